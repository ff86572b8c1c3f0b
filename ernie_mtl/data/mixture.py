"""Weighted corpus mixtures: several `.bin/.idx` corpora blended into one pretraining stream.

Forms accepted for `--input_dir` (and for `train_file` of a `reader: pretrain` task):

* ``data/corpus`` -- one corpus prefix (weight 1): exactly the datasets, samples and caches of
  a single-corpus run (`build_pretrain_datasets`);
* ``"5.0 data/clue 7.0 data/news 12.0 data/wudao"`` -- weight/prefix pairs, PaddleNLP/Megatron
  style (also a YAML list, flat or of ``[weight, prefix]`` pairs); weights need not sum to 1;
* ``data/`` -- a folder: every ``<name>.bin`` + ``<name>.idx`` pair directly inside it, sorted by
  name, each weighted by its size in tokens (the `.bin` size divided by the token width, so equal
  to the `.bin` size whenever the corpora share a dtype). A `.bin` without its `.idx` (or the
  reverse) is refused, not skipped: leaving it out would change the mixture without a word.
  PaddleNLP also takes every corpus of a folder, but in `os.listdir` order and with weight 1.0 each.

How many samples each corpus contributes (N = samples the run needs from a split, w_i the
weights normalised by their left-to-right sum, as the compiled helper normalises them)::

    samples requested from corpus i = ceil(N * w_i * 1.005)          (per split)
    blended dataset length           = N
    blended sample k                 = corpus d[k], its sample s[k]   (d, s = build_blending_indices(w, N))

This is `get_datasets_weights_and_num_samples` of PaddleNLP 2.8.1
(`paddlenlp/data/causal_dataset.py`, and the ERNIE 1.0 `data_tools/dataset_utils.py`) and of
legacy Megatron-LM (`megatron/data/dataset_utils.py`), whose blended dataset has size N.
Newer Megatron-Core (`blended_megatron_dataset_builder._get_size_per_split_per_dataset`) builds
ceil(ceil(N * w_i) * (1 + 0.005)) per corpus and blends sum_i ceil(N * w_i) >= N samples; newer
PaddleNLP adds 20 samples per corpus on top of the 1.005 factor because its blend could run past
a corpus's end. Here that cannot happen: the greedy blend keeps every prefix of n samples within
one sample of w_i * n, so corpus i is asked for at most ceil(N * w_i) <= ceil(N * w_i * 1.005)
samples (checked again when the blend is loaded), and each corpus's sample index holds whole
epochs, usually more. The 0.5% margin is kept so the per-corpus counts are the ones PaddleNLP and
Megatron users know.

Each corpus keeps its own train/valid/test document split (`--split` applied to its documents)
and its own cached sample index (the single-corpus machinery, keyed as before). The blend
arrays are cached with the same protocol (data_tools/index_cache.py) under
``<cache_dir>/mixture<K>-<split>-<key>/``; the key covers the weights, the corpus list in order
with each corpus's file identity and the key of its sample index, the split, N and the helper
version. All caches of a mixture are built by the builder rank before the one barrier every rank
meets (`build_mixture_datasets`), so a rank that fails afterwards leaves nobody waiting.
Blended sample k is a pure function of (seed, k) and the data: the blend is RNG-free
and corpus i's sample j is a pure function of (seed, split, j, i) -- in a mixture the corpus's
position i is part of each sample's random key, so that sample j of two corpora do not share
their masks and sentence-order labels (Megatron and PaddleNLP seed every corpus alike).

Every problem with the mixture text (a weight that is not a positive number, an odd number of
items, a missing or incomplete prefix, a folder without a corpus, corpora tokenized with
different vocabularies, a corpus listed twice) is collected into one ConfigError naming the item,
the value and the fix, by `parse_mixture`, before any process communicates.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from data_tools import index as index_helper
from data_tools.index_cache import by_path, cache_key, load_or_build, reopened
from data_tools.indexed_dataset import IndexedDatasetError, MMapIndexedDataset, file_identity
from ernie_mtl.config import ConfigError
from ernie_mtl.data.pretrain import (SPLIT_NAMES, PretrainSampleConfig, build_pretrain_datasets, index_description,
                                     parse_split, split_document_ranges)

# Over-sampling factor of PaddleNLP's / legacy Megatron's get_datasets_weights_and_num_samples.
OVERSAMPLE = 1.005
# build_blending_indices writes int16 corpus ids.
MAX_CORPORA = 32767
# Documents per call when counting one epoch's samples (bounds the memory of `describe`).
_EPOCH_COUNT_CHUNK_DOCS = 1 << 20

SampleCounts = Sequence[Optional[int]]


# -- what the user asked for ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    """One corpus of a mixture."""

    prefix: str  # absolute path without .bin/.idx
    weight: float  # as given (a folder's corpora: their token counts)
    name: str  # short unique label for logs and metrics: the file name (+ "#<position>" on clashes)


@dataclass(frozen=True)
class Mixture:
    """Corpora and their weights, in the order given (the order is part of the cache key)."""

    corpora: Tuple[Corpus, ...]
    what: str = "--input_dir"  # where it came from, for messages
    notes: Tuple[str, ...] = ()  # things worth logging (e.g. a corpus without its .json sidecar)

    def __len__(self) -> int:
        return len(self.corpora)

    def __iter__(self) -> Iterator[Corpus]:
        return iter(self.corpora)

    @property
    def prefixes(self) -> List[str]:
        return [c.prefix for c in self.corpora]

    @property
    def weights(self) -> List[float]:
        return [c.weight for c in self.corpora]

    @property
    def shares(self) -> List[float]:
        """Weights normalised by their left-to-right sum (what build_blending_indices uses)."""
        total = 0.0
        for w in self.weights:
            total += w
        return [w / total for w in self.weights]

    def corpus_samples(self, total: int) -> List[int]:
        """Samples requested from each corpus for a blend of `total`: ceil(total * share * 1.005)."""
        return [int(math.ceil(total * share * OVERSAMPLE)) for share in self.shares]

    def spec(self) -> Union[str, List[list]]:
        """Canonical form that parse_mixture reads back to the same mixture, for configs and records:
        the absolute prefix of a lone corpus, else [[weight, absolute prefix], ...] (a folder expanded)."""
        if len(self.corpora) == 1:
            return self.corpora[0].prefix
        return [[c.weight, c.prefix] for c in self.corpora]

    def identity(self) -> List[dict]:
        """Corpus list with weights and file identities: for resume checks and run records."""
        return [{"prefix": c.prefix, "weight": c.weight, "data": file_identity(c.prefix)} for c in self.corpora]


def parse_mixture(spec: Union[str, Sequence, os.PathLike], *, what: str = "--input_dir",
                  base_dir: Optional[str] = None, vocab_file: Optional[str] = None) -> Mixture:
    """Read a mixture: one prefix, weight/prefix pairs (a string or a YAML list) or a folder.

    `base_dir`: relative paths are looked up there first, then in the current directory (as the
    multi-task YAML resolves its paths); without it, relative to the current directory.
    `vocab_file`: the run's vocabulary; every corpus whose `.json` sidecar records another one is
    an error. The corpora must also agree with each other.

    Raises ConfigError listing every problem, each naming `what`, the item and the fix.
    """
    problems: List[str] = []
    notes: List[str] = []
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, str) and len(spec.split()) > 1 and _anything_at(_locate(spec.strip(), base_dir)):
        spec = [spec.strip()]  # one path with spaces in it, as a single prefix always was
    tokens = _tokens(spec, what, problems)
    entries: List[Tuple[int, float, str]] = []  # (item number, weight, resolved prefix)
    if tokens is None:
        pass
    elif len(tokens) == 1:
        entries = _single(tokens[0], what, base_dir, problems, notes)
    elif len(tokens) % 2:
        problems.append(f"{what} {_show(spec)} has {len(tokens)} items, an odd number: give weight/prefix pairs "
                        "('5.0 data/clue 7.0 data/news'), one corpus prefix, or one folder of corpora")
    else:
        entries = _pairs(tokens, what, base_dir, problems)
    if len(entries) > MAX_CORPORA:
        problems.append(f"{what} lists {len(entries)} corpora; at most {MAX_CORPORA} can be blended: merge some")
    seen: Dict[str, int] = {}
    for item, _, prefix in entries:
        if prefix in seen:
            problems.append(f"{what} lists corpus {prefix} twice (items {seen[prefix]} and {item}): list it once with "
                            "the summed weight")
        seen.setdefault(prefix, item)
    if not problems:
        _check_vocabs(entries, what, vocab_file, problems, notes)
    if problems:
        raise ConfigError(problems)
    names = [Path(p).name for _, _, p in entries]
    corpora = tuple(Corpus(prefix=p, weight=w, name=n if names.count(n) == 1 else f"{n}#{k + 1}")
                    for k, ((_, w, p), n) in enumerate(zip(entries, names)))
    return Mixture(corpora=corpora, what=what, notes=tuple(notes))


def _show(spec) -> str:
    return repr(spec if isinstance(spec, str) else list(spec))


def _tokens(spec, what: str, problems: List[str]) -> Optional[List[Union[str, float]]]:
    """The items of the spec: strings and (YAML) numbers, pairs flattened."""
    if isinstance(spec, str):
        tokens: List[Union[str, float]] = spec.split()
    elif isinstance(spec, (list, tuple)):
        tokens = []
        for k, item in enumerate(spec):
            if isinstance(item, (list, tuple)) and len(item) == 2:
                tokens.extend(item)
            elif isinstance(item, (list, tuple, dict)) or item is None or isinstance(item, bool):
                problems.append(f"{what} entry {k + 1} {item!r} is neither a weight, a prefix nor a "
                                "[weight, prefix] pair; write e.g. [5.0, data/clue] or 5.0, data/clue")
                return None
            else:
                tokens.append(item)
    else:
        problems.append(f"{what} {spec!r} ({type(spec).__name__}) is not a corpus prefix, a folder or a list of "
                        "weight/prefix pairs; write e.g. data/corpus or '5.0 data/clue 7.0 data/news'")
        return None
    if not tokens:
        problems.append(f"{what} is empty: give a corpus prefix (data/corpus), weight/prefix pairs "
                        "('5.0 data/clue 7.0 data/news') or a folder of corpora")
        return None
    return tokens


def _weight(token) -> Optional[float]:
    """A positive finite number, or None."""
    if isinstance(token, bool):
        return None
    try:
        value = float(token)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _is_number(token) -> bool:
    try:
        float(token)
        return not isinstance(token, bool)
    except (TypeError, ValueError):
        return False


def _locate(path: str, base_dir: Optional[str]) -> str:
    """Absolute path: relative to `base_dir` when it exists there, else to the current directory
    when it exists there, else relative to `base_dir` (or the current directory without one)."""
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return os.path.normpath(path)
    cwd = os.path.abspath(path)
    if base_dir is None:
        return cwd
    first = os.path.normpath(os.path.join(base_dir, path))
    return cwd if not _anything_at(first) and _anything_at(cwd) else first


def _anything_at(path: str) -> bool:
    return any(os.path.exists(path + ext) for ext in ("", ".bin", ".idx"))


def _is_prefix(prefix: str) -> bool:
    return os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")


def _prefix_problem(prefix: str, shown: str) -> Optional[str]:
    """Why `prefix` is not a usable corpus (None if it is one)."""
    if _is_prefix(prefix):
        try:
            MMapIndexedDataset(prefix)
        except (IndexedDatasetError, OSError) as e:
            return f"{shown}: {e}"
        return None
    for ext in (".bin", ".idx"):
        if prefix.endswith(ext) and _is_prefix(prefix[:-len(ext)]):
            return f"{shown} names a file of the corpus; give its prefix without the extension: {prefix[:-len(ext)]}"
    has_bin, has_idx = os.path.isfile(prefix + ".bin"), os.path.isfile(prefix + ".idx")
    if has_bin != has_idx:
        missing = ".idx" if has_bin else ".bin"
        return (f"{shown}: corpus {prefix} is incomplete ({prefix}{missing} is missing): tokenization did not finish; "
                "re-run python -m data_tools.create_pretraining_data with --output_prefix " + prefix)
    if os.path.isdir(prefix):
        return (f"{shown} is a folder; weight/prefix pairs take corpus prefixes (the path of <prefix>.bin/.idx "
                "without the extension). Give the folder alone to mix all its corpora by size")
    return (f"{shown}: no corpus {prefix}.bin/.idx; give the path of a tokenized corpus without its extension "
            "(written by python -m data_tools.create_pretraining_data --output_prefix PREFIX)")


def _single(token, what: str, base_dir: Optional[str], problems: List[str], notes: List[str]):
    if _is_number(token) and not _anything_at(_locate(str(token), base_dir)):
        problems.append(f"{what} {token!r} is a weight without a corpus: give a corpus prefix, a folder, or "
                        "weight/prefix pairs ('5.0 data/clue 7.0 data/news')")
        return []
    path = _locate(str(token), base_dir)
    if not _is_prefix(path) and os.path.isdir(path):
        return _folder(path, what, problems, notes)
    problem = _prefix_problem(path, f"{what} {token!r}")
    if problem:
        problems.append(problem)
        return []
    return [(1, 1.0, path)]


def _folder(folder: str, what: str, problems: List[str], notes: List[str]):
    """Every complete .bin/.idx pair directly in `folder`, by name, weighted by tokens."""
    names = sorted(os.listdir(folder))
    stems = {n[:-4] for n in names if n.endswith((".bin", ".idx")) and not n.startswith(".")}
    entries = []
    incomplete = []
    for stem in sorted(stems):
        prefix = os.path.join(folder, stem)
        if not _is_prefix(prefix):
            incomplete.append(stem + (".bin" if os.path.isfile(prefix + ".bin") else ".idx"))
            continue
        try:
            corpus = MMapIndexedDataset(prefix)
        except (IndexedDatasetError, OSError) as e:
            problems.append(f"{what} {folder}: corpus {stem}: {e}")
            continue
        tokens = os.path.getsize(prefix + ".bin") // corpus.dtype.itemsize
        if tokens == 0:
            problems.append(f"{what} {folder}: corpus {stem} holds no tokens; remove it from the folder")
            continue
        entries.append((len(entries) + 1, float(tokens), prefix))
    if not entries and not problems:
        found = f"it holds {', '.join(incomplete)} without the matching file" if incomplete else \
            f"it holds {len(names)} entries, none a .bin/.idx pair"
        problems.append(f"{what} {folder} is a folder without any complete corpus ({found}); point at a folder of "
                        "<name>.bin + <name>.idx pairs, or give a corpus prefix")
    elif incomplete:  # refused, not skipped: training on the rest would silently change the mixture
        for name in incomplete:
            other = name[:-4] + (".idx" if name.endswith(".bin") else ".bin")
            problems.append(f"{what} {folder}: {os.path.join(folder, name)} has no {other} beside it (an unfinished "
                            f"tokenization or copy); complete the pair, or move {name} out of the folder; the folder's "
                            "corpora are mixed by size, so training on the others would change the mixture silently")
    return entries


def _pairs(tokens, what: str, base_dir: Optional[str], problems: List[str]):
    entries = []
    for k in range(0, len(tokens), 2):
        raw_w, raw_p = tokens[k], tokens[k + 1]
        weight = _weight(raw_w)
        if weight is None:
            if not _is_number(raw_w) and _is_number(raw_p):
                problems.append(f"{what} item {k + 1} {raw_w!r}: a weight comes before its prefix: write "
                                f"'{raw_p} {raw_w}'")
            else:
                problems.append(f"{what} item {k + 1} {raw_w!r} (the weight of {raw_p!r}) is not a positive number: "
                                f"weights must be finite numbers > 0, e.g. '5.0 {raw_p}' (they need not sum to 1)")
        if _is_number(raw_p) and not _is_number(raw_w):
            continue  # swapped pair: reported above
        path = _locate(str(raw_p), base_dir)
        problem = _prefix_problem(path, f"{what} item {k + 2} {raw_p!r}")
        if problem:
            problems.append(problem)
        elif weight is not None:
            entries.append((k + 2, weight, path))
    return entries


SANITY_TOKENS = 1 << 20  # tokens read (from spread-out sentences) to sanity-check a corpus without sidecar
UNK_LIMIT = 0.5  # more than this share of [UNK] ids among them: tokenized with another vocabulary


def _check_unrecorded(item, prefix: str, what: str, vocab_file: Optional[str], problems: List[str],
                      notes: List[str]) -> None:
    """A corpus without its `.json` sidecar (another tool wrote it, or the file was lost): its vocabulary
    cannot be compared, so its ids are sanity-checked against the run's vocab -- every id below the
    vocab size, not mostly [UNK] -- over sentences spread through the corpus, and a warning names the
    missing file."""
    sidecar = prefix + ".json"
    if not vocab_file or not os.path.isfile(vocab_file):
        notes.append(f"warning: {what} item {item}: {sidecar} is missing, so the vocabulary {prefix} was "
                     "tokenized with cannot be checked")
        return
    tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    unk = tokens.index("[UNK]") if "[UNK]" in tokens else None
    try:
        corpus = MMapIndexedDataset(prefix)
    except IndexedDatasetError:
        return  # reported by the dataset itself
    n = len(corpus)
    picked = np.unique(np.linspace(0, n - 1, num=min(n, 2048)).astype(np.int64)) if n else np.zeros(0, np.int64)
    ids, budget = [], SANITY_TOKENS
    for i in picked:
        sentence = corpus[int(i)]
        ids.append(sentence[:budget])
        budget -= len(ids[-1])
        if budget <= 0:
            break
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if len(ids) and int(ids.max()) >= len(tokens):
        problems.append(f"{what} item {item}: {prefix} holds token id {int(ids.max())} but the run's vocab "
                        f"{vocab_file} has {len(tokens)} tokens: the corpus was tokenized with another vocabulary "
                        f"({sidecar} is missing); pass that vocab, or re-tokenize the corpus with this one")
    elif len(ids) and unk is not None and float(np.mean(ids == unk)) > UNK_LIMIT:
        problems.append(f"{what} item {item}: {float(np.mean(ids == unk)):.0%} of the sampled tokens of {prefix} are "
                        f"[UNK] in {vocab_file}: the corpus was tokenized with another vocabulary ({sidecar} is "
                        "missing); pass that vocab, or re-tokenize the corpus with this one")
    else:
        notes.append(f"warning: {what} item {item}: {sidecar} is missing, so the vocabulary of {prefix} cannot be "
                     f"compared with {vocab_file}; its ids passed a sanity check ({len(ids):,} tokens sampled: "
                     f"all below the vocab size {len(tokens)}, few [UNK])")


def _check_vocabs(entries, what: str, vocab_file: Optional[str], problems: List[str],
                  notes: Optional[List[str]] = None) -> None:
    """Token ids only mean something with their vocab: the sidecars must agree (and match the run's
    vocab); a corpus without sidecar is sanity-checked (`_check_unrecorded`)."""
    notes = notes if notes is not None else []
    recorded = []  # (item, prefix, vocab file, sha1)
    for item, _, prefix in entries:
        sidecar = prefix + ".json"
        if not os.path.isfile(sidecar):
            _check_unrecorded(item, prefix, what, vocab_file, problems, notes)
            continue
        try:
            meta = json.loads(Path(sidecar).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            problems.append(f"{what} item {item}: {sidecar} is unreadable ({e}); it is written by "
                            "create_pretraining_data: re-run it, or delete the file to skip the vocab check")
            continue
        if isinstance(meta, dict) and meta.get("vocab_sha1"):
            recorded.append((item, prefix, meta.get("vocab_file", "?"), str(meta["vocab_sha1"])))
    if len({sha for *_, sha in recorded}) > 1:
        listed = "; ".join(f"{p} (item {i}): {vf}, sha1 {sha[:12]}" for i, p, vf, sha in recorded)
        problems.append(f"{what}: the corpora were tokenized with different vocabularies ({listed}); token ids "
                        "only mean something with their vocab: re-tokenize them with one vocab.txt")
        return
    if vocab_file and recorded and os.path.isfile(vocab_file):  # a missing vocab is the caller's error to report
        run_sha = hashlib.sha1(Path(vocab_file).read_bytes()).hexdigest()
        for item, prefix, vf, sha in recorded:
            if sha != run_sha:
                problems.append(f"{what} item {item}: {prefix} was tokenized with {vf} (sha1 {sha[:12]}), but the "
                                f"run's vocab {vocab_file} has sha1 {run_sha[:12]}: pass the vocab the corpus was "
                                "made with, or re-tokenize the corpus with this one")


# -- the plan: what each corpus contributes ---------------------------------------------------------------
@dataclass
class CorpusPlan:
    """One corpus's part of each split."""

    corpus: Corpus
    share: float
    documents: int
    doc_ranges: Dict[str, Tuple[int, int]]
    samples: Dict[str, Optional[int]]  # requested from this corpus (0: split skipped; None: one epoch)
    samples_per_epoch: Dict[str, int] = field(default_factory=dict)  # filled by MixturePlan.count_epochs()


@dataclass
class MixturePlan:
    """Per-corpus sample counts for a run; pure arithmetic over the corpus headers (nothing is built)."""

    mixture: Mixture
    split: str
    num_samples: Tuple[Optional[int], ...]  # blended samples per split (0: skip; None: natural size)
    cfg: PretrainSampleConfig
    corpora: List[CorpusPlan]

    def count_epochs(self) -> None:
        """Samples in one epoch of each corpus split (one pass of the compiled helper per split)."""
        for cp in self.corpora:
            if cp.samples_per_epoch:
                continue
            corpus = MMapIndexedDataset(cp.corpus.prefix)
            for name in SPLIT_NAMES:
                if cp.samples[name] != 0:
                    cp.samples_per_epoch[name] = samples_per_epoch(corpus, cp.doc_ranges[name], self.cfg)

    def epoch_counts(self, split_name: str = "train") -> List[Tuple[str, int, int]]:
        """(corpus name, samples planned, samples per epoch) of every corpus that `split_name` reads
        (what the plan's repeat warnings compare: ernie_mtl/planning/plan.py `corpus_warnings`)."""
        self.count_epochs()
        out = []
        for cp in self.corpora:
            if cp.samples[split_name] == 0:
                continue
            per_epoch = cp.samples_per_epoch.get(split_name, 0)
            planned = per_epoch if cp.samples[split_name] is None else int(cp.samples[split_name])
            out.append((cp.corpus.name, planned, per_epoch))
        return out

    def lines(self, realised: Optional[Mapping] = None) -> List[str]:
        """Human-readable plan: per corpus its weight and share, documents, and per split the documents,
        samples planned and the epochs of its split they take; `realised` = {split: counts per corpus}."""
        self.count_epochs()
        wanted = [(k, name) for k, name in enumerate(SPLIT_NAMES) if self.num_samples[k] != 0]
        sizes = ", ".join(f"{name} {_n(self.num_samples[k])}" for k, name in wanted)
        head = (f"corpus mixture ({self.mixture.what}): "
                f"{len(self.corpora)} corpor{'a' if len(self.corpora) > 1 else 'us'}, "
                f"split {self.split}; blended samples {sizes}; per corpus ceil(N x share x {OVERSAMPLE})"
                if len(self.corpora) > 1 else
                f"corpus ({self.mixture.what}): split {self.split}; samples {sizes}")
        out = [head]
        for cp in self.corpora:
            parts = []
            for _, name in wanted:
                lo, hi = cp.doc_ranges[name]
                per_epoch = cp.samples_per_epoch.get(name, 0)
                planned = cp.samples[name] if cp.samples[name] is not None else per_epoch
                epochs = f"{planned / per_epoch:.2f} epochs" if per_epoch else "no samples per epoch"
                parts.append(f"{name}: {hi - lo:,} docs, {_n(planned)} samples planned ({epochs})")
            out.append(f"  {cp.corpus.name}: weight {cp.corpus.weight:g} (share {cp.share:.2%}), "
                       f"{cp.documents:,} documents | " + " | ".join(parts) + f"  [{cp.corpus.prefix}]")
        for split_name, counts in (realised or {}).items():
            total = int(sum(counts)) or 1
            out.append(f"  realised {split_name}: " + ", ".join(
                f"{cp.corpus.name} {int(c):,} ({int(c) / total:.2%})" for cp, c in zip(self.corpora, counts)))
        out.extend(f"  note: {n}" for n in self.mixture.notes)
        return out


def _n(value: Optional[int]) -> str:
    return "one epoch" if value is None else f"{value:,}"


def plan_mixture(mixture: Mixture, *, split: str, num_samples: SampleCounts,
                 cfg: PretrainSampleConfig) -> MixturePlan:
    """Per-corpus document ranges and sample counts. `num_samples[k]`: blended samples of split k
    (0 = skip it, None = its natural size: one epoch of every corpus, blended as far as the weights
    allow). Raises ConfigError for every split the run needs that is empty in some corpus."""
    counts = tuple(num_samples[k] if k < len(num_samples) else 0 for k in range(len(SPLIT_NAMES)))
    problems = []
    try:
        parse_split(split)
    except ValueError as e:
        raise ConfigError([str(e)]) from None
    for k, n in enumerate(counts):
        if n is not None and (isinstance(n, bool) or int(n) != n or n < 0):
            problems.append(f"num_samples[{k}] ({SPLIT_NAMES[k]}) = {n!r} must be a whole number >= 0 or None")
    _raise(problems)
    single = len(mixture) == 1
    per_corpus = [mixture.corpus_samples(int(n)) if n else None for n in counts]
    plans = []
    for i, (corpus, share) in enumerate(zip(mixture.corpora, mixture.shares)):
        documents = MMapIndexedDataset(corpus.prefix).num_docs
        ranges = split_document_ranges(split, documents)
        samples = {}
        for k, name in enumerate(SPLIT_NAMES):
            n = counts[k]
            samples[name] = 0 if n == 0 else (None if n is None else (int(n) if single else per_corpus[k][i]))
            lo, hi = ranges[name]
            if samples[name] != 0 and hi <= lo:
                problems.append(
                    f"the {name} split of {corpus.prefix} ({mixture.what}) is empty: --split {split} over its "
                    f"{documents} documents gives it 0 documents, but the run needs {name} samples from it. Give "
                    f"{name} a larger ratio, or use more data")
        plans.append(CorpusPlan(corpus=corpus, share=share, documents=documents, doc_ranges=ranges, samples=samples))
    _raise(problems)
    return MixturePlan(mixture=mixture, split=split, num_samples=counts, cfg=cfg, corpora=plans)


def _raise(problems: List[str]) -> None:
    if problems:
        raise ConfigError(problems)


def samples_per_epoch(corpus: MMapIndexedDataset, doc_range: Tuple[int, int], cfg: PretrainSampleConfig) -> int:
    """Rows one epoch of the split's documents gives (what the sample index adds per epoch).

    The helper keys each sample's random target length by its start sentence, so counting the
    first epoch document chunk by document chunk gives the same total as one call, in bounded memory.
    """
    lo, hi = doc_range
    doc_idx = np.asarray(corpus.doc_idx, dtype=np.int64)
    sizes = np.asarray(corpus.sizes, dtype=np.int32)
    total = 0
    for start in range(lo, hi, _EPOCH_COUNT_CHUNK_DOCS):
        end = min(hi, start + _EPOCH_COUNT_CHUNK_DOCS)
        try:
            rows = index_helper.build_sentence_pair_mapping(
                doc_idx[start:end + 1], sizes, num_epochs=1, max_num_samples=1, max_seq_len=cfg.max_seq_len - 3,
                short_seq_prob=cfg.short_seq_prob, seed=cfg.seed, min_num_sent=2 if cfg.binary_head else 1,
                shuffle=False)
        except ValueError:  # no document of this chunk has enough sentences for a pair
            continue
        total += len(rows)
    return total


# -- the datasets -----------------------------------------------------------------------------------------
class BlendedDataset:
    """Samples of one split drawn from several corpora: sample k = corpus `dataset_index[k]`'s sample
    `sample_index[k]`. Same `len` / `[k]` contract as ErniePretrainDataset."""

    def __init__(self, datasets: Sequence, dataset_index: np.ndarray, sample_index: np.ndarray, *,
                 split_name: str, names: Sequence[str], counts: Optional[np.ndarray] = None):
        self.datasets = list(datasets)
        self.dataset_index = dataset_index
        self.sample_index = sample_index
        self.split_name = split_name
        self.names = list(names)
        self._total = None if counts is None else np.asarray(counts, dtype=np.int64)  # of the whole split
        self._counted = (0, np.zeros(len(self.datasets), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getstate__(self):
        """Pickled for a data-loading worker: the blend arrays travel as file names (no copy)."""
        state = dict(self.__dict__)
        state["dataset_index"], state["sample_index"] = by_path(self.dataset_index), by_path(self.sample_index)
        return state

    def __setstate__(self, state):
        state["dataset_index"], state["sample_index"] = (reopened(state["dataset_index"]),
                                                         reopened(state["sample_index"]))
        self.__dict__.update(state)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for the blended {self.split_name} split ({len(self)} samples)")
        return self.datasets[int(self.dataset_index[i])][int(self.sample_index[i])]

    def corpus_of(self, i: int) -> int:
        """Position in the mixture of the corpus sample `i` comes from."""
        return int(self.dataset_index[i])

    def corpus_counts(self, n: Optional[int] = None) -> np.ndarray:
        """Samples of each corpus among the first `n` (default: all); incremental for growing `n`."""
        n = len(self) if n is None else max(0, min(int(n), len(self)))
        if n == len(self) and self._total is not None:
            return self._total.copy()
        done, counts = self._counted
        if n < done:
            done, counts = 0, np.zeros(len(self.datasets), dtype=np.int64)
        counts = counts + np.bincount(np.asarray(self.dataset_index[done:n]), minlength=len(self.datasets))
        self._counted = (n, counts)
        return counts.copy()


class MixtureDatasets(MappingABC):
    """{"train"/"valid"/"test": dataset or None} (like build_pretrain_datasets) plus the plan and the
    per-corpus counts for logs and metrics."""

    def __init__(self, plan: MixturePlan, datasets: Dict[str, Optional[object]]):
        self.plan = plan
        self._datasets = datasets

    def __getitem__(self, split_name: str):
        return self._datasets[split_name]

    def __iter__(self):
        return iter(self._datasets)

    def __len__(self) -> int:
        return len(self._datasets)

    @property
    def names(self) -> List[str]:
        return [cp.corpus.name for cp in self.plan.corpora]

    def corpus_counts(self, split_name: str, n: Optional[int] = None) -> Dict[str, int]:
        """Samples of each corpus among the first `n` samples of a split (default: the whole split)."""
        ds = self._datasets[split_name]
        if ds is None:
            return {name: 0 for name in self.names}
        if isinstance(ds, BlendedDataset):
            return dict(zip(self.names, (int(c) for c in ds.corpus_counts(n))))
        return {self.names[0]: len(ds) if n is None else max(0, min(int(n), len(ds)))}

    def scalars(self, consumed: int, split_name: str = "train") -> Dict[str, float]:
        """VisualDL scalars `data/<split>_samples/<corpus>`: samples of each corpus consumed so far."""
        return {f"data/{split_name}_samples/{name}": float(c)
                for name, c in self.corpus_counts(split_name, consumed).items()}

    def describe(self) -> List[str]:
        """The plan (weight, documents, samples planned, epochs per corpus and split) and, for a
        mixture, the realised count of each corpus in every blended split."""
        realised = {}
        if len(self.plan.corpora) > 1:
            realised = {name: list(self.corpus_counts(name).values()) for name, ds in self._datasets.items()
                        if ds is not None}
        return self.plan.lines(realised)


def blend_description(plan: MixturePlan, split_name: str, size: int) -> dict:
    """Everything that shapes a split's blend arrays, plus the corpus list it pairs with (the cache key)."""
    k = SPLIT_NAMES.index(split_name)
    corpora = []
    for cp in plan.corpora:
        requested = cp.samples[split_name]
        mapping = index_description(cp.corpus.prefix, plan.split, split_name, cp.doc_ranges[split_name],
                                    1 if requested is None else requested, plan.cfg)
        corpora.append({"prefix": cp.corpus.prefix, "weight": cp.corpus.weight, "data": mapping["data"],
                        "num_samples": requested, "mapping_key": cache_key(mapping)})
    return {"kind": "blended_corpus_mixture", "split": plan.split, "split_name": split_name,
            "requested": plan.num_samples[k], "size": int(size), "weights": [c.weight for c in plan.mixture],
            "corpora": corpora, "oversample": OVERSAMPLE, "sample_streams": "corpus position",
            "helper_version": index_helper.HELPER_VERSION}


def build_mixture_datasets(
    mixture: Mixture,
    *,
    split: str,
    num_samples: SampleCounts,
    cfg: PretrainSampleConfig,
    vocab,
    cache_dir: Optional[str] = None,
    is_builder: bool = True,
    barrier: Optional[Callable[[], None]] = None,
    log: Callable[[str], None] = print,
) -> MixtureDatasets:
    """Train/valid/test datasets of a mixture. Every rank calls this; builders build the caches.

    `num_samples[k]`: blended samples split k needs (0 = skip it; None = natural size). A one-corpus
    mixture returns exactly build_pretrain_datasets' datasets (same samples, same cache). Otherwise
    every corpus gets its own split and sample index (ceil(N x share x 1.005) samples, cached under
    `cache_dir`, default `<corpus dir>/index-cache`) and each split a BlendedDataset whose arrays
    come from the compiled build_blending_indices, cached under `cache_dir` (default: the first
    corpus's `index-cache`).

    Protocol (data_tools/index_cache.py): the builder (`is_index_builder(rank, local_rank,
    share_folder)`) builds every cache of the mixture; then every rank calls `barrier` exactly once
    (a builder whose build failed too, so nobody hangs); then the other ranks load the caches,
    or raise IndexCacheError naming the missing folder when the builder failed or their node does
    not see its cache directory. No barrier comes after a rank can fail.
    """
    cfg.validate()
    plan = plan_mixture(mixture, split=split, num_samples=num_samples, cfg=cfg)
    built, build_error = None, None
    if is_builder:
        try:
            built = _assemble(plan, vocab, cache_dir, build=True, log=log)
        except BaseException as exc:  # still meet the other ranks at the barrier below
            build_error = exc
    if barrier is not None:
        barrier()
    if build_error is not None:
        raise build_error
    return built if built is not None else _assemble(plan, vocab, cache_dir, build=False, log=log)


def _assemble(plan: MixturePlan, vocab, cache_dir: Optional[str], *, build: bool, log) -> MixtureDatasets:
    """Open (and with `build`, first build) every cache of the plan; no barrier."""
    mixture, cfg = plan.mixture, plan.cfg
    common = dict(split=plan.split, cfg=cfg, vocab=vocab, cache_dir=cache_dir, is_builder=build, barrier=None,
                  log=log)
    if len(mixture) == 1:
        counts = [1 if n is None else n for n in plan.num_samples]  # None: the first epoch, the natural size
        return MixtureDatasets(plan, build_pretrain_datasets(mixture.prefixes[0], num_samples=counts, **common))
    per_corpus = []
    for i, cp in enumerate(plan.corpora):
        counts = [1 if cp.samples[name] is None else cp.samples[name] for name in SPLIT_NAMES]
        per_corpus.append(build_pretrain_datasets(cp.corpus.prefix, num_samples=counts, sample_stream=i, **common))
    blend_dir = cache_dir or str(Path(mixture.prefixes[0]).resolve().parent / "index-cache")
    names = [c.name for c in mixture]
    datasets: Dict[str, Optional[BlendedDataset]] = {}
    for k, name in enumerate(SPLIT_NAMES):
        if plan.num_samples[k] == 0:
            datasets[name] = None
            continue
        parts = [d[name] for d in per_corpus]
        lengths = [len(part) for part in parts]
        size = plan.num_samples[k]
        if size is None:  # as many as the weights allow without running past any corpus's split
            size = min(int(math.floor(n / share)) for n, share in zip(lengths, mixture.shares))

        def build_blend(size=size):
            dataset_index, sample_index = index_helper.build_blending_indices(np.asarray(mixture.weights), size)
            counts = np.bincount(dataset_index, minlength=len(mixture)).astype(np.int64)
            return {"dataset_index": dataset_index, "sample_index": sample_index, "corpus_counts": counts}

        arrays = load_or_build(blend_dir, f"mixture{len(mixture)}-{name}", blend_description(plan, name, size),
                               build_blend, is_builder=build, barrier=None, log=log)
        short = [f"{names[i]} needs {int(c)} but has {n}"
                 for i, (c, n) in enumerate(zip(arrays["corpus_counts"], lengths)) if c > n]
        if short or len(arrays["dataset_index"]) != size:
            raise ValueError(f"the blended {name} split does not fit its corpora ({'; '.join(short) or 'wrong size'}); "
                             "this is a bug: report it with the run's flags")
        datasets[name] = BlendedDataset(parts, arrays["dataset_index"], arrays["sample_index"], split_name=name,
                                        names=names, counts=arrays["corpus_counts"])
    return MixtureDatasets(plan, datasets)
