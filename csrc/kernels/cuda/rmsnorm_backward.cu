#include "kernels/cuda/rmsnorm.cuh"

namespace baracuda::kernels {

namespace cuda {
namespace {
using BackwardKernel = void (*)(const RmsNormParams);

// f(kernel, threads, shared memory bytes) of the backward kernel the launch picks.
template <typename F>
void with_backward_kernel(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    if (l.layout == RmsNormLayout::Strided)
      return f(BackwardKernel(rms_norm_strided_backward<T, W, O>), kRmsNormLoopThreads, size_t{0});
    const int threads = l.group * l.rows_per_block;
    const size_t smem = rms_norm_backward_smem<acc_t<T>>(l);
    switch (l.vecs) {
      case 1: return f(BackwardKernel(rms_norm_rows_backward<T, W, O, 1>), threads, smem);
      case 2: return f(BackwardKernel(rms_norm_rows_backward<T, W, O, 2>), threads, smem);
      case 4: return f(BackwardKernel(rms_norm_rows_backward<T, W, O, 4>), threads, smem);
      default: fail(PlanErrorKind::Internal, "rms_norm_backward", "no kernel for this vector count");
    }
  });
}
}  // namespace

void launch_rms_norm_backward(const RmsNormLaunch& l, cudaStream_t stream) {
  const RmsNormParams p = rms_norm_params(l);
  if (l.rows > 0)
    with_backward_kernel(l, [&](BackwardKernel kernel, int threads, size_t smem) {
      kernel<<<static_cast<unsigned int>(l.grid), threads, smem, stream>>>(p);
    });
  if (l.has_weight && l.cols > 0)
    dispatch_rms_norm(l, [&](auto t, auto wt, auto) {
      using Acc = acc_t<decltype(t)>;
      using W = decltype(wt);
      rms_norm_dw_sum<Acc, W><<<blocks_for(l.cols, kRmsNormReduceThreads), kRmsNormReduceThreads,
                                0, stream>>>(static_cast<const Acc*>(l.workspace), l.dw_blocks,
                                             l.cols, static_cast<W*>(l.dw));
    });
  check_launch("rms_norm_backward");
}
}  // namespace cuda

int64_t rms_norm_cuda_backward_blocks(const RmsNormLaunch& l) {
  int per_sm = 1;
  cuda::with_backward_kernel(l, [&](cuda::BackwardKernel kernel, int threads, size_t smem) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it; one block an SM is always correct
      per_sm = 1;
    }
  });
  return static_cast<int64_t>(std::max(l.sm_count, 1)) * std::max(per_sm, 1);
}

}  // namespace baracuda::kernels
