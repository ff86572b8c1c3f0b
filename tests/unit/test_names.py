"""Names that say what they hold, read from every `ernie_mtl/**/*.py` with `ast`.

A newcomer met `t` as a trainer, a task, a time, a config, a topology and a spec, and `self.p`,
`self.s`, `self.b` for objects that live as long as a run. The rules, each reported as `file:line`:

(a) no name, parameter, attribute store, function, class, import alias or `except ... as` spelled
    `t`, `l`, `O` or `I` (`l`, `O`, `I` read as 1 and 0: PEP 8; `t` meant something new in every function);
(b) no single-letter attribute assigned on `self` or `cls`, and no single-letter class attribute
    (a class-body assignment or annotation, a method or a property);
(c) no single-letter function or lambda parameter other than the index, count and math names
    i, j, k, n, x, y, v, unless a public signature fixes it (`PUBLIC_API_PARAMETERS`, empty today).

Local variables of other single letters (`m = cfg.setup.mtl`, `for k, v in ...`) are left to review.
"""
import ast
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ernie_mtl"

AMBIGUOUS = frozenset({"t", "l", "O", "I"})
IDIOMATIC_PARAMETERS = frozenset("ijknxyv")  # indices, counts and math: `for i in range(n)`, `lambda x: ...`

# (file relative to the repository, function, parameter): single-letter keyword parameters a public
# signature fixes (ernie_mtl/api.py, the PALM face's PaddlePALM signatures, anything docs/ documents).
# None today; add one only with the signature it mirrors in a comment.
PUBLIC_API_PARAMETERS: frozenset = frozenset()


def _single_letter(name: str) -> bool:
    return len(name) == 1 and name.isalpha()


def _parameters(args: ast.arguments) -> List[ast.arg]:
    return [*args.posonlyargs, *args.args, *args.kwonlyargs,
            *([args.vararg] if args.vararg else []), *([args.kwarg] if args.kwarg else [])]


def name_problems(source: str, filename: str) -> List[str]:
    """`file:line: what` for every name in `source` that breaks rules (a), (b) or (c) (module docstring)."""
    tree = ast.parse(source, filename=filename)
    found = []

    def report(node, what):
        found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in AMBIGUOUS:
            report(node, f"name {node.id!r}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if node.attr in AMBIGUOUS:
                report(node, f"attribute {node.attr!r}")
            elif (_single_letter(node.attr) and isinstance(node.value, ast.Name)
                  and node.value.id in ("self", "cls")):
                report(node, f"single-letter attribute {node.value.id}.{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            function = getattr(node, "name", "<lambda>")
            if function in AMBIGUOUS:
                report(node, f"function {function!r}")
            for arg in _parameters(node.args):
                if arg.arg in AMBIGUOUS:
                    report(arg, f"parameter {arg.arg!r} of {function}")
                elif (_single_letter(arg.arg) and arg.arg not in IDIOMATIC_PARAMETERS
                      and (filename, function, arg.arg) not in PUBLIC_API_PARAMETERS):
                    report(arg, f"single-letter parameter {arg.arg!r} of {function}")
        elif isinstance(node, ast.ClassDef):
            if node.name in AMBIGUOUS:
                report(node, f"class {node.name!r}")
            for statement in node.body:
                targets = (statement.targets if isinstance(statement, ast.Assign)
                           else [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else [])
                names = [n for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.append(ast.Name(id=statement.name, lineno=statement.lineno))
                for name in names:
                    if _single_letter(name.id) and name.id not in AMBIGUOUS:  # AMBIGUOUS: reported as a name
                        report(name, f"single-letter class attribute {node.name}.{name.id}")
        elif isinstance(node, ast.ExceptHandler) and node.name in AMBIGUOUS:
            report(node, f"exception name {node.name!r}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if (alias.asname or alias.name) in AMBIGUOUS:
                    report(node, f"import name {alias.asname or alias.name!r}")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in set(node.names) & AMBIGUOUS:
                report(node, f"name {name!r}")
    return sorted(set(found), key=lambda line: (line.split(":")[0], int(line.split(":")[1]), line))


def package_sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_package_names_say_what_they_hold():
    files = package_sources()
    assert len(files) > 50, "the package's modules were not found"
    problems = [p for f in files
                for p in name_problems(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert not problems, (f"{len(problems)} name(s) that do not say what they hold (tests/unit/test_names.py "
                          "says why); rename by meaning at each site:\n" + "\n".join(problems))


def test_allow_list_names_real_parameters():
    """Every public-API exception is a parameter that exists (a stale entry would hide nothing)."""
    for filename, function, parameter in PUBLIC_API_PARAMETERS:
        tree = ast.parse((ROOT / filename).read_text(encoding="utf-8"))
        assert any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function
                   and parameter in {a.arg for a in _parameters(n.args)} for n in ast.walk(tree)), \
            (filename, function, parameter)


# Negative controls: each rule reports the line of a source that breaks it.
@pytest.mark.parametrize("source, expected", [
    ("t = 1\n", "x.py:1: name 't'"),
    ("for I in range(3):\n    pass\n", "x.py:1: name 'I'"),
    ("xs = [l for l in 'ab']\n", "x.py:1: name 'l'"),
    ("def f(O):\n    return O\n", "x.py:1: parameter 'O' of f"),
    ("f = lambda t: t\n", "x.py:1: parameter 't' of <lambda>"),
    ("obj.t = 3\n", "x.py:1: attribute 't'"),
    ("try:\n    pass\nexcept OSError as t:\n    pass\n", "x.py:3: exception name 't'"),
    ("import numpy as l\n", "x.py:1: import name 'l'"),
    ("class A:\n    def __init__(self):\n        self.p = 1\n", "x.py:3: single-letter attribute self.p"),
    ("class A:\n    @classmethod\n    def make(cls):\n        cls.s = 1\n", "x.py:4: single-letter attribute cls.s"),
    ("class A:\n    b: int = 0\n", "x.py:2: single-letter class attribute A.b"),
    ("class A:\n    @property\n    def p(self):\n        return 1\n", "x.py:3: single-letter class attribute A.p"),
    ("def f(c):\n    return c\n", "x.py:1: single-letter parameter 'c' of f"),
    ("g = sorted([], key=lambda r: r)\n", "x.py:1: single-letter parameter 'r' of <lambda>"),
    ("def f(*a, **kw):\n    pass\n", "x.py:1: single-letter parameter 'a' of f"),
])
def test_each_rule_reports_its_line(source, expected):
    assert expected in name_problems(source, "x.py")


def test_idiomatic_and_descriptive_names_pass():
    source = ("def f(i, j, k, n, x, y, v, *, task, trainer_cfg):\n"
              "    m = {key: value for key, value in task.items()}\n"
              "    return [x for _ in range(n)], m, other.p, re.M\n"
              "class A:\n"
              "    name = 'a'\n"
              "    def __init__(self, spec):\n"
              "        self.spec = spec\n"
              "        self.spec.p = 1\n")
    assert name_problems(source, "x.py") == []
