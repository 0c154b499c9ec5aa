//! The GPU side of the dense MLP (parts/mlp.zig): gate and up in one GEMV launch when they pair,
//! down with the SwiGLU fused into its input; a prompt step's prompt rows through the prompt
//! kernels' fused MLP when every projection is eligible.
const core = @import("../../../core/root.zig");
const cuda = @import("../../../cuda/root.zig");
const model_mod = @import("../cuda_model.zig");
const GpuModel = model_mod.GpuModel;
const Error = model_mod.Error;
const Diagnostic = core.Diagnostic;
const Ptr = cuda.gpu.DevicePtr;
const K = cuda.glm_kernels;
const P = cuda.exl3_prompt;
const Mlp = @import("mlp.zig").Mlp;
const linear_cuda = @import("linear_cuda.zig");
const GpuLinear = linear_cuda.GpuLinear;
const promptShape = linear_cuda.promptShape;

/// `pair`: a two-entry table (gate, up) when both are EXL3 of one shape, rate and codebook, so that
/// one launch runs both; 0 otherwise. `prompt`: the prompt kernels take the whole MLP.
pub const GpuMlp = struct { gate: GpuLinear, up: GpuLinear, down: GpuLinear, pair: Ptr, prompt: bool = false };

pub fn uploadMlp(model: *GpuModel, source: *const Mlp, diag: *Diagnostic) Error!GpuMlp {
    var mlp: GpuMlp = .{
        .gate = try model.uploadLinear(&source.gate, diag),
        .up = try model.uploadLinear(&source.up, diag),
        .down = try model.uploadLinear(&source.down, diag),
        .pair = 0,
    };
    mlp.pair = try model.pairTable(&mlp.gate, &mlp.up, diag);
    if (mlp.pair != 0 and mlp.down.kind == .exl3) {
        const g = mlp.gate.kind.exl3;
        const d = mlp.down.kind.exl3;
        mlp.prompt = g.prompt and d.prompt and P.eligibleMlp(promptShape(g), promptShape(mlp.up.kind.exl3), promptShape(d), mlp.gate.out_features);
    }
    return mlp;
}

/// gate and up (one launch when paired) into model.gate: gate rows, then up rows; then down
/// with the SwiGLU fused into its input (an unquantized down takes a separate SwiGLU).
/// A prompt step's prompt rows take the prompt kernels for the whole MLP when it is eligible.
pub fn runMlp(model: *GpuModel, k: K.Kernels, mlp: *const GpuMlp, x: Ptr, out: Ptr, rows: usize) Error!void {
    const width = mlp.gate.out_features;
    const up = model.gate + rows * width * @sizeOf(f32);
    const prompt = model.step_prompt and mlp.prompt;
    if (mlp.pair != 0) {
        try model.pairGemv(k, &mlp.gate, mlp.pair, x, model.gate, rows, prompt);
    } else {
        try model.runLinear(k, &mlp.gate, x, model.gate, rows, 0);
        try model.runLinear(k, &mlp.up, x, up, rows, 0);
    }
    if (!prompt or model.step_decode) try model.runDown(k, &mlp.down, model.gate, up, out, rows, prompt);
    if (prompt) {
        const g = mlp.gate.kind.exl3;
        const d = mlp.down.kind.exl3;
        try model.launcher(k).runMlp(model.prompt_scratch.?, .{
            .x = x,
            .items = rows,
            .items_per_row = 1,
            .layer_of_item = model.rowTable(.prompt),
            .layers = 1,
            .gate_up = mlp.pair,
            .up_offset = 1,
            .down = d.table,
            .hidden = mlp.down.out_features,
            .width = width,
            .gate = promptShape(g),
            .down_shape = promptShape(d),
            .y = out,
        });
    }
}

/// y = down(silu(gate) · up); with `skip_prompt`, for the generated rows only.
pub fn runDown(model: *GpuModel, k: K.Kernels, down: *const GpuLinear, gate: Ptr, up: Ptr, y: Ptr, rows: usize, skip_prompt: bool) Error!void {
    switch (down.kind) {
        .exl3 => |e| {
            var call = model.exl3Call(e, e.table, down.in_features, down.out_features, gate, y, rows);
            call.up = up;
            if (skip_prompt) {
                call.layer_of_item = model.rowTable(.gemv);
                call.layers = 1;
            }
            try k.exl3Linear(call);
        },
        .dense => {
            try k.swiglu(gate, up, rows * down.in_features);
            try model.runLinear(k, down, gate, y, rows, 0);
        },
    }
}
