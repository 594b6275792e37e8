// CPU RoPE kernels. Positions are taken in blocks of up to kBlock consecutive s (of one
// batch when positions are per-batch); a task is one (block, row), a row one (b, h) (one
// h when positions are per-batch), and rotates the block's positions of that row, which
// in a [B, H, S, D] tensor are consecutive in memory. Tasks are walked in parallel
// chunks, block by block, so a block's cos/sin table is computed once per chunk that
// touches it and reused for all its rows. The rows go to rope_rows.h's kernels: AVX2 for
// unit feature stride (float32/float16/bfloat16), the scalar strided loop otherwise.
#include <algorithm>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/rope_rows.h"
#include "kernels/rope.h"
#include "kernels/rope_math.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

// Positions per block: a block's two tables stay within about 16 KiB (float32).
int64_t block_positions(int64_t table_stride) {
  return std::clamp<int64_t>(2048 / table_stride, 1, 16);
}

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
void rope_blocks(const RopeLaunch& l) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(l.x);
  T* y = static_cast<T*>(l.y);
  const int64_t half = l.R / 2;
  const int64_t ab = cpu::rope_table_stride(l.R);
  const int64_t block = block_positions(ab);
  const int64_t s_blocks = (l.S + block - 1) / block;
  const int64_t nrows = l.per_batch ? l.H : l.B * l.H;  // rows of one block
  const int64_t nblocks = (l.per_batch ? l.B : 1) * s_blocks;
  const auto& xs = l.x_strides;
  const auto& ys = l.y_strides;
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / (block * l.D));
  at::parallel_for(0, nblocks * nrows, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> inv_freq(half);
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(l.base, i, l.R);
    std::vector<Acc> A(block * ab, Acc(0)), B(block * ab, Acc(0));
    int64_t table_block = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t blk = t / nrows, r = t % nrows;
      const int64_t gb = l.per_batch ? blk / s_blocks : 0;
      const int64_t s0 = (blk % s_blocks) * block;
      const int64_t n = std::min(block, l.S - s0);
      if (blk != table_block) {
        for (int64_t k = 0; k < n; ++k) {
          const int64_t s = s0 + k;
          const int64_t p =
              l.has_positions ? l.positions[gb * l.pos_stride_b + s * l.pos_stride_s] : s;
          fill_table<Acc>(l, inv_freq.data(), p, A.data() + k * ab, B.data() + k * ab);
        }
        table_block = blk;
      }
      const int64_t b = l.per_batch ? gb : r / l.H;
      const int64_t h = l.per_batch ? r : r % l.H;
      const T* xr = x + b * xs[0] + h * xs[1] + s0 * xs[2];
      T* yr = y + b * ys[0] + h * ys[1] + s0 * ys[2];
      cpu::rope_rows<T, Acc>(n, xr, xs[2], xs[3], yr, ys[2], ys[3], A.data(), B.data(), ab,
                             l.R, l.D, l.interleaved);
    }
  });
}
}  // namespace

void rope_cpu(const RopeLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) { rope_blocks<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
