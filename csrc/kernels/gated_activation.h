// Launchers for the gated-activation kernels (CPU and CUDA). They trust the launch
// description the plan filled in; validation lives in core/gated_activation_plan.cpp.
#pragma once

#include "core/gated_activation_plan.h"

namespace baracuda::kernels {

void gated_activation_cpu(const GatedActivationLaunch& launch);

namespace cpu {
// The AVX2 kernels (cpu/gated_activation_avx2.cpp): run the launch and return true for
// the rows layout of float32/float16/bfloat16; false (nothing run) otherwise. Call only
// when cpu_has_avx2().
bool gated_activation_avx2(const GatedActivationLaunch& launch);
}  // namespace cpu

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void gated_activation_cuda(const GatedActivationLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
