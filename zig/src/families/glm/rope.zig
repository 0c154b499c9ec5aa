//! Rotary position embedding as transformers computes it (GLM.md §3.4): frequencies
//! θ^(-2j/dim) over the rotated dims, or one of transformers' static rescalings of them
//! (`rope_type` "yarn", which also scales cos and sin by its attention factor; "linear";
//! "llama3"; "proportional", which rotates the whole head with frequency 0 past its pairs), applied
//! in one of two pairings:
//! - half (NeoX rotate-half, class A's partial RoPE and MLA with rope_interleave false): dim j pairs
//!   with j + dim/2 inside the rotated slice; dims past it pass through;
//! - interleaved (GPT-J, MLA and the DSA indexer): pairs (2j, 2j+1), written back de-interleaved,
//!   [rotated evens | rotated odds], as transformers' apply_rotary_pos_emb_interleave does. q and k
//!   share the layout, so their dot products are those of the interleaved vectors.
const std = @import("std");
const Fields = @import("config_fields.zig").Fields;
const Error = @import("config_fields.zig").Error;

pub const dim_max = 256;

pub const Style = enum { half, interleaved };

pub const Yarn = struct {
    factor: f64,
    original_max_position: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
};

pub const Llama3 = struct {
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position: f64,
};

pub const Rope = struct {
    /// Rotated dims per head (even; 0: no rotation).
    dim: usize,
    theta: f64,
    style: Style,
    yarn: ?Yarn = null,
    llama3: ?Llama3 = null,
    /// "linear" and "proportional" divide every frequency by it.
    divisor: f64 = 1,
    /// "proportional": pairs from here on turn with frequency 0, and the exponents are over
    /// `dim` (the whole head) rather than the rotated pairs.
    pairs_turning: ?usize = null,
    /// The `factor` of a rope_type other than "default" (transformers' yarn_apply_mscale reads it
    /// for MLA's softmax scale whatever the type), else null.
    factor: ?f64 = null,
    /// cos and sin are scaled by it (transformers' attention_scaling; 1 without YaRN).
    attention_factor: f64 = 1,

    /// The RoPE fields of config.json for heads of `head_dim` dims rotating `dim` of them in
    /// `style`; "proportional" rotates the whole head (then `rope.dim` is head_dim).
    pub fn parse(f: Fields, dim: usize, head_dim: usize, style: Style, max_position: usize) Error!Rope {
        var rope: Rope = .{ .dim = dim, .theta = try f.ropeNumber("rope_theta", 10000.0), .style = style };
        const parameters = try f.ropeObject() orelse return rope;
        const kind_value = parameters.get("rope_type") orelse parameters.get("type") orelse return rope;
        if (kind_value != .string) return f.wrong("rope_parameters.rope_type", "a string");
        const kind = kind_value.string;
        if (std.mem.eql(u8, kind, "default")) return rope;
        const p: Fields = .{ .map = parameters, .diag = f.diag };
        if (std.mem.eql(u8, kind, "linear") or std.mem.eql(u8, kind, "proportional")) {
            const linear = kind[0] == 'l';
            rope.divisor = try p.number("factor", if (linear) std.math.nan(f64) else 1.0);
            if (!(rope.divisor > 0)) return p.wrong("rope_parameters.factor", "a positive number");
            rope.factor = rope.divisor;
            if (!linear) {
                // transformers: int(partial_rotary_factor * head_dim // 2) pairs of the whole head.
                const partial = try f.ropeNumber("partial_rotary_factor", 1.0);
                rope.pairs_turning = @intFromFloat(@floor(partial * @as(f64, @floatFromInt(head_dim)) / 2));
                rope.dim = head_dim;
            }
            return rope;
        }
        if (std.mem.eql(u8, kind, "llama3")) {
            const llama3: Llama3 = .{
                .factor = try p.number("factor", std.math.nan(f64)),
                .low_freq_factor = try p.number("low_freq_factor", std.math.nan(f64)),
                .high_freq_factor = try p.number("high_freq_factor", std.math.nan(f64)),
                .original_max_position = try p.number("original_max_position_embeddings", std.math.nan(f64)),
            };
            if (!(llama3.factor > 0 and llama3.low_freq_factor > 0 and llama3.high_freq_factor > llama3.low_freq_factor and llama3.original_max_position > 0)) {
                f.diag.set("config.json: llama3 rope needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0", .{});
                return error.InvalidConfig;
            }
            rope.llama3 = llama3;
            rope.factor = llama3.factor;
            return rope;
        }
        if (!std.mem.eql(u8, kind, "yarn")) {
            // "dynamic" and "longrope" change the frequencies with the length of each forward, so a
            // position's rotation would depend on how its prompt was chunked.
            f.diag.set("config.json: rope_type '{s}' is not supported (default, yarn, linear, llama3 and proportional are)", .{kind});
            return error.UnsupportedModel;
        }
        const original = try p.number("original_max_position_embeddings", @floatFromInt(max_position));
        const factor = try p.number("factor", @as(f64, @floatFromInt(max_position)) / original);
        const yarn: Yarn = .{
            .factor = factor,
            .original_max_position = original,
            .beta_fast = nonZero(try p.number("beta_fast", 32), 32),
            .beta_slow = nonZero(try p.number("beta_slow", 1), 1),
            .truncate = try p.boolean("truncate", true),
        };
        if (!(factor > 0 and original > 0)) {
            f.diag.set("config.json: yarn needs a positive factor and original_max_position_embeddings", .{});
            return error.InvalidConfig;
        }
        rope.yarn = yarn;
        rope.factor = factor;
        const mscale = try p.number("mscale", 0);
        const mscale_all_dim = try p.number("mscale_all_dim", 0);
        rope.attention_factor = if (parameters.get("attention_factor")) |value|
            try p.numberValue("attention_factor", value, 1)
        else if (mscale != 0 and mscale_all_dim != 0)
            yarnMscale(factor, mscale) / yarnMscale(factor, mscale_all_dim)
        else
            yarnMscale(factor, 1);
        return rope;
    }

    /// The frequency of pair j, in f32 as transformers rounds it.
    pub fn inverseFrequency(rope: Rope, j: usize) f32 {
        if (rope.pairs_turning) |pairs| if (j >= pairs) return 0;
        const exponent: f32 = @as(f32, @floatFromInt(2 * j)) / @as(f32, @floatFromInt(rope.dim));
        const base_power: f32 = @floatCast(std.math.pow(f64, rope.theta, exponent));
        const extrapolation: f32 = 1.0 / base_power;
        if (rope.llama3) |llama3| return llama3Frequency(llama3, extrapolation);
        if (rope.divisor != 1) return extrapolation / @as(f32, @floatCast(rope.divisor));
        const yarn = rope.yarn orelse return extrapolation;
        const interpolation: f32 = 1.0 / (@as(f32, @floatCast(yarn.factor)) * base_power);
        const range = yarnRange(yarn, rope.dim, rope.theta);
        const high = if (range[0] == range[1]) range[1] + 0.001 else range[1];
        const ramp = std.math.clamp((@as(f32, @floatFromInt(j)) - @as(f32, @floatCast(range[0]))) / @as(f32, @floatCast(high - range[0])), 0, 1);
        const extrapolation_factor: f32 = 1 - ramp;
        return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
};

/// transformers' _compute_llama3_parameters for one frequency: long wavelengths divided by the
/// factor, short ones kept, the band between blended.
fn llama3Frequency(l: Llama3, frequency: f32) f32 {
    const factor: f32 = @floatCast(l.factor);
    const old_context: f32 = @floatCast(l.original_max_position);
    const low: f32 = @floatCast(l.low_freq_factor);
    const high: f32 = @floatCast(l.high_freq_factor);
    const wavelength = 2 * std.math.pi / frequency;
    if (wavelength > old_context / low) return frequency / factor;
    if (wavelength < old_context / high) return frequency;
    const smooth = (old_context / wavelength - low) / (high - low);
    return (1 - smooth) * frequency / factor + smooth * frequency;
}

/// YaRN's attention scale for a context `factor` (transformers' get_mscale).
pub fn yarnMscale(factor: f64, mscale: f64) f64 {
    if (factor <= 1) return 1;
    return 0.1 * mscale * @log(factor) + 1;
}

fn nonZero(value: f64, default: f64) f64 {
    return if (value == 0) default else value;
}

/// The dims YaRN blends between, from the rotations beta_fast and beta_slow.
fn yarnRange(yarn: Yarn, dim: usize, theta: f64) [2]f64 {
    const d: f64 = @floatFromInt(dim);
    const correction = struct {
        fn at(rotations: f64, dims: f64, base: f64, max: f64) f64 {
            return dims * @log(max / (rotations * 2 * std.math.pi)) / (2 * @log(base));
        }
    };
    var low = correction.at(yarn.beta_fast, d, theta, yarn.original_max_position);
    var high = correction.at(yarn.beta_slow, d, theta, yarn.original_max_position);
    if (yarn.truncate) {
        low = @floor(low);
        high = @ceil(high);
    }
    return .{ @max(low, 0), @min(high, d - 1) };
}

/// out = [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}] for `position`, each times the attention
/// factor: the angle pos·inv_freq rounded to f32 before cos and sin, as transformers does.
pub fn cosSin(rope: Rope, position: u32, out: []f32) void {
    const half = rope.dim / 2;
    std.debug.assert(out.len == 2 * half);
    const scale: f32 = @floatCast(rope.attention_factor);
    for (0..half) |j| {
        const angle: f32 = @as(f32, @floatFromInt(position)) * rope.inverseFrequency(j);
        out[j] = @as(f32, @floatCast(@cos(@as(f64, angle)))) * scale;
        out[half + j] = @as(f32, @floatCast(@sin(@as(f64, angle)))) * scale;
    }
}

/// Rotates `x` (the rotated dims of one head) in place.
pub fn apply(style: Style, x: []f32, cos_sin: []const f32) void {
    const half = x.len / 2;
    std.debug.assert(cos_sin.len == x.len and x.len <= dim_max);
    switch (style) {
        .half => for (0..half) |j| {
            const a = x[j];
            const b = x[j + half];
            x[j] = a * cos_sin[j] - b * cos_sin[half + j];
            x[j + half] = b * cos_sin[j] + a * cos_sin[half + j];
        },
        .interleaved => {
            var pairs: [dim_max]f32 = undefined;
            @memcpy(pairs[0..x.len], x);
            for (0..half) |j| {
                const a = pairs[2 * j];
                const b = pairs[2 * j + 1];
                x[j] = a * cos_sin[j] - b * cos_sin[half + j];
                x[half + j] = b * cos_sin[j] + a * cos_sin[half + j];
            }
        },
    }
}

test "position 0 is the identity; a quarter turn swaps the pair" {
    var x = [_]f32{ 1, 2, 3, 4 };
    apply(.half, &x, &.{ 1, 1, 0, 0 });
    try std.testing.expectEqualSlices(f32, &.{ 1, 2, 3, 4 }, &x);
    apply(.half, &x, &.{ 0, 1, 1, 0 }); // pair (0, 2) by 90 degrees, pair (1, 3) unturned
    try std.testing.expectEqualSlices(f32, &.{ -3, 2, 1, 4 }, &x);
}

test "interleaved pairs are adjacent and come back de-interleaved" {
    var x = [_]f32{ 1, 2, 3, 4 };
    apply(.interleaved, &x, &.{ 1, 1, 0, 0 });
    try std.testing.expectEqualSlices(f32, &.{ 1, 3, 2, 4 }, &x);
    var y = [_]f32{ 1, 2, 3, 4 };
    apply(.interleaved, &y, &.{ 0, 1, 1, 0 }); // pair (0, 1) by 90 degrees, pair (2, 3) unturned
    try std.testing.expectEqualSlices(f32, &.{ -2, 3, 1, 4 }, &y);
}

test "yarn leaves the highest frequencies and divides the lowest by the factor" {
    const plain: Rope = .{ .dim = 64, .theta = 10000, .style = .interleaved };
    var yarn = plain;
    yarn.yarn = .{ .factor = 4, .original_max_position = 4096, .beta_fast = 32, .beta_slow = 1, .truncate = true };
    try std.testing.expectEqual(plain.inverseFrequency(0), yarn.inverseFrequency(0));
    try std.testing.expectApproxEqRel(plain.inverseFrequency(31) / 4, yarn.inverseFrequency(31), 1e-6);
    try std.testing.expectApproxEqRel(1.1386294, yarnMscale(4, 1), 1e-6);
}

test "linear divides every frequency; llama3 only the long wavelengths; proportional stops turning" {
    const plain: Rope = .{ .dim = 64, .theta = 10000, .style = .half };
    var linear = plain;
    linear.divisor = 4;
    try std.testing.expectEqual(plain.inverseFrequency(5) / 4, linear.inverseFrequency(5));
    var llama3 = plain;
    llama3.llama3 = .{ .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 8192 };
    try std.testing.expectEqual(plain.inverseFrequency(0), llama3.inverseFrequency(0));
    try std.testing.expectEqual(plain.inverseFrequency(31) / 8, llama3.inverseFrequency(31));
    var proportional = plain;
    proportional.pairs_turning = 8;
    try std.testing.expectEqual(plain.inverseFrequency(7), proportional.inverseFrequency(7));
    try std.testing.expectEqual(@as(f32, 0), proportional.inverseFrequency(8));
}
