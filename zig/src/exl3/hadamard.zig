//! The 128-point Hadamard of EXL3 (EXL3.md §8): natural-order Sylvester, scaled by 1/sqrt(128) so
//! that H·H = I, applied block-diagonally to every aligned 128-chunk.
const std = @import("std");

pub const block = 128;
pub const scale: f32 = 0.08838834764831845; // 1/sqrt(128)

comptime {
    std.debug.assert(block % 16 == 0); // a Hadamard block holds whole trellis tiles
}

const Lanes = @Vector(16, f32);

/// In place on one 128-chunk. The butterfly (a, b) -> (a + b, a - b) over strides 1, 2, .., 64
/// computes x·H128 in natural Sylvester order.
pub fn transform(chunk: *[block]f32) void {
    var stride: usize = 1;
    while (stride < block) : (stride *= 2) {
        var base: usize = 0;
        while (base < block) : (base += 2 * stride) {
            for (base..base + stride) |i| {
                const a = chunk[i];
                const b = chunk[i + stride];
                chunk[i] = a + b;
                chunk[i + stride] = a - b;
            }
        }
    }
    for (chunk) |*v| v.* *= scale;
}

/// Every aligned 128-chunk of a row.
pub fn transformRow(row: []f32) void {
    std.debug.assert(row.len % block == 0);
    var at: usize = 0;
    while (at < row.len) : (at += block) transform(row[at..][0..block]);
}

/// Hk·M for a row-major (rows, columns) matrix: the transform runs down each column, 128 rows at
/// a time, vectorised across columns.
pub fn transformColumns(matrix: []f32, rows: usize, columns: usize) void {
    std.debug.assert(rows % block == 0 and columns % 16 == 0);
    std.debug.assert(matrix.len == rows * columns);
    var row_block: usize = 0;
    while (row_block < rows) : (row_block += block) {
        var stride: usize = 1;
        while (stride < block) : (stride *= 2) {
            var base: usize = 0;
            while (base < block) : (base += 2 * stride) {
                for (base..base + stride) |r| {
                    const top = matrix[(row_block + r) * columns ..][0..columns];
                    const bottom = matrix[(row_block + r + stride) * columns ..][0..columns];
                    var c: usize = 0;
                    while (c < columns) : (c += 16) {
                        const a: Lanes = top[c..][0..16].*;
                        const b: Lanes = bottom[c..][0..16].*;
                        top[c..][0..16].* = a + b;
                        bottom[c..][0..16].* = a - b;
                    }
                }
            }
        }
        const scale_lanes: Lanes = @splat(scale);
        for (matrix[row_block * columns ..][0 .. block * columns], 0..) |_, i| {
            if (i % 16 != 0) continue;
            const at = row_block * columns + i;
            const v: Lanes = matrix[at..][0..16].*;
            matrix[at..][0..16].* = v * scale_lanes;
        }
    }
}

test "H is its own inverse and matches the Sylvester definition" {
    var x: [block]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = @floatFromInt(@as(i32, @intCast(i % 7)) - 3);
    const original = x;
    var unit: [block]f32 = @splat(0);
    unit[5] = 1;
    transform(&unit);
    for (unit, 0..) |v, j| {
        const sign: f32 = if (@popCount(@as(u32, 5) & @as(u32, @intCast(j))) % 2 == 0) 1 else -1;
        try std.testing.expectApproxEqAbs(sign * scale, v, 1e-7);
    }
    transform(&x);
    transform(&x);
    for (x, original) |a, b| try std.testing.expectApproxEqAbs(b, a, 1e-5);
}

test "column transform equals the row transform of the transpose" {
    const rows = 128;
    const columns = 32;
    var matrix: [rows * columns]f32 = undefined;
    var prng = std.Random.DefaultPrng.init(3);
    for (&matrix) |*v| v.* = prng.random().floatNorm(f32);
    var column: [block]f32 = undefined;
    for (0..rows) |r| column[r] = matrix[r * columns + 7];
    transform(&column);
    transformColumns(&matrix, rows, columns);
    for (0..rows) |r| try std.testing.expectApproxEqAbs(column[r], matrix[r * columns + 7], 1e-5);
}
