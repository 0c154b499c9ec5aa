//! Tensor parallelism across processes (one per node or GPU): rank 0 runs the engine and the
//! scheduler, sends each step's plan (tokens, positions, which rows are prompt rows, each row's
//! sequence slot, page tables, how many logits rows) to the workers over TCP, and every rank runs the same forward on its
//! shard. On the CPU backend the two all-reduces per layer go over the same sockets (rank 0 sums
//! in rank order and returns the sum, so every rank holds the same bits). A peer that dies or
//! stops answering fails the step with a message; it never hangs the master.
const std = @import("std");
const core = @import("../core/root.zig");
const glm = @import("../families/glm/root.zig");
const tcp = @import("../dist/tcp.zig");
const nccl_mod = @import("../dist/nccl.zig");
const gpu_sampling = @import("../cuda/sampling.zig");
const Diagnostic = core.Diagnostic;

pub const Error = glm.shard.Error || tcp.Error || glm.cuda_model.Error || nccl_mod.Error;

pub const Collective = enum(u32) {
    /// The all-reduce through rank 0 over the plan's sockets; on GPUs the partials are staged
    /// through host memory. Works anywhere, also for several ranks sharing one GPU.
    tcp = 0,
    /// NCCL on the GPUs' stream (one GPU per rank).
    nccl = 1,

    /// NCCL between GPUs unless TRELLISFORGE_TP_COLLECTIVE=tcp (several ranks sharing one GPU, or
    /// no NCCL); the CPU backend always reduces over TCP.
    pub fn choose(on_gpus: bool) Collective {
        if (!on_gpus) return .tcp;
        const choice = std.c.getenv("TRELLISFORGE_TP_COLLECTIVE") orelse return .nccl;
        return if (std.mem.eql(u8, std.mem.span(choice), "tcp")) .tcp else .nccl;
    }
};

pub const ranks_max = 16;
pub const peer_timeout_s: u32 = 120;

pub const Shape = extern struct {
    world: u32,
    backend: u32, // 0 cpu, 1 cuda
    collective: u32, // Collective
    rows_max: u32,
    context_max: u32,
    pages: u32,
    page_tokens: u32,
    pages_per_sequence: u32,
    logits_rows_max: u32,
    /// Sequence slots: each rank keeps its heads' part of every slot's recurrent (KDA) state.
    sequences: u32,
    kv_dtype: u32, // a core.KvDtype
    /// Recurrent-state slots after them for the prefix cache's snapshots (state_snapshots.zig).
    state_snapshots: u32 = 0,
};

/// Copies between recurrent-state slots that a plan carries (from, to), in order: at most a
/// snapshot after each sequence's chunk and a restore for each admitted sequence per step.
pub const copies_max = 2 * 256;

/// GPU of this host for `rank`: TRELLISFORGE_GPU when set, else the rank (one GPU per rank on a
/// multi-GPU host; on single-GPU nodes set TRELLISFORGE_GPU=0).
fn gpuOrdinal(rank: usize) u32 {
    if (std.c.getenv("TRELLISFORGE_GPU")) |text| return std.fmt.parseInt(u32, std.mem.span(text), 10) catch 0;
    return @intCast(rank);
}

const Header = extern struct {
    kind: u32, // 1 forward, 2 shutdown
    rows: u32,
    logits_rows: u32,
    tables_len: u32,
    /// State-slot copies to make before the forward (the pairs follow the page tables).
    copies: u32 = 0,
};

const kind_forward: u32 = 1;
const kind_shutdown: u32 = 2;

pub const Rank = struct {
    gpa: std.mem.Allocator,
    rank: usize,
    shape: Shape,
    weights: glm.Weights,
    /// The host KV cache of a CPU rank (a GPU rank's lives in its GpuModel).
    cache: ?glm.cache.HostCache,
    scratch: glm.forward_cpu.Scratch,
    gpu: ?*glm.cuda_model.GpuModel,
    nccl: ?nccl_mod.Nccl,
    comm: nccl_mod.Comm,
    peers: [ranks_max]tcp.Connection, // rank 0: peers[r - 1] is rank r
    master: tcp.Connection, // rank > 0
    partials: []f32,
    host_values: []f32, // the second half of `partials`: a GPU rank's staged partial
    plan: []u32,
    tables: [][]const u32,
    /// Which rows of a plan are prompt rows (the GPU's prompt kernels take them on every rank).
    prompt: []bool,
    /// Rank 0: state-slot copies made here since the last plan, for the workers to make before
    /// their next forward (a worker: the ones received).
    copies: [copies_max][2]u32,
    copies_len: usize,
    failure: ?Diagnostic,

    /// Rank 0: shards `full`, waits for the workers to connect and sends them the shape.
    pub fn initMaster(gpa: std.mem.Allocator, full: *const glm.Weights, shape: Shape, host: []const u8, port: u16, diag: *Diagnostic) Error!*Rank {
        const self = try init(gpa, full, shape, 0, diag);
        errdefer self.deinit();
        try tcp.acceptPeers(host, port, self.peers[0 .. shape.world - 1], peer_timeout_s, diag);
        for (self.peers[0 .. shape.world - 1]) |*peer| try peer.sendValue(shape, diag);
        if (shape.collective == @backingInt(Collective.nccl)) {
            const id = try self.nccl.?.uniqueId(diag);
            for (self.peers[0 .. shape.world - 1]) |*peer| try peer.sendValue(id, diag);
            self.comm = try self.nccl.?.initRank(shape.world, 0, id, diag);
        }
        return self;
    }

    /// Rank > 0: connects, receives the master's shape, and shards `full` for itself.
    pub fn initWorker(gpa: std.mem.Allocator, full: *const glm.Weights, rank: usize, host: []const u8, port: u16, diag: *Diagnostic) Error!*Rank {
        var master = try tcp.connectToMaster(host, port, @intCast(rank), peer_timeout_s, diag);
        errdefer master.close();
        const shape = try master.recvValue(Shape, diag);
        if (shape.world < 2 or shape.world > ranks_max or rank >= shape.world) {
            diag.set("the master runs {d} ranks; this is rank {d}", .{ shape.world, rank });
            return error.UnsupportedModel;
        }
        if (std.enums.fromInt(core.KvDtype, shape.kv_dtype) == null) {
            diag.set("the master's KV dtype {d} is unknown to this worker", .{shape.kv_dtype});
            return error.UnsupportedModel;
        }
        const self = try init(gpa, full, shape, rank, diag);
        self.master = master;
        errdefer self.deinit();
        if (shape.collective == @backingInt(Collective.nccl)) {
            const id = try master.recvValue(nccl_mod.UniqueId, diag);
            self.comm = try self.nccl.?.initRank(shape.world, rank, id, diag);
        }
        return self;
    }

    fn init(gpa: std.mem.Allocator, full: *const glm.Weights, shape: Shape, rank: usize, diag: *Diagnostic) Error!*Rank {
        const self = try gpa.create(Rank);
        errdefer gpa.destroy(self);
        self.gpa = gpa;
        self.rank = rank;
        self.shape = shape;
        self.failure = null;
        self.copies_len = 0;
        self.gpu = null;
        self.nccl = null;
        self.comm = null;
        self.master = .{ .fd = -1 };
        for (&self.peers) |*p| p.* = .{ .fd = -1 };
        self.weights = try glm.shard.shard(gpa, full, shape.world, rank, diag);
        errdefer self.weights.deinit(gpa);
        const c = self.weights.config;
        const on_gpu = shape.backend == 1;
        self.cache = if (on_gpu) null else try glm.cache.HostCache.init(gpa, &c, @fromBackingInt(@intCast(shape.kv_dtype)), shape.pages, shape.page_tokens, shape.sequences + shape.state_snapshots);
        errdefer if (self.cache) |*cache| cache.deinit(gpa);
        self.scratch = try glm.forward_cpu.Scratch.init(gpa, &self.weights, shape.rows_max, shape.context_max);
        errdefer self.scratch.deinit();
        self.partials = try gpa.alloc(f32, 2 * shape.rows_max * c.hidden_size);
        errdefer gpa.free(self.partials);
        self.host_values = self.partials[shape.rows_max * c.hidden_size ..];
        self.plan = try gpa.alloc(u32, 5 * shape.rows_max + shape.rows_max * shape.pages_per_sequence);
        errdefer gpa.free(self.plan);
        self.tables = try gpa.alloc([]const u32, shape.rows_max);
        errdefer gpa.free(self.tables);
        self.prompt = try gpa.alloc(bool, shape.rows_max);
        errdefer gpa.free(self.prompt);
        if (on_gpu) {
            // The shard is this rank's heap copy: its projections go as the device takes them.
            self.gpu = try glm.cuda_model.GpuModel.initReleasing(gpa, &self.weights, .{
                .device = gpuOrdinal(rank),
                .rows_max = shape.rows_max,
                .logits_rows_max = shape.logits_rows_max,
                .context_max = shape.context_max,
                .pages = shape.pages,
                .page_tokens = shape.page_tokens,
                .pages_per_sequence = shape.pages_per_sequence,
                .sequences = shape.sequences,
                .state_snapshots = shape.state_snapshots,
                .kv_dtype = @fromBackingInt(@intCast(shape.kv_dtype)),
            }, diag);
        }
        errdefer if (self.gpu) |g| g.deinit();
        if (shape.collective == @backingInt(Collective.nccl)) self.nccl = try nccl_mod.Nccl.open(diag);
        return self;
    }

    pub fn deinit(self: *Rank) void {
        const gpa = self.gpa;
        if (self.rank == 0) {
            for (self.peers[0 .. self.shape.world - 1]) |*peer| {
                if (peer.fd >= 0) {
                    var diag: Diagnostic = .{};
                    peer.sendValue(Header{ .kind = kind_shutdown, .rows = 0, .logits_rows = 0, .tables_len = 0 }, &diag) catch {};
                    peer.close();
                }
            }
        } else if (self.master.fd >= 0) self.master.close();
        if (self.comm != null) _ = self.nccl.?.api.ncclCommDestroy(self.comm);
        if (self.nccl) |*n| n.close();
        if (self.gpu) |g| g.deinit();
        gpa.free(self.prompt);
        gpa.free(self.tables);
        gpa.free(self.plan);
        gpa.free(self.partials);
        self.scratch.deinit();
        if (self.cache) |*cache| cache.deinit(gpa);
        self.weights.deinit(gpa);
        gpa.destroy(self);
    }

    /// Rank 0: one forward of `batch` on every rank; the logits as forward_cpu.forward, or, with
    /// `summarized` (rank 0 on a GPU), summarized and sampled on rank 0's GPU as
    /// GpuModel.forwardSummarized does on one GPU (no logits row crosses to the host unless
    /// `wanted` asks for it).
    pub fn forward(self: *Rank, batch: glm.forward_cpu.Batch, logits: []f32, summarized: ?Summarized, diag: *Diagnostic) Error!void {
        std.debug.assert(summarized == null or self.gpu != null);
        try self.sendPlan(batch, diag);
        try self.run(batch, logits, summarized, diag);
    }

    /// What a summarized forward fills beside the logits (GpuModel.forwardSummarized's arguments).
    pub const Summarized = struct {
        summaries: []core.LogitsSummary,
        wanted: ?[]const bool,
        jobs: []const gpu_sampling.Job,
        choices: []gpu_sampling.Choice,
    };

    fn sendPlan(self: *Rank, batch: glm.forward_cpu.Batch, diag: *Diagnostic) Error!void {
        std.debug.assert(self.rank == 0);
        if (self.failure) |failed| {
            diag.* = failed;
            return error.NetworkFailed;
        }
        var tables_len: usize = 0;
        for (batch.page_tables) |t| tables_len += t.len;
        const header: Header = .{ .kind = kind_forward, .rows = @intCast(batch.rows()), .logits_rows = @intCast(batch.logits_rows.len), .tables_len = @intCast(tables_len), .copies = @intCast(self.copies_len) };
        const rows = batch.rows();
        const flags = self.plan[0..rows];
        for (flags, 0..) |*flag, r| flag.* = @intFromBool(r < batch.prompt.len and batch.prompt[r]);
        const slots = self.plan[rows..][0..rows];
        for (slots, 0..) |*slot, r| slot.* = if (r < batch.sequences.len) batch.sequences[r] else 0;
        for (self.peers[0 .. self.shape.world - 1]) |*peer| {
            errdefer self.failure = diag.*;
            try peer.sendValue(header, diag);
            try peer.sendAll(std.mem.sliceAsBytes(batch.tokens), diag);
            try peer.sendAll(std.mem.sliceAsBytes(batch.positions), diag);
            try peer.sendAll(std.mem.sliceAsBytes(flags), diag);
            try peer.sendAll(std.mem.sliceAsBytes(slots), diag);
            for (batch.page_tables) |t| try peer.sendValue(@as(u32, @intCast(t.len)), diag);
            for (batch.page_tables) |t| try peer.sendAll(std.mem.sliceAsBytes(t), diag);
            try peer.sendAll(std.mem.sliceAsBytes(self.copies[0..self.copies_len]), diag);
        }
        self.copies_len = 0;
    }

    /// Rank > 0: serves plans until the master shuts down (returns) or fails (error).
    pub fn serve(self: *Rank, diag: *Diagnostic) Error!void {
        std.debug.assert(self.rank > 0);
        self.master.setTimeout(0); // between requests a worker waits as long as the master idles
        while (true) {
            const header = try self.master.recvValue(Header, diag);
            if (header.kind == kind_shutdown) return;
            self.master.setTimeout(peer_timeout_s);
            const rows: usize = header.rows;
            if (header.kind != kind_forward or rows == 0 or rows > self.shape.rows_max or header.tables_len > self.shape.rows_max * self.shape.pages_per_sequence or header.copies > copies_max) {
                diag.set("malformed plan from the master", .{});
                return error.NetworkFailed;
            }
            const tokens = self.plan[0..rows];
            const positions = self.plan[rows..][0..rows];
            const flags = self.plan[2 * rows ..][0..rows];
            const slots = self.plan[3 * rows ..][0..rows];
            const lengths = self.plan[4 * rows ..][0..rows];
            const flat = self.plan[5 * rows ..][0..header.tables_len];
            try self.master.recvAll(std.mem.sliceAsBytes(tokens), diag);
            try self.master.recvAll(std.mem.sliceAsBytes(positions), diag);
            try self.master.recvAll(std.mem.sliceAsBytes(flags), diag);
            try self.master.recvAll(std.mem.sliceAsBytes(slots), diag);
            for (slots) |slot| if (slot >= @max(self.shape.sequences, 1)) {
                diag.set("malformed plan from the master: sequence slot {d} of {d}", .{ slot, self.shape.sequences });
                return error.NetworkFailed;
            };
            try self.master.recvAll(std.mem.sliceAsBytes(lengths), diag);
            for (self.prompt[0..rows], flags) |*prompt, flag| prompt.* = flag != 0;
            try self.master.recvAll(std.mem.sliceAsBytes(flat), diag);
            var at: usize = 0;
            for (self.tables[0..rows], lengths) |*table, length| {
                table.* = flat[at..][0..length];
                at += length;
            }
            const copies = self.copies[0..header.copies];
            try self.master.recvAll(std.mem.sliceAsBytes(copies), diag);
            const state_slots = self.shape.sequences + self.shape.state_snapshots;
            for (copies) |pair| if (pair[0] >= state_slots or pair[1] >= state_slots) {
                diag.set("malformed plan from the master: state copy {d} -> {d} of {d} slots", .{ pair[0], pair[1], state_slots });
                return error.NetworkFailed;
            };
            for (copies) |pair| try self.copyLocalState(pair[0], pair[1], diag);
            try self.run(.{ .tokens = tokens, .positions = positions, .page_tables = self.tables[0..rows], .logits_rows = &.{}, .prompt = self.prompt[0..rows], .sequences = slots }, &.{}, null, diag);
            self.master.setTimeout(0);
        }
    }

    /// Rank 0: recurrent state slot `to` becomes slot `from` here now and on every worker before
    /// its next forward.
    pub fn copyState(self: *Rank, from: u32, to: u32, diag: *Diagnostic) Error!void {
        std.debug.assert(self.rank == 0);
        if (self.copies_len == copies_max) {
            diag.set("more than {d} state copies wait for the next plan", .{copies_max});
            return error.NetworkFailed;
        }
        try self.copyLocalState(from, to, diag);
        self.copies[self.copies_len] = .{ from, to };
        self.copies_len += 1;
    }

    fn copyLocalState(self: *Rank, from: u32, to: u32, diag: *Diagnostic) Error!void {
        if (self.gpu) |model| return glm.parts.kda_cuda.copySlot(model, from, to, diag);
        self.cache.?.copyState(from, to);
    }

    const ReduceContext = struct { self: *Rank, diag: *Diagnostic, failed: bool };

    fn run(self: *Rank, batch: glm.forward_cpu.Batch, logits: []f32, summarized: ?Summarized, diag: *Diagnostic) Error!void {
        var context: ReduceContext = .{ .self = self, .diag = diag, .failed = false };
        if (self.gpu) |model| {
            // NCCL's all-reduce is queued on the stream, so the forward can be recorded with it.
            const sum: glm.cuda_model.GpuModel.Reduce = .{ .context = &context, .sum = reduceGpu, .recordable = self.comm != null and !core.switches.off("TF_CUDA_TP_GRAPHS") };
            const ran = if (summarized) |out|
                model.forwardSummarized(batch, logits, out.summaries, out.wanted, out.jobs, out.choices, sum, diag)
            else
                model.forwardRank(batch, logits, sum, diag);
            ran catch |err| {
                if (self.rank == 0) self.failure = diag.*;
                return if (context.failed) error.NetworkFailed else err;
            };
            return;
        }
        glm.forward_cpu.forwardRank(&self.weights, &self.cache.?, batch, &self.scratch, logits, .{ .context = &context, .sum = reduce });
        if (context.failed) {
            if (self.rank == 0) self.failure = diag.*;
            return error.NetworkFailed;
        }
    }

    /// The GPU all-reduce: NCCL on the device, or the TCP one staged through host memory.
    fn reduceGpu(opaque_context: *anyopaque, model: *glm.cuda_model.GpuModel, buffer: u64, count: usize, diag: *Diagnostic) anyerror!void {
        const context: *ReduceContext = @ptrCast(@alignCast(opaque_context));
        const self = context.self;
        if (model.gpu.timeline) |timeline| try timeline.mark(&model.gpu, if (self.comm != null) "nccl_all_reduce" else "host_all_reduce", diag);
        if (self.comm != null) {
            return self.nccl.?.allReduceSum(self.comm, buffer, count, .float32, @ptrCast(model.gpu.stream), diag);
        }
        const staged = self.host_values[0..count];
        try model.gpu.download(std.mem.sliceAsBytes(staged), buffer, diag);
        reduce(opaque_context, staged);
        if (context.failed) return error.NetworkFailed;
        try model.gpu.upload(buffer, std.mem.sliceAsBytes(staged), diag);
    }

    /// The all-reduce: workers send their partial and receive the sum; rank 0 sums in rank order.
    /// After a failure the forward still runs to its end (its buffers stay valid) and then fails.
    fn reduce(opaque_context: *anyopaque, values: []f32) void {
        const context: *ReduceContext = @ptrCast(@alignCast(opaque_context));
        if (context.failed) return;
        const self = context.self;
        const diag = context.diag;
        if (self.rank == 0) {
            for (self.peers[0 .. self.shape.world - 1]) |*peer| {
                peer.recvAll(std.mem.sliceAsBytes(self.partials[0..values.len]), diag) catch {
                    context.failed = true;
                    return;
                };
                for (values, self.partials[0..values.len]) |*v, p| v.* += p;
            }
            for (self.peers[0 .. self.shape.world - 1]) |*peer| {
                peer.sendAll(std.mem.sliceAsBytes(values), diag) catch {
                    context.failed = true;
                    return;
                };
            }
        } else {
            self.master.sendAll(std.mem.sliceAsBytes(values), diag) catch {
                context.failed = true;
                return;
            };
            self.master.recvAll(std.mem.sliceAsBytes(values), diag) catch {
                context.failed = true;
            };
        }
    }
};
