//! The GPU suites' glm_forward module: loaded, or its failure reported as a check.
const tf = @import("trellisforge");
const cuda = tf.cuda;
const Diagnostic = tf.core.Diagnostic;
const Report = @import("report.zig").Report;

pub fn load(gpu: *cuda.Gpu, diag: *Diagnostic, report: *Report) !cuda.glm_kernels.Module {
    return cuda.glm_kernels.load(gpu, diag) catch |err| {
        report.check(false, "load glm_forward: {s}", .{diag.message()});
        return err;
    };
}
