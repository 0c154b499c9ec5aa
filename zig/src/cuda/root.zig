//! The CUDA backend's host half: the driver API through dlopen, contexts, streams, events,
//! device memory, and modules loaded from the fatbins embedded at build time.
pub const driver = @import("driver.zig");
pub const kernels = @import("kernels.zig");
pub const gpu = @import("gpu.zig");
pub const device_arena = @import("device_arena.zig");
pub const timeline = @import("timeline.zig");
pub const Gpu = gpu.Gpu;
pub const exl3_decode = @import("exl3_decode.zig");
pub const glm_kernels = @import("glm_kernels.zig");
pub const gemv_splits = @import("gemv_splits.zig");
pub const exl3_parts = @import("exl3_parts.zig");
pub const exl3_prompt = @import("exl3_prompt.zig");
pub const sampling = @import("sampling.zig");
pub const mla_kernels = @import("mla_kernels.zig");
pub const dsa_kernels = @import("dsa_kernels.zig");
pub const kda_kernels = @import("kda_kernels.zig");
pub const hyper_kernels = @import("hyper_kernels.zig");
pub const kpool_kernels = @import("kpool_kernels.zig");
pub const exl3_encode = @import("exl3_encode.zig");
pub const bench_kernels = @import("bench_kernels.zig");

test {
    _ = driver;
    _ = gpu;
    _ = device_arena;
    _ = kernels;
    _ = exl3_decode;
    _ = exl3_prompt;
    _ = glm_kernels;
    _ = gemv_splits;
    _ = exl3_parts;
    _ = mla_kernels;
    _ = dsa_kernels;
    _ = kda_kernels;
    _ = hyper_kernels;
    _ = kpool_kernels;
}
