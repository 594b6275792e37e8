// CPU RoPE kernels: rope_rows.h's walk over blocks of positions (table groups are batches
// when positions are per-batch [B, S]; rows are (b, h), or h when per-batch), the cos/sin
// table of a block computed once per chunk and reused for all its rows, and its row
// kernels: AVX2 for unit feature stride (float32/float16/bfloat16), the scalar strided
// loop otherwise.
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/rope_rows.h"
#include "kernels/rope.h"
#include "kernels/rope_math.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

// rope_rows.h's coefficients at position p: A = cos θ_i at both features of pair i,
// B = (−sin θ_i, sin θ_i), with −θ in the backward.
template <typename Acc>
void fill_table(const RopeLaunch& l, const double* inv_freq, int64_t p, Acc* A, Acc* B) {
  const int64_t half = l.R / 2;
  for (int64_t i = 0; i < half; ++i) {
    Acc c, s;
    rope_cos_sin(static_cast<double>(p) * inv_freq[i], c, s);
    if (l.backward) s = -s;
    int64_t fu, fv;
    cpu::rope_pair_features(i, half, l.interleaved, fu, fv);
    A[fu] = A[fv] = c;
    B[fu] = -s;
    B[fv] = s;
  }
}

template <typename T>
void run(const RopeLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  T* y = static_cast<T*>(l.y);
  std::vector<double> inv_freq(l.R / 2);
  for (int64_t i = 0; i < l.R / 2; ++i) inv_freq[i] = rope_inv_freq(l.base, i, l.R);
  const auto& xs = l.x_strides;
  const auto& ys = l.y_strides;
  cpu::rope_walk<Acc>(
      l.per_batch ? l.B : 1, l.S, l.per_batch ? l.H : l.B * l.H, l.R, l.D,
      [&](int64_t g, int64_t s, Acc* A, Acc* B) {
        const int64_t p =
            l.has_positions ? l.positions[g * l.pos_stride_b + s * l.pos_stride_s] : s;
        fill_table<Acc>(l, inv_freq.data(), p, A, B);
      },
      [&](int64_t g, int64_t r, int64_t s0, int64_t n, const Acc* A, const Acc* B, int64_t ab) {
        const int64_t b = l.per_batch ? g : r / l.H;
        const int64_t h = l.per_batch ? r : r % l.H;
        cpu::rope_rows<T, Acc>(n, x + b * xs[0] + h * xs[1] + s0 * xs[2], xs[2], xs[3],
                               y + b * ys[0] + h * ys[1] + s0 * ys[2], ys[2], ys[3], A, B, ab,
                               l.R, l.D, l.interleaved);
      });
}
}  // namespace

void rope_cpu(const RopeLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) { run<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
