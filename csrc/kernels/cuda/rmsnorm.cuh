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
// results are bitwise reproducible on a given GPU.
//
// Strided variant (any strides, any N, or rows wider than the registers hold): a row per
// block of kRmsNormLoopThreads threads, two passes over the row (the backward's dw
// partial accumulated in the block's workspace row).
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
  float eps, inv_cols;
  double eps64, inv_cols64;
  int group, rows_per_block;
  const void* x;
  const void* residual;
  const void* weight;
  const void* dy;
  const void* dh;
  const void* rstd_in;
  void* y;
  void* h;
  void* rstd;
  void* dx;
  void* workspace;  // backward: dw partials [gridDim.x, cols]

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
// at most 32 warps). Every thread of the block calls it (it synchronizes the block when
// groups span warps).
template <typename Acc>
__device__ __forceinline__ Acc group_sum(Acc v, int group, Acc* red) {
  // The xor butterfly stays inside aligned groups of up to 32 lanes; a + b = b + a, so
  // every lane ends with the same value.
  for (int offset = (group < 32 ? group : 32) / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (group <= 32) return v;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) red[warp] = v;
  __syncthreads();
  const int first = threadIdx.x / group * (group / 32);
  Acc total = 0;
  for (int w = 0; w < group / 32; ++w) total += red[first + w];
  __syncthreads();  // red is free again
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

template <typename T, typename W, typename O, int VPT>
__global__ void __launch_bounds__(kRmsNormMaxGroup)
    rms_norm_rows_forward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  __shared__ Acc red[32];
  const int G = p.group;
  const int lane = threadIdx.x % G;
  const W* w = static_cast<const W*>(p.weight);
  // One pass unless there are more than 2^31 - 1 row groups.
  for_each_row_group<2>(p, [&](int64_t row, bool active, const int64_t* off) {
    const T* x = static_cast<const T*>(p.x) + off[kRmsX];
    T v[VPT][V];
    Acc ss = 0;
    for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t c) {
      load_vec<T, V>(x + c, v[k]);
      if (p.has_residual) {
        T r[V];
        load_vec<T, V>(static_cast<const T*>(p.residual) + off[kRmsResidual] + c, r);
#pragma unroll
        for (int i = 0; i < V; ++i) v[k][i] = from_acc<T>(to_acc(v[k][i]) + to_acc(r[i]));
        store_vec<T, V>(static_cast<T*>(p.h) + row * p.cols + c, v[k]);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc a = to_acc(v[k][i]);
        ss += a * a;
      }
    });
    ss = group_sum(ss, G, red);
    const Acc rstd = rsqrt_acc(ss * p.inv_of<Acc>() + p.eps_of<Acc>());
    if (!active) return;
    if (lane == 0) static_cast<Acc*>(p.rstd)[row] = rstd;
    O* y = static_cast<O*>(p.y) + row * p.cols;
    for_each_vector<VPT, V>(lane, G, p.cols, [&](int k, int64_t c) {
      W wv[V];
      if (p.has_weight) load_vec<W, V>(w + c, wv);
      O out[V];
#pragma unroll
      for (int i = 0; i < V; ++i)
        out[i] = from_acc<O>(rms_norm_output<Acc>(p.conv, p.has_weight, to_acc(v[k][i]) * rstd,
                                                  p.has_weight ? Acc(to_acc(wv[i])) : Acc(0),
                                                  RoundTo<T>()));
      store_vec<O, V>(y + c, out);
    });
  });
}

template <typename T, typename W, typename O, int VPT>
__global__ void __launch_bounds__(kRmsNormBackwardThreads)
    rms_norm_rows_backward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  __shared__ Acc red[32];
  extern __shared__ __align__(16) unsigned char dw_smem_raw[];  // [cols]: several groups a block
  const int G = p.group, R = p.rows_per_block;
  const int lane = threadIdx.x % G, grp = threadIdx.x / G;
  const W* w = static_cast<const W*>(p.weight);
  const Acc inv = p.inv_of<Acc>();

  Acc dw[VPT][V];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int i = 0; i < V; ++i) dw[k][i] = 0;

  for_each_row_group<4>(p, [&](int64_t row, bool active, const int64_t* off) {
    const O* dy = static_cast<const O*>(p.dy) + off[kRmsDy];
    const T* x = static_cast<const T*>(p.x) + off[kRmsBx];
    const Acc rstd = active ? static_cast<const Acc*>(p.rstd_in)[off[kRmsRstd]] : Acc(0);

    O d[VPT][V];
    T xv[VPT][V];
    Acc part = 0;
    for_each_vector<VPT, V>(lane, G, active ? p.cols : 0, [&](int k, int64_t c) {
      load_vec<O, V>(dy + c, d[k]);
      load_vec<T, V>(x + c, xv[k]);
      W wv[V];
      if (p.has_weight) load_vec<W, V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc s = rms_norm_grad_scale<Acc>(p.conv, p.has_weight,
                                               p.has_weight ? Acc(to_acc(wv[i])) : Acc(0));
        part += Acc(to_acc(d[k][i])) * s * (to_acc(xv[k][i]) * rstd);
      }
    });
    const Acc c_row = group_sum(part, G, red) * inv;
    if (!active) return;
    T* dx = static_cast<T*>(p.dx) + row * p.cols;
    const T* dh = static_cast<const T*>(p.dh) + off[kRmsDh];
    for_each_vector<VPT, V>(lane, G, p.cols, [&](int k, int64_t c) {
      W wv[V];
      if (p.has_weight) load_vec<W, V>(w + c, wv);
      T e[V];
      if (p.has_residual) load_vec<T, V>(dh + c, e);
      T out[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const Acc wi = p.has_weight ? Acc(to_acc(wv[i])) : Acc(0);
        const Acc di = to_acc(d[k][i]);
        const Acc n = to_acc(xv[k][i]) * rstd;
        Acc r = rstd * (di * rms_norm_grad_scale<Acc>(p.conv, p.has_weight, wi) - n * c_row);
        if (p.has_residual) r += to_acc(e[i]);
        out[i] = from_acc<T>(r);
        dw[k][i] += di * rms_norm_dw_factor<Acc>(p.conv, n, RoundTo<T>());
      }
      store_vec<T, V>(dx + c, out);
    });
  });
  if (!p.has_weight) return;
  // The block's partial row: its groups' partials added in group order.
  Acc* part_row = static_cast<Acc*>(p.workspace) + static_cast<int64_t>(blockIdx.x) * p.cols;
  if (R == 1) {
    for_each_vector<VPT, V>(lane, G, p.cols, [&](int k, int64_t c) {
#pragma unroll
      for (int i = 0; i < V; ++i) part_row[c + i] = dw[k][i];
    });
    return;
  }
  Acc* smem = reinterpret_cast<Acc*>(dw_smem_raw);
  for (int r = 0; r < R; ++r) {
    for_each_vector<VPT, V>(lane, G, grp == r ? p.cols : 0, [&](int k, int64_t c) {
#pragma unroll
      for (int i = 0; i < V; ++i) smem[c + i] = r == 0 ? dw[k][i] : smem[c + i] + dw[k][i];
    });
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) part_row[c] = smem[c];
}

// ---- strided variant -------------------------------------------------------------------

template <typename T, typename W, typename O>
__global__ void __launch_bounds__(kRmsNormLoopThreads)
    rms_norm_strided_forward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  __shared__ Acc red[32];
  const W* w = static_cast<const W*>(p.weight);
  const int64_t sx = p.col_stride[kRmsX], sr = p.col_stride[kRmsResidual];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    int64_t off[2];
    p.offsets(2, row, off);
    const T* x = static_cast<const T*>(p.x) + off[kRmsX];
    T* h = static_cast<T*>(p.h) + row * p.cols;
    Acc ss = 0;
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
      Acc v = to_acc(x[c * sx]);
      if (p.has_residual) {
        const T hv = from_acc<T>(v + to_acc(static_cast<const T*>(p.residual)[off[kRmsResidual] + c * sr]));
        h[c] = hv;
        v = to_acc(hv);
      }
      ss += v * v;
    }
    ss = group_sum(ss, kRmsNormLoopThreads, red);
    const Acc rstd = rsqrt_acc(ss * p.inv_of<Acc>() + p.eps_of<Acc>());
    if (threadIdx.x == 0) static_cast<Acc*>(p.rstd)[row] = rstd;
    O* y = static_cast<O*>(p.y) + row * p.cols;
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
      // h[c] was written by this thread above.
      const Acc v = p.has_residual ? to_acc(h[c]) : to_acc(x[c * sx]);
      const Acc wc = p.has_weight ? Acc(to_acc(w[c * p.w_stride])) : Acc(0);
      y[c] = from_acc<O>(rms_norm_output<Acc>(p.conv, p.has_weight, v * rstd, wc, RoundTo<T>()));
    }
  }
}

template <typename T, typename W, typename O>
__global__ void __launch_bounds__(kRmsNormLoopThreads)
    rms_norm_strided_backward(const RmsNormParams p) {
  using Acc = acc_t<T>;
  __shared__ Acc red[32];
  const W* w = static_cast<const W*>(p.weight);
  Acc* part_row = static_cast<Acc*>(p.workspace) + static_cast<int64_t>(blockIdx.x) * p.cols;
  // This thread's columns of the block's partial row, zeroed, then added to row by row.
  if (p.has_weight)
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) part_row[c] = 0;
  const int64_t sdy = p.col_stride[kRmsDy], sx = p.col_stride[kRmsBx], sdh = p.col_stride[kRmsDh];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    int64_t off[4];
    p.offsets(4, row, off);
    const O* dy = static_cast<const O*>(p.dy) + off[kRmsDy];
    const T* x = static_cast<const T*>(p.x) + off[kRmsBx];
    const T* dh = static_cast<const T*>(p.dh) + off[kRmsDh];
    const Acc rstd = static_cast<const Acc*>(p.rstd_in)[off[kRmsRstd]];
    const auto g_at = [&](int64_t c) {
      const Acc wc = p.has_weight ? Acc(to_acc(w[c * p.w_stride])) : Acc(0);
      return Acc(to_acc(dy[c * sdy])) * rms_norm_grad_scale<Acc>(p.conv, p.has_weight, wc);
    };
    Acc part = 0;
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads)
      part += g_at(c) * (to_acc(x[c * sx]) * rstd);
    const Acc c_row = group_sum(part, kRmsNormLoopThreads, red) * p.inv_of<Acc>();
    T* dx = static_cast<T*>(p.dx) + row * p.cols;
    for (int64_t c = threadIdx.x; c < p.cols; c += kRmsNormLoopThreads) {
      const Acc n = to_acc(x[c * sx]) * rstd;
      Acc r = rstd * (g_at(c) - n * c_row);
      if (p.has_residual) r += to_acc(dh[c * sdh]);
      dx[c] = from_acc<T>(r);
      if (p.has_weight)
        part_row[c] += Acc(to_acc(dy[c * sdy])) * rms_norm_dw_factor<Acc>(p.conv, n, RoundTo<T>());
    }
  }
}

// dw[c] = Σ_b partial[b][c] over the backward's blocks, in order (zeros without rows).
template <typename Acc, typename W>
__global__ void __launch_bounds__(kRmsNormReduceThreads)
    rms_norm_dw_sum(const Acc* partials, int64_t blocks, int64_t cols, W* dw) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRmsNormReduceThreads + threadIdx.x;
  if (c >= cols) return;
  Acc s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partials[b * cols + c];
  dw[c] = from_acc<W>(s);
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
  p.eps = l.eps;
  p.inv_cols = l.inv_cols;
  p.eps64 = l.eps64;
  p.inv_cols64 = l.inv_cols64;
  p.group = l.group;
  p.rows_per_block = l.rows_per_block;
  p.x = l.x;
  p.residual = l.residual;
  p.weight = l.weight;
  p.dy = l.dy;
  p.dh = l.dh;
  p.rstd_in = l.rstd_in;
  p.y = l.y;
  p.h = l.h;
  p.rstd = l.rstd;
  p.dx = l.dx;
  p.workspace = l.workspace;
  return p;
}

// f(T{}, W{}, O{}) with the device types of x, the weight and the output.
template <typename F>
void dispatch_rms_norm(const RmsNormLaunch& l, F&& f) {
  dispatch_rms_norm_types(l, [](ElementKind e, auto&& g) { dispatch_floating(e, g); }, f);
}

// The rows backward's shared memory: the block's dw partial row when it has several
// row groups.
template <typename Acc>
size_t rms_norm_backward_smem(const RmsNormLaunch& l) {
  return l.rows_per_block > 1 && l.has_weight ? static_cast<size_t>(l.cols) * sizeof(Acc) : 0;
}

// Instantiated once per direction (rmsnorm_forward.cu, rmsnorm_backward.cu).
void launch_rms_norm_forward(const RmsNormLaunch& l, cudaStream_t stream);
void launch_rms_norm_backward(const RmsNormLaunch& l, cudaStream_t stream);

}  // namespace baracuda::kernels::cuda
