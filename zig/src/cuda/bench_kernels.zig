//! The host half of zig/kernels/cuda/bench.cu: the mma.sync ceiling kernels tf-bench times.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;

pub const Module = gpu_mod.Module(&.{ "tf_bench_mma_f16", "tf_bench_mma_bf16" });

pub fn load(gpu: *const gpu_mod.Gpu, diag: *Diagnostic) gpu_mod.Error!Module {
    return Module.load(gpu, kernels.bench, "bench", diag);
}

/// Flops of one launch of `blocks` 256-thread blocks: 8 warps x iterations x 8 mma of 4096 flops.
pub fn mmaFlops(blocks: u32, iterations: u32) f64 {
    return @as(f64, @floatFromInt(blocks)) * 8 * @as(f64, @floatFromInt(iterations)) * 8 * 4096;
}

pub fn mma(gpu: *const gpu_mod.Gpu, module: *const Module, comptime bf16: bool, out: gpu_mod.DevicePtr, blocks: u32, iterations: u32, diag: *Diagnostic) gpu_mod.Error!void {
    const name = if (bf16) "tf_bench_mma_bf16" else "tf_bench_mma_f16";
    var a = .{ out, @as(c_int, @intCast(iterations)) };
    try gpu_mod.launch(gpu, module.function(name), .{ .grid = .{ blocks, 1, 1 }, .block = .{ 256, 1, 1 } }, .{ &a[0], &a[1] }, "launch " ++ name, diag);
}
