//! A GLM checkpoint's weights, layer by layer as the config plans them (parts/): each layer's
//! attention part (GQA or MLA, with or without the DSA indexer) and FFN part (dense MLP or MoE)
//! loads its own tensors, shape and dtype checked (loader.zig). Norms are widened to f32 once, the
//! embedding kept as a view. A missing tensor is an error naming it, and so is any tensor no part
//! claims, except the MTP ("nextn") layer, which is skipped.
const std = @import("std");
const core = @import("../../core/root.zig");
const linear_mod = @import("linear.zig");
const loader_mod = @import("loader.zig");
const Config = @import("config.zig").Config;
const Gqa = @import("parts/gqa.zig").Gqa;
const Mla = @import("parts/mla.zig").Mla;
const Kda = @import("parts/kda.zig").Kda;
const hyper = @import("parts/hyper.zig");
const Mlp = @import("parts/mlp.zig").Mlp;
const Moe = @import("parts/moe.zig").Moe;
const Linear = linear_mod.Linear;
const Diagnostic = core.Diagnostic;
const Tensor = core.safetensors.Tensor;

pub const Error = loader_mod.Error;

pub const Attention = union(enum) { gqa: Gqa, mla: Mla, kda: Kda };
/// The hyper-connection sites of a layer (GLM-5.3-Flash), before attention and before the FFN.
pub const HyperSites = struct { attn: hyper.Site, ffn: hyper.Site };
pub const Ffn = union(enum) { dense: Mlp, moe: Moe };

pub const Block = struct {
    input_norm: []f32,
    post_attention_norm: []f32,
    attention: Attention,
    ffn: Ffn,
    /// null: the plain residual.
    hyper: ?HyperSites = null,

    fn deinit(block: *Block, gpa: std.mem.Allocator) void {
        switch (block.attention) {
            inline else => |*part| part.deinit(gpa),
        }
        switch (block.ffn) {
            inline else => |*part| part.deinit(gpa),
        }
    }

    fn scratchLength(block: *const Block, rows: usize) usize {
        const attention = switch (block.attention) {
            inline else => |*part| part.scratchLength(rows),
        };
        const ffn = switch (block.ffn) {
            inline else => |*part| part.scratchLength(rows),
        };
        return @max(attention, ffn);
    }
};

pub const Embedding = struct {
    tensor: *const Tensor,

    /// Row `token` widened to f32.
    pub fn row(embedding: Embedding, token: usize, out: []f32) void {
        const hidden = out.len;
        switch (embedding.tensor.dtype) {
            .f32 => for (out, embedding.tensor.elements(f32)[token * hidden ..][0..hidden]) |*o, v| {
                o.* = v;
            },
            .f16 => for (out, embedding.tensor.elements(u16)[token * hidden ..][0..hidden]) |*o, v| {
                o.* = core.dtype.f16ToF32(v);
            },
            .bf16 => for (out, embedding.tensor.elements(u16)[token * hidden ..][0..hidden]) |*o, v| {
                o.* = core.dtype.bf16ToF32(v);
            },
            else => unreachable, // checked at load
        }
    }
};

pub const Weights = struct {
    config: Config,
    embedding: Embedding,
    blocks: []Block,
    norm: []f32,
    lm_head: Linear,
    /// Everything f32 above is owned here; Linear layers own their own buffers.
    arena: std.heap.ArenaAllocator,

    pub fn load(gpa: std.mem.Allocator, checkpoint: *const core.Checkpoint, config_in: Config, diag: *Diagnostic) Error!Weights {
        var config = config_in;
        // A text-only GLM-5.3-Flash checkpoint keeps its tensors under "model." (transformers'
        // module names) rather than the multimodal "model.language_model.".
        if (config.class == .glm5_next and checkpoint.find("model.language_model.embed_tokens.weight") == null and
            checkpoint.find("model.embed_tokens.weight") != null) config.prefix = "model";
        var loader: loader_mod.Loader = .{
            .gpa = gpa,
            .checkpoint = checkpoint,
            .config = config,
            .claimed = try gpa.alloc(bool, checkpoint.tensors.len),
            .diag = diag,
            .linears = .empty,
        };
        defer gpa.free(loader.claimed);
        @memset(loader.claimed, false);
        defer loader.linears.deinit(gpa);
        errdefer for (loader.linears.items) |*linear| linear.deinit(gpa);

        var weights: Weights = undefined;
        weights.config = config;
        weights.arena = std.heap.ArenaAllocator.init(gpa);
        errdefer weights.arena.deinit();
        loader.arena = weights.arena.allocator();

        weights.embedding = .{ .tensor = try embeddingTensor(&loader) };
        weights.blocks = try loader.arena.alloc(Block, config.layers);
        for (weights.blocks, 0..) |*block, layer| block.* = try loadBlock(&loader, layer);
        weights.norm = try loader.vector(loader.name("{s}.norm.weight", .{config.prefix}), config.hidden_size);
        weights.lm_head = try lmHead(&loader);
        try loader.checkAllClaimed();
        return weights;
    }

    pub fn deinit(weights: *Weights, gpa: std.mem.Allocator) void {
        for (weights.blocks) |*block| block.deinit(gpa);
        weights.lm_head.deinit(gpa);
        weights.arena.deinit();
        weights.* = undefined;
    }

    /// The largest scratch any projection needs for `rows` rows.
    pub fn scratchLength(weights: *const Weights, rows: usize) usize {
        var length = weights.lm_head.scratchLength(rows);
        for (weights.blocks) |*block| length = @max(length, block.scratchLength(rows));
        return length;
    }
};

fn loadBlock(loader: *loader_mod.Loader, layer: usize) Error!Block {
    const c = loader.config;
    var buffer: [128]u8 = undefined;
    const p = std.fmt.bufPrint(&buffer, "{s}.layers.{d}", .{ c.prefix, layer }) catch unreachable;
    var part_buffer: [160]u8 = undefined;
    var block: Block = undefined;
    block.input_norm = try loader.vector(loader.name("{s}.input_layernorm.weight", .{p}), c.hidden_size);
    block.post_attention_norm = try loader.vector(loader.name("{s}.post_attention_layernorm.weight", .{p}), c.hidden_size);
    const attention = loader_mod.join(&part_buffer, p, "self_attn");
    block.attention = switch (c.plan[layer].attention) {
        .gqa => .{ .gqa = try Gqa.load(loader, attention) },
        .mla => .{ .mla = try Mla.load(loader, attention, layer) },
        .kda => .{ .kda = try Kda.load(loader, attention) },
    };
    block.hyper = if (c.hyper.mult > 0) .{ .attn = try hyper.Site.load(loader, p, "attn"), .ffn = try hyper.Site.load(loader, p, "ffn") } else null;
    const mlp = loader_mod.join(&part_buffer, p, "mlp");
    block.ffn = switch (c.plan[layer].ffn) {
        .dense => .{ .dense = try Mlp.load(loader, mlp, c.intermediate_size) },
        .moe => .{ .moe = try Moe.load(loader, mlp) },
    };
    return block;
}

fn embeddingTensor(loader: *loader_mod.Loader) Error!*const Tensor {
    const c = loader.config;
    const tensor = try loader.require(loader.name("{s}.embed_tokens.weight", .{c.prefix}));
    const shape = tensor.shape();
    const ok = shape.len == 2 and shape[0] == c.vocab_size and shape[1] == c.hidden_size and
        (tensor.dtype == .f32 or tensor.dtype == .f16 or tensor.dtype == .bf16);
    if (!ok) {
        loader.diag.set("tensor '{s}': {s} {any}, expected F32/F16/BF16 [{d}, {d}]", .{ tensor.name, tensor.dtype.name(), shape, c.vocab_size, c.hidden_size });
        return error.InvalidWeights;
    }
    return tensor;
}

/// EXL3 converters always write lm_head; an unquantized checkpoint with tied embeddings has none
/// and reuses the embedding matrix.
fn lmHead(loader: *loader_mod.Loader) Error!Linear {
    const c = loader.config;
    const present = loader.has("lm_head.trellis") or loader.has("lm_head.weight");
    if (present or !c.tie_word_embeddings) return loader.linear("lm_head", c.hidden_size, c.vocab_size, .none);
    const weight = try linear_mod.widen(loader.gpa, try embeddingTensor(loader), &.{ c.vocab_size, c.hidden_size }, loader.diag);
    const tied: Linear = .{ .in_features = c.hidden_size, .out_features = c.vocab_size, .kind = .{ .dense = .{ .weight = weight, .bias = null } } };
    try loader.keep(tied);
    return tied;
}
