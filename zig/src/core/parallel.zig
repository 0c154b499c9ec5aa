//! Split a range of work items over CPU threads. Each call spawns and joins its workers: the CPU
//! path is the exact reference, and a spawn costs microseconds against milliseconds of work.
const std = @import("std");

pub const threads_max = 256;

var thread_count_cached: std.atomic.Value(usize) = .init(0);

/// Thread count: TF_THREADS when set, else the CPU count; read once per process, so that buffers
/// sized by it stay large enough.
pub fn threadCount() usize {
    const cached = thread_count_cached.load(.monotonic);
    if (cached != 0) return cached;
    var count: usize = 0;
    if (std.c.getenv("TF_THREADS")) |text| {
        count = std.fmt.parseInt(usize, std.mem.span(text), 10) catch 0;
    }
    if (count == 0) count = std.Thread.getCpuCount() catch 1;
    count = @max(1, @min(count, threads_max));
    thread_count_cached.store(count, .monotonic);
    return count;
}

/// Calls `body(context, worker, begin, end)` on disjoint chunks covering [0, count), from up to
/// threadCount() threads; `worker` < threads_max is distinct per concurrent call, for per-thread
/// scratch. Chunks are whole multiples of `grain` items except the last.
pub fn forRange(
    count: usize,
    grain: usize,
    context: anytype,
    comptime body: fn (@TypeOf(context), usize, usize, usize) void,
) void {
    std.debug.assert(grain >= 1);
    const grains = std.math.divCeil(usize, count, grain) catch unreachable;
    const workers = @min(threadCount(), grains);
    if (workers <= 1) {
        if (count > 0) body(context, 0, 0, count);
        return;
    }
    const per_worker = std.math.divCeil(usize, grains, workers) catch unreachable;
    var threads: [threads_max]?std.Thread = @splat(null);
    for (1..workers) |worker| {
        const begin = @min(count, worker * per_worker * grain);
        const end = @min(count, (worker + 1) * per_worker * grain);
        if (begin >= end) continue;
        threads[worker] = std.Thread.spawn(.{}, body, .{ context, worker, begin, end }) catch null;
        // A failed spawn runs its chunk here instead: slower, never wrong. Worker 0's chunk has not
        // started yet, so reusing index `worker` here overlaps no one.
        if (threads[worker] == null) body(context, worker, begin, end);
    }
    body(context, 0, 0, @min(count, per_worker * grain));
    for (threads[1..workers]) |thread| if (thread) |t| t.join();
}

test "forRange covers every item exactly once" {
    const Counter = struct {
        hits: []std.atomic.Value(u32),
        fn run(self: *const @This(), worker: usize, begin: usize, end: usize) void {
            std.debug.assert(worker < threads_max);
            for (begin..end) |i| _ = self.hits[i].fetchAdd(1, .monotonic);
        }
    };
    var hits: [1000]std.atomic.Value(u32) = undefined;
    for (&hits) |*h| h.* = .init(0);
    const counter: Counter = .{ .hits = &hits };
    forRange(hits.len, 7, &counter, Counter.run);
    for (hits) |h| try std.testing.expectEqual(@as(u32, 1), h.load(.monotonic));
}
