"""The test suite's own layout: pytest's default import mode imports test modules by basename, so
two test files with one name in different folders stop `make test` at collection ("import file
mismatch") -- a run of one file, as developers do, never shows it."""
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    seen = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"test modules sharing a basename (rename one): {twice}"
