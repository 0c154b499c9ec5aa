//! The host half of zig/kernels/cuda/kpool.cu: the pooled DSA indexer's launches (the pools' top-k
//! is dsa.cu's tf_dsa_topk). Every launch goes on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const mla = @import("mla_kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_kpool_store", "tf_kpool_scores", "tf_kpool_expand" });

/// kDim and kHeadsMax in kpool.cu.
pub const head_dim = 128;
pub const heads_max = 64;
/// kPoolsPerBlock and kScoreThreads in kpool.cu.
const pools_per_block = 64;
const score_threads = 256;

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.kpool, "kpool", diag);
}

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        try gpu_mod.launchValues(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 } }, args, "launch " ++ name, k.diag);
    }

    /// Each row's [LayerNorm(key) | gates] (key, gates: rows x 128) into its slot of `p.cache`.
    pub fn store(k: Kernels, key: Ptr, gates: Ptr, norm_weight: Ptr, norm_bias: Ptr, p: mla.Paged, eps: f32) Error!void {
        try k.run("tf_kpool_store", .{ @intCast(p.rows), 1, 1 }, head_dim, .{
            key,                            gates,                         norm_weight,                         norm_bias,                    p.cache,
            p.positions,                    p.tables,                      p.table_offsets,                     @as(c_int, @intCast(p.rows)), eps,
            @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)), @as(c_int, @intCast(p.page_tokens)),
        });
    }

    /// Rows first .. first + chunk: every complete pool's score into scores (chunk x context_max).
    /// q: rows x heads x 128, weights: rows x heads (weights_proj's output, unscaled).
    pub fn scores(k: Kernels, q: Ptr, weights: Ptr, ape: Ptr, out: Ptr, p: mla.Paged, first: usize, chunk: usize, heads: usize, pool: usize, context_max: usize) Error!void {
        // Runtime values: a comptime-known one would make its tuple field comptime.
        var score_scale: f32 = undefined;
        score_scale = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(head_dim))));
        const weight_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(heads))));
        const tiles: u32 = @intCast(std.math.divCeil(usize, context_max, pools_per_block) catch unreachable);
        try k.run("tf_kpool_scores", .{ @intCast(chunk), tiles, 1 }, score_threads, .{
            q,                              weights,                       p.cache,                             ape,                         p.positions,
            p.tables,                       p.table_offsets,               out,                                 @as(c_int, @intCast(first)), @as(c_int, @intCast(p.rows)),
            @as(c_int, @intCast(heads)),    @as(c_int, @intCast(pool)),    score_scale,                         weight_scale,                @as(c_int, @intCast(context_max)),
            @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)), @as(c_int, @intCast(p.page_tokens)),
        });
    }

    /// The chosen pools (picks: rows x keep, ascending; pick_counts) as positions, then the tail,
    /// into selected (rows x stride) and counts.
    pub fn expand(k: Kernels, picks: Ptr, pick_counts: Ptr, positions: Ptr, selected: Ptr, counts: Ptr, rows: usize, keep: usize, pool: usize, stride: usize, tail: bool) Error!void {
        try k.run("tf_kpool_expand", .{ @intCast(rows), 1, 1 }, 256, .{
            picks,                      pick_counts,                positions,                  selected,                     counts,
            @as(c_int, @intCast(rows)), @as(c_int, @intCast(keep)), @as(c_int, @intCast(pool)), @as(c_int, @intCast(stride)), @as(c_int, @intFromBool(tail)),
        });
    }
};
