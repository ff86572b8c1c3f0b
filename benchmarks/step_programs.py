"""Training-step programs and their CPU variants, shared by bench_train.py and profile_step.py.

The coupling to the library is the training engine's one builder, `ernie_mtl.program.builder.build_programs`,
called by `build_pretrain_step` (the one task `pretrain` of flag-mode pretraining) and
`build_multitask_step` (masked LM + classification + CRF tagging), with tasks made from
`ernie_mtl.tasks` as the config loader makes them. Both return a `Step`: the main program, how to
initialise its scope, a few fixed feeds (`ernie_mtl.program.forward.make_feed`, plus the engine's dropout
seeds drawn per step as the trainer draws them) and the loss to fetch. When the builder changes,
only these functions follow.

Variants (a `+`-joined list, applied by `prepare_env` before paddle is imported and by
`apply_variant` after the build):

    threads1   OMP_NUM_THREADS=1 / MKL_NUM_THREADS=1, as Paddle runs when nobody sets them
    (default)  threads from ernie_mtl.dist.threads (cores / ranks on this node)
    serial     FLAGS_new_executor_serial_run=1 (ops run in order on the calling thread)
    inplace    FLAGS_new_executor_use_inplace=1
    onednn     ernie_mtl.program.cpu_kernels.use_onednn_ops(main): the fixed `exact` list (measured on Intel)
    onednn=T1:T2  oneDNN on the listed op types (candidates under study; `:`-separated)
    biasgrad   bias gradients by matmul (ernie_mtl.program.cpu_kernels.bias_grads_by_matmul)
    auto       what `--cpu_kernels auto` applies: the op types kernel_choice.measure_choice picks on this
               machine (the user's kernel cache first), then bias gradients by matmul
    fusedadam  the per-parameter adamw ops replaced by one fused_adam op per (decay, no decay) group
               (Paddle's multi-tensor op; its CPU kernel loops over the same AdamW kernel)
    seed       kept for old command lines: the engine's programs already read every dropout seed from
               the fed `dropout_seeds` (ernie_mtl/program/randomness.py), so this adds nothing
    nodrop     dropout probabilities 0 (the dropout ops stay, with p = 0)
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(os.path.abspath(__file__)).parents[1]  # not resolve(): a symlinked copy uses its own tree
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = {"tiny": "ernie-tiny-test", "small": "ernie-small", "base": "ernie-1.0-base-zh"}
SEED_PREFIX = "dropout_seed_"
# the LR schedule of every benchmark program: no warm-up, linear decay from the default max_lr over this many
# steps, stepped after every run (`Step.after_run`) as the trainer steps it, so the programs really train
# (bench_train --real_loop gives the CLI the same schedule: --warmup_rate 0 --decay_steps LR_HORIZON)
LR_HORIZON = 1000


def cpu_idle(seconds: float = 3.0) -> float:
    """Fraction of the machine's CPU time that was idle over the next `seconds` (/proc/stat)."""
    import time

    def sample():
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return float("nan")
    return (idle1 - idle0) / max(1, total1 - total0)


class OtherLoad:
    """CPU used by *other* processes while a block runs, in cores: the machine's busy time
    (/proc/stat) minus this process's own (os.times), over the wall time. 0.0 = nobody else ran.

        with OtherLoad() as other: ...;   other.cores"""

    def _sample(self):
        import time

        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system

    def __enter__(self):
        try:
            self._start = self._sample()
        except (OSError, ValueError):
            self._start = None
        self.cores = float("nan")
        return self

    def __exit__(self, *exc):
        if self._start is not None:
            end = self._sample()
            wall = end[0] - self._start[0]
            self.cores = max(0.0, ((end[1] - self._start[1]) - (end[2] - self._start[2])) / max(wall, 1e-9))
        return False


CLEAN = 0.1  # cores used by other processes below which a timed step counts as undisturbed
# steps run at most per kept step while waiting for undisturbed ones (`timed_steps`); BENCH_RETRY lowers it on a
# machine that is never quiet (every step is then disturbed and 3x the steps only cost time)
RETRY = max(1, int(os.environ.get("BENCH_RETRY", "3") or 3))

# --isa avx2: the math libraries Paddle and NumPy use, held to their AVX2 code paths on a CPU that has more
# (oneDNN and MKL read these when they first dispatch, NumPy's OpenBLAS when it loads: set before the import;
# checked with ONEDNN_VERBOSE=1 / MKL_VERBOSE=1, docs/performance.md). Paddle's own CPU kernels are not limited.
ISA_LIMITS = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}}


def isa_env(isa: str) -> Dict[str, str]:
    """The environment of an ISA-limited run (`--isa`): {} for the CPU's own ISA."""
    if not isa or isa == "native":
        return {}
    if isa not in ISA_LIMITS:
        raise SystemExit(f"--isa {isa!r}: choose native or {', '.join(ISA_LIMITS)}")
    return dict(ISA_LIMITS[isa])


def machine(*, numpy_blas: bool = True, env=None):
    """This machine (ernie_mtl.dist.machine.describe_machine) under `env` (default: this process's)."""
    from ernie_mtl.dist.machine import describe_machine

    m = describe_machine(env=env)
    if not numpy_blas:
        m.libraries.pop("numpy_blas", None)
    return m


def print_machine(m, file=None) -> None:
    """The header every benchmark prints first: the machine, its ISA, cores, clock, software and FP32 peak."""
    for line in m.header():
        print(line, file=file or sys.stdout)


def other_cores_summary(values) -> Dict[str, float]:
    """{median, max} of other processes' CPU (cores) over timed parts, NaNs left out."""
    import statistics

    v = [float(x) for x in values if x == x]
    return {"median": statistics.median(v), "max": max(v), "n": len(v)} if v else {}


def write_json(path, payload: Dict[str, Any], m) -> None:
    """`payload` with the machine and the command line, written to `path` atomically."""
    import json

    out = {"machine": m.to_json(), "command": [os.path.basename(sys.argv[0])] + sys.argv[1:], **payload}
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str))
    os.replace(tmp, path)


def timed_steps(run: Callable[[int], None], n: int, *, start: int = 0, max_runs: Optional[int] = None):
    """Run `run(i)` for i = start, start+1, ... until `n` steps ran while other processes used
    less than CLEAN cores, or `max_runs` (default RETRY x n) steps ran. Returns the `n` least disturbed
    steps as (seconds, other-process cores) pairs, in order of running, and the steps run."""
    import time

    max_runs = max_runs or RETRY * n
    steps = []
    i = start
    while len(steps) < max_runs:
        with OtherLoad() as other:
            t = time.perf_counter()
            run(i)
            seconds = time.perf_counter() - t
        steps.append((i, seconds, other.cores))
        i += 1
        if sum(1 for s in steps if s[2] < CLEAN) >= n:
            break
    kept = sorted(sorted(steps, key=lambda s: s[2])[:n])
    return [(s[1], s[2]) for s in kept], i


def wait_for_quiet(max_wait: float, *, idle: float = 0.9, log=None) -> float:
    """Block until the machine is at least `idle` idle over 3 s (other jobs finished), or `max_wait`
    seconds passed; returns the last idle fraction seen. 0 disables waiting."""
    import time

    deadline = time.time() + max_wait
    seen = cpu_idle()
    while max_wait > 0 and seen < idle and time.time() < deadline:
        if log:
            log(f"waiting for a quiet machine: {seen:.0%} idle")
        time.sleep(10)
        seen = cpu_idle()
    return seen


def parse_variant(text: str) -> Dict[str, Optional[str]]:
    """"serial+onednn=layer_norm:softmax" -> {"serial": None, "onednn": "layer_norm:softmax"}."""
    out: Dict[str, Optional[str]] = {}
    for part in filter(None, (text or "plain").split("+")):
        key, _, value = part.partition("=")
        if key not in ("plain", "threads1", "serial", "inplace", "onednn", "seed", "nodrop", "fusedadam", "biasgrad", "auto"):
            raise SystemExit(f"unknown variant part {part!r} in {text!r}")
        if key != "plain":
            out[key] = value or None
    return out


def prepare_env(variant: Dict[str, Optional[str]], env=None) -> str:
    """Set threads and executor flags for `variant` in `env` (os.environ); call before importing paddle.
    Returns the threads log line."""
    env = os.environ if env is None else env
    if "threads1" in variant:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    from ernie_mtl.dist.threads import configure_threads

    line = configure_threads(env)
    if "serial" in variant:
        env["FLAGS_new_executor_serial_run"] = "1"
    if "inplace" in variant:
        env["FLAGS_new_executor_use_inplace"] = "1"
    return line


def pretrain_batch(rng, b, seq, vocab, masked=0.15, real_len: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """A pretraining micro-batch in the collate layout; `real_len[i]` real tokens in sample i (the rest
    padding, masked out of attention), all `seq` by default."""
    real_len = [seq] * b if real_len is None else list(real_len)
    ids = rng.randint(5, vocab, (b, seq)).astype("int64")
    mask = np.zeros((b, 1, 1, seq), "float32")
    pos = []
    for i, n in enumerate(real_len):
        ids[i, n:] = 0
        mask[i, ..., n:] = -1e4
        k = max(1, int(n * masked))
        pos.append(i * seq + np.sort(rng.choice(np.arange(1, max(n, 2)), min(k, max(n - 1, 1)), replace=False)))
    pos = np.concatenate(pos).astype("int64")
    return {"input_ids": ids, "segment_ids": (np.arange(seq) >= seq // 2).astype("int64")[None].repeat(b, 0),
            "input_mask": mask, "masked_lm_positions": pos, "masked_lm_labels": ids.reshape(-1)[pos].reshape(-1, 1),
            "next_sentence_labels": rng.randint(0, 2, (b, 1)).astype("int64")}


@dataclass
class Step:
    """One training micro-batch program, ready to run: `run(i)` runs feed i (cycling)."""

    kind: str
    main: Any
    initialize: Callable[[Any, Any], None]  # (exe, scope)
    feeds: List[Dict[str, np.ndarray]]
    loss: Any
    arch: Dict[str, Any]
    batch: int
    seq: int
    seed_vars: List[str] = field(default_factory=list)
    tasks: List[str] = field(default_factory=list)
    programs: Any = None  # the engine's build.Programs
    task_types: List[Any] = field(default_factory=list)  # the engine's task objects (ernie_mtl.tasks)
    dropout_seeds: int = 0  # length of the engine's `dropout_seeds` feed (ernie_mtl/program/randomness.py)
    seed: int = 1
    kernels: Any = None  # variant `auto`: the KernelChoice applied
    applied: str = ""  # what apply_variant did

    def flops_per_token(self) -> float:
        """6 x non-embedding parameters + 12 x layers x hidden x seq (attention scores and values):
        the usual estimate of a training step's FLOPs per token (Kaplan et al.; heads not counted)."""
        h, layers, ffn = self.arch["hidden_size"], self.arch["num_hidden_layers"], self.arch["intermediate_size"]
        return 6 * layers * (4 * h * h + 2 * h * ffn) + 12 * layers * h * self.seq

    def engine_feed(self, batch: Dict[str, np.ndarray], task_index: int, i: int) -> Dict[str, np.ndarray]:
        """The full feed of run i for an unprefixed `batch` of task `task_index` (e.g. another width)."""
        from ernie_mtl.program.forward import make_feed
        from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        batch = dict(batch)
        if self.kind == "pretrain" and not getattr(self.task_types[0], "binary_head", True):
            batch.pop("next_sentence_labels", None)
        feed = {**make_feed(self.task_types, task_index, batch),
                **self.programs.freeze.feed([self.task_types[task_index].spec.name])}
        if self.dropout_seeds:
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.seed, i, 0, self.dropout_seeds)
        return feed

    def after_run(self) -> None:
        """After each run of `main` (one optimizer step): the LR schedule's next step, as the trainer does."""
        if self.programs is not None:
            self.programs.lr_scheduler.step()

    def feed(self, i: int) -> Dict[str, np.ndarray]:
        f = dict(self.feeds[i % len(self.feeds)])
        if self.dropout_seeds:  # the trainer's seeds of (step i, slot 0)
            from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds

            f[DROPOUT_SEEDS] = draw_dropout_seeds(self.seed, i, 0, self.dropout_seeds)
        for k, name in enumerate(self.seed_vars):  # a new seed per op and step, as real dropout gets
            f[name] = np.array([1 + (i * len(self.seed_vars) + k) % (2 ** 31 - 2)], "int32")
        return f


def _model_cfg(name: str, nodrop: bool):
    from ernie_mtl.config import ModelConfig

    extra = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0) if nodrop else {}
    return ModelConfig(model_name_or_path=MODELS.get(name, name), **extra)


def _fleet(b: int):
    import functools

    from ernie_mtl.config import AmpConfig, ParallelConfig
    from ernie_mtl.dist.topology import Topology, build_strategy, init_fleet

    parallel = ParallelConfig(micro_batch_size=b, global_batch_size=b)
    topo = Topology.from_config(parallel, 1)
    init_fleet(topo)
    return topo, functools.partial(build_strategy, topo, parallel, AmpConfig())


def _vocab_file(folder: Path, size: int) -> str:
    """A vocab.txt of `size` entries with ERNIE's special tokens (the task types read it)."""
    path = folder / "vocab.txt"
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    path.write_text("\n".join(specials + [f"t{i}" for i in range(size - len(specials))]) + "\n", encoding="utf-8")
    return str(path)


def _make_task(ctx, type_name: str, task_name: str, index: int, b: int, seq: int, **options):
    """A task of `type_name` (ernie_mtl.tasks) as the config loader resolves one: its options' defaults
    filled in, `options` on top; its data is never loaded here (the benchmarks feed random batches)."""
    import ernie_mtl.tasks  # noqa: F401  (registers the built-in task types)
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.tasks.base import get_task_type

    cls = get_task_type(type_name)
    opts = {k: o.default for k, o in cls.options.items()}
    opts.update(options)
    spec = TaskSpec(name=task_name, reader=type_name, index=index, train_file="unused-corpus", batch_size=b,
                    max_seq_len=seq, options=opts)
    return cls(spec, ctx)


def _build(model, tasks, b: int, seed: int):
    """`ernie_mtl.program.builder.build_programs` for `tasks`, one process, no accumulation (as the trainer builds)."""
    from ernie_mtl.program.builder import build_programs
    from ernie_mtl.config import AmpConfig, OptimConfig

    topo, strategy = _fleet(b)
    return build_programs(model, OptimConfig(max_steps=LR_HORIZON, warmup_rate=0.0), strategy, topo, tasks, seed=seed,
                          amp_cfg=AmpConfig())


def build_pretrain_step(name: str, b: int, seq: int, *, seed: int = 1, nodrop: bool = False,
                        n_feeds: int = 4, real_len=None) -> Step:
    """Flag-mode pretraining (the one task `pretrain`: MLM + sentence-pair head) through the training
    engine's builder (ernie_mtl.program.builder.build_programs), one process, no accumulation."""
    import paddle

    paddle.enable_static()
    from ernie_mtl.program.forward import make_feed
    from ernie_mtl.tasks.base import TaskContext

    model = _model_cfg(name, nodrop)
    arch = model.resolve().arch
    with tempfile.TemporaryDirectory(prefix="ernie_bench_") as tmp:  # read while the task is made
        ctx = TaskContext(vocab_file=_vocab_file(Path(tmp), arch["vocab_size"]), seed=seed,
                          model_type=model.model_type, log=lambda s: None)
        task = _make_task(ctx, "pretrain", "pretrain", 0, b, seq, binary_head=model.binary_head)
    progs = _build(model, [task], b, seed)
    rng = np.random.RandomState(0)
    feeds = []
    for k in range(n_feeds):
        batch = pretrain_batch(rng, b, seq, arch["vocab_size"], real_len=real_len)
        if not task.binary_head:
            batch.pop("next_sentence_labels")
        feeds.append({**make_feed([task], 0, batch), **progs.freeze.feed(["pretrain"])})
    return Step("pretrain", progs.main, progs.initialize, feeds, progs.fwd.task_losses["pretrain"], arch, b, seq,
                tasks=["pretrain"], programs=progs, task_types=[task], dropout_seeds=progs.dropout_seeds, seed=seed)


def build_multitask_step(name: str, b: int, seq: int, *, seed: int = 1, nodrop: bool = False) -> Step:
    """Three tasks on one ERNIE, through the training engine's builder: masked LM, 2-class
    classification, CRF word segmentation (4 tags). Feed i is a micro-batch of task i % 3 (the others
    get their placeholder labels, as `ernie_mtl.program.forward.make_feed` gives them)."""
    import json

    import paddle

    paddle.enable_static()
    from ernie_mtl.program.forward import make_feed
    from ernie_mtl.tasks.base import TaskContext

    model = _model_cfg(name, nodrop)
    arch = model.resolve().arch
    with tempfile.TemporaryDirectory(prefix="ernie_bench_") as tmp:  # read while the tasks are made
        work = Path(tmp)
        (work / "tags.json").write_text(json.dumps({"B": 0, "M": 1, "E": 2, "S": 3}))
        ctx = TaskContext(vocab_file=_vocab_file(work, arch["vocab_size"]), seed=seed, model_type=model.model_type,
                          log=lambda s: None)
        tasks = [_make_task(ctx, "mlm", "corpus", 0, b, seq),
                 _make_task(ctx, "cls", "sentiment", 1, b, seq, n_classes=2),
                 _make_task(ctx, "seq_label", "wordseg", 2, b, seq, label_map=str(work / "tags.json"), use_crf=True)]
    progs = _build(model, tasks, b, seed)
    rng = np.random.RandomState(0)
    feeds = []
    for i in range(3):
        pre = pretrain_batch(rng, b, seq, arch["vocab_size"])
        batch = {k: pre[k] for k in ("input_ids", "segment_ids", "input_mask")}
        batch.update({"masked_lm_positions": pre["masked_lm_positions"], "masked_lm_labels": pre["masked_lm_labels"]}
                     if i == 0 else {"label": rng.randint(0, 2, b).astype("int64")} if i == 1 else
                     {"labels": rng.randint(0, 4, (b, seq)).astype("int64"), "label_weights": np.ones((b, seq), "float32")})
        feed = make_feed(tasks, i, batch)
        feed.update(progs.freeze.feed([tasks[i].spec.name]))  # the heads of the other tasks are idle this step
        feeds.append(feed)
    return Step("multitask", progs.main, progs.initialize, feeds, progs.fwd.loss, arch, b, seq,
                tasks=[t.spec.name for t in tasks], programs=progs, task_types=tasks, dropout_seeds=progs.dropout_seeds,
                seed=seed)


def add_dropout_seed_inputs(program) -> List[str]:
    """Give every dropout op of `program` a Seed input: an int32 [1] variable to feed each step (the
    training engine's real-random dropout feeds CPU int32 seeds the same way). Returns their names."""
    block = program.global_block()
    names = []
    for op in block.ops:
        if op.type == "dropout" and not op.input("Seed"):
            name = f"{SEED_PREFIX}{len(names)}"
            block.create_var(name=name, shape=[1], dtype="int32", persistable=False, stop_gradient=True)
            op.desc.set_input("Seed", [name])
            names.append(name)
    program._sync_with_cpp()
    return names


def fuse_adamw(program) -> Dict[str, int]:
    """Replace the program's adamw ops by fused_adam ops, one per group of equal settings (decay or
    not), placed where the group's last adamw op was. Returns {group: parameters}."""
    block = program.global_block()
    groups: Dict[tuple, List[int]] = {}
    for i, op in enumerate(block.ops):
        if op.type != "adamw":
            continue
        if op.attr("lr_ratio") != 1.0 or op.attr("lazy_mode") or op.input("Beta1Tensor") or op.input("SkipUpdate"):
            raise SystemExit("fusedadam: an adamw op with lr_ratio, lazy_mode, tensor betas or SkipUpdate")
        decay = bool(op.attr("with_decay")) and op.attr("coeff") != 0.0
        key = (decay, op.attr("coeff") if decay else 0.0, op.attr("beta1"), op.attr("beta2"), op.attr("epsilon"),
               op.attr("multi_precision"), tuple(op.input("LearningRate")))
        groups.setdefault(key, []).append(i)
    slots = ("Param", "Grad", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow", "MasterParam")
    plans = []
    for key, idx in groups.items():
        ops = [block.ops[i] for i in idx]
        ins = {s + "s": [n for op in ops for n in op.input(s)] for s in slots}
        plans.append((idx[-1], key, ins, ops[0].attr("op_role"), ops[0].attr("op_role_var")))
    removed = sorted(i for idx in groups.values() for i in idx)
    # insert the fused ops at their groups' last positions, from the back so indices stay valid
    for pos, key, ins, role, _ in sorted(plans, key=lambda x: -x[0]):
        decay, coeff, b1, b2, eps, mp, lr = key
        inputs = {"Params": ins["Params"], "Grads": ins["Grads"], "LearningRate": list(lr),
                  "Moments1": ins["Moment1s"], "Moments2": ins["Moment2s"], "Beta1Pows": ins["Beta1Pows"],
                  "Beta2Pows": ins["Beta2Pows"]}
        outputs = {"ParamsOut": ins["Params"], "Moments1Out": ins["Moment1s"], "Moments2Out": ins["Moment2s"],
                   "Beta1PowsOut": ins["Beta1Pows"], "Beta2PowsOut": ins["Beta2Pows"]}
        if ins["MasterParams"]:
            inputs["MasterParams"] = outputs["MasterParamsOut"] = ins["MasterParams"]
        block._insert_op(pos + 1, type="fused_adam", inputs=inputs, outputs=outputs,
                         attrs={"beta1": b1, "beta2": b2, "epsilon": eps, "chunk_size": 16 * 2048,
                                "weight_decay": coeff, "use_adamw": decay, "multi_precision": mp,
                                "use_global_beta_pow": False, "op_role": role})
    shift = {pos: n for n, (pos, *_rest) in enumerate(sorted(plans, key=lambda x: x[0]))}
    for i in reversed(removed):  # each inserted op after position p moves later ones by one
        block._remove_op(i + sum(1 for pos in shift if pos < i), sync=False)
    block._sync_with_cpp()
    return {("decay" if k[0] else "no_decay"): len(v) for k, v in groups.items()}


def apply_variant(step: Step, variant: Dict[str, Optional[str]]) -> str:
    """Program-level parts of `variant` (oneDNN ops, dropout seeds); returns what was done."""
    done = []
    if "auto" in variant:
        from ernie_mtl.program.cpu_kernels import tune_for_cpu
        from ernie_mtl.program.kernel_choice import KernelCache, machine_identity, measure_choice

        choice = measure_choice(step.main, batch=step.batch, seq=step.seq, cache=KernelCache(machine=machine_identity()))
        step.kernels = choice
        done.append(f"auto: {choice.describe()}; {tune_for_cpu(step.main, onednn_types=choice.onednn)}")
    if "onednn" in variant:
        from ernie_mtl.program.cpu_kernels import use_onednn_ops

        types = variant["onednn"].split(":") if variant["onednn"] else None
        changed = use_onednn_ops(step.main, types)
        done.append("onednn " + ",".join(f"{k}:{v}" for k, v in sorted(changed.items())))
    if "biasgrad" in variant:
        from ernie_mtl.program.cpu_kernels import bias_grads_by_matmul

        done.append(f"{len(bias_grads_by_matmul(step.main))} bias gradients by matmul")
    if "fusedadam" in variant:
        done.append("fused_adam " + str(fuse_adamw(step.main)))
    if "seed" in variant:
        step.seed_vars = add_dropout_seed_inputs(step.main)
        done.append(f"seed inputs on {len(step.seed_vars)} dropout ops")
    return "; ".join(done) or "as built"


def build_step(kind: str, name: str, b: int, seq: int, variant: Dict[str, Optional[str]], **kw) -> Step:
    builder = build_pretrain_step if kind == "pretrain" else build_multitask_step
    step = builder(name, b, seq, nodrop="nodrop" in variant, **kw)
    step.applied = apply_variant(step, variant)
    return step
