//! Per-sequence sampling from one row of logits. Order: penalties (repetition over prompt and
//! output, presence and frequency over output, as vLLM), then greedy when temperature is 0, else
//! temperature, top-k, top-p, min-p and a draw from the sequence's own seeded generator. Logprobs
//! are the model's: log-softmax of the raw logits, before penalties and temperature.
const std = @import("std");

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

    pub fn init(gpa: std.mem.Allocator, vocab: usize) error{OutOfMemory}!Workspace {
        const adjusted = try gpa.alloc(f32, vocab);
        errdefer gpa.free(adjusted);
        const counts = try gpa.alloc(u32, vocab);
        errdefer gpa.free(counts);
        const order = try gpa.alloc(u32, vocab);
        @memset(counts, 0);
        return .{ .adjusted = adjusted, .counts = counts, .order = order };
    }

    pub fn deinit(workspace: *Workspace, gpa: std.mem.Allocator) void {
        gpa.free(workspace.adjusted);
        gpa.free(workspace.counts);
        gpa.free(workspace.order);
        workspace.* = undefined;
    }
};

pub const History = struct {
    prompt: []const u32,
    output: []const u32,
};

pub fn sample(params: *const Params, logits: []const f32, history: History, random: std.Random, workspace: *Workspace) Choice {
    const vocab = logits.len;
    var choice: Choice = undefined;
    const log_total = logSumExp(logits);

    const adjusted = workspace.adjusted[0..vocab];
    @memcpy(adjusted, logits);
    applyPenalties(params, adjusted, history, workspace.counts);

    choice.token = if (params.temperature == 0) argmax(adjusted) else draw(params, adjusted, random, workspace.order[0..vocab]);
    choice.logprob = @floatCast(@as(f64, logits[choice.token]) - log_total);
    choice.top_count = @intCast(params.top_logprobs);
    topLogprobs(logits, log_total, &choice);
    return choice;
}

fn logSumExp(logits: []const f32) f64 {
    var max: f32 = -std.math.inf(f32);
    for (logits) |v| max = @max(max, v);
    var sum: f64 = 0;
    for (logits) |v| sum += @exp(@as(f64, v - max));
    return @as(f64, max) + @log(sum);
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

fn greaterLogit(logits: []const f32, a: u32, b: u32) bool {
    if (logits[a] != logits[b]) return logits[a] > logits[b];
    return a < b;
}

fn draw(params: *const Params, logits: []f32, random: std.Random, order: []u32) u32 {
    const vocab = logits.len;
    for (order, 0..) |*o, i| o.* = @intCast(i);
    const keep_k: usize = if (params.top_k > 0) @min(@as(usize, @intCast(params.top_k)), vocab) else vocab;
    std.sort.pdq(u32, order, logits, greaterLogit); // descending; ties by token id

    const kept = order[0..keep_k];
    const inverse_temperature = 1.0 / @as(f64, params.temperature);
    const top = @as(f64, logits[kept[0]]) * inverse_temperature;
    var total: f64 = 0;
    for (kept) |t| {
        const p = @exp(@as(f64, logits[t]) * inverse_temperature - top);
        logits[t] = @floatCast(p);
        total += p;
    }
    // Nucleus: the smallest prefix whose probability reaches top_p.
    var count: usize = kept.len;
    if (params.top_p < 1) {
        var cumulative: f64 = 0;
        for (kept, 0..) |t, i| {
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
    const target = random.float(f64) * mass;
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
    const choice = sample(&params, &logits, .{ .prompt = &.{}, .output = &.{} }, prng.random(), &workspace);
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
    const choice = sample(&params, &logits, .{ .prompt = &.{}, .output = &.{1} }, prng.random(), &workspace);
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
        for (run) |*t| t.* = sample(&params, &logits, .{ .prompt = &.{}, .output = &.{} }, prng.random(), &workspace).token;
    }
    try std.testing.expectEqualSlices(u32, &draws[0], &draws[1]);
    var prng = std.Random.DefaultPrng.init(5);
    const params: Params = .{ .temperature = 1, .top_k = 1 };
    try std.testing.expectEqual(@as(u32, 3), sample(&params, &logits, .{ .prompt = &.{}, .output = &.{} }, prng.random(), &workspace).token);
}
