// CUDA kernel of the cos/sin RoPE (forward and backward, q and k in one launch).
//
// No table kernel: the caller holds the table. The index space is columns × rows (see
// RopeCosSinLaunch): a column is (b, s, row item) with the item fastest, so a warp's
// 16-byte accesses are consecutive in a row; a row is one head of q (r < Hq) or of k.
// A thread loads its column's table entries once (P pairs × (c_u, s_u, c_v, s_v), from
// the table's dtype to float; double for float64 data; in 16-byte vectors where the plan
// says table_vec16, else one entry a load), builds the 2×2 coefficients of
// the direction (forward: [c_u, −s_u; s_v, c_v], backward: their transpose), and walks
// rows_per_thread heads, issuing every load of a step before its math.
//
// Row items (V features per access; V = 16 bytes on the Vec16 path, 1 otherwise), as in
// rope.cuh: interleaved with V > 1: one pack of V adjacent features (V/2 pairs);
// half-split (any V) and interleaved with V = 1: pack a holds the u features and pack b
// the v features of V pairs; pass-through items copy V features of R..D−1.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope_cos_sin.h"

namespace baracuda::kernels {
namespace cuda {

// kRopeCosSinThreads (core/rope_cos_sin_plan.h): threads a block, shared with the plan.
// Rows per step: every load of a step is issued before its math and stores. 4 (128
// registers, still 2 blocks an SM) against 2 (98): flash-attention's layout 183.4 → 181.1
// µs, the Hugging Face q + k 212.2 → 209.0 (H200, benchmarks/tune/time_rope_cos_sin.py).
constexpr int kRopeCsUnroll = 4;

// The launch description as the kernels read it: offsets and counts in Idx (int64_t for
// rope_cos_sin_kernel, uint32_t for the walk on 32-bit offsets).
template <typename Idx>
struct RopeCsParamsOf {
  Idx Hq, rows, S, R, half;  // rows: Hq + Hk
  Idx n_items, n_rot, n_cols, rows_per_thread;
  Idx q_s[4], k_s[4], yq_s[4], yk_s[4];
  Idx cos_s[3], sin_s[3];
  bool full_table, backward, table_vec16;
  const void* q;
  const void* k;
  const void* cos;
  const void* sin;
  void* yq;
  void* yk;
};
using RopeCsParams = RopeCsParamsOf<int64_t>;

__device__ __forceinline__ double table_to_double(double v) { return v; }
__device__ __forceinline__ double table_to_double(float v) { return v; }

template <typename T, typename C>
__device__ __forceinline__ acc_t<T> load_entry(const C* p) {
  if constexpr (std::is_same_v<acc_t<T>, double>)
    return table_to_double(__ldg(p));
  else
    return to_acc(p[0]);
}

// K consecutive table entries from 16-byte vectors (p 16-byte aligned; K·sizeof(C) a
// multiple of 16).
template <typename T, typename C, int K>
__device__ __forceinline__ void load_run(const C* p, acc_t<T> (&out)[K]) {
  constexpr int kPer = 16 / sizeof(C);
  static_assert(K % kPer == 0, "a run of whole 16-byte vectors");
#pragma unroll
  for (int i = 0; i < K / kPer; ++i) {
    const Pack<C, kPer> v = load_pack<C, kPer>(p + i * kPer);
#pragma unroll
    for (int j = 0; j < kPer; ++j) out[i * kPer + j] = static_cast<acc_t<T>>(to_acc(v.v[j]));
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_pack_acc(T* p, const acc_t<T> (&v)[V]) {
  Pack<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(v[j]);
  store_pack<T, V>(p, out);
}

template <typename T, typename C, int V, bool Interleaved>
__global__ void __launch_bounds__(kRopeCosSinThreads) rope_cos_sin_kernel(const RopeCsParams p) {
  using Acc = acc_t<T>;
  constexpr bool kOnePack = Interleaved && V > 1;
  constexpr int P = Interleaved ? (V > 1 ? V / 2 : 1) : V;  // pairs per item
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRopeCosSinThreads + threadIdx.x;
  if (col >= p.n_cols) return;
  const int64_t rows = p.rows;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * p.rows_per_thread;
  if (r0 >= rows) return;
  const int64_t r1 = r0 + p.rows_per_thread < rows ? r0 + p.rows_per_thread : rows;
  const int64_t bs = col / p.n_items;
  const int64_t item = col - bs * p.n_items;
  const int64_t b = bs / p.S;
  const int64_t s = bs - b * p.S;

  // Feature offsets of packs a and b (or the pass-through pack).
  int64_t fa, fb;
  const bool pass = item >= p.n_rot;
  if (pass) {
    fa = p.R + (item - p.n_rot) * V;
    fb = fa;
  } else if constexpr (kOnePack) {
    fa = item * V;
    fb = fa;
  } else if constexpr (Interleaved) {
    fa = 2 * item;
    fb = fa + 1;
  } else {
    fa = item * V;
    fb = p.half + fa;
  }

  // Coefficients of the item's pairs: y_u = m00·u + m01·v, y_v = m10·u + m11·v.
  Acc m00[P], m01[P], m10[P], m11[P];
  const auto set_pair = [&](int j, Acc cu, Acc su, Acc cv, Acc sv) {
    m00[j] = cu;
    m11[j] = cv;
    m01[j] = p.backward ? sv : -su;
    m10[j] = p.backward ? -su : sv;
  };
  // table runs in 16-byte vectors (the plan's table_vec16): P entries of each table from
  // the item's first pair (and P more from half on a full half-split table), or 2P with a
  // full interleaved table
  constexpr bool kRunVec = P * sizeof(C) % 16 == 0, kRun2Vec = 2 * P * sizeof(C) % 16 == 0;
  bool loaded = false;
  if (!pass) {
    const C* cosr = static_cast<const C*>(p.cos) + b * p.cos_s[0] + s * p.cos_s[1];
    const C* sinr = static_cast<const C*>(p.sin) + b * p.sin_s[0] + s * p.sin_s[1];
    if constexpr (Interleaved && kRun2Vec) {
      if (p.table_vec16 && p.full_table) {
        Acc c[2 * P], sn[2 * P];
        load_run<T, C, 2 * P>(cosr + 2 * item * P, c);
        load_run<T, C, 2 * P>(sinr + 2 * item * P, sn);
#pragma unroll
        for (int j = 0; j < P; ++j) set_pair(j, c[2 * j], sn[2 * j], c[2 * j + 1], sn[2 * j + 1]);
        loaded = true;
      }
    }
    if constexpr (kRunVec) {
      if (p.table_vec16 && !loaded && !(Interleaved && p.full_table)) {
        Acc cu[P], su[P];
        load_run<T, C, P>(cosr + item * P, cu);
        load_run<T, C, P>(sinr + item * P, su);
        if (p.full_table) {  // half-split: the v entries from half on
          Acc cv[P], sv[P];
          load_run<T, C, P>(cosr + p.half + item * P, cv);
          load_run<T, C, P>(sinr + p.half + item * P, sv);
#pragma unroll
          for (int j = 0; j < P; ++j) set_pair(j, cu[j], su[j], cv[j], sv[j]);
        } else {
#pragma unroll
          for (int j = 0; j < P; ++j) set_pair(j, cu[j], su[j], cu[j], su[j]);
        }
        loaded = true;
      }
    }
    if (!loaded) {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        const int64_t pair = item * P + j;
        int64_t eu = pair, ev = pair;
        if (p.full_table) {
          eu = Interleaved ? 2 * pair : pair;
          ev = Interleaved ? 2 * pair + 1 : pair + p.half;
        }
        set_pair(j, load_entry<T>(cosr + eu * p.cos_s[2]), load_entry<T>(sinr + eu * p.sin_s[2]),
                 load_entry<T>(cosr + ev * p.cos_s[2]), load_entry<T>(sinr + ev * p.sin_s[2]));
      }
    }
  }

  for (int64_t r = r0; r < r1; r += kRopeCsUnroll) {
    Pack<T, V> a[kRopeCsUnroll], bv[kRopeCsUnroll];
    T* ya[kRopeCsUnroll];
    T* yb[kRopeCsUnroll];
    bool live[kRopeCsUnroll];
#pragma unroll
    for (int k = 0; k < kRopeCsUnroll; ++k) {
      const int64_t row = r + k;
      live[k] = row < r1;
      if (!live[k]) continue;
      const bool is_q = row < p.Hq;
      const int64_t h = is_q ? row : row - p.Hq;
      const int64_t* xs = is_q ? p.q_s : p.k_s;
      const int64_t* ys = is_q ? p.yq_s : p.yk_s;
      const T* x = static_cast<const T*>(is_q ? p.q : p.k) + b * xs[0] + h * xs[1] + s * xs[2];
      T* y = static_cast<T*>(is_q ? p.yq : p.yk) + b * ys[0] + h * ys[1] + s * ys[2];
      if constexpr (V > 1) {
        a[k] = load_pack<T, V>(x + fa);
        if (!pass && !kOnePack) bv[k] = load_pack<T, V>(x + fb);
        ya[k] = y + fa;
        yb[k] = y + fb;
      } else {
        a[k].v[0] = x[fa * xs[3]];
        if (!pass) bv[k].v[0] = x[fb * xs[3]];
        ya[k] = y + fa * ys[3];
        yb[k] = y + fb * ys[3];
      }
    }
#pragma unroll
    for (int k = 0; k < kRopeCsUnroll; ++k) {
      if (!live[k]) continue;
      if (pass) {
        store_pack<T, V>(ya[k], a[k]);
        continue;
      }
      if constexpr (kOnePack) {
        Acc out[V];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const Acc u = to_acc(a[k].v[2 * j]), v = to_acc(a[k].v[2 * j + 1]);
          out[2 * j] = m00[j] * u + m01[j] * v;
          out[2 * j + 1] = m10[j] * u + m11[j] * v;
        }
        store_pack_acc<T, V>(ya[k], out);
      } else {
        Acc ou[V], ov[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const Acc u = to_acc(a[k].v[j]), v = to_acc(bv[k].v[j]);
          ou[j] = m00[j] * u + m01[j] * v;
          ov[j] = m10[j] * u + m11[j] * v;
        }
        store_pack_acc<T, V>(ya[k], ou);
        store_pack_acc<T, V>(yb[k], ov);
      }
    }
  }
}

// The walk on 32-bit offsets (RopeCosSinLaunch::walk32): the Vec16 path where every offset
// of q, k, their outputs and the tables fits in 32 bits. The same columns, rows and math
// as rope_cos_sin_kernel, shaped as rope's streaming kernel (rope.cuh): a step's loads of
// x go out first and the table's loads only after the first step's (its latency then
// overlaps theirs), kUnroll rows a step as rope's (4 16-byte loads in flight a step for
// 16-bit data, 2 for float32), a half table's pairs held as (c, s) and a full table's as
// the four coefficients, offsets and row walks in 32-bit arithmetic, the output pointer
// recomputed at the store instead of held across the step.
// (The table's entry stride is 1 on this path.)
using RopeCsWalkParams = RopeCsParamsOf<uint32_t>;

template <typename T, int V>
__device__ __forceinline__ void walk_store(T* p, const Pack<T, V>& v) {
  static_assert(sizeof(T) * V == 16, "16-byte items");
  uint4 raw;
  memcpy(&raw, &v, 16);
  __stwb(reinterpret_cast<uint4*>(p), raw);
}

template <typename T, typename C, bool Interleaved, bool kFull>
__global__ void __launch_bounds__(kRopeCosSinThreads) rope_cos_sin_walk_kernel(const RopeCsWalkParams p) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool kOnePack = Interleaved;               // V > 1: a pack holds both features of V/2 pairs
  constexpr int P = Interleaved ? V / 2 : V;            // pairs an item
  constexpr int kUnroll = (sizeof(T) == 2 ? 4 : 2) / (Interleaved ? 1 : 2);
  constexpr int kRun = (Interleaved && kFull ? 2 : 1) * P;  // table entries a run
  const uint32_t col = blockIdx.x * kRopeCosSinThreads + threadIdx.x;
  if (col >= p.n_cols) return;
  const uint32_t r0 = blockIdx.y * p.rows_per_thread;
  const uint32_t rows = p.rows;
  if (r0 >= rows) return;
  const uint32_t n = min(rows - r0, p.rows_per_thread);
  const uint32_t bs = col / p.n_items;
  const uint32_t item = col - bs * p.n_items;
  const uint32_t b = bs / p.S;
  const uint32_t s = bs - b * p.S;
  const bool pass = item >= p.n_rot;
  uint32_t fa, fb;
  if (pass) {
    fa = p.R + (item - p.n_rot) * V;
    fb = fa;
  } else if constexpr (kOnePack) {
    fa = item * V;
    fb = fa;
  } else {
    fa = item * V;
    fb = p.half + fa;
  }
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  T* yq = static_cast<T*>(p.yq);
  T* yk = static_cast<T*>(p.yk);
  const uint32_t qo = b * p.q_s[0] + s * p.q_s[2], ko = b * p.k_s[0] + s * p.k_s[2];
  const uint32_t yqo = b * p.yq_s[0] + s * p.yq_s[2], yko = b * p.yk_s[0] + s * p.yk_s[2];
  const auto x_row = [&](uint32_t row) -> const T* {
    return row < p.Hq ? q + (qo + row * p.q_s[1]) : k + (ko + (row - p.Hq) * p.k_s[1]);
  };
  const auto y_row = [&](uint32_t row) -> T* {
    return row < p.Hq ? yq + (yqo + row * p.yq_s[1]) : yk + (yko + (row - p.Hq) * p.yk_s[1]);
  };

  // Coefficients: y_u = c0·u − s0·v, y_v = s1·u + c1·v (c1, s1 only with a full table);
  // the backward's transpose is folded in at the load (a half table: s negated; a full
  // one: s0 ← −s_v, s1 ← −s_u).
  Acc c0[P], s0[P];
  [[maybe_unused]] Acc c1[kFull ? P : 1], s1[kFull ? P : 1];
  const auto load_table = [&] {
    const C* cosr = static_cast<const C*>(p.cos) + (b * p.cos_s[0] + s * p.cos_s[1]);
    const C* sinr = static_cast<const C*>(p.sin) + (b * p.sin_s[0] + s * p.sin_s[1]);
    Acc cu[kRun], su[kRun];
    [[maybe_unused]] Acc cv[kFull && !Interleaved ? P : 1], sv[kFull && !Interleaved ? P : 1];
    const uint32_t e = item * kRun;
    constexpr bool kVec = kRun * sizeof(C) % 16 == 0;
    if (kVec && p.table_vec16) {
      if constexpr (kVec) {
        load_run<T, C, kRun>(cosr + e, cu);
        load_run<T, C, kRun>(sinr + e, su);
        if constexpr (kFull && !Interleaved) {
          load_run<T, C, P>(cosr + p.half + e, cv);
          load_run<T, C, P>(sinr + p.half + e, sv);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        cu[j] = load_entry<T>(cosr + e + j);
        su[j] = load_entry<T>(sinr + e + j);
      }
      if constexpr (kFull && !Interleaved) {
#pragma unroll
        for (int j = 0; j < P; ++j) {
          cv[j] = load_entry<T>(cosr + p.half + e + j);
          sv[j] = load_entry<T>(sinr + p.half + e + j);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if constexpr (!kFull) {
        c0[j] = cu[j];
        s0[j] = p.backward ? -su[j] : su[j];
      } else {
        const Acc cuj = Interleaved ? cu[2 * j] : cu[j], suj = Interleaved ? su[2 * j] : su[j];
        const Acc cvj = Interleaved ? cu[2 * j + 1] : cv[j], svj = Interleaved ? su[2 * j + 1] : sv[j];
        c0[j] = cuj;
        c1[j] = cvj;
        s0[j] = p.backward ? -svj : suj;
        s1[j] = p.backward ? -suj : svj;
      }
    }
  };

  const auto step = [&](uint32_t r, auto count, bool first) {
    constexpr int kN = decltype(count)::value;
    Pack<T, V> a[kN];
    [[maybe_unused]] Pack<T, V> bv[kOnePack ? 1 : kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const T* x = x_row(r + i);
      a[i] = load_pack<T, V>(x + fa);
      if constexpr (!kOnePack) {
        if (!pass) bv[i] = load_pack<T, V>(x + fb);
      }
    }
    if (first) load_table();  // the step's loads of x are in flight
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      T* y = y_row(r + i);
      if (pass) {
        walk_store<T, V>(y + fa, a[i]);
        continue;
      }
      if constexpr (kOnePack) {
        Pack<T, V> o;
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const Acc u = to_acc(a[i].v[2 * j]), v = to_acc(a[i].v[2 * j + 1]);
          o.v[2 * j] = from_acc<T>(c0[j] * u - s0[j] * v);
          o.v[2 * j + 1] = from_acc<T>((kFull ? s1[j] : s0[j]) * u + (kFull ? c1[j] : c0[j]) * v);
        }
        walk_store<T, V>(y + fa, o);
      } else {
        Pack<T, V> ou, ov;
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const Acc u = to_acc(a[i].v[j]), v = to_acc(bv[i].v[j]);
          ou.v[j] = from_acc<T>(c0[j] * u - s0[j] * v);
          ov.v[j] = from_acc<T>((kFull ? s1[j] : s0[j]) * u + (kFull ? c1[j] : c0[j]) * v);
        }
        walk_store<T, V>(y + fa, ou);
        walk_store<T, V>(y + fb, ov);
      }
    }
  };
  using Full = std::integral_constant<int, kUnroll>;
  using One = std::integral_constant<int, 1>;
  uint32_t i = 0;
  bool first = !pass;
  for (; i + kUnroll <= n; i += kUnroll, first = false) step(r0 + i, Full{}, first);
  for (; i < n; ++i, first = false) step(r0 + i, One{}, first);
}

// The plan's description must match the kernel.
template <int V, bool Interleaved>
void check_rope_cos_sin_launch(const RopeCosSinLaunch& l, const char* op) {
  constexpr int P = Interleaved ? (V > 1 ? V / 2 : 1) : V;
  if (l.vec != V || l.pairs_per_item != P)
    fail(PlanErrorKind::Internal, op, "launch description does not match the kernel's vector width");
  if (l.n_rot * P != l.R / 2 || l.n_pass * V != l.D - l.R ||
      l.n_cols != l.B * l.S * (l.n_rot + l.n_pass))
    fail(PlanErrorKind::Internal, op, "launch description's row items do not cover the row");
  if (l.rows_per_thread < 1 || (l.q == nullptr && l.Hq > 0) || (l.k == nullptr && l.Hk > 0) ||
      l.cos == nullptr || l.sin == nullptr)
    fail(PlanErrorKind::Internal, op, "launch description is missing an operand");
  if (V > 1 && (l.q_strides[3] != 1 || l.yq_strides[3] != 1 ||
                (l.Hk > 0 && (l.k_strides[3] != 1 || l.yk_strides[3] != 1))))
    fail(PlanErrorKind::Internal, op, "the vector path needs unit feature strides");
}

template <typename Idx>
RopeCsParamsOf<Idx> params_of(const RopeCosSinLaunch& l) {
  const auto idx = [](int64_t v) { return static_cast<Idx>(v); };
  RopeCsParamsOf<Idx> p;
  p.Hq = idx(l.Hq);
  p.rows = idx(l.Hq + l.Hk);
  p.S = idx(l.S);
  p.R = idx(l.R);
  p.half = idx(l.R / 2);
  p.n_items = idx(l.n_rot + l.n_pass);
  p.n_rot = idx(l.n_rot);
  p.n_cols = idx(l.n_cols);
  p.rows_per_thread = idx(l.rows_per_thread);
  for (int i = 0; i < 4; ++i) {
    p.q_s[i] = idx(l.q_strides[i]);
    p.k_s[i] = idx(l.k_strides[i]);
    p.yq_s[i] = idx(l.yq_strides[i]);
    p.yk_s[i] = idx(l.yk_strides[i]);
  }
  for (int i = 0; i < 3; ++i) {
    p.cos_s[i] = idx(l.cos_strides[i]);
    p.sin_s[i] = idx(l.sin_strides[i]);
  }
  p.full_table = l.full_table;
  p.backward = l.backward;
  p.table_vec16 = l.table_vec16;
  p.q = l.q;
  p.k = l.k;
  p.cos = l.cos;
  p.sin = l.sin;
  p.yq = l.yq;
  p.yk = l.yk;
  return p;
}

// Columns by blocks of kRopeCosSinThreads, rows by chunks of rows_per_thread.
dim3 grid_of(const RopeCosSinLaunch& l) {
  return dim3(blocks_for(l.n_cols, kRopeCosSinThreads),
              static_cast<unsigned int>((l.Hq + l.Hk + l.rows_per_thread - 1) / l.rows_per_thread));
}

template <typename T, typename C, int V, bool Interleaved>
void launch(const RopeCosSinLaunch& l, cudaStream_t stream, const char* op) {
  check_rope_cos_sin_launch<V, Interleaved>(l, op);
  constexpr int64_t P = Interleaved ? (V > 1 ? V / 2 : 1) : V;
  const int64_t run = (Interleaved && l.full_table ? 2 : 1) * P;
  if (l.table_vec16 && (V == 1 || run * static_cast<int64_t>(sizeof(C)) % 16 != 0))
    fail(PlanErrorKind::Internal, op, "table_vec16 planned for table runs that are not whole 16-byte vectors");
  rope_cos_sin_kernel<T, C, V, Interleaved><<<grid_of(l), kRopeCosSinThreads, 0, stream>>>(params_of<int64_t>(l));
  check_launch(op);
}

template <typename T, typename C>
void launch_walk(const RopeCosSinLaunch& l, cudaStream_t stream, const char* op) {
  constexpr int kVec = 16 / sizeof(T);
  if (l.interleaved)
    check_rope_cos_sin_launch<kVec, true>(l, op);
  else
    check_rope_cos_sin_launch<kVec, false>(l, op);
  if (l.cos_strides[2] != 1 || l.sin_strides[2] != 1)
    fail(PlanErrorKind::Internal, op, "the 32-bit walk needs unit table entry strides");
  const RopeCsWalkParams p = params_of<uint32_t>(l);
  const dim3 grid = grid_of(l);
  const auto go = [&](auto kernel) { kernel<<<grid, kRopeCosSinThreads, 0, stream>>>(p); };
  if (l.interleaved)
    l.full_table ? go(rope_cos_sin_walk_kernel<T, C, true, true>) : go(rope_cos_sin_walk_kernel<T, C, true, false>);
  else
    l.full_table ? go(rope_cos_sin_walk_kernel<T, C, false, true>) : go(rope_cos_sin_walk_kernel<T, C, false, false>);
  check_launch(op);
}

template <typename T, typename C>
void dispatch_layout(const RopeCosSinLaunch& l, cudaStream_t stream, const char* op) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = l.access == RopeCosSinAccess::Vec16;
  if constexpr (!std::is_same_v<T, double>) {
    if (l.walk32) return launch_walk<T, C>(l, stream, op);
  }
  if (l.interleaved) {
    if (vec) launch<T, C, kVec, true>(l, stream, op);
    else launch<T, C, 1, true>(l, stream, op);
  } else {
    if (vec) launch<T, C, kVec, false>(l, stream, op);
    else launch<T, C, 1, false>(l, stream, op);
  }
}

}  // namespace cuda

void rope_cos_sin_cuda(const RopeCosSinLaunch& l, void* stream) {
  const char* op = l.backward ? "rope_qk_cos_sin_backward" : "rope_qk_cos_sin";
  auto st = static_cast<cudaStream_t>(stream);
  cuda::dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.table_element == l.element)
      cuda::dispatch_layout<T, T>(l, st, op);
    else if constexpr (!std::is_same_v<T, float>) {
      if (l.table_element == ElementKind::F32)
        cuda::dispatch_layout<T, float>(l, st, op);
      else
        fail(PlanErrorKind::Internal, op, "cos/sin dtype is neither float32 nor the data's");
    } else {
      fail(PlanErrorKind::Internal, op, "cos/sin dtype is neither float32 nor the data's");
    }
  });
}

}  // namespace baracuda::kernels
