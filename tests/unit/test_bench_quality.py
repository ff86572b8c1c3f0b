"""benchmarks/bench_quality.py without running anything: the configuration each arm writes (the engine's
keys, exact target quotas), the comparisons fixed by the arms alone, the paired statistics and verdicts,
the plan checks and the tables built from the runs."""
import zlib  # noqa: F401  (before anything that may load paddle)

import importlib.util
import json
import math
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "benchmarks" / "bench_quality.py")
bq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bq)

INFO = {"vocab_size": 12773, "sentiment": {"train": 13889}, "wordseg": {"train": 35027}}


def _args(tmp_path, *extra):
    return bq.parse_args(["--work_dir", str(tmp_path), *extra])


def _yaml(text):
    return dict(line.split(": ", 1) for line in text.strip().split("\n"))


def _config(args, arm, task=None, size=300, init="pretrained"):
    names = bq.run_tasks(args, arm, task)
    files = {n: _yaml(bq.target_yaml(args, INFO, arm, n, size) if n in bq.TASKS else bq.aux_yaml(args, n, size))
             for n in names}
    return names, files, bq.global_keys(args, arm, init, names, "MODEL", Path("OUT"), 3, INFO)


def test_the_default_table_is_the_one_documented(tmp_path):
    args = _args(tmp_path)
    assert args.arm_list == list(bq.DEFAULT_ARMS) == ["single", "pair", "related", "uncertainty", "refine"]
    assert (args.sizes, args.init_list, args.seeds, args.pretrain_steps) == ([300], ["pretrained"], 5, 6000)
    assert args.steps == {"sentiment": 100, "wordseg": 100} and args.refine_steps == 100 and args.refine_lr == 1e-3
    doc = (ROOT / "docs" / "quality.md").read_text(encoding="utf-8")
    section = doc.split("## The default table")[1].split("\n## ")[0]
    for arm in bq.DEFAULT_ARMS:
        assert f"`{arm}`" in section, arm
    assert "5 seeds" in section and "6,000" in section and "300" in section


@pytest.mark.parametrize("arm", list(bq.ARMS))
def test_every_target_gets_exactly_its_planned_updates(tmp_path, arm):
    args = _args(tmp_path)
    for size in (300, 3000, "full"):
        names, files, _ = _config(args, arm, "sentiment" if arm in bq.SINGLE_ARMS else None, size)
        for task in set(names) & set(bq.TASKS):
            spe = math.ceil(bq.n_train(INFO, task, size) / int(files[task]["batch_size"]))
            assert math.ceil(float(files[task]["num_epochs"]) * spe) == bq.quota(args, arm, task) == (
                200 if arm == "single-long" else 100)


def test_each_arm_writes_the_engine_keys(tmp_path):
    args = _args(tmp_path)
    names, files, glob = _config(args, "related")
    assert names == ["sentiment", "wordseg", "pos"] and glob["target_tag"] == "1, 1, 0"
    assert glob["mix_ratio"] == "1.0, 1.0, 1.0"
    unlabeled = str(bq.poor_dir(args) / "sentiment" / "300" / "unlabeled.tsv")
    assert (files["sentiment"]["tapt"], files["sentiment"]["tapt_file"], files["sentiment"]["tapt_mix_ratio"]) == (
        "true", unlabeled, "1.0")
    assert "tapt" not in files["wordseg"] and files["pos"]["reader"] == "seq_label"
    assert files["pos"]["train_file"] == str(bq.poor_dir(args) / "pos" / "train.tsv")
    assert files["sentiment"]["train_file"] == str(bq.poor_dir(args) / "sentiment" / "300" / "train.tsv")
    assert files["sentiment"]["dev_file"] == str(tmp_path / "data" / "tasks" / "sentiment" / "dev.tsv")
    base = {k: v for k, v in glob.items()}
    for arm, extra in (("refine", {"refine": True, "refine_steps": 100, "refine_learning_rate": 1e-3}),
                       ("uncertainty", {"loss_balance": "uncertainty"}), ("normalize", {"loss_balance": "normalize"})):
        _, arm_files, arm_glob = _config(args, arm)
        assert arm_files == files and arm_glob == {**base, **extra}, arm  # one setting more than `related`
    _, anneal_files, anneal = _config(args, "anneal")
    assert {k: anneal[k] for k in ("sampling", "temperature", "temperature_end", "examples_cap")} == {
        "sampling": "temperature", "temperature": 1.0, "temperature_end": "inf", "examples_cap": 1000}
    assert "mix_ratio" not in anneal and "tapt_mix_ratio" not in anneal_files["sentiment"]
    names, files, glob = _config(args, "mtl")
    assert names == ["corpus", "sentiment", "wordseg"] and glob["mix_ratio"] == "0.5, 1.0, 1.0"
    assert not any("tapt" in f for f in files.values())
    names, files, _ = _config(args, "tapt")
    assert all(files[t]["tapt"] == "true" and "tapt_file" not in files[t] for t in bq.TASKS)
    # full size: sentiment's TAPT reads its own training text
    assert "tapt_file" not in _config(args, "related", size="full")[1]["sentiment"]
    _, single, glob = _config(args, "single", "wordseg", init="random")
    assert list(single) == ["wordseg"] and glob["vocab_size"] == 12773 and glob["model_name_or_path"] == "MODEL"


def test_tapt_as_task_gives_the_reviews_as_an_mlm_task(tmp_path):
    args = _args(tmp_path, "--tapt_as_task")
    names, files, glob = _config(args, "related")
    assert names == ["sentiment", "wordseg", "pos", "reviews"] and glob["mix_ratio"] == "1.0, 1.0, 1.0, 1.0"
    assert files["reviews"]["reader"] == "mlm" and "tapt" not in files["sentiment"]
    assert files["reviews"]["train_file"] == str(bq.poor_dir(args) / "sentiment" / "300" / "unlabeled.tsv")
    assert bq.run_name(args, 300, "random", "related", None, 2) == "related-random-all-seed2-taptask"
    with pytest.raises(SystemExit):
        _args(tmp_path, "--tapt_as_task", "--sizes", "full")


@pytest.mark.parametrize("flags, message", [
    (["--arms", "single,bogus"], "--arms: unknown ['bogus']"),
    (["--inits", "warm"], "--inits 'warm'"),
    (["--sizes", "0"], "--sizes '0'"), (["--sizes", "many"], "--sizes 'many'"),
    (["--first_seed", "0"], "--first_seed 0: both must be at least 1"),
    (["--jobs", "0"], "--jobs 0: give 1 to"), (["--jobs", "100000"], "--jobs 100000: give 1 to")])
def test_bad_flags_are_refused_with_the_flag(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        _args(tmp_path, *flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_comparisons_are_fixed_by_the_arms(tmp_path):
    args = _args(tmp_path)
    plan = bq.comparison_plan(args.arm_list, args.init_list, args.sizes)
    questions = [(c["kind"], c["question"]) for c in plan]
    assert [q for k, q in questions if k == "vs_single"] == [
        "related vs single", "refine vs single", "uncertainty vs single", "pair vs single"]  # in ARMS' order
    assert [q for k, q in questions if k == "recipe"] == ["refine vs related", "uncertainty vs related"]
    assert [q for k, q in questions if k == "control"] == [
        "refine vs its own multi-task stage", "refine's multi-task stage vs related"]
    every = bq.comparison_plan(list(bq.ARMS), args.init_list, args.sizes)
    assert [c["question"] for c in every if c["kind"] == "recipe"] == [f"{r} vs related" for r in bq.RECIPES] + [
        "mtl-refine vs mtl"]
    assert [c["question"] for c in every if c["kind"] == "control"][:2] == [
        "refine vs single-long (same target updates)", "mtl-refine vs single-long (same target updates)"]
    both = bq.comparison_plan(["single", "mtl"], ["random", "pretrained"], [300, "full"])
    assert [(c["size"], c["init_a"], c["init_b"], c["question"]) for c in both if c["kind"] == "pretraining"] == [
        (s, "random", "pretrained", f"pretraining gain, {a}") for s in (300, "full") for a in ("single", "mtl")]


def test_the_pair_arm_is_mtl_without_the_generic_masked_lm(tmp_path):
    args = _args(tmp_path, "--arms", "single,mtl,pair")
    names, files, glob = _config(args, "pair")
    mtl_names, mtl_files, mtl_glob = _config(args, "mtl")
    assert names == ["sentiment", "wordseg"] and mtl_names == ["corpus", "sentiment", "wordseg"]
    assert {n: files[n] for n in names} == {n: mtl_files[n] for n in names}  # the targets alike
    assert glob["mix_ratio"] == "1.0, 1.0" and mtl_glob["mix_ratio"] == "0.5, 1.0, 1.0"
    plan = bq.comparison_plan(args.arm_list, args.init_list, args.sizes)
    assert ("control", "mtl vs pair (the generic masked LM added)", "pair", "mtl") in [
        (c["kind"], c["question"], c["a"], c["b"]) for c in plan]


def test_fresh_seeds_keep_the_shared_pretraining_and_their_own_results_file(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bq, "build_data", lambda args, run: {"vocab_size": 1})
    monkeypatch.setattr(bq.dc, "trivial_baselines", lambda folder: {})
    monkeypatch.setattr(bq, "pretrain", lambda args, run, info, seed: (calls.append(("pretrain", seed)) or tmp_path,
                                                                        {}))
    monkeypatch.setattr(bq, "finetune", lambda args, run, info, size, init, arm, task, seed, pre: (
        calls.append((arm, task, seed)) or {t: {"reported": {"acc": 0.5, "f1": 0.5}} for t in bq.TASKS} | {
            "steps": 1, "seconds": 1, "train_seconds": 1, "run": "r", "stage1": {}}))
    monkeypatch.setattr(bq, "plan_checks", lambda args, results, seeds: [])
    monkeypatch.setattr(bq, "tables", lambda results, seeds: "")
    assert bq.main(["--work_dir", str(tmp_path), "--arms", "pair", "--seeds", "2", "--first_seed", "6",
                    "--quiet"]) == 0
    assert calls == [("pretrain", 1), ("pair", None, 6), ("pair", None, 7)]  # one shared pretraining: seed 1's
    assert json.loads((tmp_path / "results-seeds6-7.json").read_text())["seeds"] == [6, 7]
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_results_are_written_after_every_run_also_before_a_seed_is_complete(tmp_path, monkeypatch, jobs):
    """The results file is rewritten as each run finishes; before any seed has all its runs there is no
    comparison yet (the first version of --jobs asked the statistics for a mean of nothing and stopped)."""
    monkeypatch.setattr(bq, "build_data", lambda args, run: {"vocab_size": 1})
    monkeypatch.setattr(bq.dc, "trivial_baselines", lambda folder: {})
    monkeypatch.setattr(bq, "pretrain", lambda args, run, info, seed: (tmp_path, {}))
    monkeypatch.setattr(bq, "cpu_slots", lambda n: [[0]] * n)
    monkeypatch.setattr(bq, "plan_checks", lambda args, results, seeds: [])
    monkeypatch.setattr(bq, "tables", lambda results, seeds: "")
    written = []
    write_json = bq.write_json
    monkeypatch.setattr(bq, "write_json", lambda path, doc: written.append(json.loads(json.dumps(doc))) or
                        write_json(path, doc))
    score = {"sentiment": {1: 0.50, 2: 0.60}, "wordseg": {1: 0.70, 2: 0.72}}

    def finetune(args, run, info, size, init, arm, task, seed, pre):
        gain = 0.01 * seed if arm == "pair" else 0.0
        return {t: {"reported": {"acc": score[t][seed] + gain, "f1": score[t][seed] + gain}} for t in bq.TASKS} | {
            "steps": 1, "seconds": 1, "train_seconds": 1, "run": f"{arm}-{task}-{seed}", "stage1": {}}

    monkeypatch.setattr(bq, "finetune", finetune)
    assert bq.main(["--work_dir", str(tmp_path), "--arms", "single,pair", "--seeds", "2", "--quiet",
                    "--jobs", jobs]) == 0
    assert len(written) == 6 + 1 and written[0]["comparisons"] == []  # 3 runs per seed; then the final write
    final = {(c["question"], c["task"]): c for c in written[-1]["comparisons"]}
    assert final[("pair vs single", "sentiment")]["mean"] == pytest.approx(0.015)


def test_invocations_that_differ_keep_their_own_results_file(tmp_path):
    def suffix(*flags):
        args = _args(tmp_path, *flags)
        return bq.results_suffix(args, list(range(args.first_seed, args.first_seed + args.seeds)))

    assert suffix() == ""  # the default table's results.json
    assert suffix("--first_seed", "6") == "-seeds6-10"
    assert suffix("--first_seed", "6", "--inits", "random", "--sizes", "full") == "-seeds6-10-random-full"
    assert suffix("--inits", "random,pretrained", "--sizes", "300,3000", "--lr", "3e-4") == \
        "-lr0.0003-random+pretrained-300+3000"


def test_paired_verdicts():
    assert bq.paired([0.5] * 5, [0.6, 0.61, 0.59, 0.6, 0.62])["verdict"] == "gain > 2 SE"
    assert bq.paired([0.5] * 5, [0.4, 0.41, 0.39, 0.4, 0.42])["verdict"] == "loss > 2 SE"
    st = bq.paired([0.5] * 5, [0.6, 0.4, 0.55, 0.45, 0.5])
    assert st["verdict"] == "within 2 SE" and st["wins"] == 2 and abs(st["mean"]) < 1e-12


def _record(run, value, task, updates=100, refine_updates=None):
    metric = {"acc": value, "f1": value, "precision": value, "recall": value} if task == "sentiment" else \
        {"f1": value, "precision": value, "recall": value, "accuracy": value}
    return {"reported": metric, "updates": updates, "refine_updates": refine_updates, "steps": 100, "seconds": 60.0,
            "train_seconds": 30.0, "run": run, "check": {"ok": True, "problems": [], "by_hand": metric}, "dev": metric}


def _results(args, values):
    """values: {arm: [per-seed value]} for both tasks, size 300, pretrained."""
    cell = {}
    for arm, per_seed in values.items():
        for task in bq.TASKS:
            for s, v in enumerate(per_seed, 1):
                run = f"{arm}-{task if arm in bq.SINGLE_ARMS else 'all'}-seed{s}"
                cell.setdefault(arm, {}).setdefault(task, {})[str(s)] = _record(
                    run, v, task, bq.quota(args, arm, task), args.refine_steps if arm in bq.REFINED else None)
    settings = {"arm_list": list(values), "init_list": ["pretrained"], "size_list": [300]}
    return {"settings": settings, "cells": {"300/pretrained": cell}, "pretraining": {},
            "baselines": {"sentiment": {"majority_label": 0, "acc": 0.52, "f1": 0.0},
                          "wordseg": {"f1": 0.35, "precision": 0.28, "recall": 0.47}}}


def test_tables_and_verdicts_are_built_from_the_runs(tmp_path):
    args = _args(tmp_path)
    seeds = [1, 2, 3, 4, 5]
    results = _results(args, {"single": [0.70, 0.71, 0.69, 0.70, 0.72], "related": [0.75, 0.74, 0.76, 0.75, 0.77],
                              "refine": [0.69, 0.73, 0.70, 0.71, 0.70]})
    rows = {(c["question"], c["task"]): c for c in bq.compare(results, seeds)}
    gain = rows[("related vs single", "sentiment")]
    assert gain["verdict"] == "gain > 2 SE" and gain["wins"] == 5 and abs(gain["mean"] - 0.05) < 1e-9
    assert rows[("refine vs single", "wordseg")]["verdict"] == "within 2 SE"
    assert rows[("refine vs related", "sentiment")]["verdict"] == "loss > 2 SE"
    text = bq.tables(results, seeds)
    assert ("| 300 | pretrained | related vs single | sentiment (acc) | single: 0.7040 +- 0.0114 | related: "
            "0.7540 +- 0.0114 | +0.0500 +0.0300 +0.0700 +0.0500 +0.0500 | +0.0500 +- 0.0063 | 5/5 | gain > 2 SE |"
            in text)
    run_row = re.compile(r"\| 300 \| pretrained \| (single|related|refine) \| \d \| 0\.\d{4} \|")
    every_run = [line for line in text.split("\n") if run_row.match(line)]
    assert len(every_run) == 15  # every seed of every arm
    assert "| 300 | pretrained | single | 5 | 1.00 | 2.00 | 100 |" in text  # two runs of 30 s training per seed
    # a missing seed drops the comparisons of that arm instead of comparing fewer seeds
    del results["cells"]["300/pretrained"]["refine"]["sentiment"]["3"]
    assert not [c for c in bq.compare(results, seeds) if c["b"] == "refine" and c["task"] == "sentiment"]
    assert bq.plan_checks(args, results, seeds) == []
    assert "| 300 | pretrained | refine | 1 | 0.6900 | 0.6900 (0.690, 0.690) | 0.6900 (0.690, 0.690) | 0.6900 | " \
           "100+100 / 100+100 |" in text


def test_plan_checks_name_a_failed_check_and_wrong_updates(tmp_path):
    args = _args(tmp_path)
    results = _results(args, {"single": [0.7], "single-long": [0.7]})
    results["cells"]["300/pretrained"]["single-long"]["wordseg"]["1"]["updates"] = 100
    results["cells"]["300/pretrained"]["single"]["sentiment"]["1"]["check"].update(ok=False, problems=["x"])
    results["cells"]["300/pretrained"]["single"]["wordseg"]["1"]["refine_updates"] = 7
    assert bq.plan_checks(args, results, [1]) == [
        "check 300/pretrained single sentiment seed 1: ['x']",
        "300/pretrained single wordseg seed 1: 7 target updates in its refine stage, planned None",
        "300/pretrained single-long wordseg seed 1: 100 target updates in the training stage, planned 200"]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_two_stage_run_is_read_as_the_engine_writes_it(tmp_path):
    """read_run on a run folder laid out as the engine's two-stage run writes it: the training stage's updates
    from the first `training finished` line, each refine stage's from its own (the other tasks show 0 there),
    the multi-task stage's figures from its export's --do_eval, the refined model's dev figures against the
    refine stage's own evaluation, and the exported predictions recounted."""
    import json

    args = _args(tmp_path)
    tasks = tmp_path / "data" / "tasks"
    _write(tasks / "sentiment" / "test.tsv", "label\ttext_a\n1\t好\n0\t差\n")
    _write(tasks / "wordseg" / "test.tsv", "text_a\tlabel\n我\x02们\tB\x02E\n")
    folder = tmp_path / "runs" / "300" / "refine-pretrained-all-seed1"
    out = folder / "out"
    _write(folder / "bench_spec.json", json.dumps({"hash": "x", "seconds": 90.0, "train_seconds": 60.0}))
    _write(folder / "train.log", "stage 1: multi-task\n"
           "training finished at step 396: micro-batches per task {'sentiment': 100, 'wordseg': 100, 'pos': 101}\n"
           "stage 2: refine sentiment\n"
           "training finished at step 100: micro-batches per task {'sentiment': 100, 'wordseg': 0, 'pos': 0}\n"
           "stage 3: refine wordseg\n"
           "training finished at step 100: micro-batches per task {'sentiment': 0, 'wordseg': 100, 'pos': 0}\n")
    sentiment = {"acc": 0.5, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    wordseg = {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0}
    for task, metrics in (("sentiment", sentiment), ("wordseg", wordseg)):
        _write(out / task / "test_eval.json", json.dumps({"metrics": metrics}))
        _write(out / task / "dev_eval.json", json.dumps({"metrics": metrics}))
        _write(out / task / "test_eval_multitask.json", json.dumps({"metrics": {**metrics, "f1": 0.25}}))
    _write(out / "sentiment" / "predictions.json", json.dumps([{"label": 0}, {"label": 0}]))
    _write(out / "wordseg" / "predictions.json", json.dumps([{"tokens": ["我", "们"], "labels": ["B", "E"]}]))
    # the multi-task stage evaluated other weights; the refine stage's own evaluation is what the export holds
    _write(out / "train_metrics.jsonl", json.dumps({f"eval/{t}/{k}": 0.1 for t in bq.TASKS for k in wordseg}) + "\n")
    _write(out / "refine" / "sentiment" / "train_metrics.jsonl",
           json.dumps({f"eval/sentiment/{k}": v for k, v in sentiment.items()}) + "\n")
    _write(out / "refine" / "wordseg" / "train_metrics.jsonl",
           json.dumps({"eval/wordseg/f1": 1.0, "eval/wordseg/precision": 1.0, "eval/wordseg/recall": 1.0,
                       "eval/wordseg/accuracy": 0.9}) + "\n")
    got = bq.read_run(args, folder, "refine-pretrained-all-seed1", list(bq.TASKS))
    assert (got["steps"], got["seconds"], got["train_seconds"]) == (396, 90.0, 60.0)
    assert [(got[t]["updates"], got[t]["refine_updates"]) for t in bq.TASKS] == [(100, 100), (100, 100)]
    assert got["stage1"] == {"sentiment": {**sentiment, "f1": 0.25}, "wordseg": {**wordseg, "f1": 0.25}}
    assert got["sentiment"]["check"]["ok"] and got["sentiment"]["reported"] == sentiment
    assert not got["wordseg"]["check"]["ok"]  # its dev accuracy 1.0 against the refine stage's own 0.9
    assert got["wordseg"]["check"]["problems"] == ["dev accuracy: exported model 1.000000, training program 0.9"]


def test_cpu_shares_cover_the_usable_cpus_once(monkeypatch):
    from ernie_mtl.dist import threads

    monkeypatch.setattr(bq.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5, 6})
    monkeypatch.setattr(threads, "cpu_budget", lambda: threads.CpuBudget(affinity=5))
    assert bq.cpu_slots(1) == [[0, 1, 2, 5, 6]]
    assert bq.cpu_slots(2) == [[0, 1], [2, 5, 6]]
    assert bq.cpu_slots(5) == [[0], [1], [2], [5], [6]]
    monkeypatch.setattr(threads, "cpu_budget", lambda: threads.CpuBudget(affinity=5, quota=2.5))  # a container
    assert bq.usable_cpus() == [0, 1] and bq.cpu_slots(2) == [[0], [1]]


def test_a_pinned_runner_starts_its_command_on_its_cpus(tmp_path, monkeypatch):
    """Confined from its start, with the thread counts of this environment dropped (the engine sizes its
    threads to the share)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    cpu = sorted(bq.os.sched_getaffinity(0))[-1]
    runner = bq.Runner(tmp_path, verbose=False).pinned([cpu])
    log = tmp_path / "affinity.log"
    probe = "import os, sys; print(sorted(os.sched_getaffinity(0)), sys.argv[1:], os.environ.get('OMP_NUM_THREADS'))"
    runner(["-c", probe, "a b", "--x"], log, "probe")
    first, printed = log.read_text(encoding="utf-8").splitlines()[:2]
    assert first.startswith(f"$ (CPUs {cpu}) ") and printed == f"[{cpu}] ['a b', '--x'] None"
    assert bq.Runner(tmp_path, verbose=False).env["OMP_NUM_THREADS"] == "7"  # an unpinned runner keeps it


def _plan_runs(tmp_path, monkeypatch, jobs, fail=None, ran=None):
    """run_plan with finetune replaced: which CPUs each run had (`ran`, filled as runs start), and what was
    recorded."""
    import threading
    ran = {} if ran is None else ran
    recorded, lock = [], threading.Lock()
    barrier = threading.Barrier(jobs) if jobs > 1 else None

    def finetune(args, run, info, size, init, arm, task, seed, pre):
        if barrier is not None and seed == 1:
            barrier.wait(timeout=30)  # the first `jobs` runs must be running at the same time
        with lock:
            ran[(seed, arm, task)] = run.cpus
        if (seed, arm) == fail:
            raise SystemExit(f"bench_quality: seed {seed} {arm} failed")
        time.sleep(0.2)  # a run takes a while: a failed one's thread is free before the others
        return {"seed": seed}

    monkeypatch.setattr(bq, "finetune", finetune)
    monkeypatch.setattr(bq, "cpu_slots", lambda n: [[10 + i] for i in range(n)])
    args = _args(tmp_path, "--arms", "pair,related", "--seeds", "3")
    args.jobs = jobs
    plan = bq.finetuning_plan(args, [1, 2, 3])
    bq.run_plan(args, bq.Runner(tmp_path, verbose=False), {}, plan, {1: tmp_path},
                lambda key, out: recorded.append((key, out)))
    return plan, ran, recorded


def test_runs_go_one_at_a_time_unconfined_by_default(tmp_path, monkeypatch):
    plan, ran, recorded = _plan_runs(tmp_path, monkeypatch, 1)
    assert [key for key, _ in recorded] == plan and len(plan) == 6
    assert set(ran.values()) == {None}


def test_jobs_run_at_once_each_on_its_own_cpus_and_every_run_is_recorded_once(tmp_path, monkeypatch):
    plan, ran, recorded = _plan_runs(tmp_path, monkeypatch, 2)
    assert sorted(key for key, _ in recorded) == sorted(plan)
    assert all(out == {"seed": key[0]} for key, out in recorded)
    assert {tuple(c) for c in ran.values()} == {(10,), (11,)}  # both shares used, never a run unconfined


def test_a_failed_run_stops_the_jobs_with_its_message(tmp_path, monkeypatch):
    """No run starts after a failure (the one running beside it may finish): seed 3's never start, also when
    the main thread is late to see the failure (its wait for finished runs slowed down here)."""
    as_completed = bq.concurrent.futures.as_completed

    def late(futures):
        for done in as_completed(futures):
            time.sleep(0.1)
            yield done

    monkeypatch.setattr(bq.concurrent.futures, "as_completed", late)
    ran = {}
    with pytest.raises(SystemExit, match="seed 2 pair failed"):
        _plan_runs(tmp_path, monkeypatch, 2, fail=(2, "pair"), ran=ran)
    assert {(1, "pair", None), (1, "related", None), (2, "pair", None)} <= set(ran)
    assert not [key for key in ran if key[0] == 3], ran
