// The causal conv1d's activation (core/causal_conv1d_plan.h), written once for the CPU
// and CUDA kernels. Acc is float (float64 for float64 data); Fast as in
// gated_activation_math.h (the hardware exp and reciprocal, for float16/bfloat16 data on
// the GPU).
#pragma once

#include "core/causal_conv1d_plan.h"
#include "kernels/gated_activation_math.h"

namespace baracuda::kernels {

// SiLU: v · σ(v).
template <bool Fast, typename Acc>
BARACUDA_HD Acc conv_silu(Acc v) {
  return v * sigmoid<Fast>(v);
}

// d silu(v) / dv = σ(v) · (1 + v · (1 − σ(v))).
template <bool Fast, typename Acc>
BARACUDA_HD Acc conv_silu_grad(Acc v) {
  const Acc s = sigmoid<Fast>(v);
  return s * (Acc(1) + v * (Acc(1) - s));
}

}  // namespace baracuda::kernels
