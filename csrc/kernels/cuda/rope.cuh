// CUDA RoPE kernels, forward and backward (the backward's table holds −sin).
//
// The angle depends only on (g, s, i) (g: the batch when positions are per-batch), not on
// the head, so the trig is split from the streaming (see RopeLaunch):
//  1. rope_table_kernel writes table[(g·S + s)·R/2 + i] = (cos θ, ±sin θ) into the
//     workspace, θ = p(g, s)·base^(−2i/R) with float64 θ and float64 range reduction
//     (rope_math.h), the same numbers the CPU kernel uses. A thread takes one pair i and
//     kRopeTableS consecutive positions, so one float64 pow serves kRopeTableS entries;
//     i is the fastest index, so the stores coalesce.
//  2. rope_stream_kernel reads x once with 16-byte vectors (both halves of a pair for
//     half-split), rotates and writes y. A thread owns one column (g, s, row item): it
//     loads the column's P table entries once (16-byte loads, L2 hits: the table is small
//     next to x) and keeps them in registers while it walks rows_per_thread rows (b, h),
//     kUnroll rows at a time, every load of a step issued before any math. Index math is
//     int32 (FastDivmod, once per thread; rows advance by adding strides), int64 only in
//     the _i64 variant. rope_linear_kernel (the plan's `linear`, interleaved pairs on
//     [B, H, S, D] layouts) instead takes one item per thread in memory order and loads
//     that item's entries.
//
// Row items (V features per access; V = 16 bytes on the Vec16 path, 1 otherwise):
//  - interleaved, V > 1: one pack of V adjacent features holds V/2 pairs (2j, 2j+1);
//  - half-split (any V) and interleaved with V = 1: pack `a` holds the u features and
//    pack `b` the v features of V pairs (half-split: features i and i + R/2;
//    interleaved: 2i and 2i+1);
//  - pass-through items copy V features of R..D−1.
//   y_u = u·cos θ − v·sin θ,   y_v = u·sin θ + v·cos θ   (in float; double for float64)
//
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope.h"
#include "kernels/rope_math.h"

namespace baracuda::kernels::cuda {

// kRopeThreads (core/rope_plan.h): threads a block, shared with the plan.
// Positions per table-kernel thread (they share the thread's float64 pow).
constexpr int kRopeTableS = 4;

// Pairs per rotation item (RopeLaunch::pairs_per_item).
__host__ __device__ constexpr int rope_pairs_per_item(int V, bool interleaved) {
  return interleaved ? (V > 1 ? V / 2 : 1) : V;
}

// Rows a streaming thread loads per step: 4 16-byte loads in flight per thread for 2-byte
// types, 2 for 4- and 8-byte types (the gated rows kernel's measured best on an H200 is
// the same number of loads: 2 units of 2 loads for bf16, 1 for float32); items with two
// packs (half-split) take half as many rows. Scalar paths take 4 rows.
template <typename T, int V, bool Interleaved>
constexpr int rope_default_unroll() {
  if (V == 1) return 4;
  const int loads = sizeof(T) == 2 ? 4 : 2;
  return Interleaved ? loads : loads / 2;
}

template <typename Acc>
struct alignas(2 * sizeof(Acc)) CosSin {
  Acc c, s;
};

// ---- 1. the table ---------------------------------------------------------------------

struct RopeTableParams {
  int64_t threads;  // table_groups · n_stiles · half
  int64_t half, n_stiles, S, R;
  FastDivmod half_div, stiles_div;  // thread → (i, s tile, g) when threads < 2^31
  bool has_positions, backward;
  int64_t pos_b, pos_s;
  double base;
  const int64_t* positions;
  void* table;
};

template <typename Acc, bool k64>
__global__ void __launch_bounds__(kRopeThreads) rope_table_kernel(const RopeTableParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRopeThreads + threadIdx.x;
  if (t >= p.threads) return;
  int64_t i, st, g;
  if constexpr (k64) {
    const int64_t q = t / p.half;
    i = t - q * p.half;
    g = q / p.n_stiles;
    st = q - g * p.n_stiles;
  } else {
    const uint32_t tt = static_cast<uint32_t>(t);
    const uint32_t q = p.half_div.div(tt);
    i = tt - q * static_cast<uint32_t>(p.half);
    const uint32_t gg = p.stiles_div.div(q);
    g = gg;
    st = q - gg * static_cast<uint32_t>(p.n_stiles);
  }
  const int64_t s0 = st * kRopeTableS;
  int64_t pos[kRopeTableS];  // loaded first, so that the pow below hides their latency
#pragma unroll
  for (int k = 0; k < kRopeTableS; ++k) {
    const int64_t s = s0 + k;
    pos[k] = p.has_positions && s < p.S ? p.positions[g * p.pos_b + s * p.pos_s] : s;
  }
  const double inv_freq = rope_inv_freq(p.base, i, p.R);
  CosSin<Acc>* out = static_cast<CosSin<Acc>*>(p.table) + (g * p.S + s0) * p.half + i;
#pragma unroll
  for (int k = 0; k < kRopeTableS; ++k) {
    if (s0 + k < p.S) {
      Acc c, sn;
      rope_cos_sin(static_cast<double>(pos[k]) * inv_freq, c, sn);
      out[k * p.half] = CosSin<Acc>{c, p.backward ? -sn : sn};
    }
  }
}

// ---- 2. the streaming rotation --------------------------------------------------------

template <typename Idx>
struct RopeStreamParams {
  Idx n_cols, n_items, n_rot, S;
  FastDivmod items_div, s_div, h_div;  // 32-bit offsets only: column → (g, s, item), row → (b, h)
  uint32_t col_shift, col_mask;        // a block covers col_mask + 1 = 2^col_shift columns
  Idx nrows, rows_per_thread;
  bool per_batch;
  Idx H;
  Idx x_b, x_h, x_s, x_d;  // element strides of x
  Idx y_b, y_h, y_s, y_d;  // ... and of y
  Idx x_wrap, y_wrap;      // b·x_b + H·x_h → (b+1)·x_b: x_b − H·x_h (modulo 2^32 when 32-bit)
  Idx half;
  Idx R;
  const void* x;
  const void* table;
  void* y;
};

// The P (cos, sin) entries of one rotation item. 16-byte loads when the entries fill them
// (the plan guarantees the alignment: R/2 and the item's first pair are multiples of P).
template <typename Acc, int P>
__device__ __forceinline__ void load_table(const CosSin<Acc>* t, CosSin<Acc> (&cs)[P]) {
  constexpr int kBytes = P * static_cast<int>(sizeof(CosSin<Acc>));
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int q = 0; q < kBytes / 16; ++q) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(t) + q);
      memcpy(reinterpret_cast<unsigned char*>(cs) + 16 * q, &raw, 16);
    }
  } else {  // one float pair
    static_assert(P == 1 && sizeof(Acc) == 4, "unexpected table entry size");
    const float2 raw = __ldg(reinterpret_cast<const float2*>(t));
    cs[0] = CosSin<Acc>{raw.x, raw.y};
  }
}

// store_pack, but always one 16-byte store on the vector path (as st.global.v4: left to
// itself, the compiler split some of them into four 4-byte stores under the 64-bit
// variant's register pressure).
template <typename T, int V>
__device__ __forceinline__ void rope_store(T* p, const Pack<T, V>& v) {
  if constexpr (sizeof(T) * V == 16) {
    uint4 raw;
    memcpy(&raw, &v, 16);
    __stwb(reinterpret_cast<uint4*>(p), raw);
  } else {
    store_pack<T, V>(p, v);
  }
}

// Rotates one item (pack a; pack bv holds the v features unless the item is one pack)
// with its P table entries and stores it at yu (and yv).
template <typename T, int V, bool Interleaved>
__device__ __forceinline__ void rope_rotate_store(
    const Pack<T, V>& a, [[maybe_unused]] const Pack<T, V>& bv,
    const CosSin<acc_t<T>> (&cs)[rope_pairs_per_item(V, Interleaved)], T* yu,
    [[maybe_unused]] T* yv) {
  using Acc = acc_t<T>;
  constexpr int P = rope_pairs_per_item(V, Interleaved);
  if constexpr (Interleaved && V > 1) {
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const Acc u = to_acc(a.v[2 * j]), v = to_acc(a.v[2 * j + 1]);
      o.v[2 * j] = from_acc<T>(u * cs[j].c - v * cs[j].s);
      o.v[2 * j + 1] = from_acc<T>(u * cs[j].s + v * cs[j].c);
    }
    rope_store<T, V>(yu, o);
  } else {
    Pack<T, V> ou, ov;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const Acc u = to_acc(a.v[j]), v = to_acc(bv.v[j]);
      ou.v[j] = from_acc<T>(u * cs[j].c - v * cs[j].s);
      ov.v[j] = from_acc<T>(u * cs[j].s + v * cs[j].c);
    }
    rope_store<T, V>(yu, ou);
    rope_store<T, V>(yv, ov);
  }
}

template <typename T, int V, bool Interleaved, typename Idx, int kUnroll>
__global__ void __launch_bounds__(kRopeThreads) rope_stream_kernel(const RopeStreamParams<Idx> p) {
  using Acc = acc_t<T>;
  constexpr int P = rope_pairs_per_item(V, Interleaved);
  constexpr bool kOnePack = Interleaved && V > 1;  // the pack holds both features of its pairs
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);

  const Idx col = static_cast<Idx>(blockIdx.x) * (p.col_mask + 1) + (threadIdx.x & p.col_mask);
  const Idx chunk = static_cast<Idx>(blockIdx.y) * (kRopeThreads >> p.col_shift) +
                    (threadIdx.x >> p.col_shift);
  const Idx r0 = chunk * p.rows_per_thread;
  if (col >= p.n_cols || r0 >= p.nrows) return;
  const Idx n = p.nrows - r0 < p.rows_per_thread ? p.nrows - r0 : p.rows_per_thread;

  // column → (g, s, item); first row r0 → (b, h)
  Idx item, g, s, b, h;
  if constexpr (sizeof(Idx) == 4) {
    const Idx q = p.items_div.div(col);
    item = col - q * p.n_items;
    g = p.s_div.div(q);
    s = q - g * p.S;
  } else {
    const Idx q = col / p.n_items;
    item = col - q * p.n_items;
    g = q / p.S;
    s = q - g * p.S;
  }
  if (p.per_batch) {  // rows are the heads of batch g
    b = g;
    h = r0;
  } else {  // g == 0; rows are (b, h) pairs
    if constexpr (sizeof(Idx) == 4)
      b = p.h_div.div(r0);
    else
      b = r0 / p.H;
    h = r0 - b * p.H;
  }
  Idx xo = b * p.x_b + h * p.x_h + s * p.x_s;  // offsets of the current row's (b, h, s)
  Idx yo = b * p.y_b + h * p.y_h + s * p.y_s;
  const auto next_row = [&] {
    xo += p.x_h;
    yo += p.y_h;
    if (++h == p.H) {
      h = 0;
      xo += p.x_wrap;
      yo += p.y_wrap;
    }
  };

  // A step handles kN rows: all loads first, then the math and the stores. Full steps of
  // kUnroll rows, then single rows for the remainder (none when rows_per_thread is a
  // multiple of kUnroll, as the plan's usually is).
  using Full = std::integral_constant<int, kUnroll>;
  using One = std::integral_constant<int, 1>;

  if (item >= p.n_rot) {  // pass-through: copy V features of R..D−1
    const Idx d = p.R + (item - p.n_rot) * V;
    const T* xs = x + d * p.x_d;
    T* ys = y + d * p.y_d;
    const auto step = [&](auto count) {
      constexpr int kN = decltype(count)::value;
      Pack<T, V> a[kN];
      Idx yr[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        a[k] = load_pack<T, V>(xs + xo);
        yr[k] = yo;
        next_row();
      }
#pragma unroll
      for (int k = 0; k < kN; ++k) rope_store<T, V>(ys + yr[k], a[k]);
    };
    Idx r = 0;
    for (; r + kUnroll <= n; r += kUnroll) step(Full{});
    for (; r < n; ++r) step(One{});
    return;
  }

  // Feature indices of packs a (u features) and b (v features).
  Idx du, dv;
  if constexpr (kOnePack) {
    du = item * V;
    dv = du;
  } else if constexpr (Interleaved) {  // V == 1: features 2·item and 2·item + 1
    du = 2 * item;
    dv = du + 1;
  } else {
    du = item * V;
    dv = p.half + du;
  }
  const T* xu = x + du * p.x_d;
  const T* xv = x + dv * p.x_d;
  T* yu = y + du * p.y_d;
  T* yv = y + dv * p.y_d;
  const CosSin<Acc>* tab =
      static_cast<const CosSin<Acc>*>(p.table) + (g * p.S + s) * p.half + item * P;
  CosSin<Acc> cs[P];
  bool first = true;
  const auto step = [&](auto count) {
    constexpr int kN = decltype(count)::value;
    Pack<T, V> a[kN];
    [[maybe_unused]] Pack<T, V> bv[kOnePack ? 1 : kN];  // v features (half-split, scalar)
    Idx yr[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      a[k] = load_pack<T, V>(xu + xo);
      if constexpr (!kOnePack) bv[k] = load_pack<T, V>(xv + xo);
      yr[k] = yo;
      next_row();
    }
    if (first) {  // the first loads of x are in flight: now the table
      first = false;
      load_table<Acc, P>(tab, cs);
    }
#pragma unroll
    for (int k = 0; k < kN; ++k)
      rope_rotate_store<T, V, Interleaved>(a[k], bv[kOnePack ? 0 : k], cs, yu + yr[k], yv + yr[k]);
  };
  Idx r = 0;
  for (; r + kUnroll <= n; r += kUnroll) step(Full{});
  for (; r < n; ++r) step(One{});
}

// ---- 2b. the linear streaming rotation --------------------------------------------------
// The same rotation over items in memory order: item t is (row, s, item) with the item
// fastest, then s, then the row (b, h), so a block's items are consecutive in memory for
// a contiguous x. A thread takes kUnroll items kRopeThreads apart, issues every load of x
// and of the items' table entries (L2 hits: the table is small next to x) before any math.
// No table reuse across rows; in exchange the accesses of the whole grid sweep memory in
// order.
template <typename T, int V, bool Interleaved, typename Idx, int kUnroll>
__global__ void __launch_bounds__(kRopeThreads) rope_linear_kernel(const RopeStreamParams<Idx> p) {
  using Acc = acc_t<T>;
  constexpr int P = rope_pairs_per_item(V, Interleaved);
  constexpr bool kOnePack = Interleaved && V > 1;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const Idx first = static_cast<Idx>(blockIdx.x) * (kUnroll * kRopeThreads) + threadIdx.x;

  Pack<T, V> a[kUnroll];
  [[maybe_unused]] Pack<T, V> bv[kOnePack ? 1 : kUnroll];
  CosSin<Acc> cs[kUnroll][P];
  Idx yu[kUnroll], yv[kUnroll];
  int kind[kUnroll];  // 0: past the end, 1: pass-through, 2: rotation
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const Idx t = first + static_cast<Idx>(k * kRopeThreads);
    kind[k] = 0;
    if (t >= p.n_cols) continue;  // n_cols: every (row, s, item) here
    Idx q, item, row, s, b;
    if constexpr (sizeof(Idx) == 4) {
      q = p.items_div.div(t);
      item = t - q * p.n_items;
      row = p.s_div.div(q);
      s = q - row * p.S;
      b = p.h_div.div(row);
    } else {
      q = t / p.n_items;
      item = t - q * p.n_items;
      row = q / p.S;
      s = q - row * p.S;
      b = row / p.H;
    }
    const Idx h = row - b * p.H;
    const Idx xo = b * p.x_b + h * p.x_h + s * p.x_s;
    const Idx yo = b * p.y_b + h * p.y_h + s * p.y_s;
    Idx du, dv;
    if (item >= p.n_rot) {
      du = p.R + (item - p.n_rot) * V;
      dv = du;
      kind[k] = 1;
    } else {
      kind[k] = 2;
      if constexpr (kOnePack) {
        du = item * V;
        dv = du;
      } else if constexpr (Interleaved) {
        du = 2 * item;
        dv = du + 1;
      } else {
        du = item * V;
        dv = p.half + du;
      }
    }
    a[k] = load_pack<T, V>(x + xo + du * p.x_d);
    if (kind[k] == 2) {
      if constexpr (!kOnePack) bv[k] = load_pack<T, V>(x + xo + dv * p.x_d);
      const Idx g = p.per_batch ? b : Idx{0};
      load_table<Acc, P>(static_cast<const CosSin<Acc>*>(p.table) + (g * p.S + s) * p.half + item * P,
                         cs[k]);
    }
    yu[k] = yo + du * p.y_d;
    yv[k] = yo + dv * p.y_d;
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    if (kind[k] == 2)
      rope_rotate_store<T, V, Interleaved>(a[k], bv[kOnePack ? 0 : k], cs[k], y + yu[k], y + yv[k]);
    else if (kind[k] == 1)
      rope_store<T, V>(y + yu[k], a[k]);
  }
}

// ---- launchers --------------------------------------------------------------------------

inline int64_t rope_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename Acc>
void launch_rope_table(const RopeLaunch& l, cudaStream_t stream) {
  RopeTableParams p;
  p.half = l.R / 2;
  p.n_stiles = rope_ceil_div(l.S, kRopeTableS);
  p.threads = l.table_groups * p.n_stiles * p.half;
  p.S = l.S;
  p.R = l.R;
  const bool k64 = p.threads > INT32_MAX;
  p.half_div = FastDivmod(static_cast<uint32_t>(k64 ? 1 : p.half));
  p.stiles_div = FastDivmod(static_cast<uint32_t>(k64 ? 1 : p.n_stiles));
  p.has_positions = l.has_positions;
  p.backward = l.backward;
  p.pos_b = l.pos_stride_b;
  p.pos_s = l.pos_stride_s;
  p.base = l.base;
  p.positions = l.positions;
  p.table = l.table;
  const unsigned int blocks = blocks_for(p.threads, kRopeThreads);
  if (k64)
    rope_table_kernel<Acc, true><<<blocks, kRopeThreads, 0, stream>>>(p);
  else
    rope_table_kernel<Acc, false><<<blocks, kRopeThreads, 0, stream>>>(p);
}

template <typename Idx>
RopeStreamParams<Idx> make_rope_stream_params(const RopeLaunch& l) {
  RopeStreamParams<Idx> p;
  const bool i32 = sizeof(Idx) == 4;
  const int64_t n_items = l.n_rot + l.n_pass;
  const int64_t nrows = l.per_batch ? l.H : l.B * l.H;
  p.n_cols = static_cast<Idx>(l.n_cols);
  p.n_items = static_cast<Idx>(n_items);
  p.n_rot = static_cast<Idx>(l.n_rot);
  p.S = static_cast<Idx>(l.S);
  p.items_div = FastDivmod(static_cast<uint32_t>(i32 ? n_items : 1));
  p.s_div = FastDivmod(static_cast<uint32_t>(i32 ? l.S : 1));
  p.h_div = FastDivmod(static_cast<uint32_t>(i32 && !l.per_batch ? l.H : 1));
  p.col_shift = static_cast<uint32_t>(l.col_shift);
  p.col_mask = (1u << l.col_shift) - 1;
  p.nrows = static_cast<Idx>(nrows);
  p.rows_per_thread = static_cast<Idx>(l.rows_per_thread);
  p.per_batch = l.per_batch;
  p.H = static_cast<Idx>(l.H);
  p.x_b = static_cast<Idx>(l.x_strides[0]);
  p.x_h = static_cast<Idx>(l.x_strides[1]);
  p.x_s = static_cast<Idx>(l.x_strides[2]);
  p.x_d = static_cast<Idx>(l.x_strides[3]);
  p.y_b = static_cast<Idx>(l.y_strides[0]);
  p.y_h = static_cast<Idx>(l.y_strides[1]);
  p.y_s = static_cast<Idx>(l.y_strides[2]);
  p.y_d = static_cast<Idx>(l.y_strides[3]);
  // (int64 difference, then reduced modulo 2^32 for 32-bit offsets: the running offsets
  // stay exact because every true offset fits.)
  p.x_wrap = static_cast<Idx>(l.x_strides[0] - l.H * l.x_strides[1]);
  p.y_wrap = static_cast<Idx>(l.y_strides[0] - l.H * l.y_strides[1]);
  p.half = static_cast<Idx>(l.R / 2);
  p.R = static_cast<Idx>(l.R);
  p.x = l.x;
  p.table = l.table;
  p.y = l.y;
  return p;
}

// The plan's description must match the kernel, and load_table's 16-byte loads need the
// items' first table entries 16-byte aligned.
template <typename T, int V, bool Interleaved>
void check_rope_stream_launch(const RopeLaunch& l) {
  const char* op = l.backward ? "rope_backward" : "rope";
  constexpr int P = rope_pairs_per_item(V, Interleaved);
  constexpr int kEntryBytes = static_cast<int>(sizeof(CosSin<acc_t<T>>));
  if (l.pairs_per_item != P || l.vec != V)
    fail(PlanErrorKind::Internal, op, "launch description does not match the kernel's vector width");
  if (P * kEntryBytes % 16 == 0 &&
      ((l.R / 2) % P != 0 || reinterpret_cast<uintptr_t>(l.table) % 16 != 0))
    fail(PlanErrorKind::Internal, op, "cos/sin table entries are not 16-byte aligned");
}

template <typename T, int V, bool Interleaved, typename Idx,
          int kUnroll = rope_default_unroll<T, V, Interleaved>()>
void launch_rope_stream(const RopeLaunch& l, cudaStream_t stream) {
  check_rope_stream_launch<T, V, Interleaved>(l);
  const int64_t nrows = l.per_batch ? l.H : l.B * l.H;
  const int64_t row_slots = kRopeThreads >> l.col_shift;
  const dim3 grid(static_cast<unsigned int>(rope_ceil_div(l.n_cols, int64_t{1} << l.col_shift)),
                  static_cast<unsigned int>(
                      rope_ceil_div(rope_ceil_div(nrows, l.rows_per_thread), row_slots)));
  const auto kernel = rope_stream_kernel<T, V, Interleaved, Idx, kUnroll>;
  kernel<<<grid, kRopeThreads, 0, stream>>>(make_rope_stream_params<Idx>(l));
}

// The linear kernel over all B·H·S·(n_rot + n_pass) items.
template <typename T, int V, bool Interleaved, typename Idx, int kUnroll>
void launch_rope_linear(const RopeLaunch& l, cudaStream_t stream) {
  check_rope_stream_launch<T, V, Interleaved>(l);
  RopeStreamParams<Idx> p = make_rope_stream_params<Idx>(l);
  const bool i32 = sizeof(Idx) == 4;
  const int64_t n_items = l.n_rot + l.n_pass;
  const int64_t total = l.B * l.H * l.S * n_items;
  p.n_cols = static_cast<Idx>(total);
  p.h_div = FastDivmod(static_cast<uint32_t>(i32 ? l.H : 1));
  const int64_t blocks = rope_ceil_div(total, int64_t{kUnroll} * kRopeThreads);
  rope_linear_kernel<T, V, Interleaved, Idx, kUnroll>
      <<<static_cast<unsigned int>(blocks), kRopeThreads, 0, stream>>>(p);
}

// One instantiation per layout (rope_interleaved.cu, rope_half_split.cu) so that the two
// compile in parallel.
template <bool Interleaved>
void launch_rope_layout(const RopeLaunch& l, cudaStream_t stream) {
  const char* op = l.backward ? "rope_backward" : "rope";
  if (l.table == nullptr || l.n_cols <= 0)
    fail(PlanErrorKind::Internal, op, "the CUDA kernels need the plan's cos/sin table workspace");
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    launch_rope_table<acc_t<T>>(l, stream);
    check_launch(op);
    constexpr int kVec = 16 / sizeof(T);
    if (l.access == RopeAccess::Vec16 && l.linear) {
      if (l.index64)
        launch_rope_linear<T, kVec, Interleaved, int64_t, 1>(l, stream);
      else
        launch_rope_linear<T, kVec, Interleaved, uint32_t, 1>(l, stream);
    } else if (l.access == RopeAccess::Vec16) {
      if (l.index64)
        launch_rope_stream<T, kVec, Interleaved, int64_t>(l, stream);
      else
        launch_rope_stream<T, kVec, Interleaved, uint32_t>(l, stream);
    } else {
      if (l.index64)
        launch_rope_stream<T, 1, Interleaved, int64_t>(l, stream);
      else
        launch_rope_stream<T, 1, Interleaved, uint32_t>(l, stream);
    }
    check_launch(op);
  });
}

// The half-split instantiations, compiled in their own translation unit
// (rope_half_split.cu).
void launch_rope_half_split(const RopeLaunch& l, cudaStream_t stream);

}  // namespace baracuda::kernels::cuda
