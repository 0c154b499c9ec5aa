//! A sequence's KV pages over their life: taken as its positions arrive (from the free list, or
//! an evictable page of the prefix cache when the list is empty), mapped from the prefix cache
//! when it becomes active, offered to it as its prompt fills them, released when it ends.
const std = @import("std");
const assert = std.debug.assert;
const engine_mod = @import("engine.zig");
const Engine = engine_mod.Engine;
const Sequence = engine_mod.Sequence;
const Diagnostic = @import("../core/root.zig").Diagnostic;
const state_snapshots = @import("state_snapshots.zig");

pub fn ensurePage(engine: *Engine, sequence: *Sequence, position: usize) void {
    const page_index = position / engine.params.page_tokens;
    assert(page_index <= sequence.pages_used);
    if (page_index < sequence.pages_used) return;
    assert(sequence.pages_used < sequence.pages_reserved); // admission.zig reserved it
    const slot = engine.slotOf(sequence);
    sequence.pages[sequence.pages_used] = if (engine.pages.free_count > 0) engine.pages.take(slot) else taken: {
        // Admission counted the evictable cached pages as free: one waits.
        const page = engine.prefix.?.evict().?;
        engine.pages.adopt(slot, page);
        break :taken page;
    };
    sequence.pages_used += 1;
}

/// Every page back: cached ones to the prefix cache (a reference fewer), the rest to the pool.
/// Last page first: a cached page then always becomes evictable after its children, so eviction
/// never strands a child behind a page that is gone.
pub fn releasePages(engine: *Engine, sequence: *Sequence, slot: u32) void {
    var i = sequence.pages_used;
    while (i > 0) {
        i -= 1;
        const page = sequence.pages[i];
        if (engine.prefix) |*cache| if (cache.isCached(page)) {
            cache.release(page);
            continue;
        };
        engine.pages.release(slot, page);
    }
}

/// A newly active sequence's prompt starts at its cached full pages, if any: they are mapped
/// (they count in the sequence's reservation, so admission never over-commits) and its
/// computation starts after them. At least the prompt's last token is always computed: its logits
/// give the first token. A recurrent model keeps those up to its deepest state snapshot and starts
/// from that state (state_snapshots.zig).
pub fn mapCachedPrefix(engine: *Engine, sequence: *Sequence, diag: *Diagnostic) engine_mod.Error!void {
    const cache = &(engine.prefix orelse return);
    const n = engine.params.page_tokens;
    const prompt = sequence.tokens[0..sequence.prompt_len];
    const found = cache.lookup(prompt, (prompt.len - 1) / n, sequence.pages);
    const mapped = try state_snapshots.restore(engine, sequence, found, diag);
    sequence.pages_used = mapped;
    sequence.pages_offered = mapped;
    sequence.computed = mapped * n;
    sequence.cached_tokens = mapped * n;
    cache.hit_tokens += mapped * n;
    cache.miss_tokens += prompt.len - mapped * n;
}

/// Offers the prefix cache every page of `sequence` that its prompt has now filled.
pub fn offerFilledPages(engine: *Engine, sequence: *Sequence) void {
    const cache = &(engine.prefix orelse return);
    const n = engine.params.page_tokens;
    const filled = @min(sequence.computed, sequence.prompt_len) / n;
    while (sequence.pages_offered < filled) : (sequence.pages_offered += 1) {
        const i = sequence.pages_offered;
        const page = sequence.pages[i];
        if (cache.isCached(page)) continue; // mapped from the cache
        const parent: ?u32 = if (i == 0) null else sequence.pages[i - 1];
        if (cache.register(page, parent, sequence.tokens[i * n ..][0..n])) engine.pages.disown(engine.slotOf(sequence), page);
    }
}
