//! What a step hands back per sequence and what the engine reports of itself: C ABI structs
//! (`tf_record`, `tf_engine_stats`), their sizes asserted in c_api.zig.
const sampler = @import("sampler.zig");

pub const Finish = enum(i32) { none = 0, stop = 1, length = 2, cancelled = 3 };

pub const Record = extern struct {
    sequence_id: u64,
    token: u32,
    finish: i32,
    logprob: f32,
    top_count: u32,
    top_tokens: [sampler.top_logprobs_max]u32,
    top_logprobs: [sampler.top_logprobs_max]f32,
    /// Prompt tokens of this sequence whose KV came from the prefix cache.
    cached_tokens: u32,
    reserved: u32 = 0,
};

pub const Stats = extern struct {
    pages_total: u32,
    pages_free: u32,
    pages_reserved: u32,
    sequences_live: u32,
    sequences_waiting: u32,
    sequences_max: u32,
    context_tokens_max: u32,
    vocab_size: u32,
    graph_replays: u64,
    prompt_rows: u64,
    prompt_layers: u64,
    gpu_sampled: u64,
    kv_pairs: u64,
    /// Recurrent state (KDA) one sequence holds whatever its length, and the pool of it allocated
    /// at creation: every sequence slot's, and as many prefix-cache snapshots with the cache on (0
    /// for models without it).
    state_bytes_per_sequence: u64,
    state_bytes_total: u64,
    /// Prefix caching: whether it runs (asked for), the pages
    /// it holds (pages_free counts the evictable ones among them), and the prompt tokens it served
    /// and did not.
    prefix_cache: u32,
    pages_cached: u32,
    prefix_hit_tokens: u64,
    prefix_miss_tokens: u64,
    kv_dtype: u32,
    kv_reserved: u32 = 0,
    kv_bytes_per_token: u64,
    programmatic_launch: u32,
    /// MoE layers whose shared expert a decode step runs on a second stream.
    shared_side_layers: u32,
    /// Sequences preempted for pages since the engine began (admission.zig).
    preemptions: u64,
};
