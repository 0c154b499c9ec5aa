//! The fatbins embedded at build time (zig/build/cuda.zig): empty without -Dnvcc.
const kernel_images = @import("kernel_images");

pub const built_with_nvcc = kernel_images.built_with_nvcc;
pub const sm_list = kernel_images.sm_list;
pub const exl3_decode: []const u8 = &kernel_images.exl3_decode;
pub const glm_forward: []const u8 = &kernel_images.glm_forward;
pub const exl3_experts: []const u8 = &kernel_images.exl3_experts;
pub const exl3_encode: []const u8 = &kernel_images.exl3_encode;
pub const bench: []const u8 = &kernel_images.bench;
pub const sample: []const u8 = &kernel_images.sample;
pub const mla: []const u8 = &kernel_images.mla;
pub const dsa: []const u8 = &kernel_images.dsa;
pub const kda: []const u8 = &kernel_images.kda;
pub const hyper: []const u8 = &kernel_images.hyper;
pub const kpool: []const u8 = &kernel_images.kpool;

test "images are embedded exactly when nvcc built them" {
    const std = @import("std");
    try std.testing.expectEqual(built_with_nvcc, exl3_decode.len > 0);
}
