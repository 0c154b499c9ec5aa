//! The small f32 operations every part's CPU forward shares: norms, SiLU, residual adds. Row by row
//! in a fixed order, so a row's bits never depend on its batch.
const std = @import("std");

pub fn silu(z: f32) f32 {
    return z / (1.0 + @exp(-z));
}

pub fn addInto(target: []f32, source: []const f32) void {
    for (target, source) |*t, s| t.* += s;
}

pub fn rmsNormRows(x: []const f32, weight: []const f32, eps: f32, out: []f32) void {
    const width = weight.len;
    for (0..x.len / width) |r| rmsNorm(x[r * width ..][0..width], weight, eps, out[r * width ..][0..width]);
}

/// w ⊙ x / sqrt(mean(x²) + eps) (GLM.md §3.1); the mean of squares is accumulated in f64.
/// `out` may alias `x`.
pub fn rmsNorm(x: []const f32, weight: []const f32, eps: f32, out: []f32) void {
    var sum: f64 = 0;
    for (x) |v| sum += @as(f64, v) * v;
    const mean: f32 = @floatCast(sum / @as(f64, @floatFromInt(x.len)));
    const inverse = 1.0 / @sqrt(mean + eps);
    for (out, x, weight) |*o, v, w| o.* = w * (v * inverse);
}

/// (x - mean) / sqrt(var + eps) ⊙ w + b, the biased variance, as torch's LayerNorm (the DSA
/// indexer's k_norm); sums in f64. `out` may alias `x`.
pub fn layerNorm(x: []const f32, weight: []const f32, bias: []const f32, eps: f32, out: []f32) void {
    var sum: f64 = 0;
    for (x) |v| sum += v;
    const n: f64 = @floatFromInt(x.len);
    const mean: f32 = @floatCast(sum / n);
    var squares: f64 = 0;
    for (x) |v| squares += @as(f64, v - mean) * (v - mean);
    const inverse = 1.0 / @sqrt(@as(f32, @floatCast(squares / n)) + eps);
    for (out, x, weight, bias) |*o, v, w, b| o.* = (v - mean) * inverse * w + b;
}

test "layer norm centres and scales" {
    var out: [4]f32 = undefined;
    layerNorm(&.{ 1, 2, 3, 4 }, &.{ 1, 1, 1, 2 }, &.{ 0, 0, 0, 1 }, 0, &out);
    const s: f32 = 1.0 / @sqrt(@as(f32, 1.25));
    try std.testing.expectApproxEqAbs(-1.5 * s, out[0], 1e-6);
    try std.testing.expectApproxEqAbs(2 * 1.5 * s + 1, out[3], 1e-6);
}
