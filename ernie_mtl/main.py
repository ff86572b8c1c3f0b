"""`run_multitask_static.py`: parse and validate, then predict, plan, prebuild or train.

Every user error (a flag, a file, a key, a checkpoint that cannot be resumed, a disk that is full)
ends with one message naming the culprit and the fix, exit status 2, no traceback unless
`ERNIE_MTL_DEBUG=1` (data_tools/cli_utils.py); anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys
from typing import Optional, Sequence

from data_tools.cli_utils import UserError, run_cli

PROG = "run_multitask_static.py"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Before anything imports paddle: the rank's thread budget (ernie_mtl/dist/threads.py: paddle's import
    pins OMP_NUM_THREADS=1 otherwise), on CPU the serial executor (runtime.configure_executor), the
    framework's console chatter off unless --log_level debug (ernie_mtl/dist/console.py), and the orphan
    guard (a rank whose launcher died exits: ernie_mtl/dist/watchdog.py)."""
    from ernie_mtl.dist import console
    from ernie_mtl.dist import process as runtime
    from ernie_mtl.dist import threads
    from ernie_mtl.dist import watchdog

    argv = list(sys.argv[1:] if argv is None else argv)
    device = threads.device_hint(argv)
    try:
        runtime.THREADS_NOTE = threads.configure_threads(device=device)
        runtime.configure_executor(device=device)  # CPU: the serial executor, read by paddle at import
    except RuntimeError:  # paddle already imported (main() called in-process): its threads stay as they are
        runtime.THREADS_NOTE = None
    console.quiet_framework(debug=console.debug_requested(argv))  # imports paddle, without its chatter
    console.quiet_fleet_loggers()
    watchdog.install_orphan_guard()
    code = run_cli(PROG, lambda: _main(argv))
    if runtime.ProcessInfo.from_env().world_size > 1:
        watchdog.leave(code)
    return code


def _main(argv: Optional[Sequence[str]]) -> int:
    from ernie_mtl.checkpoint import CheckpointError
    from ernie_mtl.config.cli import parse_config

    cfg = parse_config(argv)
    try:
        if cfg.train.do_predict:
            return _predict(cfg)
        if cfg.train.do_eval:
            from ernie_mtl.engine.inference import run_eval
            from ernie_mtl.dist.process import resolve_device

            run_eval(cfg.train, use_gpu=resolve_device(cfg.train.device) == "gpu")
            return 0
        if cfg.train.dry_run:
            from ernie_mtl.planning.dryrun import dry_run

            print(dry_run(cfg))
            return 0
        from ernie_mtl.engine.loop import run

        return run(cfg)
    except CheckpointError as e:  # e.g. resuming with another topology: a user error, not a crash
        raise UserError(str(e)) from None


def _predict(cfg) -> int:
    import os

    from ernie_mtl.engine.exporter import export_dir, predict
    from ernie_mtl.dist.process import resolve_device

    t = cfg.train
    output = t.predict_output or os.path.join(t.output_dir, t.task, "predictions.json")
    predict(export_dir(t.output_dir, t.task), t.pred_file, output, use_gpu=resolve_device(t.device) == "gpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
