#include "kernels/cuda/rmsnorm.cuh"

namespace baracuda::kernels {

namespace cuda {
void launch_rms_norm_forward(const RmsNormLaunch& l, cudaStream_t stream) {
  const RmsNormParams p = rms_norm_params(l);
  const auto grid = static_cast<unsigned int>(l.grid);
  dispatch_rms_norm(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    if (l.layout == RmsNormLayout::Strided) {
      rms_norm_strided_forward<T, W, O><<<grid, kRmsNormLoopThreads, 0, stream>>>(p);
      return;
    }
    const unsigned int threads = static_cast<unsigned int>(l.group * l.rows_per_block);
    switch (l.vecs) {
      case 1: rms_norm_rows_forward<T, W, O, 1><<<grid, threads, 0, stream>>>(p); break;
      case 2: rms_norm_rows_forward<T, W, O, 2><<<grid, threads, 0, stream>>>(p); break;
      case 4: rms_norm_rows_forward<T, W, O, 4><<<grid, threads, 0, stream>>>(p); break;
      default: fail(PlanErrorKind::Internal, "rms_norm", "no kernel for this vector count");
    }
  });
  check_launch(l.has_residual ? "add_rms_norm" : "rms_norm");
}
}  // namespace cuda

void rms_norm_cuda(const RmsNormLaunch& l, void* stream) {
  if (l.gated)  // the gated op's CUDA kernels follow in the next commit
    fail(PlanErrorKind::Unsupported, l.backward ? "gated_rms_norm_backward" : "gated_rms_norm",
         "no CUDA kernels yet");
  const auto s = static_cast<cudaStream_t>(stream);
  return l.backward ? cuda::launch_rms_norm_backward(l, s) : cuda::launch_rms_norm_forward(l, s);
}

}  // namespace baracuda::kernels
