"""Where the suite's CPU goes: sums the per-test records that `ERNIE_MTL_TEST_CPU_REPORT=<folder>` makes
the tests write (tests/conftest.py), per module and per test, most expensive first.

    ERNIE_MTL_TEST_CPU_REPORT=/tmp/cpu make test
    python tests/cpu_report.py /tmp/cpu [--top 25]
"""
import argparse
import collections
import json
from pathlib import Path


def load(folder: Path) -> list:
    """Every record, with the worker (file) that wrote it."""
    return [{**json.loads(line), "worker": path.stem} for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    records = load(args.folder)
    if not records:
        raise SystemExit(f"{args.folder}: no *.jsonl records "
                         f"(run the tests with ERNIE_MTL_TEST_CPU_REPORT={args.folder})")
    total = sum(r["cpu_s"] for r in records)
    modules = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        entry = modules[r["test"].split("::")[0]]
        entry[0] += r["cpu_s"]
        entry[1] += r["wall_s"]
        entry[2] += 1
    print(f"{len(records)} tests, {total / 60:.1f} CPU-minutes (tests and the processes they waited for)")
    print(f"\n{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>5}  module")
    for name, (cpu, wall, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{cpu:8.1f} {cpu / total:6.1%} {wall:8.1f} {n:5d}  {name}")
    sessions = collections.defaultdict(lambda: collections.defaultdict(list))  # pytest session -> worker -> records
    for r in records:
        if "start" in r:
            sessions[r.get("session", "")][r["worker"]].append(r)
    for workers in sorted(sessions.values(), key=lambda ws: min(r["start"] for rs in ws.values() for r in rs)):
        if len(workers) < 2:
            continue
        # when each worker finished: the idle tail of the one that finished first
        first = min(r["start"] for rs in workers.values() for r in rs)
        ends = {w: max(r["start"] + r["wall_s"] for r in rs) - first for w, rs in workers.items()}
        last = max(ends.values())
        kind = "exclusive" if all(r.get("exclusive") for rs in workers.values() for r in rs) else "shared"
        print(f"\n{kind} pass, workers (from its first test's start): " + "; ".join(
            f"{w} {len(workers[w])} tests, done at {_clock(end)}, then idle {_clock(last - end)}"
            for w, end in sorted(ends.items())))
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for r in sorted(records, key=lambda r: -r["cpu_s"])[:args.top]:
        print(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")


if __name__ == "__main__":
    main()
