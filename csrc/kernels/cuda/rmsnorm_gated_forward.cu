// The gated RMSNorm's forward kernels (a file of their own: they compile in parallel
// with the plain ops').
#include "kernels/cuda/rmsnorm.cuh"

namespace baracuda::kernels::cuda {
template void launch_rms_norm_forward<true>(const RmsNormLaunch&, cudaStream_t);
template int64_t rms_norm_forward_blocks<true>(const RmsNormLaunch&);
}  // namespace baracuda::kernels::cuda
