//! What parts load their weights with: each tensor found by name, its shape and dtype checked,
//! claimed (so that a tensor no part claims is named as unexpected), norms and small matrices
//! widened to f32 once into the weights' arena, projections as `Linear`. Every Linear loaded is
//! remembered, so that a failure part-way frees them all.
const std = @import("std");
const core = @import("../../core/root.zig");
const linear_mod = @import("linear.zig");
const Config = @import("config.zig").Config;
const Linear = linear_mod.Linear;
const Diagnostic = core.Diagnostic;
const Tensor = core.safetensors.Tensor;

pub const Error = linear_mod.Error || error{UnexpectedTensor};

pub const Bias = enum { none, required };

pub const Loader = struct {
    gpa: std.mem.Allocator,
    arena: std.mem.Allocator = undefined,
    checkpoint: *const core.Checkpoint,
    config: Config,
    claimed: []bool,
    diag: *Diagnostic,
    linears: std.ArrayList(Linear),
    name_buffer: [512]u8 = undefined,

    /// A name for `require` and friends; valid until the next call.
    pub fn name(loader: *Loader, comptime fmt: []const u8, args: anytype) []const u8 {
        return std.fmt.bufPrint(&loader.name_buffer, fmt, args) catch unreachable; // names are short
    }

    pub fn has(loader: *const Loader, tensor_name: []const u8) bool {
        return loader.checkpoint.find(tensor_name) != null;
    }

    /// Whether `prefix` is a projection in the checkpoint (EXL3 or unquantized).
    pub fn hasLinear(loader: *Loader, prefix: []const u8) bool {
        var buffer: [256]u8 = undefined;
        inline for (.{ "trellis", "weight" }) |suffix| {
            const full = std.fmt.bufPrint(&buffer, "{s}." ++ suffix, .{prefix}) catch return false;
            if (loader.has(full)) return true;
        }
        return false;
    }

    fn claimPrefix(loader: *Loader, prefix: []const u8) void {
        for (loader.checkpoint.tensors, 0..) |tensor, i| {
            if (tensor.name.len > prefix.len and std.mem.startsWith(u8, tensor.name, prefix) and tensor.name[prefix.len] == '.') {
                loader.claimed[i] = true;
            }
        }
    }

    pub fn require(loader: *Loader, tensor_name: []const u8) Error!*const Tensor {
        const tensor = loader.checkpoint.find(tensor_name) orelse {
            loader.diag.set("missing tensor '{s}'", .{tensor_name});
            return error.MissingTensor;
        };
        const index = (@intFromPtr(tensor) - @intFromPtr(loader.checkpoint.tensors.ptr)) / @sizeOf(Tensor);
        loader.claimed[index] = true;
        return tensor;
    }

    /// A vector of `length` values as f32 in the weights' arena.
    pub fn vector(loader: *Loader, tensor_name: []const u8, length: usize) Error![]f32 {
        const tensor = try loader.require(tensor_name);
        const values = try linear_mod.widen(loader.gpa, tensor, &.{length}, loader.diag);
        defer loader.gpa.free(values);
        return try loader.arena.dupe(f32, values);
    }

    /// A (rows, columns) matrix as f32 in the weights' arena.
    pub fn matrix(loader: *Loader, tensor_name: []const u8, rows: usize, columns: usize) Error![]f32 {
        const tensor = try loader.require(tensor_name);
        const values = try linear_mod.widen(loader.gpa, tensor, &.{ rows, columns }, loader.diag);
        defer loader.gpa.free(values);
        return try loader.arena.dupe(f32, values);
    }

    /// A (a, b, c) tensor as f32 in the weights' arena.
    pub fn matrix3(loader: *Loader, tensor_name: []const u8, a: usize, b: usize, c: usize) Error![]f32 {
        const tensor = try loader.require(tensor_name);
        const values = try linear_mod.widen(loader.gpa, tensor, &.{ a, b, c }, loader.diag);
        defer loader.gpa.free(values);
        return try loader.arena.dupe(f32, values);
    }

    /// The projection at `prefix`, remembered so that a failure later in the load frees it.
    pub fn linear(loader: *Loader, prefix: []const u8, in_features: usize, out_features: usize, bias: Bias) Error!Linear {
        const result = loaded: {
            var result = try linear_mod.load(loader.gpa, loader.checkpoint, prefix, in_features, out_features, loader.diag);
            errdefer result.deinit(loader.gpa);
            if (bias == .required and !result.hasBias()) {
                loader.diag.set("missing tensor '{s}.bias' (config.json has attention_bias = true)", .{prefix});
                return error.MissingTensor;
            }
            break :loaded result;
        };
        return loader.remember(prefix, result);
    }

    /// The projection at `prefix` unquantized, remembered as `linear`'s are: an EXL3 one
    /// dequantized into an f32 weight (its own buffers freed), for a part that reads the weight's
    /// rows and never runs it as a projection (MLA's kv_b).
    pub fn unquantizedLinear(loader: *Loader, prefix: []const u8, in_features: usize, out_features: usize) Error!Linear {
        const result = loaded: {
            var source = try linear_mod.load(loader.gpa, loader.checkpoint, prefix, in_features, out_features, loader.diag);
            if (source.kind == .dense) break :loaded source;
            defer source.deinit(loader.gpa);
            break :loaded try source.dequantized(loader.gpa);
        };
        return loader.remember(prefix, result);
    }

    /// `result` claimed and taken into the failure cleanup. Past the loading's own errdefer:
    /// keep frees it when it cannot take it, and a second free there was a double free.
    fn remember(loader: *Loader, prefix: []const u8, result: Linear) Error!Linear {
        loader.claimPrefix(prefix);
        try loader.keep(result);
        return result;
    }

    /// Takes a Linear made elsewhere (a tied head) into the failure cleanup.
    pub fn keep(loader: *Loader, result: Linear) Error!void {
        loader.linears.append(loader.gpa, result) catch |err| {
            var copy = result;
            copy.deinit(loader.gpa);
            return err;
        };
    }

    pub fn checkAllClaimed(loader: *Loader) Error!void {
        for (loader.checkpoint.tensors, loader.claimed) |tensor, claimed| {
            if (claimed or isSkipped(tensor.name, loader.config.prefix, loader.config.layers)) continue;
            loader.diag.set("unexpected tensor '{s}' (no part of a {t} model uses it)", .{ tensor.name, loader.config.class });
            return error.UnexpectedTensor;
        }
    }
};

/// `prefix` with `.{suffix}`, copied out of the loader's name buffer (parts hold a layer's prefix
/// while naming its tensors).
pub fn join(buffer: []u8, prefix: []const u8, suffix: []const u8) []const u8 {
    return std.fmt.bufPrint(buffer, "{s}.{s}", .{ prefix, suffix }) catch unreachable;
}

/// The MTP layer (index = num_hidden_layers and beyond), rotary caches and a multimodal
/// checkpoint's vision tower are not weights of the text model.
fn isSkipped(tensor_name: []const u8, model_prefix: []const u8, layers: usize) bool {
    if (std.mem.endsWith(u8, tensor_name, ".rotary_emb.inv_freq")) return true;
    if (std.mem.startsWith(u8, tensor_name, "model.visual.")) return true;
    if (!std.mem.startsWith(u8, tensor_name, model_prefix)) return false;
    const after = tensor_name[model_prefix.len..];
    const prefix = ".layers.";
    if (!std.mem.startsWith(u8, after, prefix)) return false;
    const rest = after[prefix.len..];
    const end = std.mem.indexOfScalar(u8, rest, '.') orelse return false;
    const layer = std.fmt.parseInt(usize, rest[0..end], 10) catch return false;
    return layer >= layers;
}

test "MTP layers are skipped, others are not" {
    try std.testing.expect(isSkipped("model.layers.46.eh_proj.weight", "model", 46));
    try std.testing.expect(!isSkipped("model.layers.45.mlp.gate.weight", "model", 46));
    try std.testing.expect(!isSkipped("model.extra.weight", "model", 46));
    try std.testing.expect(isSkipped("model.language_model.layers.8.eh_proj.trellis", "model.language_model", 8));
    try std.testing.expect(isSkipped("model.visual.blocks.0.attn.k_proj.trellis", "model.language_model", 8));
    try std.testing.expect(!isSkipped("model.language_model.layers.7.hc_attn_fn", "model.language_model", 8));
}

test "a projection dequantized at load is the one a failed load frees" {
    try std.testing.checkAllAllocationFailures(std.testing.allocator, loadDequantized, .{});
}

/// One 128 x 128 EXL3 layer at 3 bits (48 words a tile), every byte 0x3C (f16 scales of ~1),
/// loaded unquantized and then freed as a failed load frees what the loader remembered. Run with
/// every allocation failing in turn: nothing leaks and nothing is freed twice.
fn loadDequantized(gpa: std.mem.Allocator) !void {
    const header =
        \\{"kv.trellis":{"dtype":"I16","shape":[8,8,48],"data_offsets":[0,6144]},
        \\ "kv.suh":{"dtype":"F16","shape":[128],"data_offsets":[6144,6400]},
        \\ "kv.svh":{"dtype":"F16","shape":[128],"data_offsets":[6400,6656]}}
    ;
    const bytes = try gpa.alloc(u8, 8 + header.len + 6656);
    defer gpa.free(bytes);
    std.mem.writeInt(u64, bytes[0..8], header.len, .little);
    @memcpy(bytes[8..][0..header.len], header);
    @memset(bytes[8 + header.len ..], 0x3C);
    var diag: Diagnostic = .{};
    var file = try core.safetensors.File.parse(gpa, bytes, &diag);
    defer file.deinit();
    var checkpoint: core.Checkpoint = .{ .gpa = gpa, .arena = undefined, .shards = &.{}, .tensors = file.tensors, .config = null };
    const claimed = try gpa.alloc(bool, file.tensors.len);
    defer gpa.free(claimed);
    @memset(claimed, false);
    var loader: Loader = .{ .gpa = gpa, .checkpoint = &checkpoint, .config = undefined, .claimed = claimed, .diag = &diag, .linears = .empty };
    defer loader.linears.deinit(gpa);
    // A later part failing: weights.zig frees every remembered projection. Remembering the EXL3
    // layer instead of its dequantized copy leaked the copy.
    defer for (loader.linears.items) |*remembered| remembered.deinit(gpa);

    const linear = try loader.unquantizedLinear("kv", 128, 128);
    try std.testing.expect(linear.kind == .dense and linear.kind.dense.weight.len == 128 * 128);
    try std.testing.expect(std.math.isFinite(linear.kind.dense.weight[0]) and linear.kind.dense.weight[0] != 0);
    for (claimed) |c| try std.testing.expect(c);
    try std.testing.expectEqual(@as(usize, 1), loader.linears.items.len);
}
