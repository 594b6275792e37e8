// Mamba-2 SSD chunk scan, the tensor-core path for float16 and bfloat16 inputs (sm_80+).
//
// The algorithm, the formulas, the workspace and the finalize kernels are those of
// ssd_chunk_scan.cuh (read its header comment first); this file replaces the four
// matrix-shaped kernels (chunk state, scan products, crossing sums X_s) for 16-bit
// inputs. What changes:
//  - Every tile product runs on mma.sync.m16n8k16 with operands in the input's 16-bit
//    type and float32 accumulation. The inputs x, B, C, dy enter exactly; an
//    intermediate is rounded to the input type only where it becomes an operand, as
//    mamba_ssm does: P = (Lft·Rgtᵀ)∘dec, the decay-weighted x (or dy) of the chunk
//    states, and the float32 states H_c / Gn_c of the inter-chunk products (rounded once,
//    by the state pass, into states_t / gstates_t, which the products copy with
//    cp.async straight into their operand tiles). Row scales
//    rs_r are applied to the float32 accumulators, not to an operand. X_s (the stable da)
//    uses T = (C·Bᵀ)∘(dy·xᵀ)∘dec formed in float32 from two exact-operand products, so
//    da loses nothing to the 16-bit operands beyond what U, V and W carry.
//  - C·Bᵀ (Y) and B·Cᵀ (DX) belong to the group, not to the head: a Y/DX block takes up
//    to 16 heads of one group, computes each 64 × 64 tile of that product once and keeps
//    up to 4 column tiles of it (chunks up to 256) in shared memory for its heads
//    (further tiles are recomputed per head). The X_s kernel computes one C·Bᵀ tile per
//    tile pair for all of its heads.
//  - A block is 4 warps; warp w owns rows 16w..16w+15 of a 64-row tile and keeps its
//    16 × 64 accumulators in registers. P goes from the accumulator layout straight into
//    A fragments, and diagonal tiles skip the 16-column steps without causal pairs.
//  - Loads overlap the products: the scan kernel copies the next column tile with
//    cp.async into a second buffer, the chunk-state kernel the next 64 positions.
// Determinism: the MMA sequence of every output depends on the shapes alone (the head
// split of Y/DX/X_s only picks the block that computes a head; cached and recomputed
// C·Bᵀ tiles are the same bits), DC/DB keep the workspace's fixed head split, and the
// fused-or-not choice of the states depends on the shapes and the multiprocessor count:
// results are bitwise reproducible on a given GPU model.
// Non-finite values: P·V multiplies the masked (zero) P entries of a diagonal tile with
// the V rows of the other positions of that 64-position tile, so a NaN or Inf in x, dy,
// B or C can also reach earlier (or, for dx and dB, later) positions of its chunk; the
// float32 path's causal-only diagonal products do not do that.
#pragma once

#include "kernels/cuda/ssd_chunk_scan.cuh"
#include "kernels/cuda/ssd_chunk_scan_mma.cuh"
#include "kernels/cuda/ssd_wgmma.cuh"

#include <algorithm>
#include <type_traits>

namespace baracuda::kernels::cuda {

constexpr int kTcThreads = 128;           // 4 warps × 16 rows of a 64-row tile
constexpr int kTcLd = kSsdTile + 8;       // row stride of a 64-column 16-bit tile
constexpr int kSsdTileBytes = kSsdTile * kSsdTile * 2;  // a [64][64] 16-bit tile, unpadded (sw128_fill)
constexpr int kTcMaxHeads = 16;           // heads per Y / DX / X_s block
constexpr int kTcCacheTiles = 4;          // Lft·Rgtᵀ column tiles kept per Y / DX block
constexpr int kTcCacheSlot = 4 * 32 * 32;  // floats per cached tile: 4 warps × 32 lanes × 32

template <typename T>
constexpr bool ssd_is_half = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// K rounded up to the MMA's k-step; a 16-bit row of K16 + 8 elements is an odd multiple
// of 16 bytes, so the 8 rows an ldmatrix reads fall in 8 different bank groups.
inline __host__ __device__ int ssd_k16(int k) { return (k + 15) / 16 * 16; }

template <typename T>
__device__ __forceinline__ T ssd_zero() {
  return from_acc<T>(0.0f);
}

// ---- decays in base 2 ----------------------------------------------------------------------
// The tile kernels weigh each (q, s) pair of a 64 × 64 tile with exp(Acs_q − Acs_s). They
// take it as 2^(a_q − a_s) with a = (Acs − Acs_ref)·log2(e) in float32 for a reference
// position ref of the tile pair (one conversion per position instead of per pair) and
// one ex2.approx per pair. With ref between s and q (or inside the diagonal tile), |a_q|
// and |a_s| are at most the tile's total decay (in base 2), so the exponent's error is a
// few float32 ulps of that: far below the 16-bit rounding of every use.
constexpr double kSsdLog2e = 1.4426950408889634;
__device__ __forceinline__ float ssd_log2_rel(double acs, double ref) {
  return static_cast<float>((acs - ref) * kSsdLog2e);
}
// With seq_idx (`seg`), a position's value for the kernels that keep packed sequences
// apart: relative to `ref` where the position is in ref's sequence (seg == seg_ref), else
// to its own sequence's start. There the cumsum restarts at each start and lowers the sum
// by kSsdSeqOffset per start, so acs + kSsdSeqOffset·seg is the sum from that start (to
// ~1e-12), a value of the sequence alone: two positions of one sequence share a reference,
// and none takes another sequence's (a reference after an Inf dt would be -Inf).
__device__ __forceinline__ float ssd_log2_seq(double acs, int seg, double ref, int seg_ref) {
  return seg == seg_ref ? ssd_log2_rel(acs, ref) : ssd_log2_rel(acs + kSsdSeqOffset * seg, 0.0);
}
// Factored weights (SsdChunkScanLaunch::factored_decays, set by the plan where dt_min >= 0):
// the processed dt is then >= 0 (or NaN) and A has one sign a head, so each head's cumsum
// is monotone in the position. For a pair (t, s) and a reference e with s <= e < t, the
// weight 2^(a_t − a_s) is then 2^(a_t − a_e)·2^(a_e − a_s), both factors on the same side
// of 1: where one overflows or flushes to 0 the direct weight does too (never inf·0). A
// tile of pairs wholly after e (the mma.sync fused forwards' 16-position steps before a
// row's own, e the step's last position; the group dCB and dx kernels' off-diagonal tile
// pairs, e the reference they already take) then needs one exp2 a row and one a column,
// not one a pair: by count, one a pair gave the MUFU unit (16 results a clock a
// multiprocessor) about twice the clocks the tile's mma.sync products take. A pair's
// value may differ in its last bits from the direct weight's (the factors are rounded);
// each kernel takes one form or the other by the tile's place alone, so results stay
// bitwise reproducible. With dt of both signs (dt_min < 0) a factor could overflow where
// the weight does not, and the kernels keep one exp2 a pair.
// 2^v (ex2.approx.ftz: about 2 ulp; results below 2^-126 flush to 0)
__device__ __forceinline__ float ssd_exp2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// ---- shared-memory tile fills (all kTcThreads threads) -------------------------------------
// Whether 8-element groups of rows of src (row stride s1, inner stride s3) can move as
// 16-byte vectors: unit inner stride and 16-byte aligned rows.
template <typename T>
__device__ __forceinline__ bool tc_vec_ok(const T* src, int64_t s1, int64_t s3) {
  return s3 == 1 && s1 % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
}

// Elements k..k+7 of row r of src as 16 raw bytes, 0 where r >= rows or k + i >= K; one
// 16-byte load when `vec` and the group lies inside K.
template <typename T>
__device__ __forceinline__ uint4 tc_load8(const T* src, int64_t s1, int64_t s3, bool vec, int r, int k, int rows,
                                          int K) {
  if (vec && r < rows && k + 8 <= K) return __ldg(reinterpret_cast<const uint4*>(src + r * s1 + k));
  T v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = r < rows && k + i < K ? src[r * s1 + (k + i) * s3] : ssd_zero<T>();
  uint4 raw;
  memcpy(&raw, v, 16);
  return raw;
}

// Group g (elements 8g..8g+7) of row r of a [nrows][kcols] tile, for r < nrows, g <
// kcols / 8, = src[r·s1 + k·s3] (k = 8g..8g+7), 0 where r >= rows or k >= K, stored as 16
// bytes at at(r, g) (a 16-byte aligned shared-memory address: the tile's layout). kcols is a
// multiple of 8. ASYNC: the vector groups go by cp.async (complete after
// ssd_cp_async_commit + ssd_cp_async_wait), the others by plain stores. Consecutive threads
// take a row's consecutive groups: a warp reads whole rows of src.
template <typename T, bool ASYNC = false, typename At>
__device__ __forceinline__ void tc_fill_to(At at, int nrows, int kcols, const T* src, int64_t s1, int64_t s3,
                                           int rows, int K) {
  const int groups = kcols / 8;
  const bool vec = tc_vec_ok(src, s1, s3);
  // Group e = r·groups + g of thread t: e = t, t + kTcThreads, ...; a step adds dr rows
  // and dg groups (with a carry), so no group needs a division.
  const int dr = kTcThreads / groups, dg = kTcThreads - dr * groups;
  int r = static_cast<int>(threadIdx.x) / groups, g = static_cast<int>(threadIdx.x) - r * groups;
  if constexpr (ASYNC) {
    if (vec && rows >= nrows && K >= kcols) {  // every group one 16-byte copy: no checks per group
      if (dg == 0) {  // (kcols / 8 divides kTcThreads) the thread's groups share a column
        const T* s = src + r * s1 + g * 8;
        for (; r < nrows; r += dr, s += dr * s1) ssd_cp_async16(at(r, g), s);
      } else {
        while (r < nrows) {
          ssd_cp_async16(at(r, g), src + r * s1 + g * 8);
          r += dr, g += dg;
          if (g >= groups) g -= groups, ++r;
        }
      }
      return;
    }
  }
  while (r < nrows) {
    const int k = g * 8;
    bool done = false;
    if constexpr (ASYNC) {
      if (vec && r < rows && k + 8 <= K) {
        ssd_cp_async16(at(r, g), src + r * s1 + k);
        done = true;
      }
    }
    if (!done) *reinterpret_cast<uint4*>(at(r, g)) = tc_load8(src, s1, s3, vec, r, k, rows, K);
    r += dr, g += dg;
    if (g >= groups) g -= groups, ++r;
  }
}

// dst[r·ld + k] = src[r·s1 + k·s3] for r < nrows, k < kcols, and 0 where r >= rows or
// k >= K (tc_fill_to with a row-major tile of row stride ld; ld a multiple of 8).
template <typename T, bool ASYNC = false>
__device__ __forceinline__ void tc_fill(T* dst, int ld, int nrows, int kcols, const T* src, int64_t s1,
                                        int64_t s3, int rows, int K) {
  tc_fill_to<T, ASYNC>([=](int r, int g) { return dst + r * ld + g * 8; }, nrows, kcols, src, s1, s3, rows, K);
}

// dst = a [nrows][kcols] 16-bit tile (tc_fill_to) in wgmma's 128-byte swizzle
// (gmma_sw128_off), in panels of 64 columns (nrows·128 bytes each; a last partial panel's
// chunks past kcols are never read); dst 128-byte aligned (1024 for wgmma's descriptors),
// nrows a multiple of 8. A warp reads four whole 128-byte rows and each 8-thread phase
// stores one row's 8 chunks to 8 different bank groups (the core-matrix layout allowed
// only half rows without bank conflicts, which doubled the group dC kernel's L2 requests).
// Rows padded to an odd multiple of 16 bytes instead (tc_fill's layouts for ldmatrix) cost
// cp.async 1.5 × the rows' bytes in L2 sectors read: 7.9 M sectors for 5.2 M of rows in a
// micro-benchmark of the chunk-state fills, 5.2 M swizzled (ncu, H200). When kcols / 8
// divides kTcThreads into passes of a multiple of 8 rows and the tile is whole (16-byte
// groups, rows and K complete), a thread's group and row % 8 stay fixed, so its
// destination moves by whole rows.
template <typename T>
__device__ __forceinline__ void sw128_fill(unsigned char* dst, int nrows, int kcols, const T* src, int64_t s1,
                                           int64_t s3, int rows, int K) {
  const int groups = kcols / 8, dr = kTcThreads / groups;
  if (tc_vec_ok(src, s1, s3) && rows >= nrows && K >= kcols && dr * groups == kTcThreads && dr % 8 == 0) {
    const int r0 = static_cast<int>(threadIdx.x) / groups, g = static_cast<int>(threadIdx.x) - r0 * groups;
    unsigned char* d = dst + gmma_sw128_elem(nrows, r0, 8 * g);
    const T* s = src + r0 * s1 + 8 * g;
    for (int r = r0; r < nrows; r += dr, d += dr * 128, s += dr * s1) ssd_cp_async16(d, s);
    return;
  }
  tc_fill_to<T, true>([=](int r, int g) { return dst + gmma_sw128_elem(nrows, r, 8 * g); }, nrows, kcols, src, s1,
                      s3, rows, K);
}

// ---- warp-level tile products -------------------------------------------------------------
// The warp's A fragments of k-step kk (tc_warp_gemm's A layouts).
template <bool A_KM, typename T>
__device__ __forceinline__ void tc_load_a(uint32_t (&a)[4], const T* sA, int lda, int kk) {
  const int lane = threadIdx.x % 32;
  if constexpr (A_KM)
    ssd_ldsm_x4_t(a, sA + (kk * 16 + (lane / 16) * 8 + lane % 8) * lda + ((lane / 8) % 2) * 8);
  else
    ssd_ldsm_x4(a, sA + (lane % 16) * lda + kk * 16 + (lane / 16) * 8);
}

// acc[nt] (the 16 × 8 tiles nt = 2·np, 2·np + 1 for np_lo <= np < np_hi) += A · B over
// `ksteps` k-steps of 16. A is the warp's 16 rows, stored [m][k] at sA (row stride lda),
// or [k][m] when A_KM (sA then points at the warp's first column). B has 64 columns,
// stored [n][k] (row stride ldb), or [k][n] when B_KN.
template <typename T, bool A_KM, bool B_KN>
__device__ __forceinline__ void tc_warp_gemm(float (&acc)[8][4], const T* sA, int lda, const T* sB, int ldb,
                                             int ksteps, int np_lo, int np_hi) {
  const int lane = threadIdx.x % 32;
  for (int kk = 0; kk < ksteps; ++kk) {
    uint32_t a[4];
    tc_load_a<A_KM>(a, sA, lda, kk);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (np < np_lo || np >= np_hi) continue;
      uint32_t b[4];
      if constexpr (B_KN)
        ssd_ldsm_x4_t(b, sB + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ldb + np * 16 + (lane / 16) * 8);
      else
        ssd_ldsm_x4(b, sB + (np * 16 + (lane / 16) * 8 + lane % 8) * ldb + kk * 16 + ((lane / 8) % 2) * 8);
      ssd_mma16816<T>(acc[2 * np], a, b[0], b[1]);
      ssd_mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// tc_warp_gemm<T, false, false> over KS k-steps known at compile time (np_lo 0): each
// lane's ldmatrix rows are addressed once a call and the k-steps add immediate offsets.
// With the k-steps a runtime count, the group dCB kernel's product of a head (K = 64)
// took 241 instructions a warp for its 32 mma.sync: the addresses formed again at every
// step, the loop unrolled by four with a remainder and the accumulators zeroed on three
// paths (ncu, H200, the 2.7B shape). An np_hi known where it is called (4: every column
// pair) also drops the predicates and their WARPSYNCs.
template <typename T, int KS>
__device__ __forceinline__ void tc_warp_gemm_ks(float (&acc)[8][4], const T* sA, int lda, const T* sB, int ldb,
                                                int np_hi) {
  const int lane = threadIdx.x % 32;
  const T* a_row = sA + (lane % 16) * lda + (lane / 16) * 8;
  const T* b_row = sB + ((lane / 16) * 8 + lane % 8) * ldb + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t a[4];
    ssd_ldsm_x4(a, a_row + kk * 16);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (np >= np_hi) continue;
      uint32_t b[4];
      ssd_ldsm_x4(b, b_row + np * 16 * ldb + kk * 16);
      ssd_mma16816<T>(acc[2 * np], a, b[0], b[1]);
      ssd_mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc += P · V with P the warp's 16 × 64 A fragments (k-steps kk_lo <= kk < kk_hi) and V
// a 64 × 64 tile stored [k][n] in shared memory (row stride kTcLd).
template <typename T>
__device__ __forceinline__ void tc_warp_pv(float (&acc)[8][4], const uint32_t (&pa)[4][4], const T* sV, int kk_lo,
                                           int kk_hi) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk < kk_lo || kk >= kk_hi) continue;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ssd_ldsm_x4_t(b, sV + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kTcLd + np * 16 + (lane / 16) * 8);
      ssd_mma16816<T>(acc[2 * np], pa[kk], b[0], b[1]);
      ssd_mma16816<T>(acc[2 * np + 1], pa[kk], b[2], b[3]);
    }
  }
}

// One 16-position k-step of acc += A·V for packed sequences (ssd_seq_masks): a, the warp's A
// fragments of the step; vrow, this lane's ldmatrix row address of V's step ([k][n] tiles,
// + 16 elements a 16-column pair np); k0, the step's first position in the tile, ncols the
// tile's positions inside the chunk; rs, the starts counts of the warp's rows (tc_row_seg);
// cseg, those of the tile's positions. A's entries across a start are 0, but 0·V is
// NaN for a NaN V, so a step whose positions and the warp's rows are not all one sequence
// multiplies V once per sequence of both: V's fragments of the other positions selected to
// 0, into an accumulator of its own that only that sequence's rows add. (Warp-uniform:
// every lane reads the same counts.)
struct TcRowSeg {
  int lo, hi;  // the counts of the warp's first and last row inside the chunk
  int a, b;    // those of the lane's rows g8, g8 + 8 (-1 outside)
};
__device__ __forceinline__ TcRowSeg tc_row_seg(const int* rseg, int nrows) {
  const int g8 = (threadIdx.x % 32) / 4;
  return {rseg[0], rseg[nrows - 1], g8 < nrows ? rseg[g8] : -1, g8 + 8 < nrows ? rseg[g8 + 8] : -1};
}

template <typename T>
__device__ __forceinline__ void tc_step_seg(float (&acc)[8][4], const uint32_t (&a)[4], const T* vrow, int k0,
                                            int ncols, const TcRowSeg& rs, const int* cseg) {
  const int lane = threadIdx.x % 32, t4 = lane % 4;
  if (k0 >= ncols) return;  // (past the chunk: A = 0, V = 0)
  const int c_lo = cseg[k0], c_hi = cseg[min(k0 + 15, ncols - 1)];
  if (c_lo == rs.hi && c_hi == rs.lo) {  // (then all four are equal) one sequence
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ssd_ldsm_x4_t(b, vrow + np * 16);
      ssd_mma16816<T>(acc[2 * np], a, b[0], b[1]);
      ssd_mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
    return;
  }
  for (int q = max(c_lo, rs.lo); q <= min(c_hi, rs.hi); ++q) {
    // sequence q's positions of the step, [lo, hi) (the counts grow with the position)
    const unsigned m = __ballot_sync(0xffffffffu, lane < 16 && k0 + lane < ncols && cseg[k0 + lane] == q) & 0xffffu;
    const int lo = k0 + __ffs(m) - 1, hi = lo + __popc(m);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ssd_ldsm_x4_t(b, vrow + np * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = keep2(b[i], k0 + 2 * t4 + (i & 1) * 8, lo, hi);
      float u0[4] = {}, u1[4] = {};
      ssd_mma16816<T>(u0, a, b[0], b[1]);
      ssd_mma16816<T>(u1, a, b[2], b[3]);
      if (rs.a == q) acc[2 * np][0] += u0[0], acc[2 * np][1] += u0[1], acc[2 * np + 1][0] += u1[0], acc[2 * np + 1][1] += u1[1];
      if (rs.b == q) acc[2 * np][2] += u0[2], acc[2 * np][3] += u0[3], acc[2 * np + 1][2] += u1[2], acc[2 * np + 1][3] += u1[3];
    }
  }
}

// tc_warp_pv for packed sequences (tc_step_seg): rseg, the starts counts of the warp's 16
// rows (nrows of them inside the chunk), cseg, those of the tile's 64 positions (ncols
// inside).
template <typename T>
__device__ __forceinline__ void tc_warp_pv_seg(float (&acc)[8][4], const uint32_t (&pa)[4][4], const T* sV,
                                               int kk_lo, int kk_hi, const int* rseg, int nrows, const int* cseg,
                                               int ncols) {
  const int lane = threadIdx.x % 32;
  const TcRowSeg rs = tc_row_seg(rseg, nrows);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk < kk_lo || kk >= kk_hi) continue;
    tc_step_seg<T>(acc, pa[kk], sV + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kTcLd + (lane / 16) * 8, kk * 16,
                   ncols, rs, cseg);
  }
}

// tc_warp_gemm<T, A_KM, true> for packed sequences (tc_step_seg; all four 16-column pairs):
// rseg / nrows and cseg / ncols as in tc_warp_pv_seg, the k positions those of B's rows.
template <typename T, bool A_KM>
__device__ __forceinline__ void tc_warp_gemm_seg(float (&acc)[8][4], const T* sA, int lda, const T* sB, int ldb,
                                                 int ksteps, const int* rseg, int nrows, const int* cseg,
                                                 int ncols) {
  const int lane = threadIdx.x % 32;
  const TcRowSeg rs = tc_row_seg(rseg, nrows);
  for (int kk = 0; kk < ksteps; ++kk) {
    uint32_t a[4];
    tc_load_a<A_KM>(a, sA, lda, kk);
    tc_step_seg<T>(acc, a, sB + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ldb + (lane / 16) * 8, kk * 16, ncols,
                   rs, cseg);
  }
}

// The 16 × 64 accumulator layout read as the A fragments of the next product: k-step kk
// covers columns 16kk..16kk+15, i.e. accumulator tiles 2kk and 2kk + 1.
template <typename T>
__device__ __forceinline__ void tc_to_a_frags(const float (&v)[8][4], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = ssd_pack2<T>(v[2 * kk][0], v[2 * kk][1]);
    pa[kk][1] = ssd_pack2<T>(v[2 * kk][2], v[2 * kk][3]);
    pa[kk][2] = ssd_pack2<T>(v[2 * kk + 1][0], v[2 * kk + 1][1]);
    pa[kk][3] = ssd_pack2<T>(v[2 * kk + 1][2], v[2 * kk + 1][3]);
  }
}

__device__ __forceinline__ void tc_zero(float (&v)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) v[nt][i] = 0.0f;
}

// v summed over the 4 lanes that hold one accumulator row (a fixed xor tree; every one of
// them gets the sum).
__device__ __forceinline__ float ssd_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// part[rg·tiles + jt] = Σ_j dot(rg, j)·v(rg, j) over the warp's 16 rows rg = r0 + rw + ..
// (rows >= len skipped) and this 64-column tile: each lane sums its 16 columns of a row
// in a fixed order, then the 4 lanes of the row in a fixed xor tree; 0 (selected) for
// row g8 + 8·half where bit `half` of `zero` is set. Warp-uniform call.
template <typename T>
__device__ __forceinline__ void tc_row_dot(const T* dot, int64_t s_t, int64_t s_j, int r0, int len, int rw, int j0,
                                           int J, const float (&v)[8][4], float* part, int tiles, int jt,
                                           unsigned zero = 0) {
  const int lane = threadIdx.x % 32, g8 = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rg = r0 + rw + g8 + 8 * half;
    float s = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jg = j0 + nt * 8 + 2 * t4 + e;
        if (rg < len && jg < J) s += to_acc(dot[static_cast<int64_t>(rg) * s_t + jg * s_j]) * v[nt][2 * half + e];
      }
    s = ssd_quad_sum(s);
    if ((zero >> half) & 1u) s = 0.0f;
    if (t4 == 0 && rg < len) part[static_cast<int64_t>(rg) * tiles + jt] = s;
  }
}

// One row of an output from the warp's accumulators (row g8 + 8·half of the warp's 16),
// times `scale`: columns j0 + (the lane's columns) below J. `pairs`: two adjacent
// columns as one store (the caller knows that orow + j0 is 2-element aligned and J even).
template <typename O>
__device__ __forceinline__ void tc_store_row(O* orow, int j0, int J, bool pairs, const float (&v)[8][4], int half,
                                             float scale) {
  const int t4 = (threadIdx.x % 32) % 4;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int jg = j0 + nt * 8 + 2 * t4;
    const float v0 = v[nt][2 * half] * scale, v1 = v[nt][2 * half + 1] * scale;
    if constexpr (std::is_same_v<O, float>) {
      if (pairs) {
        if (jg < J) *reinterpret_cast<float2*>(orow + jg) = make_float2(v0, v1);
      } else {
        if (jg < J) orow[jg] = v0;
        if (jg + 1 < J) orow[jg + 1] = v1;
      }
    } else {
      if (pairs) {
        if (jg < J) *reinterpret_cast<uint32_t*>(orow + jg) = ssd_pack2<O>(v0, v1);
      } else {
        if (jg < J) orow[jg] = from_acc<O>(v0);
        if (jg + 1 < J) orow[jg + 1] = from_acc<O>(v1);
      }
    }
  }
}

// ---- 2'. chunk state (and the backward's local dstate) ------------------------------------
// The product of tc_warp_gemm<T, true, true> into NT accumulator tiles (B columns 64·j..,
// for the j with 64·j < nv) with the A operand's k-th column scaled by w[k] in registers
// (each A fragment value times the weight of its k, rounded back to T) before its MMAs.
// A (the warp's 16 columns of a [k][64] tile) and B ([k][64·NT], NT panels) are 64-row
// tiles in the 128-byte swizzle (sw128_fill), read by byte offsets fixed per lane: an
// ldmatrix's 8 rows start at a multiple of 8, so row % 8 = lane % 8 and the chunk flip
// is the lane's; a k-step adds 16 rows (2048 bytes), B's 16-column step np flips chunk
// bit 1 (np << 5), a panel adds 64 rows · 128 bytes. (Through gmma_sw128_elem per
// ldmatrix the kernel ran 35 % more instructions than with padded rows: ncu, H200.)
// The warp's A fragment of one k-step (ldmatrix, transposed) at a_at, its k-th column
// scaled by w[k] (w: the k-step's 16 weights) and rounded back to T: a[0], a[1] hold
// columns 2·t4, 2·t4 + 1, a[2], a[3] columns 2·t4 + 8, 2·t4 + 9.
template <typename T>
__device__ __forceinline__ void tc_load_a_scaled(uint32_t (&a)[4], const unsigned char* a_at, const float* w) {
  const int t4 = threadIdx.x % 4;
  ssd_ldsm_x4_t(a, a_at);
  const float2 wl = *reinterpret_cast<const float2*>(w + 2 * t4);
  const float2 wh = *reinterpret_cast<const float2*>(w + 2 * t4 + 8);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    T v[2];
    memcpy(v, &a[i], 4);
    const float2 ww = i < 2 ? wl : wh;
    a[i] = ssd_pack2<T>(ww.x * to_acc(v[0]), ww.y * to_acc(v[1]));
  }
}

template <typename T, int NT>
__device__ __forceinline__ void tc_warp_gemm_wk(float (&acc)[NT][8][4], const unsigned char* sA, int a_chunk,
                                                const unsigned char* sB, int ksteps, const float* w, int nv) {
  const int lane = threadIdx.x % 32, l8 = lane % 8;
  // A: rows 8·(lane / 16) + l8 of the k-step, chunk a_chunk + (lane / 8) % 2;
  // B: rows 8·((lane / 8) % 2) + l8, chunk 2·np + lane / 16
  const unsigned char* a_row = sA + ((lane / 16) * 8 + l8) * 128 + (((a_chunk + (lane / 8) % 2) ^ l8) << 4);
  const unsigned char* b_row = sB + (((lane / 8) % 2) * 8 + l8) * 128;
  const int b_chunk = ((lane / 16) ^ l8) << 4;
  for (int kk = 0; kk < ksteps; ++kk, a_row += 16 * 128, b_row += 16 * 128) {
    uint32_t a[4];
    tc_load_a_scaled<T>(a, a_row, w + kk * 16);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j * kSsdTile >= nv) continue;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ssd_ldsm_x4_t(b, b_row + j * kSsdTileBytes + (b_chunk ^ (np << 5)));
        ssd_mma16816<T>(acc[j][2 * np], a, b[0], b[1]);
        ssd_mma16816<T>(acc[j][2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// tc_warp_gemm_wk's product on wgmma (sm_90a; WG): the warp's A fragments as there
// (ldmatrix of its 16 columns, scaled by w and rounded to T) into af, then one product a
// k-step, the warpgroup's four warps together, with B from
// shared memory (N-major, the same swizzled panels): m64n128 (NT = 2) or m64n64 (NT = 1),
// all four k-steps of the 64-position step (past the step's rows both operands are zeros
// and their weights 0; with NT = 2, Y's columns past N too). Issued and committed, not
// waited for: the caller waits (wgmma_wait) before it reads acc, writes af or overwrites
// sA or sB.
template <typename T, int NT>
__device__ __forceinline__ void tc_wgmma_wk(float (&acc)[NT * 32], uint32_t (&af)[4][4], const unsigned char* sA,
                                            int a_chunk, const unsigned char* sB, const float* w) {
  const int lane = threadIdx.x % 32, l8 = lane % 8;
  const unsigned char* a_row = sA + ((lane / 16) * 8 + l8) * 128 + (((a_chunk + (lane / 8) % 2) ^ l8) << 4);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) tc_load_a_scaled<T>(af[kk], a_row + kk * 16 * 128, w + kk * 16);
  wgmma_fence();
  if constexpr (NT == 2) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_rs_n128<T, 1>(reinterpret_cast<float(&)[64]>(acc), af[kk], gmma_sw128_mnmajor(sB, kSsdTile, kk * 16));
  } else {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_rs_n64<T, 1>(reinterpret_cast<float(&)[32]>(acc), af[kk], gmma_sw128_mnmajor(sB, kSsdTile, kk * 16));
  }
  wgmma_commit();
}

// Keeps af (the A operand of products in flight) in its registers until this point.
__device__ __forceinline__ void wgmma_keep(uint32_t (&af)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(af[kk][i])::"memory");
}

// ssd_chunk_state_kernel's product on tensor cores: out[d, n] = Σ_s (w_s·X_s[d])·Y_s[n]
// for a 64 × (64·NT) (d, n) tile, K = the chunk's positions in steps of 64; w_s·X_s is
// rounded to T. X is stored [s][d] (A read transposed), Y [s][n] (B read transposed), in
// the 128-byte swizzle (sw128_fill).
// A two-step cp.async ring of (X, Y) steps: step k + 1 is copied while step k
// multiplies; threads 0..63 write the step's weights w_s, one barrier per step, and each
// warp scales its A fragments in registers (tc_warp_gemm_wk: w_s·X_s rounded to T, the
// same bits as scaling the tile in shared memory, which an earlier version did with a
// read-modify-write pass and a decay per 16 bytes). NT = 2 (the plan's
// SsdChunkScanLaunch::state_tile_n = 128) reads each X tile once for 128 state columns.
// Measured at the Mamba-2 2.7B shape (H200, bf16, N = 128; states recomputed in the
// backward / chunk dstate): NT = 2 with 2 steps 226 / 194 µs; NT = 1: 321 / 234; 3 steps
// (2 blocks per multiprocessor instead of 4): 370 / 296 with NT = 2, 323 / 259 with
// NT = 1 (the same build and run). Four 32-position steps in the same shared memory
// (three in flight): 176 / 170 against 150 / 145 µs with two of 64 (2026-12-03, H200):
// twice the barriers; the kernel was L2-bound (80 % under ncu). Its X and Y rows padded to
// 72 and 136 elements had the fills read 763 MB from L2 for 503 MB of operands; swizzled,
// 493 MB, 64 % of L2 throughput, 139 / 136 µs (ncu: 64 M instructions against 59 M).
constexpr int kSsdCsStages = 2;
template <int NT>
__host__ __device__ constexpr int ssd_cs_smem() {  // the ring of swizzled tiles and room to align it
  return kSsdCsStages * (1 + NT) * kSsdTileBytes + 1024;
}

// SEG (p.seg given: packed sequences): only the positions of one sequence enter, the
// chunk's last (forward: from its last start) or first (backward: before its first start).
// The steps without any are skipped; in the step holding the boundary the other positions'
// weights and rows of both operands are 0 (selected: a NaN or Inf there stays out). A
// separate instantiation: in the others it cost 2 (NT = 2) and 16 (NT = 1) registers.
// WG (SsdChunkScanLaunch::state_wgmma: sm_90a, NT = 2, SEG or not): the step's products on
// wgmma (tc_wgmma_wk), every warp of the block's warpgroup taking part (a warp past D
// multiplies the zeros its columns were filled with), the same bits as mma.sync. Step k's
// products are waited for only before step k + 1's barrier (after which step k's buffers
// are refilled), so they run while step k + 1's copies land. H100, the 2.7B shape: 131-135
// µs a launch against 144-150 (the plan's state_wgmma); with 7 sequences a row (SEG) the
// backward's dstates 122.7 against 136.3 µs, its S_c level (142.2 against 140.9).
template <typename T, bool DSTATE, int NT, bool SEG = false, bool WG = false>
__global__ void __launch_bounds__(kTcThreads) ssd_tc_chunk_state_kernel(const SsdStateParams<T> p) {
  constexpr int STAGES = kSsdCsStages;
  constexpr int kStage = (1 + NT) * kSsdTileBytes;  // X [64][64], Y [64][64·NT]
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  unsigned char* ring = gmma_align1024(ssd_dyn_smem);
  __shared__ __align__(16) float sW[STAGES][kSsdTile];  // the step's w_s
  __shared__ int sCut;  // seg: the chunk's last (forward) or first (backward) sequence start
  auto sX = [&](int k) { return ring + (k % STAGES) * kStage; };
  auto sY = [&](int k) { return ring + (k % STAGES) * kStage + kSsdTileBytes; };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4;
  const int n_blocks = (p.n_tiles + NT - 1) / NT;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const bool narrow = ssd_narrow(p.total_blocks);
    int64_t rest = vb;
    const int nb = static_cast<int>(ssd_peel(rest, n_blocks, narrow));
    const int dtl = static_cast<int>(ssd_peel(rest, p.d_tiles, narrow));
    const int64_t c = ssd_peel(rest, p.nchunks, narrow);
    const int64_t h = ssd_peel(rest, p.heads, narrow), b = rest;
    const int64_t g = h / p.hpg, bh = b * p.heads + h;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int d0 = dtl * kSsdTile, n0 = nb * NT * kSsdTile;
    const int dv = static_cast<int>(min(static_cast<int64_t>(kSsdTile), p.D - d0));
    const int nv = static_cast<int>(min(static_cast<int64_t>(NT * kSsdTile), p.N - n0));
    const double* acs = p.acs + bh * p.seqlen + t0;
    const float* dtf = p.dtf + bh * p.seqlen + t0;
    const double acs_last = acs[len - 1];
    const T* X = p.xo.p + b * p.xo.s[0] + t0 * p.xo.s[1] + h * p.xo.s[2] + d0 * p.xo.s[3];
    const T* Y = p.yo.p + b * p.yo.s[0] + t0 * p.yo.s[1] + g * p.yo.s[2] + n0 * p.yo.s[3];
    const bool live = 16 * warp < dv;
    __syncthreads();  // the previous virtual block is done with the ring (and sCut)
    // The positions that enter, [lo, hi): the whole chunk, or with a start in it (seg, a
    // count that grows with the position) those of its last (forward) or first (backward)
    // sequence.
    int lo = 0, hi = len;
    if (SEG && p.seg[b * p.seqlen + t0 + len - 1] != 0) {  // (block-uniform)
      const int32_t* seg = p.seg + b * p.seqlen + t0;
      if (threadIdx.x == 0) sCut = DSTATE ? len : 0;
      __syncthreads();
      int cut = DSTATE ? len : 0;
      for (int s = threadIdx.x; s < len; s += kTcThreads)  // (a start at the chunk's first position counts)
        if (seg[s] != (s > 0 ? seg[s - 1] : 0)) cut = DSTATE ? min(cut, s) : max(cut, s);
      if (DSTATE)
        atomicMin(&sCut, cut);
      else
        atomicMax(&sCut, cut);
      __syncthreads();
      (DSTATE ? hi : lo) = sCut;
    }
    const int k_begin = lo / kSsdTile, steps = (hi + kSsdTile - 1) / kSsdTile;
    auto issue = [&](int k) {  // step k's copies (none past hi); always a commit group
      if (k < steps) {
        const int s0 = k * kSsdTile, rows = min(kSsdTile, hi - s0);
        sw128_fill<T>(sX(k), kSsdTile, kSsdTile, X + s0 * p.xo.s[1], p.xo.s[1], p.xo.s[3], rows, dv);
        sw128_fill<T>(sY(k), kSsdTile, NT * kSsdTile, Y + s0 * p.yo.s[1], p.yo.s[1], p.yo.s[3], rows, nv);
      }
      ssd_cp_async_commit();
    };
    // Threads 0..63 load step k's Acs_s and dt_s one step ahead, into registers (the index
    // clamped into the chunk, so the load is unconditional and nothing waits for it before
    // the step that uses it).
    double a_s = 0.0;
    float dt_s = 0.0f;
    // (forward: a position before lo weighs 0, its Acs and dt not read: they may not be finite)
    auto load_w = [&](int k) {
      if (threadIdx.x < kSsdTile && k < steps) {
        const int s = min(k * kSsdTile + static_cast<int>(threadIdx.x), hi - 1);
        const bool in = !SEG || DSTATE || s >= lo;
        a_s = in ? acs[s] : acs_last;
        if constexpr (!DSTATE) dt_s = in ? dtf[s] : 0.0f;
      }
    };
    float acc[NT][8][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) tc_zero(acc[j]);
    float(&accf)[NT * 32] = reinterpret_cast<float(&)[NT * 32]>(acc);
    uint32_t af[4][4];
#pragma unroll
    for (int k = 0; k < STAGES - 1; ++k) issue(k_begin + k);
    load_w(k_begin);
    if (SEG && lo % kSsdTile != 0) {  // (block-uniform) the first step's rows before lo, both operands, to 0
      ssd_cp_async_wait<0>();
      __syncthreads();  // its copies have landed
      const int skip = lo % kSsdTile;
      for (int e = threadIdx.x; e < skip * (1 + NT) * 16; e += kTcThreads) {
        const int r = e / ((1 + NT) * 16), q = e % ((1 + NT) * 16);  // q: 8 bytes of the row's X, then Y's panels
        unsigned char* at = q < 16 ? sX(k_begin) + r * 128 + q * 8
                                   : sY(k_begin) + ((q - 16) / 16) * kSsdTileBytes + r * 128 + (q % 16) * 8;
        *reinterpret_cast<uint2*>(at) = make_uint2(0u, 0u);
      }
    }
    for (int k = k_begin; k < steps; ++k) {
      ssd_cp_async_wait<STAGES - 2>();  // step k's copies (this thread's) have landed
      if constexpr (WG) fence_proxy_async();
      const int s0 = k * kSsdTile, rows = min(kSsdTile, hi - s0);
      float* w = sW[k % STAGES];
      if (threadIdx.x < kSsdTile) {  // (0 past hi: those X rows are zeros, w may not be finite)
        const int r = threadIdx.x;
        w[r] = r >= rows ? 0.0f : DSTATE ? ssd_decay<float>(a_s) : ssd_decay<float>(acs_last - a_s) * dt_s;
      }
      if constexpr (WG) {  // step k − 1's products are done with its buffers and af
        wgmma_wait<0>();
        wgmma_keep(af);
        wgmma_fence_regs(accf);
      }
      __syncthreads();  // step k, its weights (and zeroed rows) are visible; step k − 1's buffers are free
      issue(k + STAGES - 1);
      load_w(k + 1);
      if constexpr (WG)
        tc_wgmma_wk<T, NT>(accf, af, sX(k), 2 * warp, sY(k), w);
      else if (live)
        tc_warp_gemm_wk<T, NT>(acc, sX(k), 2 * warp, sY(k), (rows + 15) / 16, w, nv);
    }
    if constexpr (WG) {
      wgmma_wait<0>();
      wgmma_keep(af);
      wgmma_fence_regs(accf);
    }
    ssd_cp_async_wait<0>();  // (only empty groups are left)
    if (!live) continue;
    float* out = p.out + (bh * p.nchunks + c) * p.D * p.N + n0;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j * kSsdTile >= nv) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dl = 16 * warp + g8 + 8 * half;
        if (dl < dv)
          tc_store_row(out + static_cast<int64_t>(d0 + dl) * p.N + j * kSsdTile, 0, nv - j * kSsdTile,
                       p.N % 2 == 0, acc[j], half, 1.0f);
      }
    }
  }
}

// ---- 4'. the chunk scan products -----------------------------------------------------------
// ssd_scan_kernel's four modes on tensor cores (see the table in ssd_chunk_scan.cuh):
//   out(r, j) = Σ_heads [ rs_r·Σ_k Lft(r,k)·S(k,j) + Σ_{c causal} P(r,c)·V(c,j) ],
//   P(r, c) = (Σ_k Lft(r,k)·Rgt(c,k))·dec(r,c)  (masked to 0, rounded to T).
// A virtual block is (b, g, head split, c, row tile, column tile). Y and DX loop over
// their split's heads and write each head's rows; DC and DB sum their split's heads.
//
// Shared memory (dynamic; offsets in bytes from the host):
//   L       [64][ld_l]   Lft rows of the tile (C, B: once per block; dy, x: per head)
//   V0, R0  [64][72], [64][ld_l]   column-tile buffer 0: V rows, Rgt rows (R only when
//                        some column tile is not cached)
//   X       the state tile S ([64][ld_l] for Y/DX, [K1P][72] for DC/DB) during a head's
//           inter-chunk product, then column-tile buffer 1 (V1 at X, R1 after it); also
//           the Rgt staging while the Y/DX cache is built
//   cache   cache_tiles × 4 warps × 32 lanes × 32 floats of Lft·Rgtᵀ (Y/DX)
// Column tile k + 1 is copied (cp.async) into buffer (k + 1) % 2 while tile k is
// multiplied; the first one comes with the head's prologue.
template <typename T>
struct SsdTcScanParams {
  int64_t batch, seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int64_t nsplit, hps;  // head splits per group, heads per split
  int K1, K1P, J, r_tiles, j_tiles, cache_tiles;
  int ld_l, ld_s;       // row strides of the Lft / Rgt tiles and of the state tile
  int off_v0, off_r0, off_x, off_r1, off_cache;  // byte offsets in dynamic shared memory
  SsdOperand<T> lft, rgt, val, dot;
  const T* state;       // [B, H, nc, D, N]: H_c (Y, DC) or Gn_c (DX, DB) rounded to T (states_t, gstates_t)
  int64_t state_ld;     // N
  const double* acs;
  const float* dtf;
  T* out;
  float* out_split;  // DC/DB with nsplit > 1: [nsplit, B, L, G, J]
  float* part;       // DX: x·dxpre, DC: U ([B, H, L, j_tiles])
  float* part2;      // DX: x·dxpre (inter-chunk part)
  SsdEpilogue<T> epi;  // Y, DX (see ssd_epilogue)
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
};

// (At most 168 registers, 3 blocks per multiprocessor: DC's U row dots would take it to
// 208 and 2 blocks.)
// EPI (Y, DX with an option of p.epi): a separate instantiation, so that the plain
// kernel keeps its registers.
// SEG (p.seg given: packed sequences; Y and DX take it with EPI, whose epilogue also
// serves no option) keeps every sequence to itself: the inter-chunk term (and its row dot)
// is selected to 0 in the rows that the state does not reach (Y, DC: after the chunk's
// first start; DX, DB: before its last), P to 0 across a start, and P·V runs per sequence
// where a step mixes them (tc_warp_pv_seg). A separate instantiation too: as a runtime
// branch it cost the plain kernels 20–44 bytes of spills (ptxas, sm_90a); the SEG kernels
// spill themselves (bytes stored / loaded: Y 16 / 24, DC 24 / 40, DX with EPI 76 / 108
// against EPI's own 60 / 88).
template <typename T, int MODE, bool EPI = false, bool SEG = false>
__global__ void __launch_bounds__(kTcThreads, 3) ssd_tc_scan_kernel(const SsdTcScanParams<T> p) {
  constexpr bool kRev = MODE == kSsdDX || MODE == kSsdDB;    // causal partners c >= r
  constexpr bool kMulti = MODE == kSsdDC || MODE == kSsdDB;  // per group, sum over heads
  constexpr bool kGroupLR = !kMulti;  // Lft, Rgt are C and B: the same for every head
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  T* sL = reinterpret_cast<T*>(ssd_dyn_smem);
  T* sX = reinterpret_cast<T*>(ssd_dyn_smem + p.off_x);
  auto sV = [&](int k) { return reinterpret_cast<T*>(ssd_dyn_smem + (k % 2 ? p.off_x : p.off_v0)); };
  auto sR = [&](int k) { return reinterpret_cast<T*>(ssd_dyn_smem + (k % 2 ? p.off_r1 : p.off_r0)); };
  float* sCache = reinterpret_cast<float*>(ssd_dyn_smem + p.off_cache);
  // decays in base 2 relative to the row tile's first (Y, DC) or last (DX, DB) row
  __shared__ float sRowL[kSsdTile], sColL[kSsdTile];
  __shared__ float sRowDt[kSsdTile], sRowScale[kSsdTile], sColDt[kSsdTile];
  __shared__ int sRowSeg[kSsdTile], sColSeg[kSsdTile];  // seg: the starts counts (rows past the chunk: -1)
  __shared__ bool sRowCut[kSsdTile];  // seg: the state does not reach the row
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;  // the warp's first row in the tile
  const int ksteps = p.K1P / 16;
  const int64_t n_gs = p.groups * p.nsplit;

  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int64_t rest = vb;
    const int jt = static_cast<int>(rest % p.j_tiles);
    rest /= p.j_tiles;
    int rt = static_cast<int>(rest % p.r_tiles);
    rest /= p.r_tiles;
    if (!kRev) rt = p.r_tiles - 1 - rt;  // Y, DC: the row tiles with the most work first
    const int64_t c = rest % p.nchunks;
    rest /= p.nchunks;
    const int64_t gs = rest % n_gs, b = rest / n_gs;
    const int64_t g = gs / p.nsplit, split = gs % p.nsplit;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = rt * kSsdTile, j0 = jt * kSsdTile;
    if (r0 >= len) continue;  // a row tile past the end of the last (short) chunk
    const int rows = min(kSsdTile, len - r0);
    const int n_ct = (len + kSsdTile - 1) / kSsdTile;
    const int ct_begin = kRev ? rt : 0, n_steps = kRev ? n_ct - rt : rt + 1;
    const int64_t h_begin = g * p.hpg + split * p.hps;
    const int nh = static_cast<int>(min(p.hps, (g + 1) * p.hpg - h_begin));
    const bool live = rw < rows;  // the warp has rows inside the chunk (warp-uniform)
    auto base = [&](const SsdOperand<T>& o, int64_t h) {
      return o.p + b * o.s[0] + t0 * o.s[1] + (o.per_head ? h : g) * o.s[2];
    };
    // Column pairs (= k-steps of P·V) of column tile ct that hold causal pairs of the
    // warp's rows: all of them off the diagonal.
    auto np_lo = [&](int ct) { return ct == rt && kRev ? warp : 0; };
    auto np_hi = [&](int ct) { return ct == rt && !kRev ? warp + 1 : 4; };
    // Y/DX: the first cache_tiles column tiles of Lft·Rgtᵀ are computed once per block.
    const int n_cached = kGroupLR ? min(n_steps, p.cache_tiles) : 0;
    // Copies column step k of head h into buffer k % 2: V rows, and Rgt rows unless cached.
    auto issue_step = [&](int k, int64_t h) {
      const int c0 = (ct_begin + k) * kSsdTile, cols = min(kSsdTile, len - c0);
      tc_fill<T, true>(sV(k), kTcLd, kSsdTile, kSsdTile, base(p.val, h) + c0 * p.val.s[1] + j0 * p.val.s[3],
                       p.val.s[1], p.val.s[3], cols, p.J - j0);
      if (k >= n_cached)
        tc_fill<T, true>(sR(k), p.ld_l, kSsdTile, p.K1P, base(p.rgt, h) + c0 * p.rgt.s[1], p.rgt.s[1],
                         p.rgt.s[3], cols, p.K1);
    };

    __syncthreads();  // the previous virtual block is done with shared memory
    if constexpr (kGroupLR)
      tc_fill<T>(sL, p.ld_l, kSsdTile, p.K1P, base(p.lft, 0) + r0 * p.lft.s[1], p.lft.s[1], p.lft.s[3], rows, p.K1);
    for (int k = 0; k < n_cached; ++k) {  // each warp keeps its own 16 rows, lane-major
      const int ct = ct_begin + k, c0 = ct * kSsdTile;
      __syncthreads();  // X is free; L is visible
      tc_fill<T>(sX, p.ld_l, kSsdTile, p.K1P, base(p.rgt, 0) + c0 * p.rgt.s[1], p.rgt.s[1], p.rgt.s[3],
                 min(kSsdTile, len - c0), p.K1);
      __syncthreads();
      if (live) {
        float cb[8][4];
        tc_zero(cb);
        tc_warp_gemm<T, false, false>(cb, sL + rw * p.ld_l, p.ld_l, sX, p.ld_l, ksteps, np_lo(ct), np_hi(ct));
        float* slot = sCache + (k * 4 + warp) * 1024 + lane;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) slot[(nt * 4 + i) * 32] = cb[nt][i];
      }
    }

    float acc[8][4];       // the output tile: this head's (Y, DX) or the split's sum (DC, DB)
    float acc_head[8][4];  // DC, DB: this head's inter-chunk term before it joins acc
    // Y, DX accumulate the inter-chunk term straight into acc (one head per output).
    float(&accI)[8][4] = ssd_pick<kMulti>(acc_head, acc);
    tc_zero(acc);
    for (int hi = 0; hi < nh; ++hi) {
      const int64_t h = h_begin + hi, bh = b * p.heads + h;
      const double* acs = p.acs + bh * p.seqlen + t0;
      const float* dtf = p.dtf + bh * p.seqlen + t0;
      const double acs_last = acs[len - 1];
      const double acs_ref = acs[kRev ? r0 + rows - 1 : r0];
      const int seg_ref = SEG ? p.seg[b * p.seqlen + t0 + (kRev ? r0 + rows - 1 : r0)] : 0;
      __syncthreads();  // the previous head (or the cache) is done with all buffers and the row data
      if (threadIdx.x < kSsdTile) {
        const int r = r0 + threadIdx.x;
        const bool ok = r < len;
        const double ar = ok ? acs[r] : 0.0;
        const float dr = ok ? dtf[r] : 0.0f;
        sRowL[threadIdx.x] = ssd_log2_rel(ar, acs_ref);
        sRowDt[threadIdx.x] = dr;
        float scale = kRev ? ssd_decay<float>(acs_last - ar) : ssd_decay<float>(ar);
        if (MODE == kSsdDB) scale *= dr;
        sRowScale[threadIdx.x] = ok ? scale : 0.0f;
        if constexpr (SEG) {  // (the state reaches the chunk's first (Y, DC) or last (DX, DB) sequence)
          const int32_t* seg = p.seg + b * p.seqlen + t0;
          const int rs = ok ? seg[r] : -1;
          sRowSeg[threadIdx.x] = rs;
          sRowCut[threadIdx.x] = rs != (kRev ? seg[len - 1] : 0);
          if (ok) sRowL[threadIdx.x] = ssd_log2_seq(ar, rs, acs_ref, seg_ref);
        }
      }
      if constexpr (!kGroupLR)
        tc_fill<T, true>(sL, p.ld_l, kSsdTile, p.K1P, base(p.lft, h) + r0 * p.lft.s[1], p.lft.s[1], p.lft.s[3], rows,
                         p.K1);
      issue_step(0, h);
      ssd_cp_async_commit();
      // S tile into X (as the state pass rounded it to T): Y/DX S(k = n, j = d) =
      // state[d·N + n], stored [j][k]; DC/DB S(k = d, j = n) = state[d·N + n], stored [k][j].
      const T* st = p.state + (bh * p.nchunks + c) * static_cast<int64_t>(p.K1) * p.J;
      if constexpr (kGroupLR)
        tc_fill<T, true>(sX, p.ld_s, kSsdTile, p.K1P, st + static_cast<int64_t>(j0) * p.state_ld, p.state_ld, 1,
                         p.J - j0, p.K1);
      else
        tc_fill<T, true>(sX, p.ld_s, p.K1P, kSsdTile, st + j0, p.state_ld, 1, p.K1, p.J - j0);
      ssd_cp_async_commit();
      ssd_cp_async_wait<0>();
      __syncthreads();

      // (a) inter-chunk term of this head: rs_r · Σ_k Lft(r,k)·S(k,j), the row scale
      //     applied to the float32 accumulators.
      tc_zero(accI);
      if (live) {
        tc_warp_gemm<T, false, !kGroupLR>(accI, sL + rw * p.ld_l, p.ld_l, sX, p.ld_s, ksteps, 0, 4);
        const float sa = sRowScale[rw + g8], sb = sRowScale[rw + g8 + 8];
        // (SEG: the rows the state does not reach, selected)
        const bool cut_a = SEG && sRowCut[rw + g8], cut_b = SEG && sRowCut[rw + g8 + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          accI[nt][0] = cut_a ? 0.0f : accI[nt][0] * sa, accI[nt][1] = cut_a ? 0.0f : accI[nt][1] * sa;
          accI[nt][2] = cut_b ? 0.0f : accI[nt][2] * sb, accI[nt][3] = cut_b ? 0.0f : accI[nt][3] * sb;
        }
        // Row dots of the inter-chunk part: DX x·dxpre_inter (→ V), DC C·dC_inter (→ U).
        if constexpr (MODE == kSsdDX || MODE == kSsdDC) {
          float* part = (MODE == kSsdDX ? p.part2 : p.part) + (bh * p.seqlen + t0) * p.j_tiles;
          tc_row_dot<T>(base(p.dot, h), p.dot.s[1], p.dot.s[3], r0, len, rw, j0, p.J, accI, part, p.j_tiles, jt,
                        (cut_a ? 1u : 0u) | (cut_b ? 2u : 0u));
        }
      }
      if constexpr (kMulti) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] += accI[nt][i];
      }

      // (b) intra-chunk term over the causal column tiles, step k in buffer k % 2.
      for (int k = 0; k < n_steps; ++k) {
        const int ct = ct_begin + k, c0 = ct * kSsdTile;
        __syncthreads();  // step k − 1 (or the inter-chunk product) is done with buffer (k + 1) % 2 and the column data
        if (k + 1 < n_steps) issue_step(k + 1, h);
        ssd_cp_async_commit();
        if (threadIdx.x < kSsdTile) {
          const int cc = c0 + threadIdx.x;
          sColL[threadIdx.x] = cc < len ? ssd_log2_rel(acs[cc], acs_ref) : 0.0f;
          sColDt[threadIdx.x] = cc < len ? dtf[cc] : 0.0f;
          if constexpr (SEG) {
            const int cs = cc < len ? p.seg[b * p.seqlen + t0 + cc] : 0;
            sColSeg[threadIdx.x] = cs;
            if (cc < len) sColL[threadIdx.x] = ssd_log2_seq(acs[cc], cs, acs_ref, seg_ref);
          }
        }
        ssd_cp_async_wait<1>();  // step k's copies (the group before the newest) are done
        __syncthreads();
        if (!live) continue;
        const int lo = np_lo(ct), hi_ = np_hi(ct);
        // SEG: whether the warp's rows and the column tile are all one sequence (warp-uniform;
        // the counts grow with the position): then nothing below needs the counts
        const int w_rows = min(16, rows - rw), t_cols = min(kSsdTile, len - c0);
        const bool one = !SEG || (sRowSeg[rw] == sRowSeg[rw + w_rows - 1] && sColSeg[0] == sColSeg[t_cols - 1] &&
                                  sRowSeg[rw] == sColSeg[0]);
        float cb[8][4];
        if (k < n_cached) {
          const float* slot_p = sCache + (k * 4 + warp) * 1024 + lane;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) cb[nt][i] = slot_p[(nt * 4 + i) * 32];
        } else {
          tc_zero(cb);
          tc_warp_gemm<T, false, false>(cb, sL + rw * p.ld_l, p.ld_l, sR(k), p.ld_l, ksteps, lo, hi_);
        }
        // P = cb · dec, masked (selected, not multiplied, to 0), in place.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int rl = rw + g8 + 8 * half, rg = r0 + rl;
          const float ra = sRowL[rl];
          const float rd = sRowDt[rl];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int cl = nt * 8 + 2 * t4 + e, cg = c0 + cl;
              const bool causal = kRev ? cg >= rg : cg <= rg;
              float v = 0.0f;
              if (causal && rg < len && cg < len && (one || sRowSeg[rl] == sColSeg[cl])) {
                if (kRev) {
                  v = cb[nt][2 * half + e] * ssd_exp2(sColL[cl] - ra);
                  if (MODE == kSsdDB) v *= rd;
                } else {
                  v = cb[nt][2 * half + e] * (ssd_exp2(ra - sColL[cl]) * sColDt[cl]);
                }
              }
              cb[nt][2 * half + e] = v;
            }
        }
        uint32_t pa[4][4];
        tc_to_a_frags<T>(cb, pa);
        if (SEG && !one)
          tc_warp_pv_seg<T>(acc, pa, sV(k), lo, hi_, sRowSeg + rw, w_rows, sColSeg, t_cols);
        else
          tc_warp_pv<T>(acc, pa, sV(k), lo, hi_);
      }
      ssd_cp_async_wait<0>();  // (only empty groups can be left; keep every thread idle)

      if constexpr (!kMulti) {
        if (live) {
          // DX: ddt(direct) partial x·dxpre over this column tile; dx = dt·dxpre.
          if constexpr (MODE == kSsdDX)
            tc_row_dot<T>(base(p.dot, h), p.dot.s[1], p.dot.s[3], r0, len, rw, j0, p.J, acc,
                          p.part + (bh * p.seqlen + t0) * p.j_tiles, p.j_tiles, jt);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int rl = rw + g8 + 8 * half, rg = r0 + rl;
            if (rg >= len) continue;
            const int64_t row = ((b * p.seqlen + t0 + rg) * p.heads + h) * p.J;
            const float scale = MODE == kSsdDX ? sRowDt[rl] : 1.0f;
            if constexpr (EPI) {  // D, y_pre, z: element by element
#pragma unroll
              for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int jg = j0 + nt * 8 + 2 * t4 + e;
                  if (jg < p.J)
                    p.out[row + jg] = from_acc<T>(
                        ssd_epilogue<T>(p.epi, acc[nt][2 * half + e] * scale, p.val, b, t0 + rg, h, jg, row + jg));
                }
            } else {
              tc_store_row<T>(p.out + row, j0, p.J, p.J % 2 == 0, acc, half, scale);
            }
          }
        }
      }
    }

    if constexpr (kMulti) {
      if (live) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int rg = r0 + rw + g8 + 8 * half;
          if (rg >= len) continue;
          const int64_t row = ((b * p.seqlen + t0 + rg) * p.groups + g) * p.J;
          if (p.nsplit > 1)
            tc_store_row<float>(p.out_split + split * p.batch * p.seqlen * p.groups * p.J + row, j0, p.J,
                                p.J % 2 == 0, acc, half, 1.0f);
          else
            tc_store_row<T>(p.out + row, j0, p.J, p.J % 2 == 0, acc, half, 1.0f);
        }
      }
    }
  }
}

// ---- 5'. the crossing sums X_s -------------------------------------------------------------
// ssd_dacs_kernel on tensor cores, a block per (b, c, g, head split): for each
// lower-triangular tile pair (rows q in tile ti, columns s' in tile tj <= ti) it computes
// the C·Bᵀ tile once, then for each head the dy·xᵀ tile and
//   T_qs' = (C_q·B_s')·(dy_q·x_s')·exp(Acs_q − Acs_s')·dt_s'   (s' < q, else 0)
// in float32, and adds the tile's crossing sums to that head's xs exactly as
// ssd_dacs_kernel does (same fixed order per head; see there). With `seg` (packed
// sequences) T is selected to 0 for a pair across a start.
template <typename T>
struct SsdTcDacsParams {
  int64_t seqlen, heads, groups, hpg, chunk, nchunks, total_blocks, nsplit, hps;
  int D, N, KP, ld;
  int off_b, off_t, off_rowtot;  // byte offsets in dynamic shared memory (sA at 0)
  SsdOperand<T> x, dy, B, C;
  const double* acs;
  const float* dtf;
  float* xs;  // [B, H, L]
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
};

template <typename T>
__global__ void __launch_bounds__(kTcThreads) ssd_tc_dacs_kernel(const SsdTcDacsParams<T> p) {
  constexpr int TLD = kSsdTile + 1;
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  T* sA = reinterpret_cast<T*>(ssd_dyn_smem);
  T* sB = reinterpret_cast<T*>(ssd_dyn_smem + p.off_b);
  float* sT = reinterpret_cast<float*>(ssd_dyn_smem + p.off_t);
  float* sRowTotAll = reinterpret_cast<float*>(ssd_dyn_smem + p.off_rowtot);  // [hps][64]
  __shared__ float sRowL[kSsdTile], sColL[kSsdTile];  // base-2 decays relative to the column tile's last position
  __shared__ float sColDt[kSsdTile], sColSum[kSsdTile];
  __shared__ int sRowSeg[kSsdTile], sColSeg[kSsdTile];  // seg: the starts counts
  __shared__ float sFull;
  const int tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  const int64_t n_gs = p.groups * p.nsplit;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const int64_t c = vb % p.nchunks, rest = vb / p.nchunks;
    const int64_t gs = rest % n_gs, b = rest / n_gs;
    const int64_t g = gs / p.nsplit, split = gs % p.nsplit;
    const int64_t h_begin = g * p.hpg + split * p.hps;
    const int nh = static_cast<int>(min(p.hps, (g + 1) * p.hpg - h_begin));
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const T* bp = p.B.p + b * p.B.s[0] + t0 * p.B.s[1] + g * p.B.s[2];
    const T* cp = p.C.p + b * p.C.s[0] + t0 * p.C.s[1] + g * p.C.s[2];
    const int32_t* seg = p.seg != nullptr ? p.seg + b * p.seqlen + t0 : nullptr;
    __syncthreads();  // the previous virtual block is done with shared memory
    for (int hi = 0; hi < nh; ++hi) {
      float* xs = p.xs + (b * p.heads + h_begin + hi) * p.seqlen + t0;
      for (int s = tid; s < len; s += kTcThreads) xs[s] = 0;
    }
    const int n_t = (len + kSsdTile - 1) / kSsdTile;
    for (int ti = 0; ti < n_t; ++ti) {
      const int r0 = ti * kSsdTile, rows = min(kSsdTile, len - r0);
      const bool live = rw < rows;
      __syncthreads();  // the previous row tile's readers of sRowTot are done
      for (int i = tid; i < nh * kSsdTile; i += kTcThreads) sRowTotAll[i] = 0;
      for (int tj = 0; tj <= ti; ++tj) {
        const int c0 = tj * kSsdTile, cols = min(kSsdTile, len - c0);
        // Column pairs with pairs s' < q for the warp's rows (strictly causal).
        const int hi_np = tj == ti ? warp + 1 : 4;
        __syncthreads();  // the previous tile is done with sA, sB
        tc_fill<T>(sA, p.ld, kSsdTile, ssd_k16(p.N), cp + r0 * p.C.s[1], p.C.s[1], p.C.s[3], rows, p.N);
        tc_fill<T>(sB, p.ld, kSsdTile, ssd_k16(p.N), bp + c0 * p.B.s[1], p.B.s[1], p.B.s[3], cols, p.N);
        __syncthreads();
        float cb[8][4];
        tc_zero(cb);
        if (live) tc_warp_gemm<T, false, false>(cb, sA + rw * p.ld, p.ld, sB, p.ld, ssd_k16(p.N) / 16, 0, hi_np);
        for (int hi = 0; hi < nh; ++hi) {
          const int64_t h = h_begin + hi, bh = b * p.heads + h;
          const double* acs = p.acs + bh * p.seqlen + t0;
          const float* dtf = p.dtf + bh * p.seqlen + t0;
          float* xs = p.xs + bh * p.seqlen + t0;
          float* sRowTot = sRowTotAll + hi * kSsdTile;
          const T* xp = p.x.p + b * p.x.s[0] + t0 * p.x.s[1] + h * p.x.s[2];
          const T* dyp = p.dy.p + b * p.dy.s[0] + t0 * p.dy.s[1] + h * p.dy.s[2];
          __syncthreads();  // sA, sB, sT and the row/column data are free
          if (tid < kSsdTile) {
            const double ref = acs[c0 + cols - 1];
            const int rs = seg != nullptr && r0 + tid < len ? seg[r0 + tid] : 0;
            const int cs = seg != nullptr && c0 + tid < len ? seg[c0 + tid] : 0;
            const int seg_ref = seg != nullptr ? seg[c0 + cols - 1] : 0;
            sRowL[tid] = r0 + tid < len ? ssd_log2_seq(acs[r0 + tid], rs, ref, seg_ref) : 0.0f;
            sColL[tid] = c0 + tid < len ? ssd_log2_seq(acs[c0 + tid], cs, ref, seg_ref) : 0.0f;
            sColDt[tid] = c0 + tid < len ? dtf[c0 + tid] : 0.0f;
            sRowSeg[tid] = rs;
            sColSeg[tid] = cs;
          }
          tc_fill<T>(sA, p.ld, kSsdTile, ssd_k16(p.D), dyp + r0 * p.dy.s[1], p.dy.s[1], p.dy.s[3], rows, p.D);
          tc_fill<T>(sB, p.ld, kSsdTile, ssd_k16(p.D), xp + c0 * p.x.s[1], p.x.s[1], p.x.s[3], cols, p.D);
          __syncthreads();
          float m[8][4];
          tc_zero(m);
          if (live) tc_warp_gemm<T, false, false>(m, sA + rw * p.ld, p.ld, sB, p.ld, ssd_k16(p.D) / 16, 0, hi_np);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int ql = rw + g8 + 8 * half, q = r0 + ql;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int sl = nt * 8 + 2 * t4 + e, sc = c0 + sl;
                float v = 0.0f;
                if (q < len && sc < q && sRowSeg[ql] == sColSeg[sl])
                  v = cb[nt][2 * half + e] * m[nt][2 * half + e] *
                      (ssd_exp2(sRowL[ql] - sColL[sl]) * sColDt[sl]);
                sT[ql * TLD + sl] = v;
              }
          }
          __syncthreads();
          ssd_dacs_add_tile<float, kTcThreads>(sT, sRowTot, sColSum, sFull, xs, tj == ti, r0, c0, len);
        }
      }
    }
  }
}

// ---- host side -------------------------------------------------------------------------------
// The device comes from the plan (SsdChunkScanLaunch: tensor_cores, sm_count,
// smem_optin_bytes).

// Heads per block for the kernels that share C·Bᵀ over a group's heads: at most
// kTcMaxHeads, halved while the grid would have fewer than 4 blocks per multiprocessor;
// then spread evenly over the splits (every split non-empty: (nsplit − 1)·hps < hpg).
inline void ssd_tc_head_split(int64_t hpg, int64_t other_blocks, int sms, int64_t& nsplit, int64_t& hps) {
  int64_t h = hpg < kTcMaxHeads ? hpg : kTcMaxHeads;
  while (h > 1 && other_blocks * ((hpg + h - 1) / h) < 4 * static_cast<int64_t>(sms)) h = (h + 1) / 2;
  nsplit = (hpg + h - 1) / h;
  hps = (hpg + nsplit - 1) / nsplit;
}

inline int ssd_align16(int bytes) { return (bytes + 15) / 16 * 16; }

template <typename T, bool DSTATE, int NT>
void ssd_launch_tc_chunk_state_nt(SsdStateParams<T> p, bool wgmma, cudaStream_t stream) {
  p.total_blocks = p.batch * p.heads * p.nchunks * p.d_tiles * ((p.n_tiles + NT - 1) / NT);
  if (p.total_blocks == 0) return;
  constexpr int smem = ssd_cs_smem<NT>();
  const char* op = DSTATE ? "ssd_chunk_scan_backward(chunk_dstate)" : "ssd_chunk_scan(chunk_state)";
  auto run = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem, op);
    kernel<<<ssd_grid(p.total_blocks), kTcThreads, smem, stream>>>(p);
  };
  auto pick = [&](auto seg) {
    constexpr bool SEG = decltype(seg)::value;
    if constexpr (NT == 2) {  // (the plan takes wgmma only with 128 state columns)
      if (wgmma) return run(ssd_tc_chunk_state_kernel<T, DSTATE, NT, SEG, true>);
    }
    run(ssd_tc_chunk_state_kernel<T, DSTATE, NT, SEG>);
  };
  if (p.seg != nullptr)
    pick(std::true_type{});
  else
    pick(std::false_type{});
  check_launch(op);
}

template <typename T, bool DSTATE>
void ssd_launch_tc_chunk_state(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdStateParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks(), p.D = l.head_dim, p.N = l.state_dim;
  p.d_tiles = static_cast<int>(w.d_tiles), p.n_tiles = static_cast<int>(w.n_tiles);
  p.xo = ssd_operand<T>(DSTATE ? l.dy : l.x, DSTATE ? l.dy_stride : l.x_stride, true);
  p.yo = ssd_operand<T>(DSTATE ? l.C : l.B, DSTATE ? l.C_stride : l.B_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.out = ssd_ws<float>(l, DSTATE ? w.gstates : w.states);
  // The plan's state tile and product (SsdChunkScanLaunch::state_tile_n, checked with the
  // launch, and state_wgmma).
  if (l.state_wgmma && l.state_tile_n != 2 * kSsdTile)
    fail(PlanErrorKind::Internal, DSTATE ? "ssd_chunk_scan_backward(chunk_dstate)" : "ssd_chunk_scan(chunk_state)",
         "the chunk-state kernel's wgmma products need a state tile of 128 columns");
  if (l.state_tile_n == 2 * kSsdTile)
    ssd_launch_tc_chunk_state_nt<T, DSTATE, 2>(p, l.state_wgmma, stream);
  else
    ssd_launch_tc_chunk_state_nt<T, DSTATE, 1>(p, false, stream);
}

// The plan takes the tensor cores only where this kernel's shared memory without its cache
// fits the device (core/ssd_chunk_scan_plan.h's ssd_tc_scan_smem_bytes, which this layout
// must equal): on tensor cores H_c is kept only as its 16-bit copy, which the SIMT kernel
// could not read, so there is no falling back to it here.
template <typename T, int MODE>
void ssd_launch_tc_scan(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  constexpr bool kMulti = MODE == kSsdDC || MODE == kSsdDB;
  const char* op = MODE == kSsdY ? "ssd_chunk_scan(scan)" : "ssd_chunk_scan_backward(scan)";
  SsdTcScanParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups;
  p.hpg = l.heads / l.groups, p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.K1 = static_cast<int>(kMulti ? l.head_dim : l.state_dim);
  p.J = static_cast<int>(kMulti ? l.state_dim : l.head_dim);
  p.K1P = ssd_k16(p.K1);
  const int64_t qe = l.chunk_size < l.seqlen ? l.chunk_size : l.seqlen;  // longest chunk
  p.r_tiles = static_cast<int>((qe + kSsdTile - 1) / kSsdTile);
  p.j_tiles = static_cast<int>((p.J + kSsdTile - 1) / kSsdTile);
  const int64_t per_split = l.batch * l.groups * p.nchunks * p.r_tiles * p.j_tiles;
  if (kMulti) {
    p.nsplit = w.nsplit, p.hps = w.hps;  // the workspace's split partials
  } else {
    ssd_tc_head_split(p.hpg, per_split, l.sm_count, p.nsplit, p.hps);
  }
  p.total_blocks = per_split * p.nsplit;
  // Shared memory (see the kernel): L, buffer 0 (V0, R0), X (S, or V1 + R1), cache.
  p.ld_l = p.K1P + 8;
  p.ld_s = kMulti ? kTcLd : p.ld_l;
  const int l_bytes = ssd_align16(kSsdTile * p.ld_l * 2);  // also an Rgt tile
  const int s_bytes = ssd_align16((kMulti ? p.K1P : kSsdTile) * p.ld_s * 2);
  const int v_bytes = kSsdTile * kTcLd * 2;
  auto layout = [&](int cache_tiles) {  // the offsets for a cache of this many tiles; total bytes
    // Rgt buffers are needed when some column tile is not cached.
    const bool need_r = kMulti || cache_tiles < p.r_tiles;
    const int x_bytes = std::max(std::max(s_bytes, v_bytes + (need_r ? l_bytes : 0)), cache_tiles > 0 ? l_bytes : 0);
    p.cache_tiles = cache_tiles;
    p.off_v0 = l_bytes;
    p.off_r0 = p.off_v0 + v_bytes;
    p.off_x = p.off_r0 + (need_r ? l_bytes : 0);
    p.off_r1 = p.off_x + v_bytes;
    p.off_cache = p.off_x + x_bytes;
    return p.off_cache + cache_tiles * kTcCacheSlot * 4;
  };
  if (p.total_blocks == 0) return;
  const int64_t room = l.smem_optin_bytes - kSsdTcStaticSmem;
  const int bare = layout(0);
  if (bare != ssd_tc_scan_smem_bytes(p.K1, kMulti) || bare > room)
    fail(PlanErrorKind::Internal, op, "the tensor-core scan's shared memory is not what the plan counted");
  // Y/DX with several heads per block cache Lft·Rgtᵀ: as many column tiles as a row
  // tile has causal partners, up to kTcCacheTiles, if the device's shared memory holds
  // them (kSsdTcStaticSmem left for the static arrays); otherwise no cache.
  const int want = !kMulti && p.hps > 1 ? std::min(p.r_tiles, kTcCacheTiles) : 0;
  int smem = layout(want);
  if (want > 0 && smem > room) smem = layout(0);  // (layout sets p's offsets too)
  p.out_split = kMulti ? ssd_ws<float>(l, w.split) : nullptr;
  p.state = MODE == kSsdY || MODE == kSsdDC ? ssd_h_copy<T>(l, w) : ssd_ws<T>(l, w.gstates_t);
  p.state_ld = l.state_dim;
  ssd_scan_roles<T, float, MODE>(p, l, w);
  p.seg = ssd_seg(l, w);
  auto run = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem, op);
    kernel<<<ssd_grid(p.total_blocks), kTcThreads, smem, stream>>>(p);
  };
  if (p.seg != nullptr)
    run(ssd_tc_scan_kernel<T, MODE, !kMulti, true>);
  else if (!kMulti && p.epi.on)
    run(ssd_tc_scan_kernel<T, MODE, !kMulti>);
  else
    run(ssd_tc_scan_kernel<T, MODE>);
  check_launch(op);
  if constexpr (kMulti)
    if (p.nsplit > 1) ssd_split_sum(l, p.out_split, p.nsplit, p.out, stream);
}

// Its shared memory, at most 86 KB (D or N 256, kTcMaxHeads heads a block), fits every
// sm_80+ device (99 KB or more), so the plan's tensor-core choice needs no check of its own.
template <typename T>
void ssd_launch_tc_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdTcDacsParams<T> p;
  p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.D = static_cast<int>(l.head_dim), p.N = static_cast<int>(l.state_dim);
  p.KP = ssd_k16(p.D > p.N ? p.D : p.N);
  p.ld = p.KP + 8;
  const int64_t per_split = l.batch * l.groups * p.nchunks;
  ssd_tc_head_split(p.hpg, per_split, l.sm_count, p.nsplit, p.hps);
  p.total_blocks = per_split * p.nsplit;
  const int ab_bytes = ssd_align16(kSsdTile * p.ld * 2);
  p.off_b = ab_bytes;
  p.off_t = 2 * ab_bytes;
  p.off_rowtot = p.off_t + ssd_align16(kSsdTile * (kSsdTile + 1) * 4);
  const int smem = p.off_rowtot + static_cast<int>(p.hps) * kSsdTile * 4;
  if (smem > l.smem_optin_bytes - kSsdTcStaticSmem)
    fail(PlanErrorKind::Internal, "ssd_chunk_scan_backward(dacs)", "the tensor-core X_s kernel does not fit the device");
  p.x = ssd_operand<T>(l.x, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.B = ssd_operand<T>(l.B, l.B_stride, false);
  p.C = ssd_operand<T>(l.C, l.C_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.xs = ssd_ws<float>(l, w.xs);
  p.seg = ssd_seg(l, w);
  if (p.total_blocks == 0) return;
  allow_dynamic_smem(ssd_tc_dacs_kernel<T>, smem, "ssd_chunk_scan_backward(dacs)");
  ssd_tc_dacs_kernel<T><<<ssd_grid(p.total_blocks), kTcThreads, smem, stream>>>(p);
  check_launch("ssd_chunk_scan_backward(dacs)");
}

// ---- dispatch: tensor cores where the plan takes them (SsdChunkScanLaunch::tensor_cores),
// the SIMT kernels otherwise
template <typename T, bool DSTATE>
void ssd_run_chunk_state(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  if constexpr (ssd_is_half<T>) {
    if (l.tensor_cores) {
      ssd_launch_tc_chunk_state<T, DSTATE>(l, w, s);
      return;
    }
  }
  ssd_launch_chunk_state<T, DSTATE>(l, w, s);
}

// The chunk states H_c (BW = false) or Gn_c and the ⟨Gn_c, H_c⟩ partials (BW = true),
// from the inputs and Acs: the chunk state kernel (tensor cores or SIMT) followed by the
// state pass. (A tensor-core kernel that walked the chunks with the running state in
// registers served the forward states until the chunk-state kernel above got its copy
// ring: 446 µs against 226 + 143 as two kernels at the 2.7B shape, H200.)
// `last`: final_states (forward; null for the backward's recompute) or dinitial_states
// (backward), written when non-null.
template <typename T, bool BW>
void ssd_run_states(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t s) {
  ssd_run_chunk_state<T, /*DSTATE=*/BW>(l, w, s);
  ssd_launch_state_pass<T, BW>(l, w, last, s);
}

template <typename T, int MODE>
void ssd_run_scan(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  if constexpr (ssd_is_half<T>) {
    if (l.tensor_cores) {
      ssd_launch_tc_scan<T, MODE>(l, w, s);
      return;
    }
  }
  ssd_launch_scan<T, MODE>(l, w, s);
}

template <typename T>
void ssd_run_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  if constexpr (ssd_is_half<T>) {
    if (l.tensor_cores) {
      ssd_launch_tc_dacs<T>(l, w, s);
      return;
    }
  }
  ssd_launch_dacs<T>(l, w, s);
}

}  // namespace baracuda::kernels::cuda
