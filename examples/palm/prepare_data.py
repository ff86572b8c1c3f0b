"""Tiny data and a tiny "pretrained" ERNIE for the ported PaddlePALM examples, generated (nothing is
downloaded), in the layout PALM's examples expect:

    pretrain/tiny-ernie/ernie_config.json   (in git: 2 layers, hidden 32, ERNIE 1.0's keys)
    pretrain/tiny-ernie/vocab.txt           a small vocabulary: Chinese characters and English words
    pretrain/tiny-ernie/params/             a randomly initialised ERNIE saved as ERNIE 1.0 / PALM save it:
                                            one file per variable, static names (word_embedding, ...)
    classification/data/{train,test}.tsv    label<TAB>text_a          (label 1 iff the text holds 好)
    matching/data/{train,test}.tsv          text_a<TAB>text_b<TAB>label (1 iff both name the same topic)
    tagging/data/{train,test}.tsv, label_map.json   MSRA-NER style, tokens and tags joined by \\x02
    mrc/data/{train,dev}.json               SQuAD-style: who follows 名字是 in the context
    multi-task/data/atis/atis_slot/{train,test}.tsv, label_map.json (130 tags, "PAD": 0 as
        ATIS's; a trailing \\x02 as PALM's process.py writes), multi-task/data/atis/atis_intent/{train,test}.tsv (26 intents)
    predict/data/test.tsv, train_with_eval/data/{train,test}.tsv   the classification files

    python prepare_data.py [--root DIR] [--rows N]      (DIR: default this folder)

The tasks follow simple rules, so a few dozen steps of the tiny model learn something.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import json
import os
import random
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
FILLER = list("的了是在我有他这中大人民日天上下本方们")
NAMES = list("张王李赵刘陈")  # person names (tagging PER, MRC answers)
ORGS = list("司局院")  # the last character of an organisation
PLACES = list("京海省市")  # the last character of a place
MRC_CUE = list("名字是")
CHARS = sorted(set(FILLER + NAMES + ORGS + PLACES + MRC_CUE + list("好坏国家北南东西什么谁")))
WORDS = ["show", "me", "flights", "from", "to", "on", "the", "what", "is", "a", "list", "fare", "cheap",
         "morning", "evening", "please", "i", "want", "need", "about", "how", "much", "does", "cost"]
TOPICS = ["boston", "denver", "dallas", "atlanta", "seattle", "miami", "chicago", "phoenix", "houston", "austin"]
INTENT_WORDS = [f"intent{i}" for i in range(26)]  # intent i is said by its keyword
# 130 tags, laid out as ATIS's label_map.json: "PAD": 0, "O": 1, then B-/I- tags
SLOT_TAGS = ["PAD", "O"] + [f"B-s{i}" for i in range(64)] + [f"I-s{i}" for i in range(64)]


def vocab(size):
    tokens = SPECIALS + CHARS + ["##" + c for c in CHARS] + WORDS + TOPICS + INTENT_WORDS + ["city"]
    if len(tokens) > size:
        raise SystemExit(f"the vocabulary needs {len(tokens)} entries but ernie_config.json says {size}")
    return tokens + [f"[unused{i}]" for i in range(size - len(tokens))]


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def tsv(path, header, rows):
    write(path, "\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))


def classification(rng, n):
    rows = []
    for i in range(n):
        chars = [rng.choice(FILLER) for _ in range(rng.randint(4, 9))]
        label = i % 2
        chars.insert(rng.randint(0, len(chars)), "好" if label else "坏")
        rows.append((label, "".join(chars)))
    return rows


def matching(rng, n):
    rows = []
    for i in range(n):
        a = rng.choice(TOPICS)
        b = a if i % 2 else rng.choice([t for t in TOPICS if t != a])
        text_a = " ".join([rng.choice(WORDS) for _ in range(rng.randint(2, 5))] + [a])
        text_b = " ".join([b] + [rng.choice(WORDS) for _ in range(rng.randint(2, 5))])
        rows.append((text_a, text_b, i % 2))
    return rows


def tagging(rng, n):
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 6)):
            kind = rng.random()
            if kind < 0.2:
                piece, tag = [rng.choice(NAMES), rng.choice(FILLER)], "PER"
            elif kind < 0.35:
                piece, tag = [rng.choice(FILLER), rng.choice(ORGS)], "ORG"
            elif kind < 0.5:
                piece, tag = [rng.choice(FILLER), rng.choice(PLACES)], "LOC"
            else:
                piece, tag = [rng.choice(FILLER)], None
            tokens += piece
            tags += ["O"] if tag is None else [f"B-{tag}"] + [f"I-{tag}"] * (len(piece) - 1)
        rows.append(("\x02".join(tokens), "\x02".join(tags)))
    return rows


def mrc(rng, n, prefix):
    paragraphs = []
    for i in range(n):
        before = "".join(rng.choice(FILLER) for _ in range(rng.randint(3, 12)))
        answer = rng.choice(NAMES) + rng.choice(NAMES)
        after = "".join(rng.choice(FILLER) for _ in range(rng.randint(3, 12)))
        context = before + "名字是" + answer + after
        qa = {"id": f"{prefix}{i}", "question": "名字是什么", "answers": [{"text": answer,
                                                                          "answer_start": len(before) + 3}]}
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "tiny", "data": [{"title": "tiny", "paragraphs": paragraphs}]}


def atis(rng, n):
    slots, intents = [], []
    for _ in range(n):
        intent = rng.randrange(26)
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        words.insert(rng.randint(0, len(words)), INTENT_WORDS[intent])
        tags = ["O"] * len(words)
        k = rng.randrange(len(TOPICS))
        at = rng.randint(0, len(words))
        words[at:at] = [TOPICS[k], "city"]
        tags[at:at] = [f"B-s{k}", f"I-s{k}"]
        # PALM's examples/multi-task/process.py ends every token and every tag with \x02
        slots.append(("".join(w + "\x02" for w in words), "".join(t + "\x02" for t in tags)))
        intents.append((intent, " ".join(words)))
    return slots, intents


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=HERE, help="where the examples' folders are (default: this folder)")
    parser.add_argument("--rows", type=int, default=64, help="training rows per task (test files: half)")
    args = parser.parse_args(argv)
    root, n = args.root, args.rows
    rng = random.Random(0)
    model = os.path.join(root, "pretrain", "tiny-ernie")
    with open(os.path.join(model, "ernie_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    write(os.path.join(model, "vocab.txt"), "\n".join(vocab(config["vocab_size"])) + "\n")
    write_params(os.path.join(model, "params"), config)

    train, test = classification(rng, n), classification(rng, n // 2)
    for example in ("classification", "train_with_eval"):
        tsv(os.path.join(root, example, "data", "train.tsv"), ["label", "text_a"], train)
        tsv(os.path.join(root, example, "data", "test.tsv"), ["label", "text_a"], test)
    tsv(os.path.join(root, "predict", "data", "test.tsv"), ["label", "text_a"], test)
    tsv(os.path.join(root, "matching", "data", "train.tsv"), ["text_a", "text_b", "label"], matching(rng, n))
    tsv(os.path.join(root, "matching", "data", "test.tsv"), ["text_a", "text_b", "label"], matching(rng, n // 2))
    labels = ["B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "O"]  # O = 6, as in MSRA-NER
    write(os.path.join(root, "tagging", "data", "label_map.json"), json.dumps({t: i for i, t in enumerate(labels)}))
    tsv(os.path.join(root, "tagging", "data", "train.tsv"), ["text_a", "label"], tagging(rng, n))
    tsv(os.path.join(root, "tagging", "data", "test.tsv"), ["text_a", "label"], tagging(rng, n // 2))
    write(os.path.join(root, "mrc", "data", "train.json"), json.dumps(mrc(rng, n, "train"), ensure_ascii=False))
    write(os.path.join(root, "mrc", "data", "dev.json"), json.dumps(mrc(rng, n // 4, "dev"), ensure_ascii=False))
    atis_dir = os.path.join(root, "multi-task", "data", "atis")
    write(os.path.join(atis_dir, "atis_slot", "label_map.json"), json.dumps({t: i for i, t in enumerate(SLOT_TAGS)}))
    for split, rows in (("train", n), ("test", n // 2)):
        slots, intents = atis(rng, rows)
        tsv(os.path.join(atis_dir, "atis_slot", f"{split}.tsv"), ["text_a", "label"], slots)
        tsv(os.path.join(atis_dir, "atis_intent", f"{split}.tsv"), ["label", "text_a"], intents)
    print(f"tiny data and model written under {root}")


def write_params(folder, config):
    """A randomly initialised ERNIE (with its pretraining heads) saved under ERNIE 1.0's static names."""
    import paddle

    sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..")))
    from ernie_mtl.program.static_params import to_static_names, write_static_params

    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        paddle.seed(1)
        arch = ErnieConfig(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                           num_hidden_layers=config["num_hidden_layers"],
                           num_attention_heads=config["num_attention_heads"],
                           intermediate_size=4 * config["hidden_size"],
                           max_position_embeddings=config["max_position_embeddings"],
                           type_vocab_size=config["sent_type_vocab_size"], hidden_act=config["hidden_act"])
        state = {k: v.numpy() for k, v in ErnieForPretraining(arch).state_dict().items()}
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    write_static_params(folder, to_static_names(state))


if __name__ == "__main__":
    main()
