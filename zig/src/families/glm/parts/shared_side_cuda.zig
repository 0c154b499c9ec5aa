//! The MoE layer's shared expert on the GPU's side stream (Gpu.forkSide): a decode step's shared
//! expert depends on the normed rows alone, so it runs beside the router, whose launch is a chain
//! of small steps on a few SMs, and the routed experts, and the combine waits for it. Its GEMVs
//! write their own partial sums, counters, groups and gate/up outputs (this Scratch), never the
//! main stream's. A shared expert merged into the routed launches (moe_cuda.mergedShared) leaves
//! them for such steps and runs its own launches over the same weights, with the merged table's k
//! splits: the same bits either way. Prompt steps, steps of more rows than the graphs take, and a
//! timeline keep the main stream. TF_CUDA_SHARED_SIDE=0 turns it off.
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const buffers = @import("../cuda_buffers.zig");
const GpuMlp = @import("mlp_cuda.zig").GpuMlp;

pub const Scratch = struct {
    /// Decode steps of up to this many rows fork (its buffers' size; more rows run serially).
    rows: usize,
    gate: Ptr,
    gemv: buffers.GemvScratch,
};

/// Whether the switch allows the side stream: read once, before the shared experts are uploaded
/// (a merged one gets its own launches beside the merged form when it does).
pub fn allowed() bool {
    return !core.switches.off("TF_CUDA_SHARED_SIDE");
}

/// The side's buffers when some MoE layer has a shared expert; null otherwise.
pub fn allocate(model: *GpuModel, diag: *Diagnostic) Error!?Scratch {
    if (!model.shared_side) return null;
    // Typed: @min with a comptime bound narrows to u7, and 2 * rows wrapped to 0 at 64 rows (the
    // gate buffer came out one byte long, and the GEMVs wrote past it).
    const rows: usize = @min(model.limits.rows_max, model_mod.graph_rows_max);
    var need: buffers.LinearScratch = .{};
    var width: usize = 0;
    for (model.blocks) |*block| switch (block.ffn) {
        .dense => {},
        .moe => |*moe| if (moe.sideMlp()) |mlp| {
            buffers.LinearScratch.mlp(&need, mlp, rows);
            width = @max(width, mlp.gate.out_features);
        },
    };
    if (width == 0) return null;
    // An unquantized shared expert's tensor-core launches leave their split sums in `acc` too.
    need.partials = @max(need.partials, model.dense_partials);
    return .{
        .rows = rows,
        .gate = try model.alloc(2 * rows * width * @sizeOf(f32), diag),
        .gemv = try buffers.allocateGemvScratch(model, need, diag),
    };
}

/// MoE layers whose shared expert a decode step can run on the side stream (tf_engine_stats).
pub fn layers(model: *const GpuModel) u32 {
    if (model.side == null) return 0;
    var count: u32 = 0;
    for (model.blocks) |*block| switch (block.ffn) {
        .dense => {},
        .moe => |*moe| count += @intFromBool(moe.sideMlp() != null),
    };
    return count;
}

/// Whether this step runs the shared expert on the side: a decode step (no prompt rows) of few
/// enough rows, and no timeline being taken (it times launches one after another on one stream).
pub fn takes(model: *const GpuModel, rows: usize) bool {
    const side = model.side orelse return false;
    return !model.step_prompt and rows <= side.rows and model.gpu.timeline == null;
}

/// Queues `mlp` on the side stream into model.shared_out; the caller awaits it (Gpu.awaitSide)
/// before the combine reads it.
pub fn run(model: *GpuModel, k: K.Kernels, mlp: *const GpuMlp, rows: usize) Error!void {
    const side = model.side.?;
    try model.gpu.forkSide(k.diag);
    const kept = .{ model.gate, model.acc, model.counters, model.grouping };
    model.gate, model.acc, model.counters, model.grouping = .{ side.gate, side.gemv.acc, side.gemv.counters, side.gemv.grouping };
    defer {
        model.gate, model.acc, model.counters, model.grouping = kept;
        if (model.gpu.stream != model.gpu.main) model.gpu.stream = model.gpu.main; // an error left it on the side
    }
    try model.runMlp(k, mlp, model.normed, model.shared_out, rows);
    try model.gpu.leaveSide(k.diag);
}
