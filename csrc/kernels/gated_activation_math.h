// The gated-activation formulas, once, for the CPU and CUDA kernels. `Acc` is float for
// float32/float16/bfloat16 inputs and double for float64.
#pragma once

#include <type_traits>

#include "core/gated_activation_plan.h"
#include "kernels/common.h"

namespace baracuda::kernels {

// Calls f(std::integral_constant<GatedKind, K>{}) for the runtime kind k, so that each
// kernel is instantiated once per kind (host code: the CPU loops and the CUDA launchers).
template <class F>
inline void with_gated_kind(GatedKind k, F&& f) {
  switch (k) {
    case GatedKind::Glu: f(std::integral_constant<GatedKind, GatedKind::Glu>{}); break;
    case GatedKind::Reglu: f(std::integral_constant<GatedKind, GatedKind::Reglu>{}); break;
    case GatedKind::Swiglu: f(std::integral_constant<GatedKind, GatedKind::Swiglu>{}); break;
    case GatedKind::Geglu: f(std::integral_constant<GatedKind, GatedKind::Geglu>{}); break;
    case GatedKind::GegluTanh: f(std::integral_constant<GatedKind, GatedKind::GegluTanh>{}); break;
  }
}

// Fast = true for float16/bfloat16 data on the GPU: exp and reciprocal use the hardware
// approximations (ex2.approx, rcp.approx; ~2 float32 ulp), far below the output's own
// rounding (2^-9 / 2^-12 relative), which halves the instructions per element and keeps
// those dtypes at memory speed. float32/float64 data use the accurate library functions.
template <bool Fast>
BARACUDA_HD float exp_(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) {  // 2^(v·log2 e) on MUFU.EX2; results below 2^-126 flush to 0
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v * 1.4426950408889634f));
    return r;
  }
#endif
  return math_exp(v);
}
template <bool Fast>
BARACUDA_HD double exp_(double v) {
  return math_exp(v);
}
#if defined(__CUDA_ARCH__)
// 2^v on MUFU.EX2 (the Fast path's building block).
__device__ __forceinline__ float fast_exp2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
#endif
template <bool Fast>
BARACUDA_HD float recip(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) {  // one MUFU.RCP; every caller passes v >= 1 (rcp(inf) = 0)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  }
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
//
// Accurate (float32/float64 data: the CUDA kernels and the CPU's scalar kernels):
// Φ = erfc(−b/√2) / 2. Its relative error stays at a few ulps in the lower tail, where
// PyTorch's (1 + erf(b/√2)) / 2 cancels: in float64 that loses 1.3e-10 of Φ(−6) and 1.8 %
// of Φ(−8), in float32 all of Φ below b ≈ −5.9 (and a random draw of tests/test_fuzz.py
// had this kernel's float64 GeGLU and F.gelu's 1.0e-12 apart, of an output of 8.8e-5).
// The CPU's AVX2 kernels (float32, float16, bfloat16 rows) take the same erfc form from
// fitted polynomials (gated_activation_avx2.cpp's vgelu_parts; Sleef's erfc doubled their
// time, and ATen's vectorized erf cancels as 1 + erf does).
// Fast (float16/bfloat16 in the CUDA kernels): Φ from erfc without erf, branch-free:
//   x = |b|/√2,  t = 1/(1 + x/2),  erfc(x) = t·Q(t)·exp(−x²),  Φ = b ≥ 0 ? 1 − erfc/2 : erfc/2
// with Q a degree-6 polynomial fitted for this library (weighted least squares towards
// minimax relative error on x in [0, 10]): erfc's relative error ≤ 1.4e-6 for every x ≥ 0,
// so gelu(b) = b·Φ(b) is within 1.3e-5 relative everywhere (float32 evaluation) — better
// in the tail than 1 + erf, which cancels — in ~15 instructions instead of erff's ~40.
// Q's coefficients, highest degree first (k = 0..6; they carry the factor 1/2, so t·Q(t)
// is erfc/2 before exp(−x²)): the CUDA kernels' fast Φ and the CPU's AVX2 rows of 16-bit
// data (gated_activation_avx2.cpp) evaluate Q by Horner's rule from these.
constexpr int kErfcQ6Terms = 7;
BARACUDA_HD constexpr float erfc_q6(int k) {
  return k == 0 ? 0.04410344889178667f
       : k == 1 ? -0.17837385152127142f
       : k == 2 ? 0.19461920381500385f
       : k == 3 ? 0.01894024934839285f
       : k == 4 ? 0.14075384414401025f
       : k == 5 ? 0.13879069387837298f
                : 0.14116573388993528f;
}

template <bool Fast, typename Acc>
BARACUDA_HD Acc normal_cdf(Acc b) {
#if defined(__CUDA_ARCH__)
  if constexpr (Fast) {
    // u = x·√(log2 e), so exp(−x²) = 2^(−u²)
    const float u = fabsf(b) * 0.84932180028801907f;          // (1/√2)·√(log2 e)
    const float t = recip<true>(1.0f + 0.41627730557884884f * u);  // 1/(1 + x/2)
    float q = erfc_q6(0);
#pragma unroll
    for (int k = 1; k < kErfcQ6Terms; ++k) q = q * t + erfc_q6(k);
    const float half_erfc = t * q * fast_exp2(-u * u);
    return b >= 0.0f ? 1.0f - half_erfc : half_erfc;
  }
#endif
  return Acc(0.5) * math_erfc(b * Acc(-0.70710678118654752440));
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
    return a * (b * normal_cdf<Fast>(b));
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
    // torch.relu's gradient: zero where b <= 0, passed everywhere else, a NaN b included
    da = dy * ((b > Acc(0) || b != b) ? b : Acc(0));
    db = (b <= Acc(0)) ? Acc(0) : dy * a;
  } else if constexpr (K == GatedKind::Swiglu) {
    const Acc s = sigmoid<Fast>(b);
    da = dy * (b * s);
    db = dy * a * (s * (Acc(1) + b * (Acc(1) - s)));
  } else if constexpr (K == GatedKind::Geglu) {
    const Acc cdf = normal_cdf<Fast>(b);
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
