#include "kernels/cuda/causal_conv1d.cuh"

namespace baracuda::kernels::cuda {

int causal_conv1d_backward_blocks_per_sm(const CausalConv1dLaunch& l) {
  return conv_blocks_per_sm<true>(l);
}

// The walk (dx, dinitial_states, the blocks' dweight/dbias partial rows), then the rows'
// sums per channel (zeros without a batch).
void launch_causal_conv1d_backward(const CausalConv1dLaunch& l, cudaStream_t stream) {
  if (l.batch > 0) launch_conv_walk<true>(l, stream);
  dispatch_causal_conv1d(l, [&](auto t, auto wt, auto, auto) {
    causal_conv1d_weight_sum_kernel<acc_t<decltype(t)>, decltype(wt)>
        <<<blocks_for(l.dim * (l.width + 1), kCausalConv1dThreads), kCausalConv1dThreads, 0,
           stream>>>(l);
  });
  check_launch("causal_conv1d_backward");
}

}  // namespace baracuda::kernels::cuda
