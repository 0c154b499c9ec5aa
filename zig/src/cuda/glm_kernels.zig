//! The host half of zig/kernels/cuda/glm_forward.cu: one typed launch per kernel, each giving its
//! grid and block and why. Every launch goes on the GPU's stream; nothing here synchronizes.
const std = @import("std");
const gpu_mod = @import("gpu.zig");
const kernels = @import("kernels.zig");
const driver = @import("driver.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const KvDtype = @import("../core/kv_store.zig").KvDtype;
const Gpu = gpu_mod.Gpu;
const Ptr = gpu_mod.DevicePtr;
const Error = gpu_mod.Error;
const dense = @import("dense_kernels.zig");

pub const Module = gpu_mod.Module(&.{
    "tf_embed",                  "tf_rmsnorm",              "tf_add",                     "tf_swiglu",                  "tf_gather_rows",
    "tf_exl3_item_linear",       "tf_exl3_group_linear",    "tf_exl3_group_items",        "tf_dense_matmul",            "tf_qk_rope_store",
    "tf_attention",              "tf_route",                "tf_moe_combine",             "tf_logits_summary",          "tf_attention_combine",
    "tf_attention_prompt",       "tf_logits_summary_parts", "tf_dense_half",              "tf_dense_f32",               "tf_dense_splits",
    "tf_attention_prompt_f16",   "tf_attention_prompt_fp8", "tf_attention_heads_128_f16", "tf_attention_heads_128_fp8", "tf_attention_heads_64_f16",
    "tf_attention_heads_64_fp8", "tf_exl3_parts_linear",    "tf_exl3_group_linear8",      "tf_route_logits",            "tf_exl3_shared_item_linear",
    "tf_exl3_group_linear4",     "tf_exl3_parts_linear4",   "tf_route_logits_tiles",
});

/// tf_attention's dynamic shared memory (kAttentionSharedBytes in glm_forward.cu): two stages of
/// 32 positions of K and V, and 12 queries, rows of 132 floats.
pub const attention_shared_bytes = (2 * 2 * 32 + 12) * 132 * 4;
comptime {
    std.debug.assert(attention_shared_bytes == 73920); // static_assert'ed in glm_forward.cu too
}

/// tf_attention_prompt's (kPromptAttentionSharedBytes in attention_prompt.cuh): K and V as f16
/// high/low planes of 32 rows of 136 halves, and the next 32 positions' f32 K and V.
pub const prompt_attention_shared_bytes = 2 * 2 * 32 * 136 * 2 + 2 * 32 * 128 * 4;
comptime {
    std.debug.assert(prompt_attention_shared_bytes == 67584);
}

/// tf_attention_heads_*'s (HeadsTile<D, dtype>::kSharedBytes in attention_heads.cuh): per warp of
/// 4, stages of a 16-position chunk's K and V rows as stored, each padded by 16 bytes; f16 keeps two
/// chunks in flight, fp8 (rows half as long) three.
pub fn headsAttentionSharedBytes(comptime head_dim: usize, comptime dtype: KvDtype) u32 {
    const row_bytes = head_dim * dtype.bytes();
    const stages: usize = if (dtype == .f16) 2 else 3;
    return @intCast(4 * stages * 2 * 16 * (row_bytes + 16));
}
comptime {
    std.debug.assert(headsAttentionSharedBytes(128, .f16) == 69632); // static_assert'ed in attention_heads.cuh too
    std.debug.assert(headsAttentionSharedBytes(64, .f16) == 36864);
    std.debug.assert(headsAttentionSharedBytes(128, .fp8) == 55296);
    std.debug.assert(headsAttentionSharedBytes(64, .fp8) == 30720);
}

pub fn load(gpu: *const Gpu, diag: *Diagnostic) Error!Module {
    var module = try Module.load(gpu, kernels.glm_forward, "glm_forward", diag);
    errdefer module.unload(gpu);
    const attribute = driver.function_attribute_max_dynamic_shared_bytes;
    try gpu.driver.check(gpu.driver.api.cuFuncSetAttribute(module.function("tf_attention"), attribute, attention_shared_bytes), "cuFuncSetAttribute(tf_attention shared memory)", diag);
    inline for (.{ "tf_attention_prompt", "tf_attention_prompt_f16", "tf_attention_prompt_fp8" }) |name|
        try gpu.driver.check(gpu.driver.api.cuFuncSetAttribute(module.function(name), attribute, prompt_attention_shared_bytes), "cuFuncSetAttribute(tf_attention_prompt shared memory)", diag);
    inline for (.{ 128, 64 }) |dim| inline for (.{ KvDtype.f16, KvDtype.fp8 }) |dtype| {
        const name = std.fmt.comptimePrint("tf_attention_heads_{d}_{s}", .{ dim, @tagName(dtype) });
        try gpu.driver.check(gpu.driver.api.cuFuncSetAttribute(module.function(name), attribute, @intCast(headsAttentionSharedBytes(dim, dtype))), "cuFuncSetAttribute(tf_attention_heads shared memory)", diag);
    };
    return module;
}

/// Device twin of `struct Exl3Layer` in glm_forward.cu.
pub const Exl3Layer = extern struct {
    words: Ptr,
    suh: Ptr,
    svh: Ptr,
    bias: Ptr, // 0 = none
};

comptime {
    std.debug.assert(@sizeOf(Exl3Layer) == 32);
}

const gemv_splits = @import("gemv_splits.zig");
pub const tiles_per_split = gemv_splits.tiles_per_split;
pub const splitTiles = gemv_splits.splitTiles;
pub const splitsFor = gemv_splits.splitsFor;
pub const splitsMax = gemv_splits.splitsMax;

/// Completion counters tf_exl3_item_linear needs for `items` items of n_p columns: one per (item, 128
/// columns). Zero when allocated; each launch leaves them zero.
pub fn countersFor(items: usize, n_p: usize) usize {
    return items * (n_p / 128);
}

/// One EXL3 table entry's bytes, its trellis (8·bits2 words per 16x16 tile) and both f16 sign
/// vectors: what the GEMV's and the prompt kernels' launches state they read per entry (timeline).
pub fn exl3EntryBytes(k_p: usize, n_p: usize, bits2: u8) u64 {
    return (k_p / 16) * (n_p / 16) * 16 * @as(u64, bits2) + 2 * (k_p + n_p);
}

/// Items per group on the grouped path (kGroupRows in glm_forward.cu): one decoded tile serves up
/// to this many items of the same layer.
pub const group_rows = 16;
/// The rows of tf_exl3_group_linear8's groups, for plain layers of that many rows or fewer.
pub const group_rows_narrow = 8;
/// The rows of tf_exl3_group_linear4's groups (kSharedRun in glm_forward.cu).
pub const group_rows_together = 4;
/// The grouping kernel's bound on table entries (its shared counters: kGroupLayersMax).
pub const group_layers_max = 1024;

/// Groups the grouped path can form from `items` items over `layers` table entries.
pub fn groupsMax(items: usize, layers: usize) usize {
    return (std.math.divCeil(usize, items, group_rows) catch unreachable) + layers;
}

/// Device scratch of the grouped path, sized for the largest call.
pub const Grouping = struct {
    ranks: Ptr, // i32[items]
    sorted: Ptr, // i32[items]
    first: Ptr, // i32[groups]
    count: Ptr, // i32[groups]
    layer: Ptr, // i32[groups]
    total: Ptr, // i32[1]
};

/// The experts' outputs before their combine: Kernels.moeCombine's inputs.
pub const MoeCombine = struct { expert_out: Ptr, weights: Ptr, shared: Ptr, slots: usize };

pub const Kernels = struct {
    gpu: *const Gpu,
    module: *const Module,
    diag: *Diagnostic,

    pub fn run(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, args: anytype) Error!void {
        return k.runShared(name, grid, block, 0, args);
    }

    /// `run` with dynamic shared memory (its maximum set in `load`).
    fn runShared(k: Kernels, comptime name: []const u8, grid: [3]u32, block: u32, shared_bytes: u32, args: anytype) Error!void {
        try gpu_mod.launch(k.gpu, k.module.function(name), .{ .grid = grid, .block = .{ block, 1, 1 }, .shared_bytes = shared_bytes }, args, "launch " ++ name, k.diag);
    }

    pub fn blocks(count: usize, per_block: usize) u32 {
        return @intCast(std.math.divCeil(usize, @max(count, 1), per_block) catch unreachable);
    }

    /// The embedding table's dtype as stored on the device (tf_embed's kEmbed*).
    pub const EmbedDtype = enum(c_int) { f32 = 0, f16 = 1, bf16 = 2 };

    pub fn embed(k: Kernels, tokens: Ptr, table: Ptr, dtype: EmbedDtype, out: Ptr, rows: usize, hidden: usize) Error!void {
        var a = .{ tokens, table, @backingInt(dtype), out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(hidden)) };
        try k.run("tf_embed", .{ @intCast(rows), blocks(hidden, 256), 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5] });
    }

    /// 256 threads per row: the kernel's 8-warp reduction assumes exactly that.
    pub fn rmsnorm(k: Kernels, x: Ptr, weight: Ptr, out: Ptr, rows: usize, width: usize, eps: f32) Error!void {
        return k.addRmsnorm(x, 0, weight, out, rows, width, eps);
    }

    /// x += delta, then out = rmsnorm(x): the residual add and the next norm in one launch.
    pub fn addRmsnorm(k: Kernels, x: Ptr, delta: Ptr, weight: Ptr, out: Ptr, rows: usize, width: usize, eps: f32) Error!void {
        std.debug.assert(delta == 0 or out != x);
        var a = .{ x, delta, weight, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(width)), eps };
        try k.run("tf_rmsnorm", .{ @intCast(rows), 1, 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6] });
    }

    pub fn add(k: Kernels, target: Ptr, source: Ptr, count: usize) Error!void {
        var a = .{ target, source, @as(c_int, @intCast(count)) };
        try k.run("tf_add", .{ blocks(count, 256), 1, 1 }, 256, .{ &a[0], &a[1], &a[2] });
    }

    pub fn swiglu(k: Kernels, gate: Ptr, up: Ptr, count: usize) Error!void {
        var a = .{ gate, up, @as(c_int, @intCast(count)) };
        try k.run("tf_swiglu", .{ blocks(count, 256), 1, 1 }, 256, .{ &a[0], &a[1], &a[2] });
    }

    pub fn gatherRows(k: Kernels, x: Ptr, rows_wanted: Ptr, out: Ptr, count: usize, width: usize) Error!void {
        var a = .{ x, rows_wanted, out, @as(c_int, @intCast(count)), @as(c_int, @intCast(width)) };
        try k.run("tf_gather_rows", .{ @intCast(count), 1, 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3], &a[4] });
    }

    pub const Exl3Call = struct {
        x: Ptr,
        up: Ptr = 0, // non-zero: the input is silu(x) · up
        source_rows: Ptr = 0, // 0: item i reads row i % group_items
        layer_of_item: Ptr = 0, // 0: item i uses table entry i / group_items
        group_items: usize = 0, // 0: items (every item entry 0, row i)
        table: Ptr, // Exl3Layer[]
        acc: Ptr, // scratch (splitsFor(k_p, n_p, entries), items, n_p) partial sums
        counters: Ptr, // countersFor(items, n_p) zeroed u32
        y: Ptr, // (items, out_features)
        items: usize,
        in_features: usize,
        out_features: usize,
        k_p: usize,
        n_p: usize,
        bits2: u8,
        codebook: u8,
        /// Table entries the items may name (0: items / group_items, the plain layers).
        layers: usize = 0,
        /// The table entries the k split follows (gemv_splits) when not `layers`: a shared expert
        /// run apart takes its merged table's splits, so both forms sum alike (0: `layers`).
        split_entries: usize = 0,
        /// With scratch: the grouped path (items sorted by layer, groups of up to 16 sharing each
        /// decoded tile) when there are at least 4 items per layer. Its results equal the item
        /// path's bit for bit.
        grouping: ?Grouping = null,
        /// The most items one table entry may hold (0: one; a decode step's routed experts: its
        /// rows, each picking an expert once). From 2, the item path's items of one entry share
        /// each decoded tile in runs of 4 (tf_exl3_shared_item_linear: the same bits).
        entry_items_max: usize = 0,
        /// A plain layer's 2 to 4 rows share each decoded tile in one block (tf_exl3_group_linear4,
        /// six blocks an SM as one row's kernel; the same bits), where the item path decoded a
        /// tile per row and 4 rows took the 8-row form's four blocks an SM.
        rows_together: bool = false,

        fn plainTogether(c: Exl3Call, group_items: usize) bool {
            return c.rows_together and c.layer_of_item == 0 and group_items >= 2 and group_items <= group_rows_together;
        }

        /// The entries the k split follows for a call over `layers` table entries.
        fn splitEntries(c: Exl3Call, layers: usize) usize {
            return if (c.split_entries != 0) c.split_entries else layers;
        }
    };

    /// One launch: a 256-thread block per (128 output columns, k split, item); or, grouped, the
    /// grouping launch and one block per (128 columns, k split, group).
    pub fn exl3Linear(k: Kernels, c: Exl3Call) Error!void {
        std.debug.assert(c.k_p % 128 == 0 and c.n_p % 128 == 0 and c.acc % 16 == 0); // the last block reads the partials as float4
        const group_items = if (c.group_items == 0) c.items else c.group_items;
        const layers = if (c.layers != 0) c.layers else std.math.divCeil(usize, c.items, group_items) catch unreachable;
        // Grouping pays when a layer's items are several on average: one decoded tile then
        // serves them all; with about one item per layer (decode over many experts) the item path
        // is faster (tf-bench: 16 rows over 128 experts took 1.9 ms grouped, 1.2 ms by item).
        if (c.grouping) |g| if (layers <= group_layers_max and (c.items >= 4 * layers or c.plainTogether(group_items))) return k.exl3GroupLinear(c, g, group_items, layers);
        k.gpu.noteReads(@min(c.items, layers) * exl3EntryBytes(c.k_p, c.n_p, c.bits2));
        const split_entries = c.splitEntries(layers);
        const split_tiles = splitTiles(c.k_p, c.n_p, split_entries);
        var a = .{
            c.x,                               c.up,                                                                     c.source_rows,                       c.layer_of_item,
            c.table,                           c.acc,                                                                    c.counters,                          c.y,
            @as(c_int, @intCast(c.items)),     @as(c_int, @intCast(if (c.group_items == 0) c.items else c.group_items)), @as(c_int, @intCast(c.in_features)), @as(c_int, @intCast(c.out_features)),
            @as(c_int, @intCast(c.k_p)),       @as(c_int, @intCast(c.n_p)),                                              @as(c_int, c.bits2),                 @as(c_int, c.codebook),
            @as(c_int, @intCast(split_tiles)),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const grid: [3]u32 = .{ @intCast(c.n_p / 128), @intCast(splitsFor(c.k_p, c.n_p, split_entries)), @intCast(c.items) };
        if (c.entry_items_max >= 2 and c.layer_of_item != 0) return k.run("tf_exl3_shared_item_linear", grid, 256, ptrs);
        try k.run("tf_exl3_item_linear", grid, 256, ptrs);
    }

    /// Sorts `items` items by table entry (layer_of_item, or i / group_items when 0; entries of -1
    /// are left out) into groups of at most `group_size` of one entry: one block of eight warps.
    pub fn groupItems(k: Kernels, layer_of_item: Ptr, items: usize, group_items: usize, layers: usize, group_size: usize, g: Grouping) Error!void {
        std.debug.assert(layers <= group_layers_max);
        var sort = .{
            layer_of_item,                    @as(c_int, @intCast(items)), @as(c_int, @intCast(group_items)), @as(c_int, @intCast(layers)),
            @as(c_int, @intCast(group_size)), g.ranks,                     g.sorted,                          g.first,
            g.count,                          g.layer,                     g.total,
        };
        var sort_ptrs: [sort.len]*anyopaque = undefined;
        inline for (0..sort.len) |i| sort_ptrs[i] = @ptrCast(&sort[i]);
        try k.run("tf_exl3_group_items", .{ 1, 1, 1 }, 256, sort_ptrs);
    }

    fn exl3GroupLinear(k: Kernels, c: Exl3Call, g: Grouping, group_items: usize, layers: usize) Error!void {
        const split_entries = c.splitEntries(layers);
        const items: c_int = @intCast(c.items);
        const group_items_c: c_int = @intCast(group_items);
        // Plain layers' groups are known without sorting (tf_exl3_group_linear computes them).
        const sorted = c.layer_of_item != 0;
        if (sorted) try k.groupItems(c.layer_of_item, c.items, group_items, layers, group_rows, g);
        k.gpu.noteReads(@min(c.items, layers) * exl3EntryBytes(c.k_p, c.n_p, c.bits2));
        const none: Ptr = 0;
        var a = .{
            c.x,                                                           c.up,                          c.source_rows,                       c.table,
            if (sorted) g.sorted else none,                                if (sorted) g.first else none, if (sorted) g.count else none,       if (sorted) g.layer else none,
            if (sorted) g.total else none,                                 c.acc,                         c.counters,                          c.y,
            items,                                                         group_items_c,                 @as(c_int, @intCast(c.in_features)), @as(c_int, @intCast(c.out_features)),
            @as(c_int, @intCast(c.k_p)),                                   @as(c_int, @intCast(c.n_p)),   @as(c_int, c.bits2),                 @as(c_int, c.codebook),
            @as(c_int, @intCast(splitTiles(c.k_p, c.n_p, split_entries))),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        // Plain layers of at most 8 rows a layer (steps of up to 8 streams) take the one-n8-block
        // form: the same arithmetic per row, so the same bits.
        const grid: [3]u32 = .{ @intCast(c.n_p / 128), @intCast(splitsFor(c.k_p, c.n_p, split_entries)), @intCast(groupsMax(c.items, layers)) };
        if (c.plainTogether(group_items)) return k.run("tf_exl3_group_linear4", grid, 256, ptrs);
        if (!sorted and group_items <= group_rows_narrow) return k.run("tf_exl3_group_linear8", grid, 256, ptrs);
        try k.run("tf_exl3_group_linear", grid, 256, ptrs);
    }

    // The unquantized projections' launches (dense_kernels.zig), called as methods.
    pub const denseLinear = dense.denseLinear;
    pub const denseSplits = dense.denseSplits;
    pub const DenseCall = dense.DenseCall;
    pub const denseScratch = dense.denseScratch;
    pub const denseMma = dense.denseMma;

    /// The rows' places in the paged KV cache of one layer: what the rope/store and the attention
    /// launches share.
    pub const PagedKv = struct {
        cache_k: Ptr,
        cache_v: Ptr,
        /// fp8: the per-position exponents beside the codes (kv_store.cuh); 0 otherwise.
        exp_k: Ptr = 0,
        exp_v: Ptr = 0,
        dtype: KvDtype = .f32,
        positions: Ptr,
        tables: Ptr,
        table_offsets: Ptr,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        layers: usize,
        layer: usize,
        page_tokens: usize,
    };

    pub const RopeStore = struct {
        q: Ptr,
        k: Ptr,
        v: Ptr,
        q_norm: Ptr,
        k_norm: Ptr,
        cos_sin: Ptr,
        rotary_dim: usize,
        eps: f32,
    };

    pub fn qkRopeStore(k: Kernels, c: RopeStore, kv: PagedKv) Error!void {
        var a = .{
            c.q,                             c.k,                               c.v,                                  c.q_norm,                                    c.k_norm,
            c.cos_sin,                       kv.positions,                      kv.tables,                            kv.table_offsets,                            kv.cache_k,
            kv.cache_v,                      kv.exp_k,                          kv.exp_v,                             @as(c_int, @intCast(@backingInt(kv.dtype))), @as(c_int, @intCast(kv.rows)),
            @as(c_int, @intCast(kv.heads)),  @as(c_int, @intCast(kv.kv_heads)), @as(c_int, @intCast(kv.head_dim)),    @as(c_int, @intCast(c.rotary_dim)),          c.eps,
            @as(c_int, @intCast(kv.layers)), @as(c_int, @intCast(kv.layer)),    @as(c_int, @intCast(kv.page_tokens)),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_qk_rope_store", .{ @intCast(kv.rows), blocks(kv.heads + kv.kv_heads, 8), 1 }, 256, ptrs);
    }

    /// Attention's limits on the head (kAttentionPitch in glm_forward.cu).
    pub const attention_head_dim_max = 128;

    /// Splits of a row's positions (kAttentionSplits in glm_forward.cu): fixed, so that a row's
    /// attention depends on its length alone.
    pub const attention_splits = 32;

    /// Device scratch for the partials of attention spread over splits, rows × heads × splits of
    /// (head_dim accumulators, max, sum).
    pub const AttentionParts = struct {
        acc: Ptr,
        ml: Ptr,

        pub fn floats(rows: usize, heads: usize, head_dim: usize) struct { acc: usize, ml: usize } {
            return .{ .acc = rows * heads * attention_splits * head_dim, .ml = rows * heads * attention_splits * 2 };
        }

        pub fn alloc(gpu: *Gpu, rows: usize, heads: usize, head_dim: usize, diag: *Diagnostic) Error!AttentionParts {
            const n = floats(rows, heads, head_dim);
            const acc = try gpu.alloc(@max(n.acc, 1) * 4, diag);
            errdefer gpu.free(acc);
            return .{ .acc = acc, .ml = try gpu.alloc(@max(n.ml, 1) * 4, diag) };
        }

        pub fn free(parts: AttentionParts, gpu: *Gpu) void {
            gpu.free(parts.acc);
            gpu.free(parts.ml);
        }
    };

    /// out = attention of q over the cache, a warp per query head of a KV head's group (in rounds of
    /// up to 12: GLM-4.5's groups).
    /// With `parts`, a block per (row, KV head, split) and a fold of the splits after it: a decode
    /// step's few rows fill the GPU. Without, a block per (row, KV head) runs and folds every split
    /// itself. Both give the same bits (tf_attention in glm_forward.cu). Rows with a non-zero i32 in
    /// `skip` (0: none) are left to attentionPrompt.
    pub fn attention(k: Kernels, q: Ptr, out: Ptr, kv: PagedKv, parts: ?AttentionParts, skip: Ptr) Error!void {
        std.debug.assert(kv.head_dim <= attention_head_dim_max and kv.head_dim % 4 == 0);
        const p = parts orelse AttentionParts{ .acc = 0, .ml = 0 };
        if (kv.dtype != .f32) return k.attentionHeads(q, out, kv, p, parts != null, skip);
        var a = .{
            q,                                    kv.cache_k,                        kv.cache_v,                      kv.positions,
            kv.tables,                            kv.table_offsets,                  skip,                            out,
            p.acc,                                p.ml,                              @as(c_int, @intCast(kv.rows)),   @as(c_int, @intCast(kv.heads)),
            @as(c_int, @intCast(kv.kv_heads)),    @as(c_int, @intCast(kv.head_dim)), @as(c_int, @intCast(kv.layers)), @as(c_int, @intCast(kv.layer)),
            @as(c_int, @intCast(kv.page_tokens)),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const warps: u32 = @intCast(@min(kv.heads / kv.kv_heads, 12));
        const splits: u32 = if (parts == null) 1 else attention_splits;
        try k.runShared("tf_attention", .{ @intCast(kv.rows * kv.kv_heads), splits, 1 }, 32 * warps, attention_shared_bytes, ptrs);
        if (parts == null) return;
        var c = .{ p.acc, p.ml, kv.positions, skip, out, @as(c_int, @intCast(kv.rows)), @as(c_int, @intCast(kv.heads)), @as(c_int, @intCast(kv.head_dim)) };
        var cptrs: [c.len]*anyopaque = undefined;
        inline for (0..c.len) |i| cptrs[i] = @ptrCast(&c[i]);
        try k.run("tf_attention_combine", .{ @intCast(kv.rows * kv.heads), 1, 1 }, 128, cptrs);
    }

    /// The head sizes tf_attention_heads_* is built for (an f16 or fp8 cache needs one of them).
    pub fn headsAttentionTakes(head_dim: usize) bool {
        return head_dim == 64 or head_dim == 128;
    }

    /// attention() over an f16 or fp8 cache: a block per (row, KV head, split or all, 16 heads of
    /// the group), its query heads the m of tensor-core products (attention_heads.cuh); the same
    /// splits, partials and combine as tf_attention.
    fn attentionHeads(k: Kernels, q: Ptr, out: Ptr, kv: PagedKv, p: AttentionParts, spread: bool, skip: Ptr) Error!void {
        std.debug.assert(headsAttentionTakes(kv.head_dim));
        var a = .{
            q,                              kv.cache_k,                           kv.cache_v,                        kv.exp_k,
            kv.exp_v,                       kv.positions,                         kv.tables,                         kv.table_offsets,
            skip,                           out,                                  p.acc,                             p.ml,
            @as(c_int, @intCast(kv.rows)),  @as(c_int, @intCast(kv.heads)),       @as(c_int, @intCast(kv.kv_heads)), @as(c_int, @intCast(kv.layers)),
            @as(c_int, @intCast(kv.layer)), @as(c_int, @intCast(kv.page_tokens)),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const chunks = std.math.divCeil(usize, kv.heads / kv.kv_heads, 16) catch unreachable;
        const splits: u32 = if (spread) attention_splits else 1;
        const grid: [3]u32 = .{ @intCast(kv.rows * kv.kv_heads), splits, @intCast(chunks) };
        switch (kv.dtype) {
            inline .f16, .fp8 => |d| switch (kv.head_dim) {
                inline 64, 128 => |dim| try k.runShared(std.fmt.comptimePrint("tf_attention_heads_{d}_{s}", .{ dim, @tagName(d) }), grid, 128, headsAttentionSharedBytes(dim, d), ptrs),
                else => unreachable,
            },
            .f32 => unreachable,
        }
        if (!spread) return;
        var c = .{ p.acc, p.ml, kv.positions, skip, out, @as(c_int, @intCast(kv.rows)), @as(c_int, @intCast(kv.heads)), @as(c_int, @intCast(kv.head_dim)) };
        var cptrs: [c.len]*anyopaque = undefined;
        inline for (0..c.len) |i| cptrs[i] = @ptrCast(&c[i]);
        try k.run("tf_attention_combine", .{ @intCast(kv.rows * kv.heads), 1, 1 }, 128, cptrs);
    }

    /// The prompt attention's head size and tile (tf_attention_prompt, attention_prompt.cuh).
    pub const prompt_attention_head_dim = 128;
    pub const prompt_attention_rows = 16;

    /// Tiles of up to 16 prompt rows of one sequence at consecutive positions, as the i32 table
    /// tf_attention_prompt reads: the count, then (first row, rows) per tile.
    pub const AttentionTiles = struct {
        table: []i32,
        count: usize = 0,
        open_first_page: u32 = 0,
        open_position: u32 = 0,

        pub fn init(table: []i32) AttentionTiles {
            table[0] = 0;
            return .{ .table = table };
        }

        pub fn add(tiles: *AttentionTiles, row: usize, position: u32, first_page: u32) void {
            const open = tiles.count > 0 and tiles.table[2 * tiles.count] < prompt_attention_rows and
                first_page == tiles.open_first_page and position == tiles.open_position + 1 and
                @as(usize, @intCast(tiles.table[2 * tiles.count - 1] + tiles.table[2 * tiles.count])) == row;
            if (open) {
                tiles.table[2 * tiles.count] += 1;
            } else {
                tiles.count += 1;
                tiles.table[2 * tiles.count - 1] = @intCast(row);
                tiles.table[2 * tiles.count] = 1;
            }
            tiles.table[0] = @intCast(tiles.count);
            tiles.open_first_page = first_page;
            tiles.open_position = position;
        }
    };

    /// Attention of the rows in `tiles` on tensor cores: a block per (tile, KV head, 4 query heads
    /// of its group). `grid_tiles` >= the table's count (blocks past it return): a recorded graph
    /// keeps its grid while the count changes.
    pub fn attentionPrompt(k: Kernels, q: Ptr, out: Ptr, kv: PagedKv, tiles: Ptr, grid_tiles: usize) Error!void {
        std.debug.assert(kv.head_dim == prompt_attention_head_dim);
        var a = .{
            q,                               kv.cache_k,                     kv.cache_v,                           kv.exp_k,
            kv.exp_v,                        kv.positions,                   kv.tables,                            kv.table_offsets,
            tiles,                           out,                            @as(c_int, @intCast(kv.heads)),       @as(c_int, @intCast(kv.kv_heads)),
            @as(c_int, @intCast(kv.layers)), @as(c_int, @intCast(kv.layer)), @as(c_int, @intCast(kv.page_tokens)),
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        const group = kv.heads / kv.kv_heads;
        const warps: usize = @min(group, 4);
        const chunks = std.math.divCeil(usize, group, warps) catch unreachable;
        const grid: [3]u32 = .{ @intCast(@max(grid_tiles, 1)), @intCast(kv.kv_heads * chunks), 1 };
        switch (kv.dtype) {
            .f32 => try k.runShared("tf_attention_prompt", grid, @intCast(32 * warps), prompt_attention_shared_bytes, ptrs),
            inline .f16, .fp8 => |d| try k.runShared("tf_attention_prompt_" ++ @tagName(d), grid, @intCast(32 * warps), prompt_attention_shared_bytes, ptrs),
        }
    }

    pub const Route = struct {
        x: Ptr,
        gate: Ptr,
        correction: Ptr,
        experts_out: Ptr,
        weights_out: Ptr,
        pair_layers: Ptr,
        pair_rows: Ptr,
        /// With prompt_layers: i32 per row, non-zero for the rows the prompt kernels take.
        row_prompt: Ptr = 0,
        /// 0, or i32 per item: the prompt rows' experts (-1 for the other rows).
        prompt_layers: Ptr = 0,
        scratch: Ptr,
        /// A zeroed u32 per row, left zeroed (the rows' completion counters).
        counters: Ptr,
        rows: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        /// Per row in the outputs: top_k, or top_k + 1 with a merged shared expert last.
        slots: usize,
        groups: usize,
        groups_per_token: usize,
        normalize: bool,
        scaling: f32,
    };

    /// Logits over the whole GPU (a warp per (row, expert), 8 per block), then the selection (a
    /// 256-thread block per row).
    /// Experts a router may have: tf_route's shared arrays (kRouteExpertsMax in moe_route.cuh).
    pub const route_experts_max = 512;

    /// Rows from which the router's logits take their own launch (route_logits.cuh): a prompt
    /// chunk's. Fewer (decode steps) keep the one launch.
    pub const route_logits_rows_min = 16;
    /// tf_route_logits_tiles: a block per 16 rows and 16 experts (kRouteTile* in route_logits.cuh),
    /// for hidden sizes it steps through 128 floats at a time; tf_route_logits otherwise.
    const route_tile = 16;
    const route_tile_hidden = 128;

    /// One launch: a block per (8 experts, row) for the logits, the last of a row's blocks choosing;
    /// for many rows, the logits launch and then a block a row choosing. The same bits either way.
    pub fn route(k: Kernels, c: Route) Error!void {
        std.debug.assert(c.experts <= route_experts_max);
        const apart = c.rows >= route_logits_rows_min;
        if (apart) {
            var l = .{ c.x, c.gate, c.correction, c.scratch, @as(c_int, @intCast(c.rows)), @as(c_int, @intCast(c.hidden)), @as(c_int, @intCast(c.experts)) };
            const args = .{ &l[0], &l[1], &l[2], &l[3], &l[4], &l[5], &l[6] };
            if (c.hidden % route_tile_hidden == 0) {
                try k.run("tf_route_logits_tiles", .{ blocks(c.experts, route_tile), blocks(c.rows, route_tile), 1 }, 256, args);
            } else {
                try k.run("tf_route_logits", .{ blocks(c.experts, 8), blocks(c.rows, 8), 1 }, 256, args);
            }
        }
        const gate: Ptr = if (apart) 0 else c.gate;
        var a = .{
            c.x,                            gate,                                     c.correction,                          c.scratch,
            c.counters,                     c.experts_out,                            c.weights_out,                         c.pair_layers,
            c.pair_rows,                    c.row_prompt,                             c.prompt_layers,                       @as(c_int, @intCast(c.rows)),
            @as(c_int, @intCast(c.hidden)), @as(c_int, @intCast(c.experts)),          @as(c_int, @intCast(c.top_k)),         @as(c_int, @intCast(c.slots)),
            @as(c_int, @intCast(c.groups)), @as(c_int, @intCast(c.groups_per_token)), @as(c_int, @intFromBool(c.normalize)), c.scaling,
        };
        var ptrs: [a.len]*anyopaque = undefined;
        inline for (0..a.len) |i| ptrs[i] = @ptrCast(&a[i]);
        try k.run("tf_route", .{ if (apart) 1 else blocks(c.experts, 8), @intCast(c.rows), 1 }, 256, ptrs);
    }

    /// Slices a logits row is summarized in (kSummarySlices in logits_summary.cuh).
    pub const summary_slices = 32;

    /// A 256-thread block per (row, slice), then a warp per row folding the slices. `out` is
    /// core.LogitsSummary[rows * (1 + summary_slices)]: the rows' summaries, then the slices'.
    pub fn logitsSummary(k: Kernels, logits: Ptr, out: Ptr, rows: usize, vocab: usize) Error!void {
        const parts = out + rows * 16;
        var a = .{ logits, parts, @as(c_int, @intCast(rows)), @as(c_int, @intCast(vocab)) };
        try k.run("tf_logits_summary_parts", .{ @intCast(rows * summary_slices), 1, 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3] });
        var b = .{ parts, out, @as(c_int, @intCast(rows)) };
        try k.run("tf_logits_summary", .{ blocks(rows, 8), 1, 1 }, 256, .{ &b[0], &b[1], &b[2] });
    }

    pub fn moeCombine(k: Kernels, expert_out: Ptr, weights: Ptr, shared: Ptr, out: Ptr, rows: usize, top_k: usize, hidden: usize) Error!void {
        var a = .{ expert_out, weights, shared, out, @as(c_int, @intCast(rows)), @as(c_int, @intCast(top_k)), @as(c_int, @intCast(hidden)) };
        try k.run("tf_moe_combine", .{ blocks(rows * hidden, 256), 1, 1 }, 256, .{ &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6] });
    }
};

test "prompt rows tile by sequence, consecutive position and 16 rows" {
    var table: [1 + 2 * 40]i32 = undefined;
    var tiles = Kernels.AttentionTiles.init(&table);
    // Rows 0..19: sequence A (first page 7) at positions 0..19; rows 20..22: sequence B at 5..7;
    // row 23: sequence B at 9 (a gap); row 24 (not a prompt row) is left out; row 25: B at 10.
    for (0..20) |r| tiles.add(r, @intCast(r), 7);
    for (20..23) |r| tiles.add(r, @intCast(r - 15), 3);
    tiles.add(23, 9, 3);
    tiles.add(25, 10, 3);
    try std.testing.expectEqualSlices(i32, &.{ 5, 0, 16, 16, 4, 20, 3, 23, 1, 25, 1 }, table[0..11]);
    try std.testing.expectEqual(5, tiles.count);
}
