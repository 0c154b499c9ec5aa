//! The GPU side of one projection (linear.zig): an EXL3 layer uploaded as its trellis words,
//! scales and bias behind a one-entry table (or a two-entry pair table when two projections of one
//! shape share their input), or an unquantized matrix (f16 where exact, else f32); and the launches that run it. Generated
//! rows take the trellis GEMV (tf_exl3_item_linear); a prompt step's prompt rows take the
//! tensor-core prompt kernels (cuda/exl3_prompt.zig) where the weight is eligible.
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const exl3 = @import("../../../exl3/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Linear = @import("../linear.zig").Linear;

pub const GpuLinear = struct {
    in_features: usize,
    out_features: usize,
    kind: union(enum) {
        /// prompt: the prompt kernels take this weight (for a prompt step's prompt rows).
        /// split_entries: the table entries its k split follows when not its own (K.Exl3Call).
        exl3: struct { table: Ptr, entry: K.Exl3Layer, k_p: usize, n_p: usize, bits2: u8, codebook: u8, prompt: bool, split_entries: usize = 0 },
        /// mma: on the tensor cores (tf_dense_half / tf_dense_f32), else a warp per output
        /// (inputs not a multiple of 16, or TF_CUDA_DENSE_MMA=0); half: the weight is f16 (every
        /// value of the checkpoint's came through exactly), else f32.
        dense: Dense,
    },

    /// Uploaded from a released projection (uploadLinear): nothing on the device to run.
    pub fn absent(linear: *const GpuLinear) bool {
        return linear.kind == .dense and linear.kind.dense.weight == 0;
    }
};

pub const Dense = struct { weight: Ptr, bias: Ptr, mma: bool, half: bool };

/// One projection of all experts: a table of Exl3Layer, one per expert, sharing shape and rate.
pub const GroupedLinear = struct { table: Ptr, in_features: usize, out_features: usize, k_p: usize, n_p: usize, bits2: u8, codebook: u8 };

/// A two-entry table (first, second) on the GPU when both linears are EXL3 of one shape, rate
/// and codebook on the same input, so that one launch runs both (runPair); 0 otherwise.
pub fn pairTable(model: *GpuModel, first: *const GpuLinear, second: *const GpuLinear, diag: *Diagnostic) Error!Ptr {
    if (first.kind != .exl3 or second.kind != .exl3) return 0;
    const a = first.kind.exl3;
    const b = second.kind.exl3;
    if (a.k_p != b.k_p or a.n_p != b.n_p or a.bits2 != b.bits2 or a.codebook != b.codebook or a.prompt != b.prompt) return 0;
    if (first.in_features != second.in_features or first.out_features != second.out_features) return 0;
    const entries = [2]K.Exl3Layer{ a.entry, b.entry };
    return model.put(std.mem.sliceAsBytes(&entries), diag);
}

pub fn exl3Entry(model: *GpuModel, layer: *const exl3.Layer, out_features: usize, diag: *Diagnostic) Error!K.Exl3Layer {
    var bias_ptr: Ptr = 0;
    if (layer.bias) |bias| {
        const values = try model.gpa.alloc(f32, out_features);
        defer model.gpa.free(values);
        for (values, 0..) |*v, n| v.* = if (n < bias.len()) bias.get(n) else 0;
        bias_ptr = try model.putF32(values, diag);
    }
    return .{
        .words = try model.put(std.mem.sliceAsBytes(layer.words), diag),
        .suh = try model.put(std.mem.sliceAsBytes(layer.suh), diag),
        .svh = try model.put(std.mem.sliceAsBytes(layer.svh), diag),
        .bias = bias_ptr,
    };
}

pub fn uploadLinear(model: *GpuModel, source: *const Linear, diag: *Diagnostic) Error!GpuLinear {
    // A projection this rank never runs (a TP worker's lm_head: shard.zig) takes no device memory
    // and no split sums; its null weight is what GpuLinear.absent tells.
    if (source.released()) return .{
        .in_features = source.in_features,
        .out_features = source.out_features,
        .kind = .{ .dense = .{ .weight = 0, .bias = 0, .mma = false, .half = false } },
    };
    return .{
        .in_features = source.in_features,
        .out_features = source.out_features,
        .kind = switch (source.kind) {
            .exl3 => |*layer| blk: {
                const entry = try model.exl3Entry(layer, source.out_features, diag);
                break :blk .{ .exl3 = .{
                    .table = try model.put(std.mem.asBytes(&entry), diag),
                    .entry = entry,
                    .k_p = layer.rows,
                    .n_p = layer.columns,
                    .bits2 = layer.rate.bits2,
                    .codebook = @backingInt(layer.codebook),
                    .prompt = model.prompt_enabled and P.ineligible(.{
                        .k_p = layer.rows,
                        .n_p = layer.columns,
                        .bits2 = layer.rate.bits2,
                        .codebook = @backingInt(layer.codebook),
                    }) == null,
                } };
            },
            .dense => |dense| .{ .dense = try uploadDense(model, dense.weight, dense.bias, source.in_features, source.out_features, diag) },
        },
    };
}

/// An unquantized weight to the device: as f16 when every value converts exactly (checkpoints
/// store these projections as f16, or bf16 within f16's range), which halves what a decode step
/// reads; as f32 otherwise. Notes the split sums its launches leave in model.acc.
fn uploadDense(model: *GpuModel, weight: []const f32, bias: ?[]const f32, in_features: usize, out_features: usize, diag: *Diagnostic) Error!Dense {
    const bias_ptr: Ptr = if (bias) |b| try model.putF32(b, diag) else 0;
    const mma = model.dense_mma and in_features % 16 == 0;
    if (mma) {
        model.noteDenseSplits(in_features, out_features, false);
        if (try exactHalves(model.gpa, weight)) |halves| {
            defer model.gpa.free(halves);
            return .{ .weight = try model.put(std.mem.sliceAsBytes(halves), diag), .bias = bias_ptr, .mma = true, .half = true };
        }
    }
    return .{ .weight = try model.putF32(weight, diag), .bias = bias_ptr, .mma = mma, .half = false };
}

/// `values` as f16 (owned by the caller) when every one converts exactly, else null: a weight the
/// checkpoint stored as f16, or as bf16 within f16's range and precision.
pub fn exactHalves(gpa: std.mem.Allocator, values: []const f32) error{OutOfMemory}!?[]f16 {
    const halves = try gpa.alloc(f16, values.len);
    for (halves, values) |*h, v| {
        h.* = @floatCast(v);
        if (@as(f32, h.*) != v) {
            gpa.free(halves);
            return null;
        }
    }
    return halves;
}

test exactHalves {
    const gpa = std.testing.allocator;
    const halves = (try exactHalves(gpa, &.{ 1.0, -0.5, 0.0, 65504.0, 0x1p-24 })).?;
    defer gpa.free(halves);
    try std.testing.expectEqual(@as(f16, 65504.0), halves[3]);
    try std.testing.expectEqual(@as(?[]f16, null), try exactHalves(gpa, &.{ 1.0, 1.0 + 0x1p-12 })); // a mantissa bit past f16's
    try std.testing.expectEqual(@as(?[]f16, null), try exactHalves(gpa, &.{70000.0})); // past f16's range
    try std.testing.expectEqual(@as(?[]f16, null), try exactHalves(gpa, &.{0x1p-26})); // under its subnormals
    try std.testing.expectEqual(@as(?[]f16, null), try exactHalves(gpa, &.{std.math.nan(f32)}));
}

/// Room in model.acc (sized in cuda_buffers.zig) for a tensor-core projection's split sums.
pub fn noteDenseSplits(model: *GpuModel, in_features: usize, out_features: usize, squares: bool) void {
    const rows = @max(model.limits.rows_max, model.limits.logits_rows_max);
    model.dense_partials = @max(model.dense_partials, K.Kernels.denseScratch(rows, in_features, out_features, squares));
}

/// y = x · Wᵀ (+ b) over `rows` rows for an unquantized weight.
pub fn runDense(model: *GpuModel, k: K.Kernels, d: Dense, x: Ptr, y: Ptr, rows: usize, in_features: usize, out_features: usize) Error!void {
    if (!d.mma) return k.denseLinear(x, d.weight, d.bias, y, rows, in_features, out_features);
    try k.denseMma(denseCall(model, d, x, 0, y, rows, in_features, out_features));
}

/// runDense for a tensor-core weight whose input rows are x_stride floats apart (a part of a
/// wider row, as KDA's stacked gates leave them).
pub fn runDenseStrided(model: *GpuModel, k: K.Kernels, linear: *const GpuLinear, x: Ptr, x_stride: usize, y: Ptr, rows: usize) Error!void {
    std.debug.assert(linear.kind.dense.mma);
    try k.denseMma(denseCall(model, linear.kind.dense, x, x_stride, y, rows, linear.in_features, linear.out_features));
}

fn denseCall(model: *GpuModel, d: Dense, x: Ptr, x_stride: usize, y: Ptr, rows: usize, in_features: usize, out_features: usize) K.Kernels.DenseCall {
    return .{
        .x = x,
        .weight = d.weight,
        .half = d.half,
        .bias = d.bias,
        .y = y,
        .x_stride = x_stride,
        .y_stride = out_features,
        .partial = model.acc,
        .rows = rows,
        .in_features = in_features,
        .out_features = out_features,
    };
}

/// The fields every EXL3 launch of this model shares, for a weight of `shape` (anything with
/// k_p, n_p, bits2 and codebook) in `table`; callers add what differs (rows, tables, SwiGLU).
pub fn exl3Call(model: *const GpuModel, shape: anytype, table: Ptr, in_features: usize, out_features: usize, x: Ptr, y: Ptr, items: usize) K.Kernels.Exl3Call {
    return .{
        .x = x,
        .table = table,
        .acc = model.acc,
        .counters = model.counters,
        .grouping = model.grouping,
        .y = y,
        .items = items,
        .in_features = in_features,
        .out_features = out_features,
        .k_p = shape.k_p,
        .n_p = shape.n_p,
        .bits2 = shape.bits2,
        .codebook = shape.codebook,
        .split_entries = if (@hasField(@TypeOf(shape), "split_entries")) shape.split_entries else 0,
        .rows_together = model.shared_items,
    };
}

/// The GEMV of a pair table (pairTable) over the same rows: first's outputs at y, second's
/// after them. With `prompt`, for the generated rows only (the prompt rows' entries say -1).
pub fn pairGemv(model: *GpuModel, k: K.Kernels, first: *const GpuLinear, table: Ptr, x: Ptr, y: Ptr, rows: usize, prompt: bool) Error!void {
    var call = model.exl3Call(first.kind.exl3, table, first.in_features, first.out_features, x, y, 2 * rows);
    call.group_items = rows;
    if (prompt) {
        call.layer_of_item = model.rowTable(.pair);
        call.layers = 2;
    }
    if (!prompt or model.step_decode) try k.exl3Linear(call);
}

/// Two linears of one pair table on the same rows, as runLinear would run each: the generated
/// rows in one GEMV launch, a prompt step's prompt rows on the prompt kernels, linear by linear.
pub fn runPair(model: *GpuModel, k: K.Kernels, first: *const GpuLinear, second: *const GpuLinear, table: Ptr, x: Ptr, y: Ptr, rows: usize) Error!void {
    const prompt = model.step_prompt and first.kind.exl3.prompt;
    try model.pairGemv(k, first, table, x, y, rows, prompt);
    if (!prompt) return;
    const width = first.out_features * @sizeOf(f32);
    for ([2]*const GpuLinear{ first, second }, [2]Ptr{ y, y + rows * width }) |linear, out| {
        const e = linear.kind.exl3;
        try model.launcher(k).runLinear(model.prompt_scratch.?, x, rows, 1, model.rowTable(.prompt), e.table, promptShape(e), linear.in_features, linear.out_features, out);
    }
}

/// rows_wanted: 0, or a device array naming which rows of x to run (the logits rows).
pub fn runLinear(model: *GpuModel, k: K.Kernels, linear: *const GpuLinear, x: Ptr, y: Ptr, rows: usize, rows_wanted: Ptr) Error!void {
    switch (linear.kind) {
        .exl3 => |e| {
            var call = model.exl3Call(e, e.table, linear.in_features, linear.out_features, x, y, rows);
            call.source_rows = rows_wanted;
            const prompt = rows_wanted == 0 and model.step_prompt and e.prompt;
            if (prompt) {
                call.layer_of_item = model.rowTable(.gemv);
                call.layers = 1;
            }
            if (!prompt or model.step_decode) try k.exl3Linear(call);
            if (prompt) try model.launcher(k).runLinear(model.prompt_scratch.?, x, rows, 1, model.rowTable(.prompt), e.table, promptShape(e), linear.in_features, linear.out_features, y);
        },
        .dense => |d| {
            std.debug.assert(rows_wanted == 0);
            try model.runDense(k, d, x, y, rows, linear.in_features, linear.out_features);
        },
    }
}

pub fn launcher(model: *const GpuModel, k: K.Kernels) P.Launcher {
    return .{ .glm = k, .module = &model.prompt_module, .linear_form = model.prompt_linear, .mlp_form = model.prompt_mlp, .deep = model.prompt_deep };
}

/// The shape of anything with k_p, n_p, bits2 and codebook (a GroupedLinear, a GpuLinear's exl3).
pub fn promptShape(g: anytype) P.Shape {
    return .{ .k_p = g.k_p, .n_p = g.n_p, .bits2 = g.bits2, .codebook = g.codebook };
}
