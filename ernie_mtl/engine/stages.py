"""The two-stage recipe of MT-DNN as one run: the multi-task stage, then each target refined alone from
the multi-task weights, in the same output folder and the same processes. (MT-DNN: Liu et al. 2019.)

    output_dir/                      the multi-task stage (its checkpoints, best_<task>, test results)
      refine/<task>/                 target <task>'s refine stage: the same layout again
      <task>/infer_model/            the refined export (what --do_predict and --do_eval read)
      <task>/infer_model_multitask/  the multi-task stage's export of <task> (--stage multitask)
      test_results.json              <task>: the refined {last, best}, and {multitask: {last, best}}
      stages.json                    which stages are complete, their settings and results

A refine stage is the run's own program (the same tasks and heads, so the same parameter names) with
a schedule that draws only its target: the other tasks get mix_ratio 0 (never drawn, their data not
read, their heads frozen) and no dev or test split. It warm-starts from the multi-task stage's final
weights (`refine_from: last`, MT-DNN) or the target's best checkpoint (`best`) with a fresh optimizer,
its own LR schedule (refine_learning_rate, refine_warmup_proportion), budget (refine_steps or
refine_epochs) and early stopping on the target's dev metric. Loss balancing and annealed sampling do
not apply to one task and are off there.

Resume. Each stage resumes its own checkpoints (`--resume auto`); `stages.json`, written by rank 0
when a stage completes, lets the command run again after a stop skip what is done, so a run
interrupted anywhere -- inside a stage or between two -- ends as the uninterrupted one does. A stage
recorded complete whose settings changed since is refused (its results would not be the settings'),
and when the multi-task stage trains again every refine stage after it starts over.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from ernie_mtl.checkpoint.io import write_json_atomic
from ernie_mtl.checkpoint.layout import (REFINE_DIR, STAGES_FILE, TEST_RESULTS, best_dir, export_dir, is_complete,
                                         last_dir, multitask_export_dir, refine_dir)
from ernie_mtl.config import ConfigError
from ernie_mtl.planning.refine import REFINE_KEYS, refine_budget, refine_config, refine_targets

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.config import RunConfig

STAGES_VERSION = 1
MULTITASK = "multitask"
# TrainConfig fields that say how a run is operated, not what it computes
_OPERATIONAL = ("output_dir", "resume", "overwrite_output_dir", "logging_freq", "cpu_kernels", "preempt_signals",
                "keep_last", "dry_run", "do_predict", "do_eval", "task", "pred_file", "predict_output", "eval_file",
                "checkpoint", "eval_output", "init_from", "init_optimizer", "slow_rank_factor", "loss_spike_factor",
                "stage")


def multitask_config(cfg: RunConfig):
    """The multi-task stage's RunConfig: the run's, which the refine keys do not change."""
    return cfg


def stage_key(cfg: RunConfig) -> str:
    """A digest of what a stage computes (its model, optimizer, tasks and data files, seed): the same key,
    the same results. Operational settings (where, how often to log, threads, kernels) are left out."""
    from ernie_mtl.data.identity import data_identity
    from ernie_mtl.planning.plan import idle_tasks

    d: Dict[str, Any] = dict(cfg.to_dict())
    d["train"] = {k: v for k, v in d["train"].items() if k not in _OPERATIONAL}
    # callbacks and plugins observe a run (a resume may add or drop them); the task types they register are
    # named by the tasks' readers
    d["mtl"] = {k: v for k, v in d["mtl"].items() if k not in REFINE_KEYS + ("callbacks", "plugins")}
    d["tasks"] = [{k: v for k, v in spec.to_json().items() if k not in REFINE_KEYS} for spec in cfg.setup.tasks]
    d["data"] = {k: v for k, v in d["data"].items() if k not in ("num_workers", "worker_timeout", "data_cache")}
    idle = idle_tasks(cfg)
    d["identity"] = {spec.name: data_identity(spec.train_file) for spec in cfg.setup.tasks if spec.name not in idle}
    text = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# -- the record -------------------------------------------------------------------------------------------
def read_record(output_dir) -> Dict[str, Any]:
    """stages.json (an empty record when there is none). A damaged file is refused: it decides what runs."""
    from data_tools.safe_io import read_json_bounded

    path = Path(output_dir) / STAGES_FILE
    if not path.is_file():
        return {"version": STAGES_VERSION, "stages": {}}
    try:
        record = read_json_bounded(path, max_bytes=1 << 20, what="stages record")
    except (OSError, ValueError) as e:
        raise ConfigError([f"{path} is damaged ({e}); it records which stages of the run are complete. Remove it "
                           "and the refine/ folder to train the refine stages again (the multi-task stage "
                           "resumes from its checkpoints)"]) from None
    if not isinstance(record, dict) or record.get("version") != STAGES_VERSION or \
            not isinstance(record.get("stages"), dict):
        raise ConfigError([f"{path}: not a stages record of this version (version {STAGES_VERSION} with 'stages'); "
                           "remove it and the refine/ folder to train the refine stages again"])
    return record


def multitask_done(record: Dict[str, Any], key: str, where: Path) -> bool:
    """Whether the multi-task stage is recorded complete with settings `key` (ConfigError when complete with
    others: its checkpoints are what the refine stages start from)."""
    entry = record["stages"].get(MULTITASK)
    if not isinstance(entry, dict) or not entry.get("done"):
        return False
    if entry.get("key") != key:
        raise ConfigError([f"{where / STAGES_FILE}: the multi-task stage is complete with other settings than this "
                           "run's (model, optimizer, tasks, data or seed changed since); its results would not be "
                           "this configuration's, nor those of the refine stages that start from it. Restore the "
                           "settings, or start over with --resume none --overwrite_output_dir (or another "
                           "--output_dir)"])
    return True


# -- promotion of a refined target's outputs ----------------------------------------------------------------
def promote_export(output_dir, target: str) -> Optional[Path]:
    """Make the refined export `output_dir/<target>/infer_model` and keep the multi-task one as
    infer_model_multitask. Safe to repeat after a crash at any point: infer_model_multitask, once there,
    is the multi-task export (the multi-task stage removes it when it trains again)."""
    refined = export_dir(refine_dir(output_dir, target), target)
    if not refined.is_dir():
        return None
    final, kept = export_dir(output_dir, target), multitask_export_dir(output_dir, target)
    tmp = final.with_name(".infer_model.refined")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(refined, tmp)
    if final.exists() and not kept.exists():
        final.rename(kept)
    elif final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def merged_test_results(multitask: Dict[str, Any], refined: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """test_results.json of a run with refine stages: a refined target's {last, best} are the refined
    model's, with the multi-task stage's under `multitask`; other targets as the multi-task stage wrote."""
    out = {k: dict(v) for k, v in multitask.items()}
    for task, result in refined.items():
        if task in result:
            entry = dict(result[task])
            if task in multitask:
                entry[MULTITASK] = {k: v for k, v in multitask[task].items() if k in ("last", "best")}
            out[task] = entry
    return out


# -- running ------------------------------------------------------------------------------------------------
@dataclass
class StageRun:
    """What running one stage gave back: its result, and the job it ran in (for the next stage)."""

    result: Any  # engine.run.RunResult
    process: Any  # engine.session.Process


def run_stages(cfg: RunConfig, run_stage: Callable[[Any, Optional[Any], str], StageRun],
               process) -> Tuple[Any, Dict[str, Any]]:
    """Run the multi-task stage then each refine stage (module docstring) in `process` (the job, set up
    once); `run_stage(stage_cfg, process, label)` trains one. Returns (the multi-task stage's RunResult or
    None when it was complete already, {target: the refine stage's RunResult or its record})."""
    out = Path(cfg.train.output_dir)
    info, barrier, log = process.info, process.barrier, process.log
    rank0 = info.rank == 0
    targets = refine_targets(cfg)
    fresh = cfg.train.resume == "none"
    if fresh and cfg.train.overwrite_output_dir and rank0:  # the earlier run's refine stages go with it
        shutil.rmtree(out / REFINE_DIR, ignore_errors=True)
        (out / STAGES_FILE).unlink(missing_ok=True)
    barrier("stages: overwrite")
    record = barrier.share("stages record", read_record(out) if rank0 else None)
    if fresh or cfg.train.resume != "auto":  # a new run, or the multi-task stage from a named checkpoint
        record = {"version": STAGES_VERSION, "stages": {}}
    key0 = stage_key(multitask_config(cfg))
    results: Dict[str, Any] = {}
    first = None
    if multitask_done(record, key0, out):
        log.info(f"stage 1 (multi-task) is complete ({out / STAGES_FILE}): going on with the refine stages")
        multitask_test = record["stages"][MULTITASK].get("test", {})
    else:
        ran = run_stage(cfg, process, "stage 1: multi-task")
        first, process = ran.result, ran.process
        multitask_test = dict(first.test)
        record = {"version": STAGES_VERSION, "stages": {MULTITASK: {
            "done": True, "key": key0, "steps": first.steps, "test": multitask_test,
            "last": str(last_dir(out)) if is_complete(last_dir(out)) else None}}}
        if rank0:  # the stages after it start over from the new weights
            shutil.rmtree(out / REFINE_DIR, ignore_errors=True)
            for target in targets:
                shutil.rmtree(multitask_export_dir(out, target), ignore_errors=True)
            write_json_atomic(out / STAGES_FILE, record)
        barrier("stages: multi-task done")
    for k, target in enumerate(targets, start=2):
        start = _start_of(cfg, target, out)
        stage_cfg = refine_config(cfg, target, init_from=str(start))
        key = stage_key(stage_cfg) + ":" + refine_budget(cfg, target).start
        entry = record["stages"].get(target)
        if isinstance(entry, dict) and entry.get("key") == key and entry.get("done"):
            log.info(f"stage {k} (refine {target}) is complete: {refine_dir(out, target)}")
            results[target] = entry
            continue
        if rank0:
            if isinstance(entry, dict) and entry.get("key") != key:  # its settings changed: it trains again
                log.info(f"stage {k} (refine {target}): its settings changed since {refine_dir(out, target)} was "
                         "trained; it trains again from the multi-task weights")
                shutil.rmtree(refine_dir(out, target), ignore_errors=True)
            record["stages"][target] = {"done": False, "key": key}
            write_json_atomic(out / STAGES_FILE, record)
        barrier(f"stages: refine {target} starts")
        ran = run_stage(stage_cfg, process, f"stage {k}: refine {target} ({refine_budget(cfg, target).describe()})")
        process = ran.process
        results[target] = ran.result
        if rank0:
            promoted = promote_export(out, target)
            record["stages"][target] = {"done": True, "key": key, "steps": ran.result.steps,
                                        "test": dict(ran.result.test), "from": str(start),
                                        "export": str(promoted) if promoted else None}
            refined_tests = {stage: r["test"] for stage, r in record["stages"].items() if stage != MULTITASK}
            write_json_atomic(out / TEST_RESULTS, merged_test_results(multitask_test, refined_tests))
            write_json_atomic(out / STAGES_FILE, record)
        barrier(f"stages: refine {target} done")
    return first, {"record": record, "refined": results, "multitask_test": multitask_test}


def _start_of(cfg: RunConfig, target: str, out: Path) -> Path:
    """The checkpoint a refine stage warm-starts from (refine_from: last, or best with last as fallback)."""
    if cfg.setup.mtl.refine_from == "best" and is_complete(best_dir(out, target)):
        return best_dir(out, target)
    if not is_complete(last_dir(out)):
        raise ConfigError([f"the refine stage of {target} starts from the multi-task stage's model_last, which "
                           f"{out} lacks (removed?); run the multi-task stage again (--resume none "
                           "--overwrite_output_dir)"])
    return last_dir(out)
