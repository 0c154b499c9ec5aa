//! Per-sequence sampling from one row of logits. Order: the logit bias (logit_bias.zig), penalties
//! (repetition over prompt and output, presence and frequency over output, as vLLM), then greedy when temperature is 0, else
//! temperature, top-k, top-p, min-p and a draw from the sequence's own seeded generator. Logprobs
//! are the model's: log-softmax of the raw logits, before penalties and temperature.
const std = @import("std");
const LogitsSummary = @import("../core/logits_summary.zig").LogitsSummary;
const token_mask = @import("token_mask.zig");
const logit_bias = @import("logit_bias.zig");

pub const Params = extern struct {
    temperature: f32 = 0,
    top_p: f32 = 1,
    top_k: i32 = 0,
    min_p: f32 = 0,
    presence_penalty: f32 = 0,
    frequency_penalty: f32 = 0,
    repetition_penalty: f32 = 1,
    /// Alternatives reported with each token (0..top_logprobs_max).
    top_logprobs: i32 = 0,
    seed: u64 = 0,
    has_seed: i32 = 0,
    max_tokens: u32 = 16,
    /// 1: every sampled token waits for its mask (token_mask.zig); 0: free.
    constrained: i32 = 0,
    reserved: i32 = 0,

    pub fn check(params: *const Params) ?[]const u8 {
        if (!(params.temperature >= 0 and params.temperature <= 100)) return "temperature must be in [0, 100]";
        if (!(params.top_p > 0 and params.top_p <= 1)) return "top_p must be in (0, 1]";
        if (params.top_k < 0) return "top_k must be >= 0 (0 disables it)";
        if (!(params.min_p >= 0 and params.min_p <= 1)) return "min_p must be in [0, 1]";
        if (!(params.presence_penalty >= -2 and params.presence_penalty <= 2)) return "presence_penalty must be in [-2, 2]";
        if (!(params.frequency_penalty >= -2 and params.frequency_penalty <= 2)) return "frequency_penalty must be in [-2, 2]";
        if (!(params.repetition_penalty > 0 and params.repetition_penalty <= 10)) return "repetition_penalty must be in (0, 10]";
        if (params.top_logprobs < 0 or params.top_logprobs > top_logprobs_max) return "top_logprobs must be in [0, 20]";
        if (params.max_tokens == 0) return "max_tokens must be at least 1";
        if (params.constrained != 0 and params.constrained != 1) return "constrained must be 0 or 1";
        return null;
    }
};

pub const top_logprobs_max = 20;

pub const Choice = struct {
    token: u32,
    logprob: f32,
    top_count: u32,
    top_tokens: [top_logprobs_max]u32,
    top_logprobs: [top_logprobs_max]f32,
};

/// Vocab-sized buffers for one sampling call, owned by the engine.
pub const Workspace = struct {
    adjusted: []f32,
    counts: []u32,
    order: []u32,
    /// The radix sort's second order buffer and its two key buffers.
    order_swap: []u32,
    keys: []u32,
    keys_swap: []u32,

    pub fn init(gpa: std.mem.Allocator, vocab: usize) error{OutOfMemory}!Workspace {
        var workspace: Workspace = undefined;
        const fields = .{ "counts", "order", "order_swap", "keys", "keys_swap" };
        workspace.adjusted = try gpa.alloc(f32, vocab);
        errdefer gpa.free(workspace.adjusted);
        var done: usize = 0;
        errdefer inline for (fields, 0..) |name, i| {
            if (i < done) gpa.free(@field(workspace, name));
        };
        inline for (fields) |name| {
            @field(workspace, name) = try gpa.alloc(u32, vocab);
            done += 1;
        }
        @memset(workspace.counts, 0);
        return workspace;
    }

    pub fn deinit(workspace: *Workspace, gpa: std.mem.Allocator) void {
        gpa.free(workspace.adjusted);
        inline for (.{ "counts", "order", "order_swap", "keys", "keys_swap" }) |name| gpa.free(@field(workspace, name));
    }
};

/// Whether sampling with `params` reads the logits row, not only its summary: everything but plain
/// greedy without penalties or alternatives.
pub fn needsLogits(params: *const Params) bool {
    const penalties = params.repetition_penalty != 1 or params.presence_penalty != 0 or params.frequency_penalty != 0;
    return params.temperature != 0 or penalties or params.top_logprobs > 0;
}

/// Whether the GPU samples rows of `params` (cuda/sampling.zig): temperature with top-k, top-p and
/// min-p, no penalties and no alternatives.
pub fn gpuSamples(params: *const Params) bool {
    const penalties = params.repetition_penalty != 1 or params.presence_penalty != 0 or params.frequency_penalty != 0;
    return params.temperature != 0 and !penalties and params.top_logprobs == 0;
}

/// The one uniform a sampled token takes from its sequence's generator, wherever it is sampled.
pub fn drawUniform(random: std.Random) f64 {
    return random.float(f64);
}

pub const History = struct {
    prompt: []const u32,
    output: []const u32,
};

/// `summary` is the row's LogitsSummary; `logits` may be null when `needsLogits` is false, no
/// `mask` (token_mask.zig) limits the choice and no `bias` moves it; the bias applies before the
/// penalties, a mask after them.
pub fn sample(params: *const Params, logits_or_null: ?[]const f32, summary: LogitsSummary, history: History, mask: ?[]const u32, bias: logit_bias.Entries, random: std.Random, workspace: *Workspace) Choice {
    var choice: Choice = undefined;
    const log_total = summary.log_total;
    const logits = logits_or_null orelse {
        std.debug.assert(!needsLogits(params) and mask == null and bias.tokens.len == 0);
        choice.token = summary.argmax;
        choice.logprob = @floatCast(@as(f64, summary.max) - log_total);
        choice.top_count = 0;
        return choice;
    };
    const vocab = logits.len;

    const adjusted = workspace.adjusted[0..vocab];
    @memcpy(adjusted, logits);
    logit_bias.apply(bias, adjusted);
    applyPenalties(params, adjusted, history, workspace.counts);
    if (mask) |allowed| token_mask.apply(allowed, adjusted);

    choice.token = if (params.temperature == 0) argmax(adjusted) else draw(params, adjusted, random, workspace);
    choice.logprob = @floatCast(@as(f64, logits[choice.token]) - log_total);
    choice.top_count = @intCast(params.top_logprobs);
    topLogprobs(logits, log_total, &choice);
    return choice;
}

fn applyPenalties(params: *const Params, logits: []f32, history: History, counts: []u32) void {
    const repetition = params.repetition_penalty != 1;
    const additive = params.presence_penalty != 0 or params.frequency_penalty != 0;
    if (!repetition and !additive) return;
    for (history.output) |t| counts[t] += 1;
    if (repetition) {
        for ([_][]const u32{ history.prompt, history.output }) |tokens| {
            for (tokens) |t| {
                if (counts[t] & seen_bit != 0) continue;
                counts[t] |= seen_bit;
                logits[t] = if (logits[t] > 0) logits[t] / params.repetition_penalty else logits[t] * params.repetition_penalty;
            }
        }
    }
    if (additive) {
        for (history.output) |t| {
            if (counts[t] & applied_bit != 0) continue;
            counts[t] |= applied_bit;
            const count: f32 = @floatFromInt(counts[t] & count_mask);
            logits[t] -= params.presence_penalty + params.frequency_penalty * count;
        }
    }
    for ([_][]const u32{ history.prompt, history.output }) |tokens| {
        for (tokens) |t| counts[t] = 0;
    }
}

const seen_bit: u32 = 1 << 31;
const applied_bit: u32 = 1 << 30;
const count_mask: u32 = applied_bit - 1;

/// The highest logit; on a tie the lowest token id.
fn argmax(logits: []const f32) u32 {
    var best: usize = 0;
    for (logits, 0..) |v, i| {
        if (v > logits[best]) best = i;
    }
    return @intCast(best);
}

/// Token ids by descending logit, ties by ascending id: a stable LSD radix sort (4 passes of 8
/// bits) of keys that order floats as integers, from ids in ascending order: the order of the
/// comparison sort it replaced (a test checks), in linear time over a 151552-token vocabulary.
fn sortDescending(logits: []const f32, workspace: *Workspace) []u32 {
    const vocab = logits.len;
    var order = workspace.order[0..vocab];
    var order_swap = workspace.order_swap[0..vocab];
    var keys = workspace.keys[0..vocab];
    var keys_swap = workspace.keys_swap[0..vocab];
    for (logits, keys, order, 0..) |v, *key, *o, i| {
        const bits: u32 = @bitCast(if (v == 0) 0 else v); // -0 ties with +0
        const ascending = if (bits >> 31 != 0) ~bits else bits | 0x8000_0000;
        key.* = ~ascending;
        o.* = @intCast(i);
    }
    var shift: u5 = 0;
    while (true) : (shift += 8) {
        var starts: [256]usize = @splat(0);
        for (keys) |key| starts[(key >> shift) & 0xFF] += 1;
        var at: usize = 0;
        for (&starts) |*start| {
            const count = start.*;
            start.* = at;
            at += count;
        }
        for (keys, order) |key, o| {
            const bucket = (key >> shift) & 0xFF;
            keys_swap[starts[bucket]] = key;
            order_swap[starts[bucket]] = o;
            starts[bucket] += 1;
        }
        std.mem.swap([]u32, &keys, &keys_swap);
        std.mem.swap([]u32, &order, &order_swap);
        if (shift == 24) break;
    }
    return order; // after an even number of passes: workspace.order
}

fn draw(params: *const Params, logits: []f32, random: std.Random, workspace: *Workspace) u32 {
    const vocab = logits.len;
    const keep_k: usize = if (params.top_k > 0) @min(@as(usize, @intCast(params.top_k)), vocab) else vocab;
    const order = sortDescending(logits, workspace);

    const kept = order[0..keep_k];
    const inverse_temperature = 1.0 / @as(f64, params.temperature);
    const top = @as(f64, logits[kept[0]]) * inverse_temperature;
    var total: f64 = 0;
    for (kept) |t| {
        const p = @exp(@as(f64, logits[t]) * inverse_temperature - top);
        logits[t] = @floatCast(p);
        total += p;
    }
    // Tokens a mask sent to -inf sort last with probability 0: the draw never reaches them, and
    // neither may the fallback below.
    var count: usize = kept.len;
    while (count > 1 and logits[kept[count - 1]] == 0) count -= 1;
    // Nucleus: the smallest prefix whose probability reaches top_p.
    if (params.top_p < 1) {
        var cumulative: f64 = 0;
        for (kept[0..count], 0..) |t, i| {
            cumulative += logits[t] / total;
            if (cumulative >= params.top_p) {
                count = i + 1;
                break;
            }
        }
    }
    // min-p: keep tokens with p >= min_p · p_max (p_max is the first).
    if (params.min_p > 0) {
        const floor = @as(f64, params.min_p) * logits[kept[0]];
        var i: usize = 1;
        while (i < count and logits[kept[i]] >= floor) : (i += 1) {}
        count = i;
    }
    var mass: f64 = 0;
    for (kept[0..count]) |t| mass += logits[t];
    const target = drawUniform(random) * mass;
    var cumulative: f64 = 0;
    for (kept[0..count]) |t| {
        cumulative += logits[t];
        if (target < cumulative) return t;
    }
    return kept[count - 1];
}

fn topLogprobs(logits: []const f32, log_total: f64, choice: *Choice) void {
    var taken: usize = 0;
    while (taken < choice.top_count) : (taken += 1) {
        var best: ?u32 = null;
        for (logits, 0..) |v, i| {
            const t: u32 = @intCast(i);
            const already = for (choice.top_tokens[0..taken]) |picked| {
                if (picked == t) break true;
            } else false;
            if (already) continue;
            if (best == null or v > logits[best.?]) best = t;
        }
        choice.top_tokens[taken] = best.?;
        choice.top_logprobs[taken] = @floatCast(@as(f64, logits[best.?]) - log_total);
    }
}

test "greedy picks the largest logit and reports its log-probability" {
    var workspace = try Workspace.init(std.testing.allocator, 4);
    defer workspace.deinit(std.testing.allocator);
    var prng = std.Random.DefaultPrng.init(1);
    const params: Params = .{ .top_logprobs = 2 };
    const logits = [_]f32{ 0, 2, 1, 2 };
    const choice = sample(&params, &logits, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{} }, null, .{}, prng.random(), &workspace);
    try std.testing.expectEqual(@as(u32, 1), choice.token);
    const expected = 2 - @log(@exp(0.0) + 2 * @exp(2.0) + @exp(1.0));
    try std.testing.expectApproxEqAbs(@as(f32, expected), choice.logprob, 1e-6);
    try std.testing.expectEqual(@as(u32, 1), choice.top_tokens[0]);
    try std.testing.expectEqual(@as(u32, 3), choice.top_tokens[1]);
}

test "penalties change the greedy choice and leave no counts behind" {
    var workspace = try Workspace.init(std.testing.allocator, 3);
    defer workspace.deinit(std.testing.allocator);
    var prng = std.Random.DefaultPrng.init(1);
    const params: Params = .{ .frequency_penalty = 1.5 };
    const logits = [_]f32{ 1, 2, 0 };
    const choice = sample(&params, &logits, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{1} }, null, .{}, prng.random(), &workspace);
    try std.testing.expectEqual(@as(u32, 0), choice.token);
    for (workspace.counts) |count| try std.testing.expectEqual(@as(u32, 0), count);
}

test "the same seed draws the same tokens; top_k 1 is greedy" {
    var workspace = try Workspace.init(std.testing.allocator, 8);
    defer workspace.deinit(std.testing.allocator);
    const logits = [_]f32{ 0.1, 0.5, 0.2, 0.9, 0.3, 0.4, 0.8, 0.0 };
    var draws: [2][16]u32 = undefined;
    for (&draws) |*run| {
        var prng = std.Random.DefaultPrng.init(1234);
        const params: Params = .{ .temperature = 1, .top_p = 0.9 };
        for (run) |*t| t.* = sample(&params, &logits, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{} }, null, .{}, prng.random(), &workspace).token;
    }
    try std.testing.expectEqualSlices(u32, &draws[0], &draws[1]);
    var prng = std.Random.DefaultPrng.init(5);
    const params: Params = .{ .temperature = 1, .top_k = 1 };
    try std.testing.expectEqual(@as(u32, 3), sample(&params, &logits, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{} }, null, .{}, prng.random(), &workspace).token);
}

test "the radix order is the comparison order: descending logits, ties by ascending id, -0 == +0" {
    const gpa = std.testing.allocator;
    const vocab = 5000;
    var workspace = try Workspace.init(gpa, vocab);
    defer workspace.deinit(gpa);
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    const logits = try gpa.alloc(f32, vocab);
    defer gpa.free(logits);
    for (logits) |*v| {
        // Few distinct values, both zeros, infinities and subnormals: many ties to break.
        v.* = switch (random.uintLessThan(u8, 8)) {
            0 => 0.0,
            1 => -0.0,
            2 => -std.math.inf(f32),
            3 => std.math.floatTrueMin(f32),
            else => @as(f32, @floatFromInt(random.intRangeAtMost(i32, -40, 40))) * 0.25,
        };
    }
    const expected = try gpa.alloc(u32, vocab);
    defer gpa.free(expected);
    for (expected, 0..) |*o, i| o.* = @intCast(i);
    const Greater = struct {
        fn lessThan(values: []const f32, a: u32, b: u32) bool {
            if (values[a] != values[b]) return values[a] > values[b];
            return a < b;
        }
    };
    std.sort.pdq(u32, expected, @as([]const f32, logits), Greater.lessThan);
    try std.testing.expectEqualSlices(u32, expected, sortDescending(logits, &workspace));
}

test "plain greedy samples from the summary alone" {
    var workspace = try Workspace.init(std.testing.allocator, 4);
    defer workspace.deinit(std.testing.allocator);
    var prng = std.Random.DefaultPrng.init(1);
    const params: Params = .{};
    try std.testing.expect(!needsLogits(&params));
    try std.testing.expect(needsLogits(&.{ .top_logprobs = 1 }));
    try std.testing.expect(needsLogits(&.{ .repetition_penalty = 1.1 }));
    const logits = [_]f32{ 0, 2, 1, 2 };
    const from_row = sample(&params, &logits, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{} }, null, .{}, prng.random(), &workspace);
    const from_summary = sample(&params, null, LogitsSummary.of(&logits), .{ .prompt = &.{}, .output = &.{} }, null, .{}, prng.random(), &workspace);
    try std.testing.expectEqual(from_row.token, from_summary.token);
    try std.testing.expectEqual(from_row.logprob, from_summary.logprob);
}

test "a mask limits greedy and drawn tokens to the allowed ones; logprobs stay the model's" {
    var workspace = try Workspace.init(std.testing.allocator, 40);
    defer workspace.deinit(std.testing.allocator);
    var logits: [40]f32 = undefined;
    for (&logits, 0..) |*v, i| v.* = @as(f32, @floatFromInt(i)) * 0.25;
    const mask = [_]u32{ 0b1001_0000, 0 }; // tokens 4 and 7
    const summary = LogitsSummary.of(&logits);
    var prng = std.Random.DefaultPrng.init(3);
    const greedy = sample(&.{}, &logits, summary, .{ .prompt = &.{}, .output = &.{} }, &mask, .{}, prng.random(), &workspace);
    try std.testing.expectEqual(@as(u32, 7), greedy.token);
    try std.testing.expectApproxEqAbs(@as(f64, logits[7]) - summary.log_total, greedy.logprob, 1e-6);
    var seen: [40]bool = @splat(false);
    for (0..200) |_| {
        const params: Params = .{ .temperature = 2, .top_k = 30, .top_p = 1 };
        seen[sample(&params, &logits, summary, .{ .prompt = &.{}, .output = &.{} }, &mask, .{}, prng.random(), &workspace).token] = true;
    }
    for (seen, 0..) |was, token| try std.testing.expectEqual(token == 4 or token == 7, was);
}

test "a logit bias moves greedy and drawn tokens before the penalties; logprobs stay the model's" {
    var workspace = try Workspace.init(std.testing.allocator, 4);
    defer workspace.deinit(std.testing.allocator);
    var prng = std.Random.DefaultPrng.init(5);
    const logits = [_]f32{ 3, 2, 1, 0 };
    const summary = LogitsSummary.of(&logits);
    const history: History = .{ .prompt = &.{}, .output = &.{} };
    const ban: logit_bias.Entries = .{ .tokens = &.{0}, .values = &.{-100} };
    const greedy = sample(&.{}, &logits, summary, history, null, ban, prng.random(), &workspace);
    try std.testing.expectEqual(@as(u32, 1), greedy.token);
    try std.testing.expectApproxEqAbs(@as(f64, logits[1]) - summary.log_total, greedy.logprob, 1e-6);
    // Token 0 biased to -1 then penalized (x 1.6: -1.6) beats token 1 (-1.7); penalized first
    // (2 / 1.6 - 3 = -1.75) it would not.
    const close = [_]f32{ 2, -1.7, -5, -5 };
    const first: logit_bias.Entries = .{ .tokens = &.{0}, .values = &.{-3} };
    const penalized = sample(&.{ .repetition_penalty = 1.6 }, &close, LogitsSummary.of(&close), .{ .prompt = &.{0}, .output = &.{} }, null, first, prng.random(), &workspace);
    try std.testing.expectEqual(@as(u32, 0), penalized.token);
    for (0..100) |_| {
        const drawn = sample(&.{ .temperature = 1 }, &logits, summary, history, null, .{ .tokens = &.{3}, .values = &.{100} }, prng.random(), &workspace);
        try std.testing.expectEqual(@as(u32, 3), drawn.token);
    }
}
