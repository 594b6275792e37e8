// CUDA RMSNorm kernels, forward and backward (core/rmsnorm_plan.h has the formulas and
// the variants).
//
// Rows variant: a row per group of `group` threads (a power of two up to a warp, or whole
// warps), `rows_per_block` groups a block. Thread t of a group holds vectors t, t + group,
// ... (`vecs` of them, 16 bytes of x each) in registers, so every input is read once: the
// group sums h² (warp shuffles, then shared memory across the group's warps, in a fixed
// order), and writes y from the registers. The backward walks the row groups of its
// block (b, b + grid, ...), each thread keeping the dw partial of its own columns in
// registers over the rows; at the end the block's groups add their partials in shared
// memory in group order and write one partial row to the workspace, and a second kernel
// sums the grid's partial rows per column in order. Every sum has a fixed order: the
// results are bitwise reproducible on a given GPU. The backward's groups, where the plan
// stages them (RmsNormLaunch::stage; not the gated op's with a bias), read dy and x (and z)
// from a ring of two rows in shared memory that cp.async fills with the next row while this
// one computes (the same values in the same order: the same bits).
//
// Strided variant (any strides, any N, or rows wider than the registers hold): a row per
// block of kRmsNormLoopThreads threads, two passes over the row (the backward's dw
// partial accumulated in the block's workspace row).
//
// The gated op (Gated = true: separate instantiations, so the plain ops carry none of
// the gate's, bias's or row groups' work; ptxas for sm_90 still gives their rows backward
// 12 more registers than before the templating, 90 for one bfloat16 vector a thread, one
// 512-thread block an SM either way) runs the same kernels over row groups: block (b, y) takes the groups
// g = y, y + gridDim.y, ... of its rows, a row group being `cols` elements at column
// g·cols; z is held in registers next to x, silu(z) is recomputed where the second
// pass needs it (16-bit data: the hardware exp and reciprocal), and the backward keeps
// db partials next to dw's, flushed per row group to the block's workspace rows.
//
// rstd is rsqrtf(mean + eps) in float32, as torch's CUDA rsqrt computes it (1/sqrt in
// float64).
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rmsnorm.h"
#include "kernels/rmsnorm_math.h"

namespace baracuda::kernels::cuda {

struct RmsNormParams {
  int64_t rows, cols;
  int lead_rank;
  int64_t lead_sizes[kMaxRank];
  int64_t lead_strides[kMaxOperands][kMaxRank];
  int64_t col_stride[kMaxOperands];
  int64_t w_stride;
  RmsNormConvention conv;
  bool has_weight, has_residual;
  RmsNormGate gate;  // the gated op
  bool has_bias;
  int64_t ngroups, b_stride;
  int64_t dz_row_stride;  // the gated backward's dz (and the recomputed y in p.y)
  float eps, inv_cols;
  double eps64, inv_cols64;
  int group, rows_per_block;
  int stage_at, stage_row_bytes;  // the staged rows' rings in shared memory (RmsNormLaunch::stage)
  const void* x;
  const void* residual;
  const void* weight;
  const void* z;
  const void* bias;
  const void* dy;
  const void* dh;
  const void* rstd_in;
  void* y;
  void* h;
  void* rstd;
  void* dx;
  void* dz;
  void* workspace;  // backward: dw (then db) partials [gridDim.x, ngroups·cols]

  template <typename Acc>
  __device__ __forceinline__ Acc eps_of() const {
    if constexpr (std::is_same_v<Acc, double>) return eps64; else return eps;
  }
  template <typename Acc>
  __device__ __forceinline__ Acc inv_of() const {
    if constexpr (std::is_same_v<Acc, double>) return inv_cols64; else return inv_cols;
  }
  __device__ __forceinline__ void offsets(int n, int64_t row, int64_t* off) const {
    rms_norm_row_offsets(lead_rank, lead_sizes, &lead_strides[0][0], n, row, off);
  }
};

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return 1.0 / sqrt(v); }

// v rounded to T and back (the llama convention's cast).
template <typename T>
struct RoundTo {
  __device__ __forceinline__ acc_t<T> operator()(acc_t<T> v) const { return to_acc(from_acc<T>(v)); }
};

// V consecutive elements: 16-byte accesses when they fill whole 16-byte words (the plan
// has checked the alignment), element by element otherwise.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, T (&out)[V]) {
  if constexpr (sizeof(T) * V % 16 == 0) {
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(T) * V / 16); ++i) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + i);
      memcpy(reinterpret_cast<char*>(out) + 16 * i, &raw, 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = p[i];
  }
}

// load_vec from shared memory (16-byte aligned, whole 16-byte words: the staged rows).
template <typename T, int V>
__device__ __forceinline__ void load_vec_shared(const T* p, T (&out)[V]) {
  static_assert(sizeof(T) * V % 16 == 0, "whole 16-byte words");
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) * V / 16); ++i) {
    const uint4 raw = reinterpret_cast<const uint4*>(p)[i];
    memcpy(reinterpret_cast<char*>(out) + 16 * i, &raw, 16);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const T (&in)[V]) {
  if constexpr (sizeof(T) * V % 16 == 0) {
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(T) * V / 16); ++i) {
      uint4 raw;
      memcpy(&raw, reinterpret_cast<const char*>(in) + 16 * i, 16);
      reinterpret_cast<uint4*>(p)[i] = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = in[i];
  }
}

// The sum of v over the `group` threads of a row (groups are consecutive threads), the
// same bits in every thread of the group. red: 32 entries of shared memory (a block has
// at most 32 warps). Every thread of the group calls it. Groups that span warps (whole
// warps) meet at a barrier of their own, named 1 + the group's index in the block (0 is
// __syncthreads'; the plan's blocks hold at most 8 such groups), so that the row groups of
// a block do not wait for each other's loads between rows: one group's loads overlap
// another's arithmetic.
__device__ __forceinline__ void group_barrier(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + static_cast<int>(threadIdx.x) / group), "r"(group) : "memory");
}

template <typename Acc>
__device__ __forceinline__ Acc group_sum(Acc v, int group, Acc* red) {
  // The xor butterfly stays inside aligned groups of up to 32 lanes; a + b = b + a, so
  // every lane ends with the same value.
  for (int offset = (group < 32 ? group : 32) / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (group <= 32) return v;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) red[warp] = v;
  group_barrier(group);
  const int first = threadIdx.x / group * (group / 32);
  Acc total = 0;
  for (int w = 0; w < group / 32; ++w) total += red[first + w];
  group_barrier(group);  // the group's entries of red are free again
  return total;
}

// body(row, active, off) for each row group of this block, b, b + grid, ... (row: this
// thread's row in the group, active: row < rows, off: the row's offsets in the N input
// operands). Every thread of the block runs the same iterations, as group_sum needs.
template <int N, typename F>
__device__ __forceinline__ void for_each_row_group(const RmsNormParams& p, F&& body) {
  const int64_t rows_per_block = p.rows_per_block;
  for (int64_t base = blockIdx.x * rows_per_block; base < p.rows;
       base += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = base + threadIdx.x / p.group;
    const bool active = row < p.rows;
    int64_t off[N] = {};
    if (active) p.offsets(N, row, off);
    body(row, active, off);
  }
}

// for_each_row_group with the next row's loads in flight (the plain backward's `stage`):
// before a row's body, copy(next_off, slot) puts the group's next row into the other slot
// of a ring of two (cp.async, one group of copies an iteration, even when empty) and
// returns a value of it loaded into a register (its rstd); body(row, active, off, slot,
// value) then finds its own row complete in `slot` (each thread waits for its own copies
// and reads only what it copied, so no barrier is needed) and its value loaded.
template <int N, typename Acc, typename Copy, typename F>
__device__ __forceinline__ void for_each_row_group_staged(const RmsNormParams& p, Copy&& copy, F&& body) {
  const int64_t rows_per_block = p.rows_per_block, step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  const int sub = static_cast<int>(threadIdx.x) / p.group;
  const auto issue = [&](int64_t base, int slot) {
    const int64_t row = base + sub;
    Acc v = 0;
    if (row < p.rows) {
      int64_t off[N] = {};
      p.offsets(N, row, off);
      v = copy(off, slot);
    }
    cp_async_commit();
    return v;
  };
  int64_t base = blockIdx.x * rows_per_block;
  Acc next = issue(base, 0);
  for (int slot = 0; base < p.rows; base += step, slot ^= 1) {
    const Acc value = next;
    next = issue(base + step, slot ^ 1);
    cp_async_wait<1>();  // this row's copies (the next row's may still be in flight)
    const int64_t row = base + sub;
    const bool active = row < p.rows;
    int64_t off[N] = {};
    if (active) p.offsets(N, row, off);
    body(row, active, off, slot, value);
  }
  cp_async_wait<0>();  // (the last, empty group)
}

// body(g) for the row groups g = blockIdx.y, + gridDim.y, ... < ngroups of the gated op;
// the plain ops: body(0), once.
template <bool Gated, typename F>
__device__ __forceinline__ void for_each_group(const RmsNormParams& p, F&& body) {
  if constexpr (Gated) {
    for (int64_t g = blockIdx.y; g < p.ngroups; g += gridDim.y) body(g);
  } else {
    body(int64_t{0});
  }
}

// The index of row group g of `row` (the position of its rstd; its outputs start at
// that times cols).
template <bool Gated>
__device__ __forceinline__ int64_t row_group(const RmsNormParams& p, int64_t row, int64_t g) {
  if constexpr (Gated) return row * p.ngroups + g; else return row;
}

// The gated op's silu(z) takes the hardware exp and reciprocal for 16-bit data.
template <typename T>
constexpr bool kFastGate = sizeof(T) == 2;

// v·silu(*z) where the gated op's gate sits at `where` (Before: v is x, giving h; After,
// in the backward: v is dy, giving u), else v (the plain ops: always v). z is read only
// then.
template <bool Gated, typename T>
__device__ __forceinline__ acc_t<T> gated_at(const RmsNormParams& p, RmsNormGate where,
                                             acc_t<T> v, const T* z) {
  if constexpr (Gated)
    if (p.gate == where) return silu_gate<kFastGate<T>>(v, acc_t<T>(to_acc(*z)));
  return v;
}

// n·w (+ b): the gated op's output before the gate, the product rounded on its own (no
// fused multiply-add), so that the forward and the backward's recomputed y
// (gated_rms_norm_backward_into) have the same bits whatever the compiler contracts.
template <typename Acc>
__device__ __forceinline__ Acc gated_pre(Acc n, Acc w, bool has_bias, Acc b) {
  Acc o;
  if constexpr (std::is_same_v<Acc, double>) o = __dmul_rn(n, w); else o = __fmul_rn(n, w);
  return has_bias ? o + b : o;
}

// f(k, c) for the vectors a thread holds of a row: vector k (< VPT) starts at column
// c = (lane + k·group)·V, for those with c < cols (cols 0 for an inactive row).
template <int VPT, int V, typename F>
__device__ __forceinline__ void for_each_vector(int lane, int group, int64_t cols, F&& f) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t c = static_cast<int64_t>(lane + k * group) * V;
    if (c < cols) f(k, c);
  }
}

// ---- rows variant ----------------------------------------------------------------------

// Res: the plain op with a residual (add_rms_norm), instantiated apart: as a runtime flag
// its loads and h's stores cost the plain op's kernel registers.
// Stage (the plan's `stage` on the forward: the gated op; not with Res): x and z come
// through a ring of two row buffers a group in shared memory (rms_norm_smem_bytes), the
// next row's copies in flight while a row computes (for_each_row_group_staged's steps,
// here in the row loop itself: with the row's work in a lambda the unstaged kernels'
// code changed, add_rms_norm's 110 -> 121 µs at [8192, 4096] bf16 on an H100), over a
// resident grid (the plan's grid: the blocks that run at once).
template <typename T, typename W, typename O, int VPT, bool Gated, bool Res, bool Stage = false>
__global__ void __launch_bounds__(Gated ? kRmsNormGatedMaxGroup : kRmsNormMaxGroup)
    rms_norm_rows_forward(const RmsNormParams p) {
  static_assert(!(Gated && Res), "the gated op has no residual");
  static_assert(!Stage || Gated, "only the gated op's forward is staged");
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool Fast = kFastGate<T>;
  __shared__ Acc red[32];
  const int G = p.group;
  const int lane = threadIdx.x % G;
  for_each_group<Gated>(p, [&](int64_t g) {
    const int64_t c0 = g * p.cols;  // the row group's first column (unit strides here)
    const W* w = static_cast<const W*>(p.weight) + c0;
    const W* b = static_cast<const W*>(p.bias) + c0;
    // The block's row groups base = b, b + grid, ... in turn (every thread runs the same
    // iterations, as group_sum needs); one pass of the y grid unless there are more than
    // 2^31 - 1 row groups. This thread's group takes row base + sub.
    const int sub = threadIdx.x / G;
    const int64_t step = static_cast<int64_t>(gridDim.x) * p.rows_per_block;
    // Stage: the group's ring of two rows of x (then z); issue(base, slot) copies the
    // group's row of `base` into `slot` (one group of copies, even when empty).
    extern __shared__ __align__(16) unsigned char fwd_smem_raw[];
    T* const ring = reinterpret_cast<T*>(fwd_smem_raw + p.stage_at + sub * 2 * p.stage_row_bytes);
    const int64_t slot_elems = p.stage_row_bytes / static_cast<int64_t>(sizeof(T));
    const auto issue = [&](int64_t base, int slot) {
      const int64_t row = base + sub;
      if (row < p.rows) {
        int64_t off[2] = {};
        p.offsets(2, row, off);
        const T* x = static_cast<const T*>(p.x) + off[kRmsX] + c0;
        const T* z = static_cast<const T*>(p.z) + off[kRmsZ] + c0;
        T* sx = ring + slot * slot_elems;
        for_each_vector<VPT, V>(lane, G, p.cols, [&](int, int64_t c) {
          cp_async16(sx + c, x + c);
          if (p.gate != RmsNormGate::None) cp_async16(sx + p.cols + c, z + c);
        });
      }
      cp_async_commit();
    };
    if constexpr (Stage) issue(blockIdx.x * p.rows_per_block, 0);
    int slot = 0;
    for (int64_t base = blockIdx.x * p.rows_per_block; base < p.rows; base += step, slot ^= 1) {
      if constexpr (Stage) {
        issue(base + step, slot ^ 1);
        cp_async_wait<1>();  // this row's copies (each thread reads only what it copied)
      }
      const int64_t row = base + sub;
      const bool active = row < p.rows;
      // The row's vectors: x, and z (the gated op) or the residual (Res, into zv). Every
      // load of the row is issued before h is stored: with h's stores between them, each
      // vector's loads waited for the previous vector's store (the compiler keeps a load
      // after a store that may alias it), a round trip to memory per vector.
      int64_t off[2] = {};
      if (active) p.offsets(2, row, off);
      const T* x = Stage ? ring + slot * slot_elems : static_cast<const T*>(p.x) + off[kRmsX] + c0;
      const T* z = Stage ? x + p.cols : static_cast<const T*>(p.z) + off[kRmsZ] + c0;
      T v[VPT][V], zv[VPT][V];
      for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t c) {
        if constexpr (Stage) {
          load_vec_shared<T, V>(x + c, v[k]);
          if (p.gate != RmsNormGate::None) load_vec_shared<T, V>(z + c, zv[k]);
        } else {
          load_vec<T, V>(x + c, v[k]);
          if constexpr (Gated) {
            if (p.gate != RmsNormGate::None) load_vec<T, V>(z + c, zv[k]);
          } else if constexpr (Res) {
            load_vec<T, V>(static_cast<const T*>(p.residual) + off[kRmsResidual] + c, zv[k]);
          }
        }
      });
      if constexpr (Res)  // h = x + residual, rounded to T, stored
        for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t c) {
#pragma unroll
          for (int i = 0; i < V; ++i) v[k][i] = from_acc<T>(to_acc(v[k][i]) + to_acc(zv[k][i]));
          store_vec<T, V>(static_cast<T*>(p.h) + row * p.cols + c, v[k]);
        });
      Acc ss = 0;
      for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const Acc a = gated_at<Gated>(p, RmsNormGate::Before, to_acc(v[k][i]), &zv[k][i]);
          ss += a * a;
        }
      });
      ss = group_sum(ss, G, red);
      const Acc rstd = rsqrt_acc(ss * p.inv_of<Acc>() + p.eps_of<Acc>());
      if (active) {
        const int64_t rg = row_group<Gated>(p, row, g);
        if (lane == 0) static_cast<Acc*>(p.rstd)[rg] = rstd;
        O* y = static_cast<O*>(p.y) + rg * p.cols;
        for_each_vector<VPT, V>(lane, G, p.cols, [&](int k, int64_t c) {
          W wv[V], bv[V];
          if (p.has_weight) load_vec<W, V>(w + c, wv);
          if (Gated && p.has_bias) load_vec<W, V>(b + c, bv);
          O out[V];
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const Acc wi = p.has_weight ? Acc(to_acc(wv[i])) : Acc(0);
            Acc o;
            if constexpr (Gated) {  // (n·w + b), then ·silu(z) with the gate after the norm
              o = gated_pre(gated_at<Gated>(p, RmsNormGate::Before, to_acc(v[k][i]), &zv[k][i]) * rstd, wi,
                            p.has_bias, p.has_bias ? Acc(to_acc(bv[i])) : Acc(0));
              if (p.gate == RmsNormGate::After) o = silu_gate<Fast>(o, Acc(to_acc(zv[k][i])));
            } else {
              o = rms_norm_output<Acc>(p.conv, p.has_weight, to_acc(v[k][i]) * rstd, wi, RoundTo<T>());
            }
            out[i] = from_acc<O>(o);
          }
          store_vec<O, V>(y + c, out);
        });
      }
    }
    if constexpr (Stage) cp_async_wait<0>();  // (the last, empty group)
  });
}

// The block's partial row of `acc` (each thread's sums over its columns of the row group)
// into `row`: its row groups' registers added in shared memory `smem` (cols entries) in
// group order when the block has several (R > 1). Every thread of the block calls it.
template <typename Acc, int VPT, int V>
__device__ __forceinline__ void store_block_partial(const Acc (&acc)[VPT][V], Acc* row, Acc* smem,
                                                    int G, int R, int64_t cols) {
  const int lane = threadIdx.x % G, grp = threadIdx.x / G;
  if (R == 1) {
    for_each_vector<VPT, V>(lane, G, cols, [&](int k, int64_t c) {
#pragma unroll
      for (int i = 0; i < V; ++i) row[c + i] = acc[k][i];
    });
    return;
  }
  for (int r = 0; r < R; ++r) {
    for_each_vector<VPT, V>(lane, G, grp == r ? cols : 0, [&](int k, int64_t c) {
#pragma unroll
      for (int i = 0; i < V; ++i) smem[c + i] = r == 0 ? acc[k][i] : smem[c + i] + acc[k][i];
    });
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = smem[c];
  __syncthreads();  // smem is free again
}

// Bias (the gated op with a bias): db partials in registers too (instantiated apart, so
// that the usual case holds 8 fewer registers per vector).
// Stage (the plan's `stage`; the gated op without a bias too): dy and x (and the gated op's
// z) come through a ring of two row buffers a group in shared memory
// (rms_norm_smem_bytes), the next row's copies in flight while a row computes
// (for_each_row_group_staged).
template <typename T, typename W, typename O, int VPT, bool Gated, bool Bias, bool Stage = false>
__global__ void __launch_bounds__(Gated ? kRmsNormGatedBackwardThreads : kRmsNormBackwardThreads,
                                  Gated && VPT <= 2 ? 2 : 1)
    rms_norm_rows_backward(const RmsNormParams p) {
  static_assert(Gated || !Bias, "only the gated op has a bias");
  static_assert(!Stage || !Bias, "the staged rows hold no bias");
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool Fast = kFastGate<T>;
  __shared__ Acc red[32];
  extern __shared__ __align__(16) unsigned char dw_smem_raw[];  // [cols]: several groups a block
  const int G = p.group, R = p.rows_per_block;
  const int lane = threadIdx.x % G;
  const Acc inv = p.inv_of<Acc>();
  const int64_t width = p.ngroups * p.cols;

  for_each_group<Gated>(p, [&](int64_t g) {
    const int64_t c0 = g * p.cols;  // the row group's first column (unit strides here)
    const W* w = static_cast<const W*>(p.weight) + c0;
    const W* b = static_cast<const W*>(p.bias) + c0;
    Acc dw[VPT][V], db[VPT][V];
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int i = 0; i < V; ++i) dw[k][i] = db[k][i] = 0;

    // Stage: the group's ring of two rows of dy, x (then z), after the dw partial row.
    const bool has_z = Gated && p.gate != RmsNormGate::None;
    unsigned char* const ring = dw_smem_raw + p.stage_at + (threadIdx.x / G) * 2 * p.stage_row_bytes;
    const auto staged_dy = [&](int slot) { return reinterpret_cast<O*>(ring + slot * p.stage_row_bytes); };
    const auto staged_x = [&](int slot) { return reinterpret_cast<T*>(staged_dy(slot) + p.cols); };
    const auto staged_z = [&](int slot) { return staged_x(slot) + p.cols; };
    const auto rstd_at = [&](const int64_t* off) {
      return off[kRmsRstd] + (Gated ? g * p.col_stride[kRmsRstd] : 0);
    };
    const auto copy_row = [&](const int64_t* off, int slot) {
      const O* dy = static_cast<const O*>(p.dy) + off[kRmsDy] + c0;
      const T* x = static_cast<const T*>(p.x) + off[kRmsBx] + c0;
      const T* z = static_cast<const T*>(p.z) + off[kRmsBz] + c0;
      O* sdy = staged_dy(slot);
      T *sx = staged_x(slot), *sz = staged_z(slot);
      for_each_vector<VPT, V>(lane, G, p.cols, [&](int, int64_t c) {
#pragma unroll
        for (int i = 0; i < static_cast<int>(sizeof(O)) * V / 16; ++i)
          cp_async16(reinterpret_cast<unsigned char*>(sdy + c) + 16 * i,
                     reinterpret_cast<const unsigned char*>(dy + c) + 16 * i);
        cp_async16(sx + c, x + c);
        if (has_z) cp_async16(sz + c, z + c);
      });
      return static_cast<const Acc*>(p.rstd_in)[rstd_at(off)];
    };
    const auto row_body = [&](int64_t row, bool active, const int64_t* off, int slot, Acc staged_rstd) {
      const O* dy = Stage ? staged_dy(slot) : static_cast<const O*>(p.dy) + off[kRmsDy] + c0;
      const T* x = Stage ? staged_x(slot) : static_cast<const T*>(p.x) + off[kRmsBx] + c0;
      const T* z = Stage ? staged_z(slot) : static_cast<const T*>(p.z) + off[kRmsBz] + c0;
      const Acc rstd = Stage ? staged_rstd : active ? static_cast<const Acc*>(p.rstd_in)[rstd_at(off)] : Acc(0);

      O d[VPT][V];
      T xv[VPT][V], zv[VPT][V];
      Acc part = 0;
      for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t c) {
        if constexpr (Stage) {
          load_vec_shared<O, V>(dy + c, d[k]);
          load_vec_shared<T, V>(x + c, xv[k]);
          if (has_z) load_vec_shared<T, V>(z + c, zv[k]);
        } else {
          load_vec<O, V>(dy + c, d[k]);
          load_vec<T, V>(x + c, xv[k]);
          if (has_z) load_vec<T, V>(z + c, zv[k]);
        }
        W wv[V];
        if (p.has_weight) load_vec<W, V>(w + c, wv);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const Acc s = rms_norm_grad_scale<Acc>(p.conv, p.has_weight,
                                                 p.has_weight ? Acc(to_acc(wv[i])) : Acc(0));
          const Acc u = gated_at<Gated>(p, RmsNormGate::After, Acc(to_acc(d[k][i])), &zv[k][i]);
          const Acc h = gated_at<Gated>(p, RmsNormGate::Before, to_acc(xv[k][i]), &zv[k][i]);
          part += u * s * (h * rstd);
        }
      });
      const Acc c_row = group_sum(part, G, red) * inv;
      if (!active) return;
      const int64_t rg = row_group<Gated>(p, row, g);
      T* dx = static_cast<T*>(p.dx) + rg * p.cols;
      T* dz = static_cast<T*>(p.dz) + row * p.dz_row_stride + g * p.cols;
      T* y = static_cast<T*>(p.y) + rg * p.cols;  // the recomputed output (gated, if asked)
      const T* dh = static_cast<const T*>(p.dh) + off[kRmsDh];
      for_each_vector<VPT, V>(lane, G, p.cols, [&](int k, int64_t c) {
        if constexpr (Stage) {  // read again rather than held over the row's sum: fewer registers
          load_vec_shared<O, V>(dy + c, d[k]);
          load_vec_shared<T, V>(x + c, xv[k]);
          if (has_z) load_vec_shared<T, V>(z + c, zv[k]);
        }
        W wv[V], bv[V];
        if (p.has_weight) load_vec<W, V>(w + c, wv);
        if constexpr (Bias) load_vec<W, V>(b + c, bv);
        T e[V];
        if (!Gated && p.has_residual) load_vec<T, V>(dh + c, e);
        T out[V], dzo[V], yo[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const Acc wi = p.has_weight ? Acc(to_acc(wv[i])) : Acc(0);
          const Acc di = to_acc(d[k][i]);
          const Acc n =
              gated_at<Gated>(p, RmsNormGate::Before, to_acc(xv[k][i]), &zv[k][i]) * rstd;
          if constexpr (Gated) {
            const Acc xi = to_acc(xv[k][i]), zi = to_acc(zv[k][i]);
            const Acc pre = gated_pre(n, wi, Bias, Bias ? Acc(to_acc(bv[i])) : Acc(0));  // y before the gate
            Acc u = di, dzi = 0;
            if (p.gate == RmsNormGate::After)  // y = (n·w + b)·silu(z)
              silu_gate_backward<Fast>(di, pre, zi, u, dzi);
            Acc r = rstd * (u * wi - n * c_row);  // the gradient of h
            if (p.gate == RmsNormGate::Before) {  // h = x·silu(z)
              const Acc dhi = r;
              silu_gate_backward<Fast>(dhi, xi, zi, r, dzi);
            }
            out[i] = from_acc<T>(r);
            dzo[i] = from_acc<T>(dzi);
            yo[i] = from_acc<T>(p.gate == RmsNormGate::After ? silu_gate<Fast>(pre, zi) : pre);
            dw[k][i] += u * n;
            if constexpr (Bias) db[k][i] += u;
          } else {
            Acc r = rstd * (di * rms_norm_grad_scale<Acc>(p.conv, p.has_weight, wi) - n * c_row);
            if (p.has_residual) r += to_acc(e[i]);
            out[i] = from_acc<T>(r);
            dw[k][i] += di * rms_norm_dw_factor<Acc>(p.conv, n, RoundTo<T>());
          }
        }
        store_vec<T, V>(dx + c, out);
        if (has_z) store_vec<T, V>(dz + c, dzo);
        if (Gated && p.y) store_vec<T, V>(y + c, yo);
      });
    };
    if constexpr (Stage)
      for_each_row_group_staged<4, Acc>(p, copy_row, row_body);
    else
      for_each_row_group<4>(p, [&](int64_t row, bool active, const int64_t* off) {
        row_body(row, active, off, 0, Acc(0));
      });
    if (!p.has_weight) return;
    // The block's partial rows (dw, then db), its row groups added in group order.
    Acc* ws = static_cast<Acc*>(p.workspace);
    Acc* smem = reinterpret_cast<Acc*>(dw_smem_raw);
    store_block_partial(dw, ws + static_cast<int64_t>(blockIdx.x) * width + c0, smem, G, R, p.cols);
    if constexpr (Bias)
      store_block_partial(db, ws + (gridDim.x + static_cast<int64_t>(blockIdx.x)) * width + c0,
                          smem, G, R, p.cols);
  });
}

// ---- strided variant -------------------------------------------------------------------

template <typename T, typename W, typename O, bool Gated>
__global__ void __launch_bounds__(kRmsNormLoopThreads)
    rms_norm_strided_forward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  constexpr bool Fast = kFastGate<T>;
  __shared__ Acc red[32];
  const int64_t sx = p.col_stride[kRmsX], sr = p.col_stride[kRmsResidual];  // sr: z's too
  for_each_group<Gated>(p, [&](int64_t g) {
    const int64_t c0 = g * p.cols;  // the row group's first column
    const W* w = static_cast<const W*>(p.weight) + c0 * p.w_stride;
    const W* b = static_cast<const W*>(p.bias) + c0 * p.b_stride;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      int64_t off[2];
      p.offsets(2, row, off);
      const T* x = static_cast<const T*>(p.x) + off[kRmsX] + c0 * sx;
      const T* z = static_cast<const T*>(p.z) + off[kRmsZ] + c0 * sr;
      T* h = static_cast<T*>(p.h) + row * p.cols;
      // h of column c: x, round(x + residual) (written to h by this thread), or x·silu(z).
      const auto h_at = [&](int64_t c) {
        return gated_at<Gated>(p, RmsNormGate::Before, to_acc(x[c * sx]), z + c * sr);
      };
      Acc ss = 0;
      for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
        Acc v = h_at(c);
        if (!Gated && p.has_residual) {
          const T* res = static_cast<const T*>(p.residual) + off[kRmsResidual];
          const T hv = from_acc<T>(v + to_acc(res[c * sr]));
          h[c] = hv;
          v = to_acc(hv);
        }
        ss += v * v;
      }
      ss = group_sum(ss, kRmsNormLoopThreads, red);
      const Acc rstd = rsqrt_acc(ss * p.inv_of<Acc>() + p.eps_of<Acc>());
      const int64_t rg = row_group<Gated>(p, row, g);
      if (threadIdx.x == 0) static_cast<Acc*>(p.rstd)[rg] = rstd;
      O* y = static_cast<O*>(p.y) + rg * p.cols;
      for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
        const Acc v = !Gated && p.has_residual ? to_acc(h[c]) : h_at(c);
        const Acc wc = p.has_weight ? Acc(to_acc(w[c * p.w_stride])) : Acc(0);
        Acc o;
        if constexpr (Gated) {
          o = gated_pre(v * rstd, wc, p.has_bias, p.has_bias ? Acc(to_acc(b[c * p.b_stride])) : Acc(0));
          if (p.gate == RmsNormGate::After) o = silu_gate<Fast>(o, Acc(to_acc(z[c * sr])));
        } else {
          o = rms_norm_output<Acc>(p.conv, p.has_weight, v * rstd, wc, RoundTo<T>());
        }
        y[c] = from_acc<O>(o);
      }
    }
  });
}

template <typename T, typename W, typename O, bool Gated>
__global__ void __launch_bounds__(kRmsNormLoopThreads)
    rms_norm_strided_backward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  constexpr bool Fast = kFastGate<T>;
  __shared__ Acc red[32];
  const int64_t width = p.ngroups * p.cols;
  Acc* part_row = static_cast<Acc*>(p.workspace) + static_cast<int64_t>(blockIdx.x) * width;
  Acc* db_row = part_row + static_cast<int64_t>(gridDim.x) * width;  // with a bias
  // sdh: z's stride too.
  const int64_t sdy = p.col_stride[kRmsDy], sx = p.col_stride[kRmsBx], sdh = p.col_stride[kRmsDh];
  for_each_group<Gated>(p, [&](int64_t g) {
    const int64_t c0 = g * p.cols;  // the row group's first column
    const W* w = static_cast<const W*>(p.weight) + c0 * p.w_stride;
    const W* b = static_cast<const W*>(p.bias) + c0 * p.b_stride;
    // This thread's columns of the block's partial rows, zeroed, then added to row by row.
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
      if (p.has_weight) part_row[c0 + c] = 0;
      if (Gated && p.has_bias) db_row[c0 + c] = 0;
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      int64_t off[4];
      p.offsets(4, row, off);
      const O* dy = static_cast<const O*>(p.dy) + off[kRmsDy] + c0 * sdy;
      const T* x = static_cast<const T*>(p.x) + off[kRmsBx] + c0 * sx;
      const T* dh = static_cast<const T*>(p.dh) + off[kRmsDh];
      const T* z = static_cast<const T*>(p.z) + off[kRmsBz] + c0 * sdh;
      const int64_t rstd_at = off[kRmsRstd] + (Gated ? g * p.col_stride[kRmsRstd] : 0);
      const Acc rstd = static_cast<const Acc*>(p.rstd_in)[rstd_at];
      const auto w_at = [&](int64_t c) {
        return p.has_weight ? Acc(to_acc(w[c * p.w_stride])) : Acc(0);
      };
      // u (dy, or dy·silu(z)) and h (x, or x·silu(z)) of column c.
      const auto u_at = [&](int64_t c) {
        return gated_at<Gated>(p, RmsNormGate::After, Acc(to_acc(dy[c * sdy])), z + c * sdh);
      };
      const auto h_at = [&](int64_t c) {
        return gated_at<Gated>(p, RmsNormGate::Before, to_acc(x[c * sx]), z + c * sdh);
      };
      Acc part = 0;
      for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads)
        part +=
            u_at(c) * rms_norm_grad_scale<Acc>(p.conv, p.has_weight, w_at(c)) * (h_at(c) * rstd);
      const Acc c_row = group_sum(part, kRmsNormLoopThreads, red) * p.inv_of<Acc>();
      const int64_t rg = row_group<Gated>(p, row, g);
      T* dx = static_cast<T*>(p.dx) + rg * p.cols;
      T* dz = static_cast<T*>(p.dz) + row * p.dz_row_stride + g * p.cols;
      T* y = static_cast<T*>(p.y) + rg * p.cols;  // the recomputed output (gated, if asked)
      for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
        const Acc n = h_at(c) * rstd, wc = w_at(c), di = to_acc(dy[c * sdy]);
        if constexpr (Gated) {
          const Acc xi = to_acc(x[c * sx]);
          const Acc zi = p.gate != RmsNormGate::None ? Acc(to_acc(z[c * sdh])) : Acc(0);
          const Acc pre = gated_pre(n, wc, p.has_bias, p.has_bias ? Acc(to_acc(b[c * p.b_stride])) : Acc(0));
          Acc u = di, dzi = 0;
          if (p.gate == RmsNormGate::After)  // y = (n·w + b)·silu(z)
            silu_gate_backward<Fast>(di, pre, zi, u, dzi);
          Acc r = rstd * (u * wc - n * c_row);  // the gradient of h
          if (p.gate == RmsNormGate::Before) {  // h = x·silu(z)
            const Acc dhi = r;
            silu_gate_backward<Fast>(dhi, xi, zi, r, dzi);
          }
          dx[c] = from_acc<T>(r);
          if (p.gate != RmsNormGate::None) dz[c] = from_acc<T>(dzi);
          if (p.y) y[c] = from_acc<T>(p.gate == RmsNormGate::After ? silu_gate<Fast>(pre, zi) : pre);
          part_row[c0 + c] += u * n;
          if (p.has_bias) db_row[c0 + c] += u;
        } else {
          Acc r = rstd * (di * rms_norm_grad_scale<Acc>(p.conv, p.has_weight, wc) - n * c_row);
          if (p.has_residual) r += to_acc(dh[c * sdh]);
          dx[c] = from_acc<T>(r);
          if (p.has_weight) part_row[c] += di * rms_norm_dw_factor<Acc>(p.conv, n, RoundTo<T>());
        }
      }
    }
  });
}

// dw[c] = Σ_b partial[b][c] over the backward's blocks (zeros without rows): a block of
// kRmsNormReduceThreads takes 32 columns, its warp w the partial rows b ≡ w (mod warps),
// in order, then the warps' sums in warp order (a fixed order: the same bits every run).
// Every multiprocessor takes columns and each thread a share of the rows, where a thread a
// column summing every row in turn left the grid to a few multiprocessors waiting on their
// loads one after another.
template <typename Acc, typename W>
__global__ void __launch_bounds__(kRmsNormReduceThreads)
    rms_norm_dw_sum(const Acc* partials, int64_t blocks, int64_t cols, W* dw) {
  constexpr int kWarps = kRmsNormReduceThreads / 32;
  constexpr int kUnroll = 8;  // loads in flight a thread
  __shared__ Acc sums[kWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  Acc s = 0;
  if (c < cols) {
    int64_t b = warp;
    for (; b + (kUnroll - 1) * kWarps < blocks; b += kUnroll * kWarps) {
      Acc v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = partials[(b + u * kWarps) * cols + c];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) s += v[u];
    }
    for (; b < blocks; b += kWarps) s += partials[b * cols + c];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < cols) {
    Acc t = sums[0][lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) t += sums[w][lane];
    dw[c] = from_acc<W>(t);
  }
}

// ---- launchers -------------------------------------------------------------------------

inline RmsNormParams rms_norm_params(const RmsNormLaunch& l) {
  RmsNormParams p{};
  p.rows = l.rows;
  p.cols = l.cols;
  p.lead_rank = l.lead.rank;
  for (int d = 0; d < kMaxRank; ++d) {
    p.lead_sizes[d] = l.lead.sizes[d];
    for (int k = 0; k < kMaxOperands; ++k) p.lead_strides[k][d] = l.lead.strides[k][d];
  }
  for (int k = 0; k < kMaxOperands; ++k) p.col_stride[k] = l.col_stride[k];
  p.w_stride = l.w_stride;
  p.conv = l.convention;
  p.has_weight = l.has_weight;
  p.has_residual = l.has_residual;
  p.gate = l.gate;
  p.has_bias = l.has_bias;
  p.ngroups = l.ngroups;
  p.b_stride = l.b_stride;
  p.dz_row_stride = l.dz_row_stride;
  p.eps = l.eps;
  p.inv_cols = l.inv_cols;
  p.eps64 = l.eps64;
  p.inv_cols64 = l.inv_cols64;
  p.group = l.group;
  p.rows_per_block = l.rows_per_block;
  p.stage_at = static_cast<int>(rms_norm_dw_smem_bytes(l));
  p.stage_row_bytes = static_cast<int>(rms_norm_stage_row_bytes(l));
  p.x = l.x;
  p.residual = l.residual;
  p.weight = l.weight;
  p.z = l.z;
  p.bias = l.bias;
  p.dy = l.dy;
  p.dh = l.dh;
  p.rstd_in = l.rstd_in;
  p.y = l.y;
  p.h = l.h;
  p.rstd = l.rstd;
  p.dx = l.dx;
  p.dz = l.dz;
  p.workspace = l.workspace;
  return p;
}

// f(T{}, W{}, O{}) with the device types of x, the weight and the output.
template <typename F>
void dispatch_rms_norm(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_types(l, [](ElementKind e, auto&& g) { dispatch_floating(e, g); }, f);
}

// f(T{}, W{}, O{}) for the plain ops (dispatch_rms_norm) or the gated op, whose output
// has x's dtype (O = T: the only types it is instantiated for).
template <bool Gated, typename F>
void dispatch_rms_norm_of(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm(l, [&](auto t, auto wt, auto ot) {
    if constexpr (!Gated || std::is_same_v<decltype(t), decltype(ot)>)
      f(t, wt, ot);
    else
      fail(PlanErrorKind::Internal, "gated_rms_norm", "the output must have x's dtype");
  });
}

// ---- launchers: defined here, instantiated once per direction for the plain ops
// (rmsnorm_forward.cu, rmsnorm_backward.cu) and for the gated op (rmsnorm_gated_*.cu) ----

using RmsNormKernel = void (*)(const RmsNormParams);

// f(kernel, threads, shared memory bytes) of the forward kernel the launch picks.
template <bool Gated, typename F>
void with_forward_kernel(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_of<Gated>(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    using K = RmsNormKernel;
    if (l.layout == RmsNormLayout::Strided)
      return f(K(rms_norm_strided_forward<T, W, O, Gated>), kRmsNormLoopThreads, size_t{0});
    const int threads = l.group * l.rows_per_block;
    const size_t smem = static_cast<size_t>(rms_norm_smem_bytes(l));
    const auto rows = [&](auto res, auto stage) {
      constexpr bool R = decltype(res)::value, S = decltype(stage)::value;
      const auto run = [&](K kernel) {
        allow_dynamic_smem(kernel, static_cast<int64_t>(smem), Gated ? "gated_rms_norm" : "rms_norm");
        return f(kernel, threads, smem);
      };
      switch (l.vecs) {
        case 1: return run(K(rms_norm_rows_forward<T, W, O, 1, Gated, R, S>));
        case 2: return run(K(rms_norm_rows_forward<T, W, O, 2, Gated, R, S>));
        case 4: return run(K(rms_norm_rows_forward<T, W, O, 4, Gated, R, S>));
        default: fail(PlanErrorKind::Internal, "rms_norm", "no kernel for this vector count");
      }
    };
    if constexpr (Gated) {  // (the plan stages only the gated op's forward)
      if (l.stage) return rows(std::false_type{}, std::true_type{});
    } else {
      if (l.has_residual) return rows(std::true_type{}, std::false_type{});
    }
    return rows(std::false_type{}, std::false_type{});
  });
}

template <bool Gated>
void launch_rms_norm_forward(const RmsNormLaunch& l, cudaStream_t stream) {
  const RmsNormParams p = rms_norm_params(l);
  with_forward_kernel<Gated>(l, [&](RmsNormKernel kernel, int threads, size_t smem) {
    const dim3 grid(static_cast<unsigned int>(l.grid), static_cast<unsigned int>(l.grid_y));
    kernel<<<grid, threads, smem, stream>>>(p);
  });
  check_launch(Gated ? "gated_rms_norm" : l.has_residual ? "add_rms_norm" : "rms_norm");
}

// f(kernel, threads, shared memory bytes) of the backward kernel the launch picks.
template <bool Gated, typename F>
void with_backward_kernel(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_of<Gated>(l, [&](auto t, auto wt, auto ot) {
    using T = decltype(t);
    using W = decltype(wt);
    using O = decltype(ot);
    using K = RmsNormKernel;
    if (l.layout == RmsNormLayout::Strided)
      return f(K(rms_norm_strided_backward<T, W, O, Gated>), kRmsNormLoopThreads, size_t{0});
    const int threads = l.group * l.rows_per_block;
    const size_t smem = static_cast<size_t>(rms_norm_smem_bytes(l));
    const auto rows = [&](auto bias, auto stage) {
      constexpr bool B = decltype(bias)::value, S = decltype(stage)::value;
      const auto run = [&](K kernel) {
        allow_dynamic_smem(kernel, static_cast<int64_t>(smem), Gated ? "gated_rms_norm_backward" : "rms_norm_backward");
        return f(kernel, threads, smem);
      };
      switch (l.vecs) {
        case 1: return run(K(rms_norm_rows_backward<T, W, O, 1, Gated, B, S>));
        case 2: return run(K(rms_norm_rows_backward<T, W, O, 2, Gated, B, S>));
        case 4: return run(K(rms_norm_rows_backward<T, W, O, 4, Gated, B, S>));
        default: fail(PlanErrorKind::Internal, "rms_norm_backward", "no kernel for this vector count");
      }
    };
    if constexpr (Gated)
      if (l.has_bias) return rows(std::true_type{}, std::false_type{});
    if (l.stage) return rows(std::false_type{}, std::true_type{});
    return rows(std::false_type{}, std::false_type{});
  });
}

template <bool Gated>
void launch_rms_norm_backward(const RmsNormLaunch& l, cudaStream_t stream) {
  const RmsNormParams p = rms_norm_params(l);
  if (l.rows > 0)
    with_backward_kernel<Gated>(l, [&](RmsNormKernel kernel, int threads, size_t smem) {
      const dim3 grid(static_cast<unsigned int>(l.grid), static_cast<unsigned int>(l.grid_y));
      kernel<<<grid, threads, smem, stream>>>(p);
    });
  const int64_t width = l.width();
  if (l.has_weight && width > 0)
    dispatch_rms_norm_of<Gated>(l, [&](auto t, auto wt, auto) {
      using Acc = acc_t<decltype(t)>;
      using W = decltype(wt);
      const auto sum = [&](const Acc* partials, void* out) {
        rms_norm_dw_sum<Acc, W><<<blocks_for(width, 32), kRmsNormReduceThreads,
                                  0, stream>>>(partials, l.dw_blocks, width, static_cast<W*>(out));
      };
      const Acc* ws = static_cast<const Acc*>(l.workspace);
      sum(ws, l.dw);
      if (l.has_bias) sum(ws + l.dw_blocks * width, l.db);
    });
  check_launch(Gated ? "gated_rms_norm_backward" : "rms_norm_backward");
}

// The blocks of the kernel with_kernel(l, f) picks resident on the device at once (the
// occupancy calculator; one an SM if it cannot tell).
template <typename With>
int64_t rms_norm_resident_blocks(const RmsNormLaunch& l, With&& with_kernel) {
  int per_sm = 1;
  with_kernel(l, [&](RmsNormKernel kernel, int threads, size_t smem) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it; one block an SM is always correct
      per_sm = 1;
    }
  });
  return static_cast<int64_t>(std::max(l.sm_count, 1)) * std::max(per_sm, 1);
}

// The forward's (staged: its resident grid) and the backward's, each instantiated with its
// kernels.
template <bool Gated>
int64_t rms_norm_forward_blocks(const RmsNormLaunch& l) {
  return rms_norm_resident_blocks(l, [](const RmsNormLaunch& m, auto&& f) { with_forward_kernel<Gated>(m, f); });
}
template <bool Gated>
int64_t rms_norm_backward_blocks(const RmsNormLaunch& l) {
  return rms_norm_resident_blocks(l, [](const RmsNormLaunch& m, auto&& f) { with_backward_kernel<Gated>(m, f); });
}

extern template void launch_rms_norm_forward<false>(const RmsNormLaunch&, cudaStream_t);
extern template void launch_rms_norm_forward<true>(const RmsNormLaunch&, cudaStream_t);
extern template void launch_rms_norm_backward<false>(const RmsNormLaunch&, cudaStream_t);
extern template void launch_rms_norm_backward<true>(const RmsNormLaunch&, cudaStream_t);
extern template int64_t rms_norm_forward_blocks<false>(const RmsNormLaunch&);
extern template int64_t rms_norm_forward_blocks<true>(const RmsNormLaunch&);
extern template int64_t rms_norm_backward_blocks<false>(const RmsNormLaunch&);
extern template int64_t rms_norm_backward_blocks<true>(const RmsNormLaunch&);

}  // namespace baracuda::kernels::cuda
