//! The C ABI's statuses and its last-error message: a Zig error becomes a tf_status, its
//! diagnostic (or its name) the thread-local text that tf_last_error returns.
const std = @import("std");
const core = @import("trellisforge").core;

pub const Status = enum(c_int) {
    ok = 0,
    invalid_argument = 1,
    io = 2,
    format = 3,
    not_found = 4,
    unsupported = 5,
    out_of_memory = 6,
    cuda = 7,
    internal = 8,
};

threadlocal var last_error: [1024:0]u8 = @splat(0);

fn setError(message: []const u8) void {
    const length = @min(message.len, last_error.len);
    @memcpy(last_error[0..length], message[0..length]);
    last_error[length] = 0;
}

pub fn fail(status: Status, comptime fmt: []const u8, args: anytype) Status {
    var diag: core.Diagnostic = .{};
    diag.set(fmt, args);
    setError(diag.message());
    return status;
}

fn statusOf(err: anyerror) Status {
    return switch (err) {
        error.FileNotFound, error.AccessDenied, error.IsDirectory, error.MapFailed, error.PathTooLong, error.ReadFailed => .io,
        error.Truncated, error.HeaderPastEnd, error.HeaderTooLarge, error.InvalidJson, error.InvalidHeader, error.UnknownDType, error.RangeOutsideFile, error.ShapeMismatch, error.OverlappingRanges, error.NoWeights, error.InvalidIndex, error.IndexMismatch, error.DuplicateTensor, error.InvalidConfig, error.InvalidLayer => .format,
        error.MissingTensor, error.NotFound => .not_found,
        error.InvalidArgument => .invalid_argument,
        error.UnsupportedModel => .unsupported,
        error.NoConfig, error.InvalidWeights, error.UnexpectedTensor => .format,
        error.NetworkFailed, error.PeerClosed, error.TimedOut, error.InvalidAddress => .io,
        error.UnsupportedQuantization => .unsupported,
        error.OutOfMemory => .out_of_memory,
        error.CudaUnavailable, error.CudaFailed => .cuda,
        else => .internal,
    };
}

/// Maps an error to its status; the message is the diagnostic's, or the error's name.
pub fn failWith(err: anyerror, diag: *const core.Diagnostic) Status {
    if (diag.message().len > 0) {
        setError(diag.message());
    } else {
        _ = fail(.internal, "{t}", .{err});
    }
    return statusOf(err);
}

pub fn ok() Status {
    last_error[0] = 0;
    return .ok;
}

/// The last failed call's message on this thread ("" after a call that succeeded).
pub fn lastError() [*:0]const u8 {
    return &last_error;
}
