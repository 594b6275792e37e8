// Launchers for the causal conv1d's decoding step (CPU and CUDA). They trust the launch
// description the plan filled in; validation lives in core/causal_conv1d_update_plan.cpp.
#pragma once

#include "core/causal_conv1d_update_plan.h"

namespace baracuda::kernels {

// Raises PlanError(IndexOutOfRange) for a conv_state_indices value >= the pool size,
// before it writes anything.
void causal_conv1d_update_cpu(const ConvUpdateLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void causal_conv1d_update_cuda(const ConvUpdateLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
