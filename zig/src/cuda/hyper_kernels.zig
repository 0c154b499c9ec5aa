//! The host half of zig/kernels/cuda/hyper.cu: the hyper-connection sites' launches. Every launch
//! goes on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_hc_mix", "tf_hc_maps", "tf_hc_collapse", "tf_hc_leave", "tf_hc_spread", "tf_hc_mean" });

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

    /// maps (rows, 2m + m²): each row's pre, post and comb; collapsed (rows, hidden): the
    /// sublayer's input, from streams (rows, m, hidden). raw: (rows, 2m + m² + 1) scratch.
    /// raw (rows, mixes + 1) = the mixing dots, then the streams' sum of squares.
    pub fn mix(k: Kernels, streams: Ptr, site: Site, raw: Ptr, rows: usize, m: usize, hidden: usize) Error!void {
        const mixes = (2 + m) * m;
        try k.run("tf_hc_mix", .{ @intCast(rows), @intCast(mixes + 1), 1 }, threads, .{ streams, site.mix, raw, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
    }

    /// From raw (mix's), the site's maps and the collapse of the streams into `collapsed`.
    pub fn enter(k: Kernels, streams: Ptr, site: Site, raw: Ptr, maps: Ptr, collapsed: Ptr, rows: usize, m: usize, hidden: usize, norm_eps: f32, hc_eps: f32, iters: usize) Error!void {
        try k.run("tf_hc_maps", .{ @intCast(rows), 1, 1 }, 32, .{
            raw,                          site.base, site.scale, maps,                        @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)),
            @as(c_int, @intCast(hidden)), norm_eps,  hc_eps,     @as(c_int, @intCast(iters)),
        });
        try k.run("tf_hc_collapse", .{ @intCast(rows), columns(hidden), 1 }, threads, .{ streams, maps, collapsed, @as(c_int, @intCast(rows)), @as(c_int, @intCast(m)), @as(c_int, @intCast(hidden)) });
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
