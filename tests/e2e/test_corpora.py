"""Pretraining data at scale through the real CLI: weighted corpus mixtures in flag mode and
in a multi-task YAML (planned, logged, counted in VisualDL, resumed bitwise after SIGKILL), every bad
mixture refused before any process communicates, and per-node index caches (--share_folder false)
with two launchers acting as two nodes that share no cache folder."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import ENTRY, ROOT, free_port, jsonl, metrics, ok, run_here, state

EXCLUSIVE = {"test_per_node_caches",
             "test_without_a_shared_folder"}  # two nodes within a 30 s peer timeout: run alone (tests/conftest.py)

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
# three corpora over disjoint characters, so a sample tells which corpus it came from
ALPHABETS = {"news": "的了是在我有他这", "wiki": "中大国人民日天北", "web": "上东西南家们主本"}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    from data_tools import create_pretraining_data

    root = tmp_path_factory.mktemp("corpora")
    chars = [c for a in ALPHABETS.values() for c in a]
    (root / "vocab.txt").write_text("\n".join(SPECIALS + chars) + "\n", encoding="utf-8")
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    for k, (name, alphabet) in enumerate(ALPHABETS.items()):
        docs = ["\n".join("".join(rng.choice(list(alphabet), int(rng.integers(5, 12)))) + "。" for _ in range(4))
                for _ in range(30 + 10 * k)]
        (root / f"{name}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        assert create_pretraining_data.main(["--input", str(root / f"{name}.txt"), "--vocab_file",
                                             str(root / "vocab.txt"), "--output_prefix", str(root / "data" / name),
                                             "--workers", "1"]) == 0
    return root


def flags(root: Path, out: Path, input_dir: str, **extra):
    argv = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size", str(len(SPECIALS) + 24),
            "--tokenizer_name_or_path", root / "vocab.txt", "--input_dir", input_dir, "--split", "80,10,10",
            "--max_seq_len", "32", "--micro_batch_size", "4", "--global_batch_size", "8", "--max_steps", "6",
            "--logging_freq", "1", "--eval_freq", "3", "--eval_iters", "1", "--checkpoint_steps", "2",
            "--save_steps", "100", "--num_workers", "0", "--output_dir", out]
    for k, v in extra.items():
        argv += [f"--{k}", v]
    return argv


MIXTURE = "5.0 data/news 7.0 data/wiki 12.0 data/web"


def planned_weights(dry_run_text: str):
    """{corpus: (weight, share)} as the dry run's mixture plan prints them ("news: weight 5 (share 20.83%)")."""
    found = re.findall(r"^\s+(\w+): weight (\S+) \(share ([\d.]+)%\)", dry_run_text, flags=re.M)
    return {name: (float(weight), float(share) / 100) for name, weight, share in found}


@pytest.mark.slow
def test_a_three_corpus_mixture_is_planned_logged_counted_and_resumes_bitwise(corpora, tmp_path):
    dry = ok(run_here(flags(corpora, tmp_path / "dry", MIXTURE, dry_run="true"), cwd=corpora))
    planned = planned_weights(dry.stdout)
    assert {name: w for name, (w, _) in planned.items()} == {"news": 5.0, "wiki": 7.0, "web": 12.0}, dry.stdout
    for name, (weight, share) in planned.items():
        assert share == pytest.approx(weight / 24.0, abs=5e-5)  # printed to 0.01%
    assert all(name in line and "documents" in line for name in ALPHABETS
               for line in dry.stdout.splitlines() if f"{name}: weight" in line)
    assert "samples" in dry.stdout and "epochs" in dry.stdout
    straight = ok(run_here(flags(corpora, tmp_path / "straight", MIXTURE), cwd=corpora))
    log = straight.stdout + straight.stderr
    assert all("task pretrain: " in log and name in log for name in ALPHABETS)  # the plan at start, per corpus
    counts = metrics(tmp_path / "straight", "data/pretrain/train_samples/web")
    assert counts[6] > 0
    final = {name: metrics(tmp_path / "straight", f"data/pretrain/train_samples/{name}")[6] for name in ALPHABETS}
    assert sum(final.values()) == 6 * 8  # every sample read, attributed to its corpus
    assert final["web"] > final["wiki"] > final["news"]  # weights 12 : 7 : 5
    killed = run_here(flags(corpora, tmp_path / "resumed", MIXTURE), cwd=corpora,
                     env={"ERNIE_MTL_TEST_KILL_AT_STEP": "4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ok(run_here(flags(corpora, tmp_path / "resumed", MIXTURE), cwd=corpora))
    assert metrics(tmp_path / "straight", "train/loss") == metrics(tmp_path / "resumed", "train/loss")
    a, b = state(tmp_path / "straight/model_last/state/rank_0"), state(tmp_path / "resumed/model_last/state/rank_0")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_folder_is_every_corpus_in_it_weighted_by_size(corpora, tmp_path):
    """Each corpus of the folder is weighted by its size in tokens, counted here from its .idx."""
    from data_tools.indexed_dataset import MMapIndexedDataset

    tokens = {name: int(MMapIndexedDataset(corpora / "data" / name).sizes.sum()) for name in ALPHABETS}
    assert len(set(tokens.values())) == len(tokens)  # the corpora differ in size: equal weights would fail
    dry = ok(run_here(flags(corpora, tmp_path / "dry", "data", dry_run="true"), cwd=corpora))
    planned = planned_weights(dry.stdout)
    assert {name: w for name, (w, _) in planned.items()} == tokens, dry.stdout
    total = sum(tokens.values())
    for name, (_, share) in planned.items():
        assert share == pytest.approx(tokens[name] / total, abs=5e-5)


@pytest.mark.parametrize("spec,culprit", [
    ("5.0 data/news abc data/wiki", "abc"),
    ("-1 data/news 2 data/wiki", "-1"),
    ("5.0 data/news 7.0 data/missing", "data/missing"),
    ("5.0 data/news 7.0", "odd"),
    ("empty_folder", "empty_folder"),
    ("5.0 data/news 7.0 other/news", "vocab"),
])
def test_a_bad_mixture_is_refused_before_anything_runs(corpora, tmp_path, spec, culprit):
    (corpora / "empty_folder").mkdir(exist_ok=True)
    other = corpora / "other"
    if not other.exists():  # the same corpus, claimed by its sidecar to be tokenized with another vocab
        other.mkdir()
        for ext in (".bin", ".idx"):
            (other / f"news{ext}").write_bytes((corpora / "data" / f"news{ext}").read_bytes())
        sidecar = json.loads((corpora / "data" / "news.json").read_text())
        sidecar["vocab_sha1"] = "0" * 40
        (other / "news.json").write_text(json.dumps(sidecar))
    proc = run_here(flags(corpora, tmp_path / "out", spec), cwd=corpora)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--input_dir" in proc.stderr and culprit in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was created


@pytest.mark.slow
def test_a_multitask_pretrain_task_reads_a_mixture_from_its_yaml(corpora, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "lm.yaml").write_text(f"reader: pretrain\nsplit: '80,10,10'\ntrain_file: [[1, {corpora}/data/news], "
                                   f"[3, {corpora}/data/web]]\n")
    rows = ["label\ttext_a"] + [f"{i % 2}\t{'的中上' * 3}" for i in range(16)]
    (tmp_path / "cls.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tasks / "topic.yaml").write_text("reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n")
    (tmp_path / "g.yaml").write_text("task_instance: topic, lm\ntarget_tag: 1, 0\nmix_ratio: 1, 1\ntask_dir: tasks\n"
                                     "batch_size: 4\nmax_seq_len: 32\n")
    ok(run_here(["--config", tmp_path / "g.yaml", "--device", "cpu", "--model_name_or_path", "ernie-tiny-test",
                "--vocab_size", str(len(SPECIALS) + 24), "--tokenizer_name_or_path", corpora / "vocab.txt",
                "--num_workers", "0", "--max_steps", "4", "--logging_freq", "1", "--output_dir", tmp_path / "out"],
               cwd=tmp_path))
    rows = jsonl(tmp_path / "out" / "train_metrics.jsonl")
    assert any("data/lm/train_samples/web" in r for r in rows)


# -- per-node index caches: two launchers = two nodes, each with its own cache folder ---------------------
def _two_nodes(corpora, tmp_path, share_folder: str, timeout=240):
    """The same command started on two 'nodes' (own working directories: `--data_cache index-cache` is
    node-local), rendezvous through one master; returns (exit codes, node folders)."""
    port = free_port()
    procs, nodes = [], []
    for n in (0, 1):
        node = tmp_path / f"node{n}"
        node.mkdir()
        nodes.append(node)
        argv = [sys.executable, "-m", "paddle.distributed.launch", "--master", f"127.0.0.1:{port}", "--nnodes", "2",
                "--nproc_per_node", "1", "--log_dir", str(node / "log"), ENTRY,
                *[str(a) for a in flags(corpora, tmp_path / "out", str(corpora / "data" / "news"),
                                        max_steps="2", micro_batch_size="4", data_cache="index-cache",
                                        share_folder=share_folder, eval_freq="2", checkpoint_steps="100")]]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ERNIE_MTL_PEER_TIMEOUT": "30"}
        procs.append(subprocess.Popen(argv, cwd=node, env=env, stdout=open(node / "out.txt", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(1)
    try:
        return [p.wait(timeout=timeout) for p in procs], nodes
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def _worker_logs(nodes):
    return "".join((n / "log" / "workerlog.0").read_text(errors="replace") for n in nodes
                   if (n / "log" / "workerlog.0").exists())


@pytest.mark.slow
def test_per_node_caches_each_node_builds_its_own_copy(corpora, tmp_path):
    codes, nodes = _two_nodes(corpora, tmp_path, "false")
    assert codes == [0, 0], _worker_logs(nodes)[-4000:]
    built = [sorted(p.name for p in (node / "index-cache").iterdir() if not p.name.startswith(".")) for node in nodes]
    assert built[0] == built[1] and len(built[0]) >= 2  # the same caches, built on each node (train, valid, test)
    assert json.loads((tmp_path / "out" / "model_last" / "train_state.json").read_text())["step"] == 2


@pytest.mark.slow
def test_without_a_shared_folder_the_default_fails_clearly_on_the_other_node(corpora, tmp_path):
    codes, nodes = _two_nodes(corpora, tmp_path, "true")
    assert all(c != 0 for c in codes)
    assert "--share_folder false" in _worker_logs(nodes)
