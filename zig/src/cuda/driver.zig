//! The CUDA driver API through dlopen("libcuda.so.1"): one typed table resolved at open, so a
//! missing symbol is an error naming it, and nothing in the build links CUDA. Versioned names are
//! the ones cuda.h maps to (cuMemAlloc -> cuMemAlloc_v2). The library loads and its CPU paths run
//! on machines without a GPU; `open` then fails with the reason.
const std = @import("std");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;
const kernel_images = @import("kernel_images");

pub const Result = c_int;
pub const Device = c_int;
pub const Context = ?*opaque {};
pub const Stream = ?*opaque {};
pub const Event = ?*opaque {};
pub const Module = ?*opaque {};
pub const Function = ?*opaque {};
pub const Graph = ?*opaque {};
pub const GraphExec = ?*opaque {};
pub const DevicePtr = u64;

pub const Error = error{ CudaUnavailable, CudaFailed, OutOfMemory };

/// Field names are the exported symbol names.
pub const Api = struct {
    cuInit: *const fn (c_uint) callconv(.c) Result,
    cuDriverGetVersion: *const fn (*c_int) callconv(.c) Result,
    cuGetErrorName: *const fn (Result, *?[*:0]const u8) callconv(.c) Result,
    cuGetErrorString: *const fn (Result, *?[*:0]const u8) callconv(.c) Result,
    cuDeviceGetCount: *const fn (*c_int) callconv(.c) Result,
    cuDeviceGet: *const fn (*Device, c_int) callconv(.c) Result,
    cuDeviceGetName: *const fn ([*]u8, c_int, Device) callconv(.c) Result,
    cuDeviceGetAttribute: *const fn (*c_int, c_int, Device) callconv(.c) Result,
    cuDeviceTotalMem_v2: *const fn (*usize, Device) callconv(.c) Result,
    cuDevicePrimaryCtxRetain: *const fn (*Context, Device) callconv(.c) Result,
    cuDevicePrimaryCtxRelease_v2: *const fn (Device) callconv(.c) Result,
    cuCtxSetCurrent: *const fn (Context) callconv(.c) Result,
    cuCtxSynchronize: *const fn () callconv(.c) Result,
    cuStreamCreate: *const fn (*Stream, c_uint) callconv(.c) Result,
    cuStreamDestroy_v2: *const fn (Stream) callconv(.c) Result,
    cuStreamSynchronize: *const fn (Stream) callconv(.c) Result,
    cuStreamWaitEvent: *const fn (Stream, Event, c_uint) callconv(.c) Result,
    cuEventCreate: *const fn (*Event, c_uint) callconv(.c) Result,
    cuEventDestroy_v2: *const fn (Event) callconv(.c) Result,
    cuEventRecord: *const fn (Event, Stream) callconv(.c) Result,
    cuEventRecordWithFlags: *const fn (Event, Stream, c_uint) callconv(.c) Result,
    cuEventSynchronize: *const fn (Event) callconv(.c) Result,
    cuEventElapsedTime: *const fn (*f32, Event, Event) callconv(.c) Result,
    cuMemAlloc_v2: *const fn (*DevicePtr, usize) callconv(.c) Result,
    cuMemFree_v2: *const fn (DevicePtr) callconv(.c) Result,
    cuMemcpyHtoD_v2: *const fn (DevicePtr, *const anyopaque, usize) callconv(.c) Result,
    cuMemcpyDtoH_v2: *const fn (*anyopaque, DevicePtr, usize) callconv(.c) Result,
    cuMemsetD8_v2: *const fn (DevicePtr, u8, usize) callconv(.c) Result,
    cuMemcpyHtoDAsync_v2: *const fn (DevicePtr, *const anyopaque, usize, Stream) callconv(.c) Result,
    cuMemcpyDtoDAsync_v2: *const fn (DevicePtr, DevicePtr, usize, Stream) callconv(.c) Result,
    cuMemcpyDtoHAsync_v2: *const fn (*anyopaque, DevicePtr, usize, Stream) callconv(.c) Result,
    cuModuleLoadData: *const fn (*Module, *const anyopaque) callconv(.c) Result,
    cuModuleUnload: *const fn (Module) callconv(.c) Result,
    cuModuleGetFunction: *const fn (*Function, Module, [*:0]const u8) callconv(.c) Result,
    cuModuleGetGlobal_v2: *const fn (*DevicePtr, *usize, Module, [*:0]const u8) callconv(.c) Result,
    cuFuncSetAttribute: *const fn (Function, c_int, c_int) callconv(.c) Result,
    cuStreamBeginCapture_v2: *const fn (Stream, c_int) callconv(.c) Result,
    cuStreamEndCapture: *const fn (Stream, *Graph) callconv(.c) Result,
    cuGraphInstantiateWithFlags: *const fn (*GraphExec, Graph, c_ulonglong) callconv(.c) Result,
    cuGraphLaunch: *const fn (GraphExec, Stream) callconv(.c) Result,
    cuGraphUpload: *const fn (GraphExec, Stream) callconv(.c) Result,
    cuGraphExecDestroy: *const fn (GraphExec) callconv(.c) Result,
    cuGraphDestroy: *const fn (Graph) callconv(.c) Result,
    cuLaunchKernel: *const fn (Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Stream, ?[*]const ?*const anyopaque, ?[*]const ?*anyopaque) callconv(.c) Result,
};

/// CUlaunchAttribute: the id, padding to 8 bytes, the 64-byte value union (cuda.h).
pub const LaunchAttribute = extern struct {
    id: c_int,
    pad: [4]u8 = @splat(0),
    value: [64]u8 align(8) = @splat(0),
};

/// CUlaunchConfig, cuLaunchKernelEx's first argument.
pub const LaunchConfig = extern struct {
    grid: [3]c_uint,
    block: [3]c_uint,
    shared_bytes: c_uint,
    stream: Stream,
    attributes: ?[*]LaunchAttribute,
    attribute_count: c_uint,
};

pub const LaunchKernelEx = *const fn (*const LaunchConfig, Function, ?[*]const ?*const anyopaque, ?[*]const ?*anyopaque) callconv(.c) Result;

/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the launch may begin before the kernel
/// ahead of it in the stream completes (it waits with griddepcontrol.wait; grid_dependency.cuh).
pub const launch_attribute_programmatic_stream_serialization = 6;

pub const attribute_compute_capability_major = 75;
pub const attribute_compute_capability_minor = 76;
pub const attribute_multiprocessor_count = 16;
pub const attribute_clock_rate_khz = 13;
pub const function_attribute_max_dynamic_shared_bytes = 8;
/// CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: only this thread's unsafe calls end a capture, so another
/// engine's thread in the same process is not disturbed.
pub const stream_capture_mode_thread_local = 1;
/// CU_EVENT_RECORD_EXTERNAL: an event recorded while capturing becomes a node of the graph that
/// records it on every replay (without it, capture takes the record as a fork point only).
pub const event_record_external = 1;
/// CU_EVENT_DISABLE_TIMING: an event that only orders streams.
pub const event_disable_timing = 2;

/// Names for the results a user is most likely to meet, for drivers too old for cuGetErrorName.
const known_results = [_]struct { Result, []const u8 }{
    .{ 1, "CUDA_ERROR_INVALID_VALUE" },             .{ 2, "CUDA_ERROR_OUT_OF_MEMORY" },
    .{ 3, "CUDA_ERROR_NOT_INITIALIZED" },           .{ 34, "CUDA_ERROR_STUB_LIBRARY" },
    .{ 100, "CUDA_ERROR_NO_DEVICE" },               .{ 101, "CUDA_ERROR_INVALID_DEVICE" },
    .{ 200, "CUDA_ERROR_INVALID_IMAGE" },           .{ 201, "CUDA_ERROR_INVALID_CONTEXT" },
    .{ 209, "CUDA_ERROR_NO_BINARY_FOR_GPU" },       .{ 218, "CUDA_ERROR_INVALID_PTX" },
    .{ 222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" }, .{ 400, "CUDA_ERROR_INVALID_HANDLE" },
    .{ 500, "CUDA_ERROR_NOT_FOUND" },               .{ 700, "CUDA_ERROR_ILLEGAL_ADDRESS" },
    .{ 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" }, .{ 719, "CUDA_ERROR_LAUNCH_FAILED" },
    .{ 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" },  .{ 999, "CUDA_ERROR_UNKNOWN" },
};

pub const Driver = struct {
    library: std.DynLib,
    api: Api,
    /// cuLaunchKernelEx (CUDA 12.0 and later drivers), else null: launches then take no attributes.
    launch_ex: ?LaunchKernelEx,

    /// Loads libcuda and initialises it. Fails, with the reason in `diag`, when the library was
    /// built without kernels, libcuda is absent, a symbol is missing, or no device answers.
    pub fn open(diag: *Diagnostic) Error!Driver {
        if (!kernel_images.built_with_nvcc) {
            diag.set("CUDA unavailable: this library was built without -Dnvcc, so it holds no kernels", .{});
            return error.CudaUnavailable;
        }
        var library = std.DynLib.open("libcuda.so.1") catch |err| {
            diag.set("CUDA unavailable: cannot load libcuda.so.1 ({t}); is the NVIDIA driver installed?", .{err});
            return error.CudaUnavailable;
        };
        errdefer library.close();

        var api: Api = undefined;
        const info = @typeInfo(Api).@"struct";
        inline for (info.field_names, info.field_types) |name, T| {
            @field(api, name) = library.lookup(T, name) orelse {
                diag.set("CUDA unavailable: libcuda.so.1 lacks '{s}' (driver too old?)", .{name});
                return error.CudaUnavailable;
            };
        }
        var driver: Driver = .{ .library = library, .api = api, .launch_ex = library.lookup(LaunchKernelEx, "cuLaunchKernelEx") };
        const init_result = api.cuInit(0);
        if (init_result != 0) {
            diag.set("CUDA unavailable: cuInit failed: {s}", .{driver.resultName(init_result)});
            return error.CudaUnavailable;
        }
        var count: c_int = 0;
        const count_result = api.cuDeviceGetCount(&count);
        if (count_result != 0 or count == 0) {
            diag.set("CUDA unavailable: no CUDA device ({s})", .{driver.resultName(if (count_result != 0) count_result else 100)});
            return error.CudaUnavailable;
        }
        return driver;
    }

    pub fn close(driver: *Driver) void {
        driver.library.close();
        driver.* = undefined;
    }

    pub fn resultName(driver: *const Driver, result: Result) []const u8 {
        var name: ?[*:0]const u8 = null;
        if (driver.api.cuGetErrorName(result, &name) == 0) {
            if (name) |text| return std.mem.span(text);
        }
        for (known_results) |entry| if (entry[0] == result) return entry[1];
        return "unknown CUresult";
    }

    /// Turns a CUresult into an error with "<what>: <NAME> (<description>)" in `diag`.
    pub fn check(driver: *const Driver, result: Result, what: []const u8, diag: *Diagnostic) Error!void {
        if (result == 0) return;
        var description: ?[*:0]const u8 = null;
        _ = driver.api.cuGetErrorString(result, &description);
        diag.set("{s}: {s} ({s})", .{
            what, driver.resultName(result), if (description) |d| std.mem.span(d) else "no description",
        });
        return if (result == 2) error.OutOfMemory else error.CudaFailed;
    }
};

test "the library reports why CUDA is unavailable instead of failing to load" {
    var diag: Diagnostic = .{};
    if (Driver.open(&diag)) |opened| {
        var driver = opened;
        driver.close();
    } else |err| {
        try std.testing.expectEqual(error.CudaUnavailable, err);
        try std.testing.expect(std.mem.startsWith(u8, diag.message(), "CUDA unavailable: "));
    }
}

comptime {
    std.debug.assert(@sizeOf(LaunchAttribute) == 72 and @sizeOf(LaunchConfig) == 56);
}
