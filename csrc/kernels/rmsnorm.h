// Launchers for the RMSNorm kernels, the gated op's included (CPU and CUDA, forward and
// backward: the launch says which). They trust the launch description the plan filled
// in; validation lives in core/rmsnorm_plan.cpp.
#pragma once

#include "core/rmsnorm_plan.h"

namespace baracuda::kernels {

void rms_norm_cpu(const RmsNormLaunch& launch);
// The blocks the backward (or the staged forward) may run (the plan takes at most one per
// group of rows_per_block rows, and splits them over the row groups on y): CPU, the
// backward's kRmsNormCpuDwBlocks; CUDA, the blocks resident on the device at once (the
// occupancy calculator on the kernel the launch picks).
int64_t rms_norm_cpu_backward_blocks(const RmsNormLaunch& launch);

namespace cpu {
// The AVX2 kernels (cpu/rmsnorm_avx2.cpp): run the launch and return true for the rows
// layout of float32/float16/bfloat16 x (the plain and the gated ops); false (nothing run)
// otherwise. Call only when cpu_has_avx2().
bool rms_norm_avx2(const RmsNormLaunch& launch);
}  // namespace cpu

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void rms_norm_cuda(const RmsNormLaunch& launch, void* stream);
int64_t rms_norm_cuda_resident_blocks(const RmsNormLaunch& launch);
#endif

}  // namespace baracuda::kernels
