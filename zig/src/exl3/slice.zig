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
    std.debug.assert(range.begin % hadamard.block == 0 and range.end % hadamard.block == 0 and range.end > range.begin);
    const rows = if (axis == .rows) range.len() else layer.rows;
    const columns = if (axis == .columns) range.len() else layer.columns;
    const per_tile = layer.rate.wordsPerTile();
    const words_len = (rows / 16) * (columns / 16) * per_tile;
    const owned = try gpa.alloc(u16, words_len + rows + columns);
    errdefer gpa.free(owned);
    const words = owned[0..words_len];
    const tile_columns = columns / 16;
    for (0..rows / 16) |tile_row| {
        for (0..tile_columns) |tile_column| {
            const source_row = if (axis == .rows) range.begin / 16 + tile_row else tile_row;
            const source_column = if (axis == .columns) range.begin / 16 + tile_column else tile_column;
            @memcpy(words[(tile_row * tile_columns + tile_column) * per_tile ..][0..per_tile], layer.tileWords(source_row, source_column));
        }
    }
    const suh = owned[words_len..][0..rows];
    const svh = owned[words_len + rows ..][0..columns];
    for (suh, 0..) |*v, i| v.* = layer.suh[if (axis == .rows) range.begin + i else i];
    for (svh, 0..) |*v, i| v.* = layer.svh[if (axis == .columns) range.begin + i else i];

    var bias: ?[]f32 = null;
    if (layer.bias) |source| {
        if (axis == .columns or keep_bias) {
            const values = try gpa.alloc(f32, columns);
            for (values, 0..) |*v, i| {
                const n = if (axis == .columns) range.begin + i else i;
                v.* = if (n < source.len()) source.get(n) else 0;
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

test "units split evenly, or one more to the lower ranks" {
    try std.testing.expectEqual(Range{ .begin = 0, .end = 768 }, unitRange(1408, 2, 0));
    try std.testing.expectEqual(Range{ .begin = 768, .end = 1408 }, unitRange(1408, 2, 1));
    try std.testing.expectEqual(Range{ .begin = 5504, .end = 11008 }, unitRange(10944, 2, 1));
    try std.testing.expectEqual(Range{ .begin = 0, .end = 768 }, unitRange(1536, 2, 0));
}
