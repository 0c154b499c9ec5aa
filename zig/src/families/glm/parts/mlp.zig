//! The dense MLP (GLM.md §3.7), also the shape of every routed and shared expert:
//! down(SiLU(gate(x)) ⊙ up(x)), no biases; GLM-5.3-Flash clamps gate above and up on both sides at
//! swiglu_limit first.
const std = @import("std");
const loader_mod = @import("../loader.zig");
const Linear = @import("../linear.zig").Linear;
const ops = @import("../ops.zig");

pub const Mlp = struct {
    gate: Linear,
    up: Linear,
    down: Linear,
    limit: f32 = std.math.inf(f32),

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8, intermediate: usize) loader_mod.Error!Mlp {
        var buffer: [256]u8 = undefined;
        const hidden = loader.config.hidden_size;
        return .{
            .gate = try loader.linear(loader_mod.join(&buffer, prefix, "gate_proj"), hidden, intermediate, .none),
            .up = try loader.linear(loader_mod.join(&buffer, prefix, "up_proj"), hidden, intermediate, .none),
            .down = try loader.linear(loader_mod.join(&buffer, prefix, "down_proj"), intermediate, hidden, .none),
            .limit = loader.config.swiglu_limit,
        };
    }

    pub fn deinit(mlp: *Mlp, gpa: std.mem.Allocator) void {
        mlp.gate.deinit(gpa);
        mlp.up.deinit(gpa);
        mlp.down.deinit(gpa);
    }

    pub fn scratchLength(mlp: *const Mlp, rows: usize) usize {
        return @max(mlp.gate.scratchLength(rows), mlp.up.scratchLength(rows), mlp.down.scratchLength(rows));
    }

    /// `gate` and `up`: (rows, intermediate) buffers; `linear`: the projections' scratch.
    pub fn forward(mlp: *const Mlp, rows: usize, x: []const f32, out: []f32, buffers: Buffers) void {
        const intermediate = mlp.gate.out_features;
        const gate = buffers.gate[0 .. rows * intermediate];
        const up = buffers.up[0 .. rows * intermediate];
        mlp.gate.forward(rows, x, gate, buffers.linear);
        mlp.up.forward(rows, x, up, buffers.linear);
        if (std.math.isInf(mlp.limit)) {
            for (gate, up) |*g, u| g.* = ops.silu(g.*) * u;
        } else {
            for (gate, up) |*g, u| g.* = ops.silu(@min(g.*, mlp.limit)) * std.math.clamp(u, -mlp.limit, mlp.limit);
        }
        mlp.down.forward(rows, gate, out, buffers.linear);
    }
};

pub const Buffers = struct { gate: []f32, up: []f32, linear: []f32 };
