//! The k splits of the trellis GEMV (tf_exl3_item_linear, tf_exl3_group_linear): how many tile
//! rows each split walks, and so how many splits a weight takes.
const std = @import("std");

/// Tile rows per split of the GEMV's k loop: 32 (512 input channels, the kernel's shared planes).
/// Shorter splits repeat each block's input rotation and partial sums for fewer tiles (16 tile rows:
/// the Air expert layer at M = 1 took 86.2 us on the H200, 32: 80.6); much longer ones leave too
/// few warps in flight (a profile of a GLM-4.5-Air layer showed 96-tile chains serializing o_proj).
/// A small weight, whose column blocks x splits x table entries (up to 8) make fewer than 128
/// blocks, takes splits of 16 or 8 tile rows instead: one row's GEMV of GLM-4.7-Flash's q_a
/// (2048 x 768: 24 blocks) took 13.5 us for 0.6 MB, a chain of four rounds of loads per warp on a
/// fifth of the SMs (the step timeline, docs/measurements.md). A function of the shape and of the
/// table's entries (1 for a plain linear, 2 for a pair, the experts for an MoE), never of the rows,
/// so a row's sum does not depend on how many rows are batched.
pub const tiles_per_split = 32;

pub fn splitTiles(k_p: usize, n_p: usize, entries: usize) usize {
    var tiles: usize = tiles_per_split;
    while (tiles > 8 and (n_p / 128) * (std.math.divCeil(usize, k_p / 16, tiles) catch unreachable) * @min(entries, 8) < 128) tiles /= 2;
    return tiles;
}

pub fn splitsFor(k_p: usize, n_p: usize, entries: usize) usize {
    return std.math.divCeil(usize, k_p / 16, splitTiles(k_p, n_p, entries)) catch unreachable;
}

/// The most splits any call of a shape takes (a plain linear's), for sizing the partial sums.
pub fn splitsMax(k_p: usize, n_p: usize) usize {
    return splitsFor(k_p, n_p, 1);
}

test "small weights take shorter splits; the others keep 32 tile rows" {
    try std.testing.expectEqual(@as(usize, 8), splitTiles(2048, 768, 1)); // GLM-4.7-Flash q_a: 6 x 16 blocks
    try std.testing.expectEqual(@as(usize, 8), splitTiles(768, 5120, 1)); // its q_b: 40 x 6
    try std.testing.expectEqual(@as(usize, 32), splitTiles(5120, 2048, 1)); // its o_proj: 16 x 10
    try std.testing.expectEqual(@as(usize, 32), splitTiles(4096, 1024, 2)); // GLM-4.5-Air's k/v pair: 8 x 8 x 2
    try std.testing.expectEqual(@as(usize, 16), splitTiles(4096, 1024, 1)); // the same shape alone
    try std.testing.expectEqual(@as(usize, 32), splitTiles(4096, 1408, 129)); // its experts' gate/up
    try std.testing.expectEqual(@as(usize, 16), splitsFor(2048, 768, 1));
    try std.testing.expect(splitsMax(768, 5120) >= splitsFor(768, 5120, 2));
}
