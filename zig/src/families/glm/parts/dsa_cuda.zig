//! The GPU side of the DSA lightning indexer (parts/dsa.zig): wq_b on the q latent, wk and
//! weights_proj on the layer's input, then tf_dsa_prepare (k's LayerNorm, the rotations, the key
//! cache), tf_dsa_scores and tf_dsa_topk into the step's selection, which this layer and the
//! shared layers after it attend over (mla_cuda.zig).
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const config_mod = @import("../config.zig");
const dsa = @import("dsa.zig");
const Indexer = dsa.Indexer;
const PooledIndexer = @import("kpool.zig").Indexer;
const linear_cuda = @import("linear_cuda.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const M = cuda.mla_kernels;
const D = cuda.dsa_kernels;
const KP = cuda.kpool_kernels;
const GpuLinear = linear_cuda.GpuLinear;
const Linear = @import("../linear.zig").Linear;
const Config = config_mod.Config;

pub const GpuIndexer = struct {
    wq_b: GpuLinear,
    wk: GpuLinear,
    weights_proj: GpuLinear,
    k_norm_weight: Ptr,
    k_norm_bias: Ptr,
    /// GLM-5.3-Flash's pooled indexer (kpool.zig): the gate scores' projection and the place
    /// offsets; null for the token-level one.
    pooled: ?struct { gate: GpuLinear, ape: Ptr } = null,
};

/// A step's indexer buffers, the selection the shared layers reuse, and the indexer key cache.
pub const Buffers = struct {
    q: Ptr, // (rows, heads·head_dim)
    key: Ptr, // (rows, head_dim)
    weights: Ptr, // (rows, heads)
    scores: Ptr, // (score_rows, context_max)
    selected: Ptr, // (rows, selectionMax) u32
    counts: Ptr, // (rows) u32
    cache: Ptr, // (pages, full layers, page_tokens, head_dim, or 2·head_dim pooled)
    // Pooled: the gate scores (rows, head_dim), the chosen pools (rows, topk / pool) and their count.
    gates: Ptr,
    picks: Ptr,
    pick_counts: Ptr,
};

pub fn checkShape(c: *const Config, diag: *Diagnostic) Error!void {
    if (c.countOf("indexer", .full) == 0) return;
    const ix = c.indexer;
    const rope_ok = if (ix.pool > 0) ix.rope_dim == 0 else ix.rope_dim == D.rope;
    if (ix.head_dim != D.head_dim or ix.heads > D.heads_max or !rope_ok) {
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

pub fn uploadPooled(model: *GpuModel, source: *const PooledIndexer, diag: *Diagnostic) Error!GpuIndexer {
    const c = model.config;
    const gate: Linear = .{ .in_features = c.hidden_size, .out_features = c.indexer.head_dim, .kind = .{ .dense = .{ .weight = source.gate, .bias = null } } };
    var result = try upload(model, &source.keys, diag);
    result.pooled = .{ .gate = try model.uploadLinear(&gate, diag), .ape = try model.putF32(source.ape, diag) };
    return result;
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
        .selected = try model.alloc(rows * ix.selectionMax() * 4, diag),
        .counts = try model.alloc(rows * 4, diag),
        .cache = try model.alloc(l.pages * layers * l.page_tokens * dsa.Cache.widthOf(&c) * f, diag),
        .gates = try model.alloc(if (ix.pool > 0) rows * ix.head_dim * f else 4, diag),
        .picks = try model.alloc(if (ix.pool > 0) rows * (ix.topk / ix.pool) * 4 else 4, diag),
        .pick_counts = try model.alloc(rows * 4, diag),
    };
}

/// The step's selection as the last full layer left it.
pub fn selection(model: *const GpuModel) M.Selection {
    const b = model.dsa.?;
    return .{ .selected = b.selected, .counts = b.counts, .topk = model.config.indexer.selectionMax() };
}

/// Every row's selection for this layer (`layer`: its index among full indexers); the normed q
/// latent is in model.mla's buffers, and with `wq_b_done` its projection is already in the
/// indexer's (one launch with q_b: mla_cuda.zig).
pub fn select(model: *GpuModel, k: K.Kernels, indexer: *const GpuIndexer, layer: usize, rows: usize, wq_b_done: bool) Error!M.Selection {
    const c = model.config;
    const ix = c.indexer;
    const b = model.dsa.?;
    const dk: D.Kernels = .{ .gpu = &model.gpu, .module = &model.dsa_module.?, .diag = k.diag };
    if (!wq_b_done) try model.runLinear(k, &indexer.wq_b, model.mla.?.q_latent, b.q, rows, 0);
    if (indexer.pooled != null) return selectPooled(model, k, dk, indexer, layer, rows);
    try model.runLinear(k, &indexer.wk, model.normed, b.key, rows, 0);
    try model.runLinear(k, &indexer.weights_proj, model.normed, b.weights, rows, 0);
    const paged = keyCache(model, layer, rows);
    try dk.prepare(b.q, b.key, b.weights, indexer.k_norm_weight, indexer.k_norm_bias, model.cos_sin, paged, ix.heads, ix.eps);
    const result = selection(model);
    try dk.select(b.q, b.weights, b.scores, result, paged, ix.heads, model.limits.context_max);
    return result;
}

/// The indexer key cache of full-indexer layer `layer` and the step's rows.
fn keyCache(model: *const GpuModel, layer: usize, rows: usize) M.Paged {
    return .{
        .cache = model.dsa.?.cache,
        .positions = model.positions,
        .tables = model.tables,
        .table_offsets = model.table_offsets,
        .rows = rows,
        .layers = model.config.countOf("indexer", .full),
        .layer = layer,
        .page_tokens = model.limits.page_tokens,
    };
}

/// The pooled indexer's selection: keys and gate scores into the cache, the complete pools scored
/// and the best topk / pool of them chosen (score_rows rows at a time), then expanded to positions.
fn selectPooled(model: *GpuModel, k: K.Kernels, dk: D.Kernels, indexer: *const GpuIndexer, layer: usize, rows: usize) Error!M.Selection {
    const c = model.config;
    const ix = c.indexer;
    const b = model.dsa.?;
    const pooled = indexer.pooled.?;
    const kp: KP.Kernels = .{ .gpu = &model.gpu, .module = &model.kpool_module.?, .diag = k.diag };
    try model.runLinear(k, &indexer.wk, model.normed, b.key, rows, 0);
    try model.runLinear(k, &indexer.weights_proj, model.normed, b.weights, rows, 0);
    try model.runLinear(k, &pooled.gate, model.normed, b.gates, rows, 0);
    const paged = keyCache(model, layer, rows);
    try kp.store(b.key, b.gates, indexer.k_norm_weight, indexer.k_norm_bias, paged, ix.eps);
    const keep = ix.topk / ix.pool;
    const context_max = model.limits.context_max;
    var first: usize = 0;
    while (first < rows) : (first += D.score_rows) {
        const chunk = @min(D.score_rows, rows - first);
        try kp.scores(b.q, b.weights, pooled.ape, b.scores, paged, first, chunk, ix.heads, ix.pool, context_max);
        try dk.topk(b.scores, model.positions, b.picks, b.pick_counts, first, chunk, rows, keep, context_max, ix.pool);
    }
    const result = selection(model);
    try kp.expand(b.picks, b.pick_counts, model.positions, result.selected, result.counts, rows, keep, ix.pool, result.topk, ix.pool_tail);
    return result;
}

comptime {
    std.debug.assert(D.rope == M.rope);
    std.debug.assert(KP.head_dim == D.head_dim and KP.heads_max == D.heads_max); // the indexer reads the attention's cos/sin rows
}
