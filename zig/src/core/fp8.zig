//! OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, 0x7f/0xff NaN, largest finite 448), the KV
//! cache's 8-bit storage. Rounding is to nearest, ties to even, saturating at ±448: the same bits
//! as CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`, so the CPU's cache holds the
//! GPU's bytes. A cached position of one head carries a power-of-two scale 2^e (`scaleExponent`;
//! why per position: kv_store.zig); with e in [exponent_min, exponent_max] every code times its
//! scale is an exact f16, which lets the GPU take codes into f16 tensor-core operands without
//! rounding.
const std = @import("std");

pub const max_finite: f32 = 448.0;
/// 2^-15: the smallest code (2^-9) times it is f16's smallest subnormal step times 8, exact.
pub const exponent_min: i8 = -15;
/// 2^7: 448 · 2^7 = 57344 stays below f16's largest finite value (65504).
pub const exponent_max: i8 = 7;

pub fn encode(x: f32) u8 {
    const bits: u32 = @bitCast(x);
    const sign: u8 = @truncate((bits >> 24) & 0x80);
    const magnitude = bits & 0x7fff_ffff;
    if (magnitude > 0x7f80_0000) return sign | 0x7f; // NaN
    if (magnitude >= 0x43e0_0000) return sign | 0x7e; // |x| >= 448 (and infinity): saturate
    const biased: i32 = @intCast(magnitude >> 23);
    if (biased == 0) return sign; // f32 subnormals are far below e4m3's 2^-9
    const e = biased - 127; // x = 1.m · 2^e
    const mantissa = (magnitude & 0x7f_ffff) | 0x80_0000;
    // Quantum: 2^(e-3) for normals, 2^-9 (the subnormal step) below 2^-6.
    const quantum = @max(e - 3, -9);
    const shift: u32 = @intCast(23 + quantum - e); // >= 20
    if (shift >= 32) return sign;
    const kept = mantissa >> @intCast(shift);
    const rest = mantissa & ((@as(u32, 1) << @intCast(shift)) - 1);
    const half = @as(u32, 1) << @intCast(shift - 1);
    const n = kept + @intFromBool(rest > half or (rest == half and kept & 1 == 1)); // 0..16 quanta
    // Normals: code ((e + 7) << 3) + (n - 8), where n == 16 carries into the exponent; below 2^-6
    // the code is n itself (n == 8 is the smallest normal, code 0x08).
    const code: u32 = if (e >= -6) @as(u32, @intCast((e + 7) << 3)) + n - 8 else n;
    return sign | @as(u8, @intCast(@min(code, 0x7e)));
}

pub fn decode(code: u8) f32 {
    const magnitude = code & 0x7f;
    if (magnitude == 0x7f) return std.math.nan(f32);
    const e: i32 = magnitude >> 3;
    const m: f32 = @floatFromInt(magnitude & 7);
    const value = if (e == 0) std.math.ldexp(m, -9) else std.math.ldexp(1.0 + m / 8.0, e - 7);
    return if (code & 0x80 != 0) -value else value;
}

/// Every code's value, for the cache's reads: a position reads `decoded[code] * pow2(e)`, the same
/// bits as ldexp(decode(code), e) (the product is exact), without a call per value.
pub const decoded: [256]f32 = table: {
    @setEvalBranchQuota(100_000);
    var values: [256]f32 = undefined;
    for (&values, 0..) |*v, code| v.* = decode(code);
    break :table values;
};

/// 2^e as an f32 (exact for e in [exponent_min, exponent_max]).
pub fn pow2(e: i8) f32 {
    return @bitCast(@as(u32, @intCast(@as(i32, e) + 127)) << 23);
}

/// The smallest e (clamped to [exponent_min, exponent_max]) with amax <= 448 · 2^e.
pub fn scaleExponent(amax: f32) i8 {
    const bits: u32 = @bitCast(amax);
    const magnitude = bits & 0x7fff_ffff;
    if (magnitude >= 0x7f80_0000) return exponent_max;
    const biased: i32 = @intCast(magnitude >> 23);
    if (biased == 0) return exponent_min;
    // amax = 1.m · 2^E <= 1.75 · 2^(8 + e): e = E - 8 while 1.m <= 1.75, else E - 7.
    const e = biased - 127 - 8 + @as(i32, @intFromBool(magnitude & 0x7f_ffff > 0x60_0000));
    return @intCast(std.math.clamp(e, exponent_min, exponent_max));
}

test "e4m3 round trip of every code, and rounding to nearest even" {
    for (0..256) |i| {
        const code: u8 = @intCast(i);
        if (code & 0x7f == 0x7f) continue;
        const x = decode(code);
        // -0 encodes as 0x80, as it decodes.
        try std.testing.expectEqual(code, encode(x));
    }
    try std.testing.expectEqual(@as(f32, 448), decode(0x7e));
    try std.testing.expectEqual(@as(f32, 0x1p-9), decode(0x01));
    try std.testing.expectEqual(@as(u8, 0x7e), encode(1e9));
    try std.testing.expectEqual(@as(u8, 0xfe), encode(-500));
    try std.testing.expectEqual(@as(u8, 0x7f), encode(std.math.nan(f32)));
    // 1.0625 lies halfway between 1.0 (even) and 1.125: to 1.0; 1.1875 between 1.125 and 1.25 (even).
    try std.testing.expectEqual(@as(f32, 1.0), decode(encode(1.0625)));
    try std.testing.expectEqual(@as(f32, 1.25), decode(encode(1.1875)));
    // Half the smallest subnormal ties to zero; a hair above it rounds up.
    try std.testing.expectEqual(@as(u8, 0), encode(0x1p-10));
    try std.testing.expectEqual(@as(u8, 1), encode(0x1.01p-10));
    // Across the subnormal/normal boundary: 7.5 quanta of 2^-9 ties to 8 (even): the smallest normal.
    try std.testing.expectEqual(@as(u8, 0x08), encode(7.5 * 0x1p-9));
    // Against a float64 nearest-value search over a sweep of magnitudes.
    var x: f64 = 1e-4;
    while (x < 600) : (x *= 1.0137) {
        const got = decode(encode(@floatCast(x)));
        var best: f64 = 0;
        for (0..0x7f) |c| {
            const v: f64 = decode(@intCast(c));
            if (@abs(v - x) < @abs(best - x)) best = v;
        }
        try std.testing.expect(@abs(@as(f64, got) - x) <= @abs(best - x));
    }
}

test "scale exponents cover the row's largest value with the least headroom" {
    for ([_]f32{ 1e-3, 0.5, 1, 3.5, 448, 449, 895, 896, 897, 1000, 20000 }) |amax| {
        const e = scaleExponent(amax);
        const top = std.math.ldexp(@as(f32, max_finite), e);
        if (e < exponent_max) try std.testing.expect(amax <= top);
        if (e > exponent_min) try std.testing.expect(amax > top / 2);
    }
    try std.testing.expectEqual(exponent_min, scaleExponent(0));
    try std.testing.expectEqual(@as(i8, 0), scaleExponent(448));
    try std.testing.expectEqual(@as(i8, 1), scaleExponent(449));
    try std.testing.expectEqual(exponent_max, scaleExponent(1e30));
}

test "the decoded table times a scale is ldexp of the code's value, bit for bit" {
    var e: i8 = exponent_min;
    while (e <= exponent_max) : (e += 1) {
        for (0..256) |code| {
            const ours = decoded[code] * pow2(e);
            const reference = std.math.ldexp(decode(@intCast(code)), e);
            if (std.math.isNan(reference)) {
                try std.testing.expect(std.math.isNan(ours));
            } else {
                try std.testing.expectEqual(@as(u32, @bitCast(reference)), @as(u32, @bitCast(ours)));
            }
        }
    }
}
