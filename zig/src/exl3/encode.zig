//! The Viterbi tile encoder of EXL3.md §11.5, bit-identical to ExLlamaV3 1.6.x: fp16 arithmetic with
//! its rounding after every operation, the strict-< "lowest k" rule inside each out-edge, and the
//! rank rule for the end state. Integer K = 1..8 (the half-integer rates are not encoded here).
//!
//! Exactness without fp16 hardware: every sum d² + prev is exact in f64 whenever it can round to a
//! finite fp16 (d² has 22 significant bits, prev 11, and their magnitudes are within 2^40 of each
//! other there), and `roundHalf` rounds an f64 to the nearest fp16 (ties to even) directly, so each
//! emulated operation rounds exactly once, as the hardware does.
const std = @import("std");
const codebook = @import("codebook.zig");
const trellis = @import("trellis.zig");

pub const bits_min = 1;
pub const bits_max = 8;
const states_count = 1 << 16;
const half_max_finite: f64 = 65504.0;
const half_overflow: f64 = 65520.0; // the midpoint past 65504: it and above round to infinity
const half_normal_min: f64 = 6.103515625e-05; // 2^-14
const inf = std.math.inf(f64);

/// Nearest fp16 value to `x` (ties to even), as f64. ±inf past the largest finite fp16.
pub fn roundHalf(x: f64) f64 {
    const magnitude = @abs(x);
    const rounded = if (magnitude >= half_overflow)
        inf
    else if (magnitude < half_normal_min)
        // Subnormal spacing is 2^-24: round x·2^24 to an integer, ties to even, with the 2^52 trick.
        ((magnitude * 0x1p24 + 0x1p52) - 0x1p52) * 0x1p-24
    else blk: {
        // Normal: keep 10 of the 52 mantissa bits, ties to even; a carry bumps the exponent.
        const bits: u64 = @bitCast(magnitude);
        const lsb = (bits >> 42) & 1;
        const kept = (bits + ((@as(u64, 1) << 41) - 1) + lsb) & ~((@as(u64, 1) << 42) - 1);
        break :blk @as(f64, @bitCast(kept));
    };
    return if (x < 0) -rounded else rounded;
}

/// The largest f64 that rounds to the non-negative fp16 value `r`, and whether that midpoint itself
/// rounds to `r` (ties go to the even mantissa).
fn upperBound(r: f64) struct { limit: f64, inclusive: bool } {
    if (r < half_normal_min) {
        const units: u64 = @intFromFloat(r * 0x1p24);
        return .{ .limit = r + 0x1p-25, .inclusive = units % 2 == 0 };
    }
    const bits: u64 = @bitCast(r);
    const exponent: i32 = @as(i32, @intCast(bits >> 52)) - 1023;
    const half_ulp = std.math.ldexp(@as(f64, 1), exponent - 11);
    return .{ .limit = r + half_ulp, .inclusive = (bits >> 42) & 1 == 0 };
}

/// rank(e) of EXL3.md §11.5: minimal cost first, then minimal rank picks the end state.
fn rank(e: u32) u32 {
    const v = e & 1023;
    return (@as(u32, @bitReverse(@as(u5, @intCast(v >> 5)))) << 10) | (@as(u32, @bitReverse(@as(u5, @intCast(v & 31)))) << 5) | (e >> 10);
}

/// The distinct fp16 values of a codebook and each state's index among them, so that a step
/// computes d = hsub(c, w) once per value, not once per state.
pub const CodebookValues = struct {
    values: []f64,
    index_of: []u16, // (65536)

    pub fn init(gpa: std.mem.Allocator, cb: codebook.Codebook) error{OutOfMemory}!CodebookValues {
        const index_of = try gpa.alloc(u16, states_count);
        errdefer gpa.free(index_of);
        var slot_of: [1 << 16]i32 = @splat(-1); // by fp16 bit pattern
        var values: std.ArrayList(f64) = .empty;
        errdefer values.deinit(gpa);
        for (0..states_count) |s| {
            const bits = codebook.decode(cb, @intCast(s));
            if (slot_of[bits] < 0) {
                slot_of[bits] = @intCast(values.items.len);
                try values.append(gpa, @as(f16, @bitCast(bits)));
            }
            index_of[s] = @intCast(slot_of[bits]);
        }
        return .{ .values = try values.toOwnedSlice(gpa), .index_of = index_of };
    }

    pub fn deinit(cv: *CodebookValues, gpa: std.mem.Allocator) void {
        gpa.free(cv.values);
        gpa.free(cv.index_of);
        cv.* = undefined;
    }
};

/// Per-thread buffers: sized for K = 1, the widest trellis (2^15 out-edges, 16 MiB of back
/// pointers).
pub const Workspace = struct {
    costs: []f64, // (2 · 2^15) least and second-least cost per out-edge at the current step
    chosen: []u32, // (2^15) first k reaching the least
    squares: []f64, // (distinct codebook values)
    prev: []f64, // (2^15) fp16-rounded best cost per out-edge of the previous step
    back: []u16, // (256, 2^15)

    pub fn init(gpa: std.mem.Allocator, distinct_values: usize) error{OutOfMemory}!Workspace {
        const costs = try gpa.alloc(f64, 2 << 15);
        errdefer gpa.free(costs);
        const chosen = try gpa.alloc(u32, 1 << 15);
        errdefer gpa.free(chosen);
        const squares = try gpa.alloc(f64, distinct_values);
        errdefer gpa.free(squares);
        const prev = try gpa.alloc(f64, 1 << 15);
        errdefer gpa.free(prev);
        return .{ .costs = costs, .chosen = chosen, .squares = squares, .prev = prev, .back = try gpa.alloc(u16, 256 << 15) };
    }

    pub fn deinit(ws: *Workspace, gpa: std.mem.Allocator) void {
        gpa.free(ws.costs);
        gpa.free(ws.chosen);
        gpa.free(ws.squares);
        gpa.free(ws.prev);
        gpa.free(ws.back);
        ws.* = undefined;
    }
};

/// Encodes one tile: 256 values in trellis (PERM) order to 256 tail-biting 16-bit states.
pub fn encodeTile(bits: u4, cv: *const CodebookValues, values: *const [trellis.tile_weights]f32, ws: *Workspace, out: *[trellis.tile_weights]u16) void {
    std.debug.assert(bits >= bits_min and bits <= bits_max);
    // Pass 1: an unconstrained run over positions 128..255, 0..127 finds where a good ring ends.
    forward(bits, cv, values, ws, 128, null);
    const edges = @as(usize, 1) << @intCast(16 - @as(u5, bits));
    var end_edge: u32 = 0;
    for (1..edges) |e| {
        const better = ws.prev[e] < ws.prev[end_edge] or (ws.prev[e] == ws.prev[end_edge] and rank(@intCast(e)) < rank(end_edge));
        if (better) end_edge = @intCast(e);
    }
    var o: u32 = end_edge;
    var position: usize = 128;
    while (position > 0) {
        position -= 1;
        o = ws.back[position * edges + o];
    }
    const end = o; // in(state_0) of that run
    // Pass 2: positions 0..255 with in(state_0) forced to `end`; tracing back from out = end closes the ring.
    forward(bits, cv, values, ws, 0, end);
    o = end;
    position = trellis.tile_weights;
    while (position > 0) {
        position -= 1;
        const back = ws.back[position * edges + o];
        out[position] = @truncate((@as(u32, back) << bits) | o);
        o = back;
    }
}

fn forward(bits: u4, cv: *const CodebookValues, values: *const [trellis.tile_weights]f32, ws: *Workspace, roll: usize, pre: ?u32) void {
    const k_bits: u5 = bits;
    const edges = @as(usize, 1) << (16 - k_bits);
    const branches = @as(usize, 1) << k_bits;
    const least = ws.costs[0..edges];
    const second = ws.costs[edges..][0..edges];
    const chosen_k = ws.chosen[0..edges];
    for (0..trellis.tile_weights) |i| {
        const position = (i + roll) & 255;
        const w = roundHalf(values[position]);
        for (cv.values, ws.squares) |c, *square| {
            const d = roundHalf(c - w);
            square.* = d * d;
        }
        if (i == 0) {
            // Step 0 has no predecessor: prev is 0, or +inf for in-states other than `pre`.
            const from_count = @as(usize, 1) << (16 - k_bits);
            for (ws.prev[0..from_count], 0..) |*p, from| p.* = if (pre) |required| (if (from == required) 0 else inf) else 0;
        }
        // One sweep over all states s = (k << (16 - K)) | o: the exact least and second-least
        // d(s)² + prev[in(s)] per out-edge o, and the first k reaching the least.
        @memset(least, inf);
        @memset(second, inf);
        @memset(chosen_k, 0);
        for (0..branches) |k| {
            const base = k * edges;
            var o: usize = 0;
            while (o < edges) : (o += lanes) {
                var cost: V = undefined;
                inline for (0..lanes) |j| {
                    const s = base + o + j;
                    cost[j] = ws.squares[cv.index_of[s]] + ws.prev[s >> k_bits];
                }
                const m1: V = least[o..][0..lanes].*;
                const m2: V = second[o..][0..lanes].*;
                const improves = cost < m1;
                second[o..][0..lanes].* = @min(m2, @max(m1, cost));
                least[o..][0..lanes].* = @min(m1, cost);
                const ks: U = chosen_k[o..][0..lanes].*;
                chosen_k[o..][0..lanes].* = @select(u32, improves, @as(U, @splat(@intCast(k))), ks);
            }
        }
        // The stored cost is the fp16 rounding of the least; the winner is the lowest k whose
        // rounded cost equals it. Only when the second-least rounds the same can that be an
        // earlier k than the exact argmin.
        const back = ws.back[position * edges ..][0..edges];
        for (0..edges) |o| {
            const rounded = roundHalf(least[o]);
            var k: usize = chosen_k[o];
            if (rounded != inf) {
                const bound = upperBound(rounded);
                const tie = second[o] < bound.limit or (second[o] == bound.limit and bound.inclusive);
                if (tie) {
                    k = 0;
                    while (true) : (k += 1) {
                        const s = k * edges + o;
                        const cost = ws.squares[cv.index_of[s]] + ws.prev[s >> k_bits];
                        if (cost < bound.limit or (cost == bound.limit and bound.inclusive)) break;
                    }
                }
            } else {
                k = 0; // every branch rounds to +inf: the lowest k
            }
            back[o] = @intCast((k * edges + o) >> k_bits);
        }
        for (ws.prev[0..edges], least) |*p, l| p.* = roundHalf(l);
    }
}

const lanes = 4;
const V = @Vector(lanes, f64);
const U = @Vector(lanes, u32);

test "roundHalf matches the compiler's f64 to f16 conversion" {
    var prng = std.Random.DefaultPrng.init(11);
    const random = prng.random();
    for (0..200_000) |i| {
        const x: f64 = switch (i % 4) {
            0 => random.floatNorm(f64),
            1 => random.floatNorm(f64) * 1e-6,
            2 => random.floatNorm(f64) * 3e4,
            else => @as(f64, @as(f16, @bitCast(random.int(u16) & 0x7BFF))) + (random.float(f64) - 0.5) * 1e-3,
        };
        const expected: f64 = @as(f16, @floatCast(x));
        try std.testing.expectEqual(expected, roundHalf(x));
    }
    try std.testing.expectEqual(inf, roundHalf(65520.0));
    try std.testing.expectEqual(@as(f64, 65504.0), roundHalf(65519.99));
}

test "an encoded tile decodes to the states the encoder chose, and they close the ring" {
    const gpa = std.testing.allocator;
    var cv = try CodebookValues.init(gpa, .mul1);
    defer cv.deinit(gpa);
    var ws = try Workspace.init(gpa, cv.values.len);
    defer ws.deinit(gpa);
    var prng = std.Random.DefaultPrng.init(5);
    var values: [256]f32 = undefined;
    for (&values) |*v| v.* = prng.random().floatNorm(f32);
    for ([_]u4{ 2, 3, 4 }) |bits| {
        var states: [256]u16 = undefined;
        encodeTile(bits, &cv, &values, &ws, &states);
        for (0..256) |i| {
            const before = states[(i + 255) % 256];
            try std.testing.expectEqual(before & ((@as(u16, 1) << @intCast(16 - @as(u5, bits))) - 1), states[i] >> bits);
        }
        var squared_error: f64 = 0;
        for (values, states) |v, s| {
            const decoded: f64 = @as(f16, @bitCast(codebook.decode(.mul1, s)));
            squared_error += (decoded - v) * (decoded - v);
        }
        // EXL3.md §16.2: MSE 0.065 / 0.0162 / 0.00416 at K = 2 / 3 / 4 on unit Gaussians.
        const bound = [_]f64{ 0, 0, 0.09, 0.025, 0.0065 };
        try std.testing.expect(squared_error / 256 < bound[bits]);
    }
}

/// Encodes `values` ((tiles, 256) in trellis order) into `states` ((tiles, 256)) on all threads.
pub fn encodeTiles(gpa: std.mem.Allocator, bits: u4, cb: codebook.Codebook, values: []const f32, states: []u16) error{OutOfMemory}!void {
    std.debug.assert(values.len % trellis.tile_weights == 0 and states.len == values.len);
    var cv = try CodebookValues.init(gpa, cb);
    defer cv.deinit(gpa);
    const tiles = values.len / trellis.tile_weights;
    const workers = @min(parallel.threadCount(), @max(tiles, 1));
    const spaces = try gpa.alloc(Workspace, workers);
    defer gpa.free(spaces);
    var ready: usize = 0;
    defer for (spaces[0..ready]) |*ws| ws.deinit(gpa);
    for (spaces) |*ws| {
        ws.* = try Workspace.init(gpa, cv.values.len);
        ready += 1;
    }
    const job: EncodeJob = .{ .bits = bits, .cv = &cv, .values = values, .states = states, .spaces = spaces };
    parallel.forRange(tiles, 1, &job, EncodeJob.run);
}

const parallel = @import("../core/parallel.zig");

const EncodeJob = struct {
    bits: u4,
    cv: *const CodebookValues,
    values: []const f32,
    states: []u16,
    spaces: []Workspace,

    fn run(job: *const EncodeJob, worker: usize, begin: usize, end: usize) void {
        for (begin..end) |tile| {
            encodeTile(job.bits, job.cv, job.values[tile * 256 ..][0..256], &job.spaces[worker], job.states[tile * 256 ..][0..256]);
        }
    }
};
