//! The GPU side of the DSA lightning indexer (parts/dsa.zig): wq_b on the q latent, wk and
//! weights_proj on the layer's input, then tf_dsa_prepare (k's LayerNorm, the rotations, the key
//! cache), tf_dsa_scores and tf_dsa_topk into the step's selection, which this layer and the
//! shared layers after it attend over (mla_cuda.zig).
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const config_mod = @import("../config.zig");
const Indexer = @import("dsa.zig").Indexer;
const linear_cuda = @import("linear_cuda.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const M = cuda.mla_kernels;
const D = cuda.dsa_kernels;
const GpuLinear = linear_cuda.GpuLinear;
const Config = config_mod.Config;

pub const GpuIndexer = struct {
    wq_b: GpuLinear,
    wk: GpuLinear,
    weights_proj: GpuLinear,
    k_norm_weight: Ptr,
    k_norm_bias: Ptr,
};

/// A step's indexer buffers, the selection the shared layers reuse, and the indexer key cache.
pub const Buffers = struct {
    q: Ptr, // (rows, heads·head_dim)
    key: Ptr, // (rows, head_dim)
    weights: Ptr, // (rows, heads)
    scores: Ptr, // (score_rows, context_max)
    selected: Ptr, // (rows, topk) u32
    counts: Ptr, // (rows) u32
    cache: Ptr, // (pages, full layers, page_tokens, head_dim)
};

pub fn checkShape(c: *const Config, diag: *Diagnostic) Error!void {
    if (c.countOf("indexer", .full) == 0) return;
    const ix = c.indexer;
    if (ix.head_dim != D.head_dim or ix.heads > D.heads_max or ix.rope_dim != D.rope) {
        diag.set("the CUDA indexer takes index_head_dim {d}, at most {d} index heads and a {d}-dim rope; this model has {d}, {d}, {d}", .{ D.head_dim, D.heads_max, D.rope, ix.head_dim, ix.heads, ix.rope_dim });
        return error.UnsupportedModel;
    }
}

pub fn upload(model: *GpuModel, source: *const Indexer, diag: *Diagnostic) Error!GpuIndexer {
    return .{
        .wq_b = try model.uploadLinear(&source.wq_b, diag),
        .wk = try model.uploadLinear(&source.wk, diag),
        .weights_proj = try model.uploadLinear(&source.weights_proj, diag),
        .k_norm_weight = try model.putF32(source.k_norm_weight, diag),
        .k_norm_bias = try model.putF32(source.k_norm_bias, diag),
    };
}

pub fn allocate(model: *GpuModel, diag: *Diagnostic) Error!?Buffers {
    const c = model.config;
    const layers = c.countOf("indexer", .full);
    if (layers == 0) return null;
    const ix = c.indexer;
    const l = model.limits;
    const rows = l.rows_max;
    const f = @sizeOf(f32);
    return .{
        .q = try model.alloc(rows * ix.heads * ix.head_dim * f, diag),
        .key = try model.alloc(rows * ix.head_dim * f, diag),
        .weights = try model.alloc(rows * ix.heads * f, diag),
        .scores = try model.alloc(@min(rows, D.score_rows) * l.context_max * f, diag),
        .selected = try model.alloc(rows * ix.topk * 4, diag),
        .counts = try model.alloc(rows * 4, diag),
        .cache = try model.alloc(l.pages * layers * l.page_tokens * ix.head_dim * f, diag),
    };
}

/// The step's selection as the last full layer left it.
pub fn selection(model: *const GpuModel) M.Selection {
    const b = model.dsa.?;
    return .{ .selected = b.selected, .counts = b.counts, .topk = model.config.indexer.topk };
}

/// Every row's selection for this layer (`layer`: its index among full indexers); the normed q
/// latent is in model.mla's buffers.
pub fn select(model: *GpuModel, k: K.Kernels, indexer: *const GpuIndexer, layer: usize, rows: usize) Error!M.Selection {
    const c = model.config;
    const ix = c.indexer;
    const b = model.dsa.?;
    const dk: D.Kernels = .{ .gpu = &model.gpu, .module = &model.dsa_module.?, .diag = k.diag };
    try model.runLinear(k, &indexer.wq_b, model.mla.?.q_latent, b.q, rows, 0);
    try model.runLinear(k, &indexer.wk, model.normed, b.key, rows, 0);
    try model.runLinear(k, &indexer.weights_proj, model.normed, b.weights, rows, 0);
    const paged: M.Paged = .{
        .cache = b.cache,
        .positions = model.positions,
        .tables = model.tables,
        .table_offsets = model.table_offsets,
        .rows = rows,
        .layers = c.countOf("indexer", .full),
        .layer = layer,
        .page_tokens = model.limits.page_tokens,
    };
    try dk.prepare(b.q, b.key, b.weights, indexer.k_norm_weight, indexer.k_norm_bias, model.cos_sin, paged, ix.heads, ix.eps);
    const result = selection(model);
    try dk.select(b.q, b.weights, b.scores, result, paged, ix.heads, model.limits.context_max);
    return result;
}

comptime {
    std.debug.assert(D.rope == M.rope); // the indexer reads the attention's cos/sin rows
}
