//! The paged KV cache: a pool of fixed-size pages allocated once at engine creation. A page holds
//! `page_tokens` positions of every layer's keys and values for one sequence; a sequence's page
//! table lists its pages in position order. Pages are taken as positions arrive and all returned
//! when the sequence ends or is cancelled.
const std = @import("std");
const assert = std.debug.assert;

pub const Shape = struct {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    page_tokens: usize,
    pages: usize,
};

pub const KvCache = struct {
    shape: Shape,
    /// (pages, layers, kv_heads, page_tokens, head_dim) f32 each.
    keys: []f32,
    values: []f32,
    free: []u32,
    free_count: usize,
    /// The sequence slot holding each page, for the paired asserts in take and release.
    owner: []?u32,

    /// `host_data`: false when the keys and values live on a GPU and this is only the page allocator.
    pub fn init(gpa: std.mem.Allocator, shape: Shape, host_data: bool) error{OutOfMemory}!KvCache {
        assert(shape.pages > 0 and shape.page_tokens > 0);
        const per_page = if (host_data) shape.layers * shape.kv_heads * shape.page_tokens * shape.head_dim else 0;
        const keys = try gpa.alloc(f32, shape.pages * per_page);
        errdefer gpa.free(keys);
        const values = try gpa.alloc(f32, shape.pages * per_page);
        errdefer gpa.free(values);
        const free = try gpa.alloc(u32, shape.pages);
        errdefer gpa.free(free);
        const owner = try gpa.alloc(?u32, shape.pages);
        for (free, 0..) |*f, i| f.* = @intCast(shape.pages - 1 - i);
        @memset(owner, null);
        return .{ .shape = shape, .keys = keys, .values = values, .free = free, .free_count = shape.pages, .owner = owner };
    }

    pub fn deinit(cache: *KvCache, gpa: std.mem.Allocator) void {
        gpa.free(cache.keys);
        gpa.free(cache.values);
        gpa.free(cache.free);
        gpa.free(cache.owner);
        cache.* = undefined;
    }

    pub fn take(cache: *KvCache, sequence_slot: u32) u32 {
        assert(cache.free_count > 0); // admission reserved it
        cache.free_count -= 1;
        const page = cache.free[cache.free_count];
        assert(cache.owner[page] == null); // pairs with the assert in release
        cache.owner[page] = sequence_slot;
        return page;
    }

    pub fn release(cache: *KvCache, sequence_slot: u32, page: u32) void {
        assert(cache.owner[page].? == sequence_slot); // pairs with the assert in take
        cache.owner[page] = null;
        cache.free[cache.free_count] = page;
        cache.free_count += 1;
    }

    /// The head_dim values of (page, layer, kv_head, slot).
    pub fn offset(cache: *const KvCache, page: u32, layer: usize, kv_head: usize, slot: usize) usize {
        const s = cache.shape;
        assert(page < s.pages and layer < s.layers and kv_head < s.kv_heads and slot < s.page_tokens);
        return (((@as(usize, page) * s.layers + layer) * s.kv_heads + kv_head) * s.page_tokens + slot) * s.head_dim;
    }
};

test "pages are taken and returned once each" {
    var cache = try KvCache.init(std.testing.allocator, .{ .layers = 2, .kv_heads = 1, .head_dim = 4, .page_tokens = 8, .pages = 3 }, true);
    defer cache.deinit(std.testing.allocator);
    const a = cache.take(0);
    const b = cache.take(1);
    try std.testing.expect(a != b);
    try std.testing.expectEqual(@as(usize, 1), cache.free_count);
    cache.release(0, a);
    cache.release(1, b);
    try std.testing.expectEqual(@as(usize, 3), cache.free_count);
    try std.testing.expectEqual(@as(usize, (((2 * 2 + 1) * 1 + 0) * 8 + 3) * 4), cache.offset(2, 1, 0, 3));
}
