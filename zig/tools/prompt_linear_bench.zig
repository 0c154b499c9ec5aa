//! tf-bench's prompt-rows table for plain EXL3 linears (`tf-bench --prompt-linears`): the
//! attention projections a prefill chunk runs on the prompt kernels (GLM-4.5-Air's q/k/o,
//! GLM-4.7-Flash's q_b/o, GLM-5.3-Flash's fused KDA qkv and its o_proj; 3 bits, MUL1) at 64, 256
//! and 1024 rows, in each of exl3_prompt.LinearForm's forms and, for a weight that
//! exl3_prompt.deepSplits splits over k, the deep launch in both (*: the one the engine chooses):
//! the sort, rotate and matmul launches as the engine runs them, each linear laid out in enough
//! copies that a recorded graph's calls read DRAM. Every form's outputs are compared bit for bit
//! with the wide form's (they compute the same chains); the deep launch's (other chains) by their
//! relative L2 against wide's, and its wide form's bit for bit with its narrow one's. Reported: us per call, weight MB and their
//! GB/s as % of copy bandwidth (the weight is read once per call; each form decodes it once per
//! group of rows, so this is a decode rate, not a byte count).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;
const bench_time = @import("bench_time.zig");

const Shape = struct { name: []const u8, in_features: usize, out_features: usize };

const shapes = [_]Shape{
    .{ .name = "Air q", .in_features = 4096, .out_features = 12288 },
    .{ .name = "Air k", .in_features = 4096, .out_features = 1024 },
    .{ .name = "Air o", .in_features = 12288, .out_features = 4096 },
    .{ .name = "Flash q_b", .in_features = 768, .out_features = 5120 },
    .{ .name = "Flash o", .in_features = 5120, .out_features = 2048 },
    .{ .name = "5.3F qkv", .in_features = 4096, .out_features = 24576 },
    .{ .name = "5.3F o", .in_features = 8192, .out_features = 4096 },
};
const row_counts = [_]usize{ 64, 256, 1024 };
const bits = 3;
const calls = 8;
const spread_bytes = 256 << 20;

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, prompt_module: *const P.Module, copy_gbs: f64, diag: *Diagnostic) !void {
    say("\nplain EXL3 linears' prompt rows (3 bits, MUL1; each form's bits against wide's)\n", .{});
    say("{s:<10} {s:>6} {s:>6} {s:>5} {s:>7} {s:>7} {s:>10} {s:>9} {s:>8} {s:>8}\n", .{ "linear", "in", "out", "M", "form", "blocks", "us/call", "MB", "% copy", "bits" });
    for (shapes) |shape| {
        for (row_counts) |m| try measure(gpa, gpu, module, prompt_module, shape, m, copy_gbs, diag);
    }
}

fn measure(gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, prompt_module: *const P.Module, shape: Shape, m: usize, copy_gbs: f64, diag: *Diagnostic) !void {
    const k_p = shape.in_features;
    const n_p = shape.out_features;
    const weight_bytes = k_p * n_p * bits / 8;
    const copies: usize = @max(1, @min(calls, spread_bytes / weight_bytes + 1));
    const weights = try bench_time.Exl3Copies.init(gpa, gpu, k_p, n_p, bits, copies, weight_bytes + m, diag);
    defer weights.deinit(gpu);
    const table = weights.table;

    const x = try bench_time.randomBuffer(gpa, gpu, m * k_p, diag);
    defer gpu.free(x);
    const y = try gpu.alloc(m * n_p * 4, diag);
    defer gpu.free(y);
    // Every row a prompt row of entry 0 (the engine's row table for a chunk of prompt rows).
    const zeros = try gpa.alloc(i32, m);
    defer gpa.free(zeros);
    @memset(zeros, 0);
    const rows_table = try gpu.alloc(m * 4, diag);
    defer gpu.free(rows_table);
    try gpu.upload(rows_table, std.mem.sliceAsBytes(zeros), diag);
    var need: P.Need = .{};
    need.linear(m, k_p, n_p);
    var taken: std.ArrayList(Ptr) = .empty;
    defer {
        for (taken.items) |p| gpu.free(p);
        taken.deinit(gpa);
    }
    const Take = struct {
        gpa: std.mem.Allocator,
        gpu: *cuda.Gpu,
        taken: *std.ArrayList(Ptr),
        diag: *Diagnostic,
        fn call(t: @This(), size: usize) !Ptr {
            const p = try t.gpu.alloc(size, t.diag);
            try t.taken.append(t.gpa, p);
            return p;
        }
    };
    const scratch = try need.allocate(Take{ .gpa = gpa, .gpu = gpu, .taken = &taken, .diag = diag }, Take.call);
    const k: K.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
    const prompt_shape: P.Shape = .{ .k_p = k_p, .n_p = n_p, .bits2 = 2 * bits, .codebook = @backingInt(tf.exl3.Codebook.mul1) };

    const wide = try gpa.alloc(f32, m * n_p);
    defer gpa.free(wide);
    const other = try gpa.alloc(f32, m * n_p);
    defer gpa.free(other);
    const deep = try gpa.alloc(f32, m * n_p);
    defer gpa.free(deep);
    const splits = P.deepSplits(k_p, n_p);
    const chosen: Form = switch (P.LinearForm.choose(n_p, m, splits, gpu.multiprocessors)) {
        .wide => if (splits > 1) .deepw else .wide,
        .narrow => if (splits > 1) .deep else .narrow,
    };
    for ([_]Form{ .wide, .narrow, .deep, .deepw }) |form| {
        const split = form == .deep or form == .deepw;
        if (split and splits == 1) continue;
        const launcher: P.Launcher = .{ .glm = k, .module = prompt_module, .linear_form = if (form == .wide or form == .deepw) .wide else .narrow, .deep = split };
        try gpu.zero(y, m * n_p * 4, diag);
        try launcher.runLinear(scratch, x, m, 1, rows_table, table, prompt_shape, k_p, n_p, y);
        const out = switch (form) {
            .wide => wide,
            .deep => deep,
            else => other,
        };
        try gpu.download(std.mem.sliceAsBytes(out), y, diag);
        // The two deep forms are the same chains (deepw against deep); unsplit, against wide.
        const same = switch (form) {
            .wide, .deep => true,
            .narrow => std.mem.eql(u32, @ptrCast(wide), @ptrCast(other)),
            .deepw => std.mem.eql(u32, @ptrCast(deep), @ptrCast(other)),
        };
        const agree = if (form == .deep) relativeL2(deep, wide) else 0;

        try cuda.gpu.Graph.beginCapture(gpu, diag);
        for (0..calls) |call| {
            launcher.runLinear(scratch, x, m, 1, rows_table, table + (call % copies) * @sizeOf(K.Exl3Layer), prompt_shape, k_p, n_p, y) catch |err| {
                _ = cuda.gpu.Graph.endCapture(gpu, false, diag) catch {};
                return err;
            };
        }
        var graph = try cuda.gpu.Graph.endCapture(gpu, true, diag);
        defer graph.destroy(gpu);
        const us = try bench_time.replayMedian(gpu, &graph, calls, diag);
        const mb = @as(f64, @floatFromInt(weight_bytes)) / 1e6;
        const gbs = mb * 1e6 / (us * 1e-6) / 1e9;
        const name = if (form == chosen) switch (form) {
            .wide => "wide*",
            .narrow => "narrow*",
            .deep => "deep*",
            .deepw => "deepw*",
        } else @tagName(form);
        const blocks = switch (form) {
            .wide => P.LinearForm.wide.blocks(n_p, m),
            .narrow => P.LinearForm.narrow.blocks(n_p, m),
            .deep => P.LinearForm.narrow.blocks(n_p, m) * splits,
            .deepw => P.LinearForm.wide.blocks(n_p, m) * splits,
        };
        // The deep launch's k splits make other chains: its outputs against wide's as a relative L2.
        var verdict: [16]u8 = undefined;
        const bits_text = if (form == .deep) try std.fmt.bufPrint(&verdict, "{e:.1}", .{agree}) else if (same) "same" else "DIFFER";
        say("{s:<10} {d:>6} {d:>6} {d:>5} {s:>7} {d:>7} {d:>10.1} {d:>9.2} {d:>7.1}% {s:>8}\n", .{ shape.name, k_p, n_p, m, name, blocks, us, mb, 100 * gbs / copy_gbs, bits_text });
    }
}

/// The plain forms (LinearForm) and the deep launch (k splits, exl3_prompt.deepSplits) in each:
/// deep (one tile column a warp) and deepw (two).
const Form = enum { wide, narrow, deep, deepw };

fn relativeL2(a: []const f32, b: []const f32) f64 {
    var diff: f64 = 0;
    var norm: f64 = 0;
    for (a, b) |x, y| {
        diff += (@as(f64, x) - y) * (@as(f64, x) - y);
        norm += @as(f64, y) * y;
    }
    return @sqrt(diff / @max(norm, 1e-300));
}
