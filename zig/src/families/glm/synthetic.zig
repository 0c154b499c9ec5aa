//! A model of any GLM shape (GQA, MLA with or without the DSA indexer, GLM-5.3-Flash's KDA, pooled
//! indexer and hyper-connections) with random EXL3 weights, made in memory from a config alone: for
//! kernel and step benchmarks at full size without writing or reading checkpoint files. Like the
//! file synthesizer (python/trellisforge/synthesize.py): uniform random trellis words (they decode
//! to the codebook's distribution), random signs with scales that keep activations O(1), norms near
//! 1, a small router. The same seed gives the same weights.
const std = @import("std");
const core = @import("../../core/root.zig");
const exl3 = @import("../../exl3/root.zig");
const weights_mod = @import("weights.zig");
const Linear = @import("linear.zig").Linear;
const Config = @import("config.zig").Config;
const Mlp = @import("parts/mlp.zig").Mlp;
const Mla = @import("parts/mla.zig").Mla;
const Kda = @import("parts/kda.zig").Kda;
const dsa = @import("parts/dsa.zig");
const hyper = @import("parts/hyper.zig");

pub const Error = error{OutOfMemory};

pub fn generate(gpa: std.mem.Allocator, c: Config, bits: u4, head_bits: u4, seed: u64) Error!weights_mod.Weights {
    var prng = std.Random.DefaultPrng.init(seed);
    const random = prng.random();
    var result: weights_mod.Weights = undefined;
    result.config = c;
    result.arena = std.heap.ArenaAllocator.init(gpa);
    errdefer result.arena.deinit();
    const arena = result.arena.allocator();
    var made: std.ArrayList(Linear) = .empty;
    defer made.deinit(gpa);
    errdefer for (made.items) |*linear| linear.deinit(gpa);
    const maker: Maker = .{ .gpa = gpa, .arena = arena, .random = random, .made = &made, .limit = c.swiglu_limit };

    const embedding = try arena.create(core.safetensors.Tensor);
    const table = try maker.values(c.vocab_size * c.hidden_size, 0, 1.0);
    embedding.* = .{ .name = "model.embed_tokens.weight", .dtype = .f32, .shape_buffer = @splat(0), .rank = 2, .data = std.mem.sliceAsBytes(table) };
    embedding.shape_buffer[0] = c.vocab_size;
    embedding.shape_buffer[1] = c.hidden_size;
    result.embedding = .{ .tensor = embedding };
    result.blocks = try arena.alloc(weights_mod.Block, c.layers);
    const h = c.hidden_size;
    for (result.blocks, 0..) |*block, layer| {
        block.* = .{
            .input_norm = try maker.values(h, 1.0, 0.05),
            .post_attention_norm = try maker.values(h, 1.0, 0.05),
            .attention = switch (c.plan[layer].attention) {
                .gqa => .{ .gqa = .{
                    .q = try maker.linear(h, c.heads * c.head_dim, bits, c.attention_bias),
                    .k = try maker.linear(h, c.kv_heads * c.head_dim, bits, c.attention_bias),
                    .v = try maker.linear(h, c.kv_heads * c.head_dim, bits, c.attention_bias),
                    .o = try maker.linear(c.heads * c.head_dim, h, bits, false),
                    .q_norm = if (c.qk_norm) try maker.values(c.head_dim, 1.0, 0.05) else null,
                    .k_norm = if (c.qk_norm) try maker.values(c.head_dim, 1.0, 0.05) else null,
                } },
                .mla => .{ .mla = try maker.mla(&c, layer, bits) },
                .kda => .{ .kda = try maker.kda(&c, bits) },
            },
            .hyper = if (c.hyper.mult > 0) .{ .attn = try maker.site(&c), .ffn = try maker.site(&c) } else null,
            .ffn = undefined,
        };
        if (c.isDense(layer)) {
            block.ffn = .{ .dense = try maker.mlp(h, c.intermediate_size, bits) };
            continue;
        }
        const experts = try arena.alloc(Mlp, c.routed_experts);
        for (experts) |*e| e.* = try maker.mlp(h, c.moe_intermediate_size, bits);
        block.ffn = .{ .moe = .{
            .router = try maker.values(c.routed_experts * h, 0, 1.0 / @sqrt(@as(f32, @floatFromInt(h)))),
            .correction_bias = try maker.values(c.routed_experts, 0, 0.01),
            .experts = experts,
            .shared = if (c.shared_experts > 0) try maker.mlp(h, c.moe_intermediate_size * c.shared_experts, bits) else null,
        } };
    }
    result.norm = try maker.values(h, 1.0, 0.05);
    result.lm_head = try maker.linear(h, c.vocab_size, head_bits, false);
    made.clearRetainingCapacity(); // the Weights own them now
    return result;
}

const Maker = struct {
    gpa: std.mem.Allocator,
    arena: std.mem.Allocator,
    random: std.Random,
    made: *std.ArrayList(Linear),
    limit: f32,

    fn values(m: Maker, count: usize, center: f32, spread: f32) Error![]f32 {
        const out = try m.arena.alloc(f32, count);
        for (out) |*v| v.* = center + spread * m.random.floatNorm(f32);
        return out;
    }

    /// MLA as converters store it: every projection EXL3 but kv_b_proj, kept unquantized (the
    /// peer's converter writes it fp16), and for a full DSA layer the indexer's wq_b EXL3, its
    /// small wk and weights_proj unquantized.
    fn mla(m: Maker, c: *const Config, layer: usize, bits: u4) Error!Mla {
        const a = c.mla;
        const h = c.hidden_size;
        const kv_b = try m.dense(a.kv_lora_rank, c.heads * (a.nope_dim + a.v_dim), 1.0 / @sqrt(@as(f32, @floatFromInt(a.kv_lora_rank))));
        return .{
            .q_a = if (a.q_lora_rank > 0) try m.linear(h, a.q_lora_rank, bits, a.bias) else null,
            .q_a_norm = if (a.q_lora_rank > 0) try m.values(a.q_lora_rank, 1.0, 0.05) else &.{},
            .q_b = if (a.q_lora_rank > 0) try m.linear(a.q_lora_rank, c.heads * a.qkDim(), bits, false) else null,
            .q = if (a.q_lora_rank == 0) try m.linear(h, c.heads * a.qkDim(), bits, false) else null,
            .kv_a = try m.linear(h, a.cacheWidth(), bits, a.bias),
            .kv_a_norm = try m.values(a.kv_lora_rank, 1.0, 0.05),
            .kv_b = kv_b,
            .o = try m.linear(c.heads * a.v_dim, h, bits, a.bias),
            .pooled = if (c.plan[layer].indexer != .full or c.indexer.pool == 0) null else .{
                .keys = try m.indexer(c, bits),
                .gate = try m.values(c.indexer.head_dim * h, 0, 1.0 / @sqrt(@as(f32, @floatFromInt(h)))),
                .ape = try m.values(c.indexer.pool * c.indexer.head_dim, 0, 0.1),
            },
            .indexer = if (c.plan[layer].indexer != .full or c.indexer.pool > 0) null else try m.indexer(c, bits),
        };
    }

    /// The DSA indexer's projections: wq_b EXL3, the small wk and weights_proj unquantized.
    fn indexer(m: Maker, c: *const Config, bits: u4) Error!dsa.Indexer {
        const h = c.hidden_size;
        return .{
            .wq_b = try m.linear(c.mla.q_lora_rank, c.indexer.heads * c.indexer.head_dim, bits, false),
            .wk = try m.dense(h, c.indexer.head_dim, 1.0 / @sqrt(@as(f32, @floatFromInt(h)))),
            .weights_proj = try m.dense(h, c.indexer.heads, 1.0 / @sqrt(@as(f32, @floatFromInt(h)))),
            .k_norm_weight = try m.values(c.indexer.head_dim, 1.0, 0.05),
            .k_norm_bias = try m.values(c.indexer.head_dim, 0.0, 0.05),
        };
    }

    /// KDA as the peer's converter stores it: qkv_proj and o_proj EXL3, the gates' small
    /// projections unquantized; A_log 0 as transformers initializes it under a lower bound.
    fn kda(m: Maker, c: *const Config, bits: u4) Error!Kda {
        const k = c.kda;
        const h = c.hidden_size;
        const w = k.width();
        const inverse = struct {
            fn sqrt(n: usize) f32 {
                return 1.0 / @sqrt(@as(f32, @floatFromInt(n)));
            }
        }.sqrt;
        return .{
            .qkv = .{ .fused = try m.linear(h, 3 * w, bits, false) },
            .conv = try m.values(3 * w * k.conv_kernel, 0, 0.5),
            .f_a = try m.dense(h, k.head_dim, inverse(h)),
            .f_b = try m.dense(k.head_dim, w, inverse(k.head_dim)),
            .dt_bias = try m.values(w, -3, 0.5),
            .a_log = try m.values(k.heads, 0, 0),
            .b = try m.dense(h, k.heads, inverse(h)),
            .g_a = try m.dense(h, k.head_dim, inverse(h)),
            .g_b = try m.dense(k.head_dim, w, inverse(k.head_dim)),
            .o_norm = try m.values(k.head_dim, 1.0, 0.05),
            .o = try m.linear(w, h, bits, false),
        };
    }

    /// A hyper-connection site: small mixing weights around transformers' init (base 0, scale 1).
    fn site(m: Maker, c: *const Config) Error!hyper.Site {
        const hc = c.hyper;
        return .{
            .mix = try m.values(hc.mixes() * hc.mult * c.hidden_size, 0, 0.02),
            .base = try m.values(hc.mixes(), 0, 0.1),
            .scale = try m.values(3, 1, 0),
        };
    }

    /// An unquantized (out, in) layer with Gaussian weights of standard deviation `scale`, f16
    /// values as checkpoints store these projections (the GPU then keeps them as f16).
    fn dense(m: Maker, in_features: usize, out_features: usize, scale: f32) Error!Linear {
        try m.made.ensureUnusedCapacity(m.gpa, 1);
        const weight = try m.gpa.alloc(f32, in_features * out_features);
        for (weight) |*w| w.* = @as(f16, @floatCast(scale * m.random.floatNorm(f32)));
        const result: Linear = .{ .in_features = in_features, .out_features = out_features, .kind = .{ .dense = .{ .weight = weight, .bias = null } } };
        m.made.appendAssumeCapacity(result);
        return result;
    }

    fn mlp(m: Maker, hidden: usize, intermediate: usize, bits: u4) Error!Mlp {
        return .{
            .gate = try m.linear(hidden, intermediate, bits, false),
            .up = try m.linear(hidden, intermediate, bits, false),
            .down = try m.linear(intermediate, hidden, bits, false),
            .limit = m.limit,
        };
    }

    /// An EXL3 MUL1 layer of (in, out) features, its buffers owned like a tensor-parallel slice.
    fn linear(m: Maker, in_features: usize, out_features: usize, bits: u4, bias: bool) Error!Linear {
        const rows = std.mem.alignForward(usize, in_features, exl3.hadamard.block);
        const columns = std.mem.alignForward(usize, out_features, exl3.hadamard.block);
        const rate: exl3.trellis.Rate = .{ .bits2 = 2 * @as(u8, bits) };
        const words_len = (rows / 16) * (columns / 16) * rate.wordsPerTile();
        // Room in `made` first, so that once the buffers exist nothing below can fail.
        try m.made.ensureUnusedCapacity(m.gpa, 1);
        const owned = try m.gpa.alloc(u16, words_len + rows + columns);
        errdefer m.gpa.free(owned);
        m.random.bytes(std.mem.sliceAsBytes(owned[0..words_len]));
        const suh = owned[words_len..][0..rows];
        const svh = owned[words_len + rows ..][0..columns];
        const out_scale = 1.0 / @sqrt(@as(f32, @floatFromInt(in_features)));
        for (suh) |*v| v.* = @bitCast(@as(f16, @floatCast(m.sign() * (0.75 + 0.5 * m.random.float(f32)))));
        for (svh, 0..) |*v, n| v.* = @bitCast(@as(f16, @floatCast(if (n < out_features) m.sign() * out_scale * (0.75 + 0.5 * m.random.float(f32)) else 0)));
        var bias_values: ?[]f32 = null;
        if (bias) {
            bias_values = try m.gpa.alloc(f32, columns);
            for (bias_values.?) |*v| v.* = 0.02 * m.random.floatNorm(f32);
        }
        const result: Linear = .{ .in_features = in_features, .out_features = out_features, .kind = .{ .exl3 = .{
            .rows = rows,
            .columns = columns,
            .rate = rate,
            .codebook = .mul1,
            .words = owned[0..words_len],
            .suh = suh,
            .svh = svh,
            .bias = if (bias_values) |b| .{ .f32 = b } else null,
            .owned = null,
            .owned_slice = owned,
            .owned_bias = bias_values,
        } } };
        m.made.appendAssumeCapacity(result);
        return result;
    }

    fn sign(m: Maker) f32 {
        return if (m.random.boolean()) 1 else -1;
    }
};

test "every allocation failure unwinds without a leak; the seed fixes the weights" {
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: core.Diagnostic = .{};
    const model = try core.config.ModelConfig.parse(arena.allocator(),
        \\{"architectures":["Glm4MoeForCausalLM"],"hidden_size":128,"num_hidden_layers":2,
        \\ "num_attention_heads":2,"num_key_value_heads":1,"head_dim":64,"intermediate_size":256,
        \\ "moe_intermediate_size":128,"n_routed_experts":2,"num_experts_per_tok":1,"n_shared_experts":1,
        \\ "first_k_dense_replace":1,"attention_bias":true,"use_qk_norm":true,"vocab_size":256,
        \\ "partial_rotary_factor":0.5}
    , &diag);
    const config = try Config.parse(&model, &diag);
    try std.testing.checkAllAllocationFailures(std.testing.allocator, generateAndFree, .{ config, 7 });

    var a = try generate(std.testing.allocator, config, 3, 6, 7);
    defer a.deinit(std.testing.allocator);
    var b = try generate(std.testing.allocator, config, 3, 6, 7);
    defer b.deinit(std.testing.allocator);
    try std.testing.expect(std.mem.eql(u8, std.mem.sliceAsBytes(a.lm_head.kind.exl3.words), std.mem.sliceAsBytes(b.lm_head.kind.exl3.words)));
    try std.testing.expectEqualSlices(f32, a.blocks[1].ffn.moe.router, b.blocks[1].ffn.moe.router);
    try std.testing.expect(a.blocks[1].ffn.moe.shared != null);
}

fn generateAndFree(gpa: std.mem.Allocator, config: Config, seed: u64) !void {
    var weights = try generate(gpa, config, 3, 6, seed);
    weights.deinit(gpa);
}
