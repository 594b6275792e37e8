// Launchers for the cos/sin RoPE kernels (CPU and CUDA). They trust the launch
// description the plan filled in; validation lives in core/rope_cos_sin_plan.cpp.
#pragma once

#include "core/rope_cos_sin_plan.h"

namespace baracuda::kernels {

void rope_cos_sin_cpu(const RopeCosSinLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void rope_cos_sin_cuda(const RopeCosSinLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
