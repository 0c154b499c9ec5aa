//! tf-bench's GLM-5.3-Flash table (`tf-bench --next`): the parts a KDA layer and a hyper-connection
//! site add to a step, at the real model's size (hidden 4096, 64 KDA heads x 128, hc_mult 4), as
//! the engine launches them:
//!   - the unquantized projections of one KDA layer on the tensor cores ([f_a | g_a | b] stacked,
//!     K 4096 x N 320; f_b and g_b, K 128 x N 8192, reading their parts of its rows), f16 weights
//!     rotated over enough copies that they come from DRAM, not L2;
//!   - one hyper-connection site as the engine runs it: the mixing dots and Σ x² (f32 K 16384 x
//!     N 24, rotated copies), the maps (20 Sinkhorn iterations) from their split sums, the collapse
//!     with the sublayer's RMSNorm, and the mix back;
//!   - KDA's convolution, tail update and delta rule of one layer: decode rows each their own
//!     sequence (a 4 MiB state read and written per row), and a 1024-row prompt of one sequence.
//! At M = 1, 4 and 1024 rows; us per layer (or site) and the bytes that must move against the copy
//! bandwidth. The median of 3 timings of 20 calls each.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const K = cuda.glm_kernels;
const H = cuda.hyper_kernels;
const KK = cuda.kda_kernels;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;
const bench_time = @import("bench_time.zig");

const hidden = 4096;
const heads = 64;
const head_dim = KK.head_dim;
const width = heads * head_dim;
const gates = 2 * head_dim + heads; // [f_a | g_a | b]
const mult = 4;
const mixes = (2 + mult) * mult;
const taps = 4;
const rows_list = [_]usize{ 1, 4, 1024 };
const rows_max = 1024;
const copies = 24; // x 6.7 MB of projections, x 1.5 MB of mixing matrix: past the H200's 50 MB L2

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, copy_gbs: f64, diag: *Diagnostic) !void {
    var glm = try K.load(gpu, diag);
    defer glm.unload(gpu);
    var hyper = try H.load(gpu, diag);
    defer hyper.unload(gpu);
    var kda = try KK.load(gpu, diag);
    defer kda.unload(gpu);
    var arena_state = std.heap.ArenaAllocator.init(gpa);
    defer arena_state.deinit();
    var owned: std.ArrayList(Ptr) = .empty;
    defer {
        for (owned.items) |p| gpu.free(p);
        owned.deinit(gpa);
    }
    const B = struct {
        gpa: std.mem.Allocator,
        gpu: *cuda.Gpu,
        owned: *std.ArrayList(Ptr),
        diag: *Diagnostic,
        fn random(b: @This(), floats: usize, scale: f32) !Ptr {
            const p = try bench_time.randomScaled(b.gpa, b.gpu, floats, scale, b.diag);
            try b.owned.append(b.gpa, p);
            return p;
        }
        fn halves(b: @This(), count: usize, scale: f32) !Ptr {
            const values = try b.gpa.alloc(f16, count);
            defer b.gpa.free(values);
            var prng = std.Random.DefaultPrng.init(count);
            for (values) |*v| v.* = @floatCast(prng.random().floatNorm(f32) * scale);
            const p = try b.empty(count * 2);
            try b.gpu.upload(p, std.mem.sliceAsBytes(values), b.diag);
            return p;
        }
        fn empty(b: @This(), bytes: usize) !Ptr {
            const p = try b.gpu.alloc(bytes, b.diag);
            try b.owned.append(b.gpa, p);
            return p;
        }
    };
    const b: B = .{ .gpa = gpa, .gpu = gpu, .owned = &owned, .diag = diag };
    const k: K.Kernels = .{ .gpu = gpu, .module = &glm, .diag = diag };

    // Projections of one KDA layer.
    var stacked: [copies]Ptr = undefined;
    var f_b: [copies]Ptr = undefined;
    var g_b: [copies]Ptr = undefined;
    for (0..copies) |c| {
        stacked[c] = try b.halves(gates * hidden, 0.02);
        f_b[c] = try b.halves(width * head_dim, 0.09);
        g_b[c] = try b.halves(width * head_dim, 0.09);
    }
    const x = try b.random(rows_max * hidden, 1.0);
    const low = try b.empty(rows_max * gates * 4);
    const decay = try b.empty(rows_max * width * 4);
    const gate = try b.empty(rows_max * width * 4);
    const partial = try b.empty(@max(K.Kernels.denseScratch(rows_max, hidden, gates, false), K.Kernels.denseScratch(rows_max, mult * hidden, mixes, true)) * 4);
    say("\nGLM-5.3-Flash parts at full size (hidden {d}, {d} KDA heads x {d}, hc_mult {d})\n", .{ hidden, heads, head_dim, mult });
    say("{s:<34} {s:>5} {s:>10} {s:>10} {s:>9} {s:>8}\n", .{ "part", "M", "us", "MB moved", "GB/s", "% copy" });
    for (rows_list) |rows| {
        var turn: usize = 0;
        const Projections = struct {
            fn call(kk: K.Kernels, t: *usize, s: []const Ptr, fb: []const Ptr, gb: []const Ptr, xx: Ptr, lo: Ptr, dec: Ptr, ga: Ptr, part: Ptr, r: usize) !void {
                const c = t.* % copies;
                t.* += 1;
                try kk.denseMma(.{ .x = xx, .weight = s[c], .half = true, .y = lo, .y_stride = gates, .partial = part, .rows = r, .in_features = hidden, .out_features = gates });
                try kk.denseMma(.{ .x = lo, .x_stride = gates, .weight = fb[c], .half = true, .y = dec, .y_stride = width, .partial = part, .rows = r, .in_features = head_dim, .out_features = width });
                try kk.denseMma(.{ .x = lo + head_dim * 4, .x_stride = gates, .weight = gb[c], .half = true, .y = ga, .y_stride = width, .partial = part, .rows = r, .in_features = head_dim, .out_features = width });
            }
        };
        const us = try bench_time.timeMedian(gpu, 20, Projections.call, .{ k, &turn, &stacked, &f_b, &g_b, x, low, decay, gate, partial, rows }, diag);
        const bytes = 2 * (gates * hidden + 2 * width * head_dim) + 4 * rows * (hidden + gates + 2 * width);
        line("KDA projections (f16, 3 launches)", rows, us, bytes, copy_gbs);
    }

    // One hyper-connection site.
    var mix: [copies]Ptr = undefined;
    for (&mix) |*m| m.* = try b.random(mixes * mult * hidden, 0.01);
    const site_base = try b.random(mixes, 0.5);
    const site_scale = try b.random(3, 0.3);
    const streams = try b.random(rows_max * mult * hidden, 1.0);
    const raw = try b.empty(rows_max * (mixes + 1) * 4);
    const maps = try b.empty(rows_max * mixes * 4);
    const normed = try b.empty(rows_max * hidden * 4);
    const norm = try b.random(hidden, 1.0);
    const out = try b.random(rows_max * hidden, 0.01);
    const hk: H.Kernels = .{ .gpu = gpu, .module = &hyper, .diag = diag };
    for (rows_list) |rows| for ([_]bool{ false, true }) |fused| {
        var turn: usize = 0;
        const Site = struct {
            fn call(kk: K.Kernels, hh: H.Kernels, t: *usize, mx: []const Ptr, base: Ptr, scale: Ptr, st: Ptr, rw: Ptr, mp: Ptr, nw: Ptr, nd: Ptr, o: Ptr, part: Ptr, r: usize, one: bool) !void {
                const c = t.* % copies;
                t.* += 1;
                const in = mult * hidden;
                try kk.denseMma(.{ .x = st, .weight = mx[c], .half = false, .y = rw, .y_stride = mixes + 1, .partial = part, .rows = r, .in_features = in, .out_features = mixes, .squares = true, .reduce = false });
                const splits = K.Kernels.denseSplits(in, mixes);
                const site: H.Site = .{ .mix = mx[c], .base = base, .scale = scale };
                const sums = if (splits > 1) part else rw;
                if (one) {
                    try hh.enter(sums, splits, site, mp, st, nw, nd, r, mult, hidden, 1e-6, 1e-6, 20);
                } else {
                    try hh.mapsFrom(sums, splits, site, mp, r, mult, hidden, 1e-6, 1e-6, 20);
                    try hh.collapseNorm(st, mp, nw, nd, r, mult, hidden, 1e-6);
                }
                try hh.leave(st, mp, o, r, mult, hidden);
            }
        };
        const us = try bench_time.timeMedian(gpu, 20, Site.call, .{ k, hk, &turn, &mix, site_base, site_scale, streams, raw, maps, norm, normed, out, partial, rows, fused }, diag);
        // The matrix once; the streams read by the dots, the collapse and the mix, written once;
        // the normed input written, the sublayer's output read.
        const bytes = 4 * (mixes * mult * hidden + rows * mult * hidden * 4 + rows * hidden * 2);
        line(if (fused) "hyper site (3 launches, enter)" else "hyper site (4 launches)", rows, us, bytes, copy_gbs);
    };

    // KDA's convolution and delta rule of one layer.
    const kk: KK.Kernels = .{ .gpu = gpu, .module = &kda, .diag = diag };
    const mixed = try b.random(rows_max * 3 * width, 0.5);
    const conv_w = try b.random(3 * width * taps, 0.5);
    const tails = try b.random(rows_max * (taps - 1) * 3 * width, 0.5);
    const conv_out = try b.empty(rows_max * 3 * width * 4);
    const dt_bias = try b.random(width, 0.5);
    const a_log = try b.random(heads, 0.3);
    const beta = try b.random(rows_max * heads, 1.0);
    const o_norm = try b.random(head_dim, 1.0);
    const states = try b.random(4 * heads * head_dim * head_dim, 0.01); // four slots' states
    const core = try b.empty(rows_max * width * 4);
    const slots = try b.empty(rows_max * 4);
    const positions = try b.empty(rows_max * 4);
    const run_starts = try b.empty((rows_max + 2) * 4);
    for (rows_list) |rows| {
        // Decode rows: each its own sequence at position 100; the prompt: one sequence from 100.
        const prompt = rows > 4;
        const host = try arena_state.allocator().alloc(u32, 2 * rows_max + 2);
        for (0..rows) |r| {
            host[r] = if (prompt) 0 else @intCast(r);
            host[rows_max + r] = @intCast(100 + if (prompt) r else 0);
        }
        try gpu.upload(slots, std.mem.sliceAsBytes(host[0..rows]), diag);
        try gpu.upload(positions, std.mem.sliceAsBytes(host[rows_max..][0..rows]), diag);
        const runs = if (prompt) 1 else rows;
        var starts: [rows_max + 2]i32 = undefined;
        for (0..runs) |r| starts[r] = @intCast(r);
        starts[runs] = @intCast(rows);
        starts[rows_max + 1] = @intCast(runs);
        try gpu.upload(run_starts, std.mem.sliceAsBytes(starts[0 .. runs + 1]), diag);
        try gpu.upload(run_starts + (rows_max + 1) * 4, std.mem.asBytes(&starts[rows_max + 1]), diag);
        const Layer = struct {
            fn call(kd: KK.Kernels, args: [17]Ptr, r: usize) !void {
                try kd.conv(args[0], args[1], args[2], args[3], args[4], args[5], r, 3 * width, taps, 1, 0);
                try kd.tail(args[0], args[2], args[3], args[4], r, 3 * width, taps, 1, 0);
                try kd.recurrent(args[5], args[6], args[7], args[8], args[9], heads, args[10], args[11], args[12], args[3], args[4], args[13], args[14], args[15], r, heads, 1, 0, null, 1e-6);
            }
        };
        const args = [17]Ptr{ mixed, conv_w, tails, slots, positions, conv_out, decay, dt_bias, a_log, beta, gate, o_norm, states, run_starts, run_starts + (rows_max + 1) * 4, core, 0 };
        const us = try bench_time.timeMedian(gpu, 20, Layer.call, .{ kk, args, rows }, diag);
        // Each sequence's state read and written; the rows' inputs and outputs.
        const state_bytes = heads * head_dim * head_dim * 4;
        const bytes = 2 * runs * state_bytes + 4 * rows * (2 * 3 * width + 3 * width + heads + width);
        line(if (prompt) "KDA conv + rule, one 1024-row prompt" else "KDA conv + rule, decode rows", rows, us, bytes, copy_gbs);
    }
}

fn line(name: []const u8, rows: usize, us: f64, bytes: usize, copy_gbs: f64) void {
    const mb = @as(f64, @floatFromInt(bytes)) / 1e6;
    const gbs = mb / us * 1e3;
    say("{s:<34} {d:>5} {d:>10.1} {d:>10.1} {d:>9.0} {d:>7.1}%\n", .{ name, rows, us, mb, gbs, 100 * gbs / copy_gbs });
}
