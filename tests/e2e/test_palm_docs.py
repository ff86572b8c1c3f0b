"""docs/palm_extending.md's worked example, run as it is written (its first Python block): a user-defined
reader, backbone and head trained and used for prediction through `ernie_mtl.palm`, from a script that
imports `paddle` before `ernie_mtl` (the installed `ernie_mtl_zlib.pth` makes that order safe)."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow


def worked_example() -> str:
    text = (ROOT / "docs" / "palm_extending.md").read_text(encoding="utf-8")
    section = text.split("## A worked example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_worked_example_runs_as_written(tmp_path):
    code = worked_example()
    assert code.startswith("import paddle")  # the import order a PALM head has
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    accuracy = float(re.search(r"accuracy: ([0-9.]+)", proc.stdout).group(1))
    assert accuracy >= 0.9, proc.stdout[-2000:]  # the data's rule (a review holds 好) is learnt
    out = tmp_path / "outputs"
    assert os.readlink(out / "ckpt.step24") == "model_24" and os.readlink(out / "ckpt.step48") == "model_48"
    predictions = [json.loads(line) for line in open(out / "predict" / "predictions.json")]
    assert [p["index"] for p in predictions] == list(range(32))
    name_map = json.loads((out / "model_48" / "train_state.json").read_text())["name_map"]
    assert {"heads.sentiment.cls_out_w", "heads.sentiment.cls_out_b", "backbone.bow_embedding",
            "backbone.bow_fc.w_0"} <= set(name_map)  # the user's parameters, under structured names
