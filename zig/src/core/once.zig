//! Run a function once across threads (the std library no longer carries `std.once`). Callers
//! that arrive while it runs spin until it is done; it is used only for short table fills.
const std = @import("std");

pub fn Once(comptime function: fn () void) type {
    return struct {
        state: std.atomic.Value(u8) = .init(not_started),

        const not_started = 0;
        const running = 1;
        const done = 2;

        pub fn call(once: *@This()) void {
            if (once.state.load(.acquire) == done) return;
            if (once.state.cmpxchgStrong(not_started, running, .acquire, .acquire) == null) {
                function();
                once.state.store(done, .release);
                return;
            }
            while (once.state.load(.acquire) != done) std.atomic.spinLoopHint();
        }
    };
}

var calls: u32 = 0;
fn countCall() void {
    calls += 1;
}

test "runs exactly once" {
    var once: Once(countCall) = .{};
    once.call();
    once.call();
    try std.testing.expectEqual(@as(u32, 1), calls);
}
