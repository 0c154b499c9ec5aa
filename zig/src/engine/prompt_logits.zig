//! Logits at every position of each prompt, as fresh sequences batched together: Engine.logits()
//! and the batch-invariance checks. The prompts bypass admission order: their page budgets are
//! taken at once or the call is refused, and every sequence is cancelled after, whatever happens.
const core = @import("../core/root.zig");
const sampler = @import("sampler.zig");
const Engine = @import("engine.zig").Engine;
const admission = @import("admission.zig");
const Error = @import("engine.zig").Error;
const Diagnostic = core.Diagnostic;

pub fn promptLogits(engine: *Engine, prompts: []const []const u32, out: []f32, diag: *Diagnostic) Error!void {
    const vocab = engine.config().vocab_size;
    var total: usize = 0;
    for (prompts) |prompt| total += prompt.len;
    if (out.len != total * vocab) {
        diag.set("out holds {d} values; {d} positions x {d} vocab needs {d}", .{ out.len, total, vocab, total * vocab });
        return error.InvalidArgument;
    }
    if (prompts.len > engine.sequences.len) {
        diag.set("{d} prompts; the engine holds {d} sequences", .{ prompts.len, engine.sequences.len });
        return error.InvalidArgument;
    }
    var ids: [256]u64 = undefined;
    var added: usize = 0;
    defer for (ids[0..added]) |id| engine.cancel(id, diag) catch {};
    for (prompts) |prompt| {
        const params: sampler.Params = .{ .max_tokens = 1 };
        ids[added] = try engine.addSequence(prompt, params, &.{}, diag);
        added += 1;
    }
    // Prompt logits bypass admission order: take the budgets now or refuse.
    for (ids[0..added]) |id| {
        if (!admission.activate(engine, engine.find(id).?, 0)) {
            diag.set("not enough free KV pages for these prompts now ({d} reserved of {d})", .{ engine.pages_reserved, engine.params.kv_pages });
            return error.InvalidArgument;
        }
    }
    var written: usize = 0;
    var cursor: [256]usize = @splat(0);
    while (written < total) {
        var rows: usize = 0;
        var logits_count: usize = 0;
        for (prompts, ids[0..added], 0..) |prompt, id, p| {
            const sequence = engine.find(id).?;
            while (cursor[p] < prompt.len and rows < engine.params.rows_max and logits_count < engine.logits_rows_max) : (cursor[p] += 1) {
                const position = cursor[p];
                engine.ensurePage(sequence, position);
                engine.batch_tokens[rows] = prompt[position];
                engine.batch_positions[rows] = @intCast(position);
                engine.batch_slots[rows] = engine.slotOf(sequence);
                engine.batch_prompt[rows] = true;
                engine.logits_rows[logits_count] = @intCast(rows);
                engine.logits_slots[logits_count] = @intCast(p);
                rows += 1;
                logits_count += 1;
            }
        }
        for (engine.batch_tables[0..rows], engine.batch_slots[0..rows]) |*table, slot| {
            const sequence = &engine.sequences[slot];
            table.* = sequence.pages[0..sequence.pages_used];
        }
        try engine.runForward(rows, logits_count, null, 0, diag);
        // Rows are laid out prompt by prompt, positions ascending: place each in `out`.
        for (0..logits_count) |i| {
            const p = engine.logits_slots[i];
            const position = engine.batch_positions[i];
            var base: usize = 0;
            for (prompts[0..p]) |prompt| base += prompt.len;
            @memcpy(out[(base + position) * vocab ..][0..vocab], engine.logits[i * vocab ..][0..vocab]);
        }
        written += rows;
    }
}
