//! Part of `tf-cuda-test route`: tf_exl3_group_items, which sorts the router's picks (and a plain
//! layer's rows) by table entry into the groups the grouped GEMV and the prompt kernels run, against
//! a host counting sort, word for word: the sorted items, each group's first slot, count and entry,
//! and the group count. Cases: GLM-4.5-Air's prompt chunk (2304 items over 129 entries, groups of 32
//! and 64), a decode step's groups of 16 with items of the other path (-1), the kernel's most
//! entries (1024), one entry holding every item (many groups of one entry), a plain layer's rows (no
//! table: item i is entry i / group_items), and a single item.
const std = @import("std");
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Report = @import("report.zig").Report;
const Uploads = @import("device_upload.zig").Uploads;

const Case = struct {
    name: []const u8,
    items: usize,
    layers: usize,
    group_size: usize,
    /// Share of the items on the other path (entry -1).
    other_path: f32 = 0,
    /// All items in entry `layers / 2`.
    one_entry: bool = false,
    /// No table: item i is entry i / (items / layers).
    plain: bool = false,
};

const cases = [_]Case{
    .{ .name = "Air prompt chunk, slim groups", .items = 256 * 9, .layers = 129, .group_size = 32 },
    .{ .name = "Air prompt chunk, full groups", .items = 256 * 9, .layers = 129, .group_size = 64 },
    .{ .name = "decode step, the other path's items", .items = 37 * 8, .layers = 160, .group_size = 16, .other_path = 0.3 },
    .{ .name = "1024 entries", .items = 5000, .layers = 1024, .group_size = 16 },
    .{ .name = "every item in one entry", .items = 2000, .layers = 200, .group_size = 16, .one_entry = true },
    .{ .name = "a plain layer's rows", .items = 300, .layers = 1, .group_size = 32, .plain = true },
    .{ .name = "two plain entries' rows", .items = 2 * 70, .layers = 2, .group_size = 64, .plain = true },
    .{ .name = "one item", .items = 1, .layers = 3, .group_size = 64 },
};

pub fn run(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, report: *Report) !void {
    for (cases) |case| try runCase(gpa, gpu, k, random, case, report);
}

fn runCase(gpa: std.mem.Allocator, gpu: *cuda.Gpu, k: cuda.glm_kernels.Kernels, random: std.Random, case: Case, report: *Report) !void {
    const layer_of = try gpa.alloc(i32, case.items);
    defer gpa.free(layer_of);
    const group_items = if (case.plain) case.items / case.layers else 0;
    for (layer_of, 0..) |*l, i| {
        if (case.plain) {
            l.* = @intCast(i / group_items);
        } else if (case.one_entry) {
            l.* = @intCast(case.layers / 2);
        } else {
            l.* = if (random.float(f32) < case.other_path) -1 else @intCast(random.uintLessThan(usize, case.layers));
        }
    }

    // The host's counting sort: stable by item index, groups in entry order.
    const want_sorted = try gpa.alloc(i32, case.items);
    defer gpa.free(want_sorted);
    var want_first: std.ArrayList(i32) = .empty;
    defer want_first.deinit(gpa);
    var want_count: std.ArrayList(i32) = .empty;
    defer want_count.deinit(gpa);
    var want_layer: std.ArrayList(i32) = .empty;
    defer want_layer.deinit(gpa);
    var slots: usize = 0;
    for (0..case.layers) |layer| {
        const start = slots;
        for (layer_of, 0..) |l, i| if (l == @as(i32, @intCast(layer))) {
            want_sorted[slots] = @intCast(i);
            slots += 1;
        };
        var offset: usize = 0;
        while (start + offset < slots) : (offset += case.group_size) {
            try want_first.append(gpa, @intCast(start + offset));
            try want_count.append(gpa, @intCast(@min(case.group_size, slots - start - offset)));
            try want_layer.append(gpa, @intCast(layer));
        }
    }
    const groups = want_first.items.len;

    var uploads: Uploads = .{ .gpu = gpu, .diag = k.diag };
    defer uploads.deinit();
    const d_layer_of = try uploads.put(layer_of);
    const groups_max = cuda.exl3_prompt.groupsMax(case.items, case.layers, case.group_size);
    const words = 2 * case.items + 3 * groups_max + 1;
    const d_out = try gpu.alloc(words * 4, k.diag);
    defer gpu.free(d_out);
    try gpu.poison(d_out, words * 4, k.diag);
    const g: cuda.glm_kernels.Grouping = .{
        .ranks = d_out,
        .sorted = d_out + case.items * 4,
        .first = d_out + 2 * case.items * 4,
        .count = d_out + (2 * case.items + groups_max) * 4,
        .layer = d_out + (2 * case.items + 2 * groups_max) * 4,
        .total = d_out + (2 * case.items + 3 * groups_max) * 4,
    };
    try k.groupItems(if (case.plain) 0 else d_layer_of, case.items, group_items, case.layers, case.group_size, g);
    try gpu.synchronize(k.diag);
    const got = try gpa.alloc(i32, words);
    defer gpa.free(got);
    try gpu.download(std.mem.sliceAsBytes(got), d_out, k.diag);

    const got_total: usize = @intCast(@max(got[words - 1], 0));
    var differ: usize = 0;
    if (got_total == groups) {
        const sorted = got[case.items .. 2 * case.items];
        for (sorted[0..slots], want_sorted[0..slots]) |a, b| differ += @intFromBool(a != b);
        const at = 2 * case.items;
        for (0..groups) |j| {
            differ += @intFromBool(got[at + j] != want_first.items[j]);
            differ += @intFromBool(got[at + groups_max + j] != want_count.items[j]);
            differ += @intFromBool(got[at + 2 * groups_max + j] != want_layer.items[j]);
        }
    }
    report.check(got_total == groups and differ == 0, "group items, {s} ({d} items, {d} entries, groups of {d}): {d} groups for {d}, {d} of {d} words differ from the host's counting sort", .{
        case.name, case.items, case.layers, case.group_size, got_total, groups, differ, slots + 3 * groups,
    });
}
