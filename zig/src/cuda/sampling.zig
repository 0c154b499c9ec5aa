//! The host half of zig/kernels/cuda/sample.cu: sampling on the GPU for rows that need only
//! temperature, top-k, top-p and min-p. The host draws each row's u from the sequence's generator
//! where the host sampler would, and gets back the token and its log-probability.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;

pub const Module = gpu_mod.Module(&.{ "tf_sample_level", "tf_sample_floor", "tf_sample_draw" });

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    return Module.load(gpu, kernels.sample, "sample", diag);
}

/// Device twin of `struct SampleJob` in sample.cu: one sampled logits row.
pub const Job = extern struct {
    row: u32,
    temperature: f32,
    top_p: f32,
    top_k: i32,
    min_p: f32,
    reserved: u32 = 0,
    /// In [0, 1): the sequence generator's draw.
    u: f64,
};

pub const Choice = extern struct { token: u32, logprob: f32 };

comptime {
    std.debug.assert(@sizeOf(Job) == 32 and @sizeOf(Choice) == 8);
}

/// Tokens per block (sample.cu kSpan): a row of `vocab` logits takes spans(vocab) blocks.
pub const span = 4096;
const histogram_bytes = 2048 * 8;
const state_bytes = 64;
const span_sum_bytes = 16;

pub fn spans(vocab: usize) usize {
    return (vocab + span - 1) / span;
}

/// Device scratch for `jobs_max` jobs over rows of `vocab`: zeroed once (`Gpu.zero`), every
/// launch sequence leaves it zero.
pub fn scratchBytes(jobs_max: usize, vocab: usize) usize {
    return @max(jobs_max, 1) * (state_bytes + histogram_bytes + spans(vocab) * span_sum_bytes);
}

/// Samples `jobs` (host copies, to choose the launches; `jobs_dev` holds the same on the device):
/// top-k's digits, top-p's, min-p's floor, for the jobs that ask for them, then the draw. A grid of
/// (spans, jobs) each; `logits` (rows, vocab) and `summaries` (core.LogitsSummary per row) on the
/// device, `scratch` of scratchBytes(jobs.len or more, vocab), `out` a device array of jobs.len.
pub fn launch(gpu: *const Gpu, module: *const Module, logits: Ptr, summaries: Ptr, jobs: []const Job, jobs_dev: Ptr, scratch: Ptr, out: Ptr, vocab: usize, diag: *Diagnostic) Error!void {
    if (jobs.len == 0) return;
    var top_k = false;
    var top_p = false;
    var min_p = false;
    for (jobs) |job| {
        top_k = top_k or (job.top_k > 0 and job.top_k < vocab);
        top_p = top_p or job.top_p < 1;
        min_p = min_p or job.min_p > 0;
    }
    const config: gpu_mod.Launch = .{ .grid = .{ @intCast(spans(vocab)), @intCast(jobs.len), 1 }, .block = .{ 256, 1, 1 } };
    const vocab_c: c_int = @intCast(vocab);
    for ([_]bool{ top_k, top_p }, 0..) |wanted, phase| {
        if (!wanted) continue;
        for (0..3) |level| {
            const a = .{ logits, summaries, jobs_dev, scratch, vocab_c, @as(c_int, @intCast(phase)), @as(c_int, @intCast(level)) };
            try gpu_mod.launchValues(gpu, module.function("tf_sample_level"), config, a, "launch tf_sample_level", diag);
        }
    }
    if (min_p) {
        const a = .{ logits, summaries, jobs_dev, scratch, vocab_c };
        try gpu_mod.launchValues(gpu, module.function("tf_sample_floor"), config, a, "launch tf_sample_floor", diag);
    }
    const a = .{ logits, summaries, jobs_dev, scratch, out, vocab_c };
    try gpu_mod.launchValues(gpu, module.function("tf_sample_draw"), config, a, "launch tf_sample_draw", diag);
}

/// Why `job` cannot be sampled over `rows` logits rows, or null.
pub fn checkJob(job: Job, rows: usize) ?[]const u8 {
    if (job.row >= rows) return "a job names a logits row past the rows given";
    if (!(job.temperature > 0 and job.temperature <= 100)) return "temperature must be in (0, 100] (0 is greedy: no sampling)";
    if (!(job.top_p > 0 and job.top_p <= 1)) return "top_p must be in (0, 1]";
    if (job.top_k < 0) return "top_k must be >= 0 (0 disables it)";
    if (!(job.min_p >= 0 and job.min_p <= 1)) return "min_p must be in [0, 1]";
    if (!(job.u >= 0 and job.u < 1)) return "u must be in [0, 1)";
    return null;
}

/// Samples host `logits` (rows x vocab) for `jobs` on GPU 0, summaries included: the C ABI's
/// tf_cuda_sample, for tests of the kernel against a reference.
pub fn sampleHost(logits: []const f32, rows: usize, vocab: usize, jobs: []const Job, out: []Choice, diag: *Diagnostic) Error!void {
    std.debug.assert(logits.len == rows * vocab and out.len == jobs.len);
    const glm_kernels = @import("glm_kernels.zig");
    var gpu = try Gpu.open(0, diag);
    defer gpu.close();
    var glm = try glm_kernels.load(&gpu, diag);
    defer glm.unload(&gpu);
    var module = try load(&gpu, diag);
    defer module.unload(&gpu);
    const logits_dev = try gpu.alloc(@max(logits.len * 4, 4), diag);
    defer gpu.free(logits_dev);
    const summaries = try gpu.alloc(@max(rows, 1) * (1 + glm_kernels.Kernels.summary_slices) * 16, diag);
    defer gpu.free(summaries);
    const jobs_dev = try gpu.alloc(@max(jobs.len, 1) * @sizeOf(Job), diag);
    defer gpu.free(jobs_dev);
    const out_dev = try gpu.alloc(@max(jobs.len, 1) * @sizeOf(Choice), diag);
    defer gpu.free(out_dev);
    const scratch = try gpu.alloc(scratchBytes(jobs.len, vocab), diag);
    defer gpu.free(scratch);
    try gpu.zero(scratch, scratchBytes(jobs.len, vocab), diag);
    try gpu.upload(logits_dev, std.mem.sliceAsBytes(logits), diag);
    try gpu.upload(jobs_dev, std.mem.sliceAsBytes(jobs), diag);
    const k: glm_kernels.Kernels = .{ .gpu = &gpu, .module = &glm, .diag = diag };
    try k.logitsSummary(logits_dev, summaries, rows, vocab);
    try launch(&gpu, &module, logits_dev, summaries, jobs, jobs_dev, scratch, out_dev, vocab, diag);
    try gpu.download(std.mem.sliceAsBytes(out), out_dev, diag);
    // Again on the same scratch, into poisoned choices: every launch must leave the scratch at
    // rest (the engine keeps one for its life) and every job must get its choice written.
    const first = try std.heap.page_allocator.dupe(Choice, out);
    defer std.heap.page_allocator.free(first);
    try gpu.poison(out_dev, @max(jobs.len, 1) * @sizeOf(Choice), diag);
    try launch(&gpu, &module, logits_dev, summaries, jobs, jobs_dev, scratch, out_dev, vocab, diag);
    try gpu.download(std.mem.sliceAsBytes(out), out_dev, diag);
    for (first, out, 0..) |a, b, i| if (a.token != b.token or @as(u32, @bitCast(a.logprob)) != @as(u32, @bitCast(b.logprob))) {
        diag.set("the sampler's second run gave job {d} token {d} where the first gave {d}: a launch left its scratch dirty or wrote no choice", .{ i, b.token, a.token });
        return error.CudaFailed;
    };
}
