"""Typed configuration slices of a run: each component receives only its slice, so none depends on
flags it does not use.

Every field carries its `--help` text in `field.metadata["help"]`; the command-line flag is
`--<field name>`. `validate()` reports every problem of a slice at once as one `ConfigError`.
Defaults follow PaddleNLP's ERNIE 1.0 reference launch (`run_gb512_s1m_static.sh`) where its
`args.py` defaults are not sane (it has `max_lr` 1e-5 below `min_lr` 5e-5).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Dict, Optional, Tuple

from ernie_mtl.config.errors import raise_if as _raise_if
from ernie_mtl.config.values import cfg_field as _f

@dataclass(frozen=True)
class ParallelConfig:
    """How the work is spread over processes and memory."""

    dp_degree: int = _f(-1, "Data-parallel degree; -1 = number of processes / sharding degree.")
    sharding_degree: int = _f(1, "Sharding degree (parameters, gradients and optimizer states split across "
                                 "this many ranks); needs --use_sharding.")
    use_sharding: bool = _f(False, "Enable fleet sharding (requires --sharding_degree >= 2).")
    sharding_stage: int = _f(1, "Sharding stage; Paddle 2.6's static ShardingOptimizer has a single mode, "
                                "so only 1 is accepted.")
    micro_batch_size: int = _f(8, "Samples per process per executor run (one micro-batch).")
    global_batch_size: Optional[int] = _f(None, "Samples per optimizer step over all processes; default: "
                                                "micro batch x data-parallel world (no accumulation).")
    use_recompute: bool = _f(False, "Recompute every encoder layer in the backward pass (less memory, "
                                    "about a third more compute).")

    def validate(self) -> None:
        """Raise ConfigError listing every problem (topology arithmetic is checked by Topology)."""
        problems = []
        if self.use_sharding and self.sharding_degree < 2:
            problems.append(f"--use_sharding with --sharding_degree {self.sharding_degree} shards nothing; "
                            "set --sharding_degree >= 2 or drop --use_sharding")
        if not self.use_sharding and self.sharding_degree != 1:
            problems.append(f"--sharding_degree {self.sharding_degree} needs --use_sharding; add it or set "
                            "--sharding_degree 1")
        if self.sharding_stage != 1:
            problems.append(f"--sharding_stage {self.sharding_stage} is not available in static graphs "
                            "(Paddle 2.6's static ShardingOptimizer has one mode); use --sharding_stage 1")
        _raise_if(problems)


AMP_DTYPES = ("float16", "bfloat16")
AMP_LEVELS = ("O1", "O2")


@dataclass(frozen=True)
class AmpConfig:
    """Automatic mixed precision (GPU only: CPU builds insert no casts)."""

    use_amp: bool = _f(False, "Train with automatic mixed precision.")
    amp_dtype: str = _f("float16", 'Low-precision type: "float16" (with loss scaling) or "bfloat16".')
    amp_level: str = _f("O1", '"O1": white-listed ops in low precision; "O2": the whole model in low '
                              'precision with fp32 master weights.')
    custom_white_list: Tuple[str, ...] = _f(("softmax", "layer_norm", "gelu"),
                                            "Extra ops to run in low precision (PaddleNLP ERNIE's list).")
    custom_black_list: Tuple[str, ...] = _f(("c_softmax_with_cross_entropy",),
                                            "Extra ops to keep in float32.")
    init_loss_scaling: float = _f(32768.0, "Initial loss scale (float16).")
    use_dynamic_loss_scaling: bool = _f(True, "Adapt the loss scale to overflows (float16).")

    def validate(self) -> None:
        """Raise ConfigError listing every problem."""
        problems = []
        if self.amp_dtype not in AMP_DTYPES:
            problems.append(f"--amp_dtype {self.amp_dtype!r} is not supported; use one of {list(AMP_DTYPES)}")
        if self.amp_level not in AMP_LEVELS:
            problems.append(f"--amp_level {self.amp_level!r} is not supported; use one of {list(AMP_LEVELS)}")
        overlap = sorted(set(self.custom_white_list) & set(self.custom_black_list))
        if overlap:
            problems.append(f"--custom_white_list and --custom_black_list both name {overlap}; keep each op in "
                            "one list")
        if self.init_loss_scaling <= 0:
            problems.append(f"--init_loss_scaling {self.init_loss_scaling} must be > 0, e.g. 32768")
        _raise_if(problems)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, gradient clipping and the learning-rate schedule (in optimizer steps)."""

    max_lr: float = _f(1e-4, "Peak learning rate, reached at the end of warm-up.")
    min_lr: float = _f(1e-5, "Final learning rate, reached at --decay_steps and held after.")
    warmup_rate: float = _f(0.01, "Fraction of --max_steps spent warming up linearly from 0 to --max_lr.")
    warmup_steps: Optional[int] = _f(None, "Warm-up length in optimizer steps; when set it replaces --warmup_rate "
                                           "(PALM's schedulers and PaddleNLP's Trainer count warm-up in steps).")
    decay_steps: Optional[int] = _f(None, "Step at which linear decay reaches --min_lr; default: --max_steps.")
    max_steps: int = _f(500000, "Total optimizer steps.")
    weight_decay: float = _f(0.01, "AdamW decoupled weight decay (never applied to biases and norms).")
    grad_clip: float = _f(1.0, "Clip gradients to this global L2 norm; 0 disables clipping.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.")
    fuse_optimizer: bool = _f(False, "Update the parameters with a few fused_adam ops (Paddle's multi-tensor Adam) "
                                     "instead of one adamw op each: fewer ops for the host to issue per step, which "
                                     "is what bounds a fast GPU at small batches (docs/performance.md, section 13). "
                                     "Bitwise the same updates on CPU; on GPU another float32 rounding. Checkpoints "
                                     "are the same files either way.")

    @property
    def resolved_warmup_steps(self) -> int:
        """Warm-up length in optimizer steps: --warmup_steps, else --warmup_rate x --max_steps."""
        return self.warmup_steps if self.warmup_steps is not None else int(self.warmup_rate * self.max_steps)

    @property
    def resolved_decay_steps(self) -> int:
        """Step at which the learning rate reaches min_lr."""
        return self.max_steps if self.decay_steps is None else self.decay_steps

    def validate(self) -> None:
        """Raise ConfigError listing every problem."""
        problems = []
        if self.max_steps < 1:
            problems.append(f"--max_steps {self.max_steps} must be >= 1")
        if self.max_lr <= 0:
            problems.append(f"--max_lr {self.max_lr} must be > 0, e.g. 1e-4")
        if not 0 <= self.min_lr <= self.max_lr:
            problems.append(f"--min_lr {self.min_lr} must be within [0, --max_lr {self.max_lr}], e.g. 1e-5")
        if self.decay_steps is not None and self.decay_steps < 1:
            problems.append(f"--decay_steps {self.decay_steps} must be >= 1 (or unset: --max_steps)")
        if not 0 <= self.warmup_rate < 1:
            problems.append(f"--warmup_rate {self.warmup_rate} must be within [0, 1), e.g. 0.01")
        elif self.warmup_steps is not None and self.warmup_steps < 0:
            problems.append(f"--warmup_steps {self.warmup_steps} must be >= 0 (or unset: --warmup_rate)")
        elif self.max_steps >= 1 and (self.decay_steps is None or self.decay_steps >= 1) \
                and self.resolved_decay_steps <= self.resolved_warmup_steps:
            source = (f"--warmup_steps {self.warmup_steps}" if self.warmup_steps is not None else
                      f"--warmup_rate {self.warmup_rate} x --max_steps {self.max_steps}")
            problems.append(f"--decay_steps {self.resolved_decay_steps} must be greater than the warm-up "
                            f"steps {self.resolved_warmup_steps} ({source})")
        if self.weight_decay < 0:
            problems.append(f"--weight_decay {self.weight_decay} must be >= 0, e.g. 0.01")
        if self.grad_clip < 0:
            problems.append(f"--grad_clip {self.grad_clip} must be >= 0 (0 disables clipping)")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                problems.append(f"--{name} {value} must be within [0, 1)")
        if self.adam_epsilon <= 0:
            problems.append(f"--adam_epsilon {self.adam_epsilon} must be > 0, e.g. 1e-8")
        _raise_if(problems)


@dataclass(frozen=True)
class DataConfig:
    """Where the pretraining samples come from and how they are cut and masked."""

    input_dir: Optional[str] = _f(None, "The tokenized corpus (data_tools.create_pretraining_data): a prefix "
                                        "(the path without .bin/.idx); a weighted mixture as weight/prefix pairs, "
                                        "\"5.0 data/clue 7.0 data/wudao\" (weights need not sum to 1); or a folder: "
                                        "every .bin/.idx pair in it, weighted by size. Required.")
    tokenizer_name_or_path: Optional[str] = _f(None, "A vocab.txt or a directory containing one; default: "
                                                     "--model_name_or_path when it is a directory.")
    split: str = _f("949,50,1", "Train,valid,test ratio over documents.")
    max_seq_len: int = _f(512, "Longest sample in tokens ([CLS] A [SEP] B [SEP]); batches are padded to their "
                               "longest sample.")
    masked_lm_prob: float = _f(0.15, "Fraction of tokens masked (whole words, n-grams).")
    max_predictions_per_seq: int = _f(20, "At most this many masked tokens per sample.")
    short_seq_prob: float = _f(0.1, "Probability of a shorter random target length for a sample.")
    max_ngrams: int = _f(3, "Longest masked n-gram of whole words.")
    num_workers: int = _f(2, "Data-loading worker processes per training process: they build the micro-batches of "
                                 "the coming steps (samples, masking, collation) while the device computes, in the "
                                 "order the run defines (losses equal those of 0). 0: build them in the training "
                                 "process between steps. Each worker uses one thread; give each rank cores for its "
                                 "workers (docs/performance.md, \"Feeding a GPU\").")
    prefetch_factor: int = _f(2, "Micro-batches each worker builds ahead (PyTorch/PaddleNLP meaning): at most "
                                 "num_workers x prefetch_factor are in flight per process, which bounds the memory "
                                 "the data path holds. Ignored with --num_workers 0.")
    worker_timeout: float = _f(120.0, "Seconds the training loop waits for one micro-batch from a data-loading "
                                      "worker before it names the worker and stops (a worker stuck reading a network "
                                      "file system; one stopped with SIGSTOP is named after 5 s). 0: wait forever.")
    data_cache: Optional[str] = _f(None, "Folder of the sample-index caches; default: index-cache/ beside each "
                                         "corpus. A relative path is relative to the working directory (a "
                                         "node-local folder on clusters without a shared filesystem).")
    share_folder: bool = _f(True, "Index caches live on a filesystem every node shares: global rank 0 builds them. "
                                  "false: the local rank 0 of every node builds its own copy (PaddleNLP's flag).")

    @property
    def vocab_file(self) -> Optional[Path]:
        """The vocab.txt the tokenizer path designates (None when unset)."""
        if self.tokenizer_name_or_path is None:
            return None
        path = Path(self.tokenizer_name_or_path)
        return path / "vocab.txt" if path.is_dir() else path


CPU_KERNEL_MODES = ("auto", "exact", "plain")
_CPU_KERNEL_ALIASES = {"true": "auto", "yes": "auto", "on": "auto", "1": "auto",
                       "false": "plain", "no": "plain", "off": "plain", "0": "plain"}
_OP_TYPE = re.compile(r"^[a-z][a-z0-9_]*$")


def parse_cpu_kernels(value) -> Tuple[str, Tuple[str, ...]]:
    """(mode, op types) of a --cpu_kernels value: ("auto" | "exact" | "plain", ()) or ("list", the op types
    in order, without repeats). true/false (a YAML boolean, or the words) are the old boolean flag:
    true -> auto (it was the default), false -> plain. ValueError with the message otherwise."""
    if isinstance(value, bool):
        return ("auto" if value else "plain"), ()
    text = str(value).strip().lower()
    text = _CPU_KERNEL_ALIASES.get(text, text)
    if text in CPU_KERNEL_MODES:
        return text, ()
    types = tuple(dict.fromkeys(op_type for op_type in re.split(r"[,\s]+", text) if op_type))
    bad = [op_type for op_type in types if not _OP_TYPE.match(op_type) or op_type in CPU_KERNEL_MODES]
    if not types or bad:
        raise ValueError(f"--cpu_kernels {value!r} is not auto, exact, plain (or true/false) or a comma-separated "
                         "list of op types such as matmul_v2,matmul_v2_grad" + (f" ({bad[0]!r} is not an op type)"
                                                                                 if bad else ""))
    return "list", types


def canonical_cpu_kernels(value) -> str:
    """The --cpu_kernels value as recorded: a mode word, or the op types joined by commas."""
    mode, types = parse_cpu_kernels(value)
    return ",".join(types) if mode == "list" else mode


PREEMPT_SIGNAL_NAMES = ("TERM", "USR1", "USR2", "INT", "HUP")


def parse_preempt_signals(value) -> Tuple[str, ...]:
    """`"TERM,USR1"` -> ("TERM", "USR1"); "none" -> (); ValueError naming the bad value otherwise. An empty
    value and "none" beside signal names are refused (the empty string used to mean none without a word)."""
    text = str(value).strip()
    if not text:
        raise ValueError(f"--preempt_signals {value!r} is empty: give signal names "
                         f"({', '.join(PREEMPT_SIGNAL_NAMES)}), or none to turn preemption handling off")
    names = tuple(s.strip().upper().removeprefix("SIG") for s in text.split(","))
    if "" in names:
        raise ValueError(f"--preempt_signals {value!r} has an empty item: separate signal names by single commas")
    if names == ("NONE",):
        return ()
    if "NONE" in names:
        raise ValueError(f"--preempt_signals {value!r}: none cannot be combined with signal names; give either "
                         "none or the signals")
    bad = [n for n in names if n not in PREEMPT_SIGNAL_NAMES]
    if bad:
        raise ValueError(f"--preempt_signals {value!r}: {bad} not among {list(PREEMPT_SIGNAL_NAMES)}; give a "
                         "comma-separated list (e.g. TERM,USR1) or none")
    return names


DEVICES = ("auto", "cpu", "gpu")
LOG_LEVELS = ("info", "debug")
RESUME_WORDS = ("auto", "none")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: where outputs go, how often to log, evaluate and checkpoint, and how to resume."""

    output_dir: str = _f("output", "Checkpoints (model_last, model_<step>), VisualDL logs (visualdl/), "
                                   "program dumps (program_desc/) and train_metrics.jsonl.")
    save_steps: int = _f(10000, "Every this many steps keep a checkpoint output_dir/model_<step>.")
    checkpoint_steps: int = _f(1000, "Every this many steps overwrite the rolling checkpoint output_dir/model_last.")
    keep_last: int = _f(3, "How many model_<step> checkpoints to keep (older ones are removed).")
    checkpoint_format: str = _f("paddle", '"paddle": each rank\'s program state as paddle.static.save writes it '
                                          '(state/rank_<r>.pdparams/.pdopt); "portable": every tensor by '
                                          "structured name in safetensors files, one set of files whatever the "
                                          "topology, readable with NumPy (docs/launch.md, Changing the cluster). "
                                          "Either resumes on any topology.")
    logging_freq: int = _f(20, "Log (console, VisualDL) every this many steps.")
    eval_freq: int = _f(1000, "Evaluate on the valid split every this many steps (and after the last step).")
    eval_iters: int = _f(10, "Global batches per evaluation; the final test split uses 10x as many.")
    seed: int = _f(1234, "Seed of initialisation, dropout, sample order and masking (same on every rank).")
    device: str = _f("auto", 'Device: "gpu", "cpu", or "auto" (gpu when paddle is built with CUDA).')
    cpu_kernels: str = _f("auto", "CPU runs: which op types run on oneDNN's kernels instead of Paddle's plain ones "
                                  "(MKL for matmul). auto: time both on this run's op shapes at start-up and take the "
                                  "faster per op type (matmul_v2 and its gradient, elementwise_add, scale, sum, "
                                  "transpose2(_grad)); cached per machine in "
                                  "$XDG_CACHE_HOME/ernie_mtl/cpu_kernels.json "
                                  "(~/.cache/...) and recorded in checkpoints, so a resume continues with the same "
                                  "kernels. exact: the fixed list measured bitwise exact on an Intel machine. plain: "
                                  "the programs as built (the numerical reference). Or a comma-separated list of op "
                                  "types. Every mode but plain also computes bias gradients by matmul. true = auto, "
                                  "false = plain. Results differ from plain by float32 rounding (docs/performance.md). "
                                  "The start-up log line 'CPU kernels:' says what ran and the measured rates. No "
                                  "effect on GPU. (CPU runs also use Paddle's serial executor, bitwise equal; set "
                                  "FLAGS_new_executor_serial_run=0 to keep the threaded one.)")
    overwrite_output_dir: bool = _f(False, "With --resume none: replace the checkpoints already in --output_dir "
                                           "(without it such a run is refused rather than overwrite them).")
    resume: str = _f("auto", '"auto": continue from the newest complete checkpoint in --output_dir if any; '
                             '"none": start fresh; or the path of a model_last / model_<step> folder. A checkpoint '
                             "continues on another number of processes, data-parallel or sharding degree, micro "
                             "batch or accumulation when the global batch is the same (docs/checkpoints.md: "
                             "Changing the cluster).")
    allow_batch_change: bool = _f(False, "Resume a checkpoint with another global batch: the data continues at the "
                                         "next unread sample (by samples, not steps) and the learning-rate schedule is "
                                         "re-planned by samples. Without it such a resume is refused (a different "
                                         "global batch changes the optimization).")
    init_from: Optional[str] = _f(None, "Warm start a NEW run from a checkpoint folder (model_last, model_<step>, "
                                        "best_<task>, any topology) or a PaddleNLP model directory: its weights only "
                                        "(and optimizer state with --init_optimizer), with this run's own step 0, "
                                        "LR schedule and task schedule. Not a resume: a checkpoint of this run in "
                                        "--output_dir is resumed instead (the same command continues after a crash).")
    init_optimizer: bool = _f(False, "With --init_from a checkpoint: also load its optimizer state (Adam moments, beta "
                                     "powers, AMP master weights and loss scale, EMA), not the step or LR schedule.")
    dry_run: bool = _f(False, "Print the plan (topology, batches, task schedule, strategy, parameters, memory per "
                              "rank, warnings about the data) and exit without training. With --device gpu, also "
                              "the program rank 0 of the GPU job would run (casts, collectives; built, never run), "
                              "on a CPU build too.")
    do_predict: bool = _f(False, "Predict with an exported task model instead of training: needs --task and "
                                 "--pred_file; reads output_dir/<task>/infer_model.")
    task: Optional[str] = _f(None, "The task to predict with (--do_predict).")
    pred_file: Optional[str] = _f(None, "The file to predict (--do_predict), in the task's reader format.")
    predict_output: Optional[str] = _f(None, "Where --do_predict writes its JSON; default: "
                                            "output_dir/<task>/predictions.json.")
    do_eval: bool = _f(False, "Evaluate a saved model on a labelled file instead of training: needs --task and "
                              "--eval_file; reads output_dir/<task>/infer_model, or --checkpoint.")
    eval_file: Optional[str] = _f(None, "The labelled file to evaluate (--do_eval), in the task's reader format.")
    stage: str = _f("final", "--do_predict / --do_eval of a run with refine stages: final (the refined model, "
                             "output_dir/<task>/infer_model) or multitask (the multi-task stage's, "
                             "<task>/infer_model_multitask).")
    checkpoint: Optional[str] = _f(None, "--do_eval: a checkpoint folder (model_last, model_<step>, best_<task>) "
                                         "instead of the exported model.")
    eval_output: Optional[str] = _f(None, "Where --do_eval writes its metrics JSON; default: "
                                          "output_dir/<task>/eval_results.json.")
    preempt_signals: str = _f("TERM,USR1", "Signals that make a run save model_last at the next step boundary (every "
                                           "rank at the same step) and exit with status 76, so a scheduler's "
                                           "warning before a kill loses nothing; none: do not handle them.")
    on_anomaly: str = _f("skip", "A step whose global gradient norm is NaN or infinite: skip (the update is skipped on "
                                 "the device and counted; no per-step host sync), stop (save the last good state "
                                 "and exit with status 77), replay (run the step again: the same result means the "
                                 "data or the numerics, whose batch is written to output_dir/anomalies/ and skipped; "
                                 "another result means a transient fault, and the replay is kept), or none. stop and "
                                 "replay read the counter every step. Needs --grad_clip > 0 (the norm clipping "
                                 "computes).")
    loss_spike_factor: float = _f(3.0, "Warn when a task's mean loss over a logging window exceeds this factor "
                                       "times its median over the previous windows (0: off).")
    slow_rank_factor: float = _f(0.2, "Warn when a rank's own work (outside the program) exceeds the median rank's by "
                                      "more than this fraction of a step, several windows running (0: off); every "
                                      "logging window records min/median/max step and host times (perf/*).")
    slow_rank_windows: int = _f(3, "Logging windows a rank must be slow for in a row before the warning.")
    log_level: str = _f("info", '"info": our log lines only; "debug": also Paddle\'s own console output (glog '
                                "lines, fleet's messages and prints, its OMP warning) and our debug lines "
                                "(ERNIE_MTL_DEBUG=1 does the same and adds tracebacks to user errors).")
    prebuild_index: bool = _f(False, "Build the sample-index caches this run needs (with exactly this run's flags) "
                                     "and exit without training: run it ahead so GPUs do not wait for rank 0.")


def field_help(cls: type) -> Dict[str, str]:
    """`{field name: help text}` of a config slice (for building the command line)."""
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}
