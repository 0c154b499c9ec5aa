//! Multi-head latent attention, classes B and C (GLM.md §3.5, transformers' Glm4MoeLiteAttention):
//! q = q_b(RMSNorm(q_a(x))) (or q_proj(x)), per head [nope | rope]; [latent | k_rope] =
//! kv_a_proj_with_mqa(x), the latent RMS-normed, k_rope rotated; kv_b_proj expands a latent into each
//! head's [k_nope | v]. The cache keeps [latent | rotated k_rope] only (kv_lora_rank + rope floats
//! per position, shared by every head).
//!
//! The CPU computes the absorbed form for every row: per head, q_lat = q_nope·W_UK (W_UK: the
//! head's k_nope rows of kv_b_proj), score_t = (q_lat·latent_t + q_rope·k_rope_t)·scale, the
//! softmax-weighted sum of latents, then W_UV (the head's v rows) maps it to the head's output.
//! It equals transformers' expanded form up to f32 rounding (a test compares them through the
//! fixtures' reference logits). With a DSA indexer (dsa.zig) a row attends to its selection only.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const config_mod = @import("../config.zig");
const Linear = @import("../linear.zig").Linear;
const Batch = @import("../batch.zig").Batch;
const dsa = @import("dsa.zig");
const kpool = @import("kpool.zig");
const rope = @import("../rope.zig");
const ops = @import("../ops.zig");
const dot = @import("../linear.zig").dot;
const Config = config_mod.Config;

pub const Mla = struct {
    /// q_lora_rank > 0: q_a, its norm and q_b; else q.
    q_a: ?Linear,
    q_a_norm: []f32,
    q_b: ?Linear,
    q: ?Linear,
    kv_a: Linear,
    kv_a_norm: []f32,
    /// kv_b_proj, always unquantized (an EXL3 one is dequantized once at load): the absorbed
    /// attention reads each head's k_nope and v blocks of its rows (kvRows) and never runs it as a
    /// projection. One copy: an f32 twin beside it held an unquantized kv_b twice (GLM-5: 4.6 GB).
    kv_b: Linear,
    o: Linear,
    indexer: ?dsa.Indexer,
    /// GLM-5.3-Flash's indexer over pooled keys, in place of `indexer`.
    pooled: ?kpool.Indexer = null,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8, layer: usize) loader_mod.Error!Mla {
        const c = loader.config;
        const m = c.mla;
        var buffer: [256]u8 = undefined;
        const name = loader_mod.join;
        const bias: loader_mod.Bias = if (m.bias) .required else .none;
        var result: Mla = undefined;
        if (m.q_lora_rank > 0) {
            result.q_a = try loader.linear(name(&buffer, prefix, "q_a_proj"), c.hidden_size, m.q_lora_rank, bias);
            result.q_a_norm = try loader.vector(name(&buffer, prefix, "q_a_layernorm.weight"), m.q_lora_rank);
            result.q_b = try loader.linear(name(&buffer, prefix, "q_b_proj"), m.q_lora_rank, c.heads * m.qkDim(), .none);
            result.q = null;
        } else {
            result.q_a = null;
            result.q_a_norm = &.{};
            result.q_b = null;
            result.q = try loader.linear(name(&buffer, prefix, "q_proj"), c.hidden_size, c.heads * m.qkDim(), .none);
        }
        result.kv_a = try loader.linear(name(&buffer, prefix, "kv_a_proj_with_mqa"), c.hidden_size, m.cacheWidth(), bias);
        result.kv_a_norm = try loader.vector(name(&buffer, prefix, "kv_a_layernorm.weight"), m.kv_lora_rank);
        result.kv_b = try loader.unquantizedLinear(name(&buffer, prefix, "kv_b_proj"), m.kv_lora_rank, c.heads * (m.nope_dim + m.v_dim));
        result.o = try loader.linear(name(&buffer, prefix, "o_proj"), c.heads * m.v_dim, c.hidden_size, bias);
        result.indexer = null;
        result.pooled = null;
        if (c.plan[layer].indexer == .full) {
            if (c.indexer.pool > 0) {
                result.pooled = try kpool.Indexer.load(loader, name(&buffer, prefix, "indexer"));
            } else {
                result.indexer = try dsa.Indexer.load(loader, name(&buffer, prefix, "indexer"));
            }
        }
        return result;
    }

    pub fn deinit(mla: *Mla, gpa: std.mem.Allocator) void {
        for ([_]*?Linear{ &mla.q_a, &mla.q_b, &mla.q }) |linear| if (linear.*) |*l| l.deinit(gpa);
        mla.kv_a.deinit(gpa);
        mla.kv_b.deinit(gpa);
        mla.o.deinit(gpa);
        if (mla.indexer) |*indexer| indexer.deinit(gpa);
        if (mla.pooled) |*indexer| indexer.deinit(gpa);
    }

    /// kv_b_proj's weight, (heads·(nope + v), kv_lora_rank) f32: head h's k_nope rows, then its v
    /// rows, at h·(nope + v)·kv_lora_rank.
    pub fn kvRows(mla: *const Mla) []const f32 {
        return mla.kv_b.kind.dense.weight;
    }

    pub fn scratchLength(mla: *const Mla, rows: usize) usize {
        var length = @max(mla.kv_a.scratchLength(rows), mla.kv_b.scratchLength(rows), mla.o.scratchLength(rows));
        for ([_]?Linear{ mla.q_a, mla.q_b, mla.q }) |linear| if (linear) |l| {
            length = @max(length, l.scratchLength(rows));
        };
        if (mla.indexer) |*indexer| length = @max(length, indexer.scratchLength(rows));
        if (mla.pooled) |*indexer| length = @max(length, indexer.scratchLength(rows));
        return length;
    }

    /// out = o_proj(attention(x)) for the batch's rows, their latents written into `cache` at
    /// `layer` (its index among MLA layers) first. `index_layer`: its index among full indexers.
    pub fn forward(mla: *const Mla, c: *const Config, plan: config_mod.LayerPlan, at: Layers, caches: Caches, batch: Batch, x: []const f32, out: []f32, scratch: *Scratch, linear_scratch: []f32) void {
        const m = c.mla;
        const rows = batch.rows();
        const q = scratch.q[0 .. rows * c.heads * m.qkDim()];
        const kv = scratch.kv[0 .. rows * m.cacheWidth()];
        var q_latent: []const f32 = &.{};
        if (mla.q) |*q_proj| {
            q_proj.forward(rows, x, q, linear_scratch);
        } else {
            const latent = scratch.q_latent[0 .. rows * m.q_lora_rank];
            mla.q_a.?.forward(rows, x, latent, linear_scratch);
            ops.rmsNormRows(latent, mla.q_a_norm, m.latent_eps, latent);
            mla.q_b.?.forward(rows, latent, q, linear_scratch);
            q_latent = latent;
        }
        mla.kv_a.forward(rows, x, kv, linear_scratch);
        const cache = caches.mla;
        for (0..rows) |r| {
            const cos_sin = scratch.cos_sin[r * m.rope_dim ..][0..m.rope_dim];
            for (0..c.heads) |h| rope.apply(c.rope.style, q[(r * c.heads + h) * m.qkDim() + m.nope_dim ..][0..m.rope_dim], cos_sin);
            const row = kv[r * m.cacheWidth() ..][0..m.cacheWidth()];
            ops.rmsNorm(row[0..m.kv_lora_rank], mla.kv_a_norm, m.latent_eps, row[0..m.kv_lora_rank]);
            rope.apply(c.rope.style, row[m.kv_lora_rank..], cos_sin);
            const position = batch.positions[r];
            cache.latent.put(batch.page_tables[r][position / cache.page_tokens], at.mla, 0, position % cache.page_tokens, row);
        }
        switch (plan.indexer) {
            .full => if (mla.pooled) |*pooled|
                pooled.select(c, at.index, caches.index.?, batch, x, q_latent, scratch.dsa.?, linear_scratch)
            else
                mla.indexer.?.select(c, at.index, caches.index.?, batch, x, q_latent, scratch.dsa.?, linear_scratch),
            .shared, .none => {},
        }
        const job: Job = .{ .config = c, .mla = mla, .layer = at.mla, .cache = cache, .batch = batch, .scratch = scratch, .sparse = plan.indexer != .none };
        core.parallel.forRange(rows * c.heads, 1, &job, Job.run);
        mla.o.forward(rows, scratch.attention[0 .. rows * c.heads * m.v_dim], out, linear_scratch);
    }
};

/// The layer's index in each part's cache.
pub const Layers = struct { mla: usize, index: usize };
pub const Caches = struct { mla: *Cache, index: ?*dsa.Cache };

const Job = struct {
    config: *const Config,
    mla: *const Mla,
    layer: usize,
    cache: *const Cache,
    batch: Batch,
    scratch: *Scratch,
    sparse: bool,

    /// Items are (row, head) pairs: the absorbed attention over the row's own sequence (or its
    /// DSA selection), in f32, summed in position order.
    fn run(job: *const Job, worker: usize, begin: usize, end: usize) void {
        const c = job.config;
        const m = c.mla;
        const s = job.scratch;
        const cache = job.cache;
        const width = m.cacheWidth();
        const block = m.nope_dim + m.v_dim;
        const scores = s.scores[worker * s.context_max ..][0..s.context_max];
        const q_lat = s.absorbed[worker * 2 * m.kv_lora_rank ..][0..m.kv_lora_rank];
        const lat_out = s.absorbed[(worker * 2 + 1) * m.kv_lora_rank ..][0..m.kv_lora_rank];
        const widened = s.widened[worker * width ..][0..width];
        for (begin..end) |item| {
            const r = item / c.heads;
            const h = item % c.heads;
            const query = s.q[(r * c.heads + h) * m.qkDim() ..][0..m.qkDim()];
            const w_head = job.mla.kvRows()[h * block * m.kv_lora_rank ..][0 .. block * m.kv_lora_rank];
            // q_lat = W_UKᵀ · q_nope, summed over the nope dims in order.
            @memset(q_lat, 0);
            for (0..m.nope_dim) |i| {
                const weight_row = w_head[i * m.kv_lora_rank ..][0..m.kv_lora_rank];
                for (q_lat, weight_row) |*l, w| l.* += query[i] * w;
            }
            const length = job.batch.positions[r] + 1;
            const positions: []const u32 = if (job.sparse) s.dsa.?.positions(r) else &.{};
            const count = if (job.sparse) positions.len else length;
            const out = s.attention[(r * c.heads + h) * m.v_dim ..][0..m.v_dim];
            if (count == 0) {
                // A pooled selection without its tail can be empty (the first pool-1 positions):
                // transformers' SDPA attends to nothing there and returns zeros.
                @memset(out, 0);
                continue;
            }
            const table = job.batch.page_tables[r];
            var max_score: f32 = -std.math.inf(f32);
            for (0..count) |i| {
                const t = if (job.sparse) positions[i] else i;
                const row = cache.latent.get(table[t / cache.page_tokens], job.layer, 0, t % cache.page_tokens, widened);
                scores[i] = (dot(q_lat, row[0..m.kv_lora_rank]) + dot(query[m.nope_dim..], row[m.kv_lora_rank..])) * c.attention_scale;
                max_score = @max(max_score, scores[i]);
            }
            var total: f32 = 0;
            for (scores[0..count]) |*score| {
                score.* = @exp(score.* - max_score);
                total += score.*;
            }
            @memset(lat_out, 0);
            for (0..count) |i| {
                const t = if (job.sparse) positions[i] else i;
                const row = cache.latent.get(table[t / cache.page_tokens], job.layer, 0, t % cache.page_tokens, widened);
                const p = scores[i] / total;
                for (lat_out, row[0..m.kv_lora_rank]) |*o, value| o.* += p * value;
            }
            for (out, 0..) |*o, j| o.* = dot(w_head[(m.nope_dim + j) * m.kv_lora_rank ..][0..m.kv_lora_rank], lat_out);
        }
    }
};

/// MLA layers' latents on the host: (pages, layers, page_tokens, kv_lora_rank + rope) in the
/// engine's KV dtype (core/kv_store.zig; one "head": the latent is shared by all heads).
pub const Cache = struct {
    page_tokens: usize,
    latent: core.KvStore,

    /// Values one position stores across the MLA layers.
    pub fn valuesPerToken(c: *const Config) usize {
        return c.countOf("attention", .mla) * c.mla.cacheWidth();
    }

    pub fn init(gpa: std.mem.Allocator, c: *const Config, dtype: core.KvDtype, pages: usize, page_tokens: usize) error{OutOfMemory}!Cache {
        const layers = c.countOf("attention", .mla);
        return .{ .page_tokens = page_tokens, .latent = try core.KvStore.init(gpa, dtype, pages, layers, 1, page_tokens, c.mla.cacheWidth()) };
    }

    pub fn deinit(cache: *Cache, gpa: std.mem.Allocator) void {
        cache.latent.deinit(gpa);
    }
};

pub const Scratch = struct {
    context_max: usize,
    q_latent: []f32, // (rows, q_lora_rank)
    q: []f32, // (rows, heads·qk_dim)
    kv: []f32, // (rows, kv_lora_rank + rope)
    attention: []f32, // (rows, heads·v_dim)
    scores: []f32, // (threads, context_max)
    absorbed: []f32, // (threads, 2·kv_lora_rank): q_lat and the weighted latent
    widened: []f32, // (threads, kv_lora_rank + rope): a cached position read back as f32
    cos_sin: []const f32,
    dsa: ?*dsa.Scratch,

    pub fn init(arena: std.mem.Allocator, c: *const Config, rows_max: usize, context_max: usize, cos_sin: []const f32, indexer: ?*dsa.Scratch) error{OutOfMemory}!Scratch {
        const m = c.mla;
        const threads = core.parallel.threadCount();
        return .{
            .context_max = context_max,
            .q_latent = try arena.alloc(f32, rows_max * m.q_lora_rank),
            .q = try arena.alloc(f32, rows_max * c.heads * m.qkDim()),
            .kv = try arena.alloc(f32, rows_max * m.cacheWidth()),
            .attention = try arena.alloc(f32, rows_max * c.heads * m.v_dim),
            .scores = try arena.alloc(f32, threads * context_max),
            .absorbed = try arena.alloc(f32, threads * 2 * m.kv_lora_rank),
            .widened = try arena.alloc(f32, threads * m.cacheWidth()),
            .cos_sin = cos_sin,
            .dsa = indexer,
        };
    }
};
