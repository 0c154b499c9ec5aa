//! The host half of zig/kernels/cuda/mla.cu: multi-head latent attention's launches, each giving
//! its grid and why. Every launch goes on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const driver = @import("driver.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;
const KvDtype = @import("../core/kv_store.zig").KvDtype;

pub const Module = gpu_mod.Module(&.{
    "tf_mla_rope_store",           "tf_mla_absorb",               "tf_mla_attention",     "tf_mla_attention_split",     "tf_mla_combine",        "tf_mla_v_up",
    "tf_mla_attention_f16",        "tf_mla_attention_split_f16",  "tf_mla_attention_fp8", "tf_mla_attention_split_fp8", "tf_mla_head_rows",      "tf_mla_attention_split2",
    "tf_mla_attention_split2_f16", "tf_mla_attention_split2_fp8", "tf_mla_absorb_half",   "tf_mla_v_up_half",           "tf_mla_head_rows_half",
});

/// The shapes mla.cu is built for (kMlaLatent, kMlaRope): every GLM MLA model's.
pub const latent = 512;
pub const rope = 64;
/// kMlaSplits, kMlaHeads, kMlaWarps, kProductRows in mla.cu.
pub const splits = 64;
const heads_per_block = 16;
const warps = 8;
const product_rows = 8;
/// kTileRows, kTileColumns of tf_mla_head_rows; from `tile_rows` rows a product takes it (the
/// same bits as tf_mla_absorb / tf_mla_v_up, so the choice never shows in a row's numbers).
const tile_rows = 64;
const tile_columns = 64;
/// tf_mla_attention's dynamic shared memory (MlaStages in mla_attention.cuh): tiles of 16 cache
/// rows as stored (rows padded by 32 bytes for f32, 16 otherwise; two tiles of f32, four of f16,
/// six of fp8), then the softmax's over an iteration's tiles (one of f32, two otherwise): the
/// warps' parts of the scores and the probabilities (16 heads x 16·step + 8 floats each), 4 floats
/// per head (the tile's rescale, the split's max and sum).
pub fn attentionSharedBytes(dtype: KvDtype) u32 {
    const stages: u32, const pad: u32, const step: u32 = switch (dtype) {
        .f32 => .{ 2, 32, 1 },
        .f16 => .{ 4, 16, 2 },
        .fp8 => .{ 6, 16, 2 },
    };
    const rows = stages * 16 * ((latent + rope) * @as(u32, @intCast(dtype.bytes())) + pad);
    return rows + ((warps + 1) * 16 * (16 * step + 8) + 4 * 16) * 4;
}
comptime {
    // static_assert'ed in mla_attention.cuh too
    std.debug.assert(attentionSharedBytes(.f32) == 88832 and attentionSharedBytes(.f16) == 98048 and attentionSharedBytes(.fp8) == 80128);
}
/// The largest qk_nope_head_dim the host takes (any would do for the product; bounds the check).
pub const nope_max = 256;

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    var module = try Module.load(gpu, kernels.mla, "mla", diag);
    errdefer module.unload(gpu);
    const attribute = driver.function_attribute_max_dynamic_shared_bytes;
    inline for (.{ .f32, .f16, .fp8 }) |dtype| {
        inline for (.{ "tf_mla_attention", "tf_mla_attention_split", "tf_mla_attention_split2" }) |entry| {
            const name = entry ++ comptime suffix(dtype);
            try gpu.driver.check(gpu.driver.api.cuFuncSetAttribute(module.function(name), attribute, @intCast(attentionSharedBytes(dtype))), "cuFuncSetAttribute(" ++ name ++ " shared memory)", diag);
        }
    }
    return module;
}

/// Rows per packed block for the heads past the last whole 16: as many as fill its 16 slots when
/// the leftover divides 16 (GLM-4.7-Flash's 20 heads: 4 rows of 4), else 1 (no packing).
pub fn packRows(heads: usize) usize {
    const left = heads % heads_per_block;
    return if (left != 0 and heads_per_block % left == 0) heads_per_block / left else 1;
}

test packRows {
    try std.testing.expectEqual(@as(usize, 4), packRows(20));
    try std.testing.expectEqual(@as(usize, 4), packRows(4));
    try std.testing.expectEqual(@as(usize, 1), packRows(64));
    try std.testing.expectEqual(@as(usize, 1), packRows(22)); // 6 does not divide 16
    try std.testing.expectEqual(@as(usize, 16), packRows(17));
}

/// The attention entries' names end in the cache's dtype (none for f32).
fn suffix(comptime dtype: KvDtype) []const u8 {
    return if (dtype == .f32) "" else "_" ++ @tagName(dtype);
}

/// Where a layer's cache rows are and which rows of the step there are.
pub const Paged = struct {
    cache: Ptr,
    /// What a row holds (kv_store.cuh): f32, f16, or fp8 codes with an i8 exponent per row in
    /// `exps` ((pages, layers, page_tokens), as the host's KvStore keeps them).
    dtype: KvDtype = .f32,
    exps: Ptr = 0,
    positions: Ptr,
    tables: Ptr,
    table_offsets: Ptr,
    rows: usize,
    layers: usize,
    layer: usize,
    page_tokens: usize,
};

/// A DSA layer's selection (tf_dsa_topk's output), or none for attention over every position.
pub const Selection = struct { selected: Ptr = 0, counts: Ptr = 0, topk: usize = 0 };

pub const Parts = struct {
    acc: Ptr,
    ml: Ptr,

    /// Floats of the partials of a step of `rows` rows spread over the splits.
    pub fn floats(rows: usize, heads: usize) struct { acc: usize, ml: usize } {
        return .{ .acc = rows * heads * splits * latent, .ml = rows * heads * splits * 2 };
    }
};

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        return k.runShared(name, grid, block, 0, args);
    }

    fn runShared(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, shared_bytes: u32, args: anytype) Error!void {
        try gpu_mod.launch(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 }, .shared_bytes = shared_bytes }, args, "launch " ++ name, k.diag);
    }

    fn count(n: usize, per: usize) u32 {
        return @intCast(std.math.divCeil(usize, @max(n, 1), per) catch unreachable);
    }

    /// The latent's norm and the rotations, the cache write. A block per row.
    pub fn ropeStore(k: Kernels, kv: Ptr, q: Ptr, norm: Ptr, cos_sin: Ptr, p: Paged, heads: usize, qk_dim: usize, nope_dim: usize, interleaved: bool, eps: f32) Error!void {
        var a = .{
            kv,                                    q,                                          p.cache,                        norm,
            cos_sin,                               p.positions,                                p.tables,                       p.table_offsets,
            @as(c_int, @intCast(p.rows)),          @as(c_int, @intCast(heads)),                @as(c_int, @intCast(qk_dim)),   @as(c_int, @intCast(nope_dim)),
            @as(c_int, @intFromBool(interleaved)), eps,                                        @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)),
            @as(c_int, @intCast(p.page_tokens)),   @as(c_int, @intCast(@backingInt(p.dtype))), p.exps,
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_mla_rope_store", .{ @intCast(p.rows), 1, 1 }, 256, ptrs);
    }

    /// A head product's weights (W_UK, or W_UV transposed): f32, or f16 (the _half entries: the
    /// same values, so the same bits, from half the bytes).
    pub const Weights = struct { ptr: Ptr, half: bool };

    /// q_lat = q_nope · W_UK per head: a block per (head, 32 latent columns, 8 rows).
    pub fn absorb(k: Kernels, q: Ptr, wuk: Weights, q_lat: Ptr, rows: usize, heads: usize, qk_dim: usize, nope_dim: usize) Error!void {
        std.debug.assert(nope_dim <= nope_max);
        if (rows >= tile_rows) return k.headRows(q, wuk, q_lat, rows, heads, qk_dim, nope_dim, latent);
        var a = .{ q, wuk.ptr, q_lat, @as(c_int, @intCast(rows)), @as(c_int, @intCast(heads)), @as(c_int, @intCast(qk_dim)), @as(c_int, @intCast(nope_dim)) };
        const grid = [3]u32{ @intCast(heads), latent / 32, count(rows, product_rows) };
        const ptrs = .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6] };
        if (wuk.half) try k.run("tf_mla_absorb_half", grid, 256, ptrs) else try k.run("tf_mla_absorb", grid, 256, ptrs);
    }

    /// The attention over the latent cache into `out` (rows, heads, latent). With `parts`, a block
    /// per (row, 16 heads, split) and tf_mla_combine folds the splits (the same bits as a block per
    /// (row, 16 heads) running them all, which runs without). Without, heads past the last whole 16
    /// (GLM-4.7-Flash's last 4 of 20) take packed blocks of several rows where they fill 16 slots
    /// (packRows) in the grid's last head group: the same bits again, a block's tiles serving every
    /// row it holds (a group's first row's block runs it, the others return).
    pub fn attention(k: Kernels, q: Ptr, q_lat: Ptr, out: Ptr, p: Paged, s: Selection, parts: ?Parts, heads: usize, qk_dim: usize, nope_dim: usize, scale: f32) Error!void {
        const spread = parts orelse Parts{ .acc = 0, .ml = 0 };
        const pack = if (parts == null and s.selected == 0) packRows(heads) else 1;
        var a = .{
            q,                                   q_lat,                          p.cache,    p.exps,                         p.positions,
            p.tables,                            p.table_offsets,                s.selected, s.counts,                       @as(c_int, @intCast(s.topk)),
            out,                                 spread.acc,                     spread.ml,  @as(c_int, @intCast(p.rows)),   @as(c_int, @intCast(heads)),
            @as(c_int, @intCast(qk_dim)),        @as(c_int, @intCast(nope_dim)), scale,      @as(c_int, @intCast(p.layers)), @as(c_int, @intCast(p.layer)),
            @as(c_int, @intCast(p.page_tokens)), @as(c_int, @intCast(pack)),
        };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const grid = [3]u32{ @intCast(p.rows), count(heads, heads_per_block), if (parts != null) splits else 1 };
        switch (p.dtype) {
            inline else => |dtype| {
                const shared = attentionSharedBytes(dtype);
                if (parts == null) return k.runShared("tf_mla_attention" ++ comptime suffix(dtype), grid, 32 * warps, shared, ptrs);
                // More blocks than SMs: the form with two blocks per SM where the arch holds two
                // (mla.cu); the same bits either way.
                if (@as(usize, grid[0]) * grid[1] * grid[2] > k.gpu.multiprocessors)
                    try k.runShared("tf_mla_attention_split2" ++ comptime suffix(dtype), grid, 32 * warps, shared, ptrs)
                else
                    try k.runShared("tf_mla_attention_split" ++ comptime suffix(dtype), grid, 32 * warps, shared, ptrs);
            },
        }
        // The fold: a block per (row, head, 128 dims).
        var c = .{ spread.acc, spread.ml, p.positions, s.counts, out, @as(c_int, @intCast(p.rows)), @as(c_int, @intCast(heads)) };
        try k.run("tf_mla_combine", .{ @intCast(p.rows * heads), latent / 128, 1 }, 128, .{ &c[0], &c[1], &c[2], &c[3], &c[4], &c[5], &c[6] });
    }

    /// out (rows, heads·v) = the heads' latents through W_UV: a block per (head, 32 columns, 8 rows).
    pub fn vUp(k: Kernels, lat: Ptr, wuv_t: Weights, out: Ptr, rows: usize, heads: usize, v_dim: usize) Error!void {
        if (rows >= tile_rows) return k.headRows(lat, wuv_t, out, rows, heads, latent, latent, v_dim);
        var a = .{ lat, wuv_t.ptr, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(heads)), @as(c_int, @intCast(v_dim)) };
        const grid = [3]u32{ @intCast(heads), count(v_dim, 32), count(rows, product_rows) };
        const ptrs = .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5] };
        if (wuv_t.half) try k.run("tf_mla_v_up_half", grid, 256, ptrs) else try k.run("tf_mla_v_up", grid, 256, ptrs);
    }

    /// Either product for many rows (a prompt chunk): a block per (head, 64 columns, 64 rows),
    /// x's (row, head) vectors `x_stride` floats apart, `kd` long, through the head's kd x n weight.
    fn headRows(k: Kernels, x: Ptr, w: Weights, out: Ptr, rows: usize, heads: usize, x_stride: usize, kd: usize, n: usize) Error!void {
        var a = .{ x, w.ptr, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(heads)), @as(c_int, @intCast(x_stride)), @as(c_int, @intCast(kd)), @as(c_int, @intCast(n)) };
        var ptrs: [a.len]?*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const grid = [3]u32{ @intCast(heads), count(n, tile_columns), count(rows, tile_rows) };
        if (w.half) try k.run("tf_mla_head_rows_half", grid, 256, ptrs) else try k.run("tf_mla_head_rows", grid, 256, ptrs);
    }
};
