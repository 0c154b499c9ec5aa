//! Unbuffered stdout lines for the GPU tools: a PASS/FAIL line or a table row is out before a
//! kernel can take the process down.
const std = @import("std");

pub fn say(comptime fmt: []const u8, args: anytype) void {
    var buffer: [4096]u8 = undefined;
    const text = std.fmt.bufPrint(&buffer, fmt, args) catch return;
    _ = std.c.write(1, text.ptr, text.len);
}
