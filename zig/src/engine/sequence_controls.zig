//! What a caller sets on a live sequence between steps to steer its sampling: a constrained
//! sequence's token mask (token_mask.zig) and any sequence's logit bias (logit_bias.zig).
const engine_mod = @import("engine.zig");
const Engine = engine_mod.Engine;
const Error = engine_mod.Error;
const Diagnostic = @import("../core/root.zig").Diagnostic;
const token_mask = @import("token_mask.zig");
const logit_bias = @import("logit_bias.zig");

/// What a constrained sequence's next sampled token may be: `mask`, or anything when null.
pub fn setTokenMask(engine: *Engine, id: u64, mask: ?[]align(1) const u32, diag: *Diagnostic) Error!void {
    const sequence = engine.find(id) orelse {
        diag.set("no live sequence with id {d}", .{id});
        return error.NotFound;
    };
    if (sequence.sampling.constrained == 0) {
        diag.set("sequence {d} was not added as constrained", .{id});
        return error.InvalidArgument;
    }
    const allowed = mask orelse {
        sequence.mask_state = .open;
        return;
    };
    if (token_mask.problem(allowed, engine.config().vocab_size)) |problem| {
        diag.set("{s} (vocabulary {d}, {d} words given)", .{ problem, engine.config().vocab_size, allowed.len });
        return error.InvalidArgument;
    }
    @memcpy(sequence.mask, allowed);
    sequence.mask_state = .masked;
}

/// The bias every later sampled token of the sequence takes (none when `tokens` is empty); a
/// refused bias leaves the previous one.
pub fn setLogitBias(engine: *Engine, id: u64, tokens: []align(1) const u32, values: []align(1) const f32, diag: *Diagnostic) Error!void {
    const sequence = engine.find(id) orelse {
        diag.set("no live sequence with id {d}", .{id});
        return error.NotFound;
    };
    if (tokens.len > logit_bias.entries_max) {
        diag.set("{d} logit bias entries; at most {d}", .{ tokens.len, logit_bias.entries_max });
        return error.InvalidArgument;
    }
    const vocab = engine.config().vocab_size;
    if (logit_bias.problem(tokens, values, vocab)) |p| {
        diag.set("logit bias entry {d} (token {d}, value {d}) {s} (vocabulary {d})", .{ p.index, tokens[p.index], values[p.index], p.what, vocab });
        return error.InvalidArgument;
    }
    @memcpy(sequence.bias.tokens[0..tokens.len], tokens);
    @memcpy(sequence.bias.values[0..values.len], values);
    sequence.bias.count = tokens.len;
}
