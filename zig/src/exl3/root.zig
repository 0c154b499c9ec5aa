//! The EXL3 format (shared/EXL3.md): codebooks, trellis tiles, the 128-point Hadamard, and an
//! EXL3 linear layer with its CPU forward.
pub const codebook = @import("codebook.zig");
pub const Codebook = codebook.Codebook;
pub const trellis = @import("trellis.zig");
pub const hadamard = @import("hadamard.zig");
pub const layer = @import("layer.zig");
pub const Layer = layer.Layer;
pub const linear_cpu = @import("linear_cpu.zig");
pub const encode = @import("encode.zig");
pub const slice = @import("slice.zig");

test {
    _ = codebook;
    _ = trellis;
    _ = hadamard;
    _ = @import("layer.zig");
    _ = linear_cpu;
    _ = encode;
    _ = slice;
}
