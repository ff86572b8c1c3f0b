"""Which CPU kernel each op type runs with -- Paddle's plain kernel (MKL for matmul) or oneDNN's --
chosen on the machine by timing both on the run's own op shapes, and remembered per machine.

Why. The faster kernel depends on the CPU, not on the program. Measured with Paddle 2.6.2, float32,
ERNIE-base shapes: on an AMD EPYC (2 cores) oneDNN's `matmul_v2` is 4.5x MKL's and the gradient of a
linear layer (as `cpu_kernels.flatten_matmul_grad` feeds it) 4x; on an Intel Xeon oneDNN's matmul was
0.58x MKL's. Small ops differ too (oneDNN's `scale` and `sum` are slower on the AMD machine, faster on
the Intel one). A fixed list is right on one vendor and wrong on the other, so `--cpu_kernels auto`
measures.

How (`choose_onednn_types`):

- The candidates (`AUTO_CANDIDATES`): `matmul_v2` and its gradient (more than half of a training step)
  and the small op types whose oneDNN kernels were measured bitwise equal to the plain ones. Inexact
  oneDNN kernels with small gains (softmax, layer_norm, gelu) are not candidates; pass them in a list.
- The run's own shapes (`op_signatures`): every op of a candidate type in the built program, its
  inputs' shapes with the batch and sequence dimensions (-1 in the program: the first -1 of a shape is
  the micro-batch, later ones the sequence length) set to the run's, deduplicated with the number of
  ops that share them. Shapes whose rows depend on the data (a 2-D [-1, n], e.g. the masked tokens of
  the LM head) are not timed: they are few, and their type's choice follows the rest.
- Timing (`ProgramTimer`): each signature becomes a program of its own holding a copy of the op (same
  attributes) on random float32 inputs, run plain and with oneDNN (through `cpu_kernels.use_onednn_ops`,
  so exactly what training will run). Always on `TIMING_THREADS` (1) math threads, whatever the run's
  own thread count (`paddle.base.core.set_num_threads`, restored afterwards), so a run of 1 process x 2
  threads and one of 2 processes x 1 thread measure the same thing and choose the same kernels. A
  warm-up run of each, then paired rounds in alternating order (at least `MIN_ROUNDS`, until the op
  type's time budget is spent); the figure kept per kernel is the median round, and the per-round
  oneDNN/plain ratios give the spread. The same programs then run once more on `check_threads` (2, or
  more when the process may use more) to learn whether each kernel's result depends on the thread count
  (bitwise), and the two kernels' outputs are compared bitwise.
- The decision: oneDNN for an op type when its median time summed over the program's ops (signature time
  x ops) is below `1 - MARGIN` of the plain kernel's; within that margin the plain kernel stays (it is
  the numerical reference). A oneDNN kernel whose result changes with the thread count is never chosen
  (a run continued on another number of processes would not be bitwise). `cpu_kernels.ONEDNN_CONFLICTS`
  are then removed.
- The cache (`KernelCache`): every signature's measurement is stored in one JSON file in the user's
  cache folder (`$XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json`, default `~/.cache/ernie_mtl/`), under the
  machine's identity (`machine_identity`: CPU vendor, model name, family/model/stepping, a hash of its
  feature flags, Paddle's version and commit, and the ISA limits set in the environment, ONEDNN_MAX_CPU_ISA /
  MKL_ENABLE_INSTRUCTIONS -- not the thread count, not the number of CPUs), with how it
  was measured: threads, rounds, the ratio spread, and the CPU other processes used meanwhile. A
  measurement is *disturbed* when other processes used more than `DISTURBED_CORES` cores while it ran, or
  when its ratio spread straddles the decision threshold (noise could decide it). **The first measurement
  filed decides for good, disturbed or not**: a later run on the same kind of machine with the same shapes
  measures nothing and chooses what the first run chose, so two fresh runs of one configuration compute
  the same bits whatever the machine's load was when each started. (Until 2026-11-29 a later run measured
  a disturbed entry again and a clean measurement replaced it; the run after the replacement could then
  choose other kernels than the run before it, and a fresh run and a preempted-and-resumed run of one
  configuration ended 1 float32 ulp apart: a make test failure, reproduced by flipping `matmul_v2_grad`.)
  A disturbed decision is said in the run's log with the way out: `ernie-mtl-kernels reset --disturbed`
  on a quiet machine deletes the disturbed entries, and the next run measures them again. The file is
  read with bounds (a regular file, at most
  `CACHE_MAX_BYTES`, nesting within Python's limits) and written atomically; a damaged, special or
  unwritable one is ignored with a note (the run measures instead), never fatal, and a special file is
  never replaced.
  `python -m ernie_mtl.program.kernel_choice show|reset` (`ernie-mtl-kernels`) lists or deletes it.

Nothing here decides by vendor name, and the timing function is injectable (`measure=`), so tests
decide with fake timings and never depend on the machine's speed.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ernie_mtl.dist.machine import isa_limits, read_cpuinfo
from ernie_mtl.program.cpu_kernels import EXACT_ONEDNN_OPS, onednn_conflicts

# timed by --cpu_kernels auto; the gradient types are chosen independently of their forward types
AUTO_CANDIDATES = ("matmul_v2", "matmul_v2_grad", "elementwise_add", "scale", "sum", "transpose2", "transpose2_grad")
MARGIN = 0.10  # oneDNN must save more than this fraction of an op type's plain time to be chosen
CACHE_FORMAT = 2  # 2: machines keyed without threads; entries say how they were measured
CACHE_MAX_BYTES = 16 << 20  # a cache file larger than this is not read (a healthy one holds a few KiB per model)
TIMING_THREADS = 1  # math threads every measurement runs with (module docstring)
MIN_ROUNDS = 5  # paired rounds per signature, at least
DISTURBED_CORES = 0.5  # other processes' CPU during a measurement above which it is measured again later
_OPTIMIZE, _LR_SCHED = 0x0002, 0x0010
# attributes that do not change what a kernel computes (left out of a signature's identity)
_BOOKKEEPING = {"op_role", "op_role_var", "op_namescope", "op_callstack", "op_device", "with_quant_attr",
                "use_mkldnn", "use_cudnn", "use_quantizer", "mkldnn_data_type", "is_test", "fuse_activation",
                "fuse_alpha", "fuse_beta", "fused_output_scale", "fused_reshape_Out", "fused_transpose_Out",
                "fused_reshape_X", "fused_transpose_X", "fused_reshape_Y", "fused_transpose_Y"}


# --- the machine and the cache ------------------------------------------------------------------------

def _cpuinfo() -> Dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty when unreadable: not Linux)."""
    processors = read_cpuinfo()
    return processors[0] if processors else {}


def machine_identity(threads: Optional[int] = None, *, cpuinfo: Optional[Mapping[str, str]] = None,
                     paddle_version: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """What a kernel timing depends on besides the shapes: the kind of CPU (vendor, model name,
    family/model/stepping, a hash of its feature flags), Paddle's version and commit, and the ISA limits
    set in `env` (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS: the same CPU on other code paths times
    differently; the key is unchanged when none is set). Not the number of CPUs nor the run's threads:
    training measurements always run on `TIMING_THREADS`, so one machine type gives one choice whatever the
    topology. `threads` adds the thread count for timings that do depend on it (a predictor's throughput,
    ernie_mtl/engine/saved_models.py). Every input can be given (tests)."""
    info = _cpuinfo() if cpuinfo is None else dict(cpuinfo)
    env = os.environ if env is None else env
    if paddle_version is None:
        import paddle

        paddle_version = f"{paddle.__version__} ({paddle.version.commit[:12]})"
    flags = " ".join(sorted(info.get("flags", "").split()))
    identity: Dict[str, Any] = {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "family_model_stepping": "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping")),
        "cpu_flags": hashlib.sha1(flags.encode()).hexdigest()[:12] if flags else "", "paddle": paddle_version}
    if threads is not None:
        identity["threads"] = int(threads)
    limits = isa_limits(env)
    if limits:
        identity["isa_limits"] = " ".join(v[0] for _, v in sorted(limits.items()))
    return identity


def machine_key(machine: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(dict(machine), sort_keys=True).encode()).hexdigest()[:16]


def describe_machine(machine: Mapping[str, Any]) -> str:
    threads = f", {machine['threads']} threads" if "threads" in machine else ""
    return f"{machine.get('cpu', '?')} ({machine.get('vendor', '?')}{threads}, paddle {machine.get('paddle', '?')})"


def cache_file(env: Optional[Mapping[str, str]] = None) -> Path:
    """`$XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json` (default `~/.cache/ernie_mtl/cpu_kernels.json`)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME") or os.path.expanduser("~")) / ".cache"
    return root / "ernie_mtl" / "cpu_kernels.json"


class KernelCache:
    """Measurements per (machine, signature) in one JSON file; see the module docstring. The first
    measurement filed is kept for good, disturbed (`disturbed: true`) or not: `save` merges under a file
    lock and never replaces an entry already in the file, and `get` prefers the file's entry to this
    process's own, so every run on the machine decides from the same numbers (two runs started together
    end up with one choice, and a run that resumes another repeats its choice even before reading the
    checkpoint). `reset()` deletes the file, `reset(disturbed_only=True)` only the disturbed entries (the
    next run measures those again). `notes` collects what went wrong with the file (never raised)."""

    def __init__(self, path: Optional[os.PathLike] = None, *, machine: Mapping[str, Any]):
        self.path = Path(path) if path is not None else cache_file()
        self.machine = dict(machine)
        self.key = machine_key(machine)
        self.notes: List[str] = []
        self._new: Dict[str, Dict[str, Any]] = {}
        self._special = False  # the path exists but is not a regular file: never read nor replaced
        self._entries = self._mine(self._read())

    def _mine(self, data: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
        slot = data.get("machines", {}).get(self.key, {}) if data else {}
        entries = slot.get("signatures", {}) if isinstance(slot, dict) else {}
        return dict(entries) if isinstance(entries, dict) else {}

    def _read(self) -> Dict[str, Any]:
        from data_tools.safe_io import UnsafeFile, read_json_bounded

        try:
            data = read_json_bounded(self.path, max_bytes=CACHE_MAX_BYTES, what="kernel cache")
        except FileNotFoundError:
            return {}
        except UnsafeFile as e:  # a FIFO, device or folder where the file should be: never opened, never replaced
            self._special = e.special
            self._note(f"{e}; measuring instead")
            return {}
        except (OSError, ValueError) as e:  # unreadable, too large, not JSON, nested too deep: measure, rewrite
            self._note(f"kernel cache {self.path} ignored ({type(e).__name__}: {str(e)[:120]})")
            return {}
        if (not isinstance(data, dict) or data.get("format") != CACHE_FORMAT
                or not isinstance(data.get("machines"), dict)):
            self._note(f"kernel cache {self.path} ignored (not a format-{CACHE_FORMAT} cache file); it is rewritten")
            return {}
        return data

    def _note(self, text: str) -> None:
        if text not in self.notes:  # the file is read again when saving: say it once
            self.notes.append(text)

    @staticmethod
    def _times(entry: Any) -> Optional[Tuple[float, float]]:
        if not isinstance(entry, dict):
            return None
        try:
            plain, onednn = float(entry["plain_s"]), float(entry["onednn_s"])
        except (TypeError, KeyError, ValueError):
            return None
        return (plain, onednn) if plain > 0 and onednn > 0 and math.isfinite(plain + onednn) else None

    def _trusted(self, signature_key: str) -> Optional[Dict[str, Any]]:
        """The entry a decision uses: the file's (the first measurement filed stays, disturbed or not, so
        every run on the machine decides alike), else this process's own (a file that could not be written)."""
        for entry in (self._entries.get(signature_key), self._new.get(signature_key)):
            if self._times(entry) is not None:
                return entry
        return None

    def needs_measuring(self, signature_key: str) -> bool:
        """Nothing in the file and no measurement of this process's own: measure."""
        return self._trusted(signature_key) is None

    def get(self, signature_key: str) -> Optional[Tuple[float, float]]:
        """(plain seconds, oneDNN seconds) of this machine and signature that a decision uses (`_trusted`),
        or None when nothing was measured."""
        entry = self._trusted(signature_key)
        return None if entry is None else self._times(entry)

    def entry(self, signature_key: str) -> Optional[Dict[str, Any]]:
        """The whole entry `get` answers from (None when it has no times)."""
        entry = self._trusted(signature_key)
        return None if entry is None else dict(entry)

    def put(self, signature_key: str, description: str, plain_s: float, onednn_s: float, **extra: Any) -> None:
        self._new[signature_key] = {"op": description, "plain_s": plain_s, "onednn_s": onednn_s,
                                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}

    def save(self) -> None:
        """Add this process's new entries to the file as it is now, under a lock, atomically: an entry the
        file already holds stays (another run filed it first; module docstring). Then read the merged
        entries back. An unwritable or special place is a note, not an error (this process's own
        measurements decide)."""
        if not self._new:
            return
        if self._special:
            return  # noted when read: a FIFO or device is never replaced
        from ernie_mtl.checkpoint.io import write_json_atomic

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path.with_name(self.path.name + ".lock")):
                data = self._read()
                if self._special:
                    return
                machines = dict(data.get("machines", {})) if data else {}
                slot = machines.get(self.key) if isinstance(machines.get(self.key), dict) else {}
                entries = self._mine({"machines": {self.key: slot}})
                for key, new in self._new.items():
                    old = entries.get(key)
                    if self._times(old) is None:
                        entries[key] = new
                machines[self.key] = {"machine": self.machine, "signatures": entries}
                write_json_atomic(self.path, {"format": CACHE_FORMAT, "machines": machines}, indent=1)
        except OSError as e:
            self.notes.append(f"kernel cache {self.path} not written ({e.strerror or e}); the next run measures again")
            return
        self._entries = entries

    def reset(self, *, disturbed_only: bool = False) -> int:
        """Delete the cache file (every machine's entries), or with `disturbed_only` only its disturbed
        entries (every machine's; the file is rewritten atomically under the lock). Returns 1 when the file
        was deleted, or the number of disturbed entries deleted; 0 when there was nothing to delete (a
        special file is never touched)."""
        if self._special:
            return 0
        if not disturbed_only:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return 0
            self._entries = {}
            return 1
        from ernie_mtl.checkpoint.io import write_json_atomic

        if not self.path.exists():
            return 0
        with _locked(self.path.with_name(self.path.name + ".lock")):
            machines, gone = self._all_machines(), 0
            for key, slot in machines.items():
                entries = slot.get("signatures") if isinstance(slot.get("signatures"), dict) else {}
                kept = self._undisturbed(entries)
                gone += len(entries) - len(kept)
                machines[key] = {**slot, "signatures": kept}
            if gone:
                write_json_atomic(self.path, {"format": CACHE_FORMAT, "machines": machines}, indent=1)
        self._entries = self._undisturbed(self._entries)
        return gone

    @staticmethod
    def _undisturbed(entries: Mapping[str, Any]) -> Dict[str, Any]:
        return {k: e for k, e in entries.items() if not (isinstance(e, dict) and e.get("disturbed"))}

    def _all_machines(self) -> Dict[str, Dict[str, Any]]:
        data = self._read()
        machines = data.get("machines", {}) if data else {}
        return {key: slot for key, slot in machines.items() if isinstance(slot, dict)}


class _locked:
    """An exclusive advisory lock on `path` (fcntl; a no-op where fcntl is missing)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: Optional[int] = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # not POSIX
            return self
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
        return False


# --- the run's op shapes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpSignature:
    """An op type with concrete input shapes and its kernel-relevant attributes."""

    op_type: str
    inputs: Tuple[Tuple[str, Tuple[Tuple[int, ...], ...]], ...]  # (slot, shapes), slots sorted
    attrs: str  # JSON of the attributes that matter (sorted keys)

    @property
    def key(self) -> str:
        return hashlib.sha1(json.dumps([self.op_type, self.inputs, self.attrs]).encode()).hexdigest()[:16]

    def describe(self) -> str:
        shapes = " ".join(f"{slot}{'x'.join(map(str, s))}" for slot, group in self.inputs for s in group
                          if slot not in ("XShape",))
        return f"{self.op_type} {shapes}"

    def flops(self) -> float:
        """Multiply-adds x 2 of a matmul signature (0 for other types): the forward product, or the
        products of the gradients it computes."""
        if self.op_type not in ("matmul_v2", "matmul_v2_grad"):
            return 0.0
        shapes = dict(self.inputs)
        x, y = shapes["X"][0], shapes["Y"][0]
        attrs = json.loads(self.attrs)
        m = x[-1] if attrs.get("trans_x") else (x[-2] if len(x) > 1 else 1)
        k = x[-2] if attrs.get("trans_x") and len(x) > 1 else x[-1]
        n = (y[-2] if attrs.get("trans_y") else y[-1]) if len(y) > 1 else 1
        batch = 1
        for dim in (x[:-2] if len(x) > 2 else ()):
            batch *= dim
        if len(y) > 2:
            batch = max(batch, _prod(y[:-2]))
        one = 2.0 * batch * m * k * n
        return one if self.op_type == "matmul_v2" else 2 * one


def _prod(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _concrete(shape: Sequence[int], batch: int, seq: int) -> Optional[Tuple[int, ...]]:
    """`shape` with its -1 dimensions set (first -1: the micro-batch, later ones: the sequence), or None
    when its rows depend on the data (rank <= 2 with a -1: masked tokens, gathered rows)."""
    shape = tuple(int(d) for d in shape)
    if -1 not in shape:
        return shape
    if len([d for d in shape if d != 0]) <= 2:  # XShape has a leading 0
        return None
    out, seen = [], False
    for d in shape:
        if d == -1:
            out.append(seq if seen else batch)
            seen = True
        else:
            out.append(d)
    return tuple(out)


def _attrs_json(op) -> str:
    out = {}
    for name in sorted(op.desc.attr_names()):
        if name in _BOOKKEEPING or name.startswith("op_"):
            continue
        try:
            value = op.attr(name)
        except Exception:  # noqa: BLE001  (block attributes and the like: not kernel parameters)
            continue
        if isinstance(value, (bool, int, float, str)) or (isinstance(value, list) and all(
                isinstance(v, (bool, int, float, str)) for v in value)):
            out[name] = value
    return json.dumps(out, sort_keys=True)


def op_signatures(program, op_types: Iterable[str], *, batch: int, seq: int) -> List[Tuple[OpSignature, int, Any]]:
    """[(signature, ops sharing it, one such op)] of `program`'s global block, for the ops of `op_types`
    that `use_onednn_ops` would switch (float32, not optimizer or LR-schedule ops) and whose shapes are
    known once the batch and sequence are (module docstring)."""
    import paddle

    types = set(op_types)
    block = program.global_block()
    found: Dict[OpSignature, List[Any]] = {}
    for op in block.ops:
        if op.type not in types:
            continue
        if op.desc.has_attr("op_role") and int(op.attr("op_role")) & (_OPTIMIZE | _LR_SCHED):
            continue
        names = op.input_arg_names + op.output_arg_names
        variables = [block._find_var_recursive(n) for n in names]
        if any(v is None or v.dtype != paddle.float32 for v in variables):
            continue
        inputs = []
        for slot in sorted(op.input_names):
            shapes = tuple(_concrete(block._find_var_recursive(n).shape, batch, seq) for n in op.input(slot))
            if any(s is None for s in shapes):
                break
            if shapes:
                inputs.append((slot, shapes))
        else:
            sig = OpSignature(op.type, tuple(inputs), _attrs_json(op))
            found.setdefault(sig, []).append(op)
    return [(sig, len(ops), ops[0]) for sig, ops in found.items()]


# --- timing ------------------------------------------------------------------------------------------

def single_op_program(op, signature: OpSignature, *, onednn: bool, copies: int = 1):
    """(program, {input name: array}) running a copy of `op` (its attributes) `copies` times on random
    float32 inputs of `signature`'s shapes; with `onednn`, switched as training switches it
    (`cpu_kernels.use_onednn_ops`)."""
    import numpy as np
    import paddle

    from ernie_mtl.program.cpu_kernels import use_onednn_ops

    program = paddle.static.Program()
    block = program.global_block()
    src = op.block
    block_values = np.random.RandomState(0).uniform(-1, 1, 4099).astype("float32")
    arrays: Dict[str, Any] = {}
    names: Dict[str, List[str]] = {}
    for slot, shapes in signature.inputs:
        names[slot] = []
        for i, shape in enumerate(shapes):
            name = f"in_{slot}_{i}".replace("@", "_")
            block.create_var(name=name, shape=list(shape), dtype="float32", persistable=True)
            # values do not matter to the timing, only that they are ordinary floats: a random block, tiled
            arrays[name] = np.resize(block_values, shape)
            names[slot].append(name)
    for c in range(copies):
        desc = block.desc.append_op()
        desc.copy_from(op.desc)
        for slot in op.input_names:
            desc.set_input(slot, names.get(slot, []))
        for slot in op.output_names:
            outs = []
            for i, original in enumerate(op.output(slot)):
                if not original:
                    outs.append("")
                    continue
                var = src._find_var_recursive(original)
                outs.append(block.create_var(name=f"out_{slot}_{c}_{i}".replace("@", "_"), dtype=var.dtype,
                                             persistable=False).name)
            desc.set_output(slot, outs)
        if desc.has_attr("use_mkldnn"):
            desc._set_bool_attr("use_mkldnn", False)
    block._sync_with_cpp()
    if onednn:
        use_onednn_ops(program, [op.type])
    return program, arrays


def _output_names(program) -> List[str]:
    """The float32 outputs of the first copy of the op in a `single_op_program` (not XShape: no data)."""
    import paddle

    block = program.global_block()
    op = block.ops[0]
    names = []
    for slot in op.output_names:
        if slot == "XShape":
            continue
        for name in op.output(slot):
            var = block._find_var_recursive(name) if name else None
            if var is not None and var.dtype == paddle.float32:
                names.append(name)
    return names


def current_math_threads() -> int:
    """The math threads this process runs with: OMP_NUM_THREADS as Paddle read it at import (it writes 1
    when unset)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


class _MathThreads:
    """Run the block with Paddle's math libraries (MKL, OpenMP for oneDNN) on `n` threads, then back."""

    def __init__(self, n: int):
        self.threads = n

    def __enter__(self):
        from paddle.base import core

        core.set_num_threads(int(self.threads))
        return self

    def __exit__(self, *exc):
        from paddle.base import core

        core.set_num_threads(current_math_threads())
        return False


class LoadMeter:
    """CPU time other processes used while a block ran, in cores (/proc/stat's busy time less this
    process's own). None where /proc/stat cannot be read (not Linux)."""

    def __init__(self):
        self.others_cores: Optional[float] = None

    @staticmethod
    def _busy_s() -> Optional[float]:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        ticks = [int(x) for x in fields[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self._busy, self._own, self._wall = self._busy_s(), sum(os.times()[:2]), time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy, wall = self._busy_s(), time.perf_counter() - self._wall
        if busy is not None and self._busy is not None and wall > 0:
            own = sum(os.times()[:2]) - self._own
            self.others_cores = max(0.0, (busy - self._busy - own) / wall)
        return False


class ProgramTimer:
    """The default `measure`: how a signature's op runs plain and on oneDNN, in this process, always on
    `TIMING_THREADS` math threads (module docstring: warm-up, paired alternating rounds, median), then
    whether each kernel's result depends on the thread count and whether the two agree bitwise.
    Returns a dict: plain_s, onednn_s (median seconds per op), rounds, ratio_low/ratio_high (the quartiles
    of the per-round oneDNN/plain ratios), threads, check_threads, plain_thread_stable,
    onednn_thread_stable, same_bits, others_cores (None when unknown)."""

    def __init__(self, *, min_rounds: int = MIN_ROUNDS, max_rounds: int = 15, check_threads: Optional[int] = None):
        self.min_rounds, self.max_rounds = min_rounds, max(min_rounds, max_rounds)
        self.check_threads = check_threads
        self._exe = None

    def __call__(self, op, signature: OpSignature, budget_s: float) -> Dict[str, Any]:
        import numpy as np
        import paddle

        if self._exe is None:
            self._exe = paddle.static.Executor(paddle.CPUPlace())
        elements = sum(_prod(shape) for _, shapes in signature.inputs for shape in shapes)
        # small ops run 4 times per program run, so the executor's own per-run cost does not decide
        copies = 1 if signature.op_type.startswith("matmul") or elements > (1 << 20) else 4
        sides = []
        with LoadMeter() as load, _MathThreads(TIMING_THREADS):
            for onednn in (False, True):
                program, arrays = single_op_program(op, signature, onednn=onednn, copies=copies)
                scope = paddle.static.Scope()
                for name, array in arrays.items():
                    scope.var(name).get_tensor().set(array, paddle.CPUPlace())
                # warm-up, not timed: the first run of a program builds the executor's instruction list, allocates
                # its outputs and creates oneDNN's primitives (measured: a tiny op's first plain run took 260 ms)
                self._exe.run(program, scope=scope, fetch_list=[])
                sides.append((program, scope, []))
            start = time.perf_counter()
            for r in range(self.max_rounds):
                for program, scope, times in (sides if r % 2 == 0 else sides[::-1]):
                    started = time.perf_counter()
                    self._exe.run(program, scope=scope, fetch_list=[])
                    times.append(time.perf_counter() - started)
                if r + 1 >= self.min_rounds and time.perf_counter() - start >= budget_s:
                    break
            outputs = [self._outputs(program, scope) for program, scope, _ in sides]
        check = self.check_threads or max(2, current_math_threads())
        with _MathThreads(check):
            again = [self._outputs(program, scope) for program, scope, _ in sides]
        plain, onednn = sides[0][2], sides[1][2]
        ratios = sorted(o / p for p, o in zip(plain, onednn) if p > 0)
        same = [all(np.array_equal(a, b) for a, b in zip(x, y)) for x, y in zip(outputs, again)]
        return {"plain_s": float(np.median(plain)) / copies, "onednn_s": float(np.median(onednn)) / copies,
                "rounds": len(plain), "ratio_low": _quantile(ratios, 0.25), "ratio_high": _quantile(ratios, 0.75),
                "threads": TIMING_THREADS, "check_threads": check, "plain_thread_stable": same[0],
                "onednn_thread_stable": same[1],
                "same_bits": all(np.array_equal(a, b) for a, b in zip(outputs[0], outputs[1])),
                "others_cores": None if load.others_cores is None else round(load.others_cores, 3)}

    def _outputs(self, program, scope) -> List[Any]:
        import numpy as np

        names = _output_names(program)
        return [np.array(v) for v in self._exe.run(program, scope=scope, fetch_list=names)] if names else []


def _quantile(values: Sequence[float], quantile: float) -> float:
    if not values:
        return float("nan")
    position = quantile * (len(values) - 1)
    low, high = int(math.floor(position)), int(math.ceil(position))
    return values[low] + (values[high] - values[low]) * (position - low)


def as_measurement(result: Any) -> Dict[str, Any]:
    """A `measure` result as a dict: a (plain_s, onednn_s) pair (what an injected test timer returns) or
    the dict `ProgramTimer` returns."""
    if isinstance(result, Mapping):
        return dict(result)
    plain_s, onednn_s = result
    return {"plain_s": float(plain_s), "onednn_s": float(onednn_s)}


def is_disturbed(measurement: Mapping[str, Any], *, margin: float = MARGIN) -> bool:
    """Whether a measurement should be taken again by a later run: other processes used more than
    `DISTURBED_CORES` cores meanwhile, or its per-round ratios straddle the decision threshold."""
    others = measurement.get("others_cores")
    if others is not None and others > DISTURBED_CORES:
        return True
    low, high = measurement.get("ratio_low"), measurement.get("ratio_high")
    threshold = 1.0 - margin
    return low is not None and high is not None and low < threshold <= high


# --- the decision ------------------------------------------------------------------------------------

@dataclass
class TypeTiming:
    """An op type's time per micro-batch in the program with each kernel (its timed ops only), and what
    its measurements say about the kernels' numerics."""

    plain_s: float = 0.0
    onednn_s: float = 0.0
    flops: float = 0.0  # per micro-batch, matmul types only
    ops: int = 0  # ops of the type whose shapes were timed
    measured: int = 0  # signatures measured now (the rest came from the cache)
    disturbed: int = 0  # signatures whose measurement a later run takes again (is_disturbed)
    onednn_thread_unstable: int = 0  # signatures whose oneDNN result changed with the thread count
    plain_thread_unstable: int = 0  # ... whose plain result did

    def faster(self, margin: float = MARGIN) -> bool:
        return self.ops > 0 and self.onednn_s < (1.0 - margin) * self.plain_s

    def text(self) -> str:
        if self.flops:
            a, b = self.flops / self.onednn_s / 1e9, self.flops / self.plain_s / 1e9
            digits = 0 if min(a, b) >= 10 else 1
            return f"{a:.{digits}f} vs {b:.{digits}f} GFLOP/s"
        return f"{1e3 * self.onednn_s:.2f} vs {1e3 * self.plain_s:.2f} ms/step"

    def to_json(self) -> Dict[str, float]:
        return {"plain_s": self.plain_s, "onednn_s": self.onednn_s, "flops": self.flops, "ops": self.ops,
                "disturbed": self.disturbed, "onednn_thread_unstable": self.onednn_thread_unstable,
                "plain_thread_unstable": self.plain_thread_unstable}


Measure = Callable[[Any, OpSignature, float], Any]  # -> (plain s, oneDNN s) or ProgramTimer's dict


def time_op_types(program, op_types: Iterable[str], *, batch: int, seq: int, cache: Optional[KernelCache] = None,
                  measure: Optional[Measure] = None, budget_s: float = 0.25,
                  margin: float = MARGIN) -> Dict[str, TypeTiming]:
    """{op type: TypeTiming} of `program`'s ops of `op_types`, from the cache where it has an entry,
    measured otherwise (`measure(op, signature, budget_s)`; default `ProgramTimer`). New measurements are
    written to the cache with how they were taken (the first one filed decides every later run: KernelCache)."""
    measure = measure or ProgramTimer()
    signatures = op_signatures(program, op_types, batch=batch, seq=seq)
    own: Dict[str, Dict[str, Any]] = {}
    for op_type in op_types:
        mine = [(sig, op) for sig, _, op in signatures if sig.op_type == op_type]
        for sig, op in mine:
            if cache is None or cache.needs_measuring(sig.key):
                m = as_measurement(measure(op, sig, budget_s / max(1, len(mine))))
                m["disturbed"] = is_disturbed(m, margin=margin)
                own[sig.key] = m
                if cache is not None:
                    extra = {k: v for k, v in m.items() if k not in ("plain_s", "onednn_s")}
                    cache.put(sig.key, sig.describe(), m["plain_s"], m["onednn_s"], **extra)
    if cache is not None:
        cache.save()  # a clean entry of the file wins from here on (KernelCache)
    out = {type_name: TypeTiming() for type_name in op_types}
    for sig, n, _ in signatures:
        got = (cache.entry(sig.key) if cache is not None else None) or own[sig.key]
        timing = out[sig.op_type]
        timing.plain_s += n * float(got["plain_s"])
        timing.onednn_s += n * float(got["onednn_s"])
        timing.flops += n * sig.flops()
        timing.ops += n
        timing.measured += sig.key in own
        timing.disturbed += bool(got.get("disturbed"))
        timing.onednn_thread_unstable += got.get("onednn_thread_stable") is False
        timing.plain_thread_unstable += got.get("plain_thread_stable") is False
    return out


def choose_onednn_types(timings: Mapping[str, TypeTiming], *,
                        margin: float = MARGIN) -> Tuple[Tuple[str, ...], List[str]]:
    """(op types to run on oneDNN, notes): the types whose oneDNN time beats the plain one by `margin` and
    whose oneDNN results do not depend on the thread count, less the known conflicts
    (`cpu_kernels.ONEDNN_CONFLICTS`). Notes say what was left plain for its numerics, and which plain
    kernels depend on the thread count (MKL without `MKL_CBWR=...,STRICT`: ernie_mtl/dist/threads.py)."""
    notes = []
    faster = []
    for op_type, timing in sorted(timings.items()):
        if not timing.faster(margin):
            continue
        if timing.onednn_thread_unstable:
            notes.append(f"{op_type} left plain: its oneDNN result changes with the thread count on this machine, "
                         "so a run continued on another number of processes would not be bitwise")
            continue
        faster.append(op_type)
    unstable = sorted(op_type for op_type, timing in timings.items() if timing.plain_thread_unstable)
    if unstable:
        notes.append(f"the plain kernels of {', '.join(unstable)} change their results with the thread count here "
                     "(is MKL_CBWR set without STRICT?): a run continued with another number of threads per process "
                     "is within float32 rounding, not bitwise")
    kept, conflict_notes = onednn_conflicts(faster)
    return tuple(sorted(kept)), notes + conflict_notes


# --- the choice of a run -------------------------------------------------------------------------------

MODES = ("auto", "exact", "plain", "list")


@dataclass(frozen=True)
class KernelChoice:
    """The CPU kernels of a run: op types on oneDNN and the bias-gradient rewrite, how they were decided,
    and (auto) the measured times. `kernels()` is what a bitwise resume must repeat; the checkpoint
    records `to_json()`."""

    mode: str  # auto | exact | plain | list
    onednn: Tuple[str, ...] = ()
    bias_grads: bool = False
    source: str = "fixed"  # fixed | measured | cached | checkpoint
    timings: Dict[str, Dict[str, float]] = field(default_factory=dict)
    machine: Dict[str, Any] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()
    seconds: float = 0.0  # spent measuring

    @classmethod
    def fixed(cls, mode: str, op_types: Sequence[str] = ()) -> "KernelChoice":
        """The choice of a mode that measures nothing: plain (as built), exact (`EXACT_ONEDNN_OPS`: the
        previous default, measured exact and faster on an Intel machine) or list (`op_types`); bias
        gradients by matmul in every mode but plain."""
        if mode == "plain":
            return cls(mode="plain")
        if mode == "exact":
            types: Iterable[str] = EXACT_ONEDNN_OPS
        elif mode == "list":
            types = op_types
        else:
            raise ValueError(f"KernelChoice.fixed: mode {mode!r} is measured, not fixed")
        kept, notes = onednn_conflicts(types)
        return cls(mode=mode, onednn=tuple(sorted(kept)), bias_grads=True, notes=tuple(notes))

    def kernels(self) -> Dict[str, Any]:
        return {"onednn": sorted(self.onednn), "bias_grads": self.bias_grads}

    def forward_types(self) -> Tuple[str, ...]:
        """The oneDNN types a forward-only (evaluation, prediction) program uses."""
        return tuple(op_type for op_type in self.onednn if not op_type.endswith("_grad"))

    def to_json(self) -> Dict[str, Any]:
        return {"mode": self.mode, "onednn": sorted(self.onednn), "bias_grads": self.bias_grads,
                "source": self.source, "timings": self.timings, "machine": self.machine, "notes": list(self.notes),
                "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: Optional[str] = None) -> "KernelChoice":
        return cls(mode=str(data.get("mode", "list")), onednn=tuple(sorted(data.get("onednn", ()))),
                   bias_grads=bool(data.get("bias_grads", False)), source=source or str(data.get("source", "fixed")),
                   timings=dict(data.get("timings", {})), machine=dict(data.get("machine", {})),
                   notes=tuple(data.get("notes", ())), seconds=float(data.get("seconds", 0.0)))

    def with_(self, **changes) -> "KernelChoice":
        from dataclasses import replace

        return replace(self, **changes)

    def describe(self) -> str:
        """The start-up log's account of the choice (without the counts of ops switched)."""
        if self.mode == "plain" and self.source != "checkpoint":
            return "as built (--cpu_kernels plain)"
        if self.mode == "auto" and self.timings:
            how = {"measured": f"measured in {self.seconds:.1f} s on {TIMING_THREADS} thread",
                   "cached": "from the kernel cache",
                   "checkpoint": "recorded in the checkpoint"}.get(self.source, self.source)
            rates = "; ".join(f"{op_type} {'oneDNN' if op_type in self.onednn else 'plain'} "
                              f"({TypeTiming(**_timing(v)).text()})"
                              for op_type, v in sorted(self.timings.items()) if v.get("ops"))
            return f"--cpu_kernels auto, {how}: oneDNN vs plain: {rates or 'no candidate ops'}"
        label = {"exact": "--cpu_kernels exact", "list": "--cpu_kernels " + ",".join(self.onednn),
                 "auto": "--cpu_kernels auto"}.get(self.mode, self.mode)
        if self.source == "checkpoint":
            label = "recorded in the checkpoint"
        return f"{label}: oneDNN on {', '.join(self.onednn) or 'no op types'}"


def _timing(v: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v[k] for k in ("plain_s", "onednn_s", "flops", "ops") if k in v}


def measure_choice(program, *, batch: int, seq: int, cache: Optional[KernelCache] = None,
                   measure: Optional[Measure] = None, candidates: Sequence[str] = AUTO_CANDIDATES,
                   budget_s: float = 0.25, margin: float = MARGIN) -> KernelChoice:
    """`--cpu_kernels auto` on a built training program: time the candidates (cache first), choose."""
    start = time.perf_counter()
    timings = time_op_types(program, candidates, batch=batch, seq=seq, cache=cache, measure=measure,
                            budget_s=budget_s, margin=margin)
    onednn, notes = choose_onednn_types(timings, margin=margin)
    measured = any(timing.measured for timing in timings.values())
    disturbed = sorted(op_type for op_type, v in timings.items() if v.disturbed)
    if disturbed:
        notes.append(f"the measurement of {', '.join(disturbed)} was disturbed (other processes busy, or the rounds "
                     "disagreed); it decides for every run on this machine, so that they choose alike. To measure "
                     "again, run `ernie-mtl-kernels reset --disturbed` on a quiet machine before the next run")
    return KernelChoice(mode="auto", onednn=onednn, bias_grads=True, source="measured" if measured else "cached",
                        timings={op_type: v.to_json() for op_type, v in timings.items() if v.ops},
                        machine=dict(cache.machine) if cache is not None else {},
                        notes=tuple(notes + (cache.notes if cache is not None else [])),
                        seconds=time.perf_counter() - start)


def reconcile(current: KernelChoice, recorded: Optional[KernelChoice]) -> Tuple[KernelChoice, Optional[str]]:
    """The kernels a resumed run uses, and what to log about it. `current`: what this run chose (auto:
    measured or cached here); `recorded`: the resumed checkpoint's. Auto keeps the recorded kernels
    whenever they differ (a bitwise continuation beats a faster one) and says so; an explicit mode
    (plain, exact, a list) is obeyed, with a warning that the continuation is within float32 rounding,
    not bitwise."""
    if recorded is None or recorded.kernels() == current.kernels():
        return current, None
    what = (f"oneDNN on {', '.join(recorded.onednn) or 'no op types'}, bias gradients by matmul "
            f"{'on' if recorded.bias_grads else 'off'}")
    where = f" on {describe_machine(recorded.machine)}" if recorded.machine else ""
    if current.mode == "auto":
        mine = f"oneDNN on {', '.join(current.onednn) or 'no op types'}"
        return (recorded.with_(source="checkpoint", notes=current.notes, seconds=current.seconds),
                f"CPU kernels: resuming with the checkpoint's recorded kernels ({what}, chosen{where}) so the run "
                f"continues bitwise; this machine would choose {mine} ({current.describe()}). Pass --cpu_kernels "
                "with a mode to switch anyway (float32 rounding, not bitwise)")
    return (current,
            f"CPU kernels: --cpu_kernels {current.mode if current.mode != 'list' else ','.join(current.onednn)} "
            f"differs from the checkpoint's recorded kernels ({what}{where}): the resumed run continues within "
            "float32 rounding of the uninterrupted one, not bitwise")


# --- the command: see and reset the cache ------------------------------------------------------------------

def show(path: Optional[os.PathLike] = None) -> str:
    """The kernel cache as text: every machine, and per signature the two kernels' times, the oneDNN/plain
    ratio, how it was measured and whether a later run measures it again."""
    path = Path(path) if path is not None else cache_file()
    cache = KernelCache(path, machine={})
    lines = [f"kernel cache: {path}"]
    data = cache._read() if path.exists() else {}
    lines += [f"  note: {n}" for n in cache.notes]
    machines = data.get("machines", {}) if isinstance(data, dict) else {}
    if not machines:
        return "\n".join(lines + ["  (empty: the next --cpu_kernels auto run measures)"])
    for key, slot in sorted(machines.items()):
        if not isinstance(slot, dict):
            continue
        lines.append(f"machine {key}: {describe_machine(slot.get('machine', {}))}")
        for entry in sorted((slot.get("signatures") or {}).values(),
                            key=lambda signature: str(signature.get("op", ""))):
            times = KernelCache._times(entry)
            if times is None:
                continue
            plain, onednn = times
            how = [f"{entry.get('rounds', '?')} rounds on {entry.get('threads', '?')} thread(s)"]
            if entry.get("others_cores") is not None:
                how.append(f"others {entry['others_cores']:.2f} cores")
            if entry.get("onednn_thread_stable") is False:
                how.append("oneDNN result depends on threads")
            if entry.get("plain_thread_stable") is False:
                how.append("plain result depends on threads")
            if entry.get("disturbed"):
                how.append("DISTURBED: decides until `ernie-mtl-kernels reset --disturbed`")
            lines.append(f"  {str(entry.get('op', '?'))[:70]:70s} plain {1e3 * plain:9.3f} ms  "
                         f"oneDNN {1e3 * onednn:9.3f} ms  ratio {onednn / plain:5.2f}  "
                         f"({'; '.join(how)}; {entry.get('measured', '?')})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`ernie-mtl-kernels show|reset` (`python -m ernie_mtl.program.kernel_choice`)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="ernie-mtl-kernels",
                                description="See or reset the CPU kernel cache of --cpu_kernels auto "
                                            "($XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json).")
    p.add_argument("action", choices=("show", "reset", "path"),
                   help="show: every measurement and how it was taken; reset: delete the file (the next run "
                        "measures again); path: print where it is")
    p.add_argument("--disturbed", action="store_true",
                   help="with reset: delete only the measurements taken while the machine was busy (marked "
                        "DISTURBED by show); the next run measures those again")
    p.add_argument("--cache", default=None, help="another cache file than the default")
    args = p.parse_args(argv)
    if args.disturbed and args.action != "reset":
        p.error(f"--disturbed goes with reset (reset --disturbed), not with {args.action}")
    path = Path(args.cache) if args.cache else cache_file()
    if args.action == "path":
        print(path)
    elif args.action == "show":
        print(show(path))
    else:
        cache = KernelCache(path, machine={})
        if cache._special:
            print(f"ernie-mtl-kernels: error: {path} is not a regular file; not deleted", file=sys.stderr)
            return 2
        if args.disturbed:
            try:
                gone = cache.reset(disturbed_only=True)
            except OSError as e:
                print(f"ernie-mtl-kernels: error: {path} not rewritten ({e.strerror or e}); nothing deleted",
                      file=sys.stderr)
                return 2
            print(f"deleted {gone} disturbed measurement(s) from {path}" if gone
                  else f"nothing to delete: no disturbed measurement in {path}")
        else:
            print(f"deleted {path}" if cache.reset() else f"nothing to delete: {path} does not exist")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
