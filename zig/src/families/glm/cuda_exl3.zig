//! The class-A forward on the GPU: the same steps as forward_cpu.zig, on weights uploaded once from
//! the checked host `Weights`, with the KV cache in device memory. Kernels: glm_forward.cu through
//! cuda/glm_kernels.zig. Generated rows take the GEMV: experts on the grouped path, every (row,
//! selected expert) pair one item of the EXL3 kernels reading that expert's trellis in place through
//! a pointer table, the shared expert merged in as the last slot when it matches the experts.
//!
//! Prompt rows take the tensor-core prompt kernels (cuda/exl3_prompt.zig) for every EXL3 linear they
//! can (experts, shared and dense MLPs, attention projections), every decoded tile serving up to 64
//! rows; generated rows always take the GEMV, so a row's numbers never depend on its batch. The same
//! split for attention: prompt rows in tiles of one sequence on tensor cores (tf_attention_prompt),
//! generated rows in splits of their context spread over the GPU (tf_attention, flash-decoding).
//!
//! f32 arithmetic, the trellis decoded per item. Forwards of few rows (decode steps) are recorded
//! once per (rows, logits rows, which paths run) as a CUDA graph and replayed: a GLM-4.5-Air
//! step is ~1800 launches, whose host cost and gaps a replay removes. A greedy row crosses to the
//! host as its logits summary, a row sampled with temperature/top-k/top-p/min-p as the token the
//! GPU drew (cuda/sampling.zig); other rows' logits are copied back for the host sampler.
const std = @import("std");
const core = @import("../../core/root.zig");
const cuda = @import("../../cuda/root.zig");
const exl3 = @import("../../exl3/root.zig");
const weights_mod = @import("weights.zig");
const rope = @import("rope.zig");
const forward_cpu = @import("forward_cpu.zig");
const Mlp = @import("parts/mlp.zig").Mlp;
const Moe = @import("parts/moe.zig").Moe;
const Config = @import("config.zig").Config;
const Linear = @import("linear.zig").Linear;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;

pub const Error = cuda.gpu.Error || error{UnsupportedModel};

const GpuLinear = struct {
    in_features: usize,
    out_features: usize,
    kind: union(enum) {
        /// prompt: the prompt kernels take this weight (for a prompt step's prompt rows).
        exl3: struct { table: Ptr, entry: K.Exl3Layer, k_p: usize, n_p: usize, bits2: u8, codebook: u8, prompt: bool },
        dense: struct { weight: Ptr, bias: Ptr },
    },
};

/// One projection of all experts: a table of Exl3Layer, one per expert, sharing shape and rate.
const GroupedLinear = struct { table: Ptr, in_features: usize, out_features: usize, k_p: usize, n_p: usize, bits2: u8, codebook: u8 };

/// `pair`: a two-entry table (gate, up) when both are EXL3 of one shape, rate and codebook, so that
/// one launch runs both; 0 otherwise. `prompt`: the prompt kernels take the whole MLP.
const GpuMlp = struct { gate: GpuLinear, up: GpuLinear, down: GpuLinear, pair: Ptr, prompt: bool = false };

const GpuBlock = struct {
    input_norm: Ptr,
    post_attention_norm: Ptr,
    q: GpuLinear,
    k: GpuLinear,
    v: GpuLinear,
    o: GpuLinear,
    /// A two-entry table (k, v) when both are EXL3 of one shape (pairTable): one launch runs both,
    /// their outputs one after the other in model.k. 0 otherwise.
    kv_pair: Ptr = 0,
    q_norm: Ptr,
    k_norm: Ptr,
    ffn: union(enum) {
        dense: GpuMlp,
        moe: struct {
            router: Ptr,
            correction: Ptr,
            gate: GroupedLinear,
            up: GroupedLinear,
            down: GroupedLinear,
            /// The shared expert on its own launches; null when there is none or when it is merged.
            shared: ?GpuMlp,
            /// The shared expert rides in the routed launches as entry `routed_experts` of every
            /// table, the last slot of each row with weight 1 (sharedMerges).
            merged: bool = false,
            /// The prompt kernels take this layer's experts.
            prompt: bool = false,
        },
    },
};

pub const Limits = struct {
    /// Which GPU of this machine (tensor-parallel ranks on one host use one each).
    device: u32 = 0,
    rows_max: usize,
    logits_rows_max: usize,
    context_max: usize,
    pages: usize,
    page_tokens: usize,
    pages_per_sequence: usize,
    /// Replay recorded forwards of up to `graph_rows_max` rows (TF_CUDA_GRAPHS=0 turns it off).
    graphs: bool = true,
};

/// Forwards of at most this many rows are recorded as graphs: decode steps, not prompt chunks,
/// whose row counts rarely repeat.
const graph_rows_max = 64;
/// Steps of up to this many rows spread attention over splits (more rows fill the GPU as they are).
const attention_spread_rows_max = 32;
const graph_slots = 16;

/// A recording is keyed by what changes its launches: rows, logits rows, and which paths run.
const GraphKey = struct { rows: usize, wanted: usize, prompt: bool, decode: bool, tiles: bool, rest: bool };
const GraphSlot = struct { key: GraphKey, graph: cuda.gpu.Graph };
const P = cuda.exl3_prompt;

pub const GpuModel = struct {
    gpa: std.mem.Allocator,
    gpu: cuda.Gpu,
    module: K.Module,
    prompt_module: P.Module,
    sample_module: cuda.sampling.Module,
    /// Expert slots per row: experts_per_token, + 1 when a layer merges its shared expert.
    slots: usize,
    /// The switches (core.switches), read once: prompt kernels and the shared expert's merge.
    prompt_enabled: bool,
    merge_shared: bool,
    sample_jobs: Ptr,
    sample_choices: Ptr,
    config: Config,
    limits: Limits,
    allocations: std.ArrayList(Ptr),
    graphs: [graph_slots]?GraphSlot,
    graph_next: usize,
    graphs_enabled: bool,
    graph_replays: u64,
    /// Prompt rows run through the prompt kernels (each forward's, counted once).
    prompt_rows: u64,
    embed: Ptr,
    blocks: []GpuBlock,
    norm: Ptr,
    lm_head: GpuLinear,
    cache_k: Ptr,
    cache_v: Ptr,
    // Per-forward device buffers, sized by `limits`.
    tokens: Ptr,
    positions: Ptr,
    tables: Ptr,
    table_offsets: Ptr,
    logits_rows: Ptr,
    cos_sin: Ptr,
    hidden: Ptr,
    normed: Ptr,
    q: Ptr,
    /// k's rows, then v's (one pair launch writes both).
    k: Ptr,
    attention_out: Ptr,
    /// Steps of at most `attention_spread_rows` rows (32: partials of 32 rows x 32 splits, 51 MB
    /// for GLM-4.5) run attention a block per split, folded after (the same bits as a block per
    /// row: tf_attention); 0 when TF_CUDA_ATTENTION_SPREAD=0.
    attention_parts: K.Kernels.AttentionParts,
    attention_spread_rows: usize,
    /// Prompt rows' attention on tensor cores (tf_attention_prompt) in tiles of one sequence's
    /// rows; off with TF_CUDA_PROMPT_ATTENTION=0 or a head_dim it does not take. The tile table
    /// and the i32 per row that leaves a tiled row out of tf_attention (host copy: tiles, then
    /// skips); this step's tile count, and whether other rows remain for tf_attention.
    prompt_attention: bool,
    attention_tiles: Ptr,
    attention_skip: Ptr,
    host_attention: []i32,
    step_tiles: usize,
    step_rest: bool,
    projected: Ptr,
    ffn_out: Ptr,
    gate: Ptr,
    items_out: Ptr,
    shared_out: Ptr,
    acc: Ptr,
    counters: Ptr,
    grouping: K.Grouping,
    pair_layers: Ptr,
    pair_rows: Ptr,
    /// The prompt path: scratch (when a layer takes it), i32 per row (1 = prompt row), i32 per
    /// item (the prompt rows' experts), and whether this step has prompt rows.
    prompt_scratch: ?P.Scratch,
    row_tables: Ptr,
    prompt_layers: Ptr,
    step_prompt: bool,
    /// Whether this step has generated rows: a chunk of prompt rows alone skips the GEMV launches
    /// of the linears the prompt kernels take.
    step_decode: bool,
    route_experts: Ptr,
    route_weights: Ptr,
    route_scratch: Ptr,
    logits: Ptr,
    summaries: Ptr,
    // Host staging.
    host_tables: []u32,
    host_offsets: []u32,
    host_cos_sin: []f32,
    host_row_tables: []i32,

    pub fn init(gpa: std.mem.Allocator, weights: *const weights_mod.Weights, limits: Limits, diag: *Diagnostic) Error!*GpuModel {
        const model = try gpa.create(GpuModel);
        errdefer gpa.destroy(model);
        model.* = undefined;
        model.gpa = gpa;
        model.config = weights.config;
        model.limits = limits;
        model.allocations = .empty;
        model.graphs = @splat(null);
        model.graph_next = 0;
        model.graph_replays = 0;
        model.prompt_rows = 0;
        model.graphs_enabled = limits.graphs and !core.switches.off("TF_CUDA_GRAPHS");
        model.prompt_enabled = !core.switches.off("TF_CUDA_PROMPT");
        model.merge_shared = !core.switches.off("TF_CUDA_SHARED_MERGE");
        // A launch's items (2 x rows x slots for the expert gate/up pair) are its grid's z extent.
        model.slots = slotsOf(weights, model.merge_shared);
        const items_max = 2 * limits.rows_max * model.slots;
        if (items_max > 65535) {
            diag.set("rows_max {d} is too large for the CUDA backend: 2 x rows_max x {d} expert slots = {d} exceeds 65535 items per launch", .{ limits.rows_max, model.slots, items_max });
            return error.UnsupportedModel;
        }
        const c = weights.config;
        if (c.head_dim > K.Kernels.attention_head_dim_max or c.head_dim % 4 != 0 or c.heads % @max(c.kv_heads, 1) != 0) {
            diag.set("the CUDA attention takes head_dim <= {d}, a multiple of 4, and heads a multiple of kv_heads; this model has head_dim {d}, {d} heads, {d} KV heads", .{ K.Kernels.attention_head_dim_max, c.head_dim, c.heads, c.kv_heads });
            return error.UnsupportedModel;
        }
        if (c.countOf("attention", .mla) > 0) {
            diag.set("the CUDA backend does not run multi-head latent attention yet ({t}); use the cpu backend", .{c.class});
            return error.UnsupportedModel;
        }
        model.gpu = try cuda.Gpu.open(limits.device, diag);
        errdefer model.gpu.close();
        errdefer model.freeAll();
        model.module = try K.load(&model.gpu, diag);
        errdefer model.module.unload(&model.gpu);
        model.prompt_module = try P.load(&model.gpu, diag);
        errdefer model.prompt_module.unload(&model.gpu);
        model.sample_module = try cuda.sampling.load(&model.gpu, diag);
        errdefer model.sample_module.unload(&model.gpu);
        try model.upload(weights, diag);
        try model.allocateScratch(diag);
        return model;
    }

    pub fn deinit(model: *GpuModel) void {
        const gpa = model.gpa;
        for (&model.graphs) |*slot| if (slot.*) |*entry| entry.graph.destroy(&model.gpu);
        model.freeAll();
        model.module.unload(&model.gpu);
        model.prompt_module.unload(&model.gpu);
        model.sample_module.unload(&model.gpu);
        model.gpu.close();
        gpa.free(model.host_row_tables);
        gpa.free(model.host_attention);
        gpa.free(model.host_tables);
        gpa.free(model.host_offsets);
        gpa.free(model.host_cos_sin);
        gpa.free(model.blocks);
        gpa.destroy(model);
    }

    fn freeAll(model: *GpuModel) void {
        for (model.allocations.items) |ptr| model.gpu.free(ptr);
        model.allocations.deinit(model.gpa);
    }

    fn alloc(model: *GpuModel, size_bytes: usize, diag: *Diagnostic) Error!Ptr {
        try model.allocations.ensureUnusedCapacity(model.gpa, 1);
        const ptr = try model.gpu.alloc(size_bytes, diag);
        model.allocations.appendAssumeCapacity(ptr);
        return ptr;
    }

    fn put(model: *GpuModel, bytes: []const u8, diag: *Diagnostic) Error!Ptr {
        const ptr = try model.alloc(bytes.len, diag);
        try model.gpu.upload(ptr, bytes, diag);
        return ptr;
    }

    fn putF32(model: *GpuModel, values: []const f32, diag: *Diagnostic) Error!Ptr {
        return model.put(std.mem.sliceAsBytes(values), diag);
    }

    fn upload(model: *GpuModel, weights: *const weights_mod.Weights, diag: *Diagnostic) Error!void {
        const c = weights.config;
        const gpa = model.gpa;
        const embed = try gpa.alloc(f32, c.vocab_size * c.hidden_size);
        defer gpa.free(embed);
        for (0..c.vocab_size) |token| weights.embedding.row(token, embed[token * c.hidden_size ..][0..c.hidden_size]);
        model.embed = try model.putF32(embed, diag);
        model.blocks = try gpa.alloc(GpuBlock, c.layers);
        for (weights.blocks, model.blocks) |*block, *target| {
            const gqa = &block.attention.gqa; // init refused the other parts
            target.* = .{
                .input_norm = try model.putF32(block.input_norm, diag),
                .post_attention_norm = try model.putF32(block.post_attention_norm, diag),
                .q = try model.uploadLinear(&gqa.q, diag),
                .k = try model.uploadLinear(&gqa.k, diag),
                .v = try model.uploadLinear(&gqa.v, diag),
                .o = try model.uploadLinear(&gqa.o, diag),
                .q_norm = if (gqa.q_norm) |w| try model.putF32(w, diag) else 0,
                .k_norm = if (gqa.k_norm) |w| try model.putF32(w, diag) else 0,
                .ffn = switch (block.ffn) {
                    .dense => |*mlp| .{ .dense = try model.uploadMlp(mlp, diag) },
                    .moe => |*moe| moe: {
                        const merged = mergedShared(moe, model.merge_shared);
                        const apart: ?*const Mlp = if (merged == null) if (moe.shared) |*mlp| mlp else null else null;
                        break :moe .{ .moe = .{
                            .router = try model.putF32(moe.router, diag),
                            .correction = try model.putF32(moe.correction_bias, diag),
                            .gate = undefined,
                            .up = undefined,
                            .down = try model.grouped(moe.experts, merged, "down", diag),
                            .shared = if (apart) |mlp| try model.uploadMlp(mlp, diag) else null,
                            .merged = merged != null,
                        } };
                    },
                },
            };
            if (!core.switches.off("TF_CUDA_KV_PAIR")) target.kv_pair = try model.pairTable(&target.k, &target.v, diag);
        }
        for (weights.blocks, model.blocks) |*block, *target| switch (block.ffn) {
            .dense => {},
            .moe => |*moe| {
                const m = &target.ffn.moe;
                const gate_up = try model.groupedPair(moe.experts, if (m.merged) &moe.shared.? else null, diag);
                m.gate = gate_up[0];
                m.up = gate_up[1];
                m.prompt = model.prompt_enabled and
                    P.eligibleMlp(promptShape(m.gate), promptShape(m.up), promptShape(m.down), m.gate.out_features);
            },
        };
        model.norm = try model.putF32(weights.norm, diag);
        model.lm_head = try model.uploadLinear(&weights.lm_head, diag);
    }

    fn uploadMlp(model: *GpuModel, source: *const Mlp, diag: *Diagnostic) Error!GpuMlp {
        var mlp: GpuMlp = .{
            .gate = try model.uploadLinear(&source.gate, diag),
            .up = try model.uploadLinear(&source.up, diag),
            .down = try model.uploadLinear(&source.down, diag),
            .pair = 0,
        };
        mlp.pair = try model.pairTable(&mlp.gate, &mlp.up, diag);
        if (mlp.pair != 0 and mlp.down.kind == .exl3) {
            const g = mlp.gate.kind.exl3;
            const d = mlp.down.kind.exl3;
            mlp.prompt = g.prompt and d.prompt and P.eligibleMlp(promptShape(g), promptShape(mlp.up.kind.exl3), promptShape(d), mlp.gate.out_features);
        }
        return mlp;
    }

    /// A two-entry table (first, second) on the GPU when both linears are EXL3 of one shape, rate
    /// and codebook on the same input, so that one launch runs both (runPair); 0 otherwise.
    fn pairTable(model: *GpuModel, first: *const GpuLinear, second: *const GpuLinear, diag: *Diagnostic) Error!Ptr {
        if (first.kind != .exl3 or second.kind != .exl3) return 0;
        const a = first.kind.exl3;
        const b = second.kind.exl3;
        if (a.k_p != b.k_p or a.n_p != b.n_p or a.bits2 != b.bits2 or a.codebook != b.codebook or a.prompt != b.prompt) return 0;
        if (first.in_features != second.in_features or first.out_features != second.out_features) return 0;
        const entries = [2]K.Exl3Layer{ a.entry, b.entry };
        return model.put(std.mem.sliceAsBytes(&entries), diag);
    }

    fn exl3Entry(model: *GpuModel, layer: *const exl3.Layer, out_features: usize, diag: *Diagnostic) Error!K.Exl3Layer {
        var bias_ptr: Ptr = 0;
        if (layer.bias) |bias| {
            const values = try model.gpa.alloc(f32, out_features);
            defer model.gpa.free(values);
            for (values, 0..) |*v, n| v.* = if (n < bias.len()) bias.get(n) else 0;
            bias_ptr = try model.putF32(values, diag);
        }
        return .{
            .words = try model.put(std.mem.sliceAsBytes(layer.words), diag),
            .suh = try model.put(std.mem.sliceAsBytes(layer.suh), diag),
            .svh = try model.put(std.mem.sliceAsBytes(layer.svh), diag),
            .bias = bias_ptr,
        };
    }

    fn uploadLinear(model: *GpuModel, source: *const Linear, diag: *Diagnostic) Error!GpuLinear {
        return .{
            .in_features = source.in_features,
            .out_features = source.out_features,
            .kind = switch (source.kind) {
                .exl3 => |*layer| blk: {
                    const entry = try model.exl3Entry(layer, source.out_features, diag);
                    break :blk .{ .exl3 = .{
                        .table = try model.put(std.mem.asBytes(&entry), diag),
                        .entry = entry,
                        .k_p = layer.rows,
                        .n_p = layer.columns,
                        .bits2 = layer.rate.bits2,
                        .codebook = @backingInt(layer.codebook),
                        .prompt = model.prompt_enabled and P.ineligible(.{
                            .k_p = layer.rows,
                            .n_p = layer.columns,
                            .bits2 = layer.rate.bits2,
                            .codebook = @backingInt(layer.codebook),
                        }) == null,
                    } };
                },
                .dense => |dense| .{ .dense = .{
                    .weight = try model.putF32(dense.weight, diag),
                    .bias = if (dense.bias) |b| try model.putF32(b, diag) else 0,
                } },
            },
        };
    }

    /// The gate and up projections of all experts in one table: gate entries 0..E-1, up entries
    /// E..2E-1, so that one launch runs both for every (row, selected expert) (tf_route writes the
    /// items' entries). All must share shape, rate and codebook.
    fn groupedPair(model: *GpuModel, experts: []const Mlp, shared: ?*const Mlp, diag: *Diagnostic) Error![2]GroupedLinear {
        const first = &experts[0].gate;
        const layer0 = switch (first.kind) {
            .exl3 => |*l| l,
            .dense => {
                diag.set("the CUDA backend runs EXL3 experts only; this checkpoint's experts are unquantized", .{});
                return error.UnsupportedModel;
            },
        };
        const per_half = experts.len + @intFromBool(shared != null);
        const entries = try model.gpa.alloc(K.Exl3Layer, 2 * per_half);
        defer model.gpa.free(entries);
        inline for (.{ "gate", "up" }, 0..) |which, half| {
            if (shared) |mlp| entries[half * per_half + experts.len] = try model.exl3Entry(&@field(mlp, which).kind.exl3, @field(mlp, which).out_features, diag);
            for (experts, entries[half * per_half ..][0..experts.len], 0..) |*expert, *entry, e| {
                const source = &@field(expert, which);
                const layer = switch (source.kind) {
                    .exl3 => |*l| l,
                    .dense => {
                        diag.set("expert {d} {s}_proj is unquantized: the CUDA backend runs EXL3 experts only", .{ e, which });
                        return error.UnsupportedModel;
                    },
                };
                if (layer.rate.bits2 != layer0.rate.bits2 or layer.codebook != layer0.codebook or layer.rows != layer0.rows or
                    layer.columns != layer0.columns or source.out_features != first.out_features)
                {
                    diag.set("expert {d} {s}_proj differs in rate, codebook or shape from expert 0's gate_proj: the grouped path needs them equal", .{ e, which });
                    return error.UnsupportedModel;
                }
                entry.* = try model.exl3Entry(layer, source.out_features, diag);
            }
        }
        const table = try model.put(std.mem.sliceAsBytes(entries), diag);
        const gate: GroupedLinear = .{
            .table = table,
            .in_features = first.in_features,
            .out_features = first.out_features,
            .k_p = layer0.rows,
            .n_p = layer0.columns,
            .bits2 = layer0.rate.bits2,
            .codebook = @backingInt(layer0.codebook),
        };
        var up = gate;
        up.table = table + per_half * @sizeOf(K.Exl3Layer);
        return .{ gate, up };
    }

    fn grouped(model: *GpuModel, experts: []const Mlp, shared: ?*const Mlp, comptime which: []const u8, diag: *Diagnostic) Error!GroupedLinear {
        const first = &@field(experts[0], which);
        const layer0 = switch (first.kind) {
            .exl3 => |*l| l,
            .dense => {
                diag.set("the CUDA backend runs EXL3 experts only; this checkpoint's experts are unquantized", .{});
                return error.UnsupportedModel;
            },
        };
        const entries = try model.gpa.alloc(K.Exl3Layer, experts.len + @intFromBool(shared != null));
        defer model.gpa.free(entries);
        if (shared) |mlp| entries[experts.len] = try model.exl3Entry(&@field(mlp, which).kind.exl3, @field(mlp, which).out_features, diag);
        for (experts, entries[0..experts.len], 0..) |*expert, *entry, e| {
            const source = &@field(expert, which);
            const layer = switch (source.kind) {
                .exl3 => |*l| l,
                .dense => unreachable,
            };
            if (layer.rate.bits2 != layer0.rate.bits2 or layer.codebook != layer0.codebook or layer.rows != layer0.rows or layer.columns != layer0.columns) {
                diag.set("expert {d} {s}_proj differs in rate, codebook or shape from expert 0: the grouped path needs them equal", .{ e, which });
                return error.UnsupportedModel;
            }
            entry.* = try model.exl3Entry(layer, source.out_features, diag);
        }
        return .{
            .table = try model.put(std.mem.sliceAsBytes(entries), diag),
            .in_features = first.in_features,
            .out_features = first.out_features,
            .k_p = layer0.rows,
            .n_p = layer0.columns,
            .bits2 = layer0.rate.bits2,
            .codebook = @backingInt(layer0.codebook),
        };
    }

    fn allocateScratch(model: *GpuModel, diag: *Diagnostic) Error!void {
        const c = model.config;
        const l = model.limits;
        const rows = l.rows_max;
        const items = rows * model.slots;
        const f = @sizeOf(f32);
        const intermediate = @max(c.intermediate_size, c.moe_intermediate_size * @max(c.shared_experts, 1));
        model.tokens = try model.alloc(rows * 4, diag);
        model.positions = try model.alloc(rows * 4, diag);
        model.tables = try model.alloc(rows * l.pages_per_sequence * 4, diag);
        model.table_offsets = try model.alloc(rows * 4, diag);
        model.logits_rows = try model.alloc(l.logits_rows_max * 4, diag);
        model.cos_sin = try model.alloc(rows * @max(c.rotary_dim, 2) * f, diag);
        model.hidden = try model.alloc(rows * c.hidden_size * f, diag);
        model.normed = try model.alloc(rows * c.hidden_size * f, diag);
        model.q = try model.alloc(rows * c.heads * c.head_dim * f, diag);
        model.k = try model.alloc(2 * rows * c.kv_heads * c.head_dim * f, diag);
        model.attention_out = try model.alloc(rows * c.heads * c.head_dim * f, diag);
        model.attention_spread_rows = if (core.switches.off("TF_CUDA_ATTENTION_SPREAD")) 0 else @min(rows, attention_spread_rows_max);
        const parts = K.Kernels.AttentionParts.floats(model.attention_spread_rows, c.heads, c.head_dim);
        model.attention_parts = .{ .acc = try model.alloc(@max(parts.acc, 1) * f, diag), .ml = try model.alloc(@max(parts.ml, 1) * f, diag) };
        model.prompt_attention = c.head_dim == K.Kernels.prompt_attention_head_dim and !core.switches.off("TF_CUDA_PROMPT_ATTENTION");
        model.attention_tiles = try model.alloc((1 + 2 * rows) * 4, diag);
        model.attention_skip = try model.alloc(rows * 4, diag);
        model.step_tiles = 0;
        model.step_rest = true;
        model.projected = try model.alloc(rows * c.hidden_size * f, diag);
        model.ffn_out = try model.alloc(rows * c.hidden_size * f, diag);
        // Gate outputs of all items, then their up outputs (one launch writes both).
        model.gate = try model.alloc(2 * items * intermediate * f, diag);
        model.items_out = try model.alloc(items * c.hidden_size * f, diag);
        model.shared_out = try model.alloc(rows * c.hidden_size * f, diag);
        const need = model.linearScratchNeeded();
        model.acc = try model.alloc(need.partials * f, diag);
        model.counters = try model.alloc(need.counters * 4, diag);
        try model.gpu.zero(model.counters, need.counters * 4, diag);
        model.grouping = .{
            .ranks = try model.alloc(need.items * 4, diag),
            .sorted = try model.alloc(need.items * 4, diag),
            .first = try model.alloc(need.groups * 4, diag),
            .count = try model.alloc(need.groups * 4, diag),
            .layer = try model.alloc(need.groups * 4, diag),
            .total = try model.alloc(4, diag),
        };
        model.pair_layers = try model.alloc(2 * items * 4, diag);
        model.pair_rows = try model.alloc(2 * items * 4, diag);
        try model.allocatePromptScratch(diag);
        model.route_experts = try model.alloc(items * 4, diag);
        model.route_weights = try model.alloc(items * f, diag);
        model.route_scratch = try model.alloc(rows * 2 * c.routed_experts * f, diag);
        model.logits = try model.alloc(l.logits_rows_max * c.vocab_size * f, diag);
        model.summaries = try model.alloc(l.logits_rows_max * @sizeOf(core.LogitsSummary), diag);
        model.sample_jobs = try model.alloc(l.logits_rows_max * @sizeOf(cuda.sampling.Job), diag);
        model.sample_choices = try model.alloc(l.logits_rows_max * @sizeOf(cuda.sampling.Choice), diag);
        const cache_values = l.pages * c.layers * c.kv_heads * l.page_tokens * c.head_dim;
        model.cache_k = try model.alloc(cache_values * f, diag);
        model.cache_v = try model.alloc(cache_values * f, diag);
        const gpa = model.gpa;
        model.host_tables = try gpa.alloc(u32, rows * l.pages_per_sequence);
        errdefer gpa.free(model.host_tables);
        model.host_offsets = try gpa.alloc(u32, rows);
        errdefer gpa.free(model.host_offsets);
        model.host_cos_sin = try gpa.alloc(f32, rows * @max(c.rotary_dim, 2));
        errdefer gpa.free(model.host_cos_sin);
        model.host_row_tables = try gpa.alloc(i32, row_table_count * rows);
        errdefer gpa.free(model.host_row_tables);
        model.host_attention = try gpa.alloc(i32, 1 + 3 * rows);
    }

    /// The prompt path's buffers: the row tables a prompt step uploads, the routed experts' layers,
    /// and the kernels' scratch for the largest of this model's calls (none when no weight is
    /// eligible).
    fn allocatePromptScratch(model: *GpuModel, diag: *Diagnostic) Error!void {
        const c = model.config;
        const rows = model.limits.rows_max;
        const items = rows * model.slots;
        model.row_tables = try model.alloc(row_table_count * rows * 4, diag);
        model.prompt_layers = try model.alloc(items * 4, diag);
        model.step_prompt = false;
        model.step_decode = true;
        model.prompt_scratch = null;
        var need: P.Need = .{};
        const Note = struct {
            fn linear(n: *P.Need, l_: *const GpuLinear, r: usize) void {
                if (l_.kind == .exl3 and l_.kind.exl3.prompt) n.linear(r, l_.kind.exl3.k_p);
            }
            fn mlp(n: *P.Need, m: *const GpuMlp, r: usize) void {
                if (m.prompt) return n.mlp(r, 1, m.gate.kind.exl3.k_p, m.gate.kind.exl3.n_p);
                if (m.pair == 0) {
                    linear(n, &m.gate, r);
                    linear(n, &m.up, r);
                }
            }
        };
        for (model.blocks) |*block| {
            for ([_]*const GpuLinear{ &block.q, &block.k, &block.v, &block.o }) |linear| Note.linear(&need, linear, rows);
            switch (block.ffn) {
                .dense => |*mlp| Note.mlp(&need, mlp, rows),
                .moe => |*moe| {
                    if (moe.prompt) need.mlp(items, c.routed_experts + 1, moe.gate.k_p, moe.gate.n_p);
                    if (moe.shared) |*mlp| Note.mlp(&need, mlp, rows);
                },
            }
        }
        if (need.slots == 0) return;
        const Alloc = struct {
            model: *GpuModel,
            diag: *Diagnostic,
            fn call(a_: @This(), bytes: usize) Error!Ptr {
                return a_.model.alloc(bytes, a_.diag);
            }
        };
        model.prompt_scratch = try need.allocate(Alloc{ .model = model, .diag = diag }, Alloc.call);
    }

    /// The row tables of a prompt step (i32 each, rows_max apart): the prompt flag per row, the
    /// table entry per row for the GEMV (0, or -1 for a prompt row) and for the prompt kernels (the
    /// other way round), and the GEMV's entries for a pair table (first rows, then second rows).
    const row_table_count = 5;
    fn rowTable(model: *const GpuModel, comptime which: enum { flag, gemv, prompt, pair }) Ptr {
        return model.row_tables + @intFromEnum(which) * model.limits.rows_max * 4;
    }

    /// Sums a rank's partial outputs across tensor-parallel ranks, in place on the device.
    pub const Reduce = struct {
        context: *anyopaque,
        sum: *const fn (context: *anyopaque, model: *GpuModel, buffer: Ptr, count: usize, diag: *Diagnostic) anyerror!void,
    };

    const LinearScratch = struct { partials: usize = 1, counters: usize = 1, items: usize = 1, groups: usize = 1 };

    /// What the largest tf_exl3_item_linear call needs: splits(k_p) x items x n_p partial sums and a
    /// completion counter per (item, 128 columns). Gate/up pairs run twice the items.
    fn linearScratchNeeded(model: *const GpuModel) LinearScratch {
        const c = model.config;
        const l = model.limits;
        var need: LinearScratch = .{};
        const Need = struct {
            fn add(n: *LinearScratch, k_p: usize, n_p: usize, items: usize, layers: usize) void {
                n.partials = @max(n.partials, K.splitsFor(k_p) * items * n_p);
                n.counters = @max(n.counters, K.countersFor(@max(items, K.groupsMax(items, layers)), n_p));
                n.items = @max(n.items, items);
                n.groups = @max(n.groups, K.groupsMax(items, layers));
            }
            fn linear(n: *LinearScratch, l_: *const GpuLinear, items: usize) void {
                switch (l_.kind) {
                    .exl3 => |e| add(n, e.k_p, e.n_p, items, 1),
                    .dense => {},
                }
            }
            fn mlp(n: *LinearScratch, m: *const GpuMlp, rows: usize) void {
                linear(n, &m.gate, 2 * rows);
                if (m.gate.kind == .exl3) add(n, m.gate.kind.exl3.k_p, m.gate.kind.exl3.n_p, 2 * rows, 2);
                linear(n, &m.down, rows);
            }
        };
        Need.linear(&need, &model.lm_head, l.logits_rows_max);
        for (model.blocks) |*block| {
            for ([_]*const GpuLinear{ &block.q, &block.k, &block.v, &block.o }) |linear| Need.linear(&need, linear, l.rows_max);
            if (block.kv_pair != 0) Need.add(&need, block.k.kind.exl3.k_p, block.k.kind.exl3.n_p, 2 * l.rows_max, 2);
            switch (block.ffn) {
                .dense => |*mlp| Need.mlp(&need, mlp, l.rows_max),
                .moe => |*moe| {
                    const items = l.rows_max * model.slots;
                    Need.add(&need, moe.gate.k_p, moe.gate.n_p, 2 * items, 2 * (c.routed_experts + 1));
                    Need.add(&need, moe.down.k_p, moe.down.n_p, items, c.routed_experts + 1);
                    if (moe.shared) |*mlp| Need.mlp(&need, mlp, l.rows_max);
                },
            }
        }
        return need;
    }

    /// Attention layers whose k and v projections run as one launch.
    pub fn kvPairs(model: *const GpuModel) u64 {
        var count: u64 = 0;
        for (model.blocks) |*block| count += @intFromBool(block.kv_pair != 0);
        return count;
    }

    /// MoE layers whose routed experts the prompt kernels take.
    pub fn promptLayers(model: *const GpuModel) u64 {
        var count: u64 = 0;
        for (model.blocks) |*block| switch (block.ffn) {
            .dense => {},
            .moe => |*moe| count += @intFromBool(moe.prompt),
        };
        return count;
    }

    /// The same contract as forward_cpu.forward; the KV cache is this model's device cache.
    pub fn forward(model: *GpuModel, batch: forward_cpu.Batch, logits: []f32, diag: *Diagnostic) Error!void {
        return model.forwardRank(batch, logits, null, diag);
    }

    /// With `reduce`, the model is one rank's shard: the partial o_proj and FFN outputs are summed
    /// across ranks before each residual add.
    pub fn forwardRank(model: *GpuModel, batch: forward_cpu.Batch, logits: []f32, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const c = model.config;
        const rows = batch.rows();
        const wanted = batch.logits_rows.len;
        std.debug.assert(rows >= 1 and rows <= model.limits.rows_max);
        std.debug.assert(wanted <= model.limits.logits_rows_max);
        try model.run(batch, reduce, diag);
        if (wanted == 0) return model.gpu.synchronize(diag);
        try model.gpu.download(std.mem.sliceAsBytes(logits[0 .. wanted * c.vocab_size]), model.logits, diag);
    }

    /// `forward` for sampling: every logits row's summary, the logits of the rows `wanted` names
    /// (all when null), and the tokens the GPU samples for `jobs` into `choices`. A greedy row
    /// crosses to the host as its 16-byte summary, a GPU-sampled one as its 8-byte choice.
    pub fn forwardSummarized(model: *GpuModel, batch: forward_cpu.Batch, logits: []f32, summaries: []core.LogitsSummary, wanted: ?[]const bool, jobs: []const cuda.sampling.Job, choices: []cuda.sampling.Choice, diag: *Diagnostic) Error!void {
        const vocab = model.config.vocab_size;
        const count = batch.logits_rows.len;
        std.debug.assert(summaries.len == count and choices.len == jobs.len and jobs.len <= count);
        try model.run(batch, null, diag);
        if (count > 0) try model.gpu.downloadAsync(std.mem.sliceAsBytes(summaries), model.summaries, diag);
        if (jobs.len > 0) {
            try model.gpu.upload(model.sample_jobs, std.mem.sliceAsBytes(jobs), diag);
            try cuda.sampling.launch(&model.gpu, &model.sample_module, model.logits, model.summaries, model.sample_jobs, model.sample_choices, jobs.len, vocab, diag);
            try model.gpu.downloadAsync(std.mem.sliceAsBytes(choices), model.sample_choices, diag);
        }
        for (0..count) |i| {
            if (wanted) |w| if (!w[i]) continue;
            try model.gpu.downloadAsync(std.mem.sliceAsBytes(logits[i * vocab ..][0..vocab]), model.logits + i * vocab * @sizeOf(f32), diag);
        }
        try model.gpu.synchronize(diag);
    }

    /// The batch to the device and the forward queued, replayed from a recording when it can be.
    fn run(model: *GpuModel, batch: forward_cpu.Batch, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const rows = batch.rows();
        const wanted = batch.logits_rows.len;
        try model.uploadBatch(batch, diag);
        // A rank's reduction runs on the host between launches: it cannot be recorded.
        if (reduce == null and model.graphs_enabled and rows <= graph_rows_max) {
            const graph = try model.graphFor(.{ .rows = rows, .wanted = wanted, .prompt = model.step_prompt, .decode = model.step_decode, .tiles = model.step_tiles > 0, .rest = model.step_rest }, diag);
            try graph.launch(&model.gpu, diag);
            model.graph_replays += 1;
        } else {
            try model.enqueue(rows, wanted, reduce, diag);
        }
    }

    /// The recorded forward of `rows` rows with `wanted` logits rows, recorded on first use. Every
    /// launch reads its per-step inputs (tokens, positions, page tables, logits rows) from device
    /// buffers that `uploadBatch` refills, so one recording serves every step of that size.
    fn graphFor(model: *GpuModel, key: GraphKey, diag: *Diagnostic) Error!cuda.gpu.Graph {
        for (model.graphs) |slot| if (slot) |entry| {
            if (std.meta.eql(entry.key, key)) return entry.graph;
        };
        try cuda.gpu.Graph.beginCapture(&model.gpu, diag);
        model.enqueue(key.rows, key.wanted, null, diag) catch |err| {
            _ = cuda.gpu.Graph.endCapture(&model.gpu, false, diag) catch {};
            return err;
        };
        const graph = try cuda.gpu.Graph.endCapture(&model.gpu, true, diag);
        const slot = &model.graphs[model.graph_next % graph_slots];
        model.graph_next += 1;
        if (slot.*) |*old| old.graph.destroy(&model.gpu);
        slot.* = .{ .key = key, .graph = graph };
        return graph;
    }

    /// Queues the whole forward on the stream; the batch is already on the device.
    fn enqueue(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const c = model.config;
        const k: K.Kernels = .{ .gpu = &model.gpu, .module = &model.module, .diag = diag };
        try k.embed(model.tokens, model.embed, model.hidden, rows, c.hidden_size);
        // Each residual add is fused with the norm that follows it: the post-attention norm, the
        // next layer's input norm, or the final norm.
        if (model.blocks.len > 0) try k.rmsnorm(model.hidden, model.blocks[0].input_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
        for (model.blocks, 0..) |*block, layer| {
            try model.attention(k, block, layer, rows);
            if (reduce) |r| r.sum(r.context, model, model.projected, rows * c.hidden_size, diag) catch return error.CudaFailed;
            try k.addRmsnorm(model.hidden, model.projected, block.post_attention_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            switch (block.ffn) {
                .dense => |*mlp| try model.runMlp(k, mlp, model.normed, model.ffn_out, rows),
                .moe => |*moe| try model.runMoe(k, moe, rows),
            }
            if (reduce) |r| r.sum(r.context, model, model.ffn_out, rows * c.hidden_size, diag) catch return error.CudaFailed;
            if (layer + 1 < model.blocks.len) {
                try k.addRmsnorm(model.hidden, model.ffn_out, model.blocks[layer + 1].input_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            } else if (wanted > 0) {
                try k.addRmsnorm(model.hidden, model.ffn_out, model.norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            } else {
                try k.add(model.hidden, model.ffn_out, rows * c.hidden_size);
            }
        }
        if (wanted == 0) return;
        if (model.blocks.len == 0) try k.rmsnorm(model.hidden, model.norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
        switch (model.lm_head.kind) {
            .exl3 => try model.runLinear(k, &model.lm_head, model.normed, model.logits, wanted, model.logits_rows),
            .dense => |dense| {
                try k.gatherRows(model.normed, model.logits_rows, model.projected, wanted, c.hidden_size);
                try k.denseLinear(model.projected, dense.weight, dense.bias, model.logits, wanted, c.hidden_size, c.vocab_size);
            },
        }
        try k.logitsSummary(model.logits, model.summaries, wanted, c.vocab_size);
    }

    fn uploadBatch(model: *GpuModel, batch: forward_cpu.Batch, diag: *Diagnostic) Error!void {
        const c = model.config;
        const rows = batch.rows();
        var at: usize = 0;
        for (batch.page_tables, 0..) |table, r| {
            model.host_offsets[r] = @intCast(at);
            @memcpy(model.host_tables[at..][0..table.len], table);
            at += table.len;
            rope.cosSin(c.rope, batch.positions[r], model.host_cos_sin[r * c.rotary_dim ..][0..c.rotary_dim]);
        }
        try model.gpu.upload(model.tokens, std.mem.sliceAsBytes(batch.tokens), diag);
        try model.gpu.upload(model.positions, std.mem.sliceAsBytes(batch.positions), diag);
        try model.gpu.upload(model.tables, std.mem.sliceAsBytes(model.host_tables[0..@max(at, 1)]), diag);
        try model.gpu.upload(model.table_offsets, std.mem.sliceAsBytes(model.host_offsets[0..rows]), diag);
        if (c.rotary_dim > 0) try model.gpu.upload(model.cos_sin, std.mem.sliceAsBytes(model.host_cos_sin[0 .. rows * c.rotary_dim]), diag);
        if (batch.logits_rows.len > 0) try model.gpu.upload(model.logits_rows, std.mem.sliceAsBytes(batch.logits_rows), diag);
        try model.uploadAttentionTiles(batch, diag);
        model.step_prompt = false;
        model.step_decode = true;
        if (model.prompt_scratch == null) return;
        model.step_decode = false;
        const rows_max = model.limits.rows_max;
        const t = model.host_row_tables;
        for (0..rows) |r| {
            const prompt = r < batch.prompt.len and batch.prompt[r];
            t[r] = @intFromBool(prompt);
            t[rows_max + r] = if (prompt) -1 else 0;
            t[2 * rows_max + r] = if (prompt) 0 else -1;
            t[3 * rows_max + r] = if (prompt) -1 else 0;
            t[3 * rows_max + rows + r] = if (prompt) -1 else 1;
            model.step_prompt = model.step_prompt or prompt;
            model.step_decode = model.step_decode or !prompt;
            model.prompt_rows += @intFromBool(prompt);
        }
        if (model.step_prompt) try model.gpu.upload(model.row_tables, std.mem.sliceAsBytes(t), diag);
    }

    /// Prompt rows in tiles for tf_attention_prompt (a tile: up to 16 consecutive rows of one
    /// sequence, told by its first page, at consecutive positions), the others left to tf_attention.
    fn uploadAttentionTiles(model: *GpuModel, batch: forward_cpu.Batch, diag: *Diagnostic) Error!void {
        const rows = batch.rows();
        model.step_tiles = 0;
        model.step_rest = true;
        if (!model.prompt_attention or batch.prompt.len == 0) return;
        const rows_max = model.limits.rows_max;
        var tiles = K.Kernels.AttentionTiles.init(model.host_attention[0 .. 1 + 2 * rows_max]);
        const skip = model.host_attention[1 + 2 * rows_max ..][0..rows];
        model.step_rest = false;
        for (skip, 0..) |*s, r| {
            const prompt = batch.prompt[r];
            if (prompt) tiles.add(r, batch.positions[r], batch.page_tables[r][0]);
            s.* = @intFromBool(prompt);
            model.step_rest = model.step_rest or !prompt;
        }
        model.step_tiles = tiles.count;
        if (tiles.count == 0) return;
        try model.gpu.upload(model.attention_tiles, std.mem.sliceAsBytes(tiles.table[0 .. 1 + 2 * tiles.count]), diag);
        if (model.step_rest) try model.gpu.upload(model.attention_skip, std.mem.sliceAsBytes(skip), diag);
    }

    fn attention(model: *GpuModel, k: K.Kernels, block: *const GpuBlock, layer: usize, rows: usize) Error!void {
        const c = model.config;
        try model.runLinear(k, &block.q, model.normed, model.q, rows, 0);
        // v's rows follow k's, as a pair launch writes them.
        const v = model.k + rows * block.k.out_features * @sizeOf(f32);
        if (block.kv_pair != 0) {
            try model.runPair(k, &block.k, &block.v, block.kv_pair, model.normed, model.k, rows);
        } else {
            try model.runLinear(k, &block.k, model.normed, model.k, rows, 0);
            try model.runLinear(k, &block.v, model.normed, v, rows, 0);
        }
        const kv: K.Kernels.PagedKv = .{
            .cache_k = model.cache_k,
            .cache_v = model.cache_v,
            .positions = model.positions,
            .tables = model.tables,
            .table_offsets = model.table_offsets,
            .rows = rows,
            .heads = c.heads,
            .kv_heads = c.kv_heads,
            .head_dim = c.head_dim,
            .layers = c.layers,
            .layer = layer,
            .page_tokens = model.limits.page_tokens,
        };
        try k.qkRopeStore(.{
            .q = model.q,
            .k = model.k,
            .v = v,
            .q_norm = block.q_norm,
            .k_norm = block.k_norm,
            .cos_sin = model.cos_sin,
            .rotary_dim = c.rotary_dim,
            .eps = c.rms_norm_eps,
        }, kv);
        if (model.step_tiles > 0) {
            // A recorded forward keeps its grid: there, one block column per row bounds the tiles.
            try k.attentionPrompt(model.q, model.attention_out, kv, model.attention_tiles, if (rows <= graph_rows_max) rows else model.step_tiles);
        }
        if (model.step_rest) {
            const skip = if (model.step_tiles > 0) model.attention_skip else 0;
            try k.attention(model.q, model.attention_out, kv, if (rows <= model.attention_spread_rows) model.attention_parts else null, skip);
        }
        try model.runLinear(k, &block.o, model.attention_out, model.projected, rows, 0);
    }

    /// The fields every EXL3 launch of this model shares, for a weight of `shape` (anything with
    /// k_p, n_p, bits2 and codebook) in `table`; callers add what differs (rows, tables, SwiGLU).
    fn exl3Call(model: *const GpuModel, shape: anytype, table: Ptr, in_features: usize, out_features: usize, x: Ptr, y: Ptr, items: usize) K.Kernels.Exl3Call {
        return .{
            .x = x,
            .table = table,
            .acc = model.acc,
            .counters = model.counters,
            .grouping = model.grouping,
            .y = y,
            .items = items,
            .in_features = in_features,
            .out_features = out_features,
            .k_p = shape.k_p,
            .n_p = shape.n_p,
            .bits2 = shape.bits2,
            .codebook = shape.codebook,
        };
    }

    /// The GEMV of a pair table (pairTable) over the same rows: first's outputs at y, second's
    /// after them. With `prompt`, for the generated rows only (the prompt rows' entries say -1).
    fn pairGemv(model: *GpuModel, k: K.Kernels, first: *const GpuLinear, table: Ptr, x: Ptr, y: Ptr, rows: usize, prompt: bool) Error!void {
        var call = model.exl3Call(first.kind.exl3, table, first.in_features, first.out_features, x, y, 2 * rows);
        call.group_items = rows;
        if (prompt) {
            call.layer_of_item = model.rowTable(.pair);
            call.layers = 2;
        }
        if (!prompt or model.step_decode) try k.exl3Linear(call);
    }

    /// Two linears of one pair table on the same rows, as runLinear would run each: the generated
    /// rows in one GEMV launch, a prompt step's prompt rows on the prompt kernels, linear by linear.
    fn runPair(model: *GpuModel, k: K.Kernels, first: *const GpuLinear, second: *const GpuLinear, table: Ptr, x: Ptr, y: Ptr, rows: usize) Error!void {
        const prompt = model.step_prompt and first.kind.exl3.prompt;
        try model.pairGemv(k, first, table, x, y, rows, prompt);
        if (!prompt) return;
        const width = first.out_features * @sizeOf(f32);
        for ([2]*const GpuLinear{ first, second }, [2]Ptr{ y, y + rows * width }) |linear, out| {
            const e = linear.kind.exl3;
            try model.launcher(k).runLinear(model.prompt_scratch.?, x, rows, 1, model.rowTable(.prompt), e.table, promptShape(e), linear.in_features, linear.out_features, out);
        }
    }

    /// rows_wanted: 0, or a device array naming which rows of x to run (the logits rows).
    fn runLinear(model: *GpuModel, k: K.Kernels, linear: *const GpuLinear, x: Ptr, y: Ptr, rows: usize, rows_wanted: Ptr) Error!void {
        switch (linear.kind) {
            .exl3 => |e| {
                var call = model.exl3Call(e, e.table, linear.in_features, linear.out_features, x, y, rows);
                call.source_rows = rows_wanted;
                const prompt = rows_wanted == 0 and model.step_prompt and e.prompt;
                if (prompt) {
                    call.layer_of_item = model.rowTable(.gemv);
                    call.layers = 1;
                }
                if (!prompt or model.step_decode) try k.exl3Linear(call);
                if (prompt) try model.launcher(k).runLinear(model.prompt_scratch.?, x, rows, 1, model.rowTable(.prompt), e.table, promptShape(e), linear.in_features, linear.out_features, y);
            },
            .dense => |d| {
                std.debug.assert(rows_wanted == 0);
                try k.denseLinear(x, d.weight, d.bias, y, rows, linear.in_features, linear.out_features);
            },
        }
    }

    /// gate and up (one launch when paired) into model.gate: gate rows, then up rows; then down
    /// with the SwiGLU fused into its input (an unquantized down takes a separate SwiGLU).
    /// A prompt step's prompt rows take the prompt kernels for the whole MLP when it is eligible.
    fn runMlp(model: *GpuModel, k: K.Kernels, mlp: *const GpuMlp, x: Ptr, out: Ptr, rows: usize) Error!void {
        const width = mlp.gate.out_features;
        const up = model.gate + rows * width * @sizeOf(f32);
        const prompt = model.step_prompt and mlp.prompt;
        if (mlp.pair != 0) {
            try model.pairGemv(k, &mlp.gate, mlp.pair, x, model.gate, rows, prompt);
        } else {
            try model.runLinear(k, &mlp.gate, x, model.gate, rows, 0);
            try model.runLinear(k, &mlp.up, x, up, rows, 0);
        }
        if (!prompt or model.step_decode) try model.runDown(k, &mlp.down, model.gate, up, out, rows, prompt);
        if (prompt) {
            const g = mlp.gate.kind.exl3;
            const d = mlp.down.kind.exl3;
            try model.launcher(k).runMlp(model.prompt_scratch.?, .{
                .x = x,
                .items = rows,
                .items_per_row = 1,
                .layer_of_item = model.rowTable(.prompt),
                .layers = 1,
                .gate_up = mlp.pair,
                .up_offset = 1,
                .down = d.table,
                .hidden = mlp.down.out_features,
                .width = width,
                .gate = promptShape(g),
                .down_shape = promptShape(d),
                .y = out,
            });
        }
    }

    fn launcher(model: *const GpuModel, k: K.Kernels) P.Launcher {
        return .{ .glm = k, .module = &model.prompt_module };
    }

    /// y = down(silu(gate) · up); with `skip_prompt`, for the generated rows only.
    fn runDown(model: *GpuModel, k: K.Kernels, down: *const GpuLinear, gate: Ptr, up: Ptr, y: Ptr, rows: usize, skip_prompt: bool) Error!void {
        switch (down.kind) {
            .exl3 => |e| {
                var call = model.exl3Call(e, e.table, down.in_features, down.out_features, gate, y, rows);
                call.up = up;
                if (skip_prompt) {
                    call.layer_of_item = model.rowTable(.gemv);
                    call.layers = 1;
                }
                try k.exl3Linear(call);
            },
            .dense => {
                try k.swiglu(gate, up, rows * down.in_features);
                try model.runLinear(k, down, gate, y, rows, 0);
            },
        }
    }

    fn runMoe(model: *GpuModel, k: K.Kernels, moe: anytype, rows: usize) Error!void {
        const c = model.config;
        // Table entries per projection and slots per row: the routed experts, and the shared
        // expert after them when it is merged.
        const entries = c.routed_experts + @intFromBool(moe.merged);
        const slots = c.experts_per_token + @intFromBool(moe.merged);
        const items = rows * slots;
        const prompt = model.step_prompt and moe.prompt;
        try k.route(.{
            .x = model.normed,
            .gate = moe.router,
            .correction = moe.correction,
            .experts_out = model.route_experts,
            .weights_out = model.route_weights,
            .pair_layers = model.pair_layers,
            .pair_rows = model.pair_rows,
            .row_prompt = if (prompt) model.rowTable(.flag) else 0,
            .prompt_layers = if (prompt) model.prompt_layers else 0,
            .scratch = model.route_scratch,
            .rows = rows,
            .hidden = c.hidden_size,
            .experts = c.routed_experts,
            .top_k = c.experts_per_token,
            .slots = slots,
            .groups = c.groups,
            .groups_per_token = c.groups_per_token,
            .normalize = c.norm_topk_prob,
            .scaling = c.routed_scaling_factor,
        });
        // Items 0..items-1 are (row, slot) gate problems, items..2·items-1 the same pairs' up
        // problems; each reads its row and its expert's trellis in place through the table.
        const g = moe.gate;
        const width = g.out_features;
        var gate_up = model.exl3Call(g, g.table, g.in_features, width, model.normed, model.gate, 2 * items);
        gate_up.source_rows = model.pair_rows;
        gate_up.layer_of_item = model.pair_layers;
        gate_up.layers = 2 * entries;
        const d = moe.down;
        var down = model.exl3Call(d, d.table, d.in_features, d.out_features, model.gate, model.items_out, items);
        down.up = model.gate + items * width * @sizeOf(f32);
        down.layer_of_item = model.route_experts;
        down.layers = entries;
        if (!prompt or model.step_decode) {
            try k.exl3Linear(gate_up);
            try k.exl3Linear(down);
        }
        if (prompt) {
            try model.launcher(k).runMlp(model.prompt_scratch.?, .{
                .x = model.normed,
                .items = items,
                .items_per_row = slots,
                .layer_of_item = model.prompt_layers,
                .layers = entries,
                .gate_up = g.table,
                .up_offset = entries,
                .down = d.table,
                .hidden = c.hidden_size,
                .width = width,
                .gate = promptShape(g),
                .down_shape = promptShape(d),
                .y = model.items_out,
            });
        }
        var shared: Ptr = 0;
        if (moe.shared) |*mlp| {
            try model.runMlp(k, mlp, model.normed, model.shared_out, rows);
            shared = model.shared_out;
        }
        try k.moeCombine(model.items_out, model.route_weights, shared, model.ffn_out, rows, slots, c.hidden_size);
    }
};

/// The shared expert of `moe` when it can ride in the routed experts' launches: one shared expert
/// whose three projections are EXL3 of the routed experts' rate, codebook and shape (then its
/// output is the last slot of each row, weight 1, summed last as before: the same bits).
/// `allowed`: the TF_CUDA_SHARED_MERGE switch.
fn mergedShared(moe: *const Moe, allowed: bool) ?*const Mlp {
    const shared = if (moe.shared) |*mlp| mlp else return null;
    if (!allowed or moe.experts.len == 0) return null;
    inline for (.{ "gate", "up", "down" }) |which| {
        const ours = &@field(shared.*, which);
        const theirs = &@field(moe.experts[0], which);
        if (ours.kind != .exl3 or theirs.kind != .exl3) return null;
        const a = &ours.kind.exl3;
        const b = &theirs.kind.exl3;
        if (a.rate.bits2 != b.rate.bits2 or a.codebook != b.codebook or a.rows != b.rows or a.columns != b.columns or
            ours.out_features != theirs.out_features or ours.in_features != theirs.in_features) return null;
    }
    return shared;
}

/// Expert slots per row the model's largest MoE layer uses.
fn slotsOf(weights: *const weights_mod.Weights, merge_shared: bool) usize {
    var slots: usize = @max(weights.config.experts_per_token, 1);
    for (weights.blocks) |*block| switch (block.ffn) {
        .dense => {},
        .moe => |*moe| if (mergedShared(moe, merge_shared) != null) {
            slots = weights.config.experts_per_token + 1;
        },
    };
    return slots;
}

/// The shape of anything with k_p, n_p, bits2 and codebook (a GroupedLinear, a GpuLinear's exl3).
fn promptShape(g: anytype) P.Shape {
    return .{ .k_p = g.k_p, .n_p = g.n_p, .bits2 = g.bits2, .codebook = g.codebook };
}

