// The gated-activation formulas, once, for the CPU and CUDA kernels. `Acc` is float for
// float32/float16/bfloat16 inputs and double for float64.
#pragma once

#include "core/gated_activation_plan.h"
#include "kernels/common.h"

namespace baracuda::kernels {

template <typename Acc>
BARACUDA_HD Acc sigmoid(Acc b) {
  return Acc(1) / (Acc(1) + math_exp(-b));
}

// Standard normal CDF Φ(b) and density φ(b).
template <typename Acc>
BARACUDA_HD Acc normal_cdf(Acc b) {
  return Acc(0.5) * (Acc(1) + math_erf(b * Acc(0.70710678118654752440)));
}
template <typename Acc>
BARACUDA_HD Acc normal_pdf(Acc b) {
  return Acc(0.39894228040143267794) * math_exp(Acc(-0.5) * b * b);
}

// gelu_tanh(b) = 0.5·b·(1 + tanh(k(b + c·b³))), k = √(2/π), c = 0.044715 (as PyTorch).
constexpr double kGeluTanhK = 0.79788456080286535588;
constexpr double kGeluTanhC = 0.044715;

// y = a * gate(b)
template <GatedKind K, typename Acc>
BARACUDA_HD Acc gated_forward(Acc a, Acc b) {
  if constexpr (K == GatedKind::Glu) {
    return a * sigmoid(b);
  } else if constexpr (K == GatedKind::Reglu) {
    // relu that propagates NaN, as torch.relu does
    return a * ((b > Acc(0) || b != b) ? b : Acc(0));
  } else if constexpr (K == GatedKind::Swiglu) {
    return a * (b / (Acc(1) + math_exp(-b)));
  } else if constexpr (K == GatedKind::Geglu) {
    return a * (b * normal_cdf(b));
  } else {
    const Acc inner = Acc(kGeluTanhK) * (b + Acc(kGeluTanhC) * b * b * b);
    return a * (Acc(0.5) * b * (Acc(1) + math_tanh(inner)));
  }
}

// (da, db) from dy and the saved halves (a, b).
template <GatedKind K, typename Acc>
BARACUDA_HD void gated_backward(Acc dy, Acc a, Acc b, Acc& da, Acc& db) {
  if constexpr (K == GatedKind::Glu) {
    const Acc s = sigmoid(b);
    da = dy * s;
    db = dy * a * s * (Acc(1) - s);
  } else if constexpr (K == GatedKind::Reglu) {
    const bool pos = b > Acc(0);
    da = dy * ((pos || b != b) ? b : Acc(0));
    db = pos ? dy * a : Acc(0);
  } else if constexpr (K == GatedKind::Swiglu) {
    const Acc s = sigmoid(b);
    da = dy * (b * s);
    db = dy * a * (s * (Acc(1) + b * (Acc(1) - s)));
  } else if constexpr (K == GatedKind::Geglu) {
    const Acc cdf = normal_cdf(b);
    da = dy * (b * cdf);
    db = dy * a * (cdf + b * normal_pdf(b));
  } else {
    const Acc b2 = b * b;
    const Acc t = math_tanh(Acc(kGeluTanhK) * (b + Acc(kGeluTanhC) * b2 * b));
    da = dy * (Acc(0.5) * b * (Acc(1) + t));
    const Acc dinner = Acc(kGeluTanhK) * (Acc(1) + Acc(3 * kGeluTanhC) * b2);
    db = dy * a * (Acc(0.5) * (Acc(1) + t) + Acc(0.5) * b * (Acc(1) - t * t) * dinner);
  }
}

}  // namespace baracuda::kernels
