//! The MoE block (GLM.md §3.8): the router picks each row's experts (router.zig), the selected
//! experts run on the rows routed to them and are summed with the routing weights in ascending
//! expert order (transformers' order), then the shared expert (unweighted) is added.
const std = @import("std");
const loader_mod = @import("../loader.zig");
const Config = @import("../config.zig").Config;
const mlp_mod = @import("mlp.zig");
const router = @import("router.zig");
const ops = @import("../ops.zig");
const Mlp = mlp_mod.Mlp;

pub const Moe = struct {
    /// (routed_experts, hidden_size) f32.
    router: []f32,
    correction_bias: []f32,
    experts: []Mlp,
    shared: ?Mlp,

    pub fn load(loader: *loader_mod.Loader, prefix: []const u8) loader_mod.Error!Moe {
        const c = loader.config;
        var moe: Moe = undefined;
        moe.router = try loader.matrix(loader.name("{s}.gate.weight", .{prefix}), c.routed_experts, c.hidden_size);
        moe.correction_bias = try loader.vector(loader.name("{s}.gate.e_score_correction_bias", .{prefix}), c.routed_experts);
        moe.experts = try loader.arena.alloc(Mlp, c.routed_experts);
        var buffer: [256]u8 = undefined;
        for (moe.experts, 0..) |*expert, e| {
            const expert_prefix = std.fmt.bufPrint(&buffer, "{s}.experts.{d}", .{ prefix, e }) catch unreachable;
            expert.* = try Mlp.load(loader, expert_prefix, c.moe_intermediate_size);
        }
        moe.shared = if (c.shared_experts > 0)
            try Mlp.load(loader, loader_mod.join(&buffer, prefix, "shared_experts"), c.moe_intermediate_size * c.shared_experts)
        else
            null;
        return moe;
    }

    pub fn deinit(moe: *Moe, gpa: std.mem.Allocator) void {
        for (moe.experts) |*expert| expert.deinit(gpa);
        if (moe.shared) |*shared| shared.deinit(gpa);
    }

    pub fn scratchLength(moe: *const Moe, rows: usize) usize {
        var length: usize = 0;
        for (moe.experts) |*expert| length = @max(length, expert.scratchLength(rows));
        if (moe.shared) |*shared| length = @max(length, shared.scratchLength(rows));
        return length;
    }

    pub fn forward(moe: *const Moe, c: *const Config, rows: usize, x: []const f32, out: []f32, scratch: *Scratch, buffers: mlp_mod.Buffers) void {
        const hidden = c.hidden_size;
        for (0..rows) |r| {
            scratch.routes[r] = router.route(c.*, moe.router, moe.correction_bias, x[r * hidden ..][0..hidden]);
        }
        @memset(out, 0);
        for (moe.experts, 0..) |*expert, e| {
            var count: usize = 0;
            for (scratch.routes[0..rows], 0..) |route, r| {
                if (route.weightOf(@intCast(e)) != null) {
                    scratch.members[count] = @intCast(r);
                    count += 1;
                }
            }
            if (count == 0) continue;
            const gathered = scratch.gathered[0 .. count * hidden];
            for (scratch.members[0..count], 0..) |r, i| @memcpy(gathered[i * hidden ..][0..hidden], x[r * hidden ..][0..hidden]);
            const expert_out = scratch.expert_out[0 .. count * hidden];
            expert.forward(count, gathered, expert_out, buffers);
            for (scratch.members[0..count], 0..) |r, i| {
                const weight = scratch.routes[r].weightOf(@intCast(e)).?;
                for (out[r * hidden ..][0..hidden], expert_out[i * hidden ..][0..hidden]) |*o, y| o.* += y * weight;
            }
        }
        if (moe.shared) |*shared| {
            const shared_out = scratch.expert_out[0 .. rows * hidden];
            shared.forward(rows, x, shared_out, buffers);
            ops.addInto(out, shared_out);
        }
    }
};

/// The MoE block's buffers for up to `rows_max` rows.
pub const Scratch = struct {
    gathered: []f32, // (rows, H): the rows routed to one expert
    expert_out: []f32, // (rows, H)
    routes: []router.Route,
    members: []u32,

    pub fn init(arena: std.mem.Allocator, c: *const Config, rows_max: usize) error{OutOfMemory}!Scratch {
        return .{
            .gathered = try arena.alloc(f32, rows_max * c.hidden_size),
            .expert_out = try arena.alloc(f32, rows_max * c.hidden_size),
            .routes = try arena.alloc(router.Route, rows_max),
            .members = try arena.alloc(u32, rows_max),
        };
    }
};
