//! The GPU model's per-forward buffers, sized once from its limits and weights, and the batch's
//! upload into them each step (tokens, positions, page tables, cos/sin, the prompt path's row tables
//! and attention tiles).
const std = @import("std");
const core = @import("../../core/root.zig");
const cuda = @import("../../cuda/root.zig");
const model_mod = @import("cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const rope = @import("rope.zig");
const Batch = @import("batch.zig").Batch;
const linear_cuda = @import("parts/linear_cuda.zig");
const linear_parts = @import("parts/linear_parts_cuda.zig");
const mlp_cuda = @import("parts/mlp_cuda.zig");
const GpuLinear = linear_cuda.GpuLinear;
const GpuMlp = mlp_cuda.GpuMlp;
const mla_cuda = @import("parts/mla_cuda.zig");
const dsa_cuda = @import("parts/dsa_cuda.zig");
const kda_cuda = @import("parts/kda_cuda.zig");
const shared_side = @import("parts/shared_side_cuda.zig");

/// Every per-forward buffer, for the largest step the limits allow.
pub fn allocateScratch(model: *GpuModel, diag: *Diagnostic) Error!void {
    const c = model.config;
    const l = model.limits;
    const rows = l.rows_max;
    const items = rows * model.slots;
    const f = @sizeOf(f32);
    const intermediate = @max(c.intermediate_size, c.moe_intermediate_size * @max(c.shared_experts, 1));
    model.tokens = try model.alloc(rows * 4, diag);
    model.positions = try model.alloc(rows * 4, diag);
    model.tables = try model.alloc(rows * l.pages_per_sequence * 4, diag);
    model.table_offsets = try model.alloc(rows * 4, diag);
    model.logits_rows = try model.alloc(l.logits_rows_max * 4, diag);
    model.cos_sin = try model.alloc(rows * @max(c.rotary_dim, 2) * f, diag);
    model.hidden = try model.alloc(rows * c.hyper.streams() * c.hidden_size * f, diag);
    model.collapsed = try model.alloc(if (c.hyper.mult > 0) rows * c.hidden_size * f else 4, diag);
    model.maps = try model.alloc(if (c.hyper.mult > 0) rows * c.hyper.mixes() * f else 4, diag);
    model.hyper_raw = try model.alloc(if (c.hyper.mult > 0) rows * (c.hyper.mixes() + 1) * f else 4, diag);
    model.normed = try model.alloc(rows * c.hidden_size * f, diag);
    // GQA's buffers (a float each when the model has no GQA layer; MLA keeps its own).
    const gqa = c.countOf("attention", .gqa) > 0;
    const gqa_rows = if (gqa) rows else 0;
    model.q = try model.alloc(@max(gqa_rows * c.heads * c.head_dim, 1) * f, diag);
    model.k = try model.alloc(@max(2 * gqa_rows * c.kv_heads * c.head_dim, 1) * f, diag);
    model.attention_out = try model.alloc(@max(gqa_rows * c.heads * c.head_dim, 1) * f, diag);
    model.attention_spread_rows = if (core.switches.off("TF_CUDA_ATTENTION_SPREAD")) 0 else @min(rows, model_mod.attention_spread_rows_max);
    const parts = K.Kernels.AttentionParts.floats(if (gqa) model.attention_spread_rows else 0, c.heads, c.head_dim);
    model.attention_parts = .{ .acc = try model.alloc(@max(parts.acc, 1) * f, diag), .ml = try model.alloc(@max(parts.ml, 1) * f, diag) };
    model.prompt_attention = gqa and c.head_dim == K.Kernels.prompt_attention_head_dim and !core.switches.off("TF_CUDA_PROMPT_ATTENTION");
    model.attention_tiles = try model.alloc((1 + 2 * rows) * 4, diag);
    model.attention_skip = try model.alloc(rows * 4, diag);
    model.step_tiles = 0;
    model.step_rest = true;
    model.projected = try model.alloc(rows * c.hidden_size * f, diag);
    model.ffn_out = try model.alloc(rows * c.hidden_size * f, diag);
    // Gate outputs of all items, then their up outputs (one launch writes both).
    model.gate = try model.alloc(2 * items * intermediate * f, diag);
    model.items_out = try model.alloc(items * c.hidden_size * f, diag);
    model.shared_out = try model.alloc(rows * c.hidden_size * f, diag);
    const gemv = try allocateGemvScratch(model, linearScratchNeeded(model), diag);
    model.acc, model.counters, model.grouping = .{ gemv.acc, gemv.counters, gemv.grouping };
    model.pair_layers = try model.alloc(2 * items * 4, diag);
    model.pair_rows = try model.alloc(2 * items * 4, diag);
    try allocatePromptScratch(model, diag);
    model.route_experts = try model.alloc(items * 4, diag);
    model.route_weights = try model.alloc(items * f, diag);
    model.route_scratch = try model.alloc(rows * 2 * c.routed_experts * f, diag);
    model.logits = try model.alloc(l.logits_rows_max * c.vocab_size * f, diag);
    model.summaries = try model.alloc(l.logits_rows_max * (1 + K.Kernels.summary_slices) * @sizeOf(core.LogitsSummary), diag);
    model.sample_jobs = try model.alloc(l.logits_rows_max * @sizeOf(cuda.sampling.Job), diag);
    model.sample_choices = try model.alloc(l.logits_rows_max * @sizeOf(cuda.sampling.Choice), diag);
    model.sample_scratch = try model.alloc(cuda.sampling.scratchBytes(l.logits_rows_max, c.vocab_size), diag);
    try model.gpu.zero(model.sample_scratch, cuda.sampling.scratchBytes(l.logits_rows_max, c.vocab_size), diag);
    const cache_values = l.pages * c.countOf("attention", .gqa) * c.kv_heads * l.page_tokens * c.head_dim;
    const stored = l.kv_dtype.bytes();
    model.cache_k = try model.alloc(@max(cache_values, 1) * stored, diag);
    model.cache_v = try model.alloc(@max(cache_values, 1) * stored, diag);
    const exponents = if (l.kv_dtype == .fp8) cache_values / @max(c.head_dim, 1) else 0;
    model.exp_k = if (exponents > 0) try model.alloc(exponents, diag) else 0;
    model.exp_v = if (exponents > 0) try model.alloc(exponents, diag) else 0;
    model.mla = try mla_cuda.allocate(model, diag);
    model.dsa = try dsa_cuda.allocate(model, diag);
    model.kda = try kda_cuda.allocate(model, diag);
    const gpa = model.gpa;
    model.host_tables = try gpa.alloc(u32, rows * l.pages_per_sequence);
    errdefer gpa.free(model.host_tables);
    model.host_offsets = try gpa.alloc(u32, rows);
    errdefer gpa.free(model.host_offsets);
    model.host_cos_sin = try gpa.alloc(f32, rows * @max(c.rotary_dim, 2));
    errdefer gpa.free(model.host_cos_sin);
    model.host_row_tables = try gpa.alloc(i32, row_table_count * rows);
    errdefer gpa.free(model.host_row_tables);
    model.host_attention = try gpa.alloc(i32, 1 + 3 * rows);
    model.side = try shared_side.allocate(model, diag);
}

/// The prompt path's buffers: the row tables a prompt step uploads, the routed experts' layers,
/// and the kernels' scratch for the largest of this model's calls (none when no weight is
/// eligible).
pub fn allocatePromptScratch(model: *GpuModel, diag: *Diagnostic) Error!void {
    const c = model.config;
    const rows = model.limits.rows_max;
    const items = rows * model.slots;
    model.row_tables = try model.alloc(row_table_count * rows * 4, diag);
    model.prompt_layers = try model.alloc(items * 4, diag);
    model.step_prompt = false;
    model.step_decode = true;
    model.prompt_scratch = null;
    var need: P.Need = .{};
    const Note = struct {
        fn linear(n: *P.Need, l_: *const GpuLinear, r: usize) void {
            if (l_.kind == .exl3 and l_.kind.exl3.prompt) n.linear(r, l_.kind.exl3.k_p, l_.kind.exl3.n_p);
        }
        fn mlp(n: *P.Need, m: *const GpuMlp, r: usize) void {
            if (m.prompt) return n.mlp(r, 1, m.gate.kind.exl3.k_p, m.gate.kind.exl3.n_p);
            if (m.pair == 0) {
                linear(n, &m.gate, r);
                linear(n, &m.up, r);
            }
        }
    };
    for (model.blocks) |*block| {
        switch (block.attention) {
            .gqa => |*a| for ([_]*const GpuLinear{ &a.q, &a.k, &a.v, &a.o }) |linear| Note.linear(&need, linear, rows),
            .mla => |*a| for (a.linears()) |linear| if (linear) |l_| Note.linear(&need, l_, rows),
            .kda => |*a| for (a.linears()) |linear| if (linear) |l_| Note.linear(&need, l_, rows),
        }
        switch (block.ffn) {
            .dense => |*mlp| Note.mlp(&need, mlp, rows),
            .moe => |*moe| {
                if (moe.prompt) need.mlp(items, c.routed_experts + 1, moe.gate.k_p, moe.gate.n_p);
                if (moe.shared) |*mlp| Note.mlp(&need, mlp, rows);
            },
        }
    }
    if (need.slots == 0) return;
    const Alloc = struct {
        model: *GpuModel,
        diag: *Diagnostic,
        fn call(a_: @This(), bytes: usize) Error!Ptr {
            return a_.model.alloc(bytes, a_.diag);
        }
    };
    model.prompt_scratch = try need.allocate(Alloc{ .model = model, .diag = diag }, Alloc.call);
}

/// The row tables of a prompt step (i32 each, rows_max apart): the prompt flag per row, the
/// table entry per row for the GEMV (0, or -1 for a prompt row) and for the prompt kernels (the
/// other way round), and the GEMV's entries for a pair table (first rows, then second rows).
const row_table_count = 5;
pub fn rowTable(model: *const GpuModel, comptime which: enum { flag, gemv, prompt, pair }) Ptr {
    return model.row_tables + @backingInt(which) * model.limits.rows_max * 4;
}

/// Partial sums, counters, items and groups the GEMV launches of some linears need (`add` and the
/// helpers below take the largest over their calls).
pub const LinearScratch = struct {
    partials: usize = 1,
    counters: usize = 1,
    items: usize = 1,
    groups: usize = 1,

    pub fn add(n: *LinearScratch, k_p: usize, n_p: usize, items: usize, layers: usize) void {
        n.partials = @max(n.partials, K.splitsMax(k_p, n_p) * items * n_p);
        n.counters = @max(n.counters, K.countersFor(@max(items, K.groupsMax(items, layers)), n_p));
        n.items = @max(n.items, items);
        n.groups = @max(n.groups, K.groupsMax(items, layers));
    }

    pub fn linear(n: *LinearScratch, l_: *const GpuLinear, items: usize) void {
        switch (l_.kind) {
            .exl3 => |e| n.add(e.k_p, e.n_p, items, 1),
            .dense => {},
        }
    }

    pub fn parts(n: *LinearScratch, p: ?linear_parts.Parts, rows: usize) void {
        const s = (p orelse return).scratch(rows);
        n.partials = @max(n.partials, s.partials);
        n.counters = @max(n.counters, s.counters);
    }

    pub fn mlp(n: *LinearScratch, m: *const GpuMlp, rows: usize) void {
        n.linear(&m.gate, 2 * rows);
        if (m.gate.kind == .exl3) n.add(m.gate.kind.exl3.k_p, m.gate.kind.exl3.n_p, 2 * rows, 2);
        n.linear(&m.down, rows);
    }
};

/// The GEMV launches' scratch: partial sums, completion counters (zeroed: each launch leaves them
/// so) and the grouped path's buffers.
pub const GemvScratch = struct { acc: Ptr, counters: Ptr, grouping: K.Grouping };

pub fn allocateGemvScratch(model: *GpuModel, need: LinearScratch, diag: *Diagnostic) Error!GemvScratch {
    const scratch: GemvScratch = .{
        .acc = try model.alloc(need.partials * @sizeOf(f32), diag),
        .counters = try model.alloc(need.counters * 4, diag),
        .grouping = .{
            .ranks = try model.alloc(need.items * 4, diag),
            .sorted = try model.alloc(need.items * 4, diag),
            .first = try model.alloc(need.groups * 4, diag),
            .count = try model.alloc(need.groups * 4, diag),
            .layer = try model.alloc(need.groups * 4, diag),
            .total = try model.alloc(4, diag),
        },
    };
    try model.gpu.zero(scratch.counters, need.counters * 4, diag);
    return scratch;
}

/// What the largest tf_exl3_item_linear call needs: splits x items x n_p partial sums and a
/// completion counter per (item, 128 columns). Gate/up pairs run twice the items.
pub fn linearScratchNeeded(model: *const GpuModel) LinearScratch {
    const c = model.config;
    const l = model.limits;
    var need: LinearScratch = .{};
    need.linear(&model.lm_head, l.logits_rows_max);
    need.counters = @max(need.counters, l.rows_max); // the router's, a counter per row
    need.partials = @max(need.partials, model.dense_partials);
    for (model.blocks) |*block| {
        switch (block.attention) {
            .gqa => |*a| {
                for ([_]*const GpuLinear{ &a.q, &a.k, &a.v, &a.o }) |linear| need.linear(linear, l.rows_max);
                if (a.kv_pair != 0) need.add(a.k.kind.exl3.k_p, a.k.kind.exl3.n_p, 2 * l.rows_max, 2);
                need.parts(a.qkv, l.rows_max);
            },
            .mla => |*a| {
                for (a.linears()) |linear| if (linear) |l_| need.linear(l_, l.rows_max);
                need.parts(a.q_kv_a, l.rows_max);
                need.parts(a.q_b_wq_b, l.rows_max);
            },
            .kda => |*a| for (a.linears()) |linear| if (linear) |l_| need.linear(l_, l.rows_max),
        }
        switch (block.ffn) {
            .dense => |*mlp| need.mlp(mlp, l.rows_max),
            .moe => |*moe| {
                const items = l.rows_max * model.slots;
                need.add(moe.gate.k_p, moe.gate.n_p, 2 * items, 2 * (c.routed_experts + 1));
                need.add(moe.down.k_p, moe.down.n_p, items, c.routed_experts + 1);
                if (moe.shared) |*mlp| need.mlp(mlp, l.rows_max);
            },
        }
    }
    return need;
}

/// The batch to the device: tokens, positions, page tables, cos/sin, logits rows, and on a prompt
/// step the row tables that split prompt rows from generated rows.
pub fn uploadBatch(model: *GpuModel, batch: Batch, diag: *Diagnostic) Error!void {
    const c = model.config;
    const rows = batch.rows();
    var at: usize = 0;
    model.step_positions = 0;
    for (batch.page_tables, 0..) |table, r| {
        model.step_positions += batch.positions[r] + 1;
        // A sequence's rows (one slice) share one copy of its table: the MLA attention's packed
        // blocks take rows of one offset as one sequence's.
        const previous = if (r > 0) batch.page_tables[r - 1] else &[_]u32{};
        if (r > 0 and table.ptr == previous.ptr and table.len == previous.len) {
            model.host_offsets[r] = model.host_offsets[r - 1];
        } else {
            model.host_offsets[r] = @intCast(at);
            @memcpy(model.host_tables[at..][0..table.len], table);
            at += table.len;
        }
        rope.cosSin(c.rope, batch.positions[r], model.host_cos_sin[r * c.rotary_dim ..][0..c.rotary_dim]);
    }
    try model.gpu.upload(model.tokens, std.mem.sliceAsBytes(batch.tokens), diag);
    try model.gpu.upload(model.positions, std.mem.sliceAsBytes(batch.positions), diag);
    try model.gpu.upload(model.tables, std.mem.sliceAsBytes(model.host_tables[0..@max(at, 1)]), diag);
    try model.gpu.upload(model.table_offsets, std.mem.sliceAsBytes(model.host_offsets[0..rows]), diag);
    if (c.rotary_dim > 0) try model.gpu.upload(model.cos_sin, std.mem.sliceAsBytes(model.host_cos_sin[0 .. rows * c.rotary_dim]), diag);
    if (batch.logits_rows.len > 0) try model.gpu.upload(model.logits_rows, std.mem.sliceAsBytes(batch.logits_rows), diag);
    try uploadAttentionTiles(model, batch, diag);
    try kda_cuda.uploadRuns(model, batch, diag);
    model.step_prompt = false;
    model.step_decode = true;
    if (model.prompt_scratch == null) return;
    model.step_decode = false;
    const rows_max = model.limits.rows_max;
    const t = model.host_row_tables;
    for (0..rows) |r| {
        const prompt = r < batch.prompt.len and batch.prompt[r];
        t[r] = @intFromBool(prompt);
        t[rows_max + r] = if (prompt) -1 else 0;
        t[2 * rows_max + r] = if (prompt) 0 else -1;
        t[3 * rows_max + r] = if (prompt) -1 else 0;
        t[3 * rows_max + rows + r] = if (prompt) -1 else 1;
        model.step_prompt = model.step_prompt or prompt;
        model.step_decode = model.step_decode or !prompt;
        model.prompt_rows += @intFromBool(prompt);
    }
    if (model.step_prompt) try model.gpu.upload(model.row_tables, std.mem.sliceAsBytes(t), diag);
}

/// Prompt rows in tiles for tf_attention_prompt (a tile: up to 16 consecutive rows of one
/// sequence, told by its first page, at consecutive positions), the others left to tf_attention.
pub fn uploadAttentionTiles(model: *GpuModel, batch: Batch, diag: *Diagnostic) Error!void {
    const rows = batch.rows();
    model.step_tiles = 0;
    model.step_rest = true;
    if (!model.prompt_attention or batch.prompt.len == 0) return;
    const rows_max = model.limits.rows_max;
    var tiles = K.Kernels.AttentionTiles.init(model.host_attention[0 .. 1 + 2 * rows_max]);
    const skip = model.host_attention[1 + 2 * rows_max ..][0..rows];
    model.step_rest = false;
    for (skip, 0..) |*s, r| {
        const prompt = batch.prompt[r];
        if (prompt) tiles.add(r, batch.positions[r], batch.page_tables[r][0]);
        s.* = @intFromBool(prompt);
        model.step_rest = model.step_rest or !prompt;
    }
    model.step_tiles = tiles.count;
    if (tiles.count == 0) return;
    try model.gpu.upload(model.attention_tiles, std.mem.sliceAsBytes(tiles.table[0 .. 1 + 2 * tiles.count]), diag);
    if (model.step_rest) try model.gpu.upload(model.attention_skip, std.mem.sliceAsBytes(skip), diag);
}
