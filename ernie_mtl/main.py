"""`run_multitask_static.py`: parse and validate, then predict, plan, prebuild or train.

Every user error (a flag, a file, a key, a checkpoint that cannot be resumed, a disk that is full)
ends with one message naming the culprit and the fix, exit status 2, no traceback unless
`ERNIE_MTL_DEBUG=1` (data_tools/cli_utils.py); anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys
from typing import Optional, Sequence

from data_tools.cli_utils import run_cli

PROG = "run_multitask_static.py"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Before anything imports paddle: the rank's thread budget (ernie_mtl/dist/threads.py: paddle's
    import pins OMP_NUM_THREADS=1 otherwise), on CPU the serial executor
    (dist/process.configure_executor), the framework's console chatter off unless --log_level debug
    (ernie_mtl/dist/console.py), and the orphan guard (a rank whose launcher died exits:
    ernie_mtl/dist/watchdog.py). These are the process's business, so they live here, not in the
    engine."""
    from ernie_mtl.dist import console, preemption, process, threads, watchdog

    argv = list(sys.argv[1:] if argv is None else argv)
    device = threads.device_hint(argv)
    notes = []
    try:
        note = threads.configure_threads(device=device)
        notes.append(note if note.startswith("threads") else f"threads: {note}")
        process.configure_executor(device=device)  # CPU: the serial executor, read by paddle at import
    except RuntimeError:  # paddle already imported (main() called in-process): its threads stay as they are
        pass
    console.quiet_framework(debug=console.debug_requested(argv))  # imports paddle, without its chatter
    console.quiet_fleet_loggers()
    preemption.guard()  # a signal before or after the loop stops cleanly, not in Paddle's C++ handler
    watchdog.install_orphan_guard()
    code = run_command(argv, notes)
    if process.ProcessInfo.from_env().world_size > 1:
        watchdog.leave(code)
    return code


def run_command(argv: Sequence[str], notes: Sequence[str] = ()) -> int:
    """The command itself, once `main` has set the process up: parse, then one engine function; a user
    error becomes `run_multitask_static.py: error: ...` and exit status 2 (tests run it in-process)."""
    return run_cli(PROG, lambda: _checked(argv, notes))


def _checked(argv: Sequence[str], notes: Sequence[str]) -> int:
    from ernie_mtl.dist.compat import require_supported_paddle

    require_supported_paddle()  # before any program is built: a Paddle 3 fails deep inside, or segfaults
    return _main(argv, notes)


def _main(argv: Sequence[str], notes: Sequence[str]) -> int:
    """Parse and validate, then one engine function (ernie_mtl/engine/run.py)."""
    import json

    from ernie_mtl.dist import preemption, watchdog
    from ernie_mtl.engine import run
    from ernie_mtl.engine.anomaly import EXIT_ANOMALY, AnomalyStop
    from ernie_mtl.engine.step_feeds import EXIT_WORKER_LOST, DataWorkerLost
    from ernie_mtl.engine.config_checks import parse

    cfg = parse(argv)
    preemption.guard_again()  # paddlenlp's import (model and tokenizer classes) reset SIGTERM to its default
    train_cfg = cfg.train
    if train_cfg.do_predict:
        run.predict(cfg)
    elif train_cfg.do_eval:
        print(json.dumps(run.evaluate(cfg), indent=1, ensure_ascii=False))
    elif train_cfg.dry_run:
        print(run.plan(cfg))
    elif train_cfg.prebuild_index:
        run.prebuild(cfg)
    else:
        try:
            # a lost rank stops the job, naming it (the watch and the signal handlers are this process's)
            run.train(cfg, notes=notes, preempt_signals=preemption.parse_signals(train_cfg.preempt_signals),
                      on_distributed=lambda info: watchdog.start_peer_watch(
                          info, **run.resume_point(train_cfg.output_dir)))
        except preemption.Preempted:
            watchdog.finish()  # a planned stop: the peers stop watching this rank
            return preemption.EXIT_PREEMPTED
        except AnomalyStop as e:
            watchdog.finish()
            print(f"run_multitask_static.py: {e}", file=sys.stderr)
            return EXIT_ANOMALY
        except DataWorkerLost as e:  # not the configuration's fault: one message, no traceback, a status to retry on
            print(f"run_multitask_static.py: error: {e}", file=sys.stderr)
            return EXIT_WORKER_LOST
        watchdog.finish()  # this rank completed: its peers stop watching it
    return 0


if __name__ == "__main__":
    sys.exit(main())
