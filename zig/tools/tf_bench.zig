//! tf-bench: this GPU's ceilings and the EXL3 expert kernels, as tables (a benchmark, not a test;
//! docs/measurements.md records runs).
//!
//!   tf-bench [--quick] [--attention | --mla | --next | --linears | --prompt-linears]   (the
//!            ceilings and the attention, MLA, GLM-5.3-Flash parts or one single-linear table only)
//!
//! 1. Copy bandwidth: a 1 GiB device-to-device copy, bytes read + written per second.
//! 2. The mma.sync rate (m16n8k16, f16 and bf16 inputs, f32 accumulate).
//! 3. The experts of one GLM-4.5-Air-shaped MoE layer (hidden 4096, moe_intermediate 1408, 128
//!    routed experts, top-8, one shared expert) at 3 and 4 bits, MUL1 and 3INST codebooks, through
//!    the engine's kernels (gate/up pair, down with the SwiGLU fused, shared expert, combine):
//!    - decode at M = 1, 4, 16 rows: 32 calls recorded in one CUDA graph, each call with new expert
//!      picks and its own copy of the shared expert, so that the weights come from DRAM, not L2;
//!      the median of 5 replays, per call; "grouped" with the shared expert on its own launches,
//!      "merged" with it in the routed experts' launches as the engine runs it;
//!    - prefill at M = 256, 512, 2048, 4096 rows, the median of 3: "grouped" (the GEMV, items
//!      sorted by expert, each decoded tile serving up to 16 of them), "fused" (the routed and
//!      shared experts on the tensor-core prompt kernels, cuda/exl3_prompt.zig, each decoded tile
//!      serving up to 64 rows) and, to 512 rows, "slim" (the same in groups of up to 32 on the
//!      `_32` kernels); the engine runs a prompt fused or slim by its items per expert.
//!    Weight bandwidth counts the trellis bytes of the distinct experts a call reads.
//! 4. Attention of one GLM-4.5-Air layer at contexts of 2k, 8k and 32k tokens (attention_bench.zig).
//! --mla: MLA attention and the DSA indexer (mla_bench.zig); --next: GLM-5.3-Flash's KDA layer and
//! hyper-connection site at full size (next_bench.zig); --linears: the step's single EXL3 linears
//! (attention projections, dense MLP, lm_head) at M = 1, 4, 16 (linear_bench.zig); --prompt-linears:
//! the plain linears' prompt rows in each form of the prompt kernels (prompt_linear_bench.zig).
//! The decode step of a whole model (tokens/s) is `python -m trellisforge.bench_engine`.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Ptr = cuda.gpu.DevicePtr;

const say = @import("say.zig").say;
const bench_time = @import("bench_time.zig");
const attention_bench = @import("attention_bench.zig");
const mla_bench = @import("mla_bench.zig");
const next_bench = @import("next_bench.zig");
const linear_bench = @import("linear_bench.zig");
const prompt_linear_bench = @import("prompt_linear_bench.zig");

pub fn main(init: std.process.Init) u8 {
    const args = init.minimal.args.toSlice(init.arena.allocator()) catch return 2;
    var quick = false;
    var attention_only = false;
    var mla_only = false;
    var next_only = false;
    var linears_only = false;
    var prompt_linears_only = false;
    for (args[1..]) |arg| {
        if (std.mem.eql(u8, arg, "--quick")) quick = true else if (std.mem.eql(u8, arg, "--attention")) attention_only = true else if (std.mem.eql(u8, arg, "--mla")) mla_only = true else if (std.mem.eql(u8, arg, "--next")) next_only = true else if (std.mem.eql(u8, arg, "--linears")) linears_only = true else if (std.mem.eql(u8, arg, "--prompt-linears")) prompt_linears_only = true else {
            say("usage: tf-bench [--quick] [--attention | --mla | --next | --linears | --prompt-linears]\n", .{});
            return 2;
        }
    }
    var diag: Diagnostic = .{};
    var gpu = cuda.Gpu.open(0, &diag) catch {
        say("cannot open the GPU: {s}\n", .{diag.message()});
        return 1;
    };
    defer gpu.close();
    say("device: {s}, sm_{d}, {d} SMs; kernels built for sm {s}\n", .{ gpu.name(), gpu.compute_capability, gpu.multiprocessors, cuda.kernels.sm_list });
    run(init.gpa, &gpu, quick, .{ .attention = attention_only, .mla = mla_only, .next = next_only, .linears = linears_only, .prompt_linears = prompt_linears_only }, &diag) catch |err| {
        say("tf-bench failed: {t}: {s}\n", .{ err, diag.message() });
        return 1;
    };
    return 0;
}

/// Which single table a run prints (none: every table but those of --mla, --next, --linears and
/// --prompt-linears).
const Only = struct { attention: bool, mla: bool, next: bool, linears: bool, prompt_linears: bool };

fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, quick: bool, only: Only, diag: *Diagnostic) !void {
    const copy_gbs = try copyBandwidth(gpu, diag);
    say("\ncopy bandwidth (1 GiB device to device, read + written): {d:.0} GB/s\n", .{copy_gbs});
    if (only.mla) return mla_bench.run(gpa, gpu, copy_gbs, diag);
    if (only.next) return next_bench.run(gpa, gpu, copy_gbs, diag);

    var module = try K.load(gpu, diag);
    defer module.unload(gpu);
    if (only.linears) return linear_bench.run(gpa, gpu, &module, copy_gbs, diag);
    var prompt_module = try P.load(gpu, diag);
    defer prompt_module.unload(gpu);
    if (only.prompt_linears) return prompt_linear_bench.run(gpa, gpu, &module, &prompt_module, copy_gbs, diag);
    try mmaRate(gpu, diag);
    try attention_bench.run(gpa, gpu, &module, copy_gbs, quick, diag);
    if (only.attention) return;
    say("\nexperts of one GLM-4.5-Air MoE layer (128 x [4096 -> 1408 -> 4096], top-8 + 1 shared)\n", .{});
    say("{s:<6} {s:<6} {s:<8} {s:>6} {s:>10} {s:>9} {s:>9} {s:>8}\n", .{ "bits", "cb", "path", "M", "us/layer", "MB read", "GB/s", "% copy" });
    const configs = [_]struct { bits: u8, codebook: tf.exl3.Codebook }{
        .{ .bits = 3, .codebook = .mul1 }, .{ .bits = 3, .codebook = .@"3inst" },
        .{ .bits = 4, .codebook = .mul1 }, .{ .bits = 4, .codebook = .@"3inst" },
    };
    for (configs, 0..) |config, i| {
        if (quick and i > 0) break;
        var layer = try Layer.init(gpa, gpu, config.bits, config.codebook, diag);
        defer layer.deinit(gpu);
        for ([_]usize{ 1, 4, 16 }) |m| try layer.decode(gpa, gpu, &module, m, copy_gbs, diag);
        for ([_]usize{ 256, 512, 2048, 4096 }) |m| {
            if (quick and m > 512) break;
            try layer.prefill(gpa, gpu, &module, &prompt_module, m, copy_gbs, diag);
        }
    }
}

fn copyBandwidth(gpu: *cuda.Gpu, diag: *Diagnostic) !f64 {
    const size: usize = 1 << 30;
    const a = try gpu.alloc(size, diag);
    defer gpu.free(a);
    const b = try gpu.alloc(size, diag);
    defer gpu.free(b);
    try gpu.copy(b, a, size, diag); // warm-up
    var timer = try cuda.gpu.Timer.create(gpu, diag);
    defer timer.destroy(gpu);
    const repeats = 10;
    try timer.begin(gpu, diag);
    for (0..repeats) |_| try gpu.copy(b, a, size, diag);
    const ms = try timer.end(gpu, diag);
    return 2.0 * @as(f64, @floatFromInt(size)) * repeats / (@as(f64, ms) * 1e-3) / 1e9;
}

fn mmaRate(gpu: *cuda.Gpu, diag: *Diagnostic) !void {
    var module = try cuda.bench_kernels.load(gpu, diag);
    defer module.unload(gpu);
    const blocks = gpu.multiprocessors * 8;
    const iterations: u32 = 4096;
    const out = try gpu.alloc(@as(usize, blocks) * 256 * 4, diag);
    defer gpu.free(out);
    var timer = try cuda.gpu.Timer.create(gpu, diag);
    defer timer.destroy(gpu);
    inline for (.{ false, true }) |bf16| {
        try cuda.bench_kernels.mma(gpu, &module, bf16, out, blocks, iterations, diag); // warm-up
        try timer.begin(gpu, diag);
        try cuda.bench_kernels.mma(gpu, &module, bf16, out, blocks, iterations, diag);
        const ms = try timer.end(gpu, diag);
        const tflops = cuda.bench_kernels.mmaFlops(blocks, iterations) / (@as(f64, ms) * 1e-3) / 1e12;
        say("mma.sync m16n8k16 {s} -> f32: {d:.0} TFLOP/s\n", .{ if (bf16) "bf16" else "f16 ", tflops });
    }
}

const hidden = 4096;
const intermediate = 1408;
const experts = 128;
const top_k = 8;
/// Copies of the shared expert, one per call in turn, so that it too comes from DRAM.
const shared_copies = 16;
const calls = 32;
/// Slots per row with the shared expert merged, and table entries per merged copy.
const merged_slots = top_k + 1;
const merged_entries = 3 * (experts + 1);

/// One MoE layer's experts in device memory: random trellis words (any 16-bit pattern decodes),
/// suh/svh of ±1.
const Layer = struct {
    bits: u8,
    codebook: u8,
    words: Ptr,
    signs: Ptr,
    gate_up: Ptr, // Exl3Layer[2 * experts]: gate entries, then up entries
    down: Ptr, // Exl3Layer[experts]
    shared_pair: Ptr, // Exl3Layer[2 * shared_copies]
    shared_down: Ptr, // Exl3Layer[shared_copies]
    /// Per shared copy, the tables of the engine's merged layout: [gate x E, shared gate, up x E,
    /// shared up, down x E, shared down] (parts/moe_cuda.zig mergedShared).
    merged: Ptr,
    projection_bytes: usize,

    fn init(gpa: std.mem.Allocator, gpu: *cuda.Gpu, bits: u8, codebook: tf.exl3.Codebook, diag: *Diagnostic) !Layer {
        var layer: Layer = undefined;
        layer.bits = bits;
        layer.codebook = @backingInt(codebook);
        layer.projection_bytes = hidden * intermediate * @as(usize, bits) / 8;
        const projections = 3 * (experts + shared_copies);
        var prng = std.Random.DefaultPrng.init(0xbe9c4);
        layer.words = try bench_time.randomWords(gpa, gpu, projections * layer.projection_bytes, prng.random(), diag);
        errdefer gpu.free(layer.words);
        layer.signs = try bench_time.randomSigns(gpa, gpu, hidden, prng.random(), diag);
        errdefer gpu.free(layer.signs);

        const entries = try gpa.alloc(K.Exl3Layer, projections);
        defer gpa.free(entries);
        for (entries, 0..) |*entry, p| entry.* = .{ .words = layer.words + p * layer.projection_bytes, .suh = layer.signs, .svh = layer.signs, .bias = 0 };
        // Projections: [gate x E, up x E, down x E, shared gate/up pairs x S, shared down x S].
        const table = try gpu.alloc(projections * @sizeOf(K.Exl3Layer), diag);
        errdefer gpu.free(table);
        try gpu.upload(table, std.mem.sliceAsBytes(entries), diag);
        const entry_size = @sizeOf(K.Exl3Layer);
        layer.gate_up = table;
        layer.down = table + 2 * experts * entry_size;
        layer.shared_pair = table + 3 * experts * entry_size;
        layer.shared_down = layer.shared_pair + 2 * shared_copies * entry_size;
        const merged = try gpa.alloc(K.Exl3Layer, shared_copies * merged_entries);
        defer gpa.free(merged);
        for (0..shared_copies) |c| {
            const copy = merged[c * merged_entries ..][0..merged_entries];
            for (0..3) |projection| {
                const part = copy[projection * (experts + 1) ..][0 .. experts + 1];
                @memcpy(part[0..experts], entries[projection * experts ..][0..experts]);
                part[experts] = entries[3 * experts + if (projection < 2) 2 * c + projection else 2 * shared_copies + c];
            }
        }
        layer.merged = try gpu.alloc(merged.len * entry_size, diag);
        errdefer gpu.free(layer.merged);
        try gpu.upload(layer.merged, std.mem.sliceAsBytes(merged), diag);
        try gpu.synchronize(diag);
        return layer;
    }

    fn deinit(layer: *Layer, gpu: *cuda.Gpu) void {
        gpu.free(layer.merged);
        gpu.free(layer.gate_up);
        gpu.free(layer.signs);
        gpu.free(layer.words);
    }

    /// Device buffers for calls of m rows; `variants` calls' routing laid out back to back.
    const Buffers = struct {
        x: Ptr,
        gate: Ptr,
        items_out: Ptr,
        shared_gate: Ptr,
        shared_out: Ptr,
        ffn_out: Ptr,
        acc: Ptr,
        counters: Ptr,
        pair_layers: Ptr,
        pair_rows: Ptr,
        route_experts: Ptr,
        route_weights: Ptr,
        /// The same routing with the shared expert as slot top_k (merged_slots per row).
        merged_layers: Ptr,
        merged_rows: Ptr,
        merged_experts: Ptr,
        merged_weights: Ptr,
        grouping: K.Grouping,
        prompt: ?P.Scratch,
        all: [30]Ptr,
        count: usize,

        fn init(gpa: std.mem.Allocator, gpu: *cuda.Gpu, m: usize, variants: usize, random: std.Random, diag: *Diagnostic) !struct { Buffers, f64 } {
            var b: Buffers = undefined;
            b.count = 0;
            errdefer b.deinit(gpu);
            const items = m * top_k;
            const f = @sizeOf(f32);
            // Sized for the merged layout's merged_slots per row, which also holds top_k.
            const slot_items = m * merged_slots;
            const chunk_items: usize = @min(slot_items, 2048 * merged_slots);
            b.x = try b.take(gpu, m * hidden * f, diag);
            b.gate = try b.take(gpu, 2 * slot_items * intermediate * f, diag);
            b.items_out = try b.take(gpu, slot_items * hidden * f, diag);
            b.shared_gate = try b.take(gpu, 2 * m * intermediate * f, diag);
            b.shared_out = try b.take(gpu, m * hidden * f, diag);
            b.ffn_out = try b.take(gpu, m * hidden * f, diag);
            const splits_gate = K.splitsMax(hidden, intermediate);
            const splits_down = K.splitsMax(intermediate, hidden);
            b.acc = try b.take(gpu, @max(splits_gate * 2 * chunk_items * intermediate, splits_down * chunk_items * hidden) * f, diag);
            const groups = K.groupsMax(2 * chunk_items, 2 * (experts + 1));
            const counters = @max(K.countersFor(@max(2 * chunk_items, groups), intermediate), K.countersFor(@max(chunk_items, groups), hidden));
            b.grouping = .{
                .ranks = try b.take(gpu, 2 * chunk_items * 4, diag),
                .sorted = try b.take(gpu, 2 * chunk_items * 4, diag),
                .first = try b.take(gpu, groups * 4, diag),
                .count = try b.take(gpu, groups * 4, diag),
                .layer = try b.take(gpu, groups * 4, diag),
                .total = try b.take(gpu, 4, diag),
            };
            b.counters = try b.take(gpu, counters * 4, diag);
            try gpu.zero(b.counters, counters * 4, diag);
            b.pair_layers = try b.take(gpu, variants * 2 * items * 4, diag);
            b.pair_rows = try b.take(gpu, variants * 2 * items * 4, diag);
            b.route_experts = try b.take(gpu, variants * items * 4, diag);
            b.route_weights = try b.take(gpu, variants * items * f, diag);
            b.merged_layers = try b.take(gpu, variants * 2 * slot_items * 4, diag);
            b.merged_rows = try b.take(gpu, variants * 2 * slot_items * 4, diag);
            b.merged_experts = try b.take(gpu, variants * slot_items * 4, diag);
            b.merged_weights = try b.take(gpu, variants * slot_items * f, diag);
            b.prompt = null;
            if (m >= 256) { // the prefill rows (layer.prefill) run the prompt kernels
                var need: P.Need = .{};
                need.mlp(items, experts, hidden, intermediate);
                const Take = struct {
                    b: *Buffers,
                    gpu: *cuda.Gpu,
                    diag: *Diagnostic,
                    fn call(t: @This(), size: usize) !Ptr {
                        return t.b.take(t.gpu, size, t.diag);
                    }
                };
                b.prompt = try need.allocate(Take{ .b = &b, .gpu = gpu, .diag = diag }, Take.call);
            }

            const x = try gpa.alloc(f32, m * hidden);
            defer gpa.free(x);
            for (x) |*v| v.* = random.floatNorm(f32);
            try gpu.upload(b.x, std.mem.sliceAsBytes(x), diag);
            const pair_layers = try gpa.alloc(i32, variants * 2 * items);
            defer gpa.free(pair_layers);
            const pair_rows = try gpa.alloc(i32, variants * 2 * items);
            defer gpa.free(pair_rows);
            const route_experts = try gpa.alloc(i32, variants * items);
            defer gpa.free(route_experts);
            const route_weights = try gpa.alloc(f32, variants * items);
            defer gpa.free(route_weights);
            const merged_layers = try gpa.alloc(i32, variants * 2 * slot_items);
            defer gpa.free(merged_layers);
            const merged_rows = try gpa.alloc(i32, variants * 2 * slot_items);
            defer gpa.free(merged_rows);
            const merged_experts = try gpa.alloc(i32, variants * slot_items);
            defer gpa.free(merged_experts);
            const merged_weights = try gpa.alloc(f32, variants * slot_items);
            defer gpa.free(merged_weights);
            var distinct_total: usize = 0;
            for (0..variants) |v| {
                var used = std.StaticBitSet(experts).empty;
                for (0..m) |row| {
                    // top_k distinct experts in ascending order, as the router writes them.
                    var picked = std.StaticBitSet(experts).empty;
                    while (picked.count() < top_k) picked.set(random.uintLessThan(usize, experts));
                    var it = picked.iterator(.{});
                    var slot: usize = 0;
                    while (it.next()) |e| : (slot += 1) {
                        const i = v * items + row * top_k + slot;
                        route_experts[i] = @intCast(e);
                        route_weights[i] = 1.0 / @as(f32, top_k);
                        const pi = v * 2 * items + row * top_k + slot;
                        pair_layers[pi] = @intCast(e);
                        pair_layers[pi + items] = @intCast(experts + e);
                        pair_rows[pi] = @intCast(row);
                        pair_rows[pi + items] = @intCast(row);
                    }
                    for (0..merged_slots) |s| {
                        // The same picks, then the shared expert (entry E, weight 1).
                        const e: usize = if (s < top_k) @intCast(route_experts[v * items + row * top_k + s]) else experts;
                        const i = v * slot_items + row * merged_slots + s;
                        merged_experts[i] = @intCast(e);
                        merged_weights[i] = if (s < top_k) 1.0 / @as(f32, top_k) else 1.0;
                        const pi = v * 2 * slot_items + row * merged_slots + s;
                        merged_layers[pi] = @intCast(e);
                        merged_layers[pi + slot_items] = @intCast(experts + 1 + e);
                        merged_rows[pi] = @intCast(row);
                        merged_rows[pi + slot_items] = @intCast(row);
                    }
                    used.setUnion(picked);
                }
                distinct_total += used.count();
            }
            try gpu.upload(b.pair_layers, std.mem.sliceAsBytes(pair_layers), diag);
            try gpu.upload(b.pair_rows, std.mem.sliceAsBytes(pair_rows), diag);
            try gpu.upload(b.route_experts, std.mem.sliceAsBytes(route_experts), diag);
            try gpu.upload(b.route_weights, std.mem.sliceAsBytes(route_weights), diag);
            try gpu.upload(b.merged_layers, std.mem.sliceAsBytes(merged_layers), diag);
            try gpu.upload(b.merged_rows, std.mem.sliceAsBytes(merged_rows), diag);
            try gpu.upload(b.merged_experts, std.mem.sliceAsBytes(merged_experts), diag);
            try gpu.upload(b.merged_weights, std.mem.sliceAsBytes(merged_weights), diag);
            try gpu.synchronize(diag);
            return .{ b, @as(f64, @floatFromInt(distinct_total)) / @as(f64, @floatFromInt(variants)) };
        }

        fn take(b: *Buffers, gpu: *cuda.Gpu, size: usize, diag: *Diagnostic) !Ptr {
            const ptr = try gpu.alloc(size, diag);
            b.all[b.count] = ptr;
            b.count += 1;
            return ptr;
        }

        fn deinit(b: *Buffers, gpu: *cuda.Gpu) void {
            for (b.all[0..b.count]) |ptr| gpu.free(ptr);
        }
    };

    /// A launch of one projection kind (4096 -> 1408 for gate/up, 1408 -> 4096 for down) with the
    /// fields every call shares; the engine takes the grouped path when a layer has 4 items on
    /// average, and so does this.
    fn launchOf(layer: *const Layer, b: *const Buffers, comptime kind: enum { up_in, down }, table: Ptr, x: Ptr, y: Ptr, items: usize) K.Kernels.Exl3Call {
        const in_features: usize = if (kind == .up_in) hidden else intermediate;
        const out_features: usize = if (kind == .up_in) intermediate else hidden;
        return .{
            .x = x,
            .table = table,
            .acc = b.acc,
            .counters = b.counters,
            .grouping = b.grouping,
            .y = y,
            .items = items,
            .in_features = in_features,
            .out_features = out_features,
            .k_p = in_features,
            .n_p = out_features,
            .bits2 = 2 * layer.bits,
            .codebook = layer.codebook,
        };
    }

    /// One call's launches: the MoE block of the engine minus the router (parts/moe_cuda.zig runMoe).
    /// Rows go in chunks of at most 2048 (a launch's items are its grid's z extent).
    fn enqueueCall(layer: *const Layer, k: K.Kernels, b: *const Buffers, m: usize, variant: usize, call: usize, fused: ?*const P.Module, form: ?P.MlpForm) !void {
        const f = @sizeOf(f32);
        const items = m * top_k;
        const entry = @sizeOf(K.Exl3Layer);
        var row: usize = 0;
        if (fused) |module| {
            const launcher: P.Launcher = .{ .glm = k, .module = module, .mlp_form = form };
            const shape: P.Shape = .{ .k_p = hidden, .n_p = intermediate, .bits2 = 2 * layer.bits, .codebook = layer.codebook };
            const down_shape: P.Shape = .{ .k_p = intermediate, .n_p = hidden, .bits2 = 2 * layer.bits, .codebook = layer.codebook };
            try launcher.runMlp(b.prompt.?, .{
                .x = b.x,
                .items = items,
                .items_per_row = top_k,
                .layer_of_item = b.route_experts + variant * items * 4,
                .layers = experts,
                .gate_up = layer.gate_up,
                .up_offset = experts,
                .down = layer.down,
                .hidden = hidden,
                .width = intermediate,
                .gate = shape,
                .down_shape = down_shape,
                .y = b.items_out,
            });
            // The shared expert of the prompt rows on the same kernels, as the engine runs it.
            try launcher.runMlp(b.prompt.?, .{
                .x = b.x,
                .items = m,
                .items_per_row = 1,
                .layer_of_item = 0,
                .layers = 1,
                .gate_up = layer.shared_pair + (call % shared_copies) * 2 * entry,
                .up_offset = 1,
                .down = layer.shared_down + (call % shared_copies) * entry,
                .hidden = hidden,
                .width = intermediate,
                .gate = shape,
                .down_shape = down_shape,
                .y = b.shared_out,
            });
            return k.moeCombine(b.items_out, b.route_weights + variant * items * f, b.shared_out, b.ffn_out, m, top_k, hidden);
        }
        while (row < m) {
            const rows: usize = @min(2048, m - row);
            const chunk = rows * top_k;
            const first = row * top_k;
            if (rows == m) {
                // Every item in one launch, as the engine runs them.
                var gate_up = layer.launchOf(b, .up_in, layer.gate_up, b.x, b.gate, 2 * items);
                gate_up.source_rows = b.pair_rows + variant * 2 * items * 4;
                gate_up.layer_of_item = b.pair_layers + variant * 2 * items * 4;
                gate_up.layers = 2 * experts;
                try k.exl3Linear(gate_up);
            } else inline for (.{ 0, 1 }) |half| {
                // The chunk's slice of the gate half, then of the up half.
                const at = variant * 2 * items + half * items + first;
                var gate_up = layer.launchOf(b, .up_in, layer.gate_up, b.x, b.gate + (half * items + first) * intermediate * f, chunk);
                gate_up.source_rows = b.pair_rows + at * 4;
                gate_up.layer_of_item = b.pair_layers + at * 4;
                gate_up.layers = 2 * experts;
                try k.exl3Linear(gate_up);
            }
            var down = layer.launchOf(b, .down, layer.down, b.gate + first * intermediate * f, b.items_out + first * hidden * f, chunk);
            down.up = b.gate + (items + first) * intermediate * f;
            down.layer_of_item = b.route_experts + (variant * items + first) * 4;
            down.layers = experts;
            try k.exl3Linear(down);
            row += rows;
        }
        const copy = call % shared_copies;
        var done: usize = 0;
        while (done < m) {
            const rows: usize = @min(2048, m - done);
            var gate_up = layer.launchOf(b, .up_in, layer.shared_pair + copy * 2 * entry, b.x + done * hidden * f, b.shared_gate, 2 * rows);
            gate_up.group_items = rows;
            try k.exl3Linear(gate_up);
            var down = layer.launchOf(b, .down, layer.shared_down + copy * entry, b.shared_gate, b.shared_out + done * hidden * f, rows);
            down.up = b.shared_gate + rows * intermediate * f;
            try k.exl3Linear(down);
            done += rows;
        }
        try k.moeCombine(b.items_out, b.route_weights + variant * items * f, b.shared_out, b.ffn_out, m, top_k, hidden);
    }

    /// A decode call as the engine runs it when the shared expert is merged: one gate/up launch and
    /// one down launch for the routed and shared experts of every row, then the combine.
    fn enqueueMerged(layer: *const Layer, k: K.Kernels, b: *const Buffers, m: usize, variant: usize, call: usize) !void {
        const f = @sizeOf(f32);
        const items = m * merged_slots;
        const entry = @sizeOf(K.Exl3Layer);
        const table = layer.merged + (call % shared_copies) * merged_entries * entry;
        var gate_up = layer.launchOf(b, .up_in, table, b.x, b.gate, 2 * items);
        gate_up.source_rows = b.merged_rows + variant * 2 * items * 4;
        gate_up.layer_of_item = b.merged_layers + variant * 2 * items * 4;
        gate_up.layers = 2 * (experts + 1);
        try k.exl3Linear(gate_up);
        var down = layer.launchOf(b, .down, table + 2 * (experts + 1) * entry, b.gate, b.items_out, items);
        down.up = b.gate + items * intermediate * f;
        down.layer_of_item = b.merged_experts + variant * items * 4;
        down.layers = experts + 1;
        try k.exl3Linear(down);
        try k.moeCombine(b.items_out, b.merged_weights + variant * items * f, 0, b.ffn_out, m, merged_slots, hidden);
    }

    fn report(layer: *const Layer, path: []const u8, m: usize, us: f64, distinct: f64, copy_gbs: f64) void {
        const mb = (distinct + 1) * 3 * @as(f64, @floatFromInt(layer.projection_bytes)) / 1e6;
        const gbs = mb * 1e6 / (us * 1e-6) / 1e9;
        const cb: tf.exl3.Codebook = @fromBackingInt(@intCast(layer.codebook));
        say("{d:<6} {t:<6} {s:<8} {d:>6} {d:>10.1} {d:>9.1} {d:>9.0} {d:>7.1}%\n", .{ layer.bits, cb, path, m, us, mb, gbs, 100 * gbs / copy_gbs });
    }

    fn decode(layer: *const Layer, gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, m: usize, copy_gbs: f64, diag: *Diagnostic) !void {
        var prng = std.Random.DefaultPrng.init(m);
        var made = try Buffers.init(gpa, gpu, m, calls, prng.random(), diag);
        defer made[0].deinit(gpu);
        const k: K.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
        for ([_]bool{ false, true }) |merged| {
            try cuda.gpu.Graph.beginCapture(gpu, diag);
            for (0..calls) |call| {
                const queued = if (merged) layer.enqueueMerged(k, &made[0], m, call, call) else layer.enqueueCall(k, &made[0], m, call, call, null, null);
                queued catch |err| {
                    _ = cuda.gpu.Graph.endCapture(gpu, false, diag) catch {};
                    return err;
                };
            }
            var graph = try cuda.gpu.Graph.endCapture(gpu, true, diag);
            defer graph.destroy(gpu);
            layer.report(if (merged) "merged" else "grouped", m, try bench_time.replayMedian(gpu, &graph, calls, diag), made[1], copy_gbs);
        }
    }

    fn prefill(layer: *const Layer, gpa: std.mem.Allocator, gpu: *cuda.Gpu, module: *const K.Module, prompt_module: *const P.Module, m: usize, copy_gbs: f64, diag: *Diagnostic) !void {
        var prng = std.Random.DefaultPrng.init(m);
        var made = try Buffers.init(gpa, gpu, m, 1, prng.random(), diag);
        defer made[0].deinit(gpu);
        const k: K.Kernels = .{ .gpu = gpu, .module = module, .diag = diag };
        var timer = try cuda.gpu.Timer.create(gpu, diag);
        defer timer.destroy(gpu);
        // The grouped GEMV, then the prompt kernels in each MLP form (the same bits; the engine
        // picks by the items per entry, exl3_prompt.MlpForm).
        const paths = [_]struct { name: []const u8, fused: ?*const P.Module, form: ?P.MlpForm }{
            .{ .name = "grouped", .fused = null, .form = null },
            .{ .name = "fused", .fused = prompt_module, .form = .full },
            .{ .name = "slim", .fused = prompt_module, .form = .slim },
        };
        for (paths) |path| {
            const fused = path.fused;
            if (path.form == .slim and m > 512) continue;
            try layer.enqueueCall(k, &made[0], m, 0, 0, fused, path.form); // warm-up
            var times: [3]f64 = undefined;
            for (&times, 0..) |*t, i| {
                try timer.begin(gpu, diag);
                try layer.enqueueCall(k, &made[0], m, 0, i + 1, fused, path.form);
                t.* = @as(f64, try timer.end(gpu, diag)) * 1e3;
            }
            std.mem.sort(f64, &times, {}, std.sort.asc(f64));
            layer.report(path.name, m, times[1], made[1], copy_gbs);
        }
    }
};
