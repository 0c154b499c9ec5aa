//! The kernel table and the nvcc steps. With -Dnvcc each `.cu` becomes one fatbin holding SASS for
//! every -Dsm arch plus PTX for the newest one; without it every image is empty and the library
//! reports the CUDA backend unavailable at run time ("built without -Dnvcc").
const std = @import("std");

pub const Kernel = struct {
    name: []const u8,
    /// Extra nvcc flags, each with its reason.
    flags: []const []const u8 = &.{},
};

/// Every kernel source that is compiled and embedded. `zig/src/cuda/kernels.zig` lists the same
/// names; a kernel added here and not there fails to compile.
pub const kernels = [_]Kernel{
    // --fmad=false: the decode must equal the CPU decoder bit for bit; only the explicit
    // __hfma of the MUL1 codebook may fuse (EXL3.md §6.2).
    .{ .name = "exl3_decode", .flags = &.{"--fmad=false"} },
    .{ .name = "glm_forward" },
    .{ .name = "exl3_experts" },
    .{ .name = "exl3_encode" },
    .{ .name = "bench" },
    .{ .name = "sample" },
    .{ .name = "mla" },
    .{ .name = "dsa" },
    .{ .name = "kda" },
    .{ .name = "hyper" },
    .{ .name = "kpool" },
};

/// Every arch the kernels must build for and the contract registry covers.
pub const contract_sm = "80,86,89,90,120,121";

pub const Options = struct {
    nvcc: ?[]const u8,
    sm: []const u8,
};

pub const Kernels = struct {
    /// Declares one `[]const u8` per kernel (the fatbin, or empty), `built_with_nvcc` and `sm_list`.
    module: *std.Build.Module,
    /// The fatbins, when built with nvcc.
    images: ?[kernels.len]std.Build.LazyPath,
};

pub fn addKernels(b: *std.Build, options: Options) Kernels {
    const files = b.addWriteFiles();
    var source: std.ArrayList(u8) = .empty;
    const w = &source;
    const built = options.nvcc != null;
    append(b, w, "pub const built_with_nvcc = {};\n", .{built});
    append(b, w, "pub const sm_list = \"{s}\";\n", .{if (built) options.sm else ""});

    const nvcc = options.nvcc orelse {
        // Host-only: empty images written inline, no files to embed (and none to list as inputs).
        for (kernels) |kernel| append(b, w, "pub const {s} align(16) = [0:0]u8{{}};\n", .{kernel.name});
        return .{ .module = b.createModule(.{ .root_source_file = files.add("kernel_images.zig", source.items) }), .images = null };
    };
    const nvcc_version = files.add("nvcc-version.txt", b.run(&.{ nvcc, "--version" }));
    var images: [kernels.len]std.Build.LazyPath = undefined;
    for (kernels, &images) |kernel, *image| {
        image.* = fatbin(b, nvcc, nvcc_version, options.sm, kernel);
        append(b, w, "pub const {s} align(16) = @embedFile(\"{s}.fatbin\").*;\n", .{ kernel.name, kernel.name });
    }
    const module = b.createModule(.{ .root_source_file = files.add("kernel_images.zig", source.items) });
    for (kernels, images) |kernel, image| {
        module.addAnonymousImport(b.fmt("{s}.fatbin", .{kernel.name}), .{ .root_source_file = image });
    }
    return .{ .module = module, .images = images };
}

fn append(b: *std.Build, list: *std.ArrayList(u8), comptime fmt: []const u8, args: anytype) void {
    list.appendSlice(b.allocator, b.fmt(fmt, args)) catch @panic("OOM");
}

const headers = [_][]const u8{
    "attention_decode.cuh",
    "attention_heads.cuh",
    "attention_prompt.cuh",
    "block_scan.cuh",
    "dense_linear.cuh",
    "exl3_codebook.cuh",
    "exl3_gemv.cuh",
    "exl3_hadamard.cuh",
    "exl3_linear.cuh",
    "exl3_prompt.cuh",
    "exl3_prompt_wgmma.cuh",
    "exl3_tile_decode.cuh",
    "exl3_trellis.cuh",
    "grid_dependency.cuh",
    "group_items.cuh",
    "kv_store.cuh",
    "last_block.cuh",
    "logits_summary.cuh",
    "mla_attention.cuh",
    "mma.cuh",
    "moe_combine.cuh",
    "moe_route.cuh",
    "route_logits.cuh",
    "split_fold.cuh",
    "swiglu.cuh",
};

fn fatbin(
    b: *std.Build,
    nvcc: []const u8,
    nvcc_version: std.Build.LazyPath,
    sm: []const u8,
    kernel: Kernel,
) std.Build.LazyPath {
    const run = b.addSystemCommand(&.{ nvcc, "-fatbin", "-O3", "-std=c++17", "-lineinfo" });
    // `nvcc --version` runs when the build is configured (milliseconds) and its text is a file
    // input: a new nvcc at the same path rebuilds every fatbin, an unchanged one rebuilds nothing.
    run.addFileInput(nvcc_version);
    run.addArgs(kernel.flags);
    var newest: []const u8 = "";
    var it = std.mem.tokenizeScalar(u8, sm, ',');
    while (it.next()) |arch| {
        // Hopper's code as sm_90a: its warpgroup products (exl3_prompt_wgmma.cuh) need it.
        const target = if (std.mem.eql(u8, arch, "90")) "90a" else arch;
        run.addArg(b.fmt("-gencode=arch=compute_{s},code=sm_{s}", .{ target, target }));
        newest = arch;
    }
    // PTX of the newest arch lets a later GPU JIT the kernels instead of failing to load them.
    run.addArg(b.fmt("-gencode=arch=compute_{s},code=compute_{s}", .{ newest, newest }));
    run.addPrefixedDirectoryArg("-I", b.path("zig/kernels/cuda"));
    // Every header of zig/kernels/cuda is an input of every fatbin (test_build_and_setup checks the
    // list is whole), so that editing one rebuilds what includes it.
    for (headers) |header| {
        run.addFileInput(b.path(b.fmt("zig/kernels/cuda/{s}", .{header})));
    }
    run.addArg("-o");
    const image = run.addOutputFileArg(b.fmt("{s}.fatbin", .{kernel.name}));
    run.addFileArg(b.path(b.fmt("zig/kernels/cuda/{s}.cu", .{kernel.name})));
    return image;
}
