"""The one YAML reader, the one value coercer and the one "did you mean" helper of the configuration.

`coerce(kind, value)` types a value from YAML or from a command-line string; on failure it raises
ValueError("<value> is not <what was expected>") and the caller prefixes where the value came from
(a flag, a file and key). Kinds: str, path, bool, int, float, tuple (a list, or "a,b,c"), and the
constrained kinds of task/multi-task keys (posint, nonnegint, optposint, posfloat, nonneg, unit,
strlist, floatlist, intlist, exportfrom).
"""
from __future__ import annotations

import argparse
import difflib
import math
from dataclasses import field
from typing import Any, Dict, Iterable, List, Optional

from data_tools.cli_utils import str2bool

NONE_WORDS = {"none", "null", ""}

EXPECTED: Dict[str, str] = {
    "str": "a string", "path": "a file path", "outpath": "an output path", "bool": "true or false",
    "int": "an integer", "float": "a number",
    "tuple": "a comma-separated list", "posint": "an integer >= 1", "nonnegint": "an integer >= 0",
    "optposint": "an integer >= 1 (or none)", "posfloat": "a number > 0", "nonneg": "a number >= 0",
    "optposfloat": "a number > 0 (or none)", "optnonnegint": "an integer >= 0 (or none)",
    "opttemp": "a number > 0, inf, or none",
    "unit": "a number in (0, 1)", "strlist": "a list", "floatlist": "numbers >= 0 (a list or \"a, b, c\")",
    "intlist": "integers (a list or \"0, 1, 0\")", "exportfrom": "best or last",
    "corpus": "a corpus prefix, weight/prefix pairs or a folder of corpora",
}


def cfg_field(default: Any, help: str) -> Any:
    """A config-slice field whose `--help` text is `help`."""
    return field(default=default, metadata={"help": help})


def as_list(value: Any) -> List[Any]:
    """PALM lists: a YAML list, or a string "a, b c" split on commas and whitespace, or one scalar."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return value.replace(",", " ").split()
    return [value]


def _number(value: Any, integer: bool) -> Any:
    if isinstance(value, bool):
        raise ValueError
    if integer and isinstance(value, int):
        return value
    if integer and isinstance(value, str):
        text = value.strip()
        try:
            return int(text)  # exact for large integers (seeds)
        except ValueError:
            pass
    number = float(value)  # "3e-5" (YAML 1.1 reads it as a string), "1e3"
    if not math.isfinite(number):
        raise ValueError
    if integer:
        if not number.is_integer():
            raise ValueError
        return int(number)
    return number


def coerce(kind: str, value: Any) -> Any:
    """Typed value of `kind` (see the module docstring); ValueError(f"{value!r} is not ...") otherwise."""
    try:
        if kind in ("str", "path", "outpath"):
            if value is None or isinstance(value, (list, dict)):
                raise ValueError
            return str(value)
        if kind == "bool":
            return str2bool(value)
        if kind == "corpus":  # a prefix, weight/prefix pairs (string or list) or a folder: parsed by its reader
            if value is None or isinstance(value, dict):
                raise ValueError
            return value
        if kind == "exportfrom":
            if str(value) not in ("best", "last"):
                raise ValueError
            return str(value)
        if kind == "int":
            return _number(value, True)
        if kind == "float":
            return _number(value, False)
        if kind == "tuple":
            items = value if isinstance(value, (list, tuple)) else str(value).split(",")
            return tuple(str(i).strip() for i in items if str(i).strip())
        if kind in ("posint", "nonnegint", "optposint", "optnonnegint"):
            if kind.startswith("opt") and (value is None or str(value).strip().lower() in NONE_WORDS):
                return None
            number = _number(value, True)
            if number < (0 if kind.endswith("nonnegint") else 1):
                raise ValueError
            return number
        if kind in ("optposfloat", "opttemp"):
            if value is None or str(value).strip().lower() in NONE_WORDS:
                return None
            if kind == "opttemp" and str(value).strip().lower() in ("inf", "infinity", ".inf"):
                return math.inf
            if kind == "opttemp" and isinstance(value, float) and math.isinf(value) and value > 0:
                return math.inf
            number = _number(value, False)
            if number <= 0:
                raise ValueError
            return number
        if kind in ("posfloat", "nonneg", "unit"):
            number = _number(value, False)
            if (kind == "posfloat" and number <= 0) or (kind == "nonneg" and number < 0) or (
                    kind == "unit" and not 0 < number < 1):
                raise ValueError
            return number
        if kind == "strlist":
            return tuple(str(v) for v in as_list(value))
        if kind == "floatlist":
            items = tuple(_number(v, False) for v in as_list(value))
            if any(v < 0 for v in items):
                raise ValueError
            return items
        if kind == "intlist":
            return tuple(_number(v, True) for v in as_list(value))
        return value  # "any": an option without a typed default
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise ValueError(f"{value!r} is not {EXPECTED.get(kind, kind)}") from None


def kind_of_default(default: Any) -> str:
    """The kind of a task-type option from its default value."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    return "any"


def yaml_value(text: Any) -> Any:
    """A command-line string typed like a YAML value ("32" -> 32, "true" -> True, "a.tsv" -> "a.tsv")."""
    if not isinstance(text, str):
        return text
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def suggest(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class DuplicateKeyError(ValueError):
    """A YAML mapping that names one key twice (YAML itself would keep the last value silently)."""

    def __init__(self, key: Any, first_line: int, second_line: int):
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {second_line})")


def _unique_key_loader():
    """A yaml.SafeLoader that refuses a mapping naming one key twice. PyYAML keeps the last value:
    `learning_rate: 1e-3` above a forgotten `learning_rate: 0.5` trained at 0.5 without a word.
    Merge keys (`<<: *defaults`) may still be overridden by the mapping's own keys, as YAML intends."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it itself
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise DuplicateKeyError(key, first, line)
            seen[key] = line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def load_yaml_text(stream) -> Any:
    """yaml.safe_load, except that a key given twice in one mapping raises DuplicateKeyError."""
    import yaml

    return yaml.load(stream, Loader=_unique_key_loader())  # noqa: S506  (a SafeLoader subclass)


YAML_MAX_BYTES = 16 << 20  # a configuration file is a few KB: anything past this is not one


def read_yaml(path: str, problems: List[str], *, what: str = "config", label: Optional[str] = None,
              empty: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The mapping in YAML file `path` (keys without leading dashes), or None after appending a
    problem (`label` names the path in messages, e.g. "--config x.yaml"). An empty file (nothing but
    comments) is {}, or a problem when `empty` says what to write in it instead. Syntax errors are
    reported with the file's line and column, and a key given twice in one mapping with both lines
    (YAML would keep the last value silently)."""
    import yaml

    from data_tools.safe_io import UnsafeFile, read_bytes_bounded

    label = label or path
    try:
        data = load_yaml_text(read_bytes_bounded(path, max_bytes=YAML_MAX_BYTES, what=what).decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.append(f"{label}: the {what} is not UTF-8 text (byte {e.start}); save it as UTF-8")
        return None
    except UnsafeFile as e:  # a FIFO would block the start-up; a device or a huge file would fill memory
        problems.append(f"{label}: {e}; give a YAML file")
        return None
    except RecursionError:
        problems.append(f"{label}: the {what} nests too deeply to be read (a configuration nests a few levels)")
        return None
    except OSError as e:
        problems.append(f"{label}: cannot read the {what} ({e.strerror}); give an existing YAML file")
        return None
    except DuplicateKeyError as e:
        lines = f"on line {e.first_line}" if e.first_line == e.second_line else \
            f"(lines {e.first_line} and {e.second_line})"
        problems.append(f"{label}:{e.second_line}: the {what} gives key {e.key!r} twice {lines}; YAML would keep "
                        "only the last value: delete one of them")
        return None
    except yaml.YAMLError as e:
        mark, context_mark = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark is not None else label
        reason = getattr(e, "problem", None) or str(e)
        if getattr(e, "context", None):
            reason += f", {e.context}" + (f" started on line {context_mark.line + 1}" if context_mark else "")
        problems.append(f"{where}: the {what} is not valid YAML ({reason}); fix the syntax there")
        return None
    if data is None:
        if empty is not None:
            problems.append(f"{label}: the {what} is empty (no keys); {empty}")
            return None
        return {}
    if not isinstance(data, dict):
        problems.append(f"{label}: the {what} must be a mapping of keys to values, got {type(data).__name__}")
        return None
    return {str(k).lstrip("-"): v for k, v in data.items()}
