//! A forward's kernel timeline: an event on the GPU's stream before each launch and one after the
//! last, so a launch's time is the interval to the next event, the gap before the next launch
//! included: what the step spends, launch by launch, and the intervals add up to the whole. While
//! the stream is being recorded the events are recorded as graph nodes (event_record_external), so
//! a replayed step is timed as it runs, without the host's launch costs between kernels.
const std = @import("std");
const driver_api = @import("driver.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = @import("gpu.zig").Gpu;

/// Where in the forward a launch belongs; the composer says before each part.
pub const Part = enum(u32) { embed, attention, norm, ffn, head, other };

pub const name_max = 47;

pub const Entry = struct {
    name: [name_max]u8,
    name_len: u8,
    /// The decoder layer, or -1 outside the layers (embedding, head).
    layer: i32,
    part: Part,
    /// Bytes the launch reads from weights or the cache, where its caller states them (0: not
    /// stated; activations are not counted).
    reads: u64,

    pub fn label(entry: *const Entry) []const u8 {
        return entry.name[0..entry.name_len];
    }
};

pub const Timeline = struct {
    gpa: std.mem.Allocator,
    /// events[i] precedes entries[i]; one more follows the last entry. Kept across forwards.
    events: std.ArrayList(driver_api.Event) = .empty,
    entries: std.ArrayList(Entry) = .empty,
    recorded: usize = 0,
    capturing: bool = false,
    layer: i32 = -1,
    part: Part = .other,
    /// The bytes the next launch reads (`reads`), consumed by it.
    pending_reads: u64 = 0,
    closed: bool = false,

    pub fn init(gpa: std.mem.Allocator) Timeline {
        return .{ .gpa = gpa };
    }

    pub fn deinit(timeline: *Timeline, gpu: *const Gpu) void {
        for (timeline.events.items) |event| _ = gpu.driver.api.cuEventDestroy_v2(event);
        timeline.events.deinit(timeline.gpa);
        timeline.entries.deinit(timeline.gpa);
        timeline.* = undefined;
    }

    /// Starts a forward's timeline; `capturing` when the stream is being recorded as a graph.
    pub fn begin(timeline: *Timeline, capturing: bool) void {
        timeline.entries.clearRetainingCapacity();
        timeline.recorded = 0;
        timeline.capturing = capturing;
        timeline.layer = -1;
        timeline.part = .other;
        timeline.pending_reads = 0;
        timeline.closed = false;
    }

    pub fn at(timeline: *Timeline, layer: i32, part: Part) void {
        timeline.layer = layer;
        timeline.part = part;
    }

    pub fn reads(timeline: *Timeline, bytes: u64) void {
        timeline.pending_reads = bytes;
    }

    fn record(timeline: *Timeline, gpu: *const Gpu, diag: *Diagnostic) driver_api.Error!void {
        const api = &gpu.driver.api;
        if (timeline.recorded == timeline.events.items.len) {
            try timeline.events.ensureUnusedCapacity(timeline.gpa, 1);
            var event: driver_api.Event = null;
            try gpu.driver.check(api.cuEventCreate(&event, 0), "cuEventCreate (timeline)", diag);
            timeline.events.appendAssumeCapacity(event);
        }
        const event = timeline.events.items[timeline.recorded];
        const flags: c_uint = if (timeline.capturing) driver_api.event_record_external else 0;
        try gpu.driver.check(api.cuEventRecordWithFlags(event, gpu.stream, flags), "cuEventRecordWithFlags (timeline)", diag);
        timeline.recorded += 1;
    }

    /// Before a launch described as `what` ("launch tf_name").
    pub fn mark(timeline: *Timeline, gpu: *const Gpu, what: []const u8, diag: *Diagnostic) driver_api.Error!void {
        std.debug.assert(!timeline.closed);
        try timeline.entries.ensureUnusedCapacity(timeline.gpa, 1);
        try timeline.record(gpu, diag);
        const name = if (std.mem.startsWith(u8, what, "launch ")) what["launch ".len..] else what;
        var entry: Entry = .{ .name = undefined, .name_len = @intCast(@min(name.len, name_max)), .layer = timeline.layer, .part = timeline.part, .reads = timeline.pending_reads };
        @memcpy(entry.name[0..entry.name_len], name[0..entry.name_len]);
        timeline.entries.appendAssumeCapacity(entry);
        timeline.pending_reads = 0;
    }

    /// After the forward's last launch.
    pub fn close(timeline: *Timeline, gpu: *const Gpu, diag: *Diagnostic) driver_api.Error!void {
        try timeline.record(gpu, diag);
        timeline.closed = true;
    }

    /// Entry i's device time in microseconds, once the forward has run (the stream synchronized).
    pub fn micros(timeline: *const Timeline, gpu: *const Gpu, i: usize, diag: *Diagnostic) driver_api.Error!f32 {
        std.debug.assert(timeline.closed and i + 1 < timeline.recorded);
        var ms: f32 = 0;
        try gpu.driver.check(gpu.driver.api.cuEventElapsedTime(&ms, timeline.events.items[i], timeline.events.items[i + 1]), "cuEventElapsedTime (timeline)", diag);
        return 1000 * ms;
    }
};
