// The row kernel shared by the CPU RoPE ops (rope from positions and rope from cos/sin).
//
// A row is D features; its first R rotate in R/2 pairs (u, v) at features (fu, fv) =
// (2i, 2i+1) interleaved or (i, i + R/2) half-split, the rest pass through. Each op turns
// its cos/sin into two coefficient arrays of R entries per position, indexed by feature:
//
//   y[fu] = A[fu]·u + B[fu]·v,     y[fv] = A[fv]·v + B[fv]·u
//
// (rope: A = cos θ at both features, B[fu] = −sin θ, B[fv] = sin θ, sin negated in the
// backward). With A and B by feature, an interleaved row is y = A⊙x + B⊙swap(x) (swap:
// adjacent features exchanged) and a half-split row is the same with the halves exchanged,
// so the AVX2 kernel streams a row with one multiply and one fused multiply-add per vector.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/loops.h"

namespace baracuda::kernels::cpu {

// Entries per position of an A or B table: R, rounded up to whole float32 vectors, plus
// one vector step of half-type data (16) of slack, so that the AVX2 kernel loads whole
// vectors of coefficients past a row's last pair. The slack holds zeros.
inline int64_t rope_table_stride(int64_t R) { return (R + 7) / 8 * 8 + 16; }

// Features (fu, fv) of pair i of R/2 = half pairs.
inline void rope_pair_features(int64_t i, int64_t half, bool interleaved, int64_t& fu,
                               int64_t& fv) {
  fu = interleaved ? 2 * i : i;
  fv = interleaved ? 2 * i + 1 : i + half;
}

// The AVX2 row kernel (cpu/rope_avx2.cpp), for float32, float16 and bfloat16 rows of unit
// feature stride: rotates n rows, row k at x + k·x_step into y + k·y_step with the
// coefficients at A + k·ab_step, B + k·ab_step (ab_step = 0: one table for every row).
// Call only when cpu_has_avx2().
template <typename T>
void rope_rows_avx2(int64_t n, const T* x, int64_t x_step, T* y, int64_t y_step,
                    const float* A, const float* B, int64_t ab_step, int64_t R, int64_t D,
                    bool interleaved);

// The same for any feature strides xd and yd, one element at a time, in Acc (float32 for
// the half types, as above; float64 for float64).
template <typename T, typename Acc>
void rope_rows_scalar(int64_t n, const T* x, int64_t x_step, int64_t xd, T* y,
                      int64_t y_step, int64_t yd, const Acc* A, const Acc* B, int64_t ab_step,
                      int64_t R, int64_t D, bool interleaved) {
  const int64_t half = R / 2;
  for (int64_t k = 0; k < n; ++k) {
    const T* xr = x + k * x_step;
    T* yr = y + k * y_step;
    const Acc* a = A + k * ab_step;
    const Acc* b = B + k * ab_step;
    for (int64_t i = 0; i < half; ++i) {
      int64_t fu, fv;
      rope_pair_features(i, half, interleaved, fu, fv);
      const Acc u = static_cast<Acc>(xr[fu * xd]);
      const Acc v = static_cast<Acc>(xr[fv * xd]);
      yr[fu * yd] = T(a[fu] * u + b[fu] * v);
      yr[fv * yd] = T(a[fv] * v + b[fv] * u);
    }
    for (int64_t d = R; d < D; ++d) yr[d * yd] = xr[d * xd];
  }
}

// Rotates n rows (see rope_rows_avx2) on the AVX2 kernel when the rows have unit feature
// stride, the data is not float64 and the processor has AVX2; the scalar loop otherwise.
template <typename T, typename Acc>
void rope_rows(int64_t n, const T* x, int64_t x_step, int64_t xd, T* y, int64_t y_step,
               int64_t yd, const Acc* A, const Acc* B, int64_t ab_step, int64_t R, int64_t D,
               bool interleaved) {
  if constexpr (!std::is_same_v<T, double>) {
    if (xd == 1 && yd == 1 && cpu_has_avx2()) {
      rope_rows_avx2<T>(n, x, x_step, y, y_step, A, B, ab_step, R, D, interleaved);
      return;
    }
  }
  rope_rows_scalar<T, Acc>(n, x, x_step, xd, y, y_step, yd, A, B, ab_step, R, D, interleaved);
}

// The CPU RoPE ops' walk. Positions are taken in blocks of up to 16 consecutive s (fewer
// when R is large: a block's two tables stay within about 16 KiB of float32) of one table
// group g < groups (a batch, when the angles differ between batches; else one group); a
// task is one (g, block, row r < nrows) and rotates the block's positions of that row,
// which in a [B, H, S, D] tensor are consecutive in memory. Tasks are walked in parallel
// chunks, block by block: fill(g, s, A, B) writes position s's coefficients once per
// chunk that touches the block, then rows(g, r, s0, n, A, B, ab_step) rotates row r's
// positions s0 .. s0 + n − 1 (position s0 + k with the coefficients at A + k·ab_step).
template <typename Acc, typename Fill, typename Rows>
void rope_walk(int64_t groups, int64_t S, int64_t nrows, int64_t R, int64_t D, Fill&& fill,
               Rows&& rows) {
  const int64_t ab = rope_table_stride(R);
  const int64_t block = std::clamp<int64_t>(2048 / ab, 1, 16);
  const int64_t s_blocks = (S + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, kGrain / (block * D));
  at::parallel_for(0, groups * s_blocks * nrows, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> A(block * ab, Acc(0)), B(block * ab, Acc(0));
    int64_t table_block = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t blk = t / nrows, r = t % nrows;
      const int64_t g = blk / s_blocks, s0 = (blk % s_blocks) * block;
      const int64_t n = std::min(block, S - s0);
      if (blk != table_block) {
        for (int64_t k = 0; k < n; ++k) fill(g, s0 + k, A.data() + k * ab, B.data() + k * ab);
        table_block = blk;
      }
      rows(g, r, s0, n, A.data(), B.data(), ab);
    }
  });
}

}  // namespace baracuda::kernels::cpu
