// Launchers for the gated-activation kernels (CPU and CUDA). They trust the launch
// description the plan filled in; validation lives in core/gated_activation_plan.cpp.
#pragma once

#include "core/gated_activation_plan.h"

namespace baracuda::kernels {

void gated_activation_cpu(const GatedActivationLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void gated_activation_cuda(const GatedActivationLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
