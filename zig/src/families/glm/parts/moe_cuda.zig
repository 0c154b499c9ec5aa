//! The GPU side of the MoE block (parts/moe.zig): tf_route picks every row's experts, then one
//! launch runs gate and up for every (row, selected expert) and one runs down, each item reading
//! its expert's trellis in place through a table (the grouped path); the shared expert rides in
//! those launches as the last slot of each row when it matches the experts, else runs as an MLP.
//! A prompt step's prompt rows take the prompt kernels, experts sorted by row groups.
const std = @import("std");
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Mlp = @import("mlp.zig").Mlp;
const Moe = @import("moe.zig").Moe;
const Config = @import("../config.zig").Config;
const weights_mod = @import("../weights.zig");
const linear_cuda = @import("linear_cuda.zig");
const mlp_cuda = @import("mlp_cuda.zig");
const shared_side = @import("shared_side_cuda.zig");
const GroupedLinear = linear_cuda.GroupedLinear;
const promptShape = linear_cuda.promptShape;

pub const GpuMoe = struct {
    router: Ptr,
    correction: Ptr,
    gate: GroupedLinear,
    up: GroupedLinear,
    down: GroupedLinear,
    /// The shared expert on its own launches; null when there is none or when it is merged.
    shared: ?mlp_cuda.GpuMlp,
    /// The shared expert rides in the routed launches as entry `routed_experts` of every table,
    /// the last slot of each row with weight 1 (mergedShared).
    merged: bool = false,
    /// The prompt kernels take this layer's experts.
    prompt: bool = false,
    /// With the shared expert merged and the side stream allowed (shared_side_cuda.zig): the
    /// routed experts' gate/up table without it (gate entries 0..E-1, up E..2E-1), and the shared
    /// expert as launches of its own over the merged tables' weights, for the decode steps that
    /// run it on the side stream. Prompt steps keep the merged launches.
    side_gate_up: Ptr = 0,
    side_shared: ?mlp_cuda.GpuMlp = null,

    /// The shared expert's own launches, where it has them (apart, or beside its merged form).
    pub fn sideMlp(moe: *const GpuMoe) ?*const mlp_cuda.GpuMlp {
        if (moe.shared) |*mlp| return mlp;
        if (moe.side_shared) |*mlp| return mlp;
        return null;
    }
};

/// Everything of a MoE layer but its experts' gate/up tables (uploadGateUp, after every layer).
/// The router's one launch holds a row's experts in shared memory (tf_route).
pub fn checkShape(c: *const Config, diag: *Diagnostic) Error!void {
    if (c.routed_experts > K.Kernels.route_experts_max) {
        diag.set("the CUDA router takes up to {d} routed experts; this model has {d}", .{ K.Kernels.route_experts_max, c.routed_experts });
        return error.UnsupportedModel;
    }
}

pub fn uploadApart(model: *GpuModel, moe: *const Moe, diag: *Diagnostic) Error!GpuMoe {
    const merged = mergedShared(moe, model.merge_shared);
    const apart: ?*const Mlp = if (merged == null) if (moe.shared) |*mlp| mlp else null else null;
    var shared: ?mlp_cuda.GpuMlp = if (apart) |mlp| try model.uploadMlp(mlp, diag) else null;
    // One that could merge keeps the merged form's k splits: merged, apart or on the side stream,
    // the same sums (gemv_splits follows a table's entries; the grouped and item paths agree).
    if (shared) |*mlp| if (mergedShared(moe, true) != null) setMergedSplits(mlp, moe.experts.len + 1);
    var shared_down: K.Exl3Layer = undefined;
    const down = try grouped(model, moe.experts, merged, "down", &shared_down, diag);
    return .{
        .router = try model.putF32(moe.router, diag),
        .correction = try model.putF32(moe.correction_bias, diag),
        .gate = undefined,
        .up = undefined,
        .down = down,
        .shared = shared,
        .merged = merged != null,
        // The view's down, completed with its gate and up in uploadGateUp.
        .side_shared = if (merged != null and model.shared_side) .{
            .gate = undefined,
            .up = undefined,
            .down = try viewLinear(model, down, shared_down, diag),
            .pair = 0,
        } else null,
    };
}

/// A shared expert's own launches take the merged table's k splits (`entries` a projection): the
/// same sums as merged, whichever form runs (gemv_splits follows a table's entries; the grouped
/// and item paths agree).
fn setMergedSplits(mlp: *mlp_cuda.GpuMlp, entries: usize) void {
    mlp.gate.kind.exl3.split_entries = 2 * entries;
    mlp.up.kind.exl3.split_entries = 2 * entries;
    mlp.down.kind.exl3.split_entries = entries;
}

/// One entry of a grouped table as a linear of its own (decode rows only), over the same weights.
fn viewLinear(model: *GpuModel, shape: GroupedLinear, entry: K.Exl3Layer, diag: *Diagnostic) Error!linear_cuda.GpuLinear {
    return .{
        .in_features = shape.in_features,
        .out_features = shape.out_features,
        .kind = .{ .exl3 = .{
            .table = try model.put(std.mem.asBytes(&entry), diag),
            .entry = entry,
            .k_p = shape.k_p,
            .n_p = shape.n_p,
            .bits2 = shape.bits2,
            .codebook = shape.codebook,
            .prompt = false,
        } },
    };
}

pub fn uploadGateUp(model: *GpuModel, moe: *const Moe, target: *GpuMoe, diag: *Diagnostic) Error!void {
    var side: SideEntries = undefined;
    const gate_up = try groupedPair(model, moe.experts, if (target.merged) &moe.shared.? else null, if (target.side_shared != null) &side else null, diag);
    target.gate = gate_up[0];
    target.up = gate_up[1];
    if (target.side_shared) |*mlp| {
        target.side_gate_up = side.routed;
        mlp.gate = try viewLinear(model, target.gate, side.gate, diag);
        mlp.up = try viewLinear(model, target.up, side.up, diag);
        mlp.pair = try model.pairTable(&mlp.gate, &mlp.up, diag);
        setMergedSplits(mlp, moe.experts.len + 1);
    }
    target.prompt = model.prompt_enabled and
        P.eligibleMlp(promptShape(target.gate), promptShape(target.up), promptShape(target.down), target.gate.out_features);
}

/// What groupedPair gives the side stream's form of a merged layer: the routed experts' table
/// without the shared expert, and the shared expert's gate and up entries.
const SideEntries = struct { routed: Ptr, gate: K.Exl3Layer, up: K.Exl3Layer };

/// The gate and up projections of all experts in one table: gate entries 0..E-1, up entries
/// E..2E-1, so that one launch runs both for every (row, selected expert) (tf_route writes the
/// items' entries). All must share shape, rate and codebook. With `side` (and `shared`), also
/// the routed experts' table alone and the shared expert's entries, over the same weights.
pub fn groupedPair(model: *GpuModel, experts: []const Mlp, shared: ?*const Mlp, side: ?*SideEntries, diag: *Diagnostic) Error![2]GroupedLinear {
    const first = &experts[0].gate;
    const layer0 = switch (first.kind) {
        .exl3 => |*l| l,
        .dense => {
            diag.set("the CUDA backend runs EXL3 experts only; this checkpoint's experts are unquantized", .{});
            return error.UnsupportedModel;
        },
    };
    const per_half = experts.len + @intFromBool(shared != null);
    const entries = try model.gpa.alloc(K.Exl3Layer, 2 * per_half);
    defer model.gpa.free(entries);
    inline for (.{ "gate", "up" }, 0..) |which, half| {
        if (shared) |mlp| entries[half * per_half + experts.len] = try model.exl3Entry(&@field(mlp, which).kind.exl3, @field(mlp, which).out_features, diag);
        for (experts, entries[half * per_half ..][0..experts.len], 0..) |*expert, *entry, e| {
            const source = &@field(expert, which);
            const layer = switch (source.kind) {
                .exl3 => |*l| l,
                .dense => {
                    diag.set("expert {d} {s}_proj is unquantized: the CUDA backend runs EXL3 experts only", .{ e, which });
                    return error.UnsupportedModel;
                },
            };
            if (layer.rate.bits2 != layer0.rate.bits2 or layer.codebook != layer0.codebook or layer.rows != layer0.rows or
                layer.columns != layer0.columns or source.out_features != first.out_features)
            {
                diag.set("expert {d} {s}_proj differs in rate, codebook or shape from expert 0's gate_proj: the grouped path needs them equal", .{ e, which });
                return error.UnsupportedModel;
            }
            entry.* = try model.exl3Entry(layer, source.out_features, diag);
        }
    }
    const table = try model.put(std.mem.sliceAsBytes(entries), diag);
    if (side) |out| {
        std.debug.assert(shared != null);
        const e = experts.len;
        const routed = try model.gpa.alloc(K.Exl3Layer, 2 * e);
        defer model.gpa.free(routed);
        @memcpy(routed[0..e], entries[0..e]);
        @memcpy(routed[e..], entries[per_half..][0..e]);
        out.* = .{ .routed = try model.put(std.mem.sliceAsBytes(routed), diag), .gate = entries[e], .up = entries[per_half + e] };
    }
    const gate: GroupedLinear = .{
        .table = table,
        .in_features = first.in_features,
        .out_features = first.out_features,
        .k_p = layer0.rows,
        .n_p = layer0.columns,
        .bits2 = layer0.rate.bits2,
        .codebook = @backingInt(layer0.codebook),
    };
    var up = gate;
    up.table = table + per_half * @sizeOf(K.Exl3Layer);
    return .{ gate, up };
}

/// One projection of all experts in one table (the shared expert last when merged: its entry is
/// also written to `shared_entry`).
pub fn grouped(model: *GpuModel, experts: []const Mlp, shared: ?*const Mlp, comptime which: []const u8, shared_entry: *K.Exl3Layer, diag: *Diagnostic) Error!GroupedLinear {
    const first = &@field(experts[0], which);
    const layer0 = switch (first.kind) {
        .exl3 => |*l| l,
        .dense => {
            diag.set("the CUDA backend runs EXL3 experts only; this checkpoint's experts are unquantized", .{});
            return error.UnsupportedModel;
        },
    };
    const entries = try model.gpa.alloc(K.Exl3Layer, experts.len + @intFromBool(shared != null));
    defer model.gpa.free(entries);
    if (shared) |mlp| {
        entries[experts.len] = try model.exl3Entry(&@field(mlp, which).kind.exl3, @field(mlp, which).out_features, diag);
        shared_entry.* = entries[experts.len];
    }
    for (experts, entries[0..experts.len], 0..) |*expert, *entry, e| {
        const source = &@field(expert, which);
        const layer = switch (source.kind) {
            .exl3 => |*l| l,
            .dense => unreachable,
        };
        if (layer.rate.bits2 != layer0.rate.bits2 or layer.codebook != layer0.codebook or layer.rows != layer0.rows or layer.columns != layer0.columns) {
            diag.set("expert {d} {s}_proj differs in rate, codebook or shape from expert 0: the grouped path needs them equal", .{ e, which });
            return error.UnsupportedModel;
        }
        entry.* = try model.exl3Entry(layer, source.out_features, diag);
    }
    return .{
        .table = try model.put(std.mem.sliceAsBytes(entries), diag),
        .in_features = first.in_features,
        .out_features = first.out_features,
        .k_p = layer0.rows,
        .n_p = layer0.columns,
        .bits2 = layer0.rate.bits2,
        .codebook = @backingInt(layer0.codebook),
    };
}

/// model.ffn_out = the MoE block of model.normed.
pub fn runMoe(model: *GpuModel, k: K.Kernels, moe: *const GpuMoe, rows: usize) Error!void {
    const combine = try runExperts(model, k, moe, rows);
    try k.moeCombine(combine.expert_out, combine.weights, combine.shared, model.ffn_out, rows, combine.slots, model.config.hidden_size);
}

/// The MoE block of model.normed up to its combine, whose inputs it returns (the hyper-connected
/// forward mixes the combine straight into its streams).
pub fn runExperts(model: *GpuModel, k: K.Kernels, moe: *const GpuMoe, rows: usize) Error!K.MoeCombine {
    const c = model.config;
    // The shared expert runs on the side stream, beside the router and the routed experts, where
    // the step allows (a merged one then leaves the routed launches).
    const side_mlp = moe.sideMlp();
    const side = side_mlp != null and shared_side.takes(model, rows);
    const merged = moe.merged and !side;
    // Table entries per projection and slots per row: the routed experts, and the shared
    // expert after them when it is merged (the side's gate/up table leaves it out).
    const entries = c.routed_experts + @intFromBool(moe.merged);
    const gate_up_entries = c.routed_experts + @intFromBool(merged);
    const slots = c.experts_per_token + @intFromBool(merged);
    const items = rows * slots;
    const prompt = model.step_prompt and moe.prompt;
    if (side) try shared_side.run(model, k, side_mlp.?, rows);
    try k.route(.{
        .x = model.normed,
        .gate = moe.router,
        .correction = moe.correction,
        .experts_out = model.route_experts,
        .weights_out = model.route_weights,
        .pair_layers = model.pair_layers,
        .pair_rows = model.pair_rows,
        .row_prompt = if (prompt) model.rowTable(.flag) else 0,
        .prompt_layers = if (prompt) model.prompt_layers else 0,
        .scratch = model.route_scratch,
        .counters = model.counters,
        .rows = rows,
        .hidden = c.hidden_size,
        .experts = c.routed_experts,
        .top_k = c.experts_per_token,
        .slots = slots,
        .groups = c.groups,
        .groups_per_token = c.groups_per_token,
        .normalize = c.norm_topk_prob,
        .scaling = c.routed_scaling_factor,
    });
    // Items 0..items-1 are (row, slot) gate problems, items..2·items-1 the same pairs' up
    // problems; each reads its row and its expert's trellis in place through the table.
    const g = moe.gate;
    const width = g.out_features;
    const gate_up_table = if (moe.merged and !merged) moe.side_gate_up else g.table;
    var gate_up = model.exl3Call(g, gate_up_table, g.in_features, width, model.normed, model.gate, 2 * items);
    gate_up.source_rows = model.pair_rows;
    gate_up.layer_of_item = model.pair_layers;
    gate_up.layers = 2 * gate_up_entries;
    const d = moe.down;
    var down = model.exl3Call(d, d.table, d.in_features, d.out_features, model.gate, model.items_out, items);
    down.up = model.gate + items * width * @sizeOf(f32);
    down.layer_of_item = model.route_experts;
    down.layers = entries;
    // A row picks an expert once: an entry holds at most `rows` items (the merged shared expert
    // exactly that), which then share its decoded tiles.
    if (model.shared_items) {
        gate_up.entry_items_max = rows;
        down.entry_items_max = rows;
    }
    if (!prompt or model.step_decode) {
        try k.exl3Linear(gate_up);
        try k.exl3Linear(down);
    }
    if (prompt) {
        try model.launcher(k).runMlp(model.prompt_scratch.?, .{
            .x = model.normed,
            .items = items,
            .items_per_row = slots,
            .layer_of_item = model.prompt_layers,
            .layers = entries,
            .gate_up = g.table,
            .up_offset = entries,
            .down = d.table,
            .hidden = c.hidden_size,
            .width = width,
            .gate = promptShape(g),
            .down_shape = promptShape(d),
            .y = model.items_out,
        });
    }
    var shared: Ptr = 0;
    if (side) {
        try model.gpu.awaitSide(k.diag);
        shared = model.shared_out;
    } else if (moe.shared) |*mlp| {
        try model.runMlp(k, mlp, model.normed, model.shared_out, rows);
        shared = model.shared_out;
    }
    return .{ .expert_out = model.items_out, .weights = model.route_weights, .shared = shared, .slots = slots };
}

/// The shared expert of `moe` when it can ride in the routed experts' launches: one shared expert
/// whose three projections are EXL3 of the routed experts' rate, codebook and shape (then its
/// output is the last slot of each row, weight 1, summed last as before). Apart, such an expert's
/// GEMVs take the merged table's k splits (uploadApart: split_entries), so the two forms are the
/// same bits at every shape (gemv_splits follows a table's entries: without it GLM-4.5-Air's down
/// took 6 splits apart against 3 merged). `allowed`: the TF_CUDA_SHARED_MERGE switch.
pub fn mergedShared(moe: *const Moe, allowed: bool) ?*const Mlp {
    const shared = if (moe.shared) |*mlp| mlp else return null;
    if (!allowed or moe.experts.len == 0) return null;
    inline for (.{ "gate", "up", "down" }) |which| {
        const ours = &@field(shared.*, which);
        const theirs = &@field(moe.experts[0], which);
        if (ours.kind != .exl3 or theirs.kind != .exl3) return null;
        const a = &ours.kind.exl3;
        const b = &theirs.kind.exl3;
        if (a.rate.bits2 != b.rate.bits2 or a.codebook != b.codebook or a.rows != b.rows or a.columns != b.columns or
            ours.out_features != theirs.out_features or ours.in_features != theirs.in_features) return null;
    }
    return shared;
}

/// Expert slots per row the model's largest MoE layer uses.
pub fn slotsOf(weights: *const weights_mod.Weights, merge_shared: bool) usize {
    var slots: usize = @max(weights.config.experts_per_token, 1);
    for (weights.blocks) |*block| switch (block.ffn) {
        .dense => {},
        .moe => |*moe| if (mergedShared(moe, merge_shared) != null) {
            slots = weights.config.experts_per_token + 1;
        },
    };
    return slots;
}
