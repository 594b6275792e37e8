#include "kernels/cuda/rope.cuh"

namespace baracuda::kernels {

namespace cuda {
void launch_rope_half_split(const RopeLaunch& l, cudaStream_t stream);
}  // namespace cuda

void rope_cuda(const RopeLaunch& l, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (l.interleaved)
    cuda::launch_rope_layout<true>(l, s);
  else
    cuda::launch_rope_half_split(l, s);
}

}  // namespace baracuda::kernels
