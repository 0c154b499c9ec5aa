//! The GPU side of Kimi delta attention (parts/kda.zig): the projections (qkv, the forget gate's
//! f_a/f_b, the output gate's g_a/g_b, b) through linear_cuda — f_a, g_a and b, unquantized and on
//! the same input, stacked into one launch — then cuda/kda_kernels.zig: the causal
//! convolution with each sequence's tail, the tails' update, and the delta rule per (run of one
//! sequence's rows, head) with its state in device memory at the sequence's slot; o_proj last.
//! Every slot's state is allocated with the model; a run starting at position 0 starts from zeros.
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const config_mod = @import("../config.zig");
const Kda = @import("kda.zig").Kda;
const Linear = @import("../linear.zig").Linear;
const linear_cuda = @import("linear_cuda.zig");
const Batch = @import("../batch.zig").Batch;
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const KK = cuda.kda_kernels;
const GpuLinear = linear_cuda.GpuLinear;
const Config = config_mod.Config;

pub const GpuKda = struct {
    qkv: GpuLinear,
    conv: Ptr,
    gates: Gates,
    f_b: GpuLinear,
    dt_bias: Ptr,
    a_log: Ptr,
    g_b: GpuLinear,
    o_norm: Ptr,
    o: GpuLinear,

    /// The projections of model.normed besides qkv: [f_a | g_a | b] as one (2·head_dim + heads)
    /// output projection when all three, and f_b and g_b that read them, are unquantized tensor-
    /// core weights (each launch of these skinny shapes costs ~8 us of a decode step, mostly
    /// latency); else apart.
    pub const Gates = union(enum) {
        stacked: GpuLinear,
        apart: struct { f_a: GpuLinear, g_a: GpuLinear, b: GpuLinear },
    };

    pub fn linears(kda: *const GpuKda) [7]?*const GpuLinear {
        return switch (kda.gates) {
            .stacked => |*g| .{ &kda.qkv, g, &kda.f_b, &kda.g_b, &kda.o, null, null },
            .apart => |*g| .{ &kda.qkv, &g.f_a, &kda.f_b, &g.b, &g.g_a, &kda.g_b, &kda.o },
        };
    }
};

/// A step's KDA buffers, every slot's state, and the step's runs (uploaded by uploadBatch).
pub const Buffers = struct {
    mixed: Ptr, // (rows, 3·width)
    conv_out: Ptr,
    low: Ptr, // (rows, head_dim), or (rows, 2·head_dim + heads): [f_a | g_a | b] stacked
    decay: Ptr, // (rows, width)
    gate: Ptr, // (rows, width)
    beta: Ptr, // (rows, heads)
    core: Ptr, // (rows, width)
    tails: Ptr, // (slots, kda layers, kernel - 1, 3·width)
    states: Ptr, // (slots, kda layers, heads, head_dim, head_dim)
    slots: Ptr, // (rows) u32
    run_starts: Ptr, // (rows + 1) i32, then the run count
    host_runs: []i32,
};

pub fn checkShape(c: *const Config, diag: *Diagnostic) Error!void {
    if (c.countOf("attention", .kda) == 0) return;
    if (c.kda.head_dim != KK.head_dim or c.kda.conv_kernel < 2 or c.kda.conv_kernel > KK.taps_max) {
        diag.set("the CUDA KDA kernels take linear_head_dim {d} and a conv kernel of 2..{d}; this model has {d} and {d}", .{ KK.head_dim, KK.taps_max, c.kda.head_dim, c.kda.conv_kernel });
        return error.UnsupportedModel;
    }
}

pub fn upload(model: *GpuModel, source: *const Kda, diag: *Diagnostic) Error!GpuKda {
    return .{
        .qkv = switch (source.qkv) {
            .fused => |*l| try model.uploadLinear(l, diag),
            .split => |*ls| try uploadStacked(model, ls, diag),
        },
        .conv = try model.putF32(source.conv, diag),
        .gates = try uploadGates(model, source, diag),
        .f_b = try model.uploadLinear(&source.f_b, diag),
        .dt_bias = try model.putF32(source.dt_bias, diag),
        .a_log = try model.putF32(source.a_log, diag),
        .g_b = try model.uploadLinear(&source.g_b, diag),
        .o_norm = try model.putF32(source.o_norm, diag),
        .o = try model.uploadLinear(&source.o, diag),
    };
}

fn uploadGates(model: *GpuModel, source: *const Kda, diag: *Diagnostic) Error!GpuKda.Gates {
    const parts = [3]*const Linear{ &source.f_a, &source.g_a, &source.b };
    const all = [5]*const Linear{ &source.f_a, &source.g_a, &source.b, &source.f_b, &source.g_b };
    // The readers take their inputs at a stride of the stacked width, in float4 loads.
    const width = source.f_a.out_features + source.g_a.out_features + source.b.out_features;
    const unquantized = for (all) |l| {
        if (l.kind != .dense or l.kind.dense.bias != null) break false;
    } else true;
    const stack = model.dense_mma and unquantized and source.f_a.in_features % 16 == 0 and source.f_b.in_features % 16 == 0 and width % 4 == 0 and source.f_a.out_features % 4 == 0;
    if (!stack) return .{ .apart = .{
        .f_a = try model.uploadLinear(&source.f_a, diag),
        .g_a = try model.uploadLinear(&source.g_a, diag),
        .b = try model.uploadLinear(&source.b, diag),
    } };
    const in = source.f_a.in_features;
    var out: usize = 0;
    for (parts) |l| out += l.out_features;
    const stacked = try model.gpa.alloc(f32, out * in);
    defer model.gpa.free(stacked);
    var at: usize = 0;
    for (parts) |l| {
        @memcpy(stacked[at..][0 .. l.out_features * in], l.kind.dense.weight);
        at += l.out_features * in;
    }
    const fused: Linear = .{ .in_features = in, .out_features = out, .kind = .{ .dense = .{ .weight = stacked, .bias = null } } };
    return .{ .stacked = try model.uploadLinear(&fused, diag) };
}

/// transformers' q_proj, k_proj, v_proj as one [q | k | v] projection; unquantized only (EXL3
/// converters write the fused qkv_proj).
fn uploadStacked(model: *GpuModel, parts: *const [3]Linear, diag: *Diagnostic) Error!GpuLinear {
    const in = parts[0].in_features;
    const out = parts[0].out_features;
    const stacked = try model.gpa.alloc(f32, 3 * out * in);
    defer model.gpa.free(stacked);
    for (parts, 0..) |*part, i| switch (part.kind) {
        .dense => |d| @memcpy(stacked[i * out * in ..][0 .. out * in], d.weight),
        .exl3 => {
            diag.set("the CUDA backend takes KDA's q/k/v projections fused (qkv_proj) when they are EXL3", .{});
            return error.UnsupportedModel;
        },
    };
    const fused: Linear = .{ .in_features = in, .out_features = 3 * out, .kind = .{ .dense = .{ .weight = stacked, .bias = null } } };
    return model.uploadLinear(&fused, diag);
}

pub fn allocate(model: *GpuModel, diag: *Diagnostic) Error!?Buffers {
    const c = model.config;
    const layers = c.countOf("attention", .kda);
    if (layers == 0) return null;
    const k = c.kda;
    const rows = model.limits.rows_max;
    const slots = @max(model.limits.sequences + model.limits.state_snapshots, 1);
    const f = @sizeOf(f32);
    const width = k.width();
    const size = slotBytes(&c);
    return .{
        .mixed = try model.alloc(rows * 3 * width * f, diag),
        .conv_out = try model.alloc(rows * 3 * width * f, diag),
        .low = try model.alloc(rows * (2 * k.head_dim + k.heads) * f, diag),
        .decay = try model.alloc(rows * width * f, diag),
        .gate = try model.alloc(rows * width * f, diag),
        .beta = try model.alloc(rows * k.heads * f, diag),
        .core = try model.alloc(rows * width * f, diag),
        .tails = try model.alloc(@max(slots * size.tails, f), diag),
        .states = try model.alloc(slots * size.states, diag),
        .slots = try model.alloc(rows * 4, diag),
        .run_starts = try model.alloc((rows + 2) * 4, diag),
        .host_runs = try model.gpa.alloc(i32, rows + 2),
    };
}

/// Slot `to`'s state (matrices and convolution tails, every layer) becomes slot `from`'s, queued
/// on the stream after the forwards before it.
pub fn copySlot(model: *GpuModel, from: u32, to: u32, diag: *Diagnostic) Error!void {
    const b = &(model.kda orelse return);
    const size = slotBytes(&model.config);
    try model.gpu.copy(b.states + to * size.states, b.states + from * size.states, size.states, diag);
    if (size.tails > 0) try model.gpu.copy(b.tails + to * size.tails, b.tails + from * size.tails, size.tails, diag);
}

/// One state slot's bytes in `states` (every layer's matrices) and `tails` (its convolution tails).
fn slotBytes(c: *const Config) struct { states: usize, tails: usize } {
    const k = c.kda;
    const layers = c.countOf("attention", .kda);
    return .{
        .states = layers * k.heads * k.head_dim * k.head_dim * @sizeOf(f32),
        .tails = layers * (k.conv_kernel - 1) * 3 * k.width() * @sizeOf(f32),
    };
}

/// The batch's sequence slots and runs (consecutive rows of one sequence) to the device: run
/// starts, then the run count after rows + 1 entries.
pub fn uploadRuns(model: *GpuModel, batch: Batch, diag: *Diagnostic) Error!void {
    const b = &(model.kda orelse return);
    const rows = batch.rows();
    std.debug.assert(batch.sequences.len == rows);
    const rows_max = model.limits.rows_max;
    var runs: usize = 0;
    for (0..rows) |r| {
        if (r == 0 or batch.sequences[r] != batch.sequences[r - 1]) {
            b.host_runs[runs] = @intCast(r);
            runs += 1;
        }
    }
    b.host_runs[runs] = @intCast(rows);
    b.host_runs[rows_max + 1] = @intCast(runs);
    try model.gpu.upload(b.slots, std.mem.sliceAsBytes(batch.sequences), diag);
    try model.gpu.upload(b.run_starts, std.mem.sliceAsBytes(b.host_runs[0 .. runs + 1]), diag);
    try model.gpu.upload(b.run_starts + (rows_max + 1) * 4, std.mem.sliceAsBytes(b.host_runs[rows_max + 1 ..][0..1]), diag);
}

/// model.projected = o_proj(KDA(model.normed)); `layer`: the layer's index among KDA layers.
pub fn attention(model: *GpuModel, k: K.Kernels, kda: *const GpuKda, layer: usize, rows: usize) Error!void {
    const c = model.config;
    const a = c.kda;
    const b = model.kda.?;
    const kk: KK.Kernels = .{ .gpu = &model.gpu, .module = &model.kda_module.?, .diag = k.diag };
    const layers = c.countOf("attention", .kda);
    try model.runLinear(k, &kda.qkv, model.normed, b.mixed, rows, 0);
    var beta = b.beta;
    var beta_stride = a.heads;
    switch (kda.gates) {
        .stacked => |*gates| {
            // low = [f_a | g_a | b] per row; f_b and g_b read their parts in place.
            const width = gates.out_features;
            try model.runLinear(k, gates, model.normed, b.low, rows, 0);
            try model.runDenseStrided(k, &kda.f_b, b.low, width, b.decay, rows);
            try model.runDenseStrided(k, &kda.g_b, b.low + a.head_dim * 4, width, b.gate, rows);
            beta = b.low + 2 * a.head_dim * 4;
            beta_stride = width;
        },
        .apart => |*gates| {
            try model.runLinear(k, &gates.f_a, model.normed, b.low, rows, 0);
            try model.runLinear(k, &kda.f_b, b.low, b.decay, rows, 0);
            try model.runLinear(k, &gates.g_a, model.normed, b.low, rows, 0);
            try model.runLinear(k, &kda.g_b, b.low, b.gate, rows, 0);
            try model.runLinear(k, &gates.b, model.normed, b.beta, rows, 0);
        },
    }
    try kk.conv(b.mixed, kda.conv, b.tails, b.slots, model.positions, b.conv_out, rows, 3 * a.width(), a.conv_kernel, layers, layer);
    try kk.tail(b.mixed, b.tails, b.slots, model.positions, rows, 3 * a.width(), a.conv_kernel, layers, layer);
    const run_count = b.run_starts + (model.limits.rows_max + 1) * 4;
    try kk.recurrent(b.conv_out, b.decay, kda.dt_bias, kda.a_log, beta, beta_stride, b.gate, kda.o_norm, b.states, b.slots, model.positions, b.run_starts, run_count, b.core, rows, a.heads, layers, layer, a.lower_bound, c.rms_norm_eps);
    try model.runLinear(k, &kda.o, b.core, model.projected, rows, 0);
}
