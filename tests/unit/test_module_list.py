"""docs/architecture.md lists every module of ernie_mtl/ once, generated from the tree
(scripts/module_list.py): a module added, moved or removed without regenerating fails here."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    spec = importlib.util.spec_from_file_location("module_list", ROOT / "scripts" / "module_list.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_list_is_the_generated_one():
    gen = load_generator()
    page = gen.PAGE.read_text(encoding="utf-8")
    assert gen.current(page) == gen.block(), "run: python scripts/module_list.py --write"


def test_every_module_appears_exactly_once():
    gen = load_generator()
    names = [name.strip() for name, _ in gen.entries(ROOT / "ernie_mtl")]
    modules = sorted(p for p in (ROOT / "ernie_mtl").rglob("*.py") if "__pycache__" not in p.parts
                     and p.name != "__init__.py")
    assert len([n for n in names if n.endswith(".py")]) == len(modules)
    block = gen.current(gen.PAGE.read_text(encoding="utf-8"))
    for module in modules:
        assert f" {module.name} " in block or block.count(f" {module.name}\n") >= 1
