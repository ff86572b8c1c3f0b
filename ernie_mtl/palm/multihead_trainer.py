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


from ernie_mtl.palm.trainer import LossVar, Trainer


class MultiHeadTrainer(Trainer):
    """PALM's `MultiHeadTrainer(trainers)`; see the module docstring."""

    def __init__(self, trainers):
        trainers = list(trainers)
        if not trainers or not all(isinstance(t, Trainer) and not isinstance(t, MultiHeadTrainer) for t in trainers):
            raise TypeError("MultiHeadTrainer takes a non-empty list of palm.Trainer objects")
        names = [t.task_name for t in trainers]
        if len(set(names)) != len(names):
            raise ValueError(f"trainer names {[t.name for t in trainers]} are not distinct")
        super().__init__("+".join(t.name for t in trainers))
        self._multi = True
        self._trainers = trainers
        self._reference: Optional[Trainer] = None
        for t in trainers:
            t._owner = self

    # -- PALM's interface ---------------------------------------------------------------------------
    def build_forward(self) -> LossVar:
        """Check that every trainer has built its forward with one shared backbone; the loss of the step
        is the drawn task's."""
        missing = [t.name for t in self._trainers if t._backbone is None]
        if missing:
            raise RuntimeError(f"build_forward(backbone, head) of trainer(s) {missing} first")
        first = self._trainers[0]._backbone
        if any(t._backbone is not first and not first.same_model(t._backbone) for t in self._trainers):
            raise ValueError("the trainers' backbones differ: build every trainer's forward with the same backbone")
        self._backbone = first
        return LossVar([t.task_name for t in self._trainers])

    def build_predict_forward(self) -> Dict[str, Any]:
        """The trainers' prediction heads (each trainer predicts its own file: `predict()`)."""
        return {t.name: t._pred_head.outputs_attr for t in self._trainers if t._pred_head is not None}

    def fit_readers_with_mixratio(self, readers, sampling_reference, num_epochs, phase="train"):
        """The trainers' readers (a list in trainer order, or a dict by trainer name), the trainer whose
        epochs count (`sampling_reference`, a name) and the number of its epochs; returns the iterator of
        the run's batches, as `fit_reader` does."""
        if phase != "train":
            raise ValueError("fit_readers_with_mixratio: the train phase only; each trainer fits its own "
                             "prediction reader")
        if isinstance(readers, dict):
            unknown = sorted(set(readers) - {t.name for t in self._trainers})
            if unknown:
                raise ValueError(f"readers for unknown trainer(s) {unknown}")
            readers = [readers[t.name] for t in self._trainers]
        if len(readers) != len(self._trainers):
            raise ValueError(f"{len(readers)} readers for {len(self._trainers)} trainers")
        reference = next((t for t in self._trainers if sampling_reference in (t.name, t.task_name)), None)
        if reference is None:
            raise ValueError(f"sampling_reference {sampling_reference!r} is not one of the trainers "
                             f"{[t.name for t in self._trainers]}")
        if not isinstance(num_epochs, (int, float)) or isinstance(num_epochs, bool) or num_epochs <= 0:
            raise ValueError(f"num_epochs {num_epochs!r}: a number > 0")
        for t, r in zip(self._trainers, readers):
            t.fit_reader(r)
        self._reference, self._num_epochs = reference, num_epochs
        self._train_reader = reference._train_reader
        return self._batches()

    def train_one_step(self, batch):
        """Train the step of `batch`; returns (outputs, task id) as PALM did: {"<name>.loss": loss} and the
        drawn trainer's position in the list."""
        outputs = super().train_one_step(batch)
        return outputs, int(batch["__task_id"][0])

    def predict(self, output_dir=None, print_steps=1000):
        """Each trainer that has a prediction reader predicts it (into `output_dir/<name>/` when given);
        returns {trainer name: records} (PALM's MultiHeadTrainer.predict raised NotImplementedError)."""
        import os

        out = {}
        for t in self._trainers:
            if t._pred_reader is not None and t._pred_head is not None:
                if t._predict_from is None and self._predict_from is not None:
                    t._predict_from = self._predict_from
                out[t.name] = t.predict(None if output_dir is None else os.path.join(output_dir, t.task_name),
                                        print_steps)
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
        members = {t.task_name: t for t in self._trainers}
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
        return [ref.task_name] + [t.task_name for t in self._trainers if t is not ref]

    def _display(self, task: str) -> str:
        return next((t.name for t in self._trainers if t.task_name == task), task)


__all__ = ["MultiHeadTrainer"]
