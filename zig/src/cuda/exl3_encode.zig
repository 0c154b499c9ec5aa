//! The host half of zig/kernels/cuda/exl3_encode.cu: the Viterbi tile encoder on the GPU, one
//! 1024-thread block per tile, batched so that the back pointers (256 x 2^(16-K) per tile) fit a
//! bounded scratch. Its output equals the CPU encoder's (exl3/encode.zig) bit for bit.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const driver = @import("driver.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;

pub const EncodeModule = gpu_mod.Module(&.{"tf_exl3_encode"});

const scratch_bytes_max: usize = 1 << 30;

pub fn encodeTiles(gpu: *const gpu_mod.Gpu, values: []const f32, bits: u4, codebook: u8, states: []u16, diag: *Diagnostic) gpu_mod.Error!void {
    std.debug.assert(values.len % 256 == 0 and states.len == values.len);
    var module = try EncodeModule.load(gpu, kernels.exl3_encode, "exl3_encode", diag);
    defer module.unload(gpu);
    const function = module.function("tf_exl3_encode");
    const edges = @as(usize, 1) << @intCast(16 - @as(u5, bits));
    const shared_bytes: c_int = @intCast(4 * edges); // prev and next costs, fp16
    try gpu.driver.check(gpu.driver.api.cuFuncSetAttribute(function, driver.function_attribute_max_dynamic_shared_bytes, shared_bytes), "cuFuncSetAttribute(shared memory)", diag);
    const tiles = values.len / 256;
    const back_per_tile = 256 * edges * 2;
    const batch = @max(1, @min(tiles, scratch_bytes_max / back_per_tile));
    const values_gl = try gpu.alloc(batch * 256 * 4, diag);
    defer gpu.free(values_gl);
    const states_gl = try gpu.alloc(batch * 256 * 2, diag);
    defer gpu.free(states_gl);
    const back_gl = try gpu.alloc(batch * back_per_tile, diag);
    defer gpu.free(back_gl);
    var start: usize = 0;
    while (start < tiles) : (start += batch) {
        const count = @min(batch, tiles - start);
        try gpu.upload(values_gl, std.mem.sliceAsBytes(values[start * 256 ..][0 .. count * 256]), diag);
        var a = .{ values_gl, states_gl, back_gl, @as(c_int, @intCast(count)), @as(c_int, bits), @as(c_int, codebook) };
        try gpu_mod.launch(gpu, function, .{ .grid = .{ @intCast(count), 1, 1 }, .block = .{ 1024, 1, 1 }, .shared_bytes = @intCast(shared_bytes) }, .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5] }, "launch tf_exl3_encode", diag);
        try gpu.download(std.mem.sliceAsBytes(states[start * 256 ..][0 .. count * 256]), states_gl, diag);
    }
}
