// CPU RMSNorm kernels, forward and backward: the AVX2 kernels of rmsnorm_avx2.cpp for the
// rows layout of float32/float16/bfloat16 x on processors with AVX2; otherwise these
// scalar loops over any strides and every dtype (float32 math, float64 for float64).
// Parallel over rows; the backward's dw is summed per fixed block of rows into the
// workspace, then over the blocks in order (the same bits whatever the thread count).
#include <cmath>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/rmsnorm_rows.h"
#include "kernels/rmsnorm.h"
#include "kernels/rmsnorm_math.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

// Σ f(j) for j < n in chunks of 256 terms (a chunk's sum, then the running total): an
// error of about (256 + n/256) units of the compute precision instead of n.
template <typename Acc, typename F>
Acc chunked_sum(int64_t n, F&& f) {
  Acc total = 0;
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    Acc part = 0;
    const int64_t j1 = std::min(n, j0 + 256);
    for (int64_t j = j0; j < j1; ++j) part += f(j);
    total += part;
  }
  return total;
}

template <typename T, typename W, typename O>
void forward(const RmsNormLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  const T* res = static_cast<const T*>(l.residual);
  const W* w = static_cast<const W*>(l.weight);
  O* y = static_cast<O*>(l.y);
  T* h = static_cast<T*>(l.h);
  Acc* rstd_out = static_cast<Acc*>(l.rstd);
  const int64_t cols = l.cols, sx = l.col_stride[kRmsX], sr = l.col_stride[kRmsResidual];
  const auto round_x = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
  const Acc eps = cpu::rms_norm_eps<Acc>(l), inv = cpu::rms_norm_inv_cols<Acc>(l);
  cpu::for_each_row(l, 2, [&](int64_t row, const int64_t* off) {
    const T* xr = x + off[kRmsX];
    T* hr = l.has_residual ? h + row * cols : nullptr;
    // h = x, or round_x(x + residual) (written to the h output); then Σ h².
    const auto h_at = [&](int64_t j) {
      Acc v = static_cast<Acc>(xr[j * sx]);
      if (hr) v = round_x(v + static_cast<Acc>(res[off[kRmsResidual] + j * sr]));
      return v;
    };
    const Acc ss = chunked_sum<Acc>(cols, [&](int64_t j) {
      const Acc v = h_at(j);
      if (hr) hr[j] = static_cast<T>(v);
      return v * v;
    });
    const Acc rstd = Acc(1) / std::sqrt(ss * inv + eps);
    rstd_out[row] = rstd;
    O* yr = y + row * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const Acc v = hr ? static_cast<Acc>(hr[j]) : static_cast<Acc>(xr[j * sx]);
      const Acc wj = w ? static_cast<Acc>(w[j * l.w_stride]) : Acc(0);
      yr[j] = static_cast<O>(rms_norm_output(l.convention, l.has_weight, v * rstd, wj, round_x));
    }
  });
}

template <typename T, typename W, typename O>
void backward(const RmsNormLaunch& l) {
  using Acc = acc_t<T>;
  const O* dy = static_cast<const O*>(l.dy);
  const T* x = static_cast<const T*>(l.x);
  const T* dh = static_cast<const T*>(l.dh);
  const W* w = static_cast<const W*>(l.weight);
  const Acc* rstd_in = static_cast<const Acc*>(l.rstd_in);
  T* dx = static_cast<T*>(l.dx);
  const int64_t cols = l.cols, sdy = l.col_stride[kRmsDy], sx = l.col_stride[kRmsBx],
                sdh = l.col_stride[kRmsDh];
  const auto round_x = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
  const Acc inv = cpu::rms_norm_inv_cols<Acc>(l);
  cpu::for_each_backward_row<Acc>(l, [&](int64_t row, const int64_t* off, Acc* dw_part) {
    const O* dyr = dy + off[kRmsDy];
    const T* xr = x + off[kRmsBx];
    const Acc rstd = rstd_in[off[kRmsRstd]];
    const auto g_at = [&](int64_t j) {
      const Acc wj = w ? static_cast<Acc>(w[j * l.w_stride]) : Acc(0);
      return static_cast<Acc>(dyr[j * sdy]) * rms_norm_grad_scale(l.convention, l.has_weight, wj);
    };
    const Acc c =
        chunked_sum<Acc>(cols, [&](int64_t j) { return g_at(j) * static_cast<Acc>(xr[j * sx]) * rstd; }) *
        inv;
    T* dxr = dx + row * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const Acc n = static_cast<Acc>(xr[j * sx]) * rstd;
      Acc d = rstd * (g_at(j) - n * c);
      if (dh) d += static_cast<Acc>(dh[off[kRmsDh] + j * sdh]);
      dxr[j] = static_cast<T>(d);
      if (dw_part)
        dw_part[j] += static_cast<Acc>(dyr[j * sdy]) * rms_norm_dw_factor(l.convention, n, round_x);
    }
  });
  cpu::sum_dw_partials<Acc, W>(l);
}
}  // namespace

int64_t rms_norm_cpu_backward_blocks(const RmsNormLaunch& l) {
  return std::min(l.rows, kRmsNormCpuDwBlocks);
}

void rms_norm_cpu(const RmsNormLaunch& l) {
  if (cpu::cpu_has_avx2() && cpu::rms_norm_avx2(l)) return;
  cpu::dispatch_rms_norm(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    if (l.backward)
      backward<T, W, O>(l);
    else
      forward<T, W, O>(l);
  });
}

}  // namespace baracuda::kernels
