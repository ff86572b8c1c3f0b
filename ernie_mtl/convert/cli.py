"""`static_to_dynamic.py` (the `ernie-mtl-convert` command): a static checkpoint or an exported task
model -> a PaddleNLP dygraph directory.

    python static_to_dynamic.py --input output/model_last --output_dir converted --verify

The mapping is the name map stored with the source, never build order; see docs/convert.md.
Exit status: 0 converted (and verified), 1 verification failed, 2 bad input.
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import argparse
import sys
from typing import List, Optional

PROG = "static_to_dynamic.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True,
                   help="Checkpoint folder (output_dir/model_last, output_dir/model_<step>; a sharded run's "
                        "per-rank files are merged) or exported model folder (output_dir/<task>/infer_model).")
    p.add_argument("--output_dir", required=True, help="PaddleNLP directory to write (must not exist unless "
                                                       "--overwrite).")
    p.add_argument("--vocab_file", default=None, help="vocab.txt to ship; default: the one the run used "
                                                      "(data.tokenizer_name_or_path, or the manifest's).")
    p.add_argument("--with_optimizer", action="store_true",
                   help="Also write optimizer_state.pdparams (Adam moments and beta powers keyed "
                        "<structured name>_<accumulator>).")
    p.add_argument("--verify", action="store_true",
                   help="Run one seeded batch through the static program with the source weights and through "
                        "the converted dygraph model; fail if any output differs by more than --atol.")
    p.add_argument("--atol", type=float, default=1e-5, help="Largest allowed absolute difference (fp32).")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --output_dir.")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Exit status 0 converted (and verified), 1 verification failed, 2 bad input (one message, no
    traceback unless ERNIE_MTL_DEBUG=1)."""
    from data_tools.cli_utils import run_cli

    return run_cli(PROG, lambda: _main(argv))


def _main(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    from ernie_mtl.convert import ConvertError, VerificationError, convert, read_source, verify  # noqa: F401
    from ernie_mtl.dist.compat import require_supported_paddle

    require_supported_paddle()

    if args.atol <= 0:
        sys.stderr.write(f"{PROG}: error: --atol {args.atol} must be > 0, e.g. 1e-5\n")
        return 2
    source = read_source(args.input, vocab_file=args.vocab_file, with_optimizer=args.with_optimizer)
    result = convert(source, args.output_dir, overwrite=args.overwrite)
    print(f"converted {source.kind} {source.path} -> {result.output_dir} ({len(source.weights)} named weights; "
          f"pretraining heads: {result.pretraining_heads or 'none'}; task heads: {result.heads or 'none'}; "
          f"optimizer accumulators: {result.optimizer_keys})")
    if result.filled:
        print(f"note: {result.filled} are not in the source and were written as zeros so that the "
              "*ForPretraining class loads every key (see docs/convert.md)")
    if args.verify:
        try:
            diffs = verify(source, args.output_dir, atol=args.atol)
        except VerificationError as e:
            sys.stderr.write(f"{PROG}: verification FAILED: {e}\n")
            return 1
        except ConvertError as e:
            raise ConvertError(f"cannot verify: {e}") from None
        print(f"verified (atol {args.atol:g}):")
        for d in diffs:
            print(f"  {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
