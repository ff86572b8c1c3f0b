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
    costs = tmp_path / "costs.json"
    summary = subprocess.run([sys.executable, str(TESTS / "cpu_report.py"), str(report), "--top", "5",
                              "--write_costs", str(costs)], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "2 tests," in summary.stdout, summary.stdout + summary.stderr
    assert summary.stdout.index("test_burner.py") < summary.stdout.index("test_suite_layout.py"), summary.stdout
    wall = json.loads(costs.read_text())["wall_seconds"]
    layout = records["test_test_module_basenames_are_unique"]["wall_s"]
    assert wall["tests/unit/test_suite_layout.py"] == round(layout, 1)
    assert list(wall)[0].endswith("test_burner.py")  # the most expensive first
    quiet = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           cwd=TESTS.parent, env=dict(env, ERNIE_MTL_TEST_CPU_REPORT=""), capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0 and len((report / "main.jsonl").read_text().splitlines()) == 2


def _costs():
    import json

    return json.loads((TESTS / "module_costs.json").read_text(encoding="utf-8"))["wall_seconds"]


def test_every_test_module_has_a_cost_and_every_cost_a_module():
    """tests/module_costs.json orders `make test`'s shared pass (tests/conftest.py `order_by_cost`): a module
    without an entry runs first whatever it costs; a stale entry is a renamed or deleted module."""
    modules = {str(p.relative_to(TESTS.parent)) for d in ("unit", "e2e") for p in (TESTS / d).glob("test_*.py")}
    costs = _costs()
    missing, stale = sorted(modules - set(costs)), sorted(set(costs) - modules)
    assert not missing, (f"tests/module_costs.json has no wall time for {missing}: run make test with "
                         f"ERNIE_MTL_TEST_CPU_REPORT=<dir>, then python tests/cpu_report.py <dir> --write_costs "
                         f"tests/module_costs.json")
    assert not stale, f"tests/module_costs.json names modules that do not exist: {stale}"
    assert all(isinstance(s, (int, float)) and s >= 0 for s in costs.values())


def test_the_shared_pass_hands_out_the_most_expensive_modules_first(tmp_path):
    """Collected through pytest (the conftest hook itself): modules in descending cost, a module without
    a cost first, each module's tests in their own order; and `make test` keeps that order (xdist's own
    reorder, most tests first, would put the heaviest e2e modules last)."""
    import subprocess
    import sys

    new = tmp_path / "test_new_module.py"
    new.write_text("def test_b():\n    pass\n\n\ndef test_a():\n    pass\n")
    modules = ["tests/unit/test_docs.py", "tests/unit/test_names.py", "tests/unit/test_schedule.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *modules, str(new)], cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    order = list(dict.fromkeys(i.split("::")[0] for i in ids))
    costs = _costs()
    assert order[0] == "" and ids[:2] == ["::test_b", "::test_a"]  # outside the repository: no module shown
    assert order[1:] == sorted(modules, key=lambda m: -costs[m]) and order[1:] != modules, (order, costs)
    makefile = (TESTS.parent / "Makefile").read_text(encoding="utf-8")
    shared = [line for line in makefile.splitlines() if '-m "not exclusive"' in line]
    assert len(shared) == 1 and "--dist loadfile --no-loadscope-reorder" in shared[0], shared


def test_the_cpu_report_shows_when_each_worker_went_idle(tmp_path):
    """With records of two xdist workers, the report says when each finished (from the first test's start)
    and how long the one that finished first stood idle: the tail that the cost order shortens."""
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
    costs = tmp_path / "costs.json"
    run = subprocess.run([sys.executable, str(TESTS / "cpu_report.py"), str(tmp_path), "--write_costs", str(costs)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert ("shared pass, workers (from its first test's start): gw0 2 tests, done at 1:40, then idle 0:51; "
            "gw1 1 tests, done at 2:31, then idle 0:00") in run.stdout, run.stdout
    assert ("exclusive pass, workers (from its first test's start): gw0 1 tests, done at 0:10, then idle 0:21; "
            "gw1 1 tests, done at 0:31, then idle 0:00") in run.stdout, run.stdout
    assert json.loads(costs.read_text())["wall_seconds"] == {"tests/unit/test_gw1.py": 150.0,
                                                             "tests/unit/test_gw0.py": 100.0}  # shared pass only
