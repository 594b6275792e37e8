// AVX2 CPU gated-activation kernels (both ops, forward and backward) for the rows layout
// of float32, float16 and bfloat16 data: every operand has a unit inner stride, so each
// run of the coalesced index space is processed 8 (float32) or 16 (half types) elements
// per step in float32 registers, in parallel over the index space. The formulas are
// gated_activation_math.h's, term for term, on at::vec::Vectorized<float>: exp is
// Sleef's (1 ulp), erf ATen's vectorized erf (the one its GELU kernel uses). Other
// layouts and float64 take the scalar kernels of gated_activation.cpp.
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
inline FVec vnormal_cdf(FVec b) {
  return FVec(0.5f) * (FVec(1.0f) + (b * FVec(0.70710678118654752440f)).erf());
}
inline FVec vnormal_pdf(FVec b) {
  return FVec(0.39894228040143267794f) * (FVec(-0.5f) * b * b).exp();
}

template <GatedKind K>
inline FVec vforward(FVec a, FVec b) {
  if constexpr (K == GatedKind::Glu) {
    return a * sigmoid(b);
  } else if constexpr (K == GatedKind::Reglu) {
    return a * at::vec::maximum(b, FVec(0.0f));  // maximum propagates NaN, as torch.relu
  } else if constexpr (K == GatedKind::Swiglu) {
    return avx2::swiglu(a, b);
  } else if constexpr (K == GatedKind::Geglu) {
    return a * (b * vnormal_cdf(b));
  } else {
    const FVec two_u = FVec(float(2 * kGeluTanhK)) * (b + FVec(float(kGeluTanhC)) * b * b * b);
    return a * (b * sigmoid(two_u));
  }
}

template <GatedKind K>
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
    const FVec cdf = vnormal_cdf(b);
    da = dy * (b * cdf);
    db = dy * a * (cdf + b * vnormal_pdf(b));
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
      for (int j = 0; j < L; ++j) vy[j] = vforward<K>(va[j], vb[j]);
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
      for (int j = 0; j < L; ++j) vbackward<K>(vg[j], va[j], vb[j], vda[j], vdb[j]);
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
