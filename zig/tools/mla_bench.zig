//! tf-bench's MLA table (`tf-bench --mla`): the latent attention and the DSA indexer of one layer as
//! the engine launches them, on caches in 16-token pages (f32: random values; f16 and fp8: zeros).
//!   - attention: tf_mla_attention over a `context`-token latent cache (576 values per position,
//!     shared by the heads, in each cache dtype; fp8 with its exponent per position),
//!     GLM-4.7-Flash's 20 heads and GLM-5's 64, M = 1 and 4 rows each its own sequence, a block
//!     per (row, 16 heads) ("whole") or per split then the fold ("spread", what decode steps run);
//!     the cache bytes each row reads per second against the copy bandwidth.
//!   - a prompt chunk ("prompt"): 1024 rows of one sequence ending at the context, whole blocks,
//!     as a prefill step runs them (every row reads its own positions: the bytes are their sum).
//!   - GLM-5 with its DSA selection of 2048 positions ("sparse"): the attention then reads 2048
//!     positions whatever the context.
//!   - indexer: GLM-5's scores (32 heads x 128) and top-2048 for one row at 8k/32k/128k positions,
//!     the index keys read against the copy bandwidth.
//! The median of 3 timings of `repeats` launches each.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const M = cuda.mla_kernels;
const D = cuda.dsa_kernels;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;
const bench_time = @import("bench_time.zig");
const timeMedian = bench_time.timeMedian;
const randomBuffer = bench_time.randomBuffer;

const page_tokens = 16;
const rows_max = 4;
const prompt_rows = 1024;
const topk = 2048;
const index_heads = 32;
const contexts = [_]usize{ 2048, 8192, 32768 };
const index_contexts = [_]usize{ 8192, 32768, 131072 };
const shapes = [_]struct { name: []const u8, heads: usize }{ .{ .name = "GLM-4.7-Flash", .heads = 20 }, .{ .name = "GLM-5", .heads = 64 } };

const Mode = enum { whole, spread, sparse, prompt };

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, copy_gbs: f64, diag: *Diagnostic) !void {
    var module = try M.load(gpu, diag);
    defer module.unload(gpu);
    var dsa_module = try D.load(gpu, diag);
    defer dsa_module.unload(gpu);
    const context_max = index_contexts[index_contexts.len - 1];
    const pages = rows_max * context_max / page_tokens;
    var b: Buffers = undefined;
    const cache_floats = pages * page_tokens * (M.latent + M.rope);
    b.cache = try randomBuffer(gpa, gpu, cache_floats, diag);
    defer gpu.free(b.cache);
    b.narrow_cache = try gpu.alloc(cache_floats * 2, diag);
    defer gpu.free(b.narrow_cache);
    try gpu.zero(b.narrow_cache, cache_floats * 2, diag);
    b.exps = try gpu.alloc(pages * page_tokens, diag);
    defer gpu.free(b.exps);
    try gpu.zero(b.exps, pages * page_tokens, diag);
    b.q = try randomBuffer(gpa, gpu, prompt_rows * 64 * 256, diag);
    defer gpu.free(b.q);
    b.q_lat = try randomBuffer(gpa, gpu, prompt_rows * 64 * M.latent, diag);
    defer gpu.free(b.q_lat);
    b.out = try gpu.alloc(prompt_rows * 64 * M.latent * 4, diag);
    defer gpu.free(b.out);
    const parts = M.Parts.floats(rows_max, 64);
    b.parts = .{ .acc = try gpu.alloc(parts.acc * 4, diag), .ml = try gpu.alloc(parts.ml * 4, diag) };
    defer gpu.free(b.parts.acc);
    defer gpu.free(b.parts.ml);
    b.positions = try gpu.alloc(prompt_rows * 4, diag);
    defer gpu.free(b.positions);
    b.table_offsets = try gpu.alloc(prompt_rows * 4, diag);
    defer gpu.free(b.table_offsets);
    b.tables = try gpu.alloc(pages * 4, diag);
    defer gpu.free(b.tables);
    const table = try gpa.alloc(u32, pages);
    defer gpa.free(table);
    for (table, 0..) |*page, i| page.* = @intCast(i);
    try gpu.upload(b.tables, std.mem.sliceAsBytes(table), diag);
    b.selected = try gpu.alloc(rows_max * topk * 4, diag);
    defer gpu.free(b.selected);
    b.counts = try gpu.alloc(rows_max * 4, diag);
    defer gpu.free(b.counts);
    b.index_q = try randomBuffer(gpa, gpu, index_heads * D.head_dim, diag);
    defer gpu.free(b.index_q);
    b.index_w = try randomBuffer(gpa, gpu, index_heads, diag);
    defer gpu.free(b.index_w);
    b.scores = try gpu.alloc(context_max * 4, diag);
    defer gpu.free(b.scores);
    b.index_cache = try randomBuffer(gpa, gpu, context_max * D.head_dim, diag);
    defer gpu.free(b.index_cache);

    say("\nMLA attention of one layer (latent 512 + rope 64 per position, shared by the heads)\n", .{});
    say("{s:<14} {s:<7} {s:<4} {s:>3} {s:>8} {s:>10} {s:>12} {s:>9} {s:>8}\n", .{ "model", "mode", "KV", "M", "context", "us/layer", "cache MB", "GB/s", "% copy" });
    const dtypes = [_]tf.core.KvDtype{ .f32, .f16, .fp8 };
    for (shapes) |shape| {
        for (contexts) |context| {
            for ([_]usize{ 1, rows_max }) |rows| {
                for (dtypes) |dtype| for ([_]Mode{ .whole, .spread }) |mode| try b.attention(gpa, gpu, &module, shape.name, shape.heads, rows, context, mode, dtype, copy_gbs, diag);
            }
        }
    }
    for (contexts) |context| for (dtypes) |dtype| try b.attention(gpa, gpu, &module, "GLM-5", 64, 1, context, .sparse, dtype, copy_gbs, diag);
    for (shapes) |shape| for (contexts) |context| for (dtypes) |dtype| try b.attention(gpa, gpu, &module, shape.name, shape.heads, prompt_rows, context, .prompt, dtype, copy_gbs, diag);
    say("\nDSA indexer of one GLM-5 layer ({d} heads x {d}, top-{d}), one row\n", .{ index_heads, D.head_dim, topk });
    say("{s:<8} {s:>10} {s:>12} {s:>9} {s:>8}\n", .{ "context", "us/layer", "keys MB", "GB/s", "% copy" });
    for (index_contexts) |context| try b.indexer(gpu, &dsa_module, context, copy_gbs, diag);
}

const Buffers = struct {
    cache: Ptr,
    narrow_cache: Ptr,
    exps: Ptr,
    q: Ptr,
    q_lat: Ptr,
    out: Ptr,
    parts: M.Parts,
    positions: Ptr,
    tables: Ptr,
    table_offsets: Ptr,
    selected: Ptr,
    counts: Ptr,
    index_q: Ptr,
    index_w: Ptr,
    scores: Ptr,
    index_cache: Ptr,

    /// Rows each their own sequence at the context's last position; or (chunk) one sequence's
    /// last `rows` positions, one page table.
    fn setRows(b: *const Buffers, gpu: *cuda.Gpu, rows: usize, context: usize, chunk: bool, diag: *Diagnostic) !void {
        var positions: [prompt_rows]u32 = undefined;
        var offsets: [prompt_rows]u32 = undefined;
        for (0..rows) |r| {
            positions[r] = @intCast(if (chunk) context - rows + r else context - 1);
            offsets[r] = if (chunk) 0 else @intCast(r * context / page_tokens);
        }
        try gpu.upload(b.positions, std.mem.sliceAsBytes(positions[0..rows]), diag);
        try gpu.upload(b.table_offsets, std.mem.sliceAsBytes(offsets[0..rows]), diag);
    }

    fn attention(b: *const Buffers, gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const M.Module, name: []const u8, heads: usize, rows: usize, context: usize, mode: Mode, dtype: tf.core.KvDtype, copy_gbs: f64, diag: *Diagnostic) !void {
        try b.setRows(gpu, rows, context, mode == .prompt, diag);
        var selection: M.Selection = .{};
        var read = context;
        if (mode == .sparse) {
            // Every 4th position up to 2048 of them: scattered reads, as a selection makes them.
            const picks = try gpa.alloc(u32, topk);
            defer gpa.free(picks);
            const stride = @max(context / topk, 1);
            read = @min(topk, context);
            for (picks[0..read], 0..) |*p, i| p.* = @intCast(i * stride);
            try gpu.upload(b.selected, std.mem.sliceAsBytes(picks[0..read]), diag);
            const count: u32 = @intCast(read);
            try gpu.upload(b.counts, std.mem.asBytes(&count), diag);
            selection = .{ .selected = b.selected, .counts = b.counts, .topk = topk };
        }
        const paged: M.Paged = .{ .cache = if (dtype == .f32) b.cache else b.narrow_cache, .dtype = dtype, .exps = b.exps, .positions = b.positions, .tables = b.tables, .table_offsets = b.table_offsets, .rows = rows, .layers = 1, .layer = 0, .page_tokens = page_tokens };
        const k: M.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
        const parts: ?M.Parts = if (mode == .whole or mode == .prompt) null else b.parts;
        const launch = struct {
            fn call(kk: M.Kernels, bb: *const Buffers, p: M.Paged, s: M.Selection, ps: ?M.Parts, h: usize) !void {
                try kk.attention(bb.q, bb.q_lat, bb.out, p, s, ps, h, 256, 192, 0.0625);
            }
        }.call;
        const median = try timeMedian(gpu, if (mode == .prompt) 3 else 20, launch, .{ k, b, paged, selection, parts, heads }, diag);
        const row_bytes = (M.latent + M.rope) * dtype.bytes() + @as(usize, if (dtype == .fp8) 1 else 0);
        // A chunk's rows read positions context - rows + 1 .. context: rows x (context - (rows - 1) / 2).
        const positions_read = if (mode == .prompt) rows * context - rows * (rows - 1) / 2 else rows * read;
        const mb = @as(f64, @floatFromInt(positions_read * row_bytes)) / 1e6;
        const gbs = mb / median * 1e6 / 1e3;
        say("{s:<14} {s:<7} {s:<4} {d:>3} {d:>8} {d:>10.1} {d:>12.1} {d:>9.0} {d:>7.1}%\n", .{ name, @tagName(mode), dtype.name(), rows, context, median, mb, gbs, 100 * gbs / copy_gbs });
    }

    fn indexer(b: *const Buffers, gpu: *cuda.Gpu, module: *const D.Module, context: usize, copy_gbs: f64, diag: *Diagnostic) !void {
        try b.setRows(gpu, 1, context, false, diag);
        const paged: M.Paged = .{ .cache = b.index_cache, .positions = b.positions, .tables = b.tables, .table_offsets = b.table_offsets, .rows = 1, .layers = 1, .layer = 0, .page_tokens = page_tokens };
        const k: D.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
        const selection: M.Selection = .{ .selected = b.selected, .counts = b.counts, .topk = topk };
        const launch = struct {
            fn call(kk: D.Kernels, bb: *const Buffers, p: M.Paged, s: M.Selection, c: usize) !void {
                try kk.select(bb.index_q, bb.index_w, bb.scores, s, p, index_heads, c);
            }
        }.call;
        const median = try timeMedian(gpu, 10, launch, .{ k, b, paged, selection, context }, diag);
        const mb = @as(f64, @floatFromInt(context * D.head_dim * 4)) / 1e6;
        const gbs = mb / median * 1e6 / 1e3;
        say("{d:<8} {d:>10.1} {d:>12.1} {d:>9.0} {d:>7.1}%\n", .{ context, median, mb, gbs, 100 * gbs / copy_gbs });
    }
};
