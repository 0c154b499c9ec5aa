//! The host half of zig/kernels/cuda/dsa.cu: the DSA lightning indexer's launches. Every launch goes
//! on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const mla = @import("mla_kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_dsa_prepare", "tf_dsa_scores", "tf_dsa_scores_lanes", "tf_dsa_topk" });

/// The shapes dsa.cu is built for (kIndexHeadDim, kIndexHeadsMax, kIndexRope).
pub const head_dim = 128;
pub const heads_max = 64;
pub const rope = 64;
/// Rows whose scores one tf_dsa_scores / tf_dsa_topk pair holds at a time: the score buffer is
/// score_rows x context_max floats, whatever the step's rows (a 1024-row chunk at a 128k context
/// would need 512 MB at once).
pub const score_rows = 64;
/// The scores' threads per block (kScoreTile), and a row's blocks at most (a block then takes
/// several rounds of positions: a round is 128 positions, a thread each, or 32 with four lanes).
const score_threads = 128;
const score_columns = 512;
/// The four-lanes form (tf_dsa_scores_lanes) where a chunk's rows x rounds of 32 make at most this
/// many blocks: there it gives four times the warps (one row at 8k: 36.6 -> 25.5 us with the
/// top-k); with more blocks each lane's loads of the whole key cost more than the warps give (one
/// row at 128k: 330 -> 347 us). H200, docs/measurements.md.
const lanes_blocks_max = 512;

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.dsa, "dsa", diag);
}

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        try gpu_mod.launch(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 } }, args, "launch " ++ name, k.diag);
    }

    /// The key's LayerNorm and RoPE, its cache write, the queries' RoPE, the head weights' scale.
    pub fn prepare(k: Kernels, q: Ptr, key: Ptr, weights: Ptr, norm_weight: Ptr, norm_bias: Ptr, cos_sin: Ptr, p: mla.Paged, heads: usize, eps: f32) Error!void {
        const weight_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(heads))));
        var a = .{
            q,                                   key,             weights,                        p.cache,
            norm_weight,                         norm_bias,       cos_sin,                        p.positions,
            p.tables,                            p.table_offsets, @as(c_int, @intCast(p.rows)),   @as(c_int, @intCast(heads)),
            eps,                                 weight_scale,    @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)),
            @as(c_int, @intCast(p.page_tokens)),
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_dsa_prepare", .{ @intCast(p.rows), 1, 1 }, 256, ptrs);
    }

    /// Rows first .. first + chunk: the `topk` best candidates of each (positions, or with `pool`
    /// > 1 its complete pools) from their scores (chunk x context_max), ascending, and the count.
    pub fn topk(k: Kernels, scores: Ptr, positions: Ptr, selected: Ptr, counts: Ptr, first: usize, chunk: usize, rows: usize, count: usize, context_max: usize, pool: usize) Error!void {
        var t = .{ scores, positions, selected, counts, @as(c_int, @intCast(first)), @as(c_int, @intCast(rows)), @as(c_int, @intCast(count)), @as(c_int, @intCast(context_max)), @as(c_int, @intCast(pool)) };
        try k.run("tf_dsa_topk", .{ @intCast(chunk), 1, 1 }, 1024, .{ &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8] });
    }

    /// Every row's selection into `selection` (selected: rows x topk u32, counts: rows), through
    /// `scores` (score_rows x context_max f32), score_rows rows at a time.
    pub fn select(k: Kernels, q: Ptr, weights: Ptr, scores: Ptr, selection: mla.Selection, p: mla.Paged, heads: usize, context_max: usize) Error!void {
        // A runtime value: a comptime-known one would make its tuple field comptime, and its
        // address unavailable to the launch.
        var score_scale: f32 = undefined;
        score_scale = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(head_dim))));
        var first: usize = 0;
        while (first < p.rows) : (first += score_rows) {
            const chunk = @min(score_rows, p.rows - first);
            var a = .{
                q,                                 weights,                        p.cache,                              p.positions,
                p.tables,                          p.table_offsets,                scores,                               @as(c_int, @intCast(first)),
                @as(c_int, @intCast(p.rows)),      @as(c_int, @intCast(heads)),    @as(c_int, @intCast(selection.topk)), score_scale,
                @as(c_int, @intCast(context_max)), @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)),        @as(c_int, @intCast(p.page_tokens)),
            };
            var ptrs: [a.len]?*anyopaque = undefined;
            inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
            const lane_rounds = std.math.divCeil(usize, context_max, 32) catch unreachable;
            if (chunk * lane_rounds <= lanes_blocks_max) {
                try k.run("tf_dsa_scores_lanes", .{ @intCast(chunk), @intCast(@min(lane_rounds, score_columns)), 1 }, score_threads, ptrs);
            } else {
                const rounds = std.math.divCeil(usize, context_max, 128) catch unreachable;
                try k.run("tf_dsa_scores", .{ @intCast(chunk), @intCast(@min(rounds, score_columns)), 1 }, score_threads, ptrs);
            }
            try k.topk(scores, p.positions, selection.selected, selection.counts, first, chunk, p.rows, selection.topk, context_max, 1);
        }
    }
};
