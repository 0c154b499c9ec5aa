//! The TrellisForge host library. `c_api.zig` exports it through the C ABI; tools import it directly.
pub const core = @import("core/root.zig");
pub const exl3 = @import("exl3/root.zig");
pub const cuda = @import("cuda/root.zig");
pub const glm = @import("families/glm/root.zig");
pub const engine = @import("engine/root.zig");
pub const dist = @import("dist/root.zig");
pub const version = "0.1.0";

test {
    _ = core;
    _ = exl3;
    _ = cuda;
    _ = glm;
    _ = engine;
    _ = dist;
}
