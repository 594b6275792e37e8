#include "kernels/cuda/lerp.cuh"

namespace baracuda::kernels {

void lerp_cuda(const LerpLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const bool backward = l.op == LerpOp::Backward || l.op == LerpOp::BackwardTensor;
  return backward ? cuda::launch_lerp_backward(l, s) : cuda::launch_lerp<false>(l, s);
}

}  // namespace baracuda::kernels
