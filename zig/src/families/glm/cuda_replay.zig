//! The GPU forward recorded as a CUDA graph once per (rows, logits rows, which paths run) and
//! replayed: a GLM-4.5-Air step is ~1800 launches, whose host cost and gaps a replay removes. A
//! tensor-parallel rank records its forward too when its all-reduce is queued on the stream
//! (NCCL); a host-run reduction (the TCP collective) sits between launches and cannot be recorded.
const std = @import("std");
const core = @import("../../core/root.zig");
const cuda = @import("../../cuda/root.zig");
const model_mod = @import("cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Reduce = GpuModel.Reduce;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;

pub const slots = 16;

/// A recording is keyed by what changes its launches: rows, logits rows, and which paths run.
pub const Key = struct { rows: usize, wanted: usize, prompt: bool, decode: bool, tiles: bool, rest: bool };
pub const Slot = struct { key: Key, graph: cuda.gpu.Graph };

/// The forward of the batch already on the device: timed, replayed or queued launch by launch.
pub fn run(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
    if (model.timeline_armed) return runTimed(model, rows, wanted, reduce, diag);
    if (records(model, rows, reduce)) {
        const graph = try graphFor(model, .{ .rows = rows, .wanted = wanted, .prompt = model.step_prompt, .decode = model.step_decode, .tiles = model.step_tiles > 0, .rest = model.step_rest }, reduce, diag);
        try graph.launch(&model.gpu, diag);
        model.graph_replays += 1;
    } else {
        try model.enqueue(rows, wanted, reduce, diag);
    }
}

fn records(model: *const GpuModel, rows: usize, reduce: ?Reduce) bool {
    const recordable = if (reduce) |r| r.recordable else true;
    return recordable and model.graphs_enabled and rows <= model_mod.graph_rows_max;
}

/// `run` with an event before each launch: recorded as a graph of its own where a step would
/// be replayed (uploaded before its launch, so the launch runs as a replay does), else queued.
fn runTimed(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
    model.timeline_armed = false;
    const timeline = model.timeline.?;
    if (model.timeline_graph) |*graph| graph.destroy(&model.gpu);
    model.timeline_graph = null;
    const record = records(model, rows, reduce);
    timeline.begin(record);
    model.gpu.timeline = timeline;
    defer model.gpu.timeline = null;
    if (!record) {
        try model.enqueue(rows, wanted, reduce, diag);
        return timeline.close(&model.gpu, diag);
    }
    var graph = try recordForward(model, rows, wanted, reduce, diag);
    errdefer graph.destroy(&model.gpu);
    try graph.upload(&model.gpu, diag);
    try graph.launch(&model.gpu, diag);
    model.timeline_graph = graph;
}

/// The forward of `rows` rows recorded as a graph (with the timeline's closing event when one is
/// being taken), the stream left out of capture whatever fails.
fn recordForward(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!cuda.gpu.Graph {
    try cuda.gpu.Graph.beginCapture(&model.gpu, diag);
    enqueueRecorded(model, rows, wanted, reduce, diag) catch |err| {
        _ = cuda.gpu.Graph.endCapture(&model.gpu, false, diag) catch {};
        return err;
    };
    return cuda.gpu.Graph.endCapture(&model.gpu, true, diag);
}

fn enqueueRecorded(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
    try model.enqueue(rows, wanted, reduce, diag);
    if (model.gpu.timeline) |timeline| try timeline.close(&model.gpu, diag);
}

/// The recorded forward of `rows` rows with `wanted` logits rows, recorded on first use. Every
/// launch reads its per-step inputs (tokens, positions, page tables, logits rows) from device
/// buffers that `uploadBatch` refills, so one recording serves every step of that size; a
/// recorded all-reduce sums the same device buffer at every replay.
fn graphFor(model: *GpuModel, key: Key, reduce: ?Reduce, diag: *Diagnostic) Error!cuda.gpu.Graph {
    for (model.graphs) |slot| if (slot) |entry| {
        if (std.meta.eql(entry.key, key)) return entry.graph;
    };
    const graph = try recordForward(model, key.rows, key.wanted, reduce, diag);
    const slot = &model.graphs[model.graph_next % slots];
    model.graph_next += 1;
    if (slot.*) |*old| old.graph.destroy(&model.gpu);
    slot.* = .{ .key = key, .graph = graph };
    return graph;
}
