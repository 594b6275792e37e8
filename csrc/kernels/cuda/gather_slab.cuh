// CUDA gather column-slab kernels (core/gather_plan.h, "Column slabs"): a gather along a
// dim that is not the innermost, walked slab by slab so that each slab's random rows of
// src (forward) or of the accumulator (backward) stay in L2.
//
// Index space = outer × rows × cols (GatherSlab). Slab s = (outer position o, columns
// [k·W, k·W + W)); a tile is 2^t rows × W columns of one slab, 256 threads × 4 groups of
// G elements, group q = u·256 + thread covering elements q·G .. q·G + G - 1 of the tile
// in row-major order (row q·G >> log2 W, column q·G & (W - 1)): a warp reads whole rows.
// Offsets, with (o0, o1, o2) the outer offsets of index, value and src/dsrc:
//   index: o0 + row·rs0 + col·cs0    value (out/dout): o1 + row·rs1 + col·cs1
//   src/dsrc: o2 + col + idx·rs2     (src's column stride is 1; the row is the index)
//
// Forward: a persistent grid walks the tiles in order (tile b, b + grid, ...; every block
// resident, so the tiles in flight are about grid consecutive tiles of one or two slabs),
// loading the next tile's index while the current tile's src loads are in flight.
//
// Backward: items from an atomic ticket, in steps (step t: zero items of slab t, atomic
// items of slab t - zero_lead, convert items of slab t - zero_lead - lead):
//   zero:    rows of the slab's dsrc region (f32/f64), or of its float32 accumulator slot
//            in the ring (f16/bf16), set to 0 (256 threads × 16 groups of 4 per item).
//   atomic:  a tile of index rows: acc[idx][col] += dout[row][col] (atomicAdd at L2).
//   convert: rows of the accumulator slot converted to dsrc, then discarded from L2 (the
//            ring never goes back to DRAM), as large as the zero items.
// Each item of a phase waits until its slab's previous phase has finished (per-slab
// counters: zero before atomics, atomics before convert, convert of slab s - ring before
// zeroing slab s's ring slot). An item only waits on items with smaller ticket numbers,
// all taken by blocks that are running, so the smallest unfinished item can always
// proceed: no deadlock, whatever the grid size or residency.
#pragma once

#include "kernels/cuda/gather.cuh"

namespace baracuda::kernels::cuda {

static_assert(kGatherThreads == kGatherSlabThreads && kGatherUnroll == kGatherSlabGroups,
              "the plan's slab tile geometry must match the kernels'");

template <typename Idx>
struct GatherSlabParams {
  int outer_rank;
  Idx outer_sizes[kMaxRank];
  Idx outer_strides[3][kMaxRank];  // index, value, src/dsrc
  Idx rows, src_rows, cols;
  Idx row_strides[3];
  Idx col_strides[2];
  int width_log2;
  int tile_rows_log2;  // forward / atomic tiles: 2^k index rows
  int zc_rows_log2;    // zero / convert tiles (groups of 4): 2^k slab rows
  long long slabs_per_outer, slabs;
  long long tiles_per_slab;  // forward / atomic tiles per slab
  long long tiles;           // forward: slabs · tiles_per_slab
  long long dim_size;
  int dim;
  int op;  // GatherErrorOp
  const void* index;
  const void* value;  // src (forward) or dout (backward)
  void* target;       // out (forward) or dsrc (backward)
  GatherErrorRecord* error;
  // Backward.
  bool zero_slabs, convert, vec_target, discard;
  long long zero_lead, lead, ring;
  long long nz, na, nc, per_step, items;
  unsigned long long* ticket;
  unsigned* done[3];  // per slab: zero, atomic and convert items finished
  float* ring_base;
  Idx ring_slab_elems;  // src_rows · W
};

inline void check_slab_cuda(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, op, std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename Idx>
GatherSlabParams<Idx> make_slab_params(const GatherLaunch& l) {
  const GatherSlab& s = l.slab;
  GatherSlabParams<Idx> p{};
  p.outer_rank = s.outer.rank;
  for (int i = 0; i < kMaxRank; ++i) {
    const bool in = i < s.outer.rank;
    p.outer_sizes[i] = static_cast<Idx>(in ? s.outer.sizes[i] : 1);
    for (int k = 0; k < 3; ++k) p.outer_strides[k][i] = static_cast<Idx>(in ? s.outer.strides[k][i] : 0);
  }
  p.rows = static_cast<Idx>(s.rows);
  p.src_rows = static_cast<Idx>(s.src_rows);
  p.cols = static_cast<Idx>(s.cols);
  for (int k = 0; k < 3; ++k) p.row_strides[k] = static_cast<Idx>(s.row_strides[k]);
  for (int k = 0; k < 2; ++k) p.col_strides[k] = static_cast<Idx>(s.col_strides[k]);
  p.width_log2 = s.width_log2;
  int tile_log2 = 0;  // log2(256 · 4 · G)
  while ((1 << tile_log2) < kGatherThreads * kGatherUnroll * l.vec) ++tile_log2;
  p.tile_rows_log2 = tile_log2 - s.width_log2;
  int zc_log2 = 0;  // log2(256 · 16 · 4)
  while ((1 << zc_log2) < kGatherThreads * kGatherSlabZcGroups * 4) ++zc_log2;
  p.zc_rows_log2 = zc_log2 - s.width_log2;
  p.slabs_per_outer = s.slabs_per_outer;
  p.slabs = s.slabs;
  p.tiles_per_slab = (s.rows + (int64_t{1} << p.tile_rows_log2) - 1) >> p.tile_rows_log2;
  p.tiles = s.slabs * p.tiles_per_slab;
  p.dim_size = l.dim_size;
  p.dim = l.dim;
  p.op = static_cast<int>(l.backward ? GatherErrorOp::GatherBackward : GatherErrorOp::Gather);
  p.index = l.index;
  p.value = l.value;
  p.target = l.out;
  p.error = gather_error_record(l.device);
  p.zero_slabs = s.zero_slabs;
  p.convert = s.convert;
  p.vec_target = s.vec_target;
  p.discard = true;
  p.zero_lead = s.zero_slabs ? s.lead : 0;
  p.lead = s.lead;
  p.ring = s.ring;
  const long long zc_tiles = (s.src_rows + (int64_t{1} << p.zc_rows_log2) - 1) >> p.zc_rows_log2;
  p.nz = s.zero_slabs ? zc_tiles : 0;
  p.na = p.tiles_per_slab;
  p.nc = s.convert ? zc_tiles : 0;
  p.per_step = p.nz + p.na + p.nc;
  p.items = (s.slabs + p.zero_lead + (s.convert ? s.lead : 0)) * p.per_step;
  p.ring_slab_elems = static_cast<Idx>(s.src_rows << s.width_log2);
  return p;
}

// Where slab `slab`, index row `row0` starts: operand offsets of (row0, column 0) for
// index and value, and of column 0 (no row) for src/dsrc.
template <typename Idx>
struct SlabOrigin {
  Idx index_off, value_off, target_off;
  Idx row0, col0;
};

template <typename Idx>
__device__ __forceinline__ SlabOrigin<Idx> slab_origin(const GatherSlabParams<Idx>& p,
                                                       long long slab, Idx row0) {
  long long o = slab / p.slabs_per_outer;
  const long long k = slab - o * p.slabs_per_outer;
  Idx o0 = 0, o1 = 0, o2 = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d < p.outer_rank) {
      const long long size = static_cast<long long>(p.outer_sizes[d]);
      const long long q = o / size;
      const Idx c = static_cast<Idx>(o - q * size);
      o = q;
      o0 += c * p.outer_strides[0][d];
      o1 += c * p.outer_strides[1][d];
      o2 += c * p.outer_strides[2][d];
    }
  }
  SlabOrigin<Idx> r;
  r.col0 = static_cast<Idx>(k) << p.width_log2;
  r.row0 = row0;
  r.index_off = o0 + row0 * p.row_strides[0] + r.col0 * p.col_strides[0];
  r.value_off = o1 + row0 * p.row_strides[1] + r.col0 * p.col_strides[1];
  r.target_off = o2 + r.col0;
  return r;
}

// Group u of this thread in a tile of rows × W columns with groups of G: its row and
// column inside the tile.
template <typename Idx, int G>
__device__ __forceinline__ void slab_group(const GatherSlabParams<Idx>& p, int u, Idx& row,
                                           Idx& col) {
  const Idx e = static_cast<Idx>(u * kGatherThreads + static_cast<int>(threadIdx.x)) * G;
  row = e >> p.width_log2;
  col = e & ((Idx(1) << p.width_log2) - 1);
}

// One src element, asking L2 to fetch PF bytes around it on a miss (PF = 0: the sector).
#define BARACUDA_SLAB_LOAD(SIZE)                                                          \
  if constexpr (sizeof(T) == 2) {                                                         \
    unsigned short r;                                                                     \
    asm("ld.global.nc.L2::" #SIZE "B.b16 %0, [%1];" : "=h"(r) : "l"(p));                  \
    memcpy(&v, &r, 2);                                                                    \
  } else if constexpr (sizeof(T) == 4) {                                                  \
    unsigned int r;                                                                       \
    asm("ld.global.nc.L2::" #SIZE "B.b32 %0, [%1];" : "=r"(r) : "l"(p));                  \
    memcpy(&v, &r, 4);                                                                    \
  } else {                                                                                \
    unsigned long long r;                                                                 \
    asm("ld.global.nc.L2::" #SIZE "B.b64 %0, [%1];" : "=l"(r) : "l"(p));                  \
    memcpy(&v, &r, 8);                                                                    \
  }

template <int PF, typename T>
__device__ __forceinline__ T load_src_prefetch(const T* p) {
  static_assert(PF == 0 || PF == 64 || PF == 128 || PF == 256, "L2 prefetch size");
  T v;
  if constexpr (PF == 0) {
    v = __ldg(p);
  } else if constexpr (PF == 64) {
    BARACUDA_SLAB_LOAD(64)
  } else if constexpr (PF == 128) {
    BARACUDA_SLAB_LOAD(128)
  } else {
    BARACUDA_SLAB_LOAD(256)
  }
  return v;
}
#undef BARACUDA_SLAB_LOAD

// The index values of one forward / atomic tile (groups inside the slab and index rows).
template <typename I, typename Idx, int G>
__device__ __forceinline__ void slab_load_index(const GatherSlabParams<Idx>& p,
                                                const SlabOrigin<Idx>& t, const I* index,
                                                I (&idx)[kGatherUnroll][G]) {
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    Idx row, col;
    slab_group<Idx, G>(p, u, row, col);
    if (t.row0 + row < p.rows && t.col0 + col < p.cols) {
      const Idx off = t.index_off + row * p.row_strides[0] + col * p.col_strides[0];
      if constexpr (G == 1)
        idx[u][0] = __ldcs(index + off);
      else
        load_group<I, G>(index + off, idx[u]);
    }
  }
}

template <typename Idx>
__device__ __forceinline__ SlabOrigin<Idx> forward_tile(const GatherSlabParams<Idx>& p,
                                                        long long t) {
  const long long slab = t / p.tiles_per_slab;
  const long long in_slab = t - slab * p.tiles_per_slab;
  return slab_origin(p, slab, static_cast<Idx>(in_slab) << p.tile_rows_log2);
}

// out[r][c] = src[o2 + c + index[r][c]·rs2], 0 where the index is out of range.
template <typename T, typename I, typename Idx, int G, int PF>
__global__ void __launch_bounds__(kGatherThreads, kGatherSlabForwardBlocksPerSm)
    gather_slab_forward_kernel(const GatherSlabParams<Idx> p) {
  using Acc = acc_t<T>;
  const I* index = static_cast<const I*>(p.index);
  const T* src = static_cast<const T*>(p.value);
  T* out = static_cast<T*>(p.target);
  bool bad = false;
  long long bad_value = 0;

  I idx[kGatherUnroll][G];
  long long t = blockIdx.x;
  SlabOrigin<Idx> cur{};
  if (t < p.tiles) {
    cur = forward_tile(p, t);
    slab_load_index<I, Idx, G>(p, cur, index, idx);
  }
  for (; t < p.tiles; t += gridDim.x) {
    // The next tile's index loads go out before this tile's src loads.
    const long long tn = t + gridDim.x;
    SlabOrigin<Idx> next{};
    I next_idx[kGatherUnroll][G] = {};
    if (tn < p.tiles) {
      next = forward_tile(p, tn);
      slab_load_index<I, Idx, G>(p, next, index, next_idx);
    }

    T val[kGatherUnroll][G];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      Idx row, col;
      slab_group<Idx, G>(p, u, row, col);
      if (cur.row0 + row < p.rows && cur.col0 + col < p.cols) {
#pragma unroll
        for (int e = 0; e < G; ++e) {
          const long long v = static_cast<long long>(idx[u][e]);
          const bool ok = static_cast<unsigned long long>(v) <
                          static_cast<unsigned long long>(p.dim_size);
          if (!ok && !bad) {
            bad = true;
            bad_value = v;
          }
          val[u][e] = ok ? load_src_prefetch<PF>(src + cur.target_off + col + static_cast<Idx>(e) +
                                                 static_cast<Idx>(v) * p.row_strides[2])
                         : from_acc<T>(Acc(0));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      Idx row, col;
      slab_group<Idx, G>(p, u, row, col);
      if (cur.row0 + row < p.rows && cur.col0 + col < p.cols) {
        const Idx off = cur.value_off + row * p.row_strides[1] + col * p.col_strides[1];
        store_group<T, G>(out + off, val[u]);
      }
    }

    cur = next;
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u)
#pragma unroll
      for (int e = 0; e < G; ++e) idx[u][e] = next_idx[u][e];
  }
  report_block_error(bad, bad_value, p.dim_size, p.op, p.dim, p.error);
}

// ---- backward ---------------------------------------------------------------------

// Thread 0 waits until *counter >= target (items of an earlier phase of the slab done),
// then the block goes on; the fence makes their writes visible to the block's accesses.
__device__ __forceinline__ void slab_wait(const unsigned* counter, long long target) {
  if (threadIdx.x == 0) {
    const volatile unsigned* c = counter;
    while (static_cast<long long>(*c) < target) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();
}

// The block's item is done: its writes (ordered before thread 0's by the barrier, and
// before the count by the fence) are visible to whoever sees the count.
__device__ __forceinline__ void slab_signal(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
  }
}

template <typename Idx>
__device__ __forceinline__ float* ring_slot(const GatherSlabParams<Idx>& p, long long slab) {
  return p.ring_base + static_cast<size_t>(slab % p.ring) * static_cast<size_t>(p.ring_slab_elems);
}

template <typename Acc>
__device__ __forceinline__ void store_zero4(Acc* q) {
  const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < static_cast<int>(4 * sizeof(Acc) / 16); ++i) reinterpret_cast<uint4*>(q)[i] = z;
}

// Zero item j of slab `slab`: rows [j·2^zc, (j + 1)·2^zc) of its dsrc region (f32/f64)
// or ring slot (f16/bf16), kGatherSlabZcGroups groups of 4 columns per thread.
template <typename Acc, typename Idx>
__device__ void slab_zero(const GatherSlabParams<Idx>& p, long long slab, long long j) {
  const SlabOrigin<Idx> t = slab_origin(p, slab, Idx(0));
  const Idx row0 = static_cast<Idx>(j) << p.zc_rows_log2;
#pragma unroll 4
  for (int u = 0; u < kGatherSlabZcGroups; ++u) {
    Idx row, col;
    slab_group<Idx, 4>(p, u, row, col);
    row += row0;
    if (row >= p.src_rows || t.col0 + col >= p.cols) continue;
    if (p.convert) {
      store_zero4(ring_slot(p, slab) + (row << p.width_log2) + col);
    } else {
      Acc* q = static_cast<Acc*>(p.target) + t.target_off + row * p.row_strides[2] + col;
      if (p.vec_target) {
        store_zero4(q);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (t.col0 + col + e < p.cols) q[e] = Acc(0);
      }
    }
  }
}

// Atomic item j of slab `slab`: index rows [j·2^t, (j + 1)·2^t).
template <typename T, typename I, typename Idx, int G>
__device__ void slab_scatter(const GatherSlabParams<Idx>& p, long long slab, long long j,
                             bool& bad, long long& bad_value) {
  using Acc = acc_t<T>;
  const SlabOrigin<Idx> t = slab_origin(p, slab, static_cast<Idx>(j) << p.tile_rows_log2);
  const I* index = static_cast<const I*>(p.index);
  const T* dout = static_cast<const T*>(p.value);
  I idx[kGatherUnroll][G];
  T val[kGatherUnroll][G];
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {  // every load before any atomic
    Idx row, col;
    slab_group<Idx, G>(p, u, row, col);
    if (t.row0 + row < p.rows && t.col0 + col < p.cols) {
      const Idx io = t.index_off + row * p.row_strides[0] + col * p.col_strides[0];
      const Idx vo = t.value_off + row * p.row_strides[1] + col * p.col_strides[1];
      if constexpr (G == 1) {
        idx[u][0] = __ldcs(index + io);
        val[u][0] = dout[vo];
      } else {
        load_group<I, G>(index + io, idx[u]);
        load_group<T, G>(dout + vo, val[u]);
      }
    }
  }
  Acc* acc = p.convert ? reinterpret_cast<Acc*>(ring_slot(p, slab))
                       : static_cast<Acc*>(p.target) + t.target_off;
  const Idx pitch = p.convert ? (Idx(1) << p.width_log2) : p.row_strides[2];
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    Idx row, col;
    slab_group<Idx, G>(p, u, row, col);
    if (t.row0 + row < p.rows && t.col0 + col < p.cols) {
#pragma unroll
      for (int e = 0; e < G; ++e) {
        const long long v = static_cast<long long>(idx[u][e]);
        if (static_cast<unsigned long long>(v) < static_cast<unsigned long long>(p.dim_size)) {
          atomic_accumulate(acc + static_cast<Idx>(v) * pitch + col + static_cast<Idx>(e),
                            to_acc(val[u][e]));
        } else if (!bad) {
          bad = true;
          bad_value = v;
        }
      }
    }
  }
}

// Convert item j of slab `slab` (f16/bf16): ring rows [j·2^zc, (j + 1)·2^zc) to dsrc,
// then those ring lines are discarded from L2 (never written back to DRAM).
template <typename T, typename Idx>
__device__ void slab_convert(const GatherSlabParams<Idx>& p, long long slab, long long j) {
  const SlabOrigin<Idx> t = slab_origin(p, slab, Idx(0));
  const Idx row0 = static_cast<Idx>(j) << p.zc_rows_log2;
  const float* ring = ring_slot(p, slab);
  T* dsrc = static_cast<T*>(p.target);
  for (int u0 = 0; u0 < kGatherSlabZcGroups; u0 += kGatherUnroll) {
    float4 a[kGatherUnroll];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {  // four loads before their stores
      Idx row, col;
      slab_group<Idx, 4>(p, u0 + u, row, col);
      row += row0;
      // The atomics went to L2: read there (an L1 line could be stale from a past use).
      if (row < p.src_rows && t.col0 + col < p.cols)
        a[u] = __ldcg(reinterpret_cast<const float4*>(ring + (row << p.width_log2) + col));
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      Idx row, col;
      slab_group<Idx, 4>(p, u0 + u, row, col);
      row += row0;
      if (row >= p.src_rows || t.col0 + col >= p.cols) continue;
      const T v[4] = {from_acc<T>(a[u].x), from_acc<T>(a[u].y), from_acc<T>(a[u].z),
                      from_acc<T>(a[u].w)};
      T* q = dsrc + t.target_off + row * p.row_strides[2] + col;
      if (p.vec_target) {
        store_group<T, 4>(q, v);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (t.col0 + col + e < p.cols) q[e] = v[e];
      }
    }
  }
  if (!p.discard) return;
  __syncthreads();  // every read of these lines is done
  const Idx rows = min(p.src_rows - row0, Idx(1) << p.zc_rows_log2);
  const char* base = reinterpret_cast<const char*>(ring + (row0 << p.width_log2));
  // rows · W · 4 bytes, a multiple of 256 (W >= 64), from a 256-byte aligned slot row.
  const long long lines = (static_cast<long long>(rows) << p.width_log2) * 4 / 128;
  for (long long i = threadIdx.x; i < lines; i += kGatherThreads)
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(base + i * 128) : "memory");
}

// One backward item (uniform across the block): its phase and slab from the step
// layout, the wait on the slab's previous phase, the work, the completion count.
template <typename T, typename I, typename Idx, int G>
__device__ void slab_item(const GatherSlabParams<Idx>& p, long long item, bool& bad,
                          long long& bad_value) {
  using Acc = acc_t<T>;
  const long long step = item / p.per_step;
  long long j = item - step * p.per_step;
  if (j < p.nz) {
    const long long slab = step;
    if (slab >= p.slabs) return;
    if (p.convert && slab >= p.ring) slab_wait(p.done[2] + (slab - p.ring), p.nc);
    slab_zero<Acc, Idx>(p, slab, j);
    slab_signal(p.done[0] + slab);
  } else if ((j -= p.nz) < p.na) {
    const long long slab = step - p.zero_lead;
    if (slab < 0 || slab >= p.slabs) return;
    if (p.zero_slabs) slab_wait(p.done[0] + slab, p.nz);
    slab_scatter<T, I, Idx, G>(p, slab, j, bad, bad_value);
    if (p.convert) slab_signal(p.done[1] + slab);
  } else {
    j -= p.na;
    const long long slab = step - p.zero_lead - p.lead;
    if (slab < 0 || slab >= p.slabs) return;
    slab_wait(p.done[1] + slab, p.na);
    if constexpr (!std::is_same_v<T, Acc>) slab_convert<T, Idx>(p, slab, j);
    slab_signal(p.done[2] + slab);
  }
}

// Items in ticket order; thread 0 takes the next ticket while the block works on the
// current item (a block holds at most one unstarted item, which never blocks anyone:
// the smallest unfinished item is always being worked on).
template <typename T, typename I, typename Idx, int G>
__global__ void __launch_bounds__(kGatherThreads, kGatherSlabBackwardBlocksPerSm)
    gather_slab_backward_kernel(const GatherSlabParams<Idx> p) {
  __shared__ long long s_item;
  bool bad = false;
  long long bad_value = 0;
  if (threadIdx.x == 0) s_item = static_cast<long long>(atomicAdd(p.ticket, 1ull));
  __syncthreads();
  long long item = s_item;
  while (item < p.items) {
    unsigned long long next = 0;
    if (threadIdx.x == 0) next = atomicAdd(p.ticket, 1ull);
    slab_item<T, I, Idx, G>(p, item, bad, bad_value);
    __syncthreads();  // everyone has read s_item
    if (threadIdx.x == 0) s_item = static_cast<long long>(next);
    __syncthreads();
    item = s_item;
  }
  report_block_error(bad, bad_value, p.dim_size, p.op, p.dim, p.error);
}

// ---- launchers ----------------------------------------------------------------------

template <typename T, typename I, typename Idx, int G, int PF>
void launch_slab_forward_kernel(const GatherSlabParams<Idx>& p, int blocks, cudaStream_t stream) {
  gather_slab_forward_kernel<T, I, Idx, G, PF><<<blocks, kGatherThreads, 0, stream>>>(p);
}

template <typename Idx>
void launch_slab_forward(const GatherLaunch& l, cudaStream_t stream) {
  const GatherSlabParams<Idx> p = make_slab_params<Idx>(l);
  const int blocks = l.slab.blocks;
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(l.index_element, [&](auto index_tag) {
      using I = decltype(index_tag);
      if (l.vec == 4) {
        if (l.slab.prefetch == 128)
          launch_slab_forward_kernel<T, I, Idx, 4, 128>(p, blocks, stream);
        else
          launch_slab_forward_kernel<T, I, Idx, 4, 0>(p, blocks, stream);
      } else {
        if (l.slab.prefetch == 128)
          launch_slab_forward_kernel<T, I, Idx, 1, 128>(p, blocks, stream);
        else
          launch_slab_forward_kernel<T, I, Idx, 1, 0>(p, blocks, stream);
      }
    });
  });
  check_launch("gather");
}

// Workspace (GatherSlab): ticket and per-slab counters (zeroed here), then the ring.
template <typename Idx>
GatherSlabParams<Idx> make_slab_backward_params(const GatherLaunch& l, cudaStream_t stream) {
  const GatherSlab& s = l.slab;
  char* ws = static_cast<char*>(l.workspace.data);
  if (reinterpret_cast<uintptr_t>(ws) % kGatherWorkspaceAlign != 0)
    fail(PlanErrorKind::Internal, "gather_backward", "the slab workspace must be 256-byte aligned");
  check_slab_cuda(cudaMemsetAsync(ws, 0, s.counter_bytes, stream), "gather_backward",
                  "zeroing the slab counters");
  if (l.zero_fill)  // dsrc elements outside every slab
    check_slab_cuda(cudaMemsetAsync(l.out, 0, static_cast<size_t>(l.out_numel) * element_size(l.element),
                                    stream),
                    "gather_backward", "zero-filling dsrc");
  GatherSlabParams<Idx> p = make_slab_params<Idx>(l);
  p.ticket = reinterpret_cast<unsigned long long*>(ws);
  for (int k = 0; k < 3; ++k)
    p.done[k] = reinterpret_cast<unsigned*>(ws + 8) + static_cast<size_t>(k) * static_cast<size_t>(s.slabs);
  p.ring_base = s.convert ? reinterpret_cast<float*>(ws + s.ring_offset) : nullptr;
  return p;
}

template <typename T, typename I, typename Idx, int G>
void launch_slab_backward_kernel(const GatherSlabParams<Idx>& p, int blocks, cudaStream_t stream) {
  gather_slab_backward_kernel<T, I, Idx, G><<<blocks, kGatherThreads, 0, stream>>>(p);
}

template <typename Idx>
void launch_slab_backward(const GatherLaunch& l, cudaStream_t stream) {
  const GatherSlabParams<Idx> p = make_slab_backward_params<Idx>(l, stream);
  const int blocks = l.slab.blocks;
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(l.index_element, [&](auto index_tag) {
      using I = decltype(index_tag);
      if (l.vec == 4)
        launch_slab_backward_kernel<T, I, Idx, 4>(p, blocks, stream);
      else
        launch_slab_backward_kernel<T, I, Idx, 1>(p, blocks, stream);
    });
  });
  check_launch("gather_backward");
}

}  // namespace baracuda::kernels::cuda
