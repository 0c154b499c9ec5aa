//! All-reduce between tensor-parallel ranks that are threads of one process: the host-memory
//! collective of the CPU backend, so that the sharding is exercised without GPUs or a network.
//! Every rank gets the same bits: element i is summed in rank order, r0 + r1 + ..., by one rank.
const std = @import("std");

pub const ranks_max = 16;

pub const ThreadCollective = struct {
    world: usize,
    posted: [ranks_max][]f32 = undefined,
    result: []f32,
    arrived: std.atomic.Value(usize) = .init(0),
    generation: std.atomic.Value(usize) = .init(0),

    pub fn init(gpa: std.mem.Allocator, world: usize, elements_max: usize) error{OutOfMemory}!ThreadCollective {
        std.debug.assert(world >= 1 and world <= ranks_max);
        return .{ .world = world, .result = try gpa.alloc(f32, elements_max) };
    }

    pub fn deinit(collective: *ThreadCollective, gpa: std.mem.Allocator) void {
        gpa.free(collective.result);
        collective.* = undefined;
    }

    /// Every rank calls this with its buffer of the same length; all return with the sum.
    pub fn allReduceSum(collective: *ThreadCollective, rank: usize, values: []f32) void {
        std.debug.assert(values.len <= collective.result.len);
        collective.posted[rank] = values;
        collective.barrier();
        const chunk = std.math.divCeil(usize, values.len, collective.world) catch unreachable;
        const begin = @min(values.len, rank * chunk);
        const end = @min(values.len, begin + chunk);
        for (begin..end) |i| {
            var sum: f32 = collective.posted[0][i];
            for (collective.posted[1..collective.world]) |other| sum += other[i];
            collective.result[i] = sum;
        }
        collective.barrier();
        @memcpy(values, collective.result[0..values.len]);
        collective.barrier(); // nobody reuses `result` until every rank has copied it
    }

    /// A generation barrier; waiting ranks yield the CPU to the ones still computing.
    fn barrier(collective: *ThreadCollective) void {
        const generation = collective.generation.load(.acquire);
        if (collective.arrived.fetchAdd(1, .acq_rel) + 1 == collective.world) {
            collective.arrived.store(0, .release);
            _ = collective.generation.fetchAdd(1, .acq_rel);
            return;
        }
        while (collective.generation.load(.acquire) == generation) std.Thread.yield() catch {};
    }
};

test "ranks get identical sums" {
    const gpa = std.testing.allocator;
    var collective = try ThreadCollective.init(gpa, 3, 64);
    defer collective.deinit(gpa);
    var buffers: [3][10]f32 = undefined;
    for (&buffers, 0..) |*b, r| {
        for (b, 0..) |*v, i| v.* = @floatFromInt(r * 100 + i);
    }
    const Worker = struct {
        fn run(c: *ThreadCollective, rank: usize, b: []f32) void {
            for (0..5) |_| c.allReduceSum(rank, b[0..10]);
        }
    };
    var threads: [2]std.Thread = undefined;
    for (&threads, 1..) |*t, r| t.* = try std.Thread.spawn(.{}, Worker.run, .{ &collective, r, &buffers[r] });
    Worker.run(&collective, 0, &buffers[0]);
    for (threads) |t| t.join();
    for (buffers[1..]) |b| try std.testing.expectEqualSlices(f32, &buffers[0], &b);
}
