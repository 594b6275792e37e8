#include "kernels/cuda/gated_activation.cuh"

namespace baracuda::kernels {

void gated_activation_cuda(const GatedActivationLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return l.backward ? cuda::launch_gated_activation_backward(l, s)
                    : cuda::launch_gated_activation<false>(l, s);
}

}  // namespace baracuda::kernels
