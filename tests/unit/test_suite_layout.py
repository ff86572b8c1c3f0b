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


def test_the_cpu_report_counts_a_test_and_the_process_it_waited_for(tmp_path):
    """`ERNIE_MTL_TEST_CPU_REPORT` (tests/conftest.py): a test that waits for a child burning CPU is charged
    that CPU, and tests/cpu_report.py sums it per module. Without the variable nothing is written."""
    import json
    import os
    import subprocess
    import sys

    probe = TESTS / "unit" / "test_suite_layout.py"
    test = f"{probe}::test_test_module_basenames_are_unique"
    burner = tmp_path / "test_burner.py"
    burner.write_text("import subprocess, sys\n\ndef test_burn():\n"
                      "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
                      "while time.process_time() - t < 0.6: pass'], check=True)\n")
    report = tmp_path / "report"
    env = dict(os.environ, ERNIE_MTL_TEST_CPU_REPORT=str(report))
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, str(burner)],
                         cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    records = {r["test"].split("::")[-1]: r for r in map(json.loads, (report / "main.jsonl").read_text().splitlines())}
    assert sorted(records) == ["test_burn", "test_test_module_basenames_are_unique"]
    assert records["test_burn"]["cpu_s"] >= 0.6 > records["test_test_module_basenames_are_unique"]["cpu_s"]
    summary = subprocess.run([sys.executable, str(TESTS / "cpu_report.py"), str(report), "--top", "5"],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "2 tests," in summary.stdout, summary.stdout + summary.stderr
    assert summary.stdout.index("test_burner.py") < summary.stdout.index("test_suite_layout.py"), summary.stdout
    quiet = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           cwd=TESTS.parent, env=dict(env, ERNIE_MTL_TEST_CPU_REPORT=""), capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0 and len((report / "main.jsonl").read_text().splitlines()) == 2


def test_the_cpu_report_shows_when_each_worker_went_idle(tmp_path):
    """With records of two xdist workers, the report says per pass when each finished (from the pass's first
    test's start) and how long the one that finished first stood idle at the end."""
    import json
    import subprocess
    import sys

    def rows(worker, session, exclusive, times):
        return "".join(json.dumps({"test": f"tests/unit/test_{worker}.py::test_{i}", "cpu_s": 1.0, "wall_s": wall,
                                   "start": start, "session": session, "exclusive": exclusive}) + "\n"
                       for i, (start, wall) in enumerate(times))

    # make test's two passes append to the same worker files: the shared pass, then the exclusive one
    (tmp_path / "gw0.jsonl").write_text(rows("gw0", "a", False, [(1000.0, 60.0), (1060.0, 40.0)])  # done at 100 s
                                        + rows("gw0", "b", True, [(1200.0, 10.0)]))
    (tmp_path / "gw1.jsonl").write_text(rows("gw1", "a", False, [(1001.0, 150.0)])  # done at 151 s
                                        + rows("gw1", "b", True, [(1201.0, 30.0)]))
    run = subprocess.run([sys.executable, str(TESTS / "cpu_report.py"), str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert ("shared pass, workers (from its first test's start): gw0 2 tests, done at 1:40, then idle 0:51; "
            "gw1 1 tests, done at 2:31, then idle 0:00") in run.stdout, run.stdout
    assert ("exclusive pass, workers (from its first test's start): gw0 1 tests, done at 0:10, then idle 0:21; "
            "gw1 1 tests, done at 0:31, then idle 0:00") in run.stdout, run.stdout
