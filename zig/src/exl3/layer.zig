//! The tensors of one EXL3 linear `<prefix>` (EXL3.md §2), found and checked in a checkpoint:
//! `trellis` I16 (k_p/16, n_p/16, 8·bits2), `suh` F16 (k_p), `svh` F16 (n_p), an optional `bias`,
//! and at most one codebook marker. Legacy packed `su`/`sv` sign words are unpacked at load.
const std = @import("std");
const core = @import("../core/root.zig");
const trellis = @import("trellis.zig");
const hadamard = @import("hadamard.zig");
const Codebook = @import("codebook.zig").Codebook;
const Diagnostic = core.Diagnostic;
const Tensor = core.safetensors.Tensor;

pub const Error = error{ MissingTensor, InvalidLayer, OutOfMemory };

pub const Layer = struct {
    /// Padded in_features (k_p) and out_features (n_p), multiples of 128.
    rows: usize,
    columns: usize,
    rate: trellis.Rate,
    codebook: Codebook,
    /// (rows/16, columns/16, wordsPerTile) int16 elements, a view into the checkpoint.
    words: []align(1) const u16,
    /// fp16 bits; views, or `owned` when unpacked from legacy sign words.
    suh: []align(1) const u16,
    svh: []align(1) const u16,
    bias: ?Bias,
    owned: ?[]u16,
    /// Set when the layer is a tensor-parallel slice: its words, scales and bias are copies.
    owned_slice: ?[]u16 = null,
    owned_bias: ?[]f32 = null,

    pub const Bias = union(enum) {
        f16: []align(1) const u16,
        f32: []align(1) const f32,

        pub fn get(bias: Bias, index: usize) f32 {
            return switch (bias) {
                .f16 => |bits| @floatCast(@as(f16, @bitCast(bits[index]))),
                .f32 => |values| values[index],
            };
        }

        pub fn len(bias: Bias) usize {
            return switch (bias) {
                inline else => |values| values.len,
            };
        }
    };

    pub fn load(gpa: std.mem.Allocator, checkpoint: *const core.Checkpoint, prefix: []const u8, diag: *Diagnostic) Error!Layer {
        var name_buffer: [512]u8 = undefined;
        const finder: Finder = .{ .checkpoint = checkpoint, .prefix = prefix, .buffer = &name_buffer };

        if (finder.get("scale") != null) return invalid(diag, "{s}: has a 'scale' tensor, which EXL3 no longer uses", .{prefix});
        const words = finder.get("trellis") orelse return missing(diag, prefix, "trellis");
        const shape = words.shape();
        if (words.dtype != .i16 or shape.len != 3) {
            return invalid(diag, "{s}.trellis: expected I16 of rank 3, found {s} of rank {d}", .{ prefix, words.dtype.name(), shape.len });
        }
        const rate = trellis.Rate.fromWordsPerTile(shape[2]) orelse return invalid(diag, "{s}.trellis: last dimension {d} is neither 16·K (K = 1..8) nor 16·K + 8 (K = 1.5, 2.5, 3.5)", .{ prefix, shape[2] });
        const rows = shape[0] * trellis.tile_size;
        const columns = shape[1] * trellis.tile_size;
        if (rows == 0 or columns == 0 or rows % hadamard.block != 0 or columns % hadamard.block != 0) {
            return invalid(diag, "{s}.trellis: padded shape {d}x{d} is not a non-empty multiple of 128 on both sides", .{ prefix, rows, columns });
        }

        const has_mul1 = finder.get("mul1") != null;
        const has_mcg = finder.get("mcg") != null;
        if (has_mul1 and has_mcg) return invalid(diag, "{s}: has both codebook markers, mul1 and mcg", .{prefix});
        const cb: Codebook = if (has_mul1) .mul1 else if (has_mcg) .mcg else .@"3inst";
        if (rate.isHalf() and cb != .mul1) {
            return invalid(diag, "{s}: half-integer rate {d}.5 requires the mul1 codebook", .{ prefix, rate.bits2 / 2 });
        }

        var layer: Layer = .{
            .rows = rows,
            .columns = columns,
            .rate = rate,
            .codebook = cb,
            .words = words.elements(u16),
            .suh = &.{},
            .svh = &.{},
            .bias = null,
            .owned = null,
        };
        try layer.loadScales(gpa, finder, diag);
        errdefer layer.deinit(gpa);
        try layer.loadBias(finder, diag);
        return layer;
    }

    pub fn deinit(layer: *Layer, gpa: std.mem.Allocator) void {
        if (layer.owned) |owned| gpa.free(owned);
        if (layer.owned_slice) |owned| gpa.free(owned);
        if (layer.owned_bias) |owned| gpa.free(owned);
        layer.* = undefined;
    }

    pub fn tileWords(layer: *const Layer, tile_row: usize, tile_column: usize) []align(1) const u16 {
        const per_tile = layer.rate.wordsPerTile();
        const tile = tile_row * (layer.columns / trellis.tile_size) + tile_column;
        return layer.words[tile * per_tile ..][0..per_tile];
    }

    fn loadScales(layer: *Layer, gpa: std.mem.Allocator, finder: Finder, diag: *Diagnostic) Error!void {
        const suh = finder.get("suh");
        const svh = finder.get("svh");
        const su = if (suh == null) finder.get("su") else null;
        const sv = if (svh == null) finder.get("sv") else null;
        if (suh == null and su == null) return missing(diag, finder.prefix, "suh");
        if (svh == null and sv == null) return missing(diag, finder.prefix, "svh");

        if (su != null or sv != null) {
            layer.owned = try gpa.alloc(u16, layer.rows + layer.columns);
        }
        errdefer if (layer.owned) |owned| gpa.free(owned);

        layer.suh = if (suh) |t|
            try halfVector(t, layer.rows, finder.prefix, "suh", diag)
        else
            try unpackSigns(su.?, layer.owned.?[0..layer.rows], finder.prefix, "su", diag);
        layer.svh = if (svh) |t|
            try halfVector(t, layer.columns, finder.prefix, "svh", diag)
        else
            try unpackSigns(sv.?, layer.owned.?[layer.rows..], finder.prefix, "sv", diag);
    }

    fn loadBias(layer: *Layer, finder: Finder, diag: *Diagnostic) Error!void {
        const bias = finder.get("bias") orelse return;
        const length = if (bias.rank == 1) bias.shape()[0] else 0;
        const fits = length > 0 and length <= layer.columns and layer.columns - length < hadamard.block;
        if (!fits) return invalid(diag, "{s}.bias: expected one dimension of {d} (or its unpadded size), found {any}", .{ finder.prefix, layer.columns, bias.shape() });
        layer.bias = switch (bias.dtype) {
            .f16 => .{ .f16 = bias.elements(u16) },
            .f32 => .{ .f32 = bias.elements(f32) },
            else => return invalid(diag, "{s}.bias: dtype {s} is not F16 or F32", .{ finder.prefix, bias.dtype.name() }),
        };
    }
};

const Finder = struct {
    checkpoint: *const core.Checkpoint,
    prefix: []const u8,
    buffer: *[512]u8,

    fn get(finder: Finder, suffix: []const u8) ?*const Tensor {
        const name = std.fmt.bufPrint(finder.buffer, "{s}.{s}", .{ finder.prefix, suffix }) catch return null;
        return finder.checkpoint.find(name);
    }
};

fn halfVector(tensor: *const Tensor, length: usize, prefix: []const u8, suffix: []const u8, diag: *Diagnostic) Error![]align(1) const u16 {
    const ok = tensor.dtype == .f16 and tensor.rank == 1 and tensor.shape()[0] == length;
    if (!ok) return invalid(diag, "{s}.{s}: expected F16 of shape ({d}), found {s} {any}", .{ prefix, suffix, length, tensor.dtype.name(), tensor.shape() });
    return tensor.elements(u16);
}

/// Legacy sign words: bit i (LSB first) of word j is the sign of element 16j + i, set = -1.
fn unpackSigns(tensor: *const Tensor, out: []u16, prefix: []const u8, suffix: []const u8, diag: *Diagnostic) Error![]align(1) const u16 {
    const ok = tensor.dtype == .i16 and tensor.rank == 1 and tensor.shape()[0] * 16 == out.len;
    if (!ok) return invalid(diag, "{s}.{s}: expected I16 of shape ({d}), found {s} {any}", .{ prefix, suffix, out.len / 16, tensor.dtype.name(), tensor.shape() });
    const one: u16 = 0x3C00;
    const minus_one: u16 = 0xBC00;
    for (tensor.elements(u16), 0..) |word, j| {
        for (0..16) |i| out[16 * j + i] = if ((word >> @intCast(i)) & 1 == 1) minus_one else one;
    }
    return out;
}

fn missing(diag: *Diagnostic, prefix: []const u8, suffix: []const u8) Error {
    diag.set("{s}: missing tensor '{s}.{s}'", .{ prefix, prefix, suffix });
    return error.MissingTensor;
}

fn invalid(diag: *Diagnostic, comptime fmt: []const u8, args: anytype) Error {
    diag.set(fmt, args);
    return error.InvalidLayer;
}
