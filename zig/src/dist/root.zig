//! Tensor parallelism: the collectives between ranks.
pub const thread_collective = @import("thread_collective.zig");
pub const ThreadCollective = thread_collective.ThreadCollective;

test {
    _ = thread_collective;
}
