"""Checkpoints written offline by `ernie-mtl-reshard` (ernie_mtl/convert/reshard_cli.py): a checkpoint of
either format and any topology as a portable one (`convert_checkpoint`), and the mean of several
checkpoints' weights (`average_checkpoints`). Both verify their inputs first and never write over an
input, a resumable checkpoint or a run's output folder (`store.output_problem`); the result appears
complete or not at all."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ernie_mtl.checkpoint.errors import CheckpointError
from ernie_mtl.checkpoint.portable import FORMAT, grouped, write_groups
from ernie_mtl.checkpoint.store import output_problem, read_train_state_file, structured_state_of, verify_files


def _write_checkpoint(out: os.PathLike, raw: Mapping, state: Mapping[str, np.ndarray], *, overwrite: bool,
                      inputs: Sequence[os.PathLike] = (), **fields) -> Path:
    """A complete portable checkpoint folder `out` from train state `raw` and structured `state`:
    written in a hidden temporary folder (tensor files, the writer's record, train_state.json last)
    and renamed into place; an existing `out` is refused unless `overwrite`, and never replaced when it is
    one of `inputs` (or inside one), a resumable checkpoint or a run's output folder (`output_problem`).
    A write that fails (a full disk) names `out` and leaves nothing behind."""
    import shutil

    from data_tools.cli_utils import write_error
    from ernie_mtl.checkpoint.io import fsync_dir, replace_dir, write_json_atomic
    from ernie_mtl.checkpoint.layout import KEPT, SUMS, TRAIN_STATE, state_prefix
    from ernie_mtl.checkpoint.reshard import aliases
    out = Path(out)
    kept = KEPT.match(out.name)
    if kept and int(kept.group(1)) != int(raw["step"]):
        raise CheckpointError(f"{out}: a folder named model_<step> must hold that step; this checkpoint is at step "
                              f"{raw['step']} (name it model_{raw['step']}, or anything not model_<number>)")
    problem = output_problem(out, inputs, flag="--output")
    if problem:
        raise CheckpointError(problem)
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} exists; choose another --output or pass --overwrite to replace it")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        parameters = {names[0] for names in aliases(raw.get("name_map") or {}).values()}
        files = write_groups(tmp, grouped(state, parameters))
        write_json_atomic(state_prefix(tmp, 0).with_suffix(SUMS), files)
        write_json_atomic(tmp / TRAIN_STATE, {**{k: v for k, v in raw.items() if k != "files"}, **fields,
                                              "state_format": FORMAT, "files": files})
        fsync_dir(tmp)
        replace_dir(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        unchanged = f" ({out} is as it was)" if out.exists() else ""
        raise CheckpointError(str(write_error(e, str(out), f"nothing was written{unchanged}"))) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def convert_checkpoint(source: os.PathLike, out: os.PathLike, *, overwrite: bool = False) -> Tuple[Path, int]:
    """Checkpoint `source` (either format, written by any topology; verified) as a portable checkpoint
    `out` that resumes, warm starts and converts like the source. Returns (out, tensors)."""
    raw = read_train_state_file(source)
    verify_files(source, raw)
    state = structured_state_of(source, raw)
    return _write_checkpoint(out, raw, state, overwrite=overwrite, inputs=[source]), len(state)


def average_checkpoints(sources: Sequence[os.PathLike], out: os.PathLike, *, overwrite: bool = False
                        ) -> Tuple[Path, int]:
    """The mean of the weights (parameters and AMP master weights) of several checkpoints of one model
    (the same structured names and shapes), as a weights-only portable checkpoint `out`: warm start
    from it (--init_from) or convert it; resuming it is refused (it has no optimizer state). The train
    state is the last source's. Returns (out, parameters averaged)."""
    from ernie_mtl.checkpoint.reshard import MASTER, aliases, split_name

    if len(sources) < 2:
        raise CheckpointError("--average needs at least two checkpoints")
    problem = output_problem(out, sources, flag="--output")  # before reading gigabytes of inputs
    if problem:
        raise CheckpointError(problem)
    weights: List[Dict[str, np.ndarray]] = []
    raws = []
    for source in sources:
        raw = read_train_state_file(source)
        verify_files(source, raw)
        params = {names[0] for names in aliases(raw.get("name_map") or {}).values()}
        state = structured_state_of(source, raw)
        keep = {}
        for key, array in state.items():
            split = split_name(key, params)
            if split is not None and (split[1] == "" or MASTER.match(split[1])):
                keep[key] = array
        weights.append(keep)
        raws.append(raw)
    first = weights[0]
    for source, other in zip(sources[1:], weights[1:]):
        if set(other) != set(first) or any(other[k].shape != first[k].shape for k in first):
            differ = sorted(k for k in set(first) | set(other)
                            if k not in first or k not in other or other[k].shape != first[k].shape)
            raise CheckpointError(f"{source} does not hold the weights of {sources[0]} (names or shapes differ: "
                                  f"{', '.join(differ[:8])}{' ...' if len(differ) > 8 else ''}); average checkpoints "
                                  "of one model")
    mean = {k: np.mean(np.stack([w[k].astype(np.float64) for w in weights]), axis=0).astype(first[k].dtype)
            for k in first}
    note = {"weights_only": True, "averaged_from": [f"{Path(s)} (step {r['step']})" for s, r in zip(sources, raws)]}
    return _write_checkpoint(out, raws[-1], mean, overwrite=overwrite, inputs=sources, **note), len(mean)
