"""The test suite's own layout: pytest's default import mode imports test modules by basename, so
two test files with one name in different folders stop `make test` at collection ("import file
mismatch") -- a run of one file, as developers do, never shows it."""
import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    seen = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"test modules sharing a basename (rename one): {twice}"


def exclusive_names(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXCLUSIVE" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def test_every_exclusive_name_marks_a_test():
    """A module's EXCLUSIVE names (tests/conftest.py) are matched against test ids and fixtures: a
    misspelt or stale one marks nothing, and the test it meant would share the cores with others."""
    stale = {}
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = exclusive_names(tree)
        if not isinstance(names, (set, frozenset)):
            continue
        functions = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and n.value not in names]  # parametrize ids
        unmatched = [name for name in names if not any(name in text for text in functions + literals)]
        if unmatched:
            stale[str(path.relative_to(TESTS))] = sorted(unmatched)
    assert stale == {}
