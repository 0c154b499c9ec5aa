//! The forward on the GPU, composed from the parts' GPU sides (parts/*_cuda.zig) as forward_cpu.zig
//! composes their CPU forwards: the same steps, on weights uploaded once from the checked host
//! `Weights`, with the KV cache in device memory. Kernels: glm_forward.cu through
//! cuda/glm_kernels.zig, the prompt kernels through cuda/exl3_prompt.zig.
//!
//! Generated rows take the trellis GEMV; prompt rows take the tensor-core prompt kernels for every
//! EXL3 linear they can, so a row's numbers never depend on its batch (parts/linear_cuda.zig).
//! f32 arithmetic, the trellis decoded per item. Forwards of few rows (decode steps) are recorded
//! as CUDA graphs and replayed (cuda_replay.zig). A greedy row crosses to the
//! host as its logits summary, a row sampled with temperature/top-k/top-p/min-p as the token the
//! GPU drew (cuda/sampling.zig); other rows' logits are copied back for the host sampler.
const std = @import("std");
const core = @import("../../core/root.zig");
const cuda = @import("../../cuda/root.zig");
const weights_mod = @import("weights.zig");
const release_mod = @import("release.zig");
const Batch = @import("batch.zig").Batch;
const Config = @import("config.zig").Config;
const buffers = @import("cuda_buffers.zig");
const census = @import("cuda_census.zig");
const linear_cuda = @import("parts/linear_cuda.zig");
const gqa_cuda = @import("parts/gqa_cuda.zig");
const mlp_cuda = @import("parts/mlp_cuda.zig");
const moe_cuda = @import("parts/moe_cuda.zig");
const shared_side = @import("parts/shared_side_cuda.zig");
const mla_cuda = @import("parts/mla_cuda.zig");
const dsa_cuda = @import("parts/dsa_cuda.zig");
const kda_cuda = @import("parts/kda_cuda.zig");
const hyper_cuda = @import("parts/hyper_cuda.zig");
const replay = @import("cuda_replay.zig");
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const GpuLinear = linear_cuda.GpuLinear;

pub const Error = cuda.gpu.Error || error{UnsupportedModel};

pub const GpuBlock = struct {
    input_norm: Ptr,
    post_attention_norm: Ptr,
    attention: union(enum) { gqa: gqa_cuda.GpuGqa, mla: mla_cuda.GpuMla, kda: kda_cuda.GpuKda },
    ffn: union(enum) { dense: mlp_cuda.GpuMlp, moe: moe_cuda.GpuMoe },
    hyper: ?hyper_cuda.GpuSites = null,
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
    /// Sequence slots, each with its own recurrent (KDA) state.
    sequences: usize = 0,
    /// Recurrent-state slots after them for the prefix cache's snapshots (kda_cuda.copySlot).
    state_snapshots: usize = 0,
    /// What the GQA and MLA caches store (the DSA indexer's keys stay f32).
    kv_dtype: core.KvDtype = .f32,
    /// Replay recorded forwards of up to `graph_rows_max` rows (TF_CUDA_GRAPHS=0 turns it off).
    graphs: bool = true,
};

/// Forwards of at most this many rows are recorded as graphs: decode steps, not prompt chunks,
/// whose row counts rarely repeat.
pub const graph_rows_max = 64;
/// Steps of up to this many rows spread attention over splits (more rows fill the GPU as they are).
pub const attention_spread_rows_max = 32;

pub const GpuModel = struct {
    gpa: std.mem.Allocator,
    gpu: cuda.Gpu,
    module: K.Module,
    prompt_module: P.Module,
    sample_module: cuda.sampling.Module,
    /// The latent attention's and the indexer's kernels, when the model has such layers.
    mla_module: ?cuda.mla_kernels.Module,
    dsa_module: ?cuda.dsa_kernels.Module,
    /// GLM-5.3-Flash's: KDA, hyper-connections, the pooled indexer.
    kda_module: ?cuda.kda_kernels.Module,
    hyper_module: ?cuda.hyper_kernels.Module,
    kpool_module: ?cuda.kpool_kernels.Module,
    /// Expert slots per row: experts_per_token, + 1 when a layer merges its shared expert.
    slots: usize,
    /// The switches (core.switches), read once: prompt kernels and the shared expert's merge.
    prompt_enabled: bool,
    /// TF_CUDA_PROMPT_LINEAR's form for the plain linears' prompt rows, or null: chosen per call.
    prompt_linear: ?P.LinearForm,
    prompt_mlp: ?P.MlpForm,
    /// Whether split weights take the deep launch (exl3_prompt.deepAllowed, read once).
    prompt_deep: bool,
    /// Unquantized weights on the tensor cores (TF_CUDA_DENSE_MMA=0: a warp per output, f32), and
    /// the most split sums one of their launches leaves in model.acc.
    dense_mma: bool,
    dense_partials: usize,
    merge_shared: bool,
    /// Routed items of one expert share its decoded tiles, and a plain layer's 2 to 4 rows theirs
    /// (TF_CUDA_SHARED_ITEMS=0: one item a block; the 8-row form from 4 rows).
    shared_items: bool,
    /// A decode step's shared expert on the side stream (parts/shared_side_cuda.zig), and its
    /// buffers (null: no shared expert, or the switch off).
    shared_side: bool,
    side: ?shared_side.Scratch,
    /// Hyper-connection sites in fewer launches (TF_CUDA_HC_FUSED=0: maps, collapse and the MoE
    /// combine each on their own; the same bits).
    hyper_fused: bool,
    sample_jobs: Ptr,
    sample_choices: Ptr,
    /// tf_sample_*'s per-job state and histograms, zero between calls.
    sample_scratch: Ptr,
    config: Config,
    limits: Limits,
    allocations: std.ArrayList(Ptr),
    /// Where put() places weights and tables: chunks among `allocations` (device_arena.zig).
    arena: cuda.device_arena.Arena,
    graphs: [replay.slots]?replay.Slot,
    graph_next: usize,
    graphs_enabled: bool,
    graph_replays: u64,
    /// A timed forward (cuda/timeline.zig): `timeNext` arms it for the next forward, whose
    /// recording (kept in timeline_graph until the next) carries an event per launch.
    timeline: ?*cuda.timeline.Timeline,
    timeline_armed: bool,
    timeline_graph: ?cuda.gpu.Graph,
    /// The positions this step's rows attend to, summed over its rows (what a full-context
    /// attention reads, in cache rows).
    step_positions: u64,
    /// Prompt rows run through the prompt kernels (each forward's, counted once).
    prompt_rows: u64,
    embed: Ptr,
    embed_dtype: K.Kernels.EmbedDtype = .f32,
    blocks: []GpuBlock,
    norm: Ptr,
    lm_head: GpuLinear,
    cache_k: Ptr,
    cache_v: Ptr,
    /// fp8: the per-position exponents of cache_k and cache_v (kv_store.cuh); 0 otherwise.
    exp_k: Ptr,
    exp_v: Ptr,
    // Per-forward device buffers, sized by `limits` (cuda_buffers.zig).
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
    /// MLA layers' buffers and latent cache, the indexers' (parts/mla_cuda.zig, dsa_cuda.zig).
    mla: ?mla_cuda.Buffers,
    dsa: ?dsa_cuda.Buffers,
    kda: ?kda_cuda.Buffers,
    /// With hyper-connections: model.hidden holds (rows, mult, hidden) streams; a site's collapse
    /// (rows, hidden) and its maps (rows, 2·mult + mult²: pre, post, comb).
    collapsed: Ptr,
    maps: Ptr,
    hyper_raw: Ptr, // (rows, mixes + 1): a site's raw logits and the streams' sum of squares
    // Host staging.
    host_tables: []u32,
    host_offsets: []u32,
    host_cos_sin: []f32,
    host_row_tables: []i32,

    // The parts' launches and the buffers' helpers, callable as methods.
    pub const uploadLinear = linear_cuda.uploadLinear;
    pub const exl3Entry = linear_cuda.exl3Entry;
    pub const pairTable = linear_cuda.pairTable;
    pub const exl3Call = linear_cuda.exl3Call;
    pub const runLinear = linear_cuda.runLinear;
    pub const runDense = linear_cuda.runDense;
    pub const runDenseStrided = linear_cuda.runDenseStrided;
    pub const noteDenseSplits = linear_cuda.noteDenseSplits;
    pub const pairGemv = linear_cuda.pairGemv;
    pub const runPair = linear_cuda.runPair;
    pub const launcher = linear_cuda.launcher;
    pub const uploadMlp = mlp_cuda.uploadMlp;
    pub const runMlp = mlp_cuda.runMlp;
    pub const runDown = mlp_cuda.runDown;
    pub const sharedSideLayers = shared_side.layers;
    pub const rowTable = buffers.rowTable;
    pub const uploadBatch = buffers.uploadBatch;
    pub const kvPairs = census.kvPairs;
    pub const promptLayers = census.promptLayers;
    pub const timeNext = census.timeNext;
    pub const timelineEntries = census.timelineEntries;
    pub const launchMicros = census.launchMicros;
    pub const at = census.at;

    pub fn init(gpa: std.mem.Allocator, weights: *const weights_mod.Weights, limits: Limits, diag: *Diagnostic) Error!*GpuModel {
        return create(gpa, weights, null, limits, diag);
    }

    /// `init` that frees each part's host projections once the device holds them (release.zig): a
    /// tensor-parallel rank's heap shard, which would otherwise stay beside its device copy (on a
    /// unified-memory GPU, the same memory twice). The weights keep their config and shapes.
    pub fn initReleasing(gpa: std.mem.Allocator, weights: *weights_mod.Weights, limits: Limits, diag: *Diagnostic) Error!*GpuModel {
        return create(gpa, weights, weights, limits, diag);
    }

    fn create(gpa: std.mem.Allocator, weights: *const weights_mod.Weights, release: ?*weights_mod.Weights, limits: Limits, diag: *Diagnostic) Error!*GpuModel {
        const model = try gpa.create(GpuModel);
        errdefer gpa.destroy(model);
        model.* = undefined;
        model.gpa = gpa;
        model.config = weights.config;
        model.limits = limits;
        model.allocations = .empty;
        model.arena = .{};
        model.graphs = @splat(null);
        model.graph_next = 0;
        model.graph_replays = 0;
        model.timeline = null;
        model.timeline_armed = false;
        model.timeline_graph = null;
        model.step_positions = 0;
        model.prompt_rows = 0;
        model.graphs_enabled = limits.graphs and !core.switches.off("TF_CUDA_GRAPHS");
        model.prompt_enabled = !core.switches.off("TF_CUDA_PROMPT");
        model.prompt_linear = P.LinearForm.forced();
        model.prompt_mlp = P.MlpForm.forced();
        model.prompt_deep = P.deepAllowed();
        model.dense_mma = !core.switches.off("TF_CUDA_DENSE_MMA");
        model.dense_partials = 0;
        model.shared_side = shared_side.allowed();
        model.merge_shared = !core.switches.off("TF_CUDA_SHARED_MERGE");
        model.shared_items = !core.switches.off("TF_CUDA_SHARED_ITEMS");
        model.side = null;
        model.hyper_fused = !core.switches.off("TF_CUDA_HC_FUSED");
        // A launch's items (2 x rows x slots for the expert gate/up pair) are its grid's z extent.
        model.slots = moe_cuda.slotsOf(weights, model.merge_shared);
        const items_max = 2 * limits.rows_max * model.slots;
        if (items_max > 65535) {
            diag.set("rows_max {d} is too large for the CUDA backend: 2 x rows_max x {d} expert slots = {d} exceeds 65535 items per launch", .{ limits.rows_max, model.slots, items_max });
            return error.UnsupportedModel;
        }
        const c = weights.config;
        try gqa_cuda.checkShape(&c, limits.kv_dtype, diag);
        try mla_cuda.checkShape(&c, diag);
        try kda_cuda.checkShape(&c, diag);
        try hyper_cuda.checkShape(&c, diag);
        try moe_cuda.checkShape(&c, diag);
        if (c.countOf("attention", .kda) > 0 and limits.sequences == 0) {
            diag.set("a model with recurrent state needs limits.sequences > 0", .{});
            return error.UnsupportedModel;
        }
        model.gpu = try cuda.Gpu.open(limits.device, diag);
        errdefer model.gpu.close();
        if (limits.kv_dtype == .fp8 and model.gpu.compute_capability < 89) {
            diag.set("kv_dtype fp8 needs a GPU of sm_89 or later (e4m3 conversions); this one is sm_{d}: use f16", .{model.gpu.compute_capability});
            return error.UnsupportedModel;
        }
        errdefer model.freeAll();
        model.module = try K.load(&model.gpu, diag);
        errdefer model.module.unload(&model.gpu);
        model.prompt_module = try P.load(&model.gpu, diag);
        errdefer model.prompt_module.unload(&model.gpu);
        model.sample_module = try cuda.sampling.load(&model.gpu, diag);
        errdefer model.sample_module.unload(&model.gpu);
        model.mla_module = if (c.countOf("attention", .mla) > 0) try cuda.mla_kernels.load(&model.gpu, diag) else null;
        errdefer if (model.mla_module) |*module| module.unload(&model.gpu);
        model.dsa_module = if (c.countOf("indexer", .full) > 0) try cuda.dsa_kernels.load(&model.gpu, diag) else null;
        errdefer if (model.dsa_module) |*module| module.unload(&model.gpu);
        model.kda_module = if (c.countOf("attention", .kda) > 0) try cuda.kda_kernels.load(&model.gpu, diag) else null;
        errdefer if (model.kda_module) |*module| module.unload(&model.gpu);
        model.hyper_module = if (c.hyper.mult > 0) try cuda.hyper_kernels.load(&model.gpu, diag) else null;
        errdefer if (model.hyper_module) |*module| module.unload(&model.gpu);
        model.kpool_module = if (c.indexer.pool > 0 and c.countOf("indexer", .full) > 0) try cuda.kpool_kernels.load(&model.gpu, diag) else null;
        errdefer if (model.kpool_module) |*module| module.unload(&model.gpu);
        if (!std.math.isInf(c.swiglu_limit)) {
            try model.module.setFloat(&model.gpu, "tf_swiglu_limit", c.swiglu_limit, diag);
            try model.prompt_module.setFloat(&model.gpu, "tf_swiglu_limit", c.swiglu_limit, diag);
        }
        try model.upload(weights, release, diag);
        try buffers.allocateScratch(model, diag);
        return model;
    }

    pub fn deinit(model: *GpuModel) void {
        const gpa = model.gpa;
        for (&model.graphs) |*slot| if (slot.*) |*entry| entry.graph.destroy(&model.gpu);
        if (model.timeline_graph) |*graph| graph.destroy(&model.gpu);
        if (model.timeline) |timeline| {
            timeline.deinit(&model.gpu);
            gpa.destroy(timeline);
        }
        model.freeAll();
        model.module.unload(&model.gpu);
        model.prompt_module.unload(&model.gpu);
        model.sample_module.unload(&model.gpu);
        if (model.mla_module) |*module| module.unload(&model.gpu);
        if (model.dsa_module) |*module| module.unload(&model.gpu);
        if (model.kda_module) |*module| module.unload(&model.gpu);
        if (model.hyper_module) |*module| module.unload(&model.gpu);
        if (model.kpool_module) |*module| module.unload(&model.gpu);
        if (model.kda) |b| gpa.free(b.host_runs);
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

    /// Device memory freed with the model.
    pub fn alloc(model: *GpuModel, size_bytes: usize, diag: *Diagnostic) Error!Ptr {
        try model.allocations.ensureUnusedCapacity(model.gpa, 1);
        const ptr = try model.gpu.alloc(size_bytes, diag);
        model.allocations.appendAssumeCapacity(ptr);
        return ptr;
    }

    /// `bytes` on the device for the model's life: in the arena's chunks (a large one alone).
    pub fn put(model: *GpuModel, bytes: []const u8, diag: *Diagnostic) Error!Ptr {
        const Arena = cuda.device_arena.Arena;
        const ptr = if (bytes.len > Arena.own_above) try model.alloc(bytes.len, diag) else model.arena.place(bytes.len) orelse placed: {
            const size = model.arena.chunkFor(bytes.len);
            model.arena.start(try model.alloc(size, diag), size);
            break :placed model.arena.place(bytes.len).?;
        };
        try model.gpu.upload(ptr, bytes, diag);
        return ptr;
    }

    pub fn putF32(model: *GpuModel, values: []const f32, diag: *Diagnostic) Error!Ptr {
        return model.put(std.mem.sliceAsBytes(values), diag);
    }

    /// Every layer's parts to the device. The routed experts' gate/up tables go last, after every
    /// layer's other weights (the order of the allocations before the parts were split).
    /// `release`: the same weights, whose projections go as each part is uploaded.
    fn upload(model: *GpuModel, weights: *const weights_mod.Weights, release: ?*weights_mod.Weights, diag: *Diagnostic) Error!void {
        const c = weights.config;
        const gpa = model.gpa;
        // The table as stored (f16 and bf16 widen exactly in tf_embed): an f32 copy was twice the
        // GPU memory (GLM-4.5-Air: 2.5 GB for 1.2) and as much again of host memory while loading,
        // one pool on a unified-memory GB10.
        const table = weights.embedding.tensor;
        model.embed = try model.put(table.data, diag);
        model.embed_dtype = switch (table.dtype) {
            .f32 => .f32,
            .f16 => .f16,
            .bf16 => .bf16,
            else => unreachable, // checked at load
        };
        model.blocks = try gpa.alloc(GpuBlock, c.layers);
        for (weights.blocks, model.blocks, 0..) |*block, *target, i| {
            target.* = .{
                .input_norm = try model.putF32(block.input_norm, diag),
                .post_attention_norm = try model.putF32(block.post_attention_norm, diag),
                .attention = switch (block.attention) {
                    .gqa => |*part| .{ .gqa = try gqa_cuda.upload(model, part, diag) },
                    .mla => |*part| .{ .mla = try mla_cuda.upload(model, part, diag) },
                    .kda => |*part| .{ .kda = try kda_cuda.upload(model, part, diag) },
                },
                .hyper = if (block.hyper) |*sites| try hyper_cuda.upload(model, sites, diag) else null,
                .ffn = switch (block.ffn) {
                    .dense => |*part| .{ .dense = try model.uploadMlp(part, diag) },
                    .moe => |*part| .{ .moe = try moe_cuda.uploadApart(model, part, diag) },
                },
            };
            if (target.attention == .gqa) try gqa_cuda.pairKv(model, &target.attention.gqa, diag);
            if (release) |host| try model.releaseFirstPass(&host.blocks[i], diag);
        }
        for (weights.blocks, model.blocks, 0..) |*block, *target, i| switch (block.ffn) {
            .dense => {},
            .moe => |*part| {
                try moe_cuda.uploadGateUp(model, part, &target.ffn.moe, diag);
                if (release) |host| try model.releaseCopied(&host.blocks[i].ffn, diag);
            },
        };
        model.norm = try model.putF32(weights.norm, diag);
        model.lm_head = try model.uploadLinear(&weights.lm_head, diag);
        if (release) |host| try model.releaseCopied(&host.lm_head, diag);
    }

    /// Frees `part`'s host projections once the queued copies have read them.
    fn releaseCopied(model: *GpuModel, part: anytype, diag: *Diagnostic) Error!void {
        try model.gpu.synchronize(diag);
        release_mod.releaseLinears(model.gpa, part);
    }

    /// A block's projections the first pass uploaded: all but the routed experts' gate and up
    /// (and the shared expert, whose gate and up may join theirs), which go after the second.
    fn releaseFirstPass(model: *GpuModel, block: *weights_mod.Block, diag: *Diagnostic) Error!void {
        try model.gpu.synchronize(diag);
        const gpa = model.gpa;
        release_mod.releaseLinears(gpa, &block.attention);
        switch (block.ffn) {
            .dense => |*mlp| release_mod.releaseLinears(gpa, mlp),
            .moe => |*moe| for (moe.experts) |*expert| release_mod.releaseLinears(gpa, &expert.down),
        }
    }

    /// Sums a rank's partial outputs across tensor-parallel ranks, in place on the device.
    pub const Reduce = struct {
        context: *anyopaque,
        sum: *const fn (context: *anyopaque, model: *GpuModel, buffer: Ptr, count: usize, diag: *Diagnostic) anyerror!void,
        /// The sum is queued on the model's stream (NCCL), not run by the host between launches:
        /// a forward with it can be recorded as a graph, the collectives inside.
        recordable: bool = false,
    };

    /// The same contract as forward_cpu.forward; the KV cache is this model's device cache.
    pub fn forward(model: *GpuModel, batch: Batch, logits: []f32, diag: *Diagnostic) Error!void {
        return model.forwardRank(batch, logits, null, diag);
    }

    /// With `reduce`, the model is one rank's shard: the partial o_proj and FFN outputs are summed
    /// across ranks before each residual add.
    pub fn forwardRank(model: *GpuModel, batch: Batch, logits: []f32, reduce: ?Reduce, diag: *Diagnostic) Error!void {
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
    /// With `reduce`, tensor-parallel rank 0 (the rank that runs lm_head) as forwardRank.
    pub fn forwardSummarized(model: *GpuModel, batch: Batch, logits: []f32, summaries: []core.LogitsSummary, wanted: ?[]const bool, jobs: []const cuda.sampling.Job, choices: []cuda.sampling.Choice, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const vocab = model.config.vocab_size;
        const count = batch.logits_rows.len;
        std.debug.assert(summaries.len == count and choices.len == jobs.len and jobs.len <= count);
        try model.run(batch, reduce, diag);
        if (count > 0) try model.gpu.downloadAsync(std.mem.sliceAsBytes(summaries), model.summaries, diag);
        if (jobs.len > 0) {
            try model.gpu.upload(model.sample_jobs, std.mem.sliceAsBytes(jobs), diag);
            try cuda.sampling.launch(&model.gpu, &model.sample_module, model.logits, model.summaries, jobs, model.sample_jobs, model.sample_scratch, model.sample_choices, vocab, diag);
            try model.gpu.downloadAsync(std.mem.sliceAsBytes(choices), model.sample_choices, diag);
        }
        for (0..count) |i| {
            if (wanted) |w| if (!w[i]) continue;
            try model.gpu.downloadAsync(std.mem.sliceAsBytes(logits[i * vocab ..][0..vocab]), model.logits + i * vocab * @sizeOf(f32), diag);
        }
        try model.gpu.synchronize(diag);
    }

    /// The batch to the device and the forward queued, replayed from a recording when it can be.
    fn run(model: *GpuModel, batch: Batch, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        try model.uploadBatch(batch, diag);
        try replay.run(model, batch.rows(), batch.logits_rows.len, reduce, diag);
    }

    /// Queues the whole forward on the stream; the batch is already on the device.
    pub fn enqueue(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const c = model.config;
        const k: K.Kernels = .{ .gpu = &model.gpu, .module = &model.module, .diag = diag };
        if (c.hyper.mult > 0) return hyper_cuda.enqueue(model, k, rows, wanted, reduce, diag);
        model.at(null, .embed);
        try k.embed(model.tokens, model.embed, model.embed_dtype, model.hidden, rows, c.hidden_size);
        // Each residual add is fused with the norm that follows it: the post-attention norm, the
        // next layer's input norm, or the final norm.
        if (model.blocks.len > 0) try k.rmsnorm(model.hidden, model.blocks[0].input_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
        for (model.blocks, 0..) |*block, layer| {
            model.at(layer, .attention);
            try model.attentionPart(k, block, layer, rows);
            model.at(layer, .norm);
            if (reduce) |r| r.sum(r.context, model, model.projected, rows * c.hidden_size, diag) catch return error.CudaFailed;
            try k.addRmsnorm(model.hidden, model.projected, block.post_attention_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            model.at(layer, .ffn);
            try model.ffnPart(k, block, rows);
            model.at(layer, .norm);
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
        model.at(null, .head);
        if (model.blocks.len == 0) try k.rmsnorm(model.hidden, model.norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
        try model.head(k, wanted);
    }

    /// model.projected = the layer's attention part on model.normed.
    pub fn attentionPart(model: *GpuModel, k: K.Kernels, block: *const GpuBlock, layer: usize, rows: usize) Error!void {
        const c = model.config;
        switch (block.attention) {
            .gqa => |*part| try gqa_cuda.attention(model, k, part, c.indexAmong(layer, "attention", .gqa), rows),
            .mla => |*part| try mla_cuda.attention(model, k, part, c.plan[layer], .{
                .mla = c.indexAmong(layer, "attention", .mla),
                .index = c.indexAmong(layer, "indexer", .full),
            }, rows),
            .kda => |*part| try kda_cuda.attention(model, k, part, c.indexAmong(layer, "attention", .kda), rows),
        }
    }

    /// model.ffn_out = the layer's FFN part on model.normed.
    pub fn ffnPart(model: *GpuModel, k: K.Kernels, block: *const GpuBlock, rows: usize) Error!void {
        switch (block.ffn) {
            .dense => |*mlp| try model.runMlp(k, mlp, model.normed, model.ffn_out, rows),
            .moe => |*moe| try moe_cuda.runMoe(model, k, moe, rows),
        }
    }

    /// The logits of the wanted rows of model.normed (the final norm's output) and their summaries.
    pub fn head(model: *GpuModel, k: K.Kernels, wanted: usize) Error!void {
        const c = model.config;
        std.debug.assert(!model.lm_head.absent()); // a TP worker's forwards want no logits
        switch (model.lm_head.kind) {
            .exl3 => try model.runLinear(k, &model.lm_head, model.normed, model.logits, wanted, model.logits_rows),
            .dense => |dense| {
                try k.gatherRows(model.normed, model.logits_rows, model.projected, wanted, c.hidden_size);
                try model.runDense(k, dense, model.projected, model.logits, wanted, c.hidden_size, c.vocab_size);
            },
        }
        try k.logitsSummary(model.logits, model.summaries, wanted, c.vocab_size);
    }
};
