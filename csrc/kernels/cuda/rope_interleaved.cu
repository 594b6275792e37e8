#include "kernels/cuda/rope.cuh"

namespace baracuda::kernels {

void rope_cuda(const RopeLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return l.interleaved ? cuda::launch_rope_layout<true>(l, s) : cuda::launch_rope_half_split(l, s);
}

}  // namespace baracuda::kernels
