//! config.json: the fields every family shares, and `quantization_config` (EXL3.md §1.1). Family
//! code (families/glm/) reads its own fields from `root`; this file knows nothing of GLM.
const std = @import("std");
const Diagnostic = @import("diagnostic.zig").Diagnostic;
const MappedFile = @import("mapped_file.zig").MappedFile;

pub const Error = error{ InvalidConfig, UnsupportedQuantization, OutOfMemory } || MappedFile.Error;

pub const Codebook = enum { @"3inst", mcg, mul1 };

pub const Quantization = struct {
    /// ExLlamaV3 version that wrote the files; informational.
    version: ?[]const u8,
    /// numel-weighted mean bits of the decoder linears; informational (EXL3.md §1.1).
    bits: f64,
    /// bits of lm_head, 1..8, or 16 when stored unquantized.
    head_bits: ?f64,
    /// Informational: the codebook of each tensor comes from its marker tensor (EXL3.md §2).
    codebook: ?Codebook,
};

pub const ModelConfig = struct {
    root: std.json.ObjectMap,
    architecture: []const u8,
    model_type: ?[]const u8,
    quantization: ?Quantization,

    /// Returns null when the file does not exist; errors for a file that exists and is wrong.
    pub fn load(arena: std.mem.Allocator, path: []const u8, diag: *Diagnostic) Error!?ModelConfig {
        var map = MappedFile.open(path) catch |err| switch (err) {
            error.FileNotFound => return null,
            else => {
                diag.set("cannot open '{s}': {t}", .{ path, err });
                return err;
            },
        };
        defer map.close();
        return try parse(arena, map.bytes, diag);
    }

    /// Copies what it keeps into `arena`: `bytes` may go away afterwards.
    pub fn parse(arena: std.mem.Allocator, bytes: []const u8, diag: *Diagnostic) Error!ModelConfig {
        const root = std.json.parseFromSliceLeaky(std.json.Value, arena, bytes, .{
            .allocate = .alloc_always,
        }) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            else => {
                diag.set("config.json is not valid JSON ({t})", .{err});
                return error.InvalidConfig;
            },
        };
        if (root != .object) {
            diag.set("config.json is not a JSON object", .{});
            return error.InvalidConfig;
        }
        const fields = root.object;
        const architectures = fields.get("architectures") orelse {
            diag.set("config.json: missing field 'architectures'", .{});
            return error.InvalidConfig;
        };
        const valid = architectures == .array and architectures.array.items.len >= 1 and
            architectures.array.items[0] == .string;
        if (!valid) {
            diag.set("config.json: 'architectures' is not a non-empty list of names", .{});
            return error.InvalidConfig;
        }
        return .{
            .root = fields,
            .architecture = architectures.array.items[0].string,
            .model_type = try optionalString(fields, "model_type", diag),
            .quantization = if (fields.get("quantization_config")) |value|
                try parseQuantization(value, diag)
            else
                null,
        };
    }
};

fn parseQuantization(value: std.json.Value, diag: *Diagnostic) Error!Quantization {
    if (value != .object) {
        diag.set("config.json: 'quantization_config' is not an object", .{});
        return error.InvalidConfig;
    }
    const fields = value.object;
    const method = try optionalString(fields, "quant_method", diag) orelse {
        diag.set("config.json: quantization_config has no 'quant_method'", .{});
        return error.InvalidConfig;
    };
    if (!std.mem.eql(u8, method, "exl3")) {
        diag.set("config.json: quant_method '{s}' is not supported (only 'exl3')", .{method});
        return error.UnsupportedQuantization;
    }
    const bits = try optionalNumber(fields, "bits", diag) orelse {
        diag.set("config.json: quantization_config has no 'bits'", .{});
        return error.InvalidConfig;
    };
    if (!(bits > 0 and bits <= 16)) {
        diag.set("config.json: quantization_config.bits {d} is outside (0, 16]", .{bits});
        return error.InvalidConfig;
    }
    const head_bits = try optionalNumber(fields, "head_bits", diag);
    if (head_bits) |head| {
        const ok = (head >= 1 and head <= 8) or head == 16;
        if (!ok) {
            diag.set("config.json: quantization_config.head_bits {d} is neither 1..8 nor 16", .{head});
            return error.InvalidConfig;
        }
    }
    var codebook: ?Codebook = null;
    if (try optionalString(fields, "codebook", diag)) |name| {
        codebook = std.meta.stringToEnum(Codebook, name) orelse {
            diag.set("config.json: codebook '{s}' is not one of mul1, mcg, 3inst", .{name});
            return error.InvalidConfig;
        };
    }
    return .{
        .version = try optionalString(fields, "version", diag),
        .bits = bits,
        .head_bits = head_bits,
        .codebook = codebook,
    };
}

pub fn optionalString(fields: std.json.ObjectMap, key: []const u8, diag: *Diagnostic) Error!?[]const u8 {
    const value = fields.get(key) orelse return null;
    return switch (value) {
        .null => null,
        .string => |text| text,
        else => {
            diag.set("config.json: '{s}' is not a string", .{key});
            return error.InvalidConfig;
        },
    };
}

pub fn optionalNumber(fields: std.json.ObjectMap, key: []const u8, diag: *Diagnostic) Error!?f64 {
    const value = fields.get(key) orelse return null;
    return switch (value) {
        .null => null,
        .integer => |int| @floatFromInt(int),
        .float => |float| float,
        else => {
            diag.set("config.json: '{s}' is not a number", .{key});
            return error.InvalidConfig;
        },
    };
}

test "quantization_config of a peer checkpoint" {
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: Diagnostic = .{};
    const parsed = try ModelConfig.parse(arena.allocator(),
        \\{"architectures":["Glm4MoeForCausalLM"],"model_type":"glm4_moe",
        \\ "quantization_config":{"quant_method":"exl3","version":"1.6.5","bits":3.0,"head_bits":6,
        \\ "calibration":{"rows":250,"cols":2048},"out_scales":"auto","codebook":"mul1"}}
    , &diag);
    try std.testing.expectEqualStrings("Glm4MoeForCausalLM", parsed.architecture);
    try std.testing.expectEqual(@as(f64, 3.0), parsed.quantization.?.bits);
    try std.testing.expectEqual(Codebook.mul1, parsed.quantization.?.codebook.?);
}

test "wrong configs name the field" {
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: Diagnostic = .{};
    try std.testing.expectError(error.UnsupportedQuantization, ModelConfig.parse(arena.allocator(),
        \\{"architectures":["X"],"quantization_config":{"quant_method":"gptq","bits":4}}
    , &diag));
    try std.testing.expect(std.mem.indexOf(u8, diag.message(), "gptq") != null);
    try std.testing.expectError(error.InvalidConfig, ModelConfig.parse(arena.allocator(), "{\"model_type\":\"x\"}", &diag));
    try std.testing.expect(std.mem.indexOf(u8, diag.message(), "architectures") != null);
    try std.testing.expectError(error.InvalidConfig, ModelConfig.parse(arena.allocator(),
        \\{"architectures":["X"],"quantization_config":{"quant_method":"exl3","bits":3,"codebook":"q8"}}
    , &diag));
}
