//! The three codebooks: a 16-bit trellis state to an fp16 weight, with the fp16 rounding points
//! that are part of the format (EXL3.md §6.2, pitfall 6). zig/kernels/cuda/exl3_codebook.cuh is
//! the device half; tf-cuda-test exl3-decode checks the two agree on every state.
const std = @import("std");
const Once = @import("../core/once.zig").Once;

pub const Codebook = enum(u8) {
    @"3inst" = 0,
    mcg = 1,
    mul1 = 2,
};

pub const inst3_multiplier: u32 = 0x05517C72;
pub const inst3_addend: u32 = 0x03D45AA4;
pub const mcg_multiplier: u32 = 0xCBAC1FED;
pub const mul1_multiplier: u32 = 0x83DCD12D;
const half_mask: u32 = 0x8FFF8FFF;
const half_xor: u32 = 0x3B603B60;
const mul1_scale: f16 = @bitCast(@as(u16, 0x1EEE));
const mul1_bias: f16 = @bitCast(@as(u16, 0xC931));

/// fp16 bits of the weight that `state` decodes to.
pub fn decode(codebook: Codebook, state: u16) u16 {
    const s: u32 = state;
    return switch (codebook) {
        .@"3inst" => sumOfHalves(s *% inst3_multiplier +% inst3_addend),
        .mcg => sumOfHalves(s *% mcg_multiplier),
        .mul1 => mul1(s *% mul1_multiplier),
    };
}

/// One fp16 add of the two masked halves, rounded once (the device's __hadd). The f64 sum of two
/// fp16 values is exact, so the single cast rounds exactly once.
fn sumOfHalves(product: u32) u16 {
    const x = (product & half_mask) ^ half_xor;
    const low: f16 = @bitCast(@as(u16, @truncate(x)));
    const high: f16 = @bitCast(@as(u16, @truncate(x >> 16)));
    const sum: f64 = @as(f64, low) + @as(f64, high);
    return @bitCast(@as(f16, @floatCast(sum)));
}

/// h = 1024 + (sum of the four bytes), then one fused multiply-add rounded once (__hfma). In f64
/// h·scale + bias is exact (h < 2^11, scale has 11 significant bits), so the cast is the rounding.
fn mul1(product: u32) u16 {
    var byte_sum: u32 = 0;
    inline for (0..4) |i| byte_sum += (product >> (8 * i)) & 0xFF;
    const h: f64 = @floatFromInt(1024 + byte_sum);
    const result: f64 = h * @as(f64, mul1_scale) + @as(f64, mul1_bias);
    return @bitCast(@as(f16, @floatCast(result)));
}

/// Every state's weight as f32, per codebook: the CPU matmul's decoder is one load per weight.
pub const Table = [1 << 16]f32;
var tables: [3]Table = undefined;
var tables_once: Once(fillTables) = .{};

fn fillTables() void {
    for (&tables, 0..) |*values, index| {
        const cb: Codebook = @fromBackingInt(@intCast(index));
        for (values, 0..) |*value, state| {
            value.* = @floatCast(@as(f16, @bitCast(decode(cb, @intCast(state)))));
        }
    }
}

pub fn table(cb: Codebook) *const Table {
    tables_once.call();
    return &tables[@backingInt(cb)];
}

test "worked examples and test vectors of EXL3.md §6.3" {
    const states = [_]u16{ 0x0000, 0x0001, 0x1234, 0x8000, 0xABCD, 0xFFFF };
    const inst3 = [_]u16{ 0x3A25, 0xBB5B, 0xC066, 0xB7F8, 0xB98E, 0xB110 };
    const mcg = [_]u16{ 0x3F60, 0x304E, 0x3E0F, 0xB915, 0x35E7, 0x3ACD };
    const mul1_bits = [_]u16{ 0xC2E8, 0x3921, 0xB89E, 0xBAF2, 0xBD42, 0xB936 };
    for (states, inst3, mcg, mul1_bits) |state, a, b, c| {
        try std.testing.expectEqual(a, decode(.@"3inst", state));
        try std.testing.expectEqual(b, decode(.mcg, state));
        try std.testing.expectEqual(c, decode(.mul1, state));
    }
}

test "codebook statistics of EXL3.md §6.4" {
    const expected_rms = [_]f64{ 1.243711, 1.244112, 1.000312 };
    for (expected_rms, 0..) |rms_expected, index| {
        const values = table(@fromBackingInt(@intCast(index)));
        var sum_squares: f64 = 0;
        for (values) |v| sum_squares += @as(f64, v) * v;
        const rms = @sqrt(sum_squares / values.len);
        try std.testing.expectApproxEqAbs(rms_expected, rms, 1e-6);
    }
}
