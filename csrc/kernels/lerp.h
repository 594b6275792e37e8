// Launchers for the lerp kernels (CPU and CUDA). They trust the launch description the
// plan filled in; validation lives in core/lerp_plan.cpp.
#pragma once

#include "core/lerp_plan.h"

namespace baracuda::kernels {

void lerp_cpu(const LerpLaunch& launch);

namespace cpu {
// The AVX2 kernels (cpu/lerp_avx2.cpp): run the launch and return true for the rows
// layout of float32/float16/bfloat16; false (nothing run) otherwise. Call only when
// cpu_has_avx2().
bool lerp_avx2(const LerpLaunch& launch);
}  // namespace cpu

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void lerp_cuda(const LerpLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
