//! A step's kernel timeline through the engine (cuda/timeline.zig): armed before a step, read
//! after it, a C-shaped entry per launch for the ABI.
const std = @import("std");
const core = @import("../core/root.zig");
const Engine = @import("engine.zig").Engine;
const Error = @import("engine.zig").Error;
const Diagnostic = core.Diagnostic;

/// tf_timeline_entry in trellisforge.h.
pub const Entry = extern struct {
    /// The kernel's name, NUL-terminated.
    name: [48]u8,
    /// The decoder layer, or -1 (embedding, head).
    layer: i32,
    /// cuda.timeline.Part: 0 embed, 1 attention, 2 norm, 3 ffn, 4 head, 5 other.
    part: u32,
    /// From this launch's start to the next's (the gap between them included).
    micros: f32,
    reserved: u32 = 0,
    /// Weight or cache bytes the launch reads, where stated (0: not stated).
    reads: u64,
};

comptime {
    std.debug.assert(@sizeOf(Entry) == 72);
}

fn modelOf(engine: *Engine, diag: *Diagnostic) Error!*@import("../families/glm/root.zig").cuda_model.GpuModel {
    return engine.gpuModel() orelse {
        diag.set("a step timeline needs the cuda backend in this process (one GPU, or rank 0 of a tensor-parallel group)", .{});
        return error.InvalidArgument;
    };
}

/// Times the next step's forward launch by launch.
pub fn arm(engine: *Engine, diag: *Diagnostic) Error!void {
    try (try modelOf(engine, diag)).timeNext();
}

/// The last timed step's launches into `out` (when it has room); returns how many there are (0
/// before a timed step has run).
pub fn read(engine: *Engine, out: []Entry, diag: *Diagnostic) Error!usize {
    const model = try modelOf(engine, diag);
    const entries = model.timelineEntries();
    if (out.len < entries.len) return entries.len;
    for (entries, out[0..entries.len], 0..) |*entry, *target, i| {
        target.* = .{ .name = @splat(0), .layer = entry.layer, .part = @backingInt(entry.part), .micros = try model.launchMicros(i, diag), .reads = entry.reads };
        @memcpy(target.name[0..entry.name_len], entry.label());
    }
    return entries.len;
}
