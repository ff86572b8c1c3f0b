"""What a run with refine stages runs, decided from its configuration alone (the trainer and the dry run
both ask here): which targets are refined, each refine stage's budget and RunConfig, its planned steps,
and the stages table. Running the stages is ernie_mtl/engine/stages.py (its docstring: the recipe)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional

from ernie_mtl.checkpoint.layout import refine_dir

# keys of the run's configuration that only size or start a refine stage: changing them does not change
# the multi-task stage
REFINE_KEYS = ("refine", "refine_steps", "refine_epochs", "refine_learning_rate", "refine_warmup_proportion",
               "refine_early_stopping_patience", "refine_from")
UNBOUNDED_EPOCHS = 1e6  # refine_steps sizes the stage (max_steps); the epochs only must not end it first


def refine_targets(cfg) -> List[str]:
    """The targets this run refines after its multi-task stage (a task's `refine` overrides the global)."""
    if cfg.setup.flag_mode:
        return []
    m = cfg.setup.mtl
    return [spec.name for spec in cfg.setup.tasks
            if spec.is_target and (m.refine if spec.refine is None else spec.refine)]


@dataclass(frozen=True)
class RefineBudget:
    """What a target's refine stage runs: steps or epochs, peak LR, warm-up, early stopping, start."""

    steps: Optional[int]
    epochs: Optional[float]
    learning_rate: float
    warmup: float
    patience: int
    start: str  # last | best

    def describe(self) -> str:
        size = f"{self.steps} steps" if self.steps is not None else f"{self.epochs:g} epoch(s)"
        stop = f", early stopping after {self.patience} evaluations" if self.patience else ""
        return (f"{size}, peak LR {self.learning_rate:g}, warm-up {self.warmup:g}{stop}, from the multi-task "
                f"{self.start}")


def refine_budget(cfg, target: str) -> RefineBudget:
    """A target's refine budget: its own refine_steps / refine_epochs / refine_learning_rate, else the
    global ones, else its num_epochs (1 when unset) at the run's peak LR."""
    m = cfg.setup.mtl
    spec = next(candidate for candidate in cfg.setup.tasks if candidate.name == target)
    steps: Optional[int] = None
    epochs: Optional[float] = None
    if spec.refine_epochs is not None:
        epochs = spec.refine_epochs
    elif spec.refine_steps is not None:
        steps = spec.refine_steps
    elif m.refine_steps is not None:
        steps = m.refine_steps
    elif m.refine_epochs is not None:
        epochs = m.refine_epochs
    else:
        epochs = spec.num_epochs if spec.num_epochs is not None else 1.0
    lr = spec.refine_learning_rate or m.refine_learning_rate or cfg.optim.max_lr
    patience = m.refine_early_stopping_patience
    return RefineBudget(steps=steps, epochs=epochs, learning_rate=float(lr), warmup=float(m.refine_warmup_proportion),
                        patience=m.early_stopping_patience if patience is None else patience, start=m.refine_from)


def refine_config(cfg, target: str, *, init_from: Optional[str]):
    """The RunConfig of `target`'s refine stage (module docstring): the run's tasks, only `target` drawn."""
    budget = refine_budget(cfg, target)
    m = cfg.setup.mtl
    tasks = []
    for spec in cfg.setup.tasks:
        if spec.name == target:
            epochs = budget.epochs if budget.epochs is not None else UNBOUNDED_EPOCHS
            tasks.append(replace(spec, is_target=True, mix_ratio=1.0, num_epochs=epochs, refine=None))
        else:  # never drawn, never evaluated: its head stays in the program, frozen
            tasks.append(replace(spec, is_target=False, mix_ratio=0.0, dev_file=None, test_file=None, refine=None))
    mtl = replace(m, sampling="palm", temperature=1.0, temperature_end=None, examples_cap=None, loss_balance="none",
                  refine=False, mix_ratio=tuple(spec.mix_ratio for spec in tasks),
                  target_tag=tuple(spec.is_target for spec in tasks), early_stopping_patience=budget.patience)
    scale = budget.learning_rate / cfg.optim.max_lr
    optim = replace(cfg.optim, max_lr=budget.learning_rate, min_lr=cfg.optim.min_lr * scale,
                    warmup_rate=budget.warmup, warmup_steps=None, decay_steps=None,
                    max_steps=budget.steps if budget.steps is not None else cfg.optim.max_steps)
    train = replace(cfg.train, output_dir=str(refine_dir(cfg.train.output_dir, target)), resume="auto",
                    overwrite_output_dir=False, init_from=init_from, init_optimizer=False)
    setup = replace(cfg.setup, tasks=tuple(tasks), mtl=mtl, reports=[])
    return replace(cfg, optim=optim, train=train, setup=setup)


def refine_plan_steps(budget: RefineBudget, num_examples: int, batch_size: int, slots_per_step: int,
                      seed: int) -> int:
    """Optimizer steps of a refine stage, as its own plan will count them (one target, its quota)."""
    from ernie_mtl.planning.schedule import TaskSchedule, steps_per_epoch

    epochs = budget.epochs if budget.epochs is not None else UNBOUNDED_EPOCHS
    quota = math.ceil(epochs * steps_per_epoch(num_examples, batch_size))
    schedule = TaskSchedule([1.0], [quota], [True], seed, slots_per_step=slots_per_step, max_steps=budget.steps)
    return schedule.plan().total_steps


def stages_table(cfg, plan, slots_per_step: int) -> str:
    """The stages of a run with refine stages (log and --dry_run): the multi-task stage's steps (its
    schedule table above), then each refine stage's steps, budget and start."""
    targets = refine_targets(cfg)
    by_name = {plan_task.spec.name: (plan_task, plan.train[plan_task.spec.name]) for plan_task in plan.tasks}
    lines = ["stages of this run (two-stage recipe: multi-task, then each target refined alone):",
             f"  1. multi-task   {plan.planned.total_steps:>8} optimizer steps, tasks "
             f"{', '.join(plan_task.spec.name for plan_task in plan.tasks)}  -> {cfg.train.output_dir}"]
    for k, target in enumerate(targets, start=2):
        task, data = by_name[target]
        budget = refine_budget(cfg, target)
        steps = refine_plan_steps(budget, task.num_train_examples(data), task.spec.batch_size, slots_per_step,
                                  cfg.train.seed)
        lines.append(f"  {k}. refine {target:<10} {steps:>5} optimizer steps ({budget.describe()})  -> "
                     f"{refine_dir(cfg.train.output_dir, target)}")
    return "\n".join(lines)



def config_summary(cfg) -> Dict[str, Any]:
    """JSON of the refine settings (for the record and tests)."""
    return {target: asdict(refine_budget(cfg, target)) for target in refine_targets(cfg)}
