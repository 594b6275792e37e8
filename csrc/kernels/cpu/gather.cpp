// CPU gather kernels. Forward: one strided loop over the coalesced index space. Backward:
// each line (every coordinate but dim) is reduced by one thread, in index order, into a
// float32 (float64 for float64) line buffer, then written to dsrc: deterministic, and the
// same order as the CUDA sorted kernel (ascending source position per dsrc element).
// Every index is checked against [0, size(dim)) before it is used.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/gather.h"

namespace baracuda::kernels {

namespace {
using cpu::acc_t;

inline bool in_range(int64_t v, int64_t size) {
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(size);
}

// One run of n elements whose index and out are unit-stride and whose src advances by
// SrcStep (0: the run is along dim itself, 1: along a dim after it) per element. The
// indices are checked in a pass of their own, so the gather loop has no branch: v lies in
// [0, size) exactly when neither v nor size − 1 − v has its sign bit (as unsigned 64-bit
// values, so nothing overflows), one OR a lane, which the compiler vectorizes (a compare
// and a flag a lane did not).
template <int SrcStep, typename T, typename I>
void forward_unit_run(const I* idx, T* out, const T* src, int64_t n, const GatherLaunch& l) {
  const uint64_t top = static_cast<uint64_t>(l.dim_size) - 1;
  uint64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(idx[i]));
    acc |= u | (top - u);
  }
  if (acc >> 63)
    for (int64_t i = 0; i < n; ++i)
      if (!in_range(static_cast<int64_t>(idx[i]), l.dim_size))
        fail_index_out_of_bounds("gather", idx[i], l.dim, l.dim_size);
  const int64_t ds = l.dim_stride;
  if constexpr (SrcStep == 0) {
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
    if (ds == 1 && n * kLine >= l.dim_size)
      for (int64_t j = 0; j < l.dim_size; j += kLine) __builtin_prefetch(src + j);
  }
  for (int64_t i = 0; i < n; ++i) out[i] = src[i * SrcStep + static_cast<int64_t>(idx[i]) * ds];
}

template <typename T, typename I>
void forward(const GatherLaunch& l) {
  const I* index = static_cast<const I*>(l.index);
  const T* src = static_cast<const T*>(l.value);
  T* out = static_cast<T*>(l.out);
  const int last = l.dims.rank - 1;
  const int64_t si = l.dims.strides[0][last], so = l.dims.strides[1][last],
                ss = l.dims.strides[2][last];
  const bool unit = si == 1 && so == 1;
  cpu::parallel_for_each_run<3>(l.dims, [&](const int64_t* off, int64_t n) {
    const I* idx = index + off[0];
    if (unit && ss == 0) return forward_unit_run<0>(idx, out + off[1], src + off[2], n, l);
    if (unit && ss == 1) return forward_unit_run<1>(idx, out + off[1], src + off[2], n, l);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = static_cast<int64_t>(index[off[0] + i * si]);
      if (!in_range(v, l.dim_size)) fail_index_out_of_bounds("gather", v, l.dim, l.dim_size);
      out[off[1] + i * so] = src[off[2] + i * ss + v * l.dim_stride];
    }
  });
}

template <typename T, typename I>
void backward(const GatherLaunch& l) {
  using Acc = acc_t<T>;
  const I* index = static_cast<const I*>(l.index);
  const T* dout = static_cast<const T*>(l.value);
  T* dsrc = static_cast<T*>(l.out);
  auto zero_dsrc = [&] {  // in contiguous ranges per thread
    at::parallel_for(0, l.out_numel, cpu::kGrain, [&](int64_t b, int64_t e) {
      std::fill(dsrc + b, dsrc + e, T(0));
    });
  };

  if (l.zero_fill) zero_dsrc();  // lines outside index's extent get nothing
  if (l.numel == 0) return;

  int64_t num_lines = 1;
  for (int d = 0; d < l.lines.rank; ++d) num_lines *= l.lines.sizes[d];
  const int last = l.lines.rank - 1;
  const int64_t si = l.lines.strides[0][last], sd = l.lines.strides[1][last],
                sx = l.lines.strides[2][last];
  const int64_t size = l.dim_size;
  const int64_t lines_inner = l.lines.sizes[last];
  constexpr int64_t kBlock = 64;  // lines per block: four 64-byte float32 accumulator lines
  const bool blocked = lines_inner > 1 && si == 1 && sd == 1 && sx == 1 &&
                       size * kBlock * static_cast<int64_t>(sizeof(Acc)) <= (int64_t(4) << 20);
  if (blocked) {
    // Each block writes a short run into every row of dsrc, so its threads would
    // page-fault the same fresh pages at once: zeroed first, each thread faults a range
    // of its own (on 16 cores that contention made this path 1.1-1.5x eager's
    // scatter_add; zeroed first, 0.5-0.6x).
    if (!l.zero_fill) zero_dsrc();
    // Adjacent lines are adjacent in memory (gather along a dim that is not the innermost,
    // e.g. dim 0 of a row-major matrix): kBlock lines at a time, walking index and dout
    // row by row (contiguous runs of kBlock) into a [size, kBlock] accumulator that stays
    // in cache, then writing kBlock-wide runs of dsrc. Each dsrc element still sums its
    // contributions in ascending position along dim, as the per-line loop below does.
    const int64_t blocks_per_row = (lines_inner + kBlock - 1) / kBlock;
    const int64_t outer = num_lines / lines_inner;
    const int64_t grain =
        std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(l.line_len * kBlock, 1));
    at::parallel_for(0, outer * blocks_per_row, grain, [&](int64_t begin, int64_t end) {
      std::vector<Acc> acc(static_cast<size_t>(size * kBlock));
      for (int64_t t = begin; t < end; ++t) {
        const int64_t r = t / blocks_per_row;
        const int64_t c0 = (t % blocks_per_row) * kBlock;
        const int64_t w = std::min(kBlock, lines_inner - c0);
        int64_t off[3] = {c0, c0, c0};
        int64_t rest = r;
        for (int d = last - 1; d >= 0; --d) {
          const int64_t c = rest % l.lines.sizes[d];
          rest /= l.lines.sizes[d];
          for (int k = 0; k < 3; ++k) off[k] += c * l.lines.strides[k][d];
        }
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j < l.line_len; ++j) {
          const I* idx = index + off[0] + j * l.index_line_stride;
          const T* g = dout + off[1] + j * l.dout_line_stride;
          for (int64_t c = 0; c < w; ++c) {
            const int64_t v = static_cast<int64_t>(idx[c]);
            if (!in_range(v, size)) fail_index_out_of_bounds("gather_backward", v, l.dim, size);
            acc[v * kBlock + c] += static_cast<Acc>(g[c]);
          }
        }
        for (int64_t s = 0; s < size; ++s) {
          T* dst = dsrc + off[2] + s * l.dim_stride;
          for (int64_t c = 0; c < w; ++c) dst[c] = T(acc[s * kBlock + c]);
        }
      }
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(l.line_len, 1));
  at::parallel_for(0, num_lines, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(static_cast<size_t>(size));
    cpu::for_each_run<3>(l.lines, begin, end, [&](const int64_t* off, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const I* idx = index + off[0] + i * si;
        const T* g = dout + off[1] + i * sd;
        T* line = dsrc + off[2] + i * sx;
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j < l.line_len; ++j) {
          const int64_t v = static_cast<int64_t>(idx[j * l.index_line_stride]);
          if (!in_range(v, size)) fail_index_out_of_bounds("gather_backward", v, l.dim, size);
          acc[v] += static_cast<Acc>(g[j * l.dout_line_stride]);
        }
        for (int64_t s = 0; s < size; ++s) line[s * l.dim_stride] = T(acc[s]);
      }
    });
  });
}

template <typename T>
void dispatch_index(const GatherLaunch& l) {
  if (l.index_element == ElementKind::I32) {
    if (l.backward)
      backward<T, int32_t>(l);
    else
      forward<T, int32_t>(l);
  } else {
    if (l.backward)
      backward<T, int64_t>(l);
    else
      forward<T, int64_t>(l);
  }
}
}  // namespace

void gather_cpu(const GatherLaunch& l) {
  cpu::dispatch_floating(l.element, [&](auto tag) { dispatch_index<decltype(tag)>(l); });
}

}  // namespace baracuda::kernels
