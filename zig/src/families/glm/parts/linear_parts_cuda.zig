//! Linears on one input as one GEMV launch (cuda/exl3_parts.zig): an attention layer's q, k and v,
//! or MLA's q_a and kv_a, when all are EXL3 of one input width, rate and codebook. Generated rows
//! of a decode step (up to exl3_parts.rows_max) take it; prompt steps and more rows run each
//! linear, or pair, on its own as before. Each part keeps its own launch's k split, so an output's
//! bits are the same either way (TF_CUDA_PARTS=0 runs them apart: a test).
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const X = cuda.exl3_parts;
const GpuLinear = @import("linear_cuda.zig").GpuLinear;

pub const Parts = struct {
    list: [X.parts_max]X.Part,
    count: usize,
    in_features: usize,
    k_p: usize,
    bits2: u8,
    codebook: u8,

    /// The partial sums and counters a launch needs: cuda_buffers.zig sizes model.acc for them.
    pub fn scratch(parts: *const Parts, rows_max: usize) X.Scratch {
        return X.scratch(parts.k_p, parts.list[0..parts.count], @min(rows_max, X.rows_max));
    }
};

/// The launch for `linears` (each standing for a launch of `entries[i]` table entries: 2 for a
/// pair's member), or null where one is not EXL3, their input widths, rates or codebooks differ,
/// or TF_CUDA_PARTS=0.
pub fn partsOf(linears: []const *const GpuLinear, entries: []const usize) ?Parts {
    std.debug.assert(linears.len == entries.len and linears.len >= 2 and linears.len <= X.parts_max);
    if (core.switches.off("TF_CUDA_PARTS")) return null;
    if (linears[0].kind != .exl3) return null;
    const first = linears[0].kind.exl3;
    var parts: Parts = .{ .list = undefined, .count = linears.len, .in_features = linears[0].in_features, .k_p = first.k_p, .bits2 = first.bits2, .codebook = first.codebook };
    for (linears, entries, 0..) |linear, n, i| {
        if (linear.kind != .exl3) return null;
        const e = linear.kind.exl3;
        if (linear.in_features != parts.in_features or e.k_p != first.k_p or e.bits2 != first.bits2 or e.codebook != first.codebook) return null;
        parts.list[i] = .{ .layer = e.entry, .n_p = e.n_p, .out_features = linear.out_features, .entries = n };
    }
    return parts;
}

/// The parts over `rows` rows of x into outputs ys (one per part); false, with nothing launched,
/// where this step is not the launch's (a prompt step, more rows, no parts): the caller then runs
/// the linears its own way.
pub fn runParts(model: *GpuModel, k: K.Kernels, parts: ?Parts, x: Ptr, ys: []const Ptr, rows: usize) Error!bool {
    var p = parts orelse return false;
    if (model.step_prompt or rows > X.rowsMax(model.shared_items)) return false;
    std.debug.assert(ys.len == p.count);
    for (p.list[0..p.count], ys) |*part, y| part.y = y;
    try X.run(k, .{
        .x = x,
        .rows = rows,
        .in_features = p.in_features,
        .k_p = p.k_p,
        .bits2 = p.bits2,
        .codebook = p.codebook,
        .acc = model.acc,
        .counters = model.counters,
        .together = model.shared_items,
    }, p.list[0..p.count]);
    return true;
}
