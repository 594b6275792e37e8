// What the scalar and AVX2 CPU RMSNorm kernels share: the row walks (forward: parallel
// over row groups; backward: over fixed blocks of rows, each summing its dw (db) partial
// into its workspace row), the column sum of those partials, and the (x, weight, output)
// dtype dispatch. The plain ops have one row group a row (g = 0).
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/rmsnorm_math.h"

namespace baracuda::kernels::cpu {

template <typename Acc>
Acc rms_norm_eps(const RmsNormLaunch& l) {
  return std::is_same_v<Acc, double> ? static_cast<Acc>(l.eps64) : static_cast<Acc>(l.eps);
}

template <typename Acc>
Acc rms_norm_inv_cols(const RmsNormLaunch& l) {
  return std::is_same_v<Acc, double> ? static_cast<Acc>(l.inv_cols64)
                                     : static_cast<Acc>(l.inv_cols);
}

inline int64_t rms_norm_grain(const RmsNormLaunch& l) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(l.cols, 1));
}

inline void rms_norm_offsets(const RmsNormLaunch& l, int n, int64_t row, int64_t* off) {
  rms_norm_row_offsets(l.lead.rank, l.lead.sizes.data(), &l.lead.strides[0][0], n, row, off);
}

// f(row, g, offsets of the n input operands) for row group g of each row, row groups in
// parallel.
template <typename F>
void for_each_row_group(const RmsNormLaunch& l, int n, F&& f) {
  const int64_t groups = l.ngroups;
  at::parallel_for(0, l.rows * groups, rms_norm_grain(l), [&](int64_t begin, int64_t end) {
    int64_t off[kMaxOperands];
    for (int64_t rg = begin; rg < end; ++rg) {
      const int64_t row = rg / groups, g = rg % groups;
      if (g == 0 || rg == begin) rms_norm_offsets(l, n, row, off);
      f(row, g, off);
    }
  });
}

// The backward's walk: f(row, g, offsets, dw_part, db_part), where dw_part and db_part are
// the zeroed workspace rows [ngroups·cols] of the row's block (null without a weight, a
// bias). Block b of l.dw_blocks holds rows [b·rows/B, (b+1)·rows/B), in order, each with
// its row groups in order.
template <typename Acc, typename F>
void for_each_backward_row(const RmsNormLaunch& l, F&& f) {
  if (!l.has_weight)
    return for_each_row_group(l, 4, [&](int64_t row, int64_t g, const int64_t* off) {
      f(row, g, off, static_cast<Acc*>(nullptr), static_cast<Acc*>(nullptr));
    });
  Acc* ws = static_cast<Acc*>(l.workspace);
  const int64_t blocks = l.dw_blocks, width = l.width();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    int64_t off[kMaxOperands];
    for (int64_t b = b0; b < b1; ++b) {
      Acc* part = ws + b * width;
      Acc* db_part = l.has_bias ? ws + (blocks + b) * width : nullptr;
      std::fill(part, part + width, Acc(0));
      if (db_part) std::fill(db_part, db_part + width, Acc(0));
      for (int64_t row = b * l.rows / blocks; row < (b + 1) * l.rows / blocks; ++row) {
        rms_norm_offsets(l, 4, row, off);
        for (int64_t g = 0; g < l.ngroups; ++g) f(row, g, off, part, db_part);
      }
    }
  });
}

// out[j] = Σ_b partials[b][j] over the backward's blocks, in order, in W (zeros without
// rows).
template <typename Acc, typename W>
void sum_partials(const RmsNormLaunch& l, const Acc* partials, W* out) {
  const int64_t width = l.width();
  at::parallel_for(0, width, kGrain / std::max<int64_t>(l.dw_blocks, 1) + 1,
                   [&](int64_t c0, int64_t c1) {
                     for (int64_t j = c0; j < c1; ++j) {
                       Acc s = 0;
                       for (int64_t b = 0; b < l.dw_blocks; ++b) s += partials[b * width + j];
                       out[j] = static_cast<W>(s);
                     }
                   });
}

// dw (and db) from their partial rows, in the weight's dtype.
template <typename Acc, typename W>
void sum_dw_partials(const RmsNormLaunch& l) {
  if (!l.has_weight) return;
  const Acc* ws = static_cast<const Acc*>(l.workspace);
  sum_partials(l, ws, static_cast<W*>(l.dw));
  if (l.has_bias) sum_partials(l, ws + l.dw_blocks * l.width(), static_cast<W*>(l.db));
}

// f(T{}, W{}, O{}) with the C++ types of x, the weight and the output.
template <typename F>
void dispatch_rms_norm(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_types(l, [](ElementKind e, auto&& g) { dispatch_floating(e, g); }, f);
}

}  // namespace baracuda::kernels::cpu
