// Sampling on the GPU for rows whose parameters need only temperature, top-k, top-p and min-p (no
// penalties, no alternatives): one 1024-thread block per sampled row, and only the token and its
// log-probability cross to the host. Host half: zig/src/cuda/sampling.zig.
//
// What it computes (the host sampler's filters, engine/sampler.zig, on exact integer weights):
//  - order: logit descending, token id ascending on ties; a token's weight is
//    w = round(2^40 · exp((l − max) / T)), exp in f32, so the top token weighs 2^40 and ties weigh
//    the same;
//  - top-k keeps the first k; top-p the shortest prefix of those whose weight reaches top_p of
//    theirs; min-p the tokens with exp((l − max) / T) >= min_p; the kept set is the shortest of the
//    three prefixes;
//  - the draw: u in [0, 1), taken by the host from the sequence's own generator exactly where the
//    host sampler takes it, picks the kept token whose interval in id order holds u · (kept
//    weight). The distribution is the host sampler's; the token a given u names differs (the host
//    walks the kept tokens in logit order).
// Every sum is an integer sum over a fixed tree, so the same row and u give the same token.
#include <stdint.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

struct LogitsSummary {  // core/logits_summary.zig
    double log_total;
    float max;
    uint32_t argmax;
};

struct SampleJob {  // cuda/sampling.zig Job
    uint32_t row;
    float temperature;
    float top_p;
    int32_t top_k;
    float min_p;
    uint32_t reserved;
    double u;
};

struct SampleChoice {
    uint32_t token;
    float logprob;
};

// Orders floats as unsigned integers (larger logit, larger key); -0 ties with +0.
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t bits = __float_as_uint(v == 0.f ? 0.f : v);
    return (bits >> 31) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

struct Row {
    const float* logits;
    int vocab;
    float max;
    float inverse_temperature;
    __device__ __forceinline__ float probability(float logit) const { return expf((logit - max) * inverse_temperature); }
    __device__ __forceinline__ unsigned long long weight(float logit) const {
        return __float2ull_rn(probability(logit) * 1099511627776.0f);  // 2^40: exact scaling
    }
};

// A prefix of the order: every token with key > key, and the first `quota` tokens (by id) of those
// with key == key. Every token: key 0 (below any logit's), quota 0.
struct Boundary {
    uint32_t key;
    unsigned long long quota;
};

__device__ __forceinline__ bool shorter(Boundary a, Boundary b) {
    return a.key > b.key || (a.key == b.key && a.quota < b.quota);
}

struct Shared {
    unsigned long long warp_values[kWarps];
    uint32_t key_min;
};

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

// The block's total of v (every thread gets it).
__device__ unsigned long long block_sum_u64(unsigned long long v, Shared& s) {
    v = warp_sum_u64(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) s.warp_values[threadIdx.x / 32] = v;
    __syncthreads();
    unsigned long long total = 0;
    for (int w = 0; w < kWarps; ++w) total += s.warp_values[w];
    return total;
}

// Exclusive prefix of v over thread order; *total gets the sum.
__device__ unsigned long long block_scan_u64(unsigned long long v, Shared& s, unsigned long long* total) {
    const int lane = threadIdx.x % 32;
    unsigned long long inclusive = v;
    for (int offset = 1; offset < 32; offset *= 2) {
        const unsigned long long other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    __syncthreads();
    if (lane == 31) s.warp_values[threadIdx.x / 32] = inclusive;
    __syncthreads();
    unsigned long long before = 0, sum = 0;
    for (int w = 0; w < kWarps; ++w) {
        if (w < static_cast<int>(threadIdx.x / 32)) before += s.warp_values[w];
        sum += s.warp_values[w];
    }
    *total = sum;
    return before + inclusive - v;
}

// The amount a token of `key` adds: its weight, or 1 when counting.
template <bool kWeights>
__device__ __forceinline__ unsigned long long amount(const Row& r, uint32_t key) {
    if constexpr (kWeights) return r.weight(key_value(key));
    else return 1ull;
}

// The amount of the tokens inside `within` whose key is at least `floor`.
template <bool kWeights>
__device__ unsigned long long amount_from(const Row& r, Boundary within, uint32_t floor, Shared& s) {
    unsigned long long sum = 0;
    for (int i = threadIdx.x; i < r.vocab; i += kThreads) {
        const uint32_t key = order_key(r.logits[i]);
        if (key > within.key && key >= floor) sum += amount<kWeights>(r, key);
    }
    sum = block_sum_u64(sum, s);
    if (within.quota > 0 && within.key >= floor) sum += within.quota * amount<kWeights>(r, within.key);
    return sum;
}

// The shortest prefix of the tokens inside `within` whose amount reaches `target` (>= 1 and at most
// their total): the boundary key is the largest key k with amount(key >= k) >= target, found bit by
// bit from the top with exact block sums (no atomics: a histogram's shared-memory atomics serialise
// when the logits are flat and every token lands in one bucket).
template <bool kWeights>
__device__ Boundary select_prefix(const Row& r, Boundary within, unsigned long long target, Shared& s) {
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t candidate = prefix | (1u << bit);
        if (amount_from<kWeights>(r, within, candidate, s) >= target) prefix = candidate;
    }
    const unsigned long long above = prefix == 0xFFFFFFFFu ? 0ull : amount_from<kWeights>(r, within, prefix + 1, s);
    const unsigned long long each = amount<kWeights>(r, prefix);
    return {prefix, (target - above + each - 1) / each};
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) tf_sample(const float* __restrict__ logits, const LogitsSummary* __restrict__ summaries,
                                                                 const SampleJob* __restrict__ jobs, SampleChoice* __restrict__ out,
                                                                 int count, int vocab) {
    __shared__ Shared s;
    const int job_index = blockIdx.x;
    if (job_index >= count) return;
    const SampleJob job = jobs[job_index];
    const LogitsSummary summary = summaries[job.row];
    const Row r{logits + static_cast<size_t>(job.row) * vocab, vocab, summary.max, 1.0f / job.temperature};

    Boundary kept{0u, 0ull};  // every token
    if (job.top_k > 0 && job.top_k < vocab) kept = select_prefix<false>(r, kept, static_cast<unsigned long long>(job.top_k), s);
    if (job.top_p < 1.f) {
        const unsigned long long total = amount_from<true>(r, kept, 0u, s);
        unsigned long long target = static_cast<unsigned long long>(ceil(static_cast<double>(job.top_p) * static_cast<double>(total)));
        target = target < 1 ? 1 : (target > total ? total : target);
        const Boundary nucleus = select_prefix<true>(r, kept, target, s);
        if (shorter(nucleus, kept)) kept = nucleus;
    }
    if (job.min_p > 0.f) {
        // Tokens at or above the floor form a prefix (exp is monotone): the lowest key among them, all its ties.
        if (threadIdx.x == 0) s.key_min = 0xFFFFFFFFu;
        __syncthreads();
        uint32_t lowest = 0xFFFFFFFFu;
        for (int i = threadIdx.x; i < vocab; i += kThreads) {
            const float logit = r.logits[i];
            if (r.probability(logit) >= job.min_p) lowest = min(lowest, order_key(logit));
        }
        atomicMin(&s.key_min, lowest);
        __syncthreads();
        const Boundary floor{s.key_min, ~0ull};
        if (shorter(floor, kept)) kept = floor;
    }

    // The draw, in id order: each thread takes a contiguous run of ids.
    const int run = (vocab + kThreads - 1) / kThreads;
    const int first = min(vocab, static_cast<int>(threadIdx.x) * run);
    const int last = min(vocab, first + run);
    unsigned long long ties = 0;
    for (int i = first; i < last; ++i) ties += order_key(r.logits[i]) == kept.key;
    unsigned long long ignored;
    const unsigned long long tie_base = block_scan_u64(ties, s, &ignored);
    unsigned long long tie_rank = tie_base;
    unsigned long long mass = 0;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        const bool tie = key == kept.key;
        if (key > kept.key || (tie && tie_rank < kept.quota)) mass += r.weight(logit);
        tie_rank += tie;
    }
    unsigned long long total;
    const unsigned long long before = block_scan_u64(mass, s, &total);
    unsigned long long target = static_cast<unsigned long long>(job.u * static_cast<double>(total));
    if (target >= total) target = total - 1;  // u < 1; guards the rounding of u · total
    if (target < before || target >= before + mass) return;
    // This thread's run holds the target: walk it again to the token whose interval holds it.
    unsigned long long cumulative = before;
    tie_rank = tie_base;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        const bool tie = key == kept.key;
        const bool member = key > kept.key || (tie && tie_rank < kept.quota);
        tie_rank += tie;
        if (!member) continue;
        cumulative += r.weight(logit);
        if (target < cumulative) {
            out[job_index] = {static_cast<uint32_t>(i), static_cast<float>(static_cast<double>(logit) - summary.log_total)};
            return;
        }
    }
}
