//! The forward on the CPU, composed from the parts each layer is planned with (GLM.md §3.2):
//! embed -> per layer (norm, attention part, residual; norm, FFN part, residual) -> norm -> head.
//! With hyper-connections (GLM-5.3-Flash, parts/hyper.zig) the residual is `hc_mult` streams per
//! row: each site collapses them into the sublayer's input and mixes the output back in, and the
//! head reads their mean.
//! The reference for the CUDA forward: f32 throughout, the residual stream in f32, router and
//! softmax in f32. Every row of a batch is computed from its own inputs in a fixed order
//! (projections per row, attention per row over its own sequence, experts summed in ascending
//! index), so a row's bits do not depend on which other rows share the batch.
const std = @import("std");
const core = @import("../../core/root.zig");
const weights_mod = @import("weights.zig");
const rope = @import("rope.zig");
const ops = @import("ops.zig");
const Config = @import("config.zig").Config;
const HostCache = @import("cache.zig").HostCache;
const gqa = @import("parts/gqa.zig");
const mla = @import("parts/mla.zig");
const dsa = @import("parts/dsa.zig");
const kda = @import("parts/kda.zig");
const hyper = @import("parts/hyper.zig");
const mlp = @import("parts/mlp.zig");
const moe = @import("parts/moe.zig");
const Weights = weights_mod.Weights;

pub const Batch = @import("batch.zig").Batch;

/// Buffers for one forward of up to `rows_max` rows, allocated once with the engine; each part
/// the model has gets its own.
pub const Scratch = struct {
    rows_max: usize,
    context_max: usize,
    hidden: []f32, // (rows, streams, H) residual streams
    collapsed: []f32, // (rows, H): a hyper-connection site's sublayer input
    maps: []hyper.Maps, // (rows): a site's post and comb maps
    streams_scratch: []f32, // (threads, streams, H)
    normed: []f32, // (rows, H)
    projected: []f32, // (rows, H)
    ffn_out: []f32, // (rows, H)
    gate: []f32, // (rows, I_max)
    up: []f32,
    linear: []f32,
    cos_sin: []f32, // (rows, rotary_dim)
    gqa: ?gqa.Scratch,
    mla: ?mla.Scratch,
    dsa: ?*dsa.Scratch,
    kda: ?kda.Scratch,
    moe: moe.Scratch,
    arena: std.heap.ArenaAllocator,

    pub fn init(gpa: std.mem.Allocator, weights: *const Weights, rows_max: usize, context_max: usize) error{OutOfMemory}!Scratch {
        const c = &weights.config;
        var arena = std.heap.ArenaAllocator.init(gpa);
        errdefer arena.deinit();
        const a = arena.allocator();
        const intermediate = @max(c.intermediate_size, c.moe_intermediate_size * @max(c.shared_experts, 1));
        const cos_sin = try a.alloc(f32, rows_max * @max(c.rotary_dim, 2));
        var indexer: ?*dsa.Scratch = null;
        if (c.countOf("indexer", .full) > 0) {
            indexer = try a.create(dsa.Scratch);
            indexer.?.* = try dsa.Scratch.init(a, c, rows_max, context_max, cos_sin);
        }
        const streams = c.hyper.streams();
        return .{
            .rows_max = rows_max,
            .context_max = context_max,
            .hidden = try a.alloc(f32, rows_max * streams * c.hidden_size),
            .collapsed = try a.alloc(f32, if (c.hyper.mult > 0) rows_max * c.hidden_size else 0),
            .maps = try a.alloc(hyper.Maps, if (c.hyper.mult > 0) rows_max else 0),
            .streams_scratch = try a.alloc(f32, if (c.hyper.mult > 0) core.parallel.threadCount() * streams * c.hidden_size else 0),
            .normed = try a.alloc(f32, rows_max * c.hidden_size),
            .projected = try a.alloc(f32, rows_max * c.hidden_size),
            .ffn_out = try a.alloc(f32, rows_max * c.hidden_size),
            .gate = try a.alloc(f32, rows_max * intermediate),
            .up = try a.alloc(f32, rows_max * intermediate),
            .linear = try a.alloc(f32, weights.scratchLength(rows_max)),
            .cos_sin = cos_sin,
            .gqa = if (c.countOf("attention", .gqa) > 0) try gqa.Scratch.init(a, c, rows_max, context_max, cos_sin) else null,
            .mla = if (c.countOf("attention", .mla) > 0) try mla.Scratch.init(a, c, rows_max, context_max, cos_sin, indexer) else null,
            .dsa = indexer,
            .kda = if (c.countOf("attention", .kda) > 0) try kda.Scratch.init(a, c, rows_max) else null,
            .moe = try moe.Scratch.init(a, c, rows_max),
            .arena = arena,
        };
    }

    pub fn deinit(scratch: *Scratch) void {
        scratch.arena.deinit();
        scratch.* = undefined;
    }

    const Site = enum { attn, ffn };

    /// The sublayer's input before its norm: the residual itself, or the hyper-connection site's
    /// collapse of the streams (its maps kept for `leave`).
    fn enter(scratch: *Scratch, c: *const Config, block: *const weights_mod.Block, comptime site: Site, hidden: []const f32) []const f32 {
        const sites = block.hyper orelse return hidden;
        const rows = hidden.len / (c.hyper.mult * c.hidden_size);
        const collapsed = scratch.collapsed[0 .. rows * c.hidden_size];
        hyper.enter(c, &@field(sites, @tagName(site)), hidden, collapsed, scratch.maps[0..rows], scratch.streams_scratch);
        return collapsed;
    }

    /// The sublayer's output into the residual.
    fn leave(scratch: *Scratch, c: *const Config, block: *const weights_mod.Block, comptime site: Site, hidden: []f32, sublayer_out: []const f32) void {
        _ = site;
        if (block.hyper == null) return ops.addInto(hidden, sublayer_out);
        const rows = sublayer_out.len / c.hidden_size;
        hyper.leave(c, hidden, sublayer_out, scratch.maps[0..rows], scratch.streams_scratch);
    }

    fn mlpBuffers(scratch: *Scratch) mlp.Buffers {
        return .{ .gate = scratch.gate, .up = scratch.up, .linear = scratch.linear };
    }
};

/// Sums a rank's partial outputs across the tensor-parallel ranks, in place (dist/collective.zig).
pub const Reduce = struct {
    context: *anyopaque,
    sum: *const fn (context: *anyopaque, values: []f32) void,
};

/// Runs the batch through the model, writing each layer's cache entries into `cache` and the logits
/// of `batch.logits_rows` into `logits` ((logits_rows, vocab) f32).
pub fn forward(weights: *const Weights, cache: *HostCache, batch: Batch, scratch: *Scratch, logits: []f32) void {
    forwardRank(weights, cache, batch, scratch, logits, null);
}

/// With `reduce`, `weights` is one rank's shard and the partial attention and FFN outputs are
/// summed across ranks before each residual add (the two all-reduces of a layer).
pub fn forwardRank(weights: *const Weights, cache: *HostCache, batch: Batch, scratch: *Scratch, logits: []f32, reduce: ?Reduce) void {
    const c = &weights.config;
    const rows = batch.rows();
    std.debug.assert(rows >= 1 and rows <= scratch.rows_max);
    std.debug.assert(batch.positions.len == rows and batch.page_tables.len == rows);
    std.debug.assert(logits.len == batch.logits_rows.len * c.vocab_size);
    const streams = c.hyper.streams();
    const hidden = scratch.hidden[0 .. rows * streams * c.hidden_size];
    const normed = scratch.normed[0 .. rows * c.hidden_size];
    const projected = scratch.projected[0 .. rows * c.hidden_size];
    const out = scratch.ffn_out[0 .. rows * c.hidden_size];

    for (0..rows) |r| {
        std.debug.assert(batch.tokens[r] < c.vocab_size and batch.positions[r] < scratch.context_max);
        const row = hidden[r * streams * c.hidden_size ..][0 .. streams * c.hidden_size];
        weights.embedding.row(batch.tokens[r], row[0..c.hidden_size]);
        for (1..streams) |s| @memcpy(row[s * c.hidden_size ..][0..c.hidden_size], row[0..c.hidden_size]);
        rope.cosSin(c.rope, batch.positions[r], scratch.cos_sin[r * c.rotary_dim ..][0..c.rotary_dim]);
    }
    for (weights.blocks, 0..) |*block, layer| {
        ops.rmsNormRows(scratch.enter(c, block, .attn, hidden), block.input_norm, c.rms_norm_eps, normed);
        switch (block.attention) {
            .gqa => |*part| part.forward(c, c.indexAmong(layer, "attention", .gqa), &cache.gqa.?, batch, normed, projected, &scratch.gqa.?, scratch.linear),
            .mla => |*part| part.forward(c, c.plan[layer], .{
                .mla = c.indexAmong(layer, "attention", .mla),
                .index = c.indexAmong(layer, "indexer", .full),
            }, .{ .mla = &cache.mla.?, .index = if (cache.index) |*index| index else null }, batch, normed, projected, &scratch.mla.?, scratch.linear),
            .kda => |*part| part.forward(c, c.indexAmong(layer, "attention", .kda), &cache.kda.?, batch, normed, projected, &scratch.kda.?, scratch.linear),
        }
        if (reduce) |r| r.sum(r.context, projected);
        scratch.leave(c, block, .attn, hidden, projected);

        ops.rmsNormRows(scratch.enter(c, block, .ffn, hidden), block.post_attention_norm, c.rms_norm_eps, normed);
        switch (block.ffn) {
            .dense => |*part| part.forward(rows, normed, out, scratch.mlpBuffers()),
            .moe => |*part| part.forward(c, rows, normed, out, &scratch.moe, scratch.mlpBuffers()),
        }
        if (reduce) |r| r.sum(r.context, out);
        scratch.leave(c, block, .ffn, hidden, out);
    }

    const selected = scratch.normed[0 .. batch.logits_rows.len * c.hidden_size];
    const mean = scratch.projected[0..c.hidden_size];
    for (batch.logits_rows, 0..) |row, i| {
        const streams_of_row = hidden[row * streams * c.hidden_size ..][0 .. streams * c.hidden_size];
        const final = if (streams > 1) blk: {
            hyper.collapseMean(streams, streams_of_row, mean);
            break :blk mean;
        } else streams_of_row;
        ops.rmsNorm(final, weights.norm, c.rms_norm_eps, selected[i * c.hidden_size ..][0..c.hidden_size]);
    }
    if (batch.logits_rows.len > 0) {
        std.debug.assert(!weights.lm_head.released()); // a TP rank past 0 wants no logits
        weights.lm_head.forward(batch.logits_rows.len, selected, logits, scratch.linear);
    }
}

/// Re-exported for the GPU code, which shares the CPU's numbers.
pub const rmsNorm = ops.rmsNorm;
pub const silu = ops.silu;
