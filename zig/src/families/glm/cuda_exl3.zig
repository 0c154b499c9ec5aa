//! The class-A forward on the GPU: the same steps as forward_cpu.zig, on weights uploaded once from
//! the checked host `Weights`, with the KV cache in device memory. Kernels: glm_forward.cu through
//! cuda/glm_kernels.zig. Experts take the grouped path: every (row, selected expert) pair is one
//! item of the EXL3 kernels, reading that expert's trellis in place through a pointer table.
//!
//! f32 arithmetic, the trellis decoded per item. Forwards of few rows (decode steps) are recorded
//! once per (rows, logits rows) as a CUDA graph and replayed: a GLM-4.5-Air step is ~1800 launches,
//! whose host cost and gaps a replay removes. Sampling stays on the host: the logits of the sampled
//! rows are copied back.
const std = @import("std");
const core = @import("../../core/root.zig");
const cuda = @import("../../cuda/root.zig");
const exl3 = @import("../../exl3/root.zig");
const weights_mod = @import("weights.zig");
const rope = @import("rope.zig");
const forward_cpu = @import("forward_cpu.zig");
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
        exl3: struct { table: Ptr, k_p: usize, n_p: usize, bits2: u8, codebook: u8 },
        dense: struct { weight: Ptr, bias: Ptr },
    },
};

/// One projection of all experts: a table of Exl3Layer, one per expert, sharing shape and rate.
const GroupedLinear = struct { table: Ptr, in_features: usize, out_features: usize, k_p: usize, n_p: usize, bits2: u8, codebook: u8 };

const GpuMlp = struct { gate: GpuLinear, up: GpuLinear, down: GpuLinear };

const GpuBlock = struct {
    input_norm: Ptr,
    post_attention_norm: Ptr,
    q: GpuLinear,
    k: GpuLinear,
    v: GpuLinear,
    o: GpuLinear,
    q_norm: Ptr,
    k_norm: Ptr,
    ffn: union(enum) {
        dense: GpuMlp,
        moe: struct { router: Ptr, correction: Ptr, gate: GroupedLinear, up: GroupedLinear, down: GroupedLinear, shared: ?GpuMlp },
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
const graph_slots = 16;

const GraphSlot = struct { rows: usize, wanted: usize, graph: cuda.gpu.Graph };

pub const GpuModel = struct {
    gpa: std.mem.Allocator,
    gpu: cuda.Gpu,
    module: K.Module,
    config: Config,
    limits: Limits,
    allocations: std.ArrayList(Ptr),
    graphs: [graph_slots]?GraphSlot,
    graph_next: usize,
    graphs_enabled: bool,
    graph_replays: u64,
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
    k: Ptr,
    v: Ptr,
    attention_out: Ptr,
    projected: Ptr,
    ffn_out: Ptr,
    gate: Ptr,
    up: Ptr,
    items_out: Ptr,
    shared_out: Ptr,
    xr: Ptr,
    acc: Ptr,
    scores: Ptr,
    attention_rows_max: usize,
    route_experts: Ptr,
    route_weights: Ptr,
    route_scratch: Ptr,
    expert_rows: Ptr,
    logits: Ptr,
    // Host staging.
    host_tables: []u32,
    host_offsets: []u32,
    host_cos_sin: []f32,
    host_expert_rows: []i32,

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
        model.graphs_enabled = limits.graphs and !graphsOffInEnvironment();
        model.gpu = try cuda.Gpu.open(limits.device, diag);
        errdefer model.gpu.close();
        errdefer model.freeAll();
        model.module = try K.load(&model.gpu, diag);
        errdefer model.module.unload(&model.gpu);
        try model.upload(weights, diag);
        try model.allocateScratch(diag);
        return model;
    }

    pub fn deinit(model: *GpuModel) void {
        const gpa = model.gpa;
        for (&model.graphs) |*slot| if (slot.*) |*entry| entry.graph.destroy(&model.gpu);
        model.freeAll();
        model.module.unload(&model.gpu);
        model.gpu.close();
        gpa.free(model.host_tables);
        gpa.free(model.host_offsets);
        gpa.free(model.host_cos_sin);
        gpa.free(model.host_expert_rows);
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
            target.* = .{
                .input_norm = try model.putF32(block.input_norm, diag),
                .post_attention_norm = try model.putF32(block.post_attention_norm, diag),
                .q = try model.uploadLinear(&block.q, diag),
                .k = try model.uploadLinear(&block.k, diag),
                .v = try model.uploadLinear(&block.v, diag),
                .o = try model.uploadLinear(&block.o, diag),
                .q_norm = if (block.q_norm) |w| try model.putF32(w, diag) else 0,
                .k_norm = if (block.k_norm) |w| try model.putF32(w, diag) else 0,
                .ffn = switch (block.ffn) {
                    .dense => |*mlp| .{ .dense = try model.uploadMlp(mlp, diag) },
                    .moe => |*moe| .{ .moe = .{
                        .router = try model.putF32(moe.router, diag),
                        .correction = try model.putF32(moe.correction_bias, diag),
                        .gate = try model.grouped(moe.experts, "gate", diag),
                        .up = try model.grouped(moe.experts, "up", diag),
                        .down = try model.grouped(moe.experts, "down", diag),
                        .shared = if (moe.shared) |*shared| try model.uploadMlp(shared, diag) else null,
                    } },
                },
            };
        }
        model.norm = try model.putF32(weights.norm, diag);
        model.lm_head = try model.uploadLinear(&weights.lm_head, diag);
    }

    fn uploadMlp(model: *GpuModel, source: *const weights_mod.Mlp, diag: *Diagnostic) Error!GpuMlp {
        return .{ .gate = try model.uploadLinear(&source.gate, diag), .up = try model.uploadLinear(&source.up, diag), .down = try model.uploadLinear(&source.down, diag) };
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
                        .k_p = layer.rows,
                        .n_p = layer.columns,
                        .bits2 = layer.rate.bits2,
                        .codebook = @intFromEnum(layer.codebook),
                    } };
                },
                .dense => |dense| .{ .dense = .{
                    .weight = try model.putF32(dense.weight, diag),
                    .bias = if (dense.bias) |b| try model.putF32(b, diag) else 0,
                } },
            },
        };
    }

    fn grouped(model: *GpuModel, experts: []const weights_mod.Mlp, comptime which: []const u8, diag: *Diagnostic) Error!GroupedLinear {
        const first = &@field(experts[0], which);
        const layer0 = switch (first.kind) {
            .exl3 => |*l| l,
            .dense => {
                diag.set("the CUDA backend runs EXL3 experts only; this checkpoint's experts are unquantized", .{});
                return error.UnsupportedModel;
            },
        };
        const entries = try model.gpa.alloc(K.Exl3Layer, experts.len);
        defer model.gpa.free(entries);
        for (experts, entries, 0..) |*expert, *entry, e| {
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
            .codebook = @intFromEnum(layer0.codebook),
        };
    }

    fn allocateScratch(model: *GpuModel, diag: *Diagnostic) Error!void {
        const c = model.config;
        const l = model.limits;
        const rows = l.rows_max;
        const items = rows * c.experts_per_token;
        const f = @sizeOf(f32);
        var padded_max: usize = 128;
        var width_max: usize = @max(c.hidden_size, c.heads * c.head_dim);
        const intermediate = @max(c.intermediate_size, c.moe_intermediate_size * @max(c.shared_experts, 1));
        width_max = @max(width_max, intermediate);
        padded_max = @max(padded_max, std.mem.alignForward(usize, @max(width_max, c.vocab_size), 128));
        model.tokens = try model.alloc(rows * 4, diag);
        model.positions = try model.alloc(rows * 4, diag);
        model.tables = try model.alloc(rows * l.pages_per_sequence * 4, diag);
        model.table_offsets = try model.alloc(rows * 4, diag);
        model.logits_rows = try model.alloc(l.logits_rows_max * 4, diag);
        model.cos_sin = try model.alloc(rows * @max(c.rotary_dim, 2) * f, diag);
        model.hidden = try model.alloc(rows * c.hidden_size * f, diag);
        model.normed = try model.alloc(rows * c.hidden_size * f, diag);
        model.q = try model.alloc(rows * c.heads * c.head_dim * f, diag);
        model.k = try model.alloc(rows * c.kv_heads * c.head_dim * f, diag);
        model.v = try model.alloc(rows * c.kv_heads * c.head_dim * f, diag);
        model.attention_out = try model.alloc(rows * c.heads * c.head_dim * f, diag);
        model.projected = try model.alloc(rows * c.hidden_size * f, diag);
        model.ffn_out = try model.alloc(rows * c.hidden_size * f, diag);
        model.gate = try model.alloc(items * intermediate * f, diag);
        model.up = try model.alloc(items * intermediate * f, diag);
        model.items_out = try model.alloc(items * c.hidden_size * f, diag);
        model.shared_out = try model.alloc(rows * c.hidden_size * f, diag);
        model.xr = try model.alloc(@max(items, l.logits_rows_max) * padded_max * f, diag);
        model.acc = try model.alloc(model.partialsNeeded() * f, diag);
        // Attention scores: (rows, heads, context) would be large at long contexts; the kernel
        // runs over row chunks that fit 256 MiB.
        const per_row = c.heads * l.context_max * f;
        model.attention_rows_max = @max(1, @min(rows, (256 << 20) / per_row));
        model.scores = try model.alloc(model.attention_rows_max * per_row, diag);
        model.route_experts = try model.alloc(items * 4, diag);
        model.route_weights = try model.alloc(items * f, diag);
        model.route_scratch = try model.alloc(rows * 2 * c.routed_experts * f, diag);
        model.expert_rows = try model.alloc(items * 4, diag);
        model.logits = try model.alloc(l.logits_rows_max * c.vocab_size * f, diag);
        const cache_values = l.pages * c.layers * c.kv_heads * l.page_tokens * c.head_dim;
        model.cache_k = try model.alloc(cache_values * f, diag);
        model.cache_v = try model.alloc(cache_values * f, diag);
        model.host_tables = try model.gpa.alloc(u32, rows * l.pages_per_sequence);
        model.host_offsets = try model.gpa.alloc(u32, rows);
        model.host_cos_sin = try model.gpa.alloc(f32, rows * @max(c.rotary_dim, 2));
        model.host_expert_rows = try model.gpa.alloc(i32, items);
        for (model.host_expert_rows, 0..) |*r, i| r.* = @intCast(i / c.experts_per_token);
        try model.gpu.upload(model.expert_rows, std.mem.sliceAsBytes(model.host_expert_rows), diag);
    }

    /// Sums a rank's partial outputs across tensor-parallel ranks, in place on the device.
    pub const Reduce = struct {
        context: *anyopaque,
        sum: *const fn (context: *anyopaque, model: *GpuModel, buffer: Ptr, count: usize, diag: *Diagnostic) anyerror!void,
    };

    /// Floats of GEMV partial sums the largest call needs: splits(k_p) x items x n_p.
    fn partialsNeeded(model: *const GpuModel) usize {
        const c = model.config;
        const l = model.limits;
        var need: usize = 0;
        const Need = struct {
            fn of(linear: *const GpuLinear, items: usize) usize {
                return switch (linear.kind) {
                    .exl3 => |e| K.splitsFor(e.k_p) * items * e.n_p,
                    .dense => 0,
                };
            }
            fn grouped(g: GroupedLinear, items: usize) usize {
                return K.splitsFor(g.k_p) * items * g.n_p;
            }
        };
        need = @max(need, Need.of(&model.lm_head, l.logits_rows_max));
        for (model.blocks) |*block| {
            for ([_]*const GpuLinear{ &block.q, &block.k, &block.v, &block.o }) |linear| need = @max(need, Need.of(linear, l.rows_max));
            switch (block.ffn) {
                .dense => |*mlp| for ([_]*const GpuLinear{ &mlp.gate, &mlp.up, &mlp.down }) |linear| {
                    need = @max(need, Need.of(linear, l.rows_max));
                },
                .moe => |*moe| {
                    const items = l.rows_max * c.experts_per_token;
                    need = @max(need, @max(Need.grouped(moe.gate, items), Need.grouped(moe.up, items), Need.grouped(moe.down, items)));
                    if (moe.shared) |*mlp| for ([_]*const GpuLinear{ &mlp.gate, &mlp.up, &mlp.down }) |linear| {
                        need = @max(need, Need.of(linear, l.rows_max));
                    };
                },
            }
        }
        return @max(need, 1);
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
        try model.uploadBatch(batch, diag);
        // A rank's reduction runs on the host between launches: it cannot be recorded.
        if (reduce == null and model.graphs_enabled and rows <= graph_rows_max) {
            const graph = try model.graphFor(rows, wanted, diag);
            try graph.launch(&model.gpu, diag);
            model.graph_replays += 1;
        } else {
            try model.enqueue(rows, wanted, reduce, diag);
        }
        if (wanted == 0) return model.gpu.synchronize(diag);
        try model.gpu.download(std.mem.sliceAsBytes(logits[0 .. wanted * c.vocab_size]), model.logits, diag);
    }

    /// The recorded forward of `rows` rows with `wanted` logits rows, recorded on first use. Every
    /// launch reads its per-step inputs (tokens, positions, page tables, logits rows) from device
    /// buffers that `uploadBatch` refills, so one recording serves every step of that size.
    fn graphFor(model: *GpuModel, rows: usize, wanted: usize, diag: *Diagnostic) Error!cuda.gpu.Graph {
        for (model.graphs) |slot| if (slot) |entry| {
            if (entry.rows == rows and entry.wanted == wanted) return entry.graph;
        };
        try cuda.gpu.Graph.beginCapture(&model.gpu, diag);
        model.enqueue(rows, wanted, null, diag) catch |err| {
            _ = cuda.gpu.Graph.endCapture(&model.gpu, false, diag) catch {};
            return err;
        };
        const graph = try cuda.gpu.Graph.endCapture(&model.gpu, true, diag);
        const slot = &model.graphs[model.graph_next % graph_slots];
        model.graph_next += 1;
        if (slot.*) |*old| old.graph.destroy(&model.gpu);
        slot.* = .{ .rows = rows, .wanted = wanted, .graph = graph };
        return graph;
    }

    /// Queues the whole forward on the stream; the batch is already on the device.
    fn enqueue(model: *GpuModel, rows: usize, wanted: usize, reduce: ?Reduce, diag: *Diagnostic) Error!void {
        const c = model.config;
        const k: K.Kernels = .{ .gpu = &model.gpu, .module = &model.module, .diag = diag };
        try k.embed(model.tokens, model.embed, model.hidden, rows, c.hidden_size);
        for (model.blocks, 0..) |*block, layer| {
            try k.rmsnorm(model.hidden, block.input_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            try model.attention(k, block, layer, rows);
            if (reduce) |r| r.sum(r.context, model, model.projected, rows * c.hidden_size, diag) catch return error.CudaFailed;
            try k.add(model.hidden, model.projected, rows * c.hidden_size);
            try k.rmsnorm(model.hidden, block.post_attention_norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
            switch (block.ffn) {
                .dense => |*mlp| try model.runMlp(k, mlp, model.normed, model.ffn_out, rows),
                .moe => |*moe| try model.runMoe(k, moe, rows),
            }
            if (reduce) |r| r.sum(r.context, model, model.ffn_out, rows * c.hidden_size, diag) catch return error.CudaFailed;
            try k.add(model.hidden, model.ffn_out, rows * c.hidden_size);
        }
        if (wanted == 0) return;
        try k.rmsnorm(model.hidden, model.norm, model.normed, rows, c.hidden_size, c.rms_norm_eps);
        switch (model.lm_head.kind) {
            .exl3 => try model.runLinear(k, &model.lm_head, model.normed, model.logits, wanted, model.logits_rows),
            .dense => |dense| {
                try k.gatherRows(model.normed, model.logits_rows, model.projected, wanted, c.hidden_size);
                try k.denseLinear(model.projected, dense.weight, dense.bias, model.logits, wanted, c.hidden_size, c.vocab_size);
            },
        }
    }

    fn uploadBatch(model: *GpuModel, batch: forward_cpu.Batch, diag: *Diagnostic) Error!void {
        const c = model.config;
        const rows = batch.rows();
        var at: usize = 0;
        for (batch.page_tables, 0..) |table, r| {
            model.host_offsets[r] = @intCast(at);
            @memcpy(model.host_tables[at..][0..table.len], table);
            at += table.len;
            rope.cosSin(c, batch.positions[r], model.host_cos_sin[r * c.rotary_dim ..][0..c.rotary_dim]);
        }
        try model.gpu.upload(model.tokens, std.mem.sliceAsBytes(batch.tokens), diag);
        try model.gpu.upload(model.positions, std.mem.sliceAsBytes(batch.positions), diag);
        try model.gpu.upload(model.tables, std.mem.sliceAsBytes(model.host_tables[0..@max(at, 1)]), diag);
        try model.gpu.upload(model.table_offsets, std.mem.sliceAsBytes(model.host_offsets[0..rows]), diag);
        if (c.rotary_dim > 0) try model.gpu.upload(model.cos_sin, std.mem.sliceAsBytes(model.host_cos_sin[0 .. rows * c.rotary_dim]), diag);
        if (batch.logits_rows.len > 0) try model.gpu.upload(model.logits_rows, std.mem.sliceAsBytes(batch.logits_rows), diag);
    }

    fn attention(model: *GpuModel, k: K.Kernels, block: *const GpuBlock, layer: usize, rows: usize) Error!void {
        const c = model.config;
        try model.runLinear(k, &block.q, model.normed, model.q, rows, 0);
        try model.runLinear(k, &block.k, model.normed, model.k, rows, 0);
        try model.runLinear(k, &block.v, model.normed, model.v, rows, 0);
        try k.qkRopeStore(.{
            .q = model.q, .k = model.k, .v = model.v, .q_norm = block.q_norm, .k_norm = block.k_norm,
            .cos_sin = model.cos_sin, .positions = model.positions, .tables = model.tables, .table_offsets = model.table_offsets,
            .cache_k = model.cache_k, .cache_v = model.cache_v, .rows = rows, .heads = c.heads, .kv_heads = c.kv_heads,
            .head_dim = c.head_dim, .rotary_dim = c.rotary_dim, .eps = c.rms_norm_eps, .layers = c.layers, .layer = layer,
            .page_tokens = model.limits.page_tokens,
        });
        var start: usize = 0;
        while (start < rows) : (start += model.attention_rows_max) {
            const count = @min(model.attention_rows_max, rows - start);
            try k.attention(.{
                .q = model.q + start * c.heads * c.head_dim * 4, .cache_k = model.cache_k, .cache_v = model.cache_v,
                .positions = model.positions + start * 4, .tables = model.tables, .table_offsets = model.table_offsets + start * 4,
                .scores = model.scores, .out = model.attention_out + start * c.heads * c.head_dim * 4, .rows = count,
                .heads = c.heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim, .layers = c.layers, .layer = layer,
                .page_tokens = model.limits.page_tokens, .context_max = model.limits.context_max,
            });
        }
        try model.runLinear(k, &block.o, model.attention_out, model.projected, rows, 0);
    }

    /// rows_wanted: 0, or a device array naming which rows of x to run (the logits rows).
    fn runLinear(model: *GpuModel, k: K.Kernels, linear: *const GpuLinear, x: Ptr, y: Ptr, rows: usize, rows_wanted: Ptr) Error!void {
        switch (linear.kind) {
            .exl3 => |e| try k.exl3Linear(.{
                .x = x, .source_rows = rows_wanted, .layer_of_item = 0, .table = e.table, .xr = model.xr, .acc = model.acc, .y = y,
                .items = rows, .in_features = linear.in_features, .out_features = linear.out_features, .k_p = e.k_p, .n_p = e.n_p,
                .bits2 = e.bits2, .codebook = e.codebook,
            }),
            .dense => |d| {
                std.debug.assert(rows_wanted == 0);
                try k.denseLinear(x, d.weight, d.bias, y, rows, linear.in_features, linear.out_features);
            },
        }
    }

    fn runMlp(model: *GpuModel, k: K.Kernels, mlp: *const GpuMlp, x: Ptr, out: Ptr, rows: usize) Error!void {
        try model.runLinear(k, &mlp.gate, x, model.gate, rows, 0);
        try model.runLinear(k, &mlp.up, x, model.up, rows, 0);
        try k.swiglu(model.gate, model.up, rows * mlp.gate.out_features);
        try model.runLinear(k, &mlp.down, model.gate, out, rows, 0);
    }

    fn runGrouped(model: *GpuModel, k: K.Kernels, g: GroupedLinear, x: Ptr, source_rows: Ptr, y: Ptr, items: usize) Error!void {
        try k.exl3Linear(.{
            .x = x, .source_rows = source_rows, .layer_of_item = model.route_experts, .table = g.table, .xr = model.xr, .acc = model.acc,
            .y = y, .items = items, .in_features = g.in_features, .out_features = g.out_features, .k_p = g.k_p, .n_p = g.n_p,
            .bits2 = g.bits2, .codebook = g.codebook,
        });
    }

    fn runMoe(model: *GpuModel, k: K.Kernels, moe: anytype, rows: usize) Error!void {
        const c = model.config;
        const items = rows * c.experts_per_token;
        try k.route(.{
            .x = model.normed, .gate = moe.router, .correction = moe.correction, .experts_out = model.route_experts,
            .weights_out = model.route_weights, .scratch = model.route_scratch, .rows = rows, .hidden = c.hidden_size,
            .experts = c.routed_experts, .top_k = c.experts_per_token, .groups = c.groups, .groups_per_token = c.groups_per_token,
            .normalize = c.norm_topk_prob, .scaling = c.routed_scaling_factor,
        });
        // Item i = (row i / top_k, slot i % top_k) reads its row and its expert's trellis.
        try model.runGrouped(k, moe.gate, model.normed, model.expert_rows, model.gate, items);
        try model.runGrouped(k, moe.up, model.normed, model.expert_rows, model.up, items);
        try k.swiglu(model.gate, model.up, items * moe.gate.out_features);
        try model.runGrouped(k, moe.down, model.gate, 0, model.items_out, items);
        var shared: Ptr = 0;
        if (moe.shared) |*mlp| {
            try model.runMlp(k, mlp, model.normed, model.shared_out, rows);
            shared = model.shared_out;
        }
        try k.moeCombine(model.items_out, model.route_weights, shared, model.ffn_out, rows, c.experts_per_token, c.hidden_size);
    }
};

fn graphsOffInEnvironment() bool {
    const text = std.c.getenv("TF_CUDA_GRAPHS") orelse return false;
    return std.mem.eql(u8, std.mem.span(text), "0");
}
