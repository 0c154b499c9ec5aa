//! What a GPU forward holds and ran, for the tests and the benchmarks: the layers that took the
//! fused launches, and the launch-by-launch timeline (cuda/timeline.zig). GpuModel's methods.
const cuda = @import("../../cuda/root.zig");
const GpuModel = @import("cuda_model.zig").GpuModel;
const Diagnostic = @import("../../core/root.zig").Diagnostic;
const Error = @import("cuda_model.zig").Error;

/// Attention layers whose k and v projections run as one launch.
pub fn kvPairs(model: *const GpuModel) u64 {
    var count: u64 = 0;
    for (model.blocks) |*block| switch (block.attention) {
        .gqa => |*part| count += @intFromBool(part.kv_pair != 0),
        .mla, .kda => {},
    };
    return count;
}

/// MoE layers whose routed experts the prompt kernels take.
pub fn promptLayers(model: *const GpuModel) u64 {
    var count: u64 = 0;
    for (model.blocks) |*block| switch (block.ffn) {
        .dense => {},
        .moe => |*moe| count += @intFromBool(moe.prompt),
    };
    return count;
}

/// Times the next forward launch by launch (`timelineEntries` once it has run).
pub fn timeNext(model: *GpuModel) Error!void {
    if (model.timeline == null) {
        const timeline = try model.gpa.create(cuda.timeline.Timeline);
        timeline.* = .init(model.gpa);
        model.timeline = timeline;
    }
    model.timeline_armed = true;
}

/// The last timed forward's launches (empty before one has run); `launchMicros` times each.
pub fn timelineEntries(model: *const GpuModel) []const cuda.timeline.Entry {
    const timeline = model.timeline orelse return &.{};
    return if (timeline.closed) timeline.entries.items else &.{};
}

pub fn launchMicros(model: *const GpuModel, i: usize, diag: *Diagnostic) Error!f32 {
    return model.timeline.?.micros(&model.gpu, i, diag);
}

/// Where the launches that follow belong in the timeline (when one is being taken).
pub fn at(model: *GpuModel, layer: ?usize, part: cuda.timeline.Part) void {
    if (model.gpu.timeline) |timeline| timeline.at(if (layer) |l| @intCast(l) else -1, part);
}
