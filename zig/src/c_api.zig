//! The C ABI (zig/include/trellisforge.h). Each export validates its arguments, runs the Zig call,
//! and maps any error to a tf_status with the message in a thread-local buffer. Nothing here
//! panics on input: sizes are checked before slices are formed, and pointers before use.
const std = @import("std");
const tf = @import("trellisforge");
const core = tf.core;
const exl3 = tf.exl3;

const gpa = std.heap.c_allocator;

const c_status = @import("c_status.zig");
pub const Status = c_status.Status;
const fail = c_status.fail;
const failWith = c_status.failWith;
const ok = c_status.ok;

const Handle = struct {
    magic: u64 = magic_open,
    checkpoint: core.Checkpoint,

    const magic_open: u64 = 0x7466_636b_7074_0001;
};

fn handleOf(pointer: ?*const Handle) ?*const Handle {
    const handle = pointer orelse return null;
    return if (handle.magic == Handle.magic_open) handle else null;
}

export fn tf_version() [*:0]const u8 {
    return tf.version;
}

export fn tf_last_error() [*:0]const u8 {
    return c_status.lastError();
}

/// Available means a GPU answers and our kernels load on it, not merely that libcuda is there.
export fn tf_cuda_available() Status {
    var diag: core.Diagnostic = .{};
    var gpu = tf.cuda.Gpu.open(0, &diag) catch |err| return failWith(err, &diag);
    defer gpu.close();
    var module = tf.cuda.exl3_decode.load(&gpu, &diag) catch |err| return failWith(err, &diag);
    module.unload(&gpu);
    return ok();
}

export fn tf_cuda_device_count(out: ?*u32) Status {
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = 0;
    var diag: core.Diagnostic = .{};
    var driver = tf.cuda.driver.Driver.open(&diag) catch |err| return failWith(err, &diag);
    defer driver.close();
    var count: c_int = 0;
    driver.check(driver.api.cuDeviceGetCount(&count), "cuDeviceGetCount", &diag) catch |err| return failWith(err, &diag);
    target.* = @intCast(@max(count, 0));
    return ok();
}

/// The GPU sampler over given logits rows (for tests against a reference): `jobs` name a row, the
/// filters and the uniform draw; `out` gets each job's token and log-probability.
export fn tf_cuda_sample(logits: ?[*]const f32, rows: usize, vocab: usize, jobs: ?[*]const tf.cuda.sampling.Job, count: usize, out: ?[*]tf.cuda.sampling.Choice) Status {
    const values = logits orelse return fail(.invalid_argument, "logits is null", .{});
    const job_list = jobs orelse return fail(.invalid_argument, "jobs is null", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    if (rows == 0 or vocab == 0) return fail(.invalid_argument, "rows and vocab must be at least 1", .{});
    if (vocab > 1 << 24 or rows > 65535 or count > 65535) return fail(.invalid_argument, "at most 65535 rows and jobs of up to 2^24 tokens", .{});
    for (job_list[0..count], 0..) |job, i| {
        if (tf.cuda.sampling.checkJob(job, rows)) |why| return fail(.invalid_argument, "job {d}: {s}", .{ i, why });
    }
    var diag: core.Diagnostic = .{};
    tf.cuda.sampling.sampleHost(values[0 .. rows * vocab], rows, vocab, job_list[0..count], target[0..count], &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_checkpoint_open(path: ?[*:0]const u8, out: ?*?*Handle) Status {
    const path_z = path orelse return fail(.invalid_argument, "path is null", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = null;
    var diag: core.Diagnostic = .{};
    const handle = gpa.create(Handle) catch return fail(.out_of_memory, "out of memory", .{});
    errdefer gpa.destroy(handle);
    const checkpoint = core.Checkpoint.open(gpa, std.mem.span(path_z), &diag) catch |err| {
        gpa.destroy(handle);
        return failWith(err, &diag);
    };
    handle.* = .{ .checkpoint = checkpoint };
    target.* = handle;
    return ok();
}

export fn tf_checkpoint_close(pointer: ?*Handle) Status {
    const handle = pointer orelse return ok();
    if (handle.magic != Handle.magic_open) return fail(.invalid_argument, "not an open checkpoint", .{});
    handle.magic = 0;
    handle.checkpoint.deinit();
    gpa.destroy(handle);
    return ok();
}

export fn tf_checkpoint_tensor_count(pointer: ?*const Handle, out: ?*usize) Status {
    const handle = handleOf(pointer) orelse return fail(.invalid_argument, "not an open checkpoint", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = handle.checkpoint.tensors.len;
    return ok();
}

pub const TensorInfo = extern struct {
    name: [*]const u8,
    name_len: usize,
    dtype: i32,
    rank: u32,
    shape: [8]u64,
};

export fn tf_checkpoint_tensor_info(pointer: ?*const Handle, index: usize, out: ?*TensorInfo) Status {
    const handle = handleOf(pointer) orelse return fail(.invalid_argument, "not an open checkpoint", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    const tensors = handle.checkpoint.tensors;
    if (index >= tensors.len) return fail(.invalid_argument, "tensor index {d} is past the {d} tensors", .{ index, tensors.len });
    const tensor = &tensors[index];
    target.* = .{
        .name = tensor.name.ptr,
        .name_len = tensor.name.len,
        .dtype = @backingInt(tensor.dtype),
        .rank = tensor.rank,
        .shape = tensor.shape_buffer,
    };
    return ok();
}

pub const QuantizationInfo = extern struct {
    present: i32,
    bits: f64,
    head_bits: f64,
    codebook: i32,
    reserved: i32,
};

export fn tf_checkpoint_quantization(pointer: ?*const Handle, out: ?*QuantizationInfo) Status {
    const handle = handleOf(pointer) orelse return fail(.invalid_argument, "not an open checkpoint", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = .{ .present = 0, .bits = 0, .head_bits = 0, .codebook = -1, .reserved = 0 };
    const model_config = handle.checkpoint.config orelse return ok();
    const quantization = model_config.quantization orelse return ok();
    target.* = .{
        .present = 1,
        .bits = quantization.bits,
        .head_bits = quantization.head_bits orelse 0,
        .codebook = if (quantization.codebook) |cb| switch (cb) {
            .@"3inst" => 0,
            .mcg => 1,
            .mul1 => 2,
        } else -1,
        .reserved = 0,
    };
    return ok();
}

pub const Exl3Info = extern struct {
    in_features_padded: u64,
    out_features_padded: u64,
    bits_x2: u32,
    codebook: i32,
    has_bias: i32,
    reserved: i32,
};

comptime {
    std.debug.assert(@sizeOf(TensorInfo) == 88);
    std.debug.assert(@sizeOf(Exl3Info) == 32);
    std.debug.assert(@sizeOf(QuantizationInfo) == 32);
}

/// Runs `body(layer, args)` on the EXL3 layer `prefix`, loading and releasing it around the call.
fn withLayer(pointer: ?*const Handle, prefix: ?[*:0]const u8, args: anytype, comptime body: anytype) Status {
    const handle = handleOf(pointer) orelse return fail(.invalid_argument, "not an open checkpoint", .{});
    const prefix_z = prefix orelse return fail(.invalid_argument, "prefix is null", .{});
    var diag: core.Diagnostic = .{};
    var layer = exl3.Layer.load(gpa, &handle.checkpoint, std.mem.span(prefix_z), &diag) catch |err| return failWith(err, &diag);
    defer layer.deinit(gpa);
    return body(&layer, args);
}

export fn tf_exl3_info_get(pointer: ?*const Handle, prefix: ?[*:0]const u8, out: ?*Exl3Info) Status {
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    return withLayer(pointer, prefix, target, struct {
        fn body(layer: *const exl3.Layer, info: *Exl3Info) Status {
            info.* = .{
                .in_features_padded = layer.rows,
                .out_features_padded = layer.columns,
                .bits_x2 = layer.rate.bits2,
                .codebook = @backingInt(layer.codebook),
                .has_bias = @intFromBool(layer.bias != null),
                .reserved = 0,
            };
            return ok();
        }
    }.body);
}

export fn tf_exl3_decode_trellis(pointer: ?*const Handle, prefix: ?[*:0]const u8, out: ?[*]align(1) u16, out_len: usize) Status {
    return decodeTrellis(pointer, prefix, out, out_len, .cpu);
}

export fn tf_exl3_decode_trellis_cuda(pointer: ?*const Handle, prefix: ?[*:0]const u8, out: ?[*]align(1) u16, out_len: usize) Status {
    return decodeTrellis(pointer, prefix, out, out_len, .cuda);
}

const DecodeOn = enum { cpu, cuda };

fn decodeTrellis(pointer: ?*const Handle, prefix: ?[*:0]const u8, out: ?[*]align(1) u16, out_len: usize, comptime on: DecodeOn) Status {
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    return withLayer(pointer, prefix, .{ target, out_len }, struct {
        fn body(layer: *const exl3.Layer, args: struct { [*]align(1) u16, usize }) Status {
            const needed = layer.rows * layer.columns;
            if (args[1] != needed) return fail(.invalid_argument, "out holds {d} values; the trellis decodes to {d}x{d} = {d}", .{ args[1], layer.rows, layer.columns, needed });
            const inner = gpa.alloc(u16, needed) catch return fail(.out_of_memory, "out of memory", .{});
            defer gpa.free(inner);
            switch (on) {
                .cpu => exl3.linear_cpu.decodeInner(layer, inner),
                .cuda => {
                    var diag: core.Diagnostic = .{};
                    var gpu = tf.cuda.Gpu.open(0, &diag) catch |err| return failWith(err, &diag);
                    defer gpu.close();
                    var module = tf.cuda.exl3_decode.load(&gpu, &diag) catch |err| return failWith(err, &diag);
                    defer module.unload(&gpu);
                    tf.cuda.exl3_decode.decodeLayer(&gpu, &module, layer, inner, &diag) catch |err| return failWith(err, &diag);
                },
            }
            @memcpy(args[0][0..needed], inner);
            return ok();
        }
    }.body);
}

export fn tf_exl3_dequantize(pointer: ?*const Handle, prefix: ?[*:0]const u8, in_features: usize, out_features: usize, out: ?[*]align(1) f32, out_len: usize) Status {
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    return withLayer(pointer, prefix, .{ in_features, out_features, target, out_len }, struct {
        fn body(layer: *const exl3.Layer, args: struct { usize, usize, [*]align(1) f32, usize }) Status {
            const in_f, const out_f, const buffer, const length = args;
            if (!featuresFit(layer, in_f, out_f)) return featureError(layer, in_f, out_f);
            if (length != in_f * out_f) return fail(.invalid_argument, "out holds {d} values; {d}x{d} needs {d}", .{ length, in_f, out_f, in_f * out_f });
            const full = gpa.alloc(f32, layer.rows * layer.columns + in_f * out_f) catch return fail(.out_of_memory, "out of memory", .{});
            defer gpa.free(full);
            const trimmed = full[layer.rows * layer.columns ..];
            exl3.linear_cpu.dequantize(layer, in_f, out_f, full[0 .. layer.rows * layer.columns], trimmed);
            @memcpy(buffer[0..length], trimmed);
            return ok();
        }
    }.body);
}

export fn tf_exl3_linear(pointer: ?*const Handle, prefix: ?[*:0]const u8, x: ?[*]align(1) const f32, rows: usize, in_features: usize, y: ?[*]align(1) f32, out_features: usize) Status {
    const source = x orelse return fail(.invalid_argument, "x is null", .{});
    const target = y orelse return fail(.invalid_argument, "y is null", .{});
    return withLayer(pointer, prefix, .{ source, rows, in_features, target, out_features }, struct {
        fn body(layer: *const exl3.Layer, args: struct { [*]align(1) const f32, usize, usize, [*]align(1) f32, usize }) Status {
            const x_ptr, const m, const in_f, const y_ptr, const out_f = args;
            if (!featuresFit(layer, in_f, out_f)) return featureError(layer, in_f, out_f);
            const rows_max = (1 << 40) / (layer.rows + layer.columns);
            if (m == 0 or m > rows_max) return fail(.invalid_argument, "rows {d} is outside 1..{d}", .{ m, rows_max });
            const shape: exl3.linear_cpu.Shape = .{ .rows = m, .in_features = in_f, .out_features = out_f };
            const buffers = gpa.alloc(f32, m * in_f + m * out_f + exl3.linear_cpu.scratchLength(layer, m)) catch
                return fail(.out_of_memory, "out of memory for {d} rows", .{m});
            defer gpa.free(buffers);
            const x_aligned = buffers[0 .. m * in_f];
            const y_aligned = buffers[x_aligned.len..][0 .. m * out_f];
            for (x_aligned, 0..) |*v, i| v.* = x_ptr[i];
            exl3.linear_cpu.forward(layer, shape, x_aligned, y_aligned, buffers[x_aligned.len + y_aligned.len ..]);
            for (y_aligned, 0..) |v, i| y_ptr[i] = v;
            return ok();
        }
    }.body);
}

// ---- Quantization ----

/// The checked arguments of an encoder call, shared by the CPU and GPU entry points.
const EncodeArgs = struct { values: []const f32, states: []u16 };

fn encodeArgs(values: ?[*]const f32, tiles: usize, bits: u32, codebook: i32, states: ?[*]u16) union(enum) { ok: EncodeArgs, failed: Status } {
    const source = values orelse return .{ .failed = fail(.invalid_argument, "values is null", .{}) };
    const target = states orelse return .{ .failed = fail(.invalid_argument, "states is null", .{}) };
    if (bits < exl3.encode.bits_min or bits > exl3.encode.bits_max) return .{ .failed = fail(.unsupported, "the encoder takes K = 1..8 bits, not {d}", .{bits}) };
    if (codebook < 0 or codebook > 2) return .{ .failed = fail(.invalid_argument, "codebook {d} is not 0 (3INST), 1 (MCG) or 2 (MUL1)", .{codebook}) };
    if (tiles == 0 or tiles > (1 << 32)) return .{ .failed = fail(.invalid_argument, "tiles {d} is outside 1..2^32", .{tiles}) };
    for (source[0 .. tiles * 256]) |v| {
        if (!std.math.isFinite(v)) return .{ .failed = fail(.invalid_argument, "values must be finite", .{}) };
    }
    return .{ .ok = .{ .values = source[0 .. tiles * 256], .states = target[0 .. tiles * 256] } };
}

/// values: (tiles, 256) float32 in trellis (PERM) order; states: (tiles, 256) out.
export fn tf_exl3_encode_tiles(values: ?[*]const f32, tiles: usize, bits: u32, codebook: i32, states: ?[*]u16) Status {
    const args = switch (encodeArgs(values, tiles, bits, codebook, states)) {
        .ok => |a| a,
        .failed => |status| return status,
    };
    exl3.encode.encodeTiles(gpa, @intCast(bits), @fromBackingInt(@intCast(codebook)), args.values, args.states) catch
        return fail(.out_of_memory, "out of memory for the encoder's workspaces", .{});
    return ok();
}

/// The same encoder on the GPU (tf_exl3_encode kernel): TF_ERR_CUDA when CUDA is unavailable.
export fn tf_exl3_encode_tiles_cuda(values: ?[*]const f32, tiles: usize, bits: u32, codebook: i32, states: ?[*]u16) Status {
    const args = switch (encodeArgs(values, tiles, bits, codebook, states)) {
        .ok => |a| a,
        .failed => |status| return status,
    };
    var diag: core.Diagnostic = .{};
    var gpu = tf.cuda.Gpu.open(0, &diag) catch |err| return failWith(err, &diag);
    defer gpu.close();
    tf.cuda.exl3_encode.encodeTiles(&gpu, args.values, @intCast(bits), @intCast(codebook), args.states, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

/// states: (tiles, 256) in trellis order; words: (tiles, 16·bits) int16, the stored layout.
export fn tf_exl3_pack_states(states: ?[*]const u16, tiles: usize, bits: u32, words: ?[*]u16) Status {
    const source = states orelse return fail(.invalid_argument, "states is null", .{});
    const target = words orelse return fail(.invalid_argument, "words is null", .{});
    if (bits < 1 or bits > 8) return fail(.unsupported, "packing takes K = 1..8 bits, not {d}", .{bits});
    const rate: exl3.trellis.Rate = .{ .bits2 = @intCast(2 * bits) };
    const per_tile = rate.wordsPerTile();
    var symbols: [256]u8 = undefined;
    for (0..tiles) |tile| {
        for (&symbols, source[tile * 256 ..][0..256]) |*symbol, state| symbol.* = @truncate(state & ((@as(u16, 1) << @intCast(bits)) - 1));
        exl3.trellis.packSymbols(rate, &symbols, target[tile * per_tile ..][0..per_tile]);
    }
    return ok();
}

// ---- Engine ----

const Engine = tf.engine.Engine;
const engine_mod = tf.engine.engine;

comptime {
    std.debug.assert(@sizeOf(engine_mod.Params) == 36);
    std.debug.assert(@sizeOf(tf.engine.sampler.Params) == 56);
    std.debug.assert(@sizeOf(engine_mod.Record) == 192);
    std.debug.assert(@sizeOf(engine_mod.Stats) == 144);
}

const EngineHandle = struct {
    magic: u64 = magic_open,
    engine: *Engine,

    const magic_open: u64 = 0x7466_656e_6769_0001;
};

fn engineOf(pointer: ?*EngineHandle) ?*Engine {
    const handle = pointer orelse return null;
    return if (handle.magic == EngineHandle.magic_open) handle.engine else null;
}

export fn tf_engine_create(model_dir: ?[*:0]const u8, params: ?*const engine_mod.Params, out: ?*?*EngineHandle) Status {
    return createEngine(model_dir, params, null, 0, out);
}

/// Rank 0 of a multi-process tensor-parallel group: listens on host:port for tp_world - 1 workers.
export fn tf_engine_create_tp_master(model_dir: ?[*:0]const u8, params: ?*const engine_mod.Params, host: ?[*:0]const u8, port: u16, out: ?*?*EngineHandle) Status {
    if (host == null) return fail(.invalid_argument, "host is null", .{});
    return createEngine(model_dir, params, host, port, out);
}

fn createEngine(model_dir: ?[*:0]const u8, params: ?*const engine_mod.Params, host: ?[*:0]const u8, port: u16, out: ?*?*EngineHandle) Status {
    const dir = model_dir orelse return fail(.invalid_argument, "model_dir is null", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = null;
    const requested: engine_mod.Params = if (params) |p| p.* else .{};
    const master: ?engine_mod.Master = if (host) |h| .{ .host = std.mem.span(h), .port = port } else null;
    var diag: core.Diagnostic = .{};
    return handOut(Engine.init(gpa, std.mem.span(dir), requested, master, &diag), &diag, target);
}

/// A created engine behind a fresh handle in `target`, or the creation's error.
fn handOut(created: engine_mod.Error!*Engine, diag: *const core.Diagnostic, target: *?*EngineHandle) Status {
    const engine = created catch |err| return failWith(err, diag);
    const handle = gpa.create(EngineHandle) catch {
        engine.deinit();
        return fail(.out_of_memory, "out of memory", .{});
    };
    handle.* = .{ .engine = engine };
    target.* = handle;
    return ok();
}

/// A model of config_json's shape with random EXL3 weights of `bits` per weight, made in memory
/// (families/glm/synthetic.zig); the same seed gives the same weights.
export fn tf_engine_create_synthetic(config_json: ?[*]const u8, config_len: usize, params: ?*const engine_mod.Params, bits: u32, seed: u64, out: ?*?*EngineHandle) Status {
    const json = config_json orelse return fail(.invalid_argument, "config_json is null", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = null;
    const requested: engine_mod.Params = if (params) |p| p.* else .{};
    var diag: core.Diagnostic = .{};
    return handOut(Engine.initSynthetic(gpa, json[0..config_len], requested, bits, seed, &diag), &diag, target);
}

/// A worker rank: blocks, serving the master's forwards, until the master shuts down (TF_OK) or
/// the connection fails (an error).
export fn tf_tp_worker_run(model_dir: ?[*:0]const u8, rank: u32, host: ?[*:0]const u8, port: u16) Status {
    const dir = model_dir orelse return fail(.invalid_argument, "model_dir is null", .{});
    const host_z = host orelse return fail(.invalid_argument, "host is null", .{});
    var diag: core.Diagnostic = .{};
    engine_mod.runWorker(gpa, std.mem.span(dir), rank, .{ .host = std.mem.span(host_z), .port = port }, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_destroy(pointer: ?*EngineHandle) Status {
    const handle = pointer orelse return ok();
    if (handle.magic != EngineHandle.magic_open) return fail(.invalid_argument, "not a live engine", .{});
    handle.magic = 0;
    handle.engine.deinit();
    gpa.destroy(handle);
    return ok();
}

export fn tf_engine_add_sequence(
    pointer: ?*EngineHandle,
    tokens: ?[*]align(1) const u32,
    count: usize,
    sampling: ?*const tf.engine.sampler.Params,
    stop_tokens: ?[*]align(1) const u32,
    stop_count: usize,
    id_out: ?*u64,
) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    const target = id_out orelse return fail(.invalid_argument, "id_out is null", .{});
    if (count > 0 and tokens == null) return fail(.invalid_argument, "tokens is null", .{});
    if (stop_count > 0 and stop_tokens == null) return fail(.invalid_argument, "stop_tokens is null", .{});
    if (count > engine.params.context_tokens_max) return fail(.invalid_argument, "the prompt has {d} tokens; the context holds {d}", .{ count, engine.params.context_tokens_max });
    if (stop_count > engine_mod.stop_tokens_max) return fail(.invalid_argument, "{d} stop tokens; at most {d}", .{ stop_count, engine_mod.stop_tokens_max });
    const prompt_buffer = gpa.alloc(u32, count) catch return fail(.out_of_memory, "out of memory", .{});
    defer gpa.free(prompt_buffer);
    for (prompt_buffer, 0..) |*t, i| t.* = tokens.?[i];
    var stops: [engine_mod.stop_tokens_max]u32 = undefined;
    for (stops[0..stop_count], 0..) |*t, i| t.* = stop_tokens.?[i];
    const params: tf.engine.sampler.Params = if (sampling) |s| s.* else .{};
    var diag: core.Diagnostic = .{};
    target.* = engine.addSequence(prompt_buffer, params, stops[0..stop_count], &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_step(pointer: ?*EngineHandle, records: ?[*]engine_mod.Record, capacity: usize, count_out: ?*usize) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    const target = count_out orelse return fail(.invalid_argument, "count_out is null", .{});
    if (capacity > 0 and records == null) return fail(.invalid_argument, "records is null", .{});
    var diag: core.Diagnostic = .{};
    target.* = engine.step(if (records) |r| r[0..capacity] else &.{}, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_cancel(pointer: ?*EngineHandle, id: u64) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    var diag: core.Diagnostic = .{};
    engine.cancel(id, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_set_token_mask(pointer: ?*EngineHandle, id: u64, mask: ?[*]align(1) const u32, words: usize) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    if (words > 0 and mask == null) return fail(.invalid_argument, "mask is null", .{});
    if (mask != null and words == 0) return fail(.invalid_argument, "a mask of 0 words allows nothing", .{});
    const limit = tf.engine.token_mask.wordsFor(engine.config().vocab_size);
    if (words > limit) return fail(.invalid_argument, "{d} mask words; the vocabulary takes {d}", .{ words, limit });
    var diag: core.Diagnostic = .{};
    engine.setTokenMask(id, if (mask) |m| m[0..words] else null, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_set_logit_bias(pointer: ?*EngineHandle, id: u64, tokens: ?[*]align(1) const u32, values: ?[*]align(1) const f32, count: usize) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    if (count > 0 and (tokens == null or values == null)) return fail(.invalid_argument, "tokens or values is null", .{});
    var diag: core.Diagnostic = .{};
    engine.setLogitBias(id, if (count > 0) tokens.?[0..count] else &.{}, if (count > 0) values.?[0..count] else &.{}, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_stats_get(pointer: ?*EngineHandle, out: ?*engine_mod.Stats) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    target.* = engine.stats();
    return ok();
}

export fn tf_engine_time_next_step(pointer: ?*EngineHandle) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    var diag: core.Diagnostic = .{};
    tf.engine.step_timeline.arm(engine, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_timeline(pointer: ?*EngineHandle, entries: ?[*]tf.engine.step_timeline.Entry, capacity: usize, count_out: ?*usize) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    const target = count_out orelse return fail(.invalid_argument, "count_out is null", .{});
    if (capacity > 0 and entries == null) return fail(.invalid_argument, "entries is null", .{});
    var diag: core.Diagnostic = .{};
    target.* = tf.engine.step_timeline.read(engine, if (entries) |e| e[0..capacity] else &.{}, &diag) catch |err| return failWith(err, &diag);
    return ok();
}

export fn tf_engine_prompt_logits(pointer: ?*EngineHandle, tokens: ?[*]align(1) const u32, lengths: ?[*]align(1) const usize, prompts: usize, out: ?[*]align(1) f32, out_len: usize) Status {
    const engine = engineOf(pointer) orelse return fail(.invalid_argument, "not a live engine", .{});
    const token_ptr = tokens orelse return fail(.invalid_argument, "tokens is null", .{});
    const length_ptr = lengths orelse return fail(.invalid_argument, "lengths is null", .{});
    const target = out orelse return fail(.invalid_argument, "out is null", .{});
    if (prompts == 0 or prompts > engine.params.sequences_max) return fail(.invalid_argument, "prompts must be 1..{d}", .{engine.params.sequences_max});
    var total: usize = 0;
    for (0..prompts) |p| {
        if (length_ptr[p] > engine.params.context_tokens_max) return fail(.invalid_argument, "prompt {d} has {d} tokens; the context holds {d}", .{ p, length_ptr[p], engine.params.context_tokens_max });
        total += length_ptr[p];
    }
    const vocab = engine.config().vocab_size;
    if (out_len != total * vocab) return fail(.invalid_argument, "out holds {d} values; {d} positions x {d} vocab needs {d}", .{ out_len, total, vocab, total * vocab });
    const copy = gpa.alloc(u32, total) catch return fail(.out_of_memory, "out of memory", .{});
    defer gpa.free(copy);
    for (copy, 0..) |*t, i| t.* = token_ptr[i];
    const slices = gpa.alloc([]const u32, prompts) catch return fail(.out_of_memory, "out of memory", .{});
    defer gpa.free(slices);
    var at: usize = 0;
    for (slices, 0..) |*slice, p| {
        slice.* = copy[at..][0..length_ptr[p]];
        at += length_ptr[p];
    }
    const logits = gpa.alloc(f32, out_len) catch return fail(.out_of_memory, "out of memory for {d} logits", .{out_len});
    defer gpa.free(logits);
    var diag: core.Diagnostic = .{};
    engine.promptLogits(slices, logits, &diag) catch |err| return failWith(err, &diag);
    for (logits, 0..) |v, i| target[i] = v;
    return ok();
}

fn featuresFit(layer: *const exl3.Layer, in_features: usize, out_features: usize) bool {
    return in_features >= 1 and in_features <= layer.rows and out_features >= 1 and out_features <= layer.columns;
}

fn featureError(layer: *const exl3.Layer, in_features: usize, out_features: usize) Status {
    return fail(.invalid_argument, "features {d}x{d} do not fit the layer's padded {d}x{d}", .{ in_features, out_features, layer.rows, layer.columns });
}

test "null and stale handles are refused, not dereferenced" {
    var count: usize = 0;
    try std.testing.expectEqual(Status.invalid_argument, tf_checkpoint_tensor_count(null, &count));
    try std.testing.expectEqual(Status.invalid_argument, tf_checkpoint_open(null, null));
    try std.testing.expect(std.mem.len(tf_last_error()) > 0);
    var out: ?*Handle = null;
    try std.testing.expectEqual(Status.io, tf_checkpoint_open("/nonexistent/model.safetensors", &out));
    try std.testing.expect(out == null);
    try std.testing.expectEqual(Status.ok, tf_checkpoint_close(null));
}
