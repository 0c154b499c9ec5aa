//! What `tf_engine_stats` reports: pages, sequences, the GPU's counters, the recurrent state, the
//! prefix cache and the KV cache's dtype, read off an engine without changing it.
const glm = @import("../families/glm/root.zig");
const params_mod = @import("params.zig");
const Engine = @import("engine.zig").Engine;
const Stats = @import("records.zig").Stats;

pub fn of(engine: *const Engine) Stats {
    var live: u32 = 0;
    var waiting: u32 = 0;
    for (engine.sequences) |s| switch (s.state) {
        .free => {},
        .waiting => waiting += 1,
        .active => live += 1,
    };
    return .{
        .pages_total = engine.params.kv_pages,
        .pages_free = @intCast(engine.pages.free_count + if (engine.prefix) |c| c.evictable else 0),
        .pages_reserved = @intCast(engine.pages_reserved),
        .sequences_live = live,
        .sequences_waiting = waiting,
        .sequences_max = engine.params.sequences_max,
        .context_tokens_max = engine.params.context_tokens_max,
        .vocab_size = @intCast(engine.config().vocab_size),
        .graph_replays = if (engine.gpuModel()) |model| model.graph_replays else 0,
        .prompt_rows = if (engine.gpuModel()) |model| model.prompt_rows else 0,
        .prompt_layers = if (engine.gpuModel()) |model| model.promptLayers() else 0,
        .gpu_sampled = engine.gpu_sampled,
        .kv_pairs = if (engine.gpuModel()) |model| model.kvPairs() else 0,
        .state_bytes_per_sequence = 4 * glm.cache.floatsPerSequence(engine.config()),
        .state_bytes_total = 4 * glm.cache.floatsPerSequence(engine.config()) * (engine.params.sequences_max + if (engine.snapshots) |s| s.pages.len else 0),
        .prefix_cache = @intFromBool(engine.prefix != null),
        .pages_cached = if (engine.prefix) |c| @intCast(c.cached_count) else 0,
        .prefix_hit_tokens = if (engine.prefix) |c| c.hit_tokens else 0,
        .prefix_miss_tokens = if (engine.prefix) |c| c.miss_tokens else 0,
        .kv_dtype = engine.params.kv_dtype,
        .kv_bytes_per_token = glm.cache.bytesPerToken(engine.config(), params_mod.kvDtype(engine.params)),
        .programmatic_launch = @intFromBool(if (engine.gpuModel()) |model| model.gpu.programmatic else false),
        .shared_side_layers = if (engine.gpuModel()) |model| model.sharedSideLayers() else 0,
        .preemptions = engine.preemptions,
    };
}
