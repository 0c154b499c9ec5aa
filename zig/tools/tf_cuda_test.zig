//! tf-cuda-test <suite>: GPU checks against the CPU reference paths, one PASS/FAIL line per check,
//! exit code 1 on any failure. Runs on the device machine (docs/measurements.md records runs).
//!   exl3-decode   the decode kernel equals the CPU decoder bit for bit, every rate and codebook
//!   glm-exl3 DIR  the GLM forward on the GPU vs the exact reference, the peer and the CPU, the
//!                 chunk-boundary bit check (glm_exl3_suite.zig); DIR: shared/fixtures/glm4_moe
//!   dense         the f16 projections on the tensor cores and the sliced logits summary vs f64,
//!                 and their rows' bits independent of the batch (dense_suite.zig)
//!   kv            the f16 and fp8 KV caches: stored bytes equal the host's, attention vs f64,
//!                 spread/whole and alone/batched bits (kv_suite.zig)
//!   mla           MLA's head products for a prompt chunk's rows equal the decode step's kernels
//!                 bit for bit, and both vs f64 (mla_suite.zig); the latent attention's forms bit
//!                 for bit and vs f64 (mla_attention_suite.zig)
//!   route         the MoE router's launch equals the CPU router expert for expert, ties at the
//!                 top-k cut, groups, a merged shared expert, prompt rows (route_suite.zig); the
//!                 sort of the picks into groups by entry (group_suite.zig)
//!   nccl [--world N --rank R --master HOST:PORT]
//!                 all-reduce, broadcast and all-gather exact, the all-reduce replayed from a
//!                 graph, and the all-reduce bus bandwidth;
//!                 one process per GPU, the unique id sent from rank 0 over TCP
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const exl3 = tf.exl3;
const Diagnostic = tf.core.Diagnostic;

const glm_exl3 = @import("glm_exl3_suite.zig");
const dense = @import("dense_suite.zig");
const kv = @import("kv_suite.zig");
const mla = @import("mla_suite.zig");
const route = @import("route_suite.zig");
const Report = @import("report.zig").Report;

const say = @import("say.zig").say;

pub fn main(init: std.process.Init) u8 {
    const args = init.minimal.args.toSlice(init.arena.allocator()) catch return 2;
    const suite = if (args.len >= 2) args[1] else "";
    const is_nccl = std.mem.eql(u8, suite, "nccl");
    const is_glm = std.mem.eql(u8, suite, "glm-exl3") and args.len == 3;
    const is_dense = std.mem.eql(u8, suite, "dense");
    const is_kv = std.mem.eql(u8, suite, "kv");
    const is_mla = std.mem.eql(u8, suite, "mla");
    const is_route = std.mem.eql(u8, suite, "route");
    if (!std.mem.eql(u8, suite, "exl3-decode") and !is_nccl and !is_glm and !is_dense and !is_kv and !is_mla and !is_route) {
        say("usage: tf-cuda-test exl3-decode | dense | kv | mla | route | glm-exl3 FIXTURE_DIR | nccl [--world N --rank R --master HOST:PORT]\n", .{});
        return 2;
    }
    var options: NcclOptions = .{};
    if (is_nccl) options = NcclOptions.parse(args[2..]) orelse {
        say("usage: tf-cuda-test nccl [--world N --rank R --master HOST:PORT]\n", .{});
        return 2;
    };
    var diag: Diagnostic = .{};
    var gpu = cuda.Gpu.open(@intCast(options.rank), &diag) catch {
        say("FAIL open GPU: {s}\n", .{diag.message()});
        return 1;
    };
    defer gpu.close();
    say("device: {s}, sm_{d}, {d} SMs; kernels built for sm {s}\n", .{ gpu.name(), gpu.compute_capability, gpu.multiprocessors, cuda.kernels.sm_list });

    var report: Report = .{};
    if (is_glm) {
        glm_exl3.run(init.gpa, args[2], &report) catch |err| {
            report.check(false, "glm-exl3 aborted: {t}", .{err});
        };
    } else if (is_dense) {
        dense.run(init.gpa, &gpu, &report) catch |err| {
            report.check(false, "dense aborted: {t}", .{err});
        };
    } else if (is_kv) {
        kv.run(init.gpa, &gpu, &report) catch |err| {
            report.check(false, "kv aborted: {t}", .{err});
        };
    } else if (is_mla) {
        mla.run(init.gpa, &gpu, &report) catch |err| {
            report.check(false, "mla aborted: {t}", .{err});
        };
    } else if (is_route) {
        route.run(init.gpa, &gpu, &report) catch |err| {
            report.check(false, "route aborted: {t}", .{err});
        };
    } else if (is_nccl) {
        ncclSuite(init.gpa, &gpu, options, &report, &diag) catch |err| {
            report.check(false, "nccl aborted: {t}: {s}", .{ err, diag.message() });
        };
    } else {
        exl3DecodeSuite(init.gpa, &gpu, &report) catch |err| {
            report.check(false, "exl3-decode aborted: {t}: {s}", .{ err, diag.message() });
        };
    }
    say("{d} passed, {d} failed\n", .{ report.passed, report.failed });
    return if (report.failed == 0) 0 else 1;
}

const rates_bits2 = [_]u8{ 2, 4, 6, 8, 10, 12, 14, 16, 3, 5, 7 };

fn exl3DecodeSuite(gpa: std.mem.Allocator, gpu: *cuda.Gpu, report: *Report) !void {
    var diag: Diagnostic = .{};
    var module = cuda.exl3_decode.load(gpu, &diag) catch |err| {
        report.check(false, "load exl3_decode: {s}", .{diag.message()});
        return err;
    };
    defer module.unload(gpu);

    var prng = std.Random.DefaultPrng.init(0x5eed_e713);
    for (rates_bits2) |bits2| {
        const rate: exl3.trellis.Rate = .{ .bits2 = bits2 };
        for ([_]exl3.Codebook{ .@"3inst", .mcg, .mul1 }) |cb| {
            if (rate.isHalf() and cb != .mul1) continue; // half rates are MUL1-only (EXL3.md §7)
            const mismatches = try compareDecode(gpa, gpu, &module, prng.random(), rate, cb, 8, 16, null);
            report.check(mismatches == 0, "exl3-decode K={d}{s} {t}: 32768 weights, {d} mismatches", .{
                bits2 / 2, if (rate.isHalf()) ".5" else "", cb, mismatches,
            });
        }
    }
    // Every one of the 65536 states of every codebook: 2^20 uniformly random 16-bit windows at K=8
    // miss a given state with probability e^-16, and the check counts coverage.
    for ([_]exl3.Codebook{ .@"3inst", .mcg, .mul1 }) |cb| {
        var seen = try std.DynamicBitSet.initEmpty(gpa, 1 << 16);
        defer seen.deinit();
        const mismatches = try compareDecode(gpa, gpu, &module, prng.random(), .{ .bits2 = 16 }, cb, 64, 64, &seen);
        report.check(mismatches == 0 and seen.count() == 1 << 16, "exl3-decode all states {t}: {d} of 65536 states seen, {d} mismatches", .{ cb, seen.count(), mismatches });
    }
}

/// Random trellis words for a (tile_rows x tile_columns) grid, decoded on the GPU and by the CPU
/// decoder; returns the number of weights whose fp16 bits differ.
fn compareDecode(
    gpa: std.mem.Allocator,
    gpu: *cuda.Gpu,
    module: *const cuda.exl3_decode.DecodeModule,
    random: std.Random,
    rate: exl3.trellis.Rate,
    cb: exl3.Codebook,
    tile_rows: u32,
    tile_columns: u32,
    seen: ?*std.DynamicBitSet,
) !usize {
    var diag: Diagnostic = .{};
    const per_tile = rate.wordsPerTile();
    const tiles = @as(usize, tile_rows) * tile_columns;
    const words = try gpa.alloc(u16, tiles * per_tile);
    defer gpa.free(words);
    for (words) |*w| w.* = random.int(u16);
    const columns = @as(usize, tile_columns) * 16;
    const expected = try gpa.alloc(u16, tiles * 256);
    defer gpa.free(expected);
    const actual = try gpa.alloc(u16, tiles * 256);
    defer gpa.free(actual);

    for (0..tile_rows) |tile_row| {
        for (0..tile_columns) |tile_column| {
            const tile_words = words[(tile_row * tile_columns + tile_column) * per_tile ..][0..per_tile];
            var tile: [256]u16 = undefined;
            exl3.trellis.decodeTileBits(rate, cb, tile_words, &tile);
            if (seen) |set| {
                var states: [256]u16 = undefined;
                exl3.trellis.states(rate, tile_words, &states);
                for (states) |s| set.set(s);
            }
            for (0..16) |r| @memcpy(expected[(tile_row * 16 + r) * columns + tile_column * 16 ..][0..16], tile[r * 16 ..][0..16]);
        }
    }

    const words_gl = try gpu.alloc(words.len * 2, &diag);
    defer gpu.free(words_gl);
    const out_gl = try gpu.alloc(actual.len * 2, &diag);
    defer gpu.free(out_gl);
    try gpu.upload(words_gl, std.mem.sliceAsBytes(words), &diag);
    try gpu.poison(out_gl, actual.len * 2, &diag);
    var timer = try cuda.gpu.Timer.create(gpu, &diag);
    defer timer.destroy(gpu);
    try timer.begin(gpu, &diag);
    try cuda.exl3_decode.run(gpu, module, .{
        .words = words_gl,
        .out = out_gl,
        .tile_rows = tile_rows,
        .tile_columns = tile_columns,
        .rate = rate,
        .codebook = cb,
    }, &diag);
    const elapsed_ms = try timer.end(gpu, &diag);
    if (seen != null) say("     (decode of {d} weights: {d:.3} ms including launch; a correctness kernel, not the GEMM path)\n", .{ actual.len, elapsed_ms });
    try gpu.download(std.mem.sliceAsBytes(actual), out_gl, &diag);

    var mismatches: usize = 0;
    for (expected, actual) |e, a| mismatches += @intFromBool(e != a);
    return mismatches;
}

const NcclOptions = struct {
    world: usize = 1,
    rank: usize = 0,
    host: []const u8 = "127.0.0.1",
    port: u16 = 29500,

    fn parse(args: []const [:0]const u8) ?NcclOptions {
        var options: NcclOptions = .{};
        var i: usize = 0;
        while (i + 1 < args.len) : (i += 2) {
            const value = args[i + 1];
            if (std.mem.eql(u8, args[i], "--world")) {
                options.world = std.fmt.parseInt(usize, value, 10) catch return null;
            } else if (std.mem.eql(u8, args[i], "--rank")) {
                options.rank = std.fmt.parseInt(usize, value, 10) catch return null;
            } else if (std.mem.eql(u8, args[i], "--master")) {
                const colon = std.mem.lastIndexOfScalar(u8, value, ':') orelse return null;
                options.host = value[0..colon];
                options.port = std.fmt.parseInt(u16, value[colon + 1 ..], 10) catch return null;
            } else return null;
        }
        if (i != args.len or options.world == 0 or options.rank >= options.world or options.world > 16) return null;
        return options;
    }
};

fn ncclSuite(gpa: std.mem.Allocator, gpu: *cuda.Gpu, options: NcclOptions, report: *Report, diag: *Diagnostic) !void {
    const dist = tf.dist;
    var nccl = try dist.nccl.Nccl.open(diag);
    defer nccl.close();
    say("nccl version {d}, rank {d} of {d}\n", .{ nccl.version, options.rank, options.world });
    // Rank 0 makes the unique id and sends it to the others over TCP.
    var id: dist.nccl.UniqueId = undefined;
    var peers: [16]dist.tcp.Connection = undefined;
    var master: ?dist.tcp.Connection = null;
    defer if (master) |*m| m.close();
    if (options.rank == 0) {
        id = try nccl.uniqueId(diag);
        if (options.world > 1) {
            try dist.tcp.acceptPeers(options.host, options.port, peers[0 .. options.world - 1], 120, diag);
            for (peers[0 .. options.world - 1]) |*p| try p.sendValue(id, diag);
        }
    } else {
        master = try dist.tcp.connectToMaster(options.host, options.port, @intCast(options.rank), 120, diag);
        id = try master.?.recvValue(dist.nccl.UniqueId, diag);
    }
    defer if (options.rank == 0 and options.world > 1) for (peers[0 .. options.world - 1]) |*p| p.close();
    const comm = try nccl.initRank(options.world, options.rank, id, diag);
    defer _ = nccl.api.ncclCommDestroy(comm);
    const stream: dist.nccl.Stream = @ptrCast(gpu.stream);

    const count: usize = 1 << 20;
    const host = try gpa.alloc(f32, count * options.world);
    defer gpa.free(host);
    const buffer = try gpu.alloc(count * 4 * options.world, diag);
    defer gpu.free(buffer);
    const value = struct {
        fn at(rank: usize, i: usize) f32 {
            return @floatFromInt((rank * 7 + i * 3) % 1001); // small integers: every sum is exact
        }
    };

    for (host[0..count], 0..) |*v, i| v.* = value.at(options.rank, i);
    try gpu.upload(buffer, std.mem.sliceAsBytes(host[0..count]), diag);
    try nccl.allReduceSum(comm, buffer, count, .float32, stream, diag);
    try gpu.download(std.mem.sliceAsBytes(host[0..count]), buffer, diag);
    var wrong: usize = 0;
    for (host[0..count], 0..) |v, i| {
        var expected: f32 = 0;
        for (0..options.world) |r| expected += value.at(r, i);
        wrong += @intFromBool(v != expected);
    }
    report.check(wrong == 0, "nccl all-reduce sum of {d} floats over {d} rank(s): {d} wrong", .{ count, options.world, wrong });

    for (host[0..count], 0..) |*v, i| v.* = if (options.rank == 0) value.at(0, i) else -1;
    try gpu.upload(buffer, std.mem.sliceAsBytes(host[0..count]), diag);
    try nccl.broadcast(comm, buffer, count, .float32, 0, stream, diag);
    try gpu.download(std.mem.sliceAsBytes(host[0..count]), buffer, diag);
    wrong = 0;
    for (host[0..count], 0..) |v, i| wrong += @intFromBool(v != value.at(0, i));
    report.check(wrong == 0, "nccl broadcast of {d} floats from rank 0: {d} wrong", .{ count, wrong });

    const gathered = try gpu.alloc(count * 4 * options.world, diag);
    defer gpu.free(gathered);
    for (host[0..count], 0..) |*v, i| v.* = value.at(options.rank, i);
    try gpu.upload(buffer, std.mem.sliceAsBytes(host[0..count]), diag);
    try nccl.allGather(comm, buffer, gathered, count, .float32, stream, diag);
    try gpu.download(std.mem.sliceAsBytes(host), gathered, diag);
    wrong = 0;
    for (0..options.world) |r| {
        for (host[r * count ..][0..count], 0..) |v, i| wrong += @intFromBool(v != value.at(r, i));
    }
    report.check(wrong == 0, "nccl all-gather of {d} floats per rank: {d} wrong", .{ count, wrong });

    // The all-reduce recorded in a graph, as a tensor-parallel rank records its forward, and the
    // graph replayed over new contents: each replay sums what the buffer holds then.
    try gpu.synchronize(diag);
    try cuda.gpu.Graph.beginCapture(gpu, diag);
    nccl.allReduceSum(comm, buffer, count, .float32, stream, diag) catch |err| {
        _ = cuda.gpu.Graph.endCapture(gpu, false, diag) catch {};
        return err;
    };
    var graph = try cuda.gpu.Graph.endCapture(gpu, true, diag);
    defer graph.destroy(gpu);
    wrong = 0;
    for (0..3) |replay| {
        for (host[0..count], 0..) |*v, i| v.* = value.at(options.rank + replay, i);
        try gpu.upload(buffer, std.mem.sliceAsBytes(host[0..count]), diag);
        try graph.launch(gpu, diag);
        try gpu.download(std.mem.sliceAsBytes(host[0..count]), buffer, diag);
        for (host[0..count], 0..) |v, i| {
            var expected: f32 = 0;
            for (0..options.world) |r| expected += value.at(r + replay, i);
            wrong += @intFromBool(v != expected);
        }
    }
    report.check(wrong == 0, "nccl all-reduce recorded in a graph, replayed 3 times over new values: {d} wrong", .{wrong});

    // Bus bandwidth of a 256 MiB all-reduce, as nccl-tests reports it: 2(n-1)/n x size / time.
    const big_count: usize = 64 << 20;
    const big = try gpu.alloc(big_count * 4, diag);
    defer gpu.free(big);
    var timer = try cuda.gpu.Timer.create(gpu, diag);
    defer timer.destroy(gpu);
    try nccl.allReduceSum(comm, big, big_count, .float32, stream, diag); // warm-up
    const repeats = 10;
    try timer.begin(gpu, diag);
    for (0..repeats) |_| try nccl.allReduceSum(comm, big, big_count, .float32, stream, diag);
    const elapsed_ms = try timer.end(gpu, diag) / repeats;
    const bytes: f64 = @floatFromInt(big_count * 4);
    const algorithm_gbs = bytes / (@as(f64, elapsed_ms) * 1e-3) / 1e9;
    const factor = 2.0 * @as(f64, @floatFromInt(options.world - 1)) / @as(f64, @floatFromInt(options.world));
    say("nccl all-reduce 256 MiB: {d:.3} ms, algorithm bandwidth {d:.1} GB/s, bus bandwidth {d:.1} GB/s\n", .{ elapsed_ms, algorithm_gbs, algorithm_gbs * factor });

    // The all-reduce a decode step makes twice per layer: one hidden row (4096 f32, 16 KiB).
    const row_count: usize = 4096;
    try nccl.allReduceSum(comm, big, row_count, .float32, stream, diag); // warm-up
    const row_repeats = 200;
    try timer.begin(gpu, diag);
    for (0..row_repeats) |_| try nccl.allReduceSum(comm, big, row_count, .float32, stream, diag);
    const row_us = try timer.end(gpu, diag) * 1e3 / row_repeats;
    say("nccl all-reduce of one 4096-float row: {d:.1} us (the latency a decode step pays twice per layer)\n", .{row_us});
}
