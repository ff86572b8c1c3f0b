"""The stepping adaptor of PALM's trainer: a `palm.Trainer` (or MultiHeadTrainer) run as the engine's
`SteppedRun` (ernie_mtl/engine/stepping.py) -- opened from the configuration the PALM calls amount to
(ernie_mtl/palm/run_config.py), then one optimizer step per PALM batch, the batches being views of the
engine's micro-batches (`PalmBatch`), so the run keeps the command line's schedule, checkpoints and exact
resume. `StepDriver` is mixed into `palm.Trainer` (ernie_mtl/palm/trainer.py, PALM's facade)."""
from __future__ import annotations

import os
from typing import Iterator, List

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.palm.batches import PALM_KEYS, PalmBatch, backbone_fields


class StepDriver:
    """The engine-driving half of `palm.Trainer` (its state lives on the trainer: see trainer.py)."""

    def _step(self, batch):
        run = self._live_run()
        if run is None:
            if isinstance(batch, PalmBatch):
                raise ValueError("train_one_step: this batch's run is over (or closed); start a new Trainer")
            run = self._ensure_run()
        if not isinstance(batch, PalmBatch):
            batch = self._own_batch(run, batch)
        losses = run.step(batch.prepared)
        return {f"{self._display(task)}.loss": np.array([v], dtype=np.float32) for task, v in losses.items()}

    def _own_batch(self, run, batch) -> "PalmBatch":
        """A batch the script built, as the micro-batch of the run's next step (its task must be the one
        the schedule drew: the run's task order decides which task trains when)."""
        from ernie_mtl.palm.adaptor import engine_batch
        from ernie_mtl.program.forward import make_feed
        from ernie_mtl.tasks.feeds import TASK_TYPE_IDS

        if not isinstance(batch, dict):
            raise ValueError(f"train_one_step: a batch is a dict of arrays (PALM's reader fields), got "
                             f"{type(batch).__name__}")
        prepared = run.next_batch()
        if len(prepared.micro) != 1:
            raise ValueError(f"train_one_step with a batch the script built: this run computes {len(prepared.micro)} "
                             "micro-batches per step on this process (accumulation); give the run's own batches "
                             "(get_one_batch) or train without accumulate_steps")
        micro = prepared.micro[0]
        tasks = run.trainer.tasks
        names = [member.spec.name for member in tasks]
        wanted = micro.task
        if "__task_id" in batch:
            own = [m._task for m in self._root()._members()][int(np.asarray(batch["__task_id"]).reshape(-1)[0])]
            if own != wanted:
                raise ValueError(f"train_one_step: the batch is task {own!r}'s but the run's next step is task "
                                 f"{wanted!r}'s (the run's seeded task order decides it); build a batch of {wanted!r} "
                                 "(get_one_batch() shows the step)")
        index = names.index(wanted)
        task = tasks[index]
        collated = engine_batch(task, batch, prefix=f"{self._root()._display(wanted)}.", required=True,
                                where=f"train_one_step: the batch of task {wanted!r}")
        feed = make_feed(tasks, index, collated, use_task_id=TASK_TYPE_IDS in micro.feed)
        for key in micro.feed:
            if key not in feed:  # the step's dropout seeds and idle-group flags
                feed[key] = micro.feed[key]
        micro.feed = feed
        micro.tokens = int((np.asarray(collated["input_mask"]) == 0).sum()) * max(
            1, run.trainer.topo.data_world_size)
        out = self._palm_batch(prepared)
        for key, value in batch.items():
            out.setdefault(key, value)
        return out

    def _postprocess_step(self, task: str, outputs) -> None:
        """PALM's trainer: the drawn task's train head gets the step's outputs (its loss)."""
        from ernie_mtl.palm.head import runs_own_build

        member = next((m for m in self._root()._members() if m._task == task), None)
        if member is None or member._head is None or not runs_own_build(member._head):
            return
        prefix = f"{member._name}."
        member._head.batch_postprocess({k[len(prefix):]: v for k, v in outputs.items() if k.startswith(prefix)})

    def _order(self, run=None) -> List[str]:
        """The engine's task names, in the engine's order."""
        return [self._task]

    def _live_run(self):
        return self._root()._run

    def _index(self, run) -> int:
        return [task.spec.name for task in run.trainer.tasks].index(self._task)

    def _ensure_run(self):
        root = self._root()
        if root._run is None:
            if root._result is not None:
                raise RuntimeError("the run is over: train() finished; build a new Trainer to train again")
            root._run = root._open()
        return root._run

    def _open(self):
        """The engine's run of this trainer's configuration (ernie_mtl/engine/stepping.py)."""
        from ernie_mtl.config.cli import parse_config
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.engine.stepping import SteppedRun
        from ernie_mtl.engine.config_checks import HOOKS
        from ernie_mtl.palm.run_config import PalmLayout, run_config

        mapping = run_config(self, self._members(), print_steps=self._print_steps)
        with static_mode_restored():
            cfg = parse_config([], hooks=HOOKS, config=mapping, config_dir=os.getcwd())
        if mapping["resume"] != "none":
            self._check_resumable_readers(cfg)
        layout = PalmLayout(cfg.train.output_dir if self._save_path else None, self._save_types,
                            [m._task for m in self._members() if not m._as_aux], fresh=mapping["resume"] == "none",
                            shown=self._save_path)
        run = SteppedRun(cfg, callbacks=[layout, *self._callbacks])
        self._warn_schedule(run)
        return run

    def _check_resumable_readers(self, cfg) -> None:
        """A run continues a checkpoint exactly only when each user-defined reader yields the same batches
        on every pass (the run finds its position by reading the stream again): refused otherwise."""
        from ernie_mtl.checkpoint.layout import is_complete, last_dir
        from ernie_mtl.palm.adaptor import check_deterministic
        from ernie_mtl.palm.reader import is_builtin_reader

        if self._resume == "auto" and not is_complete(last_dir(cfg.train.output_dir)):
            return  # nothing to resume: a new run
        problems = []
        for m in self._members():
            reader = m._train_reader
            if reader is not None and not is_builtin_reader(reader):
                why = check_deterministic(reader)
                if why is not None:
                    problems.append(f"trainer {m.name!r}: reader {type(reader).__name__} yields other batches on each "
                                    f"pass of _iterator() ({why}), so a resumed run cannot find the batches the "
                                    "interrupted one would have read; make its order depend on a seed only (PALM's "
                                    "readers take seed=...), or start a new run")
        if problems:
            raise ConfigError(problems)

    def _warn_schedule(self, run) -> None:
        sched = self._optimizer._lr_schedualer if self._optimizer is not None else None
        total = run.trainer.plan.planned.total_steps
        n = getattr(sched, "num_train_steps", None)
        if n is not None and n < total:
            run.trainer.print(f"the learning-rate schedule reaches 0 at step {n} (TriangularSchedualer's "
                              f"num_train_steps) but the run plans {total} steps: the last {total - n} steps train "
                              "with rate 0; pass the run's steps as num_train_steps to use them")

    def _batches(self) -> Iterator[PalmBatch]:
        run = self._ensure_run()
        while not run.done:
            yield self._palm_batch(run.next_batch())
        self._finish()

    def _abort(self) -> None:
        """Close the run after an error (logs closed, Paddle's flags restored); it cannot continue."""
        root = self._root()
        if root._run is not None:
            run, root._run = root._run, None
            run.close()

    def _finish(self):
        root = self._root()
        if root._result is None and root._run is not None:
            root._result = root._run.finish()
            root._run = None
        return root._result

    def _palm_batch(self, prepared) -> PalmBatch:
        """The engine's micro-batch as PALM's reader dict (a view: `train_one_step` trains `prepared`)."""
        micro = prepared.micro[0]
        feed = micro.feed
        out = PalmBatch(backbone_fields(feed))
        display = {m._task: m._name for m in self._root()._members()}
        prefix = micro.task + "."
        for key, value in feed.items():
            if key.startswith(prefix):
                own = key[len(prefix):]
                out[f"{display.get(micro.task, micro.task)}.{PALM_KEYS.get(own, own)}"] = np.asarray(value)
        if len(display) > 1 or getattr(self._root(), "_multi", False):  # PALM's task id: the trainer's position
            out["__task_id"] = np.array([list(display).index(micro.task)], dtype=np.int64)
        out.prepared, out.task = prepared, micro.task
        return out
