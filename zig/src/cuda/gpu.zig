//! One GPU in use: its primary context made current on the calling thread, a stream, and typed
//! wrappers for memory, events and module loading, each returning an error with a message.
const std = @import("std");
const driver_api = @import("driver.zig");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const Driver = driver_api.Driver;
const Timeline = @import("timeline.zig").Timeline;
const switches = @import("../core/switches.zig");
pub const DevicePtr = driver_api.DevicePtr;
pub const Error = driver_api.Error;

pub const Gpu = struct {
    driver: Driver,
    device: driver_api.Device,
    context: driver_api.Context,
    /// Where launches and copies go: `main`, or `side` between forkSide and leaveSide.
    stream: driver_api.Stream,
    main: driver_api.Stream,
    /// A second stream for work that can run beside the main stream's (the MoE layer's shared
    /// expert beside its router and routed experts), ordered by two events; a recorded forward
    /// keeps the fork and the join as graph edges.
    side: driver_api.Stream,
    forked: driver_api.Event,
    joined: driver_api.Event,
    name_buffer: [256]u8,
    name_len: usize,
    compute_capability: u32,
    multiprocessors: u32,
    /// When set, every launch is timed (timeline.zig).
    timeline: ?*Timeline = null,
    /// Launches let the next kernel be scheduled before they finish (programmatic dependent
    /// launch: sm_90 and later, a driver with cuLaunchKernelEx; TF_CUDA_PDL=0 turns it off). Every
    /// kernel waits for its predecessor first (grid_dependency.cuh), so the bits do not change.
    programmatic: bool = false,

    pub fn open(ordinal: u32, diag: *Diagnostic) Error!Gpu {
        var driver = try Driver.open(diag);
        errdefer driver.close();

        var gpu: Gpu = undefined;
        gpu.driver = driver;
        const api = &gpu.driver.api;
        try driver.check(api.cuDeviceGet(&gpu.device, @intCast(ordinal)), "cuDeviceGet", diag);
        try driver.check(api.cuDevicePrimaryCtxRetain(&gpu.context, gpu.device), "cuDevicePrimaryCtxRetain", diag);
        errdefer _ = api.cuDevicePrimaryCtxRelease_v2(gpu.device);
        try driver.check(api.cuCtxSetCurrent(gpu.context), "cuCtxSetCurrent", diag);
        try driver.check(api.cuStreamCreate(&gpu.main, 1), "cuStreamCreate", diag); // 1: non-blocking
        errdefer _ = api.cuStreamDestroy_v2(gpu.main);
        gpu.stream = gpu.main;
        try driver.check(api.cuStreamCreate(&gpu.side, 1), "cuStreamCreate", diag);
        errdefer _ = api.cuStreamDestroy_v2(gpu.side);
        try driver.check(api.cuEventCreate(&gpu.forked, driver_api.event_disable_timing), "cuEventCreate", diag);
        errdefer _ = api.cuEventDestroy_v2(gpu.forked);
        try driver.check(api.cuEventCreate(&gpu.joined, driver_api.event_disable_timing), "cuEventCreate", diag);

        gpu.name_buffer = @splat(0);
        _ = api.cuDeviceGetName(&gpu.name_buffer, gpu.name_buffer.len, gpu.device);
        gpu.name_len = std.mem.indexOfScalar(u8, &gpu.name_buffer, 0) orelse gpu.name_buffer.len;
        gpu.compute_capability = 10 * gpu.attribute(driver_api.attribute_compute_capability_major) +
            gpu.attribute(driver_api.attribute_compute_capability_minor);
        gpu.multiprocessors = gpu.attribute(driver_api.attribute_multiprocessor_count);
        gpu.timeline = null;
        gpu.programmatic = gpu.compute_capability >= 90 and driver.launch_ex != null and !switches.off("TF_CUDA_PDL");
        return gpu;
    }

    pub fn close(gpu: *Gpu) void {
        _ = gpu.driver.api.cuEventDestroy_v2(gpu.joined);
        _ = gpu.driver.api.cuEventDestroy_v2(gpu.forked);
        _ = gpu.driver.api.cuStreamDestroy_v2(gpu.side);
        _ = gpu.driver.api.cuStreamDestroy_v2(gpu.main);
        _ = gpu.driver.api.cuDevicePrimaryCtxRelease_v2(gpu.device);
        gpu.driver.close();
        gpu.* = undefined;
    }

    /// Launches go to the side stream from here, after everything queued on the main stream so far.
    pub fn forkSide(gpu: *Gpu, diag: *Diagnostic) Error!void {
        std.debug.assert(gpu.stream == gpu.main);
        try gpu.driver.check(gpu.driver.api.cuEventRecord(gpu.forked, gpu.main), "cuEventRecord", diag);
        try gpu.driver.check(gpu.driver.api.cuStreamWaitEvent(gpu.side, gpu.forked, 0), "cuStreamWaitEvent", diag);
        gpu.stream = gpu.side;
    }

    /// Launches go to the main stream again; the side's so far are marked for awaitSide.
    pub fn leaveSide(gpu: *Gpu, diag: *Diagnostic) Error!void {
        std.debug.assert(gpu.stream == gpu.side);
        gpu.stream = gpu.main;
        try gpu.driver.check(gpu.driver.api.cuEventRecord(gpu.joined, gpu.side), "cuEventRecord", diag);
    }

    /// What the main stream queues next waits for the side's work before leaveSide.
    pub fn awaitSide(gpu: *Gpu, diag: *Diagnostic) Error!void {
        std.debug.assert(gpu.stream == gpu.main);
        try gpu.driver.check(gpu.driver.api.cuStreamWaitEvent(gpu.main, gpu.joined, 0), "cuStreamWaitEvent", diag);
    }

    pub fn name(gpu: *const Gpu) []const u8 {
        return gpu.name_buffer[0..gpu.name_len];
    }

    /// The SMs' typical clock (kHz), for rates stated against the issue capacity (tf-bench).
    pub fn clockKhz(gpu: *const Gpu) u32 {
        return gpu.attribute(driver_api.attribute_clock_rate_khz);
    }

    fn attribute(gpu: *const Gpu, which: c_int) u32 {
        var value: c_int = 0;
        _ = gpu.driver.api.cuDeviceGetAttribute(&value, which, gpu.device);
        return @intCast(@max(value, 0));
    }

    pub fn alloc(gpu: *const Gpu, size_bytes: usize, diag: *Diagnostic) Error!DevicePtr {
        var ptr: DevicePtr = 0;
        try gpu.driver.check(gpu.driver.api.cuMemAlloc_v2(&ptr, @max(size_bytes, 1)), "cuMemAlloc", diag);
        return ptr;
    }

    pub fn free(gpu: *const Gpu, ptr: DevicePtr) void {
        _ = gpu.driver.api.cuMemFree_v2(ptr);
    }

    /// On the GPU's stream, so it is ordered after the kernels already queued there (the stream is
    /// non-blocking: the plain cuMemcpy on the legacy stream would not wait for them). From pageable
    /// memory the call returns once `source` has been staged, so the caller may reuse it.
    pub fn upload(gpu: *const Gpu, target: DevicePtr, source: []const u8, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuMemcpyHtoDAsync_v2(target, source.ptr, source.len, gpu.stream), "cuMemcpyHtoDAsync", diag);
    }

    /// Device to device on the stream, queued after the kernels.
    pub fn copy(gpu: *const Gpu, target: DevicePtr, source: DevicePtr, size_bytes: usize, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuMemcpyDtoDAsync_v2(target, source, size_bytes, gpu.stream), "cuMemcpyDtoDAsync", diag);
    }

    /// Queued after the kernels; complete after the next `synchronize`.
    pub fn downloadAsync(gpu: *const Gpu, target: []u8, source: DevicePtr, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuMemcpyDtoHAsync_v2(target.ptr, source, target.len, gpu.stream), "cuMemcpyDtoHAsync", diag);
    }

    /// Ordered after the queued kernels, and complete when it returns.
    pub fn download(gpu: *const Gpu, target: []u8, source: DevicePtr, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuMemcpyDtoHAsync_v2(target.ptr, source, target.len, gpu.stream), "cuMemcpyDtoHAsync", diag);
        try gpu.synchronize(diag);
    }

    /// Zero bytes, ordered after the queued kernels and complete when it returns.
    pub fn zero(gpu: *const Gpu, target: DevicePtr, size_bytes: usize, diag: *Diagnostic) Error!void {
        try gpu.synchronize(diag);
        try gpu.driver.check(gpu.driver.api.cuMemsetD8_v2(target, 0, size_bytes), "cuMemsetD8", diag);
        // The memset runs on the legacy stream, which the non-blocking stream does not wait for.
        try gpu.driver.check(gpu.driver.api.cuCtxSynchronize(), "cuCtxSynchronize", diag);
    }

    /// Fills with a byte pattern so that an element a kernel failed to write shows up.
    pub fn poison(gpu: *const Gpu, target: DevicePtr, size_bytes: usize, diag: *Diagnostic) Error!void {
        try gpu.synchronize(diag);
        try gpu.driver.check(gpu.driver.api.cuMemsetD8_v2(target, 0xFF, size_bytes), "cuMemsetD8", diag);
        try gpu.driver.check(gpu.driver.api.cuCtxSynchronize(), "cuCtxSynchronize", diag); // as in `zero`
    }

    /// The weight or cache bytes the next launch reads, for a timeline being taken (else nothing).
    pub fn noteReads(gpu: *const Gpu, bytes: u64) void {
        if (gpu.timeline) |timeline| timeline.reads(bytes);
    }

    pub fn synchronize(gpu: *const Gpu, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuStreamSynchronize(gpu.stream), "cuStreamSynchronize", diag);
    }
};

/// A recorded sequence of launches on the GPU's stream, replayed with one call. Capture records
/// the launches' arguments by value, so a replay is only right while every buffer they name and
/// every size stays the same; the owner keys its graphs by the sizes.
pub const Graph = struct {
    exec: driver_api.GraphExec,

    /// Starts recording: launches on the stream are kept, not run, until `endCapture`.
    pub fn beginCapture(gpu: *const Gpu, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuStreamBeginCapture_v2(gpu.stream, driver_api.stream_capture_mode_thread_local), "cuStreamBeginCapture", diag);
    }

    /// Ends a capture begun by `beginCapture` and makes the recording launchable. Call it also when
    /// recording failed (`keep` false): the stream leaves capture mode and nothing is kept.
    pub fn endCapture(gpu: *const Gpu, keep: bool, diag: *Diagnostic) Error!Graph {
        const api = &gpu.driver.api;
        var graph: driver_api.Graph = null;
        const ended = api.cuStreamEndCapture(gpu.stream, &graph);
        defer if (graph != null) {
            _ = api.cuGraphDestroy(graph);
        };
        if (!keep) return error.CudaFailed;
        try gpu.driver.check(ended, "cuStreamEndCapture", diag);
        var exec: driver_api.GraphExec = null;
        try gpu.driver.check(api.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate", diag);
        return .{ .exec = exec };
    }

    /// Loads the graph's work onto the device ahead of its first launch, which then runs as a
    /// replay does (a timed first launch would otherwise count the upload).
    pub fn upload(graph: Graph, gpu: *const Gpu, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuGraphUpload(graph.exec, gpu.stream), "cuGraphUpload", diag);
    }

    pub fn launch(graph: Graph, gpu: *const Gpu, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuGraphLaunch(graph.exec, gpu.stream), "cuGraphLaunch", diag);
    }

    pub fn destroy(graph: *Graph, gpu: *const Gpu) void {
        _ = gpu.driver.api.cuGraphExecDestroy(graph.exec);
        graph.* = undefined;
    }
};

/// A pair of events around work on the GPU's stream: device time, not host time.
pub const Timer = struct {
    start: driver_api.Event,
    stop: driver_api.Event,

    pub fn create(gpu: *const Gpu, diag: *Diagnostic) Error!Timer {
        var timer: Timer = undefined;
        try gpu.driver.check(gpu.driver.api.cuEventCreate(&timer.start, 0), "cuEventCreate", diag);
        errdefer _ = gpu.driver.api.cuEventDestroy_v2(timer.start);
        try gpu.driver.check(gpu.driver.api.cuEventCreate(&timer.stop, 0), "cuEventCreate", diag);
        return timer;
    }

    pub fn destroy(timer: *Timer, gpu: *const Gpu) void {
        _ = gpu.driver.api.cuEventDestroy_v2(timer.start);
        _ = gpu.driver.api.cuEventDestroy_v2(timer.stop);
        timer.* = undefined;
    }

    pub fn begin(timer: *const Timer, gpu: *const Gpu, diag: *Diagnostic) Error!void {
        try gpu.driver.check(gpu.driver.api.cuEventRecord(timer.start, gpu.stream), "cuEventRecord", diag);
    }

    /// Records the end and waits for it; returns milliseconds between the two events.
    pub fn end(timer: *const Timer, gpu: *const Gpu, diag: *Diagnostic) Error!f32 {
        const api = &gpu.driver.api;
        try gpu.driver.check(api.cuEventRecord(timer.stop, gpu.stream), "cuEventRecord", diag);
        try gpu.driver.check(api.cuEventSynchronize(timer.stop), "cuEventSynchronize", diag);
        var elapsed_ms: f32 = 0;
        try gpu.driver.check(api.cuEventElapsedTime(&elapsed_ms, timer.start, timer.stop), "cuEventElapsedTime", diag);
        return elapsed_ms;
    }
};

/// A loaded fatbin with every kernel it must hold resolved at load: a missing kernel fails here,
/// not mid-request.
pub fn Module(comptime kernel_names: []const [:0]const u8) type {
    return struct {
        const Self = @This();
        handle: driver_api.Module,
        functions: [kernel_names.len]driver_api.Function,

        pub fn load(gpu: *const Gpu, image: []const u8, image_name: []const u8, diag: *Diagnostic) Error!Self {
            if (image.len == 0) {
                diag.set("kernel image '{s}' is empty: built without -Dnvcc", .{image_name});
                return error.CudaUnavailable;
            }
            var module: Self = undefined;
            var what_buffer: [128]u8 = undefined;
            const what = std.fmt.bufPrint(&what_buffer, "cuModuleLoadData({s}) on sm_{d}", .{ image_name, gpu.compute_capability }) catch "cuModuleLoadData";
            try gpu.driver.check(gpu.driver.api.cuModuleLoadData(&module.handle, image.ptr), what, diag);
            errdefer _ = gpu.driver.api.cuModuleUnload(module.handle);
            inline for (kernel_names, 0..) |kernel_name, i| {
                const result = gpu.driver.api.cuModuleGetFunction(&module.functions[i], module.handle, kernel_name);
                if (result != 0) {
                    diag.set("kernel '{s}' is missing from '{s}' ({s})", .{ kernel_name, image_name, gpu.driver.resultName(result) });
                    return error.CudaFailed;
                }
            }
            return module;
        }

        pub fn unload(module: *Self, gpu: *const Gpu) void {
            _ = gpu.driver.api.cuModuleUnload(module.handle);
            module.* = undefined;
        }

        /// Sets the module's `__constant__ float` `name` (a per-model switch such as swiglu.cuh's
        /// tf_swiglu_limit: every model loads its own modules).
        pub fn setFloat(module: *const Self, gpu: *const Gpu, comptime name: [:0]const u8, value: f32, diag: *Diagnostic) Error!void {
            var ptr: DevicePtr = 0;
            var size: usize = 0;
            try gpu.driver.check(gpu.driver.api.cuModuleGetGlobal_v2(&ptr, &size, module.handle, name), "cuModuleGetGlobal(" ++ name ++ ")", diag);
            std.debug.assert(size == @sizeOf(f32));
            try gpu.upload(ptr, std.mem.asBytes(&value), diag);
        }

        pub fn function(module: *const Self, comptime kernel_name: []const u8) driver_api.Function {
            inline for (kernel_names, 0..) |known, i| {
                if (comptime std.mem.eql(u8, known, kernel_name)) return module.functions[i];
            }
            @compileError("kernel not declared: " ++ kernel_name);
        }
    };
}

pub const Launch = struct {
    grid: [3]u32,
    block: [3]u32,
    shared_bytes: u32 = 0,
};

/// `launch` given the argument values themselves (a tuple of runtime values: a comptime-known one
/// would be a comptime field, without an address), copied here and passed by address.
pub fn launchValues(gpu: *const Gpu, function: driver_api.Function, config: Launch, values: anytype, what: []const u8, diag: *Diagnostic) Error!void {
    var copy = values;
    var pointers: [copy.len]*const anyopaque = undefined;
    inline for (0..copy.len) |i| pointers[i] = @ptrCast(&copy[i]);
    try launch(gpu, function, config, pointers, what, diag);
}

/// `args` is a tuple of pointers to each kernel argument, in order.
pub fn launch(gpu: *const Gpu, function: driver_api.Function, config: Launch, args: anytype, what: []const u8, diag: *Diagnostic) Error!void {
    var params: [args.len]?*const anyopaque = undefined;
    inline for (args, 0..) |arg, i| params[i] = @ptrCast(arg);
    var what_buffer: [160]u8 = undefined;
    const described = std.fmt.bufPrint(&what_buffer, "{s} (grid {d}x{d}x{d}, block {d})", .{
        what, config.grid[0], config.grid[1], config.grid[2], config.block[0],
    }) catch what;
    if (gpu.timeline) |timeline| try timeline.mark(gpu, what, diag);
    if (gpu.programmatic) {
        var attribute: driver_api.LaunchAttribute = .{ .id = driver_api.launch_attribute_programmatic_stream_serialization };
        std.mem.writeInt(c_int, attribute.value[0..4], 1, .little); // programmaticStreamSerializationAllowed
        const launch_config: driver_api.LaunchConfig = .{
            .grid = .{ config.grid[0], config.grid[1], config.grid[2] },
            .block = .{ config.block[0], config.block[1], config.block[2] },
            .shared_bytes = config.shared_bytes,
            .stream = gpu.stream,
            .attributes = @ptrCast(&attribute),
            .attribute_count = 1,
        };
        return gpu.driver.check(gpu.driver.launch_ex.?(&launch_config, function, &params, null), described, diag);
    }
    try gpu.driver.check(gpu.driver.api.cuLaunchKernel(
        function,
        config.grid[0],
        config.grid[1],
        config.grid[2],
        config.block[0],
        config.block[1],
        config.block[2],
        config.shared_bytes,
        gpu.stream,
        &params,
        null,
    ), described, diag);
}
