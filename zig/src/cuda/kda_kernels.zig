//! The host half of zig/kernels/cuda/kda.cu: Kimi delta attention's launches (GLM-5.3-Flash's
//! linear attention). Every launch goes on the GPU's stream; nothing here synchronizes. The run
//! count is read on the device, so one recorded graph serves every step of the same rows.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_kda_conv", "tf_kda_tail", "tf_kda_recurrent" });

/// The head_dim kda.cu is built for (kKdaDim): tf_kda_recurrent's threads are 4 per value column.
pub const head_dim = 128;
/// The most convolution taps tf_kda_tail holds (kTapsMax).
pub const taps_max = 8;
const conv_threads = 256;
const recurrent_threads = 4 * head_dim;

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.kda, "kda", diag);
}

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        try gpu_mod.launch(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 } }, args, "launch " ++ name, k.diag);
    }

    fn count(n: usize, per: usize) u32 {
        return @intCast(std.math.divCeil(usize, @max(n, 1), per) catch unreachable);
    }

    /// conv_out (rows, channels) = SiLU(causal depthwise conv of mixed (rows, channels) by conv_w
    /// (channels, taps)), earlier inputs from the batch or tails (slots, layers, taps-1, channels).
    pub fn conv(k: Kernels, mixed: Ptr, conv_w: Ptr, tails: Ptr, slots: Ptr, positions: Ptr, conv_out: Ptr, rows: usize, channels: usize, taps: usize, layers: usize, layer: usize) Error!void {
        std.debug.assert(taps >= 2 and taps <= taps_max);
        var a = .{
            mixed,                      conv_w,                       tails,                       slots,
            positions,                  conv_out,                     @as(c_int, @intCast(rows)),  @as(c_int, @intCast(channels)),
            @as(c_int, @intCast(taps)), @as(c_int, @intCast(layers)), @as(c_int, @intCast(layer)),
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_kda_conv", .{ count(rows, 1), count(channels, conv_threads), 1 }, conv_threads, ptrs);
    }

    /// Each run's last row writes its slot's tail (slots, layers, taps-1, channels) from mixed
    /// (rows, channels); after `conv`, which reads the old tails.
    pub fn tail(k: Kernels, mixed: Ptr, tails: Ptr, slots: Ptr, positions: Ptr, rows: usize, channels: usize, taps: usize, layers: usize, layer: usize) Error!void {
        std.debug.assert(taps >= 2 and taps <= taps_max);
        var a = .{
            mixed,                       tails,                          slots,                      positions,
            @as(c_int, @intCast(rows)),  @as(c_int, @intCast(channels)), @as(c_int, @intCast(taps)), @as(c_int, @intCast(layers)),
            @as(c_int, @intCast(layer)),
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_kda_tail", .{ count(rows, 1), count(channels, conv_threads), 1 }, conv_threads, ptrs);
    }

    /// out (rows, heads·128) = the gated delta rule over conv_out (rows, 3·heads·128) with decay_in
    /// (rows, heads·128), dt_bias (heads·128), a_log (heads), beta_in (rows, heads), gate_in (rows,
    /// heads·128), o_norm (128), states (slots, layers, heads, 128, 128); a block per (run, head),
    /// run_starts (rows + 1 i32) and run_count (1 i32) on the device.
    /// beta_in's rows are beta_stride floats apart.
    pub fn recurrent(k: Kernels, conv_out: Ptr, decay_in: Ptr, dt_bias: Ptr, a_log: Ptr, beta_in: Ptr, beta_stride: usize, gate_in: Ptr, o_norm: Ptr, states: Ptr, slots: Ptr, positions: Ptr, run_starts: Ptr, run_count: Ptr, out: Ptr, rows: usize, heads: usize, layers: usize, layer: usize, bound: ?f32, eps: f32) Error!void {
        var a = .{
            conv_out,                    decay_in,                                dt_bias,                           a_log,
            beta_in,                     gate_in,                                 o_norm,                            states,
            slots,                       positions,                               run_starts,                        run_count,
            out,                         @as(c_int, @intCast(heads)),             @as(c_int, @intCast(beta_stride)), @as(c_int, @intCast(layers)),
            @as(c_int, @intCast(layer)), @as(c_int, @intFromBool(bound != null)), bound orelse 0,                    eps,
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_kda_recurrent", .{ count(rows, 1), @intCast(heads), 1 }, recurrent_threads, ptrs);
    }
};
