//! Partial rotary embedding, NeoX rotate-half inside the first `rotary_dim` dims of each head
//! (GLM.md §3.4, the class-A trap): dim j pairs with j + rotary_dim/2 for j < rotary_dim/2, both
//! turned by pos·θ^(-2j/rotary_dim); dims past rotary_dim pass through.
const std = @import("std");
const Config = @import("config.zig").Config;

/// out = [cos_0 .. cos_{half-1}, sin_0 .. sin_{half-1}] for `position`. Follows transformers'
/// f32 arithmetic: inv_freq and the angle pos·inv_freq are rounded to f32 before cos and sin.
pub fn cosSin(c: Config, position: u32, out: []f32) void {
    const half = c.rotary_dim / 2;
    std.debug.assert(out.len == 2 * half);
    for (0..half) |j| {
        const exponent: f32 = @as(f32, @floatFromInt(2 * j)) / @as(f32, @floatFromInt(c.rotary_dim));
        const base_power: f32 = @floatCast(std.math.pow(f64, c.rope_theta, exponent));
        const inv_freq: f32 = 1.0 / base_power;
        const angle: f32 = @as(f32, @floatFromInt(position)) * inv_freq;
        out[j] = @floatCast(@cos(@as(f64, angle)));
        out[half + j] = @floatCast(@sin(@as(f64, angle)));
    }
}

/// Rotates `x` (the first rotary_dim dims of one head) in place.
pub fn apply(x: []f32, cos_sin: []const f32) void {
    const half = x.len / 2;
    std.debug.assert(cos_sin.len == x.len);
    for (0..half) |j| {
        const a = x[j];
        const b = x[j + half];
        const cos = cos_sin[j];
        const sin = cos_sin[half + j];
        x[j] = a * cos - b * sin;
        x[j + half] = b * cos + a * sin;
    }
}

test "position 0 is the identity; a quarter turn swaps the pair" {
    var x = [_]f32{ 1, 2, 3, 4 };
    apply(&x, &.{ 1, 1, 0, 0 });
    try std.testing.expectEqualSlices(f32, &.{ 1, 2, 3, 4 }, &x);
    apply(&x, &.{ 0, 1, 1, 0 }); // pair (0, 2) by 90 degrees, pair (1, 3) unturned
    try std.testing.expectEqualSlices(f32, &.{ -3, 2, 1, 4 }, &x);
}
