// The plain RMSNorm ops' backward kernels.
#include "kernels/cuda/rmsnorm.cuh"

namespace baracuda::kernels::cuda {
template void launch_rms_norm_backward<false>(const RmsNormLaunch&, cudaStream_t);
template int64_t rms_norm_backward_blocks<false>(const RmsNormLaunch&);
}  // namespace baracuda::kernels::cuda
