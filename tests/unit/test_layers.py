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


def imported_modules(path: Path, package: str):
    """Every module `path` (whose dotted package is `package`) imports, anywhere in the file, as
    absolute dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
