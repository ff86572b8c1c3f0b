"""The prediction side of PALM's trainer: which weights `predict()`, `predict_one_batch()` and
`evaluate()` use (the live run, a checkpoint, an exported model or pretrained parameters), the
prediction program over them (ernie_mtl/palm/predictor.py) and PALM's output files.
`PredictionDriver` is mixed into `palm.Trainer` (ernie_mtl/palm/trainer.py, PALM's facade)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from ernie_mtl.config import ConfigError


class PredictionDriver:
    """The prediction half of `palm.Trainer` (its state lives on the trainer: see trainer.py)."""

    def _predict_postprocessing(self, output_dir):
        """PALM's prediction loop: every batch through the prediction program, its outputs to the head's
        batch_postprocess; then epoch_postprocess with the reader's epoch outputs when the head asks."""
        from ernie_mtl.palm.adaptor import one_pass
        from ernie_mtl.palm.predictor import palm_outputs
        from ernie_mtl.palm.reader import is_builtin_reader

        head, reader = self._pred_head, self._pred_reader  # as PALM: what a head keeps stays until its reset()
        if output_dir is not None:
            os.makedirs(output_dir, exist_ok=True)
        kind, path = self._prediction_source()
        if kind == "exported":
            run = self._exported_runner(path)
        else:
            predictor = self._prediction_program([self])
            task = predictor.task(self._task)

            def run(collated):
                return palm_outputs(task, predictor.run(self._task, collated))
        if is_builtin_reader(reader):
            from ernie_mtl.engine.prediction_loop import collate_batch, num_batches

            data_task, data = reader._require_loaded()  # the file as load_data read it
            size = reader.batch_size
            for j in range(num_batches(len(data), size)):
                head.batch_postprocess(run(collate_batch(data_task, data, j, size)))
        else:
            from ernie_mtl.palm.adaptor import reader_batch_feed

            specs = self._prediction_program([self]).task(self._task).label_feeds() if kind != "exported" else ()
            for batch in one_pass(reader):
                head.batch_postprocess(run(reader_batch_feed(batch, specs, required=False,
                                                             where=f"reader {type(reader).__name__}")))
        post = {"reader": reader.get_epoch_outputs() if head.epoch_inputs_attrs else None}
        return head.epoch_postprocess(post, output_dir=output_dir)

    def _explicit_model(self):
        """(path, "ckpt" | "model") given by load_ckpt / load_predict_model of this trainer, else of the
        MultiHeadTrainer it is part of; (None, None) when neither was called."""
        root = self._root()
        for trainer in (self, root):
            if trainer._predict_from is not None:
                return trainer._predict_from, trainer._predict_kind
        if root._resume not in (None, "auto") and root._run is None and root._result is None:
            return root._resume, "ckpt"  # load_ckpt before a training that has not started: its weights
        return None, None

    def _uses_live_weights(self) -> bool:
        return self._explicit_model()[0] is None and self._root()._run is not None

    def _prediction_source(self):
        """("live" | "checkpoint" | "exported" | "pretrained", path) of the weights prediction uses."""
        if self._uses_live_weights():
            return "live", None
        return self._model_source()

    def _prediction_program(self, trainers, reader=None):
        """The engine's prediction program of `trainers` with the weights `predict()` uses (cached on the
        root trainer until the source or a head changes; live weights are re-read after each step)."""
        from ernie_mtl.palm.predictor import Predictor, Source

        root = self._root()
        key = (tuple(trainer.task_name for trainer in trainers), id(reader))
        cached = root.__dict__.get("_predictor")
        if cached is not None and cached[0] == key:
            return cached[1]
        kind, path = self._prediction_source()
        if kind == "live":
            source = Source.live(root._run)
        elif kind == "checkpoint":
            source = Source.checkpoint(path)
        elif kind == "pretrained":
            seed = next((r.seed for r in (trainer._pred_reader for trainer in trainers) if r is not None
                         and getattr(r, "seed", None) is not None), 0)
            source = Source.pretrained(path, self._pred_backbone or self._backbone, int(seed))
        else:
            raise ConfigError([f"{path}: an exported model runs through Paddle Inference; predict_one_batch and the "
                               "joint prediction need a checkpoint: load_ckpt(<save_path>/ckpt.step<N>)"])
        if reader is not None:  # evaluation reads another file than the prediction reader
            saved = self._pred_reader
            self._pred_reader = reader
            try:
                predictor = Predictor(trainers, source, device=self._device())
            finally:
                self._pred_reader = saved
        else:
            predictor = Predictor(trainers, source, device=self._device())
        root._predictor = (key, predictor)
        return predictor

    def _device(self) -> Optional[str]:
        device = self._root()._flags.get("device")
        return None if device in (None, "auto") else str(device)

    def _exported_runner(self, model_dir):
        from ernie_mtl.engine.saved_models import predictor_runner, read_manifest
        from ernie_mtl.palm.predictor import prediction_place

        manifest = read_manifest(Path(model_dir))
        use_gpu = not type(prediction_place(self._device())).__name__.startswith("CPU")
        run, names = predictor_runner(Path(model_dir), manifest, use_gpu=use_gpu)
        return lambda collated: dict(zip(names, (np.asarray(v) for v in run(dict(collated)))))

    def _next_predict_batch(self):
        from ernie_mtl.palm.adaptor import one_pass

        if self._pred_reader is None:
            raise RuntimeError("get_one_batch('predict'): fit_reader(reader, phase='predict') first")
        it = self.__dict__.get("_pred_batches")
        for _ in range(2):
            if it is None:
                it = self._pred_batches = iter(one_pass(self._pred_reader))
            try:
                return next(it)
            except StopIteration:
                it = self._pred_batches = None
        raise StopIteration(f"reader {type(self._pred_reader).__name__} yields no batch")

    def _model_source(self, explicit=None):
        """("exported" | "checkpoint" | "pretrained", path) of the weights predict/evaluate use."""
        from ernie_mtl.checkpoint.layout import MANIFEST, export_dir, is_complete

        path, kind = (explicit, None) if explicit is not None else self._explicit_model()
        if path is None:
            result = self._root()._result
            if result is None or result.last_checkpoint is None:
                raise RuntimeError("no model to predict with: train() first, or load_ckpt(path) / "
                                   "load_predict_model(path)")
            return "checkpoint", str(result.last_checkpoint)
        p = Path(path).resolve()
        if (p / MANIFEST).is_file():
            return "exported", str(p)
        if (export_dir(p, self._task) / MANIFEST).is_file():
            return "exported", str(export_dir(p, self._task))
        if is_complete(p):
            return "checkpoint", str(p)
        from ernie_mtl.config.model import is_static_params_dir

        if is_static_params_dir(p) or (p / "model_state.pdparams").is_file():
            if kind == "model":
                return "pretrained", str(p)  # load_predict_model(params): PALM's examples/predict, with a warning
            raise ConfigError([f"{path}: pretrained parameters, not a trained model: the head of task {self._task} "
                               "would be random (PALM's examples/predict did that; its accuracy was chance). Train "
                               "first, then predict with <save_path>/ckpt.step<N> or <save_path>/<task>/infer_model; "
                               "load_predict_model(path) predicts from them anyway, with a warning"])
        raise ConfigError([f"{path}: neither a checkpoint of this engine (model_<N>, model_last, best_<task>, "
                           "ckpt.step<N>) nor an exported model (<task>/infer_model with manifest.json)"])

    def _wants_gpu(self) -> bool:
        from ernie_mtl.palm.predictor import prediction_place

        return not type(prediction_place(self._device())).__name__.startswith("CPU")

    def _own_components(self) -> bool:
        """Whether prediction involves a user-defined reader or backbone (the engine's prediction program)."""
        from ernie_mtl.palm.backbone import runs_own_build
        from ernie_mtl.palm.reader import is_builtin_reader

        backbone = self._pred_backbone or self._backbone
        return not is_builtin_reader(self._pred_reader) or (backbone is not None and runs_own_build(backbone))

    def _predicted(self, reader, program: bool = False):
        from ernie_mtl.engine.saved_models import Predicted, predict_checkpoint, predict_exported

        kind, path = self._prediction_source()
        if not program and kind == "exported":
            return predict_exported(path, reader.input_file, batch_size=reader.batch_size,
                                    overrides={"max_seq_len": reader.max_len}, flag="predict reader file",
                                    use_gpu=self._wants_gpu())
        if not program and kind == "checkpoint" and not self._wants_gpu():
            return predict_checkpoint(path, self._task, reader.input_file, batch_size=reader.batch_size,
                                      overrides={"max_seq_len": reader.max_len}, flag="predict reader file")
        from ernie_mtl.engine.prediction_loop import by_name, predict_batches
        from ernie_mtl.palm.adaptor import PalmTask

        predictor = self._prediction_program([self])
        task = predictor.task(self._task)
        data = task.load("pred")
        names = list(predictor.fwd.predictions[self._task])
        outputs = by_name(predict_batches(task, data, lambda batch: list(predictor.run(self._task, batch).values()),
                                          names, batch_size=task.spec.batch_size), names)
        if isinstance(task, PalmTask) and task.inner is not None:  # a built-in head's records (its own format)
            task = task.inner
        return Predicted(task, data, outputs, step=predictor.source.step)
