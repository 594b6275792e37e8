#include "kernels/cuda/lerp.cuh"

namespace baracuda::kernels::cuda {

void launch_lerp_backward(const LerpLaunch& l, cudaStream_t stream) {
  launch_lerp<true>(l, stream);
}

}  // namespace baracuda::kernels::cuda
