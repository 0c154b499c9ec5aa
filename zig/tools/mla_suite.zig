//! `tf-cuda-test mla`: MLA's head products (q_nope·W_UK and lat·W_UV) for a prompt chunk's rows
//! on tf_mla_head_rows against the same rows a few at a time on the decode step's kernels
//! (tf_mla_absorb, tf_mla_v_up): bit for bit, as the engine's batch-invariance and
//! chunk-boundary promises need; and both against a float64 host reference. Then the same weights
//! rounded to f16 on the _half entries (what the engine uploads for a checkpoint's fp16 kv_b_proj)
//! against the f32 entries on those values: bit for bit, in one launch and a few rows at a time.
//! Shapes: GLM-4.7-Flash
//! (20 heads, nope 192), GLM-5 (64 heads), GLM-5.3-Flash's NoPE layers (nope 256), and a k and
//! n that are no multiple of the tiles (the guards), at row counts that are none either.
//! Then the attention over the latent cache (mla_attention_suite.zig).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const mla = cuda.mla_kernels;
const Diagnostic = tf.core.Diagnostic;
const Report = @import("report.zig").Report;
const upload = @import("device_upload.zig").upload;

const Product = enum { absorb, v_up };
/// x_stride, k, n as tf_mla_head_rows takes them: absorb's n is the latent, v_up's k and stride too.
const Shape = struct { product: Product, heads: usize, x_stride: usize, k: usize, n: usize, rows: usize };
const shapes = [_]Shape{
    .{ .product = .absorb, .heads = 20, .x_stride = 256, .k = 192, .n = mla.latent, .rows = 1024 },
    .{ .product = .v_up, .heads = 20, .x_stride = mla.latent, .k = mla.latent, .n = 256, .rows = 1024 },
    .{ .product = .absorb, .heads = 64, .x_stride = 256, .k = 192, .n = mla.latent, .rows = 130 },
    .{ .product = .absorb, .heads = 4, .x_stride = 256, .k = 256, .n = mla.latent, .rows = 320 },
    .{ .product = .absorb, .heads = 3, .x_stride = 130, .k = 100, .n = mla.latent, .rows = 77 },
    .{ .product = .v_up, .heads = 5, .x_stride = mla.latent, .k = mla.latent, .n = 200, .rows = 64 },
};
/// Rows per launch on the decode step's kernels (under tf_mla_head_rows's 64).
const few = 7;

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, report: *Report) !void {
    var diag: Diagnostic = .{};
    var module = mla.load(gpu, &diag) catch |err| {
        report.check(false, "load mla: {s}", .{diag.message()});
        return err;
    };
    defer module.unload(gpu);
    const k: mla.Kernels = .{ .gpu = gpu, .module = &module, .diag = &diag };
    var prng = std.Random.DefaultPrng.init(0x31a);
    for (shapes) |shape| try product(gpa, gpu, k, prng.random(), shape, report);
    try @import("mla_attention_suite.zig").run(gpa, gpu, k, prng.random(), report);
}

fn launch(k: mla.Kernels, s: Shape, x: cuda.gpu.DevicePtr, w: mla.Kernels.Weights, out: cuda.gpu.DevicePtr, rows: usize) !void {
    switch (s.product) {
        .absorb => try k.absorb(x, w, out, rows, s.heads, s.x_stride, s.k),
        .v_up => try k.vUp(x, w, out, rows, s.heads, s.n),
    }
}

fn product(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: mla.Kernels, random: std.Random, s: Shape, report: *Report) !void {
    const x = try gpa.alloc(f32, s.rows * s.heads * s.x_stride);
    defer gpa.free(x);
    // Activations over several binades, as queries and attention outputs are.
    for (x) |*v| v.* = random.floatNorm(f32) * std.math.pow(f32, 2, @floatFromInt(random.intRangeAtMost(i32, -4, 4)));
    const w = try gpa.alloc(f32, s.heads * s.k * s.n);
    defer gpa.free(w);
    for (w) |*v| v.* = random.floatNorm(f32) * 0.05;
    const d_x = try upload(gpu, std.mem.sliceAsBytes(x), k.diag);
    defer gpu.free(d_x);
    const d_w = try upload(gpu, std.mem.sliceAsBytes(w), k.diag);
    defer gpu.free(d_w);
    const width = s.heads * s.n;
    const d_out = try gpu.alloc(s.rows * width * 4, k.diag);
    defer gpu.free(d_out);

    const all = try gpa.alloc(f32, s.rows * width);
    defer gpa.free(all);
    const parts = try gpa.alloc(f32, s.rows * width);
    defer gpa.free(parts);
    try outputs(k, s, d_x, .{ .ptr = d_w, .half = false }, d_out, all, parts);
    const name = @tagName(s.product);
    report.check(differingRows(s, all, parts) == 0, "mla {s} heads {d} k {d} n {d}: {d} rows in one launch (tf_mla_head_rows) equal {d} at a time (the decode kernel) bit for bit ({d} rows differ)", .{
        name, s.heads, s.k, s.n, s.rows, few, differingRows(s, all, parts),
    });
    try halfWeights(gpa, gpu, k, s, d_x, w, d_out, report);

    // Every row of the small shapes; every 9th and the last of the large (2-3 G f64 products).
    const step: usize = if (s.rows * s.heads * s.n * s.k > 300_000_000) 9 else 1;
    var worst: f64 = 0;
    for (0..s.rows) |row| for (0..s.heads) |h| {
        if (row % step != 0 and row != s.rows - 1) continue;
        const xv = x[(row * s.heads + h) * s.x_stride ..][0..s.k];
        const wh = w[h * s.k * s.n ..][0 .. s.k * s.n];
        for (0..s.n) |c| {
            var sum: f64 = 0;
            var scale: f64 = 0;
            for (xv, 0..) |v, i| {
                const p = @as(f64, v) * wh[i * s.n + c];
                sum += p;
                scale += @abs(p);
            }
            worst = @max(worst, @abs(all[(row * s.heads + h) * s.n + c] - sum) / @max(scale, 1e-30));
        }
    };
    report.check(worst <= 1e-6, "mla {s} heads {d} k {d} n {d}, {d} rows vs f64: max error {e:.2} of the |x|.|w| scale ({d:.3} x tol 1e-6)", .{
        name, s.heads, s.k, s.n, s.rows, worst, worst / 1e-6,
    });
}

/// The product of every row in one launch into `all`, and a few rows at a time into `parts`.
fn outputs(k: mla.Kernels, s: Shape, d_x: cuda.gpu.DevicePtr, w: mla.Kernels.Weights, d_out: cuda.gpu.DevicePtr, all: []f32, parts: []f32) !void {
    const width = s.heads * s.n;
    try launch(k, s, d_x, w, d_out, s.rows);
    try k.gpu.download(std.mem.sliceAsBytes(all), d_out, k.diag);
    var r: usize = 0;
    while (r < s.rows) : (r += few) {
        const rows = @min(few, s.rows - r);
        try launch(k, s, d_x + r * s.heads * s.x_stride * 4, w, d_out + r * width * 4, rows);
    }
    try k.gpu.download(std.mem.sliceAsBytes(parts), d_out, k.diag);
}

fn differingRows(s: Shape, a: []const f32, b: []const f32) usize {
    const width = s.heads * s.n;
    var differing: usize = 0;
    for (0..s.rows) |row| {
        if (!std.mem.eql(u32, @ptrCast(a[row * width ..][0..width]), @ptrCast(b[row * width ..][0..width]))) differing += 1;
    }
    return differing;
}

/// The weights rounded to f16: the _half entries against the f32 entries on the same values.
fn halfWeights(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: mla.Kernels, s: Shape, d_x: cuda.gpu.DevicePtr, w: []const f32, d_out: cuda.gpu.DevicePtr, report: *Report) !void {
    const rounded = try gpa.alloc(f32, w.len);
    defer gpa.free(rounded);
    const halves = try gpa.alloc(f16, w.len);
    defer gpa.free(halves);
    for (rounded, halves, w) |*r, *h, v| {
        h.* = @floatCast(v);
        r.* = h.*;
    }
    const d_rounded = try upload(gpu, std.mem.sliceAsBytes(rounded), k.diag);
    defer gpu.free(d_rounded);
    const d_halves = try upload(gpu, std.mem.sliceAsBytes(halves), k.diag);
    defer gpu.free(d_halves);
    const width = s.heads * s.n;
    var results: [4][]f32 = undefined;
    for (&results) |*r| r.* = try gpa.alloc(f32, s.rows * width);
    defer for (results) |r| gpa.free(r);
    try outputs(k, s, d_x, .{ .ptr = d_rounded, .half = false }, d_out, results[0], results[1]);
    try outputs(k, s, d_x, .{ .ptr = d_halves, .half = true }, d_out, results[2], results[3]);
    const one = differingRows(s, results[0], results[2]);
    const few_rows = differingRows(s, results[1], results[3]);
    report.check(one == 0 and few_rows == 0, "mla {s} heads {d} k {d} n {d}: f16 weights (tf_mla_*_half) equal the f32 entries on the same values bit for bit ({d} rows differ in one launch, {d} {d} at a time)", .{
        @tagName(s.product), s.heads, s.k, s.n, one, few_rows, few,
    });
}
