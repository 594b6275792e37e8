#include "kernels/cuda/causal_conv1d.cuh"

namespace baracuda::kernels {

namespace cuda {
int causal_conv1d_forward_blocks_per_sm(const CausalConv1dLaunch& l) {
  return conv_blocks_per_sm<false>(l);
}

void launch_causal_conv1d_forward(const CausalConv1dLaunch& l, cudaStream_t stream) {
  launch_conv_walk<false>(l, stream);
  check_launch("causal_conv1d");
}
}  // namespace cuda

CausalConv1dWork causal_conv1d_cuda_work(const CausalConv1dLaunch& l) {
  return cuda::causal_conv1d_work(l, l.backward ? cuda::causal_conv1d_backward_blocks_per_sm(l)
                                                : cuda::causal_conv1d_forward_blocks_per_sm(l));
}

void causal_conv1d_cuda(const CausalConv1dLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return l.backward ? cuda::launch_causal_conv1d_backward(l, s)
                    : cuda::launch_causal_conv1d_forward(l, s);
}

}  // namespace baracuda::kernels
