//! An EXL3 linear on the CPU: y = ((x ⊙ suh)·Hk)·Wq·Hn ⊙ svh + bias (EXL3.md §8.2, §9) in f32,
//! decoding tile by tile into registers; W is never materialised. Threads split the output
//! columns, so every output element is summed in the same order whatever the thread count: the
//! result is identical for any TF_THREADS.
const std = @import("std");
const core = @import("../core/root.zig");
const codebook = @import("codebook.zig");
const trellis = @import("trellis.zig");
const hadamard = @import("hadamard.zig");
const Layer = @import("layer.zig").Layer;

const Lanes = @Vector(trellis.tile_size, f32);

pub const Shape = struct {
    rows: usize,
    /// Logical sizes; at most the layer's padded sizes, which the input is zero-extended to and
    /// the output trimmed from.
    in_features: usize,
    out_features: usize,
};

/// Scratch for `forward`: (rows, layer.rows) rotated inputs and (rows, layer.columns) sums.
pub fn scratchLength(layer: *const Layer, rows: usize) usize {
    return rows * (layer.rows + layer.columns);
}

pub fn forward(layer: *const Layer, shape: Shape, x: []const f32, y: []f32, scratch: []f32) void {
    std.debug.assert(shape.in_features <= layer.rows and shape.out_features <= layer.columns);
    std.debug.assert(x.len == shape.rows * shape.in_features);
    std.debug.assert(y.len == shape.rows * shape.out_features);
    std.debug.assert(scratch.len >= scratchLength(layer, shape.rows));
    const rotated = scratch[0 .. shape.rows * layer.rows];
    const sums = scratch[rotated.len..][0 .. shape.rows * layer.columns];

    for (0..shape.rows) |m| {
        const source = x[m * shape.in_features ..][0..shape.in_features];
        const target = rotated[m * layer.rows ..][0..layer.rows];
        for (target, 0..) |*v, k| {
            v.* = if (k < shape.in_features) source[k] * half(layer.suh[k]) else 0;
        }
        hadamard.transformRow(target);
    }

    const job: MatmulJob = .{ .layer = layer, .rows = shape.rows, .rotated = rotated, .sums = sums };
    core.parallel.forRange(layer.columns / trellis.tile_size, 1, &job, MatmulJob.run);

    for (0..shape.rows) |m| {
        const row = sums[m * layer.columns ..][0..layer.columns];
        hadamard.transformRow(row);
        const out = y[m * shape.out_features ..][0..shape.out_features];
        for (out, 0..) |*v, n| {
            v.* = row[n] * half(layer.svh[n]);
            if (layer.bias) |bias| {
                if (n < bias.len()) v.* += bias.get(n);
            }
        }
    }
}

const MatmulJob = struct {
    layer: *const Layer,
    rows: usize,
    rotated: []const f32,
    sums: []f32,

    /// Tile columns [begin, end): sums[:, 16·begin .. 16·end) = rotated · Wq[:, same].
    fn run(job: *const MatmulJob, worker: usize, begin: usize, end: usize) void {
        _ = worker;
        const layer = job.layer;
        const values = codebook.table(layer.codebook);
        const tile_rows = layer.rows / trellis.tile_size;
        for (begin..end) |tile_column| {
            for (0..job.rows) |m| {
                job.sums[m * layer.columns + tile_column * 16 ..][0..16].* = @as(Lanes, @splat(0));
            }
            for (0..tile_rows) |tile_row| {
                var tile: [trellis.tile_weights]f32 = undefined;
                trellis.decodeTile(layer.rate, values, layer.tileWords(tile_row, tile_column), &tile);
                for (0..job.rows) |m| {
                    const input = job.rotated[m * layer.rows + tile_row * 16 ..][0..16];
                    const target = job.sums[m * layer.columns + tile_column * 16 ..][0..16];
                    var acc: Lanes = target.*;
                    inline for (0..16) |r| {
                        const weights: Lanes = tile[r * 16 ..][0..16].*;
                        acc += @as(Lanes, @splat(input[r])) * weights;
                    }
                    target.* = acc;
                }
            }
        }
    }
};

/// The whole trellis decode, fp16 bits, (rows, columns) row-major: Wq before the Hadamards.
pub fn decodeInner(layer: *const Layer, out: []u16) void {
    std.debug.assert(out.len == layer.rows * layer.columns);
    const tile_rows = layer.rows / trellis.tile_size;
    const tile_columns = layer.columns / trellis.tile_size;
    for (0..tile_rows) |tile_row| {
        for (0..tile_columns) |tile_column| {
            var tile: [trellis.tile_weights]u16 = undefined;
            trellis.decodeTileBits(layer.rate, layer.codebook, layer.tileWords(tile_row, tile_column), &tile);
            for (0..16) |r| {
                const at = (tile_row * 16 + r) * layer.columns + tile_column * 16;
                @memcpy(out[at..][0..16], tile[r * 16 ..][0..16]);
            }
        }
    }
}

/// W = diag(suh)·Hk·Wq·Hn·diag(svh) (EXL3.md §8.2) in f32, (rows, columns) row-major into `full`,
/// then the top-left (in_features, out_features) block copied to `out`.
pub fn dequantize(layer: *const Layer, in_features: usize, out_features: usize, full: []f32, out: []f32) void {
    std.debug.assert(full.len == layer.rows * layer.columns);
    std.debug.assert(out.len == in_features * out_features);
    const values = codebook.table(layer.codebook);
    const tile_columns = layer.columns / trellis.tile_size;
    for (0..layer.rows / trellis.tile_size) |tile_row| {
        for (0..tile_columns) |tile_column| {
            var tile: [trellis.tile_weights]f32 = undefined;
            trellis.decodeTile(layer.rate, values, layer.tileWords(tile_row, tile_column), &tile);
            for (0..16) |r| {
                const at = (tile_row * 16 + r) * layer.columns + tile_column * 16;
                @memcpy(full[at..][0..16], tile[r * 16 ..][0..16]);
            }
        }
    }
    hadamard.transformColumns(full, layer.rows, layer.columns);
    for (0..layer.rows) |k| hadamard.transformRow(full[k * layer.columns ..][0..layer.columns]);
    for (0..in_features) |k| {
        const scale_row = half(layer.suh[k]);
        for (0..out_features) |n| {
            out[k * out_features + n] = full[k * layer.columns + n] * scale_row * half(layer.svh[n]);
        }
    }
}

fn half(bits: u16) f32 {
    return @floatCast(@as(f16, @bitCast(bits)));
}
