// CUDA causal conv1d decoding step (core/causal_conv1d_update_plan.h has the formulas): one
// thread a channel (b, d), the last W inputs in registers (right-aligned in a window of
// kConvUpdateMaxCudaWidth, so every index is a compile-time constant), taps in order after
// the bias (the CPU kernel's order). The state is read and written by its own thread
// only. No workspace, no host synchronization: capturable in a CUDA graph.
#include "kernels/causal_conv1d_math.h"
#include "kernels/causal_conv1d_update.h"
#include "kernels/cuda/cuda_common.cuh"

namespace baracuda::kernels {

namespace {
using cuda::acc_t;
using cuda::from_acc;
using cuda::to_acc;

constexpr int kMaxW = kConvUpdateMaxCudaWidth;

__device__ __forceinline__ int64_t int_at(const void* p, ElementKind e, int64_t off) {
  return e == ElementKind::I32 ? static_cast<const int32_t*>(p)[off] : static_cast<const int64_t*>(p)[off];
}

__device__ __forceinline__ int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

template <typename T, typename Wt>
__global__ __launch_bounds__(kConvUpdateThreads) void conv_update_kernel(const ConvUpdateLaunch l) {
  using Acc = acc_t<T>;
  const int64_t b = blockIdx.x / l.dim_blocks;
  const int64_t d = (blockIdx.x % l.dim_blocks) * kConvUpdateThreads + threadIdx.x;
  if (d >= l.dim) return;
  const int W = l.width;
  const int64_t L = l.seqlen, M = l.state_len;
  T* o = static_cast<T*>(l.out) + b * l.out_s[0] + d * l.out_s[1];
  const int64_t i = l.has_indices ? int_at(l.indices, l.index_element, b * l.index_stride) : b;
  if (i < 0 || i >= l.pool) {
    // A padding row (i < 0): out = 0, the pool untouched (causal-conv1d's rule). An index
    // past the pool cannot raise here: out = NaN, the pool untouched.
    const Acc fill = i < 0 ? Acc(0) : static_cast<Acc>(NAN);
    for (int64_t t = 0; t < L; ++t) o[t * l.out_s[2]] = from_acc<T>(fill);
    return;
  }
  const T* xs = static_cast<const T*>(l.x) + b * l.x_s[0] + d * l.x_s[1];
  T* st = static_cast<T*>(l.conv_state) + i * l.state_s[0] + d * l.state_s[1];
  const int64_t js = l.state_s[2];
  const Wt* w = static_cast<const Wt*>(l.weight) + d * l.w_stride_d;
  const Acc bias = l.has_bias ? static_cast<Acc>(to_acc(static_cast<const Wt*>(l.bias)[d * l.bias_stride])) : Acc(0);
  const int first = kMaxW - W;  // the window's slot of tap 0
  const int64_t c = l.has_cache_seqlens && M > 0
                        ? floor_mod(int_at(l.cache_seqlens, l.seqlens_element, b * l.seqlens_stride), M)
                        : 0;
  Acc wv[kMaxW], win[kMaxW];
#pragma unroll
  for (int j = 0; j < kMaxW; ++j) {
    wv[j] = j >= first ? static_cast<Acc>(to_acc(w[(j - first) * l.w_stride_k])) : Acc(0);
    win[j] = Acc(0);
    if (j >= first && j < kMaxW - 1) {  // the W − 1 state values before x
      const int k = j - first;
      const int64_t at = l.has_cache_seqlens ? floor_mod(c - (W - 1) + k, M) : M - (W - 1) + k;
      win[j] = static_cast<Acc>(to_acc(st[at * js]));
    }
  }
  for (int64_t t = 0; t < L; ++t) {
    win[kMaxW - 1] = static_cast<Acc>(to_acc(xs[t * l.x_s[2]]));
    Acc acc = bias;
#pragma unroll
    for (int j = 0; j < kMaxW; ++j)
      if (j >= first) acc += wv[j] * win[j];
    o[t * l.out_s[2]] = from_acc<T>(l.silu ? conv_silu<false>(acc) : acc);
#pragma unroll
    for (int j = 0; j < kMaxW - 1; ++j) win[j] = win[j + 1];
  }
  if (M == 0) return;
  if (l.has_cache_seqlens) {
    for (int64_t t = 0; t < L; ++t) st[floor_mod(c + t, M) * js] = xs[t * l.x_s[2]];
  } else {
    // The last M values of [st, x], shifted in place in ascending order.
    for (int64_t j = 0; j < M; ++j) st[j * js] = L + j < M ? st[(L + j) * js] : xs[(L + j - M) * l.x_s[2]];
  }
}
}  // namespace

void causal_conv1d_update_cuda(const ConvUpdateLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(l.grid)), block(kConvUpdateThreads);
  cuda::dispatch_floating(l.element, [&](auto xt) {
    using T = decltype(xt);
    if (l.weight_element == l.element)
      conv_update_kernel<T, T><<<grid, block, 0, s>>>(l);
    else
      conv_update_kernel<T, float><<<grid, block, 0, s>>>(l);  // the plan allows x's dtype or float32
  });
  cuda::check_launch("causal_conv1d_update");
}

}  // namespace baracuda::kernels
