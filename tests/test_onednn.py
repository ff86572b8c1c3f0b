"""ernie_mtl.onednn: oneDNN kernels on the exact op types leave training bitwise unchanged; the
attribute really switches kernels (a non-exact type changes the numbers); optimizer ops are skipped."""
import zlib  # noqa: F401  (before paddle)

import numpy as np
import pytest

from ernie_mtl.config import ModelConfig, OptimConfig
from ernie_mtl.onednn import EXACT_ONEDNN_OPS, use_onednn_ops

pytestmark = pytest.mark.usefixtures("static_mode")

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
STEPS = 4


def batch(rng, b=4, seq=16, vocab=1000):
    ids = rng.randint(5, vocab, (b, seq)).astype("int64")
    pos = np.array([i * seq + p for i in range(b) for p in sorted(rng.choice(np.arange(1, seq), 3, replace=False))])
    mask = np.zeros((b, 1, 1, seq), "float32")
    mask[-1, ..., seq - 4:] = -1e4
    return {"input_ids": ids, "segment_ids": (np.arange(seq) >= seq // 2).astype("int64")[None].repeat(b, 0),
            "input_mask": mask, "masked_lm_positions": pos.astype("int64"),
            "masked_lm_labels": ids.reshape(-1)[pos].reshape(-1, 1),
            "next_sentence_labels": rng.randint(0, 2, (b, 1)).astype("int64")}


def train(build_programs, op_types=None):
    """(losses, parameters) after STEPS AdamW + global-norm-clip steps of tiny ERNIE pretraining,
    with oneDNN on `op_types` (None: plain kernels everywhere)."""
    import paddle

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.0, grad_clip=1.0))
    changed = use_onednn_ops(p.main, op_types) if op_types is not None else {}
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    rng = np.random.RandomState(0)
    losses = []
    for _ in range(STEPS):
        (loss,) = exe.run(p.main, feed=batch(rng), fetch_list=[p.loss], scope=scope)
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
        p.lr_scheduler.step()
    params = {n: np.array(scope.find_var(n).get_tensor()) for n in sorted(set(p.name_map.values()))}
    return losses, params, changed


@pytest.fixture(scope="module")
def plain(build_programs):
    return train(build_programs)


def test_exact_ops_train_bitwise_like_the_plain_program(build_programs, plain):
    losses, params, changed = train(build_programs, EXACT_ONEDNN_OPS)
    assert sum(changed.values()) > 20, changed  # the set really covers the network's ops
    assert losses == plain[0]
    assert all(np.array_equal(params[n], plain[1][n]) for n in params)
    assert losses[-1] < losses[0]  # and it trains


def test_the_attribute_switches_kernels(build_programs, plain):
    """Negative control: oneDNN's layer_norm rounds differently, so with it the parameters move off
    the plain program's. Were the attribute ignored, this would be bitwise too and the test above
    would prove nothing."""
    losses, params, changed = train(build_programs, ["layer_norm"])
    assert changed == {"layer_norm": 6}
    assert not all(np.array_equal(params[n], plain[1][n]) for n in params)
    assert max(abs(a - b) for a, b in zip(losses, plain[0])) < 1e-4  # different rounding, same training


def test_optimizer_ops_and_other_types_are_left_alone(build_programs):
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_steps=100, grad_clip=1.0))
    changed = use_onednn_ops(p.main, ["elementwise_mul", "sum", "relu"])
    ops = p.main.global_block().ops
    on = [op for op in ops if op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn")]
    assert {op.type for op in on} <= {"elementwise_mul", "sum", "relu"}
    assert all(not int(op.attr("op_role")) & 2 for op in on)  # no Optimize-role op (clip's mul and sum)
    clip_muls = [op for op in ops if op.type == "elementwise_mul" and int(op.attr("op_role")) & 2]
    assert clip_muls and not any(op.attr("use_mkldnn") for op in clip_muls if op.desc.has_attr("use_mkldnn"))
    assert changed["relu"] == 3  # two encoder layers and the LM head transform
    assert changed == {t: sum(op.type == t for op in on) for t in changed}


def test_multitask_heads_train_bitwise_with_exact_ops(tmp_path):
    """The multi-task forward (gated losses, classification and CRF heads) through the task harness."""
    import json

    from ernie_mtl.tasks.base import TaskContext, TaskSpec
    from ernie_mtl.tasks.classification import ClassificationTask
    from ernie_mtl.tasks.seq_label import SeqLabelTask
    from task_harness import TaskHarness

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] +
                                                  [f"t{i}" for i in range(95)]) + "\n")
    (tmp_path / "tags.json").write_text(json.dumps({"B": 0, "I": 1, "O": 2}))
    ctx = TaskContext(vocab_file=str(tmp_path / "vocab.txt"), seed=1, log=lambda s: None)

    def make(cls, name, index, **options):
        opts = {k: o.default for k, o in cls.options.items()}
        opts.update(options, dropout=0.0)
        return cls(TaskSpec(name=name, reader=cls.name, index=index, max_seq_len=16, options=opts), ctx)

    rng = np.random.RandomState(3)
    ids = rng.randint(5, 100, (4, 16)).astype("int64")
    batches = [
        {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.zeros((4, 1, 1, 16), "float32"),
         "label": rng.randint(0, 2, 4).astype("int64")},
        {"input_ids": ids[::-1].copy(), "segment_ids": np.zeros_like(ids),
         "input_mask": np.zeros((4, 1, 1, 16), "float32"), "labels": rng.randint(0, 3, (4, 16)).astype("int64"),
         "label_weights": np.ones((4, 16), "float32")},
    ]

    def run(onednn):
        tasks = [make(ClassificationTask, "cls", 0, n_classes=2),
                 make(SeqLabelTask, "tag", 1, label_map=str(tmp_path / "tags.json"), use_crf=True)]
        h = TaskHarness(tasks, vocab_size=100)
        changed = use_onednn_ops(h.main) if onednn else {}
        losses = [h.train(i % 2, [batches[i % 2]], steps=1)[0] for i in range(6)]
        return losses, {p.name: h.param(p.name) for p in h.main.global_block().all_parameters()}, changed

    plain_losses, plain_params, _ = run(False)
    losses, params, changed = run(True)
    assert sum(changed.values()) > 20
    assert losses == plain_losses
    assert all(np.array_equal(params[n], plain_params[n]) for n in params)
