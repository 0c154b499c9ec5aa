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
