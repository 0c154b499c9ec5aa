//! Tensor parallelism: the collectives between ranks.
pub const thread_collective = @import("thread_collective.zig");
pub const ThreadCollective = thread_collective.ThreadCollective;
pub const tcp = @import("tcp.zig");
pub const nccl = @import("nccl.zig");

test {
    _ = thread_collective;
    _ = tcp;
    _ = nccl;
}
