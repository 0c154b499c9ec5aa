// SwiGLU as every MLP and expert applies it: silu(gate)·up, with GLM-5.3-Flash's clamps (gate
// from above, up on both sides) at the module's tf_swiglu_limit. The host sets that global per
// loaded module (cuModuleGetGlobal) for a model with swiglu_limit; left at +inf, both clamps are
// exact no-ops and the other classes' bits do not move. Include once per .cu.
#pragma once

extern "C" {
__constant__ float tf_swiglu_limit = __builtin_huge_valf();
}

namespace tf {

__device__ __forceinline__ float swiglu(float gate, float up) {
    const float limit = tf_swiglu_limit;
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.0f + expf(-gate)) * up;
}

}  // namespace tf
