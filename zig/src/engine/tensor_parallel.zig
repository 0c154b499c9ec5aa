//! Tensor parallelism inside one process on the CPU backend: every rank's shard (families/glm/
//! shard.zig) runs in its own thread with its own KV cache (its KV heads only) and scratch, and the
//! ranks sum their partial outputs through a ThreadCollective. Rank 0 alone computes logits. The
//! page tables are the engine's: every rank places a position on the same page id.
const std = @import("std");
const core = @import("../core/root.zig");
const glm = @import("../families/glm/root.zig");
const dist = @import("../dist/root.zig");

const Diagnostic = core.Diagnostic;

pub const Error = glm.shard.Error;

pub const Limits = struct {
    world: usize,
    rows_max: usize,
    context_max: usize,
    pages: usize,
    page_tokens: usize,
    /// Sequence slots: each rank keeps its heads' part of every slot's recurrent (KDA) state.
    sequences: usize,
    kv_dtype: core.KvDtype,
};

const Rank = struct {
    weights: glm.Weights,
    cache: glm.cache.HostCache,
    scratch: glm.forward_cpu.Scratch,
};

pub const TensorParallel = struct {
    gpa: std.mem.Allocator,
    ranks: []Rank,
    collective: dist.ThreadCollective,

    pub fn init(gpa: std.mem.Allocator, full: *const glm.Weights, limits: Limits, diag: *Diagnostic) Error!*TensorParallel {
        std.debug.assert(limits.world >= 2 and limits.world <= dist.thread_collective.ranks_max);
        const group = try gpa.create(TensorParallel);
        errdefer gpa.destroy(group);
        group.gpa = gpa;
        group.ranks = try gpa.alloc(Rank, limits.world);
        errdefer gpa.free(group.ranks);
        var ready: usize = 0;
        errdefer for (group.ranks[0..ready]) |*rank| deinitRank(gpa, rank);
        for (group.ranks, 0..) |*rank, r| {
            rank.weights = try glm.shard.shard(gpa, full, limits.world, r, diag);
            errdefer rank.weights.deinit(gpa);
            const c = rank.weights.config;
            rank.cache = try glm.cache.HostCache.init(gpa, &c, limits.kv_dtype, limits.pages, limits.page_tokens, limits.sequences);
            errdefer rank.cache.deinit(gpa);
            rank.scratch = try glm.forward_cpu.Scratch.init(gpa, &rank.weights, limits.rows_max, limits.context_max);
            ready += 1;
        }
        group.collective = try dist.ThreadCollective.init(gpa, limits.world, limits.rows_max * full.config.hidden_size);
        return group;
    }

    pub fn deinit(group: *TensorParallel) void {
        const gpa = group.gpa;
        for (group.ranks) |*rank| deinitRank(gpa, rank);
        gpa.free(group.ranks);
        group.collective.deinit(gpa);
        gpa.destroy(group);
    }

    fn deinitRank(gpa: std.mem.Allocator, rank: *Rank) void {
        rank.scratch.deinit();
        rank.cache.deinit(gpa);
        rank.weights.deinit(gpa);
    }

    /// One forward over all ranks; `logits` as forward_cpu.forward.
    pub fn forward(group: *TensorParallel, batch: glm.forward_cpu.Batch, logits: []f32) void {
        var threads: [dist.thread_collective.ranks_max]?std.Thread = @splat(null);
        for (1..group.ranks.len) |r| {
            threads[r] = std.Thread.spawn(.{}, runRank, .{ group, r, batch, logits }) catch null;
            // Without a thread the ranks could not meet at the collective: run serially is not an
            // option, so a failed spawn is fatal to the step's correctness. Assert, never hang.
            std.debug.assert(threads[r] != null);
        }
        runRank(group, 0, batch, logits);
        for (threads[1..group.ranks.len]) |t| if (t) |thread| thread.join();
    }

    const ReduceContext = struct { group: *TensorParallel, rank: usize };

    fn sum(context: *anyopaque, values: []f32) void {
        const ctx: *ReduceContext = @ptrCast(@alignCast(context));
        ctx.group.collective.allReduceSum(ctx.rank, values);
    }

    fn runRank(group: *TensorParallel, r: usize, batch: glm.forward_cpu.Batch, logits: []f32) void {
        var context: ReduceContext = .{ .group = group, .rank = r };
        var local = batch;
        if (r != 0) local.logits_rows = &.{}; // rank 0 alone runs lm_head
        const rank = &group.ranks[r];
        glm.forward_cpu.forwardRank(&rank.weights, &rank.cache, local, &rank.scratch, if (r == 0) logits else &.{}, .{ .context = &context, .sum = sum });
    }
};
