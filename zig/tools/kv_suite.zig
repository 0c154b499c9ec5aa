//! `tf-cuda-test kv`: the KV caches on the GPU (f32: tf_attention; f16, fp8: tf_attention_heads_*)
//! against the host's (core/kv_store.zig) and a float64 attention:
//!   - tf_qk_rope_store writes the bytes KvStore.put writes (f16 values; fp8 codes and exponents),
//!     for keys over 2^-5..2^0 and values over 2^-5..2^5;
//!   - decode rows (contexts 1 .. 2600) on tf_attention_heads_* within 1e-5 of a float64 attention
//!     over the stored values (error relative to the largest |v|), GLM-4.5's 96 / 8 heads at
//!     head_dim 128 and a 4 / 2 model at 64 (a group smaller than the 16 rows of the products);
//!   - spread over splits and folded in the block: the same bits; each row alone and in the batch:
//!     the same bits;
//!   - 40 prompt rows on the prompt attention's tiles (head_dim 128) within the same bound;
//!   - all of it again at head_dim 128 in pages of 5 tokens placed in reverse order, so that a
//!     16-position chunk of the decode kernel spans pages that are not adjacent.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const K = cuda.glm_kernels;
const Ptr = cuda.gpu.DevicePtr;
const KvDtype = tf.core.KvDtype;
const KvStore = tf.core.KvStore;
const Diagnostic = tf.core.Diagnostic;
const Report = @import("report.zig").Report;
const upload = @import("device_upload.zig").upload;

const contexts = [_]usize{ 1, 17, 300, 1100, 2600 };
const tolerance = 1e-5;

const Shape = struct { heads: usize, kv_heads: usize, head_dim: usize, page_tokens: usize = 16, reversed: bool = false };

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, report: *Report) !void {
    var diag: Diagnostic = .{};
    var module = K.load(gpu, &diag) catch |err| {
        report.check(false, "load glm_forward: {s}", .{diag.message()});
        return err;
    };
    defer module.unload(gpu);
    const k: K.Kernels = .{ .gpu = gpu, .module = &module, .diag = &diag };
    const shapes = [_]Shape{
        .{ .heads = 96, .kv_heads = 8, .head_dim = 128 },
        .{ .heads = 4, .kv_heads = 2, .head_dim = 64 },
        .{ .heads = 96, .kv_heads = 8, .head_dim = 128, .page_tokens = 5, .reversed = true },
    };
    for (shapes) |shape| {
        for ([_]KvDtype{ .f32, .f16, .fp8 }) |dtype| {
            if (dtype == .fp8 and gpu.compute_capability < 89) continue;
            var prng = std.Random.DefaultPrng.init(0xca5e + shape.head_dim);
            try runShape(gpa, gpu, k, prng.random(), shape, dtype, report);
        }
    }
}

fn runShape(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: K.Kernels, random: std.Random, shape: Shape, dtype: KvDtype, report: *Report) !void {
    const d = shape.head_dim;
    const kvh = shape.kv_heads;
    const page_tokens = shape.page_tokens;
    var label_buffer: [64]u8 = undefined;
    const label = std.fmt.bufPrint(&label_buffer, "{s} head_dim {d}{s}", .{ dtype.name(), d, if (shape.reversed) ", pages of 5 reversed" else "" }) catch unreachable;
    var total: usize = 0;
    var first_page: [contexts.len]usize = undefined;
    for (contexts, 0..) |context, s| {
        first_page[s] = total / page_tokens;
        total += std.mem.alignForwardAnyAlign(usize, context, page_tokens);
    }
    const pages = total / page_tokens;
    // Every position of every sequence as a store row: keys and values over several binades.
    const keys = try gpa.alloc(f32, total * kvh * d);
    defer gpa.free(keys);
    const values = try gpa.alloc(f32, total * kvh * d);
    defer gpa.free(values);
    // Keys up to 2^0 keep the scores moderate (a score of hundreds leaves f32 itself ~1e-5 relative
    // in its softmax weights); values over 2^-5 .. 2^5.
    for (0..total * kvh) |unit| {
        const key_scale = std.math.pow(f32, 2, @floatFromInt(random.intRangeAtMost(i32, -5, 0)));
        const value_scale = std.math.pow(f32, 2, @floatFromInt(random.intRangeAtMost(i32, -5, 5)));
        for (keys[unit * d ..][0..d], values[unit * d ..][0..d]) |*kk, *v| {
            kk.* = random.floatNorm(f32) * key_scale;
            v.* = random.floatNorm(f32) * value_scale;
        }
    }
    const row_positions = try gpa.alloc(u32, total);
    defer gpa.free(row_positions);
    const row_offsets = try gpa.alloc(u32, total);
    defer gpa.free(row_offsets);
    const table = try gpa.alloc(u32, pages);
    defer gpa.free(table);
    for (table, 0..) |*p, i| p.* = @intCast(if (shape.reversed) pages - 1 - i else i);
    for (row_positions, row_offsets, 0..) |*position, *offset, r| {
        position.* = @intCast(r); // row r: slot r of the flat page table, every page in order
        offset.* = 0;
    }
    var host_k = try KvStore.init(gpa, dtype, pages, 1, kvh, page_tokens, d);
    defer host_k.deinit(gpa);
    var host_v = try KvStore.init(gpa, dtype, pages, 1, kvh, page_tokens, d);
    defer host_v.deinit(gpa);
    for (0..total) |r| for (0..kvh) |h| {
        host_k.put(table[r / page_tokens], 0, h, r % page_tokens, keys[(r * kvh + h) * d ..][0..d]);
        host_v.put(table[r / page_tokens], 0, h, r % page_tokens, values[(r * kvh + h) * d ..][0..d]);
    };

    const element_count = pages * kvh * page_tokens * d;
    const cache_bytes = element_count * dtype.bytes();
    const d_keys = try upload(gpu, std.mem.sliceAsBytes(keys), k.diag);
    defer gpu.free(d_keys);
    const d_values = try upload(gpu, std.mem.sliceAsBytes(values), k.diag);
    defer gpu.free(d_values);
    const d_cache_k = try gpu.alloc(cache_bytes, k.diag);
    defer gpu.free(d_cache_k);
    const d_cache_v = try gpu.alloc(cache_bytes, k.diag);
    defer gpu.free(d_cache_v);
    const d_exp_k = try gpu.alloc(element_count / d, k.diag);
    defer gpu.free(d_exp_k);
    const d_exp_v = try gpu.alloc(element_count / d, k.diag);
    defer gpu.free(d_exp_v);
    const d_positions = try upload(gpu, std.mem.sliceAsBytes(row_positions), k.diag);
    defer gpu.free(d_positions);
    const d_offsets = try upload(gpu, std.mem.sliceAsBytes(row_offsets), k.diag);
    defer gpu.free(d_offsets);
    const d_table = try upload(gpu, std.mem.sliceAsBytes(table), k.diag);
    defer gpu.free(d_table);
    var kv: K.Kernels.PagedKv = .{
        .cache_k = d_cache_k,
        .cache_v = d_cache_v,
        .exp_k = d_exp_k,
        .exp_v = d_exp_v,
        .dtype = dtype,
        .positions = d_positions,
        .tables = d_table,
        .table_offsets = d_offsets,
        .rows = total,
        .heads = 0, // keys and values only
        .kv_heads = kvh,
        .head_dim = d,
        .layers = 1,
        .layer = 0,
        .page_tokens = page_tokens,
    };
    try k.qkRopeStore(.{ .q = 0, .k = d_keys, .v = d_values, .q_norm = 0, .k_norm = 0, .cos_sin = 0, .rotary_dim = 0, .eps = 0 }, kv);
    const stored = try gpa.alloc(u8, cache_bytes);
    defer gpa.free(stored);
    const stored_exp = try gpa.alloc(u8, element_count / d);
    defer gpa.free(stored_exp);
    var same = true;
    for ([_]struct { cache: Ptr, exp: Ptr, host: *const KvStore }{ .{ .cache = d_cache_k, .exp = d_exp_k, .host = &host_k }, .{ .cache = d_cache_v, .exp = d_exp_v, .host = &host_v } }) |part| {
        try gpu.download(stored, part.cache, k.diag);
        switch (part.host.storage) {
            .f16 => |h| same = same and std.mem.eql(u8, stored, std.mem.sliceAsBytes(h)),
            .fp8 => |h| {
                try gpu.download(stored_exp, part.exp, k.diag);
                same = same and std.mem.eql(u8, stored, h.codes) and std.mem.eql(u8, stored_exp, std.mem.sliceAsBytes(h.exponents));
            },
            .f32 => |h| same = same and std.mem.eql(u8, stored, std.mem.sliceAsBytes(h)),
        }
    }
    report.check(same, "{s}: tf_qk_rope_store's {d} positions x {d} heads equal KvStore.put's bytes", .{ label, total, kvh });

    // Decode rows: row s is the last position of sequence s (its own pages).
    const rows = contexts.len;
    const q = try gpa.alloc(f32, rows * shape.heads * d);
    defer gpa.free(q);
    for (q) |*v| v.* = random.floatNorm(f32);
    var positions: [contexts.len]u32 = undefined;
    var offsets: [contexts.len]u32 = undefined;
    for (contexts, 0..) |context, s| {
        positions[s] = @intCast(context - 1);
        offsets[s] = @intCast(first_page[s]);
    }
    const d_q = try upload(gpu, std.mem.sliceAsBytes(q), k.diag);
    defer gpu.free(d_q);
    try gpu.upload(d_positions, std.mem.sliceAsBytes(&positions), k.diag);
    try gpu.upload(d_offsets, std.mem.sliceAsBytes(&offsets), k.diag);
    const d_out = try gpu.alloc(rows * shape.heads * d * 4, k.diag);
    defer gpu.free(d_out);
    const parts = try K.Kernels.AttentionParts.alloc(gpu, rows, shape.heads, d, k.diag);
    defer parts.free(gpu);
    kv.heads = shape.heads;
    kv.rows = rows;
    const whole = try gpa.alloc(f32, rows * shape.heads * d);
    defer gpa.free(whole);
    const spread = try gpa.alloc(f32, rows * shape.heads * d);
    defer gpa.free(spread);
    try k.attention(d_q, d_out, kv, null, 0);
    try gpu.download(std.mem.sliceAsBytes(whole), d_out, k.diag);
    try k.attention(d_q, d_out, kv, parts, 0);
    try gpu.download(std.mem.sliceAsBytes(spread), d_out, k.diag);
    var worst: f64 = 0;
    for (0..rows) |r| {
        const err = try referenceError(gpa, shape, &host_k, &host_v, table[offsets[r]..], positions[r], q[r * shape.heads * d ..][0 .. shape.heads * d], spread[r * shape.heads * d ..][0 .. shape.heads * d]);
        worst = @max(worst, err);
    }
    report.check(worst <= tolerance, "{s}: decode rows of contexts 1..2600 vs float64: max error {e:.2} ({d:.2} x tol {e})", .{ label, worst, worst / tolerance, tolerance });
    report.check(std.mem.eql(u32, @ptrCast(whole), @ptrCast(spread)), "{s}: spread over splits and folded in the block give the same bits", .{label});
    var alone_same = true;
    for (0..rows) |r| {
        var single = kv;
        single.rows = 1;
        single.positions = d_positions + r * 4;
        single.table_offsets = d_offsets + r * 4;
        try k.attention(d_q + r * shape.heads * d * 4, d_out, single, parts, 0);
        const alone = whole[0 .. shape.heads * d];
        try gpu.download(std.mem.sliceAsBytes(alone), d_out, k.diag);
        alone_same = alone_same and std.mem.eql(u32, @ptrCast(alone), @ptrCast(spread[r * shape.heads * d ..][0 .. shape.heads * d]));
    }
    report.check(alone_same, "{s}: every row alone equals its row in the batch, bit for bit", .{label});

    if (d != K.Kernels.prompt_attention_head_dim) return;
    // 40 prompt rows: positions 260..299 of the 300-token sequence, in tiles of 16.
    const prompt_rows = 40;
    const s = 2;
    var tile_table: [1 + 2 * prompt_rows]i32 = undefined;
    var tiles = K.Kernels.AttentionTiles.init(&tile_table);
    var prompt_positions: [prompt_rows]u32 = undefined;
    var prompt_offsets: [prompt_rows]u32 = undefined;
    for (0..prompt_rows) |r| {
        prompt_positions[r] = @intCast(contexts[s] - prompt_rows + r);
        prompt_offsets[r] = @intCast(first_page[s]);
        tiles.add(r, prompt_positions[r], @intCast(first_page[s]));
    }
    const pq = try gpa.alloc(f32, prompt_rows * shape.heads * d);
    defer gpa.free(pq);
    for (pq) |*v| v.* = random.floatNorm(f32);
    const d_pq = try upload(gpu, std.mem.sliceAsBytes(pq), k.diag);
    defer gpu.free(d_pq);
    const d_pout = try gpu.alloc(pq.len * 4, k.diag);
    defer gpu.free(d_pout);
    const d_tiles = try upload(gpu, std.mem.sliceAsBytes(tile_table[0 .. 1 + 2 * tiles.count]), k.diag);
    defer gpu.free(d_tiles);
    const d_ppos = try upload(gpu, std.mem.sliceAsBytes(&prompt_positions), k.diag);
    defer gpu.free(d_ppos);
    const d_poff = try upload(gpu, std.mem.sliceAsBytes(&prompt_offsets), k.diag);
    defer gpu.free(d_poff);
    kv.rows = prompt_rows;
    kv.positions = d_ppos;
    kv.table_offsets = d_poff;
    try k.attentionPrompt(d_pq, d_pout, kv, d_tiles, tiles.count);
    const pout = try gpa.alloc(f32, pq.len);
    defer gpa.free(pout);
    try gpu.download(std.mem.sliceAsBytes(pout), d_pout, k.diag);
    worst = 0;
    for (0..prompt_rows) |r| {
        const err = try referenceError(gpa, shape, &host_k, &host_v, table[first_page[s]..], prompt_positions[r], pq[r * shape.heads * d ..][0 .. shape.heads * d], pout[r * shape.heads * d ..][0 .. shape.heads * d]);
        worst = @max(worst, err);
    }
    report.check(worst <= tolerance, "{s}: 40 prompt rows on the tiles vs float64: max error {e:.2} ({d:.2} x tol {e})", .{ label, worst, worst / tolerance, tolerance });
}

/// max |ours - ref| / max |v| over one row's heads, the reference in float64 over the stored values.
fn referenceError(gpa: std.mem.Allocator, shape: Shape, keys: *const KvStore, values: *const KvStore, table: []const u32, position: u32, q: []const f32, ours: []const f32) !f64 {
    const d = shape.head_dim;
    const page_tokens = shape.page_tokens;
    const length = position + 1;
    const scores = try gpa.alloc(f64, length);
    defer gpa.free(scores);
    const out = try gpa.alloc(f64, d);
    defer gpa.free(out);
    var buffer: [128]f32 = undefined;
    var worst: f64 = 0;
    const group = shape.heads / shape.kv_heads;
    for (0..shape.heads) |h| {
        const kv = h / group;
        var max: f64 = -std.math.inf(f64);
        for (scores, 0..) |*score, t| {
            const key = keys.get(table[t / page_tokens], 0, kv, t % page_tokens, &buffer);
            var dot: f64 = 0;
            for (q[h * d ..][0..d], key) |a, b| dot += @as(f64, a) * b;
            score.* = dot / @sqrt(@as(f64, @floatFromInt(d)));
            max = @max(max, score.*);
        }
        var sum: f64 = 0;
        for (scores) |*score| {
            score.* = @exp(score.* - max);
            sum += score.*;
        }
        @memset(out, 0);
        var vmax: f64 = 0;
        for (scores, 0..) |p, t| {
            const value = values.get(table[t / page_tokens], 0, kv, t % page_tokens, &buffer);
            for (out, value) |*o, v| {
                o.* += p / sum * v;
                vmax = @max(vmax, @abs(@as(f64, v)));
            }
        }
        for (out, ours[h * d ..][0..d]) |r, o| worst = @max(worst, @abs(r - o) / vmax);
    }
    return worst;
}
