//! Where a model's weights go in device memory: chunks taken from cuMemAlloc, each weight at the
//! next 256-byte boundary of the current chunk, where each weight took its own cuMemAlloc. The
//! driver gives an allocation of 2 MiB or more whole 2 MiB pages (probed on an H100: 2 MiB + 256
//! bytes took 4 MiB, 1.5 MiB took 2), so a weight a little over a page took two: a routed expert's
//! 3-bit matrix of GLM-4.5-Air (4096 x 1408: 2.06 MiB) 4 MiB, the full model's 17415 of them 68 GiB
//! for 35. The full model beside the default KV pool then ran out of an 80 GB card, and in the
//! arena it peaks at 54.4 GB (docs/measurements.md, 2026-12-06). Chunks grow from 16 MiB to
//! 256 MiB, so a small model takes little and a chunk's unused tail (a weight that does not fit
//! starts the next) stays under ~2% of a large one. The chunks are the owner's to free.
const std = @import("std");
const Ptr = @import("gpu.zig").DevicePtr;

pub const Arena = struct {
    chunk: Ptr = 0,
    used: usize = 0,
    capacity: usize = 0,

    /// Every placement's alignment: more than any kernel's widest load (16 bytes) asks.
    pub const alignment = 256;
    pub const first_chunk = 16 << 20;
    pub const largest_chunk = 256 << 20;
    /// Weights above this take an allocation of their own (an embedding table, a dense lm_head):
    /// placed in a chunk they would leave most of the one before unused.
    pub const own_above = largest_chunk / 4;

    /// `bytes` placed in the current chunk, or null when they do not fit (start a chunk of
    /// chunkFor(bytes) first).
    pub fn place(arena: *Arena, bytes: usize) ?Ptr {
        if (arena.chunk == 0) return null;
        const at = std.mem.alignForward(usize, arena.used, alignment);
        if (at > arena.capacity or bytes > arena.capacity - at) return null;
        arena.used = at + bytes;
        return arena.chunk + at;
    }

    /// The next chunk's size for `bytes` that did not fit: twice the last, up to largest_chunk.
    pub fn chunkFor(arena: *const Arena, bytes: usize) usize {
        const grown = if (arena.capacity == 0) first_chunk else @min(2 * arena.capacity, largest_chunk);
        return @max(grown, std.mem.alignForward(usize, bytes, alignment));
    }

    /// Placements go to `chunk` (`size` bytes, from cuMemAlloc) from now on.
    pub fn start(arena: *Arena, chunk: Ptr, size: usize) void {
        arena.* = .{ .chunk = chunk, .capacity = size };
    }
};

test "placements are aligned, packed and never past a chunk" {
    var arena: Arena = .{};
    try std.testing.expectEqual(@as(?Ptr, null), arena.place(10));
    try std.testing.expectEqual(@as(usize, Arena.first_chunk), arena.chunkFor(10));
    arena.start(0x10000, Arena.first_chunk);
    const expert = 2162688; // a 3-bit 4096 x 1408 matrix's trellis words
    var last: Ptr = 0x10000;
    var placed: usize = 0;
    while (arena.place(expert)) |at| : (placed += 1) {
        try std.testing.expectEqual(@as(Ptr, 0), at % Arena.alignment);
        try std.testing.expectEqual(std.mem.alignForward(Ptr, last, Arena.alignment), at); // packed
        last = at + expert;
        try std.testing.expect(last <= 0x10000 + Arena.first_chunk);
    }
    // 16 MiB hold seven of them (7 x 2.06 MiB), where whole 2 MiB pages would hold four.
    try std.testing.expectEqual(@as(usize, 7), placed);
    try std.testing.expectEqual(@as(usize, 2 * Arena.first_chunk), arena.chunkFor(expert));
    arena.start(0x4000000, Arena.largest_chunk);
    try std.testing.expectEqual(@as(usize, Arena.largest_chunk), arena.chunkFor(expert));
    try std.testing.expectEqual(@as(usize, Arena.largest_chunk + 256), arena.chunkFor(Arena.largest_chunk + 1));
    // Small placements follow each other at 256-byte steps.
    const a = arena.place(8).?;
    const b = arena.place(8).?;
    try std.testing.expectEqual(a + 256, b);
    try std.testing.expectEqual(@as(?Ptr, null), arena.place(Arena.largest_chunk));
}
