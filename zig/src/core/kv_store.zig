//! One cache part's storage on the host in the engine's KV dtype: `width` values per (page, layer,
//! head, slot), pages as the engine's pool numbers them. f32 keeps the values; f16 rounds them to
//! nearest (saturating at ±65504); fp8 holds e4m3 codes (fp8.zig) with a power-of-two scale per
//! (page, layer, head, slot): one i8 exponent beside each position's codes. The GPU's cache
//! (zig/kernels/cuda/kv_store.cuh) stores the same bytes.
//!
//! Why a scale per position and not one per page: a page fills over many steps, and a shared scale
//! would have to grow with a later, larger position, changing codes an earlier step has already
//! attended to; a row's numbers would then depend on where its prompt was cut into steps. A
//! position's codes and exponent are final when written, so every row gives the same bits in any
//! batch and any chunking, for 1 byte per 128 (head_dim) codes.
const std = @import("std");
const fp8 = @import("fp8.zig");

pub const KvDtype = enum(u32) {
    f32 = 1,
    f16 = 2,
    fp8 = 3,

    pub fn bytes(d: KvDtype) usize {
        return switch (d) {
            .f32 => 4,
            .f16 => 2,
            .fp8 => 1,
        };
    }

    pub fn name(d: KvDtype) []const u8 {
        return @tagName(d);
    }
};

pub const f16_max: f32 = 65504;

pub fn toF16(x: f32) f16 {
    return @floatCast(@min(@max(x, -f16_max), f16_max));
}

pub const KvStore = struct {
    dtype: KvDtype,
    layers: usize,
    heads: usize,
    page_tokens: usize,
    width: usize,
    storage: Storage,

    pub const Storage = union(KvDtype) {
        f32: []f32,
        f16: []f16,
        fp8: struct { codes: []u8, exponents: []i8 },
    };

    pub fn init(gpa: std.mem.Allocator, dtype: KvDtype, pages: usize, layers: usize, heads: usize, page_tokens: usize, width: usize) error{OutOfMemory}!KvStore {
        const units = pages * layers * heads;
        const values = units * page_tokens * width;
        const storage: Storage = switch (dtype) {
            .f32 => .{ .f32 = try gpa.alloc(f32, values) },
            .f16 => .{ .f16 = try gpa.alloc(f16, values) },
            .fp8 => blk: {
                const codes = try gpa.alloc(u8, values);
                errdefer gpa.free(codes);
                break :blk .{ .fp8 = .{ .codes = codes, .exponents = try gpa.alloc(i8, units * page_tokens) } };
            },
        };
        return .{ .dtype = dtype, .layers = layers, .heads = heads, .page_tokens = page_tokens, .width = width, .storage = storage };
    }

    pub fn deinit(store: *KvStore, gpa: std.mem.Allocator) void {
        switch (store.storage) {
            .f32 => |values| gpa.free(values),
            .f16 => |values| gpa.free(values),
            .fp8 => |s| {
                gpa.free(s.codes);
                gpa.free(s.exponents);
            },
        }
        store.* = undefined;
    }

    fn unit(store: *const KvStore, page: u32, layer: usize, head: usize) usize {
        std.debug.assert(layer < store.layers and head < store.heads);
        return (@as(usize, page) * store.layers + layer) * store.heads + head;
    }

    fn offset(store: *const KvStore, page: u32, layer: usize, head: usize, slot: usize) usize {
        std.debug.assert(slot < store.page_tokens);
        return (store.unit(page, layer, head) * store.page_tokens + slot) * store.width;
    }

    /// Stores `values` (width of them) at a position.
    pub fn put(store: *KvStore, page: u32, layer: usize, head: usize, slot: usize, values: []const f32) void {
        std.debug.assert(values.len == store.width);
        const at = store.offset(page, layer, head, slot);
        switch (store.storage) {
            .f32 => |data| @memcpy(data[at..][0..store.width], values),
            .f16 => |data| for (data[at..][0..store.width], values) |*d, v| {
                d.* = toF16(v);
            },
            .fp8 => |s| {
                var amax: f32 = 0;
                for (values) |v| amax = @max(amax, @abs(v));
                const e = fp8.scaleExponent(amax);
                s.exponents[at / store.width] = e;
                for (s.codes[at..][0..store.width], values) |*code, v| code.* = fp8.encode(std.math.ldexp(v, -e));
            },
        }
    }

    /// The values at a position, as f32: a view of the store itself for f32, else widened into
    /// `buffer` (at least width long).
    pub fn get(store: *const KvStore, page: u32, layer: usize, head: usize, slot: usize, buffer: []f32) []const f32 {
        const at = store.offset(page, layer, head, slot);
        const out = buffer[0..store.width];
        switch (store.storage) {
            .f32 => |data| return data[at..][0..store.width],
            .f16 => |data| for (out, data[at..][0..store.width]) |*o, d| {
                o.* = d;
            },
            .fp8 => |s| {
                const scale = fp8.pow2(s.exponents[at / store.width]);
                for (out, s.codes[at..][0..store.width]) |*o, code| o.* = fp8.decoded[code] * scale;
            },
        }
        return out;
    }
};

test "each dtype stores and returns a position's values within its rounding" {
    const gpa = std.testing.allocator;
    var rng = std.Random.DefaultPrng.init(7);
    const random = rng.random();
    for ([_]KvDtype{ .f32, .f16, .fp8 }) |dtype| {
        var store = try KvStore.init(gpa, dtype, 3, 2, 2, 4, 8);
        defer store.deinit(gpa);
        var values: [8]f32 = undefined;
        for (&values) |*v| v.* = random.floatNorm(f32) * 3;
        store.put(2, 1, 1, 0, &values);
        var buffer: [8]f32 = undefined;
        const got = store.get(2, 1, 1, 0, &buffer);
        for (values, got) |v, g| {
            const bound: f32 = switch (dtype) {
                .f32 => 0,
                .f16 => @abs(v) * 0x1p-11,
                .fp8 => @max(@abs(v) * 0x1p-4, 0x1p-9 * 16),
            };
            try std.testing.expect(@abs(v - g) <= bound);
        }
    }
}

test "an fp8 position keeps its codes whatever is written after it" {
    const gpa = std.testing.allocator;
    var store = try KvStore.init(gpa, .fp8, 2, 1, 1, 4, 4);
    defer store.deinit(gpa);
    const rows = [_][4]f32{ .{ 0.5, -0.25, 0.125, 1 }, .{ 3, 1, -2, 0.75 }, .{ 40, 0.5, 0.25, -1 } };
    store.put(0, 0, 0, 0, &rows[0]);
    const first = store.storage.fp8.codes[0..4].*;
    for (rows[1..], 1..) |row, slot| store.put(0, 0, 0, slot, &row);
    try std.testing.expectEqual(first, store.storage.fp8.codes[0..4].*);
    var buffer: [4]f32 = undefined;
    for (rows[0], store.get(0, 0, 0, 0, &buffer)) |v, g| try std.testing.expectEqual(v, g);
    try std.testing.expectEqual(fp8.scaleExponent(40), store.storage.fp8.exponents[2]);
}
