// Launchers for the RoPE kernels (CPU and CUDA). They trust the launch description the
// plan filled in; validation lives in core/rope_plan.cpp.
#pragma once

#include "core/rope_plan.h"

namespace baracuda::kernels {

void rope_cpu(const RopeLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void rope_cuda(const RopeLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
