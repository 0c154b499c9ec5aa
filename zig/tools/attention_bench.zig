//! tf-bench's attention table: the attention of one GLM-4.5-Air-shaped layer (96 query heads, 8 KV
//! heads, head_dim 128, K and V in 16-token pages) as the engine launches it, for each cache dtype
//! (f32: tf_attention, a warp per query head; f16 and fp8: tf_attention_heads_*, the group's heads
//! as the m of tensor-core products).
//!   - decode: M = 1 and 4 rows, each its own sequence of `context` tokens, a block per (row, KV
//!     head) ("whole") and a block per (row, KV head, split) then the fold ("spread", what the
//!     engine runs for steps of up to 32 rows); the KV bytes every row reads, per second, against
//!     the copy bandwidth.
//!   - prefill: the last 1024 rows of a `context`-token prompt in one chunk, on tf_attention ("whole",
//!     a block per row and KV head) and on the tensor-core prompt attention ("tiles", a block per
//!     16 rows and 4 query heads, what the engine runs for prompt rows). Its cost grows with the
//!     square of the context. "KV MB read" counts what one row per block would read (mostly from
//!     L2), so its rate may pass the copy bandwidth; the tiles read a twelfth of it.
//! The median of 3 timings of `repeats` launches each. "KV MB read" counts the stored bytes (fp8:
//! with its exponent per position and head).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const K = cuda.glm_kernels;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;

const heads = 96;
const kv_heads = 8;
const head_dim = 128;
const page_tokens = 16;
const decode_rows_max = 4;
const prefill_rows = 1024;
const contexts = [_]usize{ 2048, 8192, 32768 };

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, copy_gbs: f64, quick: bool, diag: *Diagnostic) !void {
    const context_max = contexts[contexts.len - 1];
    const pages = decode_rows_max * context_max / page_tokens;
    const cache_bytes = pages * kv_heads * page_tokens * head_dim * 4;
    var b: Buffers = undefined;
    // Sized for f32; the f16 and fp8 rows read the front of the same zeroed buffers.
    b.cache_k = try zeroed(gpu, cache_bytes, diag);
    defer gpu.free(b.cache_k);
    b.cache_v = try zeroed(gpu, cache_bytes, diag);
    defer gpu.free(b.cache_v);
    b.exp_k = try zeroed(gpu, cache_bytes / 4 / head_dim, diag);
    defer gpu.free(b.exp_k);
    b.exp_v = try zeroed(gpu, cache_bytes / 4 / head_dim, diag);
    defer gpu.free(b.exp_v);
    const q_bytes = prefill_rows * heads * head_dim * 4;
    b.q = try zeroed(gpu, q_bytes, diag);
    defer gpu.free(b.q);
    b.out = try gpu.alloc(q_bytes, diag);
    defer gpu.free(b.out);
    b.parts = try K.Kernels.AttentionParts.alloc(gpu, decode_rows_max, heads, head_dim, diag);
    defer b.parts.free(gpu);
    b.positions = try gpu.alloc(prefill_rows * 4, diag);
    defer gpu.free(b.positions);
    b.table_offsets = try gpu.alloc(prefill_rows * 4, diag);
    defer gpu.free(b.table_offsets);
    b.tiles = try gpu.alloc((1 + 2 * prefill_rows) * 4, diag);
    defer gpu.free(b.tiles);
    var tile_table: [1 + 2 * prefill_rows]i32 = undefined;
    var tiles = K.Kernels.AttentionTiles.init(&tile_table);
    for (0..prefill_rows) |r| tiles.add(r, @intCast(r), 0);
    try gpu.upload(b.tiles, std.mem.sliceAsBytes(tile_table[0 .. 1 + 2 * tiles.count]), diag);
    b.tile_count = tiles.count;
    b.tables = try gpu.alloc(pages * 4, diag);
    defer gpu.free(b.tables);
    const table = try gpa.alloc(u32, pages);
    defer gpa.free(table);
    for (table, 0..) |*page, i| page.* = @intCast(i);
    try gpu.upload(b.tables, std.mem.sliceAsBytes(table), diag);

    say("\nattention of one GLM-4.5-Air layer ({d} query heads, {d} KV heads, head_dim {d})\n", .{ heads, kv_heads, head_dim });
    say("{s:<8} {s:<7} {s:<4} {s:>6} {s:>8} {s:>10} {s:>10} {s:>9} {s:>8}\n", .{ "phase", "mode", "KV", "M", "context", "us/layer", "KV MB read", "GB/s", "% copy" });
    const dtypes = [_]tf.core.KvDtype{ .f32, .f16, .fp8 };
    for (contexts, 0..) |context, i| {
        if (quick and i > 0) break;
        for ([_]usize{ 1, decode_rows_max }) |rows| {
            for (dtypes) |dtype| for ([_]Mode{ .whole, .spread }) |mode| try b.time(gpa, gpu, module, .decode, rows, context, mode, dtype, copy_gbs, diag);
        }
    }
    for (contexts, 0..) |context, i| {
        if (quick and i > 0) break;
        try b.time(gpa, gpu, module, .prefill, prefill_rows, context, .whole, .f32, copy_gbs, diag);
        for (dtypes) |dtype| try b.time(gpa, gpu, module, .prefill, prefill_rows, context, .tiles, dtype, copy_gbs, diag);
    }
}

fn zeroed(gpu: *cuda.Gpu, bytes: usize, diag: *Diagnostic) !Ptr {
    const ptr = try gpu.alloc(bytes, diag);
    errdefer gpu.free(ptr);
    try gpu.zero(ptr, bytes, diag);
    return ptr;
}

const Mode = enum { whole, spread, tiles };

const Buffers = struct {
    cache_k: Ptr,
    cache_v: Ptr,
    exp_k: Ptr,
    exp_v: Ptr,
    q: Ptr,
    out: Ptr,
    parts: K.Kernels.AttentionParts,
    positions: Ptr,
    tables: Ptr,
    table_offsets: Ptr,
    tiles: Ptr,
    tile_count: usize,

    fn time(b: *const Buffers, gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, phase: enum { decode, prefill }, rows: usize, context: usize, mode: Mode, dtype: tf.core.KvDtype, copy_gbs: f64, diag: *Diagnostic) !void {
        const positions = try gpa.alloc(u32, rows);
        defer gpa.free(positions);
        const offsets = try gpa.alloc(u32, rows);
        defer gpa.free(offsets);
        var tokens_read: usize = 0;
        for (positions, offsets, 0..) |*position, *offset, r| {
            // Decode: row r is the newest token of sequence r. Prefill: the chunk's rows are the
            // last positions of sequence 0.
            position.* = @intCast(if (phase == .decode) context - 1 else context - rows + r);
            offset.* = @intCast(if (phase == .decode) r * context / page_tokens else 0);
            tokens_read += position.* + 1;
        }
        try gpu.upload(b.positions, std.mem.sliceAsBytes(positions), diag);
        try gpu.upload(b.table_offsets, std.mem.sliceAsBytes(offsets), diag);
        const kv: K.Kernels.PagedKv = .{
            .cache_k = b.cache_k,
            .cache_v = b.cache_v,
            .exp_k = b.exp_k,
            .exp_v = b.exp_v,
            .dtype = dtype,
            .positions = b.positions,
            .tables = b.tables,
            .table_offsets = b.table_offsets,
            .rows = rows,
            .heads = heads,
            .kv_heads = kv_heads,
            .head_dim = head_dim,
            .layers = 1,
            .layer = 0,
            .page_tokens = page_tokens,
        };
        const k: K.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
        const repeats: usize = if (phase == .decode) 20 else 2;
        try b.launch(k, kv, mode); // warm-up
        var timer = try cuda.gpu.Timer.create(gpu, diag);
        defer timer.destroy(gpu);
        var times: [3]f64 = undefined;
        for (&times) |*t| {
            try timer.begin(gpu, diag);
            for (0..repeats) |_| try b.launch(k, kv, mode);
            t.* = @as(f64, try timer.end(gpu, diag)) * 1e3 / @as(f64, @floatFromInt(repeats));
        }
        std.mem.sort(f64, &times, {}, std.sort.asc(f64));
        const row_bytes = head_dim * dtype.bytes() + @as(usize, if (dtype == .fp8) 1 else 0);
        const mb = @as(f64, @floatFromInt(tokens_read * kv_heads * row_bytes * 2)) / 1e6;
        const gbs = mb * 1e6 / (times[1] * 1e-6) / 1e9;
        say("{s:<8} {s:<7} {s:<4} {d:>6} {d:>8} {d:>10.1} {d:>10.1} {d:>9.0} {d:>7.1}%\n", .{ @tagName(phase), @tagName(mode), dtype.name(), rows, context, times[1], mb, gbs, 100 * gbs / copy_gbs });
    }

    fn launch(b: *const Buffers, k: K.Kernels, kv: K.Kernels.PagedKv, mode: Mode) !void {
        switch (mode) {
            .whole => try k.attention(b.q, b.out, kv, null, 0),
            .spread => try k.attention(b.q, b.out, kv, b.parts, 0),
            .tiles => try k.attentionPrompt(b.q, b.out, kv, b.tiles, b.tile_count),
        }
    }
};
