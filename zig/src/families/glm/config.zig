//! The GLM class-A config (`Glm4MoeForCausalLM`, GLM.md §2.1, §2.5). Size fields are required and
//! a missing one is an error naming it; behaviour fields take transformers' defaults, since the
//! reference implementation is what a checkpoint was written for. RoPE fields are read from the top
//! level or from transformers 5's `rope_parameters`.
const std = @import("std");
const core = @import("../../core/root.zig");
const Diagnostic = core.Diagnostic;

pub const Error = error{ InvalidConfig, UnsupportedModel };

pub const supported_architecture = "Glm4MoeForCausalLM";
pub const layers_max = 512;
pub const experts_max = 1024;
pub const experts_per_token_max = 64;

pub const Config = struct {
    hidden_size: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    rope_theta: f64,
    rms_norm_eps: f32,
    attention_bias: bool,
    qk_norm: bool,
    vocab_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    routed_experts: usize,
    shared_experts: usize,
    experts_per_token: usize,
    first_dense_layers: usize,
    groups: usize,
    groups_per_token: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
    tie_word_embeddings: bool,
    max_position_embeddings: usize,

    pub fn isDense(config: *const Config, layer: usize) bool {
        return layer < config.first_dense_layers;
    }

    pub fn parse(model: *const core.config.ModelConfig, diag: *Diagnostic) Error!Config {
        if (!std.mem.eql(u8, model.architecture, supported_architecture)) {
            diag.set("unsupported architecture '{s}' (this build runs {s})", .{ model.architecture, supported_architecture });
            return error.UnsupportedModel;
        }
        const f: Fields = .{ .map = model.root, .diag = diag };
        const hidden_size = try f.size("hidden_size", null);
        const heads = try f.size("num_attention_heads", null);
        var config: Config = .{
            .hidden_size = hidden_size,
            .layers = try f.size("num_hidden_layers", null),
            .heads = heads,
            .kv_heads = try f.size("num_key_value_heads", heads),
            .head_dim = try f.size("head_dim", if (heads > 0) hidden_size / heads else null),
            .rotary_dim = 0,
            .rope_theta = try f.ropeNumber("rope_theta", 10000.0),
            .rms_norm_eps = @floatCast(try f.number("rms_norm_eps", 1e-5)),
            .attention_bias = try f.boolean("attention_bias", false),
            .qk_norm = try f.boolean("use_qk_norm", false),
            .vocab_size = try f.size("vocab_size", null),
            .intermediate_size = try f.size("intermediate_size", null),
            .moe_intermediate_size = try f.size("moe_intermediate_size", null),
            .routed_experts = try f.size("n_routed_experts", null),
            .shared_experts = try f.size("n_shared_experts", 1),
            .experts_per_token = try f.size("num_experts_per_tok", null),
            .first_dense_layers = try f.size("first_k_dense_replace", 1),
            .groups = try f.size("n_group", 1),
            .groups_per_token = try f.size("topk_group", 1),
            .norm_topk_prob = try f.boolean("norm_topk_prob", true),
            .routed_scaling_factor = @floatCast(try f.number("routed_scaling_factor", 1.0)),
            .tie_word_embeddings = try f.boolean("tie_word_embeddings", false),
            .max_position_embeddings = try f.size("max_position_embeddings", 131072),
        };
        const partial = try f.ropeNumber("partial_rotary_factor", 0.5);
        config.rotary_dim = @intFromFloat(@floor(@as(f64, @floatFromInt(config.head_dim)) * partial));
        try f.checkUnsupported();
        try config.validate(diag);
        return config;
    }

    fn validate(config: *const Config, diag: *Diagnostic) Error!void {
        const checks = [_]struct { bool, []const u8 }{
            .{ config.hidden_size > 0, "hidden_size must be positive" },
            .{ config.layers > 0 and config.layers <= layers_max, "num_hidden_layers must be 1..512" },
            .{ config.heads > 0 and config.kv_heads > 0, "head counts must be positive" },
            .{ config.heads % @max(config.kv_heads, 1) == 0, "num_attention_heads must be a multiple of num_key_value_heads" },
            .{ config.head_dim > 0 and config.head_dim % 2 == 0, "head_dim must be positive and even" },
            .{ config.rotary_dim % 2 == 0 and config.rotary_dim <= config.head_dim, "partial_rotary_factor x head_dim must be an even number of dims <= head_dim" },
            .{ config.rope_theta > 0, "rope_theta must be positive" },
            .{ config.rms_norm_eps > 0, "rms_norm_eps must be positive" },
            .{ config.vocab_size > 0, "vocab_size must be positive" },
            .{ config.routed_experts > 0 and config.routed_experts <= experts_max, "n_routed_experts must be 1..1024" },
            .{ config.experts_per_token > 0 and config.experts_per_token <= @min(config.routed_experts, experts_per_token_max), "num_experts_per_tok must be 1..min(n_routed_experts, 64)" },
            .{ config.groups > 0 and config.routed_experts % @max(config.groups, 1) == 0, "n_routed_experts must be a multiple of n_group" },
            .{ config.groups_per_token > 0 and config.groups_per_token <= config.groups, "topk_group must be 1..n_group" },
            .{ config.first_dense_layers <= config.layers, "first_k_dense_replace must be <= num_hidden_layers" },
        };
        for (checks) |check| {
            if (!check[0]) {
                diag.set("config.json: {s}", .{check[1]});
                return error.InvalidConfig;
            }
        }
        if (config.groups > 1 and config.routed_experts / config.groups < 2) {
            diag.set("config.json: group-limited routing needs at least 2 experts per group (n_group {d})", .{config.groups});
            return error.InvalidConfig;
        }
    }
};

const Fields = struct {
    map: std.json.ObjectMap,
    diag: *Diagnostic,

    fn size(f: Fields, key: []const u8, default: ?usize) Error!usize {
        const value = f.map.get(key) orelse return default orelse f.missing(key);
        return switch (value) {
            .integer => |int| if (int >= 0) @intCast(int) else f.wrong(key, "a non-negative integer"),
            .null => default orelse f.missing(key),
            else => f.wrong(key, "a non-negative integer"),
        };
    }

    fn number(f: Fields, key: []const u8, default: f64) Error!f64 {
        const value = f.map.get(key) orelse return default;
        return numberValue(f, key, value, default);
    }

    fn numberValue(f: Fields, key: []const u8, value: std.json.Value, default: f64) Error!f64 {
        return switch (value) {
            .integer => |int| @floatFromInt(int),
            .float => |float| float,
            .null => default,
            else => f.wrong(key, "a number"),
        };
    }

    /// Top-level key first (real GLM checkpoints), then `rope_parameters` (transformers 5).
    fn ropeNumber(f: Fields, key: []const u8, default: f64) Error!f64 {
        if (f.map.get(key)) |value| {
            if (value != .null) return f.numberValue(key, value, default);
        }
        const parameters = f.map.get("rope_parameters") orelse return default;
        if (parameters != .object) return default;
        const value = parameters.object.get(key) orelse return default;
        return f.numberValue(key, value, default);
    }

    fn boolean(f: Fields, key: []const u8, default: bool) Error!bool {
        const value = f.map.get(key) orelse return default;
        return switch (value) {
            .bool => |b| b,
            .null => default,
            else => f.wrong(key, "true or false"),
        };
    }

    /// Settings this engine does not implement are refused by name, never ignored.
    fn checkUnsupported(f: Fields) Error!void {
        if (f.map.get("hidden_act")) |act| {
            if (act != .string or !std.mem.eql(u8, act.string, "silu")) {
                f.diag.set("config.json: hidden_act must be 'silu'", .{});
                return error.UnsupportedModel;
            }
        }
        for ([_][]const u8{ "rope_scaling", "rope_parameters" }) |key| {
            const value = f.map.get(key) orelse continue;
            if (value == .null) continue;
            if (value != .object) {
                f.diag.set("config.json: {s} is not an object", .{key});
                return error.InvalidConfig;
            }
            const kind = value.object.get("rope_type") orelse value.object.get("type") orelse continue;
            if (kind != .string or !std.mem.eql(u8, kind.string, "default")) {
                f.diag.set("config.json: {s}.rope_type other than 'default' is not supported", .{key});
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

    fn missing(f: Fields, key: []const u8) Error {
        f.diag.set("config.json: missing field '{s}'", .{key});
        return error.InvalidConfig;
    }

    fn wrong(f: Fields, key: []const u8, expected: []const u8) Error {
        f.diag.set("config.json: '{s}' is not {s}", .{ key, expected });
        return error.InvalidConfig;
    }
};
