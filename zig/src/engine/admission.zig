//! Which sequences run, and the pages each may take. The pool is shared: a sequence reserves the
//! pages of the positions it has (its prompt when it is admitted) and one more each time a
//! generated token starts a page. When an older sequence needs a page and the pool has none to
//! give, the youngest running sequence is preempted: its pages go back (those the prefix cache
//! holds stay there), and it waits, oldest first, to compute its tokens again and go on. A row's
//! bits do not depend on its batch or its chunk, prompt rows and generated rows keep their paths,
//! and the seeded draws are not spent again, so a preempted sequence gives the tokens it would
//! have given. The context fits the pool (params.zig), so the oldest sequence always can go on.
const engine_mod = @import("engine.zig");
const Engine = engine_mod.Engine;
const Sequence = engine_mod.Sequence;
const Diagnostic = @import("../core/root.zig").Diagnostic;

/// Admits waiting sequences in id order while their positions' pages fit, leaving a page for each
/// running sequence's next one so that a newcomer is not preempted as soon as it starts.
pub fn admit(engine: *Engine, diag: *Diagnostic) engine_mod.Error!void {
    while (true) {
        var next: ?*Sequence = null;
        var running: usize = 0;
        for (engine.sequences) |*s| {
            if (s.state == .active) running += 1;
            if (s.state == .waiting and (next == null or s.id < next.?.id)) next = s;
        }
        const sequence = next orelse return;
        if (!activate(engine, sequence, running)) return;
        try engine.mapCachedPrefix(sequence, diag);
    }
}

/// A waiting sequence made active with the pages of its positions reserved, if they fit with
/// `spare` pages left over; false (and nothing changed) if not.
pub fn activate(engine: *Engine, sequence: *Sequence, spare: usize) bool {
    const need = engine.pagesFor(sequence.length);
    if (engine.pages_reserved + need + spare > engine.params.kv_pages) return false;
    engine.pages_reserved += need;
    sequence.pages_reserved = need;
    sequence.state = .active;
    return true;
}

/// Oldest first, each running sequence's reservation grows to its positions' pages; where the
/// pool is spent, younger sequences are preempted until it fits (or the sequence itself is the
/// youngest, and waits).
pub fn grow(engine: *Engine) void {
    // Most steps start no page: then nothing is sorted.
    for (engine.sequences) |*s| {
        if (s.state == .active and engine.pagesFor(s.length) > s.pages_reserved) break;
    } else return;
    var order: [256]u32 = undefined;
    for (engine.activeInIdOrder(&order)) |slot| {
        const sequence = &engine.sequences[slot];
        if (sequence.state != .active) continue; // preempted for an older one
        const need = engine.pagesFor(sequence.length);
        if (need <= sequence.pages_reserved) continue;
        const more = need - sequence.pages_reserved;
        while (engine.pages_reserved + more > engine.params.kv_pages) {
            const victim = youngest(engine);
            preempt(engine, victim);
            if (victim == sequence) break;
        }
        if (sequence.state != .active) continue;
        engine.pages_reserved += more;
        sequence.pages_reserved = need;
    }
}

fn youngest(engine: *Engine) *Sequence {
    var pick: ?*Sequence = null;
    for (engine.sequences) |*s| {
        if (s.state == .active and (pick == null or s.id > pick.?.id)) pick = s;
    }
    return pick.?;
}

/// Back to waiting with its tokens, its sampling state and its place in line; nothing computed.
fn preempt(engine: *Engine, sequence: *Sequence) void {
    engine.releasePages(sequence, engine.slotOf(sequence));
    engine.pages_reserved -= sequence.pages_reserved;
    sequence.pages_reserved = 0;
    sequence.pages_used = 0;
    sequence.pages_offered = 0;
    sequence.computed = 0;
    sequence.state = .waiting;
    engine.preemptions += 1;
}
