//! tf-cuda-test's PASS/FAIL lines and their tally, shared by its suites.
const say = @import("say.zig").say;

pub const Report = struct {
    passed: u32 = 0,
    failed: u32 = 0,

    pub fn check(report: *Report, ok: bool, comptime fmt: []const u8, args: anytype) void {
        if (ok) report.passed += 1 else report.failed += 1;
        say("{s} " ++ fmt ++ "\n", .{if (ok) "PASS" else "FAIL"} ++ args);
    }
};
