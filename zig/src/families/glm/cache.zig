//! The model's KV cache on the host, as its parts describe it: GQA layers' keys and values
//! (parts/gqa.zig), MLA layers' latents (parts/mla.zig), DSA indexers' keys (parts/dsa.zig). Every
//! part indexes its storage by the same page ids, which the engine's page pool hands out
//! (engine/kv_pages.zig): one page table per sequence serves all parts. KDA layers' recurrent state
//! (parts/kda.zig) is per sequence, not per position: one slot per engine sequence slot.
const std = @import("std");
const Config = @import("config.zig").Config;
const KvDtype = @import("../../core/root.zig").KvDtype;
const gqa = @import("parts/gqa.zig");
const mla = @import("parts/mla.zig");
const dsa = @import("parts/dsa.zig");
const kda = @import("parts/kda.zig");

pub const HostCache = struct {
    gqa: ?gqa.Cache,
    mla: ?mla.Cache,
    index: ?dsa.Cache,
    kda: ?kda.State,

    /// `sequences`: the engine's sequence slots, each with its own recurrent state (and the
    /// prefix cache's state snapshots after them).
    /// `dtype`: what the GQA and MLA parts store; the DSA indexer's keys and the KDA state stay f32.
    pub fn init(gpa: std.mem.Allocator, c: *const Config, dtype: KvDtype, pages: usize, page_tokens: usize, sequences: usize) error{OutOfMemory}!HostCache {
        var cache: HostCache = .{ .gqa = null, .mla = null, .index = null, .kda = null };
        errdefer cache.deinit(gpa);
        if (c.countOf("attention", .gqa) > 0) cache.gqa = try gqa.Cache.init(gpa, c, dtype, pages, page_tokens);
        if (c.countOf("attention", .mla) > 0) cache.mla = try mla.Cache.init(gpa, c, dtype, pages, page_tokens);
        if (c.countOf("indexer", .full) > 0) cache.index = try dsa.Cache.init(gpa, c, pages, page_tokens);
        if (c.countOf("attention", .kda) > 0) cache.kda = try kda.State.init(gpa, c, sequences);
        return cache;
    }

    /// Recurrent state slot `to` becomes slot `from` (prefix caching's snapshots); nothing
    /// without KDA layers.
    pub fn copyState(cache: *HostCache, from: u32, to: u32) void {
        if (cache.kda) |*state| state.copySlot(from, to);
    }

    pub fn deinit(cache: *HostCache, gpa: std.mem.Allocator) void {
        if (cache.gqa) |*part| part.deinit(gpa);
        if (cache.mla) |*part| part.deinit(gpa);
        if (cache.index) |*part| part.deinit(gpa);
        if (cache.kda) |*part| part.deinit(gpa);
        cache.* = .{ .gqa = null, .mla = null, .index = null, .kda = null };
    }
};

/// Bytes one position of one sequence occupies across every layer and part: the GQA and MLA parts
/// in `dtype` (fp8: and an exponent per layer and head), the DSA indexer's keys in f32.
pub fn bytesPerToken(c: *const Config, dtype: KvDtype) usize {
    const values = gqa.Cache.valuesPerToken(c) + mla.Cache.valuesPerToken(c);
    const exponents = if (dtype == .fp8) 2 * c.countOf("attention", .gqa) * c.kv_heads + c.countOf("attention", .mla) else 0;
    return values * dtype.bytes() + exponents + 4 * dsa.Cache.floatsPerToken(c);
}

/// f32 values one sequence's recurrent state occupies, whatever its length.
pub fn floatsPerSequence(c: *const Config) usize {
    return if (c.countOf("attention", .kda) > 0) kda.State.floatsPerSequence(c) else 0;
}
