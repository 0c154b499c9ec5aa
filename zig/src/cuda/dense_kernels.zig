//! The host half of glm_forward.cu's unquantized projections (dense_linear.cuh): their launches
//! and grids, methods of glm_kernels.Kernels by re-export. Every launch goes on the GPU's stream.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const Kernels = @import("glm_kernels.zig").Kernels;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

/// A warp per (row, output), 8 warps per block.
pub fn denseLinear(k: Kernels, x: Ptr, weight: Ptr, bias: Ptr, y: Ptr, rows: usize, in_features: usize, out_features: usize) Error!void {
    k.gpu.noteReads(in_features * out_features * @sizeOf(f32));
    var a = .{ x, weight, bias, y, @as(c_int, @intCast(rows)), @as(c_int, @intCast(in_features)), @as(c_int, @intCast(out_features)) };
    try k.run("tf_dense_matmul", .{ Kernels.blocks(rows * out_features, 8), 1, 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6] });
}

/// Blocks per 32-output tile that share the k steps of an unquantized weight (tf_dense_half,
/// tf_dense_f32): enough
/// tiles x splits to spread a skinny weight (K 4096 x N 64..128, GLM-5.3-Flash's gates) over
/// ~128 blocks, each warp keeping at least two k steps. A function of the shape alone, so a row's
/// sum does not depend on its batch; splits x out_features <= 4096 whenever splits > 1.
pub fn denseSplits(in_features: usize, out_features: usize) usize {
    const tiles = std.math.divCeil(usize, out_features, 32) catch unreachable;
    return @max(1, @min(128 / tiles, in_features / 16 / 16));
}

/// An unquantized weight on the tensor cores: tf_dense_half (f16 weight) or tf_dense_f32. x's
/// rows are x_stride floats apart (0: in_features), y's y_stride (out_features for a plain
/// projection); with `squares`, Σ x²
/// of each row lands at column out_features. With splits > 1 the blocks leave their sums in
/// `partial` (denseScratch floats) and tf_dense_splits adds them.
pub const DenseCall = struct {
    x: Ptr,
    weight: Ptr,
    half: bool,
    bias: Ptr = 0,
    y: Ptr,
    x_stride: usize = 0,
    y_stride: usize,
    partial: Ptr,
    rows: usize,
    in_features: usize,
    out_features: usize,
    squares: bool = false,
    /// With splits > 1, leave the splits' sums in `partial` for the caller's next kernel
    /// (partial[(row·(out_features + squares) + j)·splits + s]) instead of adding them.
    reduce: bool = true,
};

/// The floats of `partial` a DenseCall of `rows` rows needs.
pub fn denseScratch(rows: usize, in_features: usize, out_features: usize, squares: bool) usize {
    const splits = denseSplits(in_features, out_features);
    return if (splits == 1) 0 else splits * rows * (out_features + @intFromBool(squares));
}

pub fn denseMma(k: Kernels, c: DenseCall) Error!void {
    const splits = denseSplits(c.in_features, c.out_features);
    const x_stride = if (c.x_stride == 0) c.in_features else c.x_stride;
    std.debug.assert(c.in_features % 16 == 0 and c.x % 16 == 0 and x_stride % 4 == 0);
    var a = .{
        c.x,                          c.weight,                            c.bias,                               c.y,                            c.partial,
        @as(c_int, @intCast(c.rows)), @as(c_int, @intCast(c.in_features)), @as(c_int, @intCast(c.out_features)), @as(c_int, @intCast(x_stride)), @as(c_int, @intCast(c.y_stride)),
        @as(c_int, @intCast(splits)), @as(c_int, @intFromBool(c.squares)),
    };
    var ptrs: [a.len]*anyopaque = undefined;
    inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
    const grid = [3]u32{ Kernels.blocks(c.out_features, 32), @intCast(splits), Kernels.blocks(c.rows, 32) };
    k.gpu.noteReads(c.in_features * c.out_features * @as(u64, if (c.half) 2 else 4));
    if (c.half) try k.run("tf_dense_half", grid, 256, ptrs) else try k.run("tf_dense_f32", grid, 256, ptrs);
    if (splits == 1 or !c.reduce) return;
    const pitch = c.out_features + @intFromBool(c.squares);
    var b = .{ c.partial, c.bias, c.y, @as(c_int, @intCast(c.rows)), @as(c_int, @intCast(pitch)), @as(c_int, @intCast(c.out_features)), @as(c_int, @intCast(c.y_stride)), @as(c_int, @intCast(splits)) };
    try k.run("tf_dense_splits", .{ Kernels.blocks(c.rows * pitch, 8), 1, 1 }, 256, .{ &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7] });
}
