// CPU kernel of the cos/sin RoPE (forward and backward, q and k in one pass). Groups
// (b, s) are walked in parallel chunks; each group converts its table row once into four
// float32 (float64 for float64 data) coefficient arrays of R/2 pairs,
//   forward:  y_u = c_u·u − s_u·v,   y_v = s_v·u + c_v·v
//   backward: y_u = c_u·u + s_v·v,   y_v = −s_u·u + c_v·v
// and applies them to every head of q and k at that (b, s). Half-split rows with unit
// feature stride use at::vec::Vectorized (float16/bfloat16 converted to float32 in
// registers); interleaved or strided rows take the scalar loop.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/rope_cos_sin.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;
using at::vec::Vectorized;

template <typename T>
constexpr bool kReduced = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

// Elements per vector step of a row: one Vectorized<T> (two float vectors for half types).
template <typename T>
constexpr int64_t step_of() {
  return Vectorized<T>::size();
}

// The four coefficient arrays of one group, padded to whole vector steps (zeros).
template <typename Acc>
struct Coeffs {
  std::vector<Acc> m00, m01, m10, m11;
};

template <typename T, typename C>
void fill_coeffs(const RopeCosSinLaunch& l, int64_t b, int64_t s, Coeffs<acc_t<T>>& m) {
  using Acc = acc_t<T>;
  const int64_t half = l.R / 2;
  const C* cos = static_cast<const C*>(l.cos) + b * l.cos_strides[0] + s * l.cos_strides[1];
  const C* sin = static_cast<const C*>(l.sin) + b * l.sin_strides[0] + s * l.sin_strides[1];
  const int64_t cr = l.cos_strides[2], sr = l.sin_strides[2];
  for (int64_t p = 0; p < half; ++p) {
    int64_t eu = p, ev = p;  // table entries of u and v
    if (l.full_table) {
      eu = l.interleaved ? 2 * p : p;
      ev = l.interleaved ? 2 * p + 1 : p + half;
    }
    const Acc cu = static_cast<Acc>(cos[eu * cr]), su = static_cast<Acc>(sin[eu * sr]);
    const Acc cv = static_cast<Acc>(cos[ev * cr]), sv = static_cast<Acc>(sin[ev * sr]);
    m.m00[p] = cu;
    m.m11[p] = cv;
    m.m01[p] = l.backward ? sv : -su;
    m.m10[p] = l.backward ? -su : sv;
  }
}

// Half-split row, unit feature stride: vectorized.
template <typename T>
void row_half_split_simd(const T* x, T* y, int64_t half, const Coeffs<acc_t<T>>& m) {
  using Acc = acc_t<T>;
  constexpr int64_t kStep = step_of<T>();
  for (int64_t i = 0; i < half; i += kStep) {
    const int n = static_cast<int>(std::min(kStep, half - i));
    if constexpr (kReduced<T>) {
      constexpr int64_t kF = Vectorized<float>::size();
      auto [u0, u1] = at::vec::convert_to_float<T>(Vectorized<T>::loadu(x + i, n));
      auto [v0, v1] = at::vec::convert_to_float<T>(Vectorized<T>::loadu(x + half + i, n));
      const auto a0 = Vectorized<float>::loadu(m.m00.data() + i);
      const auto a1 = Vectorized<float>::loadu(m.m00.data() + i + kF);
      const auto b0 = Vectorized<float>::loadu(m.m01.data() + i);
      const auto b1 = Vectorized<float>::loadu(m.m01.data() + i + kF);
      const auto c0 = Vectorized<float>::loadu(m.m10.data() + i);
      const auto c1 = Vectorized<float>::loadu(m.m10.data() + i + kF);
      const auto d0 = Vectorized<float>::loadu(m.m11.data() + i);
      const auto d1 = Vectorized<float>::loadu(m.m11.data() + i + kF);
      const auto yu = at::vec::convert_from_float<T>(at::vec::fmadd(a0, u0, b0 * v0),
                                                     at::vec::fmadd(a1, u1, b1 * v1));
      const auto yv = at::vec::convert_from_float<T>(at::vec::fmadd(c0, u0, d0 * v0),
                                                     at::vec::fmadd(c1, u1, d1 * v1));
      yu.store(y + i, n);
      yv.store(y + half + i, n);
    } else {
      const auto u = Vectorized<Acc>::loadu(x + i, n);
      const auto v = Vectorized<Acc>::loadu(x + half + i, n);
      const auto a = Vectorized<Acc>::loadu(m.m00.data() + i);
      const auto b = Vectorized<Acc>::loadu(m.m01.data() + i);
      const auto c = Vectorized<Acc>::loadu(m.m10.data() + i);
      const auto d = Vectorized<Acc>::loadu(m.m11.data() + i);
      at::vec::fmadd(a, u, b * v).store(y + i, n);
      at::vec::fmadd(c, u, d * v).store(y + half + i, n);
    }
  }
}

// Any row: scalar.
template <typename T>
void row_scalar(const T* x, int64_t xd, T* y, int64_t yd, int64_t half, bool interleaved,
                const Coeffs<acc_t<T>>& m) {
  using Acc = acc_t<T>;
  for (int64_t p = 0; p < half; ++p) {
    const int64_t fu = interleaved ? 2 * p : p;
    const int64_t fv = interleaved ? 2 * p + 1 : p + half;
    const Acc u = static_cast<Acc>(x[fu * xd]);
    const Acc v = static_cast<Acc>(x[fv * xd]);
    y[fu * yd] = static_cast<T>(m.m00[p] * u + m.m01[p] * v);
    y[fv * yd] = static_cast<T>(m.m10[p] * u + m.m11[p] * v);
  }
}

template <typename T, typename C>
void run(const RopeCosSinLaunch& l) {
  using Acc = acc_t<T>;
  const int64_t half = l.R / 2;
  const int64_t padded = (half + 2 * step_of<T>() - 1) / step_of<T>() * step_of<T>();
  const int64_t heads = l.Hq + l.Hk;
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(1, heads * l.D));
  at::parallel_for(0, l.B * l.S, grain, [&](int64_t begin, int64_t end) {
    Coeffs<Acc> m;
    for (auto* v : {&m.m00, &m.m01, &m.m10, &m.m11}) v->assign(padded, Acc(0));
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b = g / l.S, s = g % l.S;
      fill_coeffs<T, C>(l, b, s, m);
      for (int64_t r = 0; r < heads; ++r) {
        const bool is_q = r < l.Hq;
        const int64_t h = is_q ? r : r - l.Hq;
        const int64_t* xs = is_q ? l.q_strides : l.k_strides;
        const int64_t* ys = is_q ? l.yq_strides : l.yk_strides;
        const T* x = static_cast<const T*>(is_q ? l.q : l.k) + b * xs[0] + h * xs[1] + s * xs[2];
        T* y = static_cast<T*>(is_q ? l.yq : l.yk) + b * ys[0] + h * ys[1] + s * ys[2];
        if (!l.interleaved && xs[3] == 1 && ys[3] == 1)
          row_half_split_simd<T>(x, y, half, m);
        else
          row_scalar<T>(x, xs[3], y, ys[3], half, l.interleaved, m);
        if (xs[3] == 1 && ys[3] == 1)
          std::copy(x + l.R, x + l.D, y + l.R);
        else
          for (int64_t d = l.R; d < l.D; ++d) y[d * ys[3]] = x[d * xs[3]];
      }
    }
  });
}
}  // namespace

void rope_cos_sin_cpu(const RopeCosSinLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.table_element == l.element)
      run<T, T>(l);
    else if (l.table_element == ElementKind::F32)
      run<T, float>(l);
    else
      fail(PlanErrorKind::Internal, "rope_cos_sin", "cos/sin dtype is neither float32 nor x's");
  });
}

}  // namespace baracuda::kernels
