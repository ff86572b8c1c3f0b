"""The machine a performance figure came from, and the FP32 peak it allows.

A figure without its machine cannot be checked: 412 tokens/s and "53% of a 408.5 GFLOP/s ceiling" are
plausible on 2 Zen 5 cores (512-bit FMA) and impossible on 2 Zen 3 cores (AVX2, about 190 GFLOP/s at
3 GHz). `describe_machine()` reads what the operating system says and returns a `Machine`:

- the CPU: vendor, family, model, stepping, model name (/proc/cpuinfo), and its microarchitecture
  where known (`microarchitecture`: AMD family 23 = Zen/Zen 2, 25 = Zen 3 or Zen 4 by model, 26 = Zen 5;
  Intel family 6 by model). A virtual CPU may report a model number that does not match its features
  (this project's Intel VM says model 167, Rocket Lake, and has AMX, which Rocket Lake lacks); then the
  features decide and the note says so;
- the ISA level from the feature flags (AVX2 / AVX-512 / AVX-512 + bf16 / AVX-512 + AMX), and the level
  the math libraries may use when the environment limits them (`ONEDNN_MAX_CPU_ISA`,
  `MKL_ENABLE_INSTRUCTIONS`, `OPENBLAS_CORETYPE`): an ISA-limited run on this CPU, not another CPU;
- physical cores and hardware threads of the CPUs this process may run on (/sys topology, else
  /proc/cpuinfo's core ids), the clock as read (/proc/cpuinfo MHz, cpufreq's `cpuinfo_max_freq` when
  present, the GHz in the model name);
- Paddle's version and commit, the oneDNN and MKL versions bundled with it and the code path each
  selects on this CPU (asked from the libraries themselves), NumPy's BLAS (`library_versions`);
- the estimated FP32 peak: physical cores x clock x FP32 FLOP per cycle and core, the last from the
  microarchitecture and the vector width in effect (two 512-bit FMA units: 64; Zen 4's AVX-512 on
  256-bit units: 32; two 256-bit FMA units (AVX2): 32). `check_rate` flags a measured rate above it.

The peak is an estimate. The clock read is often the nominal one (a VM shows no turbo; cpufreq's maximum
is used when the system exposes it), AVX-512 code may run below it, and a VM's vCPUs are counted as cores
(they may be hardware threads of fewer host cores). A measured rate above the peak is therefore either a
measurement error or a clock above the one read, and the flag says both.

Every input can be given (tests pass fake /proc/cpuinfo text, /sys trees and environments). Nothing here
imports Paddle: the library versions are read from Paddle's installed files and shared libraries.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

# ISA levels, lowest first: what the flags allow, and what a library limited by the environment may use
ISA_LEVELS = ("SSE", "AVX", "AVX2", "AVX-512", "AVX-512 + bf16", "AVX-512 + AMX")
VECTOR_BITS = {"SSE": 128, "AVX": 256, "AVX2": 256, "AVX-512": 512, "AVX-512 + bf16": 512, "AVX-512 + AMX": 512}


def isa_level(flags: Iterable[str]) -> str:
    """The highest ISA level the CPU's feature flags (/proc/cpuinfo `flags`) show. AMX and bf16 add
    bfloat16/int8 instructions; the FP32 peak is the AVX-512 one either way."""
    f = set(flags)
    if "avx512f" in f:
        if "amx_tile" in f:
            return "AVX-512 + AMX"
        return "AVX-512 + bf16" if "avx512_bf16" in f else "AVX-512"
    if "avx2" in f and "fma" in f:
        return "AVX2"
    return "AVX" if "avx" in f else "SSE"


# --- microarchitectures ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Core:
    """A microarchitecture's FP32 throughput: FLOP per cycle and core at a vector width (FMA = 2 FLOP)."""

    name: str
    top_isa: str  # the highest ISA level this microarchitecture has
    flops_512: int = 0  # 0: no 512-bit vectors
    flops_256: int = 32
    note: str = ""

    def flops_per_cycle(self, isa: str) -> int:
        bits = VECTOR_BITS[isa]
        if bits >= 512 and self.flops_512:
            return self.flops_512
        if bits >= 256:
            return self.flops_256
        return max(8, self.flops_256 // 2)  # SSE: half the 256-bit rate


_TWO_FMA_512 = dict(flops_512=64, flops_256=32)  # two 512-bit FMA units (two 256-bit ones for AVX2)
_ONE_FMA_512 = dict(flops_512=32, flops_256=32)  # one 512-bit FMA unit (ports 0+1 fused), two 256-bit ones

# AMD by (family, model range); Zen 4 runs AVX-512 on its 256-bit units ("double pumped")
_AMD = (
    (23, range(0x00, 0x30), Core("Zen / Zen+", "AVX2", flops_256=16, note="two 128-bit FMA units")),
    (23, range(0x30, 0x100), Core("Zen 2", "AVX2", note="two 256-bit FMA units")),
    (25, range(0x00, 0x10), Core("Zen 3", "AVX2", note="two 256-bit FMA units")),
    (25, range(0x10, 0x20), Core("Zen 4", "AVX-512 + bf16", flops_512=32, note="AVX-512 on 256-bit units")),
    (25, range(0x20, 0x60), Core("Zen 3", "AVX2", note="two 256-bit FMA units")),
    (25, range(0x60, 0x80), Core("Zen 4", "AVX-512 + bf16", flops_512=32, note="AVX-512 on 256-bit units")),
    (25, range(0xA0, 0xB0), Core("Zen 4", "AVX-512 + bf16", flops_512=32, note="AVX-512 on 256-bit units")),
    (26, range(0x20, 0x30), Core("Zen 5 (mobile)", "AVX-512 + bf16", flops_512=32,
                                 note="Strix Point: AVX-512 on 256-bit units")),
    (26, range(0x60, 0x70), Core("Zen 5 (mobile)", "AVX-512 + bf16", flops_512=32,
                                 note="Krackan Point: AVX-512 on 256-bit units")),
    (26, range(0x00, 0x100), Core("Zen 5", "AVX-512 + bf16", **_TWO_FMA_512,
                                  note="full 512-bit datapath (EPYC 9005 / Ryzen 9000)")),
)
# Intel family 6 by model
_INTEL: Dict[int, Core] = {}
for _models, _core in (
        ((0x2A, 0x2D), Core("Sandy Bridge", "AVX", flops_256=16, note="no FMA: one 256-bit add + one multiply")),
        ((0x3A, 0x3E), Core("Ivy Bridge", "AVX", flops_256=16, note="no FMA: one 256-bit add + one multiply")),
        ((0x3C, 0x3F, 0x45, 0x46), Core("Haswell", "AVX2", note="two 256-bit FMA units")),
        ((0x3D, 0x47, 0x4F, 0x56), Core("Broadwell", "AVX2", note="two 256-bit FMA units")),
        ((0x4E, 0x5E), Core("Skylake (client)", "AVX2", note="two 256-bit FMA units")),
        ((0x8E, 0x9E, 0xA5, 0xA6), Core("Kaby / Coffee / Comet Lake", "AVX2", note="two 256-bit FMA units")),
        ((0x97, 0x9A, 0xB7, 0xBA, 0xBF), Core("Alder / Raptor Lake", "AVX2", note="P-cores: two 256-bit FMA units")),
        ((0xAA, 0xAC, 0xBD, 0xC5, 0xC6), Core("Meteor / Lunar / Arrow Lake", "AVX2", note="P-cores: two 256-bit FMA units")),
        ((0xAF,), Core("Sierra Forest", "AVX2", flops_256=16, note="E-cores: AVX2 on 128-bit units")),
        ((0x55,), Core("Skylake-SP / Cascade Lake / Cooper Lake", "AVX-512 + bf16", **_TWO_FMA_512,
                       note="two 512-bit FMA units on most Xeon Gold 6xxx/Platinum, one on others: the upper bound")),
        ((0x6A, 0x6C), Core("Ice Lake-SP", "AVX-512", **_TWO_FMA_512, note="two 512-bit FMA units")),
        ((0x66, 0x7D, 0x7E, 0x8C, 0x8D), Core("Ice Lake / Tiger Lake (client)", "AVX-512", **_ONE_FMA_512,
                                             note="one 512-bit FMA unit")),
        ((0xA7,), Core("Rocket Lake", "AVX-512", **_ONE_FMA_512, note="one 512-bit FMA unit")),
        ((0x57, 0x85), Core("Knights Landing / Mill", "AVX-512", **_TWO_FMA_512, note="two 512-bit FMA units")),
        ((0x8F,), Core("Sapphire Rapids", "AVX-512 + AMX", **_TWO_FMA_512, note="two 512-bit FMA units")),
        ((0xCF,), Core("Emerald Rapids", "AVX-512 + AMX", **_TWO_FMA_512, note="two 512-bit FMA units")),
        ((0xAD, 0xAE), Core("Granite Rapids", "AVX-512 + AMX", **_TWO_FMA_512, note="two 512-bit FMA units")),
):
    for _m in _models:
        _INTEL[_m] = _core


def _by_features(vendor: str, isa: str) -> Core:
    """The upper bound for a CPU known only by its features."""
    if isa == "AVX-512 + AMX":
        return Core("Sapphire Rapids-class or later (by its features: AMX)", isa, **_TWO_FMA_512,
                    note="two 512-bit FMA units")
    if VECTOR_BITS[isa] >= 512:
        return Core(f"unknown {vendor or 'x86'} AVX-512 core", isa, **_TWO_FMA_512,
                    note="FMA units unknown: two 512-bit ones assumed (the upper bound)")
    if isa == "AVX2":
        return Core(f"unknown {vendor or 'x86'} AVX2 core", isa, note="two 256-bit FMA units assumed")
    return Core(f"unknown {vendor or 'x86'} core", isa, flops_256=16, note="no FMA: one add + one multiply per cycle")


def microarchitecture(vendor: str, family: int, model: int, flags: Iterable[str]) -> Tuple[Core, str]:
    """(the core's microarchitecture, a note when the model number and the features disagree). Known
    models come from the tables above; a model whose features exceed what its microarchitecture has (a
    virtual CPU that reports another model) or an unknown one is taken by its features."""
    isa = isa_level(flags)
    core: Optional[Core] = None
    if vendor == "AuthenticAMD":
        core = next((c for fam, models, c in _AMD if fam == family and model in models), None)
    elif vendor == "GenuineIntel" and family == 6:
        core = _INTEL.get(model)
    if core is None:
        return _by_features(vendor, isa), ""
    if ISA_LEVELS.index(isa) > ISA_LEVELS.index(core.top_isa):
        by_features = _by_features(vendor, isa)
        note = (f"model {model} is {core.name} by its number, but its features show {isa}, which {core.name} lacks "
                "(a virtual CPU reporting another model): taken by its features")
        return by_features, note
    return core, ""


# --- what the operating system says -------------------------------------------------------------------------

def parse_cpuinfo(text: str) -> List[Dict[str, str]]:
    """/proc/cpuinfo's text -> one dict of fields per processor."""
    processors = []
    for block in text.strip().split("\n\n"):
        fields: Dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            processors.append(fields)
    return processors


def read_cpuinfo(text: Optional[str] = None) -> List[Dict[str, str]]:
    """The processors of /proc/cpuinfo (or of `text`); empty where it cannot be read (not Linux)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
    return parse_cpuinfo(text)


def _read_int(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def core_topology(cpus: Sequence[int], processors: Sequence[Mapping[str, str]], sys_root: Path) -> Tuple[int, str]:
    """(physical cores among logical CPUs `cpus`, where that came from): distinct (package, core id)
    pairs of /sys/devices/system/cpu/cpuN/topology, else of /proc/cpuinfo's `physical id` / `core id`,
    else every logical CPU counted as a core."""
    pairs = set()
    for n in cpus:
        top = sys_root / "devices" / "system" / "cpu" / f"cpu{n}" / "topology"
        core, package = _read_int(top / "core_id"), _read_int(top / "physical_package_id")
        if core is None:
            pairs = set()
            break
        pairs.add((package, core))
    if pairs:
        return len(pairs), "/sys topology"
    by_number = {p.get("processor"): p for p in processors}
    for n in cpus:
        p = by_number.get(str(n))
        if not p or "core id" not in p:
            pairs = set()
            break
        pairs.add((p.get("physical id"), p["core id"]))
    if pairs:
        return len(pairs), "/proc/cpuinfo core ids"
    return len(cpus), "not found: every logical CPU counted as a core"


def read_clock(cpus: Sequence[int], processors: Sequence[Mapping[str, str]], sys_root: Path) -> Dict[str, Any]:
    """The clock as the system shows it, in MHz: /proc/cpuinfo's current `cpu MHz` (min and max over
    the CPUs), cpufreq's `cpuinfo_max_freq` (when the system exposes cpufreq), the GHz of the model name
    (Intel's nominal clock). `mhz` is the one the peak uses: cpufreq's maximum, else the largest of the
    others, with `source` naming it."""
    read = [float(p["cpu MHz"]) for p in processors if _float(p.get("cpu MHz")) is not None]
    max_khz = [k for k in (_read_int(sys_root / "devices" / "system" / "cpu" / f"cpu{n}" / "cpufreq" / "cpuinfo_max_freq")
                           for n in cpus) if k]
    name = processors[0].get("model name", "") if processors else ""
    named = re.search(r"@\s*([0-9.]+)\s*GHz", name)
    out: Dict[str, Any] = {"mhz_read_min": min(read) if read else None, "mhz_read_max": max(read) if read else None,
                           "cpufreq_max_mhz": max(max_khz) / 1000 if max_khz else None,
                           "model_name_mhz": float(named.group(1)) * 1000 if named else None}
    if out["cpufreq_max_mhz"]:
        out["mhz"], out["source"] = out["cpufreq_max_mhz"], "cpufreq cpuinfo_max_freq"
    else:
        candidates = [(v, s) for v, s in ((out["mhz_read_max"], "/proc/cpuinfo cpu MHz"),
                                          (out["model_name_mhz"], "the model name")) if v]
        out["mhz"], out["source"] = max(candidates) if candidates else (None, "not found")
        if out["mhz"]:
            out["source"] += " (no cpufreq: turbo not visible)"
    return out


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


# --- the math libraries' ISA limits ---------------------------------------------------------------------------

def _level_of(value: str) -> Optional[str]:
    """An environment value of ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS / OPENBLAS_CORETYPE as an ISA level."""
    v = value.strip().upper().replace("-", "_")
    if not v or v in ("ALL", "DEFAULT"):
        return None
    if "AMX" in v:
        return "AVX-512 + AMX"
    if "AVX512" in v or v in ("SKYLAKEX", "COOPERLAKE", "SAPPHIRERAPIDS"):
        return "AVX-512 + bf16" if "BF16" in v or v in ("COOPERLAKE", "SAPPHIRERAPIDS") else "AVX-512"
    if v.startswith("AVX2") or v in ("HASWELL", "ZEN", "SKYLAKE"):
        return "AVX2"
    if v.startswith("AVX") or v in ("SANDYBRIDGE",):
        return "AVX"
    if v.startswith("SSE") or v in ("NEHALEM", "PRESCOTT", "CORE2"):
        return "SSE"
    return None


ISA_LIMIT_VARIABLES = {"oneDNN": ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"), "MKL": ("MKL_ENABLE_INSTRUCTIONS",),
                       "OpenBLAS": ("OPENBLAS_CORETYPE",)}


def isa_limits(env: Mapping[str, str]) -> Dict[str, Tuple[str, str]]:
    """{library: (variable=value, ISA level)} of the limits set in `env`."""
    out = {}
    for library, names in ISA_LIMIT_VARIABLES.items():
        for name in names:
            level = _level_of(env.get(name, ""))
            if level:
                out[library] = (f"{name}={env[name]}", level)
                break
    return out


def isa_in_effect(cpu_isa: str, limits: Mapping[str, Tuple[str, str]]) -> str:
    """The widest ISA level any of the math libraries may use: the CPU's, unless every one of oneDNN,
    MKL and OpenBLAS is limited below it (then the highest of their limits)."""
    if set(limits) < set(ISA_LIMIT_VARIABLES):
        return cpu_isa
    highest = max((level for _, level in limits.values()), key=ISA_LEVELS.index)
    return min(cpu_isa, highest, key=ISA_LEVELS.index)


# --- Paddle and its math libraries --------------------------------------------------------------------------

_ONEDNN_ISA = {0x1: "SSE4.1", 0x3: "AVX", 0x7: "AVX2", 0xF: "AVX2 + VNNI", 0x1F: "AVX2 + VNNI-2", 0x27: "AVX-512",
               0x67: "AVX-512 + VNNI", 0xE7: "AVX-512 + bf16", 0x1EF: "AVX-512 + fp16", 0xFEF: "AVX-512 + AMX",
               0x1FEF: "AVX-512 + AMX-fp16"}


def _paddle_dir() -> Optional[Path]:
    try:
        spec = importlib.util.find_spec("paddle")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


def mkl_code_path(processor: str) -> str:
    """MKL's `Processor` text (the code path its dispatcher chose) as an ISA level."""
    for marker, level in (("Extensions 512", "AVX-512"), ("Extensions 2", "AVX2"), ("Vector Extensions", "AVX"),
                          ("SIMD Extensions 4.2", "SSE4.2"), ("SIMD Extensions 2", "SSE2")):
        if marker in processor:
            return level + (" + VNNI" if "Neural Network" in processor else "")
    return processor or "?"


def library_versions(paddle_dir: Optional[Path] = None, *, numpy_blas: bool = True) -> Dict[str, Any]:
    """Paddle's version and commit (from its installed version file), the oneDNN and MKL versions of the
    libraries bundled with it and the code path each chose on this CPU under this environment (asked
    from the libraries: `dnnl_get_effective_cpu_isa`, `MKL_Get_Version`), and NumPy's BLAS (threadpoolctl,
    when NumPy is importable). Missing pieces are left out, never an error."""
    out: Dict[str, Any] = {}
    root = paddle_dir or _paddle_dir()
    if root is None:
        return out
    try:
        text = (root / "version" / "__init__.py").read_text()
        for key in ("full_version", "commit", "with_mkl", "cuda_version"):
            m = re.search(rf"^{key}\s*=\s*'([^']*)'", text, re.M)
            if m:
                out[f"paddle_{key.replace('full_', '')}"] = m.group(1)
    except OSError:
        pass
    libs = root / "libs"
    try:
        dnnl = ctypes.CDLL(str(libs / "libdnnl.so.3"))

        class _DnnlVersion(ctypes.Structure):
            _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                        ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]

        dnnl.dnnl_version.restype = ctypes.POINTER(_DnnlVersion)
        v = dnnl.dnnl_version().contents
        out["onednn"] = f"{v.major}.{v.minor}.{v.patch} ({(v.hash or b'').decode()[:12]})"
        isa = dnnl.dnnl_get_effective_cpu_isa()
        out["onednn_isa"] = _ONEDNN_ISA.get(isa, hex(isa))
    except (OSError, AttributeError):
        pass
    try:
        ctypes.CDLL(str(libs / "libiomp5.so"), mode=ctypes.RTLD_GLOBAL)
        mkl = ctypes.CDLL(str(libs / "libmklml_intel.so"))

        class _MklVersion(ctypes.Structure):
            _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("update", ctypes.c_int),
                        ("status", ctypes.c_char_p), ("build", ctypes.c_char_p), ("processor", ctypes.c_char_p),
                        ("platform", ctypes.c_char_p)]

        mv = _MklVersion()
        mkl.MKL_Get_Version(ctypes.byref(mv))
        out["mkl"] = f"{mv.major}.{mv.minor}.{mv.update} (build {(mv.build or b'').decode()})"
        out["mkl_code_path"] = mkl_code_path((mv.processor or b"").decode())
    except (OSError, AttributeError):
        pass
    if numpy_blas:
        try:
            import numpy  # noqa: F401  (threadpoolctl lists the BLAS of loaded modules)
            from threadpoolctl import threadpool_info

            blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
            if blas:
                b = blas[0]
                out["numpy_blas"] = f"{b.get('internal_api')} {b.get('version')} ({b.get('architecture', '?')} kernels)"
        except Exception:  # noqa: BLE001  (optional: absent or failing introspection leaves it out)
            pass
    return out


# --- the machine -------------------------------------------------------------------------------------------

@dataclass
class Machine:
    vendor: str
    family: int
    model: int
    stepping: str
    model_name: str
    microarchitecture: str
    microarchitecture_note: str
    isa: str  # what the CPU's flags show
    isa_in_effect: str  # what the math libraries may use (isa, unless the environment limits them)
    isa_limits: Dict[str, Tuple[str, str]]
    virtual: bool  # the `hypervisor` flag
    logical_cpus: int  # online CPUs of the machine
    process_cpus: int  # logical CPUs in this process's affinity mask
    physical_cores: int  # physical cores among them
    cores_source: str
    clock: Dict[str, Any]
    flops_per_cycle: int  # FP32, per core, at isa_in_effect
    peak_gflops: Optional[float]  # FP32, physical_cores x clock x flops_per_cycle
    libraries: Dict[str, Any] = field(default_factory=dict)

    @property
    def isa_limited(self) -> bool:
        return self.isa_in_effect != self.isa

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["isa_limits"] = {k: list(v) for k, v in self.isa_limits.items()}
        out["summary"] = self.summary()
        return out

    def summary(self) -> str:
        """One line: what a figure's label should carry."""
        limited = f", ISA-limited to {self.isa_in_effect}" if self.isa_limited else ""
        return (f"{self.model_name} ({self.vendor} family {self.family} model {self.model}: {self.microarchitecture}), "
                f"{self.isa}{limited}, {self.physical_cores} physical cores / {self.process_cpus} CPUs"
                f"{', VM' if self.virtual else ''}, {_mhz(self.clock.get('mhz'))}, FP32 peak "
                f"{_gflops(self.peak_gflops)}")

    def header(self) -> List[str]:
        """The lines a benchmark prints first."""
        c, lib = self.clock, self.libraries
        lines = [f"machine: {self.model_name}; vendor {self.vendor}, family {self.family}, model {self.model}, "
                 f"stepping {self.stepping}; microarchitecture {self.microarchitecture}"
                 + (f" ({self.microarchitecture_note})" if self.microarchitecture_note else ""),
                 f"  ISA: {self.isa}" + (f"; in effect {self.isa_in_effect} (ISA-limited run on this CPU: "
                                        f"{', '.join(v[0] for v in self.isa_limits.values())})"
                                        if self.isa_limited else "")
                 + (f"; environment limits {', '.join(f'{k} {v[0]}' for k, v in self.isa_limits.items())}"
                    if self.isa_limits and not self.isa_limited else ""),
                 f"  cores: {self.physical_cores} physical for this process ({self.cores_source}) of "
                 f"{self.process_cpus} logical CPUs in its affinity mask ({self.logical_cpus} online)"
                 + ("; a virtual machine: vCPUs counted as cores" if self.virtual else ""),
                 f"  clock: {_mhz(c.get('mhz_read_min'))}-{_mhz(c.get('mhz_read_max'))} read in /proc/cpuinfo; "
                 + (f"cpufreq max {_mhz(c['cpufreq_max_mhz'])}" if c.get("cpufreq_max_mhz") else "no cpufreq")
                 + f"; the peak uses {_mhz(c.get('mhz'))} ({c.get('source')})",
                 f"  FP32 peak (estimate): {self.physical_cores} cores x {_mhz(c.get('mhz'))} x {self.flops_per_cycle} "
                 f"FLOP/cycle ({self.isa_in_effect}) = {_gflops(self.peak_gflops)}"]
        if lib:
            lines.append("  software: paddle " + f"{lib.get('paddle_version', '?')} ({str(lib.get('paddle_commit', '?'))[:12]})"
                         + f"; oneDNN {lib.get('onednn', '?')}, code path {lib.get('onednn_isa', '?')}"
                         + f"; MKL {lib.get('mkl', '?')}, code path {lib.get('mkl_code_path', '?')}"
                         + (f"; NumPy BLAS {lib['numpy_blas']}" if lib.get("numpy_blas") else ""))
        return lines

    def check_rate(self, gflops: float, what: str = "measured") -> Optional[str]:
        """A warning when `gflops` (FP32) exceeds the estimated peak, else None."""
        if not self.peak_gflops or gflops <= self.peak_gflops:
            return None
        return (f"MEASUREMENT ERROR? {what} {gflops:.1f} GFLOP/s is above this machine's estimated FP32 peak "
                f"{self.peak_gflops:.1f} GFLOP/s ({self.physical_cores} cores x {_mhz(self.clock.get('mhz'))} x "
                f"{self.flops_per_cycle} FLOP/cycle, {self.isa_in_effect}): either the timing is wrong or the cores "
                f"run above the clock read ({self.clock.get('source')})")


def _mhz(value) -> str:
    return f"{value / 1000:.2f} GHz" if value else "?"


def _gflops(value) -> str:
    return f"{value:.1f} GFLOP/s" if value else "unknown"


def describe_machine(*, cpuinfo_text: Optional[str] = None, sys_root: Path = Path("/sys"),
                     cpus: Optional[Iterable[int]] = None, env: Optional[Mapping[str, str]] = None,
                     libraries: bool = True, quota: Optional[float] = None) -> Machine:
    """The `Machine` this process runs on (module docstring). Tests give `cpuinfo_text`, `sys_root`,
    `cpus` (the affinity mask), `env` and `libraries=False`. `quota`: a cgroup CPU quota below the
    cores (default: read by ernie_mtl.dist.threads.cpu_budget when reading the real system)."""
    processors = read_cpuinfo(cpuinfo_text)
    first = processors[0] if processors else {}
    env = os.environ if env is None else env
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = range(os.cpu_count() or 1)
        if quota is None and cpuinfo_text is None:
            from ernie_mtl.dist.threads import cpu_budget

            quota = cpu_budget().quota
    cpus = sorted(cpus)
    flags = first.get("flags", "").split()
    vendor = first.get("vendor_id", "")
    family, model = int(_float(first.get("cpu family")) or 0), int(_float(first.get("model")) or 0)
    core, note = microarchitecture(vendor, family, model, flags)
    isa = isa_level(flags)
    limits = isa_limits(env)
    effective = isa_in_effect(isa, limits)
    physical, source = core_topology(cpus, processors, Path(sys_root))
    cores = physical if quota is None else min(float(physical), quota)
    clock = read_clock(cpus, processors, Path(sys_root))
    flops = core.flops_per_cycle(effective)
    peak = cores * clock["mhz"] / 1000 * flops if clock.get("mhz") else None
    return Machine(vendor=vendor, family=family, model=model, stepping=first.get("stepping", "?"),
                   model_name=first.get("model name", "?"), microarchitecture=core.name,
                   microarchitecture_note="; ".join(x for x in (note, core.note) if x), isa=isa,
                   isa_in_effect=effective, isa_limits=limits, virtual="hypervisor" in flags,
                   logical_cpus=len(processors) or (os.cpu_count() or 1), process_cpus=len(cpus),
                   physical_cores=physical, cores_source=source if quota is None or quota >= physical else
                   f"{source}; cgroup quota {quota:g} CPUs", clock=clock, flops_per_cycle=flops,
                   peak_gflops=peak, libraries=library_versions() if libraries else {})


def load_report() -> Dict[str, Any]:
    """The machine's load now: the 1/5/15-minute load averages (/proc/loadavg)."""
    try:
        return {"loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]}
    except (OSError, ValueError):
        return {}
