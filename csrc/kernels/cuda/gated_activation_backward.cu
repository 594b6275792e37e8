#include "kernels/cuda/gated_activation.cuh"

namespace baracuda::kernels::cuda {

void launch_gated_activation_backward(const GatedActivationLaunch& l, cudaStream_t stream) {
  launch_gated_activation<true>(l, stream);
}

}  // namespace baracuda::kernels::cuda
