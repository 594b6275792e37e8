// CPU RMSNorm kernels, forward and backward: the AVX2 kernels of rmsnorm_avx2.cpp for the
// rows layout of float32/float16/bfloat16 x (the plain and the gated ops) on processors
// with AVX2; otherwise these scalar loops over any strides and every dtype (float32 math,
// float64 for float64). Parallel over row groups; the backward's dw (db)
// is summed per fixed block of rows into the workspace, then over the blocks in order
// (the same bits whatever the thread count).
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
  const T* z = static_cast<const T*>(l.z);
  const W* w = static_cast<const W*>(l.weight);
  const W* b = static_cast<const W*>(l.bias);
  O* y = static_cast<O*>(l.y);
  T* h = static_cast<T*>(l.h);
  Acc* rstd_out = static_cast<Acc*>(l.rstd);
  // The residual and z share an operand slot (no op has both).
  const int64_t cols = l.cols, sx = l.col_stride[kRmsX], sr = l.col_stride[kRmsResidual];
  const auto round_x = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
  const Acc eps = cpu::rms_norm_eps<Acc>(l), inv = cpu::rms_norm_inv_cols<Acc>(l);
  cpu::for_each_row_group(l, 2, [&](int64_t row, int64_t g, const int64_t* off) {
    const int64_t rg = row * l.ngroups + g, c0 = g * cols;  // row group, its first column
    const T* xr = x + off[kRmsX] + c0 * sx;
    const T* zr = z ? z + off[kRmsZ] + c0 * sr : nullptr;
    T* hr = l.has_residual ? h + row * cols : nullptr;
    // h = x, round_x(x + residual) (written to the h output) or x·silu(z); then Σ h².
    const auto h_at = [&](int64_t j) {
      Acc v = static_cast<Acc>(xr[j * sx]);
      if (hr) v = round_x(v + static_cast<Acc>(res[off[kRmsResidual] + j * sr]));
      if (l.gate == RmsNormGate::Before) v = silu_gate<false>(v, static_cast<Acc>(zr[j * sr]));
      return v;
    };
    const Acc ss = chunked_sum<Acc>(cols, [&](int64_t j) {
      const Acc v = h_at(j);
      if (hr) hr[j] = static_cast<T>(v);
      return v * v;
    });
    const Acc rstd = Acc(1) / std::sqrt(ss * inv + eps);
    rstd_out[rg] = rstd;
    O* yr = y + rg * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const Acc v = hr ? static_cast<Acc>(hr[j]) : h_at(j);
      const Acc wj = w ? static_cast<Acc>(w[(c0 + j) * l.w_stride]) : Acc(0);
      Acc out = rms_norm_output(l.convention, l.has_weight, v * rstd, wj, round_x);
      if (b) out += static_cast<Acc>(b[(c0 + j) * l.b_stride]);
      if (l.gate == RmsNormGate::After) out = silu_gate<false>(out, static_cast<Acc>(zr[j * sr]));
      yr[j] = static_cast<O>(out);
    }
  });
}

template <typename T, typename W, typename O>
void backward(const RmsNormLaunch& l) {
  using Acc = acc_t<T>;
  const O* dy = static_cast<const O*>(l.dy);
  const T* x = static_cast<const T*>(l.x);
  const T* dh = static_cast<const T*>(l.dh);
  const T* z = static_cast<const T*>(l.z);
  const W* w = static_cast<const W*>(l.weight);
  const W* b = static_cast<const W*>(l.bias);
  const Acc* rstd_in = static_cast<const Acc*>(l.rstd_in);
  T* dx = static_cast<T*>(l.dx);
  T* dz = static_cast<T*>(l.dz);
  T* y = static_cast<T*>(l.y);  // the gated op's recomputed output, if asked
  // dh and z share an operand slot (no op has both).
  const int64_t cols = l.cols, sdy = l.col_stride[kRmsDy], sx = l.col_stride[kRmsBx],
                sdh = l.col_stride[kRmsDh];
  const RmsNormGate gate = l.gate;
  const auto round_x = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
  const Acc inv = cpu::rms_norm_inv_cols<Acc>(l);
  cpu::for_each_backward_row<Acc>(l, [&](int64_t row, int64_t g, const int64_t* off, Acc* dw_part,
                                         Acc* db_part) {
    const int64_t rg = row * l.ngroups + g, c0 = g * cols;  // row group, its first column
    const O* dyr = dy + off[kRmsDy] + c0 * sdy;
    const T* xr = x + off[kRmsBx] + c0 * sx;
    const T* zr = z ? z + off[kRmsBz] + c0 * sdh : nullptr;
    const Acc rstd = rstd_in[off[kRmsRstd] + g * l.col_stride[kRmsRstd]];
    const auto w_at = [&](int64_t j) {
      return w ? static_cast<Acc>(w[(c0 + j) * l.w_stride]) : Acc(0);
    };
    const auto b_at = [&](int64_t j) {
      return b ? static_cast<Acc>(b[(c0 + j) * l.b_stride]) : Acc(0);
    };
    const auto z_at = [&](int64_t j) { return static_cast<Acc>(zr[j * sdh]); };
    // h (x, or x·silu(z)) and u (dy, or dy·silu(z)), the gradient of y before the gate.
    const auto h_at = [&](int64_t j) {
      const Acc v = static_cast<Acc>(xr[j * sx]);
      return gate == RmsNormGate::Before ? silu_gate<false>(v, z_at(j)) : v;
    };
    const auto u_at = [&](int64_t j) {
      const Acc d = static_cast<Acc>(dyr[j * sdy]);
      return gate == RmsNormGate::After ? silu_gate<false>(d, z_at(j)) : d;
    };
    const Acc c = chunked_sum<Acc>(cols, [&](int64_t j) {
                    return u_at(j) * rms_norm_grad_scale(l.convention, l.has_weight, w_at(j)) *
                           h_at(j) * rstd;
                  }) *
                  inv;
    T* dxr = dx + rg * cols;
    T* dzr = dz ? dz + row * l.dz_row_stride + c0 : nullptr;
    T* yr = y ? y + rg * cols : nullptr;
    for (int64_t j = 0; j < cols; ++j) {
      const Acc xj = static_cast<Acc>(xr[j * sx]), dyj = static_cast<Acc>(dyr[j * sdy]);
      const Acc zj = zr ? z_at(j) : Acc(0), wj = w_at(j);
      const Acc n = (gate == RmsNormGate::Before ? silu_gate<false>(xj, zj) : xj) * rstd;
      Acc pre = n * wj;  // the gated op's y before the gate, as the forward forms it
      if (b) pre += b_at(j);
      Acc u = dyj, dzj = 0;
      if (gate == RmsNormGate::After)  // y = y_pre·silu(z), y_pre = n·w + b
        silu_gate_backward<false>(dyj, pre, zj, u, dzj);
      if (yr) yr[j] = static_cast<T>(gate == RmsNormGate::After ? silu_gate<false>(pre, zj) : pre);
      Acc d = rstd * (u * rms_norm_grad_scale(l.convention, l.has_weight, wj) - n * c);
      if (dh) d += static_cast<Acc>(dh[off[kRmsDh] + j * sdh]);
      if (gate == RmsNormGate::Before) {  // h = x·silu(z)
        const Acc dh_j = d;
        silu_gate_backward<false>(dh_j, xj, zj, d, dzj);
      }
      dxr[j] = static_cast<T>(d);
      if (dzr) dzr[j] = static_cast<T>(dzj);
      if (dw_part) dw_part[c0 + j] += u * rms_norm_dw_factor(l.convention, n, round_x);
      if (db_part) db_part[c0 + j] += u;
    }
  });
  cpu::sum_dw_partials<Acc, W>(l);
}
}  // namespace

int64_t rms_norm_cpu_backward_blocks(const RmsNormLaunch&) { return kRmsNormCpuDwBlocks; }

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
