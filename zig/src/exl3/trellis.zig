//! One 16x16 trellis tile: its bitstream, its 256 tail-biting 16-bit states and where each lands
//! in the tile (EXL3.md §4, §5, §7). zig/kernels/cuda/exl3_trellis.cuh is the device half.
const std = @import("std");
const codebook = @import("codebook.zig");

pub const tile_size = 16;
pub const tile_weights = tile_size * tile_size;

/// Bits per weight, doubled so that the half-integer rates are integers: 2..16 for K = 1..8, and
/// 3, 5, 7 for K = 1.5, 2.5, 3.5. Every rate stores 8·bits2 int16 words per tile, a ring of
/// 128·bits2 bits.
pub const Rate = struct {
    bits2: u8,

    pub fn fromWordsPerTile(words: u64) ?Rate {
        if (words % 8 != 0) return null;
        const bits2 = words / 8;
        const integer = bits2 % 2 == 0 and bits2 >= 2 and bits2 <= 16;
        const half = bits2 == 3 or bits2 == 5 or bits2 == 7;
        return if (integer or half) .{ .bits2 = @intCast(bits2) } else null;
    }

    pub fn isHalf(rate: Rate) bool {
        return rate.bits2 % 2 == 1;
    }

    pub fn wordsPerTile(rate: Rate) usize {
        return 8 * @as(usize, rate.bits2);
    }

    pub fn ringBits(rate: Rate) u32 {
        return 128 * @as(u32, rate.bits2);
    }

    /// The stream bit just past position i's symbol: (i+1)·K for integer K; for K = KA + ½ odd
    /// positions carry KA+1 bits (the 0xAAAA pattern), so 16 positions take 16·KA + 8 bits.
    pub fn endBit(rate: Rate, position: u32) u32 {
        std.debug.assert(position < tile_weights);
        if (!rate.isHalf()) return (position + 1) * (rate.bits2 / 2);
        const low: u32 = rate.bits2 / 2;
        const group = position / 16;
        const within = position % 16 + 1; // positions group*16 .. position, inclusive
        return group * (16 * low + 8) + within * low + within / 2;
    }
};

/// PERM[i] = 16·r + c: the tile element that trellis position i decodes to (EXL3.md §4, the
/// mma.m16n8k16 B-fragment order).
pub const perm: [tile_weights]u16 = blk: {
    var table: [tile_weights]u16 = undefined;
    for (0..tile_weights) |i| {
        const t = i / 8;
        const e = i % 8;
        const rows = [8]usize{ 0, 1, 8, 9, 0, 1, 8, 9 };
        const r = 2 * (t % 4) + rows[e];
        const c = t / 4 + (if (e >= 4) 8 else 0);
        table[i] = @intCast(16 * r + c);
    }
    break :blk table;
};

/// The 256 states of one tile in position order. `words` are the tile's stored int16 elements.
pub fn states(rate: Rate, words: []align(1) const u16, out: *[tile_weights]u16) void {
    std.debug.assert(words.len == rate.wordsPerTile());
    // Element pairs (2w, 2w+1) form a little-endian u32 whose MSB is the earliest stream bit.
    var ring: [64]u32 = undefined;
    const ring_words = words.len / 2;
    for (ring[0..ring_words], 0..) |*word, w| {
        word.* = @as(u32, words[2 * w]) | (@as(u32, words[2 * w + 1]) << 16);
    }
    const ring_bits = rate.ringBits();
    for (out, 0..) |*state, position| {
        // A 16-bit window ending at endBit, read cyclically (EXL3.md §5 word-level extraction).
        const end = rate.endBit(@intCast(position)) + ring_bits;
        const begin = end - 16;
        const high = ring[(begin >> 5) % ring_words];
        const low = ring[((end - 1) >> 5) % ring_words];
        const shift: u6 = @intCast(32 * (((end - 1) >> 5) + 1) - end);
        const window = (@as(u64, high) << 32) | low;
        state.* = @truncate(window >> shift);
    }
}

/// fp16 bits of the tile, row-major (element 16·r + c is W[16tk + r, 16tn + c]).
pub fn decodeTileBits(rate: Rate, cb: codebook.Codebook, words: []align(1) const u16, out: *[tile_weights]u16) void {
    var tile_states: [tile_weights]u16 = undefined;
    states(rate, words, &tile_states);
    for (tile_states, perm) |state, element| out[element] = codebook.decode(cb, state);
}

/// The tile as f32, row-major, through the codebook's lookup table.
pub fn decodeTile(rate: Rate, values: *const codebook.Table, words: []align(1) const u16, out: *[tile_weights]f32) void {
    var tile_states: [tile_weights]u16 = undefined;
    states(rate, words, &tile_states);
    for (tile_states, perm) |state, element| out[element] = values[state];
}

test "PERM starts as EXL3.md §4 lists" {
    const expected = [_]u16{ 0, 16, 128, 144, 8, 24, 136, 152, 32, 48, 160, 176, 40, 56, 168, 184, 64, 80, 192, 208, 72, 88, 200, 216, 96, 112, 224, 240, 104, 120, 232, 248 };
    try std.testing.expectEqualSlices(u16, &expected, perm[0..32]);
    var seen: [tile_weights]bool = @splat(false);
    for (perm) |element| seen[element] = true;
    for (seen) |s| try std.testing.expect(s);
}

/// Packs symbols MSB first into the stored element order (EXL3.md §5, §11.6): the inverse of
/// `states`. For integer K the symbol of a position is the low K bits of its state.
pub fn packSymbols(rate: Rate, symbols: []const u8, words: []u16) void {
    var ring: [64]u32 = @splat(0);
    var bit: u32 = 0;
    for (symbols, 0..) |symbol, position| {
        const width = rate.endBit(@intCast(position)) - bit;
        var k: u32 = width;
        while (k > 0) : (k -= 1) {
            const value = (symbol >> @intCast(k - 1)) & 1;
            ring[bit / 32] |= @as(u32, value) << @intCast(31 - bit % 32);
            bit += 1;
        }
    }
    for (0..words.len / 2) |w| {
        words[2 * w] = @truncate(ring[w]);
        words[2 * w + 1] = @truncate(ring[w] >> 16);
    }
}

test "K=4 and K=3 test vectors of EXL3.md §5" {
    var symbols: [tile_weights]u8 = undefined;
    var words: [64]u16 = undefined;
    var out: [tile_weights]u16 = undefined;

    for (&symbols, 0..) |*s, i| s.* = @intCast(i & 15);
    const k4: Rate = .{ .bits2 = 8 };
    packSymbols(k4, &symbols, &words);
    try std.testing.expectEqualSlices(u16, &.{ 0x4567, 0x0123, 0xCDEF, 0x89AB, 0x4567, 0x0123 }, words[0..6]);
    states(k4, &words, &out);
    try std.testing.expectEqualSlices(u16, &.{ 0xDEF0, 0xEF01, 0xF012, 0x0123 }, out[0..4]);
    try std.testing.expectEqual(@as(u16, 0xCDEF), out[255]);

    for (&symbols, 0..) |*s, i| s.* = @intCast(i & 7);
    const k3: Rate = .{ .bits2 = 6 };
    packSymbols(k3, &symbols, words[0..48]);
    try std.testing.expectEqualSlices(u16, &.{ 0x7705, 0x0539, 0x0539, 0x3977, 0x3977, 0x7705 }, words[0..6]);
    states(k3, words[0..48], &out);
    try std.testing.expectEqual(@as(u16, 0xCBB8), out[0]);
    try std.testing.expectEqual(@as(u16, 0x5DC1), out[1]);
    try std.testing.expectEqual(@as(u16, 0x3977), out[255]);
}

test "states follow the shift-register recurrence for every rate" {
    var prng = std.Random.DefaultPrng.init(42);
    const random = prng.random();
    for ([_]u8{ 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16 }) |bits2| {
        const rate: Rate = .{ .bits2 = bits2 };
        try std.testing.expectEqual(rate.ringBits(), rate.endBit(255));
        var symbols: [tile_weights]u8 = undefined;
        var previous_end: u32 = 0;
        for (&symbols, 0..) |*s, i| {
            const width: u5 = @intCast(rate.endBit(@intCast(i)) - previous_end);
            previous_end = rate.endBit(@intCast(i));
            s.* = @intCast(random.uintLessThan(u32, @as(u32, 1) << width));
        }
        var words: [128]u16 = undefined;
        packSymbols(rate, &symbols, words[0..rate.wordsPerTile()]);
        var out: [tile_weights]u16 = undefined;
        states(rate, words[0..rate.wordsPerTile()], &out);
        previous_end = 0;
        for (0..tile_weights) |i| {
            const width: u4 = @intCast(rate.endBit(@intCast(i)) - previous_end);
            previous_end = rate.endBit(@intCast(i));
            const before = out[(i + 255) % 256];
            const expected: u16 = @truncate((@as(u32, before) << width) | symbols[i]);
            try std.testing.expectEqual(expected, out[i]);
        }
    }
}
