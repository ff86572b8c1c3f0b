"""Checkpoint -> PaddleNLP dygraph weights converter. Not implemented yet (issue #5).

Refuses to run rather than pretend to convert.
"""
import sys


def main() -> int:
    sys.stderr.write("static_to_dynamic.py: the converter is not implemented yet (tracked in issue #5).\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
