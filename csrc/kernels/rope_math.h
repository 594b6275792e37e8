// The RoPE angle, once, for the CPU and CUDA kernels:
//   inv_freq_i = base^(−2i/R)   and   (cos θ, sin θ) for θ = p · inv_freq_i,
// both with θ in float64 so that large positions keep their accuracy.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common.h"

namespace baracuda::kernels {

// base^(−2i/R) in float64, the exponent formed as reference.py forms it.
BARACUDA_HD double rope_inv_freq(double base, int64_t i, int64_t R) {
  return pow(base, -static_cast<double>(2 * i) / static_cast<double>(R));
}

// (cos θ, sin θ) of a float64 angle, for float64 data: float64 sin and cos of θ itself.
BARACUDA_HD void rope_cos_sin(double theta, double& c, double& s) {
#ifdef __CUDA_ARCH__
  sincos(theta, &s, &c);
#else
  s = std::sin(theta);
  c = std::cos(theta);
#endif
}

// (cos θ, sin θ) of a float64 angle, for float32/float16/bfloat16 data.
// θ = k·π/2 + r with k = rint(θ·2/π) and |r| <= π/4 (about), r computed in float64 with
// a two-part π/2 (Cody–Waite; r stays accurate to ~1e-16 while k·π/2 is exact in the
// fused multiply-adds, i.e. far beyond any position that fits float64 exactly). Then
// float32 sin/cos of float(r), rotated by the quadrant k mod 4:
//   k≡0: ( cos r,  sin r)   k≡1: (−sin r,  cos r)   k≡2: (−cos r, −sin r)   k≡3: ( sin r, −cos r)
// Rounding r to float32 costs at most half an ulp of π/4, so cos and sin are within about
// one float32 ulp of the float64 reference's.
BARACUDA_HD void rope_cos_sin(double theta, float& c, float& s) {
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPiOver2Hi = 1.57079632679489655800e+00;  // float64 nearest π/2
  constexpr double kPiOver2Lo = 6.12323399573676603587e-17;  // π/2 − kPiOver2Hi
#ifdef __CUDA_ARCH__
  const bool finite = isfinite(theta);
#else
  const bool finite = std::isfinite(theta);
#endif
  if (!finite) {  // (only with extreme bases) NaN, as sin/cos of ±inf or NaN give
    c = s = NAN;
    return;
  }
  const double k = rint(theta * kTwoOverPi);
  double r = fma(-k, kPiOver2Hi, theta);
  r = fma(-k, kPiOver2Lo, r);
  // k mod 4 without an integer conversion of k (exact: k is an integral float64).
  const int q = static_cast<int>(k - 4.0 * floor(k * 0.25));
  const float rf = static_cast<float>(r);
  float sr, cr;
#ifdef __CUDA_ARCH__
  sincosf(rf, &sr, &cr);
#else
  sr = std::sin(rf);
  cr = std::cos(rf);
#endif
  switch (q) {
    case 0: c = cr; s = sr; break;
    case 1: c = -sr; s = cr; break;
    case 2: c = -cr; s = -sr; break;
    default: c = sr; s = -cr; break;
  }
}

}  // namespace baracuda::kernels
