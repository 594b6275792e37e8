// CUDA Mamba-2 SSD chunk scan, forward and backward: the chunked state-space-duality
// algorithm with SIMT math on shared-memory tiles. These kernels run float32 and float64
// inputs; float16 and bfloat16 on sm_80+ replace the chunk-state, state-pass, scan and
// X_s kernels with the tensor-core ones of ssd_chunk_scan_tc.cuh (same formulas and
// workspace) and share the rest.
//
// Notation (per batch b, head h, group g = h / (H/G); chunk c covers the global
// positions [c·Q, c·Q + len), len = min(Q, L − c·Q); r, s, q are local positions):
//   a_s   = dt_s · A_h,   Acs_q = Σ_{s ≤ q} a_s   (cumsum inside the chunk, in double)
//   H_c   = state entering chunk c (D × N): H_0 = initial_states (or 0),
//           H_{c+1} = exp(Acs_last)·H_c + S_c,
//   S_c   = Σ_s exp(Acs_last − Acs_s)·dt_s · x_s ⊗ B_s
//   y_q   = exp(Acs_q)·H_c·C_q + Σ_{s ≤ q} (C_q·B_s)·exp(Acs_q − Acs_s)·dt_s · x_s
// Backward (dy given), with Gn_c = G_{c+1} = dL/dH_{c+1}:
//   G_c     = Σ_q exp(Acs_q)·dy_q ⊗ C_q + exp(Acs_last)·G_{c+1}        (reverse scan)
//   dxpre_s = exp(Acs_last − Acs_s)·Gn·B_s + Σ_{q ≥ s} (B_s·C_q)·exp(Acs_q − Acs_s)·dy_q
//   dx_s    = dt_s · dxpre_s,   ddt_s(direct) = x_s · dxpre_s
//   dC_q    = Σ_{h∈g} [ exp(Acs_q)·H_cᵀ·dy_q + Σ_{s ≤ q} (dy_q·x_s)·exp(Acs_q − Acs_s)·dt_s·B_s ]
//   dB_s    = Σ_{h∈g} dt_s·[ exp(Acs_last − Acs_s)·Gnᵀ·x_s + Σ_{q ≥ s} (x_s·dy_q)·exp(Acs_q − Acs_s)·C_q ]
//   da_s    = dL/da_s, in the cancellation-free ("stable") form
//           = X_s + Σ_{q ≥ s} U_q + Σ_{s' < s} V_{s'} + W,  with
//     T_qs' = (C_q·B_s')·(dy_q·x_s')·exp(Acs_q − Acs_s')·dt_s'   (s' < q)
//     X_s   = Σ_{q ≥ s} Σ_{s' < s} T_qs'          (the intra-chunk pairs that cross s)
//     U_q   = exp(Acs_q)·dy_q·(H_c·C_q)           (dy·y, inter-chunk part)
//     V_s   = dt_s·x_s·(exp(Acs_last − Acs_s)·Gn·B_s)   (x·dx, inter-chunk part)
//     W     = exp(Acs_last)·⟨Gn, H_c⟩
//   ddt_s   = ddt_s(direct) + A_h·da_s,   dA_h = Σ_{b,c,s} dt_s·da_s
//   (The textbook route, dAcs_q = dy_q·y_q − x_q·dx_q + [q = last]·⟨Gn, H_{c+1}⟩ followed
//   by a reverse cumsum, is equal but subtracts O(Q²) terms that cancel; in float32 it
//   lost ~150 ulps of dA at Q = 100 (emulated). Every sum above adds each pair once.)
// These were checked in float64 against autograd of the sequential recurrence.
//
// The mamba_chunk_scan_combined options (SsdChunkScanLaunch) and where each is fused:
//   A, dt types      A is read in the compute type (Acc); dt (and ddt) in dt_element,
//                    which is T or Acc (SsdDtIn reads either).
//   dt_bias, dt_softplus, dt_min/dt_max
//                    ssd_cumsum_kernel processes dt once (ssd_dt_process) and stores the
//                    processed dt in the workspace: every later kernel sees only it.
//                    ssd_finalize_kernel recomputes d(processed)/d(raw) from the raw dt
//                    (0 strictly outside the clamp, sigmoid where softplus applied) and
//                    writes ddt of the raw dt, plus per-(b, c) ddt_bias partials that
//                    ssd_dA_kernel sums in a fixed order.
//   seq_idx          ssd_cumsum_kernel restarts the sum at every sequence start (from
//                    the start's own dt·A), lowers Acs by kSsdSeqOffset per start since
//                    the chunk's start, and stores each position's count of those starts
//                    (`seg`). Every kernel selects to 0 (never multiplies by a zero decay:
//                    0·NaN is NaN) a term that crosses a start and leaves such pairs out
//                    of its products (ssd_mma_seg; on tensor cores one product per
//                    sequence where a 16-position step holds a start), as the CPU kernels
//                    do: the intra-chunk C·Bᵀ decay matrix exp(Acs_q − Acs_s), the
//                    chunk-state weights exp(Acs_last − Acs_s), the inter-chunk exp(Acs_q)
//                    and the state passing exp(Acs_last); so a NaN or Inf stays in its
//                    sequence. A position's Acs depends on its own sequence alone (Acs +
//                    kSsdSeqOffset·seg is the sum from its start), and the tensor-core
//                    kernels take each position's decays relative to a position of its own
//                    sequence (ssd_log2_seq). The stable da below is the gradient of the
//                    reset recurrence (0 at a start, whose decay is not used). (The fused
//                    forwards keep sequences apart their own way: ssd_fused_forward.cu.
//                    mamba_ssm's Triton kernels multiply across a start, so there a NaN or
//                    Inf of one sequence reaches the others of its chunk.)
//   initial_states   seed of the forward state pass (H_0), in ssd_state_pass_kernel,
//   final_states     which also writes H_nc (the state after the last step) when
//                    asked; with L = 0 the pass only copies.
//   dfinal_states    seed of the reverse state pass (G_nc); it ends in G_0 =
//   dinitial_states  dinitial_states. Gn_c, W, V and the DX/DB inter-chunk products
//                    take the seed through the states as they are.
//   D                forward: the Y epilogue (ssd_epilogue) adds D·x to the float
//                    accumulator; backward: the DX epilogue adds D·dy_pre to dx, and
//                    the partials of dy_pre·x (ssd_dD_segments), which ssd_dD_kernel
//                    sums in a fixed order, come from the group dx kernel (dD_in_dx)
//                    or else from ssd_gate_kernel.
//   z                forward: the Y epilogue writes y_pre (when y_pre_out is given) and
//                    then y_pre·silu(z). Backward: ssd_gate_kernel writes dy_pre =
//                    dy·silu(z) (rounded to T) into the workspace (dyp), which every
//                    later kernel reads as dy, and dz = dy·y_pre·σ(z)·(1 + z·(1 − σ(z)))
//                    in the same pass over dy and z.
// Without options these add only the clamp to [0, inf) in the cumsum and a second read
// of the raw dt (for its factor of 1) in the finalize: the scan and fused state kernels
// with an option are separate instantiations (EPI, ENDS), the plain ones are unchanged.
//
// Kernels (all grid-stride over "virtual blocks", so any size fits the grid limits):
//   ssd_cumsum_kernel       warp per (b,h,c): Acs (double), dt (Acc) → workspace [B,H,L]
//   ssd_chunk_state_kernel  64×64 (d,n) tile per (b,h,c): S_c (forward) or the local
//                           dstate Σ_q exp(Acs_q)·dy_q ⊗ C_q (backward); K = positions
//   ssd_state_pass_kernel   per (b,h) and 256 (d,n) elements: S_c → H_c in place
//   ssd_state_pass_bwd_kernel  reverse: local dstate_c → Gn_c in place, and per-block
//                           partials of ⟨Gn_c, H_c⟩
//   ssd_scan_kernel<MODE>   64 rows × 64 columns of one chunk; MODE Y (y), DX (dx, and
//                           partials of ddt(direct) and V), DC (dC, partials of U), DB
//                           (dB); DC and DB loop over up to 8 of the group's heads
//   ssd_split_sum_kernel    DC/DB with more than 8 heads per group: sums the head splits
//   ssd_dacs_kernel         block per (b,h,c): X_s from 64×64 tiles of T
//   ssd_finalize_kernel     block per (b,h,c): da, ddt, dA partials
//   ssd_dA_kernel           warp per h: fixed-order sum of the dA (and ddt_bias) partials
//   ssd_gate_kernel         backward with z: dy_pre, dz; and with D without dD_in_dx:
//                           dD partials
//   ssd_dD_kernel           dD from its partials
//
// Determinism: no atomics. Every output element and every workspace partial is written
// by exactly one thread; every sum runs in an order fixed by the shapes alone.
//
// The scan kernel is one shape for all four products:
//   out(r, j) = Σ_heads [ rs_r · Σ_k Lft(r,k)·S(k,j)
//                        + Σ_{c causal to r} (Σ_k Lft(r,k)·Rgt(c,k)) · dec(r,c) · V(c,j) ]
//   mode  Lft  Rgt  V    S(k,j)          rs_r                    dec(r,c)                     causal
//   Y     C    B    x    H_c[j,k]        exp(Acs_r)              exp(Acs_r−Acs_c)·dt_c        c ≤ r
//   DX    B    C    dy   Gn[j,k]         exp(Acs_last−Acs_r)     exp(Acs_c−Acs_r)             c ≥ r
//   DC    dy   x    B    H_c[k,j]        exp(Acs_r)              exp(Acs_r−Acs_c)·dt_c        c ≤ r
//   DB    x    dy   C    Gn[k,j]         exp(Acs_last−Acs_r)·dt_r  exp(Acs_c−Acs_r)·dt_r      c ≥ r
// (rs_r is folded into the Lft tile of the first product.) Each Σ_k is a 64×64×K tile
// product from shared memory (ssd_mma); these and the P·V product are the pieces that
// become mma/wgmma later.
//
// Non-finite inputs: NaN in x, B, C or dy lands exactly where the recurrence puts it
// (masked P entries are selected to 0, and diagonal tiles accumulate only causal pairs).
// NaN in dt or A also poisons, in the backward, the positions of its chunk after it
// (Acs_last − Acs_s is NaN − NaN), and ±Inf can differ from the recurrence wherever the
// chunked form sums in another order (Σ_n C·(B·Inf) vs (C·B)·Inf). With seq_idx, none of
// these reaches another packed sequence (ssd_seq_masks).
#pragma once

#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ssd_seq_idx.cuh"
#include "kernels/gated_activation_math.h"
#include "kernels/ssd_chunk_scan.h"

namespace baracuda::kernels::cuda {

constexpr int kSsdThreads = 256;  // 16 × 16 threads, each a 4 × 4 micro-tile
constexpr int kSsdTile = 64;      // rows and columns of every output tile
// DC and DB sum over the H/G heads of a group. A block takes at most this many of them;
// with more, the group's heads are split over blocks that write float partials, summed
// in split order by ssd_split_sum_kernel (for G = 1 and H = 80 a block per group would
// leave the GPU with B·nc·4·2 long blocks).
constexpr int kSsdHeadsPerBlock = 8;
// Positions (of the flattened b·L + t) per dD partial (ssd_gate_kernel): 64, so that
// its threads of 16 bytes (8 bf16 of d) still fill the GPU (B·L/64 · H·D/8 of them).
constexpr int64_t kSsdDSeg = 64;
// Threads a (segment, vector) of the gate kernel: each walks a quarter of the segment.
constexpr int kSsdGateQuarters = 4;

// K-step depth and row padding of the k-major operand tiles. The padding keeps rows
// 16-byte aligned (vector loads) and spreads the transposing stores over banks. float64
// halves the depth so the static shared memory stays under 48 KB.
template <typename Acc>
struct SsdCfg;
template <>
struct SsdCfg<float> {
  static constexpr int KS = 16, LD = kSsdTile + 4;
};
template <>
struct SsdCfg<double> {
  static constexpr int KS = 8, LD = kSsdTile + 2;
};

enum SsdScanMode : int { kSsdY = 0, kSsdDX = 1, kSsdDC = 2, kSsdDB = 3 };

// A [B, L, H or G, K] input: element (b, t, i, k) at p[b·s0 + t·s1 + i·s2 + k·s3].
template <typename T>
struct SsdOperand {
  const T* p = nullptr;
  int64_t s[4] = {};
  bool per_head = true;  // indexed by head h (x, dy) or by group g (B, C)
};

template <typename T>
SsdOperand<T> ssd_operand(const void* p, const int64_t (&s)[4], bool per_head) {
  SsdOperand<T> o;
  o.p = static_cast<const T*>(p);
  for (int i = 0; i < 4; ++i) o.s[i] = s[i];
  o.per_head = per_head;
  return o;
}

// ---- workspace ---------------------------------------------------------------------------
// Buffers, in Acc (float, or double for float64 inputs) except acs (always double), each
// 256-byte aligned:
//   acs       [B, H, L] double     chunk-local cumsum of dt·A. Double because every decay
//                                  is exp of a difference Acs_q − Acs_s of two cumsums
//                                  that grow with the chunk: in float32 that difference
//                                  alone cost ~1e-6 relative error in y at Q = 100-256
//                                  (the sequential recurrence in float32: ~2e-7).
//   dtf       [B, H, L]            dt converted
//   seg       [B, L] int32         with seq_idx (ssd_seq_masks): the sequence starts in
//                                  [chunk start, t] at each position t
//   states    [B, H, nc, D, N]     S_c, then (in place, without states_t) H_c, the state
//                                  entering chunk c
//   states_t  [B, H, nc, D, N] T   16-bit inputs on tensor cores (ssd_state_copies): H_c
//                                  rounded to the input type, written by the state pass
//                                  in place of the float32 H_c (`states` keeps S_c); every
//                                  reader takes it: the tensor-core products read
//                                  it (they round the state to T anyway) with 16-byte
//                                  copies straight into their operand tiles
//                                  (with keep_states it is SsdChunkScanLaunch::states,
//                                  not in the workspace: the forward writes it there,
//                                  and the backward, reading it, has no `states` either)
// backward only:
//   gstates   [B, H, nc, D, N]     local dstate, then (in place) Gn_c = G_{c+1} (with
//                                  group_products it keeps the local dstate: Gn_c goes
//                                  to gstates_t alone)
//   gstates_t [B, H, nc, D, N] T   as states_t, for Gn_c
//   kpart     [B, H, nc, kblocks]  partials of ⟨Gn_c, H_c⟩ (→ W), kblocks = ⌈D·N/(256·V)⌉
//                                  (V = ssd_pass_vec: 4 float32 or 2 float64 elements)
//   ddtp      [B, H, L, ⌈D/64⌉]     partials of ddt(direct) = x·dxpre per 64-column tile
//   vp        [B, H, L, ⌈D/64⌉]     partials of x·dxpre(inter-chunk part) (→ V)
//   up        [B, H, L, ⌈N/64⌉]     partials of U per 64-column tile
//   xs        [B, H, L]            X_s (the dacs kernels'; with group_products the finalize
//                                  kernel's pass 1 results past its first round alone)
//   dap       [H, B·nc]            dA partials per (b, c)
//   split     [S, B, L, G, N]      dC, then dB, partials of S = ⌈(H/G)/8⌉ head splits
//                                  (only when S > 1; not with group_products)
//   dcb       [S', B, G, nc, Q', Q']  group_products only: Σ_heads (dy_q·x_s)·exp(Acs_q −
//                                  Acs_s)·dt_s over s <= q, one partial per dCB head split
//                                  (S' = dcb_splits; none with one split: dcb_t only), Q'
//                                  the longest chunk rounded up to 64
//                                  (ssd_chunk_scan_backward_group.cu)
//   dcb_t     [B, G, nc, Q', Q']   group_products only: the splits' dCB summed and rounded
//                                  to T, which the dC and dB kernels read
//   xin, xsuf [B, H, nc, P', 64]   group_products only: the X_s partials of the P' =
//                                  t'(t' + 1)/2 tile pairs (t' = Q'/64) of a chunk
//   cbt       [B, G, nc, P', 64, 64]  group_products only: each tile pair's B_s·C_q,
//                                  stored [s][q] (the dCB pass computes it, dx reads it)
//   dbp       [H, B·nc]            ddt_bias partials per (b, c)
//   dDp       [S_D, H, D]          dD partials, S_D = ssd_dD_segments: per 64-position
//                                  segment of b·L + t (kSsdDSeg; the gate kernel), or per
//                                  (b, chunk, 64-row tile) with dD_in_dx (the dx kernel)
//   dyp       [B, L, H, D] T       with z (SsdChunkScanLaunch::gated): dy_pre = dy·silu(z),
//                                  which the backward's kernels read in place of dy
//   (dbp and dDp are reserved whether or not dt_bias and D are given: the plan sizes the
//   workspace before it knows the pointers; both are small next to the states.)
// Size: 8·B·H·L bytes (acs) plus, in Acc elements, (2 + 2·⌈D/64⌉ + ⌈N/64⌉)·B·H·L
// + 2·B·H·nc·D·N + B·H·nc·(kblocks + 1) + [S > 1]·S·B·L·G·N (S'·B·G·nc·Q'² + 2·B·H·nc·P'·64
// + B·G·nc·P'·4096 in place of the splits with group_products), each buffer rounded up
// to 256 bytes, plus 2·2·B·H·nc·D·N bytes with the state copies and B·L·H·D elements of
// the input type with z (dyp), or 4·B·L bytes (seg) without them; the forward needs acs,
// dtf, seg and states (and states_t) only (8·B·H·L bytes + B·H·L + B·H·nc·D·N Acc, plus
// 4·B·L or 2·B·H·nc·D·N bytes).
// dD's partial sums a (h, d): one per kSsdDSeg positions of the flattened b·L + t (the gate
// kernel), or, with dD_in_dx, one per (b, chunk, 64-row tile of Q') in that order (the
// group dx kernel; a tile past a short last chunk writes zeros).
inline int64_t ssd_dD_segments(const SsdChunkScanLaunch& l) {
  if (l.dD_in_dx) return l.batch * l.nchunks() * (l.dcb_ld() / kSsdTile);
  return (l.batch * l.seqlen + kSsdDSeg - 1) / kSsdDSeg;
}

struct SsdWorkspace {
  size_t acs = 0, dtf = 0, seg = 0, states = 0, gstates = 0, kpart = 0, ddtp = 0, vp = 0, up = 0,
         xs = 0, dap = 0, split = 0, dbp = 0, dDp = 0, dyp = 0, dcb = 0, dcb_t = 0, xin = 0, xsuf = 0, cbt = 0;
  size_t states_t = 0, gstates_t = 0;  // (ssd_state_copies only)
  size_t total = 0;
  int64_t kblocks = 0, d_tiles = 0, n_tiles = 0;
  int64_t nsplit = 1, hps = 0;  // head splits per group for DC/DB, heads per split
  int64_t dcb_ld = 0;           // Q' (group_products)
  int64_t pairs = 0;            // (group_products) causal 64 × 64 tile pairs a chunk, t'(t' + 1)/2, t' = Q'/64
};

// Whether the state passes write H_c (only) and Gn_c (also) rounded to the input type
// (states_t, gstates_t): 16-bit inputs on the tensor-core kernels.
inline bool ssd_state_copies(const SsdChunkScanLaunch& l) {
  return l.tensor_cores && (l.element == ElementKind::F16 || l.element == ElementKind::BF16);
}

// Whether the run's kernels keep packed sequences apart (see seq_idx in the header comment):
// with seq_idx.
inline bool ssd_seq_masks(const SsdChunkScanLaunch& l) { return l.seq_idx != nullptr; }

// Elements of D·N per thread in the state passes: 16 bytes of the compute type.
__host__ __device__ constexpr int ssd_pass_vec(ElementKind compute) { return compute == ElementKind::F64 ? 2 : 4; }

inline SsdWorkspace ssd_workspace_layout(const SsdChunkScanLaunch& l, bool backward) {
  const size_t esz = l.element == ElementKind::F64 ? 8 : 4;
  const int64_t nc = l.nchunks();
  const int64_t bh = l.batch * l.heads;
  const int64_t dn = l.head_dim * l.state_dim;
  SsdWorkspace w;
  w.d_tiles = (l.head_dim + kSsdTile - 1) / kSsdTile;
  w.n_tiles = (l.state_dim + kSsdTile - 1) / kSsdTile;
  // ⟨Gn_c, H_c⟩ partials: one per block of ssd_state_pass_bwd_kernel (256·V elements)
  const int64_t per_block = kSsdThreads * ssd_pass_vec(l.compute);
  w.kblocks = (dn + per_block - 1) / per_block;
  const int64_t hpg = l.groups > 0 ? l.heads / l.groups : 0;
  w.nsplit = hpg > kSsdHeadsPerBlock ? (hpg + kSsdHeadsPerBlock - 1) / kSsdHeadsPerBlock : 1;
  // Splits of hps ≤ 8 heads, the last possibly fewer but never empty:
  // (nsplit − 1)·hps ≤ 8·(nsplit − 1) < H/G.
  w.hps = (hpg + w.nsplit - 1) / w.nsplit;
  size_t off = 0;
  auto take = [&](int64_t elems, size_t bytes_per = 0) {
    const size_t at = off;
    off += (static_cast<size_t>(elems) * (bytes_per ? bytes_per : esz) + 255) / 256 * 256;
    return at;
  };
  w.acs = take(bh * l.seqlen, sizeof(double));
  w.dtf = take(bh * l.seqlen);
  const bool copies = ssd_state_copies(l);
  w.seg = take(l.batch * l.seqlen, sizeof(int32_t));  // (sized before seq_idx is known)
  // (the backward that reads the forward's kept H_c, rounded, recomputes none of them)
  w.states = take(backward && l.keep_states ? 0 : bh * nc * dn);
  if (copies && !l.keep_states) w.states_t = take(bh * nc * dn, 2);
  if (backward) {
    w.gstates = take(bh * nc * dn);
    if (copies) w.gstates_t = take(bh * nc * dn, 2);
    w.kpart = take(bh * nc * w.kblocks);
    w.ddtp = take(bh * l.seqlen * w.d_tiles);
    w.vp = take(bh * l.seqlen * w.d_tiles);
    w.up = take(bh * l.seqlen * w.n_tiles);
    w.xs = take(bh * l.seqlen);
    w.dap = take(l.heads * l.batch * nc);
    w.split = take(w.nsplit > 1 && !l.group_products ? w.nsplit * l.batch * l.seqlen * l.groups * l.state_dim : 0);
    w.dbp = take(l.heads * l.batch * nc);
    w.dDp = take(ssd_dD_segments(l) * l.heads * l.head_dim);
    if (l.gated) w.dyp = take(l.batch * l.seqlen * l.heads * l.head_dim, element_size(l.element));
    if (l.group_products) {
      w.dcb_ld = l.dcb_ld();  // (a multiple of kSsdTile)
      w.dcb = take(l.dcb_splits > 1 ? l.dcb_splits * l.batch * l.groups * nc * w.dcb_ld * w.dcb_ld : 0);
      w.dcb_t = take(l.batch * l.groups * nc * w.dcb_ld * w.dcb_ld, 2);  // the splits' sum, rounded to T
      const int64_t tiles = w.dcb_ld / kSsdTile;
      w.pairs = tiles * (tiles + 1) / 2;
      w.xin = take(bh * nc * w.pairs * kSsdTile);
      w.xsuf = take(bh * nc * w.pairs * kSsdTile);
      w.cbt = take(l.batch * l.groups * nc * w.pairs * kSsdTile * kSsdTile);
    }
  }
  w.total = off;
  return w;
}

template <typename Acc>
Acc* ssd_ws(const SsdChunkScanLaunch& l, size_t offset) {
  return reinterpret_cast<Acc*>(static_cast<char*>(l.workspace) + offset);
}

// H_c rounded to T (the 16-bit copies the tensor-core kernels read): the kept states
// (SsdChunkScanLaunch::states) where the launch has them, else the workspace's states_t.
template <typename T>
T* ssd_h_copy(const SsdChunkScanLaunch& l, const SsdWorkspace& w) {
  return l.keep_states ? static_cast<T*>(l.states) : ssd_ws<T>(l, w.states_t);
}

// The starts counts (workspace `seg`) where the run keeps sequences apart, else null.
inline int32_t* ssd_seg(const SsdChunkScanLaunch& l, const SsdWorkspace& w) {
  return ssd_seq_masks(l) ? ssd_ws<int32_t>(l, w.seg) : nullptr;
}

// Grid for `total` virtual blocks; kernels loop vb = blockIdx.x, += gridDim.x.
inline unsigned int ssd_grid(int64_t total) {
  return static_cast<unsigned int>(total < (int64_t{1} << 30) ? total : (int64_t{1} << 30));
}

// ---- device helpers ----------------------------------------------------------------------
// With seq_idx, the group products' dCB and dx kernels (ssd_chunk_scan_backward_group.cu)
// launch twice: the plain instantiation takes the virtual blocks whose positions lo..hi
// of the chunk (`seg`: the chunk's starts counts) are one sequence, where it computes what
// the SEG one would (every decay within one sequence, no term to select), and the SEG
// instantiation the others. Whether this instantiation skips the block (never where seg
// is null: no seq_idx, the plain kernel alone). The SEG kernels take more registers (fewer
// blocks a multiprocessor) for what only the blocks holding a start need.
template <bool SEG>
__device__ __forceinline__ bool ssd_seg_skip(const int32_t* seg, int lo, int hi) {
  return seg != nullptr && (seg[lo] == seg[hi]) == SEG;
}

// Peels one index off a flat index (a virtual block number, an element index): returns
// v % d and leaves v / d in v, in 32-bit arithmetic where `narrow` (every flat index of the
// launch fits 32 bits: ssd_narrow of their count): a 64-bit division is a long
// instruction sequence, and each block or element peels several indices.
__device__ __forceinline__ int64_t ssd_peel(int64_t& v, int64_t d, bool narrow) {
  if (narrow) {
    const uint32_t v32 = static_cast<uint32_t>(v), d32 = static_cast<uint32_t>(d), q = v32 / d32;
    v = q;
    return v32 - q * d32;
  }
  const int64_t q = v / d, r = v - q * d;
  v = q;
  return r;
}
__host__ __device__ inline bool ssd_narrow(int64_t total_blocks) { return total_blocks <= int64_t{0xffffffff}; }

__device__ __forceinline__ float ssd_exp(float v) { return expf(v); }
__device__ __forceinline__ double ssd_exp(double v) { return exp(v); }
__device__ __forceinline__ float ssd_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double ssd_fma(double a, double b, double c) { return fma(a, b, c); }
// exp of a cumsum, or of a difference of two (computed in double), evaluated in Acc.
template <typename Acc>
__device__ __forceinline__ Acc ssd_decay(double v) {
  return ssd_exp(static_cast<Acc>(v));
}

// Four consecutive shared-memory values (16-byte aligned for float, 16 for double too).
__device__ __forceinline__ void ssd_ld4(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
__device__ __forceinline__ void ssd_ld4(const double* p, double (&v)[4]) {
  const double2 t0 = reinterpret_cast<const double2*>(p)[0];
  const double2 t1 = reinterpret_cast<const double2*>(p)[1];
  v[0] = t0.x, v[1] = t0.y, v[2] = t1.x, v[3] = t1.y;
}
__device__ __forceinline__ void ssd_st4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void ssd_st4(double* p, const double (&v)[4]) {
  reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
  reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
}

// acc[i][j] += Σ_{k < KSTEPS} a[k·lda + 4·ty + i] · b[k·ldb + 4·tx + j]: the thread's
// 4 × 4 piece of a 64 × 64 tile product, both operands k-major in shared memory.
template <int KSTEPS, typename Acc>
__device__ __forceinline__ void ssd_mma(const Acc* __restrict__ a, int lda, const Acc* __restrict__ b,
                                        int ldb, int ty, int tx, Acc (&acc)[4][4]) {
#pragma unroll
  for (int k = 0; k < KSTEPS; ++k) {
    Acc av[4], bv[4];
    ssd_ld4(a + k * lda + 4 * ty, av);
    ssd_ld4(b + k * ldb + 4 * tx, bv);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = ssd_fma(av[i], bv[j], acc[i][j]);
  }
}

// ssd_mma restricted to the causal pairs of a diagonal tile (row tile == column tile):
// row 4·ty + i takes k-step k0 + k only if it is causal to it (REV: k0 + k ≥ row, else
// k0 + k ≤ row). The masked P entries are already 0, but 0·V would still turn an Inf or
// NaN of V at a later position into NaN at earlier rows, which the recurrence does not.
template <int KSTEPS, bool REV, typename Acc>
__device__ __forceinline__ void ssd_mma_causal(const Acc* __restrict__ a, int lda, const Acc* __restrict__ b,
                                               int ldb, int ty, int tx, int k0, Acc (&acc)[4][4]) {
#pragma unroll
  for (int k = 0; k < KSTEPS; ++k) {
    Acc av[4], bv[4];
    ssd_ld4(a + k * lda + 4 * ty, av);
    ssd_ld4(b + k * ldb + 4 * tx, bv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 4 * ty + i, col = k0 + k;
      if (REV ? col >= row : col <= row) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = ssd_fma(av[i], bv[j], acc[i][j]);
      }
    }
  }
}

// ssd_mma restricted to the pairs of one packed sequence (row 4·ty + i and k-step k0 + k
// with equal starts counts rseg, cseg: ssd_seq_masks), and on a diagonal tile (`diag`) to
// the causal ones as in ssd_mma_causal: a NaN or Inf of V in another sequence stays out.
template <int KSTEPS, bool REV, typename Acc>
__device__ __forceinline__ void ssd_mma_seg(const Acc* __restrict__ a, int lda, const Acc* __restrict__ b, int ldb,
                                            int ty, int tx, int k0, bool diag, const int32_t* rseg,
                                            const int32_t* cseg, Acc (&acc)[4][4]) {
#pragma unroll
  for (int k = 0; k < KSTEPS; ++k) {
    Acc av[4], bv[4];
    ssd_ld4(a + k * lda + 4 * ty, av);
    ssd_ld4(b + k * ldb + 4 * tx, bv);
    const int col = k0 + k;
    const int32_t cs = cseg[col];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 4 * ty + i;
      if (rseg[row] == cs && (!diag || (REV ? col >= row : col <= row))) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = ssd_fma(av[i], bv[j], acc[i][j]);
      }
    }
  }
}

// dst[k·LD + m] = get(m, k) for k < KS, m < 64 (get does its own bounds checks and
// returns 0 outside). KFAST: consecutive threads walk k, for sources contiguous in k;
// otherwise they walk m.
template <typename Acc, bool KFAST, typename Get>
__device__ __forceinline__ void ssd_fill(Acc* dst, Get get) {
  constexpr int KS = SsdCfg<Acc>::KS, LD = SsdCfg<Acc>::LD;
  constexpr int kPer = KS * kSsdTile / kSsdThreads;
  static_assert(kPer * kSsdThreads == KS * kSsdTile, "tile must split evenly over threads");
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int e = static_cast<int>(threadIdx.x) + u * kSsdThreads;
    const int k = KFAST ? e % KS : e / kSsdTile;
    const int m = KFAST ? e / KS : e % kSsdTile;
    dst[k * LD + m] = get(m, k);
  }
}

// Compile-time choice between two register arrays (no runtime indexing).
template <bool FIRST, typename A>
__device__ __forceinline__ A& ssd_pick(A& first, A& second) {
  if constexpr (FIRST)
    return first;
  else
    return second;
}

// Sum over the 16 threads of a row group (tx = lane % 16): xor butterfly, so every lane
// ends with the same bits (IEEE addition is commutative) and the order is fixed.
template <typename Acc>
__device__ __forceinline__ Acc ssd_sum16(Acc v) {
#pragma unroll
  for (int o = 8; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename Acc>
__device__ __forceinline__ Acc ssd_sum32(Acc v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- 1. chunk cumsum ---------------------------------------------------------------------
// A sequence start (seq_idx[b, t] != seq_idx[b, t−1]) at local position t of a chunk
// lowers Acs at t and after it by this much, and the sum restarts at t: a decay across
// the start underflows to 0 only while the earlier sequence's sum stays above
// −kSsdSeqOffset, so every kernel selects such terms instead (`seg`; see the header
// comment). Differences inside one sequence keep their value (the offset is an integer
// multiple of a power of two; it costs at most ~2^-40·(starts in the chunk) of absolute
// precision in Acs).
constexpr double kSsdSeqOffset = 4096.0;

template <typename Acc>
__device__ __forceinline__ Acc ssd_log1p(Acc v) {
  if constexpr (std::is_same_v<Acc, double>)
    return log1p(v);
  else
    return log1pf(v);
}

// The mamba_chunk_scan_combined dt processing of one raw value: dt + dt_bias, softplus
// where that is <= 20, clamp to [lo, hi] (comparisons, so NaN stays NaN). *grad is
// d(processed)/d(raw): 0 strictly outside [lo, hi], sigmoid(dt + dt_bias) where softplus
// applied, else 1.
template <typename Acc>
__device__ __forceinline__ Acc ssd_dt_process(Acc raw, Acc bias, bool softplus, Acc lo, Acc hi, Acc* grad) {
  Acc d = raw + bias;
  Acc g = 1;
  if (softplus && d <= Acc(20)) {
    const Acc e = ssd_exp(d);
    g = e / (Acc(1) + e);
    d = ssd_log1p(e);
  }
  if (d < lo || d > hi) g = 0;
  d = d < lo ? lo : d;
  d = d > hi ? hi : d;
  *grad = g;
  return d;
}

// The dt options of the launch, for the kernels that read raw dt (cumsum, finalize).
template <typename T>
struct SsdDtIn {
  const void* dt;
  bool dt_acc;  // dt is in Acc (the compute type), else in T
  int64_t s[3];
  const acc_t<T>* bias;  // [H] or null
  int64_t bias_s;
  bool softplus;
  acc_t<T> lo, hi;
  __device__ __forceinline__ acc_t<T> raw(int64_t b, int64_t t, int64_t h) const {
    const int64_t at = b * s[0] + t * s[1] + h * s[2];
    return dt_acc ? static_cast<const acc_t<T>*>(dt)[at] : to_acc(static_cast<const T*>(dt)[at]);
  }
  __device__ __forceinline__ acc_t<T> bias_of(int64_t h) const { return bias ? bias[h * bias_s] : acc_t<T>(0); }
};

template <typename T>
SsdDtIn<T> ssd_dt_in(const SsdChunkScanLaunch& l) {
  using Acc = acc_t<T>;
  SsdDtIn<T> d;
  d.dt = l.dt;
  d.dt_acc = l.dt_element != l.element;  // the contract allows `element` or `compute`
  for (int i = 0; i < 3; ++i) d.s[i] = l.dt_stride[i];
  d.bias = static_cast<const Acc*>(l.dt_bias);
  d.bias_s = l.dt_bias_stride;
  d.softplus = l.dt_softplus;
  d.lo = static_cast<Acc>(l.dt_min);
  d.hi = static_cast<Acc>(l.dt_max);
  return d;
}

template <typename T>
struct SsdCumsumParams {
  int64_t batch, seqlen, heads, chunk, nchunks, total_warps;
  SsdDtIn<T> dt;
  const acc_t<T>* A;
  int64_t A_s;
  const void* seq_idx;  // [B, L] int32 / int64, or null
  bool seq_i64;
  int64_t seq_s[2];
  double* acs;    // [B, H, L]
  acc_t<T>* dtf;  // [B, H, L]
  int32_t* seg = nullptr;  // [B, L] (ssd_seq_masks), or null
};

// Warp per (b, h, c): dt_s processed (ssd_dt_process) and stored in Acc for the later
// kernels; Acs_q = Σ_{s ≤ q} dt_s·A_h in double, in 32-wide segments (shuffle scan plus a
// carry), in the order fixed by the chunk, minus kSsdSeqOffset per sequence start in
// [chunk start, q] when seq_idx is given. With `seg` the sum also restarts at each start
// (from the start's own dt·A: an Inf or NaN dt of one sequence stays out of the next
// one's Acs, and the value of a position depends on its sequence alone; the sum of an
// earlier sequence can exceed the offset, so a restarted Acs can rise at a start: every
// kernel that reads it selects across a start), and the warps of head 0 store each
// position's count of starts there.
template <typename T>
__global__ void __launch_bounds__(kSsdThreads) ssd_cumsum_kernel(const SsdCumsumParams<T> p) {
  using Acc = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (kSsdThreads / 32);
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * (kSsdThreads / 32) + threadIdx.x / 32;
       w < p.total_warps; w += warps_per_grid) {
    const int64_t c = w % p.nchunks;
    const int64_t bh = w / p.nchunks;
    const int64_t h = bh % p.heads, b = bh / p.heads;
    const int64_t t0 = c * p.chunk;
    const int64_t len = min(p.chunk, p.seqlen - t0);
    const double a_h = static_cast<double>(p.A[h * p.A_s]);
    const Acc bias = p.dt.bias_of(h);
    double* acs = p.acs + bh * p.seqlen + t0;
    Acc* dtf = p.dtf + bh * p.seqlen + t0;
    double carry = 0;
    int seg_carry = 0;
    const bool restart = p.seg != nullptr;
    for (int64_t base = 0; base < len; base += 32) {
      const int64_t i = base + lane;
      Acc d = 0;
      int start = 0;  // 1 where a new sequence starts at t0 + i
      if (i < len) {
        Acc grad;
        d = ssd_dt_process<Acc>(p.dt.raw(b, t0 + i, h), bias, p.dt.softplus, p.dt.lo, p.dt.hi, &grad);
        const int64_t t = t0 + i;
        if (p.seq_idx != nullptr && t > 0) start = seq_starts_at(p.seq_idx, p.seq_i64, p.seq_s, b, t);
      }
      double v = static_cast<double>(d) * a_h;
      int sg = start;
      bool cut = restart && start;  // (restart) a start in [base, i]: v then sums from the last one
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, v, o);
        const int us = __shfl_up_sync(0xffffffffu, sg, o);
        const bool uc = __shfl_up_sync(0xffffffffu, cut, o);
        if (lane >= o) {
          if (!cut) v += u;
          sg += us;
          cut = cut || uc;
        }
      }
      const double a = cut ? v : carry + v;
      const int starts = seg_carry + sg;
      if (i < len) {
        acs[i] = starts == 0 ? a : a - kSsdSeqOffset * starts;
        dtf[i] = d;
        if (restart && h == 0) p.seg[b * p.seqlen + t0 + i] = starts;
      }
      carry = __shfl_sync(0xffffffffu, a, 31);
      seg_carry += __shfl_sync(0xffffffffu, sg, 31);
    }
  }
}

// ---- 2. chunk state (and the backward's local dstate) ------------------------------------
template <typename T>
struct SsdStateParams {
  int64_t batch, seqlen, heads, hpg, chunk, nchunks, D, N, total_blocks;
  int d_tiles, n_tiles;
  SsdOperand<T> xo;  // x (forward) or dy (backward), per head, [.., D]
  SsdOperand<T> yo;  // B (forward) or C (backward), per group, [.., N]
  const double* acs;
  const acc_t<T>* dtf;
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
  acc_t<T>* out;  // [B, H, nc, D, N]
};

// out[d, n] = Σ_s w_s · X_s[d] · Y_s[n] over the chunk's positions, a 64 × 64 tile per
// block with K = positions:
//   forward (DSTATE = false): X = x, Y = B, w_s = exp(Acs_last − Acs_s)·dt_s  → S_c
//   backward (DSTATE = true): X = dy, Y = C, w_s = exp(Acs_s)   → Σ_q exp(Acs_q)·dy_q ⊗ C_q
// With `seg`, a position whose weight crosses a sequence start (forward: not in the
// chunk's last sequence; backward: after a start) is 0 in both operands.
template <typename T, bool DSTATE>
__global__ void __launch_bounds__(kSsdThreads) ssd_chunk_state_kernel(const SsdStateParams<T> p) {
  using Acc = acc_t<T>;
  constexpr int KS = SsdCfg<Acc>::KS, LD = SsdCfg<Acc>::LD;
  __shared__ __align__(16) Acc sA[KS * LD];
  __shared__ __align__(16) Acc sB[KS * LD];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int64_t rest = vb;
    const int nt = static_cast<int>(rest % p.n_tiles);
    rest /= p.n_tiles;
    const int dtl = static_cast<int>(rest % p.d_tiles);
    rest /= p.d_tiles;
    const int64_t c = rest % p.nchunks;
    rest /= p.nchunks;
    const int64_t h = rest % p.heads, b = rest / p.heads;
    const int64_t g = h / p.hpg, bh = b * p.heads + h;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int d0 = dtl * kSsdTile, n0 = nt * kSsdTile;
    const double* acs = p.acs + bh * p.seqlen + t0;
    const Acc* dtf = p.dtf + bh * p.seqlen + t0;
    const double acs_last = acs[len - 1];
    const T* X = p.xo.p + b * p.xo.s[0] + t0 * p.xo.s[1] + h * p.xo.s[2];
    const T* Y = p.yo.p + b * p.yo.s[0] + t0 * p.yo.s[1] + g * p.yo.s[2];
    const int32_t* seg = p.seg != nullptr ? p.seg + b * p.seqlen + t0 : nullptr;
    const int32_t keep = seg == nullptr ? 0 : DSTATE ? 0 : seg[len - 1];
    auto out_of_seq = [&](int s) { return seg != nullptr && seg[s] != keep; };
    Acc acc[4][4] = {};
    for (int s0 = 0; s0 < len; s0 += KS) {
      __syncthreads();  // the previous step (or virtual block) is done with sA/sB
      ssd_fill<Acc, false>(sA, [&](int m, int k) -> Acc {
        const int s = s0 + k, d = d0 + m;
        if (s >= len || d >= p.D || out_of_seq(s)) return Acc(0);
        const Acc w = DSTATE ? ssd_decay<Acc>(acs[s]) : ssd_decay<Acc>(acs_last - acs[s]) * dtf[s];
        return w * to_acc(X[s * p.xo.s[1] + d * p.xo.s[3]]);
      });
      ssd_fill<Acc, false>(sB, [&](int m, int k) -> Acc {
        const int s = s0 + k, n = n0 + m;
        if (s >= len || n >= p.N || out_of_seq(s)) return Acc(0);
        return to_acc(Y[s * p.yo.s[1] + n * p.yo.s[3]]);
      });
      __syncthreads();
      ssd_mma<KS>(sA, LD, sB, LD, ty, tx, acc);
    }
    Acc* out = p.out + (bh * p.nchunks + c) * p.D * p.N;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = d0 + 4 * ty + i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + 4 * tx + j;
        if (d < p.D && n < p.N) out[static_cast<int64_t>(d) * p.N + n] = acc[i][j];
      }
    }
  }
}

// ---- 3. state passing --------------------------------------------------------------------
template <typename Acc>
struct SsdPassParams {
  int64_t batch, heads, seqlen, chunk, nchunks, dn, kblocks, total_blocks;
  const double* acs;
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
  Acc* states;         // [B, H, nc, D·N]: S_c in, H_c out (forward pass without a copy)
  Acc* gstates;        // [B, H, nc, D·N]: local dstate in, Gn_c out (backward pass)
  Acc* kpart;          // [B, H, nc, kblocks]
  void* copy;          // states_t (forward) or gstates_t (backward), or null (ssd_state_copies)
  const void* hcopy;   // backward with a copy: states_t (H_c rounded), read in place of states
  bool copy_only;      // backward with a copy: Gn_c goes to the copy alone (group_products:
                       // every reader of Gn_c takes the copy; the local dstate stays)
  // The run's seed and result, per (b, h) and element (d, n), each optional:
  //   forward: seed = initial_states (H_0), last = final_states (H_nc);
  //   backward: seed = dfinal_states (G_nc), last = dinitial_states (G_0).
  int64_t N;
  const Acc* seed;     // [B, H, D, N] at seed_s strides, or null (zeros)
  int64_t seed_s[4];
  Acc* last;           // dense [B, H, D, N], or null
  // Whether chunk c of batch row b holds a sequence start (with `seg`): its state then
  // does not reach the next chunk, which takes S_c alone (selected, so that a NaN or Inf
  // of the earlier sequence stays there).
  __device__ __forceinline__ bool reset(int64_t b, int64_t c) const {
    return seg != nullptr && seg[b * seqlen + min(c * chunk + chunk, seqlen) - 1] != 0;
  }
  __device__ __forceinline__ Acc seed_of(int64_t bh, int64_t e) const {
    if (seed == nullptr) return Acc(0);
    const int64_t b = bh / heads, h = bh % heads, d = e / N, n = e % N;
    return seed[b * seed_s[0] + h * seed_s[1] + d * seed_s[2] + n * seed_s[3]];
  }
};

// V consecutive elements at p: one 16-byte access where `vec` (the caller has checked
// that all V exist and p is 16-byte aligned) and V elements fill 16 bytes, else element
// by element up to n (0 past it). The state passes and the gate kernels use them.
// (Also one 8-byte access where V elements fill 8 bytes: the state copies' 4 16-bit
// values, p then 8-byte aligned.)
template <typename Acc, int V>
__device__ __forceinline__ void ssd_load_vec(Acc (&v)[V], const Acc* p, bool vec, int64_t n) {
  if constexpr (sizeof(Acc) * V == 16) {
    if (vec) {
      const uint4 t = *reinterpret_cast<const uint4*>(p);
      memcpy(v, &t, 16);
      return;
    }
  } else if constexpr (sizeof(Acc) * V == 8) {
    if (vec) {
      const uint2 t = *reinterpret_cast<const uint2*>(p);
      memcpy(v, &t, 8);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = i < n ? p[i] : Acc{};  // (Acc{}: no conversion from int for 16-bit types)
}
// (The same for the store.)
template <typename Acc, int V>
__device__ __forceinline__ void ssd_store_vec(Acc* p, const Acc (&v)[V], bool vec, int64_t n) {
  if constexpr (sizeof(Acc) * V == 16) {
    if (vec) {
      uint4 t;
      memcpy(&t, v, 16);
      *reinterpret_cast<uint4*>(p) = t;
      return;
    }
  } else if constexpr (sizeof(Acc) * V == 8) {
    if (vec) {
      uint2 t;
      memcpy(&t, v, 8);
      *reinterpret_cast<uint2*>(p) = t;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (i < n) p[i] = v[i];
}

// The V values rounded to O (the state copies), stored as ssd_store_vec stores.
template <typename O, typename Acc, int V>
__device__ __forceinline__ void ssd_store_rounded(O* p, const Acc (&v)[V], bool vec, int64_t n) {
  O o[V];
#pragma unroll
  for (int i = 0; i < V; ++i) o[i] = from_acc<O>(v[i]);
  ssd_store_vec(p, o, vec, n);
}

// Forward: per (b, h) and element e of D·N, sequentially over c:
//   H_0 = initial_states (or 0); H_{c+1} = exp(Acs_last(c))·H_c + S_c, storing H_c
//   where S_c was (or in the copy, below); final_states = H_nc (the state after the last step).
// A thread takes V = 16 bytes of elements (ssd_pass_vec); the chunks go kSsdPassWindow at
// a time: their S_c and decays are loaded before the window's steps run, so that many
// loads are in flight instead of one per step (the stores of H_c to the same buffer
// otherwise keep each load behind the previous step). Measured at the Mamba-2 2.7B shape
// (H200, bf16 inputs; BENCHMARKS.md): 121 µs forward and 169 µs backward with 16 bytes a
// thread, 143 and 218 µs with one element a thread.
// O (a 16-bit type, or Acc for none): with a copy, H_c is written only rounded, to p.copy:
// every later reader takes the copy (the products, and the backward pass's ⟨Gn_c, H_c⟩),
// which saves a float32 write of B·H·nc·D·N (168 MB; 137 -> 107 µs, H200).
// Windows of 4 and 4 resident blocks an SM (54 and 60 registers, bf16 copies; float64 keeps
// 2, as its backward pass would spill): a window of 8 took 88 and 110 registers, two blocks
// an SM, 25 % occupancy (ncu: 2.3 and 2.4 TB/s); the same bytes in flight an SM with twice
// the warps to cover each window's steps and stores (107 -> 73.5 µs forward, 137.5 -> 96.6
// backward, H200).
constexpr int kSsdPassWindow = 4;
template <typename Acc>
constexpr int kSsdPassBlocks = std::is_same_v<Acc, double> ? 2 : 4;

template <typename Acc, typename O = Acc>
__global__ void __launch_bounds__(kSsdThreads, kSsdPassBlocks<Acc>) ssd_state_pass_kernel(const SsdPassParams<Acc> p) {
  constexpr int V = ssd_pass_vec(std::is_same_v<Acc, double> ? ElementKind::F64 : ElementKind::F32);
  constexpr bool kCopy = !std::is_same_v<O, Acc>;
  const bool vec = p.dn % V == 0;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const int64_t bh = vb / p.kblocks;
    const int64_t e = ((vb % p.kblocks) * kSsdThreads + threadIdx.x) * V;
    if (e >= p.dn) continue;  // no barriers in this kernel
    const int64_t n = p.dn - e;
    const double* acs = p.acs + bh * p.seqlen;
    Acc* st = p.states + bh * p.nchunks * p.dn + e;
    O* cp = kCopy ? static_cast<O*>(p.copy) + bh * p.nchunks * p.dn + e : nullptr;
    Acc run[V];
#pragma unroll
    for (int i = 0; i < V; ++i) run[i] = i < n ? p.seed_of(bh, e + i) : Acc(0);
    for (int64_t c0 = 0; c0 < p.nchunks; c0 += kSsdPassWindow) {
      Acc s[kSsdPassWindow][V], dec[kSsdPassWindow];
      bool cut[kSsdPassWindow];
#pragma unroll
      for (int i = 0; i < kSsdPassWindow; ++i) {
        const int64_t c = c0 + i;
        cut[i] = false;
        if (c < p.nchunks) {
          ssd_load_vec(s[i], st + c * p.dn, vec, n);
          dec[i] = ssd_decay<Acc>(acs[min(c * p.chunk + p.chunk, p.seqlen) - 1]);
          cut[i] = p.reset(bh / p.heads, c);
        }
      }
#pragma unroll
      for (int i = 0; i < kSsdPassWindow; ++i) {
        if (c0 + i >= p.nchunks) break;
        if constexpr (kCopy) ssd_store_rounded(cp + (c0 + i) * p.dn, run, vec, n);
        else ssd_store_vec(st + (c0 + i) * p.dn, run, vec, n);
#pragma unroll
        for (int k = 0; k < V; ++k) run[k] = cut[i] ? s[i][k] : dec[i] * run[k] + s[i][k];
      }
    }
    if (p.last != nullptr) ssd_store_vec(p.last + bh * p.dn + e, run, vec, n);
  }
}

// Backward: per (b, h) and element e, from the last chunk down:
//   G_nc = dfinal_states (or 0); Gn_c = G_{c+1} (stored where the local dstate was);
//   G_c = local_c + exp(Acs_last(c))·G_{c+1};
// and kpart[b,h,c,block] = Σ_{e in block} Gn_c[e]·H_c[e]: each thread's V products in
// order, then a fixed tree over the block (W_c = exp(Acs_last(c)) · Σ_blocks kpart).
// O as in the forward pass: each Gn_c is also written, rounded, to p.copy, and H_c comes
// from the forward pass's copy (p.hcopy; the kpart products then round H_c as mamba_ssm's
// _state_passing_bwd does with its 16-bit states).
// Each warp's sums of kSsdPassDeferWindows windows wait in shared memory and are reduced
// over the warps once for all of them (two barriers per that many windows instead of two
// a window), so that the warps of a block run their windows' loads without waiting for
// each other; the same sums in the same order (alone 132.6 -> 126.1 us under ncu at the
// 2.7B shape, H100; level in the pass, where it runs beside dCB: BENCHMARKS.md).
constexpr int kSsdPassDeferWindows = 8;

template <typename Acc, typename O = Acc>
__global__ void __launch_bounds__(kSsdThreads, kSsdPassBlocks<Acc>) ssd_state_pass_bwd_kernel(const SsdPassParams<Acc> p) {
  constexpr int V = ssd_pass_vec(std::is_same_v<Acc, double> ? ElementKind::F64 : ElementKind::F32);
  constexpr bool kCopy = !std::is_same_v<O, Acc>;
  __shared__ Acc red[kSsdPassDeferWindows * kSsdPassWindow][kSsdThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool vec = p.dn % V == 0;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const int64_t bh = vb / p.kblocks, kb = vb % p.kblocks;
    const int64_t e = (kb * kSsdThreads + threadIdx.x) * V;
    const bool ok = e < p.dn;
    const int64_t n = ok ? p.dn - e : 0;
    const double* acs = p.acs + bh * p.seqlen;
    Acc* gs = p.gstates + bh * p.nchunks * p.dn + e;
    // H_c as stored: the forward pass's copy with one (its 16-bit values are widened where
    // they are used, so that a window's loads all go out before the first is waited for)
    using Hv = std::conditional_t<kCopy, O, Acc>;
    const Hv* hs = static_cast<const Hv*>(kCopy ? p.hcopy : p.states) + bh * p.nchunks * p.dn + e;
    O* cp = kCopy ? static_cast<O*>(p.copy) + bh * p.nchunks * p.dn + e : nullptr;
    Acc run[V];  // G_{c+1}
#pragma unroll
    for (int i = 0; i < V; ++i) run[i] = i < n ? p.seed_of(bh, e + i) : Acc(0);
    // windows of kSsdPassWindow chunks from the last one down (see ssd_state_pass_kernel)
    int64_t top = p.nchunks - 1;  // the last chunk of the windows whose sums wait in red[]
    for (int64_t c0 = p.nchunks - 1; c0 >= 0; c0 -= kSsdPassWindow) {
      Acc local[kSsdPassWindow][V], dec[kSsdPassWindow], kd[kSsdPassWindow];
      Hv h[kSsdPassWindow][V];
      bool cut[kSsdPassWindow];
#pragma unroll
      for (int i = 0; i < kSsdPassWindow; ++i) {
        const int64_t c = c0 - i;
        dec[i] = Acc(0);
        cut[i] = c >= 0 && p.reset(bh / p.heads, c);
#pragma unroll
        for (int k = 0; k < V; ++k) local[i][k] = Acc(0), h[i][k] = Hv{};
        if (c >= 0) {
          if (ok) {
            ssd_load_vec(local[i], gs + c * p.dn, vec, n);
            ssd_load_vec(h[i], hs + c * p.dn, vec, n);
          }
          dec[i] = ssd_decay<Acc>(acs[min(c * p.chunk + p.chunk, p.seqlen) - 1]);
        }
      }
#pragma unroll
      for (int i = 0; i < kSsdPassWindow; ++i) {
        kd[i] = Acc(0);
        if (c0 - i < 0) continue;
        if (ok && !(kCopy && p.copy_only)) ssd_store_vec(gs + (c0 - i) * p.dn, run, vec, n);
        if (kCopy && ok) ssd_store_rounded(cp + (c0 - i) * p.dn, run, vec, n);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          kd[i] += run[k] * to_acc(h[i][k]);
          run[k] = cut[i] ? local[i][k] : local[i][k] + dec[i] * run[k];
        }
      }
      const int slot = static_cast<int>(top - c0);  // this window's first row of red[]
#pragma unroll
      for (int i = 0; i < kSsdPassWindow; ++i) {
        const Acc t = ssd_sum32(kd[i]);
        if (lane == 0) red[slot + i][warp] = t;
      }
      if (slot + kSsdPassWindow == kSsdPassDeferWindows * kSsdPassWindow || c0 - kSsdPassWindow < 0) {
        __syncthreads();
        const int64_t c = top - threadIdx.x;
        if (threadIdx.x < slot + kSsdPassWindow && c >= 0) {
          Acc t = 0;
#pragma unroll
          for (int w = 0; w < kSsdThreads / 32; ++w) t += red[threadIdx.x][w];
          p.kpart[(bh * p.nchunks + c) * p.kblocks + kb] = t;
        }
        __syncthreads();  // (red[] is read before the next windows write it)
        top = c0 - kSsdPassWindow;
      }
    }
    if (ok && p.last != nullptr) ssd_store_vec(p.last + bh * p.dn + e, run, vec, n);  // G_0 = dL/dH_0
  }
}

// ---- 4. the chunk scan products ----------------------------------------------------------
// The output options of Y and DX, applied per element to the float accumulator v of
// (b, t, h, j) before it is rounded to T (Y: val = x, DX: val = dy, already dy_pre):
//   v += D_h·val (or D_{h,j}·val);  Y only: y_pre_out = v;  out = v·silu(z).
template <typename T>
struct SsdEpilogue {
  bool on = false;                 // any of the below (else the plain store)
  const acc_t<T>* D = nullptr;     // D[h·D_s0 + j·D_s1] (D_s1 = 0 for a [H] D)
  int64_t D_s0 = 0, D_s1 = 0;
  const T* z = nullptr;            // Y only
  int64_t z_s[4] = {};
  T* y_pre = nullptr;              // Y only: dense [B, L, H, J]
};

template <typename T>
__device__ __forceinline__ acc_t<T> ssd_epilogue(const SsdEpilogue<T>& e, acc_t<T> v, const SsdOperand<T>& val,
                                                 int64_t b, int64_t t, int64_t h, int64_t j, int64_t out_at) {
  using Acc = acc_t<T>;
  if (e.D != nullptr)
    v += e.D[h * e.D_s0 + j * e.D_s1] * to_acc(val.p[b * val.s[0] + t * val.s[1] + h * val.s[2] + j * val.s[3]]);
  if (e.y_pre != nullptr) e.y_pre[out_at] = from_acc<T>(v);
  if (e.z != nullptr) {
    const Acc zv = to_acc(e.z[b * e.z_s[0] + t * e.z_s[1] + h * e.z_s[2] + j * e.z_s[3]]);
    v *= zv / (Acc(1) + ssd_exp(-zv));
  }
  return v;
}

template <typename T>
struct SsdScanParams {
  int64_t batch, seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int64_t nsplit, hps;  // DC/DB: head splits per group, heads per split (1, H/G if unsplit)
  int K1, J;  // contraction length of Lft (N for Y/DX, D for DC/DB); output columns
  int r_tiles, j_tiles;
  SsdOperand<T> lft, rgt, val, dot;
  const acc_t<T>* state;  // [B, H, nc, D, N]: H_c (Y, DC) or Gn_c (DX, DB)
  int64_t state_sk, state_sj;
  const double* acs;
  const acc_t<T>* dtf;
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
  T* out;           // dense [B, L, H or G, J]
  acc_t<T>* out_split;  // DC/DB with nsplit > 1: [nsplit, B, L, G, J] instead of out
  acc_t<T>* part;   // [B, H, L, j_tiles] row-dot partials, DX: x·dxpre (full), DC: U
  acc_t<T>* part2;  // [B, H, L, j_tiles] DX: x·dxpre (inter-chunk part only), for V
  SsdEpilogue<T> epi;  // Y, DX
};

// part[r·tiles + jt] = Σ_j dot(r, j)·v[i][j] for the thread's 4 rows r (rows ≥ len
// skipped; rows i with bit i of `zero` set are 0), reduced over the 16 threads of a row
// group in a fixed tree.
template <typename T, typename Acc>
__device__ __forceinline__ void ssd_row_dot(const T* dot, int64_t s_t, int64_t s_j, int r0, int len,
                                            int j0, int J, const Acc (&v)[4][4], Acc* part, int tiles,
                                            int jt, int ty, int tx, unsigned zero = 0) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rg = r0 + 4 * ty + i;
    Acc sdot = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int jg = j0 + 4 * tx + j;
      if (rg < len && jg < J && !(zero >> i & 1u))
        sdot += to_acc(dot[static_cast<int64_t>(rg) * s_t + jg * s_j]) * v[i][j];
    }
    sdot = ssd_sum16(sdot);
    if (tx == 0 && rg < len) part[static_cast<int64_t>(rg) * tiles + jt] = sdot;
  }
}

// EPI (Y, DX with an option of p.epi): a separate instantiation, so that the plain
// kernel keeps its registers.
// SEG (p.seg given: ssd_seq_masks) likewise.
template <typename T, int MODE, bool EPI = false, bool SEG = false>
__global__ void __launch_bounds__(kSsdThreads, 2) ssd_scan_kernel(const SsdScanParams<T> p) {
  using Acc = acc_t<T>;
  constexpr int KS = SsdCfg<Acc>::KS, LD = SsdCfg<Acc>::LD;
  constexpr bool kRev = MODE == kSsdDX || MODE == kSsdDB;     // causal partners c ≥ r
  constexpr bool kMulti = MODE == kSsdDC || MODE == kSsdDB;   // per group, sum over heads
  constexpr bool kStateKFast = MODE == kSsdY || MODE == kSsdDX;  // S(k, j) = state[j·N + k]
  // DC's U needs this head's inter-chunk part alone, and SEG's DB selects rows of it
  constexpr bool kHeadAcc = MODE == kSsdDC || (SEG && MODE == kSsdDB);
  __shared__ __align__(16) Acc sA[KS * LD];          // Lft tile, k-major
  __shared__ __align__(16) Acc sB[KS * LD];          // S, Rgt or V tile, k-major
  __shared__ __align__(16) Acc sP[kSsdTile * kSsdTile];  // P(r, c) stored at [c][r]
  __shared__ double sRowAcs[kSsdTile], sColAcs[kSsdTile];
  __shared__ Acc sRowDt[kSsdTile], sRowScale[kSsdTile], sColDt[kSsdTile];
  __shared__ int32_t sRowSeg[kSsdTile], sColSeg[kSsdTile];  // with seg: starts counts
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t n_hg = kMulti ? p.groups * p.nsplit : p.heads;  // (g, split) or h

  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int64_t rest = vb;
    const int jt = static_cast<int>(rest % p.j_tiles);
    rest /= p.j_tiles;
    const int rt = static_cast<int>(rest % p.r_tiles);
    rest /= p.r_tiles;
    const int64_t c = rest % p.nchunks;
    rest /= p.nchunks;
    const int64_t hg = rest % n_hg, b = rest / n_hg;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = rt * kSsdTile, j0 = jt * kSsdTile;
    if (r0 >= len) continue;  // a row tile past the end of the last (short) chunk
    const int n_ct = (len + kSsdTile - 1) / kSsdTile;
    const int ct_begin = kRev ? rt : 0, ct_end = kRev ? n_ct : rt + 1;
    const int64_t g = kMulti ? hg / p.nsplit : hg / p.hpg;
    const int64_t split = kMulti ? hg % p.nsplit : 0;
    const int64_t h_begin = kMulti ? g * p.hpg + split * p.hps : hg;
    const int nh = kMulti ? static_cast<int>(min(p.hps, (g + 1) * p.hpg - h_begin)) : 1;
    // With seg: the chunk's starts counts, and the count of the rows that the state term
    // reaches (Y, DC: H_c, before any start; DX, DB: Gn, the chunk's last sequence)
    const int32_t* seg = SEG ? p.seg + b * p.seqlen + t0 : nullptr;
    const int32_t reach = SEG && kRev ? seg[len - 1] : 0;

    // acc: the block's output tile. DC (and SEG's DB) computes each head's inter-chunk
    // term into accH first (for that head's U row dot; for the rows SEG selects) and then
    // adds it to acc; everything else accumulates into acc directly.
    Acc acc[4][4], accH[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0;
    Acc(&hacc)[4][4] = ssd_pick<kHeadAcc>(accH, acc);

    for (int hi = 0; hi < nh; ++hi) {  // the split's heads in order (one head for Y/DX)
      const int64_t h = h_begin + hi;
      const int64_t bh = b * p.heads + h;
      const double* acs = p.acs + bh * p.seqlen + t0;
      const Acc* dtf = p.dtf + bh * p.seqlen + t0;
      const double acs_last = acs[len - 1];
      auto base = [&](const SsdOperand<T>& o) {
        return o.p + b * o.s[0] + t0 * o.s[1] + (o.per_head ? h : g) * o.s[2];
      };
      const T* lft = base(p.lft);
      const T* rgt = base(p.rgt);
      const T* val = base(p.val);
      const Acc* st = p.state + (bh * p.nchunks + c) * static_cast<int64_t>(p.K1) * p.J;

      __syncthreads();  // the previous head / virtual block is done with all shared memory
      if (threadIdx.x < kSsdTile) {
        const int r = r0 + threadIdx.x;
        const bool ok = r < len;
        const double ar = ok ? acs[r] : 0.0;
        const Acc dr = ok ? dtf[r] : Acc(0);
        sRowAcs[threadIdx.x] = ar;
        sRowDt[threadIdx.x] = dr;
        Acc scale = kRev ? ssd_decay<Acc>(acs_last - ar) : ssd_decay<Acc>(ar);
        if (MODE == kSsdDB) scale *= dr;
        sRowScale[threadIdx.x] = ok ? scale : Acc(0);
        if constexpr (SEG) sRowSeg[threadIdx.x] = ok ? seg[r] : reach;
      }
      __syncthreads();  // row data visible (also when K1 == 0 skips the loop below)
      // Lft(r, k) for the tile's rows, times rs_r when SCALED; 0 outside the chunk and
      // past K1.
      auto get_lft = [&](int k0, auto scaled) {
        return [&, k0](int m, int k) -> Acc {
          const int r = r0 + m, kk = k0 + k;
          if (r >= len || kk >= p.K1) return Acc(0);
          const Acc v = to_acc(lft[static_cast<int64_t>(r) * p.lft.s[1] + kk * p.lft.s[3]]);
          return decltype(scaled)::value ? v * sRowScale[m] : v;
        };
      };
      if constexpr (kHeadAcc) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) accH[i][j] = 0;
      }

      // (a) inter-chunk term: hacc += (diag(rs) · Lft) · S, K = K1 (hacc = accH for DC
      //     and SEG's DB, acc otherwise).
      for (int k0 = 0; k0 < p.K1; k0 += KS) {
        __syncthreads();
        ssd_fill<Acc, true>(sA, get_lft(k0, std::true_type{}));
        ssd_fill<Acc, kStateKFast>(sB, [&](int m, int k) -> Acc {
          const int kk = k0 + k, j = j0 + m;
          if (kk >= p.K1 || j >= p.J) return Acc(0);
          return st[kk * p.state_sk + j * p.state_sj];
        });
        __syncthreads();
        ssd_mma<KS>(sA, LD, sB, LD, ty, tx, hacc);
      }
      // With seg, the rows that a sequence start separates from the state: selected to 0
      // (their scaled Lft rows are 0, or NaN, and 0 times a NaN of the state is NaN).
      unsigned cut_rows = 0;
      if constexpr (SEG) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (sRowSeg[4 * ty + i] == reach) continue;
          cut_rows |= 1u << i;
#pragma unroll
          for (int j = 0; j < 4; ++j) hacc[i][j] = 0;
        }
      }
      // Row dots of the inter-chunk part over this column tile: DX: x·dxpre_inter (→ V,
      // one head, so acc holds only the inter part here); DC: C·(this head's inter part
      // of dC) = U.
      if constexpr (MODE == kSsdDX || MODE == kSsdDC) {
        const T* dot = base(p.dot);
        Acc* part = (MODE == kSsdDX ? p.part2 : p.part) + (bh * p.seqlen + t0) * p.j_tiles;
        ssd_row_dot<T, Acc>(dot, p.dot.s[1], p.dot.s[3], r0, len, j0, p.J, hacc, part, p.j_tiles, jt, ty, tx,
                            cut_rows);
      }
      if constexpr (kHeadAcc) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += accH[i][j];
      }

      // (b) intra-chunk term over the causal column tiles:
      //     P(r, c) = (Σ_k Lft(r,k)·Rgt(c,k)) · dec(r, c), masked; acc += P · V.
      for (int ct = ct_begin; ct < ct_end; ++ct) {
        const int c0 = ct * kSsdTile;
        __syncthreads();  // previous P·V is done with sColAcs/sColDt/sP/sB
        if (threadIdx.x < kSsdTile) {
          const int cc = c0 + threadIdx.x;
          sColAcs[threadIdx.x] = cc < len ? acs[cc] : 0.0;
          sColDt[threadIdx.x] = cc < len ? dtf[cc] : Acc(0);
          if constexpr (SEG) sColSeg[threadIdx.x] = cc < len ? seg[cc] : 0;
        }
        // (block-uniform) a sequence start inside the tile pair's positions: P·V takes
        // only the pairs of one sequence (the counts grow with the position)
        const bool split = SEG && seg[min(r0, c0)] != seg[min(max(r0, c0) + kSsdTile, len) - 1];
        Acc accP[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) accP[i][j] = 0;
        for (int k0 = 0; k0 < p.K1; k0 += KS) {
          if (k0 > 0) __syncthreads();
          ssd_fill<Acc, true>(sA, get_lft(k0, std::false_type{}));
          ssd_fill<Acc, true>(sB, [&](int m, int k) -> Acc {
            const int cc = c0 + m, kk = k0 + k;
            if (cc >= len || kk >= p.K1) return Acc(0);
            return to_acc(rgt[static_cast<int64_t>(cc) * p.rgt.s[1] + kk * p.rgt.s[3]]);
          });
          __syncthreads();
          ssd_mma<KS>(sA, LD, sB, LD, ty, tx, accP);
        }
        __syncthreads();  // sColAcs/sColDt visible even when K1 == 0
        // Decay and causal mask (with seg: and the pairs of one sequence); P is stored
        // transposed (sP[c][r]) so that it is the k-major left operand of P · V. Masked
        // entries are set, not multiplied, to 0.
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int cl = 4 * tx + j, cg = c0 + cl;
          Acc col[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int rl = 4 * ty + i, rg = r0 + rl;
            const bool causal = kRev ? cg >= rg : cg <= rg;
            Acc v = 0;
            if (causal && rg < len && cg < len && (!SEG || sRowSeg[rl] == sColSeg[cl])) {
              if (kRev) {
                v = accP[i][j] * ssd_decay<Acc>(sColAcs[cl] - sRowAcs[rl]);
                if (MODE == kSsdDB) v *= sRowDt[rl];
              } else {
                v = accP[i][j] * (ssd_decay<Acc>(sRowAcs[rl] - sColAcs[cl]) * sColDt[cl]);
              }
            }
            col[i] = v;
          }
          ssd_st4(sP + cl * kSsdTile + 4 * ty, col);
        }
        for (int k0 = 0; k0 < kSsdTile; k0 += KS) {
          __syncthreads();  // sP written / previous V tile consumed
          ssd_fill<Acc, false>(sB, [&](int m, int k) -> Acc {
            const int cc = c0 + k0 + k, j = j0 + m;
            if (cc >= len || j >= p.J) return Acc(0);
            return to_acc(val[static_cast<int64_t>(cc) * p.val.s[1] + j * p.val.s[3]]);
          });
          __syncthreads();
          if (split)
            ssd_mma_seg<KS, kRev>(sP + k0 * kSsdTile, kSsdTile, sB, LD, ty, tx, k0, ct == rt, sRowSeg, sColSeg,
                                  acc);
          else if (ct == rt)
            ssd_mma_causal<KS, kRev>(sP + k0 * kSsdTile, kSsdTile, sB, LD, ty, tx, k0, acc);
          else
            ssd_mma<KS>(sP + k0 * kSsdTile, kSsdTile, sB, LD, ty, tx, acc);
        }
      }
    }

    // DX: ddt(direct) partial = Σ_j x(r,j)·dxpre(r,j) over this column tile.
    if constexpr (MODE == kSsdDX) {
      const int64_t bh = b * p.heads + hg;
      const T* dot = p.dot.p + b * p.dot.s[0] + t0 * p.dot.s[1] + hg * p.dot.s[2];
      ssd_row_dot<T, Acc>(dot, p.dot.s[1], p.dot.s[3], r0, len, j0, p.J, acc,
                          p.part + (bh * p.seqlen + t0) * p.j_tiles, p.j_tiles, jt, ty, tx);
    }

    // Epilogue: DX scales by dt_r (dx = dt·dxpre); sRowDt still holds the only head's dt.
    // Split DC/DB write their float partial instead.
    const int64_t n_out = kMulti ? p.groups : p.heads;
    const int64_t i_out = kMulti ? g : hg;
    const bool to_split = kMulti && p.nsplit > 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int rl = 4 * ty + i, rg = r0 + rl;
      if (rg >= len) continue;
      const Acc rscale = MODE == kSsdDX ? sRowDt[rl] : Acc(1);
      const int64_t row = ((b * p.seqlen + t0 + rg) * n_out + i_out) * p.J;
      T* orow = p.out + row;
      Acc* prow = p.out_split + split * p.batch * p.seqlen * n_out * p.J + row;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int jg = j0 + 4 * tx + j;
        if (jg >= p.J) continue;
        if (to_split) {
          prow[jg] = acc[i][j];
        } else {
          Acc v = MODE == kSsdDX ? acc[i][j] * rscale : acc[i][j];
          if constexpr (EPI) v = ssd_epilogue<T>(p.epi, v, p.val, b, t0 + rg, hg, jg, row + jg);
          orow[jg] = from_acc<T>(v);
        }
      }
    }
  }
}

// out[i] = Σ_{split < nsplit} part[split·count + i], in split order.
template <typename T>
__global__ void __launch_bounds__(kSsdThreads) ssd_split_sum_kernel(const acc_t<T>* part, int64_t nsplit,
                                                                   int64_t count, T* out) {
  using Acc = acc_t<T>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kSsdThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kSsdThreads) {
    Acc v = 0;
    for (int64_t sp = 0; sp < nsplit; ++sp) v += part[sp * count + i];
    out[i] = from_acc<T>(v);
  }
}

// out (dC or dB, the launch's element type, [B, L, G, N] dense) = Σ_splits of `part`
// ([nsplit, B·L·G·N] in the compute type): ssd_split_sum_kernel, launched from
// ssd_chunk_scan_backward_dc.cu only, so that DC's and DB's launchers share one copy.
void ssd_split_sum(const SsdChunkScanLaunch& l, const void* part, int64_t nsplit, void* out, cudaStream_t stream);

// ---- 5. the crossing sums X_s ------------------------------------------------------------
template <typename T>
struct SsdDacsParams {
  int64_t seqlen, heads, hpg, chunk, nchunks, total_blocks;
  int D, N;
  SsdOperand<T> x, dy, B, C;
  const double* acs;
  const acc_t<T>* dtf;
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
  acc_t<T>* xs;  // [B, H, L]
};

// Block per (b, h, c): X_s = Σ_{q ≥ s} Σ_{s' < s} T_qs' with
//   T_qs' = (C_q·B_s')·(dy_q·x_s')·exp(Acs_q − Acs_s')·dt_s'  for s' < q, else 0,
// walking the lower-triangular 64×64 tiles (rows q in tile i, columns s' in tile j ≤ i)
// in a fixed order. For a tile with j < i, its pairs cross
//   s in tile j:  Σ_{s' < s} colsum(s')           (prefix of column sums)
//   s in tile i:  Σ_{q ≥ s} rowsum(q)             (suffix of row sums, over all j < i)
//   s strictly between the tiles: the tile's full sum;
// a diagonal tile contributes Σ_{q ≥ s} Σ_{s' < s} T_qs' inside itself. The block owns
// its chunk's slice of xs and adds to it in that fixed order (barriers between steps).
// The X_s of one finished tile of T: sT holds T for rows r0.. (tile ti) and columns c0..
// (tile tj), row stride kSsdTile + 1; xs is the chunk's slice. Off the diagonal (tj < ti)
// the tile adds its column-sum prefixes to the s of tile tj, its full sum to the s strictly
// between the tiles, and its row sums to sRowTot (the suffix that the diagonal tile of row
// tile ti adds); the diagonal tile replaces sT's rows by their exclusive prefixes and adds
// Σ_{q ≥ s} (R_q(s) + sRowTot(q)). Every thread of the block calls it (it has barriers),
// after a barrier that makes sT visible.
template <typename Acc, int kThreads>
__device__ __forceinline__ void ssd_dacs_add_tile(Acc* sT, Acc* sRowTot, Acc* sColSum, Acc& sFull,
                                                  Acc* xs, bool diagonal, int r0, int c0, int len) {
  static_assert(kThreads >= 2 * kSsdTile, "column and row sums take a thread each");
  constexpr int TLD = kSsdTile + 1;
  const int tid = threadIdx.x;
  if (!diagonal) {
    if (tid < kSsdTile) {  // column sums over the tile's rows
      Acc cs = 0;
      for (int q = 0; q < kSsdTile; ++q) cs += sT[q * TLD + tid];
      sColSum[tid] = cs;
    } else if (tid < 2 * kSsdTile) {  // row sums, accumulated over tj < ti
      const int q = tid - kSsdTile;
      Acc rsum = 0;
      for (int sl = 0; sl < kSsdTile; ++sl) rsum += sT[q * TLD + sl];
      sRowTot[q] += rsum;
    }
    __syncthreads();
    if (tid < kSsdTile) {  // s in tile tj: Σ_{s' < s} colsum(s')
      Acc pre = 0;
      for (int sl = 0; sl < tid; ++sl) pre += sColSum[sl];
      if (c0 + tid < len) xs[c0 + tid] += pre;
      if (tid == kSsdTile - 1) sFull = pre + sColSum[tid];
    }
    __syncthreads();
    const Acc full = sFull;  // s strictly between the tiles: every pair crosses
    for (int sg = c0 + kSsdTile + tid; sg < r0; sg += kThreads) xs[sg] += full;
  } else {
    // Diagonal tile: R_q(s) = Σ_{s' < s} T_qs' (exclusive prefix along each row) ...
    if (tid < kSsdTile) {
      Acc run = 0;
      for (int sl = 0; sl < kSsdTile; ++sl) {
        const Acc v = sT[tid * TLD + sl];
        sT[tid * TLD + sl] = run;
        run += v;
      }
    }
    __syncthreads();
    // ... then X_s += Σ_{q ≥ s} (R_q(s) + rowtot(q)) over the tile's rows.
    if (tid < kSsdTile && r0 + tid < len) {
      Acc xsum = 0;
      for (int ql = tid; ql < kSsdTile; ++ql) xsum += sT[ql * TLD + tid] + sRowTot[ql];
      xs[r0 + tid] += xsum;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kSsdThreads) ssd_dacs_kernel(const SsdDacsParams<T> p) {
  using Acc = acc_t<T>;
  constexpr int KS = SsdCfg<Acc>::KS, LD = SsdCfg<Acc>::LD;
  constexpr int TLD = kSsdTile + 1;  // odd row stride: row walks and column walks conflict-free
  __shared__ __align__(16) Acc sA[KS * LD];
  __shared__ __align__(16) Acc sB[KS * LD];
  __shared__ Acc sT[kSsdTile * TLD];
  __shared__ double sRowAcs[kSsdTile], sColAcs[kSsdTile];
  __shared__ Acc sColDt[kSsdTile];
  __shared__ int32_t sRowSeg[kSsdTile], sColSeg[kSsdTile];  // starts counts (0 without seg)
  __shared__ Acc sRowTot[kSsdTile], sColSum[kSsdTile];
  __shared__ Acc sFull;
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    const int64_t c = vb % p.nchunks, bh = vb / p.nchunks;
    const int64_t h = bh % p.heads, b = bh / p.heads, g = h / p.hpg;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const double* acs = p.acs + bh * p.seqlen + t0;
    const Acc* dtf = p.dtf + bh * p.seqlen + t0;
    Acc* xs = p.xs + bh * p.seqlen + t0;
    const T* xp = p.x.p + b * p.x.s[0] + t0 * p.x.s[1] + h * p.x.s[2];
    const T* dyp = p.dy.p + b * p.dy.s[0] + t0 * p.dy.s[1] + h * p.dy.s[2];
    const T* bp = p.B.p + b * p.B.s[0] + t0 * p.B.s[1] + g * p.B.s[2];
    const T* cp = p.C.p + b * p.C.s[0] + t0 * p.C.s[1] + g * p.C.s[2];
    const int32_t* seg = p.seg != nullptr ? p.seg + b * p.seqlen + t0 : nullptr;
    __syncthreads();  // the previous virtual block is done with shared memory
    for (int s = tid; s < len; s += kSsdThreads) xs[s] = 0;
    const int n_t = (len + kSsdTile - 1) / kSsdTile;
    for (int ti = 0; ti < n_t; ++ti) {
      const int r0 = ti * kSsdTile;
      __syncthreads();  // the previous row tile's readers of sRowAcs/sRowTot are done
      if (tid < kSsdTile) {
        sRowAcs[tid] = r0 + tid < len ? acs[r0 + tid] : 0.0;
        sRowSeg[tid] = seg != nullptr && r0 + tid < len ? seg[r0 + tid] : 0;
        sRowTot[tid] = 0;
      }
      for (int tj = 0; tj <= ti; ++tj) {
        const int c0 = tj * kSsdTile;
        __syncthreads();  // the previous tile is done with sT, sColAcs, sColDt, sA, sB
        if (tid < kSsdTile) {
          sColAcs[tid] = c0 + tid < len ? acs[c0 + tid] : 0.0;
          sColDt[tid] = c0 + tid < len ? dtf[c0 + tid] : Acc(0);
          sColSeg[tid] = seg != nullptr && c0 + tid < len ? seg[c0 + tid] : 0;
        }
        // accCB(q, s') = C_q·B_s' (K = N), accYX(q, s') = dy_q·x_s' (K = D)
        Acc accCB[4][4], accYX[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) accCB[i][j] = 0, accYX[i][j] = 0;
        auto product = [&](const T* lp, const SsdOperand<T>& lo, const T* rp, const SsdOperand<T>& ro,
                           int K, Acc(&out)[4][4]) {
          for (int k0 = 0; k0 < K; k0 += KS) {
            __syncthreads();
            ssd_fill<Acc, true>(sA, [&](int m, int k) -> Acc {
              const int q = r0 + m, kk = k0 + k;
              if (q >= len || kk >= K) return Acc(0);
              return to_acc(lp[static_cast<int64_t>(q) * lo.s[1] + kk * lo.s[3]]);
            });
            ssd_fill<Acc, true>(sB, [&](int m, int k) -> Acc {
              const int sc = c0 + m, kk = k0 + k;
              if (sc >= len || kk >= K) return Acc(0);
              return to_acc(rp[static_cast<int64_t>(sc) * ro.s[1] + kk * ro.s[3]]);
            });
            __syncthreads();
            ssd_mma<KS>(sA, LD, sB, LD, ty, tx, out);
          }
        };
        product(cp, p.C, bp, p.B, p.N, accCB);
        product(dyp, p.dy, xp, p.x, p.D, accYX);
        __syncthreads();  // row/column data visible even when N == D == 0
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int ql = 4 * ty + i, q = r0 + ql;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int sl = 4 * tx + j, sc = c0 + sl;
            Acc v = 0;
            if (q < len && sc < q && sRowSeg[ql] == sColSeg[sl])  // (selected: pairs of one sequence)
              v = accCB[i][j] * accYX[i][j] * (ssd_decay<Acc>(sRowAcs[ql] - sColAcs[sl]) * sColDt[sl]);
            sT[ql * TLD + sl] = v;
          }
        }
        __syncthreads();
        ssd_dacs_add_tile<Acc, kSsdThreads>(sT, sRowTot, sColSum, sFull, xs, tj == ti, r0, c0, len);
      }
    }
  }
}

// ---- 6. backward finalize ----------------------------------------------------------------
template <typename T>
struct SsdFinalizeParams {
  int64_t batch, seqlen, heads, chunk, nchunks, total;  // total: B·H·nc (a block each)
  int64_t kblocks, d_tiles, n_tiles;
  const acc_t<T>* A;
  int64_t A_s;
  SsdDtIn<T> dt;  // raw dt and its options, for d(processed dt)/d(raw dt)
  const double* acs;
  const acc_t<T>* dtf;
  const int32_t* seg = nullptr;  // [B, L] starts counts (ssd_seq_masks), or null
  const acc_t<T>* kpart;
  const acc_t<T>* ddtp;
  const acc_t<T>* vp;
  const acc_t<T>* up;
  // X_s: from the group dCB pass's partials (xin, xsuf over `pairs` tile pairs a chunk,
  // float32; ssd_chunk_scan_backward_group.cu) when xin is given, else from xs (the dacs
  // kernels'); xs also holds pass 1's results of the positions past a chunk's first
  // kFinalizeRound (chunks longer than that only)
  const float* xin = nullptr;
  const float* xsuf = nullptr;
  int pairs = 0;
  acc_t<T>* xs;
  acc_t<T>* dap;  // [H, B·nc]
  acc_t<T>* dbp;  // [H, B·nc] ddt_bias partials, or null
  void* ddt;      // dense [B, L, H], in Acc when dt.dt_acc, else in T
};

// Block of kSsdThreads per (b, h, c), two passes over the chunk in rounds of 8 segments of
// 32 positions, warp w taking segment w of each round (position 256·r + 32·w + lane):
//   backward: X_s += Σ_{q ≥ s} U_q + W      (suffix scan, W = exp(Acs_last)·Σ kpart;
//             rounds last first)
//   forward:  da_s = X_s + Σ_{s' < s} V_s'   (exclusive prefix scan, V = dt·Σ vp)
//             ddt_s = (ddt_s(direct) + A_h·da_s)·d(processed dt_s)/d(raw dt_s),
//             dap[h, b·nc + c] = Σ_s dt_s·da_s,  dbp[h, b·nc + c] = Σ_s ddt_s
// A segment's scan is a warp's shuffles; the carry into it, the running carry plus the
// round's segment totals on its side (shared memory; pass 1 adds them last first), is
// added by each warp in segment order, and the two chunk sums are a lane's values summed
// over the segments in order (warp 0), then a fixed tree: the order is fixed by the
// shapes. Every input of a chunk of at most one round (chunk <= 256, the usual case) is
// loaded at the block's start, one round trip to memory, and X_s stays in the thread's
// registers from pass 1 to pass 2 (the same position in both). (A warp a chunk walked its
// 8 segments twice, 16 dependent steps, with under a wave of warps at small shapes: 21.2
// µs against 8.7 at B2 L4096 H16 P128 N256 G16 with the options; at the Mamba-2 2.7B
// shape 56-57 against 42 in separate runs, 52.5-54.4 for an experiment build of it in
// the old one's run; H100s, BENCHMARKS.md, fifty-fifth session.) Held to 40 registers (6
// blocks an SM; it is latency-bound): at the 2.7B shape, X_s from the dCB partials included,
// 51.5 µs against 62.1 at its own 64 registers and 41.7 + 20.0 for the old finalize and
// the xs kernel it replaces (H100, sixty-ninth session).
constexpr int kFinalizeRound = kSsdThreads;
constexpr int kFinalizeXTiles = 4;  // X_s's loads all at once up to 4 tiles (a chunk of 256)

template <typename T>
__global__ void __launch_bounds__(kSsdThreads, 6) ssd_finalize_kernel(const SsdFinalizeParams<T> p) {
  using Acc = acc_t<T>;
  constexpr int kWarps = kSsdThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __shared__ Acc sTot[2][kWarps];                   // a round's segment totals, pass 1 and 2
  __shared__ Acc sG[kWarps][32], sDa[kWarps][32];  // a round's ddt_s and dt_s·da_s
  for (int64_t blk = blockIdx.x; blk < p.total; blk += gridDim.x) {
    const int64_t c = blk % p.nchunks;
    const int64_t bh = blk / p.nchunks;
    const int64_t h = bh % p.heads, b = bh / p.heads;
    const int64_t t0 = c * p.chunk;
    const int64_t len = min(p.chunk, p.seqlen - t0);
    const int64_t row0 = bh * p.seqlen + t0;
    const int64_t nseg = (len + 31) / 32, rounds = (len + kFinalizeRound - 1) / kFinalizeRound;
    const Acc a_h = p.A[h * p.A_s];
    const Acc bias = p.dt.bias_of(h);
    // Pass 2's inputs of position i (chunk-local)
    struct In2 {
      Acc dti = 0, vsum = 0, direct = 0, raw = 0;
    };
    auto load2 = [&](int64_t i) {
      In2 v;
      if (i < len) {
        v.dti = p.dtf[row0 + i];
#pragma unroll 2
        for (int64_t k = 0; k < p.d_tiles; ++k) {
          v.vsum += p.vp[(row0 + i) * p.d_tiles + k];
          v.direct += p.ddtp[(row0 + i) * p.d_tiles + k];
        }
        v.raw = p.dt.raw(b, t0 + i, h);
      }
      return v;
    };
    const In2 first = load2(32 * warp + lane);  // (round 0's, in flight with pass 1's loads)
    // X_s of position i < len: the dCB pass's partials in a fixed order (over the row tiles
    // ti >= t of s's tile t, the pair (ti, t)'s xin, then for every earlier column tile tj
    // the pair (ti, tj)'s row suffix sums: all of them when ti > t), or xs
    auto x_of = [&](int64_t i) -> Acc {
      if constexpr (std::is_same_v<Acc, float>) {
        if (p.xin != nullptr) {
          const int tt = static_cast<int>(i / kSsdTile), sl = static_cast<int>(i % kSsdTile);
          const int n_t = static_cast<int>((len + kSsdTile - 1) / kSsdTile);
          const int64_t base = (bh * p.nchunks + c) * p.pairs * kSsdTile;
          if (n_t <= kFinalizeXTiles) {
            // Every load issued before the first sum (in a loop of run-time length each
            // waited for the one before it); the sums in the loop's order below
            float xv[kFinalizeXTiles][kFinalizeXTiles];  // [ti][0]: xin of (ti, tt); [ti][1 + tj]: xsuf of (ti, tj)
#pragma unroll
            for (int ti = 0; ti < kFinalizeXTiles; ++ti) {
              const bool row = ti >= tt && ti < n_t;
              const int64_t at = base + (ti * (ti + 1) / 2) * kSsdTile;
              xv[ti][0] = row ? p.xin[at + tt * kSsdTile + sl] : 0.0f;
#pragma unroll
              for (int tj = 0; tj + 1 < kFinalizeXTiles; ++tj)
                xv[ti][1 + tj] = row && tj < tt ? p.xsuf[at + tj * kSsdTile + (ti > tt ? 0 : sl)] : 0.0f;
            }
            float x = 0.0f;
#pragma unroll
            for (int ti = 0; ti < kFinalizeXTiles; ++ti) {
              if (ti < tt || ti >= n_t) continue;
              x += xv[ti][0];
#pragma unroll
              for (int tj = 0; tj + 1 < kFinalizeXTiles; ++tj)
                if (tj < tt) x += xv[ti][1 + tj];
            }
            return x;
          }
          float x = 0.0f;
          for (int ti = tt; ti < n_t; ++ti) {
            const int row_pairs = ti * (ti + 1) / 2;  // pair index of (ti, 0)
            x += p.xin[base + (row_pairs + tt) * kSsdTile + sl];
            for (int tj = 0; tj < tt; ++tj) x += p.xsuf[base + (row_pairs + tj) * kSsdTile + (ti > tt ? 0 : sl)];
          }
          return x;
        }
      }
      return p.xs[row0 + i];
    };
    Acc wsum = 0;  // (every warp sums it alike)
    for (int64_t i = lane; i < p.kblocks; i += 32) wsum += p.kpart[(bh * p.nchunks + c) * p.kblocks + i];
    // With seg: W only without a start in the chunk, and V only of its last sequence
    // (selected, as everything that crosses a start)
    const int32_t* seg = p.seg != nullptr ? p.seg + b * p.seqlen + t0 : nullptr;
    const int32_t last_seq = seg != nullptr ? seg[len - 1] : 0;
    Acc w_c = ssd_decay<Acc>(p.acs[row0 + len - 1]) * ssd_sum32(wsum);
    if (last_seq != 0) w_c = 0;
    // Publishes this warp's segment total `tot` among the round's `n` segments (in sTot[k]),
    // then returns the carry into this warp's segment: `carry` plus the totals of the
    // segments before it (pass 2: k < warp, in order) or after it (pass 1: k > warp, last
    // first); `carry` goes on with all n of them added in that order.
    auto carries = [&](Acc* tot_of, Acc& carry, Acc tot, int n, bool last_first) {
      __syncthreads();  // (the previous round's totals, and in pass 2 its sums, are read)
      if (lane == 0) tot_of[warp] = tot;
      __syncthreads();
      Acc mine = carry;
      for (int j = 0; j < n; ++j) {
        const int k = last_first ? n - 1 - j : j;
        if (k == warp) mine = carry;
        carry += tot_of[k];
      }
      return warp < n ? mine : carry;
    };

    Acc carry = 0, x0 = 0;  // x0: X_s of the thread's position in round 0
    for (int64_t r = rounds - 1; r >= 0; --r) {
      const int64_t i = r * kFinalizeRound + 32 * warp + lane;
      Acc x = 0, v = 0;
      if (i < len) {
        x = x_of(i);
#pragma unroll 4
        for (int64_t k = 0; k < p.n_tiles; ++k) v += p.up[(row0 + i) * p.n_tiles + k];
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {  // inclusive suffix sum inside the segment
        const Acc u = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += u;
      }
      const int n = static_cast<int>(min(nseg - r * kWarps, static_cast<int64_t>(kWarps)));
      const Acc in = carries(sTot[0], carry, __shfl_sync(0xffffffffu, v, 0), n, true);
      x += in + v + w_c;
      if (r == 0)
        x0 = x;
      else if (i < len)
        p.xs[row0 + i] = x;  // (read back by this thread in pass 2)
    }

    carry = 0;
    Acc da_dt = 0, ddt_sum = 0;  // warp 0: each lane's sums over the segments
    for (int64_t r = 0; r < rounds; ++r) {
      const int64_t i = r * kFinalizeRound + 32 * warp + lane;
      const In2 in2 = r == 0 ? first : load2(i);
      Acc vi = 0;
      if (i < len) vi = seg != nullptr && seg[i] != last_seq ? Acc(0) : in2.dti * in2.vsum;
      Acc incl = vi;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {  // inclusive prefix sum inside the segment
        const Acc u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += u;
      }
      Acc excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = 0;
      const int n = static_cast<int>(min(nseg - r * kWarps, static_cast<int64_t>(kWarps)));
      const Acc in = carries(sTot[1], carry, __shfl_sync(0xffffffffu, incl, 31), n, false);
      Acc g = 0, dad = 0;
      if (i < len) {
        const Acc da = (r == 0 ? x0 : p.xs[row0 + i]) + (in + excl);
        Acc grad;
        (void)ssd_dt_process<Acc>(in2.raw, bias, p.dt.softplus, p.dt.lo, p.dt.hi, &grad);
        // (0 · an Inf or NaN gradient would be NaN; outside [dt_min, dt_max] it is 0)
        g = grad == Acc(0) ? Acc(0) : (in2.direct + a_h * da) * grad;
        const int64_t at = (b * p.seqlen + t0 + i) * p.heads + h;
        if (p.dt.dt_acc)
          static_cast<Acc*>(p.ddt)[at] = g;
        else
          static_cast<T*>(p.ddt)[at] = from_acc<T>(g);
        dad = in2.dti * da;
      }
      sG[warp][lane] = g;
      sDa[warp][lane] = dad;
      __syncthreads();
      if (warp == 0)
        for (int k = 0; k < n; ++k) ddt_sum += sG[k][lane], da_dt += sDa[k][lane];
    }
    if (warp == 0) {
      da_dt = ssd_sum32(da_dt);
      if (lane == 0) p.dap[h * (p.batch * p.nchunks) + b * p.nchunks + c] = da_dt;
      if (p.dbp != nullptr) {
        ddt_sum = ssd_sum32(ddt_sum);
        if (lane == 0) p.dbp[h * (p.batch * p.nchunks) + b * p.nchunks + c] = ddt_sum;
      }
    }
    __syncthreads();  // (the next chunk's rounds reuse the shared arrays)
  }
}

// Warp per head: dA_h = Σ_{b, c} dap[h, b·nc + c] (lane-strided, then a fixed tree), and
// the same for ddt_bias from dbp when that is non-null.
template <typename Acc>
__global__ void __launch_bounds__(kSsdThreads) ssd_dA_kernel(const Acc* dap, const Acc* dbp, int64_t heads,
                                                             int64_t per_head, Acc* dA, Acc* ddt_bias) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (kSsdThreads / 32);
  for (int64_t h = static_cast<int64_t>(blockIdx.x) * (kSsdThreads / 32) + threadIdx.x / 32;
       h < heads; h += warps_per_grid) {
    Acc s = 0, sb = 0;
    for (int64_t i = lane; i < per_head; i += 32) {
      s += dap[h * per_head + i];
      if (dbp != nullptr) sb += dbp[h * per_head + i];
    }
    s = ssd_sum32(s);
    if (lane == 0) dA[h] = s;
    if (dbp != nullptr) {
      sb = ssd_sum32(sb);
      if (lane == 0) ddt_bias[h] = sb;
    }
  }
}

// ---- launch helpers ----------------------------------------------------------------------
// Throws if the problem breaks the kernels' index assumptions (the plan rejects these
// first): positions inside a chunk and tile indices are int32.
inline void ssd_check_launch_struct(const SsdChunkScanLaunch& l, bool backward) {
  const char* op = backward ? "ssd_chunk_scan_backward" : "ssd_chunk_scan";
  if (l.chunk_size < 1) fail(PlanErrorKind::Internal, op, "chunk_size must be >= 1");
  if (l.seqlen >= (int64_t{1} << 31) - kSsdTile)
    fail(PlanErrorKind::Unsupported, op, "seqlen must be < 2^31 - 64 on CUDA");
  if (l.head_dim > (1 << 20) || l.state_dim > (1 << 20))
    fail(PlanErrorKind::Unsupported, op, "head_dim and state_dim must be <= 2^20 on CUDA");
  if (l.groups < 1 || l.heads % l.groups != 0)
    fail(PlanErrorKind::Internal, op, "heads must be a multiple of groups");
  if (l.compute != (l.element == ElementKind::F64 ? ElementKind::F64 : ElementKind::F32))
    fail(PlanErrorKind::Internal, op, "compute must be float64 for float64 inputs, else float32");
  if (l.dt_element != l.element && l.dt_element != l.compute)
    fail(PlanErrorKind::Internal, op, "dt_element must be the element or the compute type");
  if (backward && l.z != nullptr && (l.dz == nullptr || l.y_pre == nullptr))
    fail(PlanErrorKind::Internal, op, "z needs dz and y_pre in the backward");
  if (backward && l.group_products && l.compute != ElementKind::F32)
    fail(PlanErrorKind::Internal, op, "group_products needs float32 compute (its partials are float32)");
  if (backward && l.dD_in_dx && !l.group_products)
    fail(PlanErrorKind::Internal, op, "dD_in_dx needs the group products' dx kernel");
  if (l.side_stream && !(backward && l.group_products))
    fail(PlanErrorKind::Internal, op, "side_stream is the group products' backward's");
  if (backward && l.gated != (l.z != nullptr))
    fail(PlanErrorKind::Internal, op, "gated must say whether z is given (the workspace's dy_pre)");
  if (l.state_tile_n != 0 && l.state_tile_n != kSsdTile && l.state_tile_n != 2 * kSsdTile)
    fail(PlanErrorKind::Internal, op, "state_tile_n must be 0, 64 or 128");
  if (l.keep_states && (l.states == nullptr || !ssd_keeps_states(l.element) || (backward && !ssd_state_copies(l))))
    fail(PlanErrorKind::Internal, op,
         "keep_states needs the states pointer and 16-bit inputs (and the tensor-core path in the backward)");
  const SsdWorkspace w = ssd_workspace_layout(l, backward);
  if (w.total > 0 && (l.workspace == nullptr || l.workspace_bytes < w.total))
    fail(PlanErrorKind::Internal, op, "workspace too small");
}

template <typename T>
void ssd_launch_cumsum(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  SsdCumsumParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.chunk = l.chunk_size;
  p.nchunks = l.nchunks();
  p.total_warps = l.batch * l.heads * p.nchunks;
  p.dt = ssd_dt_in<T>(l);
  p.A = static_cast<const Acc*>(l.A);
  p.A_s = l.A_stride;
  p.seq_idx = l.seq_idx;
  p.seq_i64 = l.seq_idx_int64;
  p.seq_s[0] = l.seq_idx_stride[0], p.seq_s[1] = l.seq_idx_stride[1];
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<Acc>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  if (p.total_warps == 0) return;
  ssd_cumsum_kernel<T><<<ssd_grid((p.total_warps + 7) / 8), kSsdThreads, 0, stream>>>(p);
  check_launch("ssd_chunk_scan(cumsum)");
}

// DSTATE = false: S_c from (x, B) into `states`; true: local dstate from (dy, C) into `gstates`.
template <typename T, bool DSTATE>
void ssd_launch_chunk_state(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  SsdStateParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks(), p.D = l.head_dim, p.N = l.state_dim;
  p.d_tiles = static_cast<int>(w.d_tiles), p.n_tiles = static_cast<int>(w.n_tiles);
  p.total_blocks = l.batch * l.heads * p.nchunks * p.d_tiles * p.n_tiles;
  p.xo = ssd_operand<T>(DSTATE ? l.dy : l.x, DSTATE ? l.dy_stride : l.x_stride, true);
  p.yo = ssd_operand<T>(DSTATE ? l.C : l.B, DSTATE ? l.C_stride : l.B_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<Acc>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.out = ssd_ws<Acc>(l, DSTATE ? w.gstates : w.states);
  if (p.total_blocks == 0) return;
  ssd_chunk_state_kernel<T, DSTATE><<<ssd_grid(p.total_blocks), kSsdThreads, 0, stream>>>(p);
  check_launch(DSTATE ? "ssd_chunk_scan_backward(chunk_dstate)" : "ssd_chunk_scan(chunk_state)");
}

// The state run's seed and result (see SsdPassParams): forward initial_states → `last`
// (final_states, or null when only the H_c are wanted); backward dfinal_states →
// dinitial_states.
template <typename T, bool BW, typename Params>
void ssd_pass_ends(Params& p, const SsdChunkScanLaunch& l, void* last) {
  using Acc = acc_t<T>;
  p.N = l.state_dim;
  p.seed = static_cast<const Acc*>(BW ? l.dfinal_states : l.initial_states);
  for (int i = 0; i < 4; ++i) p.seed_s[i] = BW ? l.dfinal_stride[i] : l.init_stride[i];
  p.last = static_cast<Acc*>(last);
}

template <typename T, bool BW>
void ssd_launch_state_pass(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t stream) {
  using Acc = acc_t<T>;
  SsdPassParams<Acc> p;
  p.batch = l.batch, p.heads = l.heads, p.seqlen = l.seqlen, p.chunk = l.chunk_size;
  p.nchunks = l.nchunks(), p.dn = l.head_dim * l.state_dim, p.kblocks = w.kblocks;
  p.total_blocks = l.batch * l.heads * p.kblocks;
  p.acs = ssd_ws<double>(l, w.acs);
  p.seg = ssd_seg(l, w);
  p.states = ssd_ws<Acc>(l, w.states);
  p.gstates = BW ? ssd_ws<Acc>(l, w.gstates) : nullptr;
  p.kpart = BW ? ssd_ws<Acc>(l, w.kpart) : nullptr;
  p.copy = nullptr;
  p.hcopy = nullptr;
  p.copy_only = BW && l.group_products;
  ssd_pass_ends<T, BW>(p, l, last);
  // With L == 0 the run is only seed → last (final_states = initial_states).
  if (p.total_blocks == 0 || (p.nchunks == 0 && last == nullptr)) return;
  auto run = [&](auto copy_tag) {
    using O = decltype(copy_tag);
    if constexpr (BW) {
      ssd_state_pass_bwd_kernel<Acc, O><<<ssd_grid(p.total_blocks), kSsdThreads, 0, stream>>>(p);
      check_launch("ssd_chunk_scan_backward(state_pass)");
    } else {
      ssd_state_pass_kernel<Acc, O><<<ssd_grid(p.total_blocks), kSsdThreads, 0, stream>>>(p);
      check_launch("ssd_chunk_scan(state_pass)");
    }
  };
  if constexpr (!std::is_same_v<T, Acc>) {  // 16-bit inputs
    if (ssd_state_copies(l)) {
      p.copy = BW ? ssd_ws<T>(l, w.gstates_t) : ssd_h_copy<T>(l, w);
      if (BW) p.hcopy = ssd_h_copy<T>(l, w);
      run(T{});
      return;
    }
  }
  run(Acc{});
}

// The operands, output and partial-sum buffers of a scan kernel of MODE (the SIMT and the
// tensor-core parameter structs share these members): Y from C·Bᵀ and x, DX from
// B·Cᵀ and dy, DC from dy·xᵀ and B, DB from x·dyᵀ and C.
template <typename T, typename Acc, int MODE, typename Params>
void ssd_scan_roles(Params& p, const SsdChunkScanLaunch& l, const SsdWorkspace& w) {
  const SsdOperand<T> x = ssd_operand<T>(l.x, l.x_stride, true);
  const SsdOperand<T> dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  const SsdOperand<T> Bo = ssd_operand<T>(l.B, l.B_stride, false);
  const SsdOperand<T> Co = ssd_operand<T>(l.C, l.C_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<Acc>(l, w.dtf);
  p.part = nullptr;
  p.part2 = nullptr;
  p.epi = SsdEpilogue<T>{};
  if (MODE == kSsdY || MODE == kSsdDX) {  // D·x (Y) or D·dy_pre (DX); Y also y_pre and the z gate
    p.epi.D = static_cast<const Acc*>(l.D);
    p.epi.D_s0 = l.D_stride[0];
    p.epi.D_s1 = l.D_per_dim ? l.D_stride[1] : 0;
    if (MODE == kSsdY) {
      p.epi.z = static_cast<const T*>(l.z);
      for (int i = 0; i < 4; ++i) p.epi.z_s[i] = l.z_stride[i];
      p.epi.y_pre = static_cast<T*>(l.y_pre_out);
    }
    p.epi.on = p.epi.D != nullptr || p.epi.z != nullptr || p.epi.y_pre != nullptr;
  }
  switch (MODE) {
    case kSsdY:
      p.lft = Co, p.rgt = Bo, p.val = x, p.dot = x;
      p.out = static_cast<T*>(l.y);
      break;
    case kSsdDX:
      p.lft = Bo, p.rgt = Co, p.val = dy, p.dot = x;
      p.out = static_cast<T*>(l.dx);
      p.part = ssd_ws<Acc>(l, w.ddtp);
      p.part2 = ssd_ws<Acc>(l, w.vp);
      break;
    case kSsdDC:
      p.lft = dy, p.rgt = x, p.val = Bo, p.dot = Co;
      p.out = static_cast<T*>(l.dC);
      p.part = ssd_ws<Acc>(l, w.up);
      break;
    default:  // kSsdDB
      p.lft = x, p.rgt = dy, p.val = Co, p.dot = Co;
      p.out = static_cast<T*>(l.dB);
      break;
  }
}

template <typename T, int MODE>
void ssd_launch_scan(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  constexpr bool kMulti = MODE == kSsdDC || MODE == kSsdDB;
  const bool y_like = MODE == kSsdY || MODE == kSsdDX;
  SsdScanParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups;
  p.hpg = l.heads / l.groups, p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.K1 = static_cast<int>(y_like ? l.state_dim : l.head_dim);
  p.J = static_cast<int>(y_like ? l.head_dim : l.state_dim);
  const int64_t qe = l.chunk_size < l.seqlen ? l.chunk_size : l.seqlen;  // longest chunk
  p.r_tiles = static_cast<int>((qe + kSsdTile - 1) / kSsdTile);
  p.j_tiles = static_cast<int>((p.J + kSsdTile - 1) / kSsdTile);
  p.nsplit = kMulti ? w.nsplit : 1;
  p.hps = kMulti ? w.hps : 1;
  p.total_blocks = l.batch * (kMulti ? l.groups * p.nsplit : l.heads) * p.nchunks * p.r_tiles * p.j_tiles;
  p.out_split = kMulti ? ssd_ws<Acc>(l, w.split) : nullptr;
  // state[d·N + n]: S(k = n, j = d) for Y/DX, S(k = d, j = n) for DC/DB
  p.state_sk = y_like ? 1 : l.state_dim;
  p.state_sj = y_like ? l.state_dim : 1;
  p.state = ssd_ws<Acc>(l, MODE == kSsdY || MODE == kSsdDC ? w.states : w.gstates);
  p.seg = ssd_seg(l, w);
  ssd_scan_roles<T, Acc, MODE>(p, l, w);
  if (p.total_blocks == 0) return;
  auto run = [&](auto epi, auto seg) {
    ssd_scan_kernel<T, MODE, decltype(epi)::value, decltype(seg)::value>
        <<<ssd_grid(p.total_blocks), kSsdThreads, 0, stream>>>(p);
  };
  auto with_seg = [&](auto epi) {
    if (p.seg != nullptr)
      run(epi, std::true_type{});
    else
      run(epi, std::false_type{});
  };
  if constexpr (kMulti)
    with_seg(std::false_type{});  // (DC, DB: no epilogue)
  else if (p.epi.on)
    with_seg(std::true_type{});
  else
    with_seg(std::false_type{});
  check_launch(MODE == kSsdY ? "ssd_chunk_scan(scan)" : "ssd_chunk_scan_backward(scan)");
  if constexpr (kMulti)
    if (p.nsplit > 1) ssd_split_sum(l, p.out_split, p.nsplit, p.out, stream);
}

template <typename T>
void ssd_launch_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  SsdDacsParams<T> p;
  p.seqlen = l.seqlen, p.heads = l.heads, p.hpg = l.heads / l.groups, p.chunk = l.chunk_size;
  p.nchunks = l.nchunks();
  p.total_blocks = l.batch * l.heads * p.nchunks;
  p.D = static_cast<int>(l.head_dim), p.N = static_cast<int>(l.state_dim);
  p.x = ssd_operand<T>(l.x, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.B = ssd_operand<T>(l.B, l.B_stride, false);
  p.C = ssd_operand<T>(l.C, l.C_stride, false);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<Acc>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.xs = ssd_ws<Acc>(l, w.xs);
  if (p.total_blocks == 0) return;
  ssd_dacs_kernel<T><<<ssd_grid(p.total_blocks), kSsdThreads, 0, stream>>>(p);
  check_launch("ssd_chunk_scan_backward(dacs)");
}

template <typename T>
void ssd_launch_finalize(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  SsdFinalizeParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.heads = l.heads, p.chunk = l.chunk_size;
  p.nchunks = l.nchunks();
  p.total = l.batch * l.heads * p.nchunks;
  p.kblocks = w.kblocks, p.d_tiles = w.d_tiles, p.n_tiles = w.n_tiles;
  p.A = static_cast<const Acc*>(l.A);
  p.A_s = l.A_stride;
  p.dt = ssd_dt_in<T>(l);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<Acc>(l, w.dtf);
  p.seg = ssd_seg(l, w);
  p.kpart = ssd_ws<Acc>(l, w.kpart);
  p.ddtp = ssd_ws<Acc>(l, w.ddtp);
  p.vp = ssd_ws<Acc>(l, w.vp);
  p.up = ssd_ws<Acc>(l, w.up);
  if (l.group_products) {  // X_s from the group dCB pass's partials
    p.xin = ssd_ws<float>(l, w.xin);
    p.xsuf = ssd_ws<float>(l, w.xsuf);
    p.pairs = static_cast<int>(w.pairs);
  }
  p.xs = ssd_ws<Acc>(l, w.xs);
  p.dap = ssd_ws<Acc>(l, w.dap);
  p.dbp = l.ddt_bias != nullptr ? ssd_ws<Acc>(l, w.dbp) : nullptr;
  p.ddt = l.ddt;
  if (p.total > 0) {
    ssd_finalize_kernel<T><<<ssd_grid(p.total), kSsdThreads, 0, stream>>>(p);
    check_launch("ssd_chunk_scan_backward(finalize)");
  }
  if (l.heads > 0) {  // also when B·L == 0: dA (and ddt_bias) are then written as zeros
    ssd_dA_kernel<Acc><<<ssd_grid((l.heads + 7) / 8), kSsdThreads, 0, stream>>>(
        p.dap, p.dbp, l.heads, l.batch * p.nchunks, static_cast<Acc*>(l.dA), static_cast<Acc*>(l.ddt_bias));
    check_launch("ssd_chunk_scan_backward(dA)");
  }
}

// ---- 7. backward D and z -------------------------------------------------------------------
// Before the other backward kernels (z or D given), a quad of threads per (position
// segment of kSsdDSeg positions of the flattened b·L + t, h, V consecutive d), each
// walking a quarter of the segment in order:
//   z:  dy_pre = dy·silu(z), rounded to T, into `dyp` (the workspace's dense [B, L, H, D]),
//       which every later kernel reads in place of dy, and dz = dy·y_pre·σ(z)·(1 + z·(1 −
//       σ(z))) into the dz output: one pass over dy and z, as mamba_ssm's
//       _chunk_scan_bwd_dz (which also allocates its dout_x);
//   D:  part[seg, h, d] = Σ_{positions of seg} dy_pre·x   (dD's partials; ssd_dD_kernel sums
//       them after the other kernels), unless the group dx kernel writes them (dD_in_dx).
// With z and no partials to write, ssd_gate_rows_kernel (the plan's gate_rows) instead.
template <typename T>
struct SsdGateParams {
  int64_t seqlen, heads, hd, D, positions, nseg, total;
  SsdOperand<T> x, dy, z, y_pre;
  T* dyp;               // dy_pre out (z given), or null
  T* dz;                // dense [B, L, H, D] (z given), or null
  acc_t<T>* part;       // [nseg, H, D] dD partials (D given), or null
};

template <typename T>
__device__ __forceinline__ const T* ssd_at(const SsdOperand<T>& o, int64_t b, int64_t t, int64_t h, int64_t d) {
  return o.p + b * o.s[0] + t * o.s[1] + h * o.s[2] + d * o.s[3];
}

// The gate kernel takes V consecutive d of one (b, t, h) a thread: 16 bytes (V =
// 16 / sizeof(T)) where every operand's d is contiguous and V-aligned (ssd_gate_vec), else
// one element. Measured at the Mamba-2 2.7B shape with z and D (H200, bf16;
// BENCHMARKS.md): 304 µs this way (a position's four loads in flight a thread, 76
// registers, 3 blocks a multiprocessor; four positions' loads in flight took 125 registers
// and 330 µs, and five blocks forced by the launch bound spilled: 393). Before, one kernel
// for dy_pre and the dD partials (209 µs) and another for dz (171 µs) read dy and z twice;
// one element a thread with four 64-bit divisions each (and 256-position segments) took
// 669 and 752 µs, and the dD sum over the 4× more partials went from 60 to 243 µs. The
// kernel is bound by memory: with z and D it reads dy, z, y_pre and x and writes dy_pre
// and dz, 12 bytes an element (1.0 GB at the 2.7B shape: ~240 µs at 4.2 TB/s). Its z math
// is SwiGLU's backward (gated_activation_math.h: the hardware exp and reciprocal for
// 16-bit data, where expf and two IEEE divisions had been) and the operands' addresses
// step by their time strides: 563 → 243 SASS instructions a position for bf16 (sm_90a),
// 74 registers, and 293 → 285–290 µs: the instructions were not what bound it.
// A segment's 64 positions go to kSsdGateQuarters threads of a quad, 16 each, their dD
// sums added by shuffles in a fixed tree: four times the threads (its 640 blocks at the
// 2.7B shape had made 1.6 waves of 3 blocks an SM), 76 registers (bfloat16; 80 in the timed
// build, its count a runtime value). H100, the 2.7B shape with the options: 355–356 → 346
// µs (BENCHMARKS.md).
template <typename T, int V>
__global__ void __launch_bounds__(kSsdThreads) ssd_gate_kernel(const SsdGateParams<T> p) {
  using Acc = acc_t<T>;
  const bool gated = p.dyp != nullptr, with_D = p.part != nullptr;
  const int64_t row_vecs = p.hd / V;
  constexpr int nq = kSsdGateQuarters;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kSsdThreads + threadIdx.x; i < p.total;
       i += static_cast<int64_t>(gridDim.x) * kSsdThreads) {
    const int64_t item = i / nq;
    const int k4 = static_cast<int>(i - item * nq);
    const int64_t seg = item / row_vecs, e = (item - seg * row_vecs) * V;
    const int64_t h = e / p.D, d = e - h * p.D;
    const int64_t qlen = kSsdDSeg / nq;
    const int64_t q_begin = min(seg * kSsdDSeg + k4 * qlen, p.positions),
                  q_end = min(q_begin + qlen, p.positions);
    int64_t t = q_begin % p.seqlen;  // position q = b·L + t
    const int64_t b = q_begin / p.seqlen;
    // The operands at (b, t, h, d), each advanced by its time stride a step, or to the next
    // batch element's t = 0 where t wraps (not a product of four strides a step).
    const T* pdy = ssd_at(p.dy, b, t, h, d);
    const T* pz = gated ? ssd_at(p.z, b, t, h, d) : nullptr;
    const T* py = gated ? ssd_at(p.y_pre, b, t, h, d) : nullptr;
    const T* px = with_D ? ssd_at(p.x, b, t, h, d) : nullptr;
    const auto wrap = [&](const SsdOperand<T>& o) { return o.s[0] - (p.seqlen - 1) * o.s[1]; };
    const int64_t wdy = wrap(p.dy), wz = gated ? wrap(p.z) : 0, wy = gated ? wrap(p.y_pre) : 0,
                  wx = with_D ? wrap(p.x) : 0;
    Acc sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0;
    for (int64_t q = q_begin; q < q_end; ++q) {
      T dv[V], zv[V], yv[V], xv[V];
      ssd_load_vec<T, V>(dv, pdy, true, V);
      if (gated) {  // z given: the launch check guarantees dz and y_pre
        ssd_load_vec<T, V>(zv, pz, true, V);
        ssd_load_vec<T, V>(yv, py, true, V);
      }
      if (with_D) ssd_load_vec<T, V>(xv, px, true, V);
      const bool next_b = ++t == p.seqlen;
      if (next_b) t = 0;
      pdy += next_b ? wdy : p.dy.s[1];
      if (gated) pz += next_b ? wz : p.z.s[1], py += next_b ? wy : p.y_pre.s[1];
      if (with_D) px += next_b ? wx : p.x.s[1];
      Acc g[V];
#pragma unroll
      for (int k = 0; k < V; ++k) g[k] = to_acc(dv[k]);
      if (gated) {
        T r[V], dz[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          Acc dyp, dzk;  // y = y_pre·silu(z): SwiGLU's backward with a = y_pre, b = z
          gated_backward<GatedKind::Swiglu, sizeof(T) == 2>(g[k], Acc(to_acc(yv[k])), Acc(to_acc(zv[k])),
                                                             dyp, dzk);
          dz[k] = from_acc<T>(dzk);
          r[k] = from_acc<T>(dyp);
          g[k] = to_acc(r[k]);
        }
        ssd_store_vec<T, V>(p.dyp + q * p.hd + e, r, true, V);
        ssd_store_vec<T, V>(p.dz + q * p.hd + e, dz, true, V);
      }
      if (with_D)
#pragma unroll
        for (int k = 0; k < V; ++k) sum[k] += g[k] * to_acc(xv[k]);
    }
    if (with_D) {
      // the quarters' sums in a fixed tree, (0 + 1) + (2 + 3) (the quad's lanes: i's low bits)
      const unsigned quad = 0xfu << (threadIdx.x & 28);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sum[k] += __shfl_xor_sync(quad, sum[k], 1);
        sum[k] += __shfl_xor_sync(quad, sum[k], 2);
      }
      if (k4 == 0)
#pragma unroll
        for (int k = 0; k < V; ++k) p.part[seg * p.hd + e + k] = sum[k];
    }
  }
}

// The gate kernel without dD's partials (SsdChunkScanLaunch::gate_rows: z given, the
// partials from the dx kernel) is an element-wise map: dy_pre and dz of each 16-byte vector
// of d, a thread taking U vectors kSsdThreads apart (a warp's lanes on consecutive vectors
// of a position's H·D row: 512 contiguous bytes an access), every load issued before the
// first store; 32-bit indices (the plan's bound: B·L·H·D < 2^31). The segment kernel's
// quads walk 16 positions each, one position's loads in flight a thread. H100, the 2.7B
// shape with D and z (bf16): 276-277 µs at U = 2 (40 registers), 278-279 at 4 (64),
// against the segment kernel's 309-310, the same bits.
constexpr int kSsdGateRowsVecs = 2;
template <typename T, int U>
__global__ void __launch_bounds__(kSsdThreads) ssd_gate_rows_kernel(const SsdGateParams<T> p, FastDivmod row_div,
                                                                    FastDivmod dv_div, FastDivmod L_div,
                                                                    uint32_t row_vecs, uint32_t d_vecs, uint32_t total) {
  using Acc = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  const uint32_t first = blockIdx.x * (kSsdThreads * U) + threadIdx.x;
  T dv[U][V], zv[U][V], yv[U][V];
  int64_t out[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint32_t i = first + u * kSsdThreads;
    if (i < total) {
      const uint32_t q = row_div.div(i), j = i - q * row_vecs;
      const uint32_t h = dv_div.div(j), d = (j - h * d_vecs) * V;
      const uint32_t b = L_div.div(q), t = q - b * static_cast<uint32_t>(p.seqlen);
      ssd_load_vec<T, V>(dv[u], ssd_at(p.dy, b, t, h, d), true, V);
      ssd_load_vec<T, V>(zv[u], ssd_at(p.z, b, t, h, d), true, V);
      ssd_load_vec<T, V>(yv[u], ssd_at(p.y_pre, b, t, h, d), true, V);
      out[u] = static_cast<int64_t>(q) * p.hd + static_cast<int64_t>(j) * V;
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (first + u * kSsdThreads < total) {
      T r[V], dz[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        Acc dyp, dzk;
        gated_backward<GatedKind::Swiglu, sizeof(T) == 2>(Acc(to_acc(dv[u][k])), Acc(to_acc(yv[u][k])),
                                                           Acc(to_acc(zv[u][k])), dyp, dzk);
        dz[k] = from_acc<T>(dzk);
        r[k] = from_acc<T>(dyp);
      }
      ssd_store_vec<T, V>(p.dyp + out[u], r, true, V);
      ssd_store_vec<T, V>(p.dz + out[u], dz, true, V);
    }
  }
}

// Block per output of dD ([H] or [H, D]): each thread sums its items (segment-major,
// d-minor for a [H] D; thread-strided, in order), then a fixed tree: the warps' xor trees,
// then the 8 warp sums in warp order. (A [H] D at the Mamba-2 2.7B shape has 80 outputs
// of 16384 partials each: a warp per output left most of the GPU idle.) A thread's items
// are loaded kSsdDLoads at a time before they are added (in the same order: the same
// bits): one load at a time, its 64 items at that shape took 28 µs of round trips.
constexpr int kSsdDLoads = 8;
template <typename Acc>
__global__ void __launch_bounds__(kSsdThreads) ssd_dD_kernel(const Acc* part, int64_t nseg, int64_t heads,
                                                             int64_t D, bool per_dim, Acc* dD) {
  __shared__ Acc warp_sums[kSsdThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t outs = per_dim ? heads * D : heads;
  const int64_t hd = heads * D;
  // the thread's first item (seg, d) and the step of kSsdThreads items, carried: no
  // division per item (D = 0, which the plan sends to its zeros variant, sums nothing)
  const int64_t per_seg = per_dim ? 1 : D;
  const int64_t dseg = per_seg > 0 ? kSsdThreads / per_seg : 0, dd = per_seg > 0 ? kSsdThreads % per_seg : 0;
  for (int64_t o = blockIdx.x; o < outs; o += gridDim.x) {
    const Acc* base = part + (per_dim ? o : o * D);
    Acc s = 0;
    int64_t seg = per_seg > 0 ? tid / per_seg : nseg, d = per_seg > 0 ? tid % per_seg : 0;
    while (seg < nseg) {  // kSsdDLoads loads in flight, then added in item order
      Acc v[kSsdDLoads];
      int n = 0;
#pragma unroll
      for (int u = 0; u < kSsdDLoads; ++u) {
        if (seg < nseg) {
          v[u] = base[seg * hd + d];
          n = u + 1;
          seg += dseg, d += dd;
          if (d >= per_seg) d -= per_seg, ++seg;
        }
      }
#pragma unroll
      for (int u = 0; u < kSsdDLoads; ++u)
        if (u < n) s += v[u];
    }
    s = ssd_sum32(s);
    __syncthreads();  // the previous output's reader of warp_sums is done
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (tid == 0) {
      Acc t = 0;
#pragma unroll
      for (int w = 0; w < kSsdThreads / 32; ++w) t += warp_sums[w];
      dD[o] = t;
    }
  }
}

// Whether the gate kernel may take 16 bytes of d a thread: D a multiple of V and, for
// every operand given (data non-null), d contiguous, the other strides multiples of V and
// the data 16-byte aligned; the dense outputs given (non-null) 16-byte aligned.
template <typename T>
bool ssd_gate_vec(int64_t D, std::initializer_list<const SsdOperand<T>*> ops, std::initializer_list<const T*> dense) {
  constexpr int V = 16 / sizeof(T);
  if (D % V != 0) return false;
  for (const T* o : dense)
    if (o != nullptr && reinterpret_cast<uintptr_t>(o) % 16 != 0) return false;
  for (const SsdOperand<T>* o : ops) {
    if (o->p == nullptr) continue;
    if (o->s[3] != 1 || o->s[0] % V != 0 || o->s[1] % V != 0 || o->s[2] % V != 0 ||
        reinterpret_cast<uintptr_t>(o->p) % 16 != 0)
      return false;
  }
  return true;
}

// dy_pre (into the workspace's dyp) and dz, and the dD partials (unless the dx kernel
// writes them: dD_in_dx); no-op when there is neither to do.
template <typename T>
void ssd_launch_gate(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  const bool partials = l.D != nullptr && !l.dD_in_dx;
  if (l.z == nullptr && !partials) return;
  SsdGateParams<T> p;
  p.seqlen = l.seqlen, p.heads = l.heads, p.D = l.head_dim, p.hd = l.heads * l.head_dim;
  p.positions = l.batch * l.seqlen;
  p.nseg = (p.positions + kSsdDSeg - 1) / kSsdDSeg;
  p.total = p.nseg * p.hd;
  p.x = ssd_operand<T>(partials ? l.x : nullptr, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.z = ssd_operand<T>(l.z, l.z_stride, true);
  p.y_pre = ssd_operand<T>(l.z != nullptr ? l.y_pre : nullptr, l.y_pre_stride, true);
  p.dyp = l.z != nullptr ? ssd_ws<T>(l, w.dyp) : nullptr;
  p.dz = l.z != nullptr ? static_cast<T*>(l.dz) : nullptr;
  p.part = partials ? ssd_ws<acc_t<T>>(l, w.dDp) : nullptr;
  if (p.total == 0) return;
  constexpr int V = 16 / sizeof(T);
  const bool vec = ssd_gate_vec<T>(p.D, {&p.dy, &p.z, &p.x, &p.y_pre}, {p.dyp, p.dz});
  if (l.gate_rows && vec) {  // (the plan's gate_rows: no partials, 32-bit indices)
    constexpr int U = kSsdGateRowsVecs;
    const int64_t total = p.positions * (p.hd / V);
    const uint32_t row_vecs = static_cast<uint32_t>(p.hd / V), d_vecs = static_cast<uint32_t>(p.D / V);
    ssd_gate_rows_kernel<T, U><<<static_cast<unsigned>((total + kSsdThreads * U - 1) / (kSsdThreads * U)),
                                 kSsdThreads, 0, stream>>>(p, FastDivmod(row_vecs), FastDivmod(d_vecs),
                                                           FastDivmod(static_cast<uint32_t>(p.seqlen)), row_vecs,
                                                           d_vecs, static_cast<uint32_t>(total));
    check_launch("ssd_chunk_scan_backward(gate)");
    return;
  }
  p.total = (vec ? p.nseg * (p.hd / V) : p.nseg * p.hd) * kSsdGateQuarters;
  if (vec)
    ssd_gate_kernel<T, V><<<ssd_grid((p.total + kSsdThreads - 1) / kSsdThreads), kSsdThreads, 0, stream>>>(p);
  else
    ssd_gate_kernel<T, 1><<<ssd_grid((p.total + kSsdThreads - 1) / kSsdThreads), kSsdThreads, 0, stream>>>(p);
  check_launch("ssd_chunk_scan_backward(gate)");
}

// dD from its partials (after the kernels that write them).
template <typename T>
void ssd_launch_dD(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  using Acc = acc_t<T>;
  if (l.dD == nullptr) return;
  const int64_t outs = l.D_per_dim ? l.heads * l.head_dim : l.heads;
  if (outs == 0) return;
  const int64_t nseg = ssd_dD_segments(l);
  ssd_dD_kernel<Acc><<<ssd_grid(outs), kSsdThreads, 0, stream>>>(ssd_ws<Acc>(l, w.dDp), nseg, l.heads, l.head_dim,
                                                                  l.D_per_dim, static_cast<Acc*>(l.dD));
  check_launch("ssd_chunk_scan_backward(dD)");
}

}  // namespace baracuda::kernels::cuda
