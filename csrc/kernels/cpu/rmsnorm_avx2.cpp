// AVX2 CPU RMSNorm kernels (forward and backward) for the rows layout of float32, float16
// and bfloat16 x: 16 elements a step in two float32 registers (vec_avx2_util.h), the
// weight and the output in their own dtypes (x's or float32). The formulas are
// rmsnorm_math.h's, term for term; the row sums add a step's lanes into two registers
// and flush them into a float total every 64 steps (a fixed order). The gated op (z, its
// gate before or after the norm, a bias, row groups) the same way, its SwiGLU gate on
// registers (vec_avx2_util.h: exp is Sleef's where the scalar kernels call std::exp).
// Other layouts and float64 take the scalar kernels of rmsnorm.cpp.
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
  const T* z = static_cast<const T*>(l.z);
  const W* w = static_cast<const W*>(l.weight);
  const W* b = static_cast<const W*>(l.bias);
  O* y = static_cast<O*>(l.y);
  T* h = static_cast<T*>(l.h);
  float* rstd_out = static_cast<float*>(l.rstd);
  const int64_t cols = l.cols;
  const RmsNormGate gate = l.gate;
  for_each_row_group(l, 2, [&](int64_t row, int64_t g, const int64_t* off) {
    const int64_t rg = row * l.ngroups + g, c0 = g * cols;  // row group, its first column
    const T* xr = x + off[kRmsX] + c0;
    const T* zr = z ? z + off[kRmsZ] + c0 : nullptr;  // (the residual's slot: no op has both)
    T* hr = l.has_residual ? h + row * cols : nullptr;
    // h: x, or x·silu(z) with the gate before the norm
    const auto load_h = [&](int64_t i, int64_t count, FVec* v) {
      avx2::load(xr + i, count, v);
      if (gate == RmsNormGate::Before) {
        FVec zv[2];
        avx2::load(zr + i, count, zv);
        for (int k = 0; k < 2; ++k) v[k] = avx2::swiglu(v[k], zv[k]);
      }
    };
    const float ss = row_sum<T>(cols, [&](int64_t i, int64_t count, FVec* acc) {
      FVec v[2];
      load_h(i, count, v);
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
    rstd_out[rg] = rstd;
    O* yr = y + rg * cols;
    avx2::for_steps<T>(cols, [&](int64_t i, int64_t count) {
      FVec n[2], wv[2];
      if (hr)
        avx2::load(hr + i, count, n);
      else
        load_h(i, count, n);
      if (w) avx2::load(w + c0 + i, count, wv);
      for (int k = 0; k < 2; ++k) n[k] = n[k] * FVec(rstd);
      output<T>(l.convention, l.has_weight, n, wv);
      if (b) {
        FVec bv[2];
        avx2::load(b + c0 + i, count, bv);
        for (int k = 0; k < 2; ++k) n[k] = n[k] + bv[k];
      }
      if (gate == RmsNormGate::After) {
        FVec zv[2];
        avx2::load(zr + i, count, zv);
        for (int k = 0; k < 2; ++k) n[k] = avx2::swiglu(n[k], zv[k]);
      }
      avx2::store(yr + i, count, n);
    });
  });
}

template <typename T, typename W, typename O>
void backward(const RmsNormLaunch& l) {
  const O* dy = static_cast<const O*>(l.dy);
  const T* x = static_cast<const T*>(l.x);
  const T* dh = static_cast<const T*>(l.dh);
  const T* z = static_cast<const T*>(l.z);
  const W* w = static_cast<const W*>(l.weight);
  const W* b = static_cast<const W*>(l.bias);
  const float* rstd_in = static_cast<const float*>(l.rstd_in);
  T* dx = static_cast<T*>(l.dx);
  T* dz = static_cast<T*>(l.dz);
  T* y = static_cast<T*>(l.y);  // the gated op's recomputed output, if asked
  const int64_t cols = l.cols;
  const RmsNormConvention conv = l.convention;
  const RmsNormGate gate = l.gate;
  for_each_backward_row<float>(l, [&](int64_t row, int64_t g, const int64_t* off, float* dw_part,
                                      float* db_part) {
    const int64_t rg = row * l.ngroups + g, c0 = g * cols;  // row group, its first column
    const O* dyr = dy + off[kRmsDy] + c0;
    const T* xr = x + off[kRmsBx] + c0;
    const T* zr = z ? z + off[kRmsBz] + c0 : nullptr;  // (dh's slot: no op has both)
    const FVec rstd(rstd_in[off[kRmsRstd] + g * l.col_stride[kRmsRstd]]);
    T* yr = y ? y + rg * cols : nullptr;
    // One step's z, x, n = h·rstd (h = x, or x·silu(z) with the gate before the norm), the
    // gated op's y before its gate, pre = n·w + b (with the gate after the norm or the
    // output recomputed), u = dy (or dy·silu(z) with the gate after the norm, then dz's
    // share from the gate), and g = u·s.
    const auto load = [&](int64_t i, int64_t count, FVec* zv, FVec* xv, FVec* n, FVec* u, FVec* gs,
                          FVec* dzv, FVec* pre) {
      FVec wv[2], d[2];
      avx2::load(dyr + i, count, d);
      avx2::load(xr + i, count, xv);
      if (w) avx2::load(w + c0 + i, count, wv);
      if (zr) avx2::load(zr + i, count, zv);
      for (int k = 0; k < 2; ++k) {
        n[k] = (gate == RmsNormGate::Before ? avx2::swiglu(xv[k], zv[k]) : xv[k]) * rstd;
        u[k] = d[k];
      }
      if (gate == RmsNormGate::After || yr) {
        FVec bv[2];
        if (b) avx2::load(b + c0 + i, count, bv);
        for (int k = 0; k < 2; ++k) {
          pre[k] = n[k] * (w ? wv[k] : FVec(0.0f));
          if (b) pre[k] = pre[k] + bv[k];
        }
      }
      if (gate == RmsNormGate::After)
        for (int k = 0; k < 2; ++k) avx2::swiglu_backward(d[k], pre[k], zv[k], u[k], dzv[k]);
      for (int k = 0; k < 2; ++k)
        gs[k] = !l.has_weight ? u[k]
                : conv == RmsNormConvention::Gemma ? u[k] * (FVec(1.0f) + wv[k])
                                                   : u[k] * wv[k];
    };
    const float c = row_sum<T>(cols, [&](int64_t i, int64_t count, FVec* acc) {
                      FVec zv[2], xv[2], n[2], u[2], gs[2], dzv[2], pre[2];
                      load(i, count, zv, xv, n, u, gs, dzv, pre);
                      for (int k = 0; k < 2; ++k) acc[k] = at::vec::fmadd(gs[k], n[k], acc[k]);
                    }) *
                    l.inv_cols;
    T* dxr = dx + rg * cols;
    T* dzr = dz ? dz + row * l.dz_row_stride + c0 : nullptr;
    avx2::for_steps<T>(cols, [&](int64_t i, int64_t count) {
      FVec zv[2], xv[2], n[2], u[2], gs[2], dzv[2], pre[2], out[2];
      load(i, count, zv, xv, n, u, gs, dzv, pre);
      for (int k = 0; k < 2; ++k) out[k] = rstd * (gs[k] - n[k] * FVec(c));
      if (dh) {
        FVec e[2];
        avx2::load(dh + off[kRmsDh] + i, count, e);
        for (int k = 0; k < 2; ++k) out[k] = out[k] + e[k];
      }
      if (yr) {  // (the gated op's y, after its gate where it follows the norm)
        if (gate == RmsNormGate::After)
          for (int k = 0; k < 2; ++k) pre[k] = avx2::swiglu(pre[k], zv[k]);
        avx2::store(yr + i, count, pre);
      }
      if (gate == RmsNormGate::Before)  // h = x·silu(z): dx and dz from dh = out
        for (int k = 0; k < 2; ++k) avx2::swiglu_backward(out[k], xv[k], zv[k], out[k], dzv[k]);
      avx2::store(dxr + i, count, out);
      if (dzr) {
        if (gate == RmsNormGate::None)
          for (int k = 0; k < 2; ++k) dzv[k] = FVec(0.0f);
        avx2::store(dzr + i, count, dzv);
      }
      if (dw_part) {
        if (conv == RmsNormConvention::Llama) round_x<T>(n);
        FVec p[2];
        avx2::load(dw_part + c0 + i, count, p);
        for (int k = 0; k < 2; ++k) p[k] = at::vec::fmadd(u[k], n[k], p[k]);
        avx2::store(dw_part + c0 + i, count, p);
      }
      if (db_part) {
        FVec p[2];
        avx2::load(db_part + c0 + i, count, p);
        for (int k = 0; k < 2; ++k) p[k] = p[k] + u[k];
        avx2::store(db_part + c0 + i, count, p);
      }
    });
  });
  sum_dw_partials<float, W>(l);
}
}  // namespace

bool rms_norm_avx2(const RmsNormLaunch& l) {
  if (l.layout != RmsNormLayout::Rows || l.element == ElementKind::F64) return false;
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
