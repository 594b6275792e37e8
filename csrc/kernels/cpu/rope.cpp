// CPU RoPE kernels: one strided loop for every layout. Rows (b, h, s) are walked in
// parallel chunks, group by group (a group is one s, and one b when positions are
// per-batch), so the cos/sin table of R/2 pairs is computed once per group a chunk
// touches and reused for all its heads (and batches).
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/rope.h"
#include "kernels/rope_math.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

template <typename T, bool Interleaved>
void rope_rows(const RopeLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  T* y = static_cast<T*>(l.y);
  const int64_t half = l.R / 2;
  const int64_t nrows = l.per_batch ? l.H : l.B * l.H;  // rows of one group
  const int64_t ngroups = (l.per_batch ? l.B : 1) * l.S;
  const auto& xs = l.x_strides;
  const auto& ys = l.y_strides;
  // u and v of pair i sit at features (2i, 2i+1) interleaved, (i, i + R/2) half-split.
  const int64_t u_step = Interleaved ? 2 : 1;
  const int64_t v_off = Interleaved ? 1 : half;
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / l.D);
  at::parallel_for(0, ngroups * nrows, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> inv_freq(half);
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(l.base, i, l.R);
    std::vector<Acc> cos_t(half), sin_t(half);
    int64_t table_group = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / nrows, r = t % nrows;
      const int64_t gb = l.per_batch ? g / l.S : 0;
      const int64_t s = l.per_batch ? g % l.S : g;
      if (g != table_group) {
        const int64_t p = l.has_positions ? l.positions[gb * l.pos_stride_b + s * l.pos_stride_s] : s;
        for (int64_t i = 0; i < half; ++i) {
          Acc c, sn;
          rope_cos_sin(static_cast<double>(p) * inv_freq[i], c, sn);
          cos_t[i] = c;
          sin_t[i] = l.backward ? -sn : sn;  // the backward rotates by −θ
        }
        table_group = g;
      }
      const int64_t b = l.per_batch ? gb : r / l.H;
      const int64_t h = l.per_batch ? r : r % l.H;
      const T* xr = x + b * xs[0] + h * xs[1] + s * xs[2];
      T* yr = y + b * ys[0] + h * ys[1] + s * ys[2];
      const int64_t xd = xs[3], yd = ys[3];
      for (int64_t i = 0; i < half; ++i) {
        const int64_t du = i * u_step, dv = du + v_off;
        const Acc u = static_cast<Acc>(xr[du * xd]);
        const Acc v = static_cast<Acc>(xr[dv * xd]);
        yr[du * yd] = T(u * cos_t[i] - v * sin_t[i]);
        yr[dv * yd] = T(u * sin_t[i] + v * cos_t[i]);
      }
      for (int64_t d = l.R; d < l.D; ++d) yr[d * yd] = xr[d * xd];
    }
  });
}
}  // namespace

void rope_cpu(const RopeLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.interleaved)
      rope_rows<T, true>(l);
    else
      rope_rows<T, false>(l);
  });
}

}  // namespace baracuda::kernels
