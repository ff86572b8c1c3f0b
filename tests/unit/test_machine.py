"""ernie_mtl.dist.machine: the machine a benchmark names (CPU, microarchitecture, ISA level, cores, clock)
and the FP32 peak estimated from them, from fake /proc/cpuinfo texts and /sys trees of known CPUs; the
ISA limits of the environment (in the machine description, in the kernel cache's machine identity, and
really honoured by the oneDNN/MKL bundled with Paddle)."""
import zlib  # noqa: F401  (before paddle)

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ernie_mtl.dist.machine import (Core, describe_machine, isa_in_effect, isa_level, isa_limits, microarchitecture,
                                    mkl_code_path, parse_cpuinfo)

ROOT = Path(__file__).resolve().parents[2]

BASE_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
              "syscall nx lm constant_tsc pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 popcnt aes xsave")
AVX2 = BASE_FLAGS + " avx f16c fma bmi1 avx2 bmi2"
AVX512 = AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"


def cpuinfo(vendor, family, model, name, flags, mhz, cores, threads_per_core=1, stepping=1):
    """/proc/cpuinfo text of `cores` x `threads_per_core` logical CPUs in one package."""
    blocks = []
    for n in range(cores * threads_per_core):
        blocks.append("\n".join([
            f"processor\t: {n}", f"vendor_id\t: {vendor}", f"cpu family\t: {family}", f"model\t\t: {model}",
            f"model name\t: {name}", f"stepping\t: {stepping}", f"cpu MHz\t\t: {mhz}", "physical id\t: 0",
            f"siblings\t: {cores * threads_per_core}", f"core id\t\t: {n % cores}", f"cpu cores\t: {cores}",
            f"flags\t\t: {flags}"]))
    return "\n\n".join(blocks) + "\n"


def machine(text, cpus=None, sys_root=None, env=None, tmp=None):
    n = len(parse_cpuinfo(text))
    return describe_machine(cpuinfo_text=text, sys_root=sys_root or (tmp / "no-sys"), cpus=cpus or range(n),
                            env=env or {}, libraries=False)


ZEN3 = cpuinfo("AuthenticAMD", 25, 1, "AMD EPYC 7763 64-Core Processor", AVX2, "2445.404", cores=2)
ZEN4 = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor", AVX512 + " avx512_bf16", "2400.000", cores=2)
ZEN5 = cpuinfo("AuthenticAMD", 26, 2, "AMD EPYC", AVX512 + " avx512_bf16 avx_vnni", "3000.000", cores=2)
SPR = cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8480+",
              AVX512 + " avx512_bf16 amx_bf16 amx_tile amx_int8", "2000.000", cores=2, threads_per_core=2)
HASWELL = cpuinfo("GenuineIntel", 6, 63, "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", AVX2, "1200.000", cores=2)
# this project's Intel VM: model 167 (Rocket Lake by its number) with AMX, which Rocket Lake lacks
VM = cpuinfo("GenuineIntel", 6, 167, "Intel(R) Xeon(R) Processor", AVX512 + " avx512_bf16 amx_tile hypervisor",
             "2599.998", cores=2)


def test_zen3_is_avx2_with_two_256_bit_fma_units(tmp_path):
    m = machine(ZEN3, tmp=tmp_path)
    assert (m.vendor, m.family, m.model, m.microarchitecture) == ("AuthenticAMD", 25, 1, "Zen 3")
    assert m.isa == m.isa_in_effect == "AVX2"
    assert m.flops_per_cycle == 32
    assert m.peak_gflops == pytest.approx(2 * 2.445404 * 32)  # 156.5: the "about 160-240" on 2 cores


def test_zen4_runs_avx512_on_256_bit_units(tmp_path):
    m = machine(ZEN4, tmp=tmp_path)
    assert m.microarchitecture == "Zen 4"
    assert m.isa == "AVX-512 + bf16"
    assert m.flops_per_cycle == 32  # double-pumped: no more FP32 per cycle than AVX2
    assert m.peak_gflops == pytest.approx(2 * 2.4 * 32)


def test_zen5_family_26_has_the_full_512_bit_datapath(tmp_path):
    m = machine(ZEN5, tmp=tmp_path)
    assert (m.family, m.microarchitecture) == (26, "Zen 5")
    assert m.isa == "AVX-512 + bf16"
    assert m.flops_per_cycle == 64
    assert m.peak_gflops == pytest.approx(2 * 3.0 * 64)  # 384: the old "Zen 4" 408.5 needs >= 3.19 GHz here
    assert "408.5" in m.check_rate(408.5)
    assert m.check_rate(383.0) is None


def test_sapphire_rapids_counts_physical_cores_not_hardware_threads(tmp_path):
    m = machine(SPR, tmp=tmp_path)  # 4 logical CPUs, 2 cores (core ids 0, 1, 0, 1)
    assert m.microarchitecture == "Sapphire Rapids"
    assert m.isa == "AVX-512 + AMX"
    assert (m.process_cpus, m.physical_cores) == (4, 2)
    assert m.cores_source == "/proc/cpuinfo core ids"
    assert m.peak_gflops == pytest.approx(2 * 2.0 * 64)
    assert m.check_rate(300.0).startswith("MEASUREMENT ERROR?")
    assert m.check_rate(250.0) is None


def test_sys_topology_and_cpufreq_maximum_are_preferred(tmp_path):
    root = tmp_path / "sys"
    for n, core in enumerate((0, 1, 0, 1)):  # SMT siblings share core ids
        top = root / "devices" / "system" / "cpu" / f"cpu{n}"
        (top / "topology").mkdir(parents=True)
        (top / "topology" / "core_id").write_text(f"{core}\n")
        (top / "topology" / "physical_package_id").write_text("0\n")
        (top / "cpufreq").mkdir()
        (top / "cpufreq" / "cpuinfo_max_freq").write_text("3800000\n")  # kHz
    m = machine(SPR, sys_root=root, tmp=tmp_path)
    assert (m.physical_cores, m.cores_source) == (2, "/sys topology")
    assert m.clock["mhz"] == pytest.approx(3800.0) and m.clock["source"] == "cpufreq cpuinfo_max_freq"
    assert m.peak_gflops == pytest.approx(2 * 3.8 * 64)
    # a process pinned to the two hardware threads of core 0 has one core's peak
    assert machine(SPR, cpus=[0, 2], sys_root=root, tmp=tmp_path).peak_gflops == pytest.approx(3.8 * 64)


def test_avx2_only_intel_takes_the_nominal_clock_of_its_model_name(tmp_path):
    m = machine(HASWELL, tmp=tmp_path)
    assert m.microarchitecture == "Haswell"
    assert m.isa == "AVX2"
    assert m.clock["mhz_read_max"] == pytest.approx(1200.0)  # an idle core's current clock
    assert m.clock["mhz"] == pytest.approx(2500.0) and "model name" in m.clock["source"]
    assert m.peak_gflops == pytest.approx(2 * 2.5 * 32)


def test_a_virtual_cpu_whose_model_number_lacks_its_features_is_taken_by_its_features(tmp_path):
    m = machine(VM, tmp=tmp_path)
    assert "Rocket Lake" in m.microarchitecture_note and "taken by its features" in m.microarchitecture_note
    assert m.microarchitecture.startswith("Sapphire Rapids-class")
    assert m.virtual
    assert m.peak_gflops == pytest.approx(2 * 2.599998 * 64)  # 332.8 GFLOP/s
    assert "family 6 model 167" in m.summary() and "332.8 GFLOP/s" in m.summary()


def test_isa_limits_of_all_math_libraries_lower_the_peak(tmp_path):
    limited = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}
    m = machine(SPR, env=limited, tmp=tmp_path)
    assert (m.isa, m.isa_in_effect, m.isa_limited) == ("AVX-512 + AMX", "AVX2", True)
    assert m.peak_gflops == pytest.approx(2 * 2.0 * 32)
    assert any("ISA-limited run on this CPU" in line for line in m.header())
    # NumPy's OpenBLAS not limited: it may still run AVX-512, so the peak stays
    partial = machine(SPR, env={k: v for k, v in limited.items() if k != "OPENBLAS_CORETYPE"}, tmp=tmp_path)
    assert partial.isa_in_effect == "AVX-512 + AMX" and partial.peak_gflops == pytest.approx(2 * 2.0 * 64)
    # a limit above the CPU's own level changes nothing
    limits = isa_limits({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
                         "OPENBLAS_CORETYPE": "SkylakeX"})
    assert isa_in_effect("AVX2", limits) == "AVX2"


def test_isa_levels_and_microarchitecture_tables():
    assert isa_level(BASE_FLAGS.split()) == "SSE"
    assert isa_level((BASE_FLAGS + " avx").split()) == "AVX"
    assert isa_level((BASE_FLAGS + " avx avx2").split()) == "AVX"  # AVX2 without FMA is not the AVX2 level
    assert isa_level(AVX512.split()) == "AVX-512"
    core, note = microarchitecture("AuthenticAMD", 25, 0x61, AVX512.split())
    assert core.name == "Zen 4" and note == ""
    core, _ = microarchitecture("AuthenticAMD", 26, 0x24, AVX512.split())
    assert core.name == "Zen 5 (mobile)" and core.flops_per_cycle("AVX-512") == 32
    core, _ = microarchitecture("GenuineIntel", 6, 0xA7, AVX512.split())  # a real Rocket Lake: one 512-bit FMA
    assert core.name == "Rocket Lake" and core.flops_per_cycle("AVX-512") == 32
    core, _ = microarchitecture("HygonGenuine", 24, 0, AVX2.split())
    assert core.name.startswith("unknown") and core.flops_per_cycle("AVX2") == 32
    assert Core("x", "AVX", flops_256=16).flops_per_cycle("SSE") == 8
    assert mkl_code_path("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors") == "AVX2"


def test_kernel_cache_identity_keeps_its_key_unless_an_isa_limit_is_set():
    from ernie_mtl.program.kernel_choice import machine_identity, machine_key

    info = parse_cpuinfo(SPR)[0]
    plain = machine_identity(cpuinfo=info, paddle_version="2.6.2", env={})
    assert "isa_limits" not in plain  # the keys of existing caches do not change
    limited = machine_identity(cpuinfo=info, paddle_version="2.6.2", env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert limited["isa_limits"] == "ONEDNN_MAX_CPU_ISA=AVX2"
    assert machine_key(plain) != machine_key(limited)  # AVX2 timings are never read as AVX-512 ones


def test_bundled_onednn_and_mkl_honour_the_isa_limits():
    """The versions come from Paddle's own files, and the code path oneDNN reports follows
    ONEDNN_MAX_CPU_ISA (asked in a fresh process: a library fixes its choice on first use)."""
    probe = ("import json; from ernie_mtl.dist.machine import library_versions; "
             "print(json.dumps(library_versions(numpy_blas=False)))")

    def versions(env):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env}, check=True)
        return json.loads(out.stdout)

    import importlib.metadata

    free, limited = versions({}), versions({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert free["paddle_version"] == importlib.metadata.version("paddlepaddle")
    assert free["onednn"].startswith("3.") and free["mkl"].startswith("2019.")
    assert limited["onednn_isa"] == "AVX2"
    assert "512" not in limited["mkl_code_path"]
