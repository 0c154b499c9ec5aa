//! Typed reads of config.json fields, each error naming the field: sizes, numbers, flags, strings
//! and per-layer string lists. RoPE fields are read from the top level or from transformers 5's
//! `rope_parameters` (older files: `rope_scaling`).
const std = @import("std");
const core = @import("../../core/root.zig");
const Diagnostic = core.Diagnostic;

pub const Error = error{ InvalidConfig, UnsupportedModel };

pub const Fields = struct {
    map: std.json.ObjectMap,
    diag: *Diagnostic,

    pub fn size(f: Fields, key: []const u8, default: ?usize) Error!usize {
        const value = f.map.get(key) orelse return default orelse f.missing(key);
        return switch (value) {
            .integer => |int| if (int >= 0) @intCast(int) else f.wrong(key, "a non-negative integer"),
            .null => default orelse f.missing(key),
            else => f.wrong(key, "a non-negative integer"),
        };
    }

    /// A size that may be null (e.g. q_lora_rank: null means no q compression): 0 then.
    pub fn sizeOrNull(f: Fields, key: []const u8, default: usize) Error!usize {
        const value = f.map.get(key) orelse return default;
        return switch (value) {
            .null => 0,
            .integer => |int| if (int > 0) @intCast(int) else f.wrong(key, "a positive integer or null"),
            else => f.wrong(key, "a positive integer or null"),
        };
    }

    pub fn number(f: Fields, key: []const u8, default: f64) Error!f64 {
        const value = f.map.get(key) orelse return default;
        return numberValue(f, key, value, default);
    }

    pub fn numberValue(f: Fields, key: []const u8, value: std.json.Value, default: f64) Error!f64 {
        return switch (value) {
            .integer => |int| @floatFromInt(int),
            .float => |float| float,
            .null => default,
            else => f.wrong(key, "a number"),
        };
    }

    pub fn boolean(f: Fields, key: []const u8, default: bool) Error!bool {
        const value = f.map.get(key) orelse return default;
        return switch (value) {
            .bool => |b| b,
            .null => default,
            else => f.wrong(key, "true or false"),
        };
    }

    /// The RoPE parameter object (`rope_parameters`, else `rope_scaling`), or null.
    pub fn ropeObject(f: Fields) Error!?std.json.ObjectMap {
        for ([_][]const u8{ "rope_parameters", "rope_scaling" }) |key| {
            const value = f.map.get(key) orelse continue;
            if (value == .null) continue;
            if (value != .object) return f.wrong(key, "an object");
            return value.object;
        }
        return null;
    }

    /// Top-level key first (real GLM checkpoints), then the RoPE parameter object.
    pub fn ropeNumber(f: Fields, key: []const u8, default: f64) Error!f64 {
        if (f.map.get(key)) |value| {
            if (value != .null) return f.numberValue(key, value, default);
        }
        const parameters = try f.ropeObject() orelse return default;
        const value = parameters.get(key) orelse return default;
        return f.numberValue(key, value, default);
    }

    /// A list of `layers` strings, each one of `names` (its index is the result), or null when
    /// the key is absent.
    pub fn layerList(f: Fields, key: []const u8, layers: usize, names: []const []const u8, out: []u8) Error!?[]u8 {
        const value = f.map.get(key) orelse return null;
        if (value == .null) return null;
        if (value != .array or value.array.items.len != layers) {
            f.diag.set("config.json: '{s}' is not a list of {d} layer names", .{ key, layers });
            return error.InvalidConfig;
        }
        for (value.array.items, out[0..layers], 0..) |item, *slot, layer| {
            const index = if (item == .string) for (names, 0..) |name, i| {
                if (std.mem.eql(u8, name, item.string)) break i;
            } else null else null;
            slot.* = @intCast(index orelse {
                f.diag.set("config.json: '{s}'[{d}] is not one of the names this engine knows", .{ key, layer });
                return error.UnsupportedModel;
            });
        }
        return out[0..layers];
    }

    /// hidden_act and scoring_func name the only functions the models use; anything else is
    /// refused by name, never ignored.
    pub fn checkFunctions(f: Fields) Error!void {
        if (f.map.get("hidden_act")) |act| {
            if (act != .string or !std.mem.eql(u8, act.string, "silu")) {
                f.diag.set("config.json: hidden_act must be 'silu'", .{});
                return error.UnsupportedModel;
            }
        }
        if (f.map.get("scoring_func")) |func| {
            if (func != .string or !std.mem.eql(u8, func.string, "sigmoid")) {
                f.diag.set("config.json: scoring_func must be 'sigmoid' (GLM.md §2.5)", .{});
                return error.UnsupportedModel;
            }
        }
    }

    pub fn missing(f: Fields, key: []const u8) Error {
        f.diag.set("config.json: missing field '{s}'", .{key});
        return error.InvalidConfig;
    }

    pub fn wrong(f: Fields, key: []const u8, expected: []const u8) Error {
        f.diag.set("config.json: '{s}' is not {s}", .{ key, expected });
        return error.InvalidConfig;
    }
};
