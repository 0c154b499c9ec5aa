//! The GLM family: config (which class, which parts per layer), weights by part, the CPU forward
//! composed from the parts, its CUDA counterpart, tensor-parallel shards and synthetic weights.
//! Classes: A `Glm4MoeForCausalLM` (GQA), B `Glm4MoeLiteForCausalLM` (MLA), C
//! `GlmMoeDsaForCausalLM` (MLA + the DSA indexer), D `Glm5NextForConditionalGeneration` (KDA,
//! NoPE MLA + the pooled DSA indexer, hyper-connections).
pub const config = @import("config.zig");
pub const Config = config.Config;
pub const linear = @import("linear.zig");
pub const loader = @import("loader.zig");
pub const weights = @import("weights.zig");
pub const Weights = weights.Weights;
pub const batch = @import("batch.zig");
pub const cache = @import("cache.zig");
pub const ops = @import("ops.zig");
pub const rope = @import("rope.zig");
pub const parts = struct {
    pub const gqa = @import("parts/gqa.zig");
    pub const mla = @import("parts/mla.zig");
    pub const dsa = @import("parts/dsa.zig");
    pub const kpool = @import("parts/kpool.zig");
    pub const kda = @import("parts/kda.zig");
    pub const hyper = @import("parts/hyper.zig");
    pub const mlp = @import("parts/mlp.zig");
    pub const moe = @import("parts/moe.zig");
    pub const router = @import("parts/router.zig");
    pub const kda_cuda = @import("parts/kda_cuda.zig");
};
pub const forward_cpu = @import("forward_cpu.zig");
pub const cuda_model = @import("cuda_model.zig");
pub const shard = @import("shard.zig");
pub const release = @import("release.zig");
pub const synthetic = @import("synthetic.zig");

test {
    _ = config;
    _ = @import("config_fields.zig");
    _ = linear;
    _ = loader;
    _ = weights;
    _ = cache;
    _ = ops;
    _ = rope;
    _ = parts.gqa;
    _ = parts.mla;
    _ = parts.dsa;
    _ = parts.kpool;
    _ = parts.kda;
    _ = parts.hyper;
    _ = @import("config_next.zig");
    _ = parts.mlp;
    _ = parts.moe;
    _ = parts.router;
    _ = forward_cpu;
    _ = cuda_model;
    _ = @import("cuda_buffers.zig");
    _ = @import("parts/linear_cuda.zig");
    _ = @import("parts/gqa_cuda.zig");
    _ = @import("parts/mlp_cuda.zig");
    _ = @import("parts/moe_cuda.zig");
    _ = @import("parts/mla_cuda.zig");
    _ = @import("parts/dsa_cuda.zig");
    _ = @import("parts/kda_cuda.zig");
    _ = @import("parts/hyper_cuda.zig");
    _ = shard;
    _ = release;
    _ = synthetic;
}
