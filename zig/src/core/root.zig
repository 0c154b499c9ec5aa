//! Model-agnostic pieces: dtypes, memory-mapped safetensors (single file or shards), config.json.
pub const dtype = @import("dtype.zig");
pub const DType = dtype.DType;
pub const Diagnostic = @import("diagnostic.zig").Diagnostic;
pub const MappedFile = @import("mapped_file.zig").MappedFile;
pub const safetensors = @import("safetensors.zig");
pub const checkpoint = @import("checkpoint.zig");
pub const Checkpoint = checkpoint.Checkpoint;
pub const config = @import("config.zig");
pub const parallel = @import("parallel.zig");
pub const LogitsSummary = @import("logits_summary.zig").LogitsSummary;
pub const switches = @import("switches.zig");
pub const fp8 = @import("fp8.zig");
pub const kv_store = @import("kv_store.zig");
pub const KvDtype = kv_store.KvDtype;
pub const KvStore = kv_store.KvStore;

test {
    _ = dtype;
    _ = @import("diagnostic.zig");
    _ = safetensors;
    _ = @import("checkpoint.zig");
    _ = config;
    _ = parallel;
    _ = @import("logits_summary.zig");
    _ = @import("once.zig");
    _ = fp8;
    _ = kv_store;
    _ = @import("contract/registry.zig");
}
