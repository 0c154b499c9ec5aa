//! What an engine is asked for (its C ABI struct, `tf_engine_params`) and the checks that turn a
//! request into the limits it runs with: zeros take the model's or the pool's defaults.
const std = @import("std");
const Diagnostic = @import("../core/root.zig").Diagnostic;
const KvDtype = @import("../core/root.zig").KvDtype;
const glm = @import("../families/glm/root.zig");

pub const Backend = enum(i32) { cpu = 0, cuda = 1 };

pub const Params = extern struct {
    backend: i32 = 0,
    sequences_max: u32 = 16,
    kv_pages: u32 = 0, // 0: enough for every sequence at full context
    page_tokens: u32 = 16,
    context_tokens_max: u32 = 0, // 0: the model's max_position_embeddings, capped at 8192
    rows_max: u32 = 256, // tokens per step (prompt chunks + decode rows)
    tp_world: u32 = 1, // tensor-parallel ranks inside this process (CPU backend)
    prefix_cache: u32 = 0, // 1: map earlier prompts' identical full KV pages (prefix_cache.zig)
    kv_dtype: u32 = 0, // 0: f16; else a core.KvDtype (1 f32, 2 f16, 3 fp8)
};

/// The cache dtype `params` asks for (resolve has checked it).
pub fn kvDtype(p: Params) KvDtype {
    return @fromBackingInt(@intCast(p.kv_dtype));
}

pub fn resolve(requested: Params, c: glm.Config, diag: *Diagnostic) error{InvalidArgument}!Params {
    var p = requested;
    if (p.sequences_max == 0 or p.sequences_max > 256) return invalid(diag, "sequences_max must be 1..256", .{});
    if (p.page_tokens == 0 or p.page_tokens > 1024) return invalid(diag, "page_tokens must be 1..1024", .{});
    if (p.rows_max == 0 or p.rows_max > 65536) return invalid(diag, "rows_max must be 1..65536", .{});
    if (p.tp_world == 0) p.tp_world = 1;
    if (p.tp_world > 16) return invalid(diag, "tp_world must be 1..16", .{});
    if (p.prefix_cache > 1) return invalid(diag, "prefix_cache must be 0 or 1", .{});
    if (p.kv_dtype == 0) p.kv_dtype = @backingInt(KvDtype.f16);
    if (std.enums.fromInt(KvDtype, p.kv_dtype) == null) return invalid(diag, "kv_dtype {d} is none of 1 (f32), 2 (f16), 3 (fp8)", .{p.kv_dtype});
    if (p.context_tokens_max == 0) p.context_tokens_max = @intCast(@min(c.max_position_embeddings, 8192));
    if (p.context_tokens_max < 2 or p.context_tokens_max > c.max_position_embeddings) {
        return invalid(diag, "context_tokens_max {d} must be 2..{d} (max_position_embeddings)", .{ p.context_tokens_max, c.max_position_embeddings });
    }
    const pages_per_sequence = std.math.divCeil(u32, p.context_tokens_max, p.page_tokens) catch unreachable;
    if (p.kv_pages == 0) p.kv_pages = pages_per_sequence * p.sequences_max;
    return p;
}

fn invalid(diag: *Diagnostic, comptime fmt: []const u8, args: anytype) error{InvalidArgument} {
    diag.set(fmt, args);
    return error.InvalidArgument;
}
