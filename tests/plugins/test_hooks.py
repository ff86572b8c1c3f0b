"""Test-only callbacks, loaded with `--plugins tests/plugins/test_hooks.py --callbacks ...` (nothing of
this lives in the production loop).

- `kill_at_step`: SIGKILLs the process right after the `model_last` checkpoint of step
  $ERNIE_MTL_TEST_KILL_AT_STEP is written, like a crashed node (exact-resume tests).
- `dump_state`: every rank saves its final program state to $ERNIE_MTL_TEST_DUMP_DIR/rank_<r>
  (without sharding checkpoints hold rank 0's state only; this shows the other ranks' copies).
"""
import os
import signal

from ernie_mtl.callbacks import Callback, register_callback


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

            paddle.static.save(trainer.p.main, os.path.join(folder, f"rank_{trainer.info.rank}"))
