// The plain RMSNorm ops' forward kernels, and the CUDA entry point of every RMSNorm
// launch.
#include "kernels/cuda/rmsnorm.cuh"

namespace baracuda::kernels {

namespace cuda {
template void launch_rms_norm_forward<false>(const RmsNormLaunch&, cudaStream_t);
template int64_t rms_norm_forward_blocks<false>(const RmsNormLaunch&);
}  // namespace cuda

void rms_norm_cuda(const RmsNormLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (l.backward)
    return l.gated ? cuda::launch_rms_norm_backward<true>(l, s)
                   : cuda::launch_rms_norm_backward<false>(l, s);
  return l.gated ? cuda::launch_rms_norm_forward<true>(l, s)
                 : cuda::launch_rms_norm_forward<false>(l, s);
}

int64_t rms_norm_cuda_resident_blocks(const RmsNormLaunch& l) {
  if (l.backward)
    return l.gated ? cuda::rms_norm_backward_blocks<true>(l) : cuda::rms_norm_backward_blocks<false>(l);
  return l.gated ? cuda::rms_norm_forward_blocks<true>(l) : cuda::rms_norm_forward_blocks<false>(l);
}

}  // namespace baracuda::kernels
