// AVX2 CPU gated-activation kernels (both ops, forward and backward) for the rows layout
// of float32, float16 and bfloat16 data: every operand has a unit inner stride, so each
// run of the coalesced index space is processed 8 (float32) or 16 (half types) elements
// per step in float32 registers, in parallel over the index space. The formulas are
// gated_activation_math.h's, term for term, on at::vec::Vectorized<float> (exp is
// Sleef's, 1 ulp), except GeGLU's Φ and φ (vgelu_parts). Other layouts and float64 take
// the scalar kernels of gated_activation.cpp.
#include "core/gated_activation_plan.h"
#include "kernels/cpu/loops.h"
#include "kernels/gated_activation_math.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
namespace {
using avx2::FVec;

using avx2::sigmoid;
// GeGLU's Φ(b) and e = exp(−b²/2) (φ = e/√(2π)), relatively accurate in the lower tail
// too:
//   Φ = erfc(−b/√2)/2:  x = |b|/√2,  t = 1/(1 + x/2),  erfc(x)/2 = t·Q(t)·exp(−x²),
//   Φ = b ≥ 0 ? 1 − erfc/2 : erfc/2.
// Exact (float32 data): Q of degree 8 fitted for this library (`python scripts/fit_erfc.py
// --degree 8`: relative minimax over x in [0, 10], 4.3e-8 in exact arithmetic, t·Q within
// 2.9e-7 evaluated in float32; up to x = 14.15, the clamp below, within 4.2e-7), and
// exp(−b²/2) from b² split exactly, u + r = b² (u = b·b rounded, r = fma(b, b, −u)), as
// exp(−u/2)·(1 − r/2): a rounded b² costs up to (b²/2)·2^-24 relative (2e-6 at
// b = −8.5). Otherwise (16-bit data, whose rounding is 2^-9 or 2^-12): the CUDA kernels'
// degree-6 Q (gated_activation_math.h, erfc within 1.4e-6) and b² rounded, 5 fewer
// operations an element.
// ATen's vectorized erf, which PyTorch's GELU uses, is within 1.5e-7 absolute, so
// (1 + erf)/2 cancels in the tail: 1e-5 relative at b = −2.7, all of Φ below b ≈ −5.9.
// |b| is clamped to 20 for the tail (Φ is 0 or 1 and e is 0 in float32 beyond it; an
// infinite b would make r NaN); a NaN b stays NaN.
template <bool Exact>
inline void vgelu_parts(FVec b, FVec& cdf, FVec& e) {
  const FVec bc = at::vec::minimum(at::vec::maximum(b, FVec(-20.0f)), FVec(20.0f));
  const FVec u = bc * bc;
  e = (FVec(-0.5f) * u).exp();
  const FVec t = FVec(1.0f) / at::vec::fmadd(bc.abs(), FVec(0.35355339059327376220f), FVec(1.0f));
  FVec q;
  if constexpr (Exact) {
    const FVec r = at::vec::fmsub(bc, bc, u);
    e = at::vec::fmadd(e, FVec(-0.5f) * r, e);
    q = FVec(-0.029534879002573362f);
    q = at::vec::fmadd(q, t, FVec(0.14228936805774559f));
    q = at::vec::fmadd(q, t, FVec(-0.24360371595011143f));
    q = at::vec::fmadd(q, t, FVec(0.13903771054070899f));
    q = at::vec::fmadd(q, t, FVec(-0.013315540815948157f));
    q = at::vec::fmadd(q, t, FVec(0.10134451578231894f));
    q = at::vec::fmadd(q, t, FVec(0.12155162598203235f));
    q = at::vec::fmadd(q, t, FVec(0.14118768672215212f));
    q = at::vec::fmadd(q, t, FVec(0.1410432072394987f));
  } else {
    q = FVec(erfc_q6(0));
    for (int k = 1; k < kErfcQ6Terms; ++k) q = at::vec::fmadd(q, t, FVec(erfc_q6(k)));
  }
  const FVec half_erfc = t * q * e;
  cdf = FVec::blendv(half_erfc, FVec(1.0f) - half_erfc, b >= FVec(0.0f));
}

// Exact: float32 data (vgelu_parts)
template <GatedKind K, bool Exact>
inline FVec vforward(FVec a, FVec b) {
  if constexpr (K == GatedKind::Glu) {
    return a * sigmoid(b);
  } else if constexpr (K == GatedKind::Reglu) {
    return a * at::vec::maximum(b, FVec(0.0f));  // maximum propagates NaN, as torch.relu
  } else if constexpr (K == GatedKind::Swiglu) {
    return avx2::swiglu(a, b);
  } else if constexpr (K == GatedKind::Geglu) {
    FVec cdf, e;
    vgelu_parts<Exact>(b, cdf, e);
    return a * (b * cdf);
  } else {
    const FVec two_u = FVec(float(2 * kGeluTanhK)) * (b + FVec(float(kGeluTanhC)) * b * b * b);
    return a * (b * sigmoid(two_u));
  }
}

template <GatedKind K, bool Exact>
inline void vbackward(FVec dy, FVec a, FVec b, FVec& da, FVec& db) {
  const FVec one(1.0f), zero(0.0f);
  if constexpr (K == GatedKind::Glu) {
    const FVec s = sigmoid(b);
    da = dy * s;
    db = dy * a * s * (one - s);
  } else if constexpr (K == GatedKind::Reglu) {
    da = dy * at::vec::maximum(b, zero);
    db = FVec::blendv(dy * a, zero, b <= zero);  // ordered compare: a NaN b passes, as torch.relu
  } else if constexpr (K == GatedKind::Swiglu) {
    avx2::swiglu_backward(dy, a, b, da, db);
  } else if constexpr (K == GatedKind::Geglu) {
    FVec cdf, e;
    vgelu_parts<Exact>(b, cdf, e);
    da = dy * (b * cdf);
    db = dy * a * (cdf + b * (FVec(0.39894228040143267794f) * e));
  } else {
    const FVec b2 = b * b;
    const FVec s =
        sigmoid(FVec(float(2 * kGeluTanhK)) * (b + FVec(float(kGeluTanhC)) * b2 * b));
    da = dy * (b * s);
    const FVec du = FVec(float(kGeluTanhK)) * (one + FVec(float(3 * kGeluTanhC)) * b2);
    db = dy * a * (s + FVec(2.0f) * b * s * (one - s) * du);
  }
}

template <typename T, GatedKind K>
void forward(const GatedActivationLaunch& l) {
  constexpr int L = avx2::kLanes<T>;
  const T* x = static_cast<const T*>(l.x);
  const T* xa = static_cast<const T*>(l.a);
  T* y = static_cast<T*>(l.out);
  const int ka = l.a_operand();
  parallel_for_each_run<4>(l.dims, [&](const int64_t* off, int64_t n) {
    const T* a = xa + off[ka] + l.x_a_offset;
    const T* b = x + off[0] + l.x_b_offset;
    T* out = y + off[1];
    avx2::for_steps<T>(n, [&](int64_t i, int64_t count) {
      FVec va[L], vb[L], vy[L];
      avx2::load(a + i, count, va);
      avx2::load(b + i, count, vb);
      for (int j = 0; j < L; ++j) vy[j] = vforward<K, std::is_same_v<T, float>>(va[j], vb[j]);
      avx2::store(out + i, count, vy);
    });
  });
}

template <typename T, GatedKind K>
void backward(const GatedActivationLaunch& l) {
  constexpr int L = avx2::kLanes<T>;
  const T* x = static_cast<const T*>(l.x);
  const T* xa = static_cast<const T*>(l.a);
  const T* dy = static_cast<const T*>(l.dy);
  T* dx = static_cast<T*>(l.out);
  T* dxa = static_cast<T*>(l.out_a);
  const int ka = l.a_operand();
  parallel_for_each_run<4>(l.dims, [&](const int64_t* off, int64_t n) {
    const T* a = xa + off[ka] + l.x_a_offset;
    const T* b = x + off[0] + l.x_b_offset;
    const T* g = dy + off[2];
    T* da = dxa + off[1] + l.out_a_offset;
    T* db = dx + off[1] + l.out_b_offset;
    avx2::for_steps<T>(n, [&](int64_t i, int64_t count) {
      FVec va[L], vb[L], vg[L], vda[L], vdb[L];
      avx2::load(a + i, count, va);
      avx2::load(b + i, count, vb);
      avx2::load(g + i, count, vg);
      for (int j = 0; j < L; ++j) vbackward<K, std::is_same_v<T, float>>(vg[j], va[j], vb[j], vda[j], vdb[j]);
      avx2::store(da + i, count, vda);
      avx2::store(db + i, count, vdb);
    });
  });
}

template <typename T>
void dispatch_kind(const GatedActivationLaunch& l) {
  auto go = [&](auto kind_tag) {
    constexpr GatedKind K = decltype(kind_tag)::value;
    if (l.backward)
      backward<T, K>(l);
    else
      forward<T, K>(l);
  };
  with_gated_kind(l.kind, go);
}
}  // namespace

bool gated_activation_avx2(const GatedActivationLaunch& l) {
  if (l.layout != GatedLayout::Rows) return false;
  switch (l.element) {
    case ElementKind::F32: dispatch_kind<float>(l); return true;
    case ElementKind::F16: dispatch_kind<c10::Half>(l); return true;
    case ElementKind::BF16: dispatch_kind<c10::BFloat16>(l); return true;
    default: return false;
  }
}
#else
bool gated_activation_avx2(const GatedActivationLaunch&) { return false; }
#endif

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
