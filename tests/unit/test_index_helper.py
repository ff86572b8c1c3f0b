"""The compiled index helper (data_tools.index over data_tools._helpers) against its NumPy
reference (data_tools.index_reference): equal outputs and dtypes on random and edge-case inputs,
properties of the algorithms, the wrapper's error messages, and GIL release."""
import zlib  # noqa: F401  (before anything that may import paddle)
import threading
import time

import numpy as np
import pytest

from data_tools import _helpers, index as H, index_reference as R
from tool_helpers import helpers as tool_helpers  # PaddleNLP's compiled helper: an oracle (pinned in the test extra)

PAIR_DEFAULTS = dict(num_epochs=1, max_num_samples=1, max_seq_len=64, short_seq_prob=0.1, seed=7,
                     min_num_sent=2)


def both_pair(doc_idx, sizes, **kw):
    """Helper and reference pair mappings, asserted identical (values and dtype)."""
    kw = {**PAIR_DEFAULTS, **kw}
    ours = H.build_sentence_pair_mapping(np.asarray(doc_idx, np.int64), np.asarray(sizes, np.int32), **kw)
    ref = R.build_sentence_pair_mapping(np.asarray(doc_idx, np.int64), np.asarray(sizes, np.int32), **kw)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref)
    return ours


def random_corpus(rng, num_docs, max_sent=7, max_len=60, offset=0):
    counts = rng.integers(0, max_sent + 1, size=num_docs)
    doc_idx = np.concatenate([[offset], offset + np.cumsum(counts)]).astype(np.int64)
    sizes = rng.integers(0, max_len, size=int(doc_idx[-1]) + int(rng.integers(0, 3))).astype(np.int32)
    return doc_idx, sizes


def check_rows_tile_documents(rows, doc_idx, sizes, min_num_sent, max_seq_len):
    """Unshuffled single-epoch rows: every document with >= min_num_sent sentences is covered
    exactly, in order; each row has >= min_num_sent sentences; a row ends inside a document only
    when it reached its target; targets are in [2, max_seq_len]."""
    k = 0
    for first, last in zip(doc_idx[:-1], doc_idx[1:]):
        if last - first < min_num_sent:
            continue
        position = first
        while position < last:
            start, end, target = (int(v) for v in rows[k])
            assert start == position and end - start >= min_num_sent and 2 <= target <= max_seq_len
            if end < last:
                assert sizes[start:end].astype(np.int64).sum() >= target
                assert last - end >= min_num_sent
            position, k = end, k + 1
    assert k == len(rows)


# ---------------------------------------------------------------------------------------------
# Random RNG and shuffle primitives


def test_version_constant_matches_compiled_module():
    assert H.HELPER_VERSION == _helpers.VERSION


def test_draw_is_standard_splitmix64():
    # stream_key(0, 0) = mix64(0) = 0, so draw(0, 0, 1) = mix64(GOLDEN): splitmix64's first output
    # for state 0, a published constant.
    assert int(R.draw(0, 0, np.array([1]))[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("n", [0, 1, 2, 17, 4096, 4097, 5000, 100_003])
def test_shuffle_index_equals_reference(n):
    ours = H.build_shuffle_index(n, seed=12345)
    ref = R.build_shuffle_index(n, seed=12345)
    assert ours.dtype == np.int64 and ref.dtype == np.int64
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(np.sort(ours), np.arange(n))


def test_shuffle_index_is_deterministic_and_seed_and_stream_dependent():
    a = H.build_shuffle_index(50_000, seed=1)
    np.testing.assert_array_equal(a, H.build_shuffle_index(50_000, seed=1))
    assert not np.array_equal(a, H.build_shuffle_index(50_000, seed=2))
    assert not np.array_equal(a, H.build_shuffle_index(50_000, seed=1, stream=6))
    # Golden values: if they change, every cached index changes, so HELPER_VERSION must be bumped.
    assert H.build_shuffle_index(8, seed=2024).tolist() == [6, 5, 3, 0, 7, 4, 1, 2]
    assert R.build_shuffle_index(8, seed=2024).tolist() == [6, 5, 3, 0, 7, 4, 1, 2]


@pytest.mark.parametrize("seed", [0, 3, 2 ** 63 - 1])
def test_doc_idx_equals_reference(seed):
    documents = np.array([4, 9, 2, 7, 0, 11], dtype=np.int64)
    ours = H.build_doc_idx(documents, 3, seed)
    ref = R.build_doc_idx(documents, 3, seed)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(np.sort(ours), np.sort(np.tile(documents, 3)))
    big = np.arange(5000, dtype=np.int32) * 2  # any integer dtype is accepted
    np.testing.assert_array_equal(H.build_doc_idx(big, 2, seed), R.build_doc_idx(big, 2, seed))


# ---------------------------------------------------------------------------------------------
# Sentence-pair mapping


@pytest.mark.parametrize("seed", range(6))
def test_pair_mapping_equals_reference_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        doc_idx, sizes = random_corpus(rng, int(rng.integers(0, 50)), offset=int(rng.integers(0, 4)))
        kw = dict(num_epochs=int(rng.integers(1, 4)), max_num_samples=int(rng.integers(0, 80)),
                  max_seq_len=int(rng.integers(2, 160)),
                  short_seq_prob=float(rng.choice([0.0, 0.1, 0.5, 1.0])),
                  seed=int(rng.integers(0, 2 ** 63)), min_num_sent=int(rng.integers(1, 4)),
                  shuffle=bool(rng.integers(0, 2)))
        try:
            ref = R.build_sentence_pair_mapping(doc_idx, sizes, **kw)
        except ValueError as exc:
            with pytest.raises(ValueError, match="no document has at least min_num_sent"):
                H.build_sentence_pair_mapping(doc_idx, sizes, **kw)
            assert "no document has at least min_num_sent" in str(exc)
            continue
        ours = H.build_sentence_pair_mapping(doc_idx, sizes, **kw)
        assert ours.dtype == ref.dtype == np.int32
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("min_num_sent", [1, 2, 3])
def test_pair_rows_tile_eligible_documents(min_num_sent):
    rng = np.random.default_rng(min_num_sent)
    doc_idx, sizes = random_corpus(rng, 300, max_sent=9, max_len=40, offset=3)
    rows = both_pair(doc_idx, sizes, min_num_sent=min_num_sent, max_seq_len=70, short_seq_prob=0.3,
                     shuffle=False)
    check_rows_tile_documents(rows, doc_idx, sizes, min_num_sent, 70)
    shuffled = both_pair(doc_idx, sizes, min_num_sent=min_num_sent, max_seq_len=70, short_seq_prob=0.3)
    np.testing.assert_array_equal(shuffled, rows[R.shuffle_order(len(rows), 7, 3)])


def test_pair_empty_split_and_empty_documents_give_no_rows():
    sizes = np.array([5, 6, 7], np.int32)
    for doc_idx in ([0], [2], [1, 1, 1, 1]):  # no documents; only documents without sentences
        rows = both_pair(doc_idx, sizes, num_epochs=10 ** 9, max_num_samples=10 ** 6)
        assert rows.shape == (0, 3) and rows.dtype == np.int32


def test_pair_zero_length_sentences_and_documents():
    # documents: [], [0-token, 0-token], [], [3 sentences with a 0-token one], [0-token]
    doc_idx = [0, 0, 2, 2, 5, 6]
    sizes = [0, 0, 10, 0, 10, 0]
    rows = both_pair(doc_idx, sizes, max_seq_len=5, short_seq_prob=0.0, min_num_sent=1, shuffle=False)
    # 0-token sentences never reach a target: [0, 2) is one sample, and the 0-token sentence 3
    # joins sentence 4 (10 tokens); the 10-token sentence 2 reaches it alone.
    assert rows[:, :2].tolist() == [[0, 2], [2, 3], [3, 5], [5, 6]]


def test_pair_single_sentence_documents_raise_with_the_fix():
    doc_idx, sizes = [0, 1, 2, 3], [10, 20, 30]
    message = r"no document has at least min_num_sent=2 sentences.*binary_head=False"
    with pytest.raises(ValueError, match=message):
        H.build_sentence_pair_mapping(np.array(doc_idx), np.array(sizes), **PAIR_DEFAULTS)
    with pytest.raises(ValueError, match=message):
        R.build_sentence_pair_mapping(np.array(doc_idx), np.array(sizes), **PAIR_DEFAULTS)
    # the same documents train fine without the pair head
    rows = both_pair(doc_idx, sizes, min_num_sent=1, shuffle=False)
    assert rows[:, :2].tolist() == [[0, 1], [1, 2], [2, 3]]


def test_pair_mixed_single_and_multi_sentence_documents():
    doc_idx = [0, 1, 4, 5, 7]  # 1, 3, 1, 2 sentences
    sizes = [9, 9, 9, 9, 9, 9, 9]
    rows = both_pair(doc_idx, sizes, max_seq_len=10, short_seq_prob=0.0, shuffle=False)
    # single-sentence documents are skipped; the 3-sentence one cannot be cut (a cut after 2
    # sentences would leave 1 < min_num_sent), so it is one sample of 3 sentences
    assert rows.tolist() == [[1, 4, 10], [5, 7, 10]]


def test_pair_sentences_longer_than_the_budget_are_kept():
    doc_idx, sizes = [0, 4], [500, 3, 700, 2]
    rows = both_pair(doc_idx, sizes, max_seq_len=100, short_seq_prob=0.0, min_num_sent=1, shuffle=False)
    assert rows[:, :2].tolist() == [[0, 1], [1, 3], [3, 4]]
    rows = both_pair(doc_idx, sizes, max_seq_len=100, short_seq_prob=0.0, min_num_sent=2, shuffle=False)
    assert rows[:, :2].tolist() == [[0, 2], [2, 4]]


def test_pair_short_seq_prob_zero_and_one():
    rng = np.random.default_rng(11)
    doc_idx, sizes = random_corpus(rng, 400, max_sent=8)
    never = both_pair(doc_idx, sizes, short_seq_prob=0.0, max_seq_len=90)
    assert (never[:, 2] == 90).all()
    always = both_pair(doc_idx, sizes, short_seq_prob=1.0, max_seq_len=90)
    assert always[:, 2].min() >= 2 and always[:, 2].max() <= 90 and len(np.unique(always[:, 2])) > 30
    some = both_pair(doc_idx, sizes, short_seq_prob=0.1, max_seq_len=90)
    assert 0.03 < np.mean(some[:, 2] < 90) < 0.2


def test_pair_epochs_and_max_num_samples_stop_rule():
    rng = np.random.default_rng(5)
    doc_idx, sizes = random_corpus(rng, 60)
    one = len(both_pair(doc_idx, sizes, num_epochs=1, max_num_samples=10 ** 9))
    two = len(both_pair(doc_idx, sizes, num_epochs=2, max_num_samples=10 ** 9))
    assert one > 0 and two > one
    # whole epochs: stop before an epoch once enough rows exist
    assert len(both_pair(doc_idx, sizes, num_epochs=5, max_num_samples=one)) == one
    assert len(both_pair(doc_idx, sizes, num_epochs=5, max_num_samples=one + 1)) == two
    three = both_pair(doc_idx, sizes, num_epochs=3, max_num_samples=10 ** 9, shuffle=False)
    # epoch 0 comes first, unchanged; every epoch starts a sample at each eligible document start
    np.testing.assert_array_equal(three[:one], both_pair(doc_idx, sizes, shuffle=False))
    firsts = doc_idx[:-1][np.diff(doc_idx) >= 2]
    assert (np.bincount(three[:, 0], minlength=len(sizes))[firsts] == 3).all()
    assert len(both_pair(doc_idx, sizes, num_epochs=9, max_num_samples=0)) == 0


def test_pair_doc_idx_slice_not_starting_at_zero():
    rng = np.random.default_rng(8)
    doc_idx, sizes = random_corpus(rng, 200)
    part = doc_idx[70:141]
    rows = both_pair(part, sizes, shuffle=False)
    assert rows[:, 0].min() >= part[0] and rows[:, 1].max() <= part[-1]
    check_rows_tile_documents(rows, part, sizes, 2, PAIR_DEFAULTS["max_seq_len"])


def test_pair_lengths_near_int32_limit_accumulate_in_int64():
    big = 2 ** 31 - 10
    doc_idx, sizes = [0, 4], [big, big, big, big]
    # int32 output; two sentences (2**32 - 20 tokens) pass the 2**31 - 1 target only in int64
    rows = both_pair(doc_idx, sizes, max_seq_len=2 ** 31 - 1, short_seq_prob=0.0, min_num_sent=1,
                     shuffle=False)
    assert rows.dtype == np.int32 and rows[:, :2].tolist() == [[0, 2], [2, 4]]
    # a budget >= 2**31 needs int64 output; three sentences exceed 2**32
    rows = both_pair(doc_idx, sizes, max_seq_len=2 ** 32, short_seq_prob=0.0, min_num_sent=1,
                     shuffle=False)
    assert rows.dtype == np.int64 and rows.tolist() == [[0, 3, 2 ** 32], [3, 4, 2 ** 32]]
    rows = both_pair(doc_idx, sizes, max_seq_len=2 ** 40, short_seq_prob=1.0, min_num_sent=1)
    assert rows.dtype == np.int64


def test_pair_forced_int64_output_has_the_same_values():
    rng = np.random.default_rng(3)
    doc_idx, sizes = random_corpus(rng, 100)
    small = H.build_sentence_pair_mapping(doc_idx, sizes, **PAIR_DEFAULTS)
    wide = H.build_sentence_pair_mapping(doc_idx, sizes, **PAIR_DEFAULTS, _force_int64=True)
    assert small.dtype == np.int32 and wide.dtype == np.int64
    np.testing.assert_array_equal(small, wide)


def test_pair_seed_determinism():
    rng = np.random.default_rng(4)
    doc_idx, sizes = random_corpus(rng, 300)
    a = H.build_sentence_pair_mapping(doc_idx, sizes, **{**PAIR_DEFAULTS, "short_seq_prob": 0.5})
    b = H.build_sentence_pair_mapping(doc_idx, sizes, **{**PAIR_DEFAULTS, "short_seq_prob": 0.5})
    c = H.build_sentence_pair_mapping(doc_idx, sizes, **{**PAIR_DEFAULTS, "short_seq_prob": 0.5, "seed": 8})
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[np.argsort(a[:, 0])], c[np.argsort(c[:, 0])])  # targets differ too


# ---------------------------------------------------------------------------------------------
# Blending


@pytest.mark.parametrize("weights",
                         [[1.0], [0.5, 0.3, 0.2], [3, 1, 0, 7, 2.5], list(np.random.default_rng(0).random(40))])
def test_blending_equals_reference_and_keeps_every_prefix_within_one_sample(weights):
    size = 5000
    ours = H.build_blending_indices(weights, size)
    ref = R.build_blending_indices(np.array(weights, np.float64), size)
    assert ours[0].dtype == np.int16 and ours[1].dtype == np.int64
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    dataset_index, sample_index = ours
    w = np.array(weights, np.float64) / np.sum(weights)
    onehot = np.zeros((size, len(w)), np.int64)
    onehot[np.arange(size), dataset_index] = 1
    counts = np.cumsum(onehot, axis=0)  # counts[n-1, d] = samples of d among the first n
    expected = np.arange(1, size + 1)[:, None] * w[None, :]
    assert np.abs(counts - expected).max() < 1
    for d in range(len(w)):  # each dataset's samples are numbered 0, 1, 2, ... in order
        np.testing.assert_array_equal(sample_index[dataset_index == d], np.arange(counts[-1, d]))


def test_blending_first_index_wins_ties_and_zero_weights_are_never_drawn():
    dataset_index, sample_index = H.build_blending_indices([1, 1, 1], 6)
    assert dataset_index.tolist() == [0, 1, 2, 0, 1, 2]
    assert sample_index.tolist() == [0, 0, 0, 1, 1, 1]
    dataset_index, _ = H.build_blending_indices([0, 2, 0, 1], 3000)
    assert set(dataset_index.tolist()) == {1, 3}
    assert H.build_blending_indices([1.0], 0)[0].shape == (0,)


# ---------------------------------------------------------------------------------------------
# GPT-style sample index


def both_sample_idx(sizes, doc_idx, **kw):
    ours = H.build_sample_idx(sizes, doc_idx, **kw)
    ref = R.build_sample_idx(sizes, doc_idx, **kw)
    assert ours.dtype == ref.dtype
    np.testing.assert_array_equal(ours, ref)
    return ours


@pytest.mark.parametrize("size_dtype,index_dtype", [(np.int32, np.int32), (np.int32, np.int64),
                                                    (np.int64, np.int32), (np.int64, np.int64),
                                                    (np.uint16, np.int16)])
def test_sample_idx_equals_reference_on_random_inputs(size_dtype, index_dtype):
    rng = np.random.default_rng(0)
    for _ in range(60):
        num_docs = int(rng.integers(1, 40))
        sizes = rng.integers(0, 25, size=num_docs).astype(size_dtype)
        epochs = int(rng.integers(1, 4))
        doc_idx = np.concatenate([rng.permutation(num_docs) for _ in range(epochs)]).astype(index_dtype)
        tokens = int(sizes.sum())
        extra = int(rng.integers(0, 2))
        if epochs * tokens < extra:
            continue
        rows = both_sample_idx(sizes, doc_idx, seq_len=int(rng.integers(1, 30)), num_epochs=epochs,
                               tokens_per_epoch=tokens, add_extra_token=extra)
        assert rows.dtype == np.int32


def test_sample_idx_zero_length_documents_and_exact_end():
    sizes = np.array([0, 4, 0, 0, 4, 0], np.int32)
    doc_idx = np.arange(6, dtype=np.int32)
    rows = both_sample_idx(sizes, doc_idx, seq_len=4, num_epochs=1, tokens_per_epoch=8, add_extra_token=0)
    # start 0 -> doc 1; start 4 -> doc 4 (empty docs 2, 3 skipped); start 8 == total -> last position
    assert rows.tolist() == [[1, 0], [4, 0], [5, 0]]
    rows = both_sample_idx(sizes, doc_idx, seq_len=3, num_epochs=1, tokens_per_epoch=8)
    assert rows.tolist() == [[1, 0], [1, 3], [4, 2]]


def test_sample_idx_matches_megatron_tool_helpers_without_empty_documents():
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 300, size=2000).astype(np.int32)
    doc_idx = np.concatenate([rng.permutation(2000), rng.permutation(2000)]).astype(np.int32)
    tokens = int(sizes.sum())
    ours = H.build_sample_idx(sizes, doc_idx, seq_len=128, num_epochs=2, tokens_per_epoch=tokens)
    theirs = tool_helpers.build_sample_idx(sizes, doc_idx, 128, 2, tokens)
    np.testing.assert_array_equal(ours, theirs)


def test_sample_idx_totals_beyond_2_to_the_32():
    sizes = np.full(5, 2_000_000_000, np.int32)  # 1e10 tokens in all
    doc_idx = np.array([3, 1, 4, 0, 2], np.int64)
    rows = both_sample_idx(sizes, doc_idx, seq_len=999_999_937, num_epochs=1, tokens_per_epoch=10 ** 10)
    assert rows.dtype == np.int32 and len(rows) == 11 and rows[-1].tolist() == [4, 1_999_999_370]
    big = np.array([3_000_000_000, 5], np.int64)  # a size >= 2**31 needs int64 output
    rows = both_sample_idx(big, np.array([0, 1]), seq_len=10 ** 9, num_epochs=1, tokens_per_epoch=3 * 10 ** 9)
    assert rows.dtype == np.int64 and rows.tolist() == [[0, 0], [0, 10 ** 9], [0, 2 * 10 ** 9]]


def test_sample_idx_forced_int64_output_has_the_same_values():
    sizes = np.array([5, 7, 3], np.int32)
    small = H.build_sample_idx(sizes, np.array([2, 0, 1]), seq_len=4, num_epochs=1, tokens_per_epoch=15)
    wide = H.build_sample_idx(sizes, np.array([2, 0, 1]), seq_len=4, num_epochs=1, tokens_per_epoch=15,
                              _force_int64=True)
    assert small.dtype == np.int32 and wide.dtype == np.int64
    np.testing.assert_array_equal(small, wide)


# ---------------------------------------------------------------------------------------------
# Wrapper errors (messages name the argument, the value and the fix)

GOOD_DOC_IDX, GOOD_SIZES = np.array([0, 2, 4], np.int64), np.array([5, 5, 5, 5], np.int32)


@pytest.mark.parametrize("doc_idx,sizes,kw,message", [
    (GOOD_DOC_IDX, GOOD_SIZES.astype(np.float64), {}, r"sizes must be an integer array, got dtype float64"),
    (GOOD_DOC_IDX.astype(np.float32), GOOD_SIZES, {}, r"doc_idx must be an integer array"),
    (np.array([[0, 2, 4]]), GOOD_SIZES, {}, r"doc_idx must be 1-D, got shape \(1, 3\)"),
    (np.array([0, 3, 2, 4]), GOOD_SIZES, {}, r"doc_idx must be non-decreasing .*doc_idx\[2\]=2 < doc_idx\[1\]=3"),
    (np.array([-1, 2]), GOOD_SIZES, {}, r"doc_idx\[0\] must be >= 0"),
    (np.array([0, 2, 9]), GOOD_SIZES, {}, r"doc_idx\[-1\]=9 exceeds len\(sizes\)=4"),
    (np.array([], np.int64), GOOD_SIZES, {}, r"doc_idx must hold at least one boundary"),
    (GOOD_DOC_IDX, np.array([5, -3, 5, 5]), {}, r"sizes must be >= 0 .*sizes\[1\]=-3"),
    (GOOD_DOC_IDX, np.array([5, 2 ** 31, 5, 5]), {}, r"sizes holds 2147483648, outside the int32 range"),
    (GOOD_DOC_IDX, GOOD_SIZES, {"max_seq_len": 1}, r"max_seq_len \(token budget for A\+B\) must be in \[2, "),
    (GOOD_DOC_IDX, GOOD_SIZES, {"short_seq_prob": 1.5}, r"short_seq_prob must be a probability in \[0, 1\], got 1.5"),
    (GOOD_DOC_IDX, GOOD_SIZES, {"seed": -1}, r"seed must be in \[0, 9223372036854775807\], got -1"),
    (GOOD_DOC_IDX, GOOD_SIZES, {"seed": 2 ** 63}, r"seed must be in \[0, "),
    (GOOD_DOC_IDX, GOOD_SIZES, {"num_epochs": 0}, r"num_epochs must be in \[1, "),
    (GOOD_DOC_IDX, GOOD_SIZES, {"num_epochs": 2.0},
     r"num_epochs must be an integer, got 2.0 \(float\); pass int\(2.0\)"),
    (GOOD_DOC_IDX, GOOD_SIZES, {"min_num_sent": 0}, r"min_num_sent must be in \[1, "),
    (GOOD_DOC_IDX, GOOD_SIZES, {"max_num_samples": True}, r"max_num_samples must be an integer, got the bool True"),
])
def test_pair_mapping_errors(doc_idx, sizes, kw, message):
    with pytest.raises(ValueError, match=message):
        H.build_sentence_pair_mapping(doc_idx, sizes, **{**PAIR_DEFAULTS, **kw})


def test_integer_dtypes_are_converted_not_refused():
    rows = H.build_sentence_pair_mapping(GOOD_DOC_IDX.astype(np.uint32), GOOD_SIZES.astype(np.int64),
                                         **PAIR_DEFAULTS)
    np.testing.assert_array_equal(rows, H.build_sentence_pair_mapping(GOOD_DOC_IDX, GOOD_SIZES, **PAIR_DEFAULTS))


@pytest.mark.parametrize("weights,size,message", [
    ([], 5, r"weights must be a 1-D list of 1 to 32767 dataset weights, got shape \(0,\)"),
    (np.ones(32768), 5, r"1 to 32767 dataset weights"),
    ([1.0, -0.5], 5, r"weights must be finite and >= 0, but weights\[1\] = -0.5"),
    ([1.0, np.nan], 5, r"weights\[1\] = nan"),
    ([0.0, 0.0], 5, r"weights must not all be zero"),
    (["a", "b"], 5, r"weights must be numbers"),
    ([1.0], -1, r"size must be in \[0, "),
])
def test_blending_errors(weights, size, message):
    with pytest.raises(ValueError, match=message):
        H.build_blending_indices(weights, size)


@pytest.mark.parametrize("sizes,doc_idx,kw,message", [
    (np.array([5, 5]), np.array([0, 1]), {"tokens_per_epoch": 11},
     r"num_epochs \* tokens_per_epoch = 11 exceeds the tokens in sizes\[doc_idx\] \(10\)"),
    (np.array([5, 5]), np.array([0, 2]), {}, r"doc_idx\[1\]=2 is not a document of sizes \(valid: 0..1\)"),
    (np.array([5, -5]), np.array([0, 1]), {}, r"sizes must be >= 0 .*sizes\[1\]=-5"),
    (np.array([5, 5]), np.array([], np.int64), {}, r"doc_idx is empty"),
    (np.array([5.0, 5.0]), np.array([0, 1]), {}, r"sizes must be an integer array"),
    (np.array([5, 5]), np.array([0, 1]), {"seq_len": 0}, r"seq_len must be in \[1, "),
    (np.array([0, 0]), np.array([0, 1]), {"tokens_per_epoch": 0},
     r"num_epochs \* tokens_per_epoch = 0 is smaller than add_extra_token = 1"),
])
def test_sample_idx_errors(sizes, doc_idx, kw, message):
    with pytest.raises(ValueError, match=message):
        H.build_sample_idx(sizes, doc_idx, **{"seq_len": 4, "num_epochs": 1, "tokens_per_epoch": 10, **kw})


def test_shuffle_and_doc_idx_errors():
    with pytest.raises(ValueError, match=r"n must be in \[0, "):
        H.build_shuffle_index(-1, 0)
    with pytest.raises(ValueError, match=r"documents must be an integer array"):
        H.build_doc_idx(np.array([0.5]), 1, 0)
    with pytest.raises(ValueError, match=r"num_epochs must be in \[1, "):
        H.build_doc_idx(np.array([1, 2]), 0, 0)


def test_read_only_inputs_are_accepted_without_copies():
    # caches and datasets hand over read-only memory maps
    doc_idx, sizes = GOOD_DOC_IDX.copy(), GOOD_SIZES.copy()
    doc_idx.setflags(write=False)
    sizes.setflags(write=False)
    expected = H.build_sentence_pair_mapping(GOOD_DOC_IDX, GOOD_SIZES, **PAIR_DEFAULTS)
    np.testing.assert_array_equal(H.build_sentence_pair_mapping(doc_idx, sizes, **PAIR_DEFAULTS), expected)
    assert H.build_sample_idx(sizes, doc_idx[:2], seq_len=3, num_epochs=1, tokens_per_epoch=10).shape == (4, 2)


def test_compiled_module_refuses_unconverted_arrays():
    # Direct callers of _helpers get a ValueError, not a silent copy or a crash.
    with pytest.raises(ValueError, match=r"doc_idx must be a native int64 array, got dtype int32"):
        _helpers.build_sentence_pair_mapping(GOOD_DOC_IDX.astype(np.int32), GOOD_SIZES, num_epochs=1,
                                             max_num_samples=1, max_seq_len=8, short_seq_prob=0.0,
                                             seed=0, min_num_sent=1)
    with pytest.raises(ValueError, match=r"documents must be C-contiguous"):
        _helpers.build_doc_idx(np.arange(10, dtype=np.int64)[::2], 1, 0)


# ---------------------------------------------------------------------------------------------
# GIL release


def test_builds_release_the_gil():
    """While a long build runs in a thread, the main thread keeps executing Python. With the
    GIL held, the main thread would see one gap as long as the whole build."""
    n = 2_000_000
    while True:
        window = {}

        def build():
            window["start"] = time.perf_counter()
            H.build_shuffle_index(n, seed=1)
            window["end"] = time.perf_counter()

        thread = threading.Thread(target=build)
        ticks = []
        thread.start()
        while thread.is_alive():
            ticks.append(time.perf_counter())
        thread.join()
        duration = window["end"] - window["start"]
        if duration >= 0.15 or n >= 32_000_000:
            break
        n *= 2
    inside = [t for t in ticks if window["start"] <= t <= window["end"]]
    gaps = np.diff([window["start"], *inside, window["end"]])
    assert duration >= 0.15, f"the build took only {duration:.3f}s; cannot judge"
    assert gaps.max() < 0.5 * duration, (
        f"main thread stalled {gaps.max():.3f}s of a {duration:.3f}s build: the GIL was held")
