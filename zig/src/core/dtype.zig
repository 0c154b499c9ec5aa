//! Element types as safetensors names them, and their sizes.
const std = @import("std");

pub const DType = enum(u8) {
    bool,
    u8,
    i8,
    i16,
    u16,
    f16,
    bf16,
    i32,
    u32,
    f32,
    i64,
    u64,
    f64,

    /// safetensors spells dtypes in capitals ("F16", "BF16", "I16").
    pub fn parse(text: []const u8) ?DType {
        const table = .{
            .{ "BOOL", .bool }, .{ "U8", .u8 },   .{ "I8", .i8 },     .{ "I16", .i16 },
            .{ "U16", .u16 },   .{ "F16", .f16 }, .{ "BF16", .bf16 }, .{ "I32", .i32 },
            .{ "U32", .u32 },   .{ "F32", .f32 }, .{ "I64", .i64 },   .{ "U64", .u64 },
            .{ "F64", .f64 },
        };
        inline for (table) |entry| {
            if (std.mem.eql(u8, text, entry[0])) return entry[1];
        }
        return null;
    }

    pub fn sizeBytes(dtype: DType) u64 {
        return switch (dtype) {
            .bool, .u8, .i8 => 1,
            .i16, .u16, .f16, .bf16 => 2,
            .i32, .u32, .f32 => 4,
            .i64, .u64, .f64 => 8,
        };
    }

    pub fn name(dtype: DType) []const u8 {
        return switch (dtype) {
            .bool => "BOOL",
            .u8 => "U8",
            .i8 => "I8",
            .i16 => "I16",
            .u16 => "U16",
            .f16 => "F16",
            .bf16 => "BF16",
            .i32 => "I32",
            .u32 => "U32",
            .f32 => "F32",
            .i64 => "I64",
            .u64 => "U64",
            .f64 => "F64",
        };
    }
};

/// bf16 is the top half of an f32: widening is exact.
pub fn bf16ToF32(bits: u16) f32 {
    return @bitCast(@as(u32, bits) << 16);
}

pub fn f16ToF32(bits: u16) f32 {
    return @floatCast(@as(f16, @bitCast(bits)));
}

test "dtype names round trip" {
    inline for (@typeInfo(DType).@"enum".field_values) |value| {
        const dtype: DType = @fromBackingInt(@intCast(value));
        try std.testing.expectEqual(dtype, DType.parse(dtype.name()).?);
    }
    try std.testing.expectEqual(@as(?DType, null), DType.parse("F8_E4M3X"));
}

test "bf16 and f16 widen exactly" {
    try std.testing.expectEqual(@as(f32, 1.0), bf16ToF32(0x3F80));
    try std.testing.expectEqual(@as(f32, -2.0), f16ToF32(0xC000));
}
