//! One safetensors file: an 8-byte little-endian header length, a JSON header, then the data.
//! Everything in the header is validated before any tensor is handed out: the header length
//! against the file size, the JSON, every dtype, shape and byte range, and that no two ranges
//! overlap. Tensors are views into the caller's bytes (normally a memory map); nothing is copied.
const std = @import("std");
const DType = @import("dtype.zig").DType;
const Diagnostic = @import("diagnostic.zig").Diagnostic;
const MappedFile = @import("mapped_file.zig").MappedFile;

pub const Error = error{
    Truncated,
    HeaderPastEnd,
    HeaderTooLarge,
    InvalidJson,
    InvalidHeader,
    UnknownDType,
    RangeOutsideFile,
    ShapeMismatch,
    OverlappingRanges,
    OutOfMemory,
};

pub const OpenError = Error || MappedFile.Error;

/// The safetensors reference implementation refuses headers over 100 MB.
pub const header_size_max_bytes: u64 = 100 * 1000 * 1000;
pub const rank_max = 8;

pub const Tensor = struct {
    name: []const u8,
    dtype: DType,
    shape_buffer: [rank_max]u64,
    rank: u8,
    data: []const u8,

    pub fn shape(tensor: *const Tensor) []const u64 {
        return tensor.shape_buffer[0..tensor.rank];
    }

    pub fn numel(tensor: *const Tensor) u64 {
        var count: u64 = 1;
        for (tensor.shape()) |dim| count *= dim;
        return count;
    }

    /// The data as elements of T. Safetensors does not promise alignment, so this is an unaligned
    /// slice; callers that need aligned access copy.
    pub fn elements(tensor: *const Tensor, comptime T: type) []align(1) const T {
        std.debug.assert(tensor.data.len % @sizeOf(T) == 0);
        return std.mem.bytesAsSlice(T, tensor.data);
    }
};

pub const File = struct {
    arena: std.heap.ArenaAllocator,
    /// Sorted by name.
    tensors: []Tensor,
    map: ?MappedFile,

    pub fn open(gpa: std.mem.Allocator, path: []const u8, diag: *Diagnostic) OpenError!File {
        var map = MappedFile.open(path) catch |err| {
            diag.set("cannot open '{s}': {t}", .{ path, err });
            return err;
        };
        errdefer map.close();

        var file = try parse(gpa, map.bytes, diag);
        file.map = map;
        return file;
    }

    /// Validates `bytes` as a whole safetensors file. The returned File views `bytes`, which must
    /// outlive it.
    pub fn parse(gpa: std.mem.Allocator, bytes: []const u8, diag: *Diagnostic) Error!File {
        var arena = std.heap.ArenaAllocator.init(gpa);
        errdefer arena.deinit();

        const tensors = try parseHeader(arena.allocator(), bytes, diag);
        return .{ .arena = arena, .tensors = tensors, .map = null };
    }

    pub fn deinit(file: *File) void {
        if (file.map) |*map| map.close();
        file.arena.deinit();
        file.* = undefined;
    }

    pub fn find(file: *const File, name: []const u8) ?*const Tensor {
        const index = std.sort.binarySearch(Tensor, file.tensors, name, compareName) orelse return null;
        return &file.tensors[index];
    }
};

fn compareName(name: []const u8, tensor: Tensor) std.math.Order {
    return std.mem.order(u8, name, tensor.name);
}

fn lessByName(_: void, a: Tensor, b: Tensor) bool {
    return std.mem.lessThan(u8, a.name, b.name);
}

fn lessByOffset(_: void, a: Tensor, b: Tensor) bool {
    return @intFromPtr(a.data.ptr) < @intFromPtr(b.data.ptr);
}

fn parseHeader(arena: std.mem.Allocator, bytes: []const u8, diag: *Diagnostic) Error![]Tensor {
    if (bytes.len < 8) {
        diag.set("file is {d} bytes, too short for the 8-byte header length", .{bytes.len});
        return error.Truncated;
    }
    const header_len = std.mem.readInt(u64, bytes[0..8], .little);
    if (header_len > bytes.len - 8) {
        diag.set("header length {d} runs past the end of the {d}-byte file", .{ header_len, bytes.len });
        return error.HeaderPastEnd;
    }
    if (header_len > header_size_max_bytes) {
        diag.set("header length {d} exceeds the {d}-byte limit", .{ header_len, header_size_max_bytes });
        return error.HeaderTooLarge;
    }
    const header = bytes[8..][0..header_len];
    const data = bytes[8 + header_len ..];

    const root = std.json.parseFromSliceLeaky(std.json.Value, arena, header, .{}) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        else => {
            diag.set("header is not valid JSON ({t})", .{err});
            return error.InvalidJson;
        },
    };
    if (root != .object) {
        diag.set("header is JSON but not an object", .{});
        return error.InvalidHeader;
    }

    var tensors: std.ArrayList(Tensor) = .empty;
    try tensors.ensureTotalCapacity(arena, root.object.count());
    var it = root.object.iterator();
    while (it.next()) |entry| {
        const name = entry.key_ptr.*;
        if (std.mem.eql(u8, name, "__metadata__")) {
            try checkMetadata(entry.value_ptr.*, diag);
            continue;
        }
        tensors.appendAssumeCapacity(try parseTensor(name, entry.value_ptr.*, data, diag));
    }

    try checkNoOverlap(tensors.items, data, diag);
    std.sort.pdq(Tensor, tensors.items, {}, lessByName);
    return tensors.items;
}

fn checkMetadata(value: std.json.Value, diag: *Diagnostic) Error!void {
    if (value != .object) {
        diag.set("__metadata__ is not an object", .{});
        return error.InvalidHeader;
    }
    var it = value.object.iterator();
    while (it.next()) |entry| {
        if (entry.value_ptr.* != .string) {
            diag.set("__metadata__ value '{s}' is not a string", .{entry.key_ptr.*});
            return error.InvalidHeader;
        }
    }
}

fn parseTensor(name: []const u8, value: std.json.Value, data: []const u8, diag: *Diagnostic) Error!Tensor {
    if (value != .object) {
        diag.set("tensor '{s}': entry is not an object", .{name});
        return error.InvalidHeader;
    }
    const fields = value.object;
    const dtype_value = fields.get("dtype") orelse return missing(name, "dtype", diag);
    const shape_value = fields.get("shape") orelse return missing(name, "shape", diag);
    const offsets_value = fields.get("data_offsets") orelse return missing(name, "data_offsets", diag);

    if (dtype_value != .string) {
        diag.set("tensor '{s}': dtype is not a string", .{name});
        return error.InvalidHeader;
    }
    const dtype = DType.parse(dtype_value.string) orelse {
        diag.set("tensor '{s}': unknown dtype '{s}'", .{ name, dtype_value.string });
        return error.UnknownDType;
    };

    var tensor: Tensor = .{ .name = name, .dtype = dtype, .shape_buffer = @splat(0), .rank = 0, .data = &.{} };
    if (shape_value != .array or shape_value.array.items.len > rank_max) {
        diag.set("tensor '{s}': shape is not an array of at most {d} dimensions", .{ name, rank_max });
        return error.InvalidHeader;
    }
    var numel: u64 = 1;
    for (shape_value.array.items, 0..) |dim_value, axis| {
        const dim = nonNegative(dim_value) orelse {
            diag.set("tensor '{s}': shape[{d}] is not a non-negative integer", .{ name, axis });
            return error.InvalidHeader;
        };
        tensor.shape_buffer[axis] = dim;
        numel = std.math.mul(u64, numel, dim) catch return overflow(name, diag);
    }
    tensor.rank = @intCast(shape_value.array.items.len);

    if (offsets_value != .array or offsets_value.array.items.len != 2) {
        diag.set("tensor '{s}': data_offsets is not a pair", .{name});
        return error.InvalidHeader;
    }
    const begin = nonNegative(offsets_value.array.items[0]);
    const end = nonNegative(offsets_value.array.items[1]);
    if (begin == null or end == null or begin.? > end.?) {
        diag.set("tensor '{s}': data_offsets are not two ordered non-negative integers", .{name});
        return error.InvalidHeader;
    }
    if (end.? > data.len) {
        diag.set("tensor '{s}': bytes [{d}, {d}) lie outside the {d}-byte data section", .{ name, begin.?, end.?, data.len });
        return error.RangeOutsideFile;
    }
    const size_bytes = std.math.mul(u64, numel, dtype.sizeBytes()) catch return overflow(name, diag);
    if (size_bytes != end.? - begin.?) {
        diag.set("tensor '{s}': shape {any} of {s} needs {d} bytes but data_offsets give {d}", .{
            name, tensor.shape(), dtype.name(), size_bytes, end.? - begin.?,
        });
        return error.ShapeMismatch;
    }
    tensor.data = data[begin.?..end.?];
    return tensor;
}

fn checkNoOverlap(tensors: []Tensor, data: []const u8, diag: *Diagnostic) Error!void {
    std.sort.pdq(Tensor, tensors, {}, lessByOffset);
    var previous: ?*const Tensor = null;
    for (tensors) |*tensor| {
        if (tensor.data.len == 0) continue;
        if (previous) |prev| {
            const prev_end = @intFromPtr(prev.data.ptr) + prev.data.len;
            if (prev_end > @intFromPtr(tensor.data.ptr)) {
                const base = @intFromPtr(data.ptr);
                diag.set("tensors '{s}' and '{s}' overlap at data byte {d}", .{
                    prev.name, tensor.name, @intFromPtr(tensor.data.ptr) - base,
                });
                return error.OverlappingRanges;
            }
        }
        previous = tensor;
    }
}

fn nonNegative(value: std.json.Value) ?u64 {
    return switch (value) {
        .integer => |int| if (int >= 0) @intCast(int) else null,
        else => null,
    };
}

fn missing(name: []const u8, field: []const u8, diag: *Diagnostic) Error {
    diag.set("tensor '{s}': missing '{s}'", .{ name, field });
    return error.InvalidHeader;
}

fn overflow(name: []const u8, diag: *Diagnostic) Error {
    diag.set("tensor '{s}': size overflows 64 bits", .{name});
    return error.ShapeMismatch;
}

// Tests build files in memory; tests/test_safetensors_errors.py does the same through the C ABI.

fn buildFile(gpa: std.mem.Allocator, header: []const u8, data_len: usize) ![]u8 {
    const bytes = try gpa.alloc(u8, 8 + header.len + data_len);
    std.mem.writeInt(u64, bytes[0..8], header.len, .little);
    @memcpy(bytes[8..][0..header.len], header);
    @memset(bytes[8 + header.len ..], 0xAB);
    return bytes;
}

fn expectParseError(expected: Error, header: []const u8, data_len: usize) !void {
    const gpa = std.testing.allocator;
    const bytes = try buildFile(gpa, header, data_len);
    defer gpa.free(bytes);
    var diag: Diagnostic = .{};
    try std.testing.expectError(expected, File.parse(gpa, bytes, &diag));
    try std.testing.expect(diag.message().len > 0);
}

test "a valid file parses into sorted views" {
    const gpa = std.testing.allocator;
    const header =
        \\{"b":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},
        \\ "a":{"dtype":"I32","shape":[],"data_offsets":[8,12]},"__metadata__":{"format":"pt"}}
    ;
    const bytes = try buildFile(gpa, header, 12);
    defer gpa.free(bytes);
    var diag: Diagnostic = .{};
    var file = try File.parse(gpa, bytes, &diag);
    defer file.deinit();
    try std.testing.expectEqual(@as(usize, 2), file.tensors.len);
    try std.testing.expectEqualStrings("a", file.tensors[0].name);
    const b = file.find("b").?;
    try std.testing.expectEqual(DType.f16, b.dtype);
    try std.testing.expectEqual(@as(u64, 4), b.numel());
    try std.testing.expect(file.find("c") == null);
}

test "bad headers give typed errors" {
    try expectParseError(error.InvalidJson, "{\"a\":", 0);
    try expectParseError(error.InvalidHeader, "[1,2]", 0);
    try expectParseError(error.UnknownDType, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    try expectParseError(error.RangeOutsideFile, "{\"a\":{\"dtype\":\"U8\",\"shape\":[9],\"data_offsets\":[0,9]}}", 8);
    try expectParseError(error.ShapeMismatch, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    try expectParseError(error.InvalidHeader, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0);
    try expectParseError(error.InvalidHeader, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    try expectParseError(error.OverlappingRanges,
        \\{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}
    , 6);
}

test "short files and lying header lengths" {
    const gpa = std.testing.allocator;
    var diag: Diagnostic = .{};
    try std.testing.expectError(error.Truncated, File.parse(gpa, "abc", &diag));
    var bytes: [16]u8 = @splat(0);
    std.mem.writeInt(u64, bytes[0..8], 9, .little);
    try std.testing.expectError(error.HeaderPastEnd, File.parse(gpa, &bytes, &diag));
}

test "no mutation of a valid header crashes the parser" {
    const gpa = std.testing.allocator;
    const header =
        \\{"w":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"v":{"dtype":"I16","shape":[2],"data_offsets":[12,16]}}
    ;
    const original = try buildFile(gpa, header, 16);
    defer gpa.free(original);
    const mutated = try gpa.alloc(u8, original.len);
    defer gpa.free(mutated);
    var prng = std.Random.DefaultPrng.init(0x7f4a7c15);
    const random = prng.random();
    for (0..4000) |_| {
        @memcpy(mutated, original);
        const flips = random.intRangeAtMost(usize, 1, 4);
        for (0..flips) |_| {
            const at = random.uintLessThan(usize, 8 + header.len);
            mutated[at] = random.int(u8);
        }
        var diag: Diagnostic = .{};
        if (File.parse(gpa, mutated, &diag)) |parsed| {
            var file = parsed;
            file.deinit();
        } else |_| {}
    }
}
