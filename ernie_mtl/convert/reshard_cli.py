"""`ernie-mtl-reshard`: a checkpoint of any topology as the topology-free (portable) format, what a
checkpoint holds, and the mean of several checkpoints' weights -- without building a program.

    ernie-mtl-reshard output/model_last --output portable/model_last     # convert (resumable, verifiable)
    ernie-mtl-reshard output/model_last --inspect                        # every tensor: name, dtype, shape
    ernie-mtl-reshard output/model_1000 output/model_2000 output/model_3000 --average --output avg
                                                                         # weights only: --init_from avg

The portable format is described in ernie_mtl/checkpoint/portable.py (docs/launch.md, "Changing the
cluster"). Every input is verified first (sizes and SHA-1s); outputs are written under a temporary
name and renamed into place. Exit status: 0 done, 2 bad input (one message, nothing written).
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import argparse
import sys
from typing import List, Optional

PROG = "ernie-mtl-reshard"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("checkpoints", nargs="+", help="Checkpoint folder(s): model_last, model_<step>, best_<task>, "
                                                  "either format, written by any number of processes.")
    p.add_argument("--output", default=None, help="The portable checkpoint to write (convert, --average).")
    p.add_argument("--inspect", action="store_true", help="Print every tensor (structured name, dtype, shape, file) "
                                                          "and the run's step and topology; write nothing.")
    p.add_argument("--average", action="store_true", help="Write the mean of the checkpoints' weights (a weights-only "
                                                          "checkpoint for --init_from or static_to_dynamic.py).")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --output.")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from data_tools.cli_utils import run_cli

    return run_cli(PROG, lambda: _main(argv))


def _main(argv: Optional[List[str]]) -> int:
    from data_tools.cli_utils import UserError

    args = build_parser().parse_args(argv)
    from ernie_mtl.dist.compat import require_supported_paddle

    require_supported_paddle()
    from ernie_mtl.checkpoint import offline, portable
    from ernie_mtl.checkpoint.reshard import describe_topology
    from ernie_mtl.checkpoint.store import (read_train_state_file, structured_state_of, verify_files)

    if args.inspect:
        if args.output or args.average:
            raise UserError("--inspect writes nothing: drop --output/--average")
        for path in args.checkpoints:
            raw = read_train_state_file(path)
            verify_files(path, raw)
            fmt = raw.get("state_format", "paddle")
            print(f"{path}: step {raw['step']}, {raw['consumed_samples']:,} samples consumed, written by "
                  f"{describe_topology(raw.get('topology') or {})}, {fmt} format"
                  + (", weights only" if raw.get("weights_only") else ""))
            if fmt == portable.FORMAT:
                lines = portable.describe(path)
            else:
                state = structured_state_of(path, raw)
                total = sum(a.nbytes for a in state.values())
                lines = [f"{k}  {a.dtype}  {list(a.shape)}" for k, a in sorted(state.items())]
                lines.append(f"{len(state)} tensors, {total / 2**20:.1f} MiB (by structured name)")
            for line in lines:
                print(f"  {line}")
        return 0
    if not args.output:
        raise UserError("give --output (the portable checkpoint to write), or --inspect")
    if args.average:
        out, n = offline.average_checkpoints(args.checkpoints, args.output, overwrite=args.overwrite)
        print(f"averaged the weights of {len(args.checkpoints)} checkpoints ({n} tensors) -> {out} (weights only: "
              f"start a new run from it with --init_from {out})")
        return 0
    if len(args.checkpoints) != 1:
        raise UserError(f"converting takes one checkpoint, got {len(args.checkpoints)} (use --average to average)")
    out, n = offline.convert_checkpoint(args.checkpoints[0], args.output, overwrite=args.overwrite)
    print(f"wrote {out}: {n} tensors by structured name (portable format); resume it on any topology (--resume {out}), "
          "warm start from it (--init_from) or convert it (static_to_dynamic.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
