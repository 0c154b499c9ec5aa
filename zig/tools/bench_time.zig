//! What tf-bench's tables share: the median timing of a launch sequence and random device buffers.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;

/// Microseconds per call: the median of 3 timings of `repeats` calls, after one warm-up.
pub fn timeMedian(gpu: *cuda.Gpu, repeats: usize, function: anytype, args: anytype, diag: *Diagnostic) !f64 {
    try @call(.auto, function, args);
    var timer = try cuda.gpu.Timer.create(gpu, diag);
    defer timer.destroy(gpu);
    var times: [3]f64 = undefined;
    for (&times) |*t| {
        try timer.begin(gpu, diag);
        for (0..repeats) |_| try @call(.auto, function, args);
        t.* = @as(f64, try timer.end(gpu, diag)) * 1e3 / @as(f64, @floatFromInt(repeats));
    }
    std.mem.sort(f64, &times, {}, std.sort.asc(f64));
    return times[1];
}

/// `floats` Gaussian values of standard deviation `scale` on the device.
pub fn randomBuffer(gpa: std.mem.Allocator, gpu: *cuda.Gpu, floats: usize, diag: *Diagnostic) !Ptr {
    return randomScaled(gpa, gpu, floats, 0.1, diag);
}

pub fn randomScaled(gpa: std.mem.Allocator, gpu: *cuda.Gpu, floats: usize, scale: f32, diag: *Diagnostic) !Ptr {
    const values = try gpa.alloc(f32, floats);
    defer gpa.free(values);
    var prng = std.Random.DefaultPrng.init(floats);
    for (values) |*v| v.* = prng.random().floatNorm(f32) * scale;
    const ptr = try gpu.alloc(floats * 4, diag);
    errdefer gpu.free(ptr);
    try gpu.upload(ptr, std.mem.sliceAsBytes(values), diag);
    return ptr;
}

/// Microseconds per call of a recorded graph of `calls` calls: the median of 5 replays after a
/// warm-up.
pub fn replayMedian(gpu: *cuda.Gpu, graph: *const cuda.gpu.Graph, calls: usize, diag: *Diagnostic) !f64 {
    var timer = try cuda.gpu.Timer.create(gpu, diag);
    defer timer.destroy(gpu);
    try graph.launch(gpu, diag); // warm-up
    var times: [5]f64 = undefined;
    for (&times) |*t| {
        try timer.begin(gpu, diag);
        try graph.launch(gpu, diag);
        t.* = @as(f64, try timer.end(gpu, diag)) * 1e3 / @as(f64, @floatFromInt(calls));
    }
    std.mem.sort(f64, &times, {}, std.sort.asc(f64));
    return times[2];
}

/// `size` random bytes on the device (any 16-bit pattern is a trellis word), one random 64 MiB
/// piece uploaded over and over.
pub fn randomWords(gpa: std.mem.Allocator, gpu: *cuda.Gpu, size: usize, random: std.Random, diag: *Diagnostic) !Ptr {
    const words = try gpu.alloc(size, diag);
    errdefer gpu.free(words);
    const piece = try gpa.alloc(u8, @min(size, 64 << 20));
    defer gpa.free(piece);
    random.bytes(piece);
    var at: usize = 0;
    while (at < size) : (at += piece.len) try gpu.upload(words + at, piece[0..@min(piece.len, size - at)], diag);
    return words;
}

/// `count` random ±1 as f16 on the device: suh / svh sign vectors.
pub fn randomSigns(gpa: std.mem.Allocator, gpu: *cuda.Gpu, count: usize, random: std.Random, diag: *Diagnostic) !Ptr {
    const signs = try gpa.alloc(u16, count);
    defer gpa.free(signs);
    for (signs) |*s| s.* = if (random.boolean()) 0x3C00 else 0xBC00;
    const ptr = try gpu.alloc(count * 2, diag);
    errdefer gpu.free(ptr);
    try gpu.upload(ptr, std.mem.sliceAsBytes(signs), diag);
    return ptr;
}

/// `copies` random EXL3 weights of k_p x n_p at `bits` (one sign vector for suh and svh, no bias)
/// and their table of entries: enough copies that a graph's calls read DRAM, not L2.
pub const Exl3Copies = struct {
    words: Ptr,
    signs: Ptr,
    table: Ptr,

    pub fn init(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k_p: usize, n_p: usize, bits: usize, copies: usize, seed: u64, diag: *Diagnostic) !Exl3Copies {
        const weight_bytes = k_p * n_p * bits / 8;
        var prng = std.Random.DefaultPrng.init(seed);
        const words = try randomWords(gpa, gpu, copies * weight_bytes, prng.random(), diag);
        errdefer gpu.free(words);
        const signs = try randomSigns(gpa, gpu, @max(k_p, n_p), prng.random(), diag);
        errdefer gpu.free(signs);
        const entries = try gpa.alloc(cuda.glm_kernels.Exl3Layer, copies);
        defer gpa.free(entries);
        for (entries, 0..) |*entry, c| entry.* = .{ .words = words + c * weight_bytes, .suh = signs, .svh = signs, .bias = 0 };
        const table = try gpu.alloc(copies * @sizeOf(cuda.glm_kernels.Exl3Layer), diag);
        errdefer gpu.free(table);
        try gpu.upload(table, std.mem.sliceAsBytes(entries), diag);
        return .{ .words = words, .signs = signs, .table = table };
    }

    pub fn deinit(self: Exl3Copies, gpu: *cuda.Gpu) void {
        gpu.free(self.table);
        gpu.free(self.signs);
        gpu.free(self.words);
    }
};
