//! The GPU side of hyper-connections (parts/hyper.zig) and the forward of a model that has them, as
//! forward_cpu.zig runs it: model.hidden holds each row's `mult` streams; per site `enter`
//! computes the maps and collapses the streams through the site's RMSNorm into model.normed, the
//! sublayer runs, and tf_hc_leave mixes its output back into the streams; the head reads their mean. The
//! plain forward fuses each residual add with the next norm; here the site's maps stand between.
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const weights_mod = @import("../weights.zig");
const hyper = @import("hyper.zig");
const moe_cuda = @import("moe_cuda.zig");
const config_mod = @import("../config.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const H = cuda.hyper_kernels;

pub const GpuSites = struct { attn: H.Site, ffn: H.Site };

pub fn checkShape(c: *const config_mod.Config, diag: *Diagnostic) Error!void {
    if (c.hyper.mult > H.mult_max) {
        diag.set("the CUDA hyper-connection kernels take hc_mult up to {d}; this model has {d}", .{ H.mult_max, c.hyper.mult });
        return error.UnsupportedModel;
    }
}

pub fn upload(model: *GpuModel, sites: *const weights_mod.HyperSites, diag: *Diagnostic) Error!GpuSites {
    return .{ .attn = try uploadSite(model, &sites.attn, diag), .ffn = try uploadSite(model, &sites.ffn, diag) };
}

fn uploadSite(model: *GpuModel, site: *const hyper.Site, diag: *Diagnostic) Error!H.Site {
    const c = model.config;
    if (mixOnTensorCores(model)) model.noteDenseSplits(c.hyper.mult * c.hidden_size, c.hyper.mixes(), true);
    return .{ .mix = try model.putF32(site.mix, diag), .base = try model.putF32(site.base, diag), .scale = try model.putF32(site.scale, diag) };
}

/// The mixing dots as a projection of the flattened streams on the tensor cores (f32 weight split
/// into f16 parts, glm_forward.cu's tf_dense_f32), the sum of squares from the same loads: the
/// matrix is read once per 32 rows, where tf_hc_mix's block per (row, logit) re-read it per row
/// (3.8 ms of a 1024-token prefill) and its sum-of-squares block alone took 7 us of a decode site.
fn mixOnTensorCores(model: *const GpuModel) bool {
    return model.dense_mma and (model.config.hyper.mult * model.config.hidden_size) % 16 == 0;
}

/// A site's entry into model.normed: the mixing dots and sum of squares, the maps, then the
/// collapse and the sublayer's RMSNorm (`norm`). On the tensor-core path the dots' split sums go
/// to the next kernel unadded, and the maps, collapse and norm are one launch where the width
/// and the rows allow (tf_hc_enter): three launches a site where there were six, the MoE combine in the third.
fn enter(model: *GpuModel, k: K.Kernels, hk: H.Kernels, site: H.Site, norm: Ptr, rows: usize) Error!void {
    const c = model.config;
    const m = c.hyper.mult;
    const d = c.hidden_size;
    const mixes = c.hyper.mixes();
    var sums = model.hyper_raw;
    var splits: usize = 1;
    if (mixOnTensorCores(model)) {
        try k.denseMma(.{
            .x = model.hidden,
            .weight = site.mix,
            .half = false,
            .y = model.hyper_raw,
            .y_stride = mixes + 1,
            .partial = model.acc,
            .rows = rows,
            .in_features = m * d,
            .out_features = mixes,
            .squares = true,
            .reduce = false,
        });
        splits = K.Kernels.denseSplits(m * d, mixes);
        if (splits > 1) sums = model.acc;
    } else {
        try hk.mix(model.hidden, site, model.hyper_raw, rows, m, d);
    }
    if (model.hyper_fused and H.Kernels.enterFits(d, splits, rows))
        return hk.enter(sums, splits, site, model.maps, model.hidden, norm, model.normed, rows, m, d, c.rms_norm_eps, c.hyper.eps, c.hyper.sinkhorn_iters);
    try hk.mapsFrom(sums, splits, site, model.maps, rows, m, d, c.rms_norm_eps, c.hyper.eps, c.hyper.sinkhorn_iters);
    if (H.Kernels.collapseNormFits(d)) return hk.collapseNorm(model.hidden, model.maps, norm, model.normed, rows, m, d, c.rms_norm_eps);
    try hk.collapse(model.hidden, model.maps, model.collapsed, rows, m, d);
    try k.rmsnorm(model.collapsed, norm, model.normed, rows, d, c.rms_norm_eps);
}

/// The whole forward of a hyper-connected model, queued on the stream (cuda_model.enqueue's
/// counterpart). With `reduce` the model is one rank's shard: a sublayer's partial output is summed
/// across ranks before tf_hc_leave mixes it into the streams (the mix is linear in it), so every
/// rank carries the same streams and computes the same maps.
pub fn enqueue(model: *GpuModel, k: K.Kernels, rows: usize, wanted: usize, reduce: ?GpuModel.Reduce, diag: *Diagnostic) Error!void {
    const c = model.config;
    const m = c.hyper.mult;
    const d = c.hidden_size;
    const hk: H.Kernels = .{ .gpu = &model.gpu, .module = &model.hyper_module.?, .diag = diag };
    model.at(null, .embed);
    try k.embed(model.tokens, model.embed, model.embed_dtype, model.collapsed, rows, d);
    try hk.spread(model.collapsed, model.hidden, rows, m, d);
    for (model.blocks, 0..) |*block, layer| {
        const sites = block.hyper.?;
        model.at(layer, .norm);
        try enter(model, k, hk, sites.attn, block.input_norm, rows);
        model.at(layer, .attention);
        try model.attentionPart(k, block, layer, rows);
        model.at(layer, .norm);
        if (reduce) |r| r.sum(r.context, model, model.projected, rows * d, diag) catch return error.CudaFailed;
        try hk.leave(model.hidden, model.maps, model.projected, rows, m, d);
        try enter(model, k, hk, sites.ffn, block.post_attention_norm, rows);
        model.at(layer, .ffn);
        // One rank alone: the MoE block's combine is computed inside the leave's launch.
        if (reduce == null and model.hyper_fused and block.ffn == .moe) {
            const combine = try moe_cuda.runExperts(model, k, &block.ffn.moe, rows);
            model.at(layer, .norm);
            try hk.leaveCombined(model.hidden, model.maps, combine, rows, m, d);
            continue;
        }
        try model.ffnPart(k, block, rows);
        model.at(layer, .norm);
        if (reduce) |r| r.sum(r.context, model, model.ffn_out, rows * d, diag) catch return error.CudaFailed;
        try hk.leave(model.hidden, model.maps, model.ffn_out, rows, m, d);
    }
    if (wanted == 0) return;
    model.at(null, .head);
    try hk.mean(model.hidden, model.collapsed, rows, m, d);
    try k.rmsnorm(model.collapsed, model.norm, model.normed, rows, d, c.rms_norm_eps);
    try model.head(k, wanted);
}
