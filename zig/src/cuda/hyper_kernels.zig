//! The host half of zig/kernels/cuda/hyper.cu: the hyper-connection sites' launches. Every launch
//! goes on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const glm_kernels = @import("glm_kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_hc_mix", "tf_hc_maps", "tf_hc_collapse", "tf_hc_collapse_norm", "tf_hc_enter", "tf_hc_leave", "tf_hc_leave_combined", "tf_hc_spread", "tf_hc_mean" });

/// kMultMax in hyper.cu (config.zig's hyper_mult_max): comb's entries fit a warp.
pub const mult_max = 5;
const threads = 256;

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.hyper, "hyper", diag);
}

/// One site's weights on the device: the (2m + m², m·hidden) mixing matrix, base, scale.
pub const Site = struct { mix: Ptr, base: Ptr, scale: Ptr };

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        try gpu_mod.launchValues(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 } }, args, "launch " ++ name, k.diag);
    }

    fn columns(hidden: usize) u32 {
        return @intCast(std.math.divCeil(usize, hidden, threads) catch unreachable);
    }

    /// raw (rows, mixes + 1) = the mixing dots, then the streams' sum of squares.
    pub fn mix(k: Kernels, streams: Ptr, site: Site, raw: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        const mixes = (2 + m) * m;
        try k.run("tf_hc_mix", .{ @intCast(rows), @intCast(mixes + 1), 1 }, threads, .{ streams, site.mix, raw, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }

    /// `out` (rows, 2m + m²): each row's pre, post and comb, from the dots and sum of squares as
    /// `splits` partial sums each (sums[(row·(mixes + 1) + j)·splits + s]; mix's raw: splits 1).
    pub fn mapsFrom(k: Kernels, sums: Ptr, splits: usize, site: Site, out: Ptr, rows: usize, m: usize, hidden: usize, norm_eps: f32, hc_eps: f32, iters: usize) Error!void {
        try k.run("tf_hc_maps", .{ @intCast(rows), 1, 1 }, 32, .{
            sums,                    @as(c_int, @intCast(splits)), site.base, site.scale, out,                         @as(c_int, @intCast(rows)),
            @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)), norm_eps,  hc_eps,     @as(c_int, @intCast(iters)),
        });
    }

    /// collapsed (rows, hidden) = Σ_s pre_s·stream_s, the sublayer's input.
    pub fn collapse(k: Kernels, streams: Ptr, maps: Ptr, collapsed: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        try k.run("tf_hc_collapse", .{ @intCast(rows), columns(hidden), 1 }, threads, .{ streams, maps, collapsed, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }

    /// Whether collapseNorm takes rows of `hidden` (kNormCache float4 per thread in hyper.cu).
    pub fn collapseNormFits(hidden: usize) bool {
        return hidden % 4 == 0 and hidden <= 4 * threads * 8;
    }

    /// normed (rows, hidden) = RMSNorm(Σ_s pre_s·stream_s) · weight: collapse and the site's norm
    /// in one launch.
    pub fn collapseNorm(k: Kernels, streams: Ptr, maps: Ptr, weight: Ptr, normed: Ptr, rows: usize, m: usize, hidden: usize, eps: f32) Error!void {
        std.debug.assert(collapseNormFits(hidden));
        try k.run("tf_hc_collapse_norm", .{ @intCast(rows), 1, 1 }, threads, .{ streams, maps, weight, normed, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)), eps });
    }

    /// kEnterSplits in hyper.cu: the split sums of one row that tf_hc_enter stages.
    pub const enter_splits_max = 128;

    /// The most rows enter is for: with a block per row and one warp of it on the maps, 1024 prompt
    /// rows took 146.7 us a site where the launches apart took 139.5 (H200 tf-bench --next, M = 1:
    /// 14.9 against 16.0); up to 64 rows, at most one block per SM on the GPUs we serve.
    pub const enter_rows_max = 64;

    /// Whether enter takes these rows: collapseNorm's widths, at most enter_splits_max splits and
    /// enter_rows_max rows.
    pub fn enterFits(hidden: usize, splits: usize, rows: usize) bool {
        return collapseNormFits(hidden) and splits <= enter_splits_max and rows <= enter_rows_max;
    }

    /// mapsFrom then collapseNorm in one launch, the same bits: `maps` still receives the maps
    /// for leave.
    pub fn enter(k: Kernels, sums: Ptr, splits: usize, site: Site, maps: Ptr, streams: Ptr, weight: Ptr, normed: Ptr, rows: usize, m: usize, hidden: usize, norm_eps: f32, hc_eps: f32, iters: usize) Error!void {
        std.debug.assert(collapseNormFits(hidden) and splits <= enter_splits_max);
        try k.run("tf_hc_enter", .{ @intCast(rows), 1, 1 }, threads, .{
            sums,                         @as(c_int, @intCast(splits)), site.base, site.scale,                  maps,
            streams,                      weight,                       normed,    @as(c_int, @intCast(rows)),  @as(c_int, @intCast(m)),
            @as(c_int, @intCast(hidden)), norm_eps,                     hc_eps,    @as(c_int, @intCast(iters)), norm_eps,
        });
    }

    /// leave of the MoE block's combined output, computed in place of its load (tf_moe_combine
    /// then leave in one launch, the same bits).
    pub fn leaveCombined(k: Kernels, streams: Ptr, maps: Ptr, combine: glm_kernels.MoeCombine, rows: usize, m: usize, hidden: usize) Error!void {
        try k.run("tf_hc_leave_combined", .{ @intCast(rows), columns(hidden), 1 }, threads, .{
            streams,                    maps,                                combine.expert_out,      combine.weights,              combine.shared,
            @as(c_int, @intCast(rows)), @as(c_int, @intCast(combine.slots)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)),
        });
    }

    /// streams += the sublayer's output `out` (rows, hidden) through the maps `enter` left.
    pub fn leave(k: Kernels, streams: Ptr, maps: Ptr, out: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        try k.run("tf_hc_leave", .{ @intCast(rows), columns(hidden), 1 }, threads, .{ streams, maps, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }

    /// Every stream of each row = x (rows, hidden).
    pub fn spread(k: Kernels, x: Ptr, streams: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        try k.run("tf_hc_spread", .{ @intCast(rows), columns(hidden), 1 }, threads, .{ x, streams, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }

    /// out (rows, hidden) = the mean of each row's streams.
    pub fn mean(k: Kernels, streams: Ptr, out: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        try k.run("tf_hc_mean", .{ @intCast(rows), columns(hidden), 1 }, threads, .{ streams, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }
};
