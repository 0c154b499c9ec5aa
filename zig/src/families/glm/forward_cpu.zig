//! The class-A forward on the CPU (GLM.md §3.2-§3.8), the reference for the CUDA forward: f32
//! throughout, the residual stream in f32, router and softmax in f32. Every row of a batch is
//! computed from its own inputs in a fixed order (projections per row, attention per row over its
//! own sequence, experts summed in ascending index), so a row's bits do not depend on which other
//! rows share the batch.
const std = @import("std");
const core = @import("../../core/root.zig");
const weights_mod = @import("weights.zig");
const router = @import("router.zig");
const rope = @import("rope.zig");
const KvCache = @import("../../engine/kv_cache.zig").KvCache;
const Config = @import("config.zig").Config;
const Weights = weights_mod.Weights;
const Mlp = weights_mod.Mlp;
const dot = @import("linear.zig").dot;

pub const Batch = struct {
    tokens: []const u32,
    positions: []const u32,
    /// Each row's sequence page table (position p lives in page page_tables[r][p / page_tokens]).
    page_tables: []const []const u32,
    /// Rows whose logits are wanted, in output order.
    logits_rows: []const u32,
    /// Which rows are prompt tokens (empty: none). The CPU ignores it; the GPU runs prompt rows
    /// through its tensor-core prompt kernels and generated rows through the GEMV.
    prompt: []const bool = &.{},

    pub fn rows(batch: *const Batch) usize {
        return batch.tokens.len;
    }
};

/// Buffers for one forward of up to `rows_max` rows, allocated once with the engine.
pub const Scratch = struct {
    rows_max: usize,
    context_max: usize,
    hidden: []f32, // (rows, H) residual stream
    normed: []f32, // (rows, H)
    q: []f32, // (rows, heads·head_dim)
    k: []f32, // (rows, kv_heads·head_dim)
    v: []f32,
    attention: []f32, // (rows, heads·head_dim)
    projected: []f32, // (rows, H)
    ffn_out: []f32, // (rows, H)
    gate: []f32, // (rows, I_max)
    up: []f32,
    gathered: []f32, // (rows, H) rows routed to one expert
    expert_out: []f32, // (rows, H)
    routes: []router.Route, // (rows)
    members: []u32, // (rows)
    scores: []f32, // (threads, context_max) attention probabilities
    linear: []f32,
    cos_sin: []f32, // (rows, rotary_dim)
    arena: std.heap.ArenaAllocator,

    pub fn init(gpa: std.mem.Allocator, weights: *const Weights, rows_max: usize, context_max: usize) error{OutOfMemory}!Scratch {
        const c = weights.config;
        var arena = std.heap.ArenaAllocator.init(gpa);
        errdefer arena.deinit();
        const a = arena.allocator();
        const intermediate = @max(c.intermediate_size, c.moe_intermediate_size * @max(c.shared_experts, 1));
        return .{
            .rows_max = rows_max,
            .context_max = context_max,
            .hidden = try a.alloc(f32, rows_max * c.hidden_size),
            .normed = try a.alloc(f32, rows_max * c.hidden_size),
            .q = try a.alloc(f32, rows_max * c.heads * c.head_dim),
            .k = try a.alloc(f32, rows_max * c.kv_heads * c.head_dim),
            .v = try a.alloc(f32, rows_max * c.kv_heads * c.head_dim),
            .attention = try a.alloc(f32, rows_max * c.heads * c.head_dim),
            .projected = try a.alloc(f32, rows_max * c.hidden_size),
            .ffn_out = try a.alloc(f32, rows_max * c.hidden_size),
            .gate = try a.alloc(f32, rows_max * intermediate),
            .up = try a.alloc(f32, rows_max * intermediate),
            .gathered = try a.alloc(f32, rows_max * c.hidden_size),
            .expert_out = try a.alloc(f32, rows_max * c.hidden_size),
            .routes = try a.alloc(router.Route, rows_max),
            .members = try a.alloc(u32, rows_max),
            .scores = try a.alloc(f32, core.parallel.threadCount() * context_max),
            .linear = try a.alloc(f32, weights.scratchLength(rows_max)),
            .cos_sin = try a.alloc(f32, rows_max * @max(c.rotary_dim, 2)),
            .arena = arena,
        };
    }

    pub fn deinit(scratch: *Scratch) void {
        scratch.arena.deinit();
        scratch.* = undefined;
    }
};

/// Sums a rank's partial outputs across the tensor-parallel ranks, in place (dist/collective.zig).
pub const Reduce = struct {
    context: *anyopaque,
    sum: *const fn (context: *anyopaque, values: []f32) void,
};

/// Runs the batch through the model, writing its keys and values into `cache` and the logits of
/// `batch.logits_rows` into `logits` ((logits_rows, vocab) f32). With `reduce`, `weights` is one
/// rank's shard and the partial o_proj and FFN outputs are summed across ranks before each residual
/// add (the two all-reduces of a layer).
pub fn forward(weights: *const Weights, cache: *KvCache, batch: Batch, scratch: *Scratch, logits: []f32) void {
    forwardRank(weights, cache, batch, scratch, logits, null);
}

pub fn forwardRank(weights: *const Weights, cache: *KvCache, batch: Batch, scratch: *Scratch, logits: []f32, reduce: ?Reduce) void {
    const c = weights.config;
    const rows = batch.rows();
    std.debug.assert(rows >= 1 and rows <= scratch.rows_max);
    std.debug.assert(batch.positions.len == rows and batch.page_tables.len == rows);
    std.debug.assert(logits.len == batch.logits_rows.len * c.vocab_size);
    const hidden = scratch.hidden[0 .. rows * c.hidden_size];

    for (0..rows) |r| {
        std.debug.assert(batch.tokens[r] < c.vocab_size and batch.positions[r] < scratch.context_max);
        weights.embedding.row(batch.tokens[r], hidden[r * c.hidden_size ..][0..c.hidden_size]);
        rope.cosSin(c, batch.positions[r], scratch.cos_sin[r * c.rotary_dim ..][0..c.rotary_dim]);
    }
    for (weights.blocks, 0..) |*block, layer| {
        const normed = scratch.normed[0 .. rows * c.hidden_size];
        rmsNormRows(hidden, block.input_norm, c.rms_norm_eps, normed);
        attention(weights, block, layer, cache, batch, scratch);
        if (reduce) |r| r.sum(r.context, scratch.projected[0 .. rows * c.hidden_size]);
        addInto(hidden, scratch.projected[0 .. rows * c.hidden_size]);

        rmsNormRows(hidden, block.post_attention_norm, c.rms_norm_eps, normed);
        const out = scratch.ffn_out[0 .. rows * c.hidden_size];
        switch (block.ffn) {
            .dense => |*mlp| runMlp(mlp, rows, normed, out, scratch),
            .moe => |*moe| runMoe(c, moe, rows, normed, out, scratch),
        }
        if (reduce) |r| r.sum(r.context, out);
        addInto(hidden, out);
    }

    const selected = scratch.normed[0 .. batch.logits_rows.len * c.hidden_size];
    for (batch.logits_rows, 0..) |row, i| {
        rmsNorm(hidden[row * c.hidden_size ..][0..c.hidden_size], weights.norm, c.rms_norm_eps, selected[i * c.hidden_size ..][0..c.hidden_size]);
    }
    if (batch.logits_rows.len > 0) weights.lm_head.forward(batch.logits_rows.len, selected, logits, scratch.linear);
}

fn attention(weights: *const Weights, block: *const weights_mod.Block, layer: usize, cache: *KvCache, batch: Batch, scratch: *Scratch) void {
    const c = weights.config;
    const rows = batch.rows();
    const normed = scratch.normed[0 .. rows * c.hidden_size];
    const q = scratch.q[0 .. rows * c.heads * c.head_dim];
    const k = scratch.k[0 .. rows * c.kv_heads * c.head_dim];
    const v = scratch.v[0 .. rows * c.kv_heads * c.head_dim];
    block.q.forward(rows, normed, q, scratch.linear);
    block.k.forward(rows, normed, k, scratch.linear);
    block.v.forward(rows, normed, v, scratch.linear);

    for (0..rows) |r| {
        const cos_sin = scratch.cos_sin[r * c.rotary_dim ..][0..c.rotary_dim];
        for (0..c.heads) |h| {
            const head = q[(r * c.heads + h) * c.head_dim ..][0..c.head_dim];
            if (block.q_norm) |w| rmsNorm(head, w, c.rms_norm_eps, head);
            rope.apply(head[0..c.rotary_dim], cos_sin);
        }
        const position = batch.positions[r];
        const page = batch.page_tables[r][position / cache.shape.page_tokens];
        const slot = position % cache.shape.page_tokens;
        for (0..c.kv_heads) |h| {
            const key = k[(r * c.kv_heads + h) * c.head_dim ..][0..c.head_dim];
            if (block.k_norm) |w| rmsNorm(key, w, c.rms_norm_eps, key);
            rope.apply(key[0..c.rotary_dim], cos_sin);
            const at = cache.offset(page, layer, h, slot);
            @memcpy(cache.keys[at..][0..c.head_dim], key);
            @memcpy(cache.values[at..][0..c.head_dim], v[(r * c.kv_heads + h) * c.head_dim ..][0..c.head_dim]);
        }
    }

    const job: AttentionJob = .{ .config = c, .layer = layer, .cache = cache, .batch = batch, .scratch = scratch };
    core.parallel.forRange(rows * c.heads, 1, &job, AttentionJob.run);
    block.o.forward(rows, scratch.attention[0 .. rows * c.heads * c.head_dim], scratch.projected[0 .. rows * c.hidden_size], scratch.linear);
}

const AttentionJob = struct {
    config: Config,
    layer: usize,
    cache: *const KvCache,
    batch: Batch,
    scratch: *Scratch,

    /// Items are (row, head) pairs. softmax(q·kᵀ / sqrt(head_dim)) · v over positions 0..pos of
    /// the row's own sequence (causal), in f32, summed in position order.
    fn run(job: *const AttentionJob, worker: usize, begin: usize, end: usize) void {
        const c = job.config;
        const cache = job.cache;
        const page_tokens = cache.shape.page_tokens;
        const group = c.heads / c.kv_heads;
        const scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(c.head_dim))));
        const scores = job.scratch.scores[worker * job.scratch.context_max ..][0..job.scratch.context_max];
        for (begin..end) |item| {
            const r = item / c.heads;
            const h = item % c.heads;
            const kv_head = h / group;
            const query = job.scratch.q[(r * c.heads + h) * c.head_dim ..][0..c.head_dim];
            const length = job.batch.positions[r] + 1;
            const table = job.batch.page_tables[r];
            var max_score: f32 = -std.math.inf(f32);
            for (0..length) |t| {
                const at = cache.offset(table[t / page_tokens], job.layer, kv_head, t % page_tokens);
                scores[t] = dot(query, cache.keys[at..][0..c.head_dim]) * scale;
                max_score = @max(max_score, scores[t]);
            }
            var total: f32 = 0;
            for (scores[0..length]) |*s| {
                s.* = @exp(s.* - max_score);
                total += s.*;
            }
            const out = job.scratch.attention[(r * c.heads + h) * c.head_dim ..][0..c.head_dim];
            @memset(out, 0);
            for (0..length) |t| {
                const at = cache.offset(table[t / page_tokens], job.layer, kv_head, t % page_tokens);
                const p = scores[t] / total;
                for (out, cache.values[at..][0..c.head_dim]) |*o, value| o.* += p * value;
            }
        }
    }
};

fn runMlp(mlp: *const Mlp, rows: usize, x: []const f32, out: []f32, scratch: *Scratch) void {
    const intermediate = mlp.gate.out_features;
    const gate = scratch.gate[0 .. rows * intermediate];
    const up = scratch.up[0 .. rows * intermediate];
    mlp.gate.forward(rows, x, gate, scratch.linear);
    mlp.up.forward(rows, x, up, scratch.linear);
    for (gate, up) |*g, u| g.* = silu(g.*) * u;
    mlp.down.forward(rows, gate, out, scratch.linear);
}

fn runMoe(c: Config, moe: *const weights_mod.Moe, rows: usize, x: []const f32, out: []f32, scratch: *Scratch) void {
    const hidden = c.hidden_size;
    for (0..rows) |r| {
        scratch.routes[r] = router.route(c, moe.router, moe.correction_bias, x[r * hidden ..][0..hidden]);
    }
    @memset(out, 0);
    // Experts in ascending index: each row's routed sum runs in ascending expert order (HF's order).
    for (moe.experts, 0..) |*expert, e| {
        var count: usize = 0;
        for (scratch.routes[0..rows], 0..) |route, r| {
            if (route.weightOf(@intCast(e)) != null) {
                scratch.members[count] = @intCast(r);
                count += 1;
            }
        }
        if (count == 0) continue;
        const gathered = scratch.gathered[0 .. count * hidden];
        for (scratch.members[0..count], 0..) |r, i| @memcpy(gathered[i * hidden ..][0..hidden], x[r * hidden ..][0..hidden]);
        const expert_out = scratch.expert_out[0 .. count * hidden];
        runMlp(expert, count, gathered, expert_out, scratch);
        for (scratch.members[0..count], 0..) |r, i| {
            const weight = scratch.routes[r].weightOf(@intCast(e)).?;
            for (out[r * hidden ..][0..hidden], expert_out[i * hidden ..][0..hidden]) |*o, y| o.* += y * weight;
        }
    }
    if (moe.shared) |*shared| {
        const shared_out = scratch.expert_out[0 .. rows * hidden];
        runMlp(shared, rows, x, shared_out, scratch);
        addInto(out, shared_out);
    }
}

pub fn silu(z: f32) f32 {
    return z / (1.0 + @exp(-z));
}

fn addInto(target: []f32, source: []const f32) void {
    for (target, source) |*t, s| t.* += s;
}

fn rmsNormRows(x: []const f32, weight: []const f32, eps: f32, out: []f32) void {
    const width = weight.len;
    for (0..x.len / width) |r| rmsNorm(x[r * width ..][0..width], weight, eps, out[r * width ..][0..width]);
}

/// w ⊙ x / sqrt(mean(x²) + eps) (GLM.md §3.1); the mean of squares is accumulated in f64.
/// `out` may alias `x`.
pub fn rmsNorm(x: []const f32, weight: []const f32, eps: f32, out: []f32) void {
    var sum: f64 = 0;
    for (x) |v| sum += @as(f64, v) * v;
    const mean: f32 = @floatCast(sum / @as(f64, @floatFromInt(x.len)));
    const inverse = 1.0 / @sqrt(mean + eps);
    for (out, x, weight) |*o, v, w| o.* = w * (v * inverse);
}
