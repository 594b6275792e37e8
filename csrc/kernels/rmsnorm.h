// Launchers for the RMSNorm kernels (CPU and CUDA, forward and backward: the launch says
// which). They trust the launch description the plan filled in; validation lives in
// core/rmsnorm_plan.cpp.
#pragma once

#include "core/rmsnorm_plan.h"

namespace baracuda::kernels {

void rms_norm_cpu(const RmsNormLaunch& launch);
// The blocks the backward runs (and dw partial rows it writes): CPU, min(rows,
// kRmsNormCpuDwBlocks); CUDA, the row-group blocks resident on the device at once (the
// occupancy calculator on the kernel the launch picks), at most one per row group.
int64_t rms_norm_cpu_backward_blocks(const RmsNormLaunch& launch);

namespace cpu {
// The AVX2 kernels (cpu/rmsnorm_avx2.cpp): run the launch and return true for the rows
// layout of float32/float16/bfloat16 x; false (nothing run) otherwise. Call only when
// cpu_has_avx2().
bool rms_norm_avx2(const RmsNormLaunch& launch);
}  // namespace cpu

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void rms_norm_cuda(const RmsNormLaunch& launch, void* stream);
int64_t rms_norm_cuda_backward_blocks(const RmsNormLaunch& launch);
#endif

}  // namespace baracuda::kernels
