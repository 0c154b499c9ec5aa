//! A worker rank of a multi-process tensor-parallel group (the master is an Engine).
const std = @import("std");
const core = @import("../core/root.zig");
const glm = @import("../families/glm/root.zig");
const distributed = @import("distributed.zig");
const engine_mod = @import("engine.zig");
const Diagnostic = core.Diagnostic;

/// A worker rank (> 0) of a multi-process tensor-parallel group: loads its shard of `model_dir`,
/// joins the master, and runs the forwards it is sent until the master shuts down.
pub fn runWorker(gpa: std.mem.Allocator, model_dir: []const u8, rank: usize, master: engine_mod.Master, diag: *Diagnostic) engine_mod.Error!void {
    if (rank == 0) {
        diag.set("a worker's rank is 1 or more; rank 0 is the engine", .{});
        return error.InvalidArgument;
    }
    var checkpoint = try core.Checkpoint.open(gpa, model_dir, diag);
    defer checkpoint.deinit();
    const model_config = checkpoint.config orelse {
        diag.set("'{s}' has no config.json", .{model_dir});
        return error.NoConfig;
    };
    const model = try glm.Config.parse(&model_config, diag);
    var weights = try glm.Weights.load(gpa, &checkpoint, model, diag);
    defer weights.deinit(gpa);
    const self = try distributed.Rank.initWorker(gpa, &weights, rank, master.host, master.port, diag);
    defer self.deinit();
    try self.serve(diag);
}
