//! A read-only memory map of a whole file, through libc so that it works the same on x86-64 and
//! aarch64 hosts. Tensors are views into this mapping; nothing is copied.
const std = @import("std");
const c = std.c;

pub const OpenError = error{ FileNotFound, AccessDenied, IsDirectory, MapFailed, PathTooLong, ReadFailed };

pub const MappedFile = struct {
    pub const Error = OpenError;

    bytes: []align(std.heap.page_size_min) const u8,

    pub fn open(path: []const u8) Error!MappedFile {
        var path_z: [std.fs.max_path_bytes + 1]u8 = undefined;
        if (path.len >= path_z.len) return error.PathTooLong;
        @memcpy(path_z[0..path.len], path);
        path_z[path.len] = 0;

        const fd = c.open(@ptrCast(&path_z), .{ .ACCMODE = .RDONLY, .CLOEXEC = true });
        if (fd < 0) return switch (c.errno(fd)) {
            .NOENT, .NOTDIR => error.FileNotFound,
            .ACCES, .PERM => error.AccessDenied,
            else => error.ReadFailed,
        };
        defer _ = c.close(fd);

        const end = c.lseek(fd, 0, c.SEEK.END);
        if (end < 0) return if (c.errno(end) == .ISDIR) error.IsDirectory else error.ReadFailed;
        const size: usize = @intCast(end);
        if (size == 0) return .{ .bytes = &.{} };

        const address = c.mmap(null, size, .{ .READ = true }, .{ .TYPE = .PRIVATE }, fd, 0);
        if (address == c.MAP_FAILED) {
            // lseek succeeds on a directory on some filesystems; mmap then fails with ENODEV.
            return if (c.errno(-1) == .NODEV) error.IsDirectory else error.MapFailed;
        }
        const base: [*]align(std.heap.page_size_min) const u8 = @ptrCast(@alignCast(address));
        return .{ .bytes = base[0..size] };
    }

    pub fn close(file: *MappedFile) void {
        if (file.bytes.len != 0) _ = c.munmap(@ptrCast(file.bytes.ptr), file.bytes.len);
        file.* = undefined;
    }
};

pub fn isDirectory(path: []const u8) bool {
    var path_z: [std.fs.max_path_bytes + 1]u8 = undefined;
    if (path.len >= path_z.len) return false;
    @memcpy(path_z[0..path.len], path);
    path_z[path.len] = 0;
    const fd = c.open(@ptrCast(&path_z), .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .CLOEXEC = true });
    if (fd < 0) return false;
    _ = c.close(fd);
    return true;
}
