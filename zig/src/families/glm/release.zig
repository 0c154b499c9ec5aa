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
    const Release = struct {
        gpa: std.mem.Allocator,
        fn visit(r: @This(), linear: *Linear) void {
            linear.release(r.gpa);
        }
    };
    each(value, Release{ .gpa = gpa });
}

/// Projections in `value` not yet released (a test's check that nothing was missed).
pub fn heldLinears(value: anytype) usize {
    const Count = struct {
        held: *usize,
        fn visit(c: @This(), linear: *Linear) void {
            c.held.* += @intFromBool(!linear.released());
        }
    };
    var held: usize = 0;
    each(value, Count{ .held = &held });
    return held;
}

/// `visitor.visit(*Linear)` for every projection the walk reaches in `value`.
fn each(value: anytype, visitor: anytype) void {
    const T = @TypeOf(value.*);
    if (T == Linear) return visitor.visit(value);
    if (comptime !holds(T, 6)) return;
    switch (@typeInfo(T)) {
        .@"struct" => |info| inline for (info.field_names) |name| each(&@field(value.*, name), visitor),
        .@"union" => switch (value.*) {
            inline else => |*payload| each(payload, visitor),
        },
        .optional => if (value.*) |*payload| each(payload, visitor),
        .pointer => for (value.*) |*item| each(item, visitor),
        .array => for (value) |*item| each(item, visitor),
        else => {},
    }
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

fn expectReleasedShard(config_json: []const u8) !void {
    var arena = std.heap.ArenaAllocator.init(std.testing.allocator);
    defer arena.deinit();
    var diag: core.Diagnostic = .{};
    const model = try core.config.ModelConfig.parse(arena.allocator(), config_json, &diag);
    const config = try Config.parse(&model, &diag);
    var full = try synthetic.generate(std.testing.allocator, config, 3, 6, 5);
    defer full.deinit(std.testing.allocator);

    // Its own allocator, to count the bytes a release gives back before deinit.
    var debug: std.heap.DebugAllocator(.{ .enable_memory_limit = true }) = .init;
    defer _ = debug.deinit(); // leaks: the count's last check below
    const gpa = debug.allocator();
    // Rank 0 alone holds lm_head (its words); the others keep its shape, released from the start.
    {
        var first = try shard_mod.shard(std.testing.allocator, &full, 2, 0, &diag);
        defer first.deinit(std.testing.allocator);
        const words = std.mem.sliceAsBytes(first.lm_head.kind.exl3.words);
        try std.testing.expect(std.mem.eql(u8, std.mem.sliceAsBytes(full.lm_head.kind.exl3.words), words));
    }
    var rank = try shard_mod.shard(gpa, &full, 2, 1, &diag);
    try std.testing.expect(rank.lm_head.released());
    try std.testing.expectEqual(full.lm_head.out_features, rank.lm_head.out_features);
    const projections = heldLinears(&rank);
    try std.testing.expect(projections > 10);
    const before = debug.total_requested_bytes;
    // Part by part, as a GPU rank's upload releases them.
    for (rank.blocks) |*block| releaseLinears(gpa, &block.attention);
    try std.testing.expect(heldLinears(&rank) < projections);
    releaseLinears(gpa, &rank);
    try std.testing.expectEqual(@as(usize, 0), heldLinears(&rank));
    // What stays is the shard's arena (its block tables), with at most its nodes' headers beside
    // it: no projection (an MLA shard's kv_b rows were its kv_b projection's, released with it).
    const arena_bytes = rank.arena.queryCapacity();
    try std.testing.expect(debug.total_requested_bytes >= arena_bytes and debug.total_requested_bytes - arena_bytes < 1024);
    try std.testing.expect(before > debug.total_requested_bytes);
    try std.testing.expectEqual(full.config.hidden_size, rank.lm_head.in_features);
    releaseLinears(gpa, &rank); // twice is harmless
    rank.deinit(gpa); // and deinit after a release frees the rest once (the testing allocator checks)
    try std.testing.expectEqual(@as(usize, 0), debug.total_requested_bytes);
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
