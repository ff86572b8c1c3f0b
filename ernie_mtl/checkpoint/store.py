"""The checkpoint store: writes, finds, verifies and loads checkpoints (integrity, retention, train state).

Layout under `output_dir`::

    model_last/            rolling checkpoint, every `checkpoint_steps`
    model_<step>/          kept checkpoint, every `save_steps` (the newest `keep_last` are kept)
    best_<task>/           the best checkpoint of each target (multi-task)
        state/rank_<r>.pdparams, .pdopt   program state (parameters; optimizer moments, AMP, gradient-merge
                                          and EMA state). Rank 0 only, unless the program differs per rank
                                          (sharding): then every rank writes its own.
        state/rank_<r>.sha1              each rank's own checksums of its two files (it hashes them itself)
        train_state.json                  written LAST: step, consumed samples, LR scheduler, sampler state,
                                          resolved config, topology, name map, and `files`: every file of
                                          the checkpoint with its size and SHA-1.

A checkpoint is complete when its `train_state.json` exists and parses. Everything is first written
into a hidden temporary folder and renamed into place, so a crash at any instant leaves the previous
checkpoint loadable; a failed save (disk full, permissions) removes its temporary folder and leaves
every existing checkpoint as it was.

Integrity. Before anything is loaded or written, resume validates the chosen checkpoint entirely:
`train_state.json` parses, holds every key the saver writes with the right types, and its values
agree with each other (`state_problems`: step vs folder name, LR scheduler, task schedule, consumed
samples); every file it lists exists with its size and SHA-1, each rank's own `.sha1` record agrees
with that list, every rank's state is there; a state file that passes all that but cannot be read
is named as damaged (not blamed on the configuration). `--resume auto` never skips a damaged newest
checkpoint silently (it would train from scratch over it): it refuses, names the damaged file and
lists the intact checkpoints to pass with `--resume PATH` (`Checkpointer.damaged_message`, also for
a damaged `--resume PATH`). `--resume none` in a folder that holds checkpoints refuses too, unless
`--overwrite_output_dir` says to replace them. Every other reader (`--do_eval --checkpoint`, the
converter) goes through `verified_state`, the same checks.
"""
from __future__ import annotations

import json
import re
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ernie_mtl.checkpoint.errors import CheckpointError  # noqa: F401  (re-exported: the package's error)
from ernie_mtl.checkpoint.io import fsync_dir as _fsync_dir, sha1_of, write_json_atomic as _write_json_atomic
from ernie_mtl.checkpoint.layout import (BEST_PREFIX, KEPT, LAST, LAST_BACKUP, STATE_DIR, SUMS,  # noqa: F401
                                         TRAIN_STATE, is_complete, kept_name, state_prefix)

_KEPT = KEPT
_BACKUP = LAST_BACKUP
_FORMAT = 2  # 1: no file checksums (read, without the integrity check)


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
        return {"format": _FORMAT, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **self.__dict__}

    @classmethod
    def from_json(cls, data: Mapping) -> "TrainState":
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


# -- reading and validating ---------------------------------------------------------------------------
_TYPES: Dict[str, Tuple[type, ...]] = {"step": (int,), "consumed_samples": (int,), "lr_scheduler": (dict,),
                                       "sampler": (dict,), "config": (dict,), "topology": (dict,),
                                       "name_map": (dict,), "extra": (dict,), "files": (dict,), "world_size": (int,)}
# every key `Checkpointer.save` writes (format 2); a checkpoint without one was not written whole by it
_REQUIRED = ("step", "consumed_samples", "lr_scheduler", "sampler", "config", "topology", "name_map", "extra",
             "files", "world_size", "per_rank_state")


def read_train_state_file(path: os.PathLike) -> Dict[str, Any]:
    """The parsed `train_state.json` of checkpoint folder `path`; CheckpointError naming the file and
    the defect otherwise: missing, not JSON, a required key absent, a field of the wrong type or out
    of range, or fields that contradict each other (`state_problems`)."""
    file = Path(path) / TRAIN_STATE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{file} is missing: {path} is not a complete checkpoint") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file} is damaged (not valid JSON: {e})") from None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read it ({e.strerror})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} is damaged (a JSON {type(raw).__name__}, not an object)")
    bad = [f"{k} is {type(raw[k]).__name__} {raw[k]!r:.40}, expected {'/'.join(kind.__name__ for kind in types)}"
           for k, types in _TYPES.items() if k in raw and (not isinstance(raw[k], types) or isinstance(raw[k], bool))]
    required = _REQUIRED if _format(raw) >= 2 else ("step", "name_map")
    missing = [f"no {k!r}" for k in required if k not in raw]
    if not isinstance(raw.get("per_rank_state", False), bool):
        bad.append(f"per_rank_state is {raw['per_rank_state']!r:.40}, expected true or false")
    if _is_int(raw.get("world_size")) and raw["world_size"] < 1:
        bad.append(f"world_size {raw['world_size']} is not a number of processes")
    problems = bad + missing or state_problems(raw, Path(path).name)
    if problems:
        raise CheckpointError(f"{file} is damaged: " + "; ".join(problems))
    return raw


def _format(raw: Mapping) -> int:
    value = raw.get("format", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 2


def _is_int(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def state_problems(raw: Mapping, folder_name: str = "") -> List[str]:
    """What contradicts itself in a train state whose fields have the right types: a negative step or
    sample count, or a step that disagrees with the folder name `model_<step>`, the LR scheduler's
    step count, the task schedule's position (slots drawn = step x slots per step, counted from the
    schedule's base after a change of global batch) or the consumed samples (slots per task x its
    batch size). Each value is
    written by the trainer at the same instant, so a disagreement means the file was edited or
    damaged; checks whose fields are absent (a hand-made or older state) are skipped."""
    step, consumed = raw["step"], raw.get("consumed_samples", 0)
    problems = [f"{k} {v} is negative" for k, v in (("step", step), ("consumed_samples", consumed))
                if _is_int(v) and v < 0]
    if problems:
        return problems
    kept = _KEPT.match(folder_name)
    if kept and int(kept.group(1)) != step:
        problems.append(f"step {step} disagrees with the folder name {folder_name} (saved at step {kept.group(1)})")
    last_epoch = (raw.get("lr_scheduler") or {}).get("last_epoch")
    if last_epoch is not None and last_epoch != step:
        problems.append(f"step {step} disagrees with lr_scheduler.last_epoch {last_epoch!r} (the optimizer steps "
                        "the learning-rate schedule counted)")
    sampler = raw.get("sampler") or {}
    position, per_step, counts = sampler.get("position"), sampler.get("slots_per_step"), sampler.get("counts")
    base = sampler.get("base", [0, 0])
    if not (isinstance(base, list) and len(base) == 2 and _is_int(*base)):
        problems.append(f"sampler.base {base!r} is not [position, step]")
        base = [0, 0]
    if _is_int(position, per_step) and int(per_step or 0) > 0 and \
            position != base[0] + (step - base[1]) * int(per_step or 0):
        problems.append(f"step {step} disagrees with sampler.position {position} (micro-batches drawn: {per_step} "
                        f"per optimizer step"
                        + (f" from position {base[0]} at step {base[1]}" if base != [0, 0] else "")
                        + ")")
    if not (isinstance(counts, list) and _is_int(*counts) and _is_int(position)):
        return problems
    if sum(counts) != position:
        problems.append(f"sampler.counts {counts} do not sum to sampler.position {position}")
    tasks = (raw.get("extra") or {}).get("tasks")
    sizes = [((task or {}).get("spec") or {}).get("batch_size") for task in tasks] if isinstance(tasks, list) else []
    if len(sizes) == len(counts) and _is_int(*sizes, consumed):
        expected = sum(c * b for c, b in zip(counts, sizes))
        if consumed != expected:
            problems.append(f"consumed_samples {consumed} disagrees with the task schedule's {expected} "
                            f"(micro-batches per task {counts} x batch sizes {sizes})")
    return problems


def check_differences(raw: Mapping[str, Any], check: Mapping[str, Any], *, free: Sequence[str] = ()) -> List[str]:
    """What in `check` (this run's resume checks: seed, tasks, data identity, LR horizon) differs from
    what checkpoint `raw` recorded, as 'key: checkpoint X vs now Y' (keys in `free` may differ)."""
    saved = (raw.get("extra") or {}).get("resume_checks", {})
    return [f"{k}: checkpoint {saved.get(k)!r} vs now {v!r}"
            for k, v in check.items() if k in saved and saved[k] != v and k not in free]


def resume_refusal(path: os.PathLike, diffs: Sequence[str]) -> str:
    """The refusal of a resume whose settings differ from the checkpoint's (`check_differences`)."""
    longer = any(d.startswith(("max_steps:", "total_steps:")) for d in diffs)
    hint = (" A run's length is part of its schedule (the learning-rate decay, the data each step reads): to train "
            f"on from these weights, start a new run with --init_from {path} --init_optimizer and another "
            "--output_dir." if longer else "")
    return (f"cannot resume exactly from {path}: " + "; ".join(diffs) +
            ". Restore those settings, or start a fresh run with another --output_dir or --resume none." + hint)


def read_train_state(path: Path) -> Optional[TrainState]:
    """The train state of a checkpoint folder, or None when it is incomplete or unreadable."""
    try:
        return TrainState.from_json(read_train_state_file(path))
    except CheckpointError:
        return None


def verify_files(path: os.PathLike, raw: Optional[Mapping] = None, *, ranks: Optional[List[int]] = None) -> None:
    """Check every file a checkpoint lists (size and SHA-1), that each rank's own record
    (`state/rank_<r>.sha1`) agrees with the list, and that the program state of `ranks` (default:
    every rank that wrote one) is there. CheckpointError naming the first defect."""
    path = Path(path)
    raw = raw if raw is not None else read_train_state_file(path)
    files = raw.get("files")
    if _format(raw) >= 2 and not isinstance(files, dict):
        raise CheckpointError(f"{path / TRAIN_STATE} is damaged: no file list")
    world = int(raw.get("world_size", 1))
    wanted = ranks if ranks is not None else (list(range(world)) if raw.get("per_rank_state") else [0])
    fmt = raw.get("state_format", "paddle")
    if fmt not in STATE_FORMATS:
        raise CheckpointError(f"{path / TRAIN_STATE} is damaged: state_format {fmt!r} is none of {list(STATE_FORMATS)} "
                              "(the trainer writes one of them)")
    if not is_portable(raw) and (path / "tensors").is_dir() and not any((path / STATE_DIR).glob("rank_*.pdparams")):
        raise CheckpointError(f"{path / TRAIN_STATE} is damaged: it says the Paddle format, but the folder holds "
                              "tensors/ and no state/rank_<r>.pdparams, the files of the portable format (its "
                              "state_format was edited)")
    if is_portable(raw):
        wanted = []  # files named by tensor, not by rank: `files` and the ranks' records cover them
        if isinstance(files, dict):
            _check_portable_records(path, files)
    for r in wanted:
        for ext in (".pdparams", ".pdopt"):
            rel = f"{STATE_DIR}/rank_{r}{ext}"
            if not (path / rel).is_file():
                raise CheckpointError(f"{path / rel} is missing from checkpoint {path} (rank {r}'s program state)")
    if isinstance(files, dict):
        _check_rank_records(path, files)
    for rel, entry in (files or {}).items():
        file = path / rel
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path / TRAIN_STATE} is damaged: its entry for {rel} is {entry!r:.60}, not "
                                  "a size and SHA-1")
        if not file.is_file():
            raise CheckpointError(f"{file} is missing from checkpoint {path}")
        size = file.stat().st_size
        if size != entry.get("size"):
            raise CheckpointError(f"{file} is damaged: {size} bytes, the checkpoint recorded {entry.get('size')} "
                                  "(truncated or replaced)")
        if sha1_of(file) != entry.get("sha1"):
            raise CheckpointError(f"{file} is damaged: its SHA-1 differs from the one recorded when it was saved")


def _check_portable_records(path: Path, files: Mapping[str, Any]) -> None:
    """A portable checkpoint's ranks each recorded the tensor files they wrote (state/rank_<r>.sha1):
    together the records must be `files`, entry for entry, and there must be tensor files."""
    from ernie_mtl.checkpoint.portable import TENSORS

    recorded: Dict[str, Any] = {}
    for sums in sorted((path / STATE_DIR).glob(f"rank_*{SUMS}")):
        try:
            mine = json.loads(sums.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{sums} is damaged (not valid JSON: {e})") from None
        if not isinstance(mine, dict):
            raise CheckpointError(f"{sums} is damaged (not a JSON object)")
        recorded.update(mine)
    on_disk = {f"{TENSORS}/{p.name}" for p in (path / TENSORS).glob("*")} if (path / TENSORS).is_dir() else set()
    extra = sorted(on_disk - set(files))
    if extra:
        raise CheckpointError(f"{path / extra[0]} is not listed in {path / TRAIN_STATE}"
                              f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: the checkpoint's save did "
                              "not write it, and its tensors would be loaded with the others; remove it (or resume "
                              "another checkpoint)")
    if recorded != dict(files):
        differ = sorted(rel for rel in set(recorded) | set(files) if recorded.get(rel) != files.get(rel))
        raise CheckpointError(f"the ranks' records in {path / STATE_DIR} disagree with {path / TRAIN_STATE} about "
                              f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''} (size or SHA-1, or a record "
                              "is missing): the checkpoint is damaged")
    if not any(rel.startswith(f"{TENSORS}/") for rel in files):
        raise CheckpointError(f"{path / TRAIN_STATE} lists no tensor file: the checkpoint is damaged")


def _check_rank_records(path: Path, files: Mapping[str, Any]) -> None:
    """Each rank hashed its own files (`state/rank_<r>.sha1`) and rank 0 copied them into
    train_state.json's `files`: the two records must be equal, entry for entry."""
    ranks = sorted({m.group(1) for rel in files if (m := re.match(rf"^{STATE_DIR}/rank_(\d+)\.", rel))}, key=int)
    for r in ranks:
        sums = state_prefix(path, int(r)).with_suffix(SUMS)
        mine = {rel: entry for rel, entry in files.items() if rel.startswith(f"{STATE_DIR}/rank_{r}.")}
        try:
            recorded = json.loads(sums.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{sums} is missing from checkpoint {path} (rank {r}'s record of its "
                                  "files)") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{sums} is damaged (not valid JSON: {e})") from None
        except OSError as e:
            raise CheckpointError(f"{sums}: cannot read it ({e.strerror})") from None
        if recorded != mine:
            differ = sorted(rel for rel in set(recorded) | set(mine)
                            if not isinstance(recorded, dict) or recorded.get(rel) != mine.get(rel))
            raise CheckpointError(f"{sums} disagrees with {path / TRAIN_STATE} about {', '.join(differ)} (size or "
                                  "SHA-1): one of the two records was changed after the save, so the checkpoint "
                                  "is damaged")


def _candidates(root: Path) -> List[Path]:
    names = [root / LAST, root / _BACKUP] + [p for p in root.iterdir() if _KEPT.match(p.name)]
    return [p for p in names if p.is_dir()]


def _looks_like_checkpoint(path: Path) -> bool:
    return (path / TRAIN_STATE).exists() or (path / STATE_DIR).is_dir()


def scan(output_dir: os.PathLike) -> Tuple[List[CheckpointRef], List[Tuple[Path, str]]]:
    """(intact checkpoints by step, damaged ones with the reason) among model_last, model_<step> and
    an interrupted swap's backup; intact = train_state.json valid and every listed file checks out."""
    root = Path(output_dir)
    if not root.is_dir():
        return [], []
    intact, damaged = [], []
    for path in _candidates(root):
        if not _looks_like_checkpoint(path):
            continue
        try:
            raw = read_train_state_file(path)
            verify_files(path, raw)
        except CheckpointError as e:
            damaged.append((path, str(e)))
            continue
        intact.append(CheckpointRef(path, int(raw["step"])))
    return sorted(intact, key=lambda ref: ref.step), damaged


def intact_checkpoints(output_dir: os.PathLike, *, exclude: Optional[os.PathLike] = None) -> List[CheckpointRef]:
    """Every intact checkpoint folder of an output directory (model_last, model_<step>, best_<task>),
    by step: what to suggest when a checkpoint given to a command is damaged."""
    found = []
    for path in existing_outputs(output_dir):
        if exclude is not None and path.resolve() == Path(exclude).resolve():
            continue
        try:
            raw = read_train_state_file(path)
            verify_files(path, raw, ranks=[])
        except CheckpointError:
            continue
        found.append(CheckpointRef(path, int(raw["step"])))
    return sorted(found, key=lambda ref: ref.step)


def verified_state(path: os.PathLike, *, use: str) -> Dict[str, Any]:
    """The train state of checkpoint `path` after the checks resume makes (train_state.json field by
    field, every listed file's size and SHA-1, the ranks' own records); CheckpointError naming the
    damaged file, the intact checkpoints beside it and `use` ("evaluate", "convert") otherwise."""
    path = Path(path)
    try:
        raw = read_train_state_file(path)
        verify_files(path, raw, ranks=[])
    except CheckpointError as e:
        others = intact_checkpoints(path.parent, exclude=path)
        listed = (f"intact checkpoints beside it: {', '.join(f'{r.path} (step {r.step})' for r in reversed(others))}"
                  if others else "no intact checkpoint is beside it")
        raise CheckpointError(f"{e}; nothing was changed: {use} an intact checkpoint instead ({listed})") from None
    return raw


def find_latest(output_dir: os.PathLike) -> Optional[CheckpointRef]:
    """The intact checkpoint with the highest step in `output_dir`, or None."""
    intact, _ = scan(output_dir)
    return intact[-1] if intact else None


def existing_outputs(output_dir: os.PathLike) -> List[Path]:
    """Checkpoint folders (any state) of an output directory: what a fresh run would overwrite."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p.name == LAST or _KEPT.match(p.name)
                                                               or p.name.startswith(BEST_PREFIX))
                  and _looks_like_checkpoint(p))


def output_problem(out: os.PathLike, inputs: Sequence[os.PathLike], *, flag: str) -> Optional[str]:
    """Why an offline tool (ernie-mtl-reshard, static_to_dynamic.py) must not write `out`, even with
    --overwrite, or None: it is one of its `inputs`, inside one or holds one; it is a checkpoint a run can
    resume (a weights-only average may be replaced); or it holds such checkpoints (a run's output folder)."""
    target = Path(out).resolve()
    for source in inputs:
        src = Path(source).resolve()
        if target == src or src in target.parents or target in src.parents:
            relation = "is" if target == src else ("is inside" if src in target.parents else "holds")
            return (f"{flag} {out} {relation} the input {source}: the output would write over what it is read from; "
                    f"choose another {flag}")
    if (target / TRAIN_STATE).is_file():
        try:
            raw = read_train_state_file(target)
        except CheckpointError:
            raw = {}
        if not raw.get("weights_only"):
            return (f"{flag} {out} is a checkpoint a run can resume (step {raw.get('step', '?')}); no tool replaces "
                    f"one, --overwrite or not: choose another {flag} (or delete it yourself if it is no longer "
                    "needed)")
    held = existing_outputs(target)
    if held:
        return (f"{flag} {out} holds the checkpoints of a run ({', '.join(p.name for p in held[:4])}"
                f"{' ...' if len(held) > 4 else ''}); no tool replaces them: choose another {flag}")
    return None


class Checkpointer:
    """Writes and finds checkpoints; owns the layout, the integrity checks and the retention policy.

    `save_program_state(prefix)` / `load_program_state(prefix)` are the only calls that touch the
    framework (paddle.static.save/load of this rank's program); `write_state(state, what)` writes a
    structured state (ernie_mtl/checkpoint/reshard.py) into this rank's program, for a checkpoint
    written by another topology or in the portable format; `portable_state(choose)` returns this
    rank's tensors by structured name for the groups `choose(all groups)` picks (state_format
    "portable": ernie_mtl/checkpoint/portable.py); `barrier` synchronises ranks.
    """

    def __init__(self, output_dir: Union[str, os.PathLike], *, rank: int, world_size: int, per_rank_state: bool,
                 save_program_state: Callable[[str], None], load_program_state: Callable[[str], None],
                 barrier: Optional[Callable[..., None]] = None, keep_last: int = 3,
                 log: Callable[[str], None] = print,
                 write_state: Optional[Callable[[Dict[str, Any], str], Any]] = None,
                 topology: Optional[Mapping[str, Any]] = None, state_format: str = "paddle",
                 portable_state: Optional[Callable[[Callable[[List[str]], List[str]]], Dict[str, Any]]] = None,
                 checkpoint_steps: int = 1000, save_steps: int = 10000):
        if keep_last < 1:
            raise ValueError(f"--keep_last {keep_last} must be >= 1 (permanent checkpoints to keep)")
        self.root = Path(output_dir)
        self.rank = rank
        self.world_size = world_size
        self.per_rank_state = per_rank_state
        self._save_state = save_program_state
        self._load_state = load_program_state
        self._barrier = barrier or (lambda *args, **kwargs: None)
        self.keep_last = keep_last
        self.log = log
        self._write_state = write_state
        if state_format not in STATE_FORMATS:
            raise ValueError(f"state_format {state_format!r} is not one of {STATE_FORMATS}")
        if state_format == "portable" and portable_state is None:
            raise ValueError("the portable format needs portable_state (this rank's tensors by structured name)")
        self.state_format = state_format
        self._portable_state = portable_state
        self.topology = dict(topology) if topology is not None else None  # this run's (Topology.to_dict())
        self.checkpoint_steps, self.save_steps = checkpoint_steps, save_steps
        self.saved_at: Dict[str, int] = {}  # name -> the step it was last saved at by this process

    # -- when -------------------------------------------------------------------------------------
    def due(self, step: int, *, done: bool = False) -> List[str]:
        """The checkpoints due after optimizer step `step` (`done`: the run's last step): model_last every
        `checkpoint_steps` steps and at the end, model_<step> every `save_steps` steps."""
        names = [LAST] if step % self.checkpoint_steps == 0 or done else []
        return names + ([kept_name(step)] if step % self.save_steps == 0 else [])

    # -- writing -------------------------------------------------------------------------
    def save(self, name: str, state: TrainState) -> Path:
        """Write checkpoint `name` ("model_last", "model_<step>", "best_<task>") atomically on all ranks.
        A failure on any rank (disk full, permissions) removes the temporary folder, leaves every
        existing checkpoint untouched and raises CheckpointError on every rank."""
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        error: Union[BaseException, str, None] = None
        began = time.perf_counter()
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)  # leftover of a crashed save
                (tmp / STATE_DIR).mkdir(parents=True)
            except OSError as e:
                error = e
        error = self._agree("checkpoint folder", error)
        if error is None and self.state_format == "portable":
            try:
                self._save_portable(tmp)
            except Exception as e:  # noqa: BLE001  (an OSError for a full disk, or the format's own error)
                error = e
        elif error is None and (self.rank == 0 or self.per_rank_state):
            try:
                prefix = state_prefix(tmp, self.rank)
                self._save_state(str(prefix))
                sums = {f"{STATE_DIR}/rank_{self.rank}{ext}": {"size": Path(f"{prefix}{ext}").stat().st_size,
                                                               "sha1": sha1_of(Path(f"{prefix}{ext}"))}
                        for ext in (".pdparams", ".pdopt")}
                _write_json_atomic(Path(f"{prefix}{SUMS}"), sums)
            except Exception as e:  # noqa: BLE001  (paddle raises OSError or its own errors for a full disk)
                error = e
        error = self._agree("program state", error)
        if error is None and self.rank == 0:
            try:
                files: Dict[str, Any] = {}
                for record in sorted((tmp / STATE_DIR).glob(f"rank_*{SUMS}")):
                    files.update(json.loads(record.read_text(encoding="utf-8")))
                extra = {"state_format": "portable"} if self.state_format == "portable" else {}
                _write_json_atomic(tmp / TRAIN_STATE, {**state.to_json(), "per_rank_state": self.per_rank_state,
                                                       "world_size": self.world_size, "files": files, **extra})
                _fsync_dir(tmp)
                self._swap_into_place(tmp, final)
                if _KEPT.match(name):
                    self._prune()
            except Exception as e:  # noqa: BLE001
                error = e
        error = self._agree("train state", error)
        if error is not None:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write checkpoint {final}: {error}; the previous checkpoints are "
                                  "unchanged (free disk space or fix the permissions of --output_dir, then run the "
                                  "same command again to resume)")
        if self.rank == 0:
            self.log(f"saved checkpoint {final} (step {state.step}) in {time.perf_counter() - began:.2f} s"
                     f"{' (portable format)' if self.state_format == 'portable' else ''}")
        self.saved_at[name] = state.step
        return final

    def _save_portable(self, tmp: Path) -> None:
        """This rank's part of a portable checkpoint (ernie_mtl/checkpoint/portable.py): under sharding
        the groups its program holds, otherwise its share of them (every rank writes in parallel);
        the run-level group on rank 0. Its files' sizes and SHA-1s go to state/rank_<r>.sha1."""
        from ernie_mtl.checkpoint.portable import RUN_GROUP, share, write_groups

        def choose(groups: List[str]) -> List[str]:
            if self.per_rank_state:  # sharded: the program holds this rank's own parameters only
                return [g for g in groups if g != RUN_GROUP or self.rank == 0]
            return share(groups, self.rank, self.world_size)

        assert self._portable_state is not None, "a portable checkpoint needs the portable_state callable"
        groups = self._portable_state(choose)
        sums = write_groups(tmp, groups)
        _write_json_atomic(state_prefix(tmp, self.rank).with_suffix(SUMS), sums)

    def _agree(self, what: str, error: Union[BaseException, str, None]) -> Optional[str]:
        """Meet the other ranks; every rank returns the first failure of any rank (as text), or None.
        `error` may be an earlier stage's agreed text: it is passed on unchanged."""
        from data_tools.cli_utils import IO_FIXES, describe_os_error

        if isinstance(error, str):  # agreed by every rank already: the same text everywhere
            self._barrier(what)
            return error
        if error is None:
            mine = None
        elif isinstance(error, OSError):
            mine = describe_os_error(error) if error.filename else f"{error.strerror or error}" + (
                f"; {fix}" if (fix := IO_FIXES.get(error.errno)) else "")
        else:
            mine = f"{type(error).__name__}: {str(error).strip()[:300]}"
        self._barrier(what)
        if self.world_size == 1:
            return mine
        # every rank publishes its outcome; rank 0 collects them (through the job's store)
        reports = self._share_all(what, mine)
        return next((f"rank {r}: {m}" for r, m in enumerate(reports) if m), None)

    def _share_all(self, what: str, mine: Optional[str]) -> List[Optional[str]]:
        gather = getattr(self._barrier, "gather", None)
        return gather(what, mine) if gather is not None else [mine]

    def _swap_into_place(self, tmp: Path, final: Path) -> None:
        backup = self.root / _BACKUP if final.name == LAST else final.with_name(f".{final.name}.old")
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
    def resolve(self, resume: str, *, overwrite: bool = False) -> Optional[CheckpointRef]:
        """`auto` -> the newest intact checkpoint in output_dir (None if the folder holds none);
        `none` -> None, refused when checkpoints exist unless `overwrite`; a path -> that checkpoint,
        validated. Never skips a damaged newest checkpoint: CheckpointError says which file is
        damaged and which intact checkpoints can be resumed instead."""
        if resume == "none":
            existing = existing_outputs(self.root)
            if existing and not overwrite:
                raise CheckpointError(
                    f"--resume none but {self.root} holds checkpoints ({', '.join(p.name for p in existing)}), which "
                    "a new run would overwrite: resume them (--resume auto), write elsewhere (--output_dir), or "
                    "pass --overwrite_output_dir to replace them")
            return None
        if resume == "auto":
            intact, damaged = scan(self.root)
            newest = intact[-1].step if intact else -1
            blocking = [(p, why) for p, why in damaged
                        if not ((m := _KEPT.match(p.name)) and int(m.group(1)) < newest)]
            if blocking:
                raise CheckpointError(self.damaged_message(self.root, blocking[0][1], intact=intact))
            for path, why in damaged:
                self.log(f"warning: ignoring damaged older checkpoint {path}: {why}")
            return intact[-1] if intact else None
        path = Path(resume)
        try:
            raw = read_train_state_file(path)
            verify_files(path, raw)
        except CheckpointError as e:
            if not (path / TRAIN_STATE).exists():
                raise
            raise CheckpointError(self.damaged_message(path, str(e), exclude=path)) from None
        return CheckpointRef(path, int(raw["step"]))

    def damaged_message(self, subject: os.PathLike, why: str, *, intact: Optional[List[CheckpointRef]] = None,
                        exclude: Optional[os.PathLike] = None) -> str:
        """The one refusal for a damaged checkpoint of this output_dir (`damaged_refusal`)."""
        return damaged_refusal(self.root, subject, why, intact=intact, exclude=exclude)

    def load(self, ref: CheckpointRef, *, topology: Mapping, check: Mapping, continuation=None) -> TrainState:
        """Restore this rank's program state from `ref` and return its train state.

        `continuation` (ernie_mtl/checkpoint/reshard.decide) says how: None or "exact" loads this
        rank's file as written, refusing when `topology` differs; "resharded"/"batch_change" reads
        every rank's state and writes it into this rank's program by structured name. Refuses when any
        `check` value (e.g. the seed, the data) differs from what the checkpoint was written with,
        since the run could not continue exactly (`total_steps` may differ after a batch change).
        """
        raw = read_train_state_file(ref.path)
        if raw.get("weights_only"):
            from ernie_mtl.checkpoint.reshard import weights_only_refusal

            raise CheckpointError(weights_only_refusal(ref.path, raw))
        state = TrainState.from_json(raw)
        lacking = [k for k in topology if k not in state.topology]
        if lacking:  # the saver writes every key: a gap is damage, not another setting
            raise CheckpointError(self.damaged_message(
                ref.path, f"{ref.path / TRAIN_STATE} is damaged: its topology lacks {lacking}", exclude=ref.path))
        resharded = continuation is not None and continuation.reshards
        diffs = [] if resharded else [f"{k}: checkpoint {state.topology.get(k)!r} vs now {v!r}"
                                      for k, v in topology.items() if state.topology.get(k) != v]
        free = ("total_steps",) if continuation is not None and continuation.kind == "batch_change" else ()
        diffs += check_differences(raw, check, free=free)
        if diffs:
            raise CheckpointError(resume_refusal(ref.path, diffs))
        if resharded or is_portable(raw):
            self._load_structured(ref.path, raw)
        else:
            self._load_rank_state(ref.path, raw)
        return state

    def _load_structured(self, path: Path, raw: Mapping) -> None:
        """Every rank's saved state of `path`, by structured name, written into this rank's program."""
        from ernie_mtl.checkpoint.reshard import ReshardError

        if self._write_state is None:
            raise RuntimeError("this Checkpointer cannot write a structured state (no write_state given)")
        verify_files(path, raw)
        try:
            self._write_state(structured_state_of(path, raw), f"checkpoint {path}")
        except ReshardError as e:
            raise CheckpointError(f"cannot continue {path} on this topology: {e}") from None
    def is_complete(self, path: os.PathLike) -> bool:
        """Whether checkpoint folder `path` is complete (its train_state.json was written)."""
        return is_complete(path)

    def step_of(self, path: os.PathLike) -> int:
        """The optimizer step checkpoint folder `path` was saved at (its train_state.json)."""
        return int(read_train_state_file(Path(path))["step"])

    def restore_weights(self, path: os.PathLike) -> CheckpointRef:
        """Load this rank's program state from checkpoint `path` (verified first, from the rank file
        its writer recorded: every rank's own under sharding, rank 0's otherwise; by name from every
        rank's file when another topology wrote it), without the resume checks: e.g. the final test
        with a best checkpoint's weights."""
        path = Path(path)
        raw = read_train_state_file(path)
        if self._written_elsewhere(raw) or is_portable(raw):
            self._load_structured(path, raw)
        else:
            self._load_rank_state(path, raw)
        return CheckpointRef(path, int(raw["step"]))

    def _written_elsewhere(self, raw: Mapping) -> bool:
        """Whether checkpoint `raw` was written by another topology than this run's (its program state
        is then read by name: ernie_mtl/checkpoint/reshard.py)."""
        if self.topology is None or self._write_state is None:
            return False
        saved = raw.get("topology") or {}
        return any(saved.get(k) != self.topology.get(k) for k in ("world_size", "dp_degree", "sharding_degree",
                                                                   "micro_batch_size", "global_batch_size"))

    def _load_rank_state(self, path: Path, raw: Mapping) -> None:
        source_rank = self.rank if raw.get("per_rank_state") else 0
        verify_files(path, raw, ranks=[source_rank])
        prefix = state_prefix(path, source_rank)
        try:
            self._load_state(str(prefix))
        except Exception as e:  # noqa: BLE001  (a file that passed the checks but paddle cannot read)
            unreadable = unreadable_state_file(prefix)
            if unreadable is not None:
                file, why = unreadable
                raise CheckpointError(self.damaged_message(
                    path, f"{file} is damaged ({why}), although its size and SHA-1 are the ones recorded at "
                    "save time: it was written damaged", exclude=path)) from None
            detail = str(e).strip().splitlines()[-1][:200] if str(e).strip() else ""
            raise CheckpointError(f"cannot load {prefix}.pdparams/.pdopt of checkpoint {path}: "
                                  f"{type(e).__name__}: {detail}; its files are intact, but their variables do not "
                                  "fit this program (written by another configuration or version?)") from None


def merged_state(path: os.PathLike, *, verify: bool = True) -> Dict[str, Any]:
    """Every rank's saved program state of checkpoint `path` merged by variable name (sharded ranks
    hold disjoint parts): parameters, optimizer state, AMP O2 master weights, EMA averages, as NumPy
    arrays. Verified first (sizes and SHA-1s of every listed file) unless `verify=False` (a folder of
    rank files that is not a checkpoint, e.g. the exporter's temporary gather)."""
    import paddle

    path = Path(path)
    folder = path / STATE_DIR if (path / STATE_DIR).is_dir() else path
    if verify:
        verify_files(path)
    if (path / TRAIN_STATE).is_file():
        raw = read_train_state_file(path)
        if is_portable(raw):  # tensors by structured name: back to this checkpoint's static names
            from ernie_mtl.checkpoint.portable import read_tensors
            from ernie_mtl.checkpoint.reshard import static_state

            name_map = raw.get("name_map") or {}
            return static_state(read_tensors(path, name_map=name_map), name_map)
    merged: Dict[str, Any] = {}
    for file in sorted(folder.glob("rank_*.pdparams")) + sorted(folder.glob("rank_*.pdopt")):
        merged.update(paddle.load(str(file), return_numpy=True))
    return merged


def damaged_refusal(root: Union[str, os.PathLike], subject: Union[str, os.PathLike], why: str, *,
                    intact: Optional[List[CheckpointRef]] = None,
                    exclude: Optional[os.PathLike] = None) -> str:
    """The one refusal for a damaged checkpoint: what is damaged, that nothing was changed, and
    what to do -- resume an intact checkpoint of output_dir `root` (listed) or start anew."""
    root = Path(root)
    if intact is None:
        intact = scan(root)[0]
    intact = [r for r in intact if exclude is None or r.path.resolve() != Path(exclude).resolve()]
    fresh = (f"start a new run in another --output_dir, or here with --resume none --overwrite_output_dir "
             f"(which deletes the checkpoints in {root})")
    if intact:
        options = (f"Intact checkpoints: {', '.join(f'{r.path} (step {r.step})' for r in reversed(intact))}; "
                   f"resume one with --resume PATH, or {fresh}.")
    else:
        options = f"No intact checkpoint remains: {fresh}."
    return (f"cannot resume from {subject}: {why.rstrip('.')}. Nothing in {root} was changed: the damaged "
            f"checkpoint is kept as it is. {options}")


STATE_FORMATS = ("paddle", "portable")


def is_portable(raw: Mapping[str, Any]) -> bool:
    """Whether train state `raw` belongs to a portable checkpoint (tensors by structured name)."""
    return raw.get("state_format") == "portable"


def structured_state_of(path: os.PathLike, raw: Mapping[str, Any]) -> Dict[str, Any]:
    """Checkpoint `path`'s program state by structured name (ernie_mtl/checkpoint/reshard.py), from
    either format (verify first: `verify_files`)."""
    from ernie_mtl.checkpoint.reshard import structured_state

    if is_portable(raw):
        from ernie_mtl.checkpoint.portable import read_tensors

        return read_tensors(path, name_map=raw.get("name_map") or {})
    return structured_state(merged_state(path, verify=False), raw.get("name_map") or {}, where=str(path))


def unreadable_state_file(prefix: os.PathLike) -> Optional[Tuple[Path, str]]:
    """(file, reason) for the first of `<prefix>.pdparams/.pdopt` that is not a readable program state
    (paddle.static.save writes each as one pickle), or None when both unpickle. Used after a load
    failed, to tell a damaged file from a state that does not fit the program."""
    import pickle

    for ext in (".pdparams", ".pdopt"):
        file = Path(f"{prefix}{ext}")
        try:
            with open(file, "rb") as f:
                pickle.load(f)
        except Exception as e:  # noqa: BLE001  (unpickling damaged bytes raises many types)
            return file, f"unreadable: {type(e).__name__}: {str(e).strip()[:120]}"
    return None


def kept_checkpoints(output_dir: os.PathLike) -> List[CheckpointRef]:
    """Permanent checkpoints in step order."""
    root = Path(output_dir)
    refs = [CheckpointRef(p, int(m.group(1)))
            for p in root.iterdir() if (m := _KEPT.match(p.name))] if root.is_dir() else []
    return sorted(refs, key=lambda ref: ref.step)
