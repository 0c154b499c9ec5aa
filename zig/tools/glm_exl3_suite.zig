//! `tf-cuda-test glm-exl3 <fixture dir>`: the GLM forward on the GPU against the exact reference
//! and the peer, for the 3.0 and 4.0 bpw fixture models (a variant whose checkpoint is absent is
//! reported and skipped). The fixture dir is ../shared/fixtures/glm4_moe or a copy of it.
//!   - every fixture prompt's logits at every position (prompt kernels) vs the exact reference
//!     (transformers fp32 on the dequantized weights), rel L2 as a fraction of 1e-4;
//!   - the same vs the peer's logits: the first position within 3e-3 (the peer's fp16 precision),
//!     and how many positions stay there before a routing near-tie sends it elsewhere (pytest's
//!     test_glm_engine explains those);
//!   - random prompts of 1, 40, 200 and 1030 rows in one chunk vs the CPU forward;
//!   - greedy decode (generated rows on the grouped GEMV) equal to the reference's continuation;
//!   - rows 1023, 1024 and 1025 of a 1030-row prompt in 1024-row chunks equal to the same rows
//!     computed one row per forward, bit for bit.
const std = @import("std");
const tf = @import("trellisforge");
const Diagnostic = tf.core.Diagnostic;
const Engine = tf.engine.Engine;
const safetensors = tf.core.safetensors;

const Report = @import("report.zig").Report;

const say = @import("say.zig").say;

const tol_exact = 1e-4;
const tol_peer = 3e-3;

pub fn run(gpa: std.mem.Allocator, dir: []const u8, report: *Report) !void {
    var parsed = readJson(gpa, "{s}/prompts.json", .{dir}) catch |err| {
        report.check(false, "glm-exl3: cannot read {s}/prompts.json: {t}", .{ dir, err });
        return;
    };
    defer parsed.deinit();
    for ([_][]const u8{ "3.0", "4.0" }) |variant| {
        const model_dir = try std.fmt.allocPrint(gpa, "{s}/exl3_{s}bpw", .{ dir, variant });
        defer gpa.free(model_dir);
        var config = readJson(gpa, "{s}/config.json", .{model_dir}) catch {
            say("SKIP {s} bpw: no checkpoint at {s}\n", .{ variant, model_dir });
            continue;
        };
        config.deinit();
        try variantChecks(gpa, dir, model_dir, variant, parsed.value.object, report);
    }
}

fn readJson(gpa: std.mem.Allocator, comptime fmt: []const u8, args: anytype) !std.json.Parsed(std.json.Value) {
    const path = try std.fmt.allocPrint(gpa, fmt, args);
    defer gpa.free(path);
    var file = try tf.core.MappedFile.open(path);
    defer file.close();
    return std.json.parseFromSlice(std.json.Value, gpa, file.bytes, .{});
}

/// An f32 cache: the tolerances here are the exact reference's (1e-4), which the default f16 cache's
/// rounding (budget 1e-3) exceeds by design.
fn open(gpa: std.mem.Allocator, model_dir: []const u8, backend: tf.engine.engine.Backend, rows_max: u32, diag: *Diagnostic) !*Engine {
    const kv_f32: u32 = @backingInt(tf.core.KvDtype.f32);
    return Engine.init(gpa, model_dir, .{ .backend = @backingInt(backend), .sequences_max = 2, .context_tokens_max = 1040, .rows_max = rows_max, .kv_dtype = kv_f32 }, null, diag);
}

fn relativeL2(actual: []const f32, expected: []align(1) const f32) f64 {
    var num: f64 = 0;
    var den: f64 = 0;
    for (actual, expected) |a, e| {
        num += (@as(f64, a) - e) * (@as(f64, a) - e);
        den += @as(f64, e) * e;
    }
    return @sqrt(num / @max(den, 1e-300));
}

fn variantChecks(gpa: std.mem.Allocator, dir: []const u8, model_dir: []const u8, variant: []const u8, prompts: std.json.ObjectMap, report: *Report) !void {
    var diag: Diagnostic = .{};
    const gpu = open(gpa, model_dir, .cuda, 1030, &diag) catch |err| {
        report.check(false, "{s} bpw: open on cuda: {t}: {s}", .{ variant, err, diag.message() });
        return;
    };
    defer gpu.deinit();
    const vocab = gpu.config().vocab_size;
    const exact_path = try std.fmt.allocPrint(gpa, "{s}/dequant_ref/{s}bpw/dequant_fp32_logits.safetensors", .{ dir, variant });
    defer gpa.free(exact_path);
    var exact = safetensors.File.open(gpa, exact_path, &diag) catch |err| {
        report.check(false, "{s} bpw: the exact reference {s}: {t}", .{ variant, exact_path, err });
        return;
    };
    defer exact.deinit();
    const peer_path = try std.fmt.allocPrint(gpa, "{s}/peer/exl3_logits_{s}bpw.safetensors", .{ dir, variant });
    defer gpa.free(peer_path);
    var peer: ?safetensors.File = safetensors.File.open(gpa, peer_path, &diag) catch null;
    defer if (peer) |*p| p.deinit();

    var it = prompts.iterator();
    while (it.next()) |entry| {
        const name = entry.key_ptr.*;
        const items = entry.value_ptr.array.items;
        const tokens = try gpa.alloc(u32, items.len);
        defer gpa.free(tokens);
        for (tokens, items) |*t, v| t.* = @intCast(v.integer);
        const logits = try gpa.alloc(f32, tokens.len * vocab);
        defer gpa.free(logits);
        try gpu.promptLogits(&.{tokens}, logits, &diag);
        const reference = exact.find(name) orelse {
            report.check(false, "{s} bpw {s}: no exact reference", .{ variant, name });
            continue;
        };
        const expected = reference.elements(f32);
        var worst: f64 = 0;
        for (0..tokens.len) |p| worst = @max(worst, relativeL2(logits[p * vocab ..][0..vocab], expected[p * vocab ..][0..vocab]));
        report.check(worst <= tol_exact, "{s} bpw {s}: {d} positions vs exact, worst {e:.2} = {d:.3} x tol", .{ variant, name, tokens.len, worst, worst / tol_exact });
        if (peer) |*p| if (p.find(name)) |tensor| {
            const theirs = tensor.elements(f32);
            var clean: usize = 0;
            while (clean < tokens.len and relativeL2(logits[clean * vocab ..][0..vocab], theirs[clean * vocab ..][0..vocab]) <= tol_peer) clean += 1;
            const first = relativeL2(logits[0..vocab], theirs[0..vocab]);
            report.check(clean >= 1, "{s} bpw {s}: vs peer, first position {e:.2} = {d:.3} x tol ({e}), {d} of {d} positions within it before any routing flip", .{ variant, name, first, first / tol_peer, tol_peer, clean, tokens.len });
        };
    }
    try greedy(gpa, dir, gpu, variant, prompts, report);
    try rowsAgainstCpu(gpa, model_dir, gpu, variant, report);
    try chunkBoundary(gpa, model_dir, variant, report);
}

fn greedy(gpa: std.mem.Allocator, dir: []const u8, gpu: *Engine, variant: []const u8, prompts: std.json.ObjectMap, report: *Report) !void {
    var diag: Diagnostic = .{};
    var parsed = readJson(gpa, "{s}/dequant_ref/{s}bpw/dequant_fp32_greedy.json", .{ dir, variant }) catch |err| {
        report.check(false, "{s} bpw: the reference continuation {s}/dequant_ref/{s}bpw/dequant_fp32_greedy.json: {t}", .{ variant, dir, variant, err });
        return;
    };
    defer parsed.deinit();
    var it = prompts.iterator();
    while (it.next()) |entry| {
        const expected = (parsed.value.object.get(entry.key_ptr.*) orelse continue).array.items;
        const items = entry.value_ptr.array.items;
        const tokens = try gpa.alloc(u32, items.len);
        defer gpa.free(tokens);
        for (tokens, items) |*t, v| t.* = @intCast(v.integer);
        _ = try gpu.addSequence(tokens, .{ .max_tokens = @intCast(expected.len) }, &.{}, &diag);
        var produced: std.ArrayList(u32) = .empty;
        defer produced.deinit(gpa);
        var records: [8]tf.engine.engine.Record = undefined;
        while (produced.items.len < expected.len) {
            const n = try gpu.step(&records, &diag);
            for (records[0..n]) |r| try produced.append(gpa, r.token);
        }
        var same = produced.items.len == expected.len;
        for (produced.items, expected) |a, e| same = same and a == e.integer;
        report.check(same, "{s} bpw {s}: greedy {d} tokens (decode on the GEMV) equal the reference's", .{ variant, entry.key_ptr.*, expected.len });
    }
}

fn randomTokens(gpa: std.mem.Allocator, count: usize, seed: u64, vocab: usize) ![]u32 {
    const tokens = try gpa.alloc(u32, count);
    var prng = std.Random.DefaultPrng.init(seed);
    for (tokens) |*t| t.* = prng.random().uintLessThan(u32, @intCast(vocab));
    return tokens;
}

fn rowsAgainstCpu(gpa: std.mem.Allocator, model_dir: []const u8, gpu: *Engine, variant: []const u8, report: *Report) !void {
    var diag: Diagnostic = .{};
    const cpu = try open(gpa, model_dir, .cpu, 1030, &diag);
    defer cpu.deinit();
    const vocab = gpu.config().vocab_size;
    for ([_]usize{ 1, 40, 200, 1030 }, 0..) |rows, i| {
        const tokens = try randomTokens(gpa, rows, 100 + i, vocab);
        defer gpa.free(tokens);
        const on_gpu = try gpa.alloc(f32, rows * vocab);
        defer gpa.free(on_gpu);
        const on_cpu = try gpa.alloc(f32, rows * vocab);
        defer gpa.free(on_cpu);
        try gpu.promptLogits(&.{tokens}, on_gpu, &diag);
        try cpu.promptLogits(&.{tokens}, on_cpu, &diag);
        var worst: f64 = 0;
        for (0..rows) |p| worst = @max(worst, relativeL2(on_gpu[p * vocab ..][0..vocab], on_cpu[p * vocab ..][0..vocab]));
        report.check(worst <= tol_exact, "{s} bpw: {d} prompt rows on the prompt kernels vs CPU, worst {e:.2} = {d:.3} x tol", .{ variant, rows, worst, worst / tol_exact });
    }
}

fn chunkBoundary(gpa: std.mem.Allocator, model_dir: []const u8, variant: []const u8, report: *Report) !void {
    var diag: Diagnostic = .{};
    const batched = try open(gpa, model_dir, .cuda, 1024, &diag);
    defer batched.deinit();
    const alone = try open(gpa, model_dir, .cuda, 1, &diag);
    defer alone.deinit();
    const vocab = batched.config().vocab_size;
    const tokens = try randomTokens(gpa, 1030, 10, vocab);
    defer gpa.free(tokens);
    const a = try gpa.alloc(f32, 1030 * vocab);
    defer gpa.free(a);
    const b = try gpa.alloc(f32, 1026 * vocab);
    defer gpa.free(b);
    try batched.promptLogits(&.{tokens}, a, &diag);
    try alone.promptLogits(&.{tokens[0..1026]}, b, &diag);
    for ([_]usize{ 1023, 1024, 1025 }) |p| {
        const same = std.mem.eql(u8, std.mem.sliceAsBytes(a[p * vocab ..][0..vocab]), std.mem.sliceAsBytes(b[p * vocab ..][0..vocab]));
        report.check(same, "{s} bpw: row {d} of 1030 in 1024-row chunks equals the row computed alone, bit for bit", .{ variant, p });
    }
}
