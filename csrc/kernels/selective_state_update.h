// Launchers for the selective state update (CPU and CUDA; the single-token and the
// T-token op share them: the launch says how many tokens). They trust the launch
// description the plan filled in; validation lives in core/selective_state_update_plan.cpp.
#pragma once

#include "core/selective_state_update_plan.h"

namespace baracuda::kernels {

// Raises PlanError(IndexOutOfRange) for a state_batch_indices value >= the pool size,
// before it writes anything.
void selective_state_update_cpu(const StateUpdateLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void selective_state_update_cuda(const StateUpdateLaunch& launch, void* stream);
#endif

}  // namespace baracuda::kernels
