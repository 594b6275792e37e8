#include "kernels/cuda/rope.cuh"

namespace baracuda::kernels::cuda {

void launch_rope_half_split(const RopeLaunch& l, cudaStream_t stream) {
  launch_rope_layout<false>(l, stream);
}

}  // namespace baracuda::kernels::cuda
