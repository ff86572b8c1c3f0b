"""Convert a static checkpoint or an exported task model to a PaddleNLP dygraph directory.

    python static_to_dynamic.py --input output/model_last --output_dir converted --verify

A thin entry point over ernie_mtl.convert.cli (installed as the `ernie-mtl-convert` command); see
docs/convert.md. Exit status: 0 converted (and verified), 1 verification failed, 2 bad input.
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys

from ernie_mtl.convert.cli import build_parser, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
