//! Prefix caching for a model with recurrent state (GLM-5.3-Flash's KDA layers). A cached KV page
//! saves a later prompt its positions only with the recurrent state the sequence had after it, so
//! the engine keeps snapshots of that state (one per sequence slot, at most count_max): extra
//! state slots after the sequence slots, each tied to a cached page (and its generation: an
//! evicted page's snapshot is stale). A prompt's
//! chunks end on page boundaries where they cross one; after each, the sequence's state is copied
//! into a snapshot of its last page. A new prompt maps its cached pages up to the deepest one with
//! a snapshot, copies that state into its slot, and computes from there. A sequence's state does
//! not depend on its batch or its chunks (the KDA tests show it bit for bit), so the restored state
//! is the one it would have computed.
//!
//! Snapshots are taken least recently used first when all hold a live page. Every rank holds its
//! heads' part of every state slot: in-process ranks copy at once, a worker process makes rank 0's
//! copies before the forward of the next plan, which carries them (distributed.zig).
const std = @import("std");
const assert = std.debug.assert;
const glm = @import("../families/glm/root.zig");
const PrefixCache = @import("prefix_cache.zig").PrefixCache;
const engine_mod = @import("engine.zig");
const Engine = engine_mod.Engine;
const Sequence = engine_mod.Sequence;
const Diagnostic = @import("../core/root.zig").Diagnostic;

const none = std.math.maxInt(u32);

/// Snapshots at most (one per sequence slot below it): GLM-5.3-Flash's whole state is ~146 MiB a
/// sequence, so 16 cost ~2.3 GiB (half a node's at TP=2) beside the model.
pub const count_max = 16;

pub const StateSnapshots = struct {
    /// The state slot of snapshot 0: the engine's sequence slots come first.
    first_slot: u32,
    /// Per snapshot: the cached page whose end it holds the state of (none: free), that page's
    /// generation then, and when it was last taken or used.
    pages: []u32,
    generations: []u32,
    used: []u64,
    clock: u64 = 0,

    pub fn init(gpa: std.mem.Allocator, count: usize, first_slot: u32) error{OutOfMemory}!StateSnapshots {
        const pages = try gpa.alloc(u32, count);
        errdefer gpa.free(pages);
        const generations = try gpa.alloc(u32, count);
        errdefer gpa.free(generations);
        const used = try gpa.alloc(u64, count);
        @memset(pages, none);
        @memset(generations, 0);
        @memset(used, 0);
        return .{ .first_slot = first_slot, .pages = pages, .generations = generations, .used = used };
    }

    pub fn deinit(snapshots: *StateSnapshots, gpa: std.mem.Allocator) void {
        gpa.free(snapshots.pages);
        gpa.free(snapshots.generations);
        gpa.free(snapshots.used);
    }

    fn live(snapshots: *const StateSnapshots, cache: *const PrefixCache, i: usize) bool {
        const page = snapshots.pages[i];
        return page != none and cache.isCached(page) and cache.generations[page] == snapshots.generations[i];
    }

    /// The state slot holding the state after cached `page`, if a live snapshot has it.
    pub fn find(snapshots: *StateSnapshots, cache: *const PrefixCache, page: u32) ?u32 {
        for (snapshots.pages, 0..) |p, i| {
            if (p != page or !snapshots.live(cache, i)) continue;
            snapshots.clock += 1;
            snapshots.used[i] = snapshots.clock;
            return snapshots.first_slot + @as(u32, @intCast(i));
        }
        return null;
    }

    /// A state slot to hold the state after cached `page`: a free or stale snapshot, else the
    /// least recently used one; recorded as `page`'s.
    pub fn claim(snapshots: *StateSnapshots, cache: *const PrefixCache, page: u32) u32 {
        var pick: usize = 0;
        for (snapshots.pages, 0..) |_, i| {
            if (!snapshots.live(cache, i)) {
                pick = i;
                break;
            }
            if (snapshots.used[i] < snapshots.used[pick]) pick = i;
        }
        snapshots.clock += 1;
        snapshots.pages[pick] = page;
        snapshots.generations[pick] = cache.generations[page];
        snapshots.used[pick] = snapshots.clock;
        return snapshots.first_slot + @as(u32, @intCast(pick));
    }
};

/// Recurrent state slot `to` becomes slot `from`, on the engine's backend (queued on the GPU's
/// stream, in order with the forwards).
fn copyState(engine: *Engine, from: u32, to: u32, diag: *Diagnostic) engine_mod.Error!void {
    if (engine.gpu_model) |model| return glm.parts.kda_cuda.copySlot(model, from, to, diag);
    if (engine.host_cache) |*cache| return cache.copyState(from, to);
    if (engine.tensor_parallel) |group| {
        for (group.ranks) |*rank| rank.cache.copyState(from, to);
        return;
    }
    // Across processes: here, and on every worker before its next forward (the plan carries it).
    return engine.distributed_rank.?.copyState(from, to, diag);
}

/// How many of `count` prompt rows from `sequence.computed` to run so the chunk ends on a page
/// boundary when it crosses one (the state there can be kept).
pub fn chunkRows(engine: *const Engine, sequence: *const Sequence, count: usize) usize {
    if (engine.snapshots == null or sequence.computed >= sequence.prompt_len) return count;
    const n = engine.params.page_tokens;
    const end = sequence.computed + count;
    const boundary = end / n * n;
    return if (boundary > sequence.computed and boundary < end) boundary - sequence.computed else count;
}

/// After a forward: each prompt that ended its chunk on the boundary of a cached page leaves its
/// state there in a snapshot (unless one has it already).
pub fn keep(engine: *Engine, active: []const u32, diag: *Diagnostic) engine_mod.Error!void {
    const snapshots = &(engine.snapshots orelse return);
    const cache = &engine.prefix.?;
    const n = engine.params.page_tokens;
    for (active) |slot| {
        const sequence = &engine.sequences[slot];
        const computed = sequence.computed;
        if (computed == 0 or computed > sequence.prompt_len or computed % n != 0) continue;
        const page = sequence.pages[computed / n - 1];
        if (!cache.isCached(page) or snapshots.find(cache, page) != null) continue;
        try copyState(engine, slot, snapshots.claim(cache, page), diag);
    }
}

/// A newly mapped prefix of a recurrent model: kept up to its deepest page with a snapshot (the
/// pages after it are let go), that state copied into the sequence's slot. Returns the pages kept.
pub fn restore(engine: *Engine, sequence: *Sequence, mapped: usize, diag: *Diagnostic) engine_mod.Error!usize {
    const snapshots = &(engine.snapshots orelse return mapped);
    const cache = &engine.prefix.?;
    var kept = mapped;
    const from: ?u32 = while (kept > 0) : (kept -= 1) {
        if (snapshots.find(cache, sequence.pages[kept - 1])) |state| break state;
    } else null;
    for (sequence.pages[kept..mapped]) |page| cache.release(page);
    if (from) |state| try copyState(engine, state, engine.slotOf(sequence), diag);
    return kept;
}

test "a snapshot follows its page's generation; the least recently used one is taken first" {
    const gpa = std.testing.allocator;
    var cache = try PrefixCache.init(gpa, 4, 2);
    defer cache.deinit(gpa);
    var snapshots = try StateSnapshots.init(gpa, 2, 8);
    defer snapshots.deinit(gpa);
    try std.testing.expect(cache.register(0, null, &.{ 1, 2 }));
    try std.testing.expect(cache.register(1, 0, &.{ 3, 4 }));
    try std.testing.expect(cache.register(2, null, &.{ 5, 6 }));
    try std.testing.expectEqual(@as(u32, 8), snapshots.claim(&cache, 0));
    try std.testing.expectEqual(@as(u32, 9), snapshots.claim(&cache, 1));
    try std.testing.expectEqual(@as(?u32, 8), snapshots.find(&cache, 0)); // page 1's is now the older
    try std.testing.expectEqual(@as(u32, 9), snapshots.claim(&cache, 2));
    try std.testing.expectEqual(@as(?u32, null), snapshots.find(&cache, 1));
    // Page 0 evicted and cached again with other tokens: its old snapshot is stale.
    cache.release(0);
    try std.testing.expectEqual(@as(?u32, 0), cache.evict());
    try std.testing.expect(cache.register(0, null, &.{ 7, 8 }));
    try std.testing.expectEqual(@as(?u32, null), snapshots.find(&cache, 0));
    try std.testing.expectEqual(@as(u32, 8), snapshots.claim(&cache, 1)); // the stale one is free
}
