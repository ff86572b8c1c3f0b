"""What a run will do, computed identically on every rank before any program is built: the task
objects and their data, the seeded task schedule, each task's example stream, and the planned
number of optimizer steps (the LR schedule's horizon). `--dry_run` prints it; the trainer runs it.

Flag-mode pretraining is the one task `pretrain`, a target whose quota is `--max_steps` optimizer
steps (so the plan is exactly --max_steps long). A task type that generates its examples
(`sized_by_run`: a pretraining corpus) gets exactly the samples the run reads: the planned
micro-batches x batch x data-parallel ranks for training, `eval_iters` global batches for each
evaluation, ten times that for the final test split.

`plan_warnings` names what a plan allows but a user rarely means -- a corpus read more than
`REPEAT_WARN_EPOCHS` times, a task smaller than one global batch -- with the numbers and the fix;
`--dry_run` prints the warnings and the trainer logs them at the start (warnings, never errors).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.checkpoint.reshard import Continuation
from ernie_mtl.checkpoint.store import CheckpointError, CheckpointRef, read_train_state_file
from ernie_mtl.config import ConfigError
from ernie_mtl.planning.schedule import (Plan, TaskSchedule, TaskStream, end_probabilities, regroup_state,
                                         sampling_probabilities, steps_per_epoch, target_quotas)
from ernie_mtl.tasks.base import TaskContext, TaskData, get_task_type

TEST_ITERS_PER_EVAL_ITER = 10  # the final test split takes 10 x eval_iters global batches (PaddleNLP)
# A plan that reads a pretraining corpus (or an auxiliary task's data) more than this many epochs
# is flagged. Muennighoff et al. 2023 ("Scaling Data-Constrained Language Models") found up to about
# 4 epochs of repeated text nearly as useful as new text and the value of more repetition fading fast
# after that (BERT's 40 epochs were over a 3.3B-word corpus). Past ten epochs a plan has almost surely
# met a corpus far smaller than its --max_steps was sized for. A warning, never an error.
REPEAT_WARN_EPOCHS = 10


@dataclass
class RunPlan:
    """Tasks with their data, the schedule and the planned length."""

    tasks: List[Any]  # TaskType instances, in task_instance order
    train: Dict[str, Any]  # task -> TaskData of its training split
    dev: Dict[str, Any]  # task -> TaskData of its dev split (tasks with a dev file)
    test: Dict[str, Any]  # task -> TaskData of its test split (targets with a test file), read before training
    streams: List[TaskStream]  # reading order per task (slot k of task i: examples [k*B_i, (k+1)*B_i))
    schedule: TaskSchedule
    planned: Plan
    probabilities: Sequence[float]
    quotas: Sequence[Optional[int]]
    eval_batches: int  # batches of a non-full-dev task's evaluation (eval_iters global batches)
    train_samples: Dict[str, int] = field(default_factory=dict)  # generated tasks: samples built (checkpointed)
    resume_sampler: Optional[Dict[str, Any]] = None  # the schedule state a resumed run continues (this topology's)
    unresumed_steps: int = 0  # optimizer steps of this configuration's plan from step 0 (what a resume compares)

    def task(self, name: str):
        return next(task for task in self.tasks if task.spec.name == name)


@dataclass
class ResumePoint:
    """Where a resumed run's plan starts: the checkpoint's task schedule state, already re-expressed
    for this topology (ernie_mtl/engine/elastic.py), and the samples its generated tasks were built
    with (kept, so that a continued run reads the same sample sequence even when its plan differs:
    another global batch)."""

    sampler: Dict[str, Any]
    train_samples: Dict[str, int] = field(default_factory=dict)


def prepare(cfg, *, info, topo, barrier, log: Callable[[str], None], is_builder: Optional[bool] = None,
            load_dev: bool = True, resume: Optional[ResumePoint] = None) -> RunPlan:
    """Task objects, their train/dev data, the schedule and its plan (every rank calls it: index
    caches are built by `is_builder` -- global rank 0, or each node's local rank 0 without a shared
    filesystem -- and the others wait at `barrier`). `resume`: plan from a checkpoint's schedule
    state (the plan of a resumed run is the rest of the uninterrupted one; after a change of global
    batch it is planned from there in the new steps)."""
    from data_tools.index_cache import is_index_builder

    setup = cfg.setup
    m = setup.mtl
    if is_builder is None:
        is_builder = is_index_builder(info.rank, info.local_rank, cfg.data.share_folder)
    ctx = TaskContext(vocab_file=str(cfg.data.vocab_file), seed=cfg.train.seed, model_type=cfg.model.model_type,
                      rank=info.rank, world_size=info.world_size, barrier=barrier, log=log, is_builder=is_builder,
                      cache_dir=cfg.data.data_cache)
    tasks = [get_task_type(spec.reader)(spec, ctx) for spec in setup.tasks]
    slots = topo.slots_per_step  # micro-batches of all ranks per optimizer step (schedule.py: slots)
    eval_batches = cfg.train.eval_iters * slots
    sized = {task.spec.name for task in tasks if task.sized_by_run}
    kept = dict(resume.train_samples) if resume is not None else {}
    train, train_samples = {}, {}
    idle = idle_tasks(cfg)
    for task in tasks:
        if task.spec.name in idle:  # never drawn: its training data is not read
            log(f"task {task.spec.name} ({task.name}): mix_ratio 0, never drawn; its training data is not read")
            train[task.spec.name] = TaskData("train", [])
            sized.discard(task.spec.name)
        elif task.spec.name not in sized:  # generated corpora are loaded once their size is planned
            log(f"reading task {task.spec.name} ({task.name}): train {task.spec.train_file}")
            train[task.spec.name] = task.load("train")
    for task in tasks:  # a generated corpus: its natural size (one epoch) tells the schedule its epochs
        if task.spec.name in sized and not setup.flag_mode:
            train[task.spec.name] = task.load("train")
        elif task.spec.name in sized:  # flag mode: the size is the plan's (--max_steps global batches)
            train_samples[task.spec.name] = kept.get(task.spec.name, cfg.optim.max_steps * topo.global_batch_size)
            ctx.extra["num_samples"] = {"train": train_samples[task.spec.name]}
            train[task.spec.name] = task.load("train")
            sized.discard(task.spec.name)
    empty = [f"task {task.spec.name}: train file {task.spec.train_file} has no examples; give a file with rows after "
             "the header" for task in tasks if len(train[task.spec.name]) == 0 and task.spec.name not in idle]
    if empty:
        raise ConfigError(empty)
    sizes = [0 if task.spec.name in idle else task.num_train_examples(train[task.spec.name]) for task in tasks]
    probabilities = sampling_probabilities(m.sampling, mix_ratio=[task.spec.mix_ratio for task in tasks],
                                           num_examples=sizes, temperature=m.temperature, examples_cap=m.examples_cap)
    max_steps = cfg.optim.max_steps
    # flag mode: the one target's quota is exactly --max_steps optimizer steps (its samples, after a batch change)
    if setup.flag_mode:
        max_steps = flag_mode_steps(train_samples[tasks[0].spec.name], topo, resume)
        quotas: List[Optional[int]] = [flag_mode_quota(max_steps, topo, resume)]
    else:
        quotas = target_quotas(num_examples=sizes, batch_sizes=[task.spec.batch_size for task in tasks],
                               is_target=[task.spec.is_target for task in tasks], num_epochs=m.num_epochs,
                               task_num_epochs=[task.spec.num_epochs for task in tasks],
                               mix_ratio=[task.spec.mix_ratio for task in tasks] if m.sampling == "palm" else None)
    def make_schedule(**annealing) -> TaskSchedule:
        return TaskSchedule(probabilities, quotas, [task.spec.is_target for task in tasks], cfg.train.seed,
                            slots_per_step=slots, max_steps=max_steps, names=[task.spec.name for task in tasks],
                            steps_per_epoch=[steps_per_epoch(n, task.spec.batch_size) for n, task in zip(sizes, tasks)],
                            **annealing)

    schedule = make_schedule()
    if getattr(m, "temperature_end", None) is not None and len(tasks) > 1:
        end = end_probabilities(sizes, m.temperature_end, m.examples_cap)
        end = np.where(np.asarray(probabilities) > 0, end, 0.0)  # a task never drawn (mix_ratio 0) stays so
        horizon = (resume.sampler.get("anneal_slots") if resume is not None else None) or anneal_horizon(schedule)
        schedule = make_schedule(end_probabilities=end, anneal_slots=horizon)
    unresumed_steps = schedule.plan().total_steps
    resume_sampler = None
    if resume is not None:  # flag mode's quota is derived from the run's length, not configured
        resume_sampler = dict(resume.sampler, quotas=quotas) if setup.flag_mode else dict(resume.sampler)
        if list(resume_sampler.get("base", [0, 0])) != [0, 0]:  # the global batch changed: plan from there
            schedule.load_state_dict(resume_sampler)
    planned = schedule.plan()
    for i, task in enumerate(tasks):  # generated samples: exactly as many as the run reads (no repeated masks)
        if task.spec.name in sized:
            train_samples[task.spec.name] = kept.get(task.spec.name, planned.micro_batches[i] * task.spec.batch_size)
            ctx.extra["num_samples"] = {"train": train_samples[task.spec.name]}
            train[task.spec.name] = task.load("train")
    ctx.extra.pop("num_samples", None)

    def stream(task):
        return TaskStream(len(train[task.spec.name]), seed=cfg.train.seed, task_index=task.spec.index,
                          batch_size=task.spec.batch_size, shuffle=task.shuffle_examples and task.spec.shuffle,
                          idle=task.spec.name in idle)

    dev, test = {}, {}
    if load_dev:  # the evaluation data too, so a bad row is found before training, not after it
        dev = _eval_splits([task for task in tasks if task.spec.dev_file], "dev", eval_batches,
                           name_key=not setup.flag_mode)
        test = _eval_splits([task for task in tasks if task.spec.is_target and task.spec.test_file], "test",
                            eval_batches, name_key=not setup.flag_mode)
    return RunPlan(tasks=tasks, train=train, dev=dev, test=test, streams=[stream(task) for task in tasks],
                   schedule=schedule, planned=planned, probabilities=probabilities, quotas=quotas,
                   eval_batches=eval_batches, train_samples=train_samples, resume_sampler=resume_sampler,
                   unresumed_steps=unresumed_steps)


def idle_tasks(cfg) -> set:
    """Auxiliary tasks never drawn: PALM sampling with mix_ratio 0 (a task switched off, the other
    tasks of a refine stage). Their programs' heads stay (frozen), their training data is not read."""
    setup = cfg.setup
    if setup.flag_mode or setup.mtl.sampling != "palm":
        return set()
    return {s.name for s in setup.tasks if not s.is_target and s.mix_ratio == 0}


def anneal_horizon(schedule: TaskSchedule) -> int:
    """The micro-batches over which annealed sampling moves (schedule.py): those of the run planned with
    its starting probabilities, fixed when the run starts (a resumed run keeps its checkpoint's)."""
    return max(1, schedule.plan().total_steps * schedule.slots_per_step)


def flag_mode_steps(run_samples: int, topo, resume: Optional[ResumePoint]) -> int:
    """Flag mode's last optimizer step: --max_steps, or after a change of global batch the step at
    which the run's samples (`run_samples`, kept from its first global batch) are consumed: the steps
    before the change plus ceil(remaining samples / global batch)."""
    base_position, base_step = (resume.sampler.get("base", [0, 0]) if resume is not None else [0, 0])
    done = int(base_position) * topo.micro_batch_size  # samples consumed when this global batch began
    return int(base_step) + -(-(int(run_samples) - done) // topo.global_batch_size)


def flag_mode_schedule(cfg, topo, run_samples: int, resume: Optional[ResumePoint]) -> Tuple[int, int, int]:
    """(last optimizer step, the one task's quota, the optimizer steps of its plan from step 0) of a
    flag-mode run whose generated task has `run_samples` training samples: what `prepare` plans."""
    max_steps = flag_mode_steps(run_samples, topo, resume)
    quota = flag_mode_quota(max_steps, topo, resume)
    fresh = TaskSchedule([1.0], [quota], [True], cfg.train.seed, slots_per_step=topo.slots_per_step,
                         max_steps=max_steps)
    return max_steps, quota, fresh.plan().total_steps


def flag_mode_quota(max_steps: int, topo, resume: Optional[ResumePoint]) -> int:
    """The one task's quota in micro-batches: every micro-batch up to `max_steps`."""
    base_position, base_step = (resume.sampler.get("base", [0, 0]) if resume is not None else [0, 0])
    return int(base_position) + (max_steps - int(base_step)) * topo.slots_per_step


def resume_point(ref: Optional[CheckpointRef], continuation: Optional[Continuation], topo):
    """Where the plan of a resumed run starts (`ResumePoint`): checkpoint `ref`'s
    task schedule state for this topology (`regrouped_sampler`) and the samples its generated tasks
    were built with; None for a new run."""
    if ref is None:
        return None
    raw = read_train_state_file(ref.path)
    sampler = (raw["sampler"] if continuation is None
               else regrouped_sampler(raw["sampler"], continuation, topo, where=ref.path))
    kept = dict((raw.get("extra") or {}).get("train_samples") or {})
    # written before they were recorded: its --max_steps global batches
    if not kept and continuation is not None and continuation.flag_mode:
        steps = ((raw.get("config") or {}).get("optim") or {}).get("max_steps")
        tasks = (raw.get("extra") or {}).get("tasks") or []
        if isinstance(steps, int) and tasks and isinstance(tasks[0], dict) and "name" in tasks[0]:
            kept = {tasks[0]["name"]: steps * int(continuation.saved["global_batch_size"])}
    return ResumePoint(sampler=sampler, train_samples=kept)


def regrouped_sampler(sampler: Dict[str, Any], continuation: Continuation, topo, *, where) -> Dict[str, Any]:
    """The task schedule's state for this topology: unchanged when the slots are (the same global
    batch in micro-batches of the same size); in flag mode with another micro batch, the one task's
    slots re-counted in the new size; with another global batch, steps counted from the checkpoint
    (`regroup_state`)."""
    old_micro, new_micro = int(continuation.saved["micro_batch_size"]), int(topo.micro_batch_size)
    scale = continuation.flag_mode and old_micro != new_micro
    if not scale and int(sampler["slots_per_step"]) == topo.slots_per_step:
        return sampler
    try:
        return regroup_state(sampler, slots_per_step=topo.slots_per_step, slot_scale=old_micro if scale else 1,
                             divide=new_micro if scale else 1)
    except ValueError:
        raise CheckpointError(
            f"cannot continue {where} with --micro_batch_size {new_micro}: its {continuation.consumed_samples:,} "
            f"consumed samples are not a whole number of micro-batches of {new_micro}, so the next sample would fall "
            f"inside a micro-batch; use a micro batch that divides {continuation.consumed_samples} "
            f"(e.g. {old_micro}, the checkpoint's)") \
            from None


def resume_checks(cfg, plan) -> Dict[str, Any]:
    """What must not change for a run to continue a checkpoint exactly, besides the global batch (the
    checkpoint store compares those at load time; the dry run too). Hashes the data: compute it once.
    `plan`: a RunPlan (or anything with `tasks` and `unresumed_steps`)."""
    from ernie_mtl.data.identity import data_identity

    o = cfg.optim
    # flag mode: the task's batch_size is --micro_batch_size, which may change with the topology (the
    # global batch is compared by the checkpoint store); a multi-task run's task batch sizes may not
    tasks = [{k: v for k, v in task.spec.to_json().items() if not (cfg.flag_mode and k == "batch_size")}
             for task in plan.tasks]
    return {"seed": cfg.train.seed, "tasks": tasks,
            "data": {task.spec.name: data_identity(task.spec.train_file) for task in plan.tasks},
            "vocab": data_identity(str(cfg.data.vocab_file)),
            "total_steps": plan.unresumed_steps, "warmup_rate": o.warmup_rate, "decay_steps": o.decay_steps,
            # the run's length as asked: a flag-mode plan keeps the checkpoint's samples, so total_steps alone
            # let a changed --max_steps pass unnoticed ("training steps 7..6", nothing trained, exit 0)
            "max_steps": o.max_steps,
            "warmup_steps": o.warmup_steps}  # a checkpoint written before a key lacks it: that key is not compared

def _eval_splits(tasks, split: str, eval_batches: int, *, name_key: bool) -> Dict[str, Any]:
    """{task: data} of the `split` ("dev" or "test") of `tasks`; one ConfigError naming each task's
    `<split>_file` key and the problem (a file that is unreadable, in the wrong format or empty).
    Every rank reads every task's split, so the index-cache barriers of generated corpora match."""
    key = f"{split}_file"
    out, problems = {}, []
    for task in tasks:
        where = f"task {task.spec.name}: {key}" if name_key else f"task {task.spec.name}"
        try:
            out[task.spec.name] = load_eval_split(task, split, eval_batches)
        except ConfigError as e:
            problems += [f"{where}: {p}" for p in e.problems]
            continue
        if len(out[task.spec.name]) == 0:
            what = f"{key} {getattr(task.spec, key)}" if name_key else f"the {split} split of {getattr(task.spec, key)}"
            problems.append(f"task {task.spec.name}: {what} has no examples; give a file with rows after the header, "
                            "or remove the key")
    if problems:
        raise ConfigError(problems)
    return out


def load_eval_split(task, split: str, eval_batches: int):
    """A task's dev or test data; a generated corpus split is sized to what evaluation reads
    (`eval_batches` batches of the task's batch size; the test split ten times that)."""
    if task.sized_by_run:
        batches = eval_batches * (TEST_ITERS_PER_EVAL_ITER if split == "test" else 1)
        task.ctx.extra["num_samples"] = {split: batches * task.spec.batch_size}
        try:
            return task.load(split)
        finally:
            task.ctx.extra.pop("num_samples", None)
    return task.load(split)


# -- warnings about the plan (printed by --dry_run, logged at the start of a run) ---------------------
_REPEAT_FIX = {True: "Use more data, fewer --max_steps, or a smaller --global_batch_size",
               False: "Give it more data, a lower sampling weight (mix_ratio), a shorter run (the targets' "
                      "num_epochs, max_steps) or a smaller batch_size"}  # by flag mode


def corpus_warnings(sources: Sequence[Tuple[str, int, int]], *, what: str, global_batch: int, flag_mode: bool,
                    max_steps: Optional[int] = None) -> List[str]:
    """Warnings about a pretraining corpus (or mixture) read by the plan: a corpus repeated more than
    `REPEAT_WARN_EPOCHS` epochs, and a train split with fewer samples per epoch than one global batch.

    `sources`: (corpus name, samples planned, samples per epoch) per corpus
    (`MixturePlan.epoch_counts`, `TaskType.train_sources`); `what` names the flag or task it comes
    from; `flag_mode` picks the flags the fixes name; `max_steps` (flag mode, where the corpus is
    read in proportion to the steps) adds the largest --max_steps that stays within the threshold."""
    out = []
    for name, planned, per_epoch in sources:
        if per_epoch <= 0:
            continue  # an empty split is refused by the data loader with its own message
        epochs = planned / per_epoch
        if epochs > REPEAT_WARN_EPOCHS:
            steps = int(max_steps * REPEAT_WARN_EPOCHS / epochs) if flag_mode and max_steps else 0
            hint = f"; --max_steps {steps:,} reads it {REPEAT_WARN_EPOCHS} times" if steps >= 1 else ""
            out.append(f"warning: {what}: the plan reads corpus '{name}' {epochs:,.2f} times ({planned:,} train "
                       f"samples planned, {per_epoch:,} per epoch), more than {REPEAT_WARN_EPOCHS} epochs: the "
                       f"model mostly re-reads the same text. {_REPEAT_FIX[flag_mode]}{hint}")
    per_epoch = sum(p for _, _, p in sources)
    if sources and 0 < per_epoch < global_batch:
        out.append(f"warning: {what}: its train split gives {per_epoch:,} samples per epoch, fewer than one global "
                   f"batch ({global_batch:,}): every optimizer step reads some samples more than once. Use more "
                   f"data or a smaller {'--global_batch_size' if flag_mode else 'batch_size'}")
    return out


def plan_warnings(run_plan: RunPlan, topo, *, flag_mode: bool, max_steps: Optional[int] = None) -> List[str]:
    """Everything in a run plan that is legal but rarely meant (warnings, never errors):

    - a pretraining corpus (a task that generates its samples, per corpus of a mixture) read more
      than `REPEAT_WARN_EPOCHS` epochs; in a multi-task run also an *auxiliary* task whose examples
      the schedule repeats that often (a target's epochs are its quota, which `num_epochs` asked for);
    - a task whose training data is smaller than one global batch of the task (batch_size x
      data-parallel ranks x accumulate steps): a step that draws only that task repeats examples.
    """
    dw, acc = topo.data_world_size, topo.accumulate_steps
    out: List[str] = []
    epochs = run_plan.planned.epochs
    for i, task in enumerate(run_plan.tasks):
        name, batch = task.spec.name, task.spec.batch_size
        if len(run_plan.train.get(name, (None,))) == 0:  # never drawn: not read (idle_tasks)
            continue
        global_batch = batch * dw * acc
        sources = task.train_sources()
        if sources is not None:
            out += corpus_warnings(sources, what="--input_dir" if flag_mode else f"task {name}",
                                   global_batch=global_batch, flag_mode=flag_mode, max_steps=max_steps)
            continue
        examples = task.num_train_examples(run_plan.train[name])
        if epochs is not None and not task.spec.is_target and epochs[i] > REPEAT_WARN_EPOCHS:
            out.append(f"warning: task {name} (auxiliary): the plan reads its {examples:,} training examples "
                       f"{epochs[i]:,.2f} times ({run_plan.planned.micro_batches[i]:,} micro-batches of {batch}), "
                       f"more than {REPEAT_WARN_EPOCHS} epochs. {_REPEAT_FIX[False]}")
        if examples < global_batch:
            out.append(f"warning: task {name}: its train data has {examples:,} examples, fewer than one global batch "
                       f"of the task ({batch} per rank x {dw} data-parallel ranks x {acc} micro-batches per step = "
                       f"{global_batch:,}): a step that draws only this task reads examples more than once. Give it "
                       "more data or a smaller batch_size")
    return out
