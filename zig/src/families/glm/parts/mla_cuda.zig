//! The GPU side of multi-head latent attention (parts/mla.zig), the absorbed form for every row as
//! on the CPU: the q and kv projections (EXL3 GEMV or the prompt kernels, linear_cuda.zig), the
//! latent's norm and the rotations with the cache write (tf_mla_rope_store), q·W_UK
//! (tf_mla_absorb), the attention over the latent cache or a DSA layer's selection
//! (tf_mla_attention, spread over splits for steps of few rows), W_UV (tf_mla_v_up), o_proj.
//! kv_b_proj's two halves live on the GPU as matrices, W_UK per head as stored, W_UV transposed: f16
//! where every value converts exactly (the peer writes kv_b_proj fp16), else f32.
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const config_mod = @import("../config.zig");
const Mla = @import("mla.zig").Mla;
const linear_cuda = @import("linear_cuda.zig");
const dsa_cuda = @import("dsa_cuda.zig");
const linear_parts = @import("linear_parts_cuda.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const M = cuda.mla_kernels;
const GpuLinear = linear_cuda.GpuLinear;
const Config = config_mod.Config;

pub const GpuMla = struct {
    q_a: ?GpuLinear,
    q_a_norm: Ptr,
    q_b: ?GpuLinear,
    q: ?GpuLinear,
    kv_a: GpuLinear,
    kv_a_norm: Ptr,
    /// q_a and kv_a as one launch for a decode step's rows (linear_parts_cuda.zig), and q_b with
    /// the indexer's wq_b (both read the normed q latent), or null.
    q_kv_a: ?linear_parts.Parts = null,
    q_b_wq_b: ?linear_parts.Parts = null,
    /// (heads, nope, kv_lora) and (heads, kv_lora, v), f16 or f32.
    wuk: M.Kernels.Weights,
    wuv_t: M.Kernels.Weights,
    o: GpuLinear,
    indexer: ?dsa_cuda.GpuIndexer,

    /// Every projection, for the buffers' sizing.
    pub fn linears(mla: *const GpuMla) [6]?*const GpuLinear {
        return .{
            if (mla.q_a) |*l| l else null, if (mla.q_b) |*l| l else null, if (mla.q) |*l| l else null,
            &mla.kv_a,                     &mla.o,                        if (mla.indexer) |*ix| &ix.wq_b else null,
        };
    }
};

/// A step's MLA buffers and the latent cache, sized once from the model's limits.
pub const Buffers = struct {
    q_latent_raw: Ptr, // (rows, q_lora)
    q_latent: Ptr,
    q: Ptr, // (rows, heads·qk)
    kv: Ptr, // (rows, kv_lora + rope)
    q_lat: Ptr, // (rows, heads, kv_lora)
    lat_out: Ptr,
    out: Ptr, // (rows, heads·v)
    cache: Ptr, // (pages, mla layers, page_tokens, kv_lora + 64) in the engine's KV dtype
    exps: Ptr, // fp8: an i8 exponent per cached row, (pages, mla layers, page_tokens); else 0
    parts: M.Parts,
    spread_rows: usize,
};

/// What mla.cu takes: every GLM MLA model's latent and rope sizes (its cache in f32, f16 or fp8).
pub fn checkShape(c: *const Config, diag: *Diagnostic) Error!void {
    if (c.countOf("attention", .mla) == 0) return;
    const m = c.mla;
    if (m.kv_lora_rank != M.latent or (m.rope_dim != M.rope and m.rope_dim != 0) or m.nope_dim > M.nope_max) {
        diag.set("the CUDA MLA kernels take kv_lora_rank {d}, qk_rope_head_dim {d} (or 0) and qk_nope_head_dim <= {d}; this model has {d}, {d}, {d}", .{ M.latent, M.rope, M.nope_max, m.kv_lora_rank, m.rope_dim, m.nope_dim });
        return error.UnsupportedModel;
    }
    try dsa_cuda.checkShape(c, diag);
}

pub fn upload(model: *GpuModel, source: *const Mla, diag: *Diagnostic) Error!GpuMla {
    const c = model.config;
    const m = c.mla;
    const gpa = model.gpa;
    const block = m.nope_dim + m.v_dim;
    const wuk = try gpa.alloc(f32, c.heads * m.nope_dim * m.kv_lora_rank);
    defer gpa.free(wuk);
    const wuv_t = try gpa.alloc(f32, c.heads * m.kv_lora_rank * m.v_dim);
    defer gpa.free(wuv_t);
    for (0..c.heads) |h| {
        const rows = source.kvRows()[h * block * m.kv_lora_rank ..][0 .. block * m.kv_lora_rank];
        @memcpy(wuk[h * m.nope_dim * m.kv_lora_rank ..][0 .. m.nope_dim * m.kv_lora_rank], rows[0 .. m.nope_dim * m.kv_lora_rank]);
        for (0..m.v_dim) |j| {
            for (0..m.kv_lora_rank) |lane| wuv_t[(h * m.kv_lora_rank + lane) * m.v_dim + j] = rows[(m.nope_dim + j) * m.kv_lora_rank + lane];
        }
    }
    var mla: GpuMla = .{
        .q_a = if (source.q_a) |*l| try model.uploadLinear(l, diag) else null,
        .q_a_norm = if (source.q_a != null) try model.putF32(source.q_a_norm, diag) else 0,
        .q_b = if (source.q_b) |*l| try model.uploadLinear(l, diag) else null,
        .q = if (source.q) |*l| try model.uploadLinear(l, diag) else null,
        .kv_a = try model.uploadLinear(&source.kv_a, diag),
        .kv_a_norm = try model.putF32(source.kv_a_norm, diag),
        .wuk = try putProduct(model, wuk, diag),
        .wuv_t = try putProduct(model, wuv_t, diag),
        .o = try model.uploadLinear(&source.o, diag),
        .indexer = if (source.indexer) |*ix|
            try dsa_cuda.upload(model, ix, diag)
        else if (source.pooled) |*ix|
            try dsa_cuda.uploadPooled(model, ix, diag)
        else
            null,
    };
    if (mla.q_a) |*q_a| mla.q_kv_a = linear_parts.partsOf(&.{ q_a, &mla.kv_a }, &.{ 1, 1 });
    if (mla.q_b) |*q_b| if (mla.indexer) |*ix| {
        mla.q_b_wq_b = linear_parts.partsOf(&.{ q_b, &ix.wq_b }, &.{ 1, 1 });
    };
    return mla;
}

/// A head product's weights on the device: f16 when every value converts exactly, which halves
/// their memory (GLM-5: 29 MB a layer) for the same bits; f32 otherwise, or with
/// TF_CUDA_MLA_HALF=0 (the comparison switch).
fn putProduct(model: *GpuModel, values: []const f32, diag: *Diagnostic) Error!M.Kernels.Weights {
    if (!core.switches.off("TF_CUDA_MLA_HALF")) {
        if (try linear_cuda.exactHalves(model.gpa, values)) |halves| {
            defer model.gpa.free(halves);
            return .{ .ptr = try model.put(std.mem.sliceAsBytes(halves), diag), .half = true };
        }
    }
    return .{ .ptr = try model.putF32(values, diag), .half = false };
}

pub fn allocate(model: *GpuModel, diag: *Diagnostic) Error!?Buffers {
    const c = model.config;
    const layers = c.countOf("attention", .mla);
    if (layers == 0) return null;
    const m = c.mla;
    const l = model.limits;
    const rows = l.rows_max;
    const f = @sizeOf(f32);
    const spread_rows = if (core.switches.off("TF_CUDA_ATTENTION_SPREAD")) 0 else @min(rows, model_mod.attention_spread_rows_max);
    const parts = M.Parts.floats(spread_rows, c.heads);
    return .{
        .q_latent_raw = try model.alloc(rows * @max(m.q_lora_rank, 1) * f, diag),
        .q_latent = try model.alloc(rows * @max(m.q_lora_rank, 1) * f, diag),
        .q = try model.alloc(rows * c.heads * m.qkDim() * f, diag),
        .kv = try model.alloc(rows * m.cacheWidth() * f, diag),
        .q_lat = try model.alloc(rows * c.heads * m.kv_lora_rank * f, diag),
        .lat_out = try model.alloc(rows * c.heads * m.kv_lora_rank * f, diag),
        .out = try model.alloc(rows * c.heads * m.v_dim * f, diag),
        // Rows of latent + 64 even for NoPE models (zeros there): the kernels' one row shape.
        .cache = try model.alloc(l.pages * layers * l.page_tokens * (M.latent + M.rope) * l.kv_dtype.bytes(), diag),
        .exps = if (l.kv_dtype == .fp8) try model.alloc(l.pages * layers * l.page_tokens, diag) else 0,
        .parts = .{ .acc = try model.alloc(@max(parts.acc, 1) * f, diag), .ml = try model.alloc(@max(parts.ml, 1) * f, diag) },
        .spread_rows = spread_rows,
    };
}

/// The layer's index in each part's cache.
pub const Layers = struct { mla: usize, index: usize };

/// model.projected = o_proj(attention(model.normed)).
pub fn attention(model: *GpuModel, k: K.Kernels, mla: *const GpuMla, plan: config_mod.LayerPlan, at: Layers, rows: usize) Error!void {
    const c = model.config;
    const m = c.mla;
    const b = model.mla.?;
    const mk: M.Kernels = .{ .gpu = &model.gpu, .module = &model.mla_module.?, .diag = k.diag };
    var wq_b_done = false;
    if (mla.q) |*q| {
        try model.runLinear(k, q, model.normed, b.q, rows, 0);
        try model.runLinear(k, &mla.kv_a, model.normed, b.kv, rows, 0);
    } else {
        if (!try linear_parts.runParts(model, k, mla.q_kv_a, model.normed, &.{ b.q_latent_raw, b.kv }, rows)) {
            try model.runLinear(k, &mla.q_a.?, model.normed, b.q_latent_raw, rows, 0);
            try model.runLinear(k, &mla.kv_a, model.normed, b.kv, rows, 0);
        }
        try k.rmsnorm(b.q_latent_raw, mla.q_a_norm, b.q_latent, rows, m.q_lora_rank, m.latent_eps);
        // A layer that runs its indexer: q_b and wq_b in one launch, the indexer told so.
        if (plan.indexer == .full) wq_b_done = try linear_parts.runParts(model, k, mla.q_b_wq_b, b.q_latent, &.{ b.q, model.dsa.?.q }, rows);
        if (!wq_b_done) try model.runLinear(k, &mla.q_b.?, b.q_latent, b.q, rows, 0);
    }
    const paged: M.Paged = .{
        .cache = b.cache,
        .dtype = model.limits.kv_dtype,
        .exps = b.exps,
        .positions = model.positions,
        .tables = model.tables,
        .table_offsets = model.table_offsets,
        .rows = rows,
        .layers = c.countOf("attention", .mla),
        .layer = at.mla,
        .page_tokens = model.limits.page_tokens,
    };
    try mk.ropeStore(b.kv, b.q, mla.kv_a_norm, model.cos_sin, paged, c.heads, m.qkDim(), m.nope_dim, c.rope.style == .interleaved, m.latent_eps);
    var selection: M.Selection = .{};
    switch (plan.indexer) {
        .none => {},
        .full => selection = try dsa_cuda.select(model, k, &mla.indexer.?, at.index, rows, wq_b_done),
        .shared => selection = dsa_cuda.selection(model),
    }
    try mk.absorb(b.q, mla.wuk, b.q_lat, rows, c.heads, m.qkDim(), m.nope_dim);
    const spread = if (rows <= b.spread_rows) b.parts else null;
    const positions = if (selection.topk > 0) @min(model.step_positions, rows * selection.topk) else model.step_positions;
    model.gpu.noteReads(positions * (M.latent + M.rope) * model.limits.kv_dtype.bytes());
    try mk.attention(b.q, b.q_lat, b.lat_out, paged, selection, spread, c.heads, m.qkDim(), m.nope_dim, c.attention_scale);
    try mk.vUp(b.lat_out, mla.wuv_t, b.out, rows, c.heads, m.v_dim);
    try model.runLinear(k, &mla.o, b.out, model.projected, rows, 0);
}
