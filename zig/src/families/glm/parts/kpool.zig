//! GLM-5.3-Flash's DSA indexer over pooled keys (transformers 5.17's Glm5NextTextIndexer): keys
//! k_t = LayerNorm(wk(x_t)) and gate scores a_t = compress_gate·x_t are kept per position (this
//! part's cache holds [k | a]); every `pool` consecutive positions from 0 form a pool whose key is
//! Σ_t softmax_t(a_t + ape_(t mod pool)) ⊙ k_t, per channel. A query scores each complete pool that
//! ends at or before it, I = Σ_h w_h·ReLU(q_h·key·head_dim^-0.5) with q = wq_b(q latent) and
//! w = weights_proj(x)·heads^-0.5 (no rope: the model is NoPE), keeps the best index_topk/pool
//! pools, and attends to their positions plus, with `pool_tail`, its own incomplete pool's.
//! Ties at the cut go to the earlier pool.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const Config = @import("../config.zig").Config;
const Linear = @import("../linear.zig").Linear;
const Batch = @import("../batch.zig").Batch;
const ops = @import("../ops.zig");
const dsa = @import("dsa.zig");
const dot = @import("../linear.zig").dot;

pub const Indexer = struct {
    /// wq_b, wk, weights_proj and k_norm, as the token-level indexer has them.
    keys: dsa.Indexer,
    /// (head_dim, hidden): the gate scores' projection.
    gate: []f32,
    /// (pool, head_dim): the gate's offset by place in the pool.
    ape: []f32,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8) loader_mod.Error!Indexer {
        const c = loader.config;
        const ix = c.indexer;
        var buffer: [256]u8 = undefined;
        const name = loader_mod.join;
        return .{
            .keys = try dsa.Indexer.load(loader, prefix),
            .gate = try loader.matrix(name(&buffer, prefix, "index_kpool_compress_gate"), ix.head_dim, c.hidden_size),
            .ape = try loader.matrix(name(&buffer, prefix, "index_kpool_compress_ape"), ix.pool, ix.head_dim),
        };
    }

    pub fn deinit(indexer: *Indexer, gpa: std.mem.Allocator) void {
        indexer.keys.deinit(gpa);
    }

    pub fn scratchLength(indexer: *const Indexer, rows: usize) usize {
        return indexer.keys.scratchLength(rows);
    }

    /// Every row's selection into `scratch.selected`/`counts`, as dsa.Indexer.select.
    pub fn select(indexer: *const Indexer, c: *const Config, layer: usize, cache: *dsa.Cache, batch: Batch, x: []const f32, q_latent: []const f32, scratch: *dsa.Scratch, linear_scratch: []f32) void {
        const ix = c.indexer;
        const rows = batch.rows();
        const d = ix.head_dim;
        const keys = scratch.keys[0 .. rows * d];
        const weights = scratch.weights[0 .. rows * ix.heads];
        const k = &indexer.keys;
        k.wq_b.forward(rows, q_latent, scratch.q[0 .. rows * ix.heads * d], linear_scratch);
        k.wk.forward(rows, x, keys, linear_scratch);
        k.weights_proj.forward(rows, x, weights, linear_scratch);
        const head_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(ix.heads))));
        for (weights) |*w| w.* *= head_scale;
        for (0..rows) |r| {
            const key = keys[r * d ..][0..d];
            ops.layerNorm(key, k.k_norm_weight, k.k_norm_bias, ix.eps, key);
            const position = batch.positions[r];
            const at = cache.offset(batch.page_tables[r][position / cache.page_tokens], layer, position % cache.page_tokens);
            const entry = cache.keys[at..][0 .. 2 * d];
            @memcpy(entry[0..d], key);
            const xr = x[r * c.hidden_size ..][0..c.hidden_size];
            for (entry[d..], 0..) |*a, j| a.* = dot(indexer.gate[j * c.hidden_size ..][0..c.hidden_size], xr);
        }
        const job: Job = .{ .config = c, .indexer = indexer, .layer = layer, .cache = cache, .batch = batch, .scratch = scratch };
        core.parallel.forRange(rows, 1, &job, Job.run);
    }
};

const Job = struct {
    config: *const Config,
    indexer: *const Indexer,
    layer: usize,
    cache: *const dsa.Cache,
    batch: Batch,
    scratch: *dsa.Scratch,

    fn run(job: *const Job, worker: usize, begin: usize, end: usize) void {
        const ix = job.config.indexer;
        const s = job.scratch;
        const d = ix.head_dim;
        const score_scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(d))));
        const scores = s.scores[worker * s.context_max ..][0..s.context_max];
        const order = s.order[worker * s.context_max ..][0..s.context_max];
        const pool_key = s.pool_key[worker * d ..][0..d];
        const keep = ix.topk / ix.pool;
        for (begin..end) |r| {
            const length = job.batch.positions[r] + 1;
            const pools = length / ix.pool;
            const weights = s.weights[r * ix.heads ..][0..ix.heads];
            for (0..pools) |p| {
                job.poolKey(r, p, pool_key);
                var total: f32 = 0;
                for (0..ix.heads) |h| {
                    const q = s.q[(r * ix.heads + h) * d ..][0..d];
                    total += weights[h] * @max(dot(q, pool_key) * score_scale, 0);
                }
                scores[p] = total;
                order[p] = @intCast(p);
            }
            const chosen = order[0..@min(pools, keep)];
            if (pools > keep) {
                std.sort.pdq(u32, order[0..pools], scores[0..pools], better);
                std.mem.sort(u32, chosen, {}, std.sort.asc(u32));
            }
            const selected = s.selected[r * s.stride ..][0..s.stride];
            var count: usize = 0;
            for (chosen) |p| {
                for (0..ix.pool) |i| selected[count + i] = @intCast(p * ix.pool + i);
                count += ix.pool;
            }
            if (ix.pool_tail) {
                for (pools * ix.pool..length) |t| {
                    selected[count] = @intCast(t);
                    count += 1;
                }
            }
            s.counts[r] = @intCast(count);
        }
    }

    /// Pool `p`'s key for row r's sequence: per channel, the softmax over the pool's positions of
    /// their gate scores plus the place offsets, weighting their keys.
    fn poolKey(job: *const Job, r: usize, p: usize, out: []f32) void {
        const ix = job.config.indexer;
        const d = ix.head_dim;
        const cache = job.cache;
        const table = job.batch.page_tables[r];
        var entries: [pool_max][]const f32 = undefined;
        for (0..ix.pool) |i| {
            const t = p * ix.pool + i;
            entries[i] = cache.keys[cache.offset(table[t / cache.page_tokens], job.layer, t % cache.page_tokens)..][0 .. 2 * d];
        }
        for (0..d) |j| {
            var max: f32 = -std.math.inf(f32);
            var logits: [pool_max]f32 = undefined;
            for (0..ix.pool) |i| {
                logits[i] = entries[i][d + j] + job.indexer.ape[i * d + j];
                max = @max(max, logits[i]);
            }
            var total: f32 = 0;
            for (logits[0..ix.pool]) |*l| {
                l.* = @exp(l.* - max);
                total += l.*;
            }
            var sum: f32 = 0;
            for (0..ix.pool) |i| sum += logits[i] / total * entries[i][j];
            out[j] = sum;
        }
    }

    fn better(scores: []const f32, a: u32, b: u32) bool {
        if (scores[a] != scores[b]) return scores[a] > scores[b];
        return a < b;
    }
};

pub const pool_max = 256;
