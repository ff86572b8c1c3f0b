"""The wheel a cluster deployment installs: built with `pip wheel`, installed without `-e` into a
clean virtualenv (which reuses the pinned dependencies of the project's environment), and run from
outside the repository: --help, a 2-step flag-mode pretraining and a 2-step multi-task run."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from helpers import write_topic_lm_tasks

ROOT = Path(__file__).resolve().parents[2]


def sh(argv, *, cwd, env=None, timeout=600):
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, (argv, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(clean venv python, folder outside the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", ROOT],
       cwd=tmp)
    (wheel,) = (tmp / "dist").glob("ernie_mtl-*.whl")
    venv = tmp / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                           text=True).strip())
    # the pinned dependencies, reused from this environment (a path line: its own .pth files -- this
    # checkout's editable install among them -- are not processed, so ernie_mtl must come from the wheel)
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel], cwd=tmp)
    outside = tmp / "work"
    outside.mkdir()
    return py, outside


def test_the_wheel_ships_every_package_and_no_top_level_modules(installed):
    py, outside = installed
    where = json.loads(sh([py, "-c", "import zlib, json, ernie_mtl, data_tools, ernie_mtl.tasks, ernie_mtl.config; "
                           "import data_tools.index as i; "
                           "print(json.dumps([ernie_mtl.__file__, data_tools.__file__, i.HELPER_VERSION]))"],
                          cwd=outside).stdout)
    assert all("/venv/" in w and str(ROOT) not in w for w in where[:2]), where
    purelib = Path(where[0]).parents[1]
    for generic in ("args.py", "run_multitask_static.py", "static_to_dynamic.py"):
        assert not (purelib / generic).exists(), generic
    registered = json.loads(sh([py, "-c", "import zlib, json; from ernie_mtl.tasks.base import registered_task_types; "
                                "print(json.dumps(sorted(registered_task_types())))"], cwd=outside).stdout)
    assert registered == ["cls", "match", "mlm", "mrc", "pretrain", "seq_label"]
    help_text = sh([py.parent / "ernie-mtl", "--help"], cwd=outside).stdout
    assert "--input_dir" in help_text and "--prebuild_index" in help_text
    assert "--input" in sh([py.parent / "ernie-mtl-convert", "--help"], cwd=outside).stdout


@pytest.mark.slow
def test_flag_mode_and_multitask_runs_from_the_installed_wheel(installed):
    py, work = installed
    rng = np.random.default_rng(0)
    chars = [chr(0x4E00 + i) for i in range(60)]
    (work / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + chars) + "\n",
                                    encoding="utf-8")
    docs = ["\n".join("".join(rng.choice(chars, 12)) + "。" for _ in range(5)) for _ in range(60)]
    (work / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    sh([py, "-m", "data_tools.create_pretraining_data", "--input", "docs.txt", "--vocab_file", "vocab.txt",
        "--output_prefix", "corpus", "--workers", "1"], cwd=work)
    common = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size", "65",
              "--tokenizer_name_or_path", "vocab.txt", "--num_workers", "0", "--max_steps", "2", "--eval_freq", "2",
              "--eval_iters", "1"]
    sh([py.parent / "ernie-mtl", *common, "--input_dir", "corpus", "--split", "80,10,10", "--max_seq_len", "32",
        "--micro_batch_size", "2", "--output_dir", "flag"], cwd=work)
    assert json.loads((work / "flag" / "model_last" / "train_state.json").read_text())["step"] == 2
    write_topic_lm_tasks(work, rng, chars, rows=16, width=8, batch_size=2)
    sh([py.parent / "ernie-mtl", "--config", "global.yaml", *common, "--output_dir", "mtl"], cwd=work)
    state = json.loads((work / "mtl" / "model_last" / "train_state.json").read_text())
    assert state["step"] == 2 and sum(state["sampler"]["counts"]) == 2


# -- the order of imports: ernie_mtl_zlib.pth -----------------------------------------------------------
PADDLE_FIRST = '''
import paddle  # before ernie_mtl, as a PALM head's module does: Python's zlib is already loaded (.pth)
import paddlenlp  # noqa: F401  (imports datasets, which decompresses: crashed without the .pth)
import json
from ernie_mtl import palm

config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 12,
          "max_position_embeddings": 32, "sent_type_vocab_size": 2, "hidden_act": "relu",
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02}
reader = palm.reader.ClassifyReader("vocab.txt", 16, seed=1)
reader.load_data("train.tsv", 4)
trainer = palm.Trainer("senti")
loss = trainer.build_forward(palm.backbone.ERNIE.from_config(config), palm.head.Classify(2, 16))
trainer.build_backward(palm.optimizer.Adam(loss, 1e-3))
trainer.fit_reader(reader)
trainer.set_saver("out", save_steps=2)
trainer.configure(device="cpu", num_workers=0)
trainer.train()                                          # trains and saves
predictor = palm.Trainer("senti")
predictor.build_predict_forward(palm.backbone.ERNIE.from_config(config, phase="predict"),
                                palm.head.Classify(2, 16, phase="predict"))
predictor.load_ckpt("out/ckpt.step2")                    # loads
pred_reader = palm.reader.ClassifyReader("vocab.txt", 16, phase="predict")
pred_reader.load_data("train.tsv", 4)
predictor.fit_reader(pred_reader, phase="predict")
order = list(__import__("sys").modules)
print(json.dumps({"predictions": len(predictor.predict()),
                  "paddle_first": order.index("paddle") < order.index("ernie_mtl")}))
'''


def paddle_first_script(folder: Path) -> Path:
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + list("好坏天气很不错"))
                                      + "\n", encoding="utf-8")
    (folder / "train.tsv").write_text("label\ttext_a\n" + "".join(f"{i % 2}\t{'好' if i % 2 else '坏'}天气\n"
                                                                  for i in range(8)), encoding="utf-8")
    (folder / "paddle_first.py").write_text(PADDLE_FIRST, encoding="utf-8")
    return folder / "paddle_first.py"


@pytest.mark.slow
def test_the_wheel_installs_the_zlib_pth_and_a_script_importing_paddle_first_trains_saves_and_loads(installed):
    py, outside = installed
    purelib = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                           text=True).strip())
    assert (purelib / "ernie_mtl_zlib.pth").read_text().splitlines()[-1] == "import zlib"
    record = next(purelib.glob("ernie_mtl-*.dist-info")) / "RECORD"
    assert any(line.startswith("ernie_mtl_zlib.pth,") for line in record.read_text().splitlines())  # uninstalled too
    folder = outside / "paddle_first"
    folder.mkdir()
    result = json.loads(sh([py, paddle_first_script(folder)], cwd=folder).stdout.strip().splitlines()[-1])
    assert result == {"predictions": 8, "paddle_first": True}


def test_the_editable_install_of_the_checkout_has_the_zlib_pth(tmp_path):
    """`pip install -e .` (make install) puts ernie_mtl_zlib.pth in site-packages too (setup.py adds it to the
    editable wheel): a script of the checkout that imports paddle first, then decompresses, does not crash."""
    import ernie_mtl

    if not Path(ernie_mtl.__file__).resolve().is_relative_to(ROOT):
        pytest.skip("ernie_mtl is not this checkout's editable install")
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert (purelib / "ernie_mtl_zlib.pth").is_file(), "reinstall the checkout: pip install -e ."
    record = next(purelib.glob("ernie_mtl-*.dist-info")) / "RECORD"
    assert any(line.startswith("ernie_mtl_zlib.pth,") for line in record.read_text().splitlines())
    proc = subprocess.run([sys.executable, "-c", "import paddle, gzip; print(len(gzip.decompress(gzip.compress("
                                                 "b'x' * 1000))))"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "1000", proc.stderr[-2000:]  # SIGSEGV without the .pth
