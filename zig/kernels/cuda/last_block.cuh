// Which block of a launch finishes last, for the kernels whose last block folds what every block
// wrote (the GEMV's k splits, the router's logits, the sampler's passes).
#pragma once

// Whether this block is the last of `blocks` counting on `counter` (the last one resets it for the
// next launch); every thread's global writes before the call are visible to the last block's loads
// after it. The barrier orders the block's writes before thread 0's GPU-scope release, which is
// cumulative (PTX memory model), and thread 0's acquire orders the other blocks' writes before the
// barrier after it: the pattern of CUTLASS's semaphore. A __threadfence() by every thread cost each
// warp a memory round trip and an L1 invalidation (ncu of the one-row GEMV: the fence and the
// barrier behind it were 19% of the warps' stall samples, docs/measurements.md).
__device__ __forceinline__ bool tf_last_block(unsigned int* counter, unsigned int blocks, bool* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int done;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(done) : "l"(counter) : "memory");
        *flag = done == blocks - 1;
        if (*flag) *counter = 0u;
    }
    __syncthreads();
    return *flag;
}
