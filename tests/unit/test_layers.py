"""The layers point one way (read from the source with `ast`, so the rule holds for imports inside
functions too): data_tools never imports ernie_mtl; config, the planner and the feed contract import
no trainer, program builder or executor set-up; task types and plugins take FeedSpec from the feed
module; nothing in the project cites notes outside the repository."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path):
    """Every module `path` imports, anywhere in the file, as absolute dotted names."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
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


def offending(files, forbidden):
    """{file: [forbidden modules it imports]} for the files that import any."""
    found = {}
    for f in files:
        bad = sorted(m for m in imported_modules(f) if any(m == x or m.startswith(x + ".") for x in forbidden))
        if bad:
            found[str(f.relative_to(ROOT))] = bad
    return found


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """Negative control: a nested import of a forbidden module is found."""
    probe = ROOT / "data_tools" / "_layer_probe_tmp.py"
    probe.write_text("def f():\n    from ernie_mtl.engine.loop import Trainer\n    return Trainer\n")
    try:
        assert offending([probe], ["ernie_mtl"]) == {"data_tools/_layer_probe_tmp.py": ["ernie_mtl.engine.loop",
                                                                                       "ernie_mtl.engine.loop.Trainer"]}
    finally:
        probe.unlink()


def test_data_tools_never_imports_ernie_mtl():
    assert offending(sources("data_tools"), ["ernie_mtl"]) == {}


@pytest.mark.parametrize("files", [["ernie_mtl/config"], ["ernie_mtl/planning/dryrun.py"], ["ernie_mtl/tasks/feeds.py"],
                                   ["ernie_mtl/planning/plan.py"]], ids=str)
def test_config_planner_and_feeds_import_no_trainer_builder_or_runtime(files):
    paths = [p for f in files for p in ([ROOT / f] if f.endswith(".py") else sources(f))]
    assert offending(paths, ["ernie_mtl.engine.loop", "ernie_mtl.program.builder", "ernie_mtl.main", "ernie_mtl.engine.exporter",
                             "ernie_mtl.engine.inference"]) == {}


def test_task_types_and_plugins_take_the_feed_contract_from_feeds():
    files = sources("ernie_mtl/tasks", "examples/plugins")
    assert offending(files, ["ernie_mtl.program.builder", "ernie_mtl.program.forward", "ernie_mtl.engine.loop"]) == {}


def test_nothing_cites_developer_notes_outside_the_repository():
    texts = [p for p in sources("ernie_mtl", "data_tools", "benchmarks", "scripts")] + \
        sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    assert [str(p.relative_to(ROOT)) for p in texts if "shared/notes" in p.read_text(encoding="utf-8")] == []
