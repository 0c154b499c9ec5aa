//! The host half of zig/kernels/cuda/exl3_decode.cu: trellis words to fp16 weights (Wq, before
//! the Hadamards), one 256-thread block per 16x16 tile, one thread per trellis position.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const exl3 = @import("../exl3/root.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;

pub const DecodeModule = gpu_mod.Module(&.{"tf_exl3_decode"});

pub fn load(gpu: *const gpu_mod.Gpu, diag: *Diagnostic) gpu_mod.Error!DecodeModule {
    return DecodeModule.load(gpu, kernels.exl3_decode, "exl3_decode", diag);
}

pub const Args = struct {
    words: gpu_mod.DevicePtr, // (tile_rows, tile_columns, 8·bits2) int16
    out: gpu_mod.DevicePtr, // (16·tile_rows, 16·tile_columns) fp16
    tile_rows: u32,
    tile_columns: u32,
    rate: exl3.trellis.Rate,
    codebook: exl3.Codebook,
};

pub fn run(gpu: *const gpu_mod.Gpu, module: *const DecodeModule, args: Args, diag: *Diagnostic) gpu_mod.Error!void {
    std.debug.assert(args.tile_rows > 0 and args.tile_columns > 0);
    std.debug.assert(args.tile_rows <= 65535); // gridDim.y limit
    var words = args.words;
    var out = args.out;
    var tile_rows: c_int = @intCast(args.tile_rows);
    var tile_columns: c_int = @intCast(args.tile_columns);
    var bits2: c_int = args.rate.bits2;
    var codebook: c_int = @backingInt(args.codebook);
    try gpu_mod.launch(gpu, module.function("tf_exl3_decode"), .{
        .grid = .{ args.tile_columns, args.tile_rows, 1 },
        .block = .{ exl3.trellis.tile_weights, 1, 1 },
    }, .{ &words, &out, &tile_rows, &tile_columns, &bits2, &codebook }, "launch tf_exl3_decode", diag);
}

/// Decodes a whole layer's trellis on the GPU into `out`, (layer.rows, layer.columns) fp16 bits.
pub fn decodeLayer(gpu: *const gpu_mod.Gpu, module: *const DecodeModule, layer: *const exl3.Layer, out: []u16, diag: *Diagnostic) gpu_mod.Error!void {
    std.debug.assert(out.len == layer.rows * layer.columns);
    const words_bytes = std.mem.sliceAsBytes(layer.words);
    const words_gl = try gpu.alloc(words_bytes.len, diag);
    defer gpu.free(words_gl);
    const out_gl = try gpu.alloc(out.len * 2, diag);
    defer gpu.free(out_gl);
    try gpu.upload(words_gl, words_bytes, diag);
    try run(gpu, module, .{
        .words = words_gl,
        .out = out_gl,
        .tile_rows = @intCast(layer.rows / 16),
        .tile_columns = @intCast(layer.columns / 16),
        .rate = layer.rate,
        .codebook = layer.codebook,
    }, diag);
    try gpu.synchronize(diag);
    try gpu.download(std.mem.sliceAsBytes(out), out_gl, diag);
}
