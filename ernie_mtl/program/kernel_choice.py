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
  so exactly what training will run), a warm-up run each, then alternating rounds until the op type's
  time budget (`budget_s`, a quarter of a second split over its signatures) is spent, at least one;
  the minimum per kernel is kept (the run least disturbed by other processes). At ERNIE-base size the
  matmul types take longer than the budget (a warm-up and one timed run of each form per kernel:
  about a second each on 2 cores); the cache makes that a one-time cost per machine and shapes.
- The decision: oneDNN for an op type when its time summed over the program's ops (signature time x
  ops) is below `1 - MARGIN` of the plain kernel's; within that margin the plain kernel stays (it is
  the numerical reference). `cpu_kernels.ONEDNN_CONFLICTS` are then removed.
- The cache (`KernelCache`): every signature's two times are stored in one JSON file in the user's
  cache folder (`$XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json`, default `~/.cache/ernie_mtl/`), under
  the machine's identity (`machine_identity`: CPU vendor, model name, family/model/stepping, a hash of
  its feature flags, logical CPUs, the process's threads, Paddle's version and commit, and the ISA limits
  set in the environment: ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS). A later run on
  the same kind of machine with the same shapes measures nothing. The file is written atomically; a
  damaged or unwritable one is ignored with a note (the run measures instead), never fatal.

Nothing here decides by vendor name, and the timing function is injectable (`measure=`), so tests
decide with fake timings and never depend on the machine's speed.
"""
from __future__ import annotations

import hashlib
import json
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
MARGIN = 0.05  # oneDNN must save more than this fraction of an op type's plain time to be chosen
CACHE_FORMAT = 1
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
                     cpus: Optional[int] = None, paddle_version: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """What a timing depends on besides the shapes: the CPU (vendor, model name, family/model/stepping,
    a hash of its feature flags), its logical CPUs, this process's threads (OMP_NUM_THREADS as paddle
    runs with it), Paddle's version and commit, and the ISA limits set in the environment
    (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS: the same CPU on other code paths times differently;
    the key is unchanged when none is set). Every input can be given (tests)."""
    info = _cpuinfo() if cpuinfo is None else dict(cpuinfo)
    env = os.environ if env is None else env
    if paddle_version is None:
        import paddle

        paddle_version = f"{paddle.__version__} ({paddle.version.commit[:12]})"
    if threads is None:
        try:
            threads = max(1, int(env.get("OMP_NUM_THREADS", "1")))
        except ValueError:
            threads = 1
    flags = " ".join(sorted(info.get("flags", "").split()))
    identity = {"cpu": info.get("model name") or platform.processor() or platform.machine(),
                "vendor": info.get("vendor_id", ""),
                "family_model_stepping": "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping")),
                "cpu_flags": hashlib.sha1(flags.encode()).hexdigest()[:12] if flags else "",
                "logical_cpus": int(cpus if cpus is not None else (os.cpu_count() or 1)),
                "threads": int(threads), "paddle": paddle_version}
    limits = isa_limits(env)
    if limits:
        identity["isa_limits"] = " ".join(v[0] for _, v in sorted(limits.items()))
    return identity


def machine_key(machine: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(dict(machine), sort_keys=True).encode()).hexdigest()[:16]


def describe_machine(machine: Mapping[str, Any]) -> str:
    return (f"{machine.get('cpu', '?')} ({machine.get('vendor', '?')}, {machine.get('logical_cpus', '?')} CPUs, "
            f"{machine.get('threads', '?')} threads, paddle {machine.get('paddle', '?')})")


def cache_file(env: Optional[Mapping[str, str]] = None) -> Path:
    """`$XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json` (default `~/.cache/ernie_mtl/cpu_kernels.json`)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME") or os.path.expanduser("~")) / ".cache"
    return root / "ernie_mtl" / "cpu_kernels.json"


class KernelCache:
    """Measured times per (machine, signature) in one JSON file; see the module docstring. The first
    measurement of a signature on a machine is kept: `save` merges under a file lock and never replaces
    an entry already in the file, and `get` prefers the file's entry to this process's own, so every
    run on the machine decides from the same numbers (two runs started together end up with one
    choice, and a run that resumes another repeats its choice even before reading the checkpoint).
    Delete the file to measure again. `notes` collects what went wrong with the file (never raised)."""

    def __init__(self, path: Optional[os.PathLike] = None, *, machine: Mapping[str, Any]):
        self.path = Path(path) if path is not None else cache_file()
        self.machine = dict(machine)
        self.key = machine_key(machine)
        self.notes: List[str] = []
        self._new: Dict[str, Dict[str, Any]] = {}
        self._entries = self._mine(self._read())

    def _mine(self, data: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
        slot = data.get("machines", {}).get(self.key, {}) if data else {}
        entries = slot.get("signatures", {}) if isinstance(slot, dict) else {}
        return dict(entries) if isinstance(entries, dict) else {}

    def _read(self) -> Dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:  # unreadable or not JSON: measure again, rewrite it
            self.notes.append(f"kernel cache {self.path} ignored ({type(e).__name__}: {str(e)[:80]})")
            return {}
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("machines"), dict):
            self.notes.append(f"kernel cache {self.path} ignored (not a format-{CACHE_FORMAT} cache file)")
            return {}
        return data

    def get(self, signature_key: str) -> Optional[Tuple[float, float]]:
        """(plain seconds, oneDNN seconds) of this machine and signature: the file's, else this process's
        own measurement, else None."""
        for entry in (self._entries.get(signature_key), self._new.get(signature_key)):
            if not isinstance(entry, dict):
                continue
            try:
                plain, onednn = float(entry["plain_s"]), float(entry["onednn_s"])
            except (TypeError, KeyError, ValueError):
                continue
            if plain > 0 and onednn > 0:
                return plain, onednn
        return None

    def entry(self, signature_key: str) -> Optional[Dict[str, Any]]:
        """The whole stored entry (the file's, else this process's), when `get` has its times."""
        if self.get(signature_key) is None:
            return None
        return dict(self._entries.get(signature_key) or self._new[signature_key])

    def put(self, signature_key: str, description: str, plain_s: float, onednn_s: float, **extra: Any) -> None:
        self._new[signature_key] = {"op": description, "plain_s": plain_s, "onednn_s": onednn_s,
                                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}

    def save(self) -> None:
        """Add this process's new entries to the file as it is now (entries already there win), under a
        lock, atomically; then read the merged entries back. An unwritable place is a note, not an error
        (this process's own measurements decide)."""
        if not self._new:
            return
        from ernie_mtl.checkpoint.io import write_json_atomic

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path.with_name(self.path.name + ".lock")):
                data = self._read()
                machines = dict(data.get("machines", {})) if data else {}
                slot = machines.get(self.key) if isinstance(machines.get(self.key), dict) else {}
                entries = {**self._new, **self._mine({"machines": {self.key: slot}})}
                machines[self.key] = {"machine": self.machine, "signatures": entries}
                write_json_atomic(self.path, {"format": CACHE_FORMAT, "machines": machines}, indent=1)
        except OSError as e:
            self.notes.append(f"kernel cache {self.path} not written ({e.strerror or e}); the next run measures again")
            return
        self._entries = entries
        self._new.clear()


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


class ProgramTimer:
    """The default `measure`: (plain seconds, oneDNN seconds) per op of a signature, timed in this
    process with its threads (module docstring: warm-up, alternating rounds, minimum)."""

    def __init__(self, *, budget_s: float = 0.25, max_rounds: int = 5):
        self.budget_s = budget_s
        self.max_rounds = max_rounds
        self._exe = None

    def __call__(self, op, signature: OpSignature, budget_s: float) -> Tuple[float, float]:
        import paddle

        if self._exe is None:
            self._exe = paddle.static.Executor(paddle.CPUPlace())
        elements = sum(_prod(shape) for _, shapes in signature.inputs for shape in shapes)
        # small ops run 4 times per program run, so the executor's own per-run cost does not decide
        copies = 1 if signature.op_type.startswith("matmul") or elements > (1 << 20) else 4
        sides = []
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
                t = time.perf_counter()
                self._exe.run(program, scope=scope, fetch_list=[])
                times.append(time.perf_counter() - t)
            if time.perf_counter() - start >= budget_s:
                break
        return min(sides[0][2]) / copies, min(sides[1][2]) / copies


# --- the decision ------------------------------------------------------------------------------------

@dataclass
class TypeTiming:
    """An op type's time per micro-batch in the program with each kernel (its timed ops only)."""

    plain_s: float = 0.0
    onednn_s: float = 0.0
    flops: float = 0.0  # per micro-batch, matmul types only
    ops: int = 0  # ops of the type whose shapes were timed
    measured: int = 0  # signatures measured now (the rest came from the cache)

    def faster(self, margin: float = MARGIN) -> bool:
        return self.ops > 0 and self.onednn_s < (1.0 - margin) * self.plain_s

    def text(self) -> str:
        if self.flops:
            a, b = self.flops / self.onednn_s / 1e9, self.flops / self.plain_s / 1e9
            digits = 0 if min(a, b) >= 10 else 1
            return f"{a:.{digits}f} vs {b:.{digits}f} GFLOP/s"
        return f"{1e3 * self.onednn_s:.2f} vs {1e3 * self.plain_s:.2f} ms/step"

    def to_json(self) -> Dict[str, float]:
        return {"plain_s": self.plain_s, "onednn_s": self.onednn_s, "flops": self.flops, "ops": self.ops}


Measure = Callable[[Any, OpSignature, float], Tuple[float, float]]


def time_op_types(program, op_types: Iterable[str], *, batch: int, seq: int, cache: Optional[KernelCache] = None,
                  measure: Optional[Measure] = None, budget_s: float = 0.25) -> Dict[str, TypeTiming]:
    """{op type: TypeTiming} of `program`'s ops of `op_types`, from the cache where it has them, measured
    otherwise (`measure(op, signature, budget_s)` -> (plain s, oneDNN s) per op; default `ProgramTimer`).
    New measurements are written to the cache."""
    measure = measure or ProgramTimer()
    signatures = op_signatures(program, op_types, batch=batch, seq=seq)
    own: Dict[str, Tuple[float, float]] = {}
    for op_type in op_types:
        mine = [(sig, op) for sig, _, op in signatures if sig.op_type == op_type]
        for sig, op in mine:
            if cache is None or cache.get(sig.key) is None:
                own[sig.key] = measure(op, sig, budget_s / max(1, len(mine)))
                if cache is not None:
                    cache.put(sig.key, sig.describe(), *own[sig.key])
    if cache is not None:
        cache.save()  # the file's entries win from here on (KernelCache)
    out = {t: TypeTiming() for t in op_types}
    for sig, n, _ in signatures:
        got = (cache.get(sig.key) if cache is not None else None) or own[sig.key]
        timing = out[sig.op_type]
        timing.plain_s += n * got[0]
        timing.onednn_s += n * got[1]
        timing.flops += n * sig.flops()
        timing.ops += n
        timing.measured += sig.key in own
    return out


def choose_onednn_types(timings: Mapping[str, TypeTiming], *, margin: float = MARGIN) -> Tuple[Tuple[str, ...], List[str]]:
    """(op types to run on oneDNN, notes): the types whose oneDNN time beats the plain one by `margin`,
    less the known conflicts (`cpu_kernels.ONEDNN_CONFLICTS`)."""
    faster = sorted(t for t, timing in timings.items() if timing.faster(margin))
    kept, notes = onednn_conflicts(faster)
    return tuple(sorted(kept)), notes


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
        return tuple(t for t in self.onednn if not t.endswith("_grad"))

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
            how = {"measured": f"measured in {self.seconds:.1f} s", "cached": "from the kernel cache",
                   "checkpoint": "recorded in the checkpoint"}.get(self.source, self.source)
            rates = "; ".join(f"{t} {'oneDNN' if t in self.onednn else 'plain'} ({TypeTiming(**_timing(v)).text()})"
                              for t, v in sorted(self.timings.items()) if v.get("ops"))
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
                            budget_s=budget_s)
    onednn, notes = choose_onednn_types(timings, margin=margin)
    measured = any(t.measured for t in timings.values())
    return KernelChoice(mode="auto", onednn=onednn, bias_grads=True, source="measured" if measured else "cached",
                        timings={t: v.to_json() for t, v in timings.items() if v.ops},
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
    return (current, f"CPU kernels: --cpu_kernels {current.mode if current.mode != 'list' else ','.join(current.onednn)} "
            f"differs from the checkpoint's recorded kernels ({what}{where}): the resumed run continues within "
            "float32 rounding of the uninterrupted one, not bitwise")
