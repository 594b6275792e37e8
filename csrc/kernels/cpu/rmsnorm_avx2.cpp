// AVX2 CPU RMSNorm kernels (forward and backward) for the rows layout of float32, float16
// and bfloat16 x: 16 elements a step in two float32 registers (vec_avx2_util.h), the
// weight and the output in their own dtypes (x's or float32). The formulas are
// rmsnorm_math.h's, term for term; the row sums add a step's lanes into two registers
// and flush them into a float total every 64 steps (a fixed order). Other layouts,
// float64 and the gated op take the scalar kernels of rmsnorm.cpp.
#include <cmath>

#include "kernels/cpu/rmsnorm_rows.h"
#include "kernels/rmsnorm.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
namespace {
using avx2::FVec;

// Σ over a row of body(i, count, acc) (which adds into the two registers acc), flushing
// the registers into the total every 64 steps.
template <typename T, typename Body>
float row_sum(int64_t n, Body&& body) {
  float total = 0.0f;
  FVec acc[2] = {FVec(0.0f), FVec(0.0f)};
  int64_t steps = 0;
  const auto flush = [&] {
    float lanes[FVec::size()];
    (acc[0] + acc[1]).store(lanes);
    for (float v : lanes) total += v;
    acc[0] = acc[1] = FVec(0.0f);
  };
  avx2::for_steps<T>(n, [&](int64_t i, int64_t count) {
    body(i, count, acc);
    if (++steps % 64 == 0) flush();
  });
  flush();
  return total;
}

// v rounded to T and back (the llama convention's cast): identity for float32.
template <typename T>
inline void round_x(FVec* v) {
  if constexpr (!std::is_same_v<T, float>)
    std::tie(v[0], v[1]) = at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v[0], v[1]));
}

// The convention's y from n (and w), in place in n.
template <typename T>
inline void output(RmsNormConvention c, bool has_weight, FVec* n, const FVec* w) {
  if (!has_weight) return;
  if (c == RmsNormConvention::Llama) round_x<T>(n);
  for (int k = 0; k < 2; ++k)
    n[k] = c == RmsNormConvention::Gemma ? n[k] * (FVec(1.0f) + w[k]) : n[k] * w[k];
}

template <typename T, typename W, typename O>
void forward(const RmsNormLaunch& l) {
  const T* x = static_cast<const T*>(l.x);
  const T* res = static_cast<const T*>(l.residual);
  const W* w = static_cast<const W*>(l.weight);
  O* y = static_cast<O*>(l.y);
  T* h = static_cast<T*>(l.h);
  float* rstd_out = static_cast<float*>(l.rstd);
  const int64_t cols = l.cols;
  for_each_row(l, 2, [&](int64_t row, const int64_t* off) {
    const T* xr = x + off[kRmsX];
    T* hr = l.has_residual ? h + row * cols : nullptr;
    const float ss = row_sum<T>(cols, [&](int64_t i, int64_t count, FVec* acc) {
      FVec v[2];
      avx2::load(xr + i, count, v);
      if (hr) {
        FVec r[2];
        avx2::load(res + off[kRmsResidual] + i, count, r);
        v[0] = v[0] + r[0];
        v[1] = v[1] + r[1];
        round_x<T>(v);
        avx2::store(hr + i, count, v);
      }
      for (int k = 0; k < 2; ++k) acc[k] = at::vec::fmadd(v[k], v[k], acc[k]);
    });
    const float rstd = 1.0f / std::sqrt(ss * l.inv_cols + l.eps);
    rstd_out[row] = rstd;
    const T* src = hr ? hr : xr;
    O* yr = y + row * cols;
    avx2::for_steps<T>(cols, [&](int64_t i, int64_t count) {
      FVec n[2], wv[2];
      avx2::load(src + i, count, n);
      if (w) avx2::load(w + i, count, wv);
      for (int k = 0; k < 2; ++k) n[k] = n[k] * FVec(rstd);
      output<T>(l.convention, l.has_weight, n, wv);
      avx2::store(yr + i, count, n);
    });
  });
}

template <typename T, typename W, typename O>
void backward(const RmsNormLaunch& l) {
  const O* dy = static_cast<const O*>(l.dy);
  const T* x = static_cast<const T*>(l.x);
  const T* dh = static_cast<const T*>(l.dh);
  const W* w = static_cast<const W*>(l.weight);
  const float* rstd_in = static_cast<const float*>(l.rstd_in);
  T* dx = static_cast<T*>(l.dx);
  const int64_t cols = l.cols;
  const RmsNormConvention conv = l.convention;
  for_each_backward_row<float>(l, [&](int64_t row, int64_t, const int64_t* off, float* dw_part,
                                      float*) {
    const O* dyr = dy + off[kRmsDy];
    const T* xr = x + off[kRmsBx];
    const FVec rstd(rstd_in[off[kRmsRstd]]);
    // dy, g = dy·s and n = x·rstd of one step.
    const auto load = [&](int64_t i, int64_t count, FVec* d, FVec* g, FVec* n) {
      FVec wv[2];
      avx2::load(dyr + i, count, d);
      avx2::load(xr + i, count, n);
      if (w) avx2::load(w + i, count, wv);
      for (int k = 0; k < 2; ++k) {
        n[k] = n[k] * rstd;
        g[k] = !l.has_weight ? d[k]
               : conv == RmsNormConvention::Gemma ? d[k] * (FVec(1.0f) + wv[k])
                                                  : d[k] * wv[k];
      }
    };
    const float c = row_sum<T>(cols, [&](int64_t i, int64_t count, FVec* acc) {
                      FVec d[2], g[2], n[2];
                      load(i, count, d, g, n);
                      for (int k = 0; k < 2; ++k) acc[k] = at::vec::fmadd(g[k], n[k], acc[k]);
                    }) *
                    l.inv_cols;
    T* dxr = dx + row * cols;
    avx2::for_steps<T>(cols, [&](int64_t i, int64_t count) {
      FVec d[2], g[2], n[2], out[2];
      load(i, count, d, g, n);
      for (int k = 0; k < 2; ++k) out[k] = rstd * (g[k] - n[k] * FVec(c));
      if (dh) {
        FVec e[2];
        avx2::load(dh + off[kRmsDh] + i, count, e);
        for (int k = 0; k < 2; ++k) out[k] = out[k] + e[k];
      }
      avx2::store(dxr + i, count, out);
      if (dw_part) {
        if (conv == RmsNormConvention::Llama) round_x<T>(n);
        FVec p[2];
        avx2::load(dw_part + i, count, p);
        for (int k = 0; k < 2; ++k) p[k] = at::vec::fmadd(d[k], n[k], p[k]);
        avx2::store(dw_part + i, count, p);
      }
    });
  });
  sum_dw_partials<float, W>(l);
}
}  // namespace

bool rms_norm_avx2(const RmsNormLaunch& l) {
  if (l.layout != RmsNormLayout::Rows || l.element == ElementKind::F64 || l.gated) return false;
  dispatch_rms_norm(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    if constexpr (!std::is_same_v<T, double> && !std::is_same_v<W, double> &&
                  !std::is_same_v<O, double>) {
      if (l.backward)
        backward<T, W, O>(l);
      else
        forward<T, W, O>(l);
    }
  });
  return true;
}
#else
bool rms_norm_avx2(const RmsNormLaunch&) { return false; }
#endif

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
