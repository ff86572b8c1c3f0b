"""`make demo`'s data step end to end on a capped real corpus."""
import zlib  # noqa: F401
import json

import numpy as np
import pytest

from data_tools import prepare_demo_data
from data_tools.indexed_dataset import MMapIndexedDataset
from ernie_mtl.data.masking import VocabInfo
from ernie_mtl.data.pretrain import PretrainSampleConfig, build_pretrain_datasets


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    rc = prepare_demo_data.main(["--output_dir", str(out), "--max_documents", "400", "--vocab_size", "3000",
                                 "--workers", "1"])
    assert rc == 0
    return out


def test_demo_outputs_exist_and_agree(demo, capsys):
    corpus = MMapIndexedDataset(str(demo / "corpus"))
    assert corpus.num_docs == 400 and corpus.dtype == np.uint16
    vocab = VocabInfo.from_file(demo / "vocab.txt")
    tokens = np.concatenate([corpus[i] for i in range(len(corpus))])
    assert int(tokens.max()) < vocab.size and int(corpus.sizes.sum()) == len(tokens)
    sidecar = json.loads((demo / "corpus.json").read_text())
    assert sidecar["documents"] == 400 and sidecar["vocab_sha1"] == vocab.sha1
    assert not (demo / "index-cache").exists()  # built by the run (or its --prebuild_index), not here
    for task, n_fields in (("sentiment", 2), ("wordseg", 2)):
        for split in ("train", "dev", "test"):
            lines = (demo / "tasks" / task / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
            assert len(lines) > 100 and all(len(line.split("\t")) == n_fields for line in lines)


def test_demo_is_rerunnable_without_rebuilding(demo, capsys):
    assert prepare_demo_data.main(["--output_dir", str(demo), "--max_documents", "400", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "corpus sentence 0" in out and "corpus: 400 documents" in out


def test_a_corpus_tokenized_with_another_vocab_is_refused(demo, tmp_path):
    other = tmp_path / "vocab.txt"
    other.write_text((demo / "vocab.txt").read_text(encoding="utf-8") + "extra\n", encoding="utf-8")
    with pytest.raises(ValueError, match="was tokenized with .*vocab.txt .*sha1"):
        build_pretrain_datasets(str(demo / "corpus"), split="90,5,5", num_samples=(10, 0, 0),
                                cfg=PretrainSampleConfig(max_seq_len=64), vocab=VocabInfo.from_file(other),
                                cache_dir=str(tmp_path / "c"), log=lambda m: None)
