//! The message that goes with a returned error: which tensor, which field, which byte. Errors are
//! typed for the caller's control flow; the Diagnostic says what went wrong in words.
const std = @import("std");

pub const Diagnostic = struct {
    buffer: [1024]u8 = undefined,
    len: usize = 0,

    pub fn set(diag: *Diagnostic, comptime fmt: []const u8, args: anytype) void {
        const text = std.fmt.bufPrint(&diag.buffer, fmt, args) catch blk: {
            const ellipsis = "...";
            @memcpy(diag.buffer[diag.buffer.len - ellipsis.len ..], ellipsis);
            break :blk diag.buffer[0..];
        };
        diag.len = text.len;
    }

    pub fn message(diag: *const Diagnostic) []const u8 {
        return diag.buffer[0..diag.len];
    }
};

test "long messages are cut, not lost" {
    var diag: Diagnostic = .{};
    const long: [2000]u8 = @splat('x');
    diag.set("{s}", .{&long});
    try std.testing.expectEqual(@as(usize, 1024), diag.message().len);
    try std.testing.expect(std.mem.endsWith(u8, diag.message(), "..."));
}
