// CPU iteration helpers shared by the CPU kernels: element types, and walking a
// coalesced strided index space in parallel chunks.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "core/plan.h"

namespace baracuda::kernels::cpu {

// float for float32/float16/bfloat16, double for float64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls f(T-typed tag) with the C++ type of a floating ElementKind.
template <typename F>
void dispatch_floating(ElementKind e, F&& f) {
  switch (e) {
    case ElementKind::F32: f(float{}); return;
    case ElementKind::F64: f(double{}); return;
    case ElementKind::F16: f(c10::Half{}); return;
    case ElementKind::BF16: f(c10::BFloat16{}); return;
    default: fail(PlanErrorKind::Internal, "cpu", "non-floating element reached a kernel");
  }
}

constexpr int64_t kGrain = 16384;

// Walks elements [begin, end) of the row-major index space `dims`, calling
// f(offsets, n) for each run of n consecutive elements along the innermost dim;
// offsets[k] is operand k's element offset at the run's start, and operand k advances
// by dims.strides[k][rank-1] per element.
template <int NOps, typename F>
void for_each_run(const CoalescedDims& dims, int64_t begin, int64_t end, F&& f) {
  const int r = dims.rank;
  const int64_t inner = dims.sizes[r - 1];
  int64_t coord[kMaxRank] = {};
  int64_t rest = begin / inner;
  int64_t col = begin % inner;
  for (int d = r - 2; d >= 0; --d) {
    coord[d] = rest % dims.sizes[d];
    rest /= dims.sizes[d];
  }
  int64_t i = begin;
  while (i < end) {
    int64_t off[NOps];
    for (int k = 0; k < NOps; ++k) {
      int64_t o = col * dims.strides[k][r - 1];
      for (int d = 0; d < r - 1; ++d) o += coord[d] * dims.strides[k][d];
      off[k] = o;
    }
    const int64_t n = std::min(inner - col, end - i);
    f(off, n);
    i += n;
    col = 0;
    for (int d = r - 2; d >= 0; --d) {
      if (++coord[d] < dims.sizes[d]) break;
      coord[d] = 0;
    }
  }
}

// Parallel version over the whole index space.
template <int NOps, typename F>
void parallel_for_each_run(const CoalescedDims& dims, F&& f) {
  int64_t numel = 1;
  for (int d = 0; d < dims.rank; ++d) numel *= dims.sizes[d];
  at::parallel_for(0, numel, kGrain,
                   [&](int64_t b, int64_t e) { for_each_run<NOps>(dims, b, e, f); });
}

}  // namespace baracuda::kernels::cpu
