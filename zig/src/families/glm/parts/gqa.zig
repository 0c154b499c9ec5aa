//! Grouped-query attention, class A (GLM.md §3.3): q/k/v projections with optional biases and
//! per-head q/k RMSNorm, partial rotate-half RoPE, softmax over the row's own sequence in f32, o_proj.
//! Its cache: per layer, the rotated key and the value of every KV head at every position.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const Config = @import("../config.zig").Config;
const Linear = @import("../linear.zig").Linear;
const Batch = @import("../batch.zig").Batch;
const rope = @import("../rope.zig");
const ops = @import("../ops.zig");
const dot = @import("../linear.zig").dot;
const KvStore = core.KvStore;
const KvDtype = core.KvDtype;

pub const Gqa = struct {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: ?[]f32,
    k_norm: ?[]f32,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8) loader_mod.Error!Gqa {
        const c = loader.config;
        var buffer: [256]u8 = undefined;
        const bias: loader_mod.Bias = if (c.attention_bias) .required else .none;
        const name = loader_mod.join;
        return .{
            .q = try loader.linear(name(&buffer, prefix, "q_proj"), c.hidden_size, c.heads * c.head_dim, bias),
            .k = try loader.linear(name(&buffer, prefix, "k_proj"), c.hidden_size, c.kv_heads * c.head_dim, bias),
            .v = try loader.linear(name(&buffer, prefix, "v_proj"), c.hidden_size, c.kv_heads * c.head_dim, bias),
            .o = try loader.linear(name(&buffer, prefix, "o_proj"), c.heads * c.head_dim, c.hidden_size, .none),
            .q_norm = if (c.qk_norm) try loader.vector(name(&buffer, prefix, "q_norm.weight"), c.head_dim) else null,
            .k_norm = if (c.qk_norm) try loader.vector(name(&buffer, prefix, "k_norm.weight"), c.head_dim) else null,
        };
    }

    pub fn deinit(gqa: *Gqa, gpa: std.mem.Allocator) void {
        for ([_]*Linear{ &gqa.q, &gqa.k, &gqa.v, &gqa.o }) |linear| linear.deinit(gpa);
    }

    pub fn scratchLength(gqa: *const Gqa, rows: usize) usize {
        var length: usize = 0;
        for ([_]*const Linear{ &gqa.q, &gqa.k, &gqa.v, &gqa.o }) |linear| length = @max(length, linear.scratchLength(rows));
        return length;
    }

    /// out = o_proj(attention(x)) for the batch's rows; their keys and values go into `cache` at
    /// `layer` (this layer's index among the GQA layers) first.
    pub fn forward(gqa: *const Gqa, c: *const Config, layer: usize, cache: *Cache, batch: Batch, x: []const f32, out: []f32, scratch: *Scratch, linear_scratch: []f32) void {
        const rows = batch.rows();
        const q = scratch.q[0 .. rows * c.heads * c.head_dim];
        const k = scratch.k[0 .. rows * c.kv_heads * c.head_dim];
        const v = scratch.v[0 .. rows * c.kv_heads * c.head_dim];
        gqa.q.forward(rows, x, q, linear_scratch);
        gqa.k.forward(rows, x, k, linear_scratch);
        gqa.v.forward(rows, x, v, linear_scratch);
        for (0..rows) |r| {
            const cos_sin = scratch.cos_sin[r * c.rotary_dim ..][0..c.rotary_dim];
            for (0..c.heads) |h| {
                const head = q[(r * c.heads + h) * c.head_dim ..][0..c.head_dim];
                if (gqa.q_norm) |w| ops.rmsNorm(head, w, c.rms_norm_eps, head);
                rope.apply(c.rope.style, head[0..c.rotary_dim], cos_sin);
            }
            const position = batch.positions[r];
            const page = batch.page_tables[r][position / cache.page_tokens];
            const slot = position % cache.page_tokens;
            for (0..c.kv_heads) |h| {
                const key = k[(r * c.kv_heads + h) * c.head_dim ..][0..c.head_dim];
                if (gqa.k_norm) |w| ops.rmsNorm(key, w, c.rms_norm_eps, key);
                rope.apply(c.rope.style, key[0..c.rotary_dim], cos_sin);
                cache.keys.put(page, layer, h, slot, key);
                cache.values.put(page, layer, h, slot, v[(r * c.kv_heads + h) * c.head_dim ..][0..c.head_dim]);
            }
        }
        const job: Job = .{ .config = c, .layer = layer, .cache = cache, .batch = batch, .scratch = scratch };
        core.parallel.forRange(rows * c.heads, 1, &job, Job.run);
        gqa.o.forward(rows, scratch.attention[0 .. rows * c.heads * c.head_dim], out, linear_scratch);
    }
};

const Job = struct {
    config: *const Config,
    layer: usize,
    cache: *const Cache,
    batch: Batch,
    scratch: *Scratch,

    /// Items are (row, head) pairs. softmax(q·kᵀ / sqrt(head_dim)) · v over positions 0..pos of
    /// the row's own sequence (causal), in f32, summed in position order.
    fn run(job: *const Job, worker: usize, begin: usize, end: usize) void {
        const c = job.config;
        const cache = job.cache;
        const page_tokens = cache.page_tokens;
        const group = c.heads / c.kv_heads;
        const scale = c.attention_scale;
        const scores = job.scratch.scores[worker * job.scratch.context_max ..][0..job.scratch.context_max];
        const widened = job.scratch.widened[worker * c.head_dim ..][0..c.head_dim];
        for (begin..end) |item| {
            const r = item / c.heads;
            const h = item % c.heads;
            const kv_head = h / group;
            const query = job.scratch.q[(r * c.heads + h) * c.head_dim ..][0..c.head_dim];
            const length = job.batch.positions[r] + 1;
            const table = job.batch.page_tables[r];
            var max_score: f32 = -std.math.inf(f32);
            for (0..length) |t| {
                scores[t] = dot(query, cache.keys.get(table[t / page_tokens], job.layer, kv_head, t % page_tokens, widened)) * scale;
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
                const p = scores[t] / total;
                for (out, cache.values.get(table[t / page_tokens], job.layer, kv_head, t % page_tokens, widened)) |*o, value| o.* += p * value;
            }
        }
    }
};

/// GQA layers' keys and values on the host: (pages, layers, kv_heads, page_tokens, head_dim) each
/// in the engine's KV dtype (core/kv_store.zig), the layout the CUDA kernels use for their device
/// copy.
pub const Cache = struct {
    page_tokens: usize,
    keys: KvStore,
    values: KvStore,

    /// Values one position stores across the GQA layers (keys and values).
    pub fn valuesPerToken(c: *const Config) usize {
        return 2 * c.countOf("attention", .gqa) * c.kv_heads * c.head_dim;
    }

    pub fn init(gpa: std.mem.Allocator, c: *const Config, dtype: KvDtype, pages: usize, page_tokens: usize) error{OutOfMemory}!Cache {
        const layers = c.countOf("attention", .gqa);
        var keys = try KvStore.init(gpa, dtype, pages, layers, c.kv_heads, page_tokens, c.head_dim);
        errdefer keys.deinit(gpa);
        return .{ .page_tokens = page_tokens, .keys = keys, .values = try KvStore.init(gpa, dtype, pages, layers, c.kv_heads, page_tokens, c.head_dim) };
    }

    pub fn deinit(cache: *Cache, gpa: std.mem.Allocator) void {
        cache.keys.deinit(gpa);
        cache.values.deinit(gpa);
    }
};

pub const Scratch = struct {
    context_max: usize,
    q: []f32, // (rows, heads·head_dim)
    k: []f32, // (rows, kv_heads·head_dim)
    v: []f32,
    attention: []f32, // (rows, heads·head_dim)
    scores: []f32, // (threads, context_max)
    widened: []f32, // (threads, head_dim): a cached position read back as f32
    /// The composer's per-row cos/sin of the model's RoPE (not owned).
    cos_sin: []const f32,

    pub fn init(arena: std.mem.Allocator, c: *const Config, rows_max: usize, context_max: usize, cos_sin: []const f32) error{OutOfMemory}!Scratch {
        return .{
            .context_max = context_max,
            .q = try arena.alloc(f32, rows_max * c.heads * c.head_dim),
            .k = try arena.alloc(f32, rows_max * c.kv_heads * c.head_dim),
            .v = try arena.alloc(f32, rows_max * c.kv_heads * c.head_dim),
            .attention = try arena.alloc(f32, rows_max * c.heads * c.head_dim),
            .scores = try arena.alloc(f32, core.parallel.threadCount() * context_max),
            .widened = try arena.alloc(f32, core.parallel.threadCount() * c.head_dim),
            .cos_sin = cos_sin,
        };
    }
};
