"""Helpers shared by the tests (one module; no test module imports another).

- `pretraining_programs(...)`: the programs of flag-mode pretraining (the one task `pretrain` on a
  tiny ERNIE) through the one builder, with `feed(batch, step=, micro=)` turning an unprefixed
  pretraining batch into the program's feed (task-prefixed labels + dropout seeds).
- `make_batch`, `scope_and_exe`, `params`: feeding and inspecting such programs.
- CLI runners (`train`, `ok`), checkpoint readers (`state`, `metrics`, `jsonl`) for end-to-end tests.
"""
from __future__ import annotations

import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import functools
import json
import os
import pickle
import subprocess
import sys
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

    def feed(self, batch: Mapping[str, np.ndarray], step: int = 0, micro: int = 0, seed: int = 1,
             data_rank: int = 0) -> Dict[str, np.ndarray]:
        """The program's feed of a pretraining batch (unprefixed names, as collate_pretrain makes)."""
        from ernie_mtl.forward import make_feed
        from ernie_mtl.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        batch = dict(batch)
        if not self.task.binary_head:
            batch.pop("next_sentence_labels", None)
        feed = make_feed([self.task], 0, batch)
        if self.programs.dropout_seeds:
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(seed, step, micro, data_rank, self.programs.dropout_seeds)
        return feed


def pretraining_programs(vocab_folder: Path, *, world=1, rank=0, gpu=False, parallel=None, amp=None, model=None,
                         optim=None, seed=1, ema_decay=None) -> PretrainingPrograms:
    """Tiny-ERNIE pretraining programs as rank `rank` of `world`. `gpu=True` (implied by world > 1)
    builds the program a GPU worker would run, on CPU (`compat.emulate_gpu_program`); otherwise
    fleet is initialised for this single process."""
    from ernie_mtl.build import build_programs
    from ernie_mtl.compat import emulate_gpu_program
    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.parallel import Topology, build_strategy, init_fleet

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
                              ema_decay=ema_decay)
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
    names = [n for n, var in (("kill_at_step", "ERNIE_MTL_TEST_KILL_AT_STEP"), ("dump_state", "ERNIE_MTL_TEST_DUMP_DIR"),
                              ("eval_at_start", "ERNIE_MTL_TEST_EVAL_AT_START"))
             if (env or {}).get(var)]
    return list(argv) + (["--plugins", HOOKS, "--callbacks", ",".join(names)] if names else [])


def run_cli(argv, *, cwd, env=None, launch_procs=0, timeout=400, log_dir=None):
    """Run run_multitask_static.py (or `paddle.distributed.launch` of it) and return the completed process."""
    argv = with_hooks([str(a) for a in argv], env)
    prefix = [sys.executable]
    if launch_procs:
        prefix += ["-m", "paddle.distributed.launch", "--nproc_per_node", str(launch_procs),
                   "--log_dir", str(log_dir or Path(cwd) / "launch_logs")]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(prefix + [ENTRY] + argv, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


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
            out.update({k: np.asarray(v) for k, v in pickle.load(f).items() if not k.startswith("StructuredToParameter")})
    return out


def launch_logs(folder: Path, tail: int = 3000) -> str:
    return "".join(p.read_text(errors="replace")[-tail:] for p in sorted(Path(folder).glob("workerlog.*")))


def first(mapping: Optional[Mapping], default=None):
    return next(iter(mapping.values()), default) if mapping else default


def rehash_checkpoint(path: Path) -> None:
    """After a test edits a checkpoint's files on purpose: record their new sizes and SHA-1s, so the
    edit reaches the code under test instead of the integrity check (tests/test_checkpoint.py
    covers that check itself)."""
    from ernie_mtl.checkpoint import TRAIN_STATE, sha1_of

    path = Path(path)
    raw = json.loads((path / TRAIN_STATE).read_text())
    raw["files"] = {rel: {"size": (path / rel).stat().st_size, "sha1": sha1_of(path / rel)}
                    for rel in raw.get("files", {}) if (path / rel).is_file()}
    (path / TRAIN_STATE).write_text(json.dumps(raw))
