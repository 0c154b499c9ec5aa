//! Kimi delta attention, GLM-5.3-Flash's linear attention layers (transformers 5.17's
//! Glm5NextTextLinearAttention): [q | k | v] = qkv_proj(x) through a causal depthwise convolution
//! and SiLU; q and k L2-normalized per head, q scaled by head_dim^-0.5; a per-channel forget gate
//! g = lower_bound·sigmoid(e^A_log·(f_b(f_a(x)) + dt_bias)) (or -e^A_log·softplus(·) without a
//! bound); β = sigmoid(b_proj(x)) per head; then per head the gated delta rule over a K×V state S:
//!   S ← diag(e^g)·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq,
//! and o_proj of the RMS-normed o gated by sigmoid(g_b(g_a(x))).
//!
//! The CPU runs the rule row by row (transformers' recurrent form; its chunked form for prompts is
//! the same sum regrouped), so a sequence's numbers do not depend on how its prompt was chunked or
//! batched. Each sequence's state (S per head, the convolution's last kernel-1 inputs) lives in
//! `State` at the sequence's slot; a row at position 0 starts from zeros.
const std = @import("std");
const core = @import("../../../core/root.zig");
const loader_mod = @import("../loader.zig");
const Config = @import("../config.zig").Config;
const Linear = @import("../linear.zig").Linear;
const Batch = @import("../batch.zig").Batch;
const ops = @import("../ops.zig");

pub const Kda = struct {
    /// The peer's fused qkv_proj, or transformers' q_proj, k_proj, v_proj.
    qkv: union(enum) { fused: Linear, split: [3]Linear },
    /// (3·width, kernel): the depthwise taps, oldest input first.
    conv: []f32,
    f_a: Linear,
    f_b: Linear,
    dt_bias: []f32,
    a_log: []f32,
    b: Linear,
    g_a: Linear,
    g_b: Linear,
    o_norm: []f32,
    o: Linear,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8) loader_mod.Error!Kda {
        const c = loader.config;
        const k = c.kda;
        const hidden = c.hidden_size;
        const width = k.width();
        var buffer: [256]u8 = undefined;
        const name = loader_mod.join;
        var result: Kda = undefined;
        if (loader.hasLinear(name(&buffer, prefix, "qkv_proj"))) {
            result.qkv = .{ .fused = try loader.linear(name(&buffer, prefix, "qkv_proj"), hidden, 3 * width, .none) };
        } else {
            var split: [3]Linear = undefined;
            inline for (.{ "q_proj", "k_proj", "v_proj" }, 0..) |projection, i| {
                split[i] = try loader.linear(name(&buffer, prefix, projection), hidden, width, .none);
            }
            result.qkv = .{ .split = split };
        }
        result.conv = try convTaps(loader, prefix, width, k.conv_kernel);
        // The forget gate's tensors: stored beside the others, or under transformers' forget_gate.
        var gate_buffer: [256]u8 = undefined;
        const module_names = loader.hasLinear(name(&buffer, prefix, "forget_gate.f_a_proj"));
        const gate = if (module_names) name(&gate_buffer, prefix, "forget_gate") else prefix;
        result.f_a = try loader.linear(name(&buffer, gate, "f_a_proj"), hidden, k.head_dim, .none);
        result.f_b = try loader.linear(name(&buffer, gate, "f_b_proj"), k.head_dim, width, .none);
        result.dt_bias = try loader.vector(name(&buffer, gate, "dt_bias"), width);
        result.a_log = try loader.vector(name(&buffer, gate, "A_log"), k.heads);
        result.b = try loader.linear(name(&buffer, prefix, "b_proj"), hidden, k.heads, .none);
        result.g_a = try loader.linear(name(&buffer, prefix, "g_a_proj"), hidden, k.head_dim, .none);
        result.g_b = try loader.linear(name(&buffer, prefix, "g_b_proj"), k.head_dim, width, .none);
        result.o_norm = try loader.vector(name(&buffer, prefix, "o_norm.weight"), k.head_dim);
        result.o = try loader.linear(name(&buffer, prefix, "o_proj"), width, hidden, .none);
        return result;
    }

    pub fn deinit(kda: *Kda, gpa: std.mem.Allocator) void {
        switch (kda.qkv) {
            .fused => |*l| l.deinit(gpa),
            .split => |*ls| for (ls) |*l| l.deinit(gpa),
        }
        for ([_]*Linear{ &kda.f_a, &kda.f_b, &kda.b, &kda.g_a, &kda.g_b, &kda.o }) |l| l.deinit(gpa);
    }

    pub fn scratchLength(kda: *const Kda, rows: usize) usize {
        var length: usize = 0;
        switch (kda.qkv) {
            .fused => |*l| length = l.scratchLength(rows),
            .split => |*ls| for (ls) |*l| {
                length = @max(length, l.scratchLength(rows));
            },
        }
        for ([_]*const Linear{ &kda.f_a, &kda.f_b, &kda.b, &kda.g_a, &kda.g_b, &kda.o }) |l| length = @max(length, l.scratchLength(rows));
        return length;
    }

    /// out = the layer's attention output for the batch's rows; `layer` is its index among KDA
    /// layers. Rows of one sequence must come in position order (the engine plans them so).
    pub fn forward(kda: *const Kda, c: *const Config, layer: usize, state: *State, batch: Batch, x: []const f32, out: []f32, scratch: *Scratch, linear_scratch: []f32) void {
        const k = c.kda;
        const rows = batch.rows();
        const width = k.width();
        std.debug.assert(batch.sequences.len == rows);
        const mixed = scratch.mixed[0 .. rows * 3 * width];
        switch (kda.qkv) {
            .fused => |*l| l.forward(rows, x, mixed, linear_scratch),
            .split => |*ls| for (ls, 0..) |*l, part| {
                const one = scratch.core[0 .. rows * width];
                l.forward(rows, x, one, linear_scratch);
                for (0..rows) |r| @memcpy(mixed[(r * 3 + part) * width ..][0..width], one[r * width ..][0..width]);
            },
        }
        const low = scratch.low[0 .. rows * k.head_dim];
        const decay = scratch.decay[0 .. rows * width];
        const gate = scratch.gate[0 .. rows * width];
        kda.f_a.forward(rows, x, low, linear_scratch);
        kda.f_b.forward(rows, low, decay, linear_scratch);
        kda.g_a.forward(rows, x, low, linear_scratch);
        kda.g_b.forward(rows, low, gate, linear_scratch);
        kda.b.forward(rows, x, scratch.beta[0 .. rows * k.heads], linear_scratch);

        // Runs of consecutive rows of one sequence; the convolution walks them in row order.
        var runs: usize = 0;
        for (0..rows) |r| {
            if (batch.positions[r] == 0) state.reset(batch.sequences[r], layer);
            kda.convolve(c, state.tail(batch.sequences[r], layer), mixed[r * 3 * width ..][0 .. 3 * width]);
            if (r == 0 or batch.sequences[r] != batch.sequences[r - 1]) {
                scratch.run_starts[runs] = @intCast(r);
                runs += 1;
            }
        }
        scratch.run_starts[runs] = @intCast(rows);
        const job: Job = .{ .config = c, .kda = kda, .layer = layer, .state = state, .batch = batch, .scratch = scratch };
        core.parallel.forRange(runs * k.heads, 1, &job, Job.run);
        kda.o.forward(rows, scratch.core[0 .. rows * width], out, linear_scratch);
    }

    /// One row's convolution in place: its inputs with the sequence's previous kernel-1 inputs,
    /// through the taps and SiLU; the newest inputs become the tail.
    fn convolve(kda: *const Kda, c: *const Config, tail: []f32, row: []f32) void {
        const taps = c.kda.conv_kernel;
        const channels = row.len;
        for (0..channels) |ch| {
            const w = kda.conv[ch * taps ..][0..taps];
            var sum: f32 = w[taps - 1] * row[ch];
            for (0..taps - 1) |j| sum += w[j] * tail[j * channels + ch];
            // Shift this channel's history: the oldest drops, the current input enters.
            if (taps > 1) {
                for (0..taps - 2) |j| tail[j * channels + ch] = tail[(j + 1) * channels + ch];
                tail[(taps - 2) * channels + ch] = row[ch];
            }
            row[ch] = ops.silu(sum);
        }
    }
};

/// The conv taps: one [3·width, 1, kernel] (or [3·width, kernel]) tensor, or transformers-era
/// q_conv1d / k_conv1d / v_conv1d apart.
fn convTaps(loader: *loader_mod.Loader, prefix: []const u8, width: usize, taps: usize) loader_mod.Error![]f32 {
    const fused = loader.name("{s}.conv1d.weight", .{prefix});
    if (loader.has(fused)) return try taps3d(loader, fused, 3 * width, taps);
    const out = try loader.arena.alloc(f32, 3 * width * taps);
    inline for (.{ "q", "k", "v" }, 0..) |part, i| {
        const values = try taps3d(loader, loader.name("{s}." ++ part ++ "_conv1d.weight", .{prefix}), width, taps);
        @memcpy(out[i * width * taps ..][0 .. width * taps], values);
    }
    return out;
}

fn taps3d(loader: *loader_mod.Loader, tensor_name: []const u8, channels: usize, taps: usize) loader_mod.Error![]f32 {
    const tensor = try loader.require(tensor_name);
    const shape = tensor.shape();
    if (shape.len == 3) return try loader.matrix3(tensor_name, channels, 1, taps);
    return try loader.matrix(tensor_name, channels, taps);
}

const Job = struct {
    config: *const Config,
    kda: *const Kda,
    layer: usize,
    state: *State,
    batch: Batch,
    scratch: *Scratch,

    /// Items are (run, head) pairs: the run's rows through the head's delta rule in order, then
    /// the gated norm of each row's output.
    fn run(job: *const Job, worker: usize, begin: usize, end: usize) void {
        _ = worker;
        const c = job.config;
        const k = c.kda;
        const s = job.scratch;
        const d = k.head_dim;
        const width = k.width();
        const scale: f32 = @floatCast(1.0 / @sqrt(@as(f64, @floatFromInt(d))));
        for (begin..end) |item| {
            const run_index = item / k.heads;
            const h = item % k.heads;
            const first = s.run_starts[run_index];
            const last = s.run_starts[run_index + 1];
            const matrix = job.state.matrix(job.batch.sequences[first], job.layer, h);
            const rate = @exp(job.kda.a_log[h]);
            for (first..last) |r| {
                const row = s.mixed[r * 3 * width ..][0 .. 3 * width];
                const q = row[h * d ..][0..d];
                const key = row[width + h * d ..][0..d];
                const v = row[2 * width + h * d ..][0..d];
                l2Normalize(q, scale);
                l2Normalize(key, 1);
                const g = s.decay[r * width + h * d ..][0..d];
                for (g, job.kda.dt_bias[h * d ..][0..d]) |*gv, bias| gv.* = forgetGate(k.lower_bound, rate, gv.* + bias);
                const beta = sigmoid(s.beta[r * k.heads + h]);
                const o = s.core[r * width + h * d ..][0..d];
                deltaStep(matrix, d, q, key, v, g, beta, o);
                ops.rmsNorm(o, job.kda.o_norm, c.rms_norm_eps, o);
                for (o, s.gate[r * width + h * d ..][0..d]) |*ov, gv| ov.* *= sigmoid(gv);
            }
        }
    }
};

/// S ← diag(e^g)·S; S ← S + k ⊗ β(v − Sᵀk); o = Sᵀq, with S (d, d) row-major by key dim.
fn deltaStep(matrix: []f32, d: usize, q: []const f32, key: []const f32, v: []const f32, g: []const f32, beta: f32, o: []f32) void {
    var delta: [dim_max]f32 = undefined;
    @memcpy(delta[0..d], v);
    for (0..d) |i| {
        const decay = @exp(g[i]);
        const s_row = matrix[i * d ..][0..d];
        for (s_row) |*sv| sv.* *= decay;
        for (delta[0..d], s_row) |*dv, sv| dv.* -= sv * key[i];
    }
    for (delta[0..d]) |*dv| dv.* *= beta;
    @memset(o, 0);
    for (0..d) |i| {
        const s_row = matrix[i * d ..][0..d];
        for (s_row, delta[0..d]) |*sv, dv| sv.* += key[i] * dv;
        for (o, s_row) |*ov, sv| ov.* += q[i] * sv;
    }
}

pub const dim_max = 512;

/// x / sqrt(Σx² + 1e-6), times `scale` (FLA's l2norm: eps inside the root, not a max).
fn l2Normalize(x: []f32, scale: f32) void {
    var sum: f64 = 0;
    for (x) |v| sum += @as(f64, v) * v;
    const inverse = scale / @sqrt(@as(f32, @floatCast(sum)) + 1e-6);
    for (x) |*v| v.* *= inverse;
}

fn sigmoid(z: f32) f32 {
    return 1.0 / (1.0 + @exp(-z));
}

fn forgetGate(lower_bound: ?f32, rate: f32, g: f32) f32 {
    if (lower_bound) |bound| return bound * sigmoid(rate * g);
    const softplus = if (g > 20.0) g else @log(1.0 + @exp(g));
    return -rate * softplus;
}

/// Every sequence slot's recurrent state across the KDA layers, allocated with the engine: per
/// (slot, layer, head) a d×d matrix, per (slot, layer) the last kernel-1 convolution inputs.
pub const State = struct {
    slots: usize,
    layers: usize,
    heads: usize,
    head_dim: usize,
    tail_length: usize,
    matrices: []f32,
    tails: []f32,

    pub fn floatsPerSequence(c: *const Config) usize {
        const k = c.kda;
        const layers = c.countOf("attention", .kda);
        return layers * (k.heads * k.head_dim * k.head_dim + (k.conv_kernel - 1) * 3 * k.width());
    }

    pub fn init(gpa: std.mem.Allocator, c: *const Config, slots: usize) error{OutOfMemory}!State {
        const k = c.kda;
        const layers = c.countOf("attention", .kda);
        const tail_length = (k.conv_kernel - 1) * 3 * k.width();
        const matrices = try gpa.alloc(f32, slots * layers * k.heads * k.head_dim * k.head_dim);
        errdefer gpa.free(matrices);
        const tails = try gpa.alloc(f32, slots * layers * tail_length);
        @memset(matrices, 0);
        @memset(tails, 0);
        return .{ .slots = slots, .layers = layers, .heads = k.heads, .head_dim = k.head_dim, .tail_length = tail_length, .matrices = matrices, .tails = tails };
    }

    pub fn deinit(state: *State, gpa: std.mem.Allocator) void {
        gpa.free(state.matrices);
        gpa.free(state.tails);
    }

    fn matrix(state: *State, slot: u32, layer: usize, head: usize) []f32 {
        std.debug.assert(slot < state.slots and layer < state.layers and head < state.heads);
        const size = state.head_dim * state.head_dim;
        return state.matrices[((@as(usize, slot) * state.layers + layer) * state.heads + head) * size ..][0..size];
    }

    fn tail(state: *State, slot: u32, layer: usize) []f32 {
        std.debug.assert(slot < state.slots and layer < state.layers);
        return state.tails[(@as(usize, slot) * state.layers + layer) * state.tail_length ..][0..state.tail_length];
    }

    /// Slot `to`'s state (every layer's matrices and convolution tail) becomes slot `from`'s.
    pub fn copySlot(state: *State, from: u32, to: u32) void {
        std.debug.assert(from < state.slots and to < state.slots);
        const size = state.layers * state.heads * state.head_dim * state.head_dim;
        const tails = state.layers * state.tail_length;
        @memcpy(state.matrices[@as(usize, to) * size ..][0..size], state.matrices[@as(usize, from) * size ..][0..size]);
        @memcpy(state.tails[@as(usize, to) * tails ..][0..tails], state.tails[@as(usize, from) * tails ..][0..tails]);
    }

    fn reset(state: *State, slot: u32, layer: usize) void {
        for (0..state.heads) |h| @memset(state.matrix(slot, layer, h), 0);
        @memset(state.tail(slot, layer), 0);
    }
};

pub const Scratch = struct {
    mixed: []f32, // (rows, 3·width): [q | k | v], convolved in place
    core: []f32, // (rows, width): the rule's output, normed and gated
    low: []f32, // (rows, head_dim): f_a / g_a
    decay: []f32, // (rows, width): the forget gate
    gate: []f32, // (rows, width): the output gate's logits
    beta: []f32, // (rows, heads)
    run_starts: []u32, // (rows + 1)

    pub fn init(arena: std.mem.Allocator, c: *const Config, rows_max: usize) error{OutOfMemory}!Scratch {
        const k = c.kda;
        return .{
            .mixed = try arena.alloc(f32, rows_max * 3 * k.width()),
            .core = try arena.alloc(f32, rows_max * k.width()),
            .low = try arena.alloc(f32, rows_max * k.head_dim),
            .decay = try arena.alloc(f32, rows_max * k.width()),
            .gate = try arena.alloc(f32, rows_max * k.width()),
            .beta = try arena.alloc(f32, rows_max * k.heads),
            .run_starts = try arena.alloc(u32, rows_max + 1),
        };
    }
};

test "the delta rule forgets, writes and reads as the recurrence says" {
    // d = 2: S starts at I; g = log(0.5) halves it; k = e0, v = (1, 3), β = 1 makes row 0 of S
    // equal v; q = e0 reads it back.
    var s = [_]f32{ 1, 0, 0, 1 };
    var o: [2]f32 = undefined;
    const half = @log(@as(f32, 0.5));
    deltaStep(&s, 2, &.{ 1, 0 }, &.{ 1, 0 }, &.{ 1, 3 }, &.{ half, half }, 1, &o);
    try std.testing.expectApproxEqAbs(@as(f32, 1), s[0], 1e-6);
    try std.testing.expectApproxEqAbs(@as(f32, 3), s[1], 1e-6);
    try std.testing.expectApproxEqAbs(@as(f32, 0.5), s[3], 1e-6);
    try std.testing.expectApproxEqAbs(@as(f32, 3), o[1], 1e-6);
}
