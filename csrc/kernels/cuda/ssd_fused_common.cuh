// What the two one-launch SSD forwards share (ssd_fused_forward.cu: mma.sync, sm_80+;
// ssd_fused_forward_sm90.cu: wgmma, sm_90a): the kernel parameters, the ticket order
// and the state hand-over between consecutive chunks, dt processing and its cumsum, the
// output epilogue, and the host side (parameters from the launch description, the
// workspace, the check of the plan's choice). ssd_fused_forward.cu's header comment gives
// the algorithm.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ssd_seq_idx.cuh"
#include "kernels/cuda/ssd_chunk_scan_mma.cuh"
#include "kernels/ssd_chunk_scan.h"

namespace baracuda::kernels::cuda {

constexpr int kFusedThreads = 256;
constexpr int kFusedWarps = kFusedThreads / 32;
static_assert(kFusedWarps == 8, "ssd_fused_smem_bytes counts 8 per-warp sequence-start maxima");
constexpr int kFusedQ = static_cast<int>(kSsdFusedMaxChunk);  // rows of the chunk tiles
constexpr int kFusedP = static_cast<int>(kSsdFusedHeadTile);  // head_dim columns per block
static_assert(kFusedThreads == kFusedQ, "one thread per chunk position for dt and its cumsum");

struct FusedParams {
  int batch, seqlen, heads, head_dim, state_dim, chunk, nchunks, psplit, hpg;
  int split_cols;  // the state columns a block takes (half of them with two halves: FusedTile)
  const void* x;
  int64_t xs[4];
  const void* dt;
  int64_t dts[3];
  bool dt_f32;
  const float* A;
  int64_t As;
  const void* B;
  int64_t Bs[4];
  const void* C;
  int64_t Cs[4];
  bool x_vec, bc_vec;  // 16-byte cp.async rows (unit inner stride, 16-byte aligned)
  const float* D;
  int64_t Ds0, Ds1;  // Ds1 = 0 for a [H] D
  const void* z;
  int64_t zs[4];
  bool z_pair;  // z's column pairs are 4-byte aligned words (unit inner stride)
  bool z_stage;  // z's rows 16-byte aligned with unit inner stride (fused_rows_vec): copied by cp.async
  bool y_stage;  // y and y_pre 16-byte aligned: stored from a staging tile, 16 bytes a lane
  const float* dt_bias;
  int64_t dbs;
  bool softplus;
  float dt_min, dt_max;
  const float* init;
  int64_t is[4];
  void* y;              // dense [B, L, H, head_dim]
  void* y_pre;          // dense [B, L, H, head_dim] or null
  float* final_states;  // dense [B, H, head_dim, N] or null
  int* ticket;          // then one counter per chain: chunks published
  int* half_ready;      // two halves: [pairs][nchunks][1 or 2], 1 once that H_c is stored
  float* ring;          // [chains][2][kFusedP][split_cols]: the last two states handed over
  void* half_states;    // two halves: [pairs][nchunks][1 or 2][kFusedP][split_cols], H_c rounded to T
  void* states;         // kept H_c (SsdChunkScanLaunch::states): dense [B, H, nc, head_dim, N] of T, or null
  float* cb;            // FusedMmaCb: [B][nchunks][G][cb_tiles][2][32 lanes][4] (ssd_fused_cb_tiles)
  int cb_tiles;
  const void* seq;      // seq_idx [B, L] (int32, or int64 with seq_i64), or null
  int64_t seq_s[2];
  bool seq_i64;
  bool factored;  // SsdChunkScanLaunch::factored_decays
  // fused_tile's divisors, by multiply-shift: batch·heads·psplit, heads·psplit, psplit, hpg
  FastDivmod tiles_div, bh_div, psplit_div, hpg_div;
};

// A block's problem, from its ticket: chunk-major, then batch, head, head_dim tile and,
// with the state columns in two halves (SPLIT: FusedMmaCb at N > 128), the half: the
// second half first, so that the block of the first, which waits for the second's H_c
// over its columns, has the larger ticket.
struct FusedTile {
  int c, b, h, grp, t0, len, p0;
  int nh, n0;      // the half of the state columns and its first column (0, 0 without halves)
  int64_t pair;    // (b, h, head_dim tile)
  int64_t chain;   // (b, h, head_dim tile, half): one state hand-over each
};

template <bool SPLIT = false>
__device__ __forceinline__ FusedTile fused_tile(const FusedParams& p, int ticket) {
  FusedTile t;
  const int nsplit = SPLIT ? 2 : 1;  // (the plan's fused_state_split)
  const int per_chunk = p.batch * p.heads * p.psplit * nsplit;
  const uint32_t u = static_cast<uint32_t>(ticket);
  t.c = static_cast<int>(p.tiles_div.div(SPLIT ? u >> 1 : u));  // (⌊⌊u/2⌋/n⌋ = ⌊u/2n⌋)
  int rest = ticket - t.c * per_chunk;
  t.nh = 0;
  if constexpr (SPLIT) {
    t.nh = 1 - (rest & 1);
    rest >>= 1;
  }
  t.n0 = t.nh * p.split_cols;
  t.b = static_cast<int>(p.bh_div.div(static_cast<uint32_t>(rest)));
  rest -= t.b * p.heads * p.psplit;
  t.h = static_cast<int>(p.psplit_div.div(static_cast<uint32_t>(rest)));
  const int ps = rest - t.h * p.psplit;
  t.grp = static_cast<int>(p.hpg_div.div(static_cast<uint32_t>(t.h)));
  t.t0 = t.c * p.chunk;
  t.len = min(p.chunk, p.seqlen - t.t0);
  t.p0 = ps * kFusedP;
  t.pair = (static_cast<int64_t>(t.b) * p.heads + t.h) * p.psplit + ps;
  t.chain = t.pair * nsplit + t.nh;
  return t;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// 2^x (MUFU.EX2; denormal results flush to 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 v;
    memcpy(&v, &r, 4);
    return __half22float2(v);
  } else {
    __nv_bfloat162 v;
    memcpy(&v, &r, 4);
    return __bfloat1622float2(v);
  }
}

// Two 16-bit values times (w0, w1), rounded back.
template <typename T>
__device__ __forceinline__ uint32_t scale2(uint32_t r, float w0, float w1) {
  const float2 f = unpack2<T>(r);
  return ssd_pack2<T>(f.x * w0, f.y * w1);
}

// Eight elements src[k·s_col], k < 8, as raw 16 bytes; 0 where k >= K (K <= 8).
template <typename T>
__device__ __forceinline__ uint4 gather8(const T* src, int64_t s_col, int K) {
  T v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = i < K ? src[i * s_col] : from_acc<T>(0.0f);
  uint4 raw;
  memcpy(&raw, v, 16);
  return raw;
}

// The kFusedQ rows of a [rows][COLS] 16-bit tile from src (row stride s_row, column stride
// s_col) into shared memory, element (r, c) at at(r, c) with 8 rows `bytes_per_8_rows`
// apart: 16-byte groups by cp.async where `vec` (needs K % 8 == 0, unit inner stride and
// 16-byte aligned rows), else gathered; 0 where r >= rows or c >= K. A thread keeps one
// column group and walks every kStep-th row, so its addresses advance by constants.
// `evict_first` (an operand no other block reads): the whole-tile copies take the L2
// evict-first policy (ssd_evict_first_policy).
template <typename T, int COLS, typename At>
__device__ __forceinline__ void fused_load_tile(At at, int bytes_per_8_rows, const T* src, int64_t s_row,
                                                int64_t s_col, bool vec, int rows, int K, bool evict_first = false) {
  constexpr int kGroups = COLS / 8;
  constexpr int kStep = kFusedThreads / kGroups;  // rows between a thread's groups
  static_assert(kFusedThreads % kGroups == 0 && kStep % 8 == 0, "whole 8-row groups per step");
  const int c = (threadIdx.x % kGroups) * 8;
  int r = threadIdx.x / kGroups;
  const T* s = src + r * s_row + c * s_col;
  unsigned char* d = at(r, c);
  const int step = kStep / 8 * bytes_per_8_rows;
  const bool col_in = c < K;
  if (vec && rows >= kFusedQ && K >= COLS) {  // the usual whole tile: a copy per group, no checks
    if (evict_first) {
      const uint64_t pol = ssd_evict_first_policy();
#pragma unroll
      for (int i = 0; i < kFusedQ / kStep; ++i) ssd_cp_async16_hint(d + i * step, s + i * kStep * s_row, pol);
      return;
    }
#pragma unroll
    for (int i = 0; i < kFusedQ / kStep; ++i) ssd_cp_async16(d + i * step, s + i * kStep * s_row);
    return;
  }
#pragma unroll 4
  for (; r < kFusedQ; r += kStep, s += kStep * s_row, d += step) {
    if (r < rows && col_in) {
      if (vec)
        ssd_cp_async16(d, s);
      else
        *reinterpret_cast<uint4*>(d) = gather8(s, s_col, K - c);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// What fused_dt_cumsum reads from global memory: the chunk's raw dt at this thread's
// position (plus dt_bias; 0 past the chunk's end) and the head's A; and, for the output
// epilogue, the head's D where D is [H] (one value per head; 0 otherwise). The kernels
// issue these loads before their tile copies, so that they do not queue behind them:
// fused_dt_cumsum, which needs them first, runs while the copies are in flight.
struct FusedDt {
  float dt, A, D;
  int start;  // 1 where a sequence starts at this position (seq_idx changes from t − 1 to t)
};
template <typename T>
__device__ __forceinline__ FusedDt fused_dt_load(const FusedParams& p, const FusedTile& tile) {
  const int tid = threadIdx.x;
  FusedDt r{0.0f, p.A[tile.h * p.As], p.D != nullptr && p.Ds1 == 0 ? p.D[tile.h * p.Ds0] : 0.0f, 0};
  if (tid < tile.len) {
    const int64_t at = tile.b * p.dts[0] + (tile.t0 + tid) * p.dts[1] + tile.h * p.dts[2];
    r.dt = p.dt_f32 ? static_cast<const float*>(p.dt)[at] : to_acc(static_cast<const T*>(p.dt)[at]);
    if (p.dt_bias != nullptr) r.dt += p.dt_bias[tile.h * p.dbs];
    const int64_t t = tile.t0 + tid;
    if (p.seq != nullptr && t > 0) r.start = seq_starts_at(p.seq, p.seq_i64, p.seq_s, tile.b, t);
  }
  return r;
}

// Processes the chunk's dt (`in`: fused_dt_load's values; softplus, clamp; 0 past the
// chunk's end) and writes, one position per thread: dts (processed dt), acs2 =
// log2(e)·cumsum(dt·A) (the chunk's decays in base 2), wgt = 2^(acs2_last − acs2_s)·dt_s
// (the chunk-state weights) and, where `colw` is given, colw = 2^(acs2_e − acs2_s)·dt_s
// with e = s | 15, the last position of s's 16-position step (0 where e is past the
// chunk): the column factors of the intra-chunk weights of the steps before a row's own
// (ssd_fused_forward.cu's step 4). Returns acs2_last. Ends with __syncthreads(). `warp_total`:
// kFusedWarps floats.
//
// SEQ, with seq_idx (p.seq; `seg`: kFusedQ + kFusedWarps ints): seg[t] is the chunk position of
// the last sequence start at or before t, or −1 where t's sequence began before the chunk.
// A decay across a start is 0 (as the staged kernels' lowered cumsum makes it): the
// intra-chunk pairs (t, s) need seg[t] <= s, the incoming state reaches only rows with
// seg[t] < 0, the chunk state takes the positions s >= seg[last] (wgt 0 before), and the
// state handed on decays by 0 when a sequence starts in the chunk (the value returned is
// then −inf, for 2^x = 0). The cumsum restarts at each start (from the start's own
// dt·A), so that an Inf or NaN dt of one sequence stays out of the later ones' decays;
// before the chunk's first start it is the plain cumsum, bit for bit.
template <bool SEQ = false>
__device__ __forceinline__ float fused_dt_cumsum(const FusedParams& p, const FusedTile& tile, FusedDt in,
                                                 float* acs2, float* dts, float* wgt, float* warp_total,
                                                 int* seg = nullptr, float* colw = nullptr) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float A2 = in.A * 1.4426950408889634f;
  float dtv = 0.0f, d = in.dt;
  if (tid < tile.len) {
    if (p.softplus && d <= 20.0f) d = log1pf(expf(d));
    d = d < p.dt_min ? p.dt_min : d;  // NaN stays NaN
    d = d > p.dt_max ? p.dt_max : d;
    dtv = d;
  }
  float cum = dtv * A2;  // inclusive scan over the chunk, in a fixed order
  int sp = in.start ? tid : -1;  // (seg: an inclusive max-scan)
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float u = __shfl_up_sync(0xffffffffu, cum, o);
    if constexpr (SEQ) {
      const int us = __shfl_up_sync(0xffffffffu, sp, o);
      if (lane >= o && sp < 0) cum += u;  // (restarts: nothing before this lane's last start)
      if (lane >= o) sp = max(sp, us);
    } else {
      if (lane >= o) cum += u;
    }
  }
  if (lane == 31) {
    warp_total[warp] = cum;
    if constexpr (SEQ) seg[kFusedQ + warp] = sp;
  }
  __syncthreads();
  int first = 0;  // (SEQ: the warps before this one whose totals count, from the last with a start)
  if constexpr (SEQ) {
    if (sp >= 0) first = warp;
    for (int w = warp - 1; w >= first; --w)
      if (seg[kFusedQ + w] >= 0) first = w;
  }
  for (int w = first; w < warp; ++w) cum += warp_total[w];
  acs2[tid] = cum;
  dts[tid] = dtv;
  if constexpr (SEQ) {
    for (int w = 0; w < warp; ++w) sp = max(sp, seg[kFusedQ + w]);
    seg[tid] = sp;
  }
  __syncthreads();
  const float last = acs2[tile.len - 1];
  if (colw != nullptr) {
    const int e = tid | 15;
    colw[tid] = e < tile.len ? fast_exp2(acs2[e] - cum) * dtv : 0.0f;
  }
  if constexpr (SEQ) {
    const int seg_last = seg[tile.len - 1];
    wgt[tid] = tid < tile.len && tid >= seg_last ? fast_exp2(last - cum) * dtv : 0.0f;
    __syncthreads();
    return seg_last < 0 ? last : -INFINITY;
  } else {
    wgt[tid] = tid < tile.len ? fast_exp2(last - cum) * dtv : 0.0f;
    __syncthreads();
    return last;
  }
}

// Whether H_c is already there (chunk 0, or chunk c − 1 has published), without waiting.
// For thread 0, which hands the answer to the block through shared memory and a barrier
// (the same acquire-then-barrier order as fused_wait_for_state).
__device__ __forceinline__ bool fused_state_ready(const FusedParams& p, const FusedTile& tile) {
  return tile.c == 0 || ld_acquire(p.ticket + 1 + tile.chain) >= tile.c;
}

// Blocks until *flag >= value (thread 0 acquires it, then the block's barrier). The ticket
// order guarantees progress; a wait of seconds can only be a bug, and a trap (an error
// the caller sees) is better than a hang. Ends with __syncthreads().
__device__ __forceinline__ void fused_block_wait(const int* flag, int value) {
  if (threadIdx.x == 0)
    for (int64_t spins = 0; ld_acquire(flag) < value; ++spins) {
      if (spins > (int64_t{1} << 26)) __trap();
      __nanosleep(32);
    }
  __syncthreads();
}

// Blocks until chunk c − 1 of the block's chain has published H_c (c > 0; fused_state_ready's
// counter). Ends with __syncthreads().
__device__ __forceinline__ void fused_wait_for_state(const FusedParams& p, const FusedTile& tile) {
  if (tile.c > 0) fused_block_wait(p.ticket + 1 + tile.chain, tile.c);
}

// H_c[p][n] and H_c[p][n + 1] (float32; n counted from the block's first state column
// tile.n0): the ring's slot of chunk c − 1, or the initial states (0 without them) for
// chunk 0. n even; columns past N read 0.
template <int NS>
__device__ __forceinline__ float2 fused_state_in(const FusedParams& p, const FusedTile& tile, int pr, int n) {
  if (tile.c > 0) {
    const float* prev = p.ring + (tile.chain * 2 + ((tile.c + 1) & 1)) * (kFusedP * NS);
    return __ldcg(reinterpret_cast<const float2*>(prev + pr * NS + n));
  }
  float2 v = make_float2(0.0f, 0.0f);
  if (p.init != nullptr) {
    const float* ip = p.init + tile.b * p.is[0] + tile.h * p.is[1] + (tile.p0 + pr) * p.is[2];
    n += tile.n0;
    if (n < p.state_dim) v.x = ip[n * p.is[3]];
    if (n + 1 < p.state_dim) v.y = ip[(n + 1) * p.is[3]];
  }
  return v;
}

// H_c[p][n..n+3], n a multiple of 4 (fused_state_in four columns at a time).
template <int NS>
__device__ __forceinline__ float4 fused_state_in4(const FusedParams& p, const FusedTile& tile, int pr, int n) {
  if (tile.c > 0) {
    const float* prev = p.ring + (tile.chain * 2 + ((tile.c + 1) & 1)) * (kFusedP * NS);
    return __ldcg(reinterpret_cast<const float4*>(prev + pr * NS + n));
  }
  const float2 lo = fused_state_in<NS>(p, tile, pr, n), hi = fused_state_in<NS>(p, tile, pr, n + 2);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Row pr of the block's kept H_c (FusedParams::states, 16-bit values): head_dim row
// tile.p0 + pr of chunk c's state.
__device__ __forceinline__ unsigned short* fused_kept_row(const FusedParams& p, const FusedTile& tile, int pr) {
  return static_cast<unsigned short*>(p.states) +
         (((static_cast<int64_t>(tile.b) * p.heads + tile.h) * p.nchunks + tile.c) * p.head_dim + tile.p0 + pr) *
             p.state_dim;
}

// The block's kept H_c from shared memory, 64 rows of 16-bit values `ld` apart that hold
// all N columns (both halves' with SPLIT): 16 bytes a thread and store where N is a
// multiple of 8 (each row's 16-byte groups then aligned), else a value at a time.
// Streamed (evict-first): the backward reads them much later.
__device__ __forceinline__ void fused_keep_states(const FusedParams& p, const FusedTile& tile,
                                                  const void* rows, int ld, int tid) {
  const int N = p.state_dim;
  unsigned short* dst = fused_kept_row(p, tile, 0);
  const auto* src = static_cast<const unsigned short*>(rows);
  if (N % 8 == 0) {
    const int W = N / 8;
    for (int i = tid; i < kFusedP * W; i += kFusedThreads)
      __stcs(reinterpret_cast<uint4*>(dst + (i / W) * N) + i % W,
             *reinterpret_cast<const uint4*>(src + (i / W) * ld + (i % W) * 8));
  } else {
    for (int i = tid; i < kFusedP * N; i += kFusedThreads) dst[(i / N) * N + i % N] = src[(i / N) * ld + i % N];
  }
}

// The kept H_c[pr][n .. n + 3] (n a multiple of 4; columns past N dropped) from a thread's
// four rounded values v (two packed pairs).
__device__ __forceinline__ void fused_keep_states4(const FusedParams& p, const FusedTile& tile, int pr, int n,
                                                   uint2 v) {
  const int N = p.state_dim;
  if (n >= N) return;
  unsigned short* row = fused_kept_row(p, tile, pr);
  if (N % 4 == 0) {
    __stcs(reinterpret_cast<uint2*>(row + n), v);
  } else {
    const unsigned short e[4] = {static_cast<unsigned short>(v.x), static_cast<unsigned short>(v.x >> 16),
                                 static_cast<unsigned short>(v.y), static_cast<unsigned short>(v.y >> 16)};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (n + k < N) row[n + k] = e[k];
  }
}

// Stores H_{c+1}[p][n], [n + 1] (n from tile.n0): into the ring for chunk c + 1, or as
// final_states after the last chunk.
template <int NS>
__device__ __forceinline__ void fused_state_out(const FusedParams& p, const FusedTile& tile, int pr, int n,
                                                float2 v) {
  if (tile.c < p.nchunks - 1) {
    float* next = p.ring + (tile.chain * 2 + (tile.c & 1)) * (kFusedP * NS);
    __stcg(reinterpret_cast<float2*>(next + pr * NS + n), v);
  } else if (p.final_states != nullptr) {
    float* fp = p.final_states +
                ((static_cast<int64_t>(tile.b) * p.heads + tile.h) * p.head_dim + tile.p0 + pr) * p.state_dim;
    n += tile.n0;
    if (n < p.state_dim) fp[n] = v.x;
    if (n + 1 < p.state_dim) fp[n + 1] = v.y;
  }
}

// After every thread's fused_state_out: chunk c + 1 may read H_{c+1}. The barrier orders
// the block's stores before thread 0's release store, and a release is cumulative (it
// covers the stores its thread has observed), so one thread releases and no thread needs
// a fence of its own (a __threadfence before the release cost 7 µs of the N = 256 forward).
__device__ __forceinline__ void fused_publish_state(const FusedParams& p, const FusedTile& tile) {
  if (tile.c == p.nchunks - 1) return;
  __syncthreads();
  if (threadIdx.x == 0) st_release(p.ticket + 1 + tile.chain, tile.c + 1);
}

// z at row t (chunk-local) and the head_dim columns col, col + 1 of the tile, packed as
// two 16-bit values. The blocks load a row tile's z before its products (fused_store_out
// then needs no load of its own).
template <typename T>
__device__ __forceinline__ uint32_t fused_z_pair(const FusedParams& p, const FusedTile& tile, int t, int col) {
  const T* zp = static_cast<const T*>(p.z) + tile.b * p.zs[0] + (tile.t0 + t) * p.zs[1] + tile.h * p.zs[2] +
                (tile.p0 + col) * p.zs[3];
  if (p.z_pair) return __ldcs(reinterpret_cast<const unsigned int*>(zp));
  T v[2] = {zp[0], zp[p.zs[3]]};
  uint32_t r;
  memcpy(&r, v, 4);
  return r;
}

// The output of row t (chunk-local, < len) at head_dim columns col, col + 1 of the tile:
// v + D·x (x: the two input values; d_head: FusedDt::D, the value of a [H] D), y_pre,
// then the z gate (z2: fused_z_pair); as T pairs: .pre (y_pre) and .y.
struct FusedOutPair {
  uint32_t pre, y;
};
template <typename T>
__device__ __forceinline__ FusedOutPair fused_out_pair(const FusedParams& p, const FusedTile& tile, int col, float v0,
                                                       float v1, uint32_t x2, uint32_t z2, float d_head) {
  const int pc = tile.p0 + col;
  if (p.D != nullptr) {
    const float2 xv = unpack2<T>(x2);
    float d0 = d_head, d1 = d_head;
    if (p.Ds1 != 0) {  // [H, head_dim]
      const float* Dh = p.D + tile.h * p.Ds0;
      d0 = Dh[pc * p.Ds1];
      d1 = Dh[(pc + 1) * p.Ds1];
    }
    v0 = fmaf(d0, xv.x, v0);
    v1 = fmaf(d1, xv.y, v1);
  }
  FusedOutPair o;
  o.pre = ssd_pack2<T>(v0, v1);
  if (p.z != nullptr) {  // v·silu(z) = v·z/(1 + e^-z); e^-z = inf gives 0
    const float2 zv = unpack2<T>(z2);
    v0 *= __fdividef(zv.x, 1.0f + __expf(-zv.x));
    v1 *= __fdividef(zv.y, 1.0f + __expf(-zv.y));
  }
  o.y = ssd_pack2<T>(v0, v1);
  return o;
}

// fused_out_pair's values stored at row t, columns col, col + 1.
template <typename T>
__device__ __forceinline__ void fused_store_out(const FusedParams& p, const FusedTile& tile, int t, int col,
                                                float v0, float v1, uint32_t x2, uint32_t z2, float d_head) {
  const FusedOutPair o = fused_out_pair<T>(p, tile, col, v0, v1, x2, z2, d_head);
  const int64_t out_at =
      ((static_cast<int64_t>(tile.b) * p.seqlen + tile.t0 + t) * p.heads + tile.h) * p.head_dim + tile.p0 + col;
  // y_pre and y stored, and z read (fused_z_pair), with the streaming hint (.cs: evicted
  // first), as the fused forward's x fill is (its evict_first): each is touched once, and
  // L2 keeps what every head's block reads (B, C, the C·Bᵀ table). H200, the Mamba-2 2.7B
  // shape: the fused kernel 540 -> 518 µs, with the options 736 -> 698 (BENCHMARKS.md).
  if (p.y_pre != nullptr) __stcs(reinterpret_cast<unsigned int*>(static_cast<T*>(p.y_pre) + out_at), o.pre);
  __stcs(reinterpret_cast<unsigned int*>(static_cast<T*>(p.y) + out_at), o.y);
}

// ---- host ------------------------------------------------------------------------------

// (b, h, head_dim tile) triples, and chains: one per triple and half of the state columns.
inline int64_t fused_pairs(const SsdChunkScanLaunch& l) {
  return l.batch * l.heads * (l.head_dim / kSsdFusedHeadTile);
}
inline int64_t fused_chains(const SsdChunkScanLaunch& l) { return fused_pairs(l) * l.fused_state_split; }

inline int64_t fused_align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// FusedMmaCb's C·Bᵀ table, in bytes (0 for the other kernels).
inline int64_t fused_cb_bytes(const SsdChunkScanLaunch& l) {
  if (l.cuda_forward != SsdCudaForward::FusedMmaCb) return 0;
  return l.batch * l.nchunks() * l.groups * ssd_fused_cb_tiles(l.chunk_size) * 256 * 4;
}

inline int64_t fused_ring_bytes(const SsdChunkScanLaunch& l) {
  return fused_chains(l) * 2 * kSsdFusedHeadTile * (l.fused_state_tile / l.fused_state_split) * 4;
}

// With two halves: the second half's H_c per (pair, chunk) (with fused_split_share, each
// half's), 16-bit, and a flag each.
inline int64_t fused_half_states(const SsdChunkScanLaunch& l) {
  return l.fused_state_split > 1 ? fused_pairs(l) * l.nchunks() * (l.fused_split_share ? 2 : 1) : 0;
}

// The workspace: the ticket, the chains' counters and the half states' flags (zeroed on
// the stream before each launch), the ring (a multiple of 256 bytes), the C·Bᵀ table,
// then the half states.
inline int64_t fused_flags_bytes(const SsdChunkScanLaunch& l) {
  return fused_align256((fused_chains(l) + 1 + fused_half_states(l)) * 4);
}
inline size_t fused_workspace_bytes(const SsdChunkScanLaunch& l) {
  return static_cast<size_t>(fused_flags_bytes(l) + fused_ring_bytes(l) + fused_cb_bytes(l) +
                             fused_half_states(l) * kSsdFusedHeadTile * (l.fused_state_tile / 2) * 2);
}

// The plan's launch description must be one these kernels were written for.
inline void fused_check_launch(const SsdChunkScanLaunch& l, SsdCudaForward kernel) {
  if (l.cuda_forward != kernel || (l.element != ElementKind::F16 && l.element != ElementKind::BF16) ||
      l.compute != ElementKind::F32 || l.chunk_size < 1 || l.chunk_size > kSsdFusedMaxChunk ||
      l.head_dim % kSsdFusedHeadTile != 0 || l.state_dim < 1 || l.state_dim > l.fused_state_tile ||
      (l.fused_state_tile != 64 && l.fused_state_tile != 128 &&
       (l.fused_state_tile != 256 || kernel != SsdCudaForward::FusedMmaCb)) ||
      l.fused_state_split != (l.fused_state_tile > 128 ? 2 : 1) || (l.fused_split_share && l.fused_state_split != 2) ||
      (l.fused_pdl && kernel != SsdCudaForward::FusedMmaCb) ||
      (l.seq_idx != nullptr && kernel == SsdCudaForward::FusedWgmma) ||
      l.seqlen >= (int64_t{1} << 31) - kSsdFusedMaxChunk ||
      fused_chains(l) * l.nchunks() >= (int64_t{1} << 31))
    fail(PlanErrorKind::Internal, "ssd_chunk_scan",
         "the fused forward got a launch description it was not planned for");
}

inline bool fused_rows_vec(const void* p, const int64_t (&s)[4]) {
  return s[3] == 1 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The kernel parameters from the launch description, with the workspace split as
// fused_workspace_bytes says; the ticket, the counters and the flags are zeroed on the
// stream.
inline FusedParams fused_params(const SsdChunkScanLaunch& l, cudaStream_t stream) {
  FusedParams p{};
  p.batch = static_cast<int>(l.batch);
  p.seqlen = static_cast<int>(l.seqlen);
  p.heads = static_cast<int>(l.heads);
  p.head_dim = static_cast<int>(l.head_dim);
  p.state_dim = static_cast<int>(l.state_dim);
  p.chunk = static_cast<int>(l.chunk_size);
  p.nchunks = static_cast<int>(l.nchunks());
  p.psplit = static_cast<int>(l.head_dim / kFusedP);
  p.hpg = static_cast<int>(l.heads / l.groups);
  p.tiles_div = FastDivmod(static_cast<uint32_t>(p.batch * p.heads * p.psplit));
  p.bh_div = FastDivmod(static_cast<uint32_t>(p.heads * p.psplit));
  p.psplit_div = FastDivmod(static_cast<uint32_t>(p.psplit));
  p.hpg_div = FastDivmod(static_cast<uint32_t>(p.hpg));
  p.split_cols = static_cast<int>(l.fused_state_tile / l.fused_state_split);
  p.x = l.x;
  p.dt = l.dt;
  p.A = static_cast<const float*>(l.A);
  p.As = l.A_stride;
  p.B = l.B;
  p.C = l.C;
  for (int d = 0; d < 4; ++d) {
    p.xs[d] = l.x_stride[d];
    p.Bs[d] = l.B_stride[d];
    p.Cs[d] = l.C_stride[d];
    p.zs[d] = l.z_stride[d];
    p.is[d] = l.init_stride[d];
  }
  for (int d = 0; d < 3; ++d) p.dts[d] = l.dt_stride[d];
  p.dt_f32 = l.dt_element == ElementKind::F32;
  p.x_vec = fused_rows_vec(l.x, l.x_stride);
  p.bc_vec = l.state_dim % 8 == 0 && fused_rows_vec(l.B, l.B_stride) && fused_rows_vec(l.C, l.C_stride);
  p.D = static_cast<const float*>(l.D);
  p.Ds0 = l.D_stride[0];
  p.Ds1 = l.D_per_dim ? l.D_stride[1] : 0;
  p.z = l.z;
  p.z_pair = l.z != nullptr && l.z_stride[3] == 1 && l.z_stride[0] % 2 == 0 && l.z_stride[1] % 2 == 0 &&
             l.z_stride[2] % 2 == 0 && reinterpret_cast<uintptr_t>(l.z) % 4 == 0;
  p.z_stage = l.z != nullptr && fused_rows_vec(l.z, l.z_stride);
  p.y_stage = reinterpret_cast<uintptr_t>(l.y) % 16 == 0 && reinterpret_cast<uintptr_t>(l.y_pre_out) % 16 == 0;
  p.dt_bias = static_cast<const float*>(l.dt_bias);
  p.dbs = l.dt_bias_stride;
  p.softplus = l.dt_softplus;
  p.dt_min = static_cast<float>(l.dt_min);
  p.dt_max = static_cast<float>(l.dt_max);
  p.init = static_cast<const float*>(l.initial_states);
  p.y = l.y;
  p.y_pre = l.y_pre_out;
  p.final_states = static_cast<float*>(l.final_states);
  p.states = l.keep_states ? l.states : nullptr;
  p.seq = l.seq_idx;
  p.seq_s[0] = l.seq_idx_stride[0];
  p.seq_s[1] = l.seq_idx_stride[1];
  p.seq_i64 = l.seq_idx_int64;
  p.factored = l.factored_decays;
  const int64_t chains = fused_chains(l);
  auto* ws = static_cast<unsigned char*>(l.workspace);
  p.ticket = reinterpret_cast<int*>(ws);
  p.half_ready = p.ticket + 1 + chains;
  p.ring = reinterpret_cast<float*>(ws + fused_flags_bytes(l));
  if (l.cuda_forward == SsdCudaForward::FusedMmaCb) {
    p.cb = reinterpret_cast<float*>(ws + fused_flags_bytes(l) + fused_ring_bytes(l));
    p.cb_tiles = static_cast<int>(ssd_fused_cb_tiles(l.chunk_size));
  }
  if (l.fused_state_split > 1)
    p.half_states = ws + fused_flags_bytes(l) + fused_ring_bytes(l) + fused_cb_bytes(l);
  if (cudaMemsetAsync(ws, 0, (chains + 1 + fused_half_states(l)) * 4, stream) != cudaSuccess)
    check_launch("ssd_chunk_scan");
  return p;
}

// Raises the kernel's dynamic shared memory limit (per device: done before every launch).
template <typename K>
void fused_allow_smem(K kernel, int64_t bytes) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, "ssd_chunk_scan",
         std::string("cannot raise the fused forward's shared memory: ") + cudaGetErrorString(err));
}

}  // namespace baracuda::kernels::cuda
