//! tf-cuda-test <suite>: GPU checks against the CPU reference paths, one PASS/FAIL line per check,
//! exit code 1 on any failure. Runs on the device machine (docs/measurements.md records runs).
//!   exl3-decode   the decode kernel equals the CPU decoder bit for bit, every rate and codebook
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const exl3 = tf.exl3;
const Diagnostic = tf.core.Diagnostic;

const Report = struct {
    passed: u32 = 0,
    failed: u32 = 0,

    fn check(report: *Report, ok: bool, comptime fmt: []const u8, args: anytype) void {
        if (ok) report.passed += 1 else report.failed += 1;
        say("{s} " ++ fmt ++ "\n", .{if (ok) "PASS" else "FAIL"} ++ args);
    }
};

fn say(comptime fmt: []const u8, args: anytype) void {
    var buffer: [4096]u8 = undefined;
    const text = std.fmt.bufPrint(&buffer, fmt, args) catch return;
    _ = std.c.write(1, text.ptr, text.len);
}

pub fn main(init: std.process.Init) u8 {
    const args = init.minimal.args.toSlice(init.arena.allocator()) catch return 2;
    const suite = if (args.len >= 2) args[1] else "";
    if (!std.mem.eql(u8, suite, "exl3-decode")) {
        say("usage: tf-cuda-test exl3-decode\n", .{});
        return 2;
    }
    var diag: Diagnostic = .{};
    var gpu = cuda.Gpu.open(0, &diag) catch {
        say("FAIL open GPU: {s}\n", .{diag.message()});
        return 1;
    };
    defer gpu.close();
    say("device: {s}, sm_{d}, {d} SMs; kernels built for sm {s}\n", .{ gpu.name(), gpu.compute_capability, gpu.multiprocessors, cuda.kernels.sm_list });

    var report: Report = .{};
    exl3DecodeSuite(init.gpa, &gpu, &report) catch |err| {
        report.check(false, "exl3-decode aborted: {t}: {s}", .{ err, diag.message() });
    };
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
