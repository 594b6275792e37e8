// CPU causal conv1d decoding step (core/causal_conv1d_update_plan.h has the formulas): any
// strides, any width, every dtype (float32 math for float32/float16/bfloat16, float64 for
// float64). Parallel over the channels (b, d); a channel reads its window of the state,
// writes its outputs, then updates its state (shift register or circular buffer).
#include <string>
#include <vector>

#include "kernels/causal_conv1d_math.h"
#include "kernels/causal_conv1d_update.h"
#include "kernels/cpu/loops.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

constexpr int64_t kGrainChannels = 256;

int64_t int_at(const void* p, ElementKind e, int64_t off) {
  return e == ElementKind::I32 ? static_cast<const int32_t*>(p)[off] : static_cast<const int64_t*>(p)[off];
}

int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

void check_indices(const ConvUpdateLaunch& l) {
  if (!l.has_indices) return;
  for (int64_t b = 0; b < l.batch; ++b) {
    const int64_t i = int_at(l.indices, l.index_element, b * l.index_stride);
    if (i >= l.pool)
      fail(PlanErrorKind::IndexOutOfRange, "causal_conv1d_update",
           "conv_state_indices[" + std::to_string(b) + "] = " + std::to_string(i) +
               " is out of range for a state pool of " + std::to_string(l.pool) +
               " rows (negative values mark padding rows)");
  }
}

template <typename T, typename Wt>
void update(const ConvUpdateLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  T* out = static_cast<T*>(l.out);
  T* state = static_cast<T*>(l.conv_state);
  const Wt* w = static_cast<const Wt*>(l.weight);
  const Wt* bias = static_cast<const Wt*>(l.bias);
  const int W = l.width;
  const int64_t L = l.seqlen, M = l.state_len;
  at::parallel_for(0, l.batch * l.dim, kGrainChannels, [&](int64_t begin, int64_t end) {
    std::vector<Acc> xt(static_cast<size_t>(W - 1 + L));  // the window, then x
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / l.dim, d = r % l.dim;
      const int64_t i = l.has_indices ? int_at(l.indices, l.index_element, b * l.index_stride) : b;
      T* o = out + b * l.out_s[0] + d * l.out_s[1];
      if (i < 0) {  // a padding row: out = 0, the pool untouched
        for (int64_t t = 0; t < L; ++t) o[t * l.out_s[2]] = static_cast<T>(Acc(0));
        continue;
      }
      const T* xs = x + b * l.x_s[0] + d * l.x_s[1];
      T* st = state + i * l.state_s[0] + d * l.state_s[1];
      const int64_t js = l.state_s[2];
      const int64_t c = l.has_cache_seqlens && M > 0
                            ? floor_mod(int_at(l.cache_seqlens, l.seqlens_element, b * l.seqlens_stride), M)
                            : 0;
      for (int j = 0; j < W - 1; ++j)
        xt[j] = static_cast<Acc>(st[(l.has_cache_seqlens ? floor_mod(c - (W - 1) + j, M) : M - (W - 1) + j) * js]);
      for (int64_t t = 0; t < L; ++t) xt[W - 1 + t] = static_cast<Acc>(xs[t * l.x_s[2]]);
      for (int64_t t = 0; t < L; ++t) {
        Acc acc = bias ? static_cast<Acc>(bias[d * l.bias_stride]) : Acc(0);
        for (int k = 0; k < W; ++k) acc += static_cast<Acc>(w[d * l.w_stride_d + k * l.w_stride_k]) * xt[t + k];
        o[t * l.out_s[2]] = static_cast<T>(l.silu ? conv_silu<false>(acc) : acc);
      }
      if (M == 0) continue;
      if (l.has_cache_seqlens) {
        for (int64_t t = 0; t < L; ++t) st[floor_mod(c + t, M) * js] = xs[t * l.x_s[2]];
      } else {
        // The last M values of [st, x], shifted in place in ascending order (st[L + j] is
        // read before any write reaches it).
        for (int64_t j = 0; j < M; ++j)
          st[j * js] = L + j < M ? st[(L + j) * js] : xs[(L + j - M) * l.x_s[2]];
      }
    }
  });
}
}  // namespace

void causal_conv1d_update_cpu(const ConvUpdateLaunch& l) {
  check_indices(l);
  cpu::dispatch_floating(l.element, [&](auto xt) {
    using T = decltype(xt);
    if (l.weight_element == l.element)
      update<T, T>(l);
    else
      update<T, float>(l);  // the plan allows x's dtype or float32
  });
}

}  // namespace baracuda::kernels
