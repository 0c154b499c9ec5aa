// Programmatic dependent launch (sm_90 and later; cuda/gpu.zig sets the launch attribute there).
// A kernel so launched may be scheduled before the kernel ahead of it in the stream has completed:
// it must not touch global memory until that kernel has, and its writes are visible, which
// griddepcontrol.wait gives. So every kernel's first statement is tf_wait_prior_grid(); the launch
// and the block scheduling of the next kernel then overlap this one's completion (H200: +2-3%
// decode, docs/measurements.md, thirteenth session). No kernel releases its successor early
// (griddepcontrol.launch_dependents at its top was measured 5-12% slower). Without the
// attribute, and before sm_90, the wait is a no-op. tests/test_kernel_grid_dependency.py checks,
// in the PTX, that no kernel touches memory before it.
#pragma once

__device__ __forceinline__ void tf_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
