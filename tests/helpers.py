"""Helpers shared by the tests (one module; no test module imports another).

- `pretraining_programs(...)`: the programs of flag-mode pretraining (the one task `pretrain` on a
  tiny ERNIE) through the one builder, with `feed(batch, step=, slot=)` turning an unprefixed
  pretraining batch into the program's feed (task-prefixed labels + dropout seeds).
- `make_batch`, `scope_and_exe`, `params`: feeding and inspecting such programs.
- CLI runners (`train`, `ok`), checkpoint readers (`state`, `metrics`, `jsonl`) for end-to-end tests.
"""
from __future__ import annotations

import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import contextlib
import functools
import json
import os
import pickle
import glob
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ENTRY = str(ROOT / "run_multitask_static.py")
HOOKS = str(ROOT / "tests" / "plugins" / "test_hooks.py")
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
TINY_VOCAB = 1000  # ernie-tiny-test's vocabulary size


# -- flag-mode pretraining programs -----------------------------------------------------------------------
def tiny_vocab_file(folder: Path, size: int = TINY_VOCAB) -> str:
    """A vocab.txt with the special tokens and `size` entries in all (pretrain task types read it)."""
    path = Path(folder) / f"vocab_{size}.txt"
    if not path.exists():
        path.write_text("\n".join(SPECIALS + [f"tok{i}" for i in range(size - len(SPECIALS))]) + "\n",
                        encoding="utf-8")
    return str(path)


def pretrain_task(vocab_file: str, *, binary_head: bool = True, batch_size: int = 2, max_seq_len: int = 64,
                  model_type: str = "ernie"):
    """The `pretrain` task of a flag-mode run (its data is never loaded by the program tests)."""
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    cls = get_task_type("pretrain")
    options = {k: o.default for k, o in cls.options.items()}
    options["binary_head"] = binary_head
    spec = TaskSpec(name="pretrain", reader="pretrain", index=0, train_file="unused-corpus", batch_size=batch_size,
                    max_seq_len=max_seq_len, options=options)
    return cls(spec, TaskContext(vocab_file=vocab_file, seed=1, model_type=model_type, log=lambda s: None))


class PretrainingPrograms:
    """`build.Programs` of a one-task pretraining run, with the names the program tests use."""

    def __init__(self, programs, task):
        self.programs = programs
        self.task = task
        name = task.spec.name
        scalars = programs.fwd.task_scalars[name]
        self.loss = programs.fwd.task_losses[name]
        self.mlm_loss = scalars["mlm_loss"]
        self.nsp_loss = scalars.get("nsp_loss")

    def __getattr__(self, item):
        return getattr(self.programs, item)

    @property
    def fetches(self) -> Dict[str, Any]:
        named = {"loss": self.loss, "mlm_loss": self.mlm_loss, "nsp_loss": self.nsp_loss, "lr": self.programs.lr,
                 "loss_scaling": self.programs.loss_scaling}
        return {k: v for k, v in named.items() if v is not None}

    @property
    def paddlenlp_name_map(self) -> Dict[str, str]:
        """The name map with the head under ErnieForPretraining's names (`heads.pretrain.` -> `cls.`)."""
        head = f"heads.{self.task.spec.name}."
        return {("cls." + k[len(head):] if k.startswith(head) else k): v for k, v in self.programs.name_map.items()}

    @property
    def recompute_checkpoints(self):
        return self.programs.fwd.recompute_checkpoints

    @property
    def feed_names(self):
        return [s.name for s in self.programs.fwd.feeds]

    def feed(self, batch: Mapping[str, np.ndarray], step: int = 0, slot: int = 0,
             seed: int = 1) -> Dict[str, np.ndarray]:
        """The program's feed of a pretraining batch (unprefixed names, as collate_pretrain makes)."""
        from ernie_mtl.program.forward import make_feed
        from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        batch = dict(batch)
        if not self.task.binary_head:
            batch.pop("next_sentence_labels", None)
        feed = make_feed([self.task], 0, batch)
        if self.programs.dropout_seeds:
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(seed, step, slot, self.programs.dropout_seeds)
        return feed


def pretraining_programs(vocab_folder: Path, *, world=1, rank=0, gpu=False, parallel=None, amp=None, model=None,
                         optim=None, seed=1, ema_decay=None, anomaly_guard=False) -> PretrainingPrograms:
    """Tiny-ERNIE pretraining programs as rank `rank` of `world`. `gpu=True` (implied by world > 1)
    builds the program a GPU worker would run, on CPU (`compat.emulate_gpu_program`); otherwise
    fleet is initialised for this single process."""
    from ernie_mtl.program.builder import build_programs
    from ernie_mtl.dist.compat import emulate_gpu_program
    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.dist.topology import Topology, build_strategy, init_fleet

    parallel = parallel or ParallelConfig(micro_batch_size=2)
    amp = amp or AmpConfig()
    model = model or ModelConfig(model_name_or_path="ernie-tiny-test")
    optim = optim or OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.1)
    vocab = tiny_vocab_file(vocab_folder, model.vocab_size or TINY_VOCAB)
    task = pretrain_task(vocab, binary_head=model.binary_head, batch_size=parallel.micro_batch_size,
                         model_type=model.model_type)
    topo = Topology.from_config(parallel, world)
    strategy = functools.partial(build_strategy, topo, parallel, amp)
    build = functools.partial(build_programs, model, optim, strategy, topo, [task], seed=seed, amp_cfg=amp,
                              ema_decay=ema_decay, anomaly_guard=anomaly_guard)
    if gpu or world > 1:
        with emulate_gpu_program(rank, world):
            return PretrainingPrograms(build(), task)
    init_fleet(topo)
    return PretrainingPrograms(build(), task)


def make_batch(seed=0, batch=4, seq=16, masked_per_seq=3, pad_slots=4, vocab=TINY_VOCAB):
    """A pretraining batch as the data pipeline's collate produces it (masked slots padded with label -1)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, vocab, (batch, seq)).astype("int64")
    positions = np.array([b * seq + p for b in range(batch)
                          for p in sorted(rng.choice(np.arange(1, seq), masked_per_seq, replace=False))], "int64")
    labels = ids.reshape(-1)[positions].reshape(-1, 1)
    mask = np.zeros((batch, 1, 1, seq), "float32")
    mask[-1, ..., seq - 3:] = -1e4  # the last sequence is padded
    return {"input_ids": ids, "segment_ids": (np.arange(seq) >= seq // 2).astype("int64")[None].repeat(batch, 0),
            "input_mask": mask,
            "masked_lm_positions": np.concatenate([positions, np.zeros(pad_slots, "int64")]),
            "masked_lm_labels": np.concatenate([labels, np.full((pad_slots, 1), -1, "int64")]),
            "next_sentence_labels": rng.randint(0, 2, (batch, 1)).astype("int64")}


def scope_and_exe(programs):
    import paddle

    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    programs.initialize(exe, scope)
    return scope, exe


def params(programs, scope):
    return {n: np.array(scope.find_var(n).get_tensor()) for n in sorted(set(programs.name_map.values()))}


# -- end-to-end runs -------------------------------------------------------------------------------------
def with_hooks(argv, env):
    """The test-only callbacks (tests/plugins/test_hooks.py) when the environment asks for them."""
    names = [n for n, var in (("kill_at_step", "ERNIE_MTL_TEST_KILL_AT_STEP"),
                              ("dump_state", "ERNIE_MTL_TEST_DUMP_DIR"),
                              ("eval_at_start", "ERNIE_MTL_TEST_EVAL_AT_START"),
                              ("record_slots", "ERNIE_MTL_TEST_SLOTS"),
                              ("signal_at_step", "ERNIE_MTL_TEST_SIGNAL_AT_STEP"),
                              ("kill_once", "ERNIE_MTL_TEST_KILL_ONCE_MARKER"),
                              ("sleep_on_rank", "ERNIE_MTL_TEST_SLEEP_RANK"),
                              ("poison_step", "ERNIE_MTL_TEST_POISON_STEP"), ("pause_at", "ERNIE_MTL_TEST_PAUSE_AT"),
                              ("disturb_data", "ERNIE_MTL_TEST_DISTURB"))
             if (env or {}).get(var)]
    return list(argv) + (["--plugins", HOOKS, "--callbacks", ",".join(names)] if names else [])


# What the test process's environment holds that a user's shell does not (paddle's import in this process
# wrote OMP_NUM_THREADS=1 into it; the CLI writes the rest): `user_environ` drops them.
PINNED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "ERNIE_MTL_THREADS_ORIGIN", "PADDLE_LOCAL_SIZE")


def user_environ(**extra):
    """The test process's environment without PINNED_ENV, plus PYTHONPATH and `extra`: what a user's shell
    gives a run (the defaults: this machine's cores for 1 process, 1 thread per launched rank)."""
    return {**{k: v for k, v in os.environ.items() if k not in PINNED_ENV}, "PYTHONPATH": str(ROOT), **extra}


def run_cli(argv, *, cwd, env=None, launch_procs=0, timeout=400, log_dir=None, entry=None, user_env=False):
    """Run run_multitask_static.py (or `entry`, a script; or `paddle.distributed.launch` of either)
    and return the completed process. `user_env`: in `user_environ()` (no pinned threads or MKL settings)."""
    argv = with_hooks([str(a) for a in argv], env) if entry is None else [str(a) for a in argv]
    prefix = [sys.executable]
    if launch_procs:
        prefix += ["-m", "paddle.distributed.launch", "--nproc_per_node", str(launch_procs),
                   "--log_dir", str(log_dir or Path(cwd) / "launch_logs")]
    full_env = (user_environ(**(env or {})) if user_env
                else {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run(prefix + [str(entry or ENTRY)] + argv, cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


# What makes a run need a process of its own: hooks that kill, signal, pause or disturb the process or its
# workers (tests/plugins/test_hooks.py); `run_in_process` refuses them.
_PROCESS_HOOKS = ("ERNIE_MTL_TEST_KILL_AT_STEP", "ERNIE_MTL_TEST_SIGNAL_AT_STEP", "ERNIE_MTL_TEST_KILL_ONCE_MARKER",
                  "ERNIE_MTL_TEST_PAUSE_AT", "ERNIE_MTL_TEST_DISTURB", "ERNIE_MTL_TEST_SLEEP_RANK")


@contextlib.contextmanager
def captured_command(out, err):
    """A command run in this process writes to `out` and `err` (they may be one buffer) as a process writes
    to its stdout and stderr: the ernie_mtl log (stdout, through the console's handler, which keeps the
    stream it was made with; pytest's own capture handlers are left alone) included. Paddle's mode and the
    flags a run sets are restored after."""
    from ernie_mtl.dist import console
    from ernie_mtl.engine.run import flags_restored, static_mode_restored

    handlers = [h for h in console.get_logger(0).handlers if isinstance(h, console._TqdmHandler)]
    streams = [h.setStream(out) for h in handlers]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), static_mode_restored(), \
                flags_restored():
            yield
    finally:
        for handler, stream in zip(handlers, streams):
            handler.setStream(stream)


def _process_warnings(stream) -> None:
    """Warnings as a new Python process shows them (its default filters; pytest records them instead),
    written to `stream` as to a process's stderr. Call inside warnings.catch_warnings()."""
    warnings.resetwarnings()
    for action, category, module in (("ignore", ResourceWarning, ""), ("ignore", ImportWarning, ""),
                                     ("ignore", PendingDeprecationWarning, ""), ("ignore", DeprecationWarning, ""),
                                     ("default", DeprecationWarning, "__main__")):
        warnings.filterwarnings(action, category=category, module=module)
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: stream.write(
        warnings.formatwarning(message, category, filename, lineno, line))


def run_in_process(argv, *, cwd, env=None, command=None):
    """run_multitask_static.py's command run in this test process, as `run_cli` runs it in a new one, and the
    same kind of result (return code, stdout, stderr). It is the function the command runs once its process
    is set up (`ernie_mtl.main.run_command`: parse, then the engine), so what a test of it checks is the
    command's behaviour, minus the process set-up (thread budget, serial executor, signal and orphan guards:
    tests/e2e/test_defaults.py, test_console.py and the launch tests keep real processes for those). It saves
    the start of a process that imports Paddle and PaddleNLP: about 3 of a tiny run's 5 CPU-seconds.
    `env` is set in os.environ for the run and restored after, as are the working folder, Paddle's mode and
    the flags a run sets. `command`: another tool's function of the same kind (e.g. the converter's
    `ernie_mtl.convert.cli.main`), given `argv` as it is."""
    import io

    from ernie_mtl import main

    env = {k: str(v) for k, v in (env or {}).items()}
    hooks = sorted(k for k in _PROCESS_HOOKS if env.get(k))
    assert not hooks, f"{hooks}: these hooks act on a process of its own; use run_cli"
    argv = with_hooks([str(a) for a in argv], env) if command is None else [str(a) for a in argv]
    command = command or main.run_command
    out, err = io.StringIO(), io.StringIO()
    environ, folder = dict(os.environ), os.getcwd()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        with captured_command(out, err), warnings.catch_warnings():
            _process_warnings(err)
            try:
                code = command(argv)
            except SystemExit as e:  # argparse's own refusals and --help
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess([getattr(command, '__module__', ENTRY), *argv], code, out.getvalue(),
                                       err.getvalue())


def run_here(argv, *, cwd, env=None, launch_procs=0, timeout=400, log_dir=None, entry=None, user_env=False):
    """`run_cli`'s command in this test process where it needs no process of its own (`run_in_process`), else
    `run_cli`: a launch, another entry script, the user's environment (the defaults: threads and kernels a
    process sets up) or a hook that kills, signals, pauses or disturbs the process keep a real process."""
    if launch_procs or entry is not None or user_env or any((env or {}).get(k) for k in _PROCESS_HOOKS):
        return run_cli(argv, cwd=cwd, env=env, launch_procs=launch_procs, timeout=timeout, log_dir=log_dir,
                       entry=entry, user_env=user_env)
    return run_in_process(argv, cwd=cwd, env=env)


def flags_as_kwargs(argv):
    """`["--max_steps", "8", "--use_amp", ...]` as keyword arguments of the Python API ({"max_steps": "8"})."""
    out, k = {}, 0
    argv = [str(a) for a in argv]
    while k < len(argv):
        key = argv[k][2:]
        if k + 1 < len(argv) and not argv[k + 1].startswith("--"):
            out[key] = argv[k + 1]
            k += 2
        else:
            out[key] = True
            k += 1
    return out


def api_script(path: Path, body: str) -> Path:
    """A Python script that imports ernie_mtl as a user's script does (the repository on sys.path)."""
    path.write_text("import zlib  # noqa: F401\nimport json, sys\nsys.path.insert(0, %r)\nimport ernie_mtl\n\n%s\n"
                    % (str(ROOT), body), encoding="utf-8")
    return path


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def jsonl(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def metrics(output_dir, tag):
    """{step: value} of one tag from train_metrics.jsonl (full precision)."""
    return {r["step"]: r[tag] for r in jsonl(Path(output_dir) / "train_metrics.jsonl") if tag in r}


def state(prefix) -> Dict[str, np.ndarray]:
    """Parameters (.pdparams) and optimizer state (.pdopt) written by paddle.static.save."""
    out = {}
    for ext in (".pdparams", ".pdopt"):
        with open(f"{prefix}{ext}", "rb") as f:
            out.update({k: np.asarray(v) for k, v in pickle.load(f).items()
                        if not k.startswith("StructuredToParameter")})
    return out


def launch_logs(folder: Path, tail: int = 3000) -> str:
    return "".join(p.read_text(errors="replace")[-tail:] for p in sorted(Path(folder).glob("workerlog.*")))


def first(mapping: Optional[Mapping], default=None):
    return next(iter(mapping.values()), default) if mapping else default


def rehash_checkpoint(path: Path) -> None:
    """After a test edits a checkpoint's files on purpose: record their new sizes and SHA-1s (in
    train_state.json and in each rank's state/rank_<r>.sha1), so the edit reaches the code under test
    instead of the integrity check (tests/unit/test_checkpoint.py covers that check itself)."""
    from ernie_mtl.checkpoint import TRAIN_STATE, sha1_of

    path = Path(path)
    raw = json.loads((path / TRAIN_STATE).read_text())
    raw["files"] = {rel: {"size": (path / rel).stat().st_size, "sha1": sha1_of(path / rel)}
                    for rel in raw.get("files", {}) if (path / rel).is_file()}
    (path / TRAIN_STATE).write_text(json.dumps(raw))
    for sums in (path / "state").glob("rank_*.sha1"):  # each rank's own record must agree with `files`
        rank = sums.name[:-len(".sha1")]
        sums.write_text(json.dumps({rel: e for rel, e in raw["files"].items() if rel.startswith(f"state/{rank}.")}))


def train(argv, *, cwd, env=None, launch_procs=0, timeout=400, log_dir=None):
    """A flag-mode run: `run_here` (the name the flag-mode tests read best)."""
    return run_here(argv, cwd=cwd, env=env, launch_procs=launch_procs, timeout=timeout, log_dir=log_dir)


# -- the demo corpus (flag mode) -------------------------------------------------------------------------
def make_demo(folder: Path) -> Path:
    """A capped demo corpus and its vocab, as `make demo` prepares them (400 documents)."""
    from data_tools import prepare_demo_data

    assert prepare_demo_data.main(["--output_dir", str(folder), "--max_documents", "400", "--vocab_size", "3000",
                                   "--workers", "1"]) == 0
    return Path(folder)


def tiny_args(demo, output_dir, **flags):
    vocab_size = sum(1 for _ in open(demo / "vocab.txt", encoding="utf-8"))
    argv = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size", str(vocab_size),
            "--max_seq_len", "64", "--num_workers", "0", "--split", "90,5,5", "--input_dir", str(demo / "corpus"),
            "--tokenizer_name_or_path", str(demo / "vocab.txt"), "--output_dir", str(output_dir)]
    for k, v in flags.items():
        argv += [f"--{k}", str(v)]
    return argv


# -- multi-task files: learnable tasks over a small character vocabulary ------------------------------
S_CHARS = list("的了是在我有他这中大")  # single-character words: tag S
B_CHARS = list("国人民日天北上东西南")  # first character of a two-character word: B
E_CHARS = list("家们主本下京海方北边")  # second character: E
GOOD = "好"
CHARS = sorted(set(S_CHARS + B_CHARS + E_CHARS + [GOOD, "坏", "。"]))
VOCAB = SPECIALS + CHARS + ["##" + c for c in CHARS]


def _sentence(rng, n_words):
    chars, tags = [], []
    for _ in range(n_words):
        if rng.random() < 0.5:
            chars.append(rng.choice(S_CHARS)), tags.append("S")
        else:
            chars += [rng.choice(B_CHARS), rng.choice(E_CHARS)]
            tags += ["B", "E"]
    return chars, tags


def make_mtl_data(root: Path) -> Path:
    """Task files, a corpus and YAMLs: sentiment (label 1 iff the text contains 好), segmentation with
    a character-determined BMES rule, and a .bin/.idx corpus over the same vocabulary."""
    from data_tools import create_pretraining_data

    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    rng = np.random.default_rng(0)
    for split, n in (("train", 160), ("dev", 64)):
        rows = []
        for i in range(n):
            chars, _ = _sentence(rng, int(rng.integers(3, 7)))
            label = i % 2
            chars.insert(int(rng.integers(0, len(chars) + 1)), GOOD if label else "坏")
            rows.append(f"{label}\t{''.join(chars)}")
        (root / f"cls_{split}.tsv").write_text("label\ttext_a\n" + "\n".join(rows) + "\n", encoding="utf-8")
        rows = []
        for _ in range(n):
            chars, tags = _sentence(rng, int(rng.integers(3, 8)))
            rows.append("\x02".join(chars) + "\t" + "\x02".join(tags))
        (root / f"seg_{split}.tsv").write_text("text_a\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (root / "label_map.json").write_text(json.dumps({"B": 0, "M": 1, "E": 2, "S": 3}), encoding="utf-8")
    (root / "pred.tsv").write_text("text_a\n国家好的\n坏了是\n", encoding="utf-8")
    (root / "seg_pred.tsv").write_text("text_a\n国\x02家\x02的\x02了\n了\x02东\x02方\n", encoding="utf-8")
    docs = ["\n".join("".join(_sentence(rng, 4)[0]) + "。" for _ in range(4)) for _ in range(40)]
    (root / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    assert create_pretraining_data.main(["--input", str(root / "docs.txt"), "--vocab_file", str(root / "vocab.txt"),
                                         "--output_prefix", str(root / "corpus"), "--workers", "1"]) == 0
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "sentiment.yaml").write_text(
        "reader: cls\nparadigm: cls\ntrain_file: ../cls_train.tsv\ndev_file: ../cls_dev.tsv\nn_classes: 2\n")
    (tasks / "wordseg.yaml").write_text(
        "reader: seq_label\ntrain_file: ../seg_train.tsv\ndev_file: ../seg_dev.tsv\nlabel_map: ../label_map.json\n")
    (tasks / "corpus.yaml").write_text(
        "reader: pretrain\ntrain_file: ../corpus\ndev_file: ../corpus\nsplit: '90,5,5'\nbinary_head: false\n"
        "batch_size: 4\n")
    (tasks / "score.yaml").write_text("reader: regression\ntrain_file: ../cls_train.tsv\ndev_file: ../cls_dev.tsv\n")
    plugin = root / "plugins.py"
    plugin.write_text((ROOT / "examples/plugins/regression_task.py").read_text() + IDLE_CHECK)
    return root


IDLE_CHECK = '''

@register_callback("idle_check")
class IdleCheck(Callback):
    """Test probe: after every step, records per head group whether its parameters and optimizer
    state changed, next to the tasks of the step."""

    def __init__(self):
        self.before = None

    def _values(self, trainer):
        return {g.name: {n: np.array(trainer.scope.find_var(n).get_tensor())
                         for n in trainer.freeze.state_vars(trainer.programs.main, g)} for g in trainer.freeze.groups}

    def on_step_end(self, trainer, step, tasks):
        now = self._values(trainer)
        users = {g.name: set(g.users) for g in trainer.freeze.groups}
        if self.before is not None:
            rows = {g: {"sampled": bool(users[g] & set(tasks)),
                        "changed": [n for n in now[g] if not np.array_equal(now[g][n], self.before[g][n])],
                        "vars": sorted(now[g])} for g in now}
            name = "idle_check.jsonl" if trainer.is_rank0 else f"idle_check_rank{trainer.info.rank}.jsonl"
            with open(os.path.join(trainer.cfg.train.output_dir, name), "a") as f:
                f.write(json.dumps({"step": step, "tasks": tasks, "groups": rows}) + "\\n")
        self.before = now

@register_task_type("regression_skewed")
class SkewedRegression(RegressionTask):
    """Test probe: a metric that differs by rank, as float reductions of different ranks may."""

    def evaluate(self, data, outputs):
        metrics = super().evaluate(data, outputs)
        return {k: v + 10.0 * self.ctx.rank for k, v in metrics.items()}


@register_callback("record_eval")
class RecordEval(Callback):
    """Test probe: every rank writes what on_evaluate received and what it decided."""

    def on_evaluate(self, trainer, task, metrics):
        path = os.path.join(trainer.cfg.train.output_dir, f"eval_rank{trainer.info.rank}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps({"step": trainer.step, "task": task, "metrics": metrics,
                                "finished": list(trainer.schedule.state_dict().get("finished_early", []))}) + "\\n")

import json, os  # noqa: E401
'''


def global_yaml(root, name, **keys):
    base = {"task_instance": "sentiment, wordseg, corpus", "target_tag": "1, 1, 0", "mix_ratio": "1.0, 1.0, 0.5",
            "task_dir": "tasks", "backbone": "ernie", "model_name_or_path": "ernie-tiny-test",
            "vocab_path": str(root / "vocab.txt"), "vocab_size": len(VOCAB), "max_seq_len": 32, "batch_size": 8,
            "num_epochs": 3, "learning_rate": "5e-3", "warmup_proportion": 0.1, "device": "cpu",
            "print_every_n_steps": 10, "eval_freq": 30, "eval_iters": 2, "num_workers": 0, "random_seed": 5,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    base.update(keys)
    path = root / name
    import yaml

    path.write_text(yaml.safe_dump(base, allow_unicode=True), encoding="utf-8")
    return path


def last(rows, tag):
    return [r[tag] for r in rows if tag in r][-1]


# -- processes of multi-process tests --------------------------------------------------------------------
def free_port():
    """A port free now, from PORT_RANGE when it is set (tests/conftest.py: above the kernel's range for
    outgoing connections, so no connection takes it before the job binds it), else any."""
    import random
    import socket

    lo, _, hi = os.environ.get("PORT_RANGE", "").partition(":")
    candidates = random.sample(range(int(lo), int(hi) + 1), min(200, int(hi) - int(lo) + 1)) if hi else [0]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in PORT_RANGE={os.environ.get('PORT_RANGE')}")


def worker_port_range(port_range, worker, workers):
    """The slice of `port_range` ("LOW:HIGH") of xdist worker `worker` ("gw<i>") of `workers`."""
    if not port_range or not worker or workers < 2:
        return port_range
    lo, hi = (int(x) for x in port_range.split(":"))
    i, width = int(worker.lstrip("gw")), (hi - lo + 1) // workers
    return f"{lo + i * width}:{lo + (i + 1) * width - 1}"


class Job:
    """Processes of one test job, found by a marker in their environment (ranks run in sessions of
    their own and outlive a killed launcher); `kill_all` ends every one of them."""

    def __init__(self, tmp_path):
        self.marker = f"ERNIE_MTL_TEST_JOB={os.getpid()}-{time.monotonic_ns()}"
        self.tmp = tmp_path
        self.launchers = []

    def env(self, **extra):
        key, value = self.marker.split("=", 1)
        return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", key: value, **extra}

    def launch(self, args, *, log, **env):
        out = open(self.tmp / f"{log}.out", "w")
        environ = {k: v for k, v in self.env(**env).items() if v is not None}  # None: unset
        proc = subprocess.Popen(args, cwd=self.tmp, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.launchers.append(proc)
        return proc

    def pids(self):
        found = []
        needle = self.marker.encode()
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in f.read().split(b"\0"):
                            found.append(int(entry))
                except OSError:
                    pass
        return [p for p in found if proc_alive(p)]

    def ranks(self):
        return [p for p in self.pids() if "paddle.distributed.launch" not in proc_cmdline(p)]

    def kill_all(self):
        for _ in range(3):
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        for proc in self.launchers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def proc_cmdline(pid):
    from ernie_mtl.dist import watchdog

    return watchdog._cmdline(pid)


def wait_for(predicate, timeout, what):
    """The predicate's first truthy value (use it: asking again may see a later state, e.g. a process
    already gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def proc_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def data_workers(parent: int):
    """Pids of the live data-loading workers (ernie_mtl/engine/data_workers.py) started by process `parent`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 7 and argv[1] == b"-c" and b"ernie_mtl.engine.data_workers" in argv[2]
                and argv[7] == str(parent).encode() and proc_alive(int(entry))):
            found.append(int(entry))
    return found


def proc_ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


class FileBarrier:
    """A barrier between processes of one machine through files in a shared folder (tests only): call
    k of rank r creates `<k>.<r>`, then waits until all `world` ranks have made call k."""

    def __init__(self, folder, rank, world, timeout_s=60.0):
        self.folder, self.rank, self.world, self.timeout_s = str(folder), rank, world, timeout_s
        self.calls = 0
        os.makedirs(self.folder, exist_ok=True)

    def __call__(self, what="barrier"):
        self.calls += 1
        open(os.path.join(self.folder, f"{self.calls}.{self.rank}"), "w").close()
        deadline = time.monotonic() + self.timeout_s
        while len(glob.glob(os.path.join(self.folder, f"{self.calls}.*"))) < self.world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: {what} #{self.calls} not reached by every rank")
            time.sleep(0.005)


def write_topic_lm_tasks(root: Path, rng, chars, *, rows: int, width: int, batch_size: int,
                         num_epochs: Optional[int] = None) -> None:
    """A two-task PALM config in `root` over a corpus `root/corpus`: `topic` (cls, target) on
    `rows` random texts of `width` characters, `lm` (pretrain, auxiliary); global.yaml last."""
    lines = ["label\ttext_a"] + [f"{i % 2}\t{''.join(rng.choice(chars, width))}" for i in range(rows)]
    (root / "cls.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "tasks").mkdir()
    (root / "tasks" / "topic.yaml").write_text("reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n")
    (root / "tasks" / "lm.yaml").write_text("reader: pretrain\ntrain_file: ../corpus\nsplit: '80,10,10'\n")
    (root / "global.yaml").write_text("task_instance: topic, lm\ntarget_tag: 1, 0\nmix_ratio: 1.0, 1.0\n"
                                      f"task_dir: tasks\nbatch_size: {batch_size}\nmax_seq_len: 32\n"
                                      + (f"num_epochs: {num_epochs}\n" if num_epochs is not None else ""))


# -- the golden runs (tests/e2e/test_golden.py), also the reference of the Python API's runs ---------------
GOLDEN_CHARS = [chr(0x4E00 + i) for i in range(80)]
GOLDEN_COMMON = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size",
                 str(5 + len(GOLDEN_CHARS)),
                 "--num_workers", "0", "--logging_freq", "1", "--eval_freq", "1000", "--checkpoint_steps", "1000",
                 "--save_steps", "1000", "--hidden_dropout_prob", "0.1", "--attention_probs_dropout_prob", "0.1",
                 "--max_lr", "5e-3", "--min_lr", "1e-4", "--warmup_rate", "0.2", "--seed", "7",
                 "--cpu_kernels", "plain"]  # the numerical reference, whatever kernels this machine would pick
GOLDEN_CASES = {  # name: (processes, arguments after GOLDEN_COMMON)
    "flag_1proc": (0, ["--input_dir", "corpus", "--split", "80,10,10", "--max_seq_len", "32", "--max_steps", "8",
                       "--micro_batch_size", "4", "--global_batch_size", "8"]),
    "flag_2proc": (2, ["--input_dir", "corpus", "--split", "80,10,10", "--max_seq_len", "32", "--max_steps", "8",
                       "--micro_batch_size", "2", "--global_batch_size", "8"]),
    "multitask_1proc": (0, ["--config", "global.yaml", "--micro_batch_size", "4", "--global_batch_size", "8"]),
    "multitask_2proc": (2, ["--config", "global.yaml", "--micro_batch_size", "4", "--global_batch_size", "16"]),
}


def golden_data(root: Path) -> Path:
    """The golden runs' data in `root`: an 80-character vocabulary, a corpus, a topic + lm task config."""
    from data_tools import create_pretraining_data

    rng = np.random.default_rng(2026)
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + GOLDEN_CHARS) + "\n",
                                    encoding="utf-8")
    docs = ["\n".join("".join(rng.choice(GOLDEN_CHARS, int(rng.integers(6, 14)))) + "。" for _ in range(6))
            for _ in range(80)]
    (root / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    assert create_pretraining_data.main(["--input", str(root / "docs.txt"), "--vocab_file", str(root / "vocab.txt"),
                                         "--output_prefix", str(root / "corpus"), "--workers", "1"]) == 0
    write_topic_lm_tasks(root, rng, GOLDEN_CHARS, rows=48, width=10, batch_size=4, num_epochs=2)
    return root


def logged_losses(out: Path):
    """{step: {tag: loss}} of every train/*loss tag in train_metrics.jsonl (full precision)."""
    rows = [json.loads(line) for line in open(Path(out) / "train_metrics.jsonl", encoding="utf-8")]
    return {str(r["step"]): {k: v for k, v in r.items() if k.startswith("train/") and k.endswith("loss")}
            for r in rows if any(k.startswith("train/") and k.endswith("loss") for k in r)}
