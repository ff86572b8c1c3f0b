"""The README's layout of ernie_mtl/ lists every module once, generated from the tree
(scripts/readme_layout.py): a module added, moved or removed without regenerating fails here."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    spec = importlib.util.spec_from_file_location("readme_layout", ROOT / "scripts" / "readme_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_layout_block_is_the_generated_one():
    gen = load_generator()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert gen.current(readme) == gen.block(), "run: python scripts/readme_layout.py --write"


def test_every_module_appears_exactly_once():
    gen = load_generator()
    names = [name.strip() for name, _ in gen.entries(ROOT / "ernie_mtl")]
    modules = sorted(p for p in (ROOT / "ernie_mtl").rglob("*.py") if "__pycache__" not in p.parts
                     and p.name != "__init__.py")
    assert len([n for n in names if n.endswith(".py")]) == len(modules)
    block = gen.current((ROOT / "README.md").read_text(encoding="utf-8"))
    for module in modules:
        assert f" {module.name} " in block or block.count(f" {module.name}\n") >= 1
