// The 128-point Hadamard of EXL3's input and output rotations (EXL3.md §8.1), shared by the GEMV
// linears (glm_forward.cu) and the prompt kernels (exl3_experts.cu) so both rotate identically.
#pragma once

namespace tf {

// One 128-chunk held as 4 values per lane (lane t holds 4t..4t+3), scaled by 1/sqrt(128): a
// 4-point butterfly in registers, then 5 shuffle stages.
__device__ __forceinline__ void hadamard128(float (&v)[4]) {
    float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
    v[0] = a + c; v[1] = b + d; v[2] = a - c; v[3] = b - d;
    const int lane = threadIdx.x % 32;
    for (int stride = 1; stride < 32; stride *= 2) {
        for (int i = 0; i < 4; ++i) {
            const float other = __shfl_xor_sync(0xFFFFFFFFu, v[i], stride);
            v[i] = (lane & stride) ? other - v[i] : v[i] + other;
        }
    }
    for (int i = 0; i < 4; ++i) v[i] *= 0.08838834764831845f;
}

}  // namespace tf
