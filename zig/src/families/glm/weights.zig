//! Every tensor of a class-A GLM checkpoint by role (GLM.md §4.1), loaded with its shape and dtype
//! checked: norms, router and correction bias widened to f32 once at load; projections as
//! `Linear` (EXL3 or unquantized); the embedding kept as a view. A missing tensor is an error
//! naming it, and so is any tensor no role claims, except the MTP ("nextn") layer, which is skipped.
const std = @import("std");
const core = @import("../../core/root.zig");
const linear_mod = @import("linear.zig");
const Config = @import("config.zig").Config;
const Linear = linear_mod.Linear;
const Diagnostic = core.Diagnostic;
const Tensor = core.safetensors.Tensor;

pub const Error = linear_mod.Error || error{UnexpectedTensor};

pub const Mlp = struct {
    gate: Linear,
    up: Linear,
    down: Linear,

    fn deinit(mlp: *Mlp, gpa: std.mem.Allocator) void {
        mlp.gate.deinit(gpa);
        mlp.up.deinit(gpa);
        mlp.down.deinit(gpa);
    }
};

pub const Moe = struct {
    /// (routed_experts, hidden_size) f32.
    router: []f32,
    correction_bias: []f32,
    experts: []Mlp,
    shared: ?Mlp,
};

pub const Block = struct {
    input_norm: []f32,
    post_attention_norm: []f32,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: ?[]f32,
    k_norm: ?[]f32,
    ffn: union(enum) { dense: Mlp, moe: Moe },
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

    pub fn load(gpa: std.mem.Allocator, checkpoint: *const core.Checkpoint, config: Config, diag: *Diagnostic) Error!Weights {
        var loader: Loader = .{
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

        weights.embedding = .{ .tensor = try loader.embedding() };
        weights.blocks = try loader.arena.alloc(Block, config.layers);
        for (weights.blocks, 0..) |*block, layer| block.* = try loader.block(layer);
        weights.norm = try loader.vector("model.norm.weight", config.hidden_size);
        weights.lm_head = try loader.lmHead();
        try loader.checkAllClaimed();
        return weights;
    }

    pub fn deinit(weights: *Weights, gpa: std.mem.Allocator) void {
        for (weights.blocks) |*block| {
            block.q.deinit(gpa);
            block.k.deinit(gpa);
            block.v.deinit(gpa);
            block.o.deinit(gpa);
            switch (block.ffn) {
                .dense => |*mlp| mlp.deinit(gpa),
                .moe => |*moe| {
                    for (moe.experts) |*expert| expert.deinit(gpa);
                    if (moe.shared) |*shared| shared.deinit(gpa);
                },
            }
        }
        weights.lm_head.deinit(gpa);
        weights.arena.deinit();
        weights.* = undefined;
    }

    /// The largest scratch any projection needs for `rows` rows.
    pub fn scratchLength(weights: *const Weights, rows: usize) usize {
        var length = weights.lm_head.scratchLength(rows);
        for (weights.blocks) |*block| {
            for ([_]*const Linear{ &block.q, &block.k, &block.v, &block.o }) |linear| length = @max(length, linear.scratchLength(rows));
            switch (block.ffn) {
                .dense => |*mlp| length = @max(length, mlpScratch(mlp, rows)),
                .moe => |*moe| {
                    for (moe.experts) |*expert| length = @max(length, mlpScratch(expert, rows));
                    if (moe.shared) |*shared| length = @max(length, mlpScratch(shared, rows));
                },
            }
        }
        return length;
    }
};

fn mlpScratch(mlp: *const Mlp, rows: usize) usize {
    return @max(mlp.gate.scratchLength(rows), mlp.up.scratchLength(rows), mlp.down.scratchLength(rows));
}

const Bias = enum { none, required };

const Loader = struct {
    gpa: std.mem.Allocator,
    arena: std.mem.Allocator = undefined,
    checkpoint: *const core.Checkpoint,
    config: Config,
    claimed: []bool,
    diag: *Diagnostic,
    /// Every Linear loaded so far (copies sharing their buffers), so that a failure part-way frees them.
    linears: std.ArrayList(Linear),
    name_buffer: [512]u8 = undefined,

    fn name(loader: *Loader, comptime fmt: []const u8, args: anytype) []const u8 {
        return std.fmt.bufPrint(&loader.name_buffer, fmt, args) catch unreachable; // names are short
    }

    fn claimPrefix(loader: *Loader, prefix: []const u8) void {
        for (loader.checkpoint.tensors, 0..) |tensor, i| {
            if (tensor.name.len > prefix.len and std.mem.startsWith(u8, tensor.name, prefix) and tensor.name[prefix.len] == '.') {
                loader.claimed[i] = true;
            }
        }
    }

    fn require(loader: *Loader, tensor_name: []const u8) Error!*const Tensor {
        const tensor = loader.checkpoint.find(tensor_name) orelse {
            loader.diag.set("missing tensor '{s}'", .{tensor_name});
            return error.MissingTensor;
        };
        const index = (@intFromPtr(tensor) - @intFromPtr(loader.checkpoint.tensors.ptr)) / @sizeOf(Tensor);
        loader.claimed[index] = true;
        return tensor;
    }

    fn vector(loader: *Loader, tensor_name: []const u8, length: usize) Error![]f32 {
        const tensor = try loader.require(tensor_name);
        const values = try linear_mod.widen(loader.gpa, tensor, &.{length}, loader.diag);
        defer loader.gpa.free(values);
        return try loader.arena.dupe(f32, values);
    }

    fn matrix(loader: *Loader, tensor_name: []const u8, rows: usize, columns: usize) Error![]f32 {
        const tensor = try loader.require(tensor_name);
        const values = try linear_mod.widen(loader.gpa, tensor, &.{ rows, columns }, loader.diag);
        defer loader.gpa.free(values);
        return try loader.arena.dupe(f32, values);
    }

    fn linear(loader: *Loader, prefix: []const u8, in_features: usize, out_features: usize, bias: Bias) Error!Linear {
        var result = try linear_mod.load(loader.gpa, loader.checkpoint, prefix, in_features, out_features, loader.diag);
        errdefer result.deinit(loader.gpa);
        if (bias == .required and !result.hasBias()) {
            loader.diag.set("missing tensor '{s}.bias' (config.json has attention_bias = true)", .{prefix});
            return error.MissingTensor;
        }
        loader.claimPrefix(prefix);
        return result;
    }

    fn embedding(loader: *Loader) Error!*const Tensor {
        const tensor = try loader.require("model.embed_tokens.weight");
        const shape = tensor.shape();
        const ok = shape.len == 2 and shape[0] == loader.config.vocab_size and shape[1] == loader.config.hidden_size and
            (tensor.dtype == .f32 or tensor.dtype == .f16 or tensor.dtype == .bf16);
        if (!ok) {
            loader.diag.set("tensor 'model.embed_tokens.weight': {s} {any}, expected F32/F16/BF16 [{d}, {d}]", .{ tensor.dtype.name(), shape, loader.config.vocab_size, loader.config.hidden_size });
            return error.InvalidWeights;
        }
        return tensor;
    }

    fn block(loader: *Loader, layer: usize) Error!Block {
        const c = loader.config;
        var prefix_buffer: [128]u8 = undefined;
        const p = std.fmt.bufPrint(&prefix_buffer, "model.layers.{d}", .{layer}) catch unreachable;
        const qkv_bias: Bias = if (c.attention_bias) .required else .none;
        var result: Block = undefined;
        result.input_norm = try loader.vector(loader.name("{s}.input_layernorm.weight", .{p}), c.hidden_size);
        result.post_attention_norm = try loader.vector(loader.name("{s}.post_attention_layernorm.weight", .{p}), c.hidden_size);
        result.q = try loader.tracked(loader.name("{s}.self_attn.q_proj", .{p}), c.hidden_size, c.heads * c.head_dim, qkv_bias);
        result.k = try loader.tracked(loader.name("{s}.self_attn.k_proj", .{p}), c.hidden_size, c.kv_heads * c.head_dim, qkv_bias);
        result.v = try loader.tracked(loader.name("{s}.self_attn.v_proj", .{p}), c.hidden_size, c.kv_heads * c.head_dim, qkv_bias);
        result.o = try loader.tracked(loader.name("{s}.self_attn.o_proj", .{p}), c.heads * c.head_dim, c.hidden_size, .none);
        result.q_norm = if (c.qk_norm) try loader.vector(loader.name("{s}.self_attn.q_norm.weight", .{p}), c.head_dim) else null;
        result.k_norm = if (c.qk_norm) try loader.vector(loader.name("{s}.self_attn.k_norm.weight", .{p}), c.head_dim) else null;
        if (c.isDense(layer)) {
            result.ffn = .{ .dense = try loader.mlp(loader.name("{s}.mlp", .{p}), c.intermediate_size) };
            return result;
        }
        var moe: Moe = undefined;
        moe.router = try loader.matrix(loader.name("{s}.mlp.gate.weight", .{p}), c.routed_experts, c.hidden_size);
        moe.correction_bias = try loader.vector(loader.name("{s}.mlp.gate.e_score_correction_bias", .{p}), c.routed_experts);
        moe.experts = try loader.arena.alloc(Mlp, c.routed_experts);
        for (moe.experts, 0..) |*expert, e| {
            expert.* = try loader.mlp(loader.name("{s}.mlp.experts.{d}", .{ p, e }), c.moe_intermediate_size);
        }
        moe.shared = if (c.shared_experts > 0)
            try loader.mlp(loader.name("{s}.mlp.shared_experts", .{p}), c.moe_intermediate_size * c.shared_experts)
        else
            null;
        result.ffn = .{ .moe = moe };
        return result;
    }

    /// Loads a Linear and remembers it, so that a failure later in the load frees it.
    fn tracked(loader: *Loader, prefix: []const u8, in_features: usize, out_features: usize, bias: Bias) Error!Linear {
        var result = try loader.linear(prefix, in_features, out_features, bias);
        loader.linears.append(loader.gpa, result) catch |err| {
            result.deinit(loader.gpa);
            return err;
        };
        return result;
    }

    fn mlp(loader: *Loader, prefix: []const u8, intermediate: usize) Error!Mlp {
        var prefix_copy: [256]u8 = undefined;
        const p = prefix_copy[0..prefix.len];
        @memcpy(p, prefix);
        const hidden = loader.config.hidden_size;
        return .{
            .gate = try loader.tracked(loader.name("{s}.gate_proj", .{p}), hidden, intermediate, .none),
            .up = try loader.tracked(loader.name("{s}.up_proj", .{p}), hidden, intermediate, .none),
            .down = try loader.tracked(loader.name("{s}.down_proj", .{p}), intermediate, hidden, .none),
        };
    }

    /// EXL3 converters always write lm_head; an unquantized checkpoint with tied embeddings has none
    /// and reuses the embedding matrix.
    fn lmHead(loader: *Loader) Error!Linear {
        const c = loader.config;
        const present = loader.checkpoint.find("lm_head.trellis") != null or loader.checkpoint.find("lm_head.weight") != null;
        if (present or !c.tie_word_embeddings) return loader.tracked("lm_head", c.hidden_size, c.vocab_size, .none);
        const weight = try linear_mod.widen(loader.gpa, try loader.embedding(), &.{ c.vocab_size, c.hidden_size }, loader.diag);
        var tied: Linear = .{ .in_features = c.hidden_size, .out_features = c.vocab_size, .kind = .{ .dense = .{ .weight = weight, .bias = null } } };
        loader.linears.append(loader.gpa, tied) catch |err| {
            tied.deinit(loader.gpa);
            return err;
        };
        return tied;
    }

    fn checkAllClaimed(loader: *Loader) Error!void {
        for (loader.checkpoint.tensors, loader.claimed) |tensor, claimed| {
            if (claimed or isSkipped(tensor.name, loader.config.layers)) continue;
            loader.diag.set("unexpected tensor '{s}' (no role of {s} uses it)", .{ tensor.name, @import("config.zig").supported_architecture });
            return error.UnexpectedTensor;
        }
    }
};

/// The MTP layer (index = num_hidden_layers and beyond) and rotary caches are not model weights.
fn isSkipped(tensor_name: []const u8, layers: usize) bool {
    if (std.mem.endsWith(u8, tensor_name, ".rotary_emb.inv_freq")) return true;
    const prefix = "model.layers.";
    if (!std.mem.startsWith(u8, tensor_name, prefix)) return false;
    const rest = tensor_name[prefix.len..];
    const end = std.mem.indexOfScalar(u8, rest, '.') orelse return false;
    const layer = std.fmt.parseInt(usize, rest[0..end], 10) catch return false;
    return layer >= layers;
}

test "MTP layers are skipped, others are not" {
    try std.testing.expect(isSkipped("model.layers.46.eh_proj.weight", 46));
    try std.testing.expect(!isSkipped("model.layers.45.mlp.gate.weight", 46));
    try std.testing.expect(!isSkipped("model.extra.weight", 46));
}
