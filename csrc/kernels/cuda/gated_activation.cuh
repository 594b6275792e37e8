// CUDA gated-activation kernels, forward and backward.
//
// Both ops: gated_activation (a and b halves of one tensor x) and gated_activation_pair
// (b = gate, a = up, separate tensors; dgate and dup separate outputs): the value operand
// a has its own base pointer and strides, and da its own base pointer (see
// GatedActivationLaunch).
//
// Rows layout (contiguous tensors, and row slices of them): the output index space is
// [rows, cols] with unit inner stride everywhere; each thread handles kUnroll vectors of
// V elements (16 bytes when the plan allows), issuing all loads before any math so that
// enough bytes are in flight to saturate HBM. Strided layout: one element per thread,
// offsets from the coalesced coordinates.
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/gated_activation.h"
#include "kernels/gated_activation_math.h"

namespace baracuda::kernels::cuda {

// Hardware exp/reciprocal approximations for the half types (see gated_activation_math.h).
template <typename T>
constexpr bool kFast = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

constexpr int kGatedThreads = 256;
// Vectors per thread: measured on an H200 at [16384, 22016] (benchmarks/tune): bf16 is
// fastest with 2 (1.03x / 1.01x copy fwd / bwd; 4 drops to 0.87x from register
// pressure), float32 with 1.
template <typename T>
constexpr int kGatedUnroll = sizeof(T) == 2 ? 2 : 1;

template <typename Idx>
struct GatedRowsParams {
  Idx total_vecs;        // rows * cols / V
  FastDivmod vecs_per_row;  // used when Idx is 32-bit
  Idx vecs_per_row_n;
  Idx x_row, out_row, dy_row, a_row;  // row strides in elements (a: the value operand)
  Idx x_a, x_b, out_a, out_b;  // half offsets in elements
  const void* x;
  const void* a;   // the value operand: x, or up in the pair op
  const void* dy;
  void* out;
  void* out_da;    // where da goes: out, or dup in the pair op's backward
};

template <typename T, GatedKind K, bool BW, int V, typename Idx, int kUnroll = kGatedUnroll<T>>
__global__ void __launch_bounds__(kGatedThreads)
    gated_activation_rows_kernel(const GatedRowsParams<Idx> p) {
  using Acc = acc_t<T>;
  const T* x = static_cast<const T*>(p.x);
  const T* xa = static_cast<const T*>(p.a);
  const T* dy = static_cast<const T*>(p.dy);
  T* out = static_cast<T*>(p.out);
  T* out_da = static_cast<T*>(p.out_da);

  const Idx base = static_cast<Idx>(blockIdx.x) * (kGatedThreads * kUnroll) + threadIdx.x;
  Pack<T, V> a[kUnroll], b[kUnroll], g[kUnroll];
  Idx out_off[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const Idx v = base + u * kGatedThreads;
    if (v < p.total_vecs) {
      Idx row;
      if constexpr (sizeof(Idx) == 4)
        row = p.vecs_per_row.div(v);
      else
        row = v / p.vecs_per_row_n;
      const Idx col = (v - row * p.vecs_per_row_n) * V;
      out_off[u] = row * p.out_row + col;
      a[u] = load_pack<T, V>(xa + (row * p.a_row + col) + p.x_a);
      b[u] = load_pack<T, V>(x + (row * p.x_row + col) + p.x_b);
      if constexpr (BW) g[u] = load_pack<T, V>(dy + row * p.dy_row + col);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (base + u * kGatedThreads < p.total_vecs) {
      if constexpr (BW) {
        Pack<T, V> da, db;
#pragma unroll
        for (int i = 0; i < V; ++i) {
          Acc ga, gb;
          gated_backward<K, kFast<T>>(to_acc(g[u].v[i]), to_acc(a[u].v[i]), to_acc(b[u].v[i]), ga, gb);
          da.v[i] = from_acc<T>(ga);
          db.v[i] = from_acc<T>(gb);
        }
        store_pack<T, V>(out_da + out_off[u] + p.out_a, da);
        store_pack<T, V>(out + out_off[u] + p.out_b, db);
      } else {
        Pack<T, V> y;
#pragma unroll
        for (int i = 0; i < V; ++i)
          y.v[i] = from_acc<T>(gated_forward<K, kFast<T>>(to_acc(a[u].v[i]), to_acc(b[u].v[i])));
        store_pack<T, V>(out + out_off[u], y);
      }
    }
  }
}

template <typename Idx>
struct GatedStridedParams {
  Idx numel;
  int rank;
  Idx sizes[kMaxRank];
  Idx strides[4][kMaxRank];  // x, out, dy, a (the value operand; x's in the single op)
  Idx x_a, x_b, out_a, out_b;
  const void* x;
  const void* a;
  const void* dy;
  void* out;
  void* out_da;
};

template <typename T, GatedKind K, bool BW, typename Idx>
__global__ void __launch_bounds__(kGatedThreads)
    gated_activation_strided_kernel(const GatedStridedParams<Idx> p) {
  using Acc = acc_t<T>;
  const Idx i = static_cast<Idx>(blockIdx.x) * kGatedThreads + threadIdx.x;
  if (i >= p.numel) return;
  Idx rest = i, ox = 0, oo = 0, od = 0, oa = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d < p.rank) {
      const Idx c = rest % p.sizes[d];
      rest /= p.sizes[d];
      ox += c * p.strides[0][d];
      oo += c * p.strides[1][d];
      oa += c * p.strides[3][d];
      if constexpr (BW) od += c * p.strides[2][d];
    }
  }
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const Acc a = to_acc(static_cast<const T*>(p.a)[oa + p.x_a]);
  const Acc b = to_acc(x[ox + p.x_b]);
  if constexpr (BW) {
    const Acc g = to_acc(static_cast<const T*>(p.dy)[od]);
    Acc ga, gb;
    gated_backward<K, kFast<T>>(g, a, b, ga, gb);
    static_cast<T*>(p.out_da)[oo + p.out_a] = from_acc<T>(ga);
    out[oo + p.out_b] = from_acc<T>(gb);
  } else {
    out[oo] = from_acc<T>(gated_forward<K, kFast<T>>(a, b));
  }
}

template <typename T, GatedKind K, bool BW, typename Idx>
void launch_rows(const GatedActivationLaunch& l, cudaStream_t stream) {
  const CoalescedDims& d = l.dims;
  const bool two = d.rank == 2;
  const int64_t cols = d.sizes[d.rank - 1];
  const int64_t rows = two ? d.sizes[0] : 1;
  GatedRowsParams<Idx> p;
  p.vecs_per_row_n = static_cast<Idx>(cols / l.vec);
  p.vecs_per_row = FastDivmod(static_cast<uint32_t>(sizeof(Idx) == 4 ? cols / l.vec : 1));
  p.total_vecs = static_cast<Idx>(rows * (cols / l.vec));
  p.x_row = static_cast<Idx>(two ? d.strides[0][0] : 0);
  p.out_row = static_cast<Idx>(two ? d.strides[1][0] : 0);
  p.dy_row = static_cast<Idx>(two && BW ? d.strides[2][0] : 0);
  p.a_row = static_cast<Idx>(two ? d.strides[l.a_operand()][0] : 0);
  p.x_a = static_cast<Idx>(l.x_a_offset);
  p.x_b = static_cast<Idx>(l.x_b_offset);
  p.out_a = static_cast<Idx>(l.out_a_offset);
  p.out_b = static_cast<Idx>(l.out_b_offset);
  p.x = l.x;
  p.a = l.a;
  p.dy = l.dy;
  p.out = l.out;
  p.out_da = l.out_a;
  const unsigned int blocks = blocks_for(rows * (cols / l.vec), kGatedThreads * kGatedUnroll<T>);
  constexpr int kVec = 16 / sizeof(T);
  if (l.vec == kVec)
    gated_activation_rows_kernel<T, K, BW, kVec, Idx><<<blocks, kGatedThreads, 0, stream>>>(p);
  else
    gated_activation_rows_kernel<T, K, BW, 1, Idx><<<blocks, kGatedThreads, 0, stream>>>(p);
}

template <typename T, GatedKind K, bool BW, typename Idx>
void launch_strided(const GatedActivationLaunch& l, cudaStream_t stream) {
  const CoalescedDims& d = l.dims;
  GatedStridedParams<Idx> p;
  int64_t numel = 1;
  p.rank = d.rank;
  for (int i = 0; i < kMaxRank; ++i) {
    p.sizes[i] = static_cast<Idx>(i < d.rank ? d.sizes[i] : 1);
    for (int k = 0; k < 3; ++k) p.strides[k][i] = static_cast<Idx>(i < d.rank ? d.strides[k][i] : 0);
    p.strides[3][i] = static_cast<Idx>(i < d.rank ? d.strides[l.a_operand()][i] : 0);
    if (i < d.rank) numel *= d.sizes[i];
  }
  p.numel = static_cast<Idx>(numel);
  p.x_a = static_cast<Idx>(l.x_a_offset);
  p.x_b = static_cast<Idx>(l.x_b_offset);
  p.out_a = static_cast<Idx>(l.out_a_offset);
  p.out_b = static_cast<Idx>(l.out_b_offset);
  p.x = l.x;
  p.a = l.a;
  p.dy = l.dy;
  p.out = l.out;
  p.out_da = l.out_a;
  gated_activation_strided_kernel<T, K, BW, Idx>
      <<<blocks_for(numel, kGatedThreads), kGatedThreads, 0, stream>>>(p);
}

// Instantiated once per direction (gated_activation_{forward,backward}.cu) so the two
// halves compile in parallel.
template <bool BW>
void launch_gated_activation(const GatedActivationLaunch& l, cudaStream_t stream) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    auto go = [&](auto kind_tag) {
      constexpr GatedKind K = decltype(kind_tag)::value;
      if (l.layout == GatedLayout::Rows) {
        if (l.index64)
          launch_rows<T, K, BW, int64_t>(l, stream);
        else
          launch_rows<T, K, BW, uint32_t>(l, stream);
      } else {
        if (l.index64)
          launch_strided<T, K, BW, int64_t>(l, stream);
        else
          launch_strided<T, K, BW, uint32_t>(l, stream);
      }
    };
    with_gated_kind(l.kind, go);
  });
  check_launch(l.pair ? (BW ? "gated_activation_pair_backward" : "gated_activation_pair")
                      : (BW ? "gated_activation_backward" : "gated_activation"));
}

// The backward's instantiations, compiled in their own translation unit
// (gated_activation_backward.cu).
void launch_gated_activation_backward(const GatedActivationLaunch& l, cudaStream_t stream);

}  // namespace baracuda::kernels::cuda
