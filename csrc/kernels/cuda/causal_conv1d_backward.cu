#include <algorithm>

#include "kernels/cuda/causal_conv1d.cuh"

namespace baracuda::kernels::cuda {

namespace {
// f(kernel) with the backward kernel the launch picks.
template <typename F>
void with_backward_kernel(const CausalConv1dLaunch& l, F&& f) {
  dispatch_causal_conv1d(l, [&](auto t, auto wt, auto width, auto lay) {
    f(causal_conv1d_backward_kernel<decltype(t), decltype(wt), decltype(width)::value,
                                    decltype(lay)::value>);
  });
}
}  // namespace

int causal_conv1d_backward_blocks_per_sm(const CausalConv1dLaunch& l) {
  int n = 1;
  with_backward_kernel(l, [&](auto kernel) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kCausalConv1dThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it; one block an SM is always correct
      n = 1;
    }
  });
  return std::max(n, 1);
}

void launch_causal_conv1d_backward(const CausalConv1dLaunch& l, cudaStream_t stream) {
  const unsigned int threads = static_cast<unsigned int>(l.block_channels * l.block_chunks);
  if (l.batch > 0)
    with_backward_kernel(l, [&](auto kernel) {
      kernel<<<static_cast<unsigned int>(l.grid), threads, 0, stream>>>(l);
    });
  dispatch_causal_conv1d(l, [&](auto t, auto wt, auto, auto) {
    causal_conv1d_weight_sum_kernel<acc_t<decltype(t)>, decltype(wt)>
        <<<blocks_for(l.dim * (l.width + 1), kCausalConv1dThreads), kCausalConv1dThreads, 0,
           stream>>>(l);
  });
  check_launch("causal_conv1d_backward");
}

}  // namespace baracuda::kernels::cuda
