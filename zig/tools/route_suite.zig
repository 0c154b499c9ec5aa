//! `tf-cuda-test route`: the MoE router (tf_route; for a prompt chunk's rows tf_route_logits and
//! then tf_route choosing) against the CPU router (parts/router.zig), expert for expert:
//!   - logits made exact in f32 on both sides (small multiples of powers of two), so a selection
//!     can differ only by the rule, not by a dot product's order;
//!   - experts in families of equal gate rows and corrections, ties that straddle the top-k cut:
//!     the lower index wins, as on the CPU;
//!   - the shapes of GLM-4.5-Air (128 experts), GLM-4.5 (160), GLM-5.3-Flash (288) and a
//!     group-limited 256 (8 groups, 4 a token); with and without normalisation and scaling;
//!   - a merged shared expert's slot, and a step's prompt rows (their experts on the prompt tables,
//!     -1 on the GEMV's, and the other way round);
//!   - a row of NaN: its picks are still top_k distinct experts in range (no table reads past them);
//!   - 6 rows (a decode step's one launch) and 20 (the logits' own launch, a last group of 4 rows);
//!   - the logits' own launch against tf_route's, row by row, on random f32 inputs, bit for bit
//!     (their chains are the same): both of its forms, the tiles (hidden a multiple of 128) and
//!     a warp per expert (other sizes), rows and experts past a whole block;
//!   - the sort of the picks into groups by entry, tf_exl3_group_items (group_suite.zig).
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const glm = tf.glm;
const Diagnostic = tf.core.Diagnostic;
const Report = @import("report.zig").Report;
const upload = @import("device_upload.zig").upload;
const Uploads = @import("device_upload.zig").Uploads;
const forward_module = @import("forward_module.zig");
const group_suite = @import("group_suite.zig");

const Case = struct {
    name: []const u8,
    experts: usize,
    top_k: usize = 8,
    groups: usize = 1,
    groups_per_token: usize = 1,
    normalize: bool = true,
    scaling: f32 = 1.0,
    /// Experts share a gate row and a correction with the others of their index mod `families`
    /// (0: every row its own).
    families: usize = 0,
    merged_shared: bool = false,
    prompt_rows: bool = false,
};

const cases = [_]Case{
    .{ .name = "Air 128 experts, ties across the cut", .experts = 128, .families = 12 },
    .{ .name = "GLM-4.5 160 experts, scaled, merged shared", .experts = 160, .scaling = 2.5, .merged_shared = true, .families = 13 },
    .{ .name = "GLM-5.3-Flash 288 experts", .experts = 288, .scaling = 2.5 },
    .{ .name = "256 experts in 8 groups, 4 a token", .experts = 256, .groups = 8, .groups_per_token = 4, .families = 24 },
    .{ .name = "64 experts top-4 unnormalised, prompt rows", .experts = 64, .top_k = 4, .normalize = false, .scaling = 1.8, .prompt_rows = true, .families = 7 },
    .{ .name = "512 experts (the kernel's most) top-16, merged shared, prompt rows", .experts = 512, .top_k = 16, .merged_shared = true, .prompt_rows = true },
    // Not a whole number of tf_route's or tf_route_logits' blocks of 8 experts.
    .{ .name = "42 experts top-6", .experts = 42, .top_k = 6, .families = 5 },
};

const hidden = 256;
const row_counts = [_]usize{ 6, 20 };
const rows_max = 20;
comptime {
    std.debug.assert(row_counts[0] < cuda.glm_kernels.Kernels.route_logits_rows_min and row_counts[1] >= cuda.glm_kernels.Kernels.route_logits_rows_min);
}

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, report: *Report) !void {
    var diag: Diagnostic = .{};
    var module = try forward_module.load(gpu, &diag, report);
    defer module.unload(gpu);
    const k: cuda.glm_kernels.Kernels = .{ .gpu = gpu, .module = &module, .diag = &diag };
    var prng = std.Random.DefaultPrng.init(0x2047e);
    for (row_counts) |rows| for (cases) |case| try runCase(gpa, gpu, k, prng.random(), case, rows, report);
    for (chain_cases) |case| try runChains(gpa, gpu, k, prng.random(), case, report);
    try group_suite.run(gpa, gpu, k, prng.random(), report);
}

const ChainCase = struct { hidden: usize, rows: usize, experts: usize };

/// tf_route_logits_tiles (4096: GLM-4.5-Air's; 2048 with 288 experts: GLM-5.3-Flash's), and
/// tf_route_logits with float4s (4100) and without (1030).
const chain_cases = [_]ChainCase{
    .{ .hidden = 4096, .rows = 37, .experts = 128 },
    .{ .hidden = 2048, .rows = 16, .experts = 288 },
    .{ .hidden = 4100, .rows = 21, .experts = 42 },
    .{ .hidden = 1030, .rows = 17, .experts = 20 },
};

/// The probabilities and choice scores a chunk's launch writes to the router's scratch against
/// those tf_route writes computing each row's logits itself.
fn runChains(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, case: ChainCase, report: *Report) !void {
    const rows = case.rows;
    const experts = case.experts;
    const top_k = 4;
    const x = try gpa.alloc(f32, rows * case.hidden);
    defer gpa.free(x);
    for (x) |*v| v.* = random.floatNorm(f32);
    const gate = try gpa.alloc(f32, experts * case.hidden);
    defer gpa.free(gate);
    for (gate) |*v| v.* = random.floatNorm(f32) * 0.05;
    const correction = try gpa.alloc(f32, experts);
    defer gpa.free(correction);
    for (correction) |*v| v.* = random.floatNorm(f32) * 0.01;

    var uploads: Uploads = .{ .gpu = gpu, .diag = k.diag };
    defer uploads.deinit();
    const d_x = try uploads.put(x);
    const scratch_bytes = rows * 2 * experts * 4;
    const d_scratch = try gpu.alloc(2 * scratch_bytes, k.diag); // the chunk's, then the rows'
    defer gpu.free(d_scratch);
    try gpu.poison(d_scratch, 2 * scratch_bytes, k.diag);
    const d_counters = try gpu.alloc(rows * 4, k.diag);
    defer gpu.free(d_counters);
    try gpu.zero(d_counters, rows * 4, k.diag);
    const items = rows * top_k;
    const d_out = try gpu.alloc(items * 4 * 6, k.diag);
    defer gpu.free(d_out);

    const route: cuda.glm_kernels.Kernels.Route = .{
        .x = d_x,
        .gate = try uploads.put(gate),
        .correction = try uploads.put(correction),
        .experts_out = d_out,
        .weights_out = d_out + items * 4,
        .pair_layers = d_out + items * 8,
        .pair_rows = d_out + items * 16,
        .row_prompt = 0,
        .prompt_layers = 0,
        .scratch = d_scratch,
        .counters = d_counters,
        .rows = rows,
        .hidden = case.hidden,
        .experts = experts,
        .top_k = top_k,
        .slots = top_k,
        .groups = 1,
        .groups_per_token = 1,
        .normalize = true,
        .scaling = 1.0,
    };
    std.debug.assert(rows >= cuda.glm_kernels.Kernels.route_logits_rows_min);
    try k.route(route);
    for (0..rows) |r| {
        var one = route;
        one.x = d_x + r * case.hidden * 4;
        one.scratch = d_scratch + scratch_bytes + r * 2 * experts * 4;
        one.counters = d_counters + r * 4;
        one.rows = 1;
        try k.route(one);
    }
    try gpu.synchronize(k.diag);
    const got = try gpa.alloc(u32, 2 * rows * 2 * experts);
    defer gpa.free(got);
    try gpu.download(std.mem.sliceAsBytes(got), d_scratch, k.diag);
    const chunk = got[0 .. rows * 2 * experts];
    const by_row = got[rows * 2 * experts ..];
    var differ: usize = 0;
    for (chunk, by_row) |a, b| differ += @intFromBool(a != b);
    report.check(differ == 0, "route logits, hidden {d}, {d} rows x {d} experts: {d} of {d} scratch words differ between the chunk's launch and tf_route's one row at a time", .{
        case.hidden, rows, experts, differ, chunk.len,
    });
}

fn runCase(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, case: Case, rows: usize, report: *Report) !void {
    const experts = case.experts;
    const slots = case.top_k + @intFromBool(case.merged_shared);
    const items = rows * slots;
    // Integers times powers of two: every product and partial sum is exact in f32, on either side.
    const x = try gpa.alloc(f32, rows * hidden);
    defer gpa.free(x);
    for (x) |*v| v.* = @as(f32, @floatFromInt(random.intRangeAtMost(i32, -8, 8))) / 16.0;
    const gate = try gpa.alloc(f32, experts * hidden);
    defer gpa.free(gate);
    const correction = try gpa.alloc(f32, experts);
    defer gpa.free(correction);
    for (0..experts) |e| {
        const source = if (case.families > 0 and e >= case.families) e % case.families else e;
        if (source != e) {
            @memcpy(gate[e * hidden ..][0..hidden], gate[source * hidden ..][0..hidden]);
            correction[e] = correction[source];
            continue;
        }
        for (gate[e * hidden ..][0..hidden]) |*v| v.* = @as(f32, @floatFromInt(random.intRangeAtMost(i32, -8, 8))) / 64.0;
        correction[e] = @as(f32, @floatFromInt(random.intRangeAtMost(i32, -16, 16))) / 64.0;
    }
    // The last row is NaN: only the validity of its picks is checked.
    @memset(x[(rows - 1) * hidden ..][0..hidden], std.math.nan(f32));
    var prompt_rows: [rows_max]i32 = undefined;
    const prompt = prompt_rows[0..rows];
    for (prompt, 0..) |*p, r| p.* = if (case.prompt_rows) @intCast(r % 2) else 0;

    var c: glm.Config = undefined;
    c.hidden_size = hidden;
    c.routed_experts = experts;
    c.experts_per_token = case.top_k;
    c.groups = case.groups;
    c.groups_per_token = case.groups_per_token;
    c.norm_topk_prob = case.normalize;
    c.routed_scaling_factor = case.scaling;

    const d_x = try upload(gpu, std.mem.sliceAsBytes(x), k.diag);
    defer gpu.free(d_x);
    const d_gate = try upload(gpu, std.mem.sliceAsBytes(gate), k.diag);
    defer gpu.free(d_gate);
    const d_correction = try upload(gpu, std.mem.sliceAsBytes(correction), k.diag);
    defer gpu.free(d_correction);
    const d_prompt = try upload(gpu, std.mem.sliceAsBytes(prompt), k.diag);
    defer gpu.free(d_prompt);
    const d_scratch = try gpu.alloc(rows * 2 * experts * 4, k.diag);
    defer gpu.free(d_scratch);
    const d_counters = try gpu.alloc(rows * 4, k.diag);
    defer gpu.free(d_counters);
    try gpu.zero(d_counters, rows * 4, k.diag);
    // Poisoned outputs: a slot the router leaves unwritten shows.
    // Seven arrays of `items` words: experts, weights, pair layers (two), pair rows (two), prompt layers.
    const d_out = try gpu.alloc(items * 4 * 7, k.diag);
    defer gpu.free(d_out);
    try gpu.poison(d_out, items * 4 * 7, k.diag);
    const d_experts = d_out;
    const d_weights = d_out + items * 4;
    const d_pair_layers = d_out + items * 8;
    const d_pair_rows = d_out + items * 16;
    const d_prompt_layers = d_out + items * 24;

    try k.route(.{
        .x = d_x,
        .gate = d_gate,
        .correction = d_correction,
        .experts_out = d_experts,
        .weights_out = d_weights,
        .pair_layers = d_pair_layers,
        .pair_rows = d_pair_rows,
        .row_prompt = if (case.prompt_rows) d_prompt else 0,
        .prompt_layers = if (case.prompt_rows) d_prompt_layers else 0,
        .scratch = d_scratch,
        .counters = d_counters,
        .rows = rows,
        .hidden = hidden,
        .experts = experts,
        .top_k = case.top_k,
        .slots = slots,
        .groups = case.groups,
        .groups_per_token = case.groups_per_token,
        .normalize = case.normalize,
        .scaling = case.scaling,
    });
    try gpu.synchronize(k.diag);
    const got = try gpa.alloc(i32, items * 7);
    defer gpa.free(got);
    try gpu.download(std.mem.sliceAsBytes(got), d_out, k.diag);
    var counters_all: [rows_max]u32 = undefined;
    const counters = counters_all[0..rows];
    try gpu.download(std.mem.sliceAsBytes(counters), d_counters, k.diag);
    const got_experts = got[0..items];
    const got_weights: []const f32 = @ptrCast(got[items .. 2 * items]);
    const got_pairs = got[2 * items .. 4 * items];
    const got_pair_rows = got[4 * items .. 6 * items];
    const got_prompt = got[6 * items .. 7 * items];

    var wrong_experts: usize = 0;
    var wrong_tables: usize = 0;
    var worst_weight: f64 = 0;
    var ties_at_cut: usize = 0;
    const entries: i32 = @intCast(experts + @intFromBool(case.merged_shared));
    for (0..rows) |r| {
        const is_prompt = prompt[r] != 0;
        var expected: [glm.config.experts_per_token_max + 1]i32 = undefined;
        var expected_weights: [glm.config.experts_per_token_max + 1]f32 = undefined;
        if (r < rows - 1) {
            const picked = glm.parts.router.route(c, gate, correction, x[r * hidden ..][0..hidden]);
            for (0..case.top_k) |s| {
                expected[s] = picked.experts[s];
                expected_weights[s] = picked.weights[s];
            }
            ties_at_cut += tiesAtCut(gate, correction, experts, picked.experts[0..case.top_k]);
        } else {
            // NaN: any top_k distinct experts in range, ascending.
            for (0..case.top_k) |s| {
                const e = if (is_prompt) got_prompt[r * slots + s] else got_experts[r * slots + s];
                const ascending = s == 0 or e > expected[s - 1];
                expected[s] = if (e >= 0 and e < experts and ascending) e else -2;
                expected_weights[s] = std.math.nan(f32);
            }
        }
        if (case.merged_shared) {
            expected[case.top_k] = @intCast(experts);
            expected_weights[case.top_k] = 1.0;
        }
        for (0..slots) |s| {
            const i = r * slots + s;
            const e = expected[s];
            const table_e = if (is_prompt) got_prompt[i] else got_experts[i];
            if (table_e != e or e == -2) wrong_experts += 1;
            const gemv_e: i32 = if (is_prompt) -1 else e;
            const ok_tables = got_experts[i] == gemv_e and got_pairs[i] == gemv_e and
                got_pairs[items + i] == (if (is_prompt) -1 else entries + e) and
                got_pair_rows[i] == r and got_pair_rows[items + i] == r and
                (!case.prompt_rows or got_prompt[i] == (if (is_prompt) e else -1));
            if (!ok_tables) wrong_tables += 1;
            if (r < rows - 1) {
                const want: f64 = expected_weights[s];
                worst_weight = @max(worst_weight, @abs(@as(f64, got_weights[i]) - want) / @abs(want));
            }
        }
    }
    const counters_reset = std.mem.allEqual(u32, counters, 0);
    report.check(wrong_experts == 0 and wrong_tables == 0 and worst_weight <= 1e-6 and counters_reset, "route {s}: {d} rows x {d} slots, {d} picks tied at the cut, {d} wrong experts, {d} wrong table entries, weights within {e:.2} relative, counters {s}", .{
        case.name, rows, slots, ties_at_cut, wrong_experts, wrong_tables, worst_weight, if (counters_reset) "reset" else "LEFT SET",
    });
}

/// How many experts outside the pick score exactly as one inside it (the same gate row and
/// correction), so that the lower-index rule decided.
fn tiesAtCut(gate: []const f32, correction: []const f32, experts: usize, picked: []const u16) usize {
    var count: usize = 0;
    outer: for (0..experts) |e| {
        for (picked) |p| if (p == e) continue :outer;
        for (picked) |p| {
            if (correction[p] == correction[e] and std.mem.eql(f32, gate[p * hidden ..][0..hidden], gate[e * hidden ..][0..hidden])) {
                count += 1;
                continue :outer;
            }
        }
    }
    return count;
}
