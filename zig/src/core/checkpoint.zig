//! A checkpoint: one safetensors file, or a directory holding `model.safetensors` or shards listed
//! by `model.safetensors.index.json`, plus its `config.json` when present. Every tensor name maps
//! to exactly one view; the index must name only shards beside it that hold what it claims.
const std = @import("std");
const safetensors = @import("safetensors.zig");
const config = @import("config.zig");
const Diagnostic = @import("diagnostic.zig").Diagnostic;
const mapped_file = @import("mapped_file.zig");

pub const Error = safetensors.OpenError || config.Error || error{
    NoWeights,
    InvalidIndex,
    IndexMismatch,
    DuplicateTensor,
};

pub const index_file_name = "model.safetensors.index.json";
pub const single_file_name = "model.safetensors";
pub const shards_max = 4096;

pub const Checkpoint = struct {
    gpa: std.mem.Allocator,
    arena: std.heap.ArenaAllocator,
    shards: []safetensors.File,
    /// Every tensor of every shard, sorted by name.
    tensors: []safetensors.Tensor,
    /// Parsed config.json when the checkpoint is a directory that has one.
    config: ?config.ModelConfig,

    pub fn open(gpa: std.mem.Allocator, path: []const u8, diag: *Diagnostic) Error!Checkpoint {
        var arena = std.heap.ArenaAllocator.init(gpa);
        errdefer arena.deinit();

        var shards: std.ArrayList(safetensors.File) = .empty;
        defer shards.deinit(gpa);
        errdefer for (shards.items) |*shard| shard.deinit();

        var model_config: ?config.ModelConfig = null;
        if (mapped_file.isDirectory(path)) {
            try openDirectory(gpa, arena.allocator(), path, &shards, diag);
            const config_path = try std.fs.path.join(arena.allocator(), &.{ path, "config.json" });
            model_config = try config.ModelConfig.load(arena.allocator(), config_path, diag);
        } else {
            try shards.append(gpa, try safetensors.File.open(gpa, path, diag));
        }

        const tensors = try mergeShards(arena.allocator(), shards.items, diag);
        const owned = try arena.allocator().dupe(safetensors.File, shards.items);
        shards.clearRetainingCapacity();
        return .{ .gpa = gpa, .arena = arena, .shards = owned, .tensors = tensors, .config = model_config };
    }

    pub fn deinit(checkpoint: *Checkpoint) void {
        for (checkpoint.shards) |*shard| shard.deinit();
        checkpoint.arena.deinit();
        checkpoint.* = undefined;
    }

    pub fn find(checkpoint: *const Checkpoint, name: []const u8) ?*const safetensors.Tensor {
        const index = std.sort.binarySearch(safetensors.Tensor, checkpoint.tensors, name, compareName) orelse
            return null;
        return &checkpoint.tensors[index];
    }
};

fn compareName(name: []const u8, tensor: safetensors.Tensor) std.math.Order {
    return std.mem.order(u8, name, tensor.name);
}

fn lessByName(_: void, a: safetensors.Tensor, b: safetensors.Tensor) bool {
    return std.mem.lessThan(u8, a.name, b.name);
}

fn openDirectory(
    gpa: std.mem.Allocator,
    arena: std.mem.Allocator,
    dir: []const u8,
    shards: *std.ArrayList(safetensors.File),
    diag: *Diagnostic,
) Error!void {
    const index_path = try std.fs.path.join(arena, &.{ dir, index_file_name });
    var index_map = mapped_file.MappedFile.open(index_path) catch |err| switch (err) {
        error.FileNotFound => {
            const single_path = try std.fs.path.join(arena, &.{ dir, single_file_name });
            const single = safetensors.File.open(gpa, single_path, diag) catch |open_err| {
                if (open_err == error.FileNotFound) {
                    diag.set("'{s}' holds neither {s} nor {s}", .{ dir, single_file_name, index_file_name });
                    return error.NoWeights;
                }
                return open_err;
            };
            try shards.append(gpa, single);
            return;
        },
        else => {
            diag.set("cannot open '{s}': {t}", .{ index_path, err });
            return err;
        },
    };
    defer index_map.close();

    const weight_map = try parseIndex(arena, index_map.bytes, diag);
    var shard_names: std.ArrayList([]const u8) = .empty;
    var it = weight_map.iterator();
    while (it.next()) |entry| {
        const shard_name = entry.value_ptr.string;
        for (shard_names.items) |known| {
            if (std.mem.eql(u8, known, shard_name)) break;
        } else {
            if (shard_names.items.len == shards_max) {
                diag.set("{s} names more than {d} shards", .{ index_file_name, shards_max });
                return error.InvalidIndex;
            }
            try shard_names.append(arena, shard_name);
        }
    }
    for (shard_names.items) |shard_name| {
        const shard_path = try std.fs.path.join(arena, &.{ dir, shard_name });
        const shard = safetensors.File.open(gpa, shard_path, diag) catch |err| {
            if (err == error.FileNotFound) {
                diag.set("{s} names shard '{s}', which does not exist", .{ index_file_name, shard_name });
                return error.IndexMismatch;
            }
            return err;
        };
        try shards.append(gpa, shard);
    }

    it = weight_map.iterator();
    while (it.next()) |entry| {
        const shard_index = for (shard_names.items, 0..) |known, i| {
            if (std.mem.eql(u8, known, entry.value_ptr.string)) break i;
        } else unreachable;
        if (shards.items[shard_index].find(entry.key_ptr.*) == null) {
            diag.set("{s} places '{s}' in '{s}', which does not hold it", .{
                index_file_name, entry.key_ptr.*, entry.value_ptr.string,
            });
            return error.IndexMismatch;
        }
    }
}

fn parseIndex(arena: std.mem.Allocator, bytes: []const u8, diag: *Diagnostic) Error!std.json.ObjectMap {
    const root = std.json.parseFromSliceLeaky(std.json.Value, arena, bytes, .{}) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        else => {
            diag.set("{s} is not valid JSON ({t})", .{ index_file_name, err });
            return error.InvalidIndex;
        },
    };
    const weight_map = if (root == .object) root.object.get("weight_map") else null;
    if (weight_map == null or weight_map.? != .object) {
        diag.set("{s} has no 'weight_map' object", .{index_file_name});
        return error.InvalidIndex;
    }
    var it = weight_map.?.object.iterator();
    while (it.next()) |entry| {
        const ok = entry.value_ptr.* == .string and isPlainFileName(entry.value_ptr.string);
        if (!ok) {
            diag.set("{s}: shard of '{s}' is not a file name in the checkpoint directory", .{
                index_file_name, entry.key_ptr.*,
            });
            return error.InvalidIndex;
        }
    }
    return weight_map.?.object;
}

/// A shard must live beside its index: no separators, no "..", nothing hidden behind a path.
fn isPlainFileName(name: []const u8) bool {
    if (name.len == 0 or std.mem.eql(u8, name, ".") or std.mem.eql(u8, name, "..")) return false;
    return std.mem.indexOfAny(u8, name, "/\\\x00") == null;
}

fn mergeShards(arena: std.mem.Allocator, shards: []const safetensors.File, diag: *Diagnostic) Error![]safetensors.Tensor {
    var count: usize = 0;
    for (shards) |shard| count += shard.tensors.len;
    const tensors = try arena.alloc(safetensors.Tensor, count);
    var at: usize = 0;
    for (shards) |shard| {
        @memcpy(tensors[at..][0..shard.tensors.len], shard.tensors);
        at += shard.tensors.len;
    }
    std.sort.pdq(safetensors.Tensor, tensors, {}, lessByName);
    for (tensors[0..tensors.len -| 1], tensors[@min(1, tensors.len)..]) |a, b| {
        if (std.mem.eql(u8, a.name, b.name)) {
            diag.set("tensor '{s}' appears in two shards", .{a.name});
            return error.DuplicateTensor;
        }
    }
    return tensors;
}

test "shard names stay inside the checkpoint directory" {
    try std.testing.expect(isPlainFileName("model-00001-of-00002.safetensors"));
    try std.testing.expect(!isPlainFileName("../etc/passwd"));
    try std.testing.expect(!isPlainFileName("sub/dir.safetensors"));
    try std.testing.expect(!isPlainFileName(".."));
    try std.testing.expect(!isPlainFileName(""));
}
