// Sampling on the GPU for rows whose parameters need only temperature, top-k, top-p and min-p (no
// penalties, no alternatives): only the token and its log-probability cross to the host. Host half:
// zig/src/cuda/sampling.zig.
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
//
// How: a row is cut into spans of kSpan tokens, a block each, so a 151552-token row keeps 37 SMs
// busy rather than one. A cut-off (top-k's, top-p's) is the largest order key whose prefix reaches
// the target, found a digit at a time (11 + 11 + 10 bits of the key): one launch per digit, whose
// blocks add their tokens' amounts into the job's histogram and whose last block to finish picks
// the digit and clears the histogram. The draw is one launch whose blocks total their spans and
// whose last block walks the span that holds the target. Every sum is an integer sum, so atomics
// in any order give the same bits: the same row and u give the same token.
#include <stdint.h>
#include "grid_dependency.cuh"
#include "last_block.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSpan = 4096;                // tokens per block (sampling.zig span)
constexpr int kRun = kSpan / kThreads;     // consecutive tokens per thread
constexpr int kBins = 2048;                // the widest digit, 11 bits
constexpr int kLevels = 3;
constexpr int kPhaseTopK = 0;  // else top-p

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

// A prefix of the order: every token with key > key, and the first `quota` tokens (by id) of those
// with key == key. Every token: key 0 (below any logit's), quota 0.
struct Boundary {
    uint32_t key;
    uint32_t reserved;
    unsigned long long quota;
};

// A job's state between launches (sampling.zig State): zero at rest, and left so by each call.
struct State {
    Boundary top_k;               // written by top-k's last digit
    Boundary top_p;               // written by top-p's last digit
    unsigned long long above;     // amount above the digits chosen so far
    unsigned long long target;    // the amount the cut-off must reach
    uint32_t prefix;              // the digits chosen so far
    uint32_t counter;             // blocks of this launch done (the last resets it)
    uint32_t floor_not;           // ~(lowest key with probability >= min_p); 0: none yet
    uint32_t reserved;
};
static_assert(sizeof(State) == 64, "sampling.zig state_bytes");

struct SpanSum {  // a draw block's span: weight strictly above the boundary, ties at it
    unsigned long long strict;
    unsigned long long ties;
};

// A job's scratch: its state, its histogram, one SpanSum per block of the row.
struct Scratch {
    State* state;
    unsigned long long* histogram;
    SpanSum* spans;
    __device__ Scratch(unsigned char* base, int job, int spans_per_row) {
        unsigned char* p = base + static_cast<size_t>(job) * (sizeof(State) + kBins * 8 + static_cast<size_t>(spans_per_row) * sizeof(SpanSum));
        state = reinterpret_cast<State*>(p);
        histogram = reinterpret_cast<unsigned long long*>(p + sizeof(State));
        spans = reinterpret_cast<SpanSum*>(p + sizeof(State) + kBins * 8);
    }
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

__device__ __forceinline__ bool shorter(Boundary a, Boundary b) {
    return a.key > b.key || (a.key == b.key && a.quota < b.quota);
}

__device__ __forceinline__ bool top_k_active(const SampleJob& job, int vocab) { return job.top_k > 0 && job.top_k < vocab; }
__device__ __forceinline__ bool top_p_active(const SampleJob& job) { return job.top_p < 1.f; }

// The amount a token adds: its weight, or 1 when counting.
template <bool kWeights>
__device__ __forceinline__ unsigned long long amount(const Row& r, float logit) {
    if constexpr (kWeights) return r.weight(logit);
    else return 1ull;
}

// Exclusive prefix of v over thread order; *total gets the sum. `warp_values` holds kWarps.
__device__ unsigned long long block_scan_u64(unsigned long long v, unsigned long long* warp_values, unsigned long long* total) {
    const int lane = threadIdx.x % 32;
    unsigned long long inclusive = v;
    for (int offset = 1; offset < 32; offset *= 2) {
        const unsigned long long other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    __syncthreads();
    if (lane == 31) warp_values[threadIdx.x / 32] = inclusive;
    __syncthreads();
    unsigned long long before = 0, sum = 0;
    for (int w = 0; w < kWarps; ++w) {
        if (w < static_cast<int>(threadIdx.x / 32)) before += warp_values[w];
        sum += warp_values[w];
    }
    *total = sum;
    return before + inclusive - v;
}

// This thread's run of consecutive token ids within span `span` (empty past the vocabulary).
__device__ __forceinline__ void run_of(int span, int vocab, int* first, int* last) {
    const int begin = span * kSpan + static_cast<int>(threadIdx.x) * kRun;
    *first = min(vocab, begin);
    *last = min(vocab, begin + kRun);
}

struct LevelShared {
    unsigned long long histogram[kBins];
    unsigned long long warp_values[kWarps];
    unsigned long long above, target;
    int digit;
    bool last;
};

// One digit of a cut-off inside `within`: the blocks histogram their tokens' amounts by the digit
// (tokens whose higher digits are the ones chosen), the last block picks the largest digit whose
// amount from the top reaches the target.
template <bool kWeights>
__device__ void level(const Row& r, const SampleJob& job, Scratch scratch, Boundary within, int level_index, LevelShared& s) {
    const int shift = level_index == 0 ? 21 : (level_index == 1 ? 10 : 0);
    const int bins = level_index == 2 ? 1024 : 2048;
    const uint32_t fixed = level_index == 0 ? 0u : ~0u << (level_index == 1 ? 21 : 10);
    State* state = scratch.state;
    const uint32_t prefix = level_index == 0 ? 0u : state->prefix;

    for (int b = threadIdx.x; b < bins; b += kThreads) s.histogram[b] = 0ull;
    __syncthreads();
    int first, last;
    run_of(blockIdx.x, r.vocab, &first, &last);
    // Consecutive tokens of one digit add up before one atomic: flat logits put a whole span in
    // one bin, where per-token shared atomics would serialise.
    int run_digit = -1;
    unsigned long long run = 0;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        if (key <= within.key || (key & fixed) != prefix) continue;
        const int digit = static_cast<int>((key >> shift) & static_cast<uint32_t>(bins - 1));
        if (digit != run_digit) {
            if (run) atomicAdd(&s.histogram[run_digit], run);
            run_digit = digit;
            run = 0;
        }
        run += amount<kWeights>(r, logit);
    }
    if (run) atomicAdd(&s.histogram[run_digit], run);
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += kThreads)
        if (s.histogram[b]) atomicAdd(scratch.histogram + b, s.histogram[b]);
    if (!tf_last_block(&state->counter, gridDim.x, &s.last)) return;

    for (int b = threadIdx.x; b < bins; b += kThreads) {
        s.histogram[b] = __ldcg(scratch.histogram + b);
        scratch.histogram[b] = 0ull;  // clear for the next launch
    }
    __syncthreads();
    // The first `quota` ties at within.key count, as a block: their key passes the higher digits or not.
    if (threadIdx.x == 0 && within.quota > 0 && (within.key & fixed) == prefix)
        s.histogram[(within.key >> shift) & static_cast<uint32_t>(bins - 1)] += within.quota * amount<kWeights>(r, key_value(within.key));
    __syncthreads();

    // Thread t holds bins in descending order, so a scan over threads sums the bins above its own.
    const int per = bins / kThreads;
    const int top = bins - 1 - static_cast<int>(threadIdx.x) * per;
    unsigned long long mine = 0;
    for (int j = 0; j < per; ++j) mine += s.histogram[top - j];
    unsigned long long total;
    const unsigned long long higher = block_scan_u64(mine, s.warp_values, &total);
    if (threadIdx.x == 0) {
        if (level_index == 0) {
            s.above = 0;
            if constexpr (kWeights) {
                unsigned long long target = static_cast<unsigned long long>(ceil(static_cast<double>(job.top_p) * static_cast<double>(total)));
                s.target = target < 1 ? 1 : (target > total ? total : target);
            } else {
                s.target = static_cast<unsigned long long>(job.top_k);
            }
        } else {
            s.above = state->above;
            s.target = state->target;
        }
        s.digit = 0;  // unreached: the target is at most the total
    }
    __syncthreads();
    const unsigned long long target = s.target;
    unsigned long long running = s.above + higher;
    __syncthreads();
    if (running < target) {
        for (int j = 0; j < per; ++j) {
            const unsigned long long next = running + s.histogram[top - j];
            if (next >= target) {
                s.digit = top - j;
                s.above = running;
                break;
            }
            running = next;
        }
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    const uint32_t chosen = prefix | (static_cast<uint32_t>(s.digit) << shift);
    if (level_index < kLevels - 1) {
        state->prefix = chosen;
        state->above = s.above;
        state->target = target;
        return;
    }
    const unsigned long long each = amount<kWeights>(r, key_value(chosen));
    const Boundary found{chosen, 0u, (target - s.above + each - 1) / each};
    if constexpr (kWeights) state->top_p = found;
    else state->top_k = found;
}

__device__ __forceinline__ Row row_of(const float* logits, const LogitsSummary* summaries, const SampleJob& job, int vocab) {
    return Row{logits + static_cast<size_t>(job.row) * vocab, vocab, summaries[job.row].max, 1.0f / job.temperature};
}

}  // namespace

// One digit (`level` 0..2) of top-k's cut-off (phase 0) or top-p's (phase 1) for every job that
// asks for it. Grid (spans, jobs).
extern "C" __global__ void __launch_bounds__(kThreads) tf_sample_level(const float* __restrict__ logits, const LogitsSummary* __restrict__ summaries,
                                                                       const SampleJob* __restrict__ jobs, unsigned char* __restrict__ scratch_base,
                                                                       int vocab, int phase, int level_index) {
    tf_wait_prior_grid();
    __shared__ LevelShared s;
    const SampleJob job = jobs[blockIdx.y];
    const Row r = row_of(logits, summaries, job, vocab);
    const Scratch scratch(scratch_base, blockIdx.y, gridDim.x);
    if (phase == kPhaseTopK) {
        if (!top_k_active(job, vocab)) return;
        level<false>(r, job, scratch, Boundary{0u, 0u, 0ull}, level_index, s);
    } else {
        if (!top_p_active(job)) return;
        const Boundary within = top_k_active(job, vocab) ? scratch.state->top_k : Boundary{0u, 0u, 0ull};
        level<true>(r, job, scratch, within, level_index, s);
    }
}

// min-p's floor: the lowest key whose probability reaches min_p (they form a prefix: exp is
// monotone), for every job that asks for it. Grid (spans, jobs).
extern "C" __global__ void __launch_bounds__(kThreads) tf_sample_floor(const float* __restrict__ logits, const LogitsSummary* __restrict__ summaries,
                                                                       const SampleJob* __restrict__ jobs, unsigned char* __restrict__ scratch_base, int vocab) {
    tf_wait_prior_grid();
    __shared__ uint32_t warp_lowest[kWarps];
    const SampleJob job = jobs[blockIdx.y];
    if (!(job.min_p > 0.f)) return;
    const Row r = row_of(logits, summaries, job, vocab);
    const Scratch scratch(scratch_base, blockIdx.y, gridDim.x);
    int first, last;
    run_of(blockIdx.x, vocab, &first, &last);
    uint32_t lowest = 0xFFFFFFFFu;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        if (r.probability(logit) >= job.min_p) lowest = min(lowest, order_key(logit));
    }
    for (int offset = 16; offset > 0; offset /= 2) lowest = min(lowest, __shfl_xor_sync(0xFFFFFFFFu, lowest, offset));
    if (threadIdx.x % 32 == 0) warp_lowest[threadIdx.x / 32] = lowest;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < kWarps; ++w) lowest = min(lowest, warp_lowest[w]);
    if (lowest != 0xFFFFFFFFu) atomicMax(&scratch.state->floor_not, ~lowest);
}

// The draw: the kept set is the shortest of the cut-offs found; each block totals its span's kept
// weight; the last block finds the span holding u · (kept weight) and walks it. Grid (spans, jobs).
extern "C" __global__ void __launch_bounds__(kThreads) tf_sample_draw(const float* __restrict__ logits, const LogitsSummary* __restrict__ summaries,
                                                                      const SampleJob* __restrict__ jobs, unsigned char* __restrict__ scratch_base,
                                                                      SampleChoice* __restrict__ out, int vocab) {
    tf_wait_prior_grid();
    __shared__ unsigned long long warp_values[kWarps];
    __shared__ unsigned long long span_mass[kThreads];
    __shared__ unsigned long long span_ties[kThreads];
    __shared__ bool last_block;
    __shared__ int chosen_span;
    __shared__ unsigned long long chosen_before, chosen_tie_base, chosen_target;  // from thread 0
    const SampleJob job = jobs[blockIdx.y];
    const LogitsSummary summary = summaries[job.row];
    const Row r = row_of(logits, summaries, job, vocab);
    const Scratch scratch(scratch_base, blockIdx.y, gridDim.x);
    State* state = scratch.state;

    Boundary kept{0u, 0u, 0ull};  // every token
    if (top_k_active(job, vocab)) kept = state->top_k;
    if (top_p_active(job) && shorter(state->top_p, kept)) kept = state->top_p;
    if (job.min_p > 0.f) {
        const Boundary floor{~state->floor_not, 0u, ~0ull};
        if (shorter(floor, kept)) kept = floor;
    }
    const unsigned long long each = r.weight(key_value(kept.key));  // a tie's weight

    int first, last;
    run_of(blockIdx.x, vocab, &first, &last);
    unsigned long long strict = 0, ties = 0;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        if (key > kept.key) strict += r.weight(logit);
        ties += key == kept.key;
    }
    unsigned long long total_strict, total_ties;
    block_scan_u64(strict, warp_values, &total_strict);
    block_scan_u64(ties, warp_values, &total_ties);
    if (threadIdx.x == 0) scratch.spans[blockIdx.x] = SpanSum{total_strict, total_ties};
    if (!tf_last_block(&state->counter, gridDim.x, &last_block)) return;
    if (threadIdx.x == 0) chosen_span = gridDim.x - 1;  // unused: the target is below the total

    // Each span's kept weight is its strict weight and its ties among the first `quota` (by id):
    // two passes over the spans' sums (staged kThreads at a time), the total, then the span
    // holding the target.
    const int spans = gridDim.x;
    unsigned long long tie_base = 0, cumulative = 0, target = 0;  // thread 0's
    for (int pass = 0; pass < 2; ++pass) {
        bool found = false;
        tie_base = cumulative = 0;
        for (int base = 0; base < spans; base += kThreads) {
            __syncthreads();
            if (base + static_cast<int>(threadIdx.x) < spans) {
                span_mass[threadIdx.x] = __ldcg(&scratch.spans[base + threadIdx.x].strict);
                span_ties[threadIdx.x] = __ldcg(&scratch.spans[base + threadIdx.x].ties);
            }
            __syncthreads();
            if (threadIdx.x != 0 || found) continue;
            for (int j = 0; j < min(kThreads, spans - base); ++j) {
                const unsigned long long taken = kept.quota > tie_base ? min(span_ties[j], kept.quota - tie_base) : 0ull;
                const unsigned long long mass = span_mass[j] + taken * each;
                if (pass == 1 && target < cumulative + mass) {
                    chosen_span = base + j;
                    found = true;
                    break;
                }
                tie_base += span_ties[j];
                cumulative += mass;
            }
        }
        if (threadIdx.x == 0 && pass == 0) {
            target = static_cast<unsigned long long>(job.u * static_cast<double>(cumulative));
            if (target >= cumulative) target = cumulative - 1;  // u < 1; guards the rounding of u · total
        }
    }
    if (threadIdx.x == 0) {
        chosen_target = target;
        chosen_before = cumulative;
        chosen_tie_base = tie_base;
        state->floor_not = 0u;  // at rest for the next call
    }
    __syncthreads();

    // Walk the chosen span: each thread its run of ids, tie ranks and weights scanned across them.
    run_of(chosen_span, vocab, &first, &last);
    unsigned long long run_ties = 0;
    for (int i = first; i < last; ++i) run_ties += order_key(r.logits[i]) == kept.key;
    unsigned long long ignored;
    const unsigned long long run_tie_base = chosen_tie_base + block_scan_u64(run_ties, warp_values, &ignored);
    unsigned long long tie_rank = run_tie_base;
    unsigned long long mass = 0;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        const bool tie = key == kept.key;
        if (key > kept.key || (tie && tie_rank < kept.quota)) mass += r.weight(logit);
        tie_rank += tie;
    }
    const unsigned long long before = chosen_before + block_scan_u64(mass, warp_values, &ignored);
    target = chosen_target;
    if (target < before || target >= before + mass) return;
    // This thread's run holds the target: walk it again to the token whose interval holds it.
    cumulative = before;
    tie_rank = run_tie_base;
    for (int i = first; i < last; ++i) {
        const float logit = r.logits[i];
        const uint32_t key = order_key(logit);
        const bool tie = key == kept.key;
        const bool member = key > kept.key || (tie && tie_rank < kept.quota);
        tie_rank += tie;
        if (!member) continue;
        cumulative += r.weight(logit);
        if (target < cumulative) {
            out[blockIdx.y] = {static_cast<uint32_t>(i), static_cast<float>(static_cast<double>(logit) - summary.log_total)};
            return;
        }
    }
}
