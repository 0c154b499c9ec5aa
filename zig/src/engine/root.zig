//! Sequences, the paged KV cache, continuous batching and sampling, over a model family's forward.
pub const kv_pages = @import("kv_pages.zig");
pub const prefix_cache = @import("prefix_cache.zig");
pub const state_snapshots = @import("state_snapshots.zig");
pub const sampler = @import("sampler.zig");
pub const token_mask = @import("token_mask.zig");
pub const logit_bias = @import("logit_bias.zig");
pub const Engine = @import("engine.zig").Engine;
pub const engine = @import("engine.zig");
pub const step_timeline = @import("step_timeline.zig");

test {
    _ = kv_pages;
    _ = prefix_cache;
    _ = state_snapshots;
    _ = sampler;
    _ = token_mask;
    _ = logit_bias;
    _ = engine;
    _ = step_timeline;
}
