//! GLM-5.3-Flash's config (`Glm5NextForConditionalGeneration`, fields under `text_config`), read
//! as transformers 5.17's Glm5NextTextConfig reads it: NoPE MLA with a k-pooled DSA indexer on the
//! `deepseek_sparse_attention` layers, KDA on the `linear_attention` ones, `hc_mult` residual
//! streams, clamped SwiGLU. `linear_attn_config`, when present, overrides the linear_* fields.
const std = @import("std");
const config = @import("config.zig");
const fields_mod = @import("config_fields.zig");
const rope_mod = @import("rope.zig");
const Config = config.Config;
const Fields = fields_mod.Fields;
const Error = fields_mod.Error;

pub fn read(f: Fields, c: *Config) Error!void {
    const q_lora_rank = try f.sizeOrNull("q_lora_rank", 1536);
    c.mla = .{
        .q_lora_rank = q_lora_rank,
        .kv_lora_rank = try f.size("kv_lora_rank", 512),
        .nope_dim = try f.size("qk_nope_head_dim", 256),
        .rope_dim = try f.size("qk_rope_head_dim", 0),
        .v_dim = try f.size("v_head_dim", 256),
        .bias = c.attention_bias,
        // Unlike classes B and C, q_a_layernorm and kv_a_layernorm take rms_norm_eps here.
        .latent_eps = c.rms_norm_eps,
    };
    c.head_dim = c.mla.qkDim();
    c.rotary_dim = 0;
    c.rope = .{ .dim = 0, .theta = 10000.0, .style = .interleaved };
    c.attention_scale = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(@max(c.mla.qkDim(), 1)))));
    c.indexer = .{
        .heads = try f.size("index_n_heads", 32),
        .head_dim = try f.size("index_head_dim", 128),
        .topk = try f.size("index_topk", 2048),
        .rope_dim = 0,
        .pool = try f.size("index_kpool", 16),
        .pool_tail = try f.boolean("index_kpool_always_select_tail", true),
    };
    c.kda = try kdaFields(f);
    c.hyper = .{
        .mult = try f.size("hc_mult", 4),
        .sinkhorn_iters = try f.size("hc_sinkhorn_iters", 20),
        .eps = @floatCast(try f.number("hc_eps", 1e-6)),
    };
    c.swiglu_limit = @floatCast(try f.number("swiglu_limit", 10.0));
    c.prefix = "model.language_model";
}

fn kdaFields(f: Fields) Error!config.Kda {
    var kda: config.Kda = .{
        .heads = try f.size("linear_num_heads", 64),
        .head_dim = try f.size("linear_head_dim", 128),
        .conv_kernel = try f.size("linear_conv_kernel_dim", 4),
        .lower_bound = try optionalNumber(f, "linear_lower_bound", -5.0),
    };
    const value = f.map.get("linear_attn_config") orelse return kda;
    if (value == .null) return kda;
    if (value != .object) return f.wrong("linear_attn_config", "an object");
    const l: Fields = .{ .map = value.object, .diag = f.diag };
    kda.head_dim = try l.size("head_dim", kda.head_dim);
    kda.heads = try l.size("num_heads", kda.heads);
    kda.conv_kernel = try l.size("short_conv_kernel_size", kda.conv_kernel);
    if (value.object.get("gate_lower_bound")) |bound| {
        kda.lower_bound = if (bound == .null) null else @floatCast(try l.numberValue("gate_lower_bound", bound, 0));
    }
    // transformers: a "safe gate" (the default) without a bound takes -5.
    if (kda.lower_bound == null and try l.boolean("safe_gate", true)) kda.lower_bound = -5.0;
    return kda;
}

/// A number that may be null (null then), or `default` when absent.
fn optionalNumber(f: Fields, key: []const u8, default: f32) Error!?f32 {
    const value = f.map.get(key) orelse return default;
    if (value == .null) return null;
    return @floatCast(try f.numberValue(key, value, default));
}

/// mlp_layer_types (else the first min(3, layers) dense), layer_types (else every fourth layer
/// DSA), and the DSA layers' indexer use. transformers hands a layer's selection only to the layer
/// right after it, so a shared DSA layer must follow a full one directly.
pub fn layerPlan(f: Fields, c: *Config) Error!void {
    var names: [config.layers_max]u8 = undefined;
    const mlp_types = try f.layerList("mlp_layer_types", c.layers, &.{ "dense", "sparse" }, &names);
    for (c.plan[0..c.layers], 0..) |*p, layer| {
        const dense = if (mlp_types) |t| t[layer] == 0 else layer < 3;
        p.* = .{ .attention = .kda, .ffn = if (dense) .dense else .moe };
    }
    var kinds: [config.layers_max]u8 = undefined;
    const layer_types = try f.layerList("layer_types", c.layers, &.{ "linear_attention", "deepseek_sparse_attention", "full_attention" }, &kinds);
    for (c.plan[0..c.layers], 0..) |*p, layer| {
        const linear = if (layer_types) |t| t[layer] == 0 else layer % 4 != 3;
        if (!linear) p.attention = .mla;
    }
    try config.indexerPlan(f, c);
    for (c.plan[0..c.layers], 0..) |*p, layer| {
        if (p.attention != .mla) {
            p.indexer = .none;
            continue;
        }
        if (p.indexer == .shared and (layer == 0 or c.plan[layer - 1].attention != .mla or c.plan[layer - 1].indexer != .full)) {
            f.diag.set("config.json: layer {d} shares the indexer selection, but layer {d} is not a DSA layer with its own indexer (transformers hands a selection to the next layer only)", .{ layer, layer -| 1 });
            return error.InvalidConfig;
        }
    }
}

test "the fixture-shaped config plans KDA, DSA and dense layers" {
    const core = @import("../../core/root.zig");
    const text =
        \\{"architectures": ["Glm5NextForConditionalGeneration"], "text_config": {
        \\ "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 2, "num_key_value_heads": 2,
        \\ "vocab_size": 32, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 4,
        \\ "num_experts_per_tok": 2, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        \\ "v_head_dim": 16, "index_topk": 8, "index_n_heads": 2, "index_head_dim": 16, "index_kpool": 4,
        \\ "linear_attn_config": {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4, "gate_lower_bound": null, "safe_gate": false},
        \\ "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
        \\ "indexer_types": ["full", "full", "full", "full", "shared"],
        \\ "layer_types": ["linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention", "full_attention"]}}
    ;
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: core.Diagnostic = .{};
    const model = try core.config.ModelConfig.parse(arena.allocator(), text, &diag);
    const c = try Config.parse(&model, &diag);
    try std.testing.expectEqual(.kda, c.plan[0].attention);
    try std.testing.expectEqual(.none, c.plan[2].indexer);
    try std.testing.expectEqual(.full, c.plan[3].indexer);
    try std.testing.expectEqual(.shared, c.plan[4].indexer);
    try std.testing.expectEqual(.mla, c.plan[4].attention);
    try std.testing.expectEqual(.dense, c.plan[0].ffn);
    try std.testing.expectEqual(@as(?f32, null), c.kda.lower_bound);
    try std.testing.expectEqual(@as(usize, 4), c.hyper.mult);
    try std.testing.expectEqual(@as(usize, 11), c.indexer.selectionMax());
    try std.testing.expectEqualStrings("model.language_model", c.prefix);
}
