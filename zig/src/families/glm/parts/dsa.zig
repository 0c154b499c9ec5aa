//! The DSA lightning indexer (GLM.md §3.6, transformers' GlmMoeDsaIndexer): per query row, a score
//! for every earlier position of its sequence, I[s] = Σ_h w_h · ReLU(q_h · k_s · head_dim^-0.5), and
//! the `index_topk` best positions, which the layer's MLA attention then attends to alone (all of
//! them while the context is no longer than index_topk). q_h = wq_b(q latent), interleaved RoPE on
//! its first rope dims; k = LayerNorm(wk(x)) likewise, one per position, kept in this part's cache;
//! w = weights_proj(x) · heads^-0.5. A "shared" layer has no indexer and reuses the selection of
//! the last full layer of the same forward. Ties at the cut go to the earlier position.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const Config = @import("../config.zig").Config;
const Linear = @import("../linear.zig").Linear;
const Batch = @import("../batch.zig").Batch;
const rope = @import("../rope.zig");
const ops = @import("../ops.zig");
const dot = @import("../linear.zig").dot;

pub const Indexer = struct {
    wq_b: Linear,
    wk: Linear,
    weights_proj: Linear,
    k_norm_weight: []f32,
    k_norm_bias: []f32,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8) loader_mod.Error!Indexer {
        const c = loader.config;
        const ix = c.indexer;
        var buffer: [256]u8 = undefined;
        const name = loader_mod.join;
        return .{
            .wq_b = try loader.linear(name(&buffer, prefix, "wq_b"), c.mla.q_lora_rank, ix.heads * ix.head_dim, .none),
            .wk = try loader.linear(name(&buffer, prefix, "wk"), c.hidden_size, ix.head_dim, .none),
            .weights_proj = try loader.linear(name(&buffer, prefix, "weights_proj"), c.hidden_size, ix.heads, .none),
            .k_norm_weight = try loader.vector(name(&buffer, prefix, "k_norm.weight"), ix.head_dim),
            .k_norm_bias = try loader.vector(name(&buffer, prefix, "k_norm.bias"), ix.head_dim),
        };
    }

    pub fn deinit(indexer: *Indexer, gpa: std.mem.Allocator) void {
        for ([_]*Linear{ &indexer.wq_b, &indexer.wk, &indexer.weights_proj }) |linear| linear.deinit(gpa);
    }

    pub fn scratchLength(indexer: *const Indexer, rows: usize) usize {
        return @max(indexer.wq_b.scratchLength(rows), indexer.wk.scratchLength(rows), indexer.weights_proj.scratchLength(rows));
    }

    /// Every row's selection into `scratch.selected`/`counts`: x is the layer's normed input,
    /// q_latent its normed q latent (rows, q_lora_rank); `layer` is its index among full indexers.
    pub fn select(indexer: *const Indexer, c: *const Config, layer: usize, cache: *Cache, batch: Batch, x: []const f32, q_latent: []const f32, scratch: *Scratch, linear_scratch: []f32) void {
        const ix = c.indexer;
        const rows = batch.rows();
        const q = scratch.q[0 .. rows * ix.heads * ix.head_dim];
        const keys = scratch.keys[0 .. rows * ix.head_dim];
        const weights = scratch.weights[0 .. rows * ix.heads];
        indexer.wq_b.forward(rows, q_latent, q, linear_scratch);
        indexer.wk.forward(rows, x, keys, linear_scratch);
        indexer.weights_proj.forward(rows, x, weights, linear_scratch);
        const head_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(ix.heads))));
        for (weights) |*w| w.* *= head_scale;
        for (0..rows) |r| {
            const cos_sin = scratch.cos_sin[r * ix.rope_dim ..][0..ix.rope_dim];
            for (0..ix.heads) |h| rope.apply(.interleaved, q[(r * ix.heads + h) * ix.head_dim ..][0..ix.rope_dim], cos_sin);
            const key = keys[r * ix.head_dim ..][0..ix.head_dim];
            ops.layerNorm(key, indexer.k_norm_weight, indexer.k_norm_bias, ix.eps, key);
            rope.apply(.interleaved, key[0..ix.rope_dim], cos_sin);
            const position = batch.positions[r];
            const at = cache.offset(batch.page_tables[r][position / cache.page_tokens], layer, position % cache.page_tokens);
            @memcpy(cache.keys[at..][0..ix.head_dim], key);
        }
        const job: Job = .{ .config = c, .layer = layer, .cache = cache, .batch = batch, .scratch = scratch };
        core.parallel.forRange(rows, 1, &job, Job.run);
    }
};

const Job = struct {
    config: *const Config,
    layer: usize,
    cache: *const Cache,
    batch: Batch,
    scratch: *Scratch,

    fn run(job: *const Job, worker: usize, begin: usize, end: usize) void {
        const ix = job.config.indexer;
        const cache = job.cache;
        const s = job.scratch;
        const score_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(ix.head_dim))));
        const scores = s.scores[worker * s.context_max ..][0..s.context_max];
        const order = s.order[worker * s.context_max ..][0..s.context_max];
        for (begin..end) |r| {
            const length = job.batch.positions[r] + 1;
            const selected = s.selected[r * s.stride ..][0..ix.topk];
            if (length <= ix.topk) {
                for (selected[0..length], 0..) |*p, t| p.* = @intCast(t);
                s.counts[r] = @intCast(length);
                continue;
            }
            const table = job.batch.page_tables[r];
            const weights = s.weights[r * ix.heads ..][0..ix.heads];
            for (0..length) |t| {
                const key = cache.keys[cache.offset(table[t / cache.page_tokens], job.layer, t % cache.page_tokens)..][0..ix.head_dim];
                var total: f32 = 0;
                for (0..ix.heads) |h| {
                    const q = s.q[(r * ix.heads + h) * ix.head_dim ..][0..ix.head_dim];
                    total += weights[h] * @max(dot(q, key) * score_scale, 0);
                }
                scores[t] = total;
                order[t] = @intCast(t);
            }
            std.sort.pdq(u32, order[0..length], scores[0..length], better);
            @memcpy(selected, order[0..ix.topk]);
            std.mem.sort(u32, selected, {}, std.sort.asc(u32));
            s.counts[r] = @intCast(ix.topk);
        }
    }

    fn better(scores: []const f32, a: u32, b: u32) bool {
        if (scores[a] != scores[b]) return scores[a] > scores[b];
        return a < b;
    }
};

/// The indexer keys of full-indexer layers on the host: (pages, layers, page_tokens, width), width
/// head_dim, or 2·head_dim for pooled indexers (kpool.zig: key, then gate scores).
pub const Cache = struct {
    layers: usize,
    width: usize,
    page_tokens: usize,
    pages: usize,
    keys: []f32,

    pub fn widthOf(c: *const Config) usize {
        return c.indexer.head_dim * @as(usize, if (c.indexer.pool > 0) 2 else 1);
    }

    pub fn floatsPerToken(c: *const Config) usize {
        return c.countOf("indexer", .full) * widthOf(c);
    }

    pub fn init(gpa: std.mem.Allocator, c: *const Config, pages: usize, page_tokens: usize) error{OutOfMemory}!Cache {
        const layers = c.countOf("indexer", .full);
        const width = widthOf(c);
        return .{ .layers = layers, .width = width, .page_tokens = page_tokens, .pages = pages, .keys = try gpa.alloc(f32, pages * layers * page_tokens * width) };
    }

    pub fn deinit(cache: *Cache, gpa: std.mem.Allocator) void {
        gpa.free(cache.keys);
    }

    pub fn offset(cache: *const Cache, page: u32, layer: usize, slot: usize) usize {
        std.debug.assert(page < cache.pages and layer < cache.layers and slot < cache.page_tokens);
        return ((@as(usize, page) * cache.layers + layer) * cache.page_tokens + slot) * cache.width;
    }
};

pub const Scratch = struct {
    context_max: usize,
    q: []f32, // (rows, heads·head_dim)
    keys: []f32, // (rows, head_dim)
    weights: []f32, // (rows, heads)
    scores: []f32, // (threads, context_max)
    order: []u32, // (threads, context_max)
    /// Each row's selected positions, ascending (rows, stride), and how many: filled by the last
    /// full layer, read by it and the shared layers after it.
    selected: []u32,
    counts: []u32,
    stride: usize,
    pool_key: []f32, // (threads, head_dim)
    cos_sin: []const f32,

    pub fn init(arena: std.mem.Allocator, c: *const Config, rows_max: usize, context_max: usize, cos_sin: []const f32) error{OutOfMemory}!Scratch {
        const ix = c.indexer;
        const threads = core.parallel.threadCount();
        return .{
            .context_max = context_max,
            .q = try arena.alloc(f32, rows_max * ix.heads * ix.head_dim),
            .keys = try arena.alloc(f32, rows_max * ix.head_dim),
            .weights = try arena.alloc(f32, rows_max * ix.heads),
            .scores = try arena.alloc(f32, threads * context_max),
            .order = try arena.alloc(u32, threads * context_max),
            .selected = try arena.alloc(u32, rows_max * ix.selectionMax()),
            .counts = try arena.alloc(u32, rows_max),
            .stride = ix.selectionMax(),
            .pool_key = try arena.alloc(f32, threads * ix.head_dim),
            .cos_sin = cos_sin,
        };
    }

    /// Row r's positions to attend to.
    pub fn positions(scratch: *const Scratch, r: usize) []const u32 {
        return scratch.selected[r * scratch.stride ..][0..scratch.counts[r]];
    }
};
