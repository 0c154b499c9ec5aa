//! GLM class A (`Glm4MoeForCausalLM`): config, weights by role, routing, RoPE and the CPU forward.
pub const config = @import("config.zig");
pub const Config = config.Config;
pub const linear = @import("linear.zig");
pub const weights = @import("weights.zig");
pub const Weights = weights.Weights;
pub const router = @import("router.zig");
pub const rope = @import("rope.zig");
pub const forward_cpu = @import("forward_cpu.zig");
pub const cuda_exl3 = @import("cuda_exl3.zig");
pub const shard = @import("shard.zig");
pub const synthetic = @import("synthetic.zig");

test {
    _ = config;
    _ = linear;
    _ = weights;
    _ = router;
    _ = rope;
    _ = forward_cpu;
    _ = cuda_exl3;
    _ = shard;
    _ = synthetic;
}
