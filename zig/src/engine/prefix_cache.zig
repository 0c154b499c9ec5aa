//! Prefix caching: full KV pages of earlier prompts, found again by their content. A page that a
//! prompt filled completely is registered under the chain of its tokens (its own page_tokens ids
//! and its parent page, the one before it in that prompt); a later prompt that starts with the same
//! tokens maps those pages instead of computing them. A sequence's KV bits do not depend on its
//! batch or its chunks, so a mapped page holds what the new prompt would have written there.
//!
//! Exactness does not rest on the hash: a page matches only when its tokens are equal and its
//! parent is the page already matched before it, in the same generation (an evicted page's
//! generation moves on, so its old children can no longer be reached through it).
//!
//! A cached page is referenced by the sequences that map it; with none it waits, evictable, in
//! least-recently-released order, and the pool takes it back when its free list is empty.
const std = @import("std");
const assert = std.debug.assert;

const none = std.math.maxInt(u32);

pub const PrefixCache = struct {
    page_tokens: usize,
    /// Per page: whether it is cached, the sequences mapping it, its chain key, its parent page
    /// and that parent's generation, its own generation, and its tokens.
    cached: []bool,
    refs: []u32,
    keys: []u64,
    parents: []u32,
    parent_generations: []u32,
    generations: []u32,
    tokens: []u32,
    map: std.AutoHashMapUnmanaged(u64, u32),
    /// Evictable pages (cached, no references): a list from the oldest release.
    prev: []u32,
    next: []u32,
    head: u32 = none,
    tail: u32 = none,
    evictable: usize = 0,
    cached_count: usize = 0,
    hit_tokens: u64 = 0,
    miss_tokens: u64 = 0,

    pub fn init(gpa: std.mem.Allocator, pages: usize, page_tokens: usize) error{OutOfMemory}!PrefixCache {
        var cache: PrefixCache = .{
            .page_tokens = page_tokens,
            .cached = &.{},
            .refs = &.{},
            .keys = &.{},
            .parents = &.{},
            .parent_generations = &.{},
            .generations = &.{},
            .tokens = &.{},
            .map = .empty,
            .prev = &.{},
            .next = &.{},
        };
        errdefer cache.deinit(gpa);
        cache.cached = try gpa.alloc(bool, pages);
        @memset(cache.cached, false);
        cache.refs = try gpa.alloc(u32, pages);
        @memset(cache.refs, 0);
        cache.keys = try gpa.alloc(u64, pages);
        cache.parents = try gpa.alloc(u32, pages);
        cache.parent_generations = try gpa.alloc(u32, pages);
        cache.generations = try gpa.alloc(u32, pages);
        @memset(cache.generations, 0);
        cache.tokens = try gpa.alloc(u32, pages * page_tokens);
        cache.prev = try gpa.alloc(u32, pages);
        cache.next = try gpa.alloc(u32, pages);
        try cache.map.ensureTotalCapacity(gpa, @intCast(pages));
        return cache;
    }

    pub fn deinit(cache: *PrefixCache, gpa: std.mem.Allocator) void {
        gpa.free(cache.cached);
        gpa.free(cache.refs);
        gpa.free(cache.keys);
        gpa.free(cache.parents);
        gpa.free(cache.parent_generations);
        gpa.free(cache.generations);
        gpa.free(cache.tokens);
        gpa.free(cache.prev);
        gpa.free(cache.next);
        cache.map.deinit(gpa);
        cache.* = undefined;
    }

    fn chainKey(parent_key: u64, page_tokens: []const u32) u64 {
        return std.hash.Wyhash.hash(parent_key, std.mem.sliceAsBytes(page_tokens));
    }

    /// Maps the cached pages that hold `prompt`'s first full pages, at most `limit` of them, into
    /// `pages` (a reference each) and returns how many.
    pub fn lookup(cache: *PrefixCache, prompt: []const u32, limit: usize, pages: []u32) usize {
        const n = cache.page_tokens;
        var key: u64 = 0;
        var parent: u32 = none;
        var found: usize = 0;
        while (found < limit) : (found += 1) {
            const chunk = prompt[found * n ..][0..n];
            key = chainKey(key, chunk);
            const page = cache.map.get(key) orelse break;
            const parent_generation = if (parent == none) 0 else cache.generations[parent];
            if (cache.parents[page] != parent or cache.parent_generations[page] != parent_generation) break;
            if (!std.mem.eql(u32, cache.tokens[page * n ..][0..n], chunk)) break;
            cache.acquire(page);
            pages[found] = page;
            parent = page;
        }
        return found;
    }

    fn acquire(cache: *PrefixCache, page: u32) void {
        assert(cache.cached[page]);
        if (cache.refs[page] == 0) cache.unlink(page);
        cache.refs[page] += 1;
    }

    /// Caches `page`, filled with `page_tokens` tokens after `parent` (null for a prompt's first
    /// page), referenced by the sequence that filled it. False when its parent is not cached (the
    /// chain stayed private) or an equal page is cached already: then `page` stays that
    /// sequence's own.
    pub fn register(cache: *PrefixCache, page: u32, parent: ?u32, page_tokens: []const u32) bool {
        const n = cache.page_tokens;
        assert(page_tokens.len == n and !cache.cached[page]);
        if (parent) |p| if (!cache.cached[p]) return false;
        const key = chainKey(if (parent) |p| cache.keys[p] else 0, page_tokens);
        if (cache.map.contains(key)) return false;
        cache.map.putAssumeCapacity(key, page);
        cache.cached[page] = true;
        cache.refs[page] = 1;
        cache.keys[page] = key;
        cache.parents[page] = parent orelse none;
        cache.parent_generations[page] = if (parent) |p| cache.generations[p] else 0;
        @memcpy(cache.tokens[page * n ..][0..n], page_tokens);
        cache.cached_count += 1;
        return true;
    }

    pub fn isCached(cache: *const PrefixCache, page: u32) bool {
        return cache.cached[page];
    }

    /// A sequence lets go of a cached page; the last one makes it evictable.
    pub fn release(cache: *PrefixCache, page: u32) void {
        assert(cache.cached[page] and cache.refs[page] > 0);
        cache.refs[page] -= 1;
        if (cache.refs[page] == 0) cache.append(page);
    }

    /// The least recently released evictable page, no longer cached (its generation moves on), or
    /// null when none waits.
    pub fn evict(cache: *PrefixCache) ?u32 {
        const page = cache.head;
        if (page == none) return null;
        cache.unlink(page);
        assert(cache.map.remove(cache.keys[page]));
        cache.cached[page] = false;
        cache.generations[page] +%= 1;
        cache.cached_count -= 1;
        return page;
    }

    fn append(cache: *PrefixCache, page: u32) void {
        cache.prev[page] = cache.tail;
        cache.next[page] = none;
        if (cache.tail != none) cache.next[cache.tail] = page else cache.head = page;
        cache.tail = page;
        cache.evictable += 1;
    }

    fn unlink(cache: *PrefixCache, page: u32) void {
        const p = cache.prev[page];
        const q = cache.next[page];
        if (p != none) cache.next[p] = q else cache.head = q;
        if (q != none) cache.prev[q] = p else cache.tail = p;
        cache.evictable -= 1;
    }
};

test "a prompt's full pages are found again, only with equal tokens in the same chain" {
    const gpa = std.testing.allocator;
    var cache = try PrefixCache.init(gpa, 8, 2);
    defer cache.deinit(gpa);
    const first = [_]u32{ 1, 2, 3, 4, 5 };
    try std.testing.expect(cache.register(0, null, first[0..2]));
    try std.testing.expect(cache.register(1, 0, first[2..4]));
    cache.release(0);
    cache.release(1);
    try std.testing.expectEqual(@as(usize, 2), cache.evictable);
    var pages: [4]u32 = undefined;
    // The same start finds both pages; a different second page finds only the first.
    try std.testing.expectEqual(@as(usize, 2), cache.lookup(&.{ 1, 2, 3, 4, 9 }, 2, &pages));
    try std.testing.expectEqualSlices(u32, &.{ 0, 1 }, pages[0..2]);
    try std.testing.expectEqual(@as(usize, 0), cache.evictable);
    try std.testing.expectEqual(@as(usize, 1), cache.lookup(&.{ 1, 2, 7, 4 }, 2, &pages));
    try std.testing.expectEqual(@as(u32, 2), cache.refs[0]);
    // Evicting the first page makes its child unreachable: its parent's generation moved on.
    cache.release(0);
    cache.release(0);
    cache.release(1);
    try std.testing.expectEqual(@as(?u32, 0), cache.evict());
    try std.testing.expect(cache.register(0, null, first[0..2]));
    try std.testing.expectEqual(@as(usize, 1), cache.lookup(&first, 2, &pages));
    try std.testing.expectEqual(@as(u32, 0), pages[0]);
}
