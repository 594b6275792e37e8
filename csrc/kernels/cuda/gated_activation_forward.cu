#include "kernels/cuda/gated_activation.cuh"

namespace baracuda::kernels {

namespace cuda {
void launch_gated_activation_backward(const GatedActivationLaunch& l, cudaStream_t stream);
}  // namespace cuda

void gated_activation_cuda(const GatedActivationLaunch& l, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (l.backward)
    cuda::launch_gated_activation_backward(l, s);
  else
    cuda::launch_gated_activation<false>(l, s);
}

}  // namespace baracuda::kernels
