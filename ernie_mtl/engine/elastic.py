"""The cluster changes between runs: how a checkpoint continues on this topology, writing a
checkpoint's state into this rank's program by name, and warm starts (`--init_from`).

Resume (`continuation_for`): the checkpoint `--resume` designates is compared with this run's
topology before any data or program work (ernie_mtl/checkpoint/reshard.decide): the same topology
loads its files as written (bitwise, as always); another topology with the same global batch reads
every rank's state and writes each variable this rank holds (`write_state`); another global batch
is refused unless `--allow_batch_change`. The decision is logged, and `--dry_run` prints it.

Warm start (`warm_start`): `--init_from` a checkpoint (any topology) or a PaddleNLP directory loads
the weights (with `--init_optimizer`, the optimizer state too) into a NEW run: step 0, this run's
LR schedule and task schedule. Names and shapes must match this model; a refusal lists the first
differences. (ERNIE issues 398 and 514: a warm start that kept a finished LR schedule at 0.)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

import numpy as np

from ernie_mtl.checkpoint.layout import is_complete
from ernie_mtl.checkpoint.reshard import (Continuation, DamagedTopology, ReshardError, assignments, decide,
                                          name_map_differences, structured_state)
from ernie_mtl.checkpoint.store import (CheckpointError, CheckpointRef, merged_state, read_train_state_file,
                                        verified_state)

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session
    from ernie_mtl.config import RunConfig


def continuation_for(cfg: RunConfig, ref: Optional[CheckpointRef], topo, *, log=None) -> Optional[Continuation]:
    """How the run continues checkpoint `ref` on `topo` (None for a new run); CheckpointError when it
    cannot (the message says what would be needed)."""
    if ref is None:
        return None
    raw = read_train_state_file(ref.path)
    try:
        c = decide(raw, topo.to_dict(), flag_mode=cfg.flag_mode, allow_batch_change=cfg.train.allow_batch_change,
                   where=str(ref.path))
    except DamagedTopology as e:  # the store's refusal of damage: nothing changed, the intact checkpoints listed
        from ernie_mtl.checkpoint.store import damaged_refusal

        raise CheckpointError(damaged_refusal(cfg.train.output_dir, ref.path, str(e), exclude=ref.path)) from None
    except ReshardError as e:
        raise CheckpointError(str(e)) from None
    if log is not None and c.kind != "exact":
        for line in c.summary():
            log(line)
    return c


def program_variables(program) -> Dict[str, tuple]:
    """{name: (shape, dtype name)} of the persistable tensors of `program` (this rank's: a sharded rank
    holds its own parameters' state only)."""
    from paddle.base import core
    from paddle.base.data_feeder import convert_dtype

    out = {}
    for v in program.list_vars():
        if v.persistable and v.type == core.VarDesc.VarType.LOD_TENSOR:
            out[v.name] = (tuple(v.shape), convert_dtype(v.dtype))
    return out


def portable_state(session: Session, choose) -> Dict[str, Dict[str, np.ndarray]]:
    """This rank's persistable tensors by structured name, grouped by file
    (ernie_mtl/checkpoint/portable.py), for the groups `choose(all group names)` returns: only those
    are copied from the device. Transient variables (gradient merge, the fed learning rate) are left out."""
    from ernie_mtl.checkpoint.portable import group_of
    from ernie_mtl.checkpoint.reshard import aliases, is_transient, split_name

    p, scope = session.programs, session.scope
    names = aliases(p.name_map)
    parameters = {structured[0] for structured in names.values()}
    members: Dict[str, Dict[str, str]] = {}
    for name in program_variables(p.state_program):  # not the loss sums (program/loss_sums.py)
        if is_transient(name, names):
            continue
        split = split_name(name, names)
        key = name if split is None else names[split[0]][0] + split[1]
        members.setdefault(group_of(key, parameters), {})[key] = name
    chosen = set(choose(sorted(members)))
    return {group: {key: np.array(scope.find_var(static).get_tensor()) for key, static in keys.items()}
            for group, keys in members.items() if group in chosen}


def write_state(session: Session, state: Dict[str, np.ndarray], what: str, *, only: Optional[str] = None,
                fresh_prefix=None) -> int:
    """Write a structured state (ernie_mtl/checkpoint/reshard.py) into this rank's training program:
    every persistable variable it holds that is not transient (`only` narrows to parameters, or
    parameters and what they own); ReshardError listing the first differences, nothing written then.
    Returns how many variables were written."""
    import paddle

    programs, scope = session.programs, session.scope
    values = assignments(state, programs.name_map, program_variables(programs.state_program), what=what, only=only,
                         fresh_prefix=fresh_prefix)
    place = session.exe.place if session.exe is not None else paddle.CPUPlace()
    for name, array in values.items():
        var = scope.find_var(name)
        if var is None:
            raise ReshardError(f"{name} is in this program but not in its scope (run the startup program first)")
        var.get_tensor().set(np.array(array, order="C", copy=False), place)
    return len(values)


def is_checkpoint(path) -> bool:
    return is_complete(path)


def check_init_from(path: str, *, with_optimizer: bool) -> None:
    """--init_from is a checkpoint folder or a PaddleNLP directory (UserError otherwise), and
    --init_optimizer needs a checkpoint: checked before any data or program work."""
    from data_tools.cli_utils import UserError

    folder = Path(path)
    if is_checkpoint(folder):
        if with_optimizer:
            from ernie_mtl.checkpoint.store import read_train_state_file

            raw = read_train_state_file(folder)
            if raw.get("weights_only"):
                n = len(raw.get("averaged_from") or [])
                raise UserError(f"--init_optimizer: --init_from {folder} is weights only (the mean of {n} "
                                "checkpoints by ernie-mtl-reshard --average) and "
                                "holds no optimizer state; drop --init_optimizer (the optimizer starts fresh), or warm "
                                "start from one of the averaged checkpoints")
        return
    if not (folder / "model_state.pdparams").is_file():
        raise UserError(f"--init_from {folder} is neither a checkpoint (train_state.json) nor a PaddleNLP model "
                        "directory (model_state.pdparams); point it at output_dir/model_last, a model_<step> or "
                        "best_<task> folder, or a directory save_pretrained() wrote")
    if with_optimizer:
        raise UserError(f"--init_optimizer: --init_from {folder} is a PaddleNLP model directory, which holds no "
                        "optimizer state; drop --init_optimizer or give a checkpoint folder")


def warm_start(session: Session, path: str, *, with_optimizer: bool) -> str:
    """`--init_from` a checkpoint folder, for a new run whose programs are initialised: its weights
    (any topology; with the optimizer state when `with_optimizer`) written into this rank's program.
    (A PaddleNLP directory is loaded by the programs' initialisation instead, as --model_name_or_path
    weights are: `Programs.weights`.) UserError (exit 2) naming the first differences when names or
    shapes do not match. Returns the line to log."""
    from data_tools.cli_utils import UserError

    folder = Path(path)
    try:
        raw = verified_state(folder, use="warm start from")
    except CheckpointError as e:
        raise UserError(f"--init_from {folder}: {e}") from None
    from ernie_mtl.program.forward import BALANCE_PREFIX, model_names

    # what must match: the backbone, and each head the checkpoint has (by its group: the first task's name).
    # A head of this model the checkpoint lacks starts fresh (the heads of a refine stage's other tasks, a
    # single-task run warm-started from a multi-task one); the checkpoint's other heads are not used. The
    # loss-balancing log-variances are not model weights: taken when both runs have them, else fresh.
    saved, mine = model_names(raw.get("name_map") or {}), model_names(session.programs.name_map)
    saved_heads = {h for h in map(_head, saved) if h is not None}
    my_heads = {h for h in map(_head, mine) if h is not None}
    fresh_heads, unused_heads = sorted(my_heads - saved_heads), sorted(saved_heads - my_heads)
    differences = name_map_differences({k: v for k, v in saved.items() if _head(k) not in unused_heads},
                                       {k: v for k, v in mine.items() if _head(k) not in fresh_heads})
    if differences:
        raise UserError(f"--init_from {folder}: its parameters do not match this model: " + "; ".join(differences)
                        + ". Warm start from a checkpoint of the same architecture (its task heads are taken by "
                        "task name), or convert its backbone with static_to_dynamic.py and pass that directory")
    try:
        state = structured_state(merged_state(folder, verify=False), raw["name_map"], where=str(folder))
        fresh = (BALANCE_PREFIX, *(f"heads.{h}." for h in fresh_heads))
        n = write_state(session, state, f"checkpoint {folder}",
                        only="parameters+optimizer" if with_optimizer else "parameters", fresh_prefix=fresh)
    except ReshardError as e:
        raise UserError(f"--init_from {folder}: {e}") from None
    what = "weights and optimizer state" if with_optimizer else "weights"
    notes = "".join([f"; the head(s) of {', '.join(fresh_heads)} start fresh (not in the checkpoint)"
                     if fresh_heads else "",
                     f"; its head(s) of {', '.join(unused_heads)} are not used" if unused_heads else ""])
    return (f"warm start from {folder}: its {what} ({n} variables; it was at step {raw['step']}){notes}; "
            "a new run from step 0 with this run's LR schedule and task schedule")


def _head(structured: str) -> Optional[str]:
    """The head group of a structured parameter name (`heads.<group>.<key>`), else None."""
    return structured.split(".", 2)[1] if structured.startswith("heads.") else None


def batch_ratio(continuation: Continuation, topo) -> float:
    """New global batch / the checkpoint's, in the units the schedule counts (flag mode: samples;
    multi-task: micro-batches of the tasks' own batch sizes)."""
    from ernie_mtl.checkpoint.reshard import slots_per_step

    if continuation.flag_mode:
        return topo.global_batch_size / int(continuation.saved["global_batch_size"])
    return topo.slots_per_step / slots_per_step(continuation.saved)
