"""A user-defined task type and callback, used from YAML without editing ernie_mtl.

    # global.yaml
    plugins: [regression_task.py]          # relative to the global YAML's folder
    callbacks: [log_best]
    # tasks/score.yaml
    reader: regression
    train_file: score_train.tsv            # header: label<TAB>text_a, label a real number

The task type reads `label<TAB>text_a`, puts a linear head on the pooled [CLS] output, trains with
mean squared error and reports the Pearson correlation (main metric) and the MSE.
"""
from typing import Dict, List, Mapping, Sequence

import numpy as np

from ernie_mtl.engine.callbacks import Callback, register_callback
from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.feeds import FeedSpec
from ernie_mtl.tasks.base import (HeadOutputs, TaskData, TaskType, pad_backbone_inputs, read_tsv,
                                  register_task_type)


@register_task_type("regression")
class RegressionTask(TaskType):
    main_metric = "pearson"

    def load(self, split: str) -> TaskData:
        path = self.spec.file(split)
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        features = []
        for line, row in read_tsv(path, ["text_a"], optional_columns=["label"]):
            try:
                label = float(row["label"]) if "label" in row else 0.0
            except ValueError:
                raise ConfigError([f"{path}:{line}: label {row['label']!r} is not a number"]) from None
            ids = tok.convert_tokens_to_ids(tok.tokenize(row["text_a"]))[: self.spec.max_seq_len - 2]
            features.append(([tok.cls_token_id] + ids + [tok.sep_token_id], label))
        return TaskData(split, features, has_labels=split != "pred")

    def collate(self, features: Sequence) -> Dict[str, np.ndarray]:
        batch = pad_backbone_inputs([f[0] for f in features], [[0] * len(f[0]) for f in features],
                                    pad_id=self.ctx.tokenizer().pad_token_id)
        batch["target"] = np.array([[f[1]] for f in features], dtype=np.float32)
        return batch

    def label_feeds(self):
        return (FeedSpec("target", (-1, 1), "float32", "regression target"),)

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        return {"target": np.zeros((batch_size, 1), dtype=np.float32)}

    def create_head(self, enc):
        import paddle

        return paddle.nn.Linear(enc.config.hidden_size, 1)

    def head_forward(self, head, enc, feeds) -> HeadOutputs:
        import paddle

        score = head(enc.pooled_output)
        loss = paddle.mean(paddle.square(score - feeds["target"]))
        return HeadOutputs(loss=loss, predictions={"score": paddle.reshape(score, [-1])})

    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        pred = np.concatenate(outputs["score"])
        gold = np.array([f[1] for f in data.features], dtype=np.float64)
        pearson = float(np.corrcoef(pred, gold)[0, 1]) if pred.std() > 0 and gold.std() > 0 else 0.0
        return {"pearson": pearson, "mse": float(np.mean((pred - gold) ** 2))}

    def predictions(self, data: TaskData, outputs):
        return [{"index": i, "score": float(s)} for i, s in enumerate(np.concatenate(outputs["score"]))]


@register_callback("log_best")
class LogBest(Callback):
    """Prints each task's best main metric so far after every evaluation."""

    def __init__(self):
        self.best = {}

    def on_evaluate(self, trainer, task, metrics):
        main = trainer.task(task).main_metric
        self.best[task] = max(self.best.get(task, float("-inf")), metrics[main])
        if trainer.is_rank0:
            trainer.log.info(f"log_best: best {main} of {task} so far {self.best[task]:.4f}")

    def state_dict(self):
        return {"best": self.best}

    def load_state_dict(self, state):
        self.best = dict(state.get("best", {}))
