"""Checkpoint layout, policy and train state for static-graph runs.

Layout under `output_dir`::

    model_last/            rolling checkpoint, every `checkpoint_steps`
    model_<step>/          kept checkpoint, every `save_steps` (the newest `keep_last` are kept)
        state/rank_<r>.pdparams, .pdopt   program state (parameters, optimizer moments, AMP and
                                          gradient-merge state). Rank 0 only, unless the program
                                          differs per rank (sharding): then every rank writes its own.
        train_state.json                  written LAST: step, consumed samples, LR scheduler, RNG,
                                          sampler state, resolved config, topology, name map.

A checkpoint is complete when its `train_state.json` exists. Everything is first written into a
hidden temporary folder and renamed into place, so a crash at any instant leaves the previous
checkpoint loadable; resume picks the complete checkpoint with the highest step among
`model_last`, `model_<step>` and a rolling backup left by an interrupted swap.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

TRAIN_STATE = "train_state.json"
STATE_DIR = "state"
_KEPT = re.compile(r"^model_(\d+)$")
_BACKUP = ".model_last.old"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, found or resumed from."""


@dataclass
class TrainState:
    """Everything besides the program state that an exact resume needs."""

    step: int
    consumed_samples: int
    lr_scheduler: Dict = field(default_factory=dict)
    rng: Dict = field(default_factory=dict)
    sampler: Dict = field(default_factory=dict)
    config: Dict = field(default_factory=dict)
    topology: Dict = field(default_factory=dict)
    name_map: Dict[str, str] = field(default_factory=dict)
    extra: Dict = field(default_factory=dict)

    def to_json(self) -> Dict:
        return {"format": 1, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **self.__dict__}

    @classmethod
    def from_json(cls, data: Mapping) -> "TrainState":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


def _write_json_atomic(path: Path, data: Mapping) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_train_state(path: Path) -> Optional[TrainState]:
    """The train state of a checkpoint folder, or None when it is incomplete/unreadable."""
    try:
        with open(Path(path) / TRAIN_STATE, encoding="utf-8") as f:
            return TrainState.from_json(json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def find_latest(output_dir: os.PathLike) -> Optional[CheckpointRef]:
    """The complete checkpoint with the highest step in `output_dir`, or None."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    candidates = [root / "model_last", root / _BACKUP] + [p for p in root.iterdir() if _KEPT.match(p.name)]
    best = None
    for path in candidates:
        state = read_train_state(path) if path.is_dir() else None
        if state is not None and (best is None or state.step > best.step):
            best = CheckpointRef(path, state.step)
    return best


class Checkpointer:
    """Writes and finds checkpoints; owns the layout and the retention policy.

    `save_program_state(prefix)` / `load_program_state(prefix)` are the only calls that touch the
    framework (paddle.static.save/load of this rank's program); `barrier` synchronises ranks.
    """

    def __init__(self, output_dir: os.PathLike, *, rank: int, world_size: int, per_rank_state: bool,
                 save_program_state: Callable[[str], None], load_program_state: Callable[[str], None],
                 barrier: Optional[Callable[[], None]] = None, keep_last: int = 3,
                 log: Callable[[str], None] = print):
        if keep_last < 1:
            raise ValueError(f"--keep_last {keep_last} must be >= 1 (permanent checkpoints to keep)")
        self.root = Path(output_dir)
        self.rank = rank
        self.world_size = world_size
        self.per_rank_state = per_rank_state
        self._save_state = save_program_state
        self._load_state = load_program_state
        self._barrier = barrier or (lambda: None)
        self.keep_last = keep_last
        self.log = log

    # -- writing -------------------------------------------------------------------------
    def save(self, name: str, state: TrainState) -> Path:
        """Write checkpoint `name` ("model_last" or "model_<step>") atomically on all ranks."""
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # leftover of a crashed save
            (tmp / STATE_DIR).mkdir(parents=True)
        self._barrier()
        if self.rank == 0 or self.per_rank_state:
            self._save_state(str(tmp / STATE_DIR / f"rank_{self.rank}"))
        self._barrier()
        if self.rank == 0:
            _write_json_atomic(tmp / TRAIN_STATE, {**state.to_json(), "per_rank_state": self.per_rank_state,
                                                   "world_size": self.world_size})
            _fsync_dir(tmp)
            self._swap_into_place(tmp, final)
            if _KEPT.match(name):
                self._prune()
            self.log(f"saved checkpoint {final} (step {state.step})")
        self._barrier()
        return final

    def _swap_into_place(self, tmp: Path, final: Path) -> None:
        backup = self.root / _BACKUP if final.name == "model_last" else final.with_name(f".{final.name}.old")
        shutil.rmtree(backup, ignore_errors=True)
        if final.exists():
            os.rename(final, backup)  # the previous checkpoint stays complete under the backup name
        os.rename(tmp, final)
        _fsync_dir(self.root)
        shutil.rmtree(backup, ignore_errors=True)

    def _prune(self) -> None:
        for ref in kept_checkpoints(self.root)[:-self.keep_last]:
            shutil.rmtree(ref.path, ignore_errors=True)
            self.log(f"removed old checkpoint {ref.path} (keep_last={self.keep_last})")

    # -- reading -------------------------------------------------------------------------
    def resolve(self, resume: str) -> Optional[CheckpointRef]:
        """`auto` -> newest complete checkpoint in output_dir (None if there is none);
        `none` -> None; a path -> that checkpoint (error if incomplete)."""
        if resume == "none":
            return None
        if resume == "auto":
            return find_latest(self.root)
        state = read_train_state(Path(resume))
        if state is None:
            raise CheckpointError(f"--resume {resume}: no complete checkpoint there ({TRAIN_STATE} missing "
                                  "or unreadable); point it at a model_last or model_<step> folder")
        return CheckpointRef(Path(resume), state.step)

    def load(self, ref: CheckpointRef, *, topology: Mapping, check: Mapping) -> TrainState:
        """Restore this rank's program state from `ref` and return its train state.

        Refuses when `topology` or any `check` value (e.g. global batch size) differs from what
        the checkpoint was written with, since the run could not continue exactly.
        """
        with open(ref.path / TRAIN_STATE, encoding="utf-8") as f:
            raw = json.load(f)
        state = TrainState.from_json(raw)
        diffs = [f"{k}: checkpoint {state.topology.get(k)!r} vs now {v!r}"
                 for k, v in topology.items() if state.topology.get(k) != v]
        saved_checks = raw.get("extra", {}).get("resume_checks", {})
        diffs += [f"{k}: checkpoint {saved_checks.get(k)!r} vs now {v!r}"
                  for k, v in check.items() if k in saved_checks and saved_checks[k] != v]
        if diffs:
            raise CheckpointError(
                f"cannot resume exactly from {ref.path}: " + "; ".join(diffs) +
                ". Restore those settings, or start a fresh run with another --output_dir or --resume none.")
        source_rank = self.rank if raw.get("per_rank_state") else 0
        prefix = ref.path / STATE_DIR / f"rank_{source_rank}"
        if not Path(f"{prefix}.pdparams").exists():
            raise CheckpointError(f"checkpoint {ref.path} lacks {prefix}.pdparams for rank {self.rank}")
        self._load_state(str(prefix))
        return state


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def kept_checkpoints(output_dir: os.PathLike) -> List[CheckpointRef]:
    """Permanent checkpoints in step order."""
    root = Path(output_dir)
    refs = [CheckpointRef(p, int(m.group(1))) for p in root.iterdir() if (m := _KEPT.match(p.name))] if root.is_dir() else []
    return sorted(refs, key=lambda r: r.step)
