//! The GPU side of grouped-query attention (parts/gqa.zig): q, then k and v in one launch when they
//! pair, tf_qk_rope_store (norms, RoPE, the cache write), prompt rows' attention on tensor cores in
//! tiles of one sequence (tf_attention_prompt), generated rows' in splits of their context spread
//! over the GPU (tf_attention, flash-decoding), then o_proj.
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Gqa = @import("gqa.zig").Gqa;
const linear_cuda = @import("linear_cuda.zig");
const GpuLinear = linear_cuda.GpuLinear;
const linear_parts = @import("linear_parts_cuda.zig");

pub const GpuGqa = struct {
    q: GpuLinear,
    k: GpuLinear,
    v: GpuLinear,
    o: GpuLinear,
    /// A two-entry table (k, v) when both are EXL3 of one shape (pairTable): one launch runs both,
    /// their outputs one after the other in model.k. 0 otherwise.
    kv_pair: Ptr = 0,
    /// q, k and v as one launch for a decode step's rows (linear_parts_cuda.zig), or null.
    qkv: ?linear_parts.Parts = null,
    q_norm: Ptr,
    k_norm: Ptr,
};

/// What tf_attention and tf_qk_rope_store take: head_dim <= attention_head_dim_max, a multiple of
/// 4, and whole groups of query heads per KV head; over an f16 or fp8 cache, head_dim 64 or 128
/// (tf_attention_heads_*).
pub fn checkShape(c: *const @import("../config.zig").Config, kv_dtype: core.KvDtype, diag: *Diagnostic) Error!void {
    if (c.countOf("attention", .gqa) == 0) return;
    if (kv_dtype != .f32 and !K.Kernels.headsAttentionTakes(c.head_dim)) {
        diag.set("the CUDA attention over an {s} cache takes head_dim 64 or 128; this model has {d}: use kv_dtype f32", .{ kv_dtype.name(), c.head_dim });
        return error.UnsupportedModel;
    }
    if (c.head_dim > K.Kernels.attention_head_dim_max or c.head_dim % 4 != 0 or c.heads % @max(c.kv_heads, 1) != 0) {
        diag.set("the CUDA attention takes head_dim <= {d}, a multiple of 4, and heads a multiple of kv_heads; this model has head_dim {d}, {d} heads, {d} KV heads", .{ K.Kernels.attention_head_dim_max, c.head_dim, c.heads, c.kv_heads });
        return error.UnsupportedModel;
    }
}

pub fn upload(model: *GpuModel, source: *const Gqa, diag: *Diagnostic) Error!GpuGqa {
    return .{
        .q = try model.uploadLinear(&source.q, diag),
        .k = try model.uploadLinear(&source.k, diag),
        .v = try model.uploadLinear(&source.v, diag),
        .o = try model.uploadLinear(&source.o, diag),
        .q_norm = if (source.q_norm) |w| try model.putF32(w, diag) else 0,
        .k_norm = if (source.k_norm) |w| try model.putF32(w, diag) else 0,
    };
}

/// k and v in one launch unless TF_CUDA_KV_PAIR=0, and q, k and v in one for a decode step's rows
/// unless TF_CUDA_PARTS=0 (the same bits every way: tests). k and v keep their pair's k split.
pub fn pairKv(model: *GpuModel, gqa: *GpuGqa, diag: *Diagnostic) Error!void {
    if (!core.switches.off("TF_CUDA_KV_PAIR")) gqa.kv_pair = try model.pairTable(&gqa.k, &gqa.v, diag);
    const kv_entries: usize = if (gqa.kv_pair != 0) 2 else 1;
    gqa.qkv = linear_parts.partsOf(&.{ &gqa.q, &gqa.k, &gqa.v }, &.{ 1, kv_entries, kv_entries });
}

/// out (model.projected) = o_proj(attention(model.normed)); `layer`: its index among GQA layers,
/// the cache's layer.
pub fn attention(model: *GpuModel, k: K.Kernels, block: *const GpuGqa, layer: usize, rows: usize) Error!void {
    const c = model.config;
    // v's rows follow k's, as a pair launch writes them.
    const v = model.k + rows * block.k.out_features * @sizeOf(f32);
    if (!try linear_parts.runParts(model, k, block.qkv, model.normed, &.{ model.q, model.k, v }, rows)) {
        try model.runLinear(k, &block.q, model.normed, model.q, rows, 0);
        if (block.kv_pair != 0) {
            try model.runPair(k, &block.k, &block.v, block.kv_pair, model.normed, model.k, rows);
        } else {
            try model.runLinear(k, &block.k, model.normed, model.k, rows, 0);
            try model.runLinear(k, &block.v, model.normed, v, rows, 0);
        }
    }
    const kv: K.Kernels.PagedKv = .{
        .cache_k = model.cache_k,
        .cache_v = model.cache_v,
        .exp_k = model.exp_k,
        .exp_v = model.exp_v,
        .dtype = model.limits.kv_dtype,
        .positions = model.positions,
        .tables = model.tables,
        .table_offsets = model.table_offsets,
        .rows = rows,
        .heads = c.heads,
        .kv_heads = c.kv_heads,
        .head_dim = c.head_dim,
        .layers = c.countOf("attention", .gqa),
        .layer = layer,
        .page_tokens = model.limits.page_tokens,
    };
    try k.qkRopeStore(.{
        .q = model.q,
        .k = model.k,
        .v = v,
        .q_norm = block.q_norm,
        .k_norm = block.k_norm,
        .cos_sin = model.cos_sin,
        .rotary_dim = c.rotary_dim,
        .eps = c.rms_norm_eps,
    }, kv);
    if (model.step_tiles > 0) {
        // A recorded forward keeps its grid: there, one block column per row bounds the tiles.
        try k.attentionPrompt(model.q, model.attention_out, kv, model.attention_tiles, if (rows <= model_mod.graph_rows_max) rows else model.step_tiles);
    }
    if (model.step_rest) {
        const skip = if (model.step_tiles > 0) model.attention_skip else 0;
        model.gpu.noteReads(model.step_positions * 2 * c.kv_heads * c.head_dim * model.limits.kv_dtype.bytes());
        try k.attention(model.q, model.attention_out, kv, if (rows <= model.attention_spread_rows) model.attention_parts else null, skip);
    }
    try model.runLinear(k, &block.o, model.attention_out, model.projected, rows, 0);
}
