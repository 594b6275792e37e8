#include "kernels/cuda/lerp.cuh"

namespace baracuda::kernels {

namespace cuda {
void launch_lerp_backward(const LerpLaunch& l, cudaStream_t stream);
}  // namespace cuda

void lerp_cuda(const LerpLaunch& l, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (l.op == LerpOp::Backward || l.op == LerpOp::BackwardTensor)
    cuda::launch_lerp_backward(l, s);
  else
    cuda::launch_lerp<false>(l, s);
}

}  // namespace baracuda::kernels
