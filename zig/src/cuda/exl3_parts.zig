//! The host half of glm_forward.cu's tf_exl3_parts_linear: up to parts_max EXL3 linears on the same
//! input rows in one GEMV launch (q with k and v, q_a with kv_a), each part run as its own launch
//! would run it (its width, its k split, its own partial sums and counters), so that every output
//! keeps that launch's bits. A decode row's small projections were a launch each, ~8 us of fixed
//! cost apiece against 1-3 us of weights (the step timeline, docs/measurements.md).
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const glm = @import("glm_kernels.zig");
const gemv_splits = @import("gemv_splits.zig");
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const parts_max = 3;
/// The rows one launch takes: up to 3 a block a row (the item path's); with rows together, 2 to 4
/// in one block a place (tf_exl3_parts_linear4, each decoded tile serving them all). From there a
/// single weight takes the grouped path (its bits are the item path's).
pub const rows_max = glm.group_rows_together;
pub fn rowsMax(together: bool) usize {
    return if (together) rows_max else 3;
}

/// LinearParts in glm_forward.cu, field for field.
pub const LinearParts = extern struct {
    layer: [parts_max]glm.Exl3Layer,
    y: [parts_max]Ptr,
    partial: [parts_max]Ptr,
    counters: [parts_max]Ptr,
    first_place: [parts_max]c_int,
    n_p: [parts_max]c_int,
    out_features: [parts_max]c_int,
    split_tiles: [parts_max]c_int,
    splits: [parts_max]c_int,
};

comptime {
    std.debug.assert(@sizeOf(LinearParts) == 232); // static_assert'ed in glm_forward.cu too
}

/// One part: its table entry and shape; `entries`, the table entries of the launch it stands for
/// (2 for a member of a pair: the k split follows the table, gemv_splits.zig); its outputs at y.
pub const Part = struct { layer: glm.Exl3Layer, n_p: usize, out_features: usize, entries: usize, y: Ptr = 0 };

pub const Call = struct {
    x: Ptr,
    /// A prompt step's row table (-1: the prompt kernels take the row), or 0: every row.
    live_rows: Ptr = 0,
    rows: usize,
    in_features: usize,
    k_p: usize,
    bits2: u8,
    codebook: u8,
    acc: Ptr,
    counters: Ptr,
    /// From 2 rows, every row in one block a place (tf_exl3_parts_linear4: the same bits).
    together: bool = false,
};

pub const Scratch = struct { partials: usize, counters: usize };

/// Where each part's blocks, partial sums and counters lie in one launch of `rows` rows (acc and
/// counters the scratch's bases), and how much scratch that takes: one walk for the launch and
/// for the buffers' sizing, so the two cannot part.
const Layout = struct { d: LinearParts, places: usize, bytes: u64, scratch: Scratch };

fn layout(k_p: usize, bits2: u8, parts: []const Part, rows: usize, acc: Ptr, counters: Ptr) Layout {
    var l: Layout = .{ .d = std.mem.zeroes(LinearParts), .places = 0, .bytes = 0, .scratch = .{ .partials = 0, .counters = 0 } };
    for (0..parts_max) |i| {
        l.d.first_place[i] = @intCast(l.places); // an absent part's: past every block
        if (i >= parts.len) continue;
        const part = parts[i];
        std.debug.assert(part.n_p % 128 == 0);
        const splits = gemv_splits.splitsFor(k_p, part.n_p, part.entries);
        l.d.layer[i] = part.layer;
        l.d.y[i] = part.y;
        l.d.partial[i] = acc + l.scratch.partials * @sizeOf(f32);
        l.d.counters[i] = counters + l.scratch.counters * @sizeOf(u32);
        l.d.n_p[i] = @intCast(part.n_p);
        l.d.out_features[i] = @intCast(part.out_features);
        l.d.split_tiles[i] = @intCast(gemv_splits.splitTiles(k_p, part.n_p, part.entries));
        l.d.splits[i] = @intCast(splits);
        l.places += part.n_p / 128 * splits;
        l.scratch.partials += splits * rows * part.n_p;
        l.scratch.counters += rows * (part.n_p / 128);
        l.bytes += glm.exl3EntryBytes(k_p, part.n_p, bits2);
    }
    return l;
}

/// The partial sums (floats) and completion counters a launch of `rows` rows needs.
pub fn scratch(k_p: usize, parts: []const Part, rows: usize) Scratch {
    return layout(k_p, 0, parts, rows, 0, 0).scratch;
}

pub fn run(k: glm.Kernels, c: Call, parts: []const Part) Error!void {
    std.debug.assert(parts.len >= 2 and parts.len <= parts_max and c.rows >= 1 and c.rows <= rowsMax(c.together) and c.acc % 16 == 0);
    const l = layout(c.k_p, c.bits2, parts, c.rows, c.acc, c.counters);
    k.gpu.noteReads(l.bytes);
    const values = .{
        c.x,                                 c.live_rows,                 l.d,                 @as(c_int, @intCast(c.rows)),
        @as(c_int, @intCast(c.in_features)), @as(c_int, @intCast(c.k_p)), @as(c_int, c.bits2), @as(c_int, c.codebook),
    };
    if (c.together and c.rows >= 2) return gpu_mod.launchValues(k.gpu, k.module.function("tf_exl3_parts_linear4"), .{
        .grid = .{ @intCast(l.places), 1, @intCast(std.math.divCeil(usize, c.rows, glm.group_rows_together) catch unreachable) },
        .block = .{ 256, 1, 1 },
    }, values, "launch tf_exl3_parts_linear4", k.diag);
    try gpu_mod.launchValues(k.gpu, k.module.function("tf_exl3_parts_linear"), .{
        .grid = .{ @intCast(l.places), 1, @intCast(c.rows) },
        .block = .{ 256, 1, 1 },
    }, values, "launch tf_exl3_parts_linear", k.diag);
}

test "the parts' scratch is what their launches would need one by one" {
    // GLM-4.5-Air's q (4096 -> 12288) and its k/v pair (4096 -> 1024 each, the pair's split).
    const parts = [_]Part{
        .{ .layer = undefined, .n_p = 12288, .out_features = 12288, .entries = 1 },
        .{ .layer = undefined, .n_p = 1024, .out_features = 1024, .entries = 2 },
        .{ .layer = undefined, .n_p = 1024, .out_features = 1024, .entries = 2 },
    };
    const need = scratch(4096, &parts, 3);
    try std.testing.expectEqual(@as(usize, 8 * 3 * 12288 + 2 * 8 * 3 * 1024), need.partials);
    try std.testing.expectEqual(@as(usize, 3 * 96 + 2 * 3 * 8), need.counters);
    // The launch's blocks: q's 96 column blocks x 8 splits, then k's and v's 8 x 8 each.
    const l = layout(4096, 6, &parts, 3, 0x1000, 0x2000);
    try std.testing.expectEqual(@as(usize, 96 * 8 + 2 * 8 * 8), l.places);
    try std.testing.expectEqualSlices(c_int, &.{ 0, 768, 832 }, &l.d.first_place);
    try std.testing.expectEqual(@as(Ptr, 0x1000 + 4 * (8 * 3 * 12288 + 8 * 3 * 1024)), l.d.partial[2]);
}
