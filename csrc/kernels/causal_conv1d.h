// Launchers for the causal conv1d kernels (CPU and CUDA, forward and backward: the launch
// says which). They trust the launch description the plan filled in; validation lives in
// core/causal_conv1d_plan.cpp.
#pragma once

#include "core/causal_conv1d_plan.h"

namespace baracuda::kernels {

void causal_conv1d_cpu(const CausalConv1dLaunch& launch);
// CPU: chunks of kCausalConv1dCpuChunk steps (no grid).
CausalConv1dWork causal_conv1d_cpu_work(const CausalConv1dLaunch& launch);

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void causal_conv1d_cuda(const CausalConv1dLaunch& launch, void* stream);
// CUDA: chunks sized so that the blocks resident at once (the occupancy calculator on the
// kernel the launch picks) hold about one item each; the grid is that many blocks, at
// most one per item.
CausalConv1dWork causal_conv1d_cuda_work(const CausalConv1dLaunch& launch);
#endif

}  // namespace baracuda::kernels
