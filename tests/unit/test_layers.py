"""The layers point one way, read from the source with `ast` (imports inside functions count too).

The architecture is declared once, in `ernie_mtl.LAYERS` (lowest first); this test derives the rule
from it and from the package tree: every package and top-level module of `ernie_mtl/` must sit in a
layer (a new one cannot slip in undeclared), and a module may import only its own package and the
packages of earlier layers. data_tools never imports ernie_mtl; task types and plugins take the
feed contract from the tasks package; nothing cites notes outside the repository."""
import ast
import sys
from pathlib import Path

import pytest

import ernie_mtl

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ernie_mtl"


def _type_checking_only(tree):
    """The nodes inside `if TYPE_CHECKING:` blocks (imports for annotations: never run)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def imported_modules(path: Path, package: str, *, runtime_only: bool = False):
    """Every module `path` (whose dotted package is `package`) imports, anywhere in the file, as
    absolute dotted names (`runtime_only`: not the imports for annotations under `if TYPE_CHECKING:`)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def sources(*folders):
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def unit_of(dotted: str):
    """The layer unit of an ernie_mtl module: its top-level package or module name (None: the root)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ernie_mtl" else None


def layer_index():
    return {unit: i for i, layer in enumerate(ernie_mtl.LAYERS) for unit in layer}


def violations(files):
    """{file: [imports that break the layers]}: a unit may import itself and units of earlier layers."""
    rank = layer_index()
    found = {}
    for f in files:
        rel = f.relative_to(ROOT).with_suffix("")
        package = ".".join(rel.parts[:-1]) if f.name != "__init__.py" else ".".join(rel.parts[:-1])
        own = unit_of(".".join(rel.parts))
        if own is None or own == "__init__":
            continue
        bad = sorted(m for m in imported_modules(f, package)
                     if unit_of(m) not in (None, own) and m.startswith("ernie_mtl.")
                     and rank.get(unit_of(m), len(rank)) >= rank[own])
        if bad:
            found[str(f.relative_to(ROOT))] = bad
    return found


def test_every_package_and_module_sits_in_a_declared_layer():
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")}
    declared = {u for layer in ernie_mtl.LAYERS for u in layer}
    assert units - declared == set(), "declare new packages in ernie_mtl.LAYERS"
    assert declared - units <= {"api", "palm"}, "LAYERS names units that do not exist"


def test_imports_point_down_the_layers():
    assert violations(sources("ernie_mtl")) == {}


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    """Negative control: a nested import of a higher layer from config is found (the probe is a
    file outside the source tree, placed in the tree's layout only by name)."""
    probe = tmp_path / "ernie_mtl" / "config" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from ernie_mtl.engine.loop import Trainer\n    return Trainer\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations([probe]) == {"ernie_mtl/config/probe.py": ["ernie_mtl.engine.loop",
                                                                 "ernie_mtl.engine.loop.Trainer"]}


def test_config_is_a_leaf():
    """config imports nothing of ernie_mtl outside itself (what it needs from above is handed in:
    config/hooks.py)."""
    for f in sources("ernie_mtl/config"):
        outside = {m for m in imported_modules(f, "ernie_mtl.config") if m.startswith("ernie_mtl.")
                   and unit_of(m) != "config"}
        assert outside == set(), (f, outside)


def test_data_tools_never_imports_ernie_mtl():
    bad = {str(f): sorted(m for m in imported_modules(f, "data_tools") if m.split(".")[0] == "ernie_mtl")
           for f in sources("data_tools")}
    assert {f: m for f, m in bad.items() if m} == {}


@pytest.mark.parametrize("folder", ["ernie_mtl/tasks", "examples/plugins"])
def test_task_types_and_plugins_need_no_program_builder_or_engine(folder):
    files = sources(folder)
    forbidden = ("ernie_mtl.program", "ernie_mtl.engine.loop", "ernie_mtl.engine.session")
    bad = {str(f): sorted(m for m in imported_modules(f, "x") if m.startswith(forbidden)) for f in files}
    assert {f: m for f, m in bad.items() if m} == {}


def test_nothing_cites_developer_notes_outside_the_repository():
    texts = [p for p in sources("ernie_mtl", "data_tools", "benchmarks", "scripts")] + \
        sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    assert [str(p.relative_to(ROOT)) for p in texts if "shared/notes" in p.read_text(encoding="utf-8")] == []


def module_graph(root: Path = None):
    """{dotted module: the ernie_mtl modules it imports (anywhere in the file, annotations under
    `if TYPE_CHECKING:` aside)} over the package tree."""
    root = root or ROOT
    files = {}
    for f in sorted((root / "ernie_mtl").rglob("*.py")):
        rel = f.relative_to(root).with_suffix("")
        dotted = ".".join(rel.parts[:-1] if f.name == "__init__.py" else rel.parts)
        files[dotted] = (f, ".".join(rel.parts[:-1]))
    return {m: {i for i in imported_modules(f, pkg, runtime_only=True) if i in files and i != m}
            for m, (f, pkg) in files.items()}


def cycles_within_packages(graph):
    """Strongly connected sets of two or more modules of one package (a cycle hidden by a function-local
    import is still a cycle: the modules cannot be understood, or moved, one without the other)."""
    def parent(m):
        return m.rsplit(".", 1)[0]

    found = []
    for package in sorted({parent(m) for m in graph}):
        nodes = [m for m in graph if parent(m) == package and m != package]
        index, low, stack, on, counter = {}, {}, [], set(), [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(graph[v]):
                if w not in nodes:
                    continue
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for v in nodes:
            if v not in index:
                visit(v)
    return found


def test_no_import_cycles_inside_packages():
    assert cycles_within_packages(module_graph()) == []


def test_the_cycle_finder_sees_a_cycle_through_a_function_local_import(tmp_path):
    """Negative control: a.py imports b at the top, b.py imports a inside a function."""
    pkg = tmp_path / "ernie_mtl" / "probe"
    pkg.mkdir(parents=True)
    (tmp_path / "ernie_mtl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ernie_mtl.probe.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from ernie_mtl.probe import a\n    return a\n")
    assert cycles_within_packages(module_graph(tmp_path)) == [["ernie_mtl.probe.a", "ernie_mtl.probe.b"]]


def private_imports(root: Path = None):
    """`from ernie_mtl.x import _name` across modules: {file: [names]} (a private name is its module's own;
    data_tools._helpers, the compiled extension module, is private by its name only)."""
    root = root or ROOT
    found = {}
    for f in sorted(list((root / "ernie_mtl").rglob("*.py")) + list((root / "data_tools").rglob("*.py"))):
        bad = []
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("ernie_mtl", "data_tools"):
                bad += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                        and not a.name.startswith("__") and f"{node.module}.{a.name}" != "data_tools._helpers"]
        if bad:
            found[str(f.relative_to(root))] = bad
    return found


def test_no_private_names_imported_across_modules():
    assert private_imports() == {}
