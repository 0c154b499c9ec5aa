//! What sampling needs of a logits row besides the row itself: log Σ exp, the highest logit and its
//! token. The GPU computes it beside the logits (logits_summary.cuh) so that a greedy
//! row crosses to the host as these 16 bytes instead of the whole vocabulary, and a sampled row's
//! host work skips its most expensive pass; the CPU backends compute it here.
const std = @import("std");

/// Device twin of `struct LogitsSummary` in logits_summary.cuh.
pub const LogitsSummary = extern struct {
    log_total: f64,
    max: f32,
    /// The highest logit's token; on a tie the lowest id.
    argmax: u32,

    pub fn of(logits: []const f32) LogitsSummary {
        var best: usize = 0;
        for (logits, 0..) |v, i| {
            if (v > logits[best]) best = i;
        }
        const max = logits[best];
        // Every token masked: nothing to normalize (the GPU's slices say the same).
        if (max == -std.math.inf(f32)) return .{ .log_total = -std.math.inf(f64), .max = max, .argmax = @intCast(best) };
        var sum: f64 = 0;
        // The difference in f64 too: an f32 one rounds by up to 2^-24 of it, ~1e-7 of each term.
        for (logits) |v| sum += @exp(@as(f64, v) - @as(f64, max));
        return .{ .log_total = @as(f64, max) + @log(sum), .max = max, .argmax = @intCast(best) };
    }
};

comptime {
    std.debug.assert(@sizeOf(LogitsSummary) == 16);
}

test "the summary of a row: log-sum-exp, the maximum and the lowest id holding it" {
    const row = [_]f32{ 0, 2, 1, 2 };
    const s = LogitsSummary.of(&row);
    try std.testing.expectEqual(@as(u32, 1), s.argmax);
    try std.testing.expectEqual(@as(f32, 2), s.max);
    try std.testing.expectApproxEqAbs(@log(@exp(0.0) + 2 * @exp(2.0) + @exp(1.0)), s.log_total, 1e-12);
}

test "a row with every token masked has no mass, not NaN" {
    const inf = std.math.inf(f32);
    const s = LogitsSummary.of(&[_]f32{ -inf, -inf, -inf });
    try std.testing.expectEqual(-std.math.inf(f64), s.log_total);
    try std.testing.expectEqual(@as(u32, 0), s.argmax);
}
