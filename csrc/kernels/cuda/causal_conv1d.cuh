// CUDA causal conv1d kernels, forward and backward (core/causal_conv1d_plan.h has the
// formulas, the layouts and the work decomposition).
//
// A thread owns C channels (16 bytes of them in the channel-last layout, one otherwise)
// and a chunk of time steps, which it walks in order, S steps an iteration with their
// loads issued first; it keeps the last W − 1 inputs of its channels (and their seq_idx)
// in registers, so that x is read once (plus W − 1 halo steps a chunk). Blocks take
// items (block_channels channel groups × block_chunks chunks of one batch) in turn from
// the grid the plan sized to the resident blocks.
//
// The backward walks the same way with a lag of W − 1 steps: at step t it forms
// g[t] = dout[t]·act'(pre[t]) (recomputing pre from the window) and completes
// dx[t − (W − 1)], whose W terms g[t − (W − 1)] .. g[t] are then all known; it walks W − 1
// steps past its chunk for the last ones. Its dweight/dbias terms (steps of its chunk
// only) stay in registers; at the end of an item the block adds its threads' sums in
// shared memory, chunk by chunk in order, into one workspace row, and a second kernel
// adds the rows per channel in order: bitwise reproducible, no atomics.
#pragma once

#include <algorithm>
#include <type_traits>

#include "kernels/causal_conv1d.h"
#include "kernels/causal_conv1d_math.h"
#include "kernels/cuda/cuda_common.cuh"

namespace baracuda::kernels::cuda {

using Layout = CausalConv1dLayout;

// The hardware exp and reciprocal for the activation of 16-bit data (gated_activation_math.h).
template <typename T>
constexpr bool kFast = sizeof(T) == 2;

template <Layout Lay, typename T>
struct ConvShape {
  static constexpr int V = 16 / sizeof(T);  // elements a 16-byte vector (rows)
  // Channels a thread (channel-last: a vector of kCausalConv1dChannelBytes at most).
  static constexpr int C = Lay == Layout::ChannelsLastVec
                               ? causal_conv1d_channel_vec(static_cast<int>(sizeof(T)))
                               : 1;
  // Steps an iteration (their loads issued together).
  static constexpr int S = causal_conv1d_steps(Lay, static_cast<int>(sizeof(T)));
};

// N consecutive elements: one 8- or 16-byte access when they fill one (the plan has
// checked the alignment), element by element otherwise.
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_vec(const T* p) {
  if constexpr (sizeof(T) * N == 8) {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
    Pack<T, N> out;
    memcpy(&out, &raw, 8);
    return out;
  } else {
    return load_pack<T, N>(p);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Pack<T, N>& v) {
  if constexpr (sizeof(T) * N == 8) {
    uint2 raw;
    memcpy(&raw, &v, 8);
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
    store_pack<T, N>(p, v);
  }
}

// A thread's share of an item: batch b, channels d0 .. d0 + C − 1, chunk j covering steps
// [t0, t1), and its block's workspace row.
struct ConvThread {
  int64_t b, d0, j, t0, t1, row, channel_block;
  bool active;
};

__device__ __forceinline__ int64_t conv_channel_blocks(const CausalConv1dLaunch& l) {
  return (l.groups + l.block_channels - 1) / l.block_channels;
}
__device__ __forceinline__ int64_t conv_chunk_blocks(const CausalConv1dLaunch& l) {
  return (l.chunks + l.block_chunks - 1) / l.block_chunks;
}
__device__ __forceinline__ int64_t conv_items(const CausalConv1dLaunch& l) {
  return l.batch * conv_chunk_blocks(l) * conv_channel_blocks(l);
}

template <int C>
__device__ __forceinline__ ConvThread conv_thread(const CausalConv1dLaunch& l, int64_t item) {
  const int tx = threadIdx.x % l.block_channels, ty = threadIdx.x / l.block_channels;
  const int64_t channel_blocks = conv_channel_blocks(l), chunk_blocks = conv_chunk_blocks(l);
  ConvThread th;
  th.channel_block = item % channel_blocks;
  const int64_t rest = item / channel_blocks, jb = rest % chunk_blocks;
  th.b = rest / chunk_blocks;
  th.row = th.b * chunk_blocks + jb;
  const int64_t g = th.channel_block * l.block_channels + tx;
  th.j = jb * l.block_chunks + ty;
  th.active = g < l.groups && th.j < l.chunks;
  th.d0 = g * C;
  th.t0 = th.j * l.chunk;
  th.t1 = min(l.seqlen, th.t0 + l.chunk);
  return th;
}

__device__ __forceinline__ int64_t at(const Strides3& s, int64_t b, int64_t d, int64_t t) {
  return b * s.b + d * s.d + t * s.t;
}

// seq_idx of step tau (−1 before time 0; 0 without seq_idx).
__device__ __forceinline__ int32_t seq_at(const CausalConv1dLaunch& l, int64_t b, int64_t tau) {
  if (!l.has_seq_idx) return 0;
  return tau >= 0 ? l.seq_idx[b * l.seq.b + tau * l.seq.t] : -1;
}

// x̃ of C channels at step tau < L: x, the initial states (tau < 0) or 0; scalar loads
// (the halo steps and the backward's recomputed first steps only).
template <typename T, int C>
__device__ __forceinline__ void load_state(const CausalConv1dLaunch& l, int64_t b, int64_t d0,
                                           int64_t tau, acc_t<T> (&out)[C]) {
  const T* x = static_cast<const T*>(l.x_data);
  const T* init = static_cast<const T*>(l.initial_states);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (tau >= 0)
      out[c] = to_acc(x[at(l.x, b, d0 + c, tau)]);
    else
      out[c] = l.has_initial_states ? to_acc(init[at(l.init, b, d0 + c, tau + l.width - 1)])
                                    : acc_t<T>(0);
  }
}

template <typename T, typename Wt, int W, int C>
__device__ __forceinline__ void load_weights(const CausalConv1dLaunch& l, int64_t d0,
                                             acc_t<T> (&w)[W][C], acc_t<T> (&bias)[C]) {
  const Wt* wp = static_cast<const Wt*>(l.weight);
  const Wt* bp = static_cast<const Wt*>(l.bias);
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k][c] = to_acc(wp[(d0 + c) * l.w_stride_d + k * l.w_stride_k]);
    bias[c] = l.has_bias ? acc_t<T>(to_acc(bp[(d0 + c) * l.bias_stride])) : acc_t<T>(0);
  }
}

// Steps [t, t + S) of C channels of a streamed operand (p: its element at step 0 of the
// thread's batch and first channel), as loaded (converted where used: half the registers
// for 16-bit data); steps at or past `end` read as 0. The vector paths rely on the plan's
// layout checks (and, for rows, on t being a multiple of S).
template <Layout Lay, typename T, int C, int S>
__device__ __forceinline__ void load_steps(const T* p, int64_t stride_t, int64_t t, int64_t end,
                                           T (&out)[S][C]) {
  using Sh = ConvShape<Lay, T>;
  if constexpr (Lay == Layout::RowsVec16) {
    if (t + S <= end) {
#pragma unroll
      for (int v = 0; v < S / Sh::V; ++v) {
        const Pack<T, Sh::V> pk = load_pack<T, Sh::V>(p + t + v * Sh::V);
#pragma unroll
        for (int i = 0; i < Sh::V; ++i) out[v * Sh::V + i][0] = pk.v[i];
      }
      return;
    }
  }
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (t + s < end) {
      if constexpr (Lay == Layout::ChannelsLastVec) {
        const Pack<T, C> pk = load_vec<T, C>(p + (t + s) * stride_t);
#pragma unroll
        for (int c = 0; c < C; ++c) out[s][c] = pk.v[c];
      } else {
        out[s][0] = p[(t + s) * stride_t];
      }
    } else {
#pragma unroll
      for (int c = 0; c < C; ++c) out[s][c] = from_acc<T>(acc_t<T>(0));
    }
  }
}

template <typename T, int C>
__device__ __forceinline__ void to_acc(const T (&in)[C], acc_t<T> (&out)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) out[c] = to_acc(in[c]);
}

template <int S>
__device__ __forceinline__ void load_seq(const CausalConv1dLaunch& l, bool has_seq, int64_t b, int64_t t,
                                         int64_t end, int32_t (&out)[S]) {
#pragma unroll
  for (int s = 0; s < S; ++s) out[s] = has_seq && t + s < end ? seq_at(l, b, t + s) : 0;
}

// C channels of one step (a vector in the channel-last layout).
template <Layout Lay, typename T, int C>
__device__ __forceinline__ void store_step(T* p, const acc_t<T> (&v)[C]) {
  if constexpr (Lay == Layout::ChannelsLastVec) {
    Pack<T, C> pk;
#pragma unroll
    for (int c = 0; c < C; ++c) pk.v[c] = from_acc<T>(v[c]);
    store_vec<T, C>(p, pk);
  } else {
    *p = from_acc<T>(v[0]);
  }
}

// The window after step t's input: inputs (and their seq_idx) of the last W − 1 steps.
template <typename Acc, int W, int C>
__device__ __forceinline__ void shift_in(Acc (&win)[W - 1][C], const Acc (&v)[C]) {
#pragma unroll
  for (int k = 0; k + 1 < W - 1; ++k)
#pragma unroll
    for (int c = 0; c < C; ++c) win[k][c] = win[k + 1][c];
#pragma unroll
  for (int c = 0; c < C; ++c) win[W - 2][c] = v[c];
}

template <typename V, int W>
__device__ __forceinline__ void shift_in(V (&win)[W - 1], V v) {
#pragma unroll
  for (int k = 0; k + 1 < W - 1; ++k) win[k] = win[k + 1];
  win[W - 2] = v;
}

// pre = bias + Σ_k w[k]·x̃[t − (W−1) + k] over the open taps (the window holds taps
// 0 .. W − 2, x_t is tap W − 1, always open), in tap order. has_seq: seq_idx is given.
template <typename Acc, int W, int C>
__device__ __forceinline__ void conv_pre(bool has_seq, const Acc (&w)[W][C],
                                         const Acc (&bias)[C], const Acc (&win)[W - 1][C],
                                         const int32_t (&seq_win)[W - 1], int32_t seq_t,
                                         const Acc (&x_t)[C], Acc (&pre)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) pre[c] = bias[c];
#pragma unroll
  for (int k = 0; k < W - 1; ++k) {
    const bool open = !has_seq || seq_win[k] == seq_t;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (open) pre[c] += w[k][c] * win[k][c];
  }
#pragma unroll
  for (int c = 0; c < C; ++c) pre[c] += w[W - 1][c] * x_t[c];
}

// ---- forward -----------------------------------------------------------------------------

// Steps [t, t + S) of a thread's chunk (Full: all of them before t1, no predicates), the
// window advanced over the steps before t1 only (so that it ends holding the chunk's last
// W − 1 inputs).
template <typename T, typename Wt, int W, Layout Lay, bool Full>
__device__ __forceinline__ void forward_steps(const CausalConv1dLaunch& l, const ConvThread& th,
                                              const acc_t<T> (&w)[W][ConvShape<Lay, T>::C],
                                              const acc_t<T> (&bias)[ConvShape<Lay, T>::C],
                                              acc_t<T> (&win)[W - 1][ConvShape<Lay, T>::C],
                                              int32_t (&seq_win)[W - 1], const T* x, T* out,
                                              int64_t t) {
  using Acc = acc_t<T>;
  constexpr int C = ConvShape<Lay, T>::C, S = ConvShape<Lay, T>::S;
  T xs[S][C];
  int32_t ss[S];
  load_steps<Lay, T, C, S>(x, l.x.t, t, Full ? t + S : th.t1, xs);
  load_seq<S>(l, l.has_seq_idx, th.b, t, Full ? t + S : th.t1, ss);
  Acc ys[Lay == Layout::RowsVec16 ? S : 1][C];  // rows: the iteration's outputs
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const bool in = Full || t + s < th.t1;
    Acc x_t[C], y[C];
    to_acc<T, C>(xs[s], x_t);
    conv_pre<Acc, W, C>(l.has_seq_idx, w, bias, win, seq_win, ss[s], x_t, y);
    const bool padding = l.has_seq_idx && ss[s] < 0;
#pragma unroll
    for (int c = 0; c < C; ++c) y[c] = padding ? Acc(0) : l.silu ? conv_silu<kFast<T>>(y[c]) : y[c];
    if constexpr (Lay == Layout::RowsVec16) {
      ys[s][0] = y[0];
    } else if (in) {
      store_step<Lay, T, C>(out + (t + s) * l.out.t, y);
    }
    if (in) {
      shift_in<Acc, W, C>(win, x_t);
      shift_in<int32_t, W>(seq_win, ss[s]);
    }
  }
  if constexpr (Lay == Layout::RowsVec16) {
    constexpr int V = ConvShape<Lay, T>::V;
    if (Full) {
#pragma unroll
      for (int v = 0; v < S / V; ++v) {
        Pack<T, V> pk;
#pragma unroll
        for (int i = 0; i < V; ++i) pk.v[i] = from_acc<T>(ys[v * V + i][0]);
        store_pack<T, V>(out + t + v * V, pk);
      }
    } else {
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (t + s < th.t1) out[t + s] = from_acc<T>(ys[s][0]);
    }
  }
}

template <typename T, typename Wt, int W, Layout Lay>
__global__ void __launch_bounds__(kCausalConv1dThreads)
    causal_conv1d_forward_kernel(const CausalConv1dLaunch l) {
  using Acc = acc_t<T>;
  constexpr int C = ConvShape<Lay, T>::C, S = ConvShape<Lay, T>::S;
  const int64_t items = conv_items(l);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ConvThread th = conv_thread<C>(l, item);
    if (!th.active) continue;
    Acc w[W][C], bias[C];
    load_weights<T, Wt, W, C>(l, th.d0, w, bias);
    Acc win[W - 1][C];
    int32_t seq_win[W - 1];
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      load_state<T, C>(l, th.b, th.d0, th.t0 - (W - 1) + k, win[k]);
      seq_win[k] = seq_at(l, th.b, th.t0 - (W - 1) + k);
    }
    const T* x = static_cast<const T*>(l.x_data) + at(l.x, th.b, th.d0, 0);
    T* out = static_cast<T*>(l.out_data) + at(l.out, th.b, th.d0, 0);
    int64_t t = th.t0;
    for (; t + S <= th.t1; t += S)
      forward_steps<T, Wt, W, Lay, true>(l, th, w, bias, win, seq_win, x, out, t);
    if (t < th.t1) forward_steps<T, Wt, W, Lay, false>(l, th, w, bias, win, seq_win, x, out, t);
    if (th.t1 == l.seqlen) {  // final_states: the last W − 1 inputs, now the window
      T* fin = static_cast<T*>(l.final_states);
#pragma unroll
      for (int k = 0; k < W - 1; ++k)
#pragma unroll
        for (int c = 0; c < C; ++c) fin[at(l.final, th.b, th.d0 + c, k)] = from_acc<T>(win[k][c]);
    }
  }
}

// ---- backward ----------------------------------------------------------------------------

// Rows: dx of S aligned steps [t, t + S), slot (step − t0) mod S, stored as 16-byte vectors
// (one 2-, 4- or 8-byte store a step, a warp writing 32 rows, took the bf16 backward to
// 3.4 × the channel-last one's time on an H200). The backward completes dx W − 1 steps
// behind its inputs, so a vector's last W − 1 slots are written in the next iteration.
template <Layout Lay, typename T, int S>
struct RowsDx {
  T v[S];
  // Steps [t, t + n) below t1 (all S of them before t1: whole vectors).
  __device__ __forceinline__ void store(T* dx, int64_t t, int n, int64_t t1) const {
    constexpr int V = ConvShape<Lay, T>::V;
    if (n == S && t + S <= t1) {
#pragma unroll
      for (int i = 0; i < S / V; ++i) {
        Pack<T, V> pk;
#pragma unroll
        for (int e = 0; e < V; ++e) pk.v[e] = v[i * V + e];
        store_pack<T, V>(dx + t + i * V, pk);
      }
    } else {
#pragma unroll
      for (int i = 0; i < S; ++i)
        if (i < n && t + i < t1) dx[t + i] = v[i];
    }
  }
};

// An iteration's steps [t, t + S) of x, dout and seq_idx, as loaded.
template <Layout Lay, typename T, int C, int S>
struct BwdSteps {
  T x[S][C], dout[S][C];
  int32_t seq[S];
  __device__ __forceinline__ void load(const CausalConv1dLaunch& l, bool has_seq, int64_t b, const T* xp,
                                       const T* doutp, int64_t t, int64_t end) {
    load_steps<Lay, T, C, S>(xp, l.x.t, t, end, x);
    load_steps<Lay, T, C, S>(doutp, l.dout.t, t, end, dout);
    load_seq<S>(l, has_seq, b, t, end, seq);
  }
  // Channel-last, all S steps before the end, no seq_idx: xp and doutp at the first step,
  // one vector a step, addresses advanced by the time strides (no predicates or products).
  __device__ __forceinline__ void load_whole(const T* xp, int64_t xs, const T* doutp, int64_t ds) {
    static_assert(Lay == Layout::ChannelsLastVec, "channel-last vectors");
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const Pack<T, C> a = load_vec<T, C>(xp), b = load_vec<T, C>(doutp);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        x[s][c] = a.v[c];
        dout[s][c] = b.v[c];
      }
      seq[s] = 0;
      xp += xs;
      doutp += ds;
    }
  }
};

// Plain (CausalConv1dLaunch::plain_walk: channel-last, no seq_idx, no dfinal_states): the
// checks those need are compiled out, and an iteration whose S steps all lie in
// [t0 + W − 1, t1) (all but a chunk's first and last) runs without per-step checks. The
// same operations in the same order either way: the same bits.
template <typename T, typename Wt, int W, Layout Lay, bool Plain>
__global__ void __launch_bounds__(kCausalConv1dThreads)
    causal_conv1d_backward_kernel(const CausalConv1dLaunch l) {
  static_assert(!Plain || Lay == Layout::ChannelsLastVec, "the plain walk is channel-last");
  using Acc = acc_t<T>;
  constexpr int C = ConvShape<Lay, T>::C, S = ConvShape<Lay, T>::S, K = W + 1;
  // (read from the launch at each use, as uniform values: held in a register, the flag
  // cost the checked rows kernel 15 % more instructions a step, ptxas sm_90a)
  const auto has_seq = [&] { return !Plain && l.has_seq_idx; };
  const auto has_dfinal = [&] { return !Plain && l.has_dfinal_states; };
  // The block's dweight/dbias partials: [block_chunks][block_channels · C][W + 1].
  __shared__ Acc partial[kCausalConv1dThreads * C * K];
  const int64_t items = conv_items(l);
  const int cols = l.block_channels * C * K;  // a chunk's partial row in shared memory
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const ConvThread th = conv_thread<C>(l, item);
    Acc part[K][C];
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int c = 0; c < C; ++c) part[k][c] = 0;
    if (th.active) {
      Acc w[W][C], bias[C];
      load_weights<T, Wt, W, C>(l, th.d0, w, bias);
      Acc win[W - 1][C], gwin[W - 1][C];
      int32_t seq_win[W - 1];
      bool live_win[W - 1];
#pragma unroll
      for (int k = 0; k < W - 1; ++k) {
        load_state<T, C>(l, th.b, th.d0, th.t0 - (W - 1) + k, win[k]);
        seq_win[k] = seq_at(l, th.b, th.t0 - (W - 1) + k);
        live_win[k] = false;  // before the chunk: never read (dx starts at t0)
#pragma unroll
        for (int c = 0; c < C; ++c) gwin[k][c] = 0;
      }
      const int64_t end = th.t1 + W - 1, in_end = min(end, l.seqlen);
      const T* x = static_cast<const T*>(l.x_data) + at(l.x, th.b, th.d0, 0);
      const T* dout = static_cast<const T*>(l.dout_data) + at(l.dout, th.b, th.d0, 0);
      const T* dfinal = static_cast<const T*>(l.dfinal_states);
      T* dx = static_cast<T*>(l.out_data) + at(l.out, th.b, th.d0, 0);
      // The next iteration's steps are loaded before this one's are used, so that a thread
      // has loads in flight while it computes: one block an SM either way (ptxas, sm_90a,
      // bf16 W = 4 channel-last: 232 → 236 registers); on an H200 the 2.7B layer's x range
      // took 391 → 375 µs, float32 channel-last 286 → 221 (BENCHMARKS.md).
      BwdSteps<Lay, T, C, S> cur, next;
      cur.load(l, has_seq(), th.b, x, dout, th.t0, in_end);
      RowsDx<Lay, T, S> rows_dx;
      T* dq = nullptr;  // Full: dx at step t + s − (W − 1)
      // Step t + s of the iteration at t (Full: live, inside the chunk, dx due, no seq_idx).
      const auto step = [&](auto full, int64_t t, int s) {
        constexpr bool Full = decltype(full)::value;
        const int32_t* ss = cur.seq;
        const int64_t tt = t + s;
        const bool live = Full || (tt < in_end && !(has_seq() && ss[s] < 0));
        Acc x_t[C], g[C];
        to_acc<T, C>(cur.x[s], x_t);
        to_acc<T, C>(cur.dout[s], g);
        if (l.silu) {
          Acc pre[C];
          conv_pre<Acc, W, C>(has_seq(), w, bias, win, seq_win, ss[s], x_t, pre);
#pragma unroll
          for (int c = 0; c < C; ++c) g[c] *= conv_silu_grad<kFast<T>>(pre[c]);
        }
        if (Full || (live && tt < th.t1)) {  // this chunk's dweight and dbias terms
#pragma unroll
          for (int k = 0; k < W - 1; ++k) {
            const bool open = !has_seq() || seq_win[k] == ss[s];
#pragma unroll
            for (int c = 0; c < C; ++c)
              if (open) part[k][c] += g[c] * win[k][c];
          }
#pragma unroll
          for (int c = 0; c < C; ++c) {
            part[W - 1][c] += g[c] * x_t[c];
            part[W][c] += g[c];
          }
        }
        const int64_t sd = tt - (W - 1);  // dx[sd]: its last term is g[tt]
        if (Full || (sd >= th.t0 && tt < end)) {
          Acc d[C];
#pragma unroll
          for (int c = 0; c < C; ++c) d[c] = 0;
          // Tap k of step sd feeds output sd + W − 1 − k: window slot W − 1 − k (slot
          // W − 1 is tt itself); sd is slot 0.
#pragma unroll
          for (int k = 0; k < W; ++k) {
            const int slot = W - 1 - k;
            const bool on = slot == W - 1 ? live : Full || live_win[slot];
            const int32_t sq = slot == W - 1 ? ss[s] : seq_win[slot];
            const bool open = on && (!has_seq() || sq == seq_win[0]);
#pragma unroll
            for (int c = 0; c < C; ++c)
              if (open) d[c] += w[k][c] * (slot == W - 1 ? g[c] : gwin[slot][c]);
          }
          const int64_t jf = sd - (l.seqlen - (W - 1));
          if (has_dfinal() && jf >= 0)
#pragma unroll
            for (int c = 0; c < C; ++c) d[c] += to_acc(dfinal[at(l.final, th.b, th.d0 + c, jf)]);
          if constexpr (Lay == Layout::RowsVec16) {
            rows_dx.v[(s + S - (W - 1)) % S] = from_acc<T>(d[0]);
          } else if constexpr (Full) {
            store_step<Lay, T, C>(dq, d);
            dq += l.out.t;
          } else {
            store_step<Lay, T, C>(dx + sd * l.out.t, d);
          }
        }
        // Rows: the steps [t − S, t) are all done after step t + W − 2.
        if constexpr (Lay == Layout::RowsVec16)
          if (s == W - 2 && t > th.t0) rows_dx.store(dx, t - S, S, th.t1);
        shift_in<Acc, W, C>(win, x_t);
        shift_in<int32_t, W>(seq_win, ss[s]);
        shift_in<bool, W>(live_win, live);
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (!live) g[c] = 0;
        shift_in<Acc, W, C>(gwin, g);
      };
      int64_t t = th.t0;
      for (; t < end; t += S) {
        if constexpr (Plain) {
          if (t + 2 * S <= in_end)
            next.load_whole(x + (t + S) * l.x.t, l.x.t, dout + (t + S) * l.dout.t, l.dout.t);
          else
            next.load(l, false, th.b, x, dout, t + S, in_end);
        } else {
          next.load(l, has_seq(), th.b, x, dout, t + S, in_end);
        }
        if (Plain && t >= th.t0 + (W - 1) && t + S <= th.t1) {
          dq = dx + (t - (W - 1)) * l.out.t;
#pragma unroll
          for (int s = 0; s < S; ++s) step(std::true_type{}, t, s);
        } else {
#pragma unroll
          for (int s = 0; s < S; ++s) step(std::false_type{}, t, s);
        }
        cur = next;
      }
      // Rows: the last iteration's first S − (W − 1) steps (a part of a vector at most).
      if constexpr (Lay == Layout::RowsVec16) rows_dx.store(dx, t - S, S - (W - 1), th.t1);
      if (l.has_initial_states && th.j == 0) {
        // dinit[i] = Σ_k w[k]·g[i − k] over 0 <= i − k < min(L, W − 1) (+ dfinal[i − L]),
        // with g of the first steps recomputed (no seq_idx with initial states).
        Acc gf[W - 1][C];
#pragma unroll
        for (int tt = 0; tt < W - 1; ++tt) {
#pragma unroll
          for (int c = 0; c < C; ++c) gf[tt][c] = 0;
          if (tt >= l.seqlen) continue;
          Acc taps[W - 1][C], x_t[C], pre[C], dy[C];
          int32_t none[W - 1];
#pragma unroll
          for (int k = 0; k < W - 1; ++k) {
            load_state<T, C>(l, th.b, th.d0, tt - (W - 1) + k, taps[k]);
            none[k] = 0;
          }
          load_state<T, C>(l, th.b, th.d0, tt, x_t);
#pragma unroll
          for (int c = 0; c < C; ++c) dy[c] = to_acc(static_cast<const T*>(l.dout_data)[at(l.dout, th.b, th.d0 + c, tt)]);
          if (l.silu) conv_pre<Acc, W, C>(false, w, bias, taps, none, 0, x_t, pre);
#pragma unroll
          for (int c = 0; c < C; ++c) gf[tt][c] = l.silu ? dy[c] * conv_silu_grad<kFast<T>>(pre[c]) : dy[c];
        }
        T* dinit = static_cast<T*>(l.dinitial_states);
#pragma unroll
        for (int i = 0; i < W - 1; ++i) {
          Acc d[C];
#pragma unroll
          for (int c = 0; c < C; ++c) d[c] = 0;
#pragma unroll
          for (int k = 0; k <= i; ++k)
#pragma unroll
            for (int c = 0; c < C; ++c)
              if (i - k < l.seqlen) d[c] += w[k][c] * gf[i - k][c];
#pragma unroll
          for (int c = 0; c < C; ++c) {
            if (has_dfinal() && i >= l.seqlen)
              d[c] += to_acc(dfinal[at(l.final, th.b, th.d0 + c, i - l.seqlen)]);
            dinit[at(l.dinit, th.b, th.d0 + c, i)] = from_acc<T>(d[c]);
          }
        }
      }
    }
    // The block's partial row: its chunks' sums in chunk order.
    const int tx = threadIdx.x % l.block_channels, ty = threadIdx.x / l.block_channels;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int k = 0; k < K; ++k) partial[ty * cols + (tx * C + c) * K + k] = part[k][c];
    __syncthreads();
    Acc* row = static_cast<Acc*>(l.workspace) +
               (th.row * l.dim + th.channel_block * l.block_channels * C) * K;
    const int64_t valid = (min(l.dim, (th.channel_block + 1) * l.block_channels * C) -
                           th.channel_block * l.block_channels * C) * K;
    for (int col = threadIdx.x; col < valid; col += blockDim.x) {
      Acc sum = 0;
      for (int r = 0; r < l.block_chunks; ++r) sum += partial[r * cols + col];
      row[col] = sum;
    }
    __syncthreads();
  }
}

// ---- rows by warps (CausalConv1dLaunch::rows_warp) ---------------------------------------
// A warp takes a row (b, d) and walks it in tiles of 32·V steps (V = 16 / sizeof(T)), lane i
// holding steps [t + V·i, t + V·i + V) as one 16-byte vector: a warp's loads and stores are
// 512 contiguous bytes. The helpers below are the forward's and the backward's.

// f(b, d) for each row (b, d) of the calling warp (warp-uniform: every lane of a warp runs
// the same rows and tiles, as the shuffles need).
template <class F>
__device__ __forceinline__ void for_each_warp_row(const CausalConv1dLaunch& l, F&& f) {
  constexpr int kWarps = kCausalConv1dThreads / 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < l.batch * l.dim;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t b = r / l.dim;
    f(b, r - b * l.dim);
  }
}

// Steps [t, t + V) of a row (zeros at or past L): one vector where all lie before L.
template <typename T, int V>
__device__ __forceinline__ void warp_row_load(const T* p, int64_t t, int64_t L, Pack<T, V>& out) {
  if (t + V <= L) {
    out = load_pack<T, V>(p + t);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = t + i < L ? p[t + i] : from_acc<T>(acc_t<T>(0));
  }
}

// p[t + j] = v[j] for the steps before L: one vector where all lie before L.
template <typename T, int V>
__device__ __forceinline__ void warp_row_store(T* p, int64_t t, int64_t L, const Pack<T, V>& v) {
  if (t + V <= L) {
    store_pack<T, V>(p + t, v);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (t + j < L) p[t + j] = v.v[j];
  }
}

// The lane's window: xa[j] = x at step base − H + j (j < V + H) from its vector cx, the H
// inputs before it from lane i − 1 (lane 0: `carry`, the previous tile's lane 31's; zeros
// before the row); carry becomes this tile's lane 31's last H inputs. Warp-uniform.
template <typename T, int V, int H>
__device__ __forceinline__ void warp_row_window(const Pack<T, V>& cx, int lane, acc_t<T> (&carry)[H],
                                                acc_t<T> (&xa)[V + H]) {
  using Acc = acc_t<T>;
#pragma unroll
  for (int i = 0; i < V; ++i) xa[H + i] = to_acc(cx.v[i]);
#pragma unroll
  for (int k = 0; k < H; ++k) {
    const Acc up = __shfl_up_sync(0xffffffffu, xa[V + k], 1);
    const Acc next_carry = __shfl_sync(0xffffffffu, xa[V + k], 31);
    xa[k] = lane == 0 ? carry[k] : up;
    carry[k] = next_carry;
  }
}

// The forward's rows by warps (RowsVec16 without seq_idx or initial states; 2- or 4-byte
// elements, so that a lane's vector holds the W − 1 steps of a window): the next two
// tiles' loads in flight while one is computed, the window by warp_row_window. The taps
// are added in the order of the other walks (conv_pre), so the outputs have their bits.
// final_states: the row's last W − 1 inputs, read again by lanes 0 .. W − 2 after the
// walk. Four blocks an SM (sm_90a: 64 registers, no spills; 80 without the bound): H200,
// B4 D5120 L4096 bf16, 114 µs against 152 for the chunks of a8a2991 (causal-conv1d 89).
template <typename T, typename Wt, int W>
__global__ void __launch_bounds__(kCausalConv1dThreads, 4)
    causal_conv1d_rows_warp_forward_kernel(const CausalConv1dLaunch l) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / static_cast<int>(sizeof(T)), H = W - 1;
  static_assert(V >= H, "a lane's vector holds a window");
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t L = l.seqlen, tile = 32 * V;
  for_each_warp_row(l, [&](int64_t b, int64_t d) {
    Acc w[W][1], bias[1];
    load_weights<T, Wt, W, 1>(l, d, w, bias);
    const T* x = static_cast<const T*>(l.x_data) + at(l.x, b, d, 0);
    T* out = static_cast<T*>(l.out_data) + at(l.out, b, d, 0);
    Acc carry[H];  // the inputs before the tile's first step (lane 0's window)
#pragma unroll
    for (int k = 0; k < H; ++k) carry[k] = 0;
    Pack<T, V> cx, n1, n2;
    warp_row_load<T, V>(x, static_cast<int64_t>(V) * lane, L, cx);
    warp_row_load<T, V>(x, static_cast<int64_t>(V) * lane + tile, L, n1);
    for (int64_t t0 = 0; t0 < L; t0 += tile) {
      const int64_t base = t0 + static_cast<int64_t>(V) * lane;
      warp_row_load<T, V>(x, base + 2 * tile, L, n2);
      Acc xa[V + H];
      warp_row_window<T, V, H>(cx, lane, carry, xa);
      Pack<T, V> pk;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        Acc pre = bias[0];
#pragma unroll
        for (int k = 0; k < W; ++k) pre += w[k][0] * xa[j + k];
        pk.v[j] = from_acc<T>(l.silu ? conv_silu<kFast<T>>(pre) : pre);
      }
      warp_row_store<T, V>(out, base, L, pk);
      cx = n1;
      n1 = n2;
    }
    if (lane < H) {  // final_states[k] = x[L − H + k] (0 before time 0)
      const int64_t t = L - H + lane;
      static_cast<T*>(l.final_states)[at(l.final, b, d, lane)] = t >= 0 ? x[t] : from_acc<T>(Acc(0));
    }
  });
}

// The backward's rows by warps (RowsVec16 without seq_idx, initial states or
// dfinal_states; 2- or 4-byte elements): x and dout a vector each a lane (the next tile's
// loads in flight while one is computed), the window by warp_row_window. dx needs g of
// the W − 1 steps after a lane's: lane i + 1's, shuffled down; lane 31's come with the next
// tile's lane 0, so lane 31 keeps its dx vector (the H sums still open in Acc) and stores it
// one tile later (the row's last after the walk). Steps at or past L are zeros with g = 0
// and add nothing. dweight/dbias: each lane's terms in step order, then the warp's lanes by
// a fixed xor tree, into workspace row b (partial_rows = B): deterministic. Three blocks an
// SM (sm_90a: 80 registers, up to 56 bytes of stack for 16-bit W = 4): H200, B4 D5120
// L4096 bf16, 218 µs against 228 at two blocks without the bound.
template <typename T, typename Wt, int W>
__global__ void __launch_bounds__(kCausalConv1dThreads, 3)
    causal_conv1d_rows_warp_backward_kernel(const CausalConv1dLaunch l) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / static_cast<int>(sizeof(T)), H = W - 1, K = W + 1;
  static_assert(V >= H, "a lane's vector holds a window");
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t L = l.seqlen, tile = 32 * V;
  for_each_warp_row(l, [&](int64_t b, int64_t d) {
    Acc w[W][1], bias[1];
    load_weights<T, Wt, W, 1>(l, d, w, bias);
    const T* x = static_cast<const T*>(l.x_data) + at(l.x, b, d, 0);
    const T* dout = static_cast<const T*>(l.dout_data) + at(l.dout, b, d, 0);
    T* dx = static_cast<T*>(l.out_data) + at(l.out, b, d, 0);
    // Steps [t, t + V) of x and dout.
    const auto load = [&](int64_t t, Pack<T, V>& px, Pack<T, V>& pd) {
      warp_row_load<T, V>(x, t, L, px);
      warp_row_load<T, V>(dout, t, L, pd);
    };
    Acc part[K];
#pragma unroll
    for (int k = 0; k < K; ++k) part[k] = 0;
    Acc carry[H];  // x of the tile's first W − 1 steps' predecessors (lane 0's window)
#pragma unroll
    for (int k = 0; k < H; ++k) carry[k] = 0;
    // Lane 31's dx of the previous tile: its first V − H steps done, the last H open.
    Pack<T, V> held;
    Acc open[H];
    Pack<T, V> cx, cd, nx, nd;
    load(static_cast<int64_t>(V) * lane, cx, cd);
    for (int64_t t0 = 0; t0 < L; t0 += tile) {
      const int64_t base = t0 + static_cast<int64_t>(V) * lane;
      load(base + tile, nx, nd);
      Acc xa[V + H];
      warp_row_window<T, V, H>(cx, lane, carry, xa);
      // g of the lane's steps (0 at or past L) and their dweight/dbias terms; then
      // dx[base + j] = Σ_k w[k]·g[base + j + W − 1 − k] (taps in order). Full: every step
      // of the tile before L (a warp-uniform test), so that no step is checked.
      const auto steps = [&](auto full, auto silu) {
        constexpr bool Full = decltype(full)::value, Silu = decltype(silu)::value;
        Acc g[V + H];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          Acc pre = bias[0];
#pragma unroll
          for (int k = 0; k < W; ++k) pre += w[k][0] * xa[j + k];
          const Acc dy = to_acc(cd.v[j]);
          const Acc gj = Silu ? dy * conv_silu_grad<kFast<T>>(pre) : dy;
          g[j] = Full || base + j < L ? gj : Acc(0);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
#pragma unroll
          for (int k = 0; k < W; ++k) part[k] += g[j] * xa[j + k];
          part[W] += g[j];
        }
        // Lane 31 of the previous tile: its open sums take this tile's lane 0's g.
        if (t0 > 0) {
#pragma unroll
          for (int m = 0; m < H; ++m) {
            const Acc g0 = __shfl_sync(kAll, g[m], 0);
#pragma unroll
            for (int k = 0; k < W; ++k) {
              const int j = V + m + k - H;  // dx step j of the held vector takes w[k]·g0[m]
              if (j < V) open[j - (V - H)] += w[k][0] * g0;
            }
          }
          if (lane == 31) {
#pragma unroll
            for (int j = 0; j < H; ++j) held.v[V - H + j] = from_acc<T>(open[j]);
            warp_row_store<T, V>(dx, base - tile, L, held);
          }
        }
#pragma unroll
        for (int k = 0; k < H; ++k) {
          const Acc down = __shfl_down_sync(kAll, g[k], 1);
          g[V + k] = lane == 31 ? Acc(0) : down;
        }
        Pack<T, V> pk;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          Acc sum = 0;
#pragma unroll
          for (int k = 0; k < W; ++k) sum += w[k][0] * g[j + H - k];
          pk.v[j] = from_acc<T>(sum);
          if (j >= V - H) open[j - (V - H)] = sum;
        }
        if (lane != 31)
          warp_row_store<T, V>(dx, base, L, pk);
        else
          held = pk;
      };
      // (the activation a template constant too: no test a step)
      const bool full = t0 + tile <= L;
      if (l.silu)
        full ? steps(std::true_type{}, std::true_type{}) : steps(std::false_type{}, std::true_type{});
      else
        full ? steps(std::true_type{}, std::false_type{}) : steps(std::false_type{}, std::false_type{});
      cx = nx;
      cd = nd;
    }
    // The row's last tile: lane 31's vector (no steps after it).
    if (lane == 31 && L > 0) {
      const int64_t last = (L - 1) / tile * tile + static_cast<int64_t>(V) * 31;
#pragma unroll
      for (int j = 0; j < H; ++j) held.v[V - H + j] = from_acc<T>(open[j]);
      warp_row_store<T, V>(dx, last, L, held);
    }
    // The row's sums: a fixed xor tree over the lanes; lane 0 writes them.
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int off = 16; off > 0; off /= 2) part[k] += __shfl_xor_sync(kAll, part[k], off);
    if (lane == 0) {
      Acc* row = static_cast<Acc*>(l.workspace) + (b * l.dim + d) * K;
#pragma unroll
      for (int k = 0; k < K; ++k) row[k] = part[k];
    }
  });
}

// dweight[d, k] = Σ_rows partial[row][d][k], dbias[d] = Σ_rows partial[row][d][W]: the rows
// in order (zeros without rows).
template <typename Acc, typename Wt>
__global__ void __launch_bounds__(kCausalConv1dThreads)
    causal_conv1d_weight_sum_kernel(const CausalConv1dLaunch l) {
  const int K = l.width + 1;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kCausalConv1dThreads + threadIdx.x;
  if (i >= l.dim * K) return;
  const int64_t d = i / K;
  const int k = static_cast<int>(i % K);
  const Acc* ws = static_cast<const Acc*>(l.workspace);
  Acc sum = 0;
  for (int64_t r = 0; r < l.partial_rows; ++r) sum += ws[r * l.dim * K + i];
  if (k < l.width)
    static_cast<Wt*>(l.dweight)[d * l.width + k] = from_acc<Wt>(sum);
  else if (l.has_bias)
    static_cast<Wt*>(l.dbias)[d] = from_acc<Wt>(sum);
}

// ---- dispatch ----------------------------------------------------------------------------

template <Layout Lay>
using LayoutTag = std::integral_constant<Layout, Lay>;
template <int W>
using WidthTag = std::integral_constant<int, W>;

// f(T{}, Wt{}, WidthTag<W>{}, LayoutTag<Lay>{}) with the device types of x and the weight,
// the width and the layout the launch picked.
template <typename F>
void dispatch_causal_conv1d(const CausalConv1dLaunch& l, F&& f) {
  dispatch_floating(l.element, [&](auto t) {
    using T = decltype(t);
    const auto with_weight = [&](auto wt) {
      const auto with_width = [&](auto width) {
        switch (l.layout) {
          case Layout::ChannelsLastVec:
            return f(T{}, wt, width, LayoutTag<Layout::ChannelsLastVec>{});
          case Layout::RowsVec16: return f(T{}, wt, width, LayoutTag<Layout::RowsVec16>{});
          default: return f(T{}, wt, width, LayoutTag<Layout::Strided>{});
        }
      };
      switch (l.width) {
        case 2: return with_width(WidthTag<2>{});
        case 3: return with_width(WidthTag<3>{});
        case 4: return with_width(WidthTag<4>{});
        default: fail(PlanErrorKind::Internal, "causal_conv1d", "no CUDA kernel for this width");
      }
    };
    if constexpr (!std::is_same_v<T, float>) {
      if (l.weight_element == ElementKind::F32) return with_weight(float{});
    }
    with_weight(T{});
  });
}

static_assert(kCausalConv1dMaxCudaWidth == 4 && kCausalConv1dMinCudaWidth == 2,
              "dispatch_causal_conv1d instantiates widths 2 to 4");

// The work split for `per_sm` resident blocks an SM. For each block shape (block_channels
// from the fewest that cover a warp's worth of channel groups, or all of them, up to a
// block of channels; block_chunks the rest of kCausalConv1dThreads), as many chunks per
// (batch, channel group) as fill the resident blocks once, without chunks shorter than
// kCausalConv1dMinChunk; the shape that keeps the most threads busy (per round of
// resident blocks) wins, the one with more chunks a block on a tie (fewer partial rows).
// Chunks are whole iterations (rows: whole vectors from a chunk's start); the grid is the
// resident blocks, at most one per item.
//
// The rows forward is split along time instead: chunks of kCausalConv1dRowsForwardChunkIters
// iterations, and block_chunks the power of two that covers a row's chunks (at most the
// block), so that a warp's lanes hold consecutive chunks of one row (of 256 / block_chunks
// rows when a row has fewer than 32 chunks) and a warp's loads read one stretch of the row
// rather than 32 rows. Measured (H200, torch 2.11, B4 D5120 L4096 W4 bf16; BENCHMARKS.md,
// "The conv's rows forward split along time"): 186.3 -> 152.2 µs; chunks of 1, 4 and 8
// iterations 186.8, 198.5, 201.2 (the fifteenth session's run). The backward with the same
// split lost at every chunk length (760 -> 889-1884 µs): it keeps the search below.
inline CausalConv1dWork causal_conv1d_work(const CausalConv1dLaunch& l, int per_sm) {
  const int64_t resident = static_cast<int64_t>(per_sm) * (l.sm_count > 0 ? l.sm_count : 1);
  const int64_t steps = causal_conv1d_steps(l.layout, element_size(l.element));
  const int64_t len = l.seqlen > 0 ? l.seqlen : 1;
  if (l.rows_warp) {  // a row a warp, blocks of kCausalConv1dThreads threads
    const int64_t blocks = (l.batch * l.dim + kCausalConv1dThreads / 32 - 1) / (kCausalConv1dThreads / 32);
    return {len, std::clamp<int64_t>(std::min(blocks, resident), 1, INT32_MAX), kCausalConv1dThreads, 1};
  }
  if (l.layout == Layout::RowsVec16 && !l.backward) {
    const int64_t chunk = kCausalConv1dRowsForwardChunkIters * steps;
    const int64_t chunks = (len + chunk - 1) / chunk;
    int64_t by = 1;
    while (by < std::min<int64_t>(chunks, kCausalConv1dThreads)) by *= 2;
    const int64_t bx = kCausalConv1dThreads / by;
    const int64_t items = l.batch * ((l.groups + bx - 1) / bx) * ((chunks + by - 1) / by);
    return {chunk, std::clamp<int64_t>(std::min(items, resident), 1, INT32_MAX), static_cast<int>(bx),
            static_cast<int>(by)};
  }
  int64_t bx = 1;
  while (bx < std::min<int64_t>(l.groups, kCausalConv1dMinBlockChannels)) bx *= 2;
  CausalConv1dWork best;
  double best_busy = -1;
  for (; bx <= kCausalConv1dThreads; bx *= 2) {
    const int64_t by = kCausalConv1dThreads / bx;
    const int64_t rows = l.batch * ((l.groups + bx - 1) / bx);
    const int64_t most = (len + by * kCausalConv1dMinChunk - 1) / (by * kCausalConv1dMinChunk);
    const int64_t chunk_blocks = std::clamp<int64_t>(resident / std::max<int64_t>(rows, 1), 1,
                                                     std::max<int64_t>(most, 1));
    int64_t chunk = (len + chunk_blocks * by - 1) / (chunk_blocks * by);
    chunk = (chunk + steps - 1) / steps * steps;
    const int64_t chunks = (len + chunk - 1) / chunk;
    const int64_t items = rows * ((chunks + by - 1) / by);
    const int64_t rounds = (items + resident - 1) / std::max<int64_t>(resident, 1);
    const double busy = static_cast<double>(l.batch * l.groups * chunks) /
                        static_cast<double>(std::max<int64_t>(rounds * resident * kCausalConv1dThreads, 1));
    if (busy > best_busy) {
      best_busy = busy;
      best = {chunk, std::clamp<int64_t>(std::min(items, resident), 1, INT32_MAX), static_cast<int>(bx),
              static_cast<int>(by)};
    }
    if (bx >= l.groups) break;  // wider blocks would only add idle channel groups
  }
  return best;
}

// f(kernel) with the forward or backward kernel the launch picks.
template <bool Backward, typename F>
void with_conv_kernel(const CausalConv1dLaunch& l, F&& f) {
  dispatch_causal_conv1d(l, [&](auto t, auto wt, auto width, auto lay) {
    using T = decltype(t);
    using Wt = decltype(wt);
    constexpr int W = decltype(width)::value;
    constexpr Layout Lay = decltype(lay)::value;
    if constexpr (Backward) {
      if constexpr (Lay == Layout::ChannelsLastVec) {
        if (l.plain_walk) return f(causal_conv1d_backward_kernel<T, Wt, W, Lay, true>);
      }
      if constexpr (Lay == Layout::RowsVec16 && sizeof(T) <= 4) {
        if (l.rows_warp) return f(causal_conv1d_rows_warp_backward_kernel<T, Wt, W>);
      }
      f(causal_conv1d_backward_kernel<T, Wt, W, Lay, false>);
    } else {
      if constexpr (Lay == Layout::RowsVec16 && sizeof(T) <= 4) {
        if (l.rows_warp) return f(causal_conv1d_rows_warp_forward_kernel<T, Wt, W>);
      }
      f(causal_conv1d_forward_kernel<T, Wt, W, Lay>);
    }
  });
}

// Blocks of kCausalConv1dThreads of that kernel resident on an SM (the occupancy
// calculator; 1 if it fails, which is always correct).
template <bool Backward>
int conv_blocks_per_sm(const CausalConv1dLaunch& l) {
  int n = 1;
  with_conv_kernel<Backward>(l, [&](auto kernel) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kCausalConv1dThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      n = 1;
    }
  });
  return std::max(n, 1);
}

// The walk over the items: l.grid blocks of block_channels × block_chunks threads.
template <bool Backward>
void launch_conv_walk(const CausalConv1dLaunch& l, cudaStream_t stream) {
  const auto threads = static_cast<unsigned int>(l.block_channels * l.block_chunks);
  with_conv_kernel<Backward>(l, [&](auto kernel) {
    kernel<<<static_cast<unsigned int>(l.grid), threads, 0, stream>>>(l);
  });
}

// Instantiated once per direction (causal_conv1d_forward.cu, causal_conv1d_backward.cu).
void launch_causal_conv1d_forward(const CausalConv1dLaunch& l, cudaStream_t stream);
void launch_causal_conv1d_backward(const CausalConv1dLaunch& l, cudaStream_t stream);
int causal_conv1d_forward_blocks_per_sm(const CausalConv1dLaunch& l);
int causal_conv1d_backward_blocks_per_sm(const CausalConv1dLaunch& l);

}  // namespace baracuda::kernels::cuda
