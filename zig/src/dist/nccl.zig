//! NCCL through dlopen("libnccl.so.2"): a typed table resolved at open, error codes mapped to names
//! and NCCL's own strings, and the collectives the tensor-parallel forward needs, on a CUDA stream.
//! Nothing in the build links NCCL. The library is looked for at TRELLISFORGE_NCCL, then by the
//! dynamic loader's search, then in the usual system directories; the Python package points
//! TRELLISFORGE_NCCL at the nvidia-nccl-cu* wheel when one is installed.
const std = @import("std");
const Diagnostic = @import("../core/diagnostic.zig").Diagnostic;

pub const Result = c_int;
pub const Comm = ?*opaque {};
pub const Stream = ?*anyopaque;
pub const UniqueId = extern struct { internal: [128]u8 };

pub const DataType = enum(c_int) { int32 = 2, float16 = 6, float32 = 7, bfloat16 = 9 };
pub const RedOp = enum(c_int) { sum = 0 };

pub const Error = error{ NcclUnavailable, NcclFailed };

pub const Api = struct {
    ncclGetVersion: *const fn (*c_int) callconv(.c) Result,
    ncclGetUniqueId: *const fn (*UniqueId) callconv(.c) Result,
    ncclCommInitRank: *const fn (*Comm, c_int, UniqueId, c_int) callconv(.c) Result,
    ncclCommDestroy: *const fn (Comm) callconv(.c) Result,
    ncclGetErrorString: *const fn (Result) callconv(.c) [*:0]const u8,
    ncclAllReduce: *const fn (?*const anyopaque, ?*anyopaque, usize, DataType, RedOp, Comm, Stream) callconv(.c) Result,
    ncclAllGather: *const fn (?*const anyopaque, ?*anyopaque, usize, DataType, Comm, Stream) callconv(.c) Result,
    ncclBroadcast: *const fn (?*const anyopaque, ?*anyopaque, usize, DataType, c_int, Comm, Stream) callconv(.c) Result,
};

const invalid_usage = 5; // ncclInvalidUsage
const result_names = [_][]const u8{ "ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress" };

const system_candidates = [_][:0]const u8{
    "libnccl.so.2",
    "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
    "/usr/lib/aarch64-linux-gnu/libnccl.so.2",
    "/usr/local/cuda/lib64/libnccl.so.2",
};

pub const Nccl = struct {
    library: std.DynLib,
    api: Api,
    version: c_int,

    pub fn open(diag: *Diagnostic) Error!Nccl {
        var library = openLibrary() orelse {
            diag.set("NCCL unavailable: libnccl.so.2 not found (set TRELLISFORGE_NCCL, or install nvidia-nccl-cu13)", .{});
            return error.NcclUnavailable;
        };
        errdefer library.close();
        var api: Api = undefined;
        const info = @typeInfo(Api).@"struct";
        inline for (info.field_names, info.field_types) |name, T| {
            @field(api, name) = library.lookup(T, name) orelse {
                diag.set("NCCL unavailable: libnccl.so.2 lacks '{s}'", .{name});
                return error.NcclUnavailable;
            };
        }
        var version: c_int = 0;
        _ = api.ncclGetVersion(&version);
        return .{ .library = library, .api = api, .version = version };
    }

    fn openLibrary() ?std.DynLib {
        if (std.c.getenv("TRELLISFORGE_NCCL")) |path| {
            if (std.DynLib.open(std.mem.span(path))) |lib| return lib else |_| {}
        }
        for (system_candidates) |candidate| {
            if (std.DynLib.open(candidate)) |lib| return lib else |_| {}
        }
        return null;
    }

    pub fn close(nccl: *Nccl) void {
        nccl.library.close();
        nccl.* = undefined;
    }

    pub fn check(nccl: *const Nccl, result: Result, what: []const u8, diag: *Diagnostic) Error!void {
        if (result == 0) return;
        const name = if (result >= 0 and result < result_names.len) result_names[@intCast(result)] else "unknown ncclResult";
        diag.set("{s}: {s} ({s})", .{ what, name, std.mem.span(nccl.api.ncclGetErrorString(result)) });
        return error.NcclFailed;
    }

    pub fn uniqueId(nccl: *const Nccl, diag: *Diagnostic) Error!UniqueId {
        var id: UniqueId = undefined;
        try nccl.check(nccl.api.ncclGetUniqueId(&id), "ncclGetUniqueId", diag);
        return id;
    }

    /// Every rank calls this with the id rank 0 made; it returns when all `world` have joined.
    /// NVLink multicast (NVLS) stays off unless the caller's environment turned it on explicitly.
    pub fn initRank(nccl: *const Nccl, world: usize, rank: usize, id: UniqueId, diag: *Diagnostic) Error!Comm {
        if (std.c.getenv("NCCL_NVLS_ENABLE") == null) _ = setenv("NCCL_NVLS_ENABLE", "0", 0);
        var comm: Comm = null;
        const result = nccl.api.ncclCommInitRank(&comm, @intCast(world), id, @intCast(rank));
        if (result == invalid_usage) {
            // NCCL's own text says only "invalid usage"; the usual cause is ours to name.
            diag.set("ncclCommInitRank: ncclInvalidUsage: NCCL needs each rank on its own GPU (are two ranks on one, e.g. TRELLISFORGE_GPU set alike?); TRELLISFORGE_TP_COLLECTIVE=tcp sums over TCP instead", .{});
            return error.NcclFailed;
        }
        try nccl.check(result, "ncclCommInitRank", diag);
        return comm;
    }

    pub fn allReduceSum(nccl: *const Nccl, comm: Comm, buffer: u64, count: usize, dtype: DataType, stream: Stream, diag: *Diagnostic) Error!void {
        const ptr: ?*anyopaque = @ptrFromInt(buffer);
        try nccl.check(nccl.api.ncclAllReduce(ptr, ptr, count, dtype, .sum, comm, stream), "ncclAllReduce", diag);
    }

    pub fn broadcast(nccl: *const Nccl, comm: Comm, buffer: u64, count: usize, dtype: DataType, root: usize, stream: Stream, diag: *Diagnostic) Error!void {
        const ptr: ?*anyopaque = @ptrFromInt(buffer);
        try nccl.check(nccl.api.ncclBroadcast(ptr, ptr, count, dtype, @intCast(root), comm, stream), "ncclBroadcast", diag);
    }

    /// `target` holds world × count elements, rank r's at r × count.
    pub fn allGather(nccl: *const Nccl, comm: Comm, source: u64, target: u64, count: usize, dtype: DataType, stream: Stream, diag: *Diagnostic) Error!void {
        try nccl.check(nccl.api.ncclAllGather(@ptrFromInt(source), @ptrFromInt(target), count, dtype, comm, stream), "ncclAllGather", diag);
    }
};

extern "c" fn setenv(name: [*:0]const u8, value: [*:0]const u8, overwrite: c_int) c_int;

test "NCCL is reported unavailable, not fatal, where it is absent" {
    var diag: Diagnostic = .{};
    if (Nccl.open(&diag)) |opened| {
        var nccl = opened;
        try std.testing.expect(nccl.version > 0);
        nccl.close();
    } else |err| {
        try std.testing.expectEqual(error.NcclUnavailable, err);
        try std.testing.expect(std.mem.startsWith(u8, diag.message(), "NCCL unavailable"));
    }
}
