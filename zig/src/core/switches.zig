//! The comparison switches of the GPU paths (TF_CUDA_GRAPHS, TF_CUDA_PROMPT, TF_CUDA_SAMPLING,
//! TF_CUDA_SHARED_MERGE, TF_CUDA_ATTENTION_SPREAD, TF_CUDA_PROMPT_ATTENTION, TF_CUDA_KV_PAIR,
//! TF_CUDA_MLA_HALF, ...): set to "0", each turns its path off, so that a test or a benchmark can
//! run the same engine both ways. Read once, when an engine or a GPU model is made.
const std = @import("std");

pub fn off(name: [*:0]const u8) bool {
    const text = std.c.getenv(name) orelse return false;
    return std.mem.eql(u8, std.mem.span(text), "0");
}
