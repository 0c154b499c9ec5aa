//! Frees the host buffers of every projection in a part, a block or whole weights, leaving empty
//! projections of the same shapes (Linear.release). A tensor-parallel rank's shard is a heap copy
//! of its part of the model; once a GPU rank has uploaded it, keeping it would hold the rank's
//! weights twice, and on a unified-memory GPU (GB10: one 128 GB pool for host and device) twice
//! is more than the node has for a model split over two of them.
const std = @import("std");
const Linear = @import("linear.zig").Linear;

/// `value`: a mutable pointer to anything that holds projections (a Linear, a part, a block, a
/// slice of experts, Weights). Shared views (pointers to const) are not followed.
pub fn releaseLinears(gpa: std.mem.Allocator, value: anytype) void {
    const T = @TypeOf(value.*);
    if (T == Linear) return value.release(gpa);
    if (comptime !holds(T, 6)) return;
    switch (@typeInfo(T)) {
        .@"struct" => |info| inline for (info.field_names) |name| releaseLinears(gpa, &@field(value.*, name)),
        .@"union" => switch (value.*) {
            inline else => |*payload| releaseLinears(gpa, payload),
        },
        .optional => if (value.*) |*payload| releaseLinears(gpa, payload),
        .pointer => for (value.*) |*item| releaseLinears(gpa, item),
        .array => for (value) |*item| releaseLinears(gpa, item),
        else => {},
    }
}

/// Projections in `value` not yet released (a test's check that nothing was missed).
pub fn heldLinears(value: anytype) usize {
    const T = @TypeOf(value.*);
    if (T == Linear) return @intFromBool(!value.released());
    if (comptime !holds(T, 6)) return 0;
    var count: usize = 0;
    switch (@typeInfo(T)) {
        .@"struct" => |info| inline for (info.field_names) |name| {
            count += heldLinears(&@field(value.*, name));
        },
        .@"union" => switch (value.*) {
            inline else => |*payload| count += heldLinears(payload),
        },
        .optional => if (value.*) |*payload| {
            count += heldLinears(payload);
        },
        .pointer => for (value.*) |*item| {
            count += heldLinears(item);
        },
        .array => for (value) |*item| {
            count += heldLinears(item);
        },
        else => {},
    }
    return count;
}

/// Whether a T can hold a projection the walk reaches: by value, in an optional, a union or a
/// mutable slice (a shard's experts), `depth` levels down.
fn holds(comptime T: type, comptime depth: u32) bool {
    if (T == Linear) return true;
    if (depth == 0) return false;
    return switch (@typeInfo(T)) {
        .@"struct" => |info| inline for (info.field_types) |Field| {
            if (holds(Field, depth - 1)) break true;
        } else false,
        .@"union" => |info| inline for (info.field_types) |Field| {
            if (holds(Field, depth - 1)) break true;
        } else false,
        .optional => |info| holds(info.child, depth - 1),
        .pointer => |info| info.size == .slice and !info.attrs.@"const" and holds(info.child, depth - 1),
        .array => |info| holds(info.child, depth - 1),
        else => false,
    };
}

const core = @import("../../core/root.zig");
const Config = @import("config.zig").Config;
const synthetic = @import("synthetic.zig");
const shard_mod = @import("shard.zig");

/// Live bytes of an allocator's blocks, to see that a release gives memory back before deinit.
const Counting = struct {
    child: std.mem.Allocator,
    live: usize = 0,

    fn allocator(counting: *Counting) std.mem.Allocator {
        return .{ .ptr = counting, .vtable = &.{ .alloc = alloc, .resize = resize, .remap = remap, .free = free } };
    }
    fn alloc(ctx: *anyopaque, len: usize, alignment: std.mem.Alignment, ret: usize) ?[*]u8 {
        const c: *Counting = @ptrCast(@alignCast(ctx));
        const result = c.child.rawAlloc(len, alignment, ret) orelse return null;
        c.live += len;
        return result;
    }
    fn resize(ctx: *anyopaque, memory: []u8, alignment: std.mem.Alignment, new_len: usize, ret: usize) bool {
        const c: *Counting = @ptrCast(@alignCast(ctx));
        if (!c.child.rawResize(memory, alignment, new_len, ret)) return false;
        c.live = c.live - memory.len + new_len;
        return true;
    }
    fn remap(ctx: *anyopaque, memory: []u8, alignment: std.mem.Alignment, new_len: usize, ret: usize) ?[*]u8 {
        const c: *Counting = @ptrCast(@alignCast(ctx));
        const result = c.child.rawRemap(memory, alignment, new_len, ret) orelse return null;
        c.live = c.live - memory.len + new_len;
        return result;
    }
    fn free(ctx: *anyopaque, memory: []u8, alignment: std.mem.Alignment, ret: usize) void {
        const c: *Counting = @ptrCast(@alignCast(ctx));
        c.child.rawFree(memory, alignment, ret);
        c.live -= memory.len;
    }
};

fn expectReleasedShard(config_json: []const u8) !void {
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: core.Diagnostic = .{};
    const model = try core.config.ModelConfig.parse(arena.allocator(), config_json, &diag);
    const config = try Config.parse(&model, &diag);
    var full = try synthetic.generate(std.testing.allocator, config, 3, 6, 5);
    defer full.deinit(std.testing.allocator);

    var counting: Counting = .{ .child = std.testing.allocator };
    const gpa = counting.allocator();
    var rank = try shard_mod.shard(gpa, &full, 2, 1, &diag);
    const projections = heldLinears(&rank);
    try std.testing.expect(projections > 10);
    const before = counting.live;
    // Part by part, as a GPU rank's upload releases them.
    for (rank.blocks) |*block| releaseLinears(gpa, &block.attention);
    try std.testing.expect(heldLinears(&rank) < projections);
    releaseLinears(gpa, &rank);
    try std.testing.expectEqual(@as(usize, 0), heldLinears(&rank));
    // What stays is the shard's arena (its block tables; an MLA shard's f32 kv_b rows for the CPU
    // form), with at most its nodes' headers beside it: no projection.
    const arena_bytes = rank.arena.queryCapacity();
    try std.testing.expect(counting.live >= arena_bytes and counting.live - arena_bytes < 1024);
    try std.testing.expect(before > counting.live);
    try std.testing.expectEqual(full.config.hidden_size, rank.lm_head.in_features);
    releaseLinears(gpa, &rank); // twice is harmless
    rank.deinit(gpa); // and deinit after a release frees the rest once (the testing allocator checks)
    try std.testing.expectEqual(@as(usize, 0), counting.live);
}

test "a released shard keeps its shapes, frees its projections, and deinits cleanly" {
    try expectReleasedShard(
        \\{"architectures":["Glm4MoeForCausalLM"],"hidden_size":256,"num_hidden_layers":2,
        \\ "num_attention_heads":4,"num_key_value_heads":4,"head_dim":64,"intermediate_size":512,
        \\ "moe_intermediate_size":256,"n_routed_experts":4,"num_experts_per_tok":2,"n_shared_experts":1,
        \\ "first_k_dense_replace":1,"vocab_size":512,"partial_rotary_factor":0.5}
    );
    try expectReleasedShard(
        \\{"architectures":["Glm4MoeLiteForCausalLM"],"model_type":"glm4_moe_lite","hidden_size":256,
        \\ "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"q_lora_rank":128,
        \\ "kv_lora_rank":128,"qk_nope_head_dim":64,"qk_rope_head_dim":64,"v_head_dim":128,
        \\ "intermediate_size":512,"moe_intermediate_size":256,"n_routed_experts":4,"num_experts_per_tok":2,
        \\ "first_k_dense_replace":1,"vocab_size":512,"partial_rotary_factor":1.0}
    );
}
