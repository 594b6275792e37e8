// CUDA gather kernels: one index-space walker shared by the forward, the atomic backward
// and the sorted backward's key pass.
//
// The walker enumerates index's (coalesced) shape row-major in groups of G elements of
// the innermost dim (G = 4 on the RowsVec path, else 1). Each thread takes kGatherUnroll
// groups, issuing every load (index, then src or dout) before any use so that enough
// independent reads are in flight to hide the latency of the scattered src accesses.
// Offsets, with c the coordinates of a group's first element and idx the index value:
//   index: Σ c_d·s0_d          out/dout: Σ c_d·s1_d
//   src/dsrc: Σ c_d·s2_d + idx·dim_stride   (s2 at dim is 0; the dim coordinate is idx)
// An index outside [0, dim_size) is never dereferenced: the forward writes 0, the
// backward skips the element, and the block's first bad value goes to the error record.
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/gather.h"

namespace baracuda::kernels::cuda {

constexpr int kGatherThreads = 256;
constexpr int kGatherUnroll = 4;
// The vector paths below are written for the plan's groups of 4 elements (G = 4).
static_assert(kGatherGroup == 4, "the gather kernels' vector groups are 4 elements");

enum class WalkMode { Forward, Scatter, Keys };

// Sort keys and values of the sorted backward: unsigned, as wide as the offsets.
template <typename Idx>
using GatherKey = std::conditional_t<sizeof(Idx) == 4, uint32_t, uint64_t>;

template <typename Idx>
struct GatherWalkParams {
  Idx groups;          // numel / G
  Idx groups_per_row;  // innermost size / G
  FastDivmod row_div;  // divides by groups_per_row (32-bit offsets only)
  int outer_rank;      // coalesced rank - 1
  Idx outer_sizes[kMaxRank];
  FastDivmod outer_div[kMaxRank];
  Idx outer_strides[3][kMaxRank];
  Idx inner_strides[3];  // per element along the innermost dim (1 for operands 0, 1 when G = 4)
  Idx dim_stride;
  long long dim_size;
  int dim;
  int op;  // GatherErrorOp
  const void* index;
  const void* value;  // src (Forward) or dout (Scatter)
  void* target;       // out (Forward), or dsrc / its float accumulator (Scatter)
  GatherKey<Idx>* keys;    // Keys: dsrc offset per index-space position, `sentinel` if invalid
  GatherKey<Idx>* values;  // Keys: dout offset per index-space position
  GatherKey<Idx> sentinel;
  GatherErrorRecord* error;
};

// Records (value, size) unless an error is already pending. Only the first failing thread
// of the first failing block gets past the checks, so host-memory atomics stay rare.
__device__ __noinline__ inline void record_index_error(GatherErrorRecord* r, long long value,
                                                       long long size, int op, int dim) {
  if (r == nullptr) return;
  volatile GatherErrorRecord* vr = r;
  if (vr->claimed != 0) return;
  if (atomicCAS(&r->claimed, 0, 1) != 0) return;
  vr->value = value;
  vr->size = size;
  vr->op = op;
  vr->dim = dim;
  __threadfence_system();  // the fields before `ready`, as the host reads them
  vr->ready = 1;
  __threadfence_system();
}

// Every thread of the block must call this (it synchronizes the block).
__device__ __forceinline__ void report_block_error(bool bad, long long value, long long size,
                                                   int op, int dim, GatherErrorRecord* r) {
  __shared__ int s_reported;
  if (threadIdx.x == 0) s_reported = 0;
  if (__syncthreads_or(bad)) {  // also orders the reset above before the exchange below
    if (bad && atomicExch(&s_reported, 1) == 0) record_index_error(r, value, size, op, dim);
  }
}

// G consecutive elements at p, read once (streaming): 16-byte loads where G·sizeof(T) is
// a multiple of 16, one 8-byte load where it is 8, scalar for G = 1.
template <typename T, int G>
__device__ __forceinline__ void load_group(const T* p, T (&out)[G]) {
  constexpr int bytes = G * static_cast<int>(sizeof(T));
  if constexpr (G == 1) {
    out[0] = p[0];
  } else if constexpr (bytes % 16 == 0) {
    uint4 raw[bytes / 16];
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) raw[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
    memcpy(out, raw, bytes);
  } else {
    static_assert(bytes == 8, "groups are 8 or a multiple of 16 bytes");
    const uint2 raw = __ldcs(reinterpret_cast<const uint2*>(p));
    memcpy(out, &raw, bytes);
  }
}

template <typename T, int G>
__device__ __forceinline__ void store_group(T* p, const T (&v)[G]) {
  constexpr int bytes = G * static_cast<int>(sizeof(T));
  if constexpr (G == 1) {
    p[0] = v[0];
  } else if constexpr (bytes % 16 == 0) {
    uint4 raw[bytes / 16];
    memcpy(raw, v, bytes);
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) __stcs(reinterpret_cast<uint4*>(p) + i, raw[i]);
  } else {
    static_assert(bytes == 8, "groups are 8 or a multiple of 16 bytes");
    uint2 raw;
    memcpy(&raw, v, bytes);
    __stcs(reinterpret_cast<uint2*>(p), raw);
  }
}

__device__ __forceinline__ void atomic_accumulate(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_accumulate(double* p, double v) { atomicAdd(p, v); }

// T: value type (unused in Keys mode); I: int32_t or int64_t; Idx: uint32_t or int64_t.
template <typename T, typename I, typename Idx, int G, WalkMode M>
__global__ void __launch_bounds__(kGatherThreads)
    gather_walk_kernel(const GatherWalkParams<Idx> p) {
  using Acc = acc_t<T>;
  const I* index = static_cast<const I*>(p.index);
  const T* value = static_cast<const T*>(p.value);

  I idx[kGatherUnroll][G];
  T val[kGatherUnroll][G];
  Idx off[kGatherUnroll][3];
  bool bad = false;
  long long bad_value = 0;

  const Idx first = static_cast<Idx>(blockIdx.x) * (kGatherThreads * kGatherUnroll) + threadIdx.x;

  // 1. Offsets and index loads (and dout loads for the scatter).
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    const Idx g = first + static_cast<Idx>(u) * kGatherThreads;
    if (g < p.groups) {
      Idx row, col;
      if constexpr (sizeof(Idx) == 4) {
        row = p.row_div.div(g);
      } else {
        row = g / p.groups_per_row;
      }
      col = (g - row * p.groups_per_row) * G;
      Idx o0 = col * p.inner_strides[0], o1 = col * p.inner_strides[1],
          o2 = col * p.inner_strides[2];
#pragma unroll
      for (int d = kMaxRank - 2; d >= 0; --d) {
        if (d < p.outer_rank) {
          const Idx c = peel_coord(row, p.outer_div[d], p.outer_sizes[d]);
          o0 += c * p.outer_strides[0][d];
          o1 += c * p.outer_strides[1][d];
          o2 += c * p.outer_strides[2][d];
        }
      }
      off[u][0] = o0;
      off[u][1] = o1;
      off[u][2] = o2;
      if constexpr (G == 1)
        idx[u][0] = index[o0];
      else
        load_group<I, G>(index + o0, idx[u]);
      if constexpr (M == WalkMode::Scatter) {
        if constexpr (G == 1)
          val[u][0] = value[o1];
        else
          load_group<T, G>(value + o1, val[u]);
      }
    }
  }

  // 2. Range checks; the forward issues its src loads.
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    const Idx g = first + static_cast<Idx>(u) * kGatherThreads;
    if (g < p.groups) {
#pragma unroll
      for (int e = 0; e < G; ++e) {
        const long long v = static_cast<long long>(idx[u][e]);
        const bool ok = static_cast<unsigned long long>(v) <
                        static_cast<unsigned long long>(p.dim_size);
        if (!ok && !bad) {
          bad = true;
          bad_value = v;
        }
        if constexpr (M == WalkMode::Forward)
          val[u][e] = ok ? value[off[u][2] + static_cast<Idx>(e) * p.inner_strides[2] +
                                 static_cast<Idx>(v) * p.dim_stride]
                         : from_acc<T>(Acc(0));
      }
    }
  }

  // 3. Writes.
#pragma unroll
  for (int u = 0; u < kGatherUnroll; ++u) {
    const Idx g = first + static_cast<Idx>(u) * kGatherThreads;
    if (g < p.groups) {
      if constexpr (M == WalkMode::Forward) {
        store_group<T, G>(static_cast<T*>(p.target) + off[u][1], val[u]);
      } else {
#pragma unroll
        for (int e = 0; e < G; ++e) {
          const long long v = static_cast<long long>(idx[u][e]);
          const bool ok = static_cast<unsigned long long>(v) <
                          static_cast<unsigned long long>(p.dim_size);
          const Idx dst = off[u][2] + static_cast<Idx>(e) * p.inner_strides[2] +
                          (ok ? static_cast<Idx>(v) * p.dim_stride : Idx(0));
          if constexpr (M == WalkMode::Scatter) {
            if (ok) atomic_accumulate(static_cast<Acc*>(p.target) + dst, to_acc(val[u][e]));
          } else {  // Keys: position g·G + e in index-space order
            const Idx pos = g * G + e;
            p.keys[pos] = ok ? static_cast<GatherKey<Idx>>(dst) : p.sentinel;
            p.values[pos] =
                static_cast<GatherKey<Idx>>(off[u][1] + static_cast<Idx>(e) * p.inner_strides[1]);
          }
        }
      }
    }
  }

  report_block_error(bad, bad_value, p.dim_size, p.op, p.dim, p.error);
}

// Fills the walker's parameters from the plan's coalesced index space.
template <typename Idx>
GatherWalkParams<Idx> make_walk_params(const GatherLaunch& l) {
  const CoalescedDims& d = l.dims;
  const int last = d.rank - 1;
  GatherWalkParams<Idx> p{};
  p.groups = static_cast<Idx>(l.numel / l.vec);
  p.groups_per_row = static_cast<Idx>(d.sizes[last] / l.vec);
  p.row_div = FastDivmod(static_cast<uint32_t>(sizeof(Idx) == 4 ? d.sizes[last] / l.vec : 1));
  p.outer_rank = last;
  for (int i = 0; i < kMaxRank; ++i) {
    const bool outer = i < last;
    p.outer_sizes[i] = static_cast<Idx>(outer ? d.sizes[i] : 1);
    p.outer_div[i] = FastDivmod(static_cast<uint32_t>(outer && sizeof(Idx) == 4 ? d.sizes[i] : 1));
    for (int k = 0; k < 3; ++k) p.outer_strides[k][i] = static_cast<Idx>(outer ? d.strides[k][i] : 0);
  }
  for (int k = 0; k < 3; ++k) p.inner_strides[k] = static_cast<Idx>(d.strides[k][last]);
  p.dim_stride = static_cast<Idx>(l.dim_stride);
  p.dim_size = l.dim_size;
  p.dim = l.dim;
  p.op = static_cast<int>(l.backward ? GatherErrorOp::GatherBackward : GatherErrorOp::Gather);
  p.index = l.index;
  p.value = l.value;
  p.target = l.out;
  p.sentinel = static_cast<GatherKey<Idx>>(l.out_numel);
  p.error = gather_error_record(l.device);
  return p;
}

template <typename T, typename I, typename Idx, WalkMode M>
void launch_walk(const GatherLaunch& l, GatherWalkParams<Idx> p, cudaStream_t stream) {
  const unsigned int blocks =
      blocks_for(static_cast<int64_t>(p.groups), kGatherThreads * kGatherUnroll);
  if (l.vec == 4)
    gather_walk_kernel<T, I, Idx, 4, M><<<blocks, kGatherThreads, 0, stream>>>(p);
  else
    gather_walk_kernel<T, I, Idx, 1, M><<<blocks, kGatherThreads, 0, stream>>>(p);
}

// Calls f(I-typed tag) for the plan's index dtype.
template <typename F>
void dispatch_index(ElementKind e, F&& f) {
  if (e == ElementKind::I32)
    f(int32_t{});
  else
    f(int64_t{});
}

}  // namespace baracuda::kernels::cuda
