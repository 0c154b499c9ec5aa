//! `tf-cuda-test mla`'s attention cases: tf_mla_attention over a paged latent cache of f32, f16 and
//! fp8 rows against a float64 host reference, and its two forms against each other bit for bit: a
//! block per row running every split (what prompt rows run) and a block per split with the fold
//! after (decode rows; the two-blocks-an-SM entries where the grid outnumbers the SMs). The rows of
//! a launch are each their own sequence, long ones (20k positions: 20 tiles a split) beside short
//! ones (one position, one tile), GLM-4.7-Flash's 20 heads (a last group of 4), 32, 10 and 64, and a
//! DSA selection (evenly spaced picks, at most `topk` of a row's positions).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const mla = cuda.mla_kernels;
const fp8 = tf.core.fp8;
const KvDtype = tf.core.KvDtype;
const Ptr = cuda.gpu.DevicePtr;
const Report = @import("report.zig").Report;
const Uploads = @import("device_upload.zig").Uploads;

const page_tokens = 16;
const width = mla.latent + mla.rope;
const qk_dim = 256; // GLM-4.7-Flash: nope 192 + rope 64
const nope_dim = 192;
const scale: f32 = 0.0625;
/// Relative L2 of a (row, head)'s output against the f64 answer: the products' f16 high and low
/// parts are exact to ~2^-22, the sums f32.
const tolerance = 1e-5;

/// Rows' contexts (positions 0 .. count - 1 of their own sequence); a selection of `topk` when set.
const Case = struct { heads: usize, counts: []const usize, topk: usize = 0 };
const cases = [_]Case{
    .{ .heads = 20, .counts = &.{ 20001, 1, 1500, 8192 } },
    .{ .heads = 32, .counts = &.{ 9000, 33 } },
    .{ .heads = 10, .counts = &.{ 8200, 700 } },
    .{ .heads = 64, .counts = &.{9000} },
    .{ .heads = 32, .counts = &.{ 5000, 900 }, .topk = 2048 },
};

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: mla.Kernels, random: std.Random, report: *Report) !void {
    for (cases) |case| for ([_]KvDtype{ .f32, .f16, .fp8 }) |dtype| try attention(gpa, gpu, k, random, case, dtype, report);
}

fn attention(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: mla.Kernels, random: std.Random, case: Case, dtype: KvDtype, report: *Report) !void {
    const rows = case.counts.len;
    const heads = case.heads;
    // Row r's pages follow row r - 1's; the page table is the identity.
    const offsets = try gpa.alloc(u32, rows);
    defer gpa.free(offsets);
    const positions = try gpa.alloc(u32, rows);
    defer gpa.free(positions);
    var pages: usize = 0;
    for (case.counts, offsets, positions) |count, *offset, *position| {
        offset.* = @intCast(pages);
        position.* = @intCast(count - 1);
        pages += std.math.divCeil(usize, count, page_tokens) catch unreachable;
    }
    const table = try gpa.alloc(u32, pages);
    defer gpa.free(table);
    for (table, 0..) |*entry, i| entry.* = @intCast(i);

    // The cache as stored and as the reference reads it (the stored values, widened).
    const elements = pages * page_tokens;
    const values = try gpa.alloc(f32, elements * width);
    defer gpa.free(values);
    for (values) |*v| v.* = random.floatNorm(f32);
    const stored = try gpa.alloc(u8, elements * width * dtype.bytes());
    defer gpa.free(stored);
    const exps = try gpa.alloc(i8, elements);
    defer gpa.free(exps);
    @memset(exps, 0);
    for (0..elements) |e| {
        const row = values[e * width ..][0..width];
        switch (dtype) {
            .f32 => @memcpy(std.mem.bytesAsSlice(f32, stored[e * width * 4 ..][0 .. width * 4]), row),
            .f16 => for (std.mem.bytesAsSlice(f16, stored[e * width * 2 ..][0 .. width * 2]), row) |*h, *v| {
                h.* = @floatCast(v.*);
                v.* = h.*;
            },
            .fp8 => {
                var amax: f32 = 0;
                for (row) |v| amax = @max(amax, @abs(v));
                exps[e] = fp8.scaleExponent(amax);
                for (stored[e * width ..][0..width], row) |*code, *v| {
                    code.* = fp8.encode(std.math.ldexp(v.*, -@as(i32, exps[e])));
                    v.* = fp8.decoded[code.*] * fp8.pow2(exps[e]);
                }
            },
        }
    }
    // A row's picks (ascending), or its every position.
    const topk = @max(case.topk, 1);
    const picks = try gpa.alloc(u32, rows * topk);
    defer gpa.free(picks);
    const picked = try gpa.alloc(u32, rows);
    defer gpa.free(picked);
    for (case.counts, 0..) |count, row| {
        picked[row] = @intCast(if (case.topk > 0) @min(case.topk, count) else count);
        if (case.topk > 0) for (picks[row * topk ..][0..picked[row]], 0..) |*pick, i| {
            pick.* = @intCast(i * count / picked[row]);
        };
    }
    const q = try gpa.alloc(f32, rows * heads * qk_dim);
    defer gpa.free(q);
    for (q) |*v| v.* = random.floatNorm(f32);
    const q_lat = try gpa.alloc(f32, rows * heads * mla.latent);
    defer gpa.free(q_lat);
    for (q_lat) |*v| v.* = random.floatNorm(f32);

    var uploads: Uploads = .{ .gpu = gpu, .diag = k.diag };
    defer uploads.deinit();
    var d: Device = undefined;
    d.cache = try uploads.put(stored);
    d.exps = try uploads.put(exps);
    d.positions = try uploads.put(positions);
    d.tables = try uploads.put(table);
    d.offsets = try uploads.put(offsets);
    d.q = try uploads.put(q);
    d.q_lat = try uploads.put(q_lat);
    d.selected = try uploads.put(picks);
    d.counts = try uploads.put(picked);
    d.topk = case.topk;
    const floats = mla.Parts.floats(rows, heads);
    const parts: mla.Parts = .{ .acc = try gpu.alloc(floats.acc * 4, k.diag), .ml = try gpu.alloc(floats.ml * 4, k.diag) };
    defer gpu.free(parts.acc);
    defer gpu.free(parts.ml);
    d.out = try gpu.alloc(rows * heads * mla.latent * 4, k.diag);
    defer gpu.free(d.out);

    const outputs = rows * heads * mla.latent;
    var results: [2][]f32 = undefined; // a block per row, a block per split
    for (&results) |*r| r.* = try gpa.alloc(f32, outputs);
    defer for (results) |r| gpa.free(r);
    for (results, [_]?mla.Parts{ null, parts }) |r, spread| {
        try gpu.zero(d.out, outputs * 4, k.diag);
        try launch(k, d, dtype, rows, heads, spread);
        try gpu.download(std.mem.sliceAsBytes(r), d.out, k.diag);
    }
    report.check(std.mem.eql(u32, @ptrCast(results[0]), @ptrCast(results[1])), "mla attention {s} heads {d} counts {any} top-{d}: a block per row and a block per split give the same bits", .{
        @tagName(dtype), heads, case.counts, case.topk,
    });

    // The f64 answer of every third head (and the last) of every row.
    var worst: f64 = 0;
    const scores = try gpa.alloc(f64, std.mem.max(usize, case.counts));
    defer gpa.free(scores);
    for (picked, 0..) |count, row| for (0..heads) |h| {
        if (h % 3 != 0 and h + 1 != heads) continue;
        const qh = q[(row * heads + h) * qk_dim ..][0..qk_dim];
        const lh = q_lat[(row * heads + h) * mla.latent ..][0..mla.latent];
        var top: f64 = -std.math.inf(f64);
        for (0..count) |i| {
            const p = if (case.topk > 0) picks[row * topk + i] else i;
            const e = offsets[row] * page_tokens + p;
            const kv = values[e * width ..][0..width];
            var dot: f64 = 0;
            for (lh, kv[0..mla.latent]) |a, b| dot += @as(f64, a) * b;
            for (qh[nope_dim..], kv[mla.latent..]) |a, b| dot += @as(f64, a) * b;
            scores[i] = dot * scale;
            top = @max(top, scores[i]);
        }
        var answer: [mla.latent]f64 = @splat(0);
        var sum: f64 = 0;
        for (0..count) |i| {
            const p = if (case.topk > 0) picks[row * topk + i] else i;
            const w = @exp(scores[i] - top);
            sum += w;
            const kv = values[(offsets[row] * page_tokens + p) * width ..][0..mla.latent];
            for (&answer, kv) |*a, v| a.* += w * v;
        }
        var err: f64 = 0;
        var norm: f64 = 0;
        for (answer, results[0][(row * heads + h) * mla.latent ..][0..mla.latent]) |a, got| {
            err += (got - a / sum) * (got - a / sum);
            norm += (a / sum) * (a / sum);
        }
        worst = @max(worst, @sqrt(err / norm));
    };
    report.check(worst <= tolerance, "mla attention {s} heads {d} counts {any} top-{d} vs f64: worst relative L2 {e:.2} ({d:.3} x tol {e})", .{
        @tagName(dtype), heads, case.counts, case.topk, worst, worst / tolerance, tolerance,
    });
}

const Device = struct { cache: Ptr, exps: Ptr, positions: Ptr, tables: Ptr, offsets: Ptr, q: Ptr, q_lat: Ptr, out: Ptr, selected: Ptr, counts: Ptr, topk: usize };

fn launch(k: mla.Kernels, d: Device, dtype: KvDtype, rows: usize, heads: usize, parts: ?mla.Parts) !void {
    const paged: mla.Paged = .{ .cache = d.cache, .dtype = dtype, .exps = d.exps, .positions = d.positions, .tables = d.tables, .table_offsets = d.offsets, .rows = rows, .layers = 1, .layer = 0, .page_tokens = page_tokens };
    const selection: mla.Selection = if (d.topk > 0) .{ .selected = d.selected, .counts = d.counts, .topk = d.topk } else .{};
    try k.attention(d.q, d.q_lat, d.out, paged, selection, parts, heads, qk_dim, nope_dim, scale);
}
