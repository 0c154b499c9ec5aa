//! The GLM config (GLM.md §2): which class a checkpoint is, its sizes, and per layer which parts it
//! is built from (parts/). Size fields are required and a missing one is an error naming it;
//! behaviour fields take the class's transformers defaults, since the reference implementation is
//! what a checkpoint was written for. Adding a class is a row of `classes` and its part fields.
const std = @import("std");
const core = @import("../../core/root.zig");
const fields_mod = @import("config_fields.zig");
const rope_mod = @import("rope.zig");
const Diagnostic = core.Diagnostic;
const Fields = fields_mod.Fields;
const next_fields = @import("config_next.zig");

pub const Error = fields_mod.Error;

pub const layers_max = 512;
pub const experts_max = 1024;
pub const experts_per_token_max = 64;
pub const kda_head_dim_max = 512; // parts/kda.zig dim_max
pub const pool_max = 256; // parts/kpool.zig pool_max
pub const hyper_mult_max = 16; // parts/hyper.zig mult_max (the GPU takes at most 5)

pub const Class = enum { glm4_moe, glm4_moe_lite, glm_moe_dsa, glm5_next };

/// Architecture name (config.json `architectures[0]`) to class, and the class's default
/// routed_scaling_factor in transformers.
const classes = [_]struct { name: []const u8, class: Class, routed_scaling_default: f64 }{
    .{ .name = "Glm4MoeForCausalLM", .class = .glm4_moe, .routed_scaling_default = 1.0 },
    .{ .name = "Glm4MoeLiteForCausalLM", .class = .glm4_moe_lite, .routed_scaling_default = 1.8 },
    .{ .name = "GlmMoeDsaForCausalLM", .class = .glm_moe_dsa, .routed_scaling_default = 2.5 },
    .{ .name = "Glm5NextForConditionalGeneration", .class = .glm5_next, .routed_scaling_default = 2.5 },
};
pub const supported_architectures = "Glm4MoeForCausalLM, Glm4MoeLiteForCausalLM, GlmMoeDsaForCausalLM, Glm5NextForConditionalGeneration";

/// kda: GLM-5.3-Flash's linear attention (parts/kda.zig).
pub const Attention = enum(u8) { gqa, mla, kda };
pub const Ffn = enum(u8) { dense, moe };
/// A DSA layer's indexer: its own (full), the last full layer's selection (shared), or none.
pub const IndexerUse = enum(u8) { none, full, shared };

pub const LayerPlan = struct { attention: Attention, ffn: Ffn, indexer: IndexerUse = .none };

/// Multi-head latent attention (GLM.md §3.5).
pub const Mla = struct {
    /// 0: q comes from one q_proj (q_lora_rank null).
    q_lora_rank: usize,
    kv_lora_rank: usize,
    nope_dim: usize,
    rope_dim: usize,
    v_dim: usize,
    /// q_a_proj, kv_a_proj_with_mqa and o_proj carry biases (attention_bias).
    bias: bool,
    /// transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm default eps.
    latent_eps: f32 = 1e-6,

    pub fn qkDim(m: Mla) usize {
        return m.nope_dim + m.rope_dim;
    }

    /// What a position of a layer keeps in the cache: the normed latent, then the rotated k_rope.
    pub fn cacheWidth(m: Mla) usize {
        return m.kv_lora_rank + m.rope_dim;
    }
};

/// The DSA lightning indexer (GLM.md §3.6).
pub const Indexer = struct {
    heads: usize,
    head_dim: usize,
    topk: usize,
    /// Its first rope_dim dims are rotated (interleaved), the rest pass.
    rope_dim: usize,
    /// k_norm is a LayerNorm with transformers' default eps.
    eps: f32 = 1e-6,
    /// GLM-5.3-Flash scores pools of `pool` consecutive keys (parts/kpool.zig); 0: every key alone.
    pool: usize = 0,
    /// With pools: the query's incomplete last pool is attended to as well.
    pool_tail: bool = true,

    /// The most positions one query attends to.
    pub fn selectionMax(ix: Indexer) usize {
        return ix.topk + if (ix.pool > 0 and ix.pool_tail) ix.pool - 1 else 0;
    }
};

/// Kimi delta attention, GLM-5.3-Flash's linear attention layers (GLM.md class D).
pub const Kda = struct {
    heads: usize = 0,
    head_dim: usize = 0,
    conv_kernel: usize = 0,
    /// The forget gate is lower_bound·sigmoid(·) when set, else -softplus(·) scaled.
    lower_bound: ?f32 = null,

    pub fn width(k: Kda) usize {
        return k.heads * k.head_dim;
    }
};

/// Manifold-constrained hyper-connections: `mult` residual streams (0: the plain residual).
pub const Hyper = struct {
    mult: usize = 0,
    sinkhorn_iters: usize = 0,
    eps: f32 = 0,

    /// The mixing logits per site: pre (mult), post (mult), comb (mult²).
    pub fn mixes(h: Hyper) usize {
        return (2 + h.mult) * h.mult;
    }

    /// Residual streams carried per row (1 without hyper-connections).
    pub fn streams(h: Hyper) usize {
        return @max(h.mult, 1);
    }
};

pub const Config = struct {
    class: Class,
    hidden_size: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    rope_theta: f64,
    rope: rope_mod.Rope,
    rms_norm_eps: f32,
    attention_bias: bool,
    qk_norm: bool,
    /// softmax(q·k · attention_scale): head_dim^-0.5 for GQA, qk_dim^-0.5 times YaRN's mscale² for
    /// MLA (transformers' yarn_apply_mscale).
    attention_scale: f32,
    mla: Mla,
    indexer: Indexer,
    kda: Kda = .{},
    hyper: Hyper = .{},
    /// MLPs clamp gate above and up both sides at it (GLM-5.3-Flash); inf: no clamp.
    swiglu_limit: f32 = std.math.inf(f32),
    /// Where the text model's tensors live: "model" (or "model.language_model").
    prefix: []const u8 = "model",
    vocab_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    routed_experts: usize,
    shared_experts: usize,
    experts_per_token: usize,
    groups: usize,
    groups_per_token: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
    tie_word_embeddings: bool,
    max_position_embeddings: usize,
    plan: [layers_max]LayerPlan,

    pub fn isDense(config: *const Config, layer: usize) bool {
        return config.plan[layer].ffn == .dense;
    }

    pub fn attentionOf(config: *const Config, layer: usize) Attention {
        return config.plan[layer].attention;
    }

    /// Layers of `kind` before `layer`: the layer's index in its part's cache.
    pub fn indexAmong(config: *const Config, layer: usize, comptime field: []const u8, kind: anytype) usize {
        var count: usize = 0;
        for (config.plan[0..layer]) |p| count += @intFromBool(@field(p, field) == kind);
        return count;
    }

    pub fn countOf(config: *const Config, comptime field: []const u8, kind: anytype) usize {
        return config.indexAmong(config.layers, field, kind);
    }

    pub fn parse(model: *const core.config.ModelConfig, diag: *Diagnostic) Error!Config {
        const row = for (classes) |row| {
            if (std.mem.eql(u8, model.architecture, row.name)) break row;
        } else {
            diag.set("unsupported architecture '{s}' (this build runs {s})", .{ model.architecture, supported_architectures });
            return error.UnsupportedModel;
        };
        const f: Fields = .{ .map = try textFields(model, row.class, diag), .diag = diag };
        try f.checkFunctions();
        var config = try common(f, row.class, row.routed_scaling_default);
        switch (row.class) {
            .glm4_moe => try gqaFields(f, &config),
            .glm4_moe_lite, .glm_moe_dsa => try mlaFields(f, &config),
            .glm5_next => try next_fields.read(f, &config),
        }
        try layerPlan(f, &config);
        try config.validate(diag);
        return config;
    }

    fn validate(config: *const Config, diag: *Diagnostic) Error!void {
        const c = config;
        const m = c.mla;
        const mla = c.class != .glm4_moe;
        const next = c.class == .glm5_next;
        const checks = [_]struct { bool, []const u8 }{
            .{ c.hidden_size > 0, "hidden_size must be positive" },
            .{ c.layers > 0 and c.layers <= layers_max, "num_hidden_layers must be 1..512" },
            .{ c.heads > 0 and c.kv_heads > 0, "head counts must be positive" },
            .{ mla or c.heads % @max(c.kv_heads, 1) == 0, "num_attention_heads must be a multiple of num_key_value_heads" },
            .{ mla or (c.head_dim > 0 and c.head_dim % 2 == 0), "head_dim must be positive and even" },
            .{ c.rotary_dim % 2 == 0 and c.rotary_dim <= rope_mod.dim_max, "the rotated dims must be even and at most 256" },
            .{ mla or c.rotary_dim <= c.head_dim, "partial_rotary_factor x head_dim must be <= head_dim" },
            .{ !mla or (m.kv_lora_rank > 0 and m.nope_dim > 0 and m.v_dim > 0), "kv_lora_rank, qk_nope_head_dim and v_head_dim must be positive" },
            .{ c.class != .glm_moe_dsa or m.q_lora_rank > 0, "GlmMoeDsa needs q_lora_rank (its indexer reads the q latent)" },
            .{ c.class != .glm_moe_dsa or (c.indexer.heads > 0 and c.indexer.topk > 0), "index_n_heads and index_topk must be positive" },
            .{ c.class != .glm_moe_dsa or (c.indexer.head_dim >= c.indexer.rope_dim and c.indexer.head_dim > 0), "index_head_dim must be at least qk_rope_head_dim" },
            .{ !next or m.q_lora_rank > 0, "Glm5Next needs q_lora_rank (its indexer reads the q latent)" },
            .{ !next or m.rope_dim == 0, "Glm5Next's attention is NoPE: qk_rope_head_dim must be 0" },
            .{ !next or c.heads == c.kv_heads, "Glm5Next needs num_key_value_heads == num_attention_heads" },
            .{ !next or (c.indexer.heads > 0 and c.indexer.head_dim > 0 and c.indexer.pool > 0), "index_n_heads, index_head_dim and index_kpool must be positive" },
            .{ !next or c.indexer.topk % @max(c.indexer.pool, 1) == 0, "index_topk must be a multiple of index_kpool" },
            .{ !next or (c.kda.heads > 0 and c.kda.head_dim > 0 and c.kda.conv_kernel > 0), "linear_num_heads, linear_head_dim and linear_conv_kernel_dim must be positive" },
            .{ !next or (c.hyper.mult > 0 and c.hyper.sinkhorn_iters > 0), "hc_mult and hc_sinkhorn_iters must be positive" },
            .{ !next or c.swiglu_limit > 0, "swiglu_limit must be positive" },
            .{ !next or c.kda.head_dim <= kda_head_dim_max, "linear_head_dim must be at most 512" },
            .{ !next or c.indexer.pool <= pool_max, "index_kpool must be at most 256" },
            .{ !next or c.hyper.mult <= hyper_mult_max, "hc_mult must be at most 16" },
            .{ c.rope_theta > 0, "rope_theta must be positive" },
            .{ c.rms_norm_eps > 0, "rms_norm_eps must be positive" },
            .{ c.vocab_size > 0, "vocab_size must be positive" },
            .{ c.routed_experts > 0 and c.routed_experts <= experts_max, "n_routed_experts must be 1..1024" },
            .{ c.experts_per_token > 0 and c.experts_per_token <= @min(c.routed_experts, experts_per_token_max), "num_experts_per_tok must be 1..min(n_routed_experts, 64)" },
            .{ c.groups > 0 and c.routed_experts % @max(c.groups, 1) == 0, "n_routed_experts must be a multiple of n_group" },
            .{ c.groups_per_token > 0 and c.groups_per_token <= c.groups, "topk_group must be 1..n_group" },
        };
        for (checks) |check| {
            if (!check[0]) {
                diag.set("config.json: {s}", .{check[1]});
                return error.InvalidConfig;
            }
        }
        if (c.groups > 1 and c.groups_per_token * (c.routed_experts / c.groups) < c.experts_per_token) {
            diag.set("config.json: topk_group {d} groups of {d} experts hold fewer than num_experts_per_tok {d}", .{ c.groups_per_token, c.routed_experts / c.groups, c.experts_per_token });
            return error.InvalidConfig;
        }
        if (c.groups > 1 and c.routed_experts / c.groups < 2) {
            diag.set("config.json: group-limited routing needs at least 2 experts per group (n_group {d})", .{c.groups});
            return error.InvalidConfig;
        }
    }
};

fn common(f: Fields, class: Class, routed_scaling_default: f64) Error!Config {
    const hidden_size = try f.size("hidden_size", null);
    const heads = try f.size("num_attention_heads", null);
    return .{
        .class = class,
        .hidden_size = hidden_size,
        .layers = try f.size("num_hidden_layers", null),
        .heads = heads,
        .kv_heads = try f.size("num_key_value_heads", heads),
        .head_dim = 0,
        .rotary_dim = 0,
        .rope_theta = try f.ropeNumber("rope_theta", 10000.0),
        .rope = undefined,
        .rms_norm_eps = @floatCast(try f.number("rms_norm_eps", 1e-5)),
        .attention_bias = try f.boolean("attention_bias", false),
        .qk_norm = false,
        .attention_scale = 0,
        .mla = std.mem.zeroes(Mla),
        .indexer = std.mem.zeroes(Indexer),
        .vocab_size = try f.size("vocab_size", null),
        .intermediate_size = try f.size("intermediate_size", null),
        .moe_intermediate_size = try f.size("moe_intermediate_size", null),
        .routed_experts = try f.size("n_routed_experts", null),
        .shared_experts = try f.size("n_shared_experts", 1),
        .experts_per_token = try f.size("num_experts_per_tok", null),
        .groups = try f.size("n_group", 1),
        .groups_per_token = try f.size("topk_group", 1),
        .norm_topk_prob = try f.boolean("norm_topk_prob", true),
        .routed_scaling_factor = @floatCast(try f.number("routed_scaling_factor", routed_scaling_default)),
        .tie_word_embeddings = try f.boolean("tie_word_embeddings", false),
        .max_position_embeddings = try f.size("max_position_embeddings", 131072),
        .plan = undefined,
    };
}

/// Class A: grouped-query attention with partial rotate-half RoPE.
fn gqaFields(f: Fields, c: *Config) Error!void {
    c.head_dim = try f.size("head_dim", if (c.heads > 0) c.hidden_size / c.heads else null);
    c.qk_norm = try f.boolean("use_qk_norm", false);
    const partial = try f.ropeNumber("partial_rotary_factor", 0.5);
    c.rotary_dim = @intFromFloat(@floor(@as(f64, @floatFromInt(c.head_dim)) * partial));
    c.rope = try rope_mod.Rope.parse(f, c.rotary_dim, c.head_dim, .half, c.max_position_embeddings);
    c.rotary_dim = c.rope.dim; // "proportional" rotates the whole head
    c.attention_scale = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(@max(c.head_dim, 1)))));
}

/// Classes B and C: multi-head latent attention; C adds the DSA indexer.
fn mlaFields(f: Fields, c: *Config) Error!void {
    const m: Mla = .{
        .q_lora_rank = try f.sizeOrNull("q_lora_rank", if (c.class == .glm_moe_dsa) 2048 else 768),
        .kv_lora_rank = try f.size("kv_lora_rank", null),
        .nope_dim = try f.size("qk_nope_head_dim", null),
        .rope_dim = try f.size("qk_rope_head_dim", null),
        .v_dim = try f.size("v_head_dim", null),
        .bias = c.attention_bias,
    };
    c.mla = m;
    c.head_dim = m.qkDim();
    c.rotary_dim = m.rope_dim;
    // GlmMoeDsa's attention and indexer always interleave; GLM-4.7-Flash's follows rope_interleave.
    const interleave = c.class == .glm_moe_dsa or try f.boolean("rope_interleave", true);
    c.rope = try rope_mod.Rope.parse(f, m.rope_dim, m.rope_dim, if (interleave) .interleaved else .half, c.max_position_embeddings);
    var scale = 1.0 / @sqrt(@as(f64, @floatFromInt(m.qkDim())));
    if (c.rope.factor) |factor| {
        // transformers' yarn_apply_mscale, for every rope_type but "default".
        const parameters = (try f.ropeObject()).?;
        const p: Fields = .{ .map = parameters, .diag = f.diag };
        const mscale_all_dim = try p.number("mscale_all_dim", 0);
        if (mscale_all_dim != 0) scale *= std.math.pow(f64, rope_mod.yarnMscale(factor, mscale_all_dim), 2);
    }
    c.attention_scale = @floatCast(scale);
    if (c.class == .glm_moe_dsa) c.indexer = .{
        .heads = try f.size("index_n_heads", 32),
        .head_dim = try f.size("index_head_dim", 128),
        .topk = try f.size("index_topk", 2048),
        .rope_dim = m.rope_dim,
    };
}

/// Per layer: the attention part, dense or MoE (mlp_layer_types, else first_k_dense_replace), and
/// for DSA the indexer (indexer_types, else transformers' index_topk_freq schedule).
fn layerPlan(f: Fields, c: *Config) Error!void {
    if (c.layers == 0 or c.layers > layers_max) return f.wrong("num_hidden_layers", "1..512");
    if (c.class == .glm5_next) return next_fields.layerPlan(f, c);
    var names: [layers_max]u8 = undefined;
    const dense_default: usize = if (c.class == .glm_moe_dsa) 3 else 1;
    const mlp_types = try f.layerList("mlp_layer_types", c.layers, &.{ "dense", "sparse" }, &names);
    // GLM-4.7-Flash's transformers config ignores first_k_dense_replace: only layer 0 is dense
    // unless mlp_layer_types says otherwise.
    const first_dense = if (c.class == .glm4_moe_lite) 1 else try f.size("first_k_dense_replace", dense_default);
    if (mlp_types == null and first_dense > c.layers) return f.wrong("first_k_dense_replace", "at most num_hidden_layers");
    for (c.plan[0..c.layers], 0..) |*p, layer| {
        const dense = if (mlp_types) |t| t[layer] == 0 else layer < first_dense;
        p.* = .{ .attention = if (c.class == .glm4_moe) .gqa else .mla, .ffn = if (dense) .dense else .moe };
    }
    if (c.class != .glm_moe_dsa) return;
    try indexerPlan(f, c);
    if (c.plan[0].indexer != .full) {
        f.diag.set("config.json: indexer_types[0] is 'shared', but no earlier layer selects for it", .{});
        return error.InvalidConfig;
    }
}

/// Every layer's indexer use from indexer_types, index_topk_pattern, else transformers'
/// index_topk_freq / index_skip_topk_offset schedule.
pub fn indexerPlan(f: Fields, c: *Config) Error!void {
    var names: [layers_max]u8 = undefined;
    if (try f.layerList("indexer_types", c.layers, &.{ "full", "shared" }, &names)) |kinds| {
        for (c.plan[0..c.layers], kinds) |*p, kind| p.indexer = if (kind == 0) .full else .shared;
    } else if (try indexerPattern(f, c.layers, &names)) |kinds| {
        for (c.plan[0..c.layers], kinds) |*p, kind| p.indexer = if (kind == 0) .full else .shared;
    } else {
        const freq = @max(try f.size("index_topk_freq", 1), 1);
        const offset = try f.size("index_skip_topk_offset", 2);
        for (c.plan[0..c.layers], 0..) |*p, i| p.indexer = if ((i + 1 -| offset) % freq == 0) .full else .shared;
    }
}

/// The object a class's fields live in: GLM-5.3-Flash nests its text model's under `text_config`.
fn textFields(model: *const core.config.ModelConfig, class: Class, diag: *Diagnostic) Error!std.json.ObjectMap {
    if (class != .glm5_next) return model.root;
    const text = model.root.get("text_config") orelse return model.root;
    if (text != .object) {
        diag.set("config.json: 'text_config' is not an object", .{});
        return error.InvalidConfig;
    }
    return text.object;
}

/// transformers' `index_topk_pattern`: a string of F (full) and S (shared) per layer, or a list of
/// "full"/"shared" names.
fn indexerPattern(f: Fields, layers: usize, out: []u8) Error!?[]u8 {
    const value = f.map.get("index_topk_pattern") orelse return null;
    if (value != .string) return try f.layerList("index_topk_pattern", layers, &.{ "full", "shared" }, out);
    if (value.string.len != layers) return f.wrong("index_topk_pattern", "one F or S per layer");
    for (value.string, out[0..layers]) |letter, *slot| slot.* = switch (letter) {
        'F' => 0,
        'S' => 1,
        else => return f.wrong("index_topk_pattern", "one F or S per layer"),
    };
    return out[0..layers];
}
