"""Training state without a topology: what a checkpoint holds by structured name, and whether (and
how) a run on another cluster can continue it.

Names. A static program names its variables by build order (`linear_3.w_0`); the checkpoint's name
map says which structured name (`ernie.encoder.layers.0.linear1.weight`, `heads.<group>.*`) each
parameter is. Everything else a parameter owns is its static name plus a known suffix, so it is
named `<structured name><suffix>` here:

    @EMA                           the EMA average (ernie_mtl/program/ema.py)
    _moment1_0 _moment2_0          AdamW's moments
    _beta1_pow_acc_0 ...           AdamW's beta powers (one per parameter)
    _fp32_master_0                 AMP O2's float32 master weight, and _fp32_master_0_moment1_0 ...
                                   (the optimizer's state of the master weight)

Run-level variables keep their static name (`loss_scaling_0`, `num_good_steps_0`,
`num_bad_steps_0`: AMP's dynamic loss scaling). What belongs to one topology is never carried:
gradient-merge buffers (`<param>@GRAD@GradientMerge`, under sharding `@GRAD@GradiantMerge`) and
counters (`gradient_merge_step`, `_k`, `_zero`, `_acc_step`, `_current_step`) are zero at the
step boundaries the trainer saves at -- that is verified, then they are dropped and the new
program keeps its own; the learning rate variable is fed from the LR scheduler on every run.

A tied parameter (the MLM decoder is the word embedding) appears under its first structured name
in the writer's name map; a reader finds it under any of its names.

Continuing on another topology (`decide`): the run goes on exactly when the global batch is the
checkpoint's (flag mode: samples per step; multi-task: micro-batches per step, each task's
micro-batch being its `batch_size`), whatever the processes, data-parallel and sharding degrees,
micro batch and accumulation: the schedule and the dropout seeds are functions of the slot in the
global batch (ernie_mtl/planning/schedule.py), the sample of a slot a function of the stream
position. Parameters and optimizer state are read from every rank's file and written into each
new rank's program by name (`assignments`; under sharding each rank writes its own shard). A
different global batch changes the optimization: refused unless `--allow_batch_change`.

Pure NumPy: no program, no Paddle (the store reads the files, the session writes the scope).
"""
from __future__ import annotations

import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from data_tools.cli_utils import UserError

# Suffixes of variables owned by one parameter (the empty suffix is the parameter itself).
_OWNED = re.compile(r"^(?:@EMA|(?:_fp32_master_\d+)?(?:_(?:moment\d+|beta\d+_pow_acc|velocity|mean_square|mean_grad)"
                    r"_\d+)?)$")
_MERGE_BUFFER = re.compile(r"^@GRAD@Gradi[ae]ntMerge$")
_MERGE_COUNTERS = ("gradient_merge_step", "gradient_merge_current_step")  # the micro-batch counter: 0 at a boundary
_MERGE_CONSTANTS = ("gradient_merge_k", "gradient_merge_zero", "gradient_merge_acc_step")  # set by the new program
_FED = re.compile(r"^learning_rate_\d+$")  # fed from the LR scheduler on every run
MASTER = re.compile(r"^_fp32_master_\d+$")  # AMP O2's float32 copy of a weight: a weight, not optimizer state
SHOWN = 8  # differences listed in a refusal


class ReshardError(UserError):
    """A checkpoint's state does not fit this run's program (the message lists the first differences)."""


class DamagedTopology(ReshardError):
    """A checkpoint's train_state.json lacks topology keys its saver always writes: damage, not another setting."""


# -- names ---------------------------------------------------------------------------------------------
def aliases(name_map: Mapping[str, str]) -> Dict[str, List[str]]:
    """static name -> its structured names, sorted: the first is the canonical one. Sorted, not in the
    name map's order: train_state.json stores the map with sorted keys, so the live map (the trainer's)
    and a saved one (the offline tools') listed `decoder_bias` and `decoder.bias` of one variable in
    opposite orders, and a portable checkpoint written by training was named otherwise than one written by
    ernie-mtl-reshard ("not the same model")."""
    out: Dict[str, List[str]] = {}
    for structured, static in name_map.items():
        out.setdefault(static, []).append(structured)
    return {static: sorted(names) for static, names in out.items()}


def canonical_names(name_map: Mapping[str, str]) -> Dict[str, str]:
    """Every structured name of `name_map` -> the canonical name of its variable (`aliases`)."""
    return {alias: names[0] for names in aliases(name_map).values() for alias in names}


def split_name(name: str, params: Iterable[str]) -> Optional[Tuple[str, str]]:
    """(parameter, suffix) when static variable `name` is parameter `param` or owned by it (a known
    suffix, or a gradient-merge buffer); None for a run-level variable. The longest parameter wins."""
    params = params if isinstance(params, (set, frozenset, dict)) else set(params)
    if name in params:
        return name, ""
    for cut in range(len(name) - 1, 0, -1):
        if name[cut] in "_@" and name[:cut] in params:
            suffix = name[cut:]
            if _OWNED.match(suffix) or _MERGE_BUFFER.match(suffix):
                return name[:cut], suffix
    return None


def is_transient(name: str, params: Iterable[str]) -> bool:
    """A variable that belongs to one topology or one run (never carried): gradient-merge buffers and
    counters, the fed learning rate."""
    split = split_name(name, params)
    if split is not None:
        return bool(_MERGE_BUFFER.match(split[1]))
    return name in _MERGE_COUNTERS or name in _MERGE_CONSTANTS or bool(_FED.match(name))


def structured_state(merged: Mapping[str, np.ndarray], name_map: Mapping[str, str], *,
                     where: str = "the checkpoint") -> Dict[str, np.ndarray]:
    """A program state (static name -> array, every rank's merged) keyed by structured name (module
    docstring); transient variables are dropped after checking that the gradient-merge buffers and
    the micro-batch counter are zero (a state saved inside an optimizer step cannot be continued on
    another topology: ReshardError)."""
    names = aliases(name_map)
    out: Dict[str, np.ndarray] = {}
    busy = []
    for name in sorted(merged):
        if name.startswith("StructuredToParameterName"):  # paddle's own bookkeeping in .pdparams, not a variable
            continue
        array = np.asarray(merged[name])
        split = split_name(name, names)
        if split is None:
            if name in _MERGE_COUNTERS and np.any(array != 0):
                busy.append(f"{name} = {array.reshape(-1)[:1].tolist()}")
            if not is_transient(name, names):
                out[name] = array
            continue
        param, suffix = split
        if _MERGE_BUFFER.match(suffix):
            if np.any(array != 0):
                busy.append(f"{name} (gradient of {names[param][0]}) is not zero")
            continue
        out[names[param][0] + suffix] = array
    if busy:
        raise ReshardError(f"{where} was saved inside an optimizer step (gradient accumulation had begun: "
                           f"{'; '.join(busy[:SHOWN])}), so its state belongs to that topology; the trainer saves "
                           "at step boundaries only. Resume it with the topology that wrote it, or use a checkpoint "
                           "the trainer wrote")
    return out


def static_state(state: Mapping[str, np.ndarray], name_map: Mapping[str, str]) -> Dict[str, np.ndarray]:
    """A structured state back under the static names of `name_map`'s program (the inverse of
    `structured_state`, transient variables aside): what readers of Paddle-format states expect."""
    static: Dict[str, str] = {}
    for structured, name in name_map.items():
        static.setdefault(structured, name)
    params = set(static)
    out: Dict[str, np.ndarray] = {}
    for key, array in state.items():
        split = split_name(key, params)
        out[key if split is None else static[split[0]] + split[1]] = array
    return out


def parameter_keys(name_map: Mapping[str, str]) -> Dict[str, List[str]]:
    """static parameter -> structured names (for lookups by any alias)."""
    return aliases(name_map)


def assignments(state: Mapping[str, np.ndarray], name_map: Mapping[str, str],
                variables: Mapping[str, Tuple[Sequence[int], str]], *, what: str = "checkpoint",
                only: Optional[str] = None, fresh_prefix: Union[str, Tuple[str, ...], None] = None
                ) -> Dict[str, np.ndarray]:
    """This rank's values from a structured `state`: for every persistable variable of its program
    (`variables`: static name -> (shape, dtype name), e.g. a sharded rank's own shard) that is not
    transient, the state's array by structured name. `only="parameters"` takes the weights alone (a
    warm start: parameters and AMP O2's float32 master weights), `only="parameters+optimizer"`
    parameters, what they own and the run-level state (AMP's loss scale). ReshardError listing
    the first differences (a variable the state lacks, another shape or dtype). A variable whose
    structured name starts with `fresh_prefix` (one or a tuple) and that the state lacks keeps its value
    (a warm start's loss-balancing log-variances, which are not model weights, and heads it starts fresh)."""
    names = aliases(name_map)
    out: Dict[str, np.ndarray] = {}
    missing: List[str] = []
    mismatched: List[str] = []
    for name in sorted(variables):
        if is_transient(name, names):
            continue
        split = split_name(name, names)
        if split is None:
            if only == "parameters":
                continue
            keys = [name]
        else:
            param, suffix = split
            if only == "parameters" and suffix and not MASTER.match(suffix):
                continue
            keys = [alias + suffix for alias in names[param]]
        key = next((k for k in keys if k in state), None)
        if key is None and fresh_prefix and keys[0].startswith(fresh_prefix):
            continue
        if key is None:
            missing.append(keys[0])
            continue
        array = np.asarray(state[key])
        shape, dtype = variables[name]
        if tuple(array.shape) != tuple(int(d) for d in shape):
            mismatched.append(f"{key}: shape {list(array.shape)} in the {what}, {list(shape)} here")
        elif dtype and str(array.dtype) != dtype:
            mismatched.append(f"{key}: {array.dtype} in the {what}, {dtype} here")
        else:
            out[name] = array
    problems = []
    if missing:
        problems.append(f"{len(missing)} of this program's variables are not in the {what}: "
                        f"{', '.join(missing[:SHOWN])}{' ...' if len(missing) > SHOWN else ''}")
    if mismatched:
        problems.append(f"{len(mismatched)} differ in shape or type: {'; '.join(mismatched[:SHOWN])}"
                        f"{' ...' if len(mismatched) > SHOWN else ''}")
    if problems:
        raise ReshardError("; ".join(problems))
    return out


def name_map_differences(saved: Mapping[str, str], now: Mapping[str, str]) -> List[str]:
    """Structured parameter names one map has and the other lacks (the first SHOWN of each side)."""
    lost = sorted(set(saved) - set(now))
    new = sorted(set(now) - set(saved))
    out = []
    if lost:
        out.append(f"{len(lost)} parameter(s) of the checkpoint are not in this model: {', '.join(lost[:SHOWN])}"
                   f"{' ...' if len(lost) > SHOWN else ''}")
    if new:
        out.append(f"{len(new)} parameter(s) of this model are not in the checkpoint: {', '.join(new[:SHOWN])}"
                   f"{' ...' if len(new) > SHOWN else ''}")
    return out


# -- continuing on another topology ----------------------------------------------------------------------
_LAYOUT = ("world_size", "dp_degree", "sharding_degree", "micro_batch_size", "global_batch_size")


def describe_topology(topology: Mapping[str, Any]) -> str:
    """'2 processes (dp 2 x sharding 1), micro batch 4 x accumulation 2, global batch 16'."""
    return (f"{topology.get('world_size')} process{'es' if topology.get('world_size') != 1 else ''} "
            f"(dp {topology.get('dp_degree')} x sharding {topology.get('sharding_degree')}), "
            f"micro batch {topology.get('micro_batch_size')} x accumulation "
            f"{topology.get('accumulate_steps')}, global batch {topology.get('global_batch_size')}")


def slots_per_step(topology: Mapping[str, Any]) -> int:
    """Micro-batches of all ranks per optimizer step of topology dict `topology`."""
    return int(topology["global_batch_size"]) // int(topology["micro_batch_size"])


@dataclass
class Continuation:
    """How a run continues checkpoint `raw` (train_state.json) on the topology `now`.

    kind: "exact" (the topology that wrote it: the program state is loaded as written), "resharded"
    (another layout, the same global batch: the same samples in the same steps, the state regathered
    by name) or "batch_change" (--allow_batch_change: another global batch, from the consumed samples).
    """

    kind: str
    saved: Dict[str, Any]
    now: Dict[str, Any]
    flag_mode: bool
    step: int
    consumed_samples: int
    notes: List[str] = field(default_factory=list)
    path: str = "the checkpoint"

    @property
    def reshards(self) -> bool:
        return self.kind != "exact"

    @property
    def same_masks(self) -> bool:
        """Whether every slot gets the dropout masks of the uninterrupted run (same micro batch and slots)."""
        return (self.saved.get("micro_batch_size") == self.now.get("micro_batch_size")
                and slots_per_step(self.saved) == slots_per_step(self.now))

    def summary(self) -> List[str]:
        """Lines for the log and the dry run: what is continued and how."""
        head = {"exact": "same topology: the program state is loaded as written; the run continues bitwise",
                "resharded": "another topology with the same global batch: parameters and optimizer state are "
                             "regathered by name and split for this layout",
                "batch_change": "another global batch (--allow_batch_change): continued from the consumed samples"}
        lines = [f"resume at step {self.step} ({self.consumed_samples:,} samples consumed): {head[self.kind]}",
                 f"  checkpoint: {describe_topology(self.saved)}",
                 f"  now:        {describe_topology(self.now)}"]
        return lines + [f"  {n}" for n in self.notes]


def decide(raw: Mapping[str, Any], now: Mapping[str, Any], *, flag_mode: bool,
           allow_batch_change: bool = False, where: str = "the checkpoint") -> Continuation:
    """Whether and how checkpoint `raw` continues on topology `now` (Topology.to_dict()); a
    CheckpointError-compatible UserError (ReshardError) names what differs and what would be needed
    when it cannot (a changed global batch without `allow_batch_change`)."""
    if raw.get("weights_only"):
        raise ReshardError(weights_only_refusal(where, raw))
    saved = dict(raw.get("topology") or {})
    lacking = [k for k in _LAYOUT if k not in saved]
    if lacking:
        raise DamagedTopology(f"{Path(str(where)) / 'train_state.json'} is damaged: its topology lacks {lacking}")
    saved.setdefault("accumulate_steps", int(saved["global_batch_size"]) // (
        int(saved["micro_batch_size"]) * int(saved["dp_degree"]) * int(saved["sharding_degree"])))
    now = dict(now)
    step, consumed = int(raw.get("step", 0)), int(raw.get("consumed_samples", 0))
    same_batch = (saved["global_batch_size"] == now["global_batch_size"] if flag_mode
                  else slots_per_step(saved) == slots_per_step(now))
    if all(saved.get(k) == now.get(k) for k in _LAYOUT):
        return Continuation("exact", saved, now, flag_mode, step, consumed, path=where)
    if same_batch:
        c = Continuation("resharded", saved, now, flag_mode, step, consumed, path=where)
        if c.same_masks:
            c.notes.append("exact: the same samples in the same optimizer steps, with the same dropout masks; float "
                           "results equal the uninterrupted run's bitwise when a step's micro-batch gradients are "
                           "summed in the same order (2 processes <-> 1 process with accumulation 2), else within "
                           "float32 rounding (docs/checkpoints.md, 'Changing the cluster')")
        else:
            c.notes.append(f"micro batch {saved['micro_batch_size']} -> {now['micro_batch_size']}: the same samples in "
                           "the same optimizer steps, but a dropout op now draws one mask for a tensor of another "
                           "shape, so the masks (and the losses) differ from the uninterrupted run's; the optimization "
                           "is the same")
        return c
    if not allow_batch_change:
        raise ReshardError(batch_change_refusal(saved, now, flag_mode=flag_mode, consumed=consumed, where=where))
    c = Continuation("batch_change", saved, now, flag_mode, step, consumed, path=where)
    c.notes.append(batch_change_meaning(saved, now, flag_mode=flag_mode))
    return c


def weights_only_refusal(where, raw: Mapping[str, Any]) -> str:
    """The refusal of resuming a weights-only checkpoint (an average: ernie-mtl-reshard --average)."""
    origin = ", ".join(raw.get("averaged_from") or []) or "no optimizer state"
    return (f"{where} holds weights only (the average of {origin}): it cannot be resumed; start a new run from it "
            f"with --init_from {where}")


def batch_change_refusal(saved: Mapping[str, Any], now: Mapping[str, Any], *, flag_mode: bool, consumed: int,
                         where: str) -> str:
    """The refusal of a changed global batch: what changed, how to keep it on this cluster, the flag
    that continues anyway and what that means."""
    world = int(now["dp_degree"]) * int(now["sharding_degree"])
    if flag_mode:
        g, micro = int(saved["global_batch_size"]), int(now["micro_batch_size"])
        what = f"global batch {saved['global_batch_size']} samples per step vs {now['global_batch_size']} now"
        keep = [m for m in (micro, *(micro // d for d in (2, 4, 8) if micro % d == 0))
                if m >= 1 and g % (m * world) == 0]
        fix = (f"keep --global_batch_size {g} (micro batch x {world} data-parallel ranks x accumulation: e.g. "
               f"--micro_batch_size {keep[0]} gives accumulation {g // (keep[0] * world)})" if keep else
               f"keep --global_batch_size {g} with a --micro_batch_size that divides {g // world} "
               f"(= {g} / {world} data-parallel ranks)")
    else:
        s = slots_per_step(saved)
        what = (f"global batch {s} micro-batches per step (--global_batch_size {saved['global_batch_size']} / "
                f"--micro_batch_size {saved['micro_batch_size']}) vs {slots_per_step(now)} now; each task's "
                "micro-batch is its batch_size")
        fix = (f"keep {s} micro-batches per step: --global_batch_size / --micro_batch_size = {s}, e.g. "
               f"--micro_batch_size {now['micro_batch_size']} --global_batch_size {s * int(now['micro_batch_size'])}"
               + ("" if s % world == 0 else f" (a multiple of the {world} data-parallel ranks is needed: run on a "
                                            f"number of processes that divides {s})"))
    return (f"cannot continue {where} with another global batch: {what}. A different global batch changes the "
            f"optimization, so it is not continued by default. To continue the same run here, {fix}. To continue with "
            f"the new batch from the checkpoint's {consumed:,} consumed samples (data position kept by samples, the "
            "learning-rate schedule re-planned by samples), add --allow_batch_change")


def batch_change_meaning(saved: Mapping[str, Any], now: Mapping[str, Any], *, flag_mode: bool) -> str:
    unit = "samples" if flag_mode else "micro-batches"
    a, b = ((saved["global_batch_size"], now["global_batch_size"]) if flag_mode
            else (slots_per_step(saved), slots_per_step(now)))
    return (f"global batch {a} -> {b} {unit} per step: the data continues at the next unread sample (by samples, "
            "not steps); the step counter goes on from the checkpoint; warm-up and decay keep their positions in "
            f"{'samples' if flag_mode else 'micro-batches'} (the LR at a step is the original schedule's at the same "
            "amount of data); the run still ends after the planned amount of data")
