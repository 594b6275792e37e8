// The gated-activation formulas, once, for the CPU and CUDA kernels. `Acc` is float for
// float32/float16/bfloat16 inputs and double for float64.
#pragma once

#include "core/gated_activation_plan.h"
#include "kernels/common.h"

namespace baracuda::kernels {

// Fast = true for float16/bfloat16 data on the GPU: exp and reciprocal use the hardware
// approximations (ex2.approx, rcp.approx; ~2 float32 ulp), far below the output's own
// rounding (2^-9 / 2^-12 relative), which halves the instructions per element and keeps
// those dtypes at memory speed. float32/float64 data use the accurate library functions.
template <bool Fast>
BARACUDA_HD float exp_(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) return __expf(v);
#endif
  return math_exp(v);
}
template <bool Fast>
BARACUDA_HD double exp_(double v) {
  return math_exp(v);
}
template <bool Fast>
BARACUDA_HD float recip(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) return __fdividef(1.0f, v);  // 0 for |v| > 2^126: exact enough there
#endif
  return 1.0f / v;
}
template <bool Fast>
BARACUDA_HD double recip(double v) {
  return 1.0 / v;
}

template <bool Fast, typename Acc>
BARACUDA_HD Acc sigmoid(Acc b) {
  return recip<Fast>(Acc(1) + exp_<Fast>(-b));
}

// Standard normal CDF Φ(b) and density φ(b).
template <typename Acc>
BARACUDA_HD Acc normal_cdf(Acc b) {
  return Acc(0.5) * (Acc(1) + math_erf(b * Acc(0.70710678118654752440)));
}
template <bool Fast, typename Acc>
BARACUDA_HD Acc normal_pdf(Acc b) {
  return Acc(0.39894228040143267794) * exp_<Fast>(Acc(-0.5) * b * b);
}

// gelu_tanh(b) = 0.5·b·(1 + tanh(u)), u = k(b + c·b³), k = √(2/π), c = 0.044715 (as
// PyTorch). Since 0.5·(1 + tanh(u)) = σ(2u), it is b·σ(2u): one exp, no tanh, and no
// cancellation in 1 − tanh² = 4σ(1−σ) in the derivative.
constexpr double kGeluTanhK = 0.79788456080286535588;
constexpr double kGeluTanhC = 0.044715;

// y = a * gate(b)
template <GatedKind K, bool Fast, typename Acc>
BARACUDA_HD Acc gated_forward(Acc a, Acc b) {
  if constexpr (K == GatedKind::Glu) {
    return a * sigmoid<Fast>(b);
  } else if constexpr (K == GatedKind::Reglu) {
    // relu that propagates NaN, as torch.relu does
    return a * ((b > Acc(0) || b != b) ? b : Acc(0));
  } else if constexpr (K == GatedKind::Swiglu) {
    return a * (b * sigmoid<Fast>(b));
  } else if constexpr (K == GatedKind::Geglu) {
    return a * (b * normal_cdf(b));
  } else {
    const Acc two_u = Acc(2 * kGeluTanhK) * (b + Acc(kGeluTanhC) * b * b * b);
    return a * (b * sigmoid<Fast>(two_u));
  }
}

// (da, db) from dy and the saved halves (a, b).
template <GatedKind K, bool Fast, typename Acc>
BARACUDA_HD void gated_backward(Acc dy, Acc a, Acc b, Acc& da, Acc& db) {
  if constexpr (K == GatedKind::Glu) {
    const Acc s = sigmoid<Fast>(b);
    da = dy * s;
    db = dy * a * s * (Acc(1) - s);
  } else if constexpr (K == GatedKind::Reglu) {
    const bool pos = b > Acc(0);
    da = dy * ((pos || b != b) ? b : Acc(0));
    db = pos ? dy * a : Acc(0);
  } else if constexpr (K == GatedKind::Swiglu) {
    const Acc s = sigmoid<Fast>(b);
    da = dy * (b * s);
    db = dy * a * (s * (Acc(1) + b * (Acc(1) - s)));
  } else if constexpr (K == GatedKind::Geglu) {
    const Acc cdf = normal_cdf(b);
    da = dy * (b * cdf);
    db = dy * a * (cdf + b * normal_pdf<Fast>(b));
  } else {
    const Acc b2 = b * b;
    const Acc s = sigmoid<Fast>(Acc(2 * kGeluTanhK) * (b + Acc(kGeluTanhC) * b2 * b));
    da = dy * (b * s);
    // d/db b·σ(2u) = σ + 2b·σ(1−σ)·u',  u' = k(1 + 3c·b²)
    const Acc du = Acc(kGeluTanhK) * (Acc(1) + Acc(3 * kGeluTanhC) * b2);
    db = dy * a * (s + Acc(2) * b * s * (Acc(1) - s) * du);
  }
}

}  // namespace baracuda::kernels
