//! The engine: sequences, their paged KV, and `step()`, one forward over a batch that mixes prompt
//! chunks and decode rows of many sequences (continuous batching with chunked prefill). Everything
//! a step uses is allocated in `init`; the pages a step's rows take are reserved before it plans
//! them (admission.zig: younger sequences are preempted when the shared pool is spent), so a step
//! never runs out of pages and never touches another sequence's.
const std = @import("std");
const assert = std.debug.assert;
const core = @import("../core/root.zig");
const glm = @import("../families/glm/root.zig");
const KvPages = @import("kv_pages.zig").KvPages;
const PrefixCache = @import("prefix_cache.zig").PrefixCache;
const sequence_pages = @import("sequence_pages.zig");
const sampler = @import("sampler.zig");
const token_mask = @import("token_mask.zig");
const logit_bias = @import("logit_bias.zig");
const sequence_controls = @import("sequence_controls.zig");
const admission = @import("admission.zig");
const TensorParallel = @import("tensor_parallel.zig").TensorParallel;
const distributed = @import("distributed.zig");
const gpu_sampling = @import("../cuda/sampling.zig");
const state_snapshots = @import("state_snapshots.zig");

/// Where rank 0 listens for the other ranks of a multi-process tensor-parallel group.
pub const Master = struct { host: []const u8, port: u16 };
const Diagnostic = core.Diagnostic;

pub const Error = error{ InvalidArgument, NotFound, OutOfMemory, UnsupportedModel, InvalidConfig, NoConfig } ||
    core.checkpoint.Error || glm.weights.Error || glm.cuda_model.Error || distributed.Error;

const params_mod = @import("params.zig");
pub const Backend = params_mod.Backend;
pub const Params = params_mod.Params;
const records_mod = @import("records.zig");
pub const Finish = records_mod.Finish;
pub const Record = records_mod.Record;
pub const Stats = records_mod.Stats;
pub const runWorker = @import("worker.zig").runWorker;

pub const stop_tokens_max = 64;

const State = enum { free, waiting, active };

pub const Sequence = struct {
    state: State = .free,
    id: u64 = 0,
    /// prompt ++ generated tokens; `tokens[0..computed]` are in the cache.
    tokens: []u32,
    prompt_len: usize = 0,
    length: usize = 0,
    computed: usize = 0,
    pages: []u32,
    pages_used: usize = 0,
    pages_reserved: usize = 0,
    /// Prompt tokens mapped from the prefix cache, and the pages offered to it so far.
    cached_tokens: usize = 0,
    pages_offered: usize = 0,
    sampling: sampler.Params = .{},
    stop_tokens: [stop_tokens_max]u32 = undefined,
    stop_count: usize = 0,
    prng: std.Random.DefaultPrng = undefined,
    /// The allowed tokens of a constrained sequence's next token (token_mask.zig).
    mask: []u32,
    mask_state: token_mask.State = .none,
    /// OpenAI's logit_bias for each of its sampled tokens (logit_bias.zig).
    bias: logit_bias.Bias,
};

pub const Engine = struct {
    gpa: std.mem.Allocator,
    checkpoint: ?core.Checkpoint, // null for an in-memory synthetic model
    weights: glm.Weights,
    params: Params,
    pages: KvPages,
    /// Prefix caching, when asked for (a recurrent model's with `snapshots` of its state).
    prefix: ?PrefixCache,
    /// A recurrent model's state after cached pages (state_snapshots.zig); null otherwise.
    snapshots: ?state_snapshots.StateSnapshots,
    /// The KV cache's storage on the host: the CPU backend's (the GPU model keeps its own, as do
    /// tensor-parallel ranks).
    host_cache: ?glm.cache.HostCache,
    scratch: glm.forward_cpu.Scratch,
    sequences: []Sequence,
    pages_reserved: usize,
    next_id: u64,
    /// Sequences sent back to wait for pages (admission.zig), since init.
    preemptions: u64,
    workspace: sampler.Workspace,
    // Per-step plan, sized for rows_max rows.
    batch_tokens: []u32,
    batch_positions: []u32,
    batch_tables: [][]const u32,
    batch_slots: []u32,
    batch_prompt: []bool,
    logits_rows: []u32,
    logits_slots: []u32,
    logits: []f32, // (logits_rows_max, vocab)
    summaries: []core.LogitsSummary, // (logits_rows_max)
    /// Per logits row of a step: whether its sampling reads the row (sampler.needsLogits).
    logits_wanted: []bool,
    /// GPU sampling: the step's jobs, their choices, and each logits row's job (or none).
    sample_jobs: []gpu_sampling.Job,
    sample_choices: []gpu_sampling.Choice,
    job_of_row: []?u32,
    gpu_sampling: bool,
    gpu_sampled: u64,
    logits_rows_max: usize,
    plan_arena: std.heap.ArenaAllocator,
    gpu_model: ?*glm.cuda_model.GpuModel,
    tensor_parallel: ?*TensorParallel,
    distributed_rank: ?*distributed.Rank,

    /// With `master`, this engine is rank 0 of `tp_world` processes and waits for the others.
    pub fn init(gpa: std.mem.Allocator, model_dir: []const u8, requested: Params, master: ?Master, diag: *Diagnostic) Error!*Engine {
        if (requested.backend != @backingInt(Backend.cpu) and requested.backend != @backingInt(Backend.cuda)) {
            diag.set("backend {d} is neither 0 (cpu) nor 1 (cuda)", .{requested.backend});
            return error.InvalidArgument;
        }
        const engine = try gpa.create(Engine);
        errdefer gpa.destroy(engine);
        engine.gpa = gpa;

        engine.checkpoint = try core.Checkpoint.open(gpa, model_dir, diag);
        errdefer engine.checkpoint.?.deinit();
        const model_config = engine.checkpoint.?.config orelse {
            diag.set("'{s}' has no config.json", .{model_dir});
            return error.NoConfig;
        };
        const model = try glm.Config.parse(&model_config, diag);
        engine.weights = try glm.Weights.load(gpa, &engine.checkpoint.?, model, diag);
        errdefer engine.weights.deinit(gpa);
        try engine.initRest(requested, master, diag);
        return engine;
    }

    /// A model made in memory from `config_json` (a config.json's text) with random EXL3 weights
    /// (families/glm/synthetic.zig): full-size benchmarks without checkpoint files.
    pub fn initSynthetic(gpa: std.mem.Allocator, config_json: []const u8, requested: Params, bits: u32, seed: u64, diag: *Diagnostic) Error!*Engine {
        if (bits < 1 or bits > 8) {
            diag.set("synthetic bits must be 1..8, not {d}", .{bits});
            return error.InvalidArgument;
        }
        const engine = try gpa.create(Engine);
        errdefer gpa.destroy(engine);
        engine.gpa = gpa;
        engine.checkpoint = null;
        var arena = std.heap.ArenaAllocator.init(gpa);
        defer arena.deinit();
        const model_config = try core.config.ModelConfig.parse(arena.allocator(), config_json, diag);
        const model = try glm.Config.parse(&model_config, diag);
        engine.weights = try glm.synthetic.generate(gpa, model, @intCast(bits), 6, seed);
        errdefer engine.weights.deinit(gpa);
        try engine.initRest(requested, null, diag);
        return engine;
    }

    /// Everything after the weights: cache, scratch, plan, and the backend's model.
    fn initRest(engine: *Engine, requested: Params, master: ?Master, diag: *Diagnostic) Error!void {
        const gpa = engine.gpa;
        const model = engine.weights.config;

        engine.params = try params_mod.resolve(requested, model, diag);
        const p = engine.params;
        engine.pages = try KvPages.init(gpa, p.kv_pages, p.page_tokens);
        errdefer engine.pages.deinit(gpa);
        // A recurrent model is cached with state snapshots (state_snapshots.zig).
        const recurrent = glm.cache.floatsPerSequence(&model) > 0;
        engine.prefix = if (p.prefix_cache != 0) try PrefixCache.init(gpa, p.kv_pages, p.page_tokens) else null;
        errdefer if (engine.prefix) |*cache| cache.deinit(gpa);
        const snapshots: usize = if (engine.prefix != null and recurrent) @min(p.sequences_max, state_snapshots.count_max) else 0;
        engine.snapshots = if (snapshots > 0) try state_snapshots.StateSnapshots.init(gpa, snapshots, @intCast(p.sequences_max)) else null;
        errdefer if (engine.snapshots) |*s| s.deinit(gpa);
        engine.host_cache = null;
        if (p.backend == @backingInt(Backend.cpu) and p.tp_world == 1) {
            engine.host_cache = try glm.cache.HostCache.init(gpa, &model, params_mod.kvDtype(p), p.kv_pages, p.page_tokens, p.sequences_max + snapshots);
        }
        errdefer if (engine.host_cache) |*cache| cache.deinit(gpa);
        engine.scratch = try glm.forward_cpu.Scratch.init(gpa, &engine.weights, p.rows_max, p.context_tokens_max);
        errdefer engine.scratch.deinit();
        engine.workspace = try sampler.Workspace.init(gpa, model.vocab_size);
        errdefer engine.workspace.deinit(gpa);
        try engine.allocPlan();
        errdefer engine.plan_arena.deinit();
        engine.gpu_model = null;
        if (p.backend == @backingInt(Backend.cuda) and master == null) {
            engine.gpu_model = try glm.cuda_model.GpuModel.init(gpa, &engine.weights, .{
                .rows_max = p.rows_max,
                .logits_rows_max = engine.logits_rows_max,
                .context_max = p.context_tokens_max,
                .pages = p.kv_pages,
                .page_tokens = p.page_tokens,
                .pages_per_sequence = engine.sequences[0].pages.len,
                .sequences = p.sequences_max,
                .state_snapshots = snapshots,
                .kv_dtype = params_mod.kvDtype(p),
            }, diag);
        }
        errdefer if (engine.gpu_model) |gpu_model| gpu_model.deinit();
        engine.tensor_parallel = null;
        engine.distributed_rank = null;
        if (master) |m| {
            if (p.tp_world < 2) {
                diag.set("a tensor-parallel master needs tp_world >= 2", .{});
                return error.InvalidArgument;
            }
            engine.distributed_rank = try distributed.Rank.initMaster(gpa, &engine.weights, .{
                .world = p.tp_world,
                .backend = @intCast(p.backend),
                .collective = @backingInt(distributed.Collective.choose(p.backend == @backingInt(Backend.cuda))),
                .logits_rows_max = @intCast(engine.logits_rows_max),
                .rows_max = p.rows_max,
                .context_max = p.context_tokens_max,
                .pages = p.kv_pages,
                .page_tokens = p.page_tokens,
                .pages_per_sequence = @intCast(engine.sequences[0].pages.len),
                .sequences = p.sequences_max,
                .kv_dtype = p.kv_dtype,
                .state_snapshots = @intCast(snapshots),
            }, m.host, m.port, diag);
        } else if (p.tp_world > 1) {
            if (p.backend != @backingInt(Backend.cpu)) {
                diag.set("tensor parallelism inside one process runs on the cpu backend; GPUs take one process per rank", .{});
                return error.InvalidArgument;
            }
            engine.tensor_parallel = try TensorParallel.init(gpa, &engine.weights, .{
                .world = p.tp_world,
                .rows_max = p.rows_max,
                .context_max = p.context_tokens_max,
                .pages = p.kv_pages,
                .page_tokens = p.page_tokens,
                .sequences = p.sequences_max + snapshots,
                .kv_dtype = params_mod.kvDtype(p),
            }, diag);
        }
        engine.pages_reserved = 0;
        engine.next_id = 1;
        engine.preemptions = 0;
    }

    /// Sequences and the per-step plan, all from one arena freed with the engine.
    fn allocPlan(engine: *Engine) Error!void {
        engine.plan_arena = std.heap.ArenaAllocator.init(engine.gpa);
        errdefer engine.plan_arena.deinit();
        const a = engine.plan_arena.allocator();
        const p = engine.params;
        const pages_per_sequence = std.math.divCeil(usize, p.context_tokens_max, p.page_tokens) catch unreachable;
        engine.sequences = try a.alloc(Sequence, p.sequences_max);
        for (engine.sequences) |*s| s.* = .{
            .tokens = try a.alloc(u32, p.context_tokens_max),
            .pages = try a.alloc(u32, pages_per_sequence),
            .mask = try a.alloc(u32, token_mask.wordsFor(engine.weights.config.vocab_size)),
            .bias = .{ .tokens = try a.alloc(u32, logit_bias.entries_max), .values = try a.alloc(f32, logit_bias.entries_max) },
        };
        const rows = p.rows_max;
        engine.batch_tokens = try a.alloc(u32, rows);
        engine.batch_positions = try a.alloc(u32, rows);
        engine.batch_tables = try a.alloc([]const u32, rows);
        engine.batch_slots = try a.alloc(u32, rows);
        engine.batch_prompt = try a.alloc(bool, rows);
        engine.logits_rows_max = @max(p.sequences_max, @min(rows, 64));
        engine.logits_rows = try a.alloc(u32, engine.logits_rows_max);
        engine.logits_slots = try a.alloc(u32, engine.logits_rows_max);
        engine.logits = try a.alloc(f32, engine.logits_rows_max * engine.weights.config.vocab_size);
        engine.summaries = try a.alloc(core.LogitsSummary, engine.logits_rows_max);
        engine.logits_wanted = try a.alloc(bool, engine.logits_rows_max);
        engine.sample_jobs = try a.alloc(gpu_sampling.Job, engine.logits_rows_max);
        engine.sample_choices = try a.alloc(gpu_sampling.Choice, engine.logits_rows_max);
        engine.job_of_row = try a.alloc(?u32, engine.logits_rows_max);
        engine.gpu_sampling = !core.switches.off("TF_CUDA_SAMPLING");
        engine.gpu_sampled = 0;
    }

    pub fn deinit(engine: *Engine) void {
        const gpa = engine.gpa;
        if (engine.gpu_model) |model| model.deinit();
        if (engine.tensor_parallel) |group| group.deinit();
        if (engine.distributed_rank) |rank| rank.deinit();
        engine.plan_arena.deinit();
        engine.workspace.deinit(gpa);
        engine.scratch.deinit();
        if (engine.host_cache) |*cache| cache.deinit(gpa);
        if (engine.prefix) |*cache| cache.deinit(gpa);
        if (engine.snapshots) |*s| s.deinit(gpa);
        engine.pages.deinit(gpa);
        engine.weights.deinit(gpa);
        if (engine.checkpoint) |*checkpoint| checkpoint.deinit();
        gpa.destroy(engine);
    }

    pub fn config(engine: *const Engine) *const glm.Config {
        return &engine.weights.config;
    }

    /// Queues a sequence; it becomes active in a later step once its prompt's pages fit (admission.zig).
    pub fn addSequence(engine: *Engine, prompt: []const u32, sampling: sampler.Params, stop_tokens: []const u32, diag: *Diagnostic) Error!u64 {
        const p = engine.params;
        if (sampling.check()) |problem| {
            diag.set("{s}", .{problem});
            return error.InvalidArgument;
        }
        if (prompt.len == 0) {
            diag.set("the prompt is empty", .{});
            return error.InvalidArgument;
        }
        if (prompt.len >= p.context_tokens_max) {
            diag.set("the prompt has {d} tokens; the context holds {d}, and at least one must be left to generate", .{ prompt.len, p.context_tokens_max });
            return error.InvalidArgument;
        }
        if (stop_tokens.len > stop_tokens_max) {
            diag.set("{d} stop tokens; at most {d}", .{ stop_tokens.len, stop_tokens_max });
            return error.InvalidArgument;
        }
        for (prompt) |t| if (t >= engine.config().vocab_size) {
            diag.set("token id {d} is outside the vocabulary of {d}", .{ t, engine.config().vocab_size });
            return error.InvalidArgument;
        };
        const pages_needed = engine.pagesFor(prompt.len);
        if (pages_needed > p.kv_pages) {
            diag.set("the sequence needs {d} KV pages but the pool has {d}", .{ pages_needed, p.kv_pages });
            return error.InvalidArgument;
        }
        const slot = for (engine.sequences, 0..) |*s, i| {
            if (s.state == .free) break i;
        } else {
            diag.set("all {d} sequence slots are in use", .{p.sequences_max});
            return error.InvalidArgument;
        };
        const sequence = &engine.sequences[slot];
        sequence.state = .waiting;
        sequence.id = engine.next_id;
        engine.next_id += 1;
        @memcpy(sequence.tokens[0..prompt.len], prompt);
        sequence.prompt_len = prompt.len;
        sequence.length = prompt.len;
        sequence.computed = 0;
        sequence.pages_used = 0;
        sequence.pages_reserved = 0; // reserved when admitted
        sequence.cached_tokens = 0;
        sequence.pages_offered = 0;
        sequence.sampling = sampling;
        @memcpy(sequence.stop_tokens[0..stop_tokens.len], stop_tokens);
        sequence.stop_count = stop_tokens.len;
        sequence.mask_state = .none;
        sequence.bias.count = 0;
        const seed = if (sampling.has_seed != 0) sampling.seed else randomSeed(sequence.id);
        sequence.prng = std.Random.DefaultPrng.init(seed);
        return sequence.id;
    }

    /// Pages that `tokens` positions take (at most the context's).
    pub fn pagesFor(engine: *const Engine, tokens: usize) usize {
        const capped = @min(tokens, engine.params.context_tokens_max);
        return std.math.divCeil(usize, capped, engine.params.page_tokens) catch unreachable;
    }

    pub fn cancel(engine: *Engine, id: u64, diag: *Diagnostic) Error!void {
        const sequence = engine.find(id) orelse {
            diag.set("no live sequence with id {d}", .{id});
            return error.NotFound;
        };
        engine.finish(sequence);
    }

    // Per-sequence controls of sampling, set between steps (sequence_controls.zig).
    pub const setTokenMask = sequence_controls.setTokenMask;
    pub const setLogitBias = sequence_controls.setLogitBias;

    pub fn find(engine: *Engine, id: u64) ?*Sequence {
        for (engine.sequences) |*s| {
            if (s.state != .free and s.id == id) return s;
        }
        return null;
    }

    pub fn slotOf(engine: *const Engine, sequence: *const Sequence) u32 {
        return @intCast((@intFromPtr(sequence) - @intFromPtr(engine.sequences.ptr)) / @sizeOf(Sequence));
    }

    fn finish(engine: *Engine, sequence: *Sequence) void {
        const slot = engine.slotOf(sequence);
        engine.releasePages(sequence, slot);
        if (sequence.state == .active) engine.pages_reserved -= sequence.pages_reserved;
        sequence.pages_used = 0;
        sequence.state = .free;
    }

    pub fn stats(engine: *const Engine) Stats {
        return @import("stats.zig").of(engine);
    }

    /// One forward over every active sequence: a prompt chunk or one decode row each, within
    /// rows_max rows. Writes a record per sampled token into `records` and returns how many.
    pub fn step(engine: *Engine, records: []Record, diag: *Diagnostic) Error!usize {
        try admission.admit(engine, diag);
        admission.grow(engine);
        var rows: usize = 0;
        var logits_count: usize = 0;
        const budget = engine.params.rows_max;
        var order: [256]u32 = undefined;
        const active = engine.activeInIdOrder(&order);
        for (active) |slot| {
            const sequence = &engine.sequences[slot];
            if (rows == budget or logits_count == @min(engine.logits_rows_max, records.len)) break;
            const pending = sequence.length - sequence.computed;
            const count = state_snapshots.chunkRows(engine, sequence, @min(pending, budget - rows));
            if (count == pending and sequence.sampling.constrained != 0 and sequence.mask_state == .none) {
                diag.set("sequence {d} is constrained and its next token has no mask (tf_engine_set_token_mask)", .{sequence.id});
                return error.InvalidArgument;
            }
            for (0..count) |i| {
                const position = sequence.computed + i;
                engine.ensurePage(sequence, position);
                engine.batch_tokens[rows] = sequence.tokens[position];
                engine.batch_positions[rows] = @intCast(position);
                engine.batch_tables[rows] = sequence.pages[0..sequence.pages_used];
                engine.batch_slots[rows] = slot;
                engine.batch_prompt[rows] = position < sequence.prompt_len;
                rows += 1;
            }
            if (count == pending) {
                engine.logits_rows[logits_count] = @intCast(rows - 1);
                engine.logits_slots[logits_count] = slot;
                logits_count += 1;
            }
        }
        if (rows == 0) return 0;
        // Page tables may have grown while planning: refresh every row's view.
        for (engine.batch_tables[0..rows], engine.batch_slots[0..rows]) |*table, slot| {
            const sequence = &engine.sequences[slot];
            table.* = sequence.pages[0..sequence.pages_used];
        }
        const vocab = engine.config().vocab_size;
        var jobs: usize = 0;
        for (engine.logits_slots[0..logits_count], engine.logits_wanted[0..logits_count], engine.job_of_row[0..logits_count], 0..) |slot, *wanted, *job, i| {
            const sequence = &engine.sequences[slot];
            // A masked or biased row is sampled here, from its whole row.
            const host_only = sequence.mask_state == .masked or sequence.bias.count > 0;
            wanted.* = sampler.needsLogits(&sequence.sampling) or host_only;
            job.* = null;
            if (host_only or engine.gpuModel() == null or !engine.gpu_sampling or !sampler.gpuSamples(&sequence.sampling)) continue;
            // The GPU samples this row: its logits stay there, the generator's draw goes to it.
            const p = &sequence.sampling;
            engine.sample_jobs[jobs] = .{ .row = @intCast(i), .temperature = p.temperature, .top_p = p.top_p, .top_k = p.top_k, .min_p = p.min_p, .u = sampler.drawUniform(sequence.prng.random()) };
            wanted.* = false;
            job.* = @intCast(jobs);
            jobs += 1;
        }
        try engine.runForward(rows, logits_count, engine.logits_wanted[0..logits_count], jobs, diag);
        engine.gpu_sampled += jobs;
        for (engine.batch_slots[0..rows]) |slot| engine.sequences[slot].computed += 1;
        if (engine.prefix != null) for (active) |slot| engine.offerFilledPages(&engine.sequences[slot]);
        try state_snapshots.keep(engine, active, diag);

        for (engine.logits_slots[0..logits_count], engine.job_of_row[0..logits_count], 0..) |slot, job, i| {
            const sequence = &engine.sequences[slot];
            if (job) |j| {
                const choice = engine.sample_choices[j];
                records[i] = engine.recordChoice(sequence, .{ .token = choice.token, .logprob = choice.logprob, .top_count = 0, .top_tokens = undefined, .top_logprobs = undefined });
                continue;
            }
            const row: ?[]const f32 = if (engine.logits_wanted[i]) engine.logits[i * vocab ..][0..vocab] else null;
            records[i] = engine.sampleInto(sequence, row, engine.summaries[i]);
        }
        return logits_count;
    }

    /// The planned batch through the model, on the engine's backend: the logits of the rows
    /// `wanted` names (all when null) and every logits row's summary.
    pub fn runForward(engine: *Engine, rows: usize, logits_count: usize, wanted: ?[]const bool, jobs: usize, diag: *Diagnostic) Error!void {
        const batch: glm.forward_cpu.Batch = .{
            .tokens = engine.batch_tokens[0..rows],
            .positions = engine.batch_positions[0..rows],
            .page_tables = engine.batch_tables[0..rows],
            .logits_rows = engine.logits_rows[0..logits_count],
            .prompt = engine.batch_prompt[0..rows],
            .sequences = engine.batch_slots[0..rows],
        };
        const logits = engine.logits[0 .. logits_count * engine.config().vocab_size];
        const summaries = engine.summaries[0..logits_count];
        const jobs_run = engine.sample_jobs[0..jobs];
        const choices = engine.sample_choices[0..jobs];
        if (engine.gpu_model) |model| {
            return model.forwardSummarized(batch, logits, summaries, wanted, jobs_run, choices, null, diag);
        } else if (engine.distributed_rank) |rank| {
            if (rank.gpu != null) return rank.forward(batch, logits, .{ .summaries = summaries, .wanted = wanted, .jobs = jobs_run, .choices = choices }, diag);
            try rank.forward(batch, logits, null, diag);
        } else if (engine.tensor_parallel) |group| {
            group.forward(batch, logits);
        } else {
            glm.forward_cpu.forward(&engine.weights, &engine.host_cache.?, batch, &engine.scratch, logits);
        }
        const vocab = engine.config().vocab_size;
        for (summaries, 0..) |*summary, i| summary.* = core.LogitsSummary.of(logits[i * vocab ..][0..vocab]);
    }

    /// The GPU forward this process summarizes and samples on: one GPU's, or rank 0's of a
    /// tensor-parallel group on GPUs.
    pub fn gpuModel(engine: *const Engine) ?*glm.cuda_model.GpuModel {
        if (engine.gpu_model) |model| return model;
        if (engine.distributed_rank) |rank| return rank.gpu;
        return null;
    }

    pub fn activeInIdOrder(engine: *const Engine, order: *[256]u32) []const u32 {
        var count: usize = 0;
        for (engine.sequences, 0..) |s, slot| {
            if (s.state != .active) continue;
            var at = count;
            while (at > 0 and engine.sequences[order[at - 1]].id > s.id) : (at -= 1) order[at] = order[at - 1];
            order[at] = @intCast(slot);
            count += 1;
        }
        return order[0..count];
    }

    fn sampleInto(engine: *Engine, sequence: *Sequence, logits: ?[]const f32, summary: core.LogitsSummary) Record {
        const history: sampler.History = .{
            .prompt = sequence.tokens[0..sequence.prompt_len],
            .output = sequence.tokens[sequence.prompt_len..sequence.length],
        };
        const mask: ?[]const u32 = if (sequence.mask_state == .masked) sequence.mask else null;
        const choice = sampler.sample(&sequence.sampling, logits, summary, history, mask, sequence.bias.entries(), sequence.prng.random(), &engine.workspace);
        return engine.recordChoice(sequence, choice);
    }

    /// The chosen token appended to its sequence, and its record.
    fn recordChoice(engine: *Engine, sequence: *Sequence, choice: sampler.Choice) Record {
        assert(sequence.sampling.constrained == 0 or sequence.mask_state != .none); // step() refused it
        assert(sequence.mask_state != .masked or token_mask.allows(sequence.mask, choice.token));
        sequence.mask_state = .none; // spent: the next token waits for its own
        sequence.tokens[sequence.length] = choice.token;
        sequence.length += 1;
        const generated = sequence.length - sequence.prompt_len;
        const stopped = for (sequence.stop_tokens[0..sequence.stop_count]) |t| {
            if (t == choice.token) break true;
        } else false;
        const finish_reason: Finish = if (stopped)
            .stop
        else if (generated >= sequence.sampling.max_tokens or sequence.length >= engine.params.context_tokens_max)
            .length
        else
            .none;
        const record: Record = .{
            .sequence_id = sequence.id,
            .token = choice.token,
            .finish = @backingInt(finish_reason),
            .logprob = choice.logprob,
            .top_count = choice.top_count,
            .top_tokens = choice.top_tokens,
            .top_logprobs = choice.top_logprobs,
            .cached_tokens = @intCast(sequence.cached_tokens),
        };
        if (finish_reason != .none) engine.finish(sequence);
        return record;
    }

    // A sequence's pages: taken, mapped from and offered to the prefix cache, released.
    pub const ensurePage = sequence_pages.ensurePage;
    pub const releasePages = sequence_pages.releasePages;
    pub const mapCachedPrefix = sequence_pages.mapCachedPrefix;
    const offerFilledPages = sequence_pages.offerFilledPages;

    /// Logits at every position of each prompt, as fresh sequences batched together: for
    /// Engine.logits() and the batch-invariance checks (prompt_logits.zig).
    pub const promptLogits = @import("prompt_logits.zig").promptLogits;
};

var seed_counter: std.atomic.Value(u64) = .init(0x9E3779B97F4A7C15);

/// An unseeded sequence still gets its own stream: a process-wide counter mixed with the clock.
fn randomSeed(id: u64) u64 {
    var ts: std.c.timespec = undefined;
    _ = std.c.clock_gettime(.MONOTONIC, &ts);
    const clock: u64 = @bitCast(@as(i64, ts.sec) *% 1_000_000_000 +% ts.nsec);
    return std.hash.Wyhash.hash(seed_counter.fetchAdd(1, .monotonic), std.mem.asBytes(&.{ id, clock }));
}
