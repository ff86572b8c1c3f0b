"""The static pretraining run: set-up (`run`) and the loop (`Trainer`).

`run(cfg)` does, in order: process info + static mode (+ gloo on CPU), topology, fleet, programs
(built once), executor + initialisation, datasets (index caches built on rank 0, others wait at a
TCP-store barrier), resume, `Trainer.train()`, the test split, and a closing line saying where the
checkpoints and VisualDL logs are.

One `exe.run` per micro-batch; `accumulate_steps` micro-batches make one optimizer step (the
gradient merge is inside the program), after which the LR scheduler steps once and the consumed
sample count grows by one global batch. Losses shown are rank 0's (its micro-batches, averaged
over the accumulation and the logging window); they are not all-reduced. tokens/s counts the
non-pad tokens rank 0 fed, times the data-parallel world size (an estimate: other ranks' batches
have similar lengths).

Test hooks (environment variables, used by tests/test_trainer.py): ERNIE_MTL_TEST_KILL_AT_STEP=k
makes the process SIGKILL itself right after step k's checkpoints are written (exact-resume
tests); ERNIE_MTL_TEST_DUMP_DIR=d makes every rank save its final program state to d/rank_<r>
(checkpoints hold rank 0's state only without sharding, so this shows the other ranks' copies).
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List

import numpy as np

from ernie_mtl.checkpoint import Checkpointer, TrainState
from ernie_mtl.logging_utils import MetricWriter, Window, format_eta, get_logger

KILL_AT_STEP_ENV = "ERNIE_MTL_TEST_KILL_AT_STEP"
DUMP_DIR_ENV = "ERNIE_MTL_TEST_DUMP_DIR"
TEST_ITERS_PER_EVAL_ITER = 10  # the final test split takes 10 x eval_iters global batches (PaddleNLP)


@dataclass
class Context:
    """What the set-up hands to the loop."""

    cfg: Any  # args.RunConfig (typed slices; never the argparse namespace)
    info: Any  # distributed.ProcessInfo
    topo: Any  # parallel.Topology
    programs: Any  # model.Programs
    exe: Any
    datasets: Dict[str, Any]
    pad_id: int
    checkpointer: Checkpointer
    log: Any


def run(cfg) -> int:
    """Train as configured by a validated `args.RunConfig`; returns the exit status."""
    import paddle

    from ernie_mtl.distributed import StoreBarrier

    info, log, topo = start_process(cfg)
    programs = build_programs(cfg, topo)
    exe = make_executor(cfg, info, programs, log)
    barrier = StoreBarrier(info)
    datasets, pad_id = build_datasets(cfg, info, barrier, log)
    checkpointer = Checkpointer(
        cfg.train.output_dir, rank=info.rank, world_size=info.world_size,
        per_rank_state=topo.sharding_degree > 1, keep_last=cfg.train.keep_last, barrier=barrier, log=log.info,
        save_program_state=lambda prefix: paddle.static.save(programs.main, prefix),
        load_program_state=lambda prefix: paddle.static.load(programs.main, prefix, exe))
    trainer = Trainer(Context(cfg, info, topo, programs, exe, datasets, pad_id, checkpointer, log))
    try:
        trainer.resume()
        trainer.train()
        trainer.test()
        if os.environ.get(DUMP_DIR_ENV):
            paddle.static.save(programs.main, os.path.join(os.environ[DUMP_DIR_ENV], f"rank_{info.rank}"))
    finally:
        trainer.close()
    log.info(f"checkpoints: {cfg.train.output_dir}/model_last and model_<step>; "
             f"VisualDL: visualdl --logdir {cfg.train.output_dir}/visualdl")
    return 0


def start_process(cfg):
    """(info, logger, topology): who this process is, static mode (+ gloo on CPU), the topology,
    the flags it needs and fleet, in that order (every entry point that trains starts so)."""
    import paddle

    from ernie_mtl.distributed import ProcessInfo, init_distributed
    from ernie_mtl.parallel import Topology, init_fleet, required_flags

    info = ProcessInfo.from_env()
    log = get_logger(info.rank)
    init_distributed(info)
    topo = Topology.from_config(cfg.parallel, info.world_size)
    paddle.set_flags(required_flags(topo))
    init_fleet(topo)
    return info, log, topo


def make_executor(cfg, info, programs, log):
    """The executor for --device, with `programs` made runnable here (CPU: GPU sync ops stripped)
    and initialised (startup, pretrained weights, AMP O2 cast)."""
    import paddle

    from ernie_mtl.compat import is_cpu_build, strip_gpu_sync_ops

    if is_cpu_build():
        strip_gpu_sync_ops(programs.main, programs.startup, programs.test)
    device = resolve_device(cfg.train.device)
    if cfg.amp.use_amp and device == "cpu":
        log.warning("--use_amp on CPU: a CPU build inserts no float16 casts, so this run computes in float32 "
                    "(with loss scaling); AMP takes effect on GPUs")
    place = paddle.CPUPlace() if device == "cpu" else paddle.CUDAPlace(info.local_rank)
    exe = paddle.static.Executor(place)
    programs.initialize(exe)
    return exe


def resolve_device(device: str) -> str:
    """"cpu" or "gpu" for a --device value ("auto" = gpu when paddle is built with CUDA)."""
    if device != "auto":
        return device
    from paddle.base import core

    return "gpu" if core.is_compiled_with_cuda() else "cpu"


def build_programs(cfg, topo):
    """Pretraining programs for `topo`. Built with the working directory set to
    `<output_dir>/program_desc`: fleet's ShardingOptimizer dumps its programs into the cwd."""
    from ernie_mtl.model import build_pretrain_programs
    from ernie_mtl.parallel import build_strategy

    dump_dir = os.path.join(cfg.train.output_dir, "program_desc")
    os.makedirs(dump_dir, exist_ok=True)
    strategy = functools.partial(build_strategy, topo, cfg.parallel, cfg.amp)
    with contextlib.chdir(dump_dir):
        return build_pretrain_programs(cfg.model, cfg.optim, strategy, topo, seed=cfg.train.seed, amp_cfg=cfg.amp)


def build_datasets(cfg, info, barrier, log):
    """train/valid/test datasets sized for the run (every rank calls; rank 0 builds the caches)."""
    from ernie_mtl.data.masking import VocabInfo
    from ernie_mtl.data.pretrain import build_pretrain_datasets, required_samples

    vocab = VocabInfo.from_file(cfg.data.vocab_file)
    counts = required_samples(global_batch_size=_global_batch(cfg, info), max_steps=cfg.optim.max_steps,
                              eval_freq=cfg.train.eval_freq, eval_iters=cfg.train.eval_iters,
                              test_iters=TEST_ITERS_PER_EVAL_ITER * cfg.train.eval_iters)
    datasets = build_pretrain_datasets(cfg.data.input_dir, split=cfg.data.split, num_samples=counts,
                                       cfg=cfg.sample_config(),
                                       vocab=vocab, is_builder=info.rank == 0, barrier=barrier, log=log.info)
    return datasets, vocab.pad_id


def _global_batch(cfg, info) -> int:
    from ernie_mtl.parallel import Topology

    return Topology.from_config(cfg.parallel, info.world_size).global_batch_size


class Trainer:
    """The loop over optimizer steps: train_step, maybe_log, maybe_eval, maybe_save."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.topo = ctx.topo
        self.p = ctx.programs
        self.log = ctx.log
        self.step = 0
        self.consumed_samples = 0
        self.is_rank0 = ctx.info.rank == 0
        self.data_rank = self.topo.data_rank(ctx.info.rank)
        self.fetch_names = list(self.p.fetches)
        self.metrics = MetricWriter(self.cfg.train.output_dir, enabled=self.is_rank0)
        self.window = Window()
        self.bar = None

    # -- state ---------------------------------------------------------------------------
    def resume(self) -> None:
        """Continue from the checkpoint `--resume` designates, if any (auto: the newest complete one)."""
        ref = self.ctx.checkpointer.resolve(self.cfg.train.resume)
        if ref is None:
            self.log.info(f"starting a new run in {self.cfg.train.output_dir} (no checkpoint to resume)")
            np.random.seed(self.cfg.train.seed)
            return
        state = self.ctx.checkpointer.load(ref, topology=self.topo.to_dict(), check=self._resume_checks())
        self.step, self.consumed_samples = state.step, state.consumed_samples
        self.p.lr_scheduler.set_state_dict(state.lr_scheduler)
        np.random.set_state(_rng_from_json(state.rng["numpy"]))
        self.log.info(f"resumed from {ref.path} at step {self.step} ({self.consumed_samples} samples consumed, "
                      f"next lr {self.p.lr_scheduler.last_lr:.3e})")

    def _resume_checks(self) -> Dict[str, Any]:
        """What must not change for the run to continue exactly (besides the topology)."""
        from data_tools.indexed_dataset import file_identity

        d, o = self.cfg.data, self.cfg.optim
        return {"seed": self.cfg.train.seed, "max_seq_len": d.max_seq_len, "split": d.split,
                "masked_lm_prob": d.masked_lm_prob, "max_ngrams": d.max_ngrams, "short_seq_prob": d.short_seq_prob,
                "binary_head": self.cfg.model.binary_head, "max_steps": o.max_steps,
                "decay_steps": o.resolved_decay_steps, "warmup_steps": o.warmup_steps,
                "input": file_identity(d.input_dir)}

    def _train_state(self) -> TrainState:
        return TrainState(
            step=self.step, consumed_samples=self.consumed_samples, lr_scheduler=self.p.lr_scheduler.state_dict(),
            rng={"numpy": _rng_to_json(np.random.get_state())},
            sampler={"consumed_samples": self.consumed_samples, "valid_consumed_samples": self._valid_consumed()},
            config=self.cfg.to_dict(), topology=self.topo.to_dict(), name_map=self.p.name_map,
            extra={"resume_checks": self._resume_checks(), "arch": dict(self.p.arch)})

    # -- the loop ------------------------------------------------------------------------
    def train(self) -> None:
        """Run optimizer steps until --max_steps."""
        max_steps = self.cfg.optim.max_steps
        if self.is_rank0:
            self.metrics.hparams(self.cfg.to_dict(), ["eval/loss", "eval/mlm_loss", "eval/nsp_loss"])
            self.log.info(f"training steps {self.step + 1}..{max_steps}: {self.topo.to_dict()}; losses are rank 0's "
                          f"(not all-reduced); tokens/s = rank 0's non-pad tokens x data world "
                          f"{self.topo.data_world_size}")
            from tqdm import tqdm

            self.bar = tqdm(total=max_steps, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0)
        batches = self._micro_batches("train", self.consumed_samples)
        kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0") or 0)
        self.window.reset()
        while self.step < max_steps:
            values, tokens = self.train_step(batches)
            self.window.add(values, tokens=tokens * self.topo.data_world_size, samples=self.topo.global_batch_size)
            self.maybe_log()
            self.maybe_eval()
            self.maybe_save()
            if self.step == kill_at:  # test hook: die like a crashed node, right after the checkpoint
                os.kill(os.getpid(), signal.SIGKILL)
        if self.step % self.cfg.train.eval_freq:
            self.evaluate()  # the final model is always evaluated

    def train_step(self, batches: Iterator[Dict[str, Any]]) -> tuple:
        """One optimizer step: `accumulate_steps` micro-batches; returns (fetched values averaged over the
        micro-batches: losses, lr, loss scale; this rank's non-pad tokens)."""
        from ernie_mtl.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        sums: Dict[str, float] = {}
        tokens = 0
        for micro in range(self.topo.accumulate_steps):
            feed = next(batches)
            if self.p.dropout_seeds:
                feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.cfg.train.seed, self.step, micro, self.data_rank,
                                                         self.p.dropout_seeds)
            tokens += int((np.asarray(feed["input_mask"]) == 0).sum())
            values = self.ctx.exe.run(self.p.main, feed=feed, fetch_list=list(self.p.fetches.values()))
            for name, value in zip(self.fetch_names, values):
                sums[name] = sums.get(name, 0.0) + float(np.asarray(value).reshape(-1)[0])
        self.p.lr_scheduler.step()
        self.step += 1
        self.consumed_samples += self.topo.global_batch_size
        return {k: v / self.topo.accumulate_steps for k, v in sums.items()}, tokens

    def maybe_log(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
        if self.step % self.cfg.train.logging_freq and self.step != self.cfg.optim.max_steps:
            return
        w = self.window.summary()
        self.window.reset()
        if not self.is_rank0:
            return
        eta = (self.cfg.optim.max_steps - self.step) / w["steps_per_s"] if w["steps_per_s"] > 0 else float("inf")
        scalars = {"train/loss": w["loss"], "train/mlm_loss": w["mlm_loss"], "train/nsp_loss": w.get("nsp_loss"),
                   "train/lr": w["lr"], "amp/loss_scale": w.get("loss_scaling"),
                   "perf/steps_per_s": w["steps_per_s"], "perf/tokens_per_s": w["tokens_per_s"],
                   "perf/samples_per_s": w["samples_per_s"]}
        self.metrics.scalars(self.step, scalars)
        parts = [f"step {self.step}/{self.cfg.optim.max_steps}", f"loss {w['loss']:.4f}",
                 f"mlm {w['mlm_loss']:.4f}"]
        if "nsp_loss" in w:
            parts.append(f"nsp {w['nsp_loss']:.4f}")
        parts.append(f"lr {w['lr']:.3e}")
        if "loss_scaling" in w:
            parts.append(f"loss scale {w['loss_scaling']:.0f}")
        parts += [f"{w['steps_per_s']:.2f} steps/s", f"{w['tokens_per_s']:.0f} tokens/s",
                  f"{w['samples_per_s']:.1f} samples/s", f"ETA {format_eta(eta)}"]
        self._print(" | ".join(parts))

    def maybe_eval(self) -> None:
        if self.step % self.cfg.train.eval_freq == 0:
            self.evaluate()

    def maybe_save(self) -> None:
        t = self.cfg.train
        if self.step % t.checkpoint_steps == 0 or self.step == self.cfg.optim.max_steps:
            self.ctx.checkpointer.save("model_last", self._train_state())
        if self.step % t.save_steps == 0:
            self.ctx.checkpointer.save(f"model_{self.step}", self._train_state())

    # -- evaluation ----------------------------------------------------------------------
    def _valid_consumed(self) -> int:
        """Valid samples used by the evaluations before the one at the current step (each
        evaluation continues where the previous stopped; derived from the step so resume is exact)."""
        done = (self.step - 1) // self.cfg.train.eval_freq if self.step else 0
        return done * self.cfg.train.eval_iters * self.topo.global_batch_size

    def evaluate(self) -> Dict[str, float]:
        """`eval_iters` global batches of the valid split through the test program."""
        return self._run_split("valid", "eval", self._valid_consumed(), self.cfg.train.eval_iters)

    def test(self) -> Dict[str, float]:
        """The test split at the end: 10 x eval_iters global batches."""
        return self._run_split("test", "test", 0, TEST_ITERS_PER_EVAL_ITER * self.cfg.train.eval_iters)

    def _run_split(self, split: str, prefix: str, consumed: int, iters: int) -> Dict[str, float]:
        batches = self._micro_batches(split, consumed)
        names = [n for n in ("loss", "mlm_loss", "nsp_loss") if n in self.p.fetches]
        sums = dict.fromkeys(names, 0.0)
        count = iters * self.topo.accumulate_steps
        for _ in range(count):
            values = self.ctx.exe.run(self.p.test, feed=next(batches), fetch_list=[self.p.fetches[n] for n in names])
            for name, value in zip(names, values):
                sums[name] += float(np.asarray(value).reshape(-1)[0])
        means = {f"{prefix}/{k}": v / count for k, v in sums.items()}
        self.metrics.scalars(self.step, means)
        self._print(f"{prefix} at step {self.step} ({iters} global batches of {split}, rank 0's share): "
                    + " | ".join(f"{k.split('/')[1]} {v:.4f}" for k, v in means.items()))
        return means

    # -- helpers -------------------------------------------------------------------------
    def _micro_batches(self, split: str, consumed: int) -> Iterator[Dict[str, Any]]:
        """This rank's micro-batches of `split`, in global order, after `consumed` samples."""
        import paddle

        from ernie_mtl.data.pretrain import collate_pretrain
        from ernie_mtl.data.sampler import ConsumedSamplesBatchSampler

        dataset = self.ctx.datasets[split]
        sampler = ConsumedSamplesBatchSampler(len(dataset), micro_batch_size=self.topo.micro_batch_size,
                                              data_rank=self.data_rank, data_world_size=self.topo.data_world_size,
                                              consumed_samples=consumed)
        loader = paddle.io.DataLoader(dataset, batch_sampler=sampler,
                                      collate_fn=functools.partial(collate_pretrain, pad_id=self.ctx.pad_id),
                                      num_workers=self.cfg.data.num_workers, return_list=True)
        yield from loader
        raise RuntimeError(f"the {split} split ran out of samples after {consumed} + {len(sampler)} micro-batches; "
                           "the index was sized by required_samples(): this is a bug")

    def _print(self, message: str) -> None:
        if self.is_rank0:
            self.log.info(message)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.metrics.close()


def _rng_to_json(state: tuple) -> List[Any]:
    kind, keys, pos, has_gauss, cached = state
    return [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def _rng_from_json(data: List[Any]) -> tuple:
    kind, keys, pos, has_gauss, cached = data
    return kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached
