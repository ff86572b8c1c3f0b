"""Test-only callbacks, loaded with `--plugins tests/plugins/test_hooks.py --callbacks ...` (nothing of
this lives in the production loop).

- `kill_at_step`: SIGKILLs the process right after the `model_last` checkpoint of step
  $ERNIE_MTL_TEST_KILL_AT_STEP is written, like a crashed node (exact-resume tests).
- `dump_state`: every rank saves its final program state to $ERNIE_MTL_TEST_DUMP_DIR/rank_<r>
  (without sharding checkpoints hold rank 0's state only; this shows the other ranks' copies).
- `eval_at_start`: evaluates every task with a dev file before the first step and writes what
  each rank got to <output_dir>/eval_at_start_rank<r>.json (distributed-evaluation tests).
"""
import json
import os
import signal

from ernie_mtl.engine.callbacks import Callback, register_callback


@register_callback("kill_at_step")
class KillAtStep(Callback):
    def on_save(self, trainer, path):
        step = int(os.environ.get("ERNIE_MTL_TEST_KILL_AT_STEP", "0") or 0)
        if step and trainer.step == step and os.path.basename(path) == "model_last":
            os.kill(os.getpid(), signal.SIGKILL)


@register_callback("dump_state")
class DumpState(Callback):
    def on_train_end(self, trainer):
        folder = os.environ.get("ERNIE_MTL_TEST_DUMP_DIR")
        if folder:
            import paddle

            os.makedirs(folder, exist_ok=True)  # ranks of two nodes share it: paddle.static.save's own mkdir races
            paddle.static.save(trainer.p.main, os.path.join(folder, f"rank_{trainer.info.rank}"))


@register_callback("eval_at_start")
class EvalAtStart(Callback):
    def on_train_begin(self, trainer):
        # each rank's own metrics, computed from the gathered outputs (before rank 0's are shared)
        results = {name: trainer.evaluator.metrics(trainer.task(name), data) for name, data in trainer.plan.dev.items()}
        path = os.path.join(trainer.cfg.train.output_dir, f"eval_at_start_rank{trainer.info.rank}.json")
        with open(path, "w") as f:
            json.dump(results, f, sort_keys=True)
