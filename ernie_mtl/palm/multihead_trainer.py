"""PaddlePALM's high-level trainer layer (`palm.MultiHeadTrainer`): several Trainers, one shared
backbone, a head each, trained as one engine run with PALM's mix-ratio sampling.

    trainer = palm.MultiHeadTrainer([trainer_slot, trainer_intent])
    loss = trainer.build_forward()
    trainer.build_backward(optimizer=adam, weight_decay=0.01)
    trainer.fit_readers_with_mixratio([slot_reader, intent_reader], "slot", num_epochs)
    trainer.load_pretrain(...); trainer.set_saver(...)
    result = trainer.train(print_steps=5)

Each micro-batch trains one task drawn with probability mix_ratio_i / sum(mix_ratio), as PALM drew
it, but from the run's seed (PALM used the global NumPy generator, reseeded by every reader). A
target's quota is PALM's `int(num_epochs * mix_ratio_i * steps_per_epoch_reference)` (with the
engine's steps per epoch, ceil(examples / batch size)); the sampling reference is listed first, as
the engine's main task. Unlike PALM, a target that reached its quota is no longer drawn (PALM kept
training it: its run length was random), and training stops when every target has its quota;
auxiliary tasks (`set_as_aux`) are drawn until then. Checkpoints are `ckpt.step<global step>`.
"""
from __future__ import annotations

import os

from typing import Any, Dict, List, Optional

import numpy as np


from ernie_mtl.palm.trainer import LossVar, Trainer


class MultiHeadTrainer(Trainer):
    """PALM's `MultiHeadTrainer(trainers)`; see the module docstring."""

    def __init__(self, trainers):
        trainers = list(trainers)
        if not trainers or not all(isinstance(trainer, Trainer) and not isinstance(trainer, MultiHeadTrainer)
                                   for trainer in trainers):
            raise TypeError("MultiHeadTrainer takes a non-empty list of palm.Trainer objects")
        seen = {}
        for trainer in trainers:
            if trainer.task_name in seen:
                same = seen[trainer.task_name] == trainer.name
                raise ValueError(f"trainers {seen[trainer.task_name]!r} and {trainer.name!r} "
                                 + ("have the same name" if same else
                                    f"collide: both become task {trainer.task_name!r} (a task name is made "
                                    "folder-safe: characters other than letters, digits, '-' and '_' become '_')")
                                 + "; rename one of them")
            seen[trainer.task_name] = trainer.name
        super().__init__("+".join(trainer.name for trainer in trainers))
        self._multi = True
        self._trainers = trainers
        self._reference: Optional[Trainer] = None
        for trainer in trainers:
            trainer._owner = self

    # -- PALM's interface ---------------------------------------------------------------------------
    def build_forward(self) -> LossVar:
        """Check that every trainer has built its forward with one shared backbone; the loss of the step
        is the drawn task's."""
        missing = [trainer.name for trainer in self._trainers if trainer._backbone is None]
        if missing:
            raise RuntimeError(f"build_forward(backbone, head) of trainer(s) {missing} first")
        first = self._trainers[0]._backbone
        if any(trainer._backbone is not first and not first.same_model(trainer._backbone)
               for trainer in self._trainers):
            raise ValueError("the trainers' backbones differ: build every trainer's forward with the same backbone")
        self._backbone = first
        return LossVar([trainer.task_name for trainer in self._trainers])

    def build_predict_forward(self) -> Dict[str, Any]:
        """PALM's joint multi-head prediction: one prediction program holding every trainer's
        predict-phase head (each trainer's `build_predict_forward(backbone, head)` first) on the shared
        backbone; `predict_one_batch(task, batch)` runs it. Returns the heads' outputs by trainer."""
        from ernie_mtl.palm.head import declared_outputs

        heads = [trainer for trainer in self._trainers if trainer._pred_head is not None]
        if not heads:
            raise RuntimeError("build_predict_forward: call build_predict_forward(backbone, head) of the trainers "
                               "first")
        first = heads[0]._pred_backbone
        if any(trainer._pred_backbone is not first and type(trainer._pred_backbone) is not type(first)
               for trainer in heads):
            raise ValueError("the trainers' prediction backbones differ: build every prediction head on the same one")
        self._pred_backbone = first
        self._predictor = None
        return {trainer.name: declared_outputs(trainer._pred_head) for trainer in heads}

    def merge_inference_readers(self, readers):
        """The trainers' prediction readers (a list in trainer order, or a dict by trainer name); returns
        `iterator(task_name)`, which yields that trainer's batches (one pass, PALM's dicts with
        `__task_id`) for `predict_one_batch(task_name, batch)`."""
        from ernie_mtl.palm.adaptor import ReaderBatch, one_pass

        if isinstance(readers, dict):
            unknown = sorted(set(readers) - {member.name for member in self._trainers})
            if unknown:
                raise ValueError(f"readers for unknown trainer(s) {unknown}")
            pairs = [(member, readers[member.name]) for member in self._trainers if member.name in readers]
        else:
            readers = list(readers)
            if len(readers) != len(self._trainers):
                raise ValueError(f"{len(readers)} readers for {len(self._trainers)} trainers")
            pairs = list(zip(self._trainers, readers))
        for member, r in pairs:
            member.fit_reader(r, phase="predict")
        self._predictor = None
        ids = {member.name: i for i, member in enumerate(self._trainers)}

        def iterator(task_name):
            trainer = self._trainer(task_name)
            if trainer._pred_reader is None:
                raise ValueError(f"no prediction reader for trainer {task_name!r}")
            for batch in one_pass(trainer._pred_reader):
                out = ReaderBatch(batch)
                out.collated = getattr(batch, "collated", None)
                out["__task_id"] = np.array([ids[trainer.name]], dtype=np.int64)
                yield out

        return iterator

    def predict_one_batch(self, task_name, batch):
        """The outputs of trainer `task_name`'s prediction head for `batch` (PALM's joint prediction: one
        program holds every trainer's head)."""
        from ernie_mtl.palm.adaptor import engine_batch
        from ernie_mtl.palm.predictor import palm_outputs

        trainer = self._trainer(task_name)
        heads = [member for member in self._trainers if member._pred_head is not None]
        if trainer._pred_head is None:
            raise RuntimeError(f"predict_one_batch: trainer {task_name!r} has no prediction head "
                               "(build_predict_forward(backbone, head))")
        predictor = trainer._prediction_program(heads)
        task = predictor.task(trainer.task_name)
        collated = engine_batch(task, batch, prefix=f"{trainer.name}.", required=False,
                                where=f"predict_one_batch: the batch of task {trainer.task_name!r}")
        return palm_outputs(task, predictor.run(trainer.task_name, collated))

    def _trainer(self, name):
        trainer = next((member for member in self._trainers if name in (member.name, member.task_name)), None)
        if trainer is None:
            raise ValueError(f"no trainer {name!r}: {[member.name for member in self._trainers]}")
        return trainer

    def fit_readers_with_mixratio(self, readers, sampling_reference, num_epochs, phase="train"):
        """The trainers' readers (a list in trainer order, or a dict by trainer name), the trainer whose
        epochs count (`sampling_reference`, a name) and the number of its epochs; returns the iterator of
        the run's batches, as `fit_reader` does."""
        if phase != "train":
            raise ValueError("fit_readers_with_mixratio: the train phase only; each trainer fits its own "
                             "prediction reader")
        if isinstance(readers, dict):
            unknown = sorted(set(readers) - {trainer.name for trainer in self._trainers})
            if unknown:
                raise ValueError(f"readers for unknown trainer(s) {unknown}")
            readers = [readers[trainer.name] for trainer in self._trainers]
        if len(readers) != len(self._trainers):
            raise ValueError(f"{len(readers)} readers for {len(self._trainers)} trainers")
        reference = next((trainer for trainer in self._trainers
                          if sampling_reference in (trainer.name, trainer.task_name)), None)
        if reference is None:
            raise ValueError(f"sampling_reference {sampling_reference!r} is not one of the trainers "
                             f"{[trainer.name for trainer in self._trainers]}")
        if not isinstance(num_epochs, (int, float)) or isinstance(num_epochs, bool) or num_epochs <= 0:
            raise ValueError(f"num_epochs {num_epochs!r}: a number > 0")
        for trainer, r in zip(self._trainers, readers):
            trainer.fit_reader(r)
        self._reference, self._num_epochs = reference, num_epochs
        self._train_reader = reference._train_reader
        return self._batches()

    def train_one_step(self, batch):
        """Train the step of `batch`; returns (outputs, task id) as PALM did: {"<name>.loss": loss} and the
        drawn trainer's position in the list."""
        outputs = super().train_one_step(batch)
        task_id = batch.get("__task_id") if hasattr(batch, "get") else None  # a script's batch may lack it
        return outputs, int(np.asarray(task_id).reshape(-1)[0]) if task_id is not None else 0

    def predict(self, output_dir=None, print_steps=1000):
        """Each trainer that has a prediction reader predicts it (into `output_dir/<name>/` when given);
        returns {trainer name: records} (PALM's MultiHeadTrainer.predict raised NotImplementedError)."""
        import os

        out = {}
        for trainer in self._trainers:
            if trainer._pred_reader is not None and trainer._pred_head is not None:
                if trainer._predict_from is None and self._predict_from is not None:
                    trainer._predict_from = self._predict_from
                out[trainer.name] = trainer.predict(
                    None if output_dir is None else os.path.join(output_dir, trainer.task_name), print_steps)
        if not out:
            raise RuntimeError("predict: no trainer has build_predict_forward(...) and fit_reader(..., "
                               "phase='predict')")
        return out

    @property
    def overall_train_steps(self) -> int:
        """The run's optimizer steps (the engine's plan: the seeded draws until every target has its quota)."""
        run = self._live_run()
        if run is not None:
            return int(run.trainer.plan.planned.total_steps)
        if self._result is not None:
            return int(self._result.steps)
        from ernie_mtl.config import TrainConfig
        from ernie_mtl.planning.schedule import TaskSchedule, sampling_probabilities, steps_per_epoch, target_quotas

        mapping = self.to_config()
        order = mapping["task_instance"]
        tasks = [mapping["tasks"][n] for n in order]
        members = {trainer.task_name: trainer for trainer in self._trainers}
        sizes = [members[n].num_examples for n in order]
        targets = [bool(x) for x in mapping["target_tag"]]
        quotas = target_quotas(num_examples=sizes, batch_sizes=[k["batch_size"] for k in tasks],
                               is_target=targets, num_epochs=mapping["num_epochs"],
                               task_num_epochs=[k.get("num_epochs") for k in tasks], mix_ratio=mapping["mix_ratio"])
        p = sampling_probabilities("palm", mix_ratio=mapping["mix_ratio"])
        # batch_size is per process: an optimizer step is one slot (micro-batch) per launched process
        processes = max(int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1), 1)
        schedule = TaskSchedule(p, quotas, targets, int(mapping.get("seed", TrainConfig().seed)),
                                slots_per_step=processes, names=order,
                                steps_per_epoch=[steps_per_epoch(n, k["batch_size"]) for n, k in zip(sizes, tasks)])
        return int(schedule.plan().total_steps)

    # -- internals ----------------------------------------------------------------------------------
    def _members(self) -> List[Trainer]:
        return list(self._trainers)

    def _order(self, run=None) -> List[str]:
        ref = self._reference or self._trainers[0]
        return [ref.task_name] + [trainer.task_name for trainer in self._trainers if trainer is not ref]

    def _display(self, task: str) -> str:
        return next((trainer.name for trainer in self._trainers if trainer.task_name == task), task)


__all__ = ["MultiHeadTrainer"]
