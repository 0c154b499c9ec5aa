//! MoE routing of one row (GLM.md §3.8), all in f32: logits = x·W_gateᵀ, s = sigmoid(logits),
//! selection on s + e_score_correction_bias (group-limited when n_group > 1), weights from the
//! unbiased s, normalised when norm_topk_prob, times routed_scaling_factor.
const std = @import("std");
const Config = @import("../config.zig").Config;
const config_mod = @import("../config.zig");
const dot = @import("../linear.zig").dot;

pub const Route = struct {
    count: u8,
    /// Selected experts in ascending index, and their weights.
    experts: [config_mod.experts_per_token_max]u16,
    weights: [config_mod.experts_per_token_max]f32,

    pub fn weightOf(selected: *const Route, expert: u16) ?f32 {
        for (selected.experts[0..selected.count], selected.weights[0..selected.count]) |e, w| {
            if (e == expert) return w;
        }
        return null;
    }
};

pub fn route(c: Config, gate: []const f32, correction_bias: []const f32, x: []const f32) Route {
    const experts = c.routed_experts;
    std.debug.assert(gate.len == experts * c.hidden_size and x.len == c.hidden_size);
    var probability: [config_mod.experts_max]f32 = undefined;
    var choice: [config_mod.experts_max]f32 = undefined;
    for (0..experts) |e| {
        const logit = dot(x, gate[e * c.hidden_size ..][0..c.hidden_size]);
        probability[e] = 1.0 / (1.0 + @exp(-logit));
        choice[e] = probability[e] + correction_bias[e];
    }
    if (c.groups > 1) limitGroups(c, choice[0..experts]);

    var taken: [config_mod.experts_max]bool = @splat(false);
    var result: Route = .{ .count = @intCast(c.experts_per_token), .experts = undefined, .weights = undefined };
    for (0..c.experts_per_token) |slot| {
        var best: usize = experts;
        for (0..experts) |e| {
            // Highest score wins; on a tie the lower index (strict >).
            if (!taken[e] and (best == experts or choice[e] > choice[best])) best = e;
        }
        taken[best] = true;
        result.experts[slot] = @intCast(best);
    }
    std.mem.sort(u16, result.experts[0..result.count], {}, std.sort.asc(u16));

    var total: f32 = 0;
    for (result.experts[0..result.count], result.weights[0..result.count]) |e, *w| {
        w.* = probability[e];
        total += w.*;
    }
    for (result.weights[0..result.count]) |*w| {
        if (c.norm_topk_prob) w.* /= total + 1e-20;
        w.* *= c.routed_scaling_factor;
    }
    return result;
}

/// Keeps the topk_group groups whose two best scores sum highest; the rest's experts leave the
/// selection (transformers masks their scores to -inf: a kept expert with a negative score still
/// wins over them, which a mask of 0 would not give).
fn limitGroups(c: Config, choice: []f32) void {
    const per_group = choice.len / c.groups;
    var group_score: [config_mod.experts_max]f32 = undefined;
    for (0..c.groups) |g| {
        var first: f32 = -std.math.inf(f32);
        var second: f32 = -std.math.inf(f32);
        for (choice[g * per_group ..][0..per_group]) |s| {
            if (s > first) {
                second = first;
                first = s;
            } else if (s > second) second = s;
        }
        group_score[g] = first + second;
    }
    var keep: [config_mod.experts_max]bool = @splat(false);
    for (0..c.groups_per_token) |_| {
        var best: usize = c.groups;
        for (0..c.groups) |g| {
            if (!keep[g] and (best == c.groups or group_score[g] > group_score[best])) best = g;
        }
        keep[best] = true;
    }
    for (0..c.groups) |g| {
        if (!keep[g]) @memset(choice[g * per_group ..][0..per_group], -std.math.inf(f32));
    }
}
