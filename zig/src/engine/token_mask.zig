//! Grammar-constrained sampling, the engine's half. A constrained sequence draws its next token only
//! from the tokens its mask allows; the grammar itself lives with the caller (the server runs an
//! llguidance matcher per request) and hands the engine one bitmask per token through
//! `tf_engine_set_token_mask`. The engine keeps a vocab-sized mask per sequence slot (allocated at
//! init) and one rule: the token a mask constrains spends it, so a stale mask can never constrain
//! the next token by mistake.
const std = @import("std");

/// What constrains a constrained sequence's next token.
pub const State = enum {
    /// Nothing yet: a step that would sample it is refused (the caller must say first).
    none,
    /// Nothing this time: the token is sampled as an unconstrained one would be (on the GPU where
    /// its sampling allows), as the server does while a reasoning block is open.
    open,
    /// The slot's mask.
    masked,
};

/// 32-bit words of a mask over `vocab` tokens: bit t % 32 of word t / 32 allows token t.
pub fn wordsFor(vocab: usize) usize {
    return std.math.divCeil(usize, vocab, 32) catch unreachable;
}

pub fn allows(mask: []align(1) const u32, token: usize) bool {
    return (mask[token / 32] >> @intCast(token % 32)) & 1 != 0;
}

/// Disallowed tokens' logits become -inf, so greedy and every filter of the draw pass them over.
pub fn apply(mask: []const u32, logits: []f32) void {
    std.debug.assert(mask.len == wordsFor(logits.len));
    for (logits, 0..) |*value, token| {
        if (!allows(mask, token)) value.* = -std.math.inf(f32);
    }
}

/// Null when `mask` fits `vocab` and allows at least one of its tokens; else what is wrong.
pub fn problem(mask: []align(1) const u32, vocab: usize) ?[]const u8 {
    if (mask.len != wordsFor(vocab)) return "the mask's length is not ceil(vocab / 32) words";
    for (0..vocab) |token| {
        if (allows(mask, token)) return null;
    }
    return "the mask allows no token of the vocabulary";
}

test "a mask allows exactly its bits and sends the rest to -inf" {
    var logits = [_]f32{ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34 };
    const mask = [_]u32{ 0b101, 0b10 };
    try std.testing.expectEqual(@as(?[]const u8, null), problem(&mask, logits.len));
    apply(&mask, &logits);
    for (logits, 0..) |value, token| {
        const allowed = token == 0 or token == 2 or token == 33;
        try std.testing.expectEqual(allowed, std.math.isFinite(value));
    }
}

test "masks that fit no vocabulary or allow nothing in it are refused" {
    try std.testing.expect(problem(&.{0}, 40) != null); // one word for 40 tokens
    try std.testing.expect(problem(&.{ 0, 0xFFFF_FF00 }, 40) != null); // bits only past the vocabulary
    try std.testing.expect(problem(&.{ 0, 0x80 }, 40) == null);
}
