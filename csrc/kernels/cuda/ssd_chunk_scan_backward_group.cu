// Mamba-2 SSD chunk scan backward, the intra-chunk dB and dC products once per group
// (SsdChunkScanLaunch::group_products; the plan's "group_mma" backward). With the
// notation of ssd_chunk_scan.cuh, the intra-chunk terms of dC and dB are
//   dC_q += Σ_{s <= q} dCB[q][s]·B_s,   dB_s += Σ_{q >= s} dCB[q][s]·C_q,
//   dCB[q][s] = Σ_{h ∈ g} (dy_q·x_s)·exp(Acs_q − Acs_s)·dt_s     (s <= q; dy_q, x_s of head h)
// The per-head kernels (ssd_tc_scan_kernel's DC and DB modes) form each head's 64 × 64
// weight tile, round it to the input type and multiply it with B or C (N columns) per
// head, and compute dy·xᵀ twice (once for each gradient). Summing the weights over the
// group's heads first costs one K = head_dim product per head and tile pair, and the
// N-wide products run once per group: at the Mamba-2 2.7B shape (80 heads, 1 group) that
// removes 79 of every 80 of them. mamba_ssm's backward factors the same way
// (`_chunk_scan_bwd_dcb`, then `_bmm_chunk_bwd`).
//
//   ssd_group_dcb_kernel    block per (b, g, c, tile pair ti >= tj) of 64 × 64 tiles:
//                           dCB's tile (rows q of tile ti, columns s of tile tj), summed
//                           over the group's heads in head order in float32 registers
//                           (the next head's dy and x tiles copied by cp.async during the
//                           products, and the Acs and dt of the head after it; with one
//                           head a block, dcb_overlap, its tiles during C·Bᵀ), written to
//                           the workspace (zeros where s > q or outside the chunk; rounded
//                           to the input type there when the group's heads are one split);
//                           and each head's partials of the crossing sums X_s (see the
//                           kernel), which the finalize kernel adds up
//                           (the per-head ssd_tc_dacs_kernel does not run)
//                           It also stores the pair's C·Bᵀ tile (float32, transposed) for
//                           the dx kernel.
//   ssd_group_dx_kernel     block per (b, g, c, up to 4 of the group's heads, 64-row tile,
//                           64-column tile of head_dim): dx from those B·Cᵀ tiles (read
//                           into registers; no per-head products and no shared-memory
//                           cache of them), the inter-chunk term from the state tile (Gn_c
//                           in the input type: gstates_t), and the ddt partials; a stage per (head, column tile)
//                           with the next stage's copies in flight
//   ssd_group_grad_kernel   block per (b, g, c, 64-row tile, 64-column tile of N), for dC
//                           (rows q) or dB (rows s), whole: dCB (rounded to the input
//                           type, as mamba_ssm rounds its dCB) times B or C, plus the
//                           inter-chunk term over the group's heads in order (each head's
//                           rows times its state tile in the input type: states_t or
//                           gstates_t, the next head's tiles copied during the products); dC also
//                           writes each head's U partial. group_wgmma (the plan's
//                           choice on Hopper): the per-head products on wgmma (sm_90a)
//                           from 128-byte swizzled tiles
// Determinism: every sum has an order fixed by the shapes (heads in order, k-steps in
// order); no atomics.
// Non-finite values: as the other tensor-core kernels, a diagonal tile's products run
// over whole 16-position k-steps, so a NaN or Inf in B, C (or in dy, x through dCB) can
// also reach up to 15 other positions of its 16-position block.
#include "kernels/cuda/side_stream.cuh"
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"
#include "kernels/cuda/ssd_wgmma.cuh"

namespace baracuda::kernels::cuda {
namespace {

// The row stride of an N = 128 tile of C, B or chunk-state rows (NP + 8, as
// SsdGroupDcbParams::ldn and SsdGroupDxParams::ld set it), for the products that take
// their k-steps at compile time there.
constexpr int kLdN128 = 2 * kSsdTile + 8;

// Sums each of 16 values over the 8 lanes that share lane % 4 (lane bits 2..4) by halving:
// at each step (partners lane ^ 4, then ^ 8, then ^ 16) a lane gives away half of its
// values and adds its partner's half to the other: 14 shuffles, where a xor tree a value
// takes 48. Each sum is the xor tree's over 4, 8, 16, bit for bit (the same pairs added in
// the same order). The lane is left with the sums of values 2·r and 2·r + 1 in v[0], v[1],
// r = ssd_scatter_slot(lane): lane / 4's three bits reversed.
template <int M, int Held>  // partner lane ^ M; values held, the first half kept
__device__ __forceinline__ void ssd_halve_over(float (&v)[16], int lane) {
  constexpr int kHalf = Held / 2;
  const bool up = (lane & M) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float give = up ? v[i] : v[i + kHalf], keep = up ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, give, M);
  }
}
__device__ __forceinline__ void ssd_reduce_scatter16(float (&v)[16], int lane) {
  ssd_halve_over<4, 16>(v, lane);
  ssd_halve_over<8, 8>(v, lane);
  ssd_halve_over<16, 4>(v, lane);
}
__device__ __forceinline__ int ssd_scatter_slot(int lane) {
  const int g8 = lane / 4;
  return ((g8 & 1) << 2) | (g8 & 2) | (g8 >> 2);
}

// Scans over a warp's 32 lanes in a fixed order (Hillis–Steele steps; each lane ends with
// its sum): the exclusive prefix sum (lane 0: 0) and the inclusive suffix sum. (The total,
// in every lane: ssd_sum32.)
__device__ __forceinline__ float ssd_warp_scan_excl(float v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  const float ex = __shfl_up_sync(0xffffffffu, v, 1);
  return lane == 0 ? 0.0f : ex;
}
__device__ __forceinline__ float ssd_warp_suffix_incl(float v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float down = __shfl_down_sync(0xffffffffu, v, d);
    if (lane + d < 32) v += down;
  }
  return v;
}

template <typename T>
struct SsdGroupDcbParams {
  int64_t batch, seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int P, KP, ld;     // head_dim, rounded up to the k-step, shared-memory row stride
  int N, NP, ldn;    // state_dim, rounded up, row stride of the C and B tiles
  int pairs, qp;     // tile pairs per chunk; Q' (dCB's row length)
  int64_t nsplit, hps;  // head splits (SsdChunkScanLaunch::dcb_splits), heads per split
  SsdOperand<T> x, dy, B, C;
  const double* acs;
  const float* dtf;
  float* dcb;        // [nsplit, B, G, nc, Q', Q']: each split's partial sum (nsplit > 1)
  T* dcb_t;          // [B, G, nc, Q', Q']: with one split, the sum rounded to T, stored here
  float* xin;        // [B, H, nc, pairs, 64]: the pair's crossing sums at its column positions
  float* xsuf;       // [B, H, nc, pairs, 64]: suffix sums of the pair's row sums
  float* cbt;        // [B, G, nc, pairs, 64, 64]: the pair's C·Bᵀ tile transposed, [s][q]
  const int32_t* seg = nullptr;  // [B, L] starts counts (SEG), or null
  bool factored = false;  // SsdChunkScanLaunch::factored_decays
};

// The crossing sums X_s of the stable da (ssd_chunk_scan.cuh) come from the same pass:
// with T[q][s'] = (C_q·B_s')·M_h[q][s'] for s' < q (the tile's C·Bᵀ computed once per
// block, in float32 from exact operands), X_s = Σ_{q >= s} Σ_{s' < s} T[q][s'] splits
// over the tile pairs (q in tile ti, s' in tile tj) into
//   xin[pair][s − c0]  = Σ_{q >= s} Σ_{c0 <= s' < s} T[q][s']   (s in tile tj: the row
//                        prefix sums of T, masked to q >= s and summed down the columns,
//                        as mamba_ssm's _chunk_scan_bwd_ddAcs_stable does per row block)
//   xsuf[pair][q − r0] = Σ_{q' >= q} Σ_{s' in tj} T[q'][s']     (for s in tiles after tj)
// which the finalize kernel (ssd_chunk_scan.cuh) adds up per position in a fixed order.
// Every T is added once per X_s it belongs to: no cancelling subtraction.
// 3 blocks per multiprocessor (up to 168 registers): at 4 (128 registers) the loop counter
// and loaded values spilled, and at the 2.7B shape (2560 blocks: 4 head splits) dCB took
// 582-583 µs against 535 at 3 (H200, same build).
// SEG (packed sequences: p.seg): M and T are selected to 0 across a start (a tile pair that
// holds one takes the masked epilogue), and each position's decay is relative to a
// position of its own sequence (ssd_log2_seq).
// OVL (SsdChunkScanLaunch::dcb_overlap; one head a block): one buffer of dy and x tiles,
// the C and B rows after it, and the head's tiles copied with the C and B rows, so that
// they arrive during C·Bᵀ (ssd_group_dcb_smem_bytes).
template <typename T, bool SEG = false, bool OVL = false>
__global__ void __launch_bounds__(kTcThreads, 3) ssd_group_dcb_kernel(const SsdGroupDcbParams<T> p) {
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  const int tile_elems = kSsdTile * p.ld;
  T* sDy = reinterpret_cast<T*>(ssd_dyn_smem);  // [2][64][ld] (OVL: [64][ld]): q rows of dy, per head buffer
  T* sX = sDy + (OVL ? 1 : 2) * tile_elems;     // [2][64][ld] (OVL: [64][ld]): s rows of x
  // [64][ldn] C rows (q), before the heads (OVL: beside them)
  T* sC = OVL ? sX + tile_elems : reinterpret_cast<T*>(ssd_dyn_smem);
  T* sB = sC + kSsdTile * p.ldn;                // and [64][ldn] B rows (s)
  // decays in base 2 relative to the column tile's last position (ssd_log2_rel)
  __shared__ float sRowL[2][kSsdTile], sColL[2][kSsdTile], sColDt[2][kSsdTile];
  // `full` pairs: the weights' row factors 2^sRowL and column factors 2^−sColL·dt;
  // `diag` pairs: sColW only, each column's factor relative to its 16-column block's last
  // position
  __shared__ float sRowF[2][kSsdTile], sColW[2][kSsdTile];
  __shared__ __align__(16) float sXcol[2][kTcThreads / 32][kSsdTile];  // per warp: Σ_q of the masked row prefixes
  __shared__ float sRowT[2][kSsdTile];                   // the row sums of T
  // a head's Acs at the rows, then the columns, and dt at the columns, as `fetch` copies them
  __shared__ double sRawA[2][2 * kSsdTile];
  __shared__ float sRawDt[2][kSsdTile];
  __shared__ int sRowSeg[SEG ? kSsdTile : 1], sColSeg[SEG ? kSsdTile : 1];  // SEG: the starts counts
  static_assert(sizeof(sRowL) + sizeof(sColL) + sizeof(sColDt) + sizeof(sRowF) + sizeof(sColW) + sizeof(sXcol) +
                        sizeof(sRowT) + sizeof(sRawA) + sizeof(sRawDt) + sizeof(sRowSeg) + sizeof(sColSeg) <=
                    kSsdGroupDcbStaticSmem,
                "the plan's dcb_overlap counts kSsdGroupDcbStaticSmem bytes of static shared memory");
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const bool narrow = ssd_narrow(p.total_blocks);
    int64_t rest = vb;
    const int64_t split = ssd_peel(rest, p.nsplit, narrow);
    const int pair = static_cast<int>(ssd_peel(rest, p.pairs, narrow));
    int ti, tj;
    ssd_tile_pair(pair, ti, tj);
    const int64_t c = ssd_peel(rest, p.nchunks, narrow);
    const int64_t g = ssd_peel(rest, p.groups, narrow), b = rest;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = ti * kSsdTile, c0 = tj * kSsdTile;
    if (r0 >= len) continue;  // a tile past the end of the last (short) chunk: never read
    const int rows = min(kSsdTile, len - r0), cols = min(kSsdTile, len - c0);
    if (ssd_seg_skip<SEG>(p.seg ? p.seg + b * p.seqlen + t0 : nullptr, c0, r0 + rows - 1)) continue;
    const bool live = rw < rows;
    const int hi_np = ti == tj ? warp + 1 : 4;  // column pairs holding s <= q for the warp's rows
    const int32_t* seg = SEG ? p.seg + b * p.seqlen + t0 : nullptr;
    // (block-uniform; SEG: and one sequence, the counts growing with the position. The SEG
    // kernel now takes only pairs that hold a start (ssd_seg_skip), so there it is never
    // true; compiled out, `!SEG && ...`, ptxas spilled 168 bytes instead of 72, sm_90a.)
    // (and factored_decays: the weights factor, ssd_chunk_scan_tc.cuh's "factored weights")
    const bool full =
        p.factored && ti > tj && rows == kSsdTile && cols == kSsdTile && (!SEG || seg[c0] == seg[r0 + rows - 1]);
    // A whole diagonal pair (factored_decays; never in SEG, whose pairs all hold a start):
    // warp w's 16 rows lie after every column of the 16-column blocks before its own, so
    // those blocks take `full`'s epilogue with the factors through each block's last
    // position e (row factor 2^(a_q − a_e), column factor 2^(a_e − a_s)·dt_s: both <= 1, as
    // the fused forwards' steps before a row's own), only the warp's own diagonal block
    // takes the masked one, and the blocks after it are skipped. Where every warp took
    // the masked epilogue over all 64 columns, warp 3 (the block's pace, a barrier a head)
    // now runs 2 of its 8 column steps masked.
    const bool diag = !SEG && p.factored && ti == tj && rows == kSsdTile;
    // Whole tiles of 16-byte groups in every head (64 rows and columns, head_dim a multiple
    // of 16, unit inner strides, 16-byte aligned bases and strides): `load` issues each
    // thread's copies straight from its first group's address, without tc_fill's checks
    // and index arithmetic.
    const bool fast = rows == kSsdTile && cols == kSsdTile && p.KP == p.P && kTcThreads % (p.KP / 8) == 0 &&
                      p.dy.s[3] == 1 && p.x.s[3] == 1 &&
                      (p.dy.s[0] | p.dy.s[1] | p.dy.s[2] | p.x.s[0] | p.x.s[1] | p.x.s[2]) % 8 == 0 &&
                      (reinterpret_cast<uintptr_t>(p.dy.p) | reinterpret_cast<uintptr_t>(p.x.p)) % 16 == 0;
    const int64_t h0 = g * p.hpg + split * p.hps;
    const int nh = static_cast<int>(min(p.hps, p.hpg - split * p.hps));
    // Head hi's row and column data into buffer hi & 1 (threads 0..63) from the Acs and dt
    // that `fetch` copied into the same slot of sRaw.
    auto convert = [&](int buf) {
      if (tid < kSsdTile) {
        auto col = [&](int j) { return sRawA[buf][kSsdTile + j]; };
        const double ref = col(cols - 1);
        const double ra = tid < rows ? sRawA[buf][tid] : 0.0;
        const double ca = tid < cols ? col(tid) : 0.0;
        if constexpr (SEG) {  // (the counts were stored before the pair's first barrier)
          const int seg_ref = sColSeg[cols - 1];
          sRowL[buf][tid] = tid < rows ? ssd_log2_seq(ra, sRowSeg[tid], ref, seg_ref) : 0.0f;
          sColL[buf][tid] = tid < cols ? ssd_log2_seq(ca, sColSeg[tid], ref, seg_ref) : 0.0f;
        } else {
          sRowL[buf][tid] = tid < rows ? ssd_log2_rel(ra, ref) : 0.0f;
          sColL[buf][tid] = tid < cols ? ssd_log2_rel(ca, ref) : 0.0f;
        }
        sColDt[buf][tid] = tid < cols ? sRawDt[buf][tid] : 0.0f;
        if (!SEG && full) {  // (every row and column inside the chunk; never true in SEG)
          sRowF[buf][tid] = ssd_exp2(sRowL[buf][tid]);
          sColW[buf][tid] = ssd_exp2(-sColL[buf][tid]) * sColDt[buf][tid];
        } else if (!SEG && diag) {  // (the block's last position e's value, as sColL has it)
          const float le = ssd_log2_rel(col(tid | 15), ref);
          sColW[buf][tid] = ssd_exp2(le - sColL[buf][tid]) * sColDt[buf][tid];
        }
      }
    };
    // Copies head h's Acs (rows, then columns) and dt (columns) into slot (h − h0) & 1 of
    // sRaw, in the thread's current cp.async group (threads 0..63). The loop over the heads
    // runs it two heads ahead, so that warps 0 and 1 (and the block, at its next barrier)
    // no longer wait on loads consumed at once (H100, 2.7B shape: dCB 576.9 and 596.1 µs
    // against 599.0 and 597.9 with those loads, two runs).
    auto fetch = [&](int64_t h) {
      if (tid < kSsdTile) {
        const int64_t at = (b * p.heads + h) * p.seqlen + t0;
        const int slot = static_cast<int>(h - h0) & 1;
        if (tid < rows) ssd_cp_async_ca<8>(&sRawA[slot][tid], p.acs + at + r0 + tid);
        if (tid < cols) {
          ssd_cp_async_ca<8>(&sRawA[slot][kSsdTile + tid], p.acs + at + c0 + tid);
          ssd_cp_async_ca<4>(&sRawDt[slot][tid], p.dtf + at + c0 + tid);
        }
      }
    };
    // Copies head h's dy rows and x rows into buffer `buf`.
    auto load = [&](int64_t h, int buf) {
      if (fast && p.KP == kSsdTile) {
        // head_dim 64: a row's 8 groups, 16 rows a pass, the row stride kTcLd (a division
        // by the runtime group count a head before)
        constexpr int kGroups = kSsdTile / 8, kDr = kTcThreads / kGroups;
        const int r = tid / kGroups, k = (tid % kGroups) * 8;
        const T* dyp = p.dy.p + b * p.dy.s[0] + (t0 + r0 + r) * p.dy.s[1] + h * p.dy.s[2] + k;
        const T* xp = p.x.p + b * p.x.s[0] + (t0 + c0 + r) * p.x.s[1] + h * p.x.s[2] + k;
        T* dd = sDy + buf * (kSsdTile * kTcLd) + r * kTcLd + k;
        T* xd = sX + buf * (kSsdTile * kTcLd) + r * kTcLd + k;
#pragma unroll
        for (int i = 0; i < kSsdTile / kDr; ++i) {
          ssd_cp_async16(dd + i * kDr * kTcLd, dyp + i * kDr * p.dy.s[1]);
          ssd_cp_async16(xd + i * kDr * kTcLd, xp + i * kDr * p.x.s[1]);
        }
      } else if (fast) {
        const int groups = p.KP / 8, r = tid / groups, k = (tid - r * groups) * 8, dr = kTcThreads / groups;
        const T* dyp = p.dy.p + b * p.dy.s[0] + (t0 + r0 + r) * p.dy.s[1] + h * p.dy.s[2] + k;
        const T* xp = p.x.p + b * p.x.s[0] + (t0 + c0 + r) * p.x.s[1] + h * p.x.s[2] + k;
        T* dd = sDy + buf * tile_elems + r * p.ld + k;
        T* xd = sX + buf * tile_elems + r * p.ld + k;
        for (int i = r; i < kSsdTile; i += dr) {
          ssd_cp_async16(dd, dyp);
          ssd_cp_async16(xd, xp);
          dd += dr * p.ld, xd += dr * p.ld, dyp += dr * p.dy.s[1], xp += dr * p.x.s[1];
        }
      } else {
        const T* dyp = p.dy.p + b * p.dy.s[0] + (t0 + r0) * p.dy.s[1] + h * p.dy.s[2];
        const T* xp = p.x.p + b * p.x.s[0] + (t0 + c0) * p.x.s[1] + h * p.x.s[2];
        tc_fill<T, true>(sDy + buf * tile_elems, p.ld, kSsdTile, p.KP, dyp, p.dy.s[1], p.dy.s[3], rows, p.P);
        tc_fill<T, true>(sX + buf * tile_elems, p.ld, kSsdTile, p.KP, xp, p.x.s[1], p.x.s[3], cols, p.P);
      }
    };
    // Head hh's X partials from the warps' shared sums, a position each for threads 0..63,
    // which store them (the others compute alike and store nothing, so that the scans'
    // shuffles run with every warp whole): warps 0 and 1 (2 and 3 repeat them) scan their 32
    // positions, warp 1 taking warp 0's total (and warp 0 warp 1's) as a xor tree of its own
    // over the other half's values.
    auto flush = [&](int hh) {
      const int pb = hh & 1, n = tid & (kSsdTile - 1);
      const int64_t at = (((b * p.heads + h0 + hh) * p.nchunks + c) * p.pairs + pair) * kSsdTile;
      const bool low = n < 32;
      float xin = 0.0f;
      if (full) {
        // sXcol holds the warps' column sums of T: xin at position c0 + n is the sum of
        // columns 0 .. n − 1 (every row of a whole pair lies after every column)
        float cs = 0.0f, other = 0.0f;
#pragma unroll
        for (int w = 0; w < kTcThreads / 32; ++w) cs += sXcol[pb][w][n], other += sXcol[pb][w][n ^ 32];
        const float lower = ssd_warp_scan_excl(cs, lane);
        const float below = ssd_sum32(other);  // (the upper warp: the sum of columns 0..31)
        xin = low ? lower : below + lower;
      } else if (n > 0) {
        // column n's masked prefix sums belong to position c0 + n + 1
#pragma unroll
        for (int w = 0; w < kTcThreads / 32; ++w) xin += sXcol[pb][w][n - 1];
      }
      // the suffix sums of the row sums, positions n .. 63
      const float upper = ssd_warp_suffix_incl(sRowT[pb][n], lane);
      const float above = ssd_sum32(sRowT[pb][n ^ 32]);  // (the lower warp: the sum of rows 32..63)
      if (tid < kSsdTile) {
        p.xin[at + n] = xin;
        p.xsuf[at + n] = low ? upper + above : upper;
      }
    };

    __syncthreads();  // the previous virtual block is done with shared memory
    if (SEG && tid < kSsdTile) {  // (-1, -2 past the chunk: no pair there is one sequence)
      sRowSeg[tid] = tid < rows ? seg[r0 + tid] : -1;
      sColSeg[tid] = tid < cols ? seg[c0 + tid] : -2;
    }
    fetch(h0);
    ssd_cp_async_commit();
    // C·Bᵀ of the tile pair, once for all heads (float32, exact operands); the C and B rows
    // by cp.async (plain loads and stores held each STS.128 on its load: 4 % of the
    // kernel's stall samples, ncu, H100, the 2.7B shape)
    tc_fill<T, true>(sC, p.ldn, kSsdTile, p.NP, p.C.p + b * p.C.s[0] + (t0 + r0) * p.C.s[1] + g * p.C.s[2],
                     p.C.s[1], p.C.s[3], rows, p.N);
    tc_fill<T, true>(sB, p.ldn, kSsdTile, p.NP, p.B.p + b * p.B.s[0] + (t0 + c0) * p.B.s[1] + g * p.B.s[2],
                     p.B.s[1], p.B.s[3], cols, p.N);
    ssd_cp_async_commit();
    if constexpr (OVL) {  // the head's tiles in a group of their own, waited for in the loop
      load(h0, 0);
      ssd_cp_async_commit();
      ssd_cp_async_wait<1>();
    } else {
      ssd_cp_async_wait<0>();
    }
    __syncthreads();
    convert(0);
    float cb[8][4];
    tc_zero(cb);
    if (live) {
      // (N = 128: the k-steps and row stride known here)
      if (p.NP == 2 * kSsdTile)
        tc_warp_gemm_ks<T, 2 * kSsdTile / 16>(cb, sC + rw * kLdN128, kLdN128, sB, kLdN128, hi_np);
      else
        tc_warp_gemm<T, false, false>(cb, sC + rw * p.ldn, p.ldn, sB, p.ldn, p.NP / 16, 0, hi_np);
    }
    if (split == 0) {  // for the dx kernel: B_s·C_q at [s][q] (zeros where nothing was computed)
      float* tile = p.cbt + (((b * p.groups + g) * p.nchunks + c) * p.pairs + pair) * (kSsdTile * kSsdTile);
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) tile[(nt * 8 + 2 * t4 + e) * kSsdTile + rw + g8 + 8 * half] = cb[nt][2 * half + e];
    }
    float acc[8][4];
    tc_zero(acc);
    if constexpr (!OVL) {
      __syncthreads();  // the C and B tiles are done before the heads' copies reuse the space
      load(h0, 0);
      if (nh > 1) fetch(h0 + 1);
      ssd_cp_async_commit();
    }
    // One barrier a head: after it, every warp is done with head hi − 1 (its tiles, row
    // data and X sums in buffer buf ^ 1), so head hi + 1's copies go there only then, and
    // head hi − 1's X sums are visible to flush.
    for (int hi = 0; hi < nh; ++hi) {
      const int buf = hi & 1;
      ssd_cp_async_wait<0>();  // head hi's tiles and head hi + 1's Acs and dt (the only group in flight)
      __syncthreads();
      if (hi + 1 < nh) load(h0 + hi + 1, buf ^ 1);
      if (hi + 2 < nh) fetch(h0 + hi + 2);  // (into slot buf: head hi's, converted)
      ssd_cp_async_commit();
      if (hi + 1 < nh) convert(buf ^ 1);  // (head hi + 1's copies waited for above)
      if (hi > 0) flush(hi - 1);
      float m[8][4];
      tc_zero(m);
      float rowtot[2] = {0.0f, 0.0f};
      // M (into acc) and T (in place of m), then T's inclusive row prefix sums in column
      // order (8-column steps: the quad's pair sums scanned across its lanes). `full`: a
      // whole off-diagonal tile pair, where every row lies after every column, so that
      // path has no per-element selects, its weights are the factors sRowF·sColW
      // (factored_decays; __fmul_rn: no contraction in either path), and it keeps T itself:
      // xin's sums over q of the row prefixes are the prefix sums of T's column sums, which
      // flush scans once a head (64 values) where the row scans took 5 shuffles and about
      // 8 more instructions a lane's pair of values. `diag` (kMode 2): the blocks before
      // the warp's own as `full`, with each block's row factor (T kept, its column sums
      // scanned by the warp below), then its own block masked from the row's sum so far.
      auto epilogue = [&](auto mode_tag) {
        constexpr int kMode = decltype(mode_tag)::value;
        constexpr bool kFull = kMode == 1;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int ql = rw + g8 + 8 * half;
          const float ra = kFull ? sRowF[buf][ql] : sRowL[buf][ql];
          float carry = 0.0f, rf = 0.0f;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            float tv[2];
            if constexpr (kMode == 2) {
              const int jb = nt / 2;  // the 16-column block (warp-uniform branches)
              if (jb < warp) {
                if (nt % 2 == 0) rf = ssd_exp2(ra - sColL[buf][16 * jb + 15]);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const float mv = __fmul_rn(m[nt][2 * half + e], __fmul_rn(rf, sColW[buf][nt * 8 + 2 * t4 + e]));
                  tv[e] = __fmul_rn(cb[nt][2 * half + e], mv);
                  acc[nt][2 * half + e] += mv;
                  m[nt][2 * half + e] = tv[e];
                }
                carry += tv[0] + tv[1];
                continue;
              }
              if (jb > warp) {
                m[nt][2 * half] = m[nt][2 * half + 1] = 0.0f;
                continue;
              }
              if (nt % 2 == 0) carry = ssd_quad_sum(carry);  // the row's sum over the whole blocks
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int sl = nt * 8 + 2 * t4 + e;
              // (kFull: the factors)
              const float w = kFull ? __fmul_rn(ra, sColW[buf][sl]) : ssd_exp2(ra - sColL[buf][sl]) * sColDt[buf][sl];
              float mv;  // selected, not multiplied: masked pairs add exactly nothing
              if constexpr (kFull) {
                mv = __fmul_rn(m[nt][2 * half + e], w);
                tv[e] = __fmul_rn(cb[nt][2 * half + e], mv);
              } else {
                const bool one = !SEG || sRowSeg[ql] == sColSeg[sl];  // (SEG: a pair of one sequence)
                mv = ql < rows && sl < cols && c0 + sl <= r0 + ql && one ? __fmul_rn(m[nt][2 * half + e], w) : 0.0f;
                tv[e] = c0 + sl < r0 + ql && one ? __fmul_rn(cb[nt][2 * half + e], mv) : 0.0f;
              }
              acc[nt][2 * half + e] += mv;
            }
            if constexpr (kFull) {  // T itself: sXcol takes its column sums, flush their prefix
              m[nt][2 * half] = tv[0];
              m[nt][2 * half + 1] = tv[1];
              carry += tv[0] + tv[1];
              continue;
            }
            const float pairsum = tv[0] + tv[1];
            float incl = pairsum;
            float up = __shfl_up_sync(0xffffffffu, incl, 1);
            if (t4 >= 1) incl += up;
            up = __shfl_up_sync(0xffffffffu, incl, 2);
            if (t4 >= 2) incl += up;
            float excl = __shfl_up_sync(0xffffffffu, incl, 1);
            if (t4 == 0) excl = 0.0f;
            const float steptot = __shfl_sync(0xffffffffu, incl, (lane & ~3) | 3);
            const float base = carry + excl;
            const int n0 = nt * 8 + 2 * t4;
            // keep the prefix through column n only where q >= c0 + n + 1 (and n + 1 < 64)
            const float p0 = base + tv[0], p1 = p0 + tv[1];
            m[nt][2 * half] = r0 + ql >= c0 + n0 + 1 && n0 + 1 < kSsdTile ? p0 : 0.0f;
            m[nt][2 * half + 1] = r0 + ql >= c0 + n0 + 2 && n0 + 2 < kSsdTile ? p1 : 0.0f;
            carry += steptot;
          }
          rowtot[half] = kFull ? ssd_quad_sum(carry) : carry;  // (kFull: the lane's own columns)
        }
      };
      if (live) {
        // dy·xᵀ of the warp's rows; head_dim 64 (the Mamba-2 default) with its k-steps and
        // row stride known here. With the loads above, 16 % fewer instructions (ncu) and
        // dCB 580.0 and 581.0 µs against 610.8 and 623.7 (H100, the 2.7B shape, two runs
        // each, same build)
        const T* a_at = sDy + buf * tile_elems + rw * p.ld;
        const T* b_at = sX + buf * tile_elems;
        if (p.KP == kSsdTile) {
          // each warp's own column pairs (a diagonal pair's warp w takes w + 1 of them), the
          // count a constant in each case: no predicates
          switch (hi_np) {
            case 1: tc_warp_gemm_ks<T, kSsdTile / 16>(m, a_at, kTcLd, b_at, kTcLd, 1); break;
            case 2: tc_warp_gemm_ks<T, kSsdTile / 16>(m, a_at, kTcLd, b_at, kTcLd, 2); break;
            case 3: tc_warp_gemm_ks<T, kSsdTile / 16>(m, a_at, kTcLd, b_at, kTcLd, 3); break;
            default: tc_warp_gemm_ks<T, kSsdTile / 16>(m, a_at, kTcLd, b_at, kTcLd, 4); break;
          }
        } else
          tc_warp_gemm<T, false, false>(m, a_at, p.ld, b_at, p.ld, p.KP / 16, 0, hi_np);
        if (full)
          epilogue(std::integral_constant<int, 1>{});
        else if (!SEG && diag)
          epilogue(std::integral_constant<int, 2>{});
        else
          epilogue(std::integral_constant<int, 0>{});
      }
      // column sums of the masked prefixes (`full`: of T) over the warp's 16 rows
      // (ssd_reduce_scatter16: the fixed xor tree's sums, a lane's two columns a float2 store)
      {
        float v[16];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) v[2 * nt] = m[nt][0] + m[nt][2], v[2 * nt + 1] = m[nt][1] + m[nt][3];
        ssd_reduce_scatter16(v, lane);
        *reinterpret_cast<float2*>(&sXcol[buf][warp][8 * ssd_scatter_slot(lane) + 2 * t4]) = make_float2(v[0], v[1]);
        if (!SEG && diag) {
          // the whole blocks' column sums of T become their inclusive prefix sums, the
          // masked prefixes' sums that the masked epilogue would have left there (every row
          // of the warp lies after those columns); a lane's two columns, scanned in order
          __syncwarp();
          float2* col = reinterpret_cast<float2*>(&sXcol[buf][warp][2 * lane]);
          const bool whole = 2 * lane < 16 * warp;
          const float2 cs = whole ? *col : make_float2(0.0f, 0.0f);
          const float p0 = ssd_warp_scan_excl(cs.x + cs.y, lane) + cs.x;
          if (whole) *col = make_float2(p0, p0 + cs.y);
        }
      }
      if (t4 == 0) {
        sRowT[buf][rw + g8] = rowtot[0];
        sRowT[buf][rw + g8 + 8] = rowtot[1];
      }
    }
    ssd_cp_async_wait<0>();
    __syncthreads();  // the last head's X sums are visible
    flush(nh - 1);
    const int64_t at = (((split * p.batch + b) * p.groups + g) * p.nchunks + c) * static_cast<int64_t>(p.qp) * p.qp +
                       static_cast<int64_t>(r0) * p.qp;
    // One split: the sum is whole here, rounded to T as ssd_group_dcb_round_kernel would
    // (the same bits) and stored where the dC and dB kernels read it, with no float32 copy.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = at + static_cast<int64_t>(rw + g8 + 8 * half) * p.qp;
      if (p.nsplit == 1)
        tc_store_row<T>(p.dcb_t + row, c0, p.qp, true, acc, half, 1.0f);
      else
        tc_store_row<float>(p.dcb + row, c0, p.qp, true, acc, half, 1.0f);
    }
  }
}

// Two adjacent 16-bit values at a 4-byte aligned address of shared memory, one 32-bit
// load (a memcpy from the T pointer compiled to four byte loads).
template <typename T>
__device__ __forceinline__ void ssd_smem_pair(T (&out)[2], const T* at) {
  const uint32_t v = *reinterpret_cast<const uint32_t*>(at);
  memcpy(out, &v, 4);
}

// dCB for the dC and dB products: the dCB pass's head-split partials summed in split order
// and rounded to T (as mamba_ssm rounds its dCB), once, so that those kernels copy 16-bit
// tiles by cp.async instead of each summing the float32 partials through registers.
// Only the causal tile pairs (row tile ti >= column tile tj, `pairs` a chunk, pair index
// ti·(ti + 1)/2 + tj): the dCB kernel writes no other tile and the dC and dB kernels read
// none.
// Four elements a thread and step.
template <typename T>
__global__ void __launch_bounds__(256) ssd_group_dcb_round_kernel(const float* dcb, T* out, int64_t n4,
                                                                  int64_t parts, int64_t stride, int qp,
                                                                  int pairs) {
  constexpr int kQuads = kSsdTile / 4;  // a tile row's groups of four
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int q4 = static_cast<int>(i % kQuads), r = static_cast<int>(i / kQuads % kSsdTile);
    const int64_t tile = i / (kQuads * kSsdTile);
    const int64_t unit = tile / pairs;  // (b, g, c)
    int tj = static_cast<int>(tile - unit * pairs), ti = 0;
    while (tj > ti) tj -= ++ti;  // pair index ti·(ti + 1)/2 + tj
    const int64_t at = unit * qp * qp + static_cast<int64_t>(ti * kSsdTile + r) * qp + tj * kSsdTile + 4 * q4;
    float4 v = *reinterpret_cast<const float4*>(dcb + at);
    for (int64_t s = 1; s < parts; ++s) {
      const float4 u = *reinterpret_cast<const float4*>(dcb + at + s * stride);
      v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    uint2 o;
    o.x = ssd_pack2<T>(v.x, v.y);
    o.y = ssd_pack2<T>(v.z, v.w);
    *reinterpret_cast<uint2*>(out + at) = o;
  }
}

// Row stride (floats) of dC's float32 C tile: a warp's 8-byte reads at (row g8, column
// 2·t4) fill both wavefronts without conflicts.
constexpr int kSsdGradCLd = kSsdTile + 8;

template <typename T>
struct SsdGroupGradParams {
  int64_t batch, seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int P, KP, lrow, N, qp, r_tiles, j_tiles;  // lrow: an Lft row's elements (padded; WG: KP rounded up to 64)
  int off_s, off_c;      // byte offsets in dynamic shared memory of the state tiles and dC's C tile (Lft at 0)
  SsdOperand<T> lft;     // dy (dC) or x (dB), per head: the inter-chunk term's rows
  SsdOperand<T> v;       // B (dC) or C (dB), per group: dCB's partner
  SsdOperand<T> dot;     // C (dC's U partials)
  const T* state;        // H_c (dC) or Gn_c (dB) rounded to T, [B, H, nc, P, N] (states_t, gstates_t)
  const double* acs;
  const float* dtf;
  const T* dcb;          // [B, G, nc, Q', Q']: dCB rounded to T (by the dCB kernel with one split,
                         // else ssd_group_dcb_round_kernel)
  float* upart;          // dC: U partials [B, H, L, j_tiles]; null for dB
  T* out;                // dC or dB, [B, L, G, N] contiguous
  const int32_t* seg = nullptr;  // [B, L] starts counts (SEG), or null
};

// dC (DB false; rows q) or dB (DB true; rows s) of one (b, g, c, 64-row tile, 64-column
// tile of N), whole:
//  1. the intra-chunk term: dCB (rounded to T, as mamba_ssm rounds its dCB) times B over
//     the partners s <= q (A = dCB[q][s] as stored), or times C over q >= s (A = dCBᵀ:
//     the stored tile read k-major);
//  2. the inter-chunk term, over the group's heads in order: rs_r·Σ_p Lft_h[r][p]·S_h[p][j]
//     (S = H_c, rs = exp(Acs_r) for dC; S = Gn_c, rs = exp(Acs_last − Acs_r)·dt_r for dB),
//     S as the state pass rounded it to T; dC also writes each head's U partial (its C
//     row dot, from a float32 copy of the block's C tile in shared memory: converted once
//     a block instead of once a head, that dot was a quarter of the kernel's time). A
//     ring of S = ssd_group_grad_stages(DB) buffers (core/ssd_chunk_scan_plan.h): head
//     h + S − 1's Lft rows and state tile are copied (cp.async) during head h's products,
//     and its row scales are loaded into registers then and stored after them (no thread
//     waits for a load that was just issued).
//     WG (group_wgmma, sm_90a): the ring's tiles are 128-byte swizzled (sw128_fill) and the
//     block, one warpgroup, computes a head's 64 x 64 product as KP/16 wgmma steps from
//     shared memory (Lft K-major, the state tile N-major) instead of each warp's 32
//     mma.sync and 20 ldmatrix; the epilogue is the same (wgmma's m64n64 accumulators are
//     laid out as the warps' mma.sync m16n8 tiles).
// SEG (packed sequences: p.seg): dCB's entries across a start are 0 (the dCB kernel), and
// phase 1 multiplies B or C once per sequence where a 16-position step mixes them
// (tc_warp_gemm_seg); phase 2 leaves out (selects) the rows the state does not reach (dC:
// after the chunk's first start; dB: before its last) and their U partials.
template <typename T, bool DB, bool WG, bool SEG = false>
__global__ void __launch_bounds__(kTcThreads, 4) ssd_group_grad_kernel(const SsdGroupGradParams<T> p) {
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  constexpr int S = ssd_group_grad_stages(DB);
  // (WG: the swizzled tiles need 1024-byte alignment; the plan's size has room for it)
  unsigned char* smem = ssd_dyn_smem;
  if constexpr (WG) smem = gmma_align1024(smem);
  const int l_elems = kSsdTile * p.lrow;
  T* sL = reinterpret_cast<T*>(smem);                           // [S][64][lrow] (WG: [S][lrow/64][64][64] swizzled)
  T* sA = sL;                                                   // phase 1: [64][kTcLd]
  T* sV = sL + kSsdTile * kTcLd;                                // phase 1: [64][kTcLd]
  T* sS = reinterpret_cast<T*>(smem + p.off_s);                 // [S][KP][kTcLd] (WG: [S][KP][64] swizzled)
  float* sCf = reinterpret_cast<float*>(smem + p.off_c);        // dC: [64][kSsdGradCLd]
  const int s_elems = WG ? p.KP * kSsdTile : p.KP * kTcLd;
  __shared__ float sScale[S][kSsdTile];  // the rows' rs, per buffer
  // SEG: the starts counts of the rows (-1 past the chunk) and of phase 1's positions (-2),
  // and whether the state misses the row
  __shared__ int sRowSeg[SEG ? kSsdTile : 1], sColSeg[SEG ? kSsdTile : 1];
  __shared__ bool sRowCut[SEG ? kSsdTile : 1];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const bool narrow = ssd_narrow(p.total_blocks);
    int64_t rest = vb;
    const int jt = static_cast<int>(ssd_peel(rest, p.j_tiles, narrow));
    const int rt = static_cast<int>(ssd_peel(rest, p.r_tiles, narrow));
    const int64_t c = ssd_peel(rest, p.nchunks, narrow);
    const int64_t g = ssd_peel(rest, p.groups, narrow), b = rest;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = rt * kSsdTile, j0 = jt * kSsdTile;
    if (r0 >= len) continue;
    const int rows = min(kSsdTile, len - r0);
    const int n_t = (len + kSsdTile - 1) / kSsdTile;
    const bool live = rw < rows;
    float acc[8][4];
    tc_zero(acc);

    // ---- 1. intra-chunk: dCB times B (dC) or C (dB)
    const T* mat = p.dcb + ((b * p.groups + g) * p.nchunks + c) * static_cast<int64_t>(p.qp) * p.qp;
    const T* vbase = p.v.p + b * p.v.s[0] + t0 * p.v.s[1] + g * p.v.s[2];
    const int k_first = DB ? rt : 0, k_last = DB ? n_t - 1 : rt;
    for (int kt = k_first; kt <= k_last; ++kt) {
      __syncthreads();  // the previous step (or virtual block) is done with shared memory
      // dC: dCB[q = rt rows][s = kt cols]; dB: dCB[q = kt rows][s = rt cols] (read k-major)
      // (both tiles by cp.async, in flight together; dCB's tile is whole: zeros where s > q
      // or past the chunk, Q' a multiple of 64)
      const T* src = DB ? mat + static_cast<int64_t>(kt * kSsdTile) * p.qp + r0
                        : mat + static_cast<int64_t>(r0) * p.qp + kt * kSsdTile;
      tc_fill<T, true>(sA, kTcLd, kSsdTile, kSsdTile, src, p.qp, 1, kSsdTile, kSsdTile);
      tc_fill<T, true>(sV, kTcLd, kSsdTile, kSsdTile,
                       vbase + static_cast<int64_t>(kt * kSsdTile) * p.v.s[1] + j0 * p.v.s[3], p.v.s[1], p.v.s[3],
                       min(kSsdTile, len - kt * kSsdTile), p.N - j0);
      const int kcols = min(kSsdTile, len - kt * kSsdTile);
      if (SEG && tid < kSsdTile) {
        const int32_t* seg = p.seg + b * p.seqlen + t0;
        sColSeg[tid] = tid < kcols ? seg[kt * kSsdTile + tid] : -2;
        if (kt == k_first) {  // (the rows' counts, once a block: the block's first barrier is behind)
          const int rs = tid < rows ? seg[r0 + tid] : -1;
          sRowSeg[tid] = rs;
          sRowCut[tid] = rs != (DB ? seg[len - 1] : 0);
        }
      }
      ssd_cp_async_commit();
      ssd_cp_async_wait<0>();
      __syncthreads();
      // The diagonal tile: only the 16-position k-steps with causal partners.
      // A is stored [m][k] (dC) or read k-major (dB); V is [k][n].
      const int lo = kt == rt && DB ? warp : 0, hi = kt == rt && !DB ? warp + 1 : 4;
      const T* a_at = DB ? sA + lo * 16 * kTcLd + rw : sA + rw * kTcLd + lo * 16;
      if (live) {
        // SEG: per sequence only where the warp's rows and the step's positions are not all
        // one (warp-uniform; the counts grow with the position)
        const int w_rows = min(16, rows - rw);
        if (SEG && !(sRowSeg[rw] == sRowSeg[rw + w_rows - 1] && sColSeg[0] == sColSeg[kcols - 1] &&
                     sRowSeg[rw] == sColSeg[0]))
          tc_warp_gemm_seg<T, DB>(acc, a_at, kTcLd, sV + lo * 16 * kTcLd, kTcLd, hi - lo, sRowSeg + rw, w_rows,
                                  sColSeg + lo * 16, kcols - lo * 16);
        else
          tc_warp_gemm<T, DB, true>(acc, a_at, kTcLd, sV + lo * 16 * kTcLd, kTcLd, hi - lo, 0, 4);
      }
    }

    // ---- 2. inter-chunk, head by head
    // dC's U partials: the block's C tile (rows r0.., columns j0..; 0 past the chunk and N)
    // as float32, for all heads (visible after the ring's first barrier).
    if constexpr (!DB) {
      const T* cbase = p.dot.p + b * p.dot.s[0] + (t0 + r0) * p.dot.s[1] + g * p.dot.s[2];
      for (int e = tid; e < kSsdTile * kSsdTile; e += kTcThreads) {
        const int r = e / kSsdTile, k = e % kSsdTile;
        sCf[r * kSsdGradCLd + k] =
            r < rows && j0 + k < p.N ? to_acc(cbase[r * p.dot.s[1] + (j0 + k) * p.dot.s[3]]) : 0.0f;
      }
    }
    const int64_t h0 = g * p.hpg;
    // Copies head hi's Lft rows and state tile S[k = p][j] (rows p >= P and columns past N
    // zero) into buffers hi % S, and (threads below 64: row tid) loads its row data into
    // registers, which store_scale turns into the row's rs.
    double row_acs = 0.0, row_last = 0.0;
    float row_dt = 0.0f;
    auto issue = [&](int hi) {
      const int64_t h = h0 + hi, bh = b * p.heads + h;
      const int buf = hi % S;
      const T* lsrc = p.lft.p + b * p.lft.s[0] + (t0 + r0) * p.lft.s[1] + h * p.lft.s[2];
      const T* ssrc = p.state + (bh * p.nchunks + c) * static_cast<int64_t>(p.P) * p.N + j0;
      if constexpr (WG) {
        sw128_fill<T>(reinterpret_cast<unsigned char*>(sL + buf * l_elems), kSsdTile, p.KP, lsrc, p.lft.s[1],
                      p.lft.s[3], rows, p.P);
        sw128_fill<T>(reinterpret_cast<unsigned char*>(sS + buf * s_elems), p.KP, kSsdTile, ssrc, p.N, 1, p.P,
                      p.N - j0);
      } else {
        tc_fill<T, true>(sL + buf * l_elems, p.lrow, kSsdTile, p.KP, lsrc, p.lft.s[1], p.lft.s[3], rows, p.P);
        tc_fill<T, true>(sS + buf * s_elems, kTcLd, p.KP, kSsdTile, ssrc, p.N, 1, p.P, p.N - j0);
      }
      if (tid < kSsdTile) {
        const int64_t at = bh * p.seqlen + t0;
        row_acs = p.acs[at + r0 + min(tid, rows - 1)];  // (clamped; rows past the chunk get 0 below)
        if constexpr (DB) {
          row_dt = p.dtf[at + r0 + min(tid, rows - 1)];
          row_last = p.acs[at + len - 1];
        }
      }
    };
    auto store_scale = [&](int hi) {
      if (tid < kSsdTile)
        sScale[hi % S][tid] = tid >= rows ? 0.0f
                              : DB        ? ssd_decay<float>(row_last - row_acs) * row_dt
                                          : ssd_decay<float>(row_acs);
    };
    __syncthreads();  // phase 1 is done with sA, sV (the Lft buffers)
#pragma unroll
    for (int hi = 0; hi < S - 1; ++hi) {  // the ring's first heads (empty groups past the last)
      if (hi < p.hpg) {
        issue(hi);
        store_scale(hi);
      }
      ssd_cp_async_commit();
    }
    for (int hi = 0; hi < p.hpg; ++hi) {
      const int buf = hi % S;
      ssd_cp_async_wait<S - 2>();  // head hi's copies (the oldest group in flight)
      if constexpr (WG) fence_proxy_async();  // (this thread's copies and stores, to wgmma)
      __syncthreads();             // ... for every thread; head hi − 1's buffers are free
      const int next = hi + S - 1;
      if (next < p.hpg) issue(next);
      ssd_cp_async_commit();
      // (WG: every warp of the warpgroup takes part in the products; rows past the chunk
      // are zeros in the Lft tile and have rs = 0)
      if (WG || live) {
        float acc_h[8][4];
        if constexpr (WG) {  // (the first step overwrites acc_h: no zeroing to serialize the chain)
          float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc_h[0][0]);
          const unsigned char* la = reinterpret_cast<const unsigned char*>(sL + buf * l_elems);
          const unsigned char* sb = reinterpret_cast<const unsigned char*>(sS + buf * s_elems);
          // k-step kk: the Lft rows (K-major) at columns 16kk.., the state tile (N-major) at rows 16kk..
          wgmma_fence();
          for (int kk = 0; kk < p.KP / 16; ++kk)
            wgmma_ss_n64<T, 0, 1>(d, gmma_sw128_kmajor(la, kSsdTile, 0, kk), gmma_sw128_mnmajor(sb, p.KP, 16 * kk),
                                  kk > 0);
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_fence_regs(d);
        } else {
          tc_zero(acc_h);
          tc_warp_gemm<T, false, true>(acc_h, sL + buf * l_elems + rw * p.lrow, p.lrow, sS + buf * s_elems, kTcLd,
                                       p.KP / 16, 0, 4);
        }
        float u[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int rl = rw + g8 + 8 * half;
          const float scale = sScale[buf][rl];
          const bool cut = SEG && sRowCut[rl];  // (selected: the row keeps phase 1's sum, U is 0)
          float dotv = 0.0f;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            if constexpr (!DB) {
              const float2 cv = *reinterpret_cast<const float2*>(&sCf[rl * kSsdGradCLd + nt * 8 + 2 * t4]);
              dotv += cv.x * acc_h[nt][2 * half] + cv.y * acc_h[nt][2 * half + 1];
            }
            if (!cut) {
              acc[nt][2 * half] = fmaf(acc_h[nt][2 * half], scale, acc[nt][2 * half]);
              acc[nt][2 * half + 1] = fmaf(acc_h[nt][2 * half + 1], scale, acc[nt][2 * half + 1]);
            }
          }
          u[half] = cut ? 0.0f : scale * dotv;
        }
        if constexpr (!DB) {  // U partial of this head, row and column tile (fixed xor tree over the row's 4 lanes)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float s = ssd_quad_sum(u[half]);
            const int r = r0 + rw + g8 + 8 * half;
            if (t4 == 0 && r < len)
              p.upart[((b * p.heads + h0 + hi) * p.seqlen + t0 + r) * p.j_tiles + jt] = s;
          }
        }
      }
      // (buffer next % S was last read at head hi − 1, before this head's barrier)
      if (next < p.hpg) store_scale(next);
    }
    ssd_cp_async_wait<0>();

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0 + rw + g8 + 8 * half;
      if (r >= len) continue;
      T* orow = p.out + ((b * p.seqlen + t0 + r) * p.groups + g) * p.N;
      tc_store_row<T>(orow, j0, p.N, p.N % 2 == 0, acc, half, 1.0f);
    }
  }
}

template <typename T>
struct SsdGroupDxParams {
  int64_t seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int64_t nsplit, hps;  // head splits per group, heads per split
  int P, N, NP, ld, r_tiles, j_tiles, pairs;
  int off_s, off_v, off_x;  // byte offsets in dynamic shared memory (the B rows at 0)
  SsdOperand<T> x, dy, B;
  const double* acs;
  const float* dtf;
  const T* state;      // Gn_c rounded to T [B, H, nc, P, N] (gstates_t)
  const float* cbt;    // [B, G, nc, pairs, 64, 64] (ssd_group_dcb_kernel)
  T* out;              // dx [B, L, H, P] contiguous
  bool out_stage;      // P % 8 == 0 and out 16-byte aligned: dx stored 16 bytes a lane (ssd_store_staged)
  float* part;         // [B, H, L, j_tiles]: x·dxpre
  float* part2;        // [B, H, L, j_tiles]: x·dxpre of the inter-chunk term
  SsdEpilogue<T> epi;  // D·dy_pre (EPI)
  float* dpart;        // DD: dD's partials [B·nc·r_tiles, H, P] (ssd_dD_segments)
  const int32_t* seg = nullptr;  // [B, L] starts counts (SEG), or null
  bool factored = false;  // SsdChunkScanLaunch::factored_decays
};

// dx of one (b, g, c, head split, 64-row tile s, 64-column tile j of head_dim), head by
// head, with the notation of ssd_chunk_scan.cuh:
//   dxpre[s][j] = Σ_{q >= s} (B_s·C_q)·exp(Acs_q − Acs_s)·dy_q[j]
//               + exp(Acs_last − Acs_s)·Σ_n B_s[n]·Gn_c[j][n],     dx = dt_s·dxpre
// (+ D·dy_pre with EPI), and the ddt partials x·dxpre and x·(the inter-chunk term).
// B_s·C_q comes from the dCB pass's tiles (cbt, float32; read straight into registers),
// times the decay, rounded to T and multiplied with dy on mma.sync; the inter-chunk term
// multiplies the block's B rows with the state tile (Gn_c rounded to T by the state pass).
// Pipeline: one "stage" per (head, causal column tile); the next stage's dy tile is
// copied (cp.async) while the current one is multiplied, and the next head's state tile
// right after the current head's inter-chunk product (so during its column tiles). With
// EPI the column tiles run last to first, so that the D term reads dy_pre from the
// diagonal tile's buffer after the loop.
// Every output has one block and a fixed order of products: deterministic.
// x's rows, for the ddt dots, come with the head's state tile into shared memory (two
// buffers, by head parity), read back as 32-bit pairs (ssd_smem_pair): held in registers
// through the column tiles they made the kernel spill. H200, 2.7B shape: dx with D
// 747 -> 680 us, then 648 with the pair loads; plain dx 646 -> 577 in all.
// Blocks an SM: 3 without EPI (168 registers; at 2 it was slower: 646 -> 712 us before the
// x tiles), 2 with it (with the x tiles at 3 it spilled: 725 us against 680; again with the
// staged stores, 96 bytes: 614-616 against 595 on an H100, BENCHMARKS.md).
// DD (with EPI; dD_in_dx, the plan's choice with D) also writes dD's partials Σ_s
// dy_pre[s][j]·x[s][j] over the block's rows (both tiles are in shared memory for the
// epilogue): the lane's two rows, then the 8 lanes of its columns (ssd_reduce_scatter16), the
// warps' sums (sDd, by head parity) added in warp order by threads below 64 after the
// next barrier. 238 → 250 registers, no spills. H200, the 2.7B shape with D and without
// z: dx 650 → 679–684 µs (688 with a xor tree a value), where the gate kernel it spares
// took 96.9 µs to read dy and x.
// SEG (packed sequences: p.seg): the inter-chunk term and its x dot are selected to 0 in
// the rows before the chunk's last start, P across a start, P·dy runs per sequence where a
// step mixes them (tc_warp_pv_seg), and each position's decay is relative to a position of
// its own sequence (ssd_log2_seq).
// WG (SsdChunkScanLaunch::dx_wgmma; sm_90a): P·dy on wgmma (the four warps' P fragments
// from registers, the dy tile from shared memory in the 128-byte swizzle), waited for at
// once (waiting only before the next barrier measured slower: 579-584 against 577-578 µs).
// With D and dD's partials (DD) it runs 3 blocks an SM (168 registers, 72 bytes of stack)
// on one sDd buffer, which head hi's epilogue fills only after the barrier that follows
// flush_dD(hi − 1): H100, the 2.7B shape, dx with D 585-589 against 608-611 µs at 2 blocks
// an SM (246 registers) on two buffers, with D and z 583-588 against 608-612, the same bits.
template <typename T, bool EPI, bool DD, bool SEG = false, bool WG = false>
__global__ void __launch_bounds__(kTcThreads, SEG || (EPI && !(WG && DD)) ? 2 : 3)
    ssd_group_dx_kernel(const SsdGroupDxParams<T> p) {
  static_assert(EPI || !DD, "dD's partials come with the D epilogue");
  static_assert(!WG || !SEG, "WG: P·dy on wgmma, the plain kernels");
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  T* sL = reinterpret_cast<T*>(ssd_dyn_smem);                             // [64][ld]: B rows s
  T* sS = reinterpret_cast<T*>(ssd_dyn_smem + p.off_s);                   // [64][ld]: Gn rows j
  T* sV = reinterpret_cast<T*>(ssd_dyn_smem + p.off_v);                   // [2][64][kTcLd]: dy rows q
  // WG: the dy tiles [2][64][64] in the 128-byte swizzle instead (16 KB from the first
  // 1024-byte boundary at or after off_v: within the padded tiles' 18 KB)
  unsigned char* sVw = WG ? gmma_align1024(ssd_dyn_smem + p.off_v) : nullptr;
  T* sX = reinterpret_cast<T*>(ssd_dyn_smem + p.off_x);                   // [2][64][kTcLd]: x rows s, by head
  // Decays in base 2 relative to the row tile's last row (ssd_log2_rel); the inter-chunk
  // row scales exp(Acs_last − Acs_s).
  __shared__ float sRowL[2][kSsdTile], sColL[2][kSsdTile], sRowScale[2][kSsdTile], sRowDt[2][kSsdTile];
  // the weights' factors 2^−sRowL and 2^sColL (the column tiles after the row tile's)
  __shared__ float sRowF[2][kSsdTile], sColF[2][kSsdTile];
  __shared__ float sD[EPI ? 2 : 1][kSsdTile];  // EPI: the head's D of columns j0.. (0 past P)
  // DD: the warps' dD sums (float2 stores), by head parity (WG: one buffer)
  __shared__ __align__(16) float sDd[DD && !WG ? 2 : 1][DD ? kTcThreads / 32 : 1][kSsdTile];
  __shared__ double sRef[2];  // written alike by threads 0..63, each reading back its own store
  // SEG: the starts counts of the rows (-1 past the chunk) and of each buffer's columns (-2),
  // and whether the state misses the row (before the chunk's last start)
  __shared__ int sRowSeg[SEG ? kSsdTile : 1], sColSeg[SEG ? 2 : 1][SEG ? kSsdTile : 1];
  __shared__ bool sRowCut[SEG ? kSsdTile : 1];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  const int64_t n_gs = p.groups * p.nsplit;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const bool narrow = ssd_narrow(p.total_blocks);
    int64_t rest = vb;
    const int jt = static_cast<int>(ssd_peel(rest, p.j_tiles, narrow));
    const int rt = static_cast<int>(ssd_peel(rest, p.r_tiles, narrow));
    const int64_t c = ssd_peel(rest, p.nchunks, narrow);
    const int64_t gs = ssd_peel(rest, n_gs, narrow), b = rest;
    int64_t g = gs;
    const int64_t split = ssd_peel(g, p.nsplit, narrow);
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = rt * kSsdTile, j0 = jt * kSsdTile;
    const int jrows = min(kSsdTile, p.P - j0);
    const int64_t h_begin = g * p.hpg + split * p.hps;
    const int nh = static_cast<int>(min(p.hps, (g + 1) * p.hpg - h_begin));
    // dD's partials of this (b, c, row tile): [seg][h][j]
    float* dpart = DD ? p.dpart + ((b * p.nchunks + c) * p.r_tiles + rt) * p.heads * p.P : nullptr;
    if (r0 >= len) {  // a row tile past the end of the last (short) chunk (the plain kernel's)
      if constexpr (DD && !SEG)
        for (int i = tid; i < nh * jrows; i += kTcThreads) dpart[(h_begin + i / jrows) * p.P + j0 + i % jrows] = 0.0f;
      continue;
    }
    const int rows = min(kSsdTile, len - r0);
    // (rows r0.., their column tiles to the chunk's end, the state reaching its last sequence)
    if (ssd_seg_skip<SEG>(p.seg ? p.seg + b * p.seqlen + t0 : nullptr, r0, len - 1)) continue;
    // Column tiles rt, rt + 1, ..., last; with EPI in the reverse order, the diagonal one
    // last, so that its dy_pre rows are still in their buffer after the loop. (The plain
    // kernel keeps the forward order: reversed, ptxas spilled 152 bytes instead of 92.)
    const int last_tile = (len - 1) / kSsdTile, n_steps = last_tile + 1 - rt;
    auto col_tile = [&](int k) { return EPI ? last_tile - k : rt + k; };
    const bool live = rw < rows;  // (warp-uniform)
    const float* cbt = p.cbt + ((b * p.groups + g) * p.nchunks + c) * p.pairs * (kSsdTile * kSsdTile);
    // The block's operands at its first head h_begin (head hi adds hi times its stride), so
    // that a head's copies and stores do not recompute their addresses from the indices.
    const T* dy_blk = p.dy.p + b * p.dy.s[0] + t0 * p.dy.s[1] + h_begin * p.dy.s[2] + j0 * p.dy.s[3];
    const T* x_blk = p.x.p + b * p.x.s[0] + (t0 + r0) * p.x.s[1] + h_begin * p.x.s[2] + j0 * p.x.s[3];
    const int64_t st_head = p.nchunks * p.P * static_cast<int64_t>(p.N);
    const T* st_blk = p.state + (((b * p.heads + h_begin) * p.nchunks + c) * p.P + j0) * static_cast<int64_t>(p.N);
    const int64_t at_blk = (b * p.heads + h_begin) * p.seqlen + t0;  // [B, H, L] at (b, h_begin, t0)
    T* out_blk = p.out + ((b * p.seqlen + t0 + r0) * p.heads + h_begin) * p.P;  // dx [B, L, H, P] at row r0
    // DD, after a barrier that follows head hi's epilogue: its dD partials, the live
    // warps' sums in warp order
    auto flush_dD = [&](int hi) {
      if (tid < jrows) {
        float t = 0.0f;
        for (int w = 0; w < (rows + 15) / 16; ++w) t += sDd[WG ? 0 : hi & 1][w][tid];
        dpart[(h_begin + hi) * p.P + j0 + tid] = t;
      }
    };

    // Stage copies: head hi's dy rows of column tile col_tile(k) into buffer `buf`, and (threads
    // below 64) that tile's Acs into a register, stored to shared memory at the stage.
    int col_seg = 0;  // SEG: the stage's column's starts count (threads below 64)
    auto issue_v = [&](int hi, int k, int buf, double& col_acs) {
      const int c0 = col_tile(k) * kSsdTile, cols = min(kSsdTile, len - c0);
      if constexpr (WG)
        sw128_fill<T>(sVw + buf * kSsdTileBytes, kSsdTile, kSsdTile, dy_blk + hi * p.dy.s[2] + c0 * p.dy.s[1],
                      p.dy.s[1], p.dy.s[3], cols, p.P - j0);
      else
        tc_fill<T, true>(sV + buf * kSsdTile * kTcLd, kTcLd, kSsdTile, kSsdTile, dy_blk + hi * p.dy.s[2] + c0 * p.dy.s[1],
                         p.dy.s[1], p.dy.s[3], cols, p.P - j0);
      // (the index clamped into the tile: an unconditional load, which nothing waits for
      // before the stage; columns past the chunk are masked where the value is used)
      if (tid < kSsdTile) {
        col_acs = p.acs[at_blk + hi * p.seqlen + c0 + min(tid, cols - 1)];
        if constexpr (SEG) col_seg = tid < cols ? p.seg[b * p.seqlen + t0 + c0 + tid] : -2;
      }
    };
    // Head hi's state rows j0.. into the state tile (zeros past P and N), its x rows into
    // x buffer hi % 2 (last read by head hi − 2's epilogue, before head hi − 1's first
    // barrier), and its row data into registers (threads below 64).
    auto issue_s = [&](int hi, double& row_acs, float& row_dt, double& last, double& ref) {
      tc_fill<T, true>(sS, p.ld, kSsdTile, p.NP, st_blk + hi * st_head, p.N, 1, jrows, p.N);
      tc_fill<T, true>(sX + (hi & 1) * kSsdTile * kTcLd, kTcLd, kSsdTile, kSsdTile, x_blk + hi * p.x.s[2], p.x.s[1],
                       p.x.s[3], rows, p.P - j0);
      if (tid < kSsdTile) {
        const int64_t at = at_blk + hi * p.seqlen;
        row_acs = p.acs[at + r0 + min(tid, rows - 1)];  // (clamped, as in issue_v; rows past
        row_dt = p.dtf[at + r0 + min(tid, rows - 1)];   // the chunk are masked where used)
        last = p.acs[at + len - 1];
        ref = p.acs[at + r0 + rows - 1];
      }
    };

    __syncthreads();  // the previous virtual block is done with shared memory
    // SEG: the rows' counts (each thread below 64 reads back its own) and the row tile's
    // last row's, the reference of the decays
    const int seg_ref = SEG ? p.seg[b * p.seqlen + t0 + r0 + rows - 1] : 0;
    if (SEG && tid < kSsdTile) {
      const int rs = tid < rows ? p.seg[b * p.seqlen + t0 + r0 + tid] : -1;
      sRowSeg[tid] = rs;
      sRowCut[tid] = rs != p.seg[b * p.seqlen + t0 + len - 1];
    }
    tc_fill<T, true>(sL, p.ld, kSsdTile, p.NP, p.B.p + b * p.B.s[0] + (t0 + r0) * p.B.s[1] + g * p.B.s[2], p.B.s[1],
                     p.B.s[3], rows, p.N);
    double col_acs = 0.0, row_acs = 0.0, last = 0.0, ref_next = 0.0;
    float row_dt = 0.0f;
    issue_s(0, row_acs, row_dt, last, ref_next);
    issue_v(0, 0, 0, col_acs);
    ssd_cp_async_commit();
    int st = 0;  // stages so far: buffer st % 2
    for (int hi = 0; hi < nh; ++hi) {
      const int64_t h = h_begin + hi, at_head = at_blk + hi * p.seqlen;
      const int hb = hi & 1;
      // the head's x rows for the ddt dots (zeros past the chunk and P), copied with its
      // state tile (issue_s): read from shared memory where used, so that no registers hold
      // them through the column tiles
      const T* xs_head = sX + hb * kSsdTile * kTcLd;
      float acc[8][4];
      tc_zero(acc);
      for (int k = 0; k < n_steps; ++k, ++st) {
        const int buf = st & 1, ct = col_tile(k), c0 = ct * kSsdTile;
        if (tid < kSsdTile) {
          if (k == 0) {  // (the registers hold head hi's row data until issue_s(hi + 1) below)
            sRef[hb] = ref_next;
            const float rl =
                SEG ? ssd_log2_seq(row_acs, sRowSeg[tid], ref_next, seg_ref) : ssd_log2_rel(row_acs, ref_next);
            sRowL[hb][tid] = rl;
            sRowF[hb][tid] = ssd_exp2(-rl);
            sRowDt[hb][tid] = row_dt;
            sRowScale[hb][tid] = tid < rows ? ssd_decay<float>(last - row_acs) : 0.0f;
            if constexpr (EPI) sD[hb][tid] = j0 + tid < p.P ? p.epi.D[h * p.epi.D_s0 + (j0 + tid) * p.epi.D_s1] : 0.0f;
          }
          const float cl = SEG ? ssd_log2_seq(col_acs, col_seg, sRef[hb], seg_ref) : ssd_log2_rel(col_acs, sRef[hb]);
          sColL[buf][tid] = cl;
          sColF[buf][tid] = ssd_exp2(cl);
          if constexpr (SEG) sColSeg[buf][tid] = col_seg;
        }
        // this stage's B·Cᵀ values (rows g8, g8 + 8 of the warp; the lane's columns)
        float cb[8][4];
        const float* tile = cbt + (ct * (ct + 1) / 2 + rt) * (kSsdTile * kSsdTile);
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            const float2 v = *reinterpret_cast<const float2*>(tile + (rw + g8 + 8 * half) * kSsdTile + nt * 8 + 2 * t4);
            cb[nt][2 * half] = v.x, cb[nt][2 * half + 1] = v.y;
          }
        ssd_cp_async_wait<0>();  // this stage's copies (the only group in flight)
        if constexpr (WG) fence_proxy_async();  // (the dy tile, read by wgmma)
        __syncthreads();
        if constexpr (DD)
          if (k == 0 && hi > 0) flush_dD(hi - 1);
        if (k == 0) {
          // the inter-chunk term: exp(Acs_last − Acs_s)·Σ_n B_s[n]·Gn[j][n] into acc
          if (live) {
            // (N = 128: the k-steps and row stride known here)
            if (p.NP == 2 * kSsdTile)
              tc_warp_gemm_ks<T, 2 * kSsdTile / 16>(acc, sL + rw * kLdN128, kLdN128, sS, kLdN128, 4);
            else
              tc_warp_gemm<T, false, false>(acc, sL + rw * p.ld, p.ld, sS, p.ld, p.NP / 16, 0, 4);
            float dot[2] = {0.0f, 0.0f};
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int rl = rw + g8 + 8 * half;
              const float scale = sRowScale[hb][rl];
              const bool cut = SEG && sRowCut[rl];  // (selected, with its dot)
#pragma unroll
              for (int nt = 0; nt < 8; ++nt) {
                T xs[2];
                ssd_smem_pair(xs, xs_head + rl * kTcLd + nt * 8 + 2 * t4);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  acc[nt][2 * half + e] = cut ? 0.0f : acc[nt][2 * half + e] * scale;
                  dot[half] += to_acc(xs[e]) * acc[nt][2 * half + e];
                }
              }
              if (cut) dot[half] = 0.0f;
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {  // part2: fixed xor tree over the row's 4 lanes
              const float s = ssd_quad_sum(dot[half]);
              const int rg = r0 + rw + g8 + 8 * half;
              if (t4 == 0 && rg < len) p.part2[(at_head + rg) * p.j_tiles + jt] = s;
            }
          }
          __syncthreads();  // every warp is done with the state tile
        }
        // the next stage's copies (and, after the inter-chunk product, the next head's state)
        if (k + 1 < n_steps)
          issue_v(hi, k + 1, buf ^ 1, col_acs);
        else if (hi + 1 < nh)
          issue_v(hi + 1, 0, buf ^ 1, col_acs);
        if (k == 0 && hi + 1 < nh) issue_s(hi + 1, row_acs, row_dt, last, ref_next);
        ssd_cp_async_commit();
        // (WG: every warp of the warpgroup takes part in the product; a warp past the short
        // last chunk's rows weighs zeros: its rows are masked)
        if (!WG && !live) continue;
        // SEG: whether the warp's rows and the column tile are all one sequence (warp-uniform;
        // the counts grow with the position): then the stage is the plain kernel's
        const int w_rows = min(16, rows - rw), t_cols = min(kSsdTile, len - c0);
        const bool one = !SEG || (sRowSeg[rw] == sRowSeg[rw + w_rows - 1] &&
                                  sColSeg[buf][0] == sColSeg[buf][t_cols - 1] && sRowSeg[rw] == sColSeg[buf][0]);
        // P = B·Cᵀ ∘ exp(Acs_q − Acs_s) over q >= s (selected, not multiplied, to 0), then P·dy.
        // A column tile after the diagonal one and inside the chunk has no pair to select
        // (each of its rows is inside the chunk too): its stage skips the 3 compares and the
        // select a value (H200, the 2.7B shape: dx with D and dD's partials 679-680 -> 666 us,
        // with D and z 648 -> 626; ptxas: no spills with D, as before).
        // Unmasked (and factored_decays: ssd_chunk_scan_tc.cuh's "factored weights"), the
        // weights factor: 2^(a_q − a_s) = 2^a_q · 2^−a_s (the reference, the row tile's last
        // row, lies between s and q), a product a value in place of an exp2.
        auto weigh = [&](auto masked) {
          constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int rl = rw + g8 + 8 * half, rg = r0 + rl;
            const float ra = kMasked ? sRowL[hb][rl] : sRowF[hb][rl];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
              const float2 ca = *reinterpret_cast<const float2*>(&(kMasked ? sColL : sColF)[buf][nt * 8 + 2 * t4]);
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int cg = c0 + nt * 8 + 2 * t4 + e;
                const float v = kMasked ? cb[nt][2 * half + e] * ssd_exp2((e ? ca.y : ca.x) - ra)
                                        : cb[nt][2 * half + e] * ((e ? ca.y : ca.x) * ra);
                if constexpr (kMasked)
                  cb[nt][2 * half + e] =
                      cg >= rg && rg < len && cg < len && (one || sRowSeg[rl] == sColSeg[buf][nt * 8 + 2 * t4 + e])
                          ? v
                          : 0.0f;
                else
                  cb[nt][2 * half + e] = v;
              }
            }
          }
        };
        if (p.factored && one && ct != rt && c0 + kSsdTile <= len)
          weigh(std::false_type{});
        else
          weigh(std::true_type{});
        uint32_t pa[4][4];
        tc_to_a_frags<T>(cb, pa);
        if constexpr (WG) {
          // P·dy on wgmma: the four warps' P fragments (A, registers) times the dy tile
          // (B, N-major), all four k-steps (P is 0 below the diagonal)
          float(&accf)[32] = reinterpret_cast<float(&)[32]>(acc);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_rs_n64<T, 1>(accf, pa[kk], gmma_sw128_mnmajor(sVw + buf * kSsdTileBytes, kSsdTile, kk * 16));
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_fence_regs(accf);
        } else if (SEG && !one) {
          tc_warp_pv_seg<T>(acc, pa, sV + buf * kSsdTile * kTcLd, ct == rt ? warp : 0, 4, sRowSeg + rw, w_rows,
                            sColSeg[buf], t_cols);
        } else {
          tc_warp_pv<T>(acc, pa, sV + buf * kSsdTile * kTcLd, ct == rt ? warp : 0, 4);
        }
      }
      if (!live) continue;
      // part: x·dxpre; dx = dt·dxpre (+ D·dy_pre)
      // EPI: dy_pre of the lane's rows read where it is used from the diagonal (last)
      // stage's tile, still in its buffer (the next stage's copies went to the other one),
      // and D from shared memory (staged with the head's row data). Read at a first
      // diagonal stage and held through the column tiles, dy_pre's 16 registers were spilled
      // at every head (dx with D 830 µs against 665 without at the Mamba-2 2.7B shape, H200).
      const T* dy_last = sV + ((st - 1) & 1) * kSsdTile * kTcLd;
      float dsum[8][2];  // DD: Σ over the lane's rows of dy_pre·x, its 16 columns
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) dsum[nt][0] = dsum[nt][1] = 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int rl = rw + g8 + 8 * half, rg = r0 + rl;
        float s = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          T xs[2];
          ssd_smem_pair(xs, xs_head + rl * kTcLd + nt * 8 + 2 * t4);
          s += to_acc(xs[0]) * acc[nt][2 * half];
          s += to_acc(xs[1]) * acc[nt][2 * half + 1];
        }
        s = ssd_quad_sum(s);
        if (rg >= len) continue;
        if (t4 == 0) p.part[(at_head + rg) * p.j_tiles + jt] = s;
        const float dt = sRowDt[hb][rl];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          T dys[2];
          float2 dd;
          if constexpr (EPI) {
            if constexpr (WG)
              ssd_smem_pair(dys, reinterpret_cast<const T*>(sVw + ((st - 1) & 1) * kSsdTileBytes +
                                                            gmma_sw128_off(rl, nt) + 4 * t4));
            else
              ssd_smem_pair(dys, dy_last + rl * kTcLd + nt * 8 + 2 * t4);
            dd = *reinterpret_cast<const float2*>(&sD[hb][nt * 8 + 2 * t4]);
            if constexpr (DD) {
              T xs[2];
              ssd_smem_pair(xs, xs_head + rl * kTcLd + nt * 8 + 2 * t4);
              dsum[nt][0] += to_acc(dys[0]) * to_acc(xs[0]);
              dsum[nt][1] += to_acc(dys[1]) * to_acc(xs[1]);
            }
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float v = acc[nt][2 * half + e] * dt;
            if constexpr (EPI) v += (e ? dd.y : dd.x) * to_acc(dys[e]);
            acc[nt][2 * half + e] = v;
          }
        }
        if (!p.out_stage)
          tc_store_row<T>(out_blk + (static_cast<int64_t>(rl) * p.heads + hi) * p.P, j0, p.P, p.P % 2 == 0, acc, half,
                          1.0f);
      }
      if (p.out_stage) {  // dx 16 bytes a lane, staged in the warp's x rows of the head (read for the last time above)
        uint32_t v[2][8];
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) v[half][nt] = ssd_pack2<T>(acc[nt][2 * half], acc[nt][2 * half + 1]);
        T* out_warp = out_blk + (static_cast<int64_t>(rw) * p.heads + hi) * p.P + j0;
        ssd_store_staged(reinterpret_cast<unsigned short*>(const_cast<T*>(xs_head) + rw * kTcLd), v, lane,
                         [&](int r, int g, uint4 val) {
                           if (r0 + rw + r < len && j0 + 8 * g < p.P)
                             *reinterpret_cast<uint4*>(out_warp + static_cast<int64_t>(r) * p.heads * p.P + 8 * g) = val;
                         });
      }
      if constexpr (DD) {  // the warp's sums over its 16 rows, to sDd
        float v[16];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) v[2 * nt] = dsum[nt][0], v[2 * nt + 1] = dsum[nt][1];
        ssd_reduce_scatter16(v, lane);
        *reinterpret_cast<float2*>(&sDd[WG ? 0 : hb][warp][8 * ssd_scatter_slot(lane) + 2 * t4]) = make_float2(v[0], v[1]);
      }
    }
    ssd_cp_async_wait<0>();  // (no copies are left in flight; keep every thread idle)
    if constexpr (DD) {
      __syncthreads();  // the last head's sDd
      flush_dD(nh - 1);
    }
  }
}

// The dCB or dx kernel's launches: the plain one alone without seq_idx (`seg` false);
// with it the plain one and the SEG one (ssd_seg_skip divides the blocks between them),
// one after the other on `stream`, or with `side` (SsdChunkScanLaunch::side_stream) the
// SEG one on side stream 1 beside the plain one, joined before `stream` goes on: each
// launch's last wave, partly empty, then overlaps the other's blocks.
template <typename Plain, typename Seg>
void ssd_seg_launches(bool side, bool seg, cudaStream_t stream, Plain plain, Seg seg_launch) {
  if (seg && side) {
    seg_launch(side_stream_fork(stream, 1));  // (first: its blocks are the longer ones)
    plain(stream);
    side_stream_join(stream, 1);
    return;
  }
  plain(stream);
  if (seg) seg_launch(stream);
}

template <typename T>
void launch_dcb(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdGroupDcbParams<T> p;
  p.factored = l.factored_decays;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.nsplit = l.dcb_splits;
  p.hps = (p.hpg + p.nsplit - 1) / p.nsplit;  // (the plan keeps nsplit <= hpg: no split is empty)
  if (p.nsplit < 1 || p.nsplit > p.hpg || (l.dcb_overlap && p.hps != 1))
    fail(PlanErrorKind::Internal, "ssd_chunk_scan_backward",
         "the dCB kernel got head splits it was not planned for (dcb_overlap takes one head a block)");
  p.P = static_cast<int>(l.head_dim);
  p.KP = ssd_k16(p.P);
  p.ld = p.KP + 8;
  p.N = static_cast<int>(l.state_dim);
  p.NP = ssd_k16(p.N);
  p.ldn = p.NP + 8;
  p.qp = static_cast<int>(w.dcb_ld);
  p.pairs = static_cast<int>(w.pairs);
  p.total_blocks = l.batch * l.groups * p.nchunks * p.pairs * p.nsplit;
  p.x = ssd_operand<T>(l.x, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.B = ssd_operand<T>(l.B, l.B_stride, false);
  p.C = ssd_operand<T>(l.C, l.C_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.dcb = p.nsplit > 1 ? ssd_ws<float>(l, w.dcb) : nullptr;
  p.dcb_t = ssd_ws<T>(l, w.dcb_t);
  p.xin = ssd_ws<float>(l, w.xin);
  p.xsuf = ssd_ws<float>(l, w.xsuf);
  p.cbt = ssd_ws<float>(l, w.cbt);
  if (p.total_blocks == 0) return;
  const int smem = static_cast<int>(ssd_group_dcb_smem_bytes(l.head_dim, l.state_dim, l.dcb_overlap));
  auto run = [&](auto kernel, cudaStream_t on) {
    allow_dynamic_smem(kernel, smem, "ssd_chunk_scan_backward(group_dcb)");
    kernel<<<ssd_grid(p.total_blocks), kTcThreads, smem, on>>>(p);
  };
  // With seq_idx the plain kernel takes the tile pairs of one sequence and the SEG one
  // the others (ssd_seg_skip): at the 2.7B shape with 7 sequences a row
  // (H200), 498-505 + 248-250 µs where the SEG kernel alone took 774-780; with
  // side_stream the two run side by side (ssd_seg_launches).
  auto plain = l.dcb_overlap ? ssd_group_dcb_kernel<T, false, true> : ssd_group_dcb_kernel<T, false, false>;
  auto seg = l.dcb_overlap ? ssd_group_dcb_kernel<T, true, true> : ssd_group_dcb_kernel<T, true, false>;
  ssd_seg_launches(l.side_stream, p.seg != nullptr, stream, [&](cudaStream_t on) { run(plain, on); },
                   [&](cudaStream_t on) { run(seg, on); });
  check_launch("ssd_chunk_scan_backward(group_dcb)");
  if (p.nsplit > 1) {
    const int64_t units = l.batch * l.groups * p.nchunks;
    const int64_t n4 = units * p.pairs * kSsdTile * kSsdTile / 4;
    ssd_group_dcb_round_kernel<T><<<ssd_grid((n4 + 255) / 256), 256, 0, stream>>>(
        p.dcb, p.dcb_t, n4, p.nsplit, units * p.qp * p.qp, p.qp, p.pairs);
    check_launch("ssd_chunk_scan_backward(group_dcb_round)");
  }
}

template <typename T, bool DB, bool WG>
void launch_grad(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  const char* op = DB ? "ssd_chunk_scan_backward(group_db)" : "ssd_chunk_scan_backward(group_dc)";
  SsdGroupGradParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups;
  p.hpg = l.heads / l.groups, p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.P = static_cast<int>(l.head_dim);
  p.KP = ssd_k16(p.P);
  p.N = static_cast<int>(l.state_dim);
  p.qp = static_cast<int>(w.dcb_ld);
  p.r_tiles = p.qp / kSsdTile;
  p.j_tiles = static_cast<int>((l.state_dim + kSsdTile - 1) / kSsdTile);
  p.total_blocks = l.batch * l.groups * p.nchunks * p.r_tiles * p.j_tiles;
  // Shared memory: the plan header's layout (ssd_group_grad_smem, which the plan checked
  // against the opt-in limit): the ring's Lft buffers (also phase 1's two [64][kTcLd]
  // tiles), its state tiles, dC's float32 C tile; WG: swizzled, unpadded tiles, the Lft
  // rows in panels of 64 columns.
  static_assert(sizeof(T) == 2 && kSsdTile == 64 && kTcLd == 72 && kSsdGradCLd == 72,
                "ssd_group_grad_smem (core/ssd_chunk_scan_plan.h) assumes these tiles");
  const SsdGroupGradSmem layout = ssd_group_grad_smem(l.head_dim, DB, WG);
  p.lrow = static_cast<int>(layout.lrow);
  p.off_s = static_cast<int>(layout.off_s);
  p.off_c = static_cast<int>(layout.off_c);
  const int smem = static_cast<int>(layout.bytes);
  p.lft = DB ? ssd_operand<T>(l.x, l.x_stride, true) : ssd_operand<T>(l.dy, l.dy_stride, true);
  p.v = DB ? ssd_operand<T>(l.C, l.C_stride, false) : ssd_operand<T>(l.B, l.B_stride, false);
  p.dot = ssd_operand<T>(l.C, l.C_stride, false);
  p.state = DB ? ssd_ws<T>(l, w.gstates_t) : ssd_h_copy<T>(l, w);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.dcb = ssd_ws<T>(l, w.dcb_t);
  p.upart = DB ? nullptr : ssd_ws<float>(l, w.up);
  p.out = static_cast<T*>(DB ? l.dB : l.dC);
  if (p.total_blocks == 0) return;
  auto run = [&](auto kernel) {
    allow_dynamic_smem(kernel, smem, op);
    kernel<<<ssd_grid(p.total_blocks), kTcThreads, smem, stream>>>(p);
  };
  // (With seq_idx the SEG kernel takes every block, unlike dCB and dx: at the Mamba-2 2.7B
  // shape its 512 blocks are one wave of 4 an SM, and a plain launch for the blocks of one
  // sequence added a second: dC 179 -> 174 + 146 µs, dB 165 -> 141 + 141 on an H200.)
  if (p.seg != nullptr)
    run(ssd_group_grad_kernel<T, DB, WG, true>);
  else
    run(ssd_group_grad_kernel<T, DB, WG>);
  check_launch(op);
}

template <typename T, bool EPI, bool DD>
void launch_dx_with(const SsdGroupDxParams<T>& p, int smem, bool side, bool wg, cudaStream_t stream) {
  auto run = [&](auto kernel, cudaStream_t on) {
    allow_dynamic_smem(kernel, smem, "ssd_chunk_scan_backward(group_dx)");
    kernel<<<ssd_grid(p.total_blocks), kTcThreads, smem, on>>>(p);
  };
  // With seq_idx the plain kernel takes the blocks of one sequence and the SEG one (2 blocks
  // an SM) the others (ssd_seg_skip): at the 2.7B shape with 7 sequences a row (H200),
  // 407-411 + 328-333 µs where the SEG kernel alone took 797-805 (with D 498-502 + 353-359
  // against 896-897); with side_stream the two run side by side (ssd_seg_launches).
  // wg (SsdChunkScanLaunch::dx_wgmma): the plain kernel's P·dy on wgmma.
  ssd_seg_launches(
      side, p.seg != nullptr, stream,
      [&](cudaStream_t on) {
        if (wg)
          run(ssd_group_dx_kernel<T, EPI, DD, false, true>, on);
        else
          run(ssd_group_dx_kernel<T, EPI, DD>, on);
      },
      [&](cudaStream_t on) { run(ssd_group_dx_kernel<T, EPI, DD, true>, on); });
  check_launch("ssd_chunk_scan_backward(group_dx)");
}

template <typename T>
void launch_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdGroupDxParams<T> p;
  p.factored = l.factored_decays;
  p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.P = static_cast<int>(l.head_dim);
  p.N = static_cast<int>(l.state_dim);
  p.NP = ssd_k16(p.N);
  p.ld = p.NP + 8;
  p.r_tiles = static_cast<int>(w.dcb_ld / kSsdTile);
  p.pairs = static_cast<int>(w.pairs);
  p.j_tiles = static_cast<int>((l.head_dim + kSsdTile - 1) / kSsdTile);
  // up to kSsdGroupDxHeads heads per block, spread evenly over the splits (none empty)
  const int64_t most = std::min<int64_t>(p.hpg, kSsdGroupDxHeads);
  p.nsplit = (p.hpg + most - 1) / most;
  p.hps = (p.hpg + p.nsplit - 1) / p.nsplit;
  p.total_blocks = l.batch * l.groups * p.nsplit * p.nchunks * p.r_tiles * p.j_tiles;
  p.off_s = kSsdTile * p.ld * static_cast<int>(sizeof(T));
  p.off_v = p.off_s + kSsdTile * p.ld * static_cast<int>(sizeof(T));
  p.off_x = p.off_v + 2 * kSsdTile * kTcLd * static_cast<int>(sizeof(T));
  const int smem = static_cast<int>(ssd_group_dx_smem_bytes(l.state_dim));  // (the plan checked it fits)
  p.x = ssd_operand<T>(l.x, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.B = ssd_operand<T>(l.B, l.B_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.state = ssd_ws<T>(l, w.gstates_t);
  p.cbt = ssd_ws<float>(l, w.cbt);
  p.out = static_cast<T*>(l.dx);
  p.out_stage = p.P % 8 == 0 && reinterpret_cast<uintptr_t>(l.dx) % 16 == 0;
  p.part = ssd_ws<float>(l, w.ddtp);
  p.part2 = ssd_ws<float>(l, w.vp);
  p.epi = SsdEpilogue<T>{};
  p.epi.D = static_cast<const float*>(l.D);
  p.epi.D_s0 = l.D_stride[0];
  p.epi.D_s1 = l.D_per_dim ? l.D_stride[1] : 0;
  p.epi.on = p.epi.D != nullptr;
  const bool dd = p.epi.on && l.dD_in_dx;  // dD's partials here (the gate kernel writes them otherwise)
  p.dpart = dd ? ssd_ws<float>(l, w.dDp) : nullptr;
  if (p.total_blocks == 0) return;
  if (!p.epi.on)
    launch_dx_with<T, false, false>(p, smem, l.side_stream, l.dx_wgmma, stream);
  else if (dd)
    launch_dx_with<T, true, true>(p, smem, l.side_stream, l.dx_wgmma, stream);
  else
    launch_dx_with<T, true, false>(p, smem, l.side_stream, l.dx_wgmma, stream);
}

}  // namespace

void ssd_backward_group_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_half(l.element, "ssd_chunk_scan_backward", [&](auto tag) { launch_dx<decltype(tag)>(l, w, s); });
}

void ssd_backward_group_dcb(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_half(l.element, "ssd_chunk_scan_backward", [&](auto tag) { launch_dcb<decltype(tag)>(l, w, s); });
}

void ssd_backward_group_grad(const SsdChunkScanLaunch& l, const SsdWorkspace& w, bool db, cudaStream_t s) {
  dispatch_half(l.element, "ssd_chunk_scan_backward", [&](auto tag) {
    using T = decltype(tag);
    if (l.group_wgmma)
      db ? launch_grad<T, true, true>(l, w, s) : launch_grad<T, false, true>(l, w, s);
    else
      db ? launch_grad<T, true, false>(l, w, s) : launch_grad<T, false, false>(l, w, s);
  });
}

}  // namespace baracuda::kernels::cuda
