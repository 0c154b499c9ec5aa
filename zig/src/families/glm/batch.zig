//! One forward's rows, as the engine plans them: tokens of many sequences (prompt chunks and
//! generated rows), each with its position and its sequence's page table.
pub const Batch = struct {
    tokens: []const u32,
    positions: []const u32,
    /// Each row's sequence page table (position p lives in page page_tables[r][p / page_tokens]).
    page_tables: []const []const u32,
    /// Rows whose logits are wanted, in output order.
    logits_rows: []const u32,
    /// Which rows are prompt tokens (empty: none). The CPU ignores it; the GPU runs prompt rows
    /// through its tensor-core prompt kernels and generated rows through the GEMV.
    prompt: []const bool = &.{},
    /// Each row's sequence slot: where a model with recurrent state (KDA) keeps that sequence's.
    /// Rows of one sequence come together, positions ascending.
    sequences: []const u32 = &.{},

    pub fn rows(batch: *const Batch) usize {
        return batch.tokens.len;
    }
};
