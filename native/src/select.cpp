// topk for generated kernels: the indices of the k first elements of one row in torch's order.
#include "select.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace cuvil {
namespace {

// The values as unsigned integers in their order: NaN above every number (all NaNs alike), -0
// equal to +0, as torch compares them. 32 bits for f32 and the narrower integers, 64 for i64.
template <class T>
auto ordered(T v) {
    if constexpr (std::is_floating_point_v<T>) {
        static_assert(sizeof(T) == 4, "only f32 among the floats: f16 and bf16 are widened first");
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        // negatives reversed, above them the positives; written without branches (random signs)
        const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;
        const uint32_t key = v == 0 ? 0x80000000u : bits ^ flip;
        return v != v ? ~uint32_t{0} : key;
    } else if constexpr (sizeof(T) <= 4) {
        return static_cast<uint32_t>(static_cast<int32_t>(v)) ^ 0x80000000u;
    } else {
        return static_cast<uint64_t>(v) ^ (uint64_t{1} << 63);
    }
}

// One element as it is ranked. The greater key comes first, then the lower index; a 32-bit key
// packs with the complement of a 32-bit index into one integer, so that a comparison is one
// compare (the sorts of a whole row are twice as fast).
struct Packed {
    uint64_t bits;
    Packed() = default;
    Packed(uint32_t key, int64_t i) : bits(uint64_t{key} << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(i))) {}
    int64_t index() const { return 0xFFFFFFFFu - static_cast<uint32_t>(bits); }
    bool before(const Packed& o) const { return bits > o.bits; }
};

struct Wide {
    uint64_t key;
    int64_t i;
    Wide(uint64_t key, int64_t i) : key(key), i(i) {}
    int64_t index() const { return i; }
    bool before(const Wide& o) const { return key > o.key || (key == o.key && i < o.i); }
};

// the order of the result, for the standard algorithms (an object, so that they inline it)
struct Before {
    template <class E>
    bool operator()(const E& a, const E& b) const { return a.before(b); }
};
constexpr Before before;

// Whether v may come before the worst value kept so far, w (exactly when it does, but for a NaN,
// which the key then decides): a cheap test on the values themselves that the compiler vectorises.
template <bool largest, class T>
bool may_beat(T v, T w) {
    if constexpr (std::is_floating_point_v<T>) {
        return largest ? ((v > w) | (v != v)) : ((v < w) | (w != w));
    } else {
        return largest ? v > w : v < w;
    }
}

constexpr int64_t CHUNK = 16;   // elements tested together before any is looked at one by one

// kept out of line: inlined into topk's loop, GCC 12 no longer vectorises it
template <bool largest, class T>
[[gnu::noinline]] bool chunk_may_beat(const T* x, T w) {
    int any = 0;
    for (int64_t j = 0; j < CHUNK; ++j) any |= may_beat<largest>(x[j], w);
    return any;
}

template <class E>
void write(const std::vector<E>& ranked, int64_t take, int64_t k, int64_t* out, int64_t out_stride) {
    for (int64_t j = 0; j < take; ++j) out[j * out_stride] = ranked[j].index();
    // k > n only where the shapes were not checked: point the rest at the row's first element
    for (int64_t j = take; j < k; ++j) out[j * out_stride] = 0;
}

// From this many elements a whole-row sort is a radix sort (std::sort's comparisons mispredict:
// 2.3 ms for 32000 floats).
constexpr int64_t RADIX_MIN_ROW = 1024;

// Sorts packed entries by key, the greater first, keeping equal keys in the order they are in
// (by index): stable counting passes over 11-bit digits of the complemented key, least
// significant first.
void radix_sort(std::vector<Packed>& v) {
    constexpr int BITS = 11;
    constexpr uint64_t MASK = (1u << BITS) - 1;
    static thread_local std::vector<Packed> spare;
    spare.resize(v.size());
    for (int shift = 32; shift < 64; shift += BITS) {
        int64_t start[MASK + 2] = {};
        for (const Packed& e : v) ++start[((~e.bits >> shift) & MASK) + 1];
        for (uint64_t d = 1; d <= MASK + 1; ++d) start[d] += start[d - 1];
        for (const Packed& e : v) spare[start[(~e.bits >> shift) & MASK]++] = e;
        v.swap(spare);
    }
}

template <bool largest, class E, class T>
void topk(const T* x, int64_t n, int64_t stride, int64_t k, int64_t* out, int64_t out_stride) {
    // smallest first is largest first over the complemented keys (NaN then last, as torch puts it)
    using Key = decltype(ordered(T{}));
    constexpr Key flip = largest ? 0 : ~Key{0};
    auto entry = [&](int64_t i) { return E(ordered(x[i * stride]) ^ flip, i); };
    const int64_t take = std::min(k, n);
    static thread_local std::vector<E> buffer;
    std::vector<E>& kept = buffer;
    kept.clear();
    if (take * 8 >= n) {            // a large share of the row: sort it (or select, then sort)
        for (int64_t i = 0; i < n; ++i) kept.push_back(entry(i));
        if constexpr (std::is_same_v<E, Packed>) {
            if (n >= RADIX_MIN_ROW) {
                radix_sort(kept);
                return write(kept, take, k, out, out_stride);
            }
        }
        if (take < n) std::nth_element(kept.begin(), kept.begin() + take, kept.end(), before);
        std::sort(kept.begin(), kept.begin() + take, before);
    } else if (take > 0) {          // a heap of the best so far, the worst of them on top
        for (int64_t i = 0; i < take; ++i) kept.push_back(entry(i));
        std::make_heap(kept.begin(), kept.end(), before);
        T worst = x[kept.front().index() * stride];
        auto offer = [&](int64_t i) {
            E e = entry(i);
            if (!e.before(kept.front())) return;
            std::pop_heap(kept.begin(), kept.end(), before);
            kept.back() = e;
            std::push_heap(kept.begin(), kept.end(), before);
            worst = x[kept.front().index() * stride];
        };
        int64_t i = take;
        if (stride == 1) {
            for (; i + CHUNK <= n; i += CHUNK) {
                if (!chunk_may_beat<largest>(x + i, worst)) continue;
                for (int64_t j = i; j < i + CHUNK; ++j) {
                    if (may_beat<largest>(x[j], worst)) offer(j);
                }
            }
        }
        for (; i < n; ++i) {
            if (may_beat<largest>(x[i * stride], worst)) offer(i);
        }
        std::sort(kept.begin(), kept.end(), before);
    }
    write(kept, take, k, out, out_stride);
}

template <bool largest, class T>
void topk_row(const T* x, int64_t n, int64_t stride, int64_t k, int64_t* out, int64_t out_stride) {
    if constexpr (sizeof(ordered(T{})) == 4) {
        if (n <= 0xFFFFFFFF) return topk<largest, Packed>(x, n, stride, k, out, out_stride);
    }
    topk<largest, Wide>(x, n, stride, k, out, out_stride);
}

// torch.topk's own CPU algorithm (ATen's topk_impl_loop), step for step: (value, index) pairs of
// the whole row, std::partial_sort of the first k when k * 64 <= n, else std::nth_element at k - 1
// then (sorted) std::sort of the first k - 1, by a comparator under which equal values (and any
// two NaNs, and -0 with +0) are unordered. Which of equal values these standard algorithms put
// first depends only on their steps, so this gives eager's indices where values tie.
template <bool largest, class T>
void torch_topk(const T* x, int64_t n, int64_t stride, int64_t k, bool sorted, int64_t* out, int64_t out_stride) {
    using E = std::pair<T, int64_t>;
    static thread_local std::vector<E> queue;
    queue.resize(n);
    for (int64_t i = 0; i < n; ++i) queue[i] = E(x[i * stride], i);
    auto nan = [](T v) {
        if constexpr (std::is_floating_point_v<T>) return v != v;
        else return false;
    };
    auto first = [&](const E& a, const E& b) {
        return largest ? (nan(a.first) && !nan(b.first)) || a.first > b.first
                       : (!nan(a.first) && nan(b.first)) || a.first < b.first;
    };
    const int64_t take = std::min(k, n);
    if (take > 0) {
        if (take * 64 <= n) {
            std::partial_sort(queue.begin(), queue.begin() + take, queue.end(), first);
        } else {
            std::nth_element(queue.begin(), queue.begin() + take - 1, queue.end(), first);
            if (sorted) std::sort(queue.begin(), queue.begin() + take - 1, first);
        }
    }
    for (int64_t j = 0; j < take; ++j) out[j * out_stride] = queue[j].second;
    for (int64_t j = take; j < k; ++j) out[j * out_stride] = 0;
}

// torch.kthvalue's CPU algorithm, step for step: the quickselect ATen keeps from TH (Sedgewick's
// partition, a median-of-three pivot) over copies of the row and its indices, selecting the k-th
// smallest (NaN above every number). Its index alone goes out: of equal values, the one eager picks.
template <class T>
void torch_kthvalue(const T* x, int64_t n, int64_t stride, int64_t k, int64_t* out) {
    static thread_local std::vector<T> v;
    static thread_local std::vector<int64_t> at;
    v.resize(n);
    at.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        v[i] = x[i * stride];
        at[i] = i;
    }
    auto above = [](T a, T b) {
        if constexpr (std::is_floating_point_v<T>) return (a != a && b == b) || a > b;
        else return a > b;
    };
    auto swap = [&](int64_t i, int64_t j) {
        std::swap(v[i], v[j]);
        std::swap(at[i], at[j]);
    };
    const int64_t want = k - 1;
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        if (hi == lo + 1) {
            if (above(v[lo], v[hi])) swap(lo, hi);
            break;
        }
        swap((lo + hi) >> 1, lo + 1);
        if (above(v[lo + 1], v[hi])) swap(lo + 1, hi);
        if (above(v[lo], v[hi])) swap(lo, hi);
        if (above(v[lo + 1], v[lo])) swap(lo + 1, lo);
        int64_t i = lo + 1, j = hi;
        const T pivot = v[lo];
        while (true) {
            do ++i; while (above(pivot, v[i]));
            do --j; while (above(v[j], pivot));
            if (j < i) break;
            swap(i, j);
        }
        swap(lo, j);
        if (j <= want) lo = i;
        if (j >= want) hi = j - 1;
    }
    *out = k >= 1 && k <= n ? at[k - 1] : 0;
}

// Whether equal values decide the sorted top k written at out (in index order among them): two
// of them equal (neighbours, being sorted), or the last equal to a value left out.
template <class T>
bool ties_decide(const T* x, int64_t n, int64_t stride, int64_t take, const int64_t* out, int64_t out_stride) {
    auto key = [&](int64_t j) { return ordered(x[out[j * out_stride] * stride]); };
    for (int64_t j = 1; j < take; ++j) {
        if (key(j) == key(j - 1)) return true;
    }
    if (take == 0 || take == n) return false;
    const auto last = key(take - 1);
    int64_t equal = 0;
    for (int64_t i = 0; i < n; ++i) equal += ordered(x[i * stride]) == last;
    return equal > 1;
}

}  // namespace

template <class T>
void row(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out, int64_t out_stride) {
    const T* v = static_cast<const T*>(x);
    const bool largest = mode & CUVIL_TOPK_LARGEST;
    if (mode & CUVIL_TOPK_KTHVALUE) return torch_kthvalue(v, n, stride, k, out);
    if (mode & CUVIL_TOPK_UNSORTED) {       // torch's order is its algorithm's even without ties
        return (largest ? torch_topk<true, T> : torch_topk<false, T>)(v, n, stride, k, false, out, out_stride);
    }
    (largest ? topk_row<true, T> : topk_row<false, T>)(v, n, stride, k, out, out_stride);
    if ((mode & CUVIL_TOPK_TORCH_ORDER) && ties_decide(v, n, stride, std::min(k, n), out, out_stride)) {
        (largest ? torch_topk<true, T> : torch_topk<false, T>)(v, n, stride, k, true, out, out_stride);
    }
}
}  // namespace cuvil

// one C entry per key type (select.h)
#define CUVIL_TOPK(name, T)                                                                              \
    void name(const void* x, int64_t n, int64_t stride, int64_t k, int32_t mode, int64_t* out,            \
              int64_t out_stride) {                                                                      \
        cuvil::row<T>(x, n, stride, k, mode, out, out_stride);                                           \
    }

extern "C" {
CUVIL_TOPK(cuvil_topk_f32, float)
CUVIL_TOPK(cuvil_topk_i64, int64_t)
CUVIL_TOPK(cuvil_topk_i32, int32_t)
CUVIL_TOPK(cuvil_topk_i8, int8_t)
}
