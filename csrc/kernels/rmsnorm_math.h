// RMSNorm's per-element formulas (core/rmsnorm_plan.h), written once for the CPU and
// CUDA kernels. Acc is float (float64 for float64 data); `round_x(v)` rounds v to x's
// dtype and back (the llama convention's cast; identity for float32 and float64). The
// gated op's gate is the swiglu of gated_activation_math.h (Fast: its hardware exp and
// reciprocal, which the CUDA kernels take for 16-bit data).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/rmsnorm_plan.h"
#include "kernels/common.h"
#include "kernels/gated_activation_math.h"

namespace baracuda::kernels {

// Element offsets of row `row` in `n` operands over the leading dims (`sizes`, and the
// operands' strides at strides[k * kMaxRank + d]), row-major.
BARACUDA_HD void rms_norm_row_offsets(int rank, const int64_t* sizes, const int64_t* strides,
                                      int n, int64_t row, int64_t* off) {
  if (rank == 1) {  // the usual case (contiguous leading dims): no division
    for (int k = 0; k < n; ++k) off[k] = row * strides[k * kMaxRank];
    return;
  }
  for (int k = 0; k < n; ++k) off[k] = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t c = row % sizes[d];
    row /= sizes[d];
    for (int k = 0; k < n; ++k) off[k] += c * strides[k * kMaxRank + d];
  }
}

// y of one element from n = h·rstd and its weight w (unused without a weight).
template <class Acc, class Round>
BARACUDA_HD Acc rms_norm_output(RmsNormConvention c, bool has_weight, Acc n, Acc w,
                                Round round_x) {
  if (!has_weight) return n;
  switch (c) {
    case RmsNormConvention::Llama: return round_x(n) * w;
    case RmsNormConvention::Gemma: return n * (Acc(1) + w);
    case RmsNormConvention::Torch: break;
  }
  return n * w;
}

// s, the factor of dy in dL/dn: w, 1 + w (gemma) or 1 without a weight.
template <class Acc>
BARACUDA_HD Acc rms_norm_grad_scale(RmsNormConvention c, bool has_weight, Acc w) {
  if (!has_weight) return Acc(1);
  return c == RmsNormConvention::Gemma ? Acc(1) + w : w;
}

// m, the factor of dy in dw: the value y multiplied w by (round_x(n) for llama, else n).
template <class Acc, class Round>
BARACUDA_HD Acc rms_norm_dw_factor(RmsNormConvention c, Acc n, Round round_x) {
  return c == RmsNormConvention::Llama ? round_x(n) : n;
}

// The gated op's gate: v·silu(z), and (dv, dz) from the gradient d of v·silu(z):
// dv = d·silu(z), dz = d·v·silu'(z).
template <bool Fast, typename Acc>
BARACUDA_HD Acc silu_gate(Acc v, Acc z) {
  return gated_forward<GatedKind::Swiglu, Fast>(v, z);
}
template <bool Fast, typename Acc>
BARACUDA_HD void silu_gate_backward(Acc d, Acc v, Acc z, Acc& dv, Acc& dz) {
  gated_backward<GatedKind::Swiglu, Fast>(d, v, z, dv, dz);
}

// f(T{}, W{}, O{}) with the types of x, the weight and the output: (T, T, T), or a float32
// weight with a 16-bit x whose output is x's dtype or float32 (llama), or with a float64
// x. `dispatch(e, g)` calls g with the backend's type of a floating ElementKind (CPU:
// c10::Half, ...; CUDA: __half, ...).
template <typename Dispatch, typename F>
void dispatch_rms_norm_types(const RmsNormLaunch& l, Dispatch&& dispatch, F&& f) {
  dispatch(l.element, [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      if (l.weight_element == ElementKind::F32) {
        if constexpr (!std::is_same_v<T, double>) {
          if (l.out_element == ElementKind::F32) return f(T{}, float{}, float{});
        }
        return f(T{}, float{}, T{});
      }
    }
    f(T{}, T{}, T{});
  });
}

}  // namespace baracuda::kernels
