//! tf-bench's single-linear table (`tf-bench --linears`): the EXL3 linears of a decode step that are
//! not experts (GLM-4.5-Air's attention projections and dense MLP, its 6-bit lm_head) at M = 1, 4
//! and 16 rows, one launch each as the engine runs them (the item path, grouped from 4 rows),
//! MUL1 codebook, random trellis words. Each linear is laid out in enough copies that the calls of
//! a recorded graph read DRAM, not L2. Reported: us per call, weight MB, their GB/s as % of copy
//! bandwidth and as % of the trellis decode's instruction cap (docs/measurements.md, "What a
//! decoded weight costs": 6.6 lane-instructions per 3-bit MUL1 weight; taken for every rate here,
//! so the 6-bit cap is an upper estimate). The median of 5 replays of `calls` launches.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const K = cuda.glm_kernels;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;
const bench_time = @import("bench_time.zig");

const Shape = struct { name: []const u8, in_features: usize, out_features: usize, bits: u8 };

/// GLM-4.5-Air (hidden 4096, 96 heads and 8 KV heads of 128, dense intermediate 10944).
const shapes = [_]Shape{
    .{ .name = "q_proj", .in_features = 4096, .out_features = 12288, .bits = 3 },
    .{ .name = "k_proj", .in_features = 4096, .out_features = 1024, .bits = 3 },
    .{ .name = "o_proj", .in_features = 12288, .out_features = 4096, .bits = 3 },
    .{ .name = "mlp gate", .in_features = 4096, .out_features = 10944, .bits = 3 },
    .{ .name = "mlp down", .in_features = 10944, .out_features = 4096, .bits = 3 },
    .{ .name = "lm_head", .in_features = 4096, .out_features = 151552, .bits = 6 },
};
const row_counts = [_]usize{ 1, 4, 16 };
const calls = 24;
/// Weight bytes the copies of one linear span at least: several times the H200's 50 MB of L2.
const spread_bytes = 512 << 20;
const instructions_per_weight = 6.6;

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, copy_gbs: f64, diag: *Diagnostic) !void {
    const lanes_per_s = @as(f64, @floatFromInt(gpu.multiprocessors)) * 128.0 * @as(f64, @floatFromInt(gpu.clockKhz())) * 1e3;
    say("\nsingle EXL3 linears of GLM-4.5-Air (MUL1; cap: {d:.1} T lane-instructions/s / {d:.1} per weight)\n", .{ lanes_per_s / 1e12, instructions_per_weight });
    say("{s:<9} {s:>6} {s:>7} {s:>5} {s:>4} {s:>9} {s:>9} {s:>8} {s:>8} {s:>7}\n", .{ "linear", "in", "out", "bits", "M", "us/call", "MB read", "GB/s", "% copy", "% cap" });
    for (shapes) |shape| {
        for (row_counts) |m| try measure(gpa, gpu, module, shape, m, copy_gbs, lanes_per_s, diag);
    }
}

fn roundUp(n: usize) usize {
    return (n + 127) / 128 * 128;
}

fn measure(gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, shape: Shape, m: usize, copy_gbs: f64, lanes_per_s: f64, diag: *Diagnostic) !void {
    const k_p = roundUp(shape.in_features);
    const n_p = roundUp(shape.out_features);
    const weight_bytes = k_p * n_p * @as(usize, shape.bits) / 8;
    const copies: usize = @max(1, @min(calls, spread_bytes / weight_bytes + 1));
    const weights = try bench_time.Exl3Copies.init(gpa, gpu, k_p, n_p, @as(usize, shape.bits), copies, weight_bytes, diag);
    defer weights.deinit(gpu);
    const table = weights.table;

    const x = try bench_time.randomBuffer(gpa, gpu, m * shape.in_features, diag);
    defer gpu.free(x);
    const y = try gpu.alloc(m * shape.out_features * 4, diag);
    defer gpu.free(y);
    const slots: usize = @max(m, K.groupsMax(m, 1)); // items, or the grouped path's groups
    const acc = try gpu.alloc(K.splitsMax(k_p, n_p) * slots * n_p * 4, diag);
    defer gpu.free(acc);
    const counter_count = K.countersFor(slots, n_p);
    const counters = try gpu.alloc(counter_count * 4, diag);
    defer gpu.free(counters);
    try gpu.zero(counters, counter_count * 4, diag);
    // The grouped path's scratch (a plain layer's groups need no sorting, but the call names it).
    const grouping_buffers = try gpu.alloc((2 * m + 3 * K.groupsMax(m, 1) + 1) * 4, diag);
    defer gpu.free(grouping_buffers);
    const grouping: K.Grouping = .{
        .ranks = grouping_buffers,
        .sorted = grouping_buffers + m * 4,
        .first = grouping_buffers + 2 * m * 4,
        .count = grouping_buffers + (2 * m + K.groupsMax(m, 1)) * 4,
        .layer = grouping_buffers + (2 * m + 2 * K.groupsMax(m, 1)) * 4,
        .total = grouping_buffers + (2 * m + 3 * K.groupsMax(m, 1)) * 4,
    };

    const k: K.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
    try cuda.gpu.Graph.beginCapture(gpu, diag);
    for (0..calls) |call| {
        k.exl3Linear(.{
            .x = x,
            .table = table + (call % copies) * @sizeOf(K.Exl3Layer),
            .acc = acc,
            .counters = counters,
            .grouping = grouping,
            .y = y,
            .items = m,
            .in_features = shape.in_features,
            .out_features = shape.out_features,
            .k_p = k_p,
            .n_p = n_p,
            .bits2 = 2 * shape.bits,
            .codebook = @backingInt(tf.exl3.Codebook.mul1),
        }) catch |err| {
            _ = cuda.gpu.Graph.endCapture(gpu, false, diag) catch {};
            return err;
        };
    }
    var graph = try cuda.gpu.Graph.endCapture(gpu, true, diag);
    defer graph.destroy(gpu);
    const us = try bench_time.replayMedian(gpu, &graph, calls, diag);
    const mb = @as(f64, @floatFromInt(weight_bytes)) / 1e6;
    const gbs = mb * 1e6 / (us * 1e-6) / 1e9;
    const cap_gbs = lanes_per_s / instructions_per_weight * @as(f64, @floatFromInt(shape.bits)) / 8.0 / 1e9;
    say("{s:<9} {d:>6} {d:>7} {d:>5} {d:>4} {d:>9.1} {d:>9.2} {d:>8.0} {d:>7.1}% {d:>6.1}%\n", .{ shape.name, shape.in_features, shape.out_features, shape.bits, m, us, mb, gbs, 100 * gbs / copy_gbs, 100 * gbs / cap_gbs });
}
