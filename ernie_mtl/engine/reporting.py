"""How a run reports itself: console lines and metric tags, in the style of the mode it runs in.

One engine, two presentations. Flag-mode pretraining (PaddleNLP flags) keeps its log lines and
VisualDL tags (`train/loss`, `train/mlm_loss`, `train/nsp_loss`, `eval/loss`, `test/loss`, ...);
a multi-task run writes PALM-style lines per task and per-task tags (`train/<task>/loss`,
`train/<task>/sampled`, `eval/<task>/<metric>`, `test/<task>/<metric>`). Both add `train/lr`,
`amp/loss_scale` and `perf/*`. Metrics measured with the best checkpoint's weights (the final test
evaluation) are tagged `test_best/...`.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Tuple

from ernie_mtl.engine.metrics import Window, format_eta


class Reporter:
    """Base: the multi-task (PALM-style) presentation."""

    flag_mode = False

    def start(self, trainer):
        """Rank 0 at the start of training: the start-up lines (schedule or topology, each task's
        data, the plan's warnings), the hyperparameters to VisualDL; returns the progress bar (drawn
        on a terminal only: log files get the log lines)."""
        from tqdm import tqdm

        from ernie_mtl.planning.plan import plan_warnings

        for line in self.start_lines(trainer) + [ln for task in trainer.tasks for ln in task.describe_data()]:
            trainer.log.info(line)
        for line in plan_warnings(trainer.plan, trainer.topo, flag_mode=trainer.setup.flag_mode,
                                  max_steps=trainer.cfg.optim.max_steps):
            trainer.log.warning(line)
        trainer.writer.hparams(trainer.cfg.to_dict(), self.hparam_metrics(trainer))
        return tqdm(total=trainer.plan.planned.total_steps, initial=trainer.step, unit="step", dynamic_ncols=True,
                    mininterval=1.0, disable=None)

    def start_lines(self, trainer) -> List[str]:
        return ["task schedule:\n" + trainer.schedule.summary()]

    def new_run(self, output_dir: str) -> str:
        return f"starting a new multi-task run in {output_dir}"

    def resumed(self, trainer, path) -> str:
        return (f"resumed from {path} at step {trainer.step} (micro-batches per task: "
                f"{dict(zip(trainer.schedule.names, trainer.schedule.counts))})")

    def hparam_metrics(self, trainer) -> List[str]:
        return [f"eval/{t.spec.name}/{t.main_metric}" for t in trainer.tasks if t.spec.dev_file]

    def window(self, trainer, w: Window) -> Tuple[List[str], Dict[str, float]]:
        """(console lines, scalars) of a logging step."""
        rates = w.rates()
        logs: Dict[str, float] = {"train/lr": w.lr, **rates}
        if w.loss_scale is not None:
            logs["amp/loss_scale"] = w.loss_scale
        lines = []
        for i, t in enumerate(trainer.tasks):
            name = t.spec.name
            logs[f"train/{name}/sampled"] = w.drawn.get(name, 0) / max(sum(w.drawn.values()), 1)  # all ranks' slots
            if name not in w.count:
                continue
            loss = w.mean_loss(name)
            logs[f"train/{name}/loss"] = loss
            stream = trainer.plan.streams[i]
            k = trainer.schedule.counts[i]
            per_epoch = stream.steps_per_epoch
            lines.append(f"global step: {trainer.step}, task: {name}, step {k - stream.epoch_of(k - 1) * per_epoch}/"
                         f"{per_epoch} (epoch {stream.epoch_of(k - 1)}), loss: {loss:.4f}, "
                         f"speed: {rates['perf/steps_per_s']:.2f} steps/s")
        return lines, logs

    def metrics(self, prefix: str, task: str, step: int, metrics: Mapping[str, float],
                what: str = "") -> Tuple[str, Dict[str, float]]:
        """(console line, scalars) of an evaluation (`prefix`: eval, test, test_best)."""
        line = f"{prefix} {task} at step {step}{what}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return line, {f"{prefix}/{task}/{k}": v for k, v in metrics.items()}

    def finished_lines(self, trainer) -> List[str]:
        return [f"training finished at step {trainer.step}: micro-batches per task "
                f"{dict(zip(trainer.schedule.names, trainer.schedule.counts))}"]

    def closing(self, output_dir: str) -> str:
        return (f"checkpoints: {output_dir}/model_last, model_<step>, best_<task>; inference models: "
                f"{output_dir}/<task>/infer_model; VisualDL: visualdl --logdir {output_dir}/visualdl")

    def note_unexportable(self, task, step: int) -> Optional[str]:
        why = getattr(task, "unexportable_reason", None) or "predictions need more than the backbone inputs"
        return (f"task {task.spec.name} ({task.name}) finished at step {step}; its type has no inference model "
                f"({why}): see the checkpoints")


class FlagReporter(Reporter):
    """Flag-mode pretraining: the lines and tags of PaddleNLP-style pretraining (one task)."""

    flag_mode = True

    def start_lines(self, trainer) -> List[str]:
        t = trainer.topo
        return [f"training steps {trainer.step + 1}..{trainer.plan.planned.total_steps}: {t.to_dict()}; losses are "
                f"rank 0's (not all-reduced); tokens/s = rank 0's non-pad tokens x data world {t.data_world_size}"]

    def new_run(self, output_dir: str) -> str:
        return f"starting a new run in {output_dir} (no checkpoint to resume)"

    def resumed(self, trainer, path) -> str:
        return (f"resumed from {path} at step {trainer.step} ({trainer.consumed_samples} samples consumed, "
                f"next lr {trainer.p.lr_scheduler.last_lr:.3e})")

    def hparam_metrics(self, trainer) -> List[str]:
        task = trainer.tasks[0]
        return ["eval/loss", "eval/mlm_loss"] + (["eval/nsp_loss"] if getattr(task, "binary_head", False) else [])

    def window(self, trainer, w: Window) -> Tuple[List[str], Dict[str, float]]:
        name = trainer.tasks[0].spec.name
        rates = w.rates()
        total = trainer.plan.planned.total_steps
        loss = w.mean_loss(name) if name in w.count else float("nan")
        scalars = w.mean_scalars(name) if name in w.count else {}
        logs: Dict[str, float] = {"train/loss": loss, **{f"train/{k}": v for k, v in scalars.items()},
                                  "train/lr": w.lr, **rates}
        if w.loss_scale is not None:
            logs["amp/loss_scale"] = w.loss_scale
        steps_per_s = rates["perf/steps_per_s"]
        eta = (total - trainer.step) / steps_per_s if steps_per_s > 0 else float("inf")
        parts = [f"step {trainer.step}/{total}", f"loss {loss:.4f}"]
        if "mlm_loss" in scalars:
            parts.append(f"mlm {scalars['mlm_loss']:.4f}")
        if "nsp_loss" in scalars:
            parts.append(f"nsp {scalars['nsp_loss']:.4f}")
        parts.append(f"lr {w.lr:.3e}")
        if w.loss_scale is not None:
            parts.append(f"loss scale {w.loss_scale:.0f}")
        parts += [f"{steps_per_s:.2f} steps/s", f"{rates['perf/tokens_per_s']:.0f} tokens/s",
                  f"{rates['perf/samples_per_s']:.1f} samples/s", f"ETA {format_eta(eta)}"]
        return [" | ".join(parts)], logs

    def metrics(self, prefix: str, task: str, step: int, metrics: Mapping[str, float],
                what: str = "") -> Tuple[str, Dict[str, float]]:
        line = f"{prefix} at step {step}{what}: " + " | ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return line, {f"{prefix}/{k}": v for k, v in metrics.items() if math.isfinite(v)}

    def finished_lines(self, trainer) -> List[str]:
        return []

    def closing(self, output_dir: str) -> str:
        return (f"checkpoints: {output_dir}/model_last and model_<step>; "
                f"VisualDL: visualdl --logdir {output_dir}/visualdl")

    def note_unexportable(self, task, step: int) -> Optional[str]:
        return None  # pretraining has no inference model; the checkpoints are the output


def reporter_for(cfg) -> Reporter:
    return FlagReporter() if cfg.flag_mode else Reporter()
