"""Test-only callbacks, loaded with `--plugins tests/plugins/test_hooks.py --callbacks ...` (nothing of
this lives in the production loop).

- `kill_at_step`: SIGKILLs the process right after the `model_last` checkpoint of step
  $ERNIE_MTL_TEST_KILL_AT_STEP is written (after `model_<step>` when one is kept at that step), like a
  crashed node (exact-resume tests).
- `dump_state`: every rank saves its final program state to $ERNIE_MTL_TEST_DUMP_DIR/rank_<r>
  (without sharding checkpoints hold rank 0's state only; this shows the other ranks' copies); with
  ERNIE_MTL_TEST_DUMP_WHEN=begin the state training starts from instead (after resume or warm start).
- `eval_at_start`: evaluates every task with a dev file before the first step and writes what
  each rank got to <output_dir>/eval_at_start_rank<r>.json (distributed-evaluation tests).
- `record_slots`: every micro-batch this rank computes, as a JSON line in
  <output_dir>/slots_rank<r>.jsonl: the step, its slot in the global batch, the task, the
  (example, epoch) pairs it read and its loss (the first value `exe.run` fetched), so tests can
  compare what each slot saw across topologies (the loop itself is not changed: the hook wraps the
  feeder and the executor of its trainer).
"""
import json
import os
import signal

from ernie_mtl.engine.callbacks import Callback, register_callback


@register_callback("kill_at_step")
class KillAtStep(Callback):
    def on_save(self, trainer, path):
        step = int(os.environ.get("ERNIE_MTL_TEST_KILL_AT_STEP", "0") or 0)
        last = f"model_{step}" if step and step % trainer.cfg.train.save_steps == 0 else "model_last"  # the step's last save
        if step and trainer.step == step and os.path.basename(path) == last:
            os.kill(os.getpid(), signal.SIGKILL)


@register_callback("dump_state")
class DumpState(Callback):
    def on_train_begin(self, trainer):
        if os.environ.get("ERNIE_MTL_TEST_DUMP_WHEN") == "begin":  # the state training starts from (warm starts)
            self.dump(trainer)

    def on_train_end(self, trainer):
        if os.environ.get("ERNIE_MTL_TEST_DUMP_WHEN") != "begin":
            self.dump(trainer)

    def dump(self, trainer):
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


@register_callback("record_slots")
class RecordSlots(Callback):
    def on_train_begin(self, trainer):
        path = os.path.join(trainer.cfg.train.output_dir, f"slots_rank{trainer.info.rank}.jsonl")
        out = open(path, "a", encoding="utf-8")
        feeder_step, exe_run = trainer.feeder.step, trainer.exe.run
        current = {}

        def step(step, drawn, read):
            for micro in feeder_step(step, drawn, read):
                current.update(step=step, slot=micro.slot, task=micro.task,
                               examples=[[int(i), int(e)] for i, e in micro.examples])
                yield micro

        def run(*args, **kwargs):
            values = exe_run(*args, **kwargs)
            if current:
                out.write(json.dumps({**current, "loss": float(values[0].reshape(-1)[0])}) + "\n")
                out.flush()
                current.clear()
            return values

        trainer.feeder.step, trainer.exe.run = step, run
