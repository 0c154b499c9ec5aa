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

pub const Module = gpu_mod.Module(&.{"tf_sample"});

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

/// One 1024-thread block per job; `logits` (rows, vocab) and `summaries` (core.LogitsSummary per
/// row) on the device, `jobs` and `out` device arrays of `count`.
pub fn launch(gpu: *const Gpu, module: *const Module, logits: Ptr, summaries: Ptr, jobs: Ptr, out: Ptr, count: usize, vocab: usize, diag: *Diagnostic) Error!void {
    var a = .{ logits, summaries, jobs, out, @as(c_int, @intCast(count)), @as(c_int, @intCast(vocab)) };
    var ptrs: [a.len]*anyopaque = undefined;
    inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
    try gpu_mod.launch(gpu, module.function("tf_sample"), .{ .grid = .{ @intCast(count), 1, 1 }, .block = .{ 1024, 1, 1 } }, ptrs, "launch tf_sample", diag);
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
    try gpu.upload(logits_dev, std.mem.sliceAsBytes(logits), diag);
    try gpu.upload(jobs_dev, std.mem.sliceAsBytes(jobs), diag);
    const k: glm_kernels.Kernels = .{ .gpu = &gpu, .module = &glm, .diag = diag };
    try k.logitsSummary(logits_dev, summaries, rows, vocab);
    if (jobs.len > 0) try launch(&gpu, &module, logits_dev, summaries, jobs_dev, out_dev, jobs.len, vocab, diag);
    try gpu.download(std.mem.sliceAsBytes(out), out_dev, diag);
}
