//! The paged KV cache's pages: a pool of fixed-size pages sized once at engine creation. A page
//! holds `page_tokens` positions of one sequence, for every layer and every cache part the model
//! describes (families/glm/cache.zig on the host, the GPU model's device copy); a sequence's page
//! table lists its pages in position order. Pages are taken as positions arrive and all returned
//! when the sequence ends or is cancelled, except those the prefix cache holds (prefix_cache.zig:
//! disown hands a page to it, adopt takes one back that it evicted). This pool only accounts for
//! them.
const std = @import("std");
const assert = std.debug.assert;

pub const KvPages = struct {
    pages: usize,
    page_tokens: usize,
    free: []u32,
    free_count: usize,
    /// The sequence slot holding each page, for the paired asserts in take and release.
    owner: []?u32,

    pub fn init(gpa: std.mem.Allocator, pages: usize, page_tokens: usize) error{OutOfMemory}!KvPages {
        assert(pages > 0 and page_tokens > 0);
        const free = try gpa.alloc(u32, pages);
        errdefer gpa.free(free);
        const owner = try gpa.alloc(?u32, pages);
        for (free, 0..) |*f, i| f.* = @intCast(pages - 1 - i);
        @memset(owner, null);
        return .{ .pages = pages, .page_tokens = page_tokens, .free = free, .free_count = pages, .owner = owner };
    }

    pub fn deinit(pool: *KvPages, gpa: std.mem.Allocator) void {
        gpa.free(pool.free);
        gpa.free(pool.owner);
        pool.* = undefined;
    }

    pub fn take(pool: *KvPages, sequence_slot: u32) u32 {
        assert(pool.free_count > 0); // admission reserved it
        pool.free_count -= 1;
        const page = pool.free[pool.free_count];
        assert(pool.owner[page] == null); // pairs with the assert in release
        pool.owner[page] = sequence_slot;
        return page;
    }

    /// A page of `sequence_slot` now held by the prefix cache: no longer the slot's, not free.
    pub fn disown(pool: *KvPages, sequence_slot: u32, page: u32) void {
        assert(pool.owner[page].? == sequence_slot);
        pool.owner[page] = null;
    }

    /// A page the prefix cache evicted, taken by `sequence_slot` (as `take` would a free one).
    pub fn adopt(pool: *KvPages, sequence_slot: u32, page: u32) void {
        assert(pool.owner[page] == null);
        pool.owner[page] = sequence_slot;
    }

    pub fn release(pool: *KvPages, sequence_slot: u32, page: u32) void {
        assert(pool.owner[page].? == sequence_slot); // pairs with the assert in take
        pool.owner[page] = null;
        pool.free[pool.free_count] = page;
        pool.free_count += 1;
    }
};

test "pages are taken and returned once each" {
    var pool = try KvPages.init(std.testing.allocator, 3, 8);
    defer pool.deinit(std.testing.allocator);
    const a = pool.take(0);
    const b = pool.take(1);
    try std.testing.expect(a != b);
    try std.testing.expectEqual(@as(usize, 1), pool.free_count);
    pool.release(0, a);
    pool.release(1, b);
    try std.testing.expectEqual(@as(usize, 3), pool.free_count);
}
