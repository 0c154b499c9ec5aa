//! OpenAI's `logit_bias`: per sequence, up to `entries_max` (token, value) pairs added to its logits
//! before the penalties and the draw (vLLM's order), so -100 all but bans a token and +100 all but
//! forces it. A biased sequence is sampled on the host from its whole logits row, as a masked one
//! is; logprobs stay the model's.
const std = @import("std");

/// OpenAI's documented range of a value.
pub const value_max: f32 = 100;
/// Entries a sequence may carry: every slot's storage is allocated at init.
pub const entries_max = 1024;

/// A slot's storage (entries_max each) and how much of it the sequence uses.
pub const Bias = struct {
    tokens: []u32,
    values: []f32,
    count: usize = 0,

    pub fn entries(bias: *const Bias) Entries {
        return .{ .tokens = bias.tokens[0..bias.count], .values = bias.values[0..bias.count] };
    }
};

pub const Entries = struct {
    tokens: []const u32 = &.{},
    values: []const f32 = &.{},
};

pub fn apply(entries: Entries, logits: []f32) void {
    for (entries.tokens, entries.values) |token, value| logits[token] += value;
}

/// What is wrong with an entry, and which.
pub const Problem = struct { index: usize, what: []const u8 };

/// Null when every entry names a token of `vocab` once, with a finite value in [-100, 100].
pub fn problem(tokens: []align(1) const u32, values: []align(1) const f32, vocab: usize) ?Problem {
    for (tokens, values, 0..) |token, value, i| {
        if (token >= vocab) return .{ .index = i, .what = "names a token outside the vocabulary" };
        if (!(value >= -value_max and value <= value_max)) return .{ .index = i, .what = "has a value outside [-100, 100]" };
        for (tokens[0..i]) |earlier| {
            if (earlier == token) return .{ .index = i, .what = "repeats an earlier entry's token" };
        }
    }
    return null;
}

test "entries are added to their tokens' logits only" {
    var logits = [_]f32{ 1, 2, 3, 4 };
    apply(.{ .tokens = &.{ 3, 0 }, .values = &.{ -100, 0.5 } }, &logits);
    try std.testing.expectEqualSlices(f32, &.{ 1.5, 2, 3, -96 }, &logits);
}

test "entries outside the vocabulary or the range, or repeated, are refused by index" {
    try std.testing.expectEqual(@as(?Problem, null), problem(&.{ 0, 9 }, &.{ -100, 100 }, 10));
    try std.testing.expectEqual(@as(usize, 1), problem(&.{ 0, 10 }, &.{ 1, 1 }, 10).?.index);
    try std.testing.expectEqual(@as(usize, 0), problem(&.{2}, &.{100.5}, 10).?.index);
    try std.testing.expectEqual(@as(usize, 0), problem(&.{2}, &.{std.math.nan(f32)}, 10).?.index);
    try std.testing.expectEqual(@as(usize, 2), problem(&.{ 4, 5, 4 }, &.{ 1, 1, 1 }, 10).?.index);
}
