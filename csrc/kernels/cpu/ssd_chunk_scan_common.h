// What the CPU SSD kernels (kernels/cpu/ssd_chunk_scan.cpp, the float64 recurrence, and
// kernels/cpu/ssd_chunk_scan_chunked.cpp, the chunked algorithm) share: strided reads of
// the launch's inputs with the dt processing and seq_idx resets, the dtype dispatch, and
// the fixed-order reduction of the per-(b, h) partial sums of dA, ddt_bias and dD.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/ssd_chunk_scan.h"

namespace baracuda::kernels::ssd_cpu {

// Strided reads of the inputs (element strides from the launch). T: x, B, C, z, dy,
// y_pre; DT: dt; CT: A, D, dt_bias, initial_states, dfinal_states.
template <typename T, typename DT, typename CT>
struct Inputs {
  const SsdChunkScanLaunch& l;
  explicit Inputs(const SsdChunkScanLaunch& launch) : l(launch) {}

  template <typename U>
  static const U* p(const void* v) { return static_cast<const U*>(v); }

  double a(int64_t h) const { return static_cast<double>(p<CT>(l.A)[h * l.A_stride]); }
  double raw_dt(int64_t b, int64_t t, int64_t h) const {
    return static_cast<double>(
        p<DT>(l.dt)[b * l.dt_stride[0] + t * l.dt_stride[1] + h * l.dt_stride[2]]);
  }
  // The processed dt and d(processed)/d(raw) (0 where the limits clamp it).
  double step(int64_t b, int64_t t, int64_t h, double* slope = nullptr) const {
    double v = raw_dt(b, t, h);
    if (l.dt_bias) v += static_cast<double>(p<CT>(l.dt_bias)[h * l.dt_bias_stride]);
    double g = 1.0;
    if (l.dt_softplus && v <= 20.0) {
      g = 1.0 / (1.0 + std::exp(-v));
      v = std::log1p(std::exp(v));
    }
    if (v < l.dt_min || v > l.dt_max) {
      g = 0.0;
      v = v < l.dt_min ? l.dt_min : l.dt_max;
    }
    if (slope) *slope = g;
    return v;
  }
  // True when the state resets before step t (seq_idx changes between t-1 and t).
  bool reset(int64_t b, int64_t t) const {
    if (!l.seq_idx || t == 0) return false;
    const int64_t s0 = l.seq_idx_stride[0], s1 = l.seq_idx_stride[1];
    if (l.seq_idx_int64) {
      const int64_t* s = p<int64_t>(l.seq_idx) + b * s0;
      return s[t * s1] != s[(t - 1) * s1];
    }
    const int32_t* s = p<int32_t>(l.seq_idx) + b * s0;
    return s[t * s1] != s[(t - 1) * s1];
  }
  // D for head h, per d (the same value for every d when D is [H]); 0 without D.
  template <typename O>
  void load_D(int64_t h, O* out) const {
    for (int64_t d = 0; d < l.head_dim; ++d)
      out[d] = !l.D ? O(0)
               : static_cast<O>(
                     p<CT>(l.D)[h * l.D_stride[0] + (l.D_per_dim ? d * l.D_stride[1] : 0)]);
  }
  template <typename O>
  static void load4(const void* base, const int64_t* st, int64_t i0, int64_t i1, int64_t i2,
                    int64_t n, O* out) {
    const T* q = p<T>(base) + i0 * st[0] + i1 * st[1] + i2 * st[2];
    for (int64_t k = 0; k < n; ++k) out[k] = static_cast<O>(q[k * st[3]]);
  }
  // Row [b, t, h, :] of an activation (x, dy, z, y_pre: D values) or [b, t, g, :] of B
  // or C (N values), given its base pointer and strides from the launch.
  template <typename O>
  void load_row(const void* base, const int64_t* st, int64_t b, int64_t t, int64_t h,
                O* out) const {
    load4(base, st, b, t, h, l.head_dim, out);
  }
  template <typename O>
  void load_bc(const void* base, const int64_t* st, int64_t b, int64_t t, int64_t g,
               O* out) const {
    load4(base, st, b, t, g, l.state_dim, out);
  }
  // A [B, H, D, N] compute-typed state (initial_states or dfinal_states), or zeros.
  template <typename O>
  void load_state(const void* base, const int64_t* st, int64_t b, int64_t h, O* out) const {
    const int64_t D = l.head_dim, N = l.state_dim;
    if (!base) {
      std::fill(out, out + D * N, O(0));
      return;
    }
    const CT* q = p<CT>(base) + b * st[0] + h * st[1];
    for (int64_t d = 0; d < D; ++d)
      for (int64_t n = 0; n < N; ++n) out[d * N + n] = static_cast<O>(q[d * st[2] + n * st[3]]);
  }
};

inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// dA[h], ddt_bias[h], dD[h(, d)] = Σ_b partial[b, h(, d)], summed in double in order of b
// (and of d for a per-head D): the same bits for any thread count. P: the partials' type.
template <typename CT, typename P>
void reduce_partials(const SsdChunkScanLaunch& l, const P* dA_partial, const P* dbias_partial,
                     const P* dD_partial) {
  const int64_t H = l.heads, D = l.head_dim;
  CT* dA = static_cast<CT*>(l.dA);
  CT* dbias = static_cast<CT*>(l.ddt_bias);
  CT* dD = static_cast<CT*>(l.dD);
  for (int64_t h = 0; h < H; ++h) {
    double acc = 0.0, accb = 0.0;
    for (int64_t b = 0; b < l.batch; ++b) {
      acc += dA_partial[b * H + h];
      accb += dbias_partial[b * H + h];
    }
    dA[h] = static_cast<CT>(acc);
    if (dbias) dbias[h] = static_cast<CT>(accb);
    if (!dD) continue;
    if (l.D_per_dim) {
      for (int64_t d = 0; d < D; ++d) {
        double s = 0.0;
        for (int64_t b = 0; b < l.batch; ++b) s += dD_partial[(b * H + h) * D + d];
        dD[h * D + d] = static_cast<CT>(s);
      }
    } else {
      double s = 0.0;
      for (int64_t b = 0; b < l.batch; ++b)
        for (int64_t d = 0; d < D; ++d) s += dD_partial[(b * H + h) * D + d];
      dD[h] = static_cast<CT>(s);
    }
  }
}

// Calls f(T{}, DT{}, CT{}) with the element, dt and compute types of the launch.
template <typename F>
void dispatch(const SsdChunkScanLaunch& l, F&& f) {
  cpu::dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    using CT = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const ElementKind ck = std::is_same_v<CT, double> ? ElementKind::F64 : ElementKind::F32;
    if (l.compute != ck)
      fail(PlanErrorKind::Internal, "ssd_chunk_scan", "compute type does not match the element");
    if (l.dt_element == l.element)
      f(T{}, T{}, CT{});
    else if (l.dt_element == ck)
      f(T{}, CT{}, CT{});
    else
      fail(PlanErrorKind::Internal, "ssd_chunk_scan", "dt must be the element or compute type");
  });
}

}  // namespace baracuda::kernels::ssd_cpu
