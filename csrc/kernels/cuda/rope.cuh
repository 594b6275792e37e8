// CUDA RoPE kernel, forward and backward (the backward negates sin).
//
// The angle depends only on (b when positions are per-batch, s, i), so the trig is
// amortized over heads: a block takes a *task* (see RopeLaunch: a tile of s_tile
// positions × a chunk of rows (b, h) × a chunk of row items), computes the task's
// cos/sin table into shared memory (one float64 pow per pair and thread, one
// float64-reduced sin/cos per (s, pair)), then streams every row of the task through it.
//
// Row items (V features per access; V = 16 bytes on the Vec16 path, 1 otherwise):
//  - interleaved, V > 1: one pack of V adjacent features holds V/2 pairs (2j, 2j+1);
//  - half-split (any V) and interleaved with V = 1: pack `a` holds the u features and
//    pack `b` the v features of V pairs (half-split: features i and i + R/2;
//    interleaved: 2i and 2i+1);
//  - pass-through items copy V features of R..D−1.
// Each thread issues the loads of kRopePacksInFlight packs before any math, so that enough
// bytes are in flight to saturate HBM.
#pragma once

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope.h"
#include "kernels/rope_math.h"

namespace baracuda::kernels::cuda {

constexpr int kRopeThreads = 256;
// Packs in flight per thread: items with two packs (half-split) unroll half as far.
constexpr int kRopePacksInFlight = 4;

template <typename Acc>
struct alignas(2 * sizeof(Acc)) CosSin {
  Acc c, s;
};

template <typename Idx>
struct RopeParams {
  // Task decomposition (64-bit, decoded once per task).
  int64_t tasks, n_groups, n_stiles, n_row_chunks;
  int64_t S, nrows, n_items, n_rot;
  int64_t s_tile, rows_per_task, cols_per_task;
  uint32_t task_items;        // rows_per_task · s_tile · cols_per_task (< 2^31)
  FastDivmod cols_div, stile_div;  // item → (row, s, column) within a task
  // Rows.
  bool per_batch;
  Idx H;
  FastDivmod h_div;  // row → (b, h) when rows span batches (32-bit offsets only)
  Idx x_b, x_h, x_s, x_d;  // element strides of x
  Idx y_b, y_h, y_s, y_d;  // ... and of y
  Idx half, R;
  // Angles.
  bool has_positions, backward;
  int64_t pos_b, pos_s;
  double base;
  const void* x;
  const int64_t* positions;
  void* y;
};

template <typename T, int V, bool Interleaved, typename Idx>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(const RopeParams<Idx> p) {
  using Acc = acc_t<T>;
  // Pairs per rotation item, as the plan computed it (RopeLaunch::pairs_per_item).
  constexpr int P = Interleaved ? (V > 1 ? V / 2 : 1) : V;
  // Interleaved packs hold both features of their pairs.
  constexpr bool kOnePack = Interleaved && V > 1;
  constexpr int kRopeUnroll = kOnePack ? kRopePacksInFlight : kRopePacksInFlight / 2;
  extern __shared__ __align__(16) unsigned char rope_smem[];
  CosSin<Acc>* table = reinterpret_cast<CosSin<Acc>*>(rope_smem);
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const int64_t chunk_pairs = p.cols_per_task * P;

  for (int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    const int64_t g = task % p.n_groups;
    const int64_t rest = task / p.n_groups;
    const int64_t row_chunk = rest % p.n_row_chunks;
    const int64_t col_chunk = rest / p.n_row_chunks;
    const int64_t gb = p.per_batch ? g / p.n_stiles : 0;  // batch of per-batch positions
    const int64_t s0 = (g - gb * p.n_stiles) * p.s_tile;
    const int64_t r0 = row_chunk * p.rows_per_task;
    const int64_t c0 = col_chunk * p.cols_per_task;

    __syncthreads();  // every thread is done with the previous task's table
    // table[sl · chunk_pairs + e] = (cos, ±sin) of θ(s0 + sl, c0·P + e).
    for (int64_t e = threadIdx.x; e < chunk_pairs; e += kRopeThreads) {
      const int64_t i = c0 * P + e;
      if (i >= static_cast<int64_t>(p.half)) break;
      const double inv_freq = rope_inv_freq(p.base, i, static_cast<int64_t>(p.R));
      for (int64_t sl = 0; sl < p.s_tile; ++sl) {
        const int64_t s = s0 + sl;
        if (s >= p.S) break;
        const int64_t pos = p.has_positions ? p.positions[gb * p.pos_b + s * p.pos_s] : s;
        Acc c, sn;
        rope_cos_sin(static_cast<double>(pos) * inv_freq, c, sn);
        table[sl * chunk_pairs + e] = CosSin<Acc>{c, p.backward ? -sn : sn};
      }
    }
    __syncthreads();

    for (uint32_t w0 = threadIdx.x; w0 < p.task_items; w0 += kRopeThreads * kRopeUnroll) {
      Pack<T, V> a[kRopeUnroll], b[kRopeUnroll];
      Idx y_u[kRopeUnroll], y_v[kRopeUnroll];  // output offsets of packs a and b
      int32_t tab[kRopeUnroll];               // table index of the item's first pair; -1: copy
      bool live[kRopeUnroll];
#pragma unroll
      for (int k = 0; k < kRopeUnroll; ++k) {
        const uint32_t w = w0 + k * kRopeThreads;
        live[k] = false;
        if (w >= p.task_items) continue;
        const uint32_t q = p.cols_div.div(w);
        const uint32_t cl = w - q * static_cast<uint32_t>(p.cols_per_task);
        const uint32_t rl = p.stile_div.div(q);
        const uint32_t sl = q - rl * static_cast<uint32_t>(p.s_tile);
        const int64_t c = c0 + cl, s = s0 + sl, r = r0 + rl;
        if (c >= p.n_items || s >= p.S || r >= p.nrows) continue;
        live[k] = true;
        Idx bb, hh;
        if (p.per_batch) {
          bb = static_cast<Idx>(gb);
          hh = static_cast<Idx>(r);
        } else if constexpr (sizeof(Idx) == 4) {
          bb = p.h_div.div(static_cast<uint32_t>(r));
          hh = static_cast<Idx>(r) - bb * p.H;
        } else {
          bb = static_cast<Idx>(r) / p.H;
          hh = static_cast<Idx>(r) - bb * p.H;
        }
        const Idx ss = static_cast<Idx>(s);
        const Idx xo = bb * p.x_b + hh * p.x_h + ss * p.x_s;
        const Idx yo = bb * p.y_b + hh * p.y_h + ss * p.y_s;
        const Idx ci = static_cast<Idx>(c);
        // Feature indices of packs a and b.
        Idx du, dv;
        if (c < p.n_rot) {
          tab[k] = static_cast<int32_t>(sl * chunk_pairs + cl * P);
          if constexpr (kOnePack) {
            du = ci * V;
            dv = du;
          } else if constexpr (Interleaved) {  // V == 1: features 2c and 2c + 1
            du = 2 * ci;
            dv = du + 1;
          } else {
            du = ci * V;
            dv = p.half + du;
          }
        } else {
          tab[k] = -1;
          du = p.R + (ci - static_cast<Idx>(p.n_rot)) * V;
          dv = du;
        }
        a[k] = load_pack<T, V>(x + xo + du * p.x_d);
        if (!kOnePack && tab[k] >= 0) b[k] = load_pack<T, V>(x + xo + dv * p.x_d);
        y_u[k] = yo + du * p.y_d;
        y_v[k] = yo + dv * p.y_d;
      }
#pragma unroll
      for (int k = 0; k < kRopeUnroll; ++k) {
        if (!live[k]) continue;
        if (tab[k] < 0) {  // pass-through
          store_pack<T, V>(y + y_u[k], a[k]);
          continue;
        }
        const CosSin<Acc>* cs = table + tab[k];
        if constexpr (kOnePack) {
          Pack<T, V> out;
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const Acc u = to_acc(a[k].v[2 * j]), v = to_acc(a[k].v[2 * j + 1]);
            const CosSin<Acc> t = cs[j];
            out.v[2 * j] = from_acc<T>(u * t.c - v * t.s);
            out.v[2 * j + 1] = from_acc<T>(u * t.s + v * t.c);
          }
          store_pack<T, V>(y + y_u[k], out);
        } else {
          Pack<T, V> ou, ov;
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const Acc u = to_acc(a[k].v[j]), v = to_acc(b[k].v[j]);
            const CosSin<Acc> t = cs[j];
            ou.v[j] = from_acc<T>(u * t.c - v * t.s);
            ov.v[j] = from_acc<T>(u * t.s + v * t.c);
          }
          store_pack<T, V>(y + y_u[k], ou);
          store_pack<T, V>(y + y_v[k], ov);
        }
      }
    }
  }
}

template <typename T, int V, bool Interleaved, typename Idx>
void launch_rope(const RopeLaunch& l, cudaStream_t stream) {
  using Acc = acc_t<T>;
  constexpr int P = Interleaved ? (V > 1 ? V / 2 : 1) : V;
  const char* op = l.backward ? "rope_backward" : "rope";
  if (l.pairs_per_item != P || l.vec != V)
    fail(PlanErrorKind::Internal, op, "launch description does not match the kernel's vector width");
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  RopeParams<Idx> p;
  p.S = l.S;
  p.nrows = l.per_batch ? l.H : l.B * l.H;
  p.n_rot = l.n_rot;
  p.n_items = l.n_rot + l.n_pass;
  p.s_tile = l.s_tile;
  p.rows_per_task = l.rows_per_task;
  p.cols_per_task = l.cols_per_task;
  p.n_stiles = ceil_div(l.S, l.s_tile);
  p.n_groups = (l.per_batch ? l.B : 1) * p.n_stiles;
  p.n_row_chunks = ceil_div(p.nrows, l.rows_per_task);
  p.tasks = p.n_groups * p.n_row_chunks * ceil_div(p.n_items, l.cols_per_task);
  p.task_items = static_cast<uint32_t>(l.rows_per_task * l.s_tile * l.cols_per_task);
  p.cols_div = FastDivmod(static_cast<uint32_t>(l.cols_per_task));
  p.stile_div = FastDivmod(static_cast<uint32_t>(l.s_tile));
  p.per_batch = l.per_batch;
  p.H = static_cast<Idx>(l.H);
  p.h_div = FastDivmod(static_cast<uint32_t>(sizeof(Idx) == 4 ? l.H : 1));
  p.x_b = static_cast<Idx>(l.x_strides[0]);
  p.x_h = static_cast<Idx>(l.x_strides[1]);
  p.x_s = static_cast<Idx>(l.x_strides[2]);
  p.x_d = static_cast<Idx>(l.x_strides[3]);
  p.y_b = static_cast<Idx>(l.y_strides[0]);
  p.y_h = static_cast<Idx>(l.y_strides[1]);
  p.y_s = static_cast<Idx>(l.y_strides[2]);
  p.y_d = static_cast<Idx>(l.y_strides[3]);
  p.half = static_cast<Idx>(l.R / 2);
  p.R = static_cast<Idx>(l.R);
  p.has_positions = l.has_positions;
  p.backward = l.backward;
  p.pos_b = l.pos_stride_b;
  p.pos_s = l.pos_stride_s;
  p.base = l.base;
  p.x = l.x;
  p.positions = l.positions;
  p.y = l.y;
  const size_t smem = static_cast<size_t>(l.s_tile * l.cols_per_task * P) * sizeof(CosSin<Acc>);
  const auto grid = static_cast<unsigned int>(std::min<int64_t>(p.tasks, INT32_MAX));
  rope_kernel<T, V, Interleaved, Idx><<<grid, kRopeThreads, smem, stream>>>(p);
}

// One instantiation per layout (rope_interleaved.cu, rope_half_split.cu) so that the two
// compile in parallel.
template <bool Interleaved>
void launch_rope_layout(const RopeLaunch& l, cudaStream_t stream) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if (l.access == RopeAccess::Vec16) {
      if (l.index64)
        launch_rope<T, kVec, Interleaved, int64_t>(l, stream);
      else
        launch_rope<T, kVec, Interleaved, uint32_t>(l, stream);
    } else {
      if (l.index64)
        launch_rope<T, 1, Interleaved, int64_t>(l, stream);
      else
        launch_rope<T, 1, Interleaved, uint32_t>(l, stream);
    }
  });
  check_launch(l.backward ? "rope_backward" : "rope");
}

}  // namespace baracuda::kernels::cuda
