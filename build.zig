//! TrellisForge build: the host library, its tools and tests, and (with -Dnvcc) the CUDA fatbins
//! embedded in the library. Every step is declared here; the kernel table lives in zig/build/cuda.zig.
const std = @import("std");
const cuda_build = @import("zig/build/cuda.zig");

pub fn build(b: *std.Build) void {
    const target = b.standardTargetOptions(.{});
    // The library and tools default to ReleaseFast; the host tests always build in Debug so that
    // every safety check runs there.
    const optimize = b.option(std.builtin.OptimizeMode, "optimize", "optimization mode (default ReleaseFast)") orelse .fast;
    const nvcc = b.option([]const u8, "nvcc", "path to nvcc; builds and embeds the CUDA kernels");
    const sm = b.option([]const u8, "sm", "comma-separated SM archs for the fatbins (default 90,121)") orelse "90,121";

    const python = b.option([]const u8, "python", "python for the kernel contract check (default python3)") orelse "python3";

    const step_test = b.step("test", "Run the host tests");
    const step_cuda_test = b.step("cuda-test", "Build tf-cuda-test (the GPU suites)");
    const step_contract = b.step("test-kernel-contract", "Check every kernel of every arch against zig/src/core/contract/registry.zig (needs -Dnvcc)");

    const built = cuda_build.addKernels(b, .{ .nvcc = nvcc, .sm = sm });
    const kernels = built.module;
    if (built.images) |images| {
        for (cuda_build.kernels, images) |kernel, image| {
            b.getInstallStep().dependOn(&b.addInstallFileWithDir(image, .{ .custom = "kernels" }, b.fmt("{s}.fatbin", .{kernel.name})).step);
        }
    }
    addContractCheck(b, step_contract, nvcc, python);

    const core = b.createModule(.{
        .root_source_file = b.path("zig/src/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true, // std.DynLib only dlopen()s libcuda's dependencies when libc is linked.
    });
    core.addImport("kernel_images", kernels);

    const lib = b.addLibrary(.{
        .linkage = .dynamic,
        .name = "trellisforge",
        .root_module = b.createModule(.{
            .root_source_file = b.path("zig/src/c_api.zig"),
            .target = target,
            .optimize = optimize,
            .link_libc = true,
            .imports = &.{.{ .name = "trellisforge", .module = core }},
        }),
    });
    b.installArtifact(lib);
    b.getInstallStep().dependOn(&b.addInstallFileWithDir(
        b.path("zig/include/trellisforge.h"),
        .header,
        "trellisforge.h",
    ).step);

    const cuda_test = b.addExecutable(.{
        .name = "tf-cuda-test",
        .root_module = b.createModule(.{
            .root_source_file = b.path("zig/tools/tf_cuda_test.zig"),
            .target = target,
            .optimize = optimize,
            .link_libc = true,
            .imports = &.{.{ .name = "trellisforge", .module = core }},
        }),
    });
    b.installArtifact(cuda_test);
    step_cuda_test.dependOn(&b.addInstallArtifact(cuda_test, .{}).step);

    const bench = b.addExecutable(.{
        .name = "tf-bench",
        .root_module = b.createModule(.{
            .root_source_file = b.path("zig/tools/tf_bench.zig"),
            .target = target,
            .optimize = optimize,
            .link_libc = true,
            .imports = &.{.{ .name = "trellisforge", .module = core }},
        }),
    });
    b.installArtifact(bench);
    step_cuda_test.dependOn(&b.addInstallArtifact(bench, .{}).step);

    const core_debug = b.createModule(.{
        .root_source_file = b.path("zig/src/root.zig"),
        .target = target,
        .optimize = .debug,
        .link_libc = true,
    });
    core_debug.addImport("kernel_images", kernels);
    const core_tests = b.addTest(.{ .root_module = core_debug });
    step_test.dependOn(&b.addRunArtifact(core_tests).step);
    const abi_tests = b.addTest(.{ .root_module = b.createModule(.{
        .root_source_file = b.path("zig/src/c_api.zig"),
        .target = target,
        .optimize = .debug,
        .link_libc = true,
        .imports = &.{.{ .name = "trellisforge", .module = core_debug }},
    }) });
    step_test.dependOn(&b.addRunArtifact(abi_tests).step);
}

/// Builds every kernel for every supported arch and compares their resource usage with the
/// registry (python/trellisforge/kernel_contract.py).
fn addContractCheck(b: *std.Build, step: *std.Build.Step, nvcc: ?[]const u8, python: []const u8) void {
    const compiler = nvcc orelse {
        const fail = b.addFail("test-kernel-contract needs -Dnvcc=PATH");
        step.dependOn(&fail.step);
        return;
    };
    const all = cuda_build.addKernels(b, .{ .nvcc = compiler, .sm = cuda_build.contract_sm });
    const run = b.addSystemCommand(&.{ python, "python/trellisforge/kernel_contract.py", "check" });
    run.setEnvironmentVariable("PATH", b.fmt("{s}:{s}", .{ std.fs.path.dirname(compiler) orelse ".", b.graph.environ_map.get("PATH") orelse "/usr/bin:/bin" }));
    for (all.images.?) |image| run.addFileArg(image);
    run.addFileInput(b.path("zig/src/core/contract/registry.zig"));
    run.has_side_effects = true;
    step.dependOn(&run.step);
}
