//! `tf-cuda-test dense`: the unquantized projections on the tensor cores (tf_dense_half) and the
//! sliced logits summary, each against a float64 host reference:
//!   - random f16 and f32 weights of the shapes the models carry (GLM-5.3-Flash's K 4096 x N 128/64
//!     gates that take split sums, K 128 x N 8192, the hyper-connections' f32 K 16384 x N 24 mixing
//!     matrix written 25 floats apart with each row's Σ x² after its dots, outputs not a multiple
//!     of the 32-output tile, a bias) at 100 rows: max error relative to the row's |x|·|w| scale
//!     within 1e-6 (Σ x² relative to itself);
//!   - every row of a 100-row batch equal, bit for bit, to the same row run alone and in a batch
//!     of 7 (the promise the engine's batch-invariance tests build on);
//!   - logits summaries (max, lowest argmax on ties, log Σ exp) of rows with masked (-inf) slices
//!     and ties across slices, against LogitsSummary.of (f64 throughout).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const Report = @import("report.zig").Report;
const say = @import("say.zig").say;
const upload = @import("device_upload.zig").upload;
const forward_module = @import("forward_module.zig");

const Shape = struct { in: usize, out: usize, bias: bool = false, half: bool = true, stride: usize = 0, squares: bool = false };
const shapes = [_]Shape{
    .{ .in = 4096, .out = 128 },
    .{ .in = 4096, .out = 64 },
    .{ .in = 128, .out = 8192 },
    .{ .in = 512, .out = 50, .bias = true },
    .{ .in = 2048, .out = 1000, .bias = true },
    .{ .in = 16384, .out = 24, .half = false, .stride = 25, .squares = true },
    .{ .in = 4096, .out = 128, .half = false },
    .{ .in = 256, .out = 300, .bias = true, .half = false },
};

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, report: *Report) !void {
    var diag: Diagnostic = .{};
    var module = try forward_module.load(gpu, &diag, report);
    defer module.unload(gpu);
    const k: cuda.glm_kernels.Kernels = .{ .gpu = gpu, .module = &module, .diag = &diag };
    var prng = std.Random.DefaultPrng.init(0xde15e);
    const random = prng.random();
    for (shapes) |shape| try denseShape(gpa, gpu, k, random, shape, report);
    try summaries(gpa, gpu, k, random, report);
}

fn denseShape(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, shape: Shape, report: *Report) !void {
    const rows = 100;
    const stride = if (shape.stride > 0) shape.stride else shape.out;
    const splits = cuda.glm_kernels.Kernels.denseSplits(shape.in, shape.out);
    const weight = try gpa.alloc(f32, shape.out * shape.in);
    defer gpa.free(weight);
    const halves = try gpa.alloc(f16, shape.out * shape.in);
    defer gpa.free(halves);
    for (weight, halves) |*w, *h| {
        w.* = random.floatNorm(f32) * 0.05;
        h.* = @floatCast(w.*);
        if (shape.half) w.* = h.*;
    }
    const bias = try gpa.alloc(f32, shape.out);
    defer gpa.free(bias);
    for (bias) |*b| b.* = random.floatNorm(f32);
    const x = try gpa.alloc(f32, rows * shape.in);
    defer gpa.free(x);
    // Activations over several binades, as hidden states are.
    for (x) |*v| v.* = random.floatNorm(f32) * std.math.pow(f32, 2, @floatFromInt(random.intRangeAtMost(i32, -6, 6)));

    const d_weight = if (shape.half) try upload(gpu, std.mem.sliceAsBytes(halves), k.diag) else try upload(gpu, std.mem.sliceAsBytes(weight), k.diag);
    defer gpu.free(d_weight);
    const d_bias = if (shape.bias) try upload(gpu, std.mem.sliceAsBytes(bias), k.diag) else 0;
    defer if (d_bias != 0) gpu.free(d_bias);
    const d_x = try upload(gpu, std.mem.sliceAsBytes(x), k.diag);
    defer gpu.free(d_x);
    const d_y = try gpu.alloc(rows * stride * 4, k.diag);
    defer gpu.free(d_y);
    const partials = cuda.glm_kernels.Kernels.denseScratch(rows, shape.in, shape.out, shape.squares);
    const d_partial = try gpu.alloc(@max(partials, 1) * 4, k.diag);
    defer gpu.free(d_partial);

    const call: cuda.glm_kernels.Kernels.DenseCall = .{
        .x = d_x,
        .weight = d_weight,
        .half = shape.half,
        .bias = d_bias,
        .y = d_y,
        .y_stride = stride,
        .partial = d_partial,
        .rows = rows,
        .in_features = shape.in,
        .out_features = shape.out,
        .squares = shape.squares,
    };
    const strided = try gpa.alloc(f32, rows * stride);
    defer gpa.free(strided);
    try k.denseMma(call);
    try gpu.download(std.mem.sliceAsBytes(strided), d_y, k.diag);
    const all = try gpa.alloc(f32, rows * shape.out);
    defer gpa.free(all);
    for (0..rows) |r| @memcpy(all[r * shape.out ..][0..shape.out], strided[r * stride ..][0..shape.out]);

    var worst: f64 = 0;
    for (0..rows) |r| {
        for (0..shape.out) |o| {
            var sum: f64 = if (shape.bias) bias[o] else 0;
            var scale: f64 = 0;
            for (0..shape.in) |i| {
                const p = @as(f64, x[r * shape.in + i]) * weight[o * shape.in + i];
                sum += p;
                scale += @abs(p);
            }
            worst = @max(worst, @abs(all[r * shape.out + o] - sum) / @max(scale, 1e-30));
        }
        if (shape.squares) {
            var squares: f64 = 0;
            for (x[r * shape.in ..][0..shape.in]) |v| squares += @as(f64, v) * v;
            worst = @max(worst, @abs(strided[r * stride + shape.out] - squares) / squares);
        }
    }
    const kind = if (shape.half) "f16" else "f32";
    report.check(worst <= 1e-6, "dense {s} K {d} N {d} ({d} splits){s}{s}, 100 rows vs f64: max error {e:.2} of the |x|.|w| scale ({d:.3} x tol 1e-6)", .{
        kind, shape.in, shape.out, splits, if (shape.bias) " + bias" else "", if (shape.squares) " + sum of squares" else "", worst, worst / 1e-6,
    });

    // The same rows alone and in a batch of 7, at other offsets of their row tiles.
    const single = try gpa.alloc(f32, 7 * stride);
    defer gpa.free(single);
    var differing: usize = 0;
    for ([_]usize{ 0, 31, 32, 45, 99 }) |r| {
        var one = call;
        one.x = d_x + r * shape.in * 4;
        one.rows = 1;
        try k.denseMma(one);
        try gpu.download(std.mem.sliceAsBytes(single[0..stride]), d_y, k.diag);
        if (!std.mem.eql(f32, single[0..stride], strided[r * stride ..][0..stride])) differing += 1;
    }
    const first = 40;
    var seven = call;
    seven.x = d_x + first * shape.in * 4;
    seven.rows = 7;
    try k.denseMma(seven);
    try gpu.download(std.mem.sliceAsBytes(single), d_y, k.diag);
    for (0..7) |i| {
        if (!std.mem.eql(f32, single[i * stride ..][0..stride], strided[(first + i) * stride ..][0..stride])) differing += 1;
    }
    report.check(differing == 0, "dense {s} K {d} N {d}: rows alone and in a batch of 7 equal the 100-row batch bit for bit ({d} of 12 differ)", .{ kind, shape.in, shape.out, differing });
}

fn summaries(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, report: *Report) !void {
    const LogitsSummary = tf.core.LogitsSummary;
    const rows = 5;
    for ([_]usize{ 151552, 2176, 20 }) |vocab| {
        const logits = try gpa.alloc(f32, rows * vocab);
        defer gpa.free(logits);
        for (logits) |*v| v.* = random.floatNorm(f32) * 4;
        // Row 1: the first half masked; row 2: the highest logit tied at both ends; row 3: all
        // but one token masked; row 4 as drawn.
        for (logits[vocab..][0 .. vocab / 2]) |*v| v.* = -std.math.inf(f32);
        logits[2 * vocab] = 40;
        logits[3 * vocab - 1] = 40;
        for (logits[3 * vocab ..][0..vocab], 0..) |*v, i| v.* = if (i == vocab / 3) 1.5 else -std.math.inf(f32);
        const d_logits = try upload(gpu, std.mem.sliceAsBytes(logits), k.diag);
        defer gpu.free(d_logits);
        const d_out = try gpu.alloc(rows * (1 + cuda.glm_kernels.Kernels.summary_slices) * @sizeOf(LogitsSummary), k.diag);
        defer gpu.free(d_out);
        try k.logitsSummary(d_logits, d_out, rows, vocab);
        var got: [rows]LogitsSummary = undefined;
        try gpu.download(std.mem.sliceAsBytes(&got), d_out, k.diag);
        var wrong: usize = 0;
        var worst: f64 = 0;
        for (0..rows) |r| {
            const row = logits[r * vocab ..][0..vocab];
            const want = LogitsSummary.of(row);
            if (want.argmax != got[r].argmax or want.max != got[r].max) wrong += 1;
            // Σ exp compensated (Kahan): a plain f64 sum of 150k terms strays ~1e-11 itself.
            var sum: f64 = 0;
            var carry: f64 = 0;
            for (row) |v| {
                const term = @exp(@as(f64, v) - want.max) - carry;
                const next = sum + term;
                carry = (next - sum) - term;
                sum = next;
            }
            const exact = @as(f64, want.max) + @log(sum);
            worst = @max(worst, @abs(exact - got[r].log_total) / @abs(exact));
        }
        report.check(wrong == 0 and worst <= 1e-13, "logits summary, vocab {d}, {d} rows (masked halves, ties across slices): {d} wrong max/argmax, log-sum-exp within {e:.2} relative of a compensated f64 sum", .{ vocab, rows, wrong, worst });
    }
}
