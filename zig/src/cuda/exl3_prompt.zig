//! The host half of zig/kernels/cuda/exl3_experts.cu: the fused prompt path of EXL3 linears over
//! many rows on tensor cores. `eligible` decides per layer (a GLM MoE layer's experts, or one MLP)
//! whether the kernels can take it; `runMlp` and `runLinear` launch them. Layers they cannot take
//! (a half-integer or > 4-bit rate, a shape off the 128 grid, gate and up of different rates) keep
//! the grouped GEMV path, and so do generated rows always: the engine sends prompt rows here and
//! decode rows to the GEMV, so a row's numbers depend on what it is, never on its batch.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const glm_kernels = @import("glm_kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const switches = @import("../core/switches.zig");
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{
    "tf_exl3_prompt_rotate",  "tf_exl3_prompt_gu",       "tf_exl3_prompt_gu3",      "tf_exl3_prompt_gu2",
    "tf_exl3_prompt_down",    "tf_exl3_prompt_down3",    "tf_exl3_prompt_down2",    "tf_exl3_prompt_narrow",
    "tf_exl3_prompt_narrow3", "tf_exl3_prompt_narrow2",  "tf_exl3_prompt_deep",     "tf_exl3_prompt_deep3",
    "tf_exl3_prompt_deep2",   "tf_exl3_prompt_deep_sum", "tf_exl3_prompt_gu_32",    "tf_exl3_prompt_gu3_32",
    "tf_exl3_prompt_gu2_32",  "tf_exl3_prompt_down_32",  "tf_exl3_prompt_down3_32", "tf_exl3_prompt_down2_32",
    "tf_exl3_prompt_deepw",   "tf_exl3_prompt_deep3w",   "tf_exl3_prompt_deep2w",
});

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.exl3_experts, "exl3_experts", diag);
}

/// Items per group (kPromptRows in exl3_prompt.cuh): one decoded tile serves up to this many.
pub const group_rows = 64;

/// How an MLP's prompt items run (both give the same bits: every output the same chain in the same
/// order, whatever its group's size): `full`, groups of up to 64 items on the kernels with 64 rows
/// of accumulators; `slim`, groups of up to 32 on the `_32` kernels, whose half the accumulators
/// fit three blocks per SM where the full ones fit two (on sm_90a two, on the warpgroup products).
/// The routed experts of a short chunk hold few items each (GLM-4.5-Air at 256 rows: ~18 per
/// entry), so the full kernels' decoded tiles serve a quarter of their rows and wait on the decode
/// with 4 warps a scheduler; an entry of more than 32 items costs the slim kernels a second decode
/// of its tiles. TF_CUDA_PROMPT_EXPERTS=full|slim forces one (tests, benchmarks).
pub const MlpForm = enum {
    full,
    slim,

    pub fn rows(form: MlpForm) usize {
        return if (form == .full) group_rows else 32;
    }

    /// Slim while the items average at most 24 an entry (so that few entries take two groups).
    pub fn choose(items: usize, layers: usize) MlpForm {
        return if (items <= 24 * layers) .slim else .full;
    }

    pub fn forced() ?MlpForm {
        const text = std.c.getenv("TF_CUDA_PROMPT_EXPERTS") orelse return null;
        return std.meta.stringToEnum(MlpForm, std.mem.span(text));
    }
};

/// How a plain linear's prompt rows run; both give the same bits (every output the same chain in
/// the same order), so the choice may follow the rows: `wide`, down's kernel, a block per 256
/// columns and 64 rows (two tile columns a warp); `narrow`, a block per 128 columns (one a warp:
/// twice the blocks, each with half the products per decoded input). The H200's tables
/// (docs/measurements.md, tf-bench --prompt-linears): narrow 1.15-1.2x faster where wide has at
/// most 64 blocks (1.3-1.4x in the first); 1.09-1.14x slower at 80 and 96 (GLM-4.7-Flash's q_b
/// at 256 rows, GLM-5.3-Flash's qkv at 64; 2026-12-07); up to 1.4x slower from 192. 128-row
/// groups (each tile decoded once for twice the rows) were slower at every shape, and so were
/// groups of 32 on down's slim kernel (three blocks an SM: GLM-4.5-Air's q_proj at 256 rows
/// 239.7 us against wide's 229.4), so these kernels are bound by the products, not the decode.
/// TF_CUDA_PROMPT_LINEAR=wide|narrow forces one (tests, benchmarks).
pub const LinearForm = enum {
    wide,
    narrow,

    fn columns(form: LinearForm) usize {
        return if (form == .wide) 256 else 128;
    }

    /// Blocks of a launch over `items` rows of a weight of n_p columns.
    pub fn blocks(form: LinearForm, n_p: usize, items: usize) usize {
        return (std.math.divCeil(usize, n_p, form.columns()) catch unreachable) * (std.math.divCeil(usize, items, group_rows) catch unreachable);
    }

    /// The form for `items` rows of a weight of n_p columns split `splits` ways over k on
    /// `multiprocessors` SMs: narrow while wide's blocks would leave most SMs idle. Unsplit, that
    /// is blocks for at most half the SMs (the table above); split, fewer than two an SM, where the
    /// deep launch was measured narrow (GLM-4.5-Air's k_proj, 64 to 512 blocks) and its weights'
    /// few columns take the splits to fill the GPU.
    pub fn choose(n_p: usize, items: usize, splits: usize, multiprocessors: usize) LinearForm {
        const wide_blocks = LinearForm.wide.blocks(n_p, items);
        if (splits == 1) return if (2 * wide_blocks <= multiprocessors) .narrow else .wide;
        return if (wide_blocks * splits < 2 * multiprocessors) .narrow else .wide;
    }

    /// TF_CUDA_PROMPT_LINEAR's form, or null (unset: the engine chooses).
    pub fn forced() ?LinearForm {
        const text = std.c.getenv("TF_CUDA_PROMPT_LINEAR") orelse return null;
        return std.meta.stringToEnum(LinearForm, std.mem.span(text));
    }
};

/// The k splits of a plain linear's prompt rows (tf_exl3_prompt_deep, _deepw): enough that the
/// weight's 128-column blocks times the splits reach 64 per group of rows, so that a 256-row chunk
/// (four groups) fills two blocks on each of an H200's SMs; each split at least 4 slabs (128 input
/// channels), at most 8; 1 (the forms above) for weights of 64 or more column blocks. From the
/// shape alone, so a row's outputs depend on its shape, never on its chunk. The profiles that asked
/// for it (docs/measurements.md): GLM-4.5-Air's k_proj and v_proj, 8 column blocks, 114 us each for
/// a 256-row chunk with a quarter of the SMs busy (2026-12-04; split 4 ways since 86ad031); its
/// o_proj, 32 column blocks, 340 us with one block an SM. The engine can turn the splits off
/// (deepAllowed).
pub fn deepSplits(k_p: usize, n_p: usize) usize {
    const deep_blocks = 64;
    const blocks = n_p / 128;
    if (blocks >= deep_blocks) return 1;
    return @max(1, @min(deep_blocks / blocks, 8, k_p / (4 * 32)));
}

/// TF_CUDA_PROMPT_DEEP=0 turns the splits off (a comparison switch: it changes the bits of those
/// weights' prompt rows); read once, when a model is made (Launcher.deep).
pub fn deepAllowed() bool {
    return !switches.off("TF_CUDA_PROMPT_DEEP");
}

/// One EXL3 weight as the kernels see it.
pub const Shape = struct {
    k_p: usize,
    n_p: usize,
    bits2: u8,
    codebook: u8,

    fn entryBytes(shape: Shape) u64 {
        return glm_kernels.exl3EntryBytes(shape.k_p, shape.n_p, shape.bits2);
    }
};

/// Why `shape` cannot take the prompt kernels, or null when it can.
pub fn ineligible(shape: Shape) ?[]const u8 {
    if (shape.bits2 % 2 != 0 or shape.bits2 < 4 or shape.bits2 > 8) return "the prompt kernels take 2, 3 and 4 bits per weight";
    if (shape.k_p % 128 != 0 or shape.n_p % 128 != 0) return "the prompt kernels take shapes on the 128 grid";
    if (shape.codebook > 2) return "unknown codebook";
    return null;
}

/// Whether an MLP (gate, up, down; `width` = gate's out_features) can run as one fused prompt MLP:
/// each weight eligible, gate and up alike, and down reading exactly gate's padded columns.
pub fn eligibleMlp(gate: Shape, up: Shape, down: Shape, width: usize) bool {
    if (ineligible(gate) != null or ineligible(down) != null) return false;
    if (!std.meta.eql(gate, up)) return false;
    return down.k_p == gate.n_p and width <= gate.n_p;
}

/// Device scratch for the calls a model makes: the grouping, the rotated inputs (one or two
/// operands, fp16 high and low planes), down's rotated inputs and the deep launches' partials.
pub const Scratch = struct {
    grouping: glm_kernels.Grouping,
    rotated: Ptr,
    down_in: Ptr,
    partials: Ptr,
    slots: usize,
};

/// The largest scratch of the calls noted, in bytes.
pub const Need = struct {
    slots: usize = 0,
    groups: usize = 0,
    rotated: usize = 0,
    down_in: usize = 0,
    partials: usize = 0,

    /// An MLP over `items` items of `layers` table entries, gate k_p -> n_p.
    pub fn mlp(n: *Need, items: usize, layers: usize, k_p: usize, n_p: usize) void {
        n.common(items, layers);
        n.rotated = @max(n.rotated, 2 * 2 * items * k_p * 2);
        n.down_in = @max(n.down_in, 2 * items * n_p * 2);
    }

    /// A plain linear over `items` rows.
    pub fn linear(n: *Need, items: usize, k_p: usize, n_p: usize) void {
        n.common(items, 1);
        n.rotated = @max(n.rotated, 2 * items * k_p * 2);
        const splits = deepSplits(k_p, n_p);
        if (splits > 1) n.partials = @max(n.partials, splits * items * n_p * 4);
    }

    fn common(n: *Need, items: usize, layers: usize) void {
        n.slots = @max(n.slots, items);
        n.groups = @max(n.groups, groupsMax(items, layers, MlpForm.slim.rows()));
    }

    /// Allocates with `alloc(context, bytes)`.
    pub fn allocate(n: Need, context: anytype, comptime alloc: anytype) !Scratch {
        return .{
            .grouping = .{
                .ranks = try alloc(context, n.slots * 4),
                .sorted = try alloc(context, n.slots * 4),
                .first = try alloc(context, n.groups * 4),
                .count = try alloc(context, n.groups * 4),
                .layer = try alloc(context, n.groups * 4),
                .total = try alloc(context, 4),
            },
            .rotated = try alloc(context, @max(n.rotated, 16)),
            .down_in = try alloc(context, @max(n.down_in, 16)),
            .partials = try alloc(context, @max(n.partials, 16)),
            .slots = n.slots,
        };
    }
};

/// The most groups of up to `rows` items that `slots` items of `layers` entries make.
pub fn groupsMax(slots: usize, layers: usize, rows: usize) usize {
    return (std.math.divCeil(usize, slots, rows) catch unreachable) + layers;
}

/// An MLP over items: item i reads row i / items_per_row of x, and uses table entry
/// layer_of_item[i] (0: entry 0; -1: not this path's item). `gate_up` holds gate entries, then up
/// entries `up_offset` later; `down` one entry per layer. y gets one row per item.
pub const Mlp = struct {
    x: Ptr,
    items: usize,
    items_per_row: usize,
    layer_of_item: Ptr,
    layers: usize,
    gate_up: Ptr,
    up_offset: usize,
    down: Ptr,
    hidden: usize, // x's width = down's out_features
    width: usize, // gate's out_features
    gate: Shape,
    down_shape: Shape,
    y: Ptr,
};

pub const Launcher = struct {
    glm: glm_kernels.Kernels,
    module: *const Module,
    /// A plain linear's form for every call (LinearForm.forced()), or null: chosen per call.
    linear_form: ?LinearForm = null,
    /// Whether weights that deepSplits splits take the deep launch (false: tf-bench's forms, or
    /// TF_CUDA_PROMPT_DEEP=0 through deepAllowed).
    deep: bool = true,
    /// An MLP's form for every call (MlpForm.forced()), or null: chosen per call.
    mlp_form: ?MlpForm = null,

    fn run(l: Launcher, comptime name: []const u8, grid: [3]u32, args: anytype) Error!void {
        var ptrs: [args.len]*anyopaque = undefined;
        var values = args;
        inline for (0..values.len) |i| ptrs[i] = @ptrCast(&values[i]);
        try gpu_mod.launch(l.glm.gpu, l.module.function(name), .{ .grid = grid, .block = .{ 256, 1, 1 } }, ptrs, "launch " ++ name, l.glm.diag);
    }

    fn int(v: usize) c_int {
        return @intCast(v);
    }

    /// Launches `base` ++ the rate's digit (none at 4 bits) ++ `suffix`: the entries come in threes,
    /// one per trellis rate K (exl3_experts.cu).
    fn runRate(l: Launcher, comptime base: []const u8, comptime suffix: []const u8, bits2: u8, grid: [3]u32, args: anytype) Error!void {
        switch (bits2) {
            8 => try l.run(base ++ suffix, grid, args),
            6 => try l.run(base ++ "3" ++ suffix, grid, args),
            else => try l.run(base ++ "2" ++ suffix, grid, args),
        }
    }

    /// An MLP kernel's entry for `form`: the slim ones end in _32.
    fn runForm(l: Launcher, comptime base: []const u8, form: MlpForm, bits2: u8, grid: [3]u32, args: anytype) Error!void {
        switch (form) {
            .full => try l.runRate(base, "", bits2, grid, args),
            .slim => try l.runRate(base, "_32", bits2, grid, args),
        }
    }

    /// Sort, rotate (gate's and up's suh), gate/up with SwiGLU and down's input rotation, down.
    pub fn runMlp(l: Launcher, s: Scratch, c: Mlp) Error!void {
        std.debug.assert(c.items <= s.slots and eligibleMlp(c.gate, c.gate, c.down_shape, c.width));
        const g = s.grouping;
        const form = l.mlp_form orelse MlpForm.choose(c.items, c.layers);
        try l.glm.groupItems(c.layer_of_item, c.items, c.items, c.layers, form.rows(), g);
        const groups: u32 = @intCast(groupsMax(c.items, c.layers, form.rows()));
        try l.rotate(s, c.x, 0, c.items_per_row, c.gate_up, 2, c.up_offset, c.layer_of_item, c.items, c.hidden, c.gate.k_p);
        const gu = .{
            c.gate_up, int(c.up_offset), c.down,       g.sorted,        g.first,         g.count,      g.layer,                     g.total,
            s.rotated, s.down_in,        int(c.items), int(c.gate.k_p), int(c.gate.n_p), int(c.width), @as(c_int, c.gate.codebook),
        };
        const gu_grid: [3]u32 = .{ @intCast(c.gate.n_p / 128), groups, 1 };
        // At most every entry the items name, gate's and up's (as the GEMV states it).
        const entries = @min(c.items, c.layers);
        l.glm.gpu.noteReads(entries * 2 * c.gate.entryBytes());
        try l.runForm("tf_exl3_prompt_gu", form, c.gate.bits2, gu_grid, gu);
        l.glm.gpu.noteReads(entries * c.down_shape.entryBytes());
        try l.down(s, s.down_in, c.down, c.down_shape, c.hidden, c.y, c.items, groups, form);
    }

    /// A plain linear over the items: sort, rotate, then down's kernel or the narrow one (with
    /// bias); or, for a weight deepSplits splits, the deep launch in either form and its sum.
    pub fn runLinear(l: Launcher, s: Scratch, x: Ptr, items: usize, items_per_row: usize, layer_of_item: Ptr, table: Ptr, shape: Shape, in_features: usize, out_features: usize, y: Ptr) Error!void {
        std.debug.assert(items <= s.slots and ineligible(shape) == null);
        const splits = if (l.deep) deepSplits(shape.k_p, shape.n_p) else 1;
        const form = l.linear_form orelse LinearForm.choose(shape.n_p, items, splits, l.glm.gpu.multiprocessors);
        const g = s.grouping;
        try l.glm.groupItems(layer_of_item, items, items, 1, group_rows, g);
        try l.rotate(s, x, 0, items_per_row, table, 1, 0, layer_of_item, items, in_features, shape.k_p);
        l.glm.gpu.noteReads(shape.entryBytes());
        const groups: u32 = @intCast(groupsMax(items, 1, group_rows));
        if (splits == 1 and form == .wide) return l.down(s, s.rotated, table, shape, out_features, y, items, groups, .full);
        const target = if (splits > 1) s.partials else y;
        const args = .{
            table,      g.sorted,       g.first,        g.count,           g.layer,                    g.total, s.rotated, target,
            int(items), int(shape.k_p), int(shape.n_p), int(out_features), @as(c_int, shape.codebook),
        };
        const columns: u32 = @intCast(std.math.divCeil(usize, shape.n_p, form.columns()) catch unreachable);
        const grid: [3]u32 = .{ columns, groups, @intCast(splits) };
        if (splits == 1) return l.runRate("tf_exl3_prompt_narrow", "", shape.bits2, grid, args);
        switch (form) {
            .narrow => try l.runRate("tf_exl3_prompt_deep", "", shape.bits2, grid, args),
            .wide => try l.runRate("tf_exl3_prompt_deep", "w", shape.bits2, grid, args),
        }
        const sum = .{ table, g.sorted, g.first, g.count, g.layer, g.total, s.partials, y, int(items), int(out_features), int(splits) };
        try l.run("tf_exl3_prompt_deep_sum", .{ @intCast(std.math.divCeil(usize, out_features, 256) catch unreachable), @intCast(items), 1 }, sum);
    }

    fn rotate(l: Launcher, s: Scratch, x: Ptr, up: Ptr, items_per_row: usize, table: Ptr, ops: usize, op_stride: usize, layer_of_item: Ptr, items: usize, in_features: usize, k_p: usize) Error!void {
        const g = s.grouping;
        const args = .{
            x,       up,      int(items_per_row), table,   int(ops),  int(op_stride), g.sorted,         layer_of_item,
            g.first, g.count, g.layer,            g.total, s.rotated, int(items),     int(in_features), int(k_p),
        };
        try l.run("tf_exl3_prompt_rotate", .{ @intCast(std.math.divCeil(usize, k_p / 128, 8) catch unreachable), @intCast(items), 1 }, args);
    }

    fn down(l: Launcher, s: Scratch, input: Ptr, table: Ptr, shape: Shape, out_features: usize, y: Ptr, items: usize, groups: u32, form: MlpForm) Error!void {
        const g = s.grouping;
        const args = .{
            table,      g.sorted,       g.first,        g.count,           g.layer,                    g.total, input, y,
            int(items), int(shape.k_p), int(shape.n_p), int(out_features), @as(c_int, shape.codebook),
        };
        const grid: [3]u32 = .{ @intCast(std.math.divCeil(usize, shape.n_p, 256) catch unreachable), groups, 1 };
        try l.runForm("tf_exl3_prompt_down", form, shape.bits2, grid, args);
    }
};

test "an MLP's form: slim while its entries average at most 24 items" {
    const t = std.testing;
    try t.expectEqual(MlpForm.slim, MlpForm.choose(256 * 9, 129)); // GLM-4.5-Air experts, 256 rows
    try t.expectEqual(MlpForm.full, MlpForm.choose(512 * 9, 129));
    try t.expectEqual(MlpForm.full, MlpForm.choose(256, 1)); // a dense MLP
    try t.expectEqual(MlpForm.slim, MlpForm.choose(20, 1));
    try t.expectEqual(@as(usize, 4 + 129), groupsMax(256, 129, MlpForm.full.rows()));
    try t.expectEqual(@as(usize, 8 + 129), groupsMax(256, 129, MlpForm.slim.rows()));
}

test "a plain linear's form: narrow while wide's blocks leave SMs idle" {
    const t = std.testing;
    try t.expectEqual(@as(usize, 64), LinearForm.wide.blocks(4096, 256));
    try t.expectEqual(@as(usize, 128), LinearForm.narrow.blocks(4096, 256));
    try t.expectEqual(@as(usize, 20), LinearForm.wide.blocks(5120, 1)); // a partial group is a block
    try t.expectEqual(LinearForm.narrow, LinearForm.choose(4096, 256, 1, 132)); // GLM-4.5-Air o_proj unsplit
    try t.expectEqual(LinearForm.wide, LinearForm.choose(4096, 1024, 1, 132));
    try t.expectEqual(LinearForm.wide, LinearForm.choose(12288, 256, 1, 132)); // q_proj: 192 blocks
    try t.expectEqual(LinearForm.narrow, LinearForm.choose(1024, 1024, 1, 132)); // k_proj unsplit: 64 blocks
    try t.expectEqual(LinearForm.narrow, LinearForm.choose(12288, 64, 1, 132)); // q_proj at 64 rows: 48
    try t.expectEqual(LinearForm.wide, LinearForm.choose(5120, 256, 1, 132)); // GLM-4.7-Flash q_b: 80
    try t.expectEqual(LinearForm.wide, LinearForm.choose(24576, 64, 1, 132)); // GLM-5.3-Flash qkv: 96
    // Split: wide once its blocks fill two an SM.
    try t.expectEqual(LinearForm.narrow, LinearForm.choose(4096, 256, 2, 132)); // o_proj: 128 wide blocks
    try t.expectEqual(LinearForm.wide, LinearForm.choose(4096, 1024, 2, 132)); // 512
    try t.expectEqual(LinearForm.narrow, LinearForm.choose(1024, 256, 8, 132)); // k_proj: 128
    try t.expectEqual(LinearForm.wide, LinearForm.choose(1024, 1024, 8, 132)); // 512
}

test "deep splits: a narrow weight's column blocks times its splits reach 64, from the shape alone" {
    const t = std.testing;
    try t.expectEqual(@as(usize, 8), deepSplits(4096, 1024)); // GLM-4.5-Air k_proj, v_proj
    try t.expectEqual(@as(usize, 2), deepSplits(12288, 4096)); // its o_proj: 32 blocks
    try t.expectEqual(@as(usize, 1), deepSplits(4096, 12288)); // its q_proj: 96
    try t.expectEqual(@as(usize, 1), deepSplits(768, 5120)); // GLM-4.7-Flash q_b: 40
    try t.expectEqual(@as(usize, 4), deepSplits(5120, 2048)); // its o_proj: 16
    try t.expectEqual(@as(usize, 8), deepSplits(2048, 256)); // at most 8
    try t.expectEqual(@as(usize, 2), deepSplits(256, 128)); // each split 4 slabs at least
    try t.expectEqual(@as(usize, 1), deepSplits(128, 128));
    try t.expectEqual(@as(usize, 8), deepSplits(2048, 640)); // GLM-4.7-Flash kv_a (576 padded)
}

test "which weights the prompt kernels take" {
    const t = std.testing;
    const air3: Shape = .{ .k_p = 4096, .n_p = 1408, .bits2 = 6, .codebook = 2 };
    try t.expect(ineligible(air3) == null);
    try t.expect(ineligible(.{ .k_p = 4096, .n_p = 1408, .bits2 = 8, .codebook = 0 }) == null);
    try t.expect(ineligible(.{ .k_p = 4096, .n_p = 1408, .bits2 = 5, .codebook = 2 }) != null); // 2.5 bits
    try t.expect(ineligible(.{ .k_p = 4096, .n_p = 1408, .bits2 = 10, .codebook = 2 }) != null); // 5 bits
    try t.expect(ineligible(.{ .k_p = 4096, .n_p = 1424, .bits2 = 6, .codebook = 2 }) != null);
    const down: Shape = .{ .k_p = 1408, .n_p = 4096, .bits2 = 8, .codebook = 2 };
    try t.expect(eligibleMlp(air3, air3, down, 1408));
    try t.expect(!eligibleMlp(air3, .{ .k_p = 4096, .n_p = 1408, .bits2 = 8, .codebook = 2 }, down, 1408));
    try t.expect(!eligibleMlp(air3, air3, .{ .k_p = 1536, .n_p = 4096, .bits2 = 8, .codebook = 2 }, 1408));
}
