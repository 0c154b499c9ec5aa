//! Tensor-parallel slices of an EXL3 layer, on 128-channel boundaries so that no Hadamard block is
//! cut (EXL3.md §13). Output split (column-parallel): trellis tile columns, svh and bias; suh whole.
//! Input split (row-parallel): trellis tile rows and suh; svh whole; the bias only on the first
//! slice, since the partial outputs are summed. Slices own copies of what they keep.
const std = @import("std");
const Layer = @import("layer.zig").Layer;
const hadamard = @import("hadamard.zig");
const trellis = @import("trellis.zig");

pub const Axis = enum { columns, rows };

pub const Range = struct {
    begin: usize,
    end: usize,

    pub fn len(range: Range) usize {
        return range.end - range.begin;
    }
};

/// Rank `rank` of `world`'s share of `size` channels in whole 128-channel units (EXL3.md §13):
/// an odd number of units gives the lower ranks one more.
pub fn unitRange(size: usize, world: usize, rank: usize) Range {
    std.debug.assert(rank < world and world >= 1);
    const units = std.math.divCeil(usize, size, hadamard.block) catch unreachable;
    const base = units / world;
    const extra = units % world;
    const begin = rank * base + @min(rank, extra);
    const count = base + @intFromBool(rank < extra);
    return .{ .begin = begin * hadamard.block, .end = (begin + count) * hadamard.block };
}

/// A copy of `layer` restricted to `range` of its padded columns (output channels) or rows (input
/// channels). `keep_bias`: whether this slice carries the bias (always for columns).
pub fn slice(gpa: std.mem.Allocator, layer: *const Layer, axis: Axis, range: Range, keep_bias: bool) error{OutOfMemory}!Layer {
    return sliceRanges(gpa, layer, axis, &.{range}, keep_bias);
}

/// `slice` over several ranges of one axis, kept in their order one after the other: a rank's part
/// of a fused projection whose outputs are parts side by side (KDA's [q | k | v]) stays one layer.
pub fn sliceRanges(gpa: std.mem.Allocator, layer: *const Layer, axis: Axis, ranges: []const Range, keep_bias: bool) error{OutOfMemory}!Layer {
    var kept: usize = 0;
    for (ranges) |range| {
        std.debug.assert(range.begin % hadamard.block == 0 and range.end % hadamard.block == 0 and range.end > range.begin);
        kept += range.len();
    }
    const rows = if (axis == .rows) kept else layer.rows;
    const columns = if (axis == .columns) kept else layer.columns;
    const per_tile = layer.rate.wordsPerTile();
    const words_len = (rows / 16) * (columns / 16) * per_tile;
    const owned = try gpa.alloc(u16, words_len + rows + columns);
    errdefer gpa.free(owned);
    const words = owned[0..words_len];
    const tile_columns = columns / 16;
    for (0..rows / 16) |tile_row| {
        for (0..tile_columns) |tile_column| {
            const source_row = if (axis == .rows) source(ranges, 16 * tile_row) / 16 else tile_row;
            const source_column = if (axis == .columns) source(ranges, 16 * tile_column) / 16 else tile_column;
            @memcpy(words[(tile_row * tile_columns + tile_column) * per_tile ..][0..per_tile], layer.tileWords(source_row, source_column));
        }
    }
    const suh = owned[words_len..][0..rows];
    const svh = owned[words_len + rows ..][0..columns];
    for (suh, 0..) |*v, i| v.* = layer.suh[if (axis == .rows) source(ranges, i) else i];
    for (svh, 0..) |*v, i| v.* = layer.svh[if (axis == .columns) source(ranges, i) else i];

    var bias: ?[]f32 = null;
    if (layer.bias) |values_of| {
        if (axis == .columns or keep_bias) {
            const values = try gpa.alloc(f32, columns);
            for (values, 0..) |*v, i| {
                const n = if (axis == .columns) source(ranges, i) else i;
                v.* = if (n < values_of.len()) values_of.get(n) else 0;
            }
            bias = values;
        }
    }
    return .{
        .rows = rows,
        .columns = columns,
        .rate = layer.rate,
        .codebook = layer.codebook,
        .words = words,
        .suh = suh,
        .svh = svh,
        .bias = if (bias) |b| .{ .f32 = b } else null,
        .owned = null,
        .owned_slice = owned,
        .owned_bias = bias,
    };
}

/// The channel of the source that channel `i` of the ranges laid end to end is.
fn source(ranges: []const Range, i: usize) usize {
    var rest = i;
    for (ranges) |range| {
        if (rest < range.len()) return range.begin + rest;
        rest -= range.len();
    }
    unreachable;
}

test "units split evenly, or one more to the lower ranks" {
    try std.testing.expectEqual(Range{ .begin = 0, .end = 768 }, unitRange(1408, 2, 0));
    try std.testing.expectEqual(Range{ .begin = 768, .end = 1408 }, unitRange(1408, 2, 1));
    try std.testing.expectEqual(Range{ .begin = 5504, .end = 11008 }, unitRange(10944, 2, 1));
    try std.testing.expectEqual(Range{ .begin = 0, .end = 768 }, unitRange(1536, 2, 0));
}

test "several column ranges equal their single slices side by side" {
    const gpa = std.testing.allocator;
    const rate = trellis.Rate.fromWordsPerTile(48).?; // K = 3
    const rows = 128;
    const columns = 3 * 256;
    const per_tile = rate.wordsPerTile();
    const words = try gpa.alloc(u16, (rows / 16) * (columns / 16) * per_tile);
    defer gpa.free(words);
    const scales = try gpa.alloc(u16, rows + columns);
    defer gpa.free(scales);
    const bias = try gpa.alloc(f32, columns);
    defer gpa.free(bias);
    for (words, 0..) |*w, i| w.* = @truncate(i *% 40503);
    for (scales, 0..) |*v, i| v.* = @truncate(i);
    for (bias, 0..) |*v, i| v.* = @floatFromInt(i);
    const layer: Layer = .{ .rows = rows, .columns = columns, .rate = rate, .codebook = .mul1, .words = words, .suh = scales[0..rows], .svh = scales[rows..], .bias = .{ .f32 = bias }, .owned = null };
    // A rank's heads 128..256 of each of the three parts.
    const ranges = [_]Range{ .{ .begin = 128, .end = 256 }, .{ .begin = 384, .end = 512 }, .{ .begin = 640, .end = 768 } };
    var fused = try sliceRanges(gpa, &layer, .columns, &ranges, true);
    defer fused.deinit(gpa);
    try std.testing.expectEqual(@as(usize, 384), fused.columns);
    try std.testing.expect(sameHalves(layer.suh, fused.suh));
    for (ranges, 0..) |range, part| {
        var alone = try slice(gpa, &layer, .columns, range, true);
        defer alone.deinit(gpa);
        for (0..rows / 16) |r| for (0..range.len() / 16) |c| {
            try std.testing.expect(sameHalves(alone.tileWords(r, c), fused.tileWords(r, part * 8 + c)));
        };
        try std.testing.expect(sameHalves(alone.svh, fused.svh[part * 128 ..][0..128]));
        for (alone.bias.?.f32, fused.bias.?.f32[part * 128 ..][0..128]) |x, y| try std.testing.expectEqual(x, y);
    }
}

fn sameHalves(a: []align(1) const u16, b: []align(1) const u16) bool {
    if (a.len != b.len) return false;
    for (a, b) |x, y| if (x != y) return false;
    return true;
}
