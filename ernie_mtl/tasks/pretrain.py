"""`pretrain`: ERNIE pretraining (masked LM + next-sentence / sentence-order) on a `.bin/.idx` corpus,
as one task type among the others, so pretraining alone is a one-task config.

Samples come from ernie_mtl.data.pretrain (ErniePretrainDataset: sample i is a pure function of
the seed, the corpus split and i, masks included), the head is PaddleNLP's ErniePretrainingHeads /
BertPretrainingHeads with the LM decoder tied to the word embedding (shared with `mlm`, see
ernie_mtl/tasks/mlm.py), the loss ernie_mtl.tasks.mlm.pretraining_losses (MLM + pair loss).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.data.masking import VocabInfo
from ernie_mtl.data.pretrain import SPLIT_NAMES, collate_pretrain, parse_split
from ernie_mtl.tasks.feeds import FeedSpec
from ernie_mtl.tasks.base import Encoded, HeadOutputs, Option, TaskData, TaskSpec, TaskType, register_task_type
from ernie_mtl.tasks.feeds import NSP_FEED
from ernie_mtl.tasks.mlm import (MASKING_OPTIONS, MLM_FEEDS, Sample, build_mlm_head, concat_outputs,
                                 masked_slots_per_example, mlm_dummy_labels, mlm_metrics, mlm_outputs,
                                 sample_config)
from ernie_mtl.data.mixture import build_mixture_datasets
from ernie_mtl.data.mixture import parse_mixture

# task split -> the corpus split it reads (ernie_mtl.data.pretrain.SPLIT_NAMES)
CORPUS_SPLITS = {"train": SPLIT_NAMES[0], "dev": SPLIT_NAMES[1], "test": SPLIT_NAMES[2]}


@register_task_type("pretrain")
class PretrainTask(TaskType):
    """`train_file` is a corpus prefix (`<prefix>.bin/.idx`); train/dev/test are its split ranges."""

    options = {
        **MASKING_OPTIONS,
        "split": Option("949,50,1", "train,valid,test document ratio of the corpus (dev reads valid)"),
        "short_seq_prob": Option(0.1, "probability of a shorter target length for a sample"),
        "binary_head": Option(True, "train the sentence-pair head (pair_task loss) besides masked LM"),
        "pair_task": Option("sop", "'sop' (sentence order: B follows A unless swapped) or 'nsp' (B random "
                                   "half the time)"),
    }
    main_metric = "mlm_acc"
    exportable = False  # predictions need masked positions, not only the backbone inputs
    pretrained_head_prefix = "cls."
    sized_by_run = True
    shuffle_examples = False  # sample i is already a random document span: the stored order is shuffled
    full_dev_eval = False  # the valid split of a corpus is large: evaluate --eval_iters batches of it

    def __init__(self, spec: TaskSpec, ctx):
        super().__init__(spec, ctx)
        o = spec.options
        self.binary_head = bool(o["binary_head"])
        self.cfg = sample_config(spec, ctx.seed, short_seq_prob=float(o["short_seq_prob"]),
                                 binary_head=self.binary_head, pair_task=str(o["pair_task"]))
        try:
            parse_split(str(o["split"]))
        except ValueError as e:
            raise ConfigError([f"task {spec.name!r} (pretrain): {str(e).replace('--split', 'split', 1)}"]) from None
        if not spec.train_file:
            raise ConfigError([f"task {spec.name!r} (pretrain): train_file is not set; give the corpus prefix "
                               "(the path of <prefix>.bin / <prefix>.idx without the extension)"])
        self.vocab = VocabInfo.from_file(ctx.vocab_file)
        self._mixtures: Dict[str, Any] = {}
        self.datasets: Dict[str, Any] = {}  # split -> MixtureDatasets of the latest load

    def mixture(self, split: str):
        """The corpus (or weighted corpus mixture, ernie_mtl/data/mixture.py) that `split` reads."""

        spec = self.spec.file(split) or self.spec.train_file
        key = repr(spec)
        if key not in self._mixtures:
            self._mixtures[key] = parse_mixture(spec, what=f"task {self.spec.name!r} {split}_file",
                                                vocab_file=self.ctx.vocab_file)
        return self._mixtures[key]

    # -- data ----------------------------------------------------------------------------------
    def load(self, split: str) -> TaskData:
        """The corpus split of `split` (dev = valid), from `<split>_file` or else `train_file`.

        Size: `ctx.extra["num_samples"][split]` samples if the trainer set it (whole epochs of the
        split, so possibly more), else one epoch of the split (its natural size).
        """
        if split not in CORPUS_SPLITS:
            raise ConfigError([f"task {self.spec.name!r} (pretrain) has no {split} split: it reads train/dev/test "
                               "from the corpus; use --do_predict with a text task type"])

        mixture = self.mixture(split)
        # None = the split's natural size (one epoch of each corpus)
        wanted = self.ctx.extra.get("num_samples", {}).get(split)
        counts = [wanted if name == CORPUS_SPLITS[split] else 0 for name in SPLIT_NAMES]
        try:
            datasets = build_mixture_datasets(mixture, split=str(self.spec.options["split"]), num_samples=counts,
                                              cfg=self.cfg, vocab=self.vocab, cache_dir=self.ctx.cache_dir,
                                              is_builder=self.ctx.is_builder,
                                              barrier=self.ctx.barrier, log=self.ctx.log)
        except OSError as e:  # the index cache's folder (--data_cache, or index-cache/ beside a corpus) or a corpus
            raise ConfigError([self._os_problem(e, split, mixture)]) from None
        except ValueError as e:  # missing/corrupt corpus, vocab mismatch, empty split
            raise ConfigError([f"task {self.spec.name!r} (pretrain), {split} split of {mixture.spec()}: {e}"]) from None
        self.datasets[split] = datasets
        return TaskData(split, datasets[CORPUS_SPLITS[split]])

    def _os_problem(self, error: OSError, split: str, mixture) -> str:
        """An I/O fault while loading a split, naming what the user controls: --data_cache when the
        failing path is in it, --data_cache as the way out when it is a corpus's index-cache/."""
        from data_tools.cli_utils import describe_os_error

        name = os.path.abspath(str(error.filename)) if error.filename is not None else None
        cache = os.path.abspath(self.ctx.cache_dir) if self.ctx.cache_dir else None
        if name and cache and os.path.commonpath([name, cache]) == cache:
            return f"--data_cache {cache}: cannot write the index cache there ({describe_os_error(error)})"
        if name and not cache and "index-cache" in Path(name).parts:
            return (f"cannot write the index cache beside the corpus ({describe_os_error(error)}); "
                    "pass --data_cache DIR, a folder you can write to")
        return f"task {self.spec.name!r} (pretrain), {split} split of {mixture.spec()}: {describe_os_error(error)}"

    def example_source(self, index: int) -> str:
        """'sample 17 of corpus data/news (sample 40 of the mixture)'."""
        from ernie_mtl.data.mixture import BlendedDataset

        train = self.datasets.get("train")
        dataset = train[CORPUS_SPLITS["train"]] if train is not None else None
        if isinstance(dataset, BlendedDataset) and 0 <= index < len(dataset):
            part = dataset.datasets[dataset.corpus_of(index)]
            return (f"sample {int(dataset.sample_index[index])} of corpus {part.corpus.path_prefix} (sample {index} "
                    "of the mixture)")
        if dataset is not None:
            return f"sample {index} of corpus {dataset.corpus.path_prefix}"
        return super().example_source(index)

    def describe_data(self) -> List[str]:
        """Per corpus of the training data: weight, documents, samples planned and epochs (and, for a
        mixture, the realised count of each corpus)."""
        train = self.datasets.get("train")
        return [f"task {self.spec.name}: {line}" for line in train.describe()] if train is not None else []

    def train_sources(self):
        """Per corpus of the latest training load: samples planned and samples per epoch."""
        train = self.datasets.get("train")
        return train.plan.epoch_counts("train") if train is not None else None

    def data_scalars(self, consumed: int) -> Dict[str, float]:
        train = self.datasets.get("train")
        if train is None or len(train.names) < 2:
            return {}
        return {k.replace("data/", f"data/{self.spec.name}/", 1): v for k, v in train.scalars(consumed).items()}

    def collate(self, features: Sequence[Sample]) -> Dict[str, np.ndarray]:
        batch = collate_pretrain(features, pad_id=self.vocab.pad_id)
        if not self.binary_head:
            del batch["next_sentence_labels"]
        return batch

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        return MLM_FEEDS + ((NSP_FEED,) if self.binary_head else ())

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        labels = mlm_dummy_labels()
        if self.binary_head:  # a valid class: the pair loss is finite (and gated out)
            labels["next_sentence_labels"] = np.zeros((batch_size, 1), dtype=np.int64)
        return labels

    # -- model ---------------------------------------------------------------------------------
    def create_head(self, enc: Encoded) -> Any:
        # the pair classifier exists even without binary_head, so the head converts to
        # ErnieForPretraining's full `cls.*` key set (its weights then stay at their initial values)
        return build_mlm_head(enc, self.ctx.model_type, with_pair_classifier=True)

    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        return mlm_outputs(head, enc, feeds, next_sentence=self.binary_head)

    def head_signature(self) -> Tuple[Any, ...]:
        return (self.name, self.vocab.size, 2)

    # -- evaluation and prediction -------------------------------------------------------------
    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        """mlm_acc, mlm_loss (token-weighted over the evaluated samples) and loss; with the pair head
        also nsp_acc and nsp_loss (per sample), loss = mlm_loss + nsp_loss (the training loss)."""
        metrics = mlm_metrics(outputs)
        metrics["loss"] = metrics["mlm_loss"]
        if self.binary_head:
            pred, label = concat_outputs(outputs, "nsp_pred"), concat_outputs(outputs, "nsp_label")
            metrics["nsp_acc"] = float((pred == label).mean()) if len(label) else 0.0
            nll = concat_outputs(outputs, "nsp_nll")
            metrics["nsp_loss"] = float(nll.mean()) if len(nll) else 0.0
            metrics["loss"] = metrics["mlm_loss"] + metrics["nsp_loss"]
        return metrics

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[Dict[str, Any]]:
        """Per sample: masked positions, original and predicted ids; with binary_head the pair
        label and prediction."""
        pair = concat_outputs(outputs, "nsp_pred") if self.binary_head else None
        records = []
        for i, (sample, predicted) in enumerate(masked_slots_per_example(data, outputs)):
            record = {"index": i, "masked_positions": sample[2].tolist(), "original_ids": sample[3].tolist(),
                      "predicted_ids": predicted.tolist()}
            if pair is not None:
                record.update(pair_label=int(sample[4]), pair_pred=int(pair[i]))
            records.append(record)
        return records
