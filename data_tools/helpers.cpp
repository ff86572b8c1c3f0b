// Compiled index helper for data_tools (pybind11). The typed wrapper is data_tools/index.py; the
// executable specification (and test oracle) is data_tools/index_reference.py, whose docstring
// describes every algorithm. This file must produce bit-identical outputs.
//
// Design choices, against the Megatron/PaddleNLP helper this replaces:
// * all counters and token sums are int64 (their int32 sums overflow on big corpora);
// * the GIL is released around every computation (raw pointers are taken first), so index
//   builds can overlap with other Python threads;
// * randomness is a counter-based hash (splitmix64 finaliser), not a sequential generator, so a
//   value depends only on (seed, stream, counter) and NumPy can reproduce it vectorised;
// * results are buffers handed to NumPy through a capsule (no copy on return);
// * bad input raises std::invalid_argument (ValueError) naming the argument and the value.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// Blending compares w*(i+1) - count across datasets; a fused multiply-add would round
// differently from NumPy and could flip ties, so setup.py compiles with -ffp-contract=off.

namespace py = pybind11;

namespace {

// Bump whenever any output of any function changes: it is part of every index-cache key.
constexpr const char* kVersion = "1";

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kStreamShortDecision = 1, kStreamShortTarget = 2, kStreamPairShuffle = 3,
                   kStreamDocShuffle = 4;

inline uint64_t mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}
inline uint64_t stream_key(uint64_t seed, uint64_t stream) { return mix64(seed * kGolden + stream); }
// draw(seed, stream, i) == draw_with_key(stream_key(seed, stream), i)
inline uint64_t draw_with_key(uint64_t key, uint64_t i) { return mix64(key + i * kGolden); }
inline double uniform_from(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

std::string str(int64_t v) { return std::to_string(v); }

void check_seed(uint64_t seed) {
    if (seed > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw std::invalid_argument("seed must be in [0, 2**63), got " + std::to_string(seed));
}

// ---------------------------------------------------------------------------------------------
// Input arrays: exact dtype, 1-D, C-contiguous. No silent conversion here (the wrapper converts).

template <typename T>
bool has_dtype(const py::array& a) {
    const char order = a.dtype().byteorder();
    return a.dtype().normalized_num() == py::dtype::of<T>().normalized_num() &&
           (order == '=' || order == '|');
}

template <typename T>
const T* vector_data(const py::array& a, const char* name, const char* dtype_name) {
    if (!has_dtype<T>(a))
        throw std::invalid_argument(std::string(name) + " must be a native " + dtype_name +
                                    " array, got dtype " + std::string(py::str(a.dtype())) +
                                    " (data_tools.index converts it for you)");
    if (a.ndim() != 1)
        throw std::invalid_argument(std::string(name) + " must be 1-D, got shape with " +
                                    str(a.ndim()) + " dimensions");
    if (!(a.flags() & py::array::c_style))
        throw std::invalid_argument(std::string(name) +
                                    " must be C-contiguous (use np.ascontiguousarray)");
    return static_cast<const T*>(a.data());
}

// Big arrays: 2 MiB-aligned and advised for transparent huge pages, with default-initialised
// elements (no memset before the real write). First-touch page faults of fresh memory dominated
// the profile of a 10M-document build on our VM (kernel page clearing, 4 KiB pages).
constexpr size_t kHugePage = size_t(2) << 20;

template <typename T>
struct BigAllocator {
    using value_type = T;
    BigAllocator() = default;
    template <typename U>
    BigAllocator(const BigAllocator<U>&) {}
    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        void* p = nullptr;
        if (bytes >= 2 * kHugePage) {
            const size_t rounded = (bytes + kHugePage - 1) & ~(kHugePage - 1);
            p = std::aligned_alloc(kHugePage, rounded);
#ifdef MADV_HUGEPAGE
            if (p) madvise(p, rounded, MADV_HUGEPAGE);  // only a hint: failure is harmless
#endif
        } else {
            p = std::malloc(bytes > 0 ? bytes : 1);
        }
        if (!p) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) { std::free(p); }
    template <typename U>
    void construct(U* p) { ::new (static_cast<void*>(p)) U; }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) { ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...); }
    template <typename U>
    bool operator==(const BigAllocator<U>&) const { return true; }
    template <typename U>
    bool operator!=(const BigAllocator<U>&) const { return false; }
};
template <typename T>
using Buffer = std::vector<T, BigAllocator<T>>;

// Hands a heap vector to NumPy without copying: the capsule owns and later deletes it.
template <typename T>
py::array to_numpy(std::unique_ptr<Buffer<T>> v, std::vector<py::ssize_t> shape) {
    T* data = v->data();
    py::capsule owner(v.get(), [](void* p) { delete static_cast<Buffer<T>*>(p); });
    v.release();
    return py::array_t<T>(std::move(shape), data, owner);
}

// ---------------------------------------------------------------------------------------------
// Shuffling. shuffle_order(n, seed, stream) is the stable argsort of the keys
// draw(seed, stream, i), i < n; sorting the pairs (key, i) lexicographically gives exactly that.
// Callers never need the order itself, only rows permuted by it (out[r] = row[order[r]]), so the
// rows travel with their keys through a two-level MSD bucket sort: the keys are uniform, so a
// scatter on the top bits (done as the rows are produced) makes cache-sized buckets, a counting
// sort on the next bits makes buckets of ~1 element, and an insertion sort settles the rare
// collisions. Each step keeps ascending i among equal keys (stability). Memory access is
// sequential or cache-resident, which measured several times faster here than computing the
// order and then gathering rows through it at random (10M rows).

int bits_for(int64_t n) {  // smallest b with 2**b >= n
    int b = 0;
    while (b < 62 && (int64_t(1) << b) < n) ++b;
    return b;
}

template <typename Row>
class Shuffler {
public:
    Shuffler(int64_t n, uint64_t seed, uint64_t stream)
        : key_(stream_key(seed, stream)), items_(static_cast<size_t>(n)) {
        const int total_bits = bits_for(n);
        // 2**10 level-1 buckets keep the scatter's write streams TLB- and cache-friendly; small
        // inputs use one bucket (a plain stable sort).
        b1_ = total_bits <= 12 ? 0 : std::min(10, total_bits - 8);
        bucket_next_.assign(size_t(1) << b1_, 0);
        if (b1_ == 0) return;
        for (int64_t i = 0; i < n; ++i) ++bucket_next_[bucket(draw_with_key(key_, uint64_t(i)))];
        int64_t start = 0;
        for (auto& c : bucket_next_) {
            start += c;
            c = start - c;
        }
    }

    // Rows must be put in ascending i, each once.
    void put(int64_t i, const Row& row) {
        const uint64_t k = draw_with_key(key_, uint64_t(i));
        items_[bucket_next_[bucket(k)]++] = {k, row};
    }

    // Writes the n rows in shuffled order; bucket_next_[b] is now the end of bucket b.
    void finish(Row* out) {
        int64_t begin = 0;
        for (const int64_t end : bucket_next_) {
            sort_bucket(items_.data() + begin, end - begin, out + begin);
            begin = end;
        }
    }

private:
    struct Item {
        uint64_t key;
        Row row;
    };

    size_t bucket(uint64_t k) const { return b1_ == 0 ? 0 : size_t(k >> (64 - b1_)); }

    void sort_bucket(const Item* items, int64_t m, Row* out) {
        const int b2 = std::min(bits_for(m), 64 - b1_);
        const int shift2 = 64 - b1_ - b2;
        const uint64_t mask = b2 == 64 ? ~uint64_t(0) : (uint64_t(1) << b2) - 1;
        count_.assign((size_t(1) << b2) + 1, 0);
        for (int64_t j = 0; j < m; ++j) ++count_[((items[j].key >> shift2) & mask) + 1];
        for (size_t c = 1; c < count_.size(); ++c) count_[c] += count_[c - 1];
        sorted_.resize(size_t(m));
        for (int64_t j = 0; j < m; ++j) sorted_[count_[(items[j].key >> shift2) & mask]++] = items[j];
        // count_[c] is now the end of sub-bucket c: sort each by the full key (stable).
        int64_t sub_begin = 0;
        for (size_t c = 0; c + 1 < count_.size(); ++c) {
            for (int64_t i = sub_begin + 1; i < count_[c]; ++i) {
                const Item v = sorted_[i];
                int64_t j = i;
                for (; j > sub_begin && sorted_[j - 1].key > v.key; --j) sorted_[j] = sorted_[j - 1];
                sorted_[j] = v;
            }
            sub_begin = count_[c];
        }
        for (int64_t j = 0; j < m; ++j) out[j] = sorted_[j].row;
    }

    uint64_t key_;
    int b1_ = 0;
    Buffer<Item> items_;
    std::vector<int64_t> bucket_next_, count_;
    std::vector<Item> sorted_;
};

// ---------------------------------------------------------------------------------------------
// 1. Sentence-pair (BERT/ERNIE) sample mapping.

struct PairParams {
    int64_t num_epochs, max_num_samples, max_seq_len, min_num_sent;
    double short_seq_prob;
    uint64_t seed;
    bool shuffle;
};

// Runs the epochs and calls emit(i, start, end, target) for row i = 0, 1, ... in (epoch, start)
// order. Returns the number of rows. Deterministic, so a counting run and a filling run agree.
// Callers pass num_docs = 0 when no document has min_num_sent sentences: otherwise every epoch
// yields rows, so the epoch loop ends even for a huge num_epochs.
template <typename Emit>
int64_t walk_pairs(const int64_t* doc_idx, int64_t num_docs, const int32_t* sizes,
                   int64_t num_sentences, const PairParams& p, Emit emit) {
    const int64_t m = p.min_num_sent;
    const uint64_t decision_key = stream_key(p.seed, kStreamShortDecision);
    const uint64_t target_key = stream_key(p.seed, kStreamShortTarget);
    const uint64_t target_span = uint64_t(p.max_seq_len - 1);
    int64_t rows = 0;
    if (num_docs == 0) return rows;
    for (int64_t epoch = 0; epoch < p.num_epochs && rows < p.max_num_samples; ++epoch) {
        const uint64_t epoch_base = uint64_t(epoch) * uint64_t(num_sentences);
        for (int64_t d = 0; d < num_docs; ++d) {
            const int64_t last = doc_idx[d + 1];
            for (int64_t start = doc_idx[d]; last - start >= m;) {
                const uint64_t k = epoch_base + uint64_t(start);
                const int64_t target = uniform_from(draw_with_key(decision_key, k)) < p.short_seq_prob
                                           ? 2 + int64_t(draw_with_key(target_key, k) % target_span)
                                           : p.max_seq_len;
                // A sample takes >= m sentences and may end after sentence s only if >= m
                // sentences remain after s: unlike Megatron (`remaining > 1`), we cut only where
                // the rest of the document can still form a valid sample. Otherwise it runs to
                // the end of the document. The running length is int64. Sentences longer than
                // the target are kept (the dataset truncates), unlike Megatron's skip.
                const int64_t first_cut = start + m - 1, last_cut = last - 1 - m;
                int64_t end = last, length = 0, s = start;
                if (first_cut <= last_cut) {
                    for (; s < first_cut; ++s) length += sizes[s];
                    for (; s <= last_cut; ++s) {
                        length += sizes[s];
                        if (length >= target) {
                            end = s + 1;
                            break;
                        }
                    }
                }
                emit(rows++, start, end, target);
                start = end;
                if (end == last) break;
            }
        }
    }
    return rows;
}

template <typename T>
std::unique_ptr<Buffer<T>> pair_mapping(const int64_t* doc_idx, int64_t num_docs,
                                        const int32_t* sizes, int64_t num_sentences,
                                        const PairParams& p) {
    struct Row {
        T start, end, target;
    };
    static_assert(sizeof(Row) == 3 * sizeof(T), "rows must be packed triples");
    // Counting first (the walk is cheap) sizes every buffer exactly: fresh memory is what costs.
    const int64_t n = walk_pairs(doc_idx, num_docs, sizes, num_sentences, p,
                                 [](int64_t, int64_t, int64_t, int64_t) {});
    auto out = std::make_unique<Buffer<T>>(size_t(3 * n));
    Row* rows = reinterpret_cast<Row*>(out->data());
    if (!p.shuffle) {
        walk_pairs(doc_idx, num_docs, sizes, num_sentences, p,
                   [rows](int64_t i, int64_t start, int64_t end, int64_t target) {
                       rows[i] = {T(start), T(end), T(target)};
                   });
        return out;
    }
    Shuffler<Row> shuffler(n, p.seed, kStreamPairShuffle);
    walk_pairs(doc_idx, num_docs, sizes, num_sentences, p,
               [&shuffler](int64_t i, int64_t start, int64_t end, int64_t target) {
                   shuffler.put(i, {T(start), T(end), T(target)});
               });
    shuffler.finish(rows);
    return out;
}

py::array build_sentence_pair_mapping(const py::array& doc_idx_arr, const py::array& sizes_arr,
                                      int64_t num_epochs, int64_t max_num_samples,
                                      int64_t max_seq_len, double short_seq_prob, uint64_t seed,
                                      int64_t min_num_sent, bool shuffle, bool force_int64) {
    const int64_t* doc_idx = vector_data<int64_t>(doc_idx_arr, "doc_idx", "int64");
    const int32_t* sizes = vector_data<int32_t>(sizes_arr, "sizes", "int32");
    const int64_t num_bounds = doc_idx_arr.shape(0), num_sentences = sizes_arr.shape(0);
    if (num_epochs < 1) throw std::invalid_argument("num_epochs must be >= 1, got " + str(num_epochs));
    if (max_num_samples < 0)
        throw std::invalid_argument("max_num_samples must be >= 0, got " + str(max_num_samples));
    if (max_seq_len < 2)
        throw std::invalid_argument("max_seq_len (token budget for A+B) must be >= 2, got " +
                                    str(max_seq_len));
    if (!(short_seq_prob >= 0.0 && short_seq_prob <= 1.0))
        throw std::invalid_argument("short_seq_prob must be in [0, 1], got " +
                                    std::to_string(short_seq_prob));
    if (min_num_sent < 1)
        throw std::invalid_argument("min_num_sent must be >= 1, got " + str(min_num_sent));
    check_seed(seed);
    if (num_bounds < 1)
        throw std::invalid_argument(
            "doc_idx must hold at least one boundary (D documents need D+1 entries), got an empty array");
    const bool int64_out = force_int64 || num_sentences >= (int64_t(1) << 31) ||
                           max_seq_len >= (int64_t(1) << 31);
    const PairParams params{num_epochs, max_num_samples, max_seq_len, min_num_sent,
                            short_seq_prob, seed, shuffle};
    const int64_t num_docs = num_bounds - 1;

    std::unique_ptr<Buffer<int32_t>> rows32;
    std::unique_ptr<Buffer<int64_t>> rows64;
    {
        py::gil_scoped_release release;
        if (doc_idx[0] < 0)
            throw std::invalid_argument("doc_idx[0] must be >= 0 (a sentence index), got " +
                                        str(doc_idx[0]));
        int64_t with_sentences = 0, eligible = 0, longest = 0;
        for (int64_t d = 0; d < num_docs; ++d) {
            const int64_t n = doc_idx[d + 1] - doc_idx[d];
            if (n < 0)
                throw std::invalid_argument(
                    "doc_idx must be non-decreasing (cumulative sentence counts), but doc_idx[" +
                    str(d + 1) + "]=" + str(doc_idx[d + 1]) + " < doc_idx[" + str(d) + "]=" +
                    str(doc_idx[d]) + "; pass the dataset's document index (or a slice of it)");
            with_sentences += n > 0;
            eligible += n >= min_num_sent;
            longest = std::max(longest, n);
        }
        if (doc_idx[num_docs] > num_sentences)
            throw std::invalid_argument("doc_idx[-1]=" + str(doc_idx[num_docs]) +
                                        " exceeds len(sizes)=" + str(num_sentences) +
                                        "; doc_idx and sizes must come from the same dataset");
        int32_t smallest = 0;  // a vectorised min first: the loop below only runs on bad input
        for (int64_t s = doc_idx[0]; s < doc_idx[num_docs]; ++s) smallest = std::min(smallest, sizes[s]);
        for (int64_t s = doc_idx[0]; smallest < 0 && s < doc_idx[num_docs]; ++s)
            if (sizes[s] < 0)
                throw std::invalid_argument(
                    "sizes must be >= 0 (tokens per sentence), but sizes[" + str(s) + "]=" +
                    str(sizes[s]) + "; the .idx file is corrupt or was read with the wrong dtype");
        if (with_sentences > 0 && eligible == 0)
            throw std::invalid_argument(
                "no document has at least min_num_sent=" + str(min_num_sent) +
                " sentences (documents with sentences: " + str(with_sentences) +
                ", longest: " + str(longest) +
                " sentences), so no sentence-pair sample can be built. Split documents into more "
                "sentences, or train without the next-sentence/sentence-order head "
                "(binary_head=False, min_num_sent=1)");
        // eligible == 0 here means an empty split (or only empty documents): no samples.
        const int64_t docs_to_walk = eligible > 0 ? num_docs : 0;
        if (int64_out)
            rows64 = pair_mapping<int64_t>(doc_idx, docs_to_walk, sizes, num_sentences, params);
        else
            rows32 = pair_mapping<int32_t>(doc_idx, docs_to_walk, sizes, num_sentences, params);
    }
    if (int64_out) {
        const py::ssize_t n = py::ssize_t(rows64->size() / 3);
        return to_numpy(std::move(rows64), {n, 3});
    }
    const py::ssize_t n = py::ssize_t(rows32->size() / 3);
    return to_numpy(std::move(rows32), {n, 3});
}

// ---------------------------------------------------------------------------------------------
// 2. Blending: greedy, deterministic; each sample goes to the dataset furthest behind its share.

py::tuple build_blending_indices(const py::array& weights_arr, int64_t size) {
    const double* raw = vector_data<double>(weights_arr, "weights", "float64");
    const int64_t num = weights_arr.shape(0);
    if (num < 1 || num > std::numeric_limits<int16_t>::max())
        throw std::invalid_argument("weights must hold 1 to 32767 datasets, got " + str(num));
    if (size < 0) throw std::invalid_argument("size must be >= 0, got " + str(size));
    auto dataset_index = std::make_unique<Buffer<int16_t>>(size_t(size));
    auto sample_index = std::make_unique<Buffer<int64_t>>(size_t(size));
    {
        py::gil_scoped_release release;
        double total = 0.0;  // left-to-right sum: the reference sums in the same order
        for (int64_t d = 0; d < num; ++d) {
            if (!(raw[d] >= 0.0 && raw[d] <= std::numeric_limits<double>::max()))
                throw std::invalid_argument("weights must be finite and >= 0, but weights[" +
                                            str(d) + "]=" + std::to_string(raw[d]));
            total += raw[d];
        }
        if (!(total > 0.0 && total <= std::numeric_limits<double>::max()))
            throw std::invalid_argument("weights must have a finite sum > 0, got " +
                                        std::to_string(total));
        std::vector<double> w(static_cast<size_t>(num));
        for (int64_t d = 0; d < num; ++d) w[d] = raw[d] / total;
        std::vector<int64_t> counts(static_cast<size_t>(num), 0);
        int16_t* out_d = dataset_index->data();
        int64_t* out_s = sample_index->data();
        for (int64_t i = 0; i < size; ++i) {
            const double due = static_cast<double>(i + 1);
            int64_t best = 0;
            double best_deficit = w[0] * due - static_cast<double>(counts[0]);
            for (int64_t d = 1; d < num; ++d) {
                const double deficit = w[d] * due - static_cast<double>(counts[d]);
                if (deficit > best_deficit) {  // strict: the first dataset wins ties
                    best_deficit = deficit;
                    best = d;
                }
            }
            out_d[i] = static_cast<int16_t>(best);
            out_s[i] = counts[best]++;
        }
    }
    return py::make_tuple(to_numpy(std::move(dataset_index), {py::ssize_t(size)}),
                          to_numpy(std::move(sample_index), {py::ssize_t(size)}));
}

// ---------------------------------------------------------------------------------------------
// 3. GPT-style sample index: row k = (position in doc_idx, token offset) of token k*seq_len.

template <typename OutT, typename SizeT, typename IdxT>
std::unique_ptr<Buffer<OutT>> sample_idx(const SizeT* sizes, int64_t num_sizes,
                                              const IdxT* doc_idx, int64_t num_positions,
                                              int64_t seq_len, int64_t num_samples,
                                              int64_t needed_tokens) {
    auto size_at = [&](int64_t p) -> int64_t {
        const int64_t doc = int64_t(doc_idx[p]);
        if (doc < 0 || doc >= num_sizes)
            throw std::invalid_argument("doc_idx[" + str(p) + "]=" + str(doc) +
                                        " is not a document of sizes (valid: 0.." +
                                        str(num_sizes - 1) + ")");
        const int64_t n = int64_t(sizes[doc]);
        if (n < 0)
            throw std::invalid_argument("sizes must be >= 0 (tokens per document), but sizes[" +
                                        str(doc) + "]=" + str(n));
        return n;
    };
    auto out = std::make_unique<Buffer<OutT>>(size_t(2 * (num_samples + 1)));
    OutT* o = out->data();
    // Invariant: cum = tokens before position pos, cur = tokens of position pos.
    int64_t pos = 0, cum = 0, cur = size_at(0);
    for (int64_t k = 0; k <= num_samples; ++k) {
        const int64_t start = k * seq_len;
        while (pos < num_positions - 1 && cum + cur <= start) {  // also skips empty documents
            cum += cur;
            cur = size_at(++pos);
            // sizes[] is read in doc_idx order, i.e. at random: fetch a few documents ahead.
            if (pos + 16 < num_positions) {
                const int64_t ahead = int64_t(doc_idx[pos + 16]);
                if (ahead >= 0 && ahead < num_sizes) __builtin_prefetch(sizes + ahead);
            }
        }
        o[2 * k] = OutT(pos);
        o[2 * k + 1] = OutT(start - cum);
    }
    int64_t total = cum + cur;  // finish the sum (and the checks) over the unvisited positions
    for (int64_t p = pos + 1; p < num_positions; ++p) total += size_at(p);
    if (total < needed_tokens)
        throw std::invalid_argument("num_epochs * tokens_per_epoch = " + str(needed_tokens) +
                                    " exceeds the tokens in sizes[doc_idx] (" + str(total) +
                                    "); pass tokens_per_epoch = the tokens of one epoch's documents");
    return out;
}

template <typename SizeT, typename IdxT>
py::array sample_idx_typed(const py::array& sizes_arr, const py::array& doc_idx_arr,
                           int64_t seq_len, int64_t num_samples, int64_t needed_tokens,
                           bool force_int64) {
    const SizeT* sizes = static_cast<const SizeT*>(sizes_arr.data());
    const IdxT* doc_idx = static_cast<const IdxT*>(doc_idx_arr.data());
    const int64_t num_sizes = sizes_arr.shape(0), num_positions = doc_idx_arr.shape(0);
    std::unique_ptr<Buffer<int32_t>> out32;
    std::unique_ptr<Buffer<int64_t>> out64;
    {
        py::gil_scoped_release release;
        int64_t max_size = 0;
        if (sizeof(SizeT) > sizeof(int32_t))
            for (int64_t i = 0; i < num_sizes; ++i) max_size = std::max(max_size, int64_t(sizes[i]));
        const bool int64_out =
            force_int64 || num_positions >= (int64_t(1) << 31) || max_size >= (int64_t(1) << 31);
        if (int64_out)
            out64 = sample_idx<int64_t>(sizes, num_sizes, doc_idx, num_positions, seq_len,
                                        num_samples, needed_tokens);
        else
            out32 = sample_idx<int32_t>(sizes, num_sizes, doc_idx, num_positions, seq_len,
                                        num_samples, needed_tokens);
    }
    if (out64) return to_numpy(std::move(out64), {py::ssize_t(num_samples + 1), 2});
    return to_numpy(std::move(out32), {py::ssize_t(num_samples + 1), 2});
}

py::array build_sample_idx(const py::array& sizes, const py::array& doc_idx, int64_t seq_len,
                           int64_t num_epochs, int64_t tokens_per_epoch, int64_t add_extra_token,
                           bool force_int64) {
    const bool sizes64 = has_dtype<int64_t>(sizes);
    const bool idx64 = has_dtype<int64_t>(doc_idx);
    if (sizes64) vector_data<int64_t>(sizes, "sizes", "int64");
    else vector_data<int32_t>(sizes, "sizes", "int32 or int64");
    if (idx64) vector_data<int64_t>(doc_idx, "doc_idx", "int64");
    else vector_data<int32_t>(doc_idx, "doc_idx", "int32 or int64");
    if (seq_len < 1) throw std::invalid_argument("seq_len must be >= 1, got " + str(seq_len));
    if (num_epochs < 1) throw std::invalid_argument("num_epochs must be >= 1, got " + str(num_epochs));
    if (tokens_per_epoch < 0)
        throw std::invalid_argument("tokens_per_epoch must be >= 0, got " + str(tokens_per_epoch));
    if (add_extra_token < 0)
        throw std::invalid_argument("add_extra_token must be >= 0, got " + str(add_extra_token));
    if (doc_idx.shape(0) < 1)
        throw std::invalid_argument("doc_idx is empty: there are no documents to sample from");
    int64_t needed = 0;
    if (__builtin_mul_overflow(num_epochs, tokens_per_epoch, &needed))
        throw std::invalid_argument("num_epochs * tokens_per_epoch overflows int64");
    if (needed < add_extra_token)
        throw std::invalid_argument("num_epochs * tokens_per_epoch = " + str(needed) +
                                    " is smaller than add_extra_token = " + str(add_extra_token) +
                                    ": not enough tokens for one sample");
    const int64_t num_samples = (needed - add_extra_token) / seq_len;
    if (sizes64 && idx64)
        return sample_idx_typed<int64_t, int64_t>(sizes, doc_idx, seq_len, num_samples, needed, force_int64);
    if (sizes64)
        return sample_idx_typed<int64_t, int32_t>(sizes, doc_idx, seq_len, num_samples, needed, force_int64);
    if (idx64)
        return sample_idx_typed<int32_t, int64_t>(sizes, doc_idx, seq_len, num_samples, needed, force_int64);
    return sample_idx_typed<int32_t, int32_t>(sizes, doc_idx, seq_len, num_samples, needed, force_int64);
}

// ---------------------------------------------------------------------------------------------
// 4./5. Document order over epochs and plain shuffle indices.

py::array build_doc_idx(const py::array& documents_arr, int64_t num_epochs, uint64_t seed) {
    const int64_t* documents = vector_data<int64_t>(documents_arr, "documents", "int64");
    const int64_t num = documents_arr.shape(0);
    if (num_epochs < 1) throw std::invalid_argument("num_epochs must be >= 1, got " + str(num_epochs));
    check_seed(seed);
    int64_t total = 0;
    if (__builtin_mul_overflow(num, num_epochs, &total))
        throw std::invalid_argument("len(documents) * num_epochs overflows int64");
    auto out = std::make_unique<Buffer<int64_t>>(size_t(total));
    {
        py::gil_scoped_release release;
        Shuffler<int64_t> shuffler(total, seed, kStreamDocShuffle);
        for (int64_t i = 0, j = 0; i < total; ++i) {  // j = i % num: the tiled input
            shuffler.put(i, documents[j]);
            if (++j == num) j = 0;
        }
        shuffler.finish(out->data());
    }
    return to_numpy(std::move(out), {py::ssize_t(total)});
}

py::array build_shuffle_index(int64_t n, uint64_t seed, uint64_t stream) {
    if (n < 0) throw std::invalid_argument("n must be >= 0, got " + str(n));
    check_seed(seed);
    auto out = std::make_unique<Buffer<int64_t>>(size_t(n));
    {
        py::gil_scoped_release release;
        Shuffler<int64_t> shuffler(n, seed, stream);
        for (int64_t i = 0; i < n; ++i) shuffler.put(i, i);
        shuffler.finish(out->data());
    }
    return to_numpy(std::move(out), {py::ssize_t(n)});
}

}  // namespace

PYBIND11_MODULE(_helpers, m) {
    m.doc() = "ernie-mtl compiled index helper; use it through data_tools.index (typed, validated)";
    m.attr("VERSION") = kVersion;
    m.def("build_sentence_pair_mapping", &build_sentence_pair_mapping, py::arg("doc_idx"),
          py::arg("sizes"), py::kw_only(), py::arg("num_epochs"), py::arg("max_num_samples"),
          py::arg("max_seq_len"), py::arg("short_seq_prob"), py::arg("seed"),
          py::arg("min_num_sent"), py::arg("shuffle") = true, py::arg("_force_int64") = false);
    m.def("build_blending_indices", &build_blending_indices, py::arg("weights"), py::arg("size"));
    m.def("build_sample_idx", &build_sample_idx, py::arg("sizes"), py::arg("doc_idx"), py::kw_only(),
          py::arg("seq_len"), py::arg("num_epochs"), py::arg("tokens_per_epoch"),
          py::arg("add_extra_token") = 1, py::arg("_force_int64") = false);
    m.def("build_doc_idx", &build_doc_idx, py::arg("documents"), py::arg("num_epochs"), py::arg("seed"));
    m.def("build_shuffle_index", &build_shuffle_index, py::arg("n"), py::arg("seed"),
          py::arg("stream") = 5);
}
