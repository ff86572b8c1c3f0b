"""Multi-task static-graph trainer for ERNIE (fleet). Not implemented yet.

The data pipeline (data_tools/, issue #2) is in place; the trainer arrives with issue #3.
This entry point refuses to run rather than pretend to train.
"""
import sys


def main() -> int:
    sys.stderr.write(
        "run_multitask_static.py: the static trainer is not implemented yet (tracked in issue #3). "
        "Today you can prepare data: see `python -m data_tools.create_pretraining_data --help`.\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
