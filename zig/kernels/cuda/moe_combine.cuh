// The experts' combine of one (row, dim): moe_route.cuh's tf_moe_combine stores it, hyper.cu's
// tf_hc_leave_combined mixes it straight into the streams; one function, so both round alike.
#pragma once

// Σ_slot weight · expert_out[row·top_k + slot] in slot (= ascending expert) order, then + shared
// when given.
__device__ __forceinline__ float moe_combined(const float* __restrict__ expert_out, const float* __restrict__ weights,
                                              const float* __restrict__ shared, int row, int d, int top_k, int hidden) {
    float sum = 0.f;
    for (int slot = 0; slot < top_k; ++slot)
        sum += expert_out[(static_cast<size_t>(row) * top_k + slot) * hidden + d] * weights[row * top_k + slot];
    if (shared) sum += shared[static_cast<size_t>(row) * hidden + d];
    return sum;
}
