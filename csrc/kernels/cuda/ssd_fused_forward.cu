// Mamba-2 SSD chunk scan, CUDA forward in one launch ("fused_mma": mma.sync tensor-core
// products, sm_80+; ssd_fused_forward_sm90.cu is the same algorithm on Hopper's wgmma):
// float16/bfloat16, head_dim a multiple of 64, state_dim <= 128 (FusedMmaCb up to 256:
// core/ssd_chunk_scan_plan.h's kSsdFusedMaxState), chunk <= 256, with or without seq_idx
// (the plan, core/ssd_chunk_scan_plan.cpp, chooses it and checks each condition; the
// staged kernels of ssd_chunk_scan_tc.cuh run everything else).
//
// One block per (chunk c, batch b, head h, 64-column slice of head_dim), 8 warps. With
// the notation of ssd_chunk_scan.cuh (Acs the chunk-local cumsum of dt·A, H_c the state
// entering chunk c, len the chunk's length):
//   1. loads the chunk's x slice [len, 64], B and C [len, N] into shared memory
//      (cp.async), and processes dt (bias, softplus, clamp) and its cumsum Acs in fp32;
//   2. S_c = Σ_s exp(Acs_last − Acs_s)·dt_s · x_sᵀ ⊗ B_s   (64 × N, tensor cores; the
//      decay-weighted x rounded to the input type once, as mamba_ssm does);
//   3. takes H_c (float32, through L2) from the block of chunk c − 1 of the same (b, h,
//      slice): into registers before step 2 where that block has already published it
//      (the usual case), else after waiting for it here; publishes H_{c+1} =
//      exp(Acs_last)·H_c + S_c for chunk c + 1 (or writes final_states), and keeps H_c,
//      rounded to the input type, in shared memory;
//   4. y_t = exp(Acs_t)·C_t·H_cᵀ + Σ_{s ≤ t} (C_t·B_s)·exp(Acs_t − Acs_s)·dt_s · x_s,
//      C·Bᵀ computed per 16 × 16 tile and turned into the second product's operand in
//      registers (P rounded to the input type), then D·x, y_pre and the z gate. FusedMmaCb
//      stores a warp's 16 rows through a staging tile of its own in shared memory, 16
//      bytes a lane instead of the fragments' 4 (store_tile_staged): at N = 128 after the
//      C tiles where B was, where z's rows also arrive (cp.async, during the products); at
//      N = 256 (SPLIT) the warp's C tile, whose copy of the next pass's rows then follows
//      the epilogue. (At N = 64 no room is left; FusedMma keeps the fragments' stores:
//      staged in its own rows of C it was 2-5 % slower, BENCHMARKS.md.)
// So chunk states never make a round trip through memory beyond the hand-over between
// consecutive chunks (a float32 P × N tile per block, read from L2), and x, B, C are read
// once per block.
//
// FusedMmaCb (the plan's choice with several heads per group): C·Bᵀ does not depend on
// the head, so ssd_fused_cb_kernel computes its causal 16 × 16 tiles once per (batch,
// chunk, group), with the same instructions in the same order as step 4 would (the same
// bits), into a float32 table in the workspace, stored as the mma accumulator fragments of
// each lane (ssd_fused_cb_tiles: each of a tile's two 16-byte loads a lane reads 512
// contiguous bytes a warp; with a lane's 8 floats together each load took half of every
// sector it touched, and the table kernel and the N = 256 forward were 11.7 and 13 µs
// slower on an H200); step 4 then reads them (from L2, the next tile's in flight while one
// is used) instead of multiplying. That removes C·Bᵀ from every head's block (about 40 %
// of its products at N = 128) and C's whole shared-memory tile:
// once the chunk state is done, H_c goes where B was, and each warp copies the 16 C rows
// of its next output tile into a [16][N] tile of its own there (C·H_cᵀ is all that still
// needs them). A block then takes 108 KB instead of 193 and two blocks share a
// multiprocessor (128 registers a thread), one's loads and waits overlapping the other's
// products. Every value is computed by the same operations in the same order as in
// FusedMma, so the outputs are the same bits (tests/test_ssd_fused.py checks that).
// On Hopper (the plan's fused_pdl) the fused kernel is launched as a programmatic dependent
// of the table kernel: its blocks' loads, dt cumsums, chunk states and hand-overs run
// during the table's last wave, and a warp waits for the table (griddepcontrol.wait) just
// before its first read of it (H100, B2 L4096 H16 P128 N256 G16: the pass 12 µs shorter).
//
// A state tile of 256 columns (N > 128: FusedMmaCb only) goes to two blocks of 128 columns
// each (SPLIT), since one block of the whole tile (175 KB, 212 registers) had its
// multiprocessor to itself and waited on its own loads (latency-bound under ncu: 0.27
// eligible warps a scheduler). Each half is a chain of its own (S_c, H_c and its
// hand-over over its columns are independent of the other's); the second half's block
// stores its H_c, rounded to the input type as the products take it (16 KB), in the
// workspace and stops there, and the first half's block multiplies C·H_cᵀ over all N
// columns (C's second half through the same per-warp tile) before the decay, the
// intra-chunk products and the epilogue. (Before, the second half's block multiplied its
// own C·H_cᵀ and handed over 64 KB of float32 partial sums per block pair, and read its C
// half for that: 13 % more L2 traffic at B2 L4096 H16 P128 N256 G16, counted; the kernel's
// time was level, BENCHMARKS.md, "SSD at N = 256: the halves hand over H_c", and the
// hand-over's workspace is a quarter of what it was.) With z (the plan's
// fused_split_share) the two blocks share the output instead: each stores its rounded H_c
// half in the workspace and takes the other's, and each takes 8 of the 16 row tiles, one a
// warp, so that z's loads and y_pre's stores, which made the first half's block the longer
// by far, split over both (H100, B2 L4096 H16 P128 N256 G16 with the options: 274 µs
// against 303; with them but z, level; plain it lost, 244–246 against 239, one warp's 16
// steps holding each block where two passes of 17 held one).
//
// Ordering and progress: blocks take a ticket (atomicAdd) when they start and work on the
// ticket's problem, chunk-major, so the block a block waits for has a smaller ticket: it
// has started, is resident, and waits only for smaller tickets itself. Chunk c − 1 of a
// chain ran B·H·slices tickets earlier, so the wait is normally already over. The hand-over
// uses a ring of two float32 state tiles per chain and a counter per chain (the number of
// chunks published), both in the workspace; the launcher zeroes the counters and the
// ticket on the stream first (cudaMemsetAsync: graph-capturable). Every sum has an order
// fixed by the shapes: results are bitwise reproducible.
//
// Non-finite values, as in the staged tensor-core kernels: the masked (zero) entries of a
// diagonal 16 × 16 tile of P multiply the x rows of later positions of that tile, so a
// NaN or Inf in x can reach up to 15 earlier positions of its sequence. With seq_idx
// (SEQ) none reaches another packed sequence: the cumsum restarts at each start, the
// chunk state leaves out (selects to 0) the positions before the chunk's last start, the
// hand-over and the incoming state's rows are selected at a start, and a 16-position
// step that holds a start multiplies x once per sequence.
#include "kernels/cuda/ssd_fused_common.cuh"

namespace baracuda::kernels {
namespace cuda {
namespace {

constexpr int kLdX = kFusedP + 8;  // 16-bit row stride: an odd multiple of 16 bytes (ldmatrix)
static_assert(kFusedWarps * 2 * 16 == kFusedQ, "each warp owns two 16-row tiles of the output");

// The warp's 16 output rows r0.. (chunk-local; those < len) of dst (dense [B, L, H,
// head_dim]) from their fragment pairs v[half][j], through `stage` (ssd_store_staged).
template <typename T>
__device__ __forceinline__ void store_tile_staged(const FusedParams& p, const FusedTile& tile, T* stage, void* dst,
                                                  const uint32_t (&v)[2][kFusedP / 8], int r0, int len, int lane) {
  static_assert(kFusedP == 64, "a staged tile is 64 columns");
  T* out = static_cast<T*>(dst) +
           ((static_cast<int64_t>(tile.b) * p.seqlen + tile.t0 + r0) * p.heads + tile.h) * p.head_dim + tile.p0;
  const int64_t row_step = static_cast<int64_t>(p.heads) * p.head_dim;
  ssd_store_staged(reinterpret_cast<unsigned short*>(stage), v, lane, [&](int r, int g, uint4 val) {
    if (r0 + r < len) __stcs(reinterpret_cast<uint4*>(out + r * row_step + g * 8), val);
  });
}

// A [kFusedQ][COLS] tile of rows padded to LD elements (fused_load_tile).
template <typename T, int LD, int COLS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t s_row, int64_t s_col, bool vec,
                                          int rows, int K, bool evict_first = false) {
  fused_load_tile<T, COLS>([&](int r, int c) { return reinterpret_cast<unsigned char*>(dst + r * LD + c); },
                           8 * LD * static_cast<int>(sizeof(T)), src, s_row, s_col, vec, rows, K, evict_first);
}

// The rows [rows0, rows0 + nrows) of a 16-bit [len][K] tile from src (row stride s_row,
// column stride s_col) into dst (row stride LD elements), zero-filled past len and K;
// 16-byte cp.async groups where `vec`, else gathered. Copied by `nthreads` threads, this
// one being number `tid` of them.
template <typename T, int LD, int COLS>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int64_t s_row, int64_t s_col, bool vec, int rows0,
                                          int nrows, int len, int K, int tid, int nthreads) {
  constexpr int kGroups = COLS / 8;
  for (int i = tid; i < nrows * kGroups; i += nthreads) {
    const int r = rows0 + i / kGroups, c = (i % kGroups) * 8;
    T* d = dst + (r - rows0) * LD + c;
    const T* sp = src + r * s_row + c * s_col;
    if (r < len && c < K) {
      if (vec)
        ssd_cp_async16(d, sp);
      else
        *reinterpret_cast<uint4*>(d) = gather8(sp, s_col, K - c);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// A table block's chunk and batch, from its index past the group: chunk-major from the
// last chunk down, so that the tables the fused kernel's first tickets read (chunk 0 of
// each batch) are the last written, still in L2 where the table outgrows it (71 MB at B2
// L4096 H16 N256 G16). On an H100 (seventy-first session, BENCHMARKS.md) the table kernel
// took 78.9–79.0 µs against 79.5–80.4 with each batch's chunks in order, and the fused
// kernel 237.4–238.0 against 237.6–239.8, the same bits.
__device__ __forceinline__ void cb_chunk_batch(const FusedParams& p, int rest, int& c, int& b) {
  c = p.nchunks - 1 - rest / p.batch;
  b = rest % p.batch;
}

// FusedMmaCb's table (see the header), computed by blocks of 4 warps in one of two ways.
// Up to N = 128, one block per (batch, chunk, group, 64-row block of the chunk); warp w
// computes the tiles (i, j <= i) of row tile i = 4·block + w: C's 16 rows as A fragments
// over N, B's 16 rows j as B fragments, k-steps over N in order (as step 4 of the fused
// kernel does). Its tiles of C and of B's rows up to the block's last take 87 KB at
// N = 128, 169 KB at 256 (one block of 4 warps a multiprocessor: 139.8 µs at B2 L4096 H16
// N256 G16 on an H200), so above 128 the pairs below.
constexpr int kCbThreads = 128;
template <typename T, int NS>
__device__ __forceinline__ void cb_table_rows(const FusedParams& p) {
  constexpr int kLdN = NS + 8;
  constexpr int kNT = NS / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sC = reinterpret_cast<T*>(smem);  // [64][kLdN]: rows 64·rb ..
  T* sB = sC + 64 * kLdN;              // [64·(rb + 1)][kLdN]: rows 0 ..
  const int groups = p.heads / p.hpg;
  int rest = blockIdx.x;
  const int rb = rest % (kFusedQ / 64);
  rest /= kFusedQ / 64;
  const int grp = rest % groups;
  rest /= groups;
  int c, b;
  cb_chunk_batch(p, rest, c, b);
  const int t0 = c * p.chunk, len = min(p.chunk, p.seqlen - t0);
  if (rb * 64 >= len) return;
  const T* Cg = static_cast<const T*>(p.C) + b * p.Cs[0] + t0 * p.Cs[1] + grp * p.Cs[2];
  const T* Bg = static_cast<const T*>(p.B) + b * p.Bs[0] + t0 * p.Bs[1] + grp * p.Bs[2];
  load_rows<T, kLdN, NS>(sC, Cg, p.Cs[1], p.Cs[3], p.bc_vec, rb * 64, 64, len, p.state_dim, threadIdx.x,
                         blockDim.x);
  load_rows<T, kLdN, NS>(sB, Bg, p.Bs[1], p.Bs[3], p.bc_vec, 0, 64 * (rb + 1), len, p.state_dim, threadIdx.x,
                         blockDim.x);
  ssd_cp_async_commit();
  ssd_cp_async_wait<0>();
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mtile = rb * 4 + warp;
  if (mtile * 16 >= len) return;
  uint32_t cf[kNT][4];
#pragma unroll
  for (int kk = 0; kk < kNT; ++kk)
    ssd_ldsm_x4(cf[kk], sC + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLdN + kk * 16 + (lane >> 4) * 8);
  float* out = p.cb + ((static_cast<int64_t>(b) * p.nchunks + c) * groups + grp) * p.cb_tiles * 256 +
               (mtile * (mtile + 1) / 2) * 256 + lane * 4;
  for (int st = 0; st <= mtile; ++st) {
    float cb[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kNT; ++kk) {
      uint32_t bf[4];
      ssd_ldsm_x4(bf, sB + (st * 16 + (lane >> 4) * 8 + (lane & 7)) * kLdN + kk * 16 + ((lane >> 3) & 1) * 8);
      ssd_mma16816<T>(cb[0], cf[kk], bf[0], bf[1]);
      ssd_mma16816<T>(cb[1], cf[kk], bf[2], bf[3]);
    }
    *reinterpret_cast<float4*>(out + st * 256) = make_float4(cb[0][0], cb[0][1], cb[0][2], cb[0][3]);
    *reinterpret_cast<float4*>(out + st * 256 + 128) = make_float4(cb[1][0], cb[1][1], cb[1][2], cb[1][3]);
  }
}

// Above N = 128, one block per (batch, chunk, group, pair of kCbR-row tiles ti >= tj of
// the chunk: 3 at chunk 256); warp w of kCbR / 16 computes the tiles (i, j) of row tile
// i = (kCbR / 16)·ti + w with j in the pair's column tiles, j <= i. C's and B's rows come
// in 64-column steps of N through a ring of three steps (110.6 KB, two blocks of 8 warps a
// multiprocessor at 120 registers), each tile's k-steps over N in order (the same bits).
// History at B2 L4096 H16 P128 N256 G16, with 64-row pairs (10 blocks of 4 warps a chunk,
// 55 KB): 100.4–101.2 µs on an H200 (two steps, 37 KB, six blocks: 104.0–105.2; 128-column
// steps or N whole in one step lost; 90.2 since the table's tiles are stored as whole
// sectors; 74.8 since the usual case's loads take addresses computed once, where the
// generic row loop's had been most of a step's instructions); persistent blocks (each
// taking every grid-th unit, its ring running on across units) 120.7, likely the pairs'
// uneven work, which blocks scheduled as they finish balance and a fixed share does not.
// 128-row pairs read 384 KB of C and B rows a chunk and group from L2 where the 10 blocks
// read 640 (256 distinct): 75.0 -> 72.3 µs (H200, session 70; under ncu 96.4 -> 91.0 µs,
// L2 throughput 71.8 -> 64.6 %).
constexpr int kCbR = 128;
constexpr int kCbPairs = (kFusedQ / kCbR) * (kFusedQ / kCbR + 1) / 2;
constexpr int kCbPairThreads = 2 * kCbR;
constexpr int kCbK = 64;           // N's columns a step
constexpr int kCbStages = 3;       // steps in the ring
constexpr int kCbLd = kCbK + 8;    // 16-bit row stride: an odd multiple of 16 bytes (ldmatrix)
constexpr int kCbPairSmem = 2 * kCbStages * kCbR * kCbLd * 2;  // C's and B's rows, 16-bit
static_assert(kCbPairSmem <= ssd_fused_smem_bytes(SsdCudaForward::FusedMmaCb, 128),
              "the plan's check of the fused blocks' shared memory (a half tile of 128) covers the table's");
template <typename T, int NS>
__device__ __forceinline__ void cb_table_pairs(const FusedParams& p) {
  static_assert(NS % kCbK == 0, "the state tile is whole steps");
  constexpr int kSteps = NS / kCbK;
  constexpr int R = kCbR, kThreads = kCbPairThreads, kW = R / 16;  // warps = a warp's column tiles
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sC0 = reinterpret_cast<T*>(smem);        // [kCbStages][R * kCbLd]
  T* const sB0 = sC0 + kCbStages * R * kCbLd;       // [kCbStages][R * kCbLd]
  const int groups = p.heads / p.hpg;
  int rest = blockIdx.x;
  int ti, tj;
  ssd_tile_pair(rest % kCbPairs, ti, tj);
  rest /= kCbPairs;
  const int grp = rest % groups;
  rest /= groups;
  int c, b;
  cb_chunk_batch(p, rest, c, b);
  const int t0 = c * p.chunk, len = min(p.chunk, p.seqlen - t0);
  if (ti * R >= len) return;  // (the whole block)
  const T* Cg = static_cast<const T*>(p.C) + b * p.Cs[0] + t0 * p.Cs[1] + grp * p.Cs[2];
  const T* Bg = static_cast<const T*>(p.B) + b * p.Bs[0] + t0 * p.Bs[1] + grp * p.Bs[2];
  // The usual case (16-byte rows, the block's R rows of C and of B inside the chunk, N the
  // whole tile): a thread's four 8-column pieces of each step are those load_rows would
  // give it, at addresses computed once and moved by a step's columns.
  static_assert(R * kCbK / 8 == 4 * kThreads, "four 16-byte pieces a thread and operand a step");
  constexpr int kFr = kThreads / 8;  // rows between a thread's pieces
  const bool fast = p.bc_vec && (ti + 1) * R <= len && p.state_dim == NS;
  const int fr = threadIdx.x >> 3, fc = (threadIdx.x & 7) * 8;
  const T* const fC = Cg + (ti * R + fr) * p.Cs[1] + fc;
  const T* const fB = Bg + (tj * R + fr) * p.Bs[1] + fc;
  const int64_t fCs = kFr * p.Cs[1], fBs = kFr * p.Bs[1];
  auto load = [&](int step, int buf) {
    const int k0 = step * kCbK;
    if (fast) {
      T* const dC = sC0 + (buf * R + fr) * kCbLd + fc;
      T* const dB = sB0 + (buf * R + fr) * kCbLd + fc;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        ssd_cp_async16(dC + k * kFr * kCbLd, fC + k * fCs + k0);
        ssd_cp_async16(dB + k * kFr * kCbLd, fB + k * fBs + k0);
      }
      return;
    }
    load_rows<T, kCbLd, kCbK>(sC0 + buf * R * kCbLd, Cg + k0 * p.Cs[3], p.Cs[1], p.Cs[3], p.bc_vec, ti * R, R,
                              len, p.state_dim - k0, threadIdx.x, kThreads);
    load_rows<T, kCbLd, kCbK>(sB0 + buf * R * kCbLd, Bg + k0 * p.Bs[3], p.Bs[1], p.Bs[3], p.bc_vec, tj * R, R,
                              len, p.state_dim - k0, threadIdx.x, kThreads);
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mtile = ti * kW + warp;
  const bool live = mtile * 16 < len;  // (warp-uniform)
  float cb[kW][2][4] = {};
#pragma unroll
  for (int s = 0; s < kCbStages - 1; ++s) {
    if (s < kSteps) load(s, s);
    ssd_cp_async_commit();
  }
#pragma unroll 1
  for (int step = 0; step < kSteps; ++step) {
    const int buf = step % kCbStages;
    if (step + kCbStages - 1 < kSteps) load(step + kCbStages - 1, (step + kCbStages - 1) % kCbStages);
    ssd_cp_async_commit();
    ssd_cp_async_wait<kCbStages - 1>();  // step `step`'s rows are here
    __syncthreads();
    const T* sC = sC0 + buf * R * kCbLd;
    const T* sB = sB0 + buf * R * kCbLd;
    if (live) {
#pragma unroll
      for (int kk = 0; kk < kCbK / 16; ++kk) {
        uint32_t cf[4];
        ssd_ldsm_x4(cf, sC + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kCbLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          if (tj * kW + j > mtile) continue;  // (warp-uniform: the diagonal pair's upper tiles)
          uint32_t bf[4];
          ssd_ldsm_x4(bf, sB + (j * 16 + (lane >> 4) * 8 + (lane & 7)) * kCbLd + kk * 16 + ((lane >> 3) & 1) * 8);
          ssd_mma16816<T>(cb[j][0], cf, bf[0], bf[1]);
          ssd_mma16816<T>(cb[j][1], cf, bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // buffer `buf` is free for step + kCbStages
  }
  if (!live) return;
  float* out = p.cb + ((static_cast<int64_t>(b) * p.nchunks + c) * groups + grp) * p.cb_tiles * 256 +
               (mtile * (mtile + 1) / 2 + tj * kW) * 256 + lane * 4;
#pragma unroll
  for (int j = 0; j < kW; ++j) {
    if (tj * kW + j > mtile) continue;
    *reinterpret_cast<float4*>(out + j * 256) = make_float4(cb[j][0][0], cb[j][0][1], cb[j][0][2], cb[j][0][3]);
    *reinterpret_cast<float4*>(out + j * 256 + 128) = make_float4(cb[j][1][0], cb[j][1][1], cb[j][1][2], cb[j][1][3]);
  }
}

template <typename T, int NS>
__global__ void __launch_bounds__(NS <= 128 ? kCbThreads : kCbPairThreads) ssd_fused_cb_kernel(const FusedParams p) {
  grid_dependents_may_start();  // (fused_pdl: the fused kernel's blocks start beside this one's last)
  if constexpr (NS <= 128)
    cb_table_rows<T, NS>(p);
  else
    cb_table_pairs<T, NS>(p);
}

// Step 2 of the fused forward: the chunk state S_c[p][n] = Σ_s (wgt_s·x[s][p])·B[s][n] of
// the block's tiles sX ([kFusedQ][kLdX]) and sB ([kFusedQ][NS + 8]) into sacc; warp
// (mt, nh) = (warp & 3, warp >> 2) owns rows 16·mt.. of p and half of the N columns.
// SEQ: seg_last is the chunk's last sequence start (−1: none); the chunk state takes only
// the positions from it on: the k-steps before it are skipped, and in its own k-step both
// operands of the earlier positions are selected to 0 (0·NaN would be NaN).
template <typename T, int NS, bool SEQ>
__device__ __forceinline__ void fused_chunk_state(float (&sacc)[NS / 16][4], const T* sX, const T* sB,
                                                  const float* wgt, int len16, int seg_last, int lane, int mt,
                                                  int nh) {
  constexpr int kLdN = NS + 8;
  constexpr int kNT = NS / 16;
  const int q4 = lane & 3;
#pragma unroll
  for (int j = 0; j < kNT; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
  for (int k0 = SEQ && seg_last > 0 ? seg_last / 16 * 16 : 0; k0 < len16; k0 += 16) {
    const bool cut = SEQ && k0 < seg_last;  // (block-uniform)
    uint32_t af[4];
    ssd_ldsm_x4_t(af, sX + (k0 + (lane >> 4) * 8 + (lane & 7)) * kLdX + mt * 16 + ((lane >> 3) & 1) * 8);
    const float2 w01 = *reinterpret_cast<const float2*>(wgt + k0 + 2 * q4);
    const float2 w89 = *reinterpret_cast<const float2*>(wgt + k0 + 2 * q4 + 8);
    af[0] = scale2<T>(af[0], w01.x, w01.y);
    af[1] = scale2<T>(af[1], w01.x, w01.y);
    af[2] = scale2<T>(af[2], w89.x, w89.y);
    af[3] = scale2<T>(af[3], w89.x, w89.y);
    if (cut) {
#pragma unroll
      for (int i = 0; i < 4; ++i) af[i] = keep2(af[i], k0 + 2 * q4 + (i >> 1) * 8, seg_last, kFusedQ);
    }
#pragma unroll
    for (int j = 0; j < kNT; j += 2) {
      uint32_t bf[4];
      ssd_ldsm_x4_t(bf, sB + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLdN + nh + j * 8 + (lane >> 4) * 8);
      if (cut) {
#pragma unroll
        for (int i = 0; i < 4; ++i) bf[i] = keep2(bf[i], k0 + 2 * q4 + (i & 1) * 8, seg_last, kFusedQ);
      }
      ssd_mma16816<T>(sacc[j], af, bf[0], bf[1]);
      ssd_mma16816<T>(sacc[j + 1], af, bf[2], bf[3]);
    }
  }
}

// H_c (fused_state_in) at the thread's accumulator places of the chunk state (see
// fused_chunk_state): hin[j][half] is the pair at row 16·mt + g8 + 8·half and columns
// nh + 8·j + 2·q4, every load in flight at once.
template <int NS>
__device__ __forceinline__ void fused_load_state(float2 (&hin)[NS / 16][2], const FusedParams& p,
                                                 const FusedTile& tile, int lane, int mt, int nh) {
  const int g8 = lane >> 2, q4 = lane & 3;
#pragma unroll
  for (int j = 0; j < NS / 16; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      hin[j][half] = fused_state_in<NS>(p, tile, mt * 16 + g8 + half * 8, nh + j * 8 + 2 * q4);
}

// Step 3's hand-over, once H_c is in `hin` (the pairs of fused_state_in at the thread's
// accumulator places of sacc): each pair of H_c goes to keep(pr, n, h) (the caller keeps it,
// rounded, for its own use), and H_{c+1} = 2^last2·H_c + S_c to the ring for chunk c + 1
// (or to final_states after the last chunk), then published. (SEQ: after a sequence start
// in the chunk, seg_last >= 0, S_c alone: the selected decay.)
template <int NS, typename Keep>
__device__ __forceinline__ void fused_hand_over(const FusedParams& p, const FusedTile& tile,
                                                const float2 (&hin)[NS / 16][2], const float (&sacc)[NS / 16][4],
                                                float last2, int seg_last, int lane, int mt, int nh,
                                                Keep&& keep) {
  constexpr int kNT = NS / 16;
  const int g8 = lane >> 2, q4 = lane & 3;
  const float decay = fast_exp2(last2);
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pr = mt * 16 + g8 + half * 8, n = nh + j * 8 + 2 * q4;
      const float2 h = hin[j][half];
      keep(pr, n, h);
      const float2 s2 = make_float2(sacc[j][2 * half], sacc[j][2 * half + 1]);
      fused_state_out<NS>(p, tile, pr, n,
                          seg_last >= 0 ? s2 : make_float2(fmaf(decay, h.x, s2.x), fmaf(decay, h.y, s2.y)));
    }
  }
  fused_publish_state(p, tile);
}

// SPLIT (FusedMmaCb's state tile of 256 as two halves of NS = 128, FusedTile::nh): the
// block's B, state and hand-over are those of its half's columns; the second half's block
// stores its rounded H_c and a flag in the workspace and stops there, and the first half's
// block takes it into sH's columns NS .. 2·NS (waiting for the flag) for C·H_cᵀ over both.
// SHARE (the plan's fused_split_share): each half's block stores its rounded H_c and takes
// the other's, and both take output tiles, one a warp: the second half's block (the
// smaller ticket) rows 128 .. 255, the first's 0 .. 127.
template <typename T, int NS, bool CB, bool SEQ, bool SPLIT = false, bool SHARE = false>
__global__ void __launch_bounds__(kFusedThreads, CB ? 2 : 1)
    ssd_fused_forward_kernel(const FusedParams p) {
  static_assert(NS <= 128 && (!SPLIT || (CB && NS == 128)), "a tile of 256 runs as two halves of 128 (SPLIT)");
  static_assert(!SHARE || SPLIT, "the halves share the output tiles (SHARE) only with SPLIT");
  constexpr int kLdN = NS + 8;
  constexpr int kNT = NS / 16;  // k-steps over N; 8-column tiles per warp in the state product
  extern __shared__ __align__(16) unsigned char smem[];
  T* sX = reinterpret_cast<T*>(smem);   // [kFusedQ][kLdX]
  T* sB = sX + kFusedQ * kLdX;          // [kFusedQ][kLdN]
  T* sC = sB + kFusedQ * kLdN;          // [kFusedQ][kLdN] (not with CB)
  // [kFusedP][kLdH]: H_c, rounded (CB: once B is done; SPLIT: both halves' columns)
  constexpr int kLdH = SPLIT ? 2 * NS + 8 : kLdN;
  T* sH = CB ? sB : sC + kFusedQ * kLdN;
  float* acs2 = reinterpret_cast<float*>(CB ? sC : sH + kFusedP * kLdN);  // [kFusedQ]
  float* dts = acs2 + kFusedQ;                                             // [kFusedQ]
  float* wgt = dts + kFusedQ;                                              // [kFusedQ]
  float* colw = wgt + kFusedQ;                                             // [kFusedQ]
  float* warp_total = colw + kFusedQ;                                      // [kFusedWarps]
  int& s_ticket = *reinterpret_cast<int*>(warp_total + kFusedWarps);
  int& s_ready = *(&s_ticket + 1);  // (within the 64 bytes ssd_fused_smem_bytes adds)
  int* seg = reinterpret_cast<int*>(warp_total + 16);  // SEQ: [kFusedQ + kFusedWarps] (ssd_fused_smem_bytes' `seq`)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, q4 = lane & 3;  // mma fragment row and column pair
  if (tid == 0) s_ticket = atomicAdd(p.ticket, 1);
  __syncthreads();
  const FusedTile tile = fused_tile<SPLIT>(p, s_ticket);
  const int len = tile.len;

  // ---- 1. loads (dt, then x and B: the state product needs them first), dt's cumsum
  const FusedDt dt_in = fused_dt_load<T>(p, tile);
  {
    const T* x = static_cast<const T*>(p.x) + tile.b * p.xs[0] + tile.t0 * p.xs[1] + tile.h * p.xs[2] +
                 tile.p0 * p.xs[3];
    load_tile<T, kLdX, kFusedP>(sX, x, p.xs[1], p.xs[3], p.x_vec, len, kFusedP, /*evict_first=*/true);
    const T* Bg = static_cast<const T*>(p.B) + tile.b * p.Bs[0] + tile.t0 * p.Bs[1] + tile.grp * p.Bs[2] +
                  tile.n0 * p.Bs[3];
    load_tile<T, kLdN, NS>(sB, Bg, p.Bs[1], p.Bs[3], p.bc_vec, len, p.state_dim - tile.n0);
    ssd_cp_async_commit();
    if constexpr (!CB) {
      const T* Cg = static_cast<const T*>(p.C) + tile.b * p.Cs[0] + tile.t0 * p.Cs[1] + tile.grp * p.Cs[2];
      load_tile<T, kLdN, NS>(sC, Cg, p.Cs[1], p.Cs[3], p.bc_vec, len, p.state_dim);
      ssd_cp_async_commit();
    }
  }
  const float last2 = fused_dt_cumsum<SEQ>(p, tile, dt_in, acs2, dts, wgt, warp_total, seg, colw);
  if (tid == 0) s_ready = fused_state_ready(p, tile);
  ssd_cp_async_wait<CB ? 0 : 1>();
  __syncthreads();  // x and B visible, s_ready set

  // H_c for step 3, in registers: every load in flight at once (one L2 round trip, not one
  // per store that follows), and before the state product where H_c has already been
  // published (the usual case: chunk c − 1 ran B·H·slices tickets earlier).
  const int mt = warp & 3, nh = (warp >> 2) * (NS / 2);
  float2 hin[kNT][2];
  auto load_state = [&] { fused_load_state<NS>(hin, p, tile, lane, mt, nh); };
  const bool early = s_ready != 0;
  if (early) load_state();

  // ---- 2. S_c (fused_chunk_state)
  const int len16 = (len + 15) / 16 * 16, mtiles = len16 / 16;
  const int seg_last = SEQ ? seg[len - 1] : -1;
  float sacc[kNT][4];
  fused_chunk_state<T, NS, SEQ>(sacc, sX, sB, wgt, len16, seg_last, lane, mt, nh);

  // ---- 3. the hand-over: H_c in (also kept, rounded, for the output), H_{c+1} out
  if (!early) {  // block-uniform
    fused_wait_for_state(p, tile);
    load_state();
  }
  // CB: C's rows come through a [16][kLdN] tile per warp where B was, after sH; columns
  // n0 .. n0 + NS of the state (SPLIT: the first half's block takes both halves in turn)
  static_assert(kFusedP * kLdH + kFusedWarps * 16 * kLdN <= kFusedQ * kLdN, "sH and the C tiles fit where B was");
  T* sCw = sH + kFusedP * kLdH + warp * 16 * kLdN;
  auto load_c_rows = [&](int r0, int n0) {
    const T* Cg = static_cast<const T*>(p.C) + tile.b * p.Cs[0] + (tile.t0 + r0) * p.Cs[1] + tile.grp * p.Cs[2] +
                  n0 * p.Cs[3];
    constexpr int kGroups = NS / 8;  // 16-byte groups of a row
    if (p.bc_vec && r0 + 16 <= len && p.state_dim - n0 >= NS) {  // whole rows: a copy per group, no checks
#pragma unroll
      for (int i = lane; i < 16 * kGroups; i += 32)
        ssd_cp_async16(sCw + (i / kGroups) * kLdN + (i % kGroups) * 8,
                       Cg + (i / kGroups) * p.Cs[1] + (i % kGroups) * 8);
    } else {  // (Cg is row r0: its rows 0 .. 15)
      load_rows<T, kLdN, NS>(sCw, Cg, p.Cs[1], p.Cs[3], p.bc_vec, 0, 16, len - r0, p.state_dim - n0, lane, 32);
    }
    ssd_cp_async_commit();
  };
  if constexpr (CB) __syncthreads();  // every warp is done with B, where sH and the C tiles go
  // ZS: each warp's z rows of its output tile, in a staging tile (ssd_stage_at) after the C
  // tiles where B was
  constexpr bool ZS = CB && !SPLIT && NS == 128;
  static_assert(!ZS || kFusedP * kLdH + kFusedWarps * 16 * (kLdN + kFusedP) <= kFusedQ * kLdN,
                "the z tiles fit where B was");
  T* sZw = sH + kFusedP * kLdH + kFusedWarps * 16 * kLdN + warp * 16 * kFusedP;
  const bool zs = ZS && p.z_stage;
  auto stage_z = [&](int r0) {
    if (zs) {
      const T* zg = static_cast<const T*>(p.z) + tile.b * p.zs[0] + (tile.t0 + r0) * p.zs[1] + tile.h * p.zs[2] +
                    tile.p0;
      const uint64_t pol = ssd_evict_first_policy();
#pragma unroll
      for (int k = 0; k < 16 * kFusedP / 8 / 32; ++k) {
        const int i = lane + 32 * k, r = i / (kFusedP / 8), g = i % (kFusedP / 8);
        if (r0 + r < len) ssd_cp_async16_hint(sZw + ssd_stage_at(r, g), zg + r * p.zs[1] + g * 8, pol);
      }
    }
    ssd_cp_async_commit();  // (empty without: the groups' count is the same either way)
  };
  // SPLIT: the (pair, chunk)'s slots in the workspace (half_states, half_ready): one
  // (the second half's), SHARE: one a half
  const int64_t at = (tile.pair * p.nchunks + tile.c) * (SHARE ? 2 : 1);
  const int own = SHARE ? tile.nh : 0, other = SHARE ? 1 - tile.nh : 0;
  fused_hand_over<NS>(p, tile, hin, sacc, last2, seg_last, lane, mt, nh, [&](int pr, int n, float2 h) {
    const uint32_t hr = ssd_pack2<T>(h.x, h.y);
    if (SPLIT && (SHARE || tile.nh == 1))  // the other half's block takes it from the workspace
      __stcg(static_cast<unsigned int*>(p.half_states) + ((at + own) * kFusedP + pr) * (NS / 2) + n / 2, hr);
    if (!SPLIT || SHARE || tile.nh == 0)
      *reinterpret_cast<uint32_t*>(sH + pr * kLdH + (SHARE ? tile.n0 : 0) + n) = hr;
  });
  if constexpr (SPLIT) {
    if (SHARE || tile.nh == 1) {  // (block-uniform) H_c's half handed to the other half's block
      __syncthreads();            // (as fused_publish_state: one cumulative release after a barrier)
      if (tid == 0) st_release(p.half_ready + at + own, 1);
      if (!SHARE) return;  // (without SHARE the second half's block is done)
    }
    // the other half's H_c, rounded by its block, into sH's columns of that half. Without
    // SHARE the second half's block has the smaller ticket: it runs. With SHARE the second
    // half's block (the even ticket) waits for ticket + 1 too, which may not have started:
    // tickets go in order to resident blocks, so only the highest ticket can wait on a block
    // not started, and that block is the next to start; and each block publishes its half
    // before it waits.
    fused_block_wait(p.half_ready + at + other, 1);
    const T* h1 = static_cast<const T*>(p.half_states) + (at + other) * (kFusedP * NS);
#pragma unroll
    for (int i = tid; i < kFusedP * NS / 8; i += kFusedThreads)
      ssd_cp_async16(sH + (i / (NS / 8)) * kLdH + (1 - tile.nh) * NS + (i % (NS / 8)) * 8, h1 + i * 8);
    ssd_cp_async_commit();
  }
  // SHARE: the warp's one output tile (16 rows). The halves by rows, 0–127 and 128–255,
  // not by equal causal work ({0–3, 12–15} and {4–11}): a block holds its place on the
  // multiprocessor until its longest warp is done, 16 steps and 8 that way against 16 and
  // 12 (H100, B2 L4096 H16 P128 N256 G16 with z: 274.1–274.4 µs against 277.2–277.9)
  const int share_tile = tile.nh == 1 ? warp + kFusedWarps : warp;
  if constexpr (SHARE) {
    if (share_tile < mtiles) load_c_rows(share_tile * 16, 0);
  } else if constexpr (CB) {
    if (warp < mtiles) load_c_rows(warp * 16, tile.n0);
  }
  ssd_cp_async_wait<0>();
  __syncthreads();  // C and H_c visible
  if (p.states != nullptr && (!SHARE || tile.nh == 0)) fused_keep_states(p, tile, sH, kLdH, tid);

  // ---- 4. the output: warp w owns 16-row tiles w and 15 − w (equal causal work; SHARE:
  // share_tile alone)
  const float* cb_chunk =
      CB ? p.cb + ((static_cast<int64_t>(tile.b) * p.nchunks + tile.c) * (p.heads / p.hpg) + tile.grp) *
                      p.cb_tiles * 256 + lane * 4
         : nullptr;
  for (int pass = 0; pass < (SHARE ? 1 : 2); ++pass) {
    const int mtile = SHARE ? share_tile : pass == 0 ? warp : 2 * kFusedWarps - 1 - warp;
    if (mtile >= mtiles) continue;
    const int r0 = mtile * 16;
    const int ta = r0 + g8, tb = ta + 8;
    // seq_idx: the first chunk position of row ta's / tb's sequence (0 without), and whether
    // the incoming state reaches it (fused_dt_cumsum)
    const int sa = SEQ ? seg[ta] : -1, sb = SEQ ? seg[tb] : -1;
    const int lo_a = max(sa, 0), lo_b = max(sb, 0);
    // z of rows ta, tb for the epilogue, all loads in flight together: loaded here, before the
    // products, where the block has the registers (one block an SM), and after them in the CB
    // kernel, whose 128 registers (two blocks an SM) would spill z across the products
    uint32_t zr[2][kFusedP / 8] = {};
    const auto load_z = [&] {
      if (p.z == nullptr) return;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < kFusedP / 8; ++j)
          if ((half == 0 ? ta : tb) < len) zr[half][j] = fused_z_pair<T>(p, tile, half == 0 ? ta : tb, j * 8 + 2 * q4);
    };
    if constexpr (!CB) load_z();
    uint32_t cf[kNT][4];  // C rows r0..r0+15 as A fragments, k over N
    if constexpr (CB) {
      ssd_cp_async_wait<0>();
      __syncwarp();
    }
#pragma unroll
    for (int kk = 0; kk < kNT; ++kk) {
      const int row = ((lane >> 3) & 1) * 8 + (lane & 7);
      ssd_ldsm_x4(cf[kk], (CB ? sCw + row * kLdN : sC + (r0 + row) * kLdN) + kk * 16 + (lane >> 4) * 8);
    }
    if constexpr (ZS) stage_z(r0);  // (the tile is free: the warp has read the last pass's, the waits above)
    float acc[kFusedP / 8][4];
#pragma unroll
    for (int j = 0; j < kFusedP / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    // inter-chunk: C·H_cᵀ (SPLIT: over both halves' columns, C's second half through the
    // warp's tile once the first is in registers), then the rows scaled by exp(Acs_t)
    auto c_h = [&](int n0) {
#pragma unroll
      for (int kk = 0; kk < kNT; ++kk) {
#pragma unroll
        for (int j = 0; j < kFusedP / 8; j += 2) {
          uint32_t bf[4];
          ssd_ldsm_x4(bf, sH + (j * 8 + (lane >> 4) * 8 + (lane & 7)) * kLdH + n0 + kk * 16 + ((lane >> 3) & 1) * 8);
          ssd_mma16816<T>(acc[j], cf[kk], bf[0], bf[1]);
          ssd_mma16816<T>(acc[j + 1], cf[kk], bf[2], bf[3]);
        }
      }
    };
    c_h(0);
    if constexpr (SPLIT) {
      __syncwarp();
      load_c_rows(r0, NS);
      ssd_cp_async_wait<0>();
      __syncwarp();
#pragma unroll
      for (int kk = 0; kk < kNT; ++kk)
        ssd_ldsm_x4(cf[kk], sCw + (((lane >> 3) & 1) * 8 + (lane & 7)) * kLdN + kk * 16 + (lane >> 4) * 8);
      c_h(NS);
    }
    if constexpr (CB) {  // the warp's C rows of its next pass, copied during this one
      __syncwarp();
      // (SPLIT with a staged epilogue: after it, the C tile being the warp's staging tile)
      if (!SHARE && pass == 0 && 2 * kFusedWarps - 1 - warp < mtiles && !(SPLIT && p.y_stage))
        load_c_rows((2 * kFusedWarps - 1 - warp) * 16, tile.n0);
      else if (ZS && pass == 0)
        ssd_cp_async_commit();  // (an empty group: the epilogue's wait counts one)
    }
    const float acs_a = acs2[ta], acs_b = acs2[tb];
    {
      // (SEQ: rows after a start in the chunk are selected to 0, not multiplied by 0)
      const float ea = fast_exp2(acs_a), eb = fast_exp2(acs_b);
      const bool ra = !SEQ || sa < 0, rb = !SEQ || sb < 0;
#pragma unroll
      for (int j = 0; j < kFusedP / 8; ++j) {
        acc[j][0] = ra ? acc[j][0] * ea : 0.0f;
        acc[j][1] = ra ? acc[j][1] * ea : 0.0f;
        acc[j][2] = rb ? acc[j][2] * eb : 0.0f;
        acc[j][3] = rb ? acc[j][3] * eb : 0.0f;
      }
    }
    // intra-chunk, per 16-column step s0 <= r0: P = (C·Bᵀ)∘exp(Acs_t − Acs_s)·dt_s (lo_t <=
    // s <= t, one unsigned comparison) from the step's C·Bᵀ fragments, rounded to the input
    // type, times x's rows s0..
    const unsigned span_a = static_cast<unsigned>(ta - lo_a), span_b = static_cast<unsigned>(tb - lo_b);
    // SEQ: the steps before the one holding row r0's sequence start have P = 0 in every row
    // (the starts grow with the position) and are skipped, so that the per-sequence path
    // below runs only in the step holding a start and in the row tile holding one
    const int st0 = SEQ ? max(seg[r0], 0) / 16 : 0;
    auto consume = [&](const float (&cb)[2][4], int s0) {
      uint32_t pf[4];
      // A step before the row tile's own, its positions and the tile's rows one sequence
      // (block-uniform): every pair is causal and of one sequence, and the weight factors
      // through e = s0 + 15 into a row factor 2^(Acs_t − Acs_e) and a column factor
      // 2^(Acs_e − Acs_s)·dt_s (colw): two exp2 a lane for the tile's 8 entries instead of
      // 8 (the plan's factored_decays: ssd_chunk_scan_tc.cuh, "factored weights"). The
      // diagonal step keeps the direct weights: there t <= e, and 2^(Acs_t − Acs_e) could
      // overflow alone.
      if (s0 + 16 <= r0 && p.factored && (!SEQ || seg[s0] == seg[min(r0 + 15, len - 1)])) {
        const float e = acs2[s0 + 15];
        const float fa = fast_exp2(acs_a - e), fb = fast_exp2(acs_b - e);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float2 w = *reinterpret_cast<const float2*>(colw + s0 + nt * 8 + 2 * q4);
          pf[2 * nt] = ssd_pack2<T>(cb[nt][0] * (fa * w.x), cb[nt][1] * (fa * w.y));
          pf[2 * nt + 1] = ssd_pack2<T>(cb[nt][2] * (fb * w.x), cb[nt][3] * (fb * w.y));
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int s = s0 + nt * 8 + 2 * q4;
          const float2 as = *reinterpret_cast<const float2*>(acs2 + s);
          const float2 ds = *reinterpret_cast<const float2*>(dts + s);
          const unsigned da = static_cast<unsigned>(s - lo_a), db = static_cast<unsigned>(s - lo_b);
          const float pa0 = da <= span_a ? cb[nt][0] * fast_exp2(acs_a - as.x) * ds.x : 0.0f;
          const float pa1 = da + 1 <= span_a ? cb[nt][1] * fast_exp2(acs_a - as.y) * ds.y : 0.0f;
          const float pb0 = db <= span_b ? cb[nt][2] * fast_exp2(acs_b - as.x) * ds.x : 0.0f;
          const float pb1 = db + 1 <= span_b ? cb[nt][3] * fast_exp2(acs_b - as.y) * ds.y : 0.0f;
          pf[2 * nt] = ssd_pack2<T>(pa0, pa1);
          pf[2 * nt + 1] = ssd_pack2<T>(pb0, pb1);
        }
      }
      // SEQ, where the positions s0 .. and the tile's rows are not all one sequence
      // (warp-uniform; the starts grow with the position): P's entries across a start are
      // 0, but 0·x is NaN for a NaN x, so x's rows go in one product per sequence (x's
      // fragments of the other positions selected to 0), each into an accumulator of its
      // own that only the rows of that sequence add
      if (SEQ && seg[s0] != seg[min(r0 + 15, len - 1)]) {
        // the starts among the step's positions (bit i: s0 + i; warp-uniform), so that each
        // sequence's positions [lo, hi) follow without a walk through seg
        const int kq = s0 + (lane & 15);
        const unsigned starts = __ballot_sync(0xffffffffu, lane < 16 && kq < len && seg[kq] == kq) & 0xffffu;
        const int sq0 = seg[s0];
#pragma unroll
        for (int j = 0; j < kFusedP / 8; j += 2) {  // (unrolled: acc's indices are compile-time)
          uint32_t bf[4];
          ssd_ldsm_x4_t(bf, sX + (s0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLdX + j * 8 + (lane >> 4) * 8);
          for (int lo = s0, hi; lo < s0 + 16; lo = hi) {
            const unsigned above = starts & ~((2u << (lo - s0)) - 1u);  // the starts after lo
            hi = above != 0u ? s0 + __ffs(above) - 1 : s0 + 16;
            const int sq = lo == s0 ? sq0 : lo;  // (a start's seg is its own position)
            uint32_t m[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) m[i] = keep2(bf[i], s0 + 2 * q4 + (i & 1) * 8, lo, hi);
            float t0[4] = {}, t1[4] = {};
            ssd_mma16816<T>(t0, pf, m[0], m[1]);
            ssd_mma16816<T>(t1, pf, m[2], m[3]);
            if (sa == sq) acc[j][0] += t0[0], acc[j][1] += t0[1], acc[j + 1][0] += t1[0], acc[j + 1][1] += t1[1];
            if (sb == sq) acc[j][2] += t0[2], acc[j][3] += t0[3], acc[j + 1][2] += t1[2], acc[j + 1][3] += t1[3];
          }
        }
        return;
      }
#pragma unroll
      for (int j = 0; j < kFusedP / 8; j += 2) {
        uint32_t bf[4];
        ssd_ldsm_x4_t(bf, sX + (s0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kLdX + j * 8 + (lane >> 4) * 8);
        ssd_mma16816<T>(acc[j], pf, bf[0], bf[1]);
        ssd_mma16816<T>(acc[j + 1], pf, bf[2], bf[3]);
      }
    };
    if constexpr (CB) {
      // the table's tiles (mtile, 0..mtile), the next tile's loads in flight while this one
      // is consumed (two tiles ahead spilled; four ahead by cp.async into the warp's C tile
      // made the kernel 12 % slower at N = 256 and 40 % at N = 128: BENCHMARKS.md, the
      // seventy-first session)
      const float* row = cb_chunk + (mtile * (mtile + 1) / 2) * 256;
      auto fetch = [&](float (&v)[2][4], int st) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          *reinterpret_cast<float4*>(v[nt]) = __ldg(reinterpret_cast<const float4*>(row + st * 256 + nt * 128));
      };
      float cur[2][4], nxt[2][4];
      // fused_pdl: the table's kernel has completed, its writes visible. Every launch has a
      // warp here (warp 0's first tile is in every chunk), so this grid's completion, which
      // the stream's next kernel waits for, also implies the table kernel's
      grid_dependency_wait();
      fetch(cur, st0);
      for (int st = st0; st <= mtile; st += 2) {
        if (st + 1 <= mtile) fetch(nxt, st + 1);
        consume(cur, st * 16);
        if (st + 1 > mtile) break;
        if (st + 2 <= mtile) fetch(cur, st + 2);
        consume(nxt, st * 16 + 16);
      }
    } else {
      // C·Bᵀ per step, STEPS steps at a time (two independent chains keep the tensor cores
      // busier)
      // (STEPS as an integral_constant: a lambda's template parameter list is C++20, and
      // torch's extension builds may compile this file as C++17)
      auto steps = [&](auto steps_c, int s_first) {
        constexpr int STEPS = decltype(steps_c)::value;
        float cb[STEPS][2][4];
#pragma unroll
        for (int u = 0; u < STEPS; ++u)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) cb[u][nt][0] = cb[u][nt][1] = cb[u][nt][2] = cb[u][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kNT; ++kk) {
#pragma unroll
          for (int u = 0; u < STEPS; ++u) {
            uint32_t bf[4];
            ssd_ldsm_x4(bf, sB + (s_first + u * 16 + (lane >> 4) * 8 + (lane & 7)) * kLdN + kk * 16 +
                                ((lane >> 3) & 1) * 8);
            ssd_mma16816<T>(cb[u][0], cf[kk], bf[0], bf[1]);
            ssd_mma16816<T>(cb[u][1], cf[kk], bf[2], bf[3]);
          }
        }
#pragma unroll
        for (int u = 0; u < STEPS; ++u) consume(cb[u], s_first + u * 16);
      };
      int s0 = st0 * 16;
      for (; s0 + 16 <= r0; s0 += 32) steps(std::integral_constant<int, 2>{}, s0);
      if (s0 <= r0) steps(std::integral_constant<int, 1>{}, s0);
    }
    // epilogue: rows ta and tb, columns j·8 + 2·q4 (+1)
    if (zs) {  // this pass's z tile (pass 0: the next pass's C rows may still be in flight)
      if (pass == 0)
        ssd_cp_async_wait<1>();
      else
        ssd_cp_async_wait<0>();
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kFusedP / 8; j += 2) {
        uint32_t m[4];
        ssd_ldsm_x4(m, sZw + ssd_stage_lane_at(lane, j));
        zr[0][j] = m[0], zr[1][j] = m[1], zr[0][j + 1] = m[2], zr[1][j + 1] = m[3];
      }
    } else if constexpr (CB) {
      load_z();
    }
    // YS: y_pre and y through the warp's staging tile (ZS: its z tile; SPLIT: its C tile, in
    // registers since c_h), stored 16 bytes a lane
    constexpr bool YS = ZS || SPLIT;
    if (YS && p.y_stage) {
      uint32_t pre[2][kFusedP / 8], yo[2][kFusedP / 8];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = half == 0 ? ta : tb;
#pragma unroll
        for (int j = 0; j < kFusedP / 8; ++j) {
          const int col = j * 8 + 2 * q4;
          const FusedOutPair o = fused_out_pair<T>(p, tile, col, acc[j][2 * half], acc[j][2 * half + 1],
                                                   *reinterpret_cast<const uint32_t*>(sX + t * kLdX + col),
                                                   zr[half][j], dt_in.D);
          pre[half][j] = o.pre;
          yo[half][j] = o.y;
        }
      }
      T* stage = ZS ? sZw : sCw;
      if (p.y_pre != nullptr) store_tile_staged(p, tile, stage, p.y_pre, pre, r0, len, lane);
      store_tile_staged(p, tile, stage, p.y, yo, r0, len, lane);
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = half == 0 ? ta : tb;
        if (t >= len) continue;
#pragma unroll
        for (int j = 0; j < kFusedP / 8; ++j) {
          const int col = j * 8 + 2 * q4;
          fused_store_out<T>(p, tile, t, col, acc[j][2 * half], acc[j][2 * half + 1],
                             *reinterpret_cast<const uint32_t*>(sX + t * kLdX + col), zr[half][j], dt_in.D);
        }
      }
    }
    if (!SHARE && SPLIT && p.y_stage && pass == 0 && 2 * kFusedWarps - 1 - warp < mtiles)
      load_c_rows((2 * kFusedWarps - 1 - warp) * 16, tile.n0);
  }
}

// NS: the plan's state tile; the blocks of a tile of 256 take it in two halves of 128
// (SPLIT in ssd_fused_forward_kernel).
template <typename T, int NS, bool CB>
void launch_fused(const SsdChunkScanLaunch& l, cudaStream_t stream) {
  const FusedParams p = fused_params(l, stream);
  constexpr bool kSplit = NS > 128;
  constexpr int kNs = kSplit ? 128 : NS;
  if constexpr (CB) {
    constexpr bool rows = NS <= 128;
    const int64_t smem = rows ? (64 + kFusedQ) * (NS + 8) * 2 : kCbPairSmem;
    fused_allow_smem(ssd_fused_cb_kernel<T, NS>, smem);
    const int64_t blocks = l.batch * l.nchunks() * l.groups * (rows ? kFusedQ / 64 : kCbPairs);
    ssd_fused_cb_kernel<T, NS>
        <<<static_cast<unsigned int>(blocks), rows ? kCbThreads : kCbPairThreads, smem, stream>>>(p);
    check_launch("ssd_chunk_scan");
  }
  const bool seq = l.seq_idx != nullptr;
  const int64_t smem = ssd_fused_smem_bytes(l.cuda_forward, kNs, seq);
  const int64_t blocks = fused_chains(l) * p.nchunks;
  const auto launch = [&](auto kernel) {
    fused_allow_smem(kernel, smem);
    if (l.fused_pdl)  // (FusedMmaCb only, fused_check_launch: after the table kernel)
      launch_programmatic(kernel, static_cast<unsigned int>(blocks), kFusedThreads, smem, stream, p);
    else
      kernel<<<static_cast<unsigned int>(blocks), kFusedThreads, smem, stream>>>(p);
  };
  if (kSplit && l.fused_split_share) {
    if (seq)
      launch(ssd_fused_forward_kernel<T, kNs, CB, true, kSplit, kSplit>);
    else
      launch(ssd_fused_forward_kernel<T, kNs, CB, false, kSplit, kSplit>);
  } else if (seq) {
    launch(ssd_fused_forward_kernel<T, kNs, CB, true, kSplit>);
  } else {
    launch(ssd_fused_forward_kernel<T, kNs, CB, false, kSplit>);
  }
  check_launch("ssd_chunk_scan");
}

}  // namespace
}  // namespace cuda

size_t ssd_chunk_scan_cuda_fused_forward_workspace(const SsdChunkScanLaunch& l) {
  return cuda::fused_workspace_bytes(l);
}

void ssd_chunk_scan_cuda_fused_forward(const SsdChunkScanLaunch& l, void* stream) {
  using namespace cuda;
  const bool cb = l.cuda_forward == SsdCudaForward::FusedMmaCb;
  fused_check_launch(l, cb ? SsdCudaForward::FusedMmaCb : SsdCudaForward::FusedMma);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_half(l.element, "ssd_chunk_scan", [&](auto tag) {
    using T = decltype(tag);
    if (cb)
      l.fused_state_tile == 256   ? launch_fused<T, 256, true>(l, s)
      : l.fused_state_tile == 128 ? launch_fused<T, 128, true>(l, s)
                                  : launch_fused<T, 64, true>(l, s);
    else
      l.fused_state_tile == 128 ? launch_fused<T, 128, false>(l, s) : launch_fused<T, 64, false>(l, s);
  });
}

}  // namespace baracuda::kernels
