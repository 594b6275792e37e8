// Launchers for the lerp kernels (CPU and CUDA). They trust the launch description the
// plan filled in; validation lives in core/lerp_plan.cpp.
#pragma once

#include "core/lerp_plan.h"

namespace baracuda::kernels {

void lerp_cpu(const LerpLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void lerp_cuda(const LerpLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
