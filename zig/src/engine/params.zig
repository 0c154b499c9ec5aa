//! What an engine is asked for (its C ABI struct, `tf_engine_params`) and the checks that turn a
//! request into the limits it runs with: zeros take the model's or the pool's defaults.
const std = @import("std");
const Diagnostic = @import("../core/root.zig").Diagnostic;
const KvDtype = @import("../core/root.zig").KvDtype;
const glm = @import("../families/glm/root.zig");

pub const Backend = enum(i32) { cpu = 0, cuda = 1 };

/// A sequence's share of the default pool: the pool is what `sequences_max` contexts of the
/// model's took when each was capped at this, and one sequence may now use all of it.
pub const default_sequence_tokens = 8192;

pub const Params = extern struct {
    backend: i32 = 0,
    sequences_max: u32 = 16,
    kv_pages: u32 = 0, // 0: every sequence at context_tokens_max (or, that 0, at the model's capped at 8192)
    page_tokens: u32 = 16,
    context_tokens_max: u32 = 0, // 0: the model's max_position_embeddings, capped at what the pool holds
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
    const model_context: u32 = @intCast(@min(c.max_position_embeddings, std.math.maxInt(u32)));
    if (p.context_tokens_max != 0 and (p.context_tokens_max < 2 or p.context_tokens_max > model_context)) {
        return invalid(diag, "context_tokens_max {d} must be 2..{d} (max_position_embeddings)", .{ p.context_tokens_max, model_context });
    }
    if (p.kv_pages == 0) {
        const per_sequence = if (p.context_tokens_max != 0) p.context_tokens_max else @min(model_context, default_sequence_tokens);
        p.kv_pages = std.math.cast(u32, @as(u64, std.math.divCeil(u32, per_sequence, p.page_tokens) catch unreachable) * p.sequences_max) orelse
            return invalid(diag, "{d} sequences of {d} tokens are more KV pages than 2^32", .{ p.sequences_max, per_sequence });
    }
    // One sequence may take the whole pool (admission.zig preempts younger ones for it).
    const pool_tokens = @as(u64, p.kv_pages) * p.page_tokens;
    if (p.context_tokens_max == 0) p.context_tokens_max = @intCast(@min(model_context, pool_tokens));
    if (p.context_tokens_max > pool_tokens) {
        return invalid(diag, "context_tokens_max {d} does not fit the KV pool ({d} pages of {d} tokens)", .{ p.context_tokens_max, p.kv_pages, p.page_tokens });
    }
    if (p.context_tokens_max < 2) return invalid(diag, "the KV pool holds {d} tokens; a context takes 2 at least", .{pool_tokens});
    return p;
}

fn invalid(diag: *Diagnostic, comptime fmt: []const u8, args: anytype) error{InvalidArgument} {
    diag.set(fmt, args);
    return error.InvalidArgument;
}
