// CUDA lerp kernels: lerp and lerp.Tensor (forward), lerp_backward and
// lerp_backward.Tensor (every gradient in one pass).
//
// The index space is the output shape, coalesced; every output is dense over it, so an
// output's offset is the linear index. Rows layout: [rows, cols] where each input has
// inner stride 1 (read as vectors of V elements, 16 bytes when the plan allows) or 0
// (one value per row, splat across the vector, e.g. a weight of shape [M, 1]); each
// thread handles kLerpUnroll<T, Op> vectors and issues all loads before any math so that enough
// bytes are in flight to saturate HBM. Strided layout: one element per thread, input
// offsets from the coalesced coordinates (broadcast dims have stride 0).
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/lerp.h"
#include "kernels/lerp_math.h"

namespace baracuda::kernels::cuda {

constexpr int kLerpThreads = 256;
// Vectors per thread in the rows kernel, as measured on an H200 at 2^28 elements
// (benchmarks/tune/tune_lerp_rows.cu): 2 for the 2-byte scalar-weight forward, else 1
// (the bf16 scalar-weight backward measured 392.6 us with 1, 397.0 with 2).
template <typename T, LerpOp Op>
constexpr int kLerpUnroll = sizeof(T) == 2 && Op == LerpOp::Forward ? 2 : 1;

template <typename Idx>
struct LerpRowsParams {
  Idx total_vecs;            // rows * cols / V
  Idx vecs_per_row_n;        // cols / V
  FastDivmod vecs_per_row;   // the same, for 32-bit division
  bool one_row;              // rows == 1: no division at all
  Idx row_stride[kMaxOperands];  // per input, in elements
  bool unit[kMaxOperands];       // per input: inner stride 1 (else 0)
  double w, one_minus_w;
  const void* in[kMaxOperands];
  void* out[3];
};

template <typename T, LerpOp Op, int V, typename Idx, int U = kLerpUnroll<T, Op>>
__global__ void __launch_bounds__(kLerpThreads) lerp_rows_kernel(const LerpRowsParams<Idx> p) {
  using Acc = acc_t<T>;
  constexpr int NI = kLerpInputs<Op>;
  constexpr int NO = kLerpOutputs<Op>;
  const LerpScalars<Acc> s{static_cast<Acc>(p.w), static_cast<Acc>(p.one_minus_w)};

  const Idx base = static_cast<Idx>(blockIdx.x) * (kLerpThreads * U) + threadIdx.x;
  Pack<T, V> x[U][NI];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const Idx v = base + u * kLerpThreads;
    if (v < p.total_vecs) {
      Idx row = 0, col = v * V;
      if (!p.one_row) {
        if constexpr (sizeof(Idx) == 4)
          row = p.vecs_per_row.div(v);
        else
          row = v / p.vecs_per_row_n;
        col = (v - row * p.vecs_per_row_n) * V;
      }
#pragma unroll
      for (int k = 0; k < NI; ++k) {
        const T* src = static_cast<const T*>(p.in[k]) + row * p.row_stride[k];
        if (p.unit[k]) {
          x[u][k] = load_pack<T, V>(src + col);
        } else {
          const T val = src[0];
#pragma unroll
          for (int i = 0; i < V; ++i) x[u][k].v[i] = val;
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const Idx v = base + u * kLerpThreads;
    if (v < p.total_vecs) {
      Pack<T, V> y[NO];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        Acc xi[NI], yi[NO];
#pragma unroll
        for (int k = 0; k < NI; ++k) xi[k] = to_acc(x[u][k].v[i]);
        lerp_element<Op>(xi, s, yi);
#pragma unroll
        for (int j = 0; j < NO; ++j) y[j].v[i] = from_acc<T>(yi[j]);
      }
#pragma unroll
      for (int j = 0; j < NO; ++j) store_pack<T, V>(static_cast<T*>(p.out[j]) + v * V, y[j]);
    }
  }
}

template <typename Idx>
struct LerpStridedParams {
  Idx numel;
  int rank;
  Idx sizes[kMaxRank];
  FastDivmod divs[kMaxRank];  // sizes, for 32-bit division
  Idx strides[kMaxOperands][kMaxRank];
  double w, one_minus_w;
  const void* in[kMaxOperands];
  void* out[3];
};

template <typename T, LerpOp Op, typename Idx>
__global__ void __launch_bounds__(kLerpThreads)
    lerp_strided_kernel(const LerpStridedParams<Idx> p) {
  using Acc = acc_t<T>;
  constexpr int NI = kLerpInputs<Op>;
  constexpr int NO = kLerpOutputs<Op>;
  const Idx i = static_cast<Idx>(blockIdx.x) * kLerpThreads + threadIdx.x;
  if (i >= p.numel) return;
  Idx rest = i;
  Idx off[NI] = {};
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d < p.rank) {
      const Idx c = peel_coord(rest, p.divs[d], p.sizes[d]);
#pragma unroll
      for (int k = 0; k < NI; ++k) off[k] += c * p.strides[k][d];
    }
  }
  const LerpScalars<Acc> s{static_cast<Acc>(p.w), static_cast<Acc>(p.one_minus_w)};
  Acc xi[NI], yi[NO];
#pragma unroll
  for (int k = 0; k < NI; ++k) xi[k] = to_acc(static_cast<const T*>(p.in[k])[off[k]]);
  lerp_element<Op>(xi, s, yi);
#pragma unroll
  for (int j = 0; j < NO; ++j) static_cast<T*>(p.out[j])[i] = from_acc<T>(yi[j]);
}

template <typename T, LerpOp Op, typename Idx>
void launch_rows(const LerpLaunch& l, cudaStream_t stream) {
  constexpr int NI = kLerpInputs<Op>;
  const CoalescedDims& d = l.dims;
  const bool two = d.rank == 2;
  const int64_t cols = d.sizes[d.rank - 1];
  const int64_t rows = two ? d.sizes[0] : 1;
  const int64_t vecs_per_row = cols / l.vec;
  LerpRowsParams<Idx> p{};
  p.total_vecs = static_cast<Idx>(rows * vecs_per_row);
  p.vecs_per_row_n = static_cast<Idx>(vecs_per_row);
  p.vecs_per_row = FastDivmod(static_cast<uint32_t>(sizeof(Idx) == 4 ? vecs_per_row : 1));
  p.one_row = rows == 1;
  for (int k = 0; k < NI; ++k) {
    p.row_stride[k] = static_cast<Idx>(two ? d.strides[k][0] : 0);
    p.unit[k] = d.strides[k][d.rank - 1] == 1;
    p.in[k] = l.in[k];
  }
  p.w = l.weight;
  p.one_minus_w = l.one_minus_w;
  for (int j = 0; j < 3; ++j) p.out[j] = l.out[j];
  const unsigned int blocks = blocks_for(rows * vecs_per_row, kLerpThreads * kLerpUnroll<T, Op>);
  constexpr int kVec = 16 / sizeof(T);
  if (l.vec == kVec)
    lerp_rows_kernel<T, Op, kVec, Idx><<<blocks, kLerpThreads, 0, stream>>>(p);
  else
    lerp_rows_kernel<T, Op, 1, Idx><<<blocks, kLerpThreads, 0, stream>>>(p);
}

template <typename T, LerpOp Op, typename Idx>
void launch_strided(const LerpLaunch& l, cudaStream_t stream) {
  constexpr int NI = kLerpInputs<Op>;
  const CoalescedDims& d = l.dims;
  LerpStridedParams<Idx> p{};
  int64_t numel = 1;
  p.rank = d.rank;
  for (int i = 0; i < kMaxRank; ++i) {
    const int64_t size = i < d.rank ? d.sizes[i] : 1;
    p.sizes[i] = static_cast<Idx>(size);
    p.divs[i] = FastDivmod(static_cast<uint32_t>(sizeof(Idx) == 4 ? size : 1));
    for (int k = 0; k < kMaxOperands; ++k)
      p.strides[k][i] = static_cast<Idx>(i < d.rank && k < NI ? d.strides[k][i] : 0);
    numel *= size;
  }
  p.numel = static_cast<Idx>(numel);
  for (int k = 0; k < NI; ++k) p.in[k] = l.in[k];
  p.w = l.weight;
  p.one_minus_w = l.one_minus_w;
  for (int j = 0; j < 3; ++j) p.out[j] = l.out[j];
  lerp_strided_kernel<T, Op, Idx>
      <<<blocks_for(numel, kLerpThreads), kLerpThreads, 0, stream>>>(p);
}

template <typename T, LerpOp Op>
void launch_op(const LerpLaunch& l, cudaStream_t stream) {
  if (l.layout == LerpLayout::Rows) {
    if (l.index64)
      launch_rows<T, Op, int64_t>(l, stream);
    else
      launch_rows<T, Op, uint32_t>(l, stream);
  } else {
    if (l.index64)
      launch_strided<T, Op, int64_t>(l, stream);
    else
      launch_strided<T, Op, uint32_t>(l, stream);
  }
}

// Instantiated once per direction (lerp_{forward,backward}.cu) so the two halves compile
// in parallel.
template <bool BW>
void launch_lerp(const LerpLaunch& l, cudaStream_t stream) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (BW) {
      if (l.op == LerpOp::Backward)
        launch_op<T, LerpOp::Backward>(l, stream);
      else
        launch_op<T, LerpOp::BackwardTensor>(l, stream);
    } else {
      if (l.op == LerpOp::Forward)
        launch_op<T, LerpOp::Forward>(l, stream);
      else
        launch_op<T, LerpOp::ForwardTensor>(l, stream);
    }
  });
  check_launch(BW ? "lerp_backward" : "lerp");
}

// The backward ops' instantiations, compiled in their own translation unit
// (lerp_backward.cu).
void launch_lerp_backward(const LerpLaunch& l, cudaStream_t stream);

}  // namespace baracuda::kernels::cuda
