// What the scalar and AVX2 CPU RMSNorm kernels share: the row walks (forward: parallel
// over rows; backward: over fixed blocks of rows, each summing its dw partial into its
// workspace row), the column sum of those partials, and the (x, weight, output) dtype
// dispatch.
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

// f(row, offsets of the n input operands), rows in parallel.
template <typename F>
void for_each_row(const RmsNormLaunch& l, int n, F&& f) {
  at::parallel_for(0, l.rows, rms_norm_grain(l), [&](int64_t begin, int64_t end) {
    int64_t off[kMaxOperands];
    for (int64_t row = begin; row < end; ++row) {
      rms_norm_offsets(l, n, row, off);
      f(row, off);
    }
  });
}

// The backward's walk: f(row, offsets, dw_part), where dw_part is the zeroed workspace row
// [cols] of the row's block (null without a weight). Block b of l.dw_blocks holds rows
// [b·rows/B, (b+1)·rows/B), in order.
template <typename Acc, typename F>
void for_each_backward_row(const RmsNormLaunch& l, F&& f) {
  if (!l.has_weight) return for_each_row(l, 4, [&](int64_t row, const int64_t* off) {
    f(row, off, static_cast<Acc*>(nullptr));
  });
  Acc* ws = static_cast<Acc*>(l.workspace);
  const int64_t blocks = l.dw_blocks;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    int64_t off[kMaxOperands];
    for (int64_t b = b0; b < b1; ++b) {
      Acc* part = ws + b * l.cols;
      std::fill(part, part + l.cols, Acc(0));
      for (int64_t row = b * l.rows / blocks; row < (b + 1) * l.rows / blocks; ++row) {
        rms_norm_offsets(l, 4, row, off);
        f(row, off, part);
      }
    }
  });
}

// dw[j] = Σ_b partial[b][j], blocks in order, in the weight's dtype (zeros without rows).
template <typename Acc, typename W>
void sum_dw_partials(const RmsNormLaunch& l) {
  if (!l.has_weight) return;
  const Acc* ws = static_cast<const Acc*>(l.workspace);
  W* dw = static_cast<W*>(l.dw);
  at::parallel_for(0, l.cols, kGrain / std::max<int64_t>(l.dw_blocks, 1) + 1,
                   [&](int64_t c0, int64_t c1) {
                     for (int64_t j = c0; j < c1; ++j) {
                       Acc s = 0;
                       for (int64_t b = 0; b < l.dw_blocks; ++b) s += ws[b * l.cols + j];
                       dw[j] = static_cast<W>(s);
                     }
                   });
}

// f(T{}, W{}, O{}) with the C++ types of x, the weight and the output.
template <typename F>
void dispatch_rms_norm(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_types(l, [](ElementKind e, auto&& g) { dispatch_floating(e, g); }, f);
}

}  // namespace baracuda::kernels::cpu
