// An exclusive prefix sum over a block's threads in thread order: dsa.cu's top-k selection and
// group_items.cuh's table entries use it.
#pragma once

namespace tf {

// Exclusive prefix sum of `value` over the block, and the block's total; `scratch` holds a warp's
// sums per warp (blockDim.x / 32 ints). Every thread calls it; it ends on a barrier, so `scratch`
// serves the next call at once.
__device__ __forceinline__ int block_scan(int value, int* scratch, int* total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = value;
    for (int offset = 1; offset < 32; offset *= 2) {
        const int other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    if (lane == 31) scratch[warp] = inclusive;
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) {
        if (w < warp) before += scratch[w];
        sum += scratch[w];
    }
    __syncthreads();
    *total = sum;
    return before + inclusive - value;
}

}  // namespace tf
