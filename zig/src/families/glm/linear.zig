//! One projection of the model: EXL3 (decoded tile by tile on the fly) or unquantized (fp16, bf16
//! or f32 as stored, widened to f32 once at load). Both compute y = x·Wᵀ + b in f32 and give each
//! output row from its input row alone, in a fixed summation order, so a row's bits do not depend
//! on its batch.
const std = @import("std");
const core = @import("../../core/root.zig");
const exl3 = @import("../../exl3/root.zig");
const Diagnostic = core.Diagnostic;

pub const Error = exl3.layer.Error || error{InvalidWeights};

const Lanes = @Vector(16, f32);

var no_floats: [0]f32 = .{};

pub const Dense = struct {
    /// (out_features, in_features) row-major, f32.
    weight: []f32,
    bias: ?[]f32,
};

pub const Linear = struct {
    in_features: usize,
    out_features: usize,
    kind: union(enum) {
        exl3: exl3.Layer,
        dense: Dense,
    },

    /// Frees the buffers and leaves an empty projection of the same shape, whose deinit is a
    /// no-op: a GPU rank's host copy goes once the device holds it (release.zig).
    pub fn release(linear: *Linear, gpa: std.mem.Allocator) void {
        const shape = releasedShape(linear.in_features, linear.out_features);
        linear.deinit(gpa);
        linear.* = shape;
    }

    /// A released projection of this shape: one a rank never runs (a TP worker's lm_head).
    pub fn releasedShape(in_features: usize, out_features: usize) Linear {
        return .{ .in_features = in_features, .out_features = out_features, .kind = .{ .dense = .{ .weight = &no_floats, .bias = null } } };
    }

    pub fn released(linear: *const Linear) bool {
        return linear.kind == .dense and linear.kind.dense.weight.len == 0;
    }

    pub fn hasBias(linear: *const Linear) bool {
        return switch (linear.kind) {
            .exl3 => |layer| layer.bias != null,
            .dense => |dense| dense.bias != null,
        };
    }

    /// f32 scratch that `forward` needs for `rows` rows.
    pub fn scratchLength(linear: *const Linear, rows: usize) usize {
        return switch (linear.kind) {
            .exl3 => |*layer| exl3.linear_cpu.scratchLength(layer, rows),
            .dense => 0,
        };
    }

    pub fn forward(linear: *const Linear, rows: usize, x: []const f32, y: []f32, scratch: []f32) void {
        std.debug.assert(x.len == rows * linear.in_features);
        std.debug.assert(y.len == rows * linear.out_features);
        switch (linear.kind) {
            .exl3 => |*layer| exl3.linear_cpu.forward(layer, .{
                .rows = rows,
                .in_features = linear.in_features,
                .out_features = linear.out_features,
            }, x, y, scratch),
            .dense => |*dense| {
                const job: DenseJob = .{ .linear = linear, .dense = dense, .rows = rows, .x = x, .y = y };
                core.parallel.forRange(linear.out_features, 16, &job, DenseJob.run);
            },
        }
    }

    /// An unquantized copy of an EXL3 projection: its weight dequantized to f32 (out_features,
    /// in_features), its bias widened.
    pub fn dequantized(linear: *const Linear, gpa: std.mem.Allocator) Error!Linear {
        const layer = &linear.kind.exl3;
        const weight = try gpa.alloc(f32, linear.out_features * linear.in_features);
        errdefer gpa.free(weight);
        const full = try gpa.alloc(f32, layer.rows * layer.columns + linear.in_features * linear.out_features);
        defer gpa.free(full);
        const columns = full[layer.rows * layer.columns ..]; // (in, out): y = x @ W
        exl3.linear_cpu.dequantize(layer, linear.in_features, linear.out_features, full[0 .. layer.rows * layer.columns], columns);
        for (0..linear.out_features) |o| {
            for (0..linear.in_features) |i| weight[o * linear.in_features + i] = columns[i * linear.out_features + o];
        }
        const bias: ?[]f32 = if (layer.bias) |b| blk: {
            const values = try gpa.alloc(f32, linear.out_features);
            for (values, 0..) |*v, n| v.* = b.get(n);
            break :blk values;
        } else null;
        return .{ .in_features = linear.in_features, .out_features = linear.out_features, .kind = .{ .dense = .{ .weight = weight, .bias = bias } } };
    }

    pub fn deinit(linear: *Linear, gpa: std.mem.Allocator) void {
        switch (linear.kind) {
            .exl3 => |*layer| layer.deinit(gpa),
            .dense => |dense| {
                gpa.free(dense.weight);
                if (dense.bias) |bias| gpa.free(bias);
            },
        }
        linear.* = undefined;
    }
};

const DenseJob = struct {
    linear: *const Linear,
    dense: *const Dense,
    rows: usize,
    x: []const f32,
    y: []f32,

    fn run(job: *const DenseJob, worker: usize, begin: usize, end: usize) void {
        _ = worker;
        const in_features = job.linear.in_features;
        const out_features = job.linear.out_features;
        for (begin..end) |o| {
            const w = job.dense.weight[o * in_features ..][0..in_features];
            for (0..job.rows) |m| {
                var value = dot(job.x[m * in_features ..][0..in_features], w);
                if (job.dense.bias) |bias| value += bias[o];
                job.y[m * out_features + o] = value;
            }
        }
    }
};

/// Sixteen lanes, then a fixed reduction: the same order for every call.
pub fn dot(a: []const f32, b: []const f32) f32 {
    std.debug.assert(a.len == b.len);
    var acc: Lanes = @splat(0);
    var i: usize = 0;
    while (i + 16 <= a.len) : (i += 16) {
        const va: Lanes = a[i..][0..16].*;
        const vb: Lanes = b[i..][0..16].*;
        acc += va * vb;
    }
    var tail: f32 = 0;
    while (i < a.len) : (i += 1) tail += a[i] * b[i];
    return @reduce(.Add, acc) + tail;
}

/// Loads `<prefix>` as EXL3 (`.trellis` present) or unquantized (`.weight`, HF layout [out, in]).
pub fn load(
    gpa: std.mem.Allocator,
    checkpoint: *const core.Checkpoint,
    prefix: []const u8,
    in_features: usize,
    out_features: usize,
    diag: *Diagnostic,
) Error!Linear {
    var name_buffer: [512]u8 = undefined;
    const trellis_name = std.fmt.bufPrint(&name_buffer, "{s}.trellis", .{prefix}) catch return nameTooLong(prefix, diag);
    if (checkpoint.find(trellis_name) != null) {
        var layer = try exl3.Layer.load(gpa, checkpoint, prefix, diag);
        errdefer layer.deinit(gpa);
        const fits = in_features <= layer.rows and layer.rows - in_features < exl3.hadamard.block and
            out_features <= layer.columns and layer.columns - out_features < exl3.hadamard.block;
        if (!fits) {
            diag.set("{s}: EXL3 padded shape {d}x{d} does not fit the model's {d}x{d} (in x out)", .{ prefix, layer.rows, layer.columns, in_features, out_features });
            return error.InvalidWeights;
        }
        return .{ .in_features = in_features, .out_features = out_features, .kind = .{ .exl3 = layer } };
    }
    const weight_name = std.fmt.bufPrint(&name_buffer, "{s}.weight", .{prefix}) catch return nameTooLong(prefix, diag);
    const weight = checkpoint.find(weight_name) orelse {
        diag.set("missing tensor '{s}.weight' (or EXL3 '{s}.trellis')", .{ prefix, prefix });
        return error.MissingTensor;
    };
    const values = try widen(gpa, weight, &.{ out_features, in_features }, diag);
    errdefer gpa.free(values);
    const bias_name = std.fmt.bufPrint(&name_buffer, "{s}.bias", .{prefix}) catch return nameTooLong(prefix, diag);
    const bias = if (checkpoint.find(bias_name)) |tensor| try widen(gpa, tensor, &.{out_features}, diag) else null;
    return .{ .in_features = in_features, .out_features = out_features, .kind = .{ .dense = .{ .weight = values, .bias = bias } } };
}

/// A stored fp16/bf16/f32 tensor of exactly `shape`, as owned f32.
pub fn widen(gpa: std.mem.Allocator, tensor: *const core.safetensors.Tensor, shape: []const usize, diag: *Diagnostic) Error![]f32 {
    var count: usize = 1;
    for (shape) |d| count *= d;
    const same_shape = tensor.rank == shape.len and for (tensor.shape(), shape) |a, b| {
        if (a != b) break false;
    } else true;
    if (!same_shape) {
        diag.set("tensor '{s}': shape {any}, expected {any}", .{ tensor.name, tensor.shape(), shape });
        return error.InvalidWeights;
    }
    const out = try gpa.alloc(f32, count);
    errdefer gpa.free(out);
    switch (tensor.dtype) {
        .f32 => for (out, tensor.elements(f32)) |*o, v| {
            o.* = v;
        },
        .f16 => for (out, tensor.elements(u16)) |*o, v| {
            o.* = core.dtype.f16ToF32(v);
        },
        .bf16 => for (out, tensor.elements(u16)) |*o, v| {
            o.* = core.dtype.bf16ToF32(v);
        },
        else => {
            diag.set("tensor '{s}': dtype {s} is not F32, F16 or BF16", .{ tensor.name, tensor.dtype.name() });
            return error.InvalidWeights;
        },
    }
    return out;
}

fn nameTooLong(prefix: []const u8, diag: *Diagnostic) Error {
    diag.set("tensor name prefix '{s}' is too long", .{prefix});
    return error.InvalidWeights;
}

test "dot sums in a fixed order and handles tails" {
    var a: [37]f32 = undefined;
    var b: [37]f32 = undefined;
    for (&a, &b, 0..) |*x, *y, i| {
        x.* = @floatFromInt(i);
        y.* = 2;
    }
    try std.testing.expectEqual(@as(f32, 2 * 666), dot(&a, &b));
}
