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
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

from ernie_mtl.engine.metrics import Window, format_eta

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session


class Reporter:
    """Base: the multi-task (PALM-style) presentation of the run of `session` (its plan and schedule)."""

    flag_mode = False

    def __init__(self, session: Session):
        self.session = session
        self.plan = session.plan

    def start(self, step: int, writer):
        """Rank 0 at the start of training (at `step`: 0, or the resumed step): the start-up lines
        (schedule or topology, each task's data, the plan's warnings), the hyperparameters to VisualDL;
        returns the progress bar (drawn on a terminal only: log files get the log lines)."""
        from tqdm import tqdm

        from ernie_mtl.planning.plan import plan_warnings

        s = self.session
        for line in self.start_lines(step) + [ln for task in self.plan.tasks for ln in task.describe_data()]:
            s.log.info(line)
        for line in plan_warnings(self.plan, s.topo, flag_mode=s.cfg.setup.flag_mode, max_steps=s.cfg.optim.max_steps):
            s.log.warning(line)
        writer.hparams(s.cfg.to_dict(), self.hparam_metrics())
        return tqdm(total=self.plan.planned.total_steps, initial=step, unit="step", dynamic_ncols=True,
                    mininterval=1.0, disable=None)

    def start_lines(self, step: int) -> List[str]:
        return ["task schedule:\n" + self.plan.schedule.summary()]

    def new_run(self, output_dir: str) -> str:
        return f"starting a new multi-task run in {output_dir}"

    def resumed(self, step: int, path) -> str:
        schedule = self.plan.schedule
        counts = dict(zip(schedule.names, schedule.counts))
        return f"resumed from {path} at step {step} (micro-batches per task: {counts})"

    def hparam_metrics(self) -> List[str]:
        return [f"eval/{task.spec.name}/{task.main_metric}" for task in self.plan.tasks if task.spec.dev_file]

    def window(self, step: int, window: Window) -> Tuple[List[str], Dict[str, float]]:
        """(console lines, scalars) of a logging step."""
        rates = window.rates()
        logs: Dict[str, float] = {"train/lr": window.lr, **rates}
        if window.loss_scale is not None:
            logs["amp/loss_scale"] = window.loss_scale
        lines = []
        for i, task in enumerate(self.plan.tasks):
            name = task.spec.name
            # all ranks' slots
            logs[f"train/{name}/sampled"] = window.drawn.get(name, 0) / max(sum(window.drawn.values()), 1)
            if name not in window.count:
                continue
            loss = window.mean_loss(name)
            logs[f"train/{name}/loss"] = loss
            stream = self.plan.streams[i]
            k = self.plan.schedule.counts[i]
            per_epoch = stream.steps_per_epoch
            lines.append(f"global step: {step}, task: {name}, step {k - stream.epoch_of(k - 1) * per_epoch}/"
                         f"{per_epoch} (epoch {stream.epoch_of(k - 1)}), loss: {loss:.4f}, "
                         f"speed: {rates['perf/steps_per_s']:.2f} steps/s")
        return lines, logs

    def metrics(self, prefix: str, task: str, step: int, metrics: Mapping[str, float],
                what: str = "") -> Tuple[str, Dict[str, float]]:
        """(console line, scalars) of an evaluation (`prefix`: eval, test, test_best)."""
        line = f"{prefix} {task} at step {step}{what}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return line, {f"{prefix}/{task}/{k}": v for k, v in metrics.items()}

    def finished_lines(self, step: int) -> List[str]:
        schedule = self.plan.schedule
        return [f"training finished at step {step}: micro-batches per task "
                f"{dict(zip(schedule.names, schedule.counts))}"]

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

    def start_lines(self, step: int) -> List[str]:
        topo = self.session.topo
        return [f"training steps {step + 1}..{self.plan.planned.total_steps}: {topo.to_dict()}; losses are rank 0's "
                f"(not all-reduced); tokens/s = rank 0's non-pad tokens x data world {topo.data_world_size}"]

    def new_run(self, output_dir: str) -> str:
        return f"starting a new run in {output_dir} (no checkpoint to resume)"

    def resumed(self, step: int, path) -> str:
        return (f"resumed from {path} at step {step} ({consumed_samples(self.plan)} samples consumed, "
                f"next lr {self.session.programs.lr_scheduler.last_lr:.3e})")

    def hparam_metrics(self) -> List[str]:
        task = self.plan.tasks[0]
        return ["eval/loss", "eval/mlm_loss"] + (["eval/nsp_loss"] if getattr(task, "binary_head", False) else [])

    def window(self, step: int, window: Window) -> Tuple[List[str], Dict[str, float]]:
        name = self.plan.tasks[0].spec.name
        rates = window.rates()
        total = self.plan.planned.total_steps
        loss = window.mean_loss(name) if name in window.count else float("nan")
        scalars = window.mean_scalars(name) if name in window.count else {}
        logs: Dict[str, float] = {"train/loss": loss, **{f"train/{k}": v for k, v in scalars.items()},
                                  "train/lr": window.lr, **rates}
        if window.loss_scale is not None:
            logs["amp/loss_scale"] = window.loss_scale
        steps_per_s = rates["perf/steps_per_s"]
        eta = (total - step) / steps_per_s if steps_per_s > 0 else float("inf")
        parts = [f"step {step}/{total}", f"loss {loss:.4f}"]
        if "mlm_loss" in scalars:
            parts.append(f"mlm {scalars['mlm_loss']:.4f}")
        if "nsp_loss" in scalars:
            parts.append(f"nsp {scalars['nsp_loss']:.4f}")
        parts.append(f"lr {window.lr:.3e}")
        if window.loss_scale is not None:
            parts.append(f"loss scale {window.loss_scale:.0f}")
        parts += [f"{steps_per_s:.2f} steps/s", f"{rates['perf/tokens_per_s']:.0f} tokens/s",
                  f"{rates['perf/samples_per_s']:.1f} samples/s", f"ETA {format_eta(eta)}"]
        return [" | ".join(parts)], logs

    def metrics(self, prefix: str, task: str, step: int, metrics: Mapping[str, float],
                what: str = "") -> Tuple[str, Dict[str, float]]:
        line = f"{prefix} at step {step}{what}: " + " | ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        return line, {f"{prefix}/{k}": v for k, v in metrics.items() if math.isfinite(v)}

    def finished_lines(self, step: int) -> List[str]:
        return []

    def closing(self, output_dir: str) -> str:
        return (f"checkpoints: {output_dir}/model_last and model_<step>; "
                f"VisualDL: visualdl --logdir {output_dir}/visualdl")

    def note_unexportable(self, task, step: int) -> Optional[str]:
        return None  # pretraining has no inference model; the checkpoints are the output


def reporter_for(session: Session) -> Reporter:
    return FlagReporter(session) if session.cfg.flag_mode else Reporter(session)


def consumed_samples(plan) -> int:
    """Training samples read so far by all ranks: the schedule's slots per task x the task's batch size."""
    return int(sum(c * task.spec.batch_size for c, task in zip(plan.schedule.counts, plan.tasks)))
