//! Manifold-constrained hyper-connections (mHC), GLM-5.3-Flash's residual (transformers 5.17's
//! Glm5NextTextHyperConnection): each row carries `mult` residual streams. At each site (before
//! attention, before the FFN) the flattened streams, RMS-normed without a weight, give 2m + m²
//! mixing logits through `fn`; scaled and offset by `scale` and `base` they become
//!   pre  = sigmoid(·) + eps          (how the streams collapse into the sublayer's input),
//!   post = 2·sigmoid(·)              (how much of the sublayer's output each stream takes),
//!   comb = Sinkhorn(softmax(·) + eps) (how the streams mix, near doubly stochastic),
//! and after the sublayer stream j becomes post_j·out + Σ_i comb_ij·stream_i. All in f32.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const config_mod = @import("../config.zig");
const dot = @import("../linear.zig").dot;
const Config = config_mod.Config;

pub const mult_max = 16;

pub const Site = struct {
    /// (2m + m², m·hidden)
    mix: []f32,
    base: []f32,
    scale: []f32,

    /// `site` is "attn" or "ffn": the peer's `hc_attn_fn` names, or transformers' `attn_hc.fn`.
    pub fn load(loader: *loader_mod.Loader, layer_prefix: []const u8, comptime site: []const u8) loader_mod.Error!Site {
        const c = loader.config;
        const h = c.hyper;
        // transformers' module names when the checkpoint has them; else the stored names, which
        // a missing tensor's error then names.
        if (!loader.has(loader.name("{s}." ++ site ++ "_hc.fn", .{layer_prefix}))) return .{
            .mix = try loader.matrix(loader.name("{s}.hc_" ++ site ++ "_fn", .{layer_prefix}), h.mixes(), h.mult * c.hidden_size),
            .base = try loader.vector(loader.name("{s}.hc_" ++ site ++ "_base", .{layer_prefix}), h.mixes()),
            .scale = try loader.vector(loader.name("{s}.hc_" ++ site ++ "_scale", .{layer_prefix}), 3),
        };
        return .{
            .mix = try loader.matrix(loader.name("{s}." ++ site ++ "_hc.fn", .{layer_prefix}), h.mixes(), h.mult * c.hidden_size),
            .base = try loader.vector(loader.name("{s}." ++ site ++ "_hc.base", .{layer_prefix}), h.mixes()),
            .scale = try loader.vector(loader.name("{s}." ++ site ++ "_hc.scale", .{layer_prefix}), 3),
        };
    }
};

/// One row's maps at one site, kept from `enter` to `leave`.
pub const Maps = struct {
    post: [mult_max]f32,
    comb: [mult_max * mult_max]f32,
};

/// The sublayer's input for every row (rows, hidden) from its streams (rows, m, hidden), and each
/// row's post and comb maps.
pub fn enter(c: *const Config, site: *const Site, streams: []const f32, collapsed: []f32, maps: []Maps, scratch: []f32) void {
    const job: EnterJob = .{ .c = c, .site = site, .streams = streams, .collapsed = collapsed, .maps = maps, .scratch = scratch };
    core.parallel.forRange(collapsed.len / c.hidden_size, 1, &job, EnterJob.run);
}

const EnterJob = struct {
    c: *const Config,
    site: *const Site,
    streams: []const f32,
    collapsed: []f32,
    maps: []Maps,
    scratch: []f32,

    fn run(job: *const EnterJob, worker: usize, begin: usize, end: usize) void {
        const c = job.c;
        const m = c.hyper.mult;
        const width = m * c.hidden_size;
        const flat = job.scratch[worker * width ..][0..width];
        for (begin..end) |r| {
            const row = job.streams[r * width ..][0..width];
            var sum: f64 = 0;
            for (row) |v| sum += @as(f64, v) * v;
            const inverse = 1.0 / @sqrt(@as(f32, @floatCast(sum / @as(f64, @floatFromInt(width)))) + c.rms_norm_eps);
            for (flat, row) |*f, v| f.* = v * inverse;
            var pre: [mult_max]f32 = undefined;
            mapsOf(c.hyper, job.site, flat, &pre, &job.maps[r]);
            const out = job.collapsed[r * c.hidden_size ..][0..c.hidden_size];
            @memset(out, 0);
            for (0..m) |s| {
                for (out, row[s * c.hidden_size ..][0..c.hidden_size]) |*o, v| o.* += pre[s] * v;
            }
        }
    }
};

fn sigmoid(z: f32) f32 {
    return 1.0 / (1.0 + @exp(-z));
}

fn mapsOf(h: config_mod.Hyper, site: *const Site, flat: []const f32, pre: *[mult_max]f32, maps: *Maps) void {
    const m = h.mult;
    const width = flat.len;
    for (0..m) |i| {
        pre[i] = sigmoid(dot(site.mix[i * width ..][0..width], flat) * site.scale[0] + site.base[i]) + h.eps;
        maps.post[i] = 2 * sigmoid(dot(site.mix[(m + i) * width ..][0..width], flat) * site.scale[1] + site.base[m + i]);
    }
    const comb = maps.comb[0 .. m * m];
    for (comb, 0..) |*v, i| v.* = dot(site.mix[(2 * m + i) * width ..][0..width], flat) * site.scale[2] + site.base[2 * m + i];
    for (0..m) |a| {
        const row = comb[a * m ..][0..m];
        var max: f32 = -std.math.inf(f32);
        for (row) |v| max = @max(max, v);
        var total: f32 = 0;
        for (row) |*v| {
            v.* = @exp(v.* - max);
            total += v.*;
        }
        for (row) |*v| v.* = v.* / total + h.eps;
    }
    normalizeColumns(comb, m, h.eps);
    for (1..h.sinkhorn_iters) |_| {
        for (0..m) |a| {
            const row = comb[a * m ..][0..m];
            var total: f32 = 0;
            for (row) |v| total += v;
            for (row) |*v| v.* /= total + h.eps;
        }
        normalizeColumns(comb, m, h.eps);
    }
}

fn normalizeColumns(comb: []f32, m: usize, eps: f32) void {
    for (0..m) |b| {
        var total: f32 = 0;
        for (0..m) |a| total += comb[a * m + b];
        for (0..m) |a| comb[a * m + b] /= total + eps;
    }
}

/// Every row's streams after the sublayer: stream j = post_j·out + Σ_i comb_ij·stream_i.
pub fn leave(c: *const Config, streams: []f32, out: []const f32, maps: []const Maps, scratch: []f32) void {
    const job: LeaveJob = .{ .c = c, .streams = streams, .out = out, .maps = maps, .scratch = scratch };
    core.parallel.forRange(out.len / c.hidden_size, 1, &job, LeaveJob.run);
}

const LeaveJob = struct {
    c: *const Config,
    streams: []f32,
    out: []const f32,
    maps: []const Maps,
    scratch: []f32,

    fn run(job: *const LeaveJob, worker: usize, begin: usize, end: usize) void {
        const hidden = job.c.hidden_size;
        const m = job.c.hyper.mult;
        const old = job.scratch[worker * m * hidden ..][0 .. m * hidden];
        for (begin..end) |r| {
            const row = job.streams[r * m * hidden ..][0 .. m * hidden];
            @memcpy(old, row);
            const maps = &job.maps[r];
            const y = job.out[r * hidden ..][0..hidden];
            for (0..m) |j| {
                const target = row[j * hidden ..][0..hidden];
                for (target, y) |*t, v| t.* = maps.post[j] * v;
                for (0..m) |i| {
                    const weight = maps.comb[i * m + j];
                    for (target, old[i * hidden ..][0..hidden]) |*t, v| t.* += weight * v;
                }
            }
        }
    }
};

/// The streams' mean, the input of the final norm.
pub fn collapseMean(m: usize, streams: []const f32, out: []f32) void {
    const hidden = out.len;
    @memset(out, 0);
    for (0..m) |s| {
        for (out, streams[s * hidden ..][0..hidden]) |*o, v| o.* += v;
    }
    const scale = 1.0 / @as(f32, @floatFromInt(m));
    for (out) |*o| o.* *= scale;
}

test "sinkhorn leaves comb near doubly stochastic" {
    const h: config_mod.Hyper = .{ .mult = 3, .sinkhorn_iters = 20, .eps = 1e-6 };
    var mix: [15 * 6]f32 = undefined;
    for (&mix, 0..) |*v, i| v.* = @sin(@as(f32, @floatFromInt(i)) * 0.7);
    var base: [15]f32 = @splat(0.1);
    var scale = [_]f32{ 1, 1, 1 };
    const site: Site = .{ .mix = &mix, .base = &base, .scale = &scale };
    const flat = [_]f32{ 0.3, -1, 0.5, 2, -0.2, 0.9 };
    var pre: [mult_max]f32 = undefined;
    var maps: Maps = undefined;
    mapsOf(h, &site, &flat, &pre, &maps);
    for (0..3) |a| {
        var row: f32 = 0;
        var column: f32 = 0;
        for (0..3) |b| {
            row += maps.comb[a * 3 + b];
            column += maps.comb[b * 3 + a];
        }
        try std.testing.expectApproxEqAbs(@as(f32, 1), row, 1e-3);
        try std.testing.expectApproxEqAbs(@as(f32, 1), column, 1e-5);
    }
    for (0..3) |i| try std.testing.expect(maps.post[i] > 0 and maps.post[i] < 2 and pre[i] > 0);
}
