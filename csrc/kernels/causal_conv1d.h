// Launchers for the causal conv1d kernels (CPU and CUDA, forward and backward: the launch
// says which). They trust the launch description the plan filled in; validation lives in
// core/causal_conv1d_plan.cpp.
#pragma once

#include "core/causal_conv1d_plan.h"

namespace baracuda::kernels {

void causal_conv1d_cpu(const CausalConv1dLaunch& launch);
// CPU: chunks of kCausalConv1dCpuChunk steps (no grid).
CausalConv1dWork causal_conv1d_cpu_work(const CausalConv1dLaunch& launch);

namespace cpu {
// The SiLU of the CPU kernels on AVX2 registers (cpu/causal_conv1d_avx2.cpp; exp is
// Sleef's): v[i] = silu(v[i]), and g[i] ·= silu'(pre[i]), for i < n (causal_conv1d_math.h's
// formulas). Return false (nothing done) where the build has no AVX2 section. Call only
// when cpu_has_avx2().
bool conv_silu_avx2(float* v, int64_t n);
bool conv_silu_grad_avx2(const float* pre, float* g, int64_t n);
}  // namespace cpu

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void causal_conv1d_cuda(const CausalConv1dLaunch& launch, void* stream);
// CUDA: chunks sized so that the blocks resident at once (the occupancy calculator on the
// kernel the launch picks) hold about one item each; the grid is that many blocks, at
// most one per item.
CausalConv1dWork causal_conv1d_cuda_work(const CausalConv1dLaunch& launch);
#endif

}  // namespace baracuda::kernels
