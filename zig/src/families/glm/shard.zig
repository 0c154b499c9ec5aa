//! The tensor-parallel plan (GLM.md §6, EXL3.md §13), as one rank's `Weights`:
//! - GQA: q/k/v split by heads and KV heads (column-parallel), o_proj by the same heads (row-parallel);
//! - MLA: q_a and kv_a (the latents) replicated, so every rank caches the whole latent; q_b (or
//!   q_proj) and kv_b split by heads, o_proj by the same heads; the DSA indexer replicated, so every
//!   rank selects the same positions;
//! - the dense MLP, every routed expert and the shared expert split along their intermediate width
//!   in 128-channel units (gate/up by columns, down by rows), unevenly when the units are odd
//!   (GLM-4.5-Air's 1408 = 11 units: 768 + 640);
//! - norms, router, correction bias replicated; row-parallel biases on rank 0 only.
//! - Embedding replicated: every rank embeds its own tokens without a collective. lm_head whole on
//!   rank 0, which alone runs it, so the logits need no gather (against a per-step all-gather of
//!   151552 logits per row over the link); the other ranks keep only its shape, released
//!   (Linear.release): a copy there was ~0.6 GB of GLM-4.5's 6-bit lm_head per node, host and
//!   device, never read.
//! The partial outputs of o_proj and of the whole FFN are summed across ranks (two all-reduces per
//! layer), which is exact because the output Hadamard and svh are linear.
const std = @import("std");
const core = @import("../../core/root.zig");
const exl3 = @import("../../exl3/root.zig");
const weights_mod = @import("weights.zig");
const Mlp = @import("parts/mlp.zig").Mlp;
const Mla = @import("parts/mla.zig").Mla;
const Kda = @import("parts/kda.zig").Kda;
const dsa = @import("parts/dsa.zig");
const Linear = @import("linear.zig").Linear;
const Config = @import("config.zig").Config;
const Diagnostic = core.Diagnostic;
const Range = exl3.slice.Range;

pub const Error = error{ OutOfMemory, UnsupportedModel };

/// Rank `rank`'s weights. Norms, router and embedding are views into `full`, which must outlive it.
pub fn shard(gpa: std.mem.Allocator, full: *const weights_mod.Weights, world: usize, rank: usize, diag: *Diagnostic) Error!weights_mod.Weights {
    const c = full.config;
    if (c.kda.heads % world != 0) {
        diag.set("tensor parallelism {d} needs the {d} KDA heads to divide evenly", .{ world, c.kda.heads });
        return error.UnsupportedModel;
    }
    if (c.heads % world != 0 or c.kv_heads % world != 0) {
        diag.set("tensor parallelism {d} needs the {d} attention heads and {d} KV heads to divide evenly", .{ world, c.heads, c.kv_heads });
        return error.UnsupportedModel;
    }
    const q_range = headRange(c.heads, c.head_dim, world, rank);
    const kv_range = headRange(c.kv_heads, c.head_dim, world, rank);
    const v_range = headRange(c.heads, c.mla.v_dim, world, rank);
    const aligned = for ([_]Range{ q_range, kv_range, v_range }) |range| {
        if (range.begin % 128 != 0 or range.end % 128 != 0) break false;
    } else true;
    const attention_exl3 = for (full.blocks) |block| switch (block.attention) {
        .gqa => |*a| if (a.q.kind == .exl3 or a.k.kind == .exl3 or a.o.kind == .exl3) break true,
        .mla => |*a| if (a.o.kind == .exl3 or a.kv_b.kind == .exl3 or (a.q_b orelse a.q.?).kind == .exl3) break true,
        .kda => {}, // its heads are 128 wide: whole EXL3 units (checked in shardKda)
    } else false;
    if (attention_exl3 and !aligned) {
        diag.set("tensor parallelism {d} would cut a 128-channel EXL3 block: {d} heads of {d} dims per rank", .{ world, c.heads / world, c.head_dim });
        return error.UnsupportedModel;
    }
    var result: weights_mod.Weights = undefined;
    result.arena = std.heap.ArenaAllocator.init(gpa);
    errdefer result.arena.deinit();
    const arena = result.arena.allocator();
    var cleanup: Cleanup = .{ .gpa = gpa };
    errdefer cleanup.run();

    result.config = c;
    result.config.heads = c.heads / world;
    result.config.kv_heads = c.kv_heads / world;
    result.config.intermediate_size = exl3.slice.unitRange(c.intermediate_size, world, rank).len();
    result.config.moe_intermediate_size = exl3.slice.unitRange(c.moe_intermediate_size, world, rank).len();
    result.config.kda.heads = c.kda.heads / world;
    result.embedding = full.embedding;
    result.norm = full.norm;
    result.lm_head = if (rank == 0) try cleanup.keep(try copyLinear(gpa, &full.lm_head)) else Linear.releasedShape(full.lm_head.in_features, full.lm_head.out_features);
    result.blocks = try arena.alloc(weights_mod.Block, full.blocks.len);
    const first = rank == 0;
    for (full.blocks, result.blocks) |*source, *target| {
        target.* = .{
            .input_norm = source.input_norm,
            .post_attention_norm = source.post_attention_norm,
            .attention = switch (source.attention) {
                .gqa => |*a| .{ .gqa = .{
                    .q = try cleanup.keep(try sliceLinear(gpa, &a.q, .columns, q_range, true)),
                    .k = try cleanup.keep(try sliceLinear(gpa, &a.k, .columns, kv_range, true)),
                    .v = try cleanup.keep(try sliceLinear(gpa, &a.v, .columns, kv_range, true)),
                    .o = try cleanup.keep(try sliceLinear(gpa, &a.o, .rows, q_range, first)),
                    .q_norm = a.q_norm,
                    .k_norm = a.k_norm,
                } },
                .mla => |*a| .{ .mla = try shardMla(&cleanup, c, a, world, rank) },
                .kda => |*a| .{ .kda = try shardKda(&cleanup, arena, c, a, world, rank, diag) },
            },
            .hyper = source.hyper,
            .ffn = switch (source.ffn) {
                .dense => |*mlp| .{ .dense = try shardMlp(&cleanup, mlp, world, rank) },
                .moe => |*moe| blk: {
                    const experts = try arena.alloc(Mlp, moe.experts.len);
                    for (moe.experts, experts) |*e, *t| t.* = try shardMlp(&cleanup, e, world, rank);
                    break :blk .{ .moe = .{
                        .router = moe.router,
                        .correction_bias = moe.correction_bias,
                        .experts = experts,
                        .shared = if (moe.shared) |*s| try shardMlp(&cleanup, s, world, rank) else null,
                    } };
                },
            },
        };
    }
    cleanup.linears.deinit(gpa);
    return result;
}

/// Frees every Linear made so far when a later step of the shard fails.
const Cleanup = struct {
    gpa: std.mem.Allocator,
    linears: std.ArrayList(Linear) = .empty,

    fn keep(cleanup: *Cleanup, linear: Linear) Error!Linear {
        var copy = linear;
        cleanup.linears.append(cleanup.gpa, linear) catch |err| {
            copy.deinit(cleanup.gpa);
            return err;
        };
        return linear;
    }

    fn run(cleanup: *Cleanup) void {
        for (cleanup.linears.items) |*linear| linear.deinit(cleanup.gpa);
        cleanup.linears.deinit(cleanup.gpa);
    }
};

fn headRange(heads: usize, head_dim: usize, world: usize, rank: usize) Range {
    const per_rank = heads / world * head_dim;
    return .{ .begin = rank * per_rank, .end = (rank + 1) * per_rank };
}

/// One rank's MLA: its heads of q_b (or q_proj), kv_b and o_proj; the latent projections and the
/// indexer whole.
fn shardMla(cleanup: *Cleanup, c: Config, a: *const Mla, world: usize, rank: usize) Error!Mla {
    const m = c.mla;
    const gpa = cleanup.gpa;
    const q_range = headRange(c.heads, m.qkDim(), world, rank);
    const kv_b_range = headRange(c.heads, m.nope_dim + m.v_dim, world, rank);
    const o_range = headRange(c.heads, m.v_dim, world, rank);
    return .{
        .q_a = if (a.q_a) |*l| try cleanup.keep(try copyLinear(gpa, l)) else null,
        .q_a_norm = a.q_a_norm,
        .q_b = if (a.q_b) |*l| try cleanup.keep(try sliceLinear(gpa, l, .columns, q_range, true)) else null,
        .q = if (a.q) |*l| try cleanup.keep(try sliceLinear(gpa, l, .columns, q_range, true)) else null,
        .kv_a = try cleanup.keep(try copyLinear(gpa, &a.kv_a)),
        .kv_a_norm = a.kv_a_norm,
        .kv_b = try cleanup.keep(try sliceLinear(gpa, &a.kv_b, .columns, kv_b_range, true)),
        .o = try cleanup.keep(try sliceLinear(gpa, &a.o, .rows, o_range, rank == 0)),
        .indexer = if (a.indexer) |*ix| try copyIndexer(cleanup, ix) else null,
        .pooled = if (a.pooled) |*ix| .{ .keys = try copyIndexer(cleanup, &ix.keys), .gate = ix.gate, .ape = ix.ape } else null,
    };
}

/// The DSA indexer whole on every rank (its heads are not the attention's).
fn copyIndexer(cleanup: *Cleanup, ix: *const dsa.Indexer) Error!dsa.Indexer {
    const gpa = cleanup.gpa;
    return .{
        .wq_b = try cleanup.keep(try copyLinear(gpa, &ix.wq_b)),
        .wk = try cleanup.keep(try copyLinear(gpa, &ix.wk)),
        .weights_proj = try cleanup.keep(try copyLinear(gpa, &ix.weights_proj)),
        .k_norm_weight = ix.k_norm_weight,
        .k_norm_bias = ix.k_norm_bias,
    };
}

/// One rank's KDA: its heads of q, k and v (the fused projection taken apart into three column
/// slices), of the convolution's channels, the gates' second projections, dt_bias, A_log and b;
/// the gates' first projections whole; o_proj's rows of its heads. Its state is its heads'.
fn shardKda(cleanup: *Cleanup, arena: std.mem.Allocator, c: Config, a: *const Kda, world: usize, rank: usize, diag: *Diagnostic) Error!Kda {
    const k = c.kda;
    const gpa = cleanup.gpa;
    const width = k.width();
    const range = headRange(k.heads, k.head_dim, world, rank);
    if (range.begin % 128 != 0 or range.end % 128 != 0) {
        diag.set("tensor parallelism {d} would cut a 128-channel EXL3 block of KDA's q/k/v", .{world});
        return error.UnsupportedModel;
    }
    // A fused [q | k | v] stays one projection of this rank's heads of each part (the CUDA
    // backend runs an EXL3 qkv fused only).
    const qkv: @FieldType(Kda, "qkv") = switch (a.qkv) {
        .fused => |*l| blk: {
            var parts: [3]Range = undefined;
            for (&parts, 0..) |*part, i| part.* = .{ .begin = i * width + range.begin, .end = i * width + range.end };
            break :blk .{ .fused = try cleanup.keep(try sliceColumns(gpa, l, &parts)) };
        },
        .split => |*ls| blk: {
            var split: [3]Linear = undefined;
            for (&split, ls) |*part, *l| part.* = try cleanup.keep(try sliceLinear(gpa, l, .columns, range, true));
            break :blk .{ .split = split };
        },
    };
    const taps = k.conv_kernel;
    const conv = try arena.alloc(f32, 3 * range.len() * taps);
    for (0..3) |i| @memcpy(conv[i * range.len() * taps ..][0 .. range.len() * taps], a.conv[(i * width + range.begin) * taps ..][0 .. range.len() * taps]);
    const heads = headRange(k.heads, 1, world, rank);
    return .{
        .qkv = qkv,
        .conv = conv,
        .f_a = try cleanup.keep(try copyLinear(gpa, &a.f_a)),
        .f_b = try cleanup.keep(try sliceLinear(gpa, &a.f_b, .columns, range, true)),
        .dt_bias = a.dt_bias[range.begin..range.end],
        .a_log = a.a_log[heads.begin..heads.end],
        .b = try cleanup.keep(try sliceLinear(gpa, &a.b, .columns, heads, true)),
        .g_a = try cleanup.keep(try copyLinear(gpa, &a.g_a)),
        .g_b = try cleanup.keep(try sliceLinear(gpa, &a.g_b, .columns, range, true)),
        .o_norm = a.o_norm,
        .o = try cleanup.keep(try sliceLinear(gpa, &a.o, .rows, range, rank == 0)),
    };
}

fn shardMlp(cleanup: *Cleanup, mlp: *const Mlp, world: usize, rank: usize) Error!Mlp {
    const range = exl3.slice.unitRange(mlp.gate.out_features, world, rank);
    return .{
        .gate = try cleanup.keep(try sliceLinear(cleanup.gpa, &mlp.gate, .columns, range, true)),
        .up = try cleanup.keep(try sliceLinear(cleanup.gpa, &mlp.up, .columns, range, true)),
        .down = try cleanup.keep(try sliceLinear(cleanup.gpa, &mlp.down, .rows, range, rank == 0)),
        .limit = mlp.limit,
    };
}

/// The logical (unpadded) part of `range` within `size` features.
fn logical(range: Range, size: usize) usize {
    return @min(range.end, size) -| range.begin;
}

fn sliceLinear(gpa: std.mem.Allocator, linear: *const Linear, axis: exl3.slice.Axis, range: Range, keep_bias: bool) Error!Linear {
    const in_features = if (axis == .rows) logical(range, linear.in_features) else linear.in_features;
    const out_features = if (axis == .columns) logical(range, linear.out_features) else linear.out_features;
    switch (linear.kind) {
        .exl3 => |*layer| return .{ .in_features = in_features, .out_features = out_features, .kind = .{ .exl3 = try exl3.slice.slice(gpa, layer, axis, range, keep_bias) } },
        .dense => |dense| {
            const weight = try gpa.alloc(f32, out_features * in_features);
            errdefer gpa.free(weight);
            const row_offset = if (axis == .columns) range.begin else 0;
            const column_offset = if (axis == .rows) range.begin else 0;
            for (0..out_features) |o| {
                @memcpy(weight[o * in_features ..][0..in_features], dense.weight[(row_offset + o) * linear.in_features + column_offset ..][0..in_features]);
            }
            var bias: ?[]f32 = null;
            if (dense.bias) |source| {
                if (axis == .columns or keep_bias) bias = try gpa.dupe(f32, source[row_offset..][0..out_features]);
            }
            return .{ .in_features = in_features, .out_features = out_features, .kind = .{ .dense = .{ .weight = weight, .bias = bias } } };
        },
    }
}

/// The output channels of `ranges`, in whole 128-channel units, side by side in one linear.
fn sliceColumns(gpa: std.mem.Allocator, linear: *const Linear, ranges: []const Range) Error!Linear {
    var out_features: usize = 0;
    for (ranges) |range| out_features += logical(range, linear.out_features);
    switch (linear.kind) {
        .exl3 => |*layer| return .{ .in_features = linear.in_features, .out_features = out_features, .kind = .{ .exl3 = try exl3.slice.sliceRanges(gpa, layer, .columns, ranges, true) } },
        .dense => |dense| {
            const in = linear.in_features;
            const weight = try gpa.alloc(f32, out_features * in);
            errdefer gpa.free(weight);
            const bias = if (dense.bias != null) try gpa.alloc(f32, out_features) else null;
            var at: usize = 0;
            for (ranges) |range| {
                const n = logical(range, linear.out_features);
                @memcpy(weight[at * in ..][0 .. n * in], dense.weight[range.begin * in ..][0 .. n * in]);
                if (bias) |b| @memcpy(b[at..][0..n], dense.bias.?[range.begin..][0..n]);
                at += n;
            }
            return .{ .in_features = in, .out_features = out_features, .kind = .{ .dense = .{ .weight = weight, .bias = bias } } };
        },
    }
}

fn copyLinear(gpa: std.mem.Allocator, linear: *const Linear) Error!Linear {
    return switch (linear.kind) {
        .exl3 => |*layer| .{
            .in_features = linear.in_features,
            .out_features = linear.out_features,
            .kind = .{ .exl3 = try exl3.slice.slice(gpa, layer, .columns, .{ .begin = 0, .end = layer.columns }, true) },
        },
        .dense => |dense| .{
            .in_features = linear.in_features,
            .out_features = linear.out_features,
            .kind = .{ .dense = .{ .weight = try gpa.dupe(f32, dense.weight), .bias = if (dense.bias) |b| try gpa.dupe(f32, b) else null } },
        },
    };
}
