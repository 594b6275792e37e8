#include "kernels/cuda/causal_conv1d.cuh"

namespace baracuda::kernels {

namespace cuda {
namespace {
// f(kernel) with the forward kernel the launch picks.
template <typename F>
void with_forward_kernel(const CausalConv1dLaunch& l, F&& f) {
  dispatch_causal_conv1d(l, [&](auto t, auto wt, auto width, auto lay) {
    f(causal_conv1d_forward_kernel<decltype(t), decltype(wt), decltype(width)::value,
                                   decltype(lay)::value>);
  });
}
}  // namespace

int causal_conv1d_forward_blocks_per_sm(const CausalConv1dLaunch& l) {
  int n = 1;
  with_forward_kernel(l, [&](auto kernel) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kCausalConv1dThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it; one block an SM is always correct
      n = 1;
    }
  });
  return std::max(n, 1);
}

void launch_causal_conv1d_forward(const CausalConv1dLaunch& l, cudaStream_t stream) {
  const unsigned int threads = static_cast<unsigned int>(l.block_channels * l.block_chunks);
  with_forward_kernel(l, [&](auto kernel) {
    kernel<<<static_cast<unsigned int>(l.grid), threads, 0, stream>>>(l);
  });
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
