"""What a run will do, computed identically on every rank before any program is built: the task
objects and their data, the seeded task schedule, each task's example stream, and the planned
number of optimizer steps (the LR schedule's horizon). `--dry_run` prints it; the trainer runs it.

Flag-mode pretraining is the one task `pretrain`, a target whose quota is `--max_steps` optimizer
steps (so the plan is exactly --max_steps long). A task type that generates its examples
(`sized_by_run`: a pretraining corpus) gets exactly the samples the run reads: the planned
micro-batches x batch x data-parallel ranks for training, `eval_iters` global batches for each
evaluation, ten times that for the final test split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ernie_mtl.config import ConfigError
from ernie_mtl.schedule import (Plan, TaskSchedule, TaskStream, sampling_probabilities, steps_per_epoch,
                                target_quotas)

TEST_ITERS_PER_EVAL_ITER = 10  # the final test split takes 10 x eval_iters global batches (PaddleNLP)


@dataclass
class RunPlan:
    """Tasks with their data, the schedule and the planned length."""

    tasks: List[Any]  # TaskType instances, in task_instance order
    train: Dict[str, Any]  # task -> TaskData of its training split
    dev: Dict[str, Any]  # task -> TaskData of its dev split (tasks with a dev file)
    test: Dict[str, Any]  # task -> TaskData of its test split (targets with a test file), read before training
    streams: List[TaskStream]  # this rank's reading order per task
    schedule: TaskSchedule
    planned: Plan
    probabilities: Sequence[float]
    quotas: Sequence[Optional[int]]
    eval_batches: int  # batches of a non-full-dev task's evaluation (eval_iters global batches)

    def task(self, name: str):
        return next(t for t in self.tasks if t.spec.name == name)


def prepare(cfg, *, info, topo, barrier, log: Callable[[str], None], is_builder: Optional[bool] = None,
            load_dev: bool = True) -> RunPlan:
    """Task objects, their train/dev data, the schedule and its plan (every rank calls it: index
    caches are built by `is_builder` -- global rank 0, or each node's local rank 0 without a shared
    filesystem -- and the others wait at `barrier`)."""
    from data_tools.index_cache import is_index_builder
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    setup = cfg.setup
    m = setup.mtl
    if is_builder is None:
        is_builder = is_index_builder(info.rank, info.local_rank, cfg.data.share_folder)
    ctx = TaskContext(vocab_file=str(cfg.data.vocab_file), seed=cfg.train.seed, model_type=cfg.model.model_type,
                      rank=info.rank, world_size=info.world_size, barrier=barrier, log=log, is_builder=is_builder,
                      cache_dir=cfg.data.data_cache)
    tasks = [get_task_type(spec.reader)(spec, ctx) for spec in setup.tasks]
    dw, acc = topo.data_world_size, topo.accumulate_steps
    eval_batches = cfg.train.eval_iters * acc * dw
    sized = {t.spec.name for t in tasks if t.sized_by_run}
    train = {}
    for t in tasks:
        if t.spec.name not in sized:  # generated corpora are loaded once their size is planned
            log(f"reading task {t.spec.name} ({t.name}): train {t.spec.train_file}")
            train[t.spec.name] = t.load("train")
    for t in tasks:  # a generated corpus: its natural size (one epoch) tells the schedule its epochs
        if t.spec.name in sized and not setup.flag_mode:
            train[t.spec.name] = t.load("train")
        elif t.spec.name in sized:  # flag mode: the size is the plan's (--max_steps global batches)
            ctx.extra["num_samples"] = {"train": cfg.optim.max_steps * topo.global_batch_size}
            train[t.spec.name] = t.load("train")
            sized.discard(t.spec.name)
    empty = [f"task {t.spec.name}: train file {t.spec.train_file} has no examples; give a file with rows after the "
             "header" for t in tasks if len(train[t.spec.name]) == 0]
    if empty:
        raise ConfigError(empty)
    sizes = [t.num_train_examples(train[t.spec.name]) for t in tasks]
    probabilities = sampling_probabilities(m.sampling, mix_ratio=[t.spec.mix_ratio for t in tasks], num_examples=sizes,
                                           temperature=m.temperature, examples_cap=m.examples_cap)
    if setup.flag_mode:  # the one target's quota: exactly --max_steps optimizer steps
        quotas: List[Optional[int]] = [cfg.optim.max_steps * acc]
    else:
        quotas = target_quotas(num_examples=sizes, batch_sizes=[t.spec.batch_size for t in tasks], data_parallel=dw,
                               is_target=[t.spec.is_target for t in tasks], num_epochs=m.num_epochs,
                               task_num_epochs=[t.spec.num_epochs for t in tasks],
                               mix_ratio=[t.spec.mix_ratio for t in tasks] if m.sampling == "palm" else None)
    schedule = TaskSchedule(probabilities, quotas, [t.spec.is_target for t in tasks], cfg.train.seed,
                            accumulate_steps=acc, max_steps=cfg.optim.max_steps, names=[t.spec.name for t in tasks],
                            steps_per_epoch=[steps_per_epoch(n, t.spec.batch_size, dw) for n, t in zip(sizes, tasks)])
    planned = schedule.plan()
    for i, t in enumerate(tasks):  # generated samples: exactly as many as the run reads (no repeated masks)
        if t.spec.name in sized:
            ctx.extra["num_samples"] = {"train": planned.micro_batches[i] * t.spec.batch_size * dw}
            train[t.spec.name] = t.load("train")
    ctx.extra.pop("num_samples", None)

    def stream(t):
        return TaskStream(len(train[t.spec.name]), seed=cfg.train.seed, task_index=t.spec.index,
                          examples_per_micro=t.spec.batch_size * dw, micro_batch_size=t.spec.batch_size,
                          data_rank=topo.data_rank(info.rank), shuffle=t.shuffle_examples)

    dev, test = {}, {}
    if load_dev:  # the evaluation data too, so a bad row is found before training, not after it
        dev = _eval_splits([t for t in tasks if t.spec.dev_file], "dev", eval_batches, name_key=not setup.flag_mode)
        test = _eval_splits([t for t in tasks if t.spec.is_target and t.spec.test_file], "test", eval_batches,
                            name_key=not setup.flag_mode)
    return RunPlan(tasks=tasks, train=train, dev=dev, test=test, streams=[stream(t) for t in tasks],
                   schedule=schedule, planned=planned, probabilities=probabilities, quotas=quotas,
                   eval_batches=eval_batches)


def _eval_splits(tasks, split: str, eval_batches: int, *, name_key: bool) -> Dict[str, Any]:
    """{task: data} of the `split` ("dev" or "test") of `tasks`; one ConfigError naming each task's
    `<split>_file` key and the problem (a file that is unreadable, in the wrong format or empty).
    Every rank reads every task's split, so the index-cache barriers of generated corpora match."""
    key = f"{split}_file"
    out, problems = {}, []
    for t in tasks:
        where = f"task {t.spec.name}: {key}" if name_key else f"task {t.spec.name}"
        try:
            out[t.spec.name] = load_eval_split(t, split, eval_batches)
        except ConfigError as e:
            problems += [f"{where}: {p}" for p in e.problems]
            continue
        if len(out[t.spec.name]) == 0:
            what = f"{key} {getattr(t.spec, key)}" if name_key else f"the {split} split of {getattr(t.spec, key)}"
            problems.append(f"task {t.spec.name}: {what} has no examples; give a file with rows after the header, "
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
