"""Test-only callbacks, loaded with `--plugins tests/plugins/test_hooks.py --callbacks ...` (nothing of
this lives in the production loop).

- `kill_at_step`: SIGKILLs the process right after the `model_last` checkpoint of step
  $ERNIE_MTL_TEST_KILL_AT_STEP is written (after `model_<step>` when one is kept at that step), like a
  crashed node (exact-resume tests).
  With $ERNIE_MTL_TEST_HOOK_STAGE set, `kill_at_step` and `signal_at_step` act only in that stage of a run
  with refine stages: `multitask`, or `refine` (any refine stage).
- `dump_state`: every rank saves its final program state to $ERNIE_MTL_TEST_DUMP_DIR/rank_<r>
  (without sharding checkpoints hold rank 0's state only; this shows the other ranks' copies); with
  ERNIE_MTL_TEST_DUMP_WHEN=begin the state training starts from instead (after resume or warm start).
- `signal_at_step`: after step $ERNIE_MTL_TEST_SIGNAL_AT_STEP, the rank(s) in
  $ERNIE_MTL_TEST_SIGNAL_RANKS (default all) send themselves $ERNIE_MTL_TEST_SIGNAL (default TERM),
  $ERNIE_MTL_TEST_SIGNAL_TIMES times (preemption tests); with $ERNIE_MTL_TEST_SIGNAL_WORKERS=1 the
  data-loading workers get it too first (their pids, and whether each was alive 0.5 s later, in
  <output_dir>/signalled_workers.json), as
  when a scheduler signals every process of the job.
- `kill_once`: SIGKILLs rank $ERNIE_MTL_TEST_KILL_ONCE_RANK (default 0) after step
  $ERNIE_MTL_TEST_KILL_ONCE_AT_STEP, once: a marker file $ERNIE_MTL_TEST_KILL_ONCE_MARKER remembers
  it across restarts (supervisor tests).
- `sleep_on_rank`: rank $ERNIE_MTL_TEST_SLEEP_RANK sleeps $ERNIE_MTL_TEST_SLEEP_S seconds after each
  step (a straggler on purpose).
- `poison_step`: a fault injected into step $ERNIE_MTL_TEST_POISON_STEP: the word embedding holds an
  infinity while the step's micro-batches run ($ERNIE_MTL_TEST_POISON=always: every time the step is
  run, as bad data would; once: only the first time, as a transient hardware fault would).
- `eval_at_start`: evaluates every task with a dev file before the first step and writes what
  each rank got to <output_dir>/eval_at_start_rank<r>.json (distributed-evaluation tests).
- `pause_at`: prints `paused at <where>` and sleeps at $ERNIE_MTL_TEST_PAUSE_AT: `import` (this file's
  import, while the command line parses), `start-up` (the trainer built, before the loop) or `train_end`
  (after the last step, before the last evaluation, exports and test): where the signal tests signal.
  With $ERNIE_MTL_TEST_PAUSE_IN_C=1 the main thread blocks every signal and sleeps inside C, so it cannot
  run a Python handler: as a rank stuck inside a C++ call (a collective) cannot.
- `record_slots`: every micro-batch this rank computes, as a JSON line in
  <output_dir>/slots_rank<r>.jsonl: the step, its slot in the global batch, the task, the
  (example, epoch) pairs it read and its loss (the hook sets the loop's `fetch_step_losses`, as the
  stepped API does, so `exe.run` fetches each micro-batch's loss), so tests can compare what each
  slot saw across topologies (the loop itself is not changed: the hook wraps the feeder and the
  executor of its trainer).
"""
import json
import os
import signal
import time

from ernie_mtl.engine.callbacks import Callback, register_callback


def _in_stage(trainer) -> bool:
    """Whether the hooks act in this trainer's stage ($ERNIE_MTL_TEST_HOOK_STAGE: part of its output path)."""
    stage = os.environ.get("ERNIE_MTL_TEST_HOOK_STAGE")
    refining = os.path.basename(os.path.dirname(str(trainer.cfg.train.output_dir))) == "refine"
    return not stage or (stage == "refine") == refining


@register_callback("kill_at_step")
class KillAtStep(Callback):
    def on_save(self, trainer, path):
        if not _in_stage(trainer):
            return
        step = int(os.environ.get("ERNIE_MTL_TEST_KILL_AT_STEP", "0") or 0)
        # the step's last save
        last = f"model_{step}" if step and step % trainer.cfg.train.save_steps == 0 else "model_last"
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
            paddle.static.save(trainer.programs.main, os.path.join(folder, f"rank_{trainer.info.rank}"))


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
        trainer.fetch_step_losses = True  # the loop fetches each micro-batch's loss (nothing otherwise)
        built = {}  # id(feed) -> (feed, record) of the micro-batches of the step being built and trained

        def step(step, drawn, read):  # the loop builds a step's micro-batches before running them
            for key in [k for k, (_, r) in built.items() if r["step"] < step]:
                del built[key]
            for micro in feeder_step(step, drawn, read):
                built[id(micro.feed)] = (micro.feed, {"step": step, "slot": micro.slot, "task": micro.task,
                                                      "examples": [[int(i), int(e)] for i, e in micro.examples]})
                yield micro

        def run(*args, **kwargs):
            values = exe_run(*args, **kwargs)
            entry = built.get(id(kwargs.get("feed")))
            if entry is not None and entry[0] is kwargs.get("feed"):  # a training micro-batch (a replay: again)
                out.write(json.dumps({**entry[1], "loss": float(values[0].reshape(-1)[0])}) + "\n")
                out.flush()
            return values

        trainer.feeder.step, trainer.exe.run = step, run


@register_callback("signal_at_step")
class SignalAtStep(Callback):
    def on_step_end(self, trainer, step, tasks):
        at = int(os.environ.get("ERNIE_MTL_TEST_SIGNAL_AT_STEP", "0") or 0)
        ranks = os.environ.get("ERNIE_MTL_TEST_SIGNAL_RANKS", "")
        if step == at and _in_stage(trainer) and (not ranks or str(trainer.info.rank) in ranks.split(",")):
            signum = getattr(signal, "SIG" + os.environ.get("ERNIE_MTL_TEST_SIGNAL", "TERM"))
            if os.environ.get("ERNIE_MTL_TEST_SIGNAL_WORKERS") == "1":
                workers = [w.process for w in getattr(trainer.feeder, "workers", [])]
                for w in workers:
                    os.kill(w.pid, signum)
                time.sleep(0.5)  # a worker the signal ends has ended by then
                with open(os.path.join(trainer.cfg.train.output_dir, "signalled_workers.json"), "w") as f:
                    json.dump({"pids": [w.pid for w in workers], "alive": [w.poll() is None for w in workers]}, f)
            for _ in range(int(os.environ.get("ERNIE_MTL_TEST_SIGNAL_TIMES", "1"))):
                os.kill(os.getpid(), signum)


@register_callback("kill_once")
class KillOnce(Callback):
    def on_step_end(self, trainer, step, tasks):
        marker = os.environ.get("ERNIE_MTL_TEST_KILL_ONCE_MARKER")
        at = int(os.environ.get("ERNIE_MTL_TEST_KILL_ONCE_AT_STEP", "0") or 0)
        if marker and step == at and trainer.info.rank == int(os.environ.get("ERNIE_MTL_TEST_KILL_ONCE_RANK", "0")) \
                and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


@register_callback("sleep_on_rank")
class SleepOnRank(Callback):
    def on_step_end(self, trainer, step, tasks):
        if str(trainer.info.rank) == os.environ.get("ERNIE_MTL_TEST_SLEEP_RANK"):
            import time

            time.sleep(float(os.environ.get("ERNIE_MTL_TEST_SLEEP_S", "0.2")))


@register_callback("poison_step")
class PoisonStep(Callback):
    def on_train_begin(self, trainer):
        import numpy as np
        import paddle

        at = int(os.environ.get("ERNIE_MTL_TEST_POISON_STEP", "0") or 0)
        always = os.environ.get("ERNIE_MTL_TEST_POISON", "always") == "always"
        run, state = trainer.exe.run, {"done": False}
        table = trainer.programs.name_map["ernie.embeddings.word_embeddings.weight"]

        def poisoned_run(program, *args, **kwargs):
            if program is not trainer.programs.main or trainer.step + 1 != at or (state["done"] and not always):
                return run(program, *args, **kwargs)
            tensor = trainer.scope.find_var(table).get_tensor()
            clean = np.array(tensor)
            bad = clean.copy()
            bad[:, 0] = np.inf
            tensor.set(bad, paddle.CPUPlace())
            try:
                return run(program, *args, **kwargs)
            finally:
                tensor.set(clean, paddle.CPUPlace())
                state["done"] = True

        trainer.exe.run = poisoned_run


@register_callback("pause_at")
class PauseAt(Callback):
    """Prints `paused at <where>` and sleeps $ERNIE_MTL_TEST_PAUSE_S (default 60) seconds at
    $ERNIE_MTL_TEST_PAUSE_AT: `start-up` (when the trainer is built: programs built, before the loop) or
    `train_end` (after the last step, before the last evaluation, exports and final test): where a signal
    tests sends one."""

    def __init__(self):
        self._pause("start-up")

    def on_train_end(self, trainer):
        self._pause("train_end")

    @staticmethod
    def _pause(where):
        if os.environ.get("ERNIE_MTL_TEST_PAUSE_AT") == where:
            seconds = float(os.environ.get("ERNIE_MTL_TEST_PAUSE_S", "60"))
            if os.environ.get("ERNIE_MTL_TEST_PAUSE_IN_C"):  # the main thread never sees the signal: as stuck in C++
                import ctypes

                import threading

                # every signal blocked in this thread: none (not even a SIGCHLD) can cut the C call short; the
                # marker comes from another thread once this one is inside C, so a signal sent on seeing it
                # cannot reach a Python handler here (the main thread is in C from before the marker on)
                signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
                threading.Timer(0.5, lambda: print(f"paused at {where}", flush=True)).start()
                r, _ = os.pipe()
                ctypes.CDLL(None).read(r, ctypes.create_string_buffer(1), 1)  # never returns: nobody writes
                return
            print(f"paused at {where}", flush=True)
            time.sleep(seconds)


PauseAt._pause("import")  # $ERNIE_MTL_TEST_PAUSE_AT=import: while the command line parses (plugins load then)


@register_callback("disturb_data")
class DisturbData(Callback):
    """After step $ERNIE_MTL_TEST_DISTURB_AT_STEP: $ERNIE_MTL_TEST_DISTURB = stop_worker (SIGSTOP to the
    first data-loading worker, as a worker stuck on a network file system), kill_worker (SIGKILL), or
    zero_corpus / truncate_corpus ($ERNIE_MTL_TEST_DISTURB_FILE written with zeros in place, or cut by
    a quarter, under the running job)."""

    def on_step_end(self, trainer, step, tasks):
        if step != int(os.environ.get("ERNIE_MTL_TEST_DISTURB_AT_STEP", "0") or 0):
            return
        what = os.environ.get("ERNIE_MTL_TEST_DISTURB", "")
        if what in ("stop_worker", "kill_worker"):
            worker = trainer.feeder.workers[0].process
            os.kill(worker.pid, signal.SIGSTOP if what == "stop_worker" else signal.SIGKILL)
            print(f"disturbed: {what} pid {worker.pid}", flush=True)
        elif what in ("zero_corpus", "truncate_corpus"):
            path = os.environ["ERNIE_MTL_TEST_DISTURB_FILE"]
            size = os.path.getsize(path)
            time.sleep(0.01)  # a distinct modification time even on coarse clocks
            with open(path, "r+b") as f:
                if what == "zero_corpus":
                    f.write(b"\0" * size)
                else:
                    f.truncate(size * 3 // 4)
            print(f"disturbed: {what} {path}", flush=True)
