// Mamba-2 SSD chunk scan: y = ssd_chunk_scan(x, dt, A, B, C, chunk_size) and its backward
// dy -> (dx, ddt, dA, dB, dC).
//
//   x, y [B, L, H, D]   dt [B, L, H]   A [H]   B, C [B, L, G, N], H % G == 0
//
// Per batch b and head h (group g = h / (H/G)), with h_{-1} = 0:
//   decay_t = exp(dt_t · A_h),  h_t = decay_t · h_{t-1} + dt_t · x_t ⊗ B_t,
//   y_t[d]  = Σ_n C_t[n] · h_t[d, n]
// (SsdChunkScanLaunch below gives the backward's formulas).
//
// With the options of mamba_chunk_scan_combined (D, z, dt_bias, dt_softplus, dt
// limits, initial and final states, seq_idx; SsdChunkScanLaunch below) the same plans
// cover ssd_chunk_scan_combined and its backward.
//
// Variants: "sequential" (CPU: the exact recurrence in float64), "chunked" (CUDA: the
// state-space-duality algorithm, float32 math, float64 for float64), "chunked_mma"
// (CUDA, float16/bfloat16 on sm_80+: the same algorithm with its tile products on
// tensor cores, float32 accumulation, operands in the input dtype: the inputs exactly,
// and the intermediates that feed a product (P = C·Bᵀ∘decay, decay-weighted x and dy,
// the float32 chunk states) rounded to it once, as mamba_ssm does), and "zeros" when
// an extent among B, L, H, D, N is 0: nothing is launched and the caller computes the
// outputs (zero_fill_outputs()): without options every output is empty or identically
// zero (a sum over an empty state); with them y is D·x (gated by z), final_states the
// initial states when L = 0, and dD, dz, dinitial_states follow from those.
#pragma once

#include <array>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/plan.h"

namespace baracuda {

// Which CUDA forward the plan runs: the staged kernels (cumsum, chunk states and state
// passing, chunk scan: any problem), or the one-launch fused kernel (float16/bfloat16,
// head_dim a multiple of kSsdFusedHeadTile, state_dim <= kSsdFusedMaxState (above 128:
// FusedMmaCb only), chunk <= kSsdFusedMaxChunk, seq_idx on the mma.sync kernels only, and
// the device's opt-in shared memory holds ssd_fused_smem_bytes) on mma.sync
// (kernels/cuda/ssd_fused_forward.cu, sm_80+), either computing each 16 × 16 tile of C·Bᵀ
// in every head's block (FusedMma) or reading it from a table that a small kernel computes
// once per (batch, chunk, group) first (FusedMmaCb:
// the plan's choice with kSsdFusedCbMinHeads or more heads per group, where the table
// costs no more memory than x and saves each block that product and C's shared-memory
// tile, so that two blocks share a multiprocessor), or on Hopper's wgmma
// (ssd_fused_forward_sm90.cu, sm_90 devices with the build's sm_90a code). The wgmma
// kernel is slower than mma.sync on an H100 today (BENCHMARKS.md, "SSD per kernel"), so
// the plan does not pick it; ssd_force_cuda_forward runs any of them for tests and
// measurements.
enum class SsdCudaForward : uint8_t { Staged, FusedMma, FusedMmaCb, FusedWgmma };
// Heads per group from which the plan takes FusedMmaCb (ssd_chunk_scan_plan.cpp's
// cuda_forward says why).
constexpr int64_t kSsdFusedCbMinHeads = 4;

// Tests and benchmarks only: makes the plan pick `kernel` for the CUDA forward wherever
// that kernel takes the problem and runs on the device (Staged always does), or restores
// the plan's own choice (std::nullopt). Returns the previous setting.
std::optional<SsdCudaForward> ssd_force_cuda_forward(std::optional<SsdCudaForward> kernel);

// The CUDA backward's intra-chunk dB and dC products ("group_mma"): with several heads
// per group, the per-head weight matrices M_h[q][s] = (dy_q·x_s)·exp(Acs_q − Acs_s)·dt_s
// are summed over the group's heads first (dCB, float32, one Q × Q matrix per batch,
// chunk and group) and multiplied with B and C once per group, instead of once per head
// (kernels/cuda/ssd_chunk_scan_backward_group.cu). The plan takes it for the tensor-core
// backward (float16/bfloat16, sm_80+) with head_dim <= 128 and state_dim <= 256 where
// dCB takes no more memory than 8× x (chunk / (4·head_dim) heads per group or more: one
// head at chunk 256 and head_dim 64).
// Tests and benchmarks only: `force` true / false makes the plan take it wherever it can
// run / never; std::nullopt restores the plan's own choice. Returns the previous setting.
std::optional<bool> ssd_force_group_products(std::optional<bool> force);
// With the group products on an sm_90 device whose build holds sm_90a code, the plan runs
// the dC/dB kernel's per-head products on wgmma ("group_wgmma") instead of mma.sync
// ("group_mma"). Tests and benchmarks only: `force` false keeps mma.sync; true or
// std::nullopt takes wgmma wherever it can run. Returns the previous setting.
std::optional<bool> ssd_force_group_wgmma(std::optional<bool> force);
// With the group products the plan runs the dCB kernel (and with seq_idx the SEG launches)
// on side streams beside the kernels they do not depend on (SsdChunkScanLaunch::
// side_stream): the same kernels and bits, in less time. Tests and benchmarks only:
// `force` false keeps every kernel on the caller's stream; true or std::nullopt takes the
// side streams wherever the group products run. Returns the previous setting.
std::optional<bool> ssd_force_backward_side_stream(std::optional<bool> force);
// On an sm_90 device whose build holds sm_90a code the plan runs the tensor-core
// chunk-state kernel's products on wgmma where a block computes 128 state columns
// (SsdChunkScanLaunch::state_wgmma): the same bits as on mma.sync. Tests and benchmarks
// only: `force` false keeps mma.sync; true or std::nullopt takes wgmma wherever the plan
// would. Returns the previous setting.
std::optional<bool> ssd_force_state_wgmma(std::optional<bool> force);
// With the group products on an sm_90 device whose build holds sm_90a code the plan runs
// the dx kernel's P·dy on wgmma with D given (SsdChunkScanLaunch::dx_wgmma): the same
// bits as on mma.sync. Tests and benchmarks only: `force` false keeps mma.sync, true takes
// wgmma wherever the kernel can (D or not), std::nullopt restores the plan's choice.
// Returns the previous setting.
std::optional<bool> ssd_force_dx_wgmma(std::optional<bool> force);
// With z given and dD's partials from the dx kernel the plan runs the gate kernel by
// positions' rows (SsdChunkScanLaunch::gate_rows): the same bits as the segment kernel.
// Tests and benchmarks only: `force` false keeps the segment kernel; true or std::nullopt
// takes the rows kernel wherever the plan would. Returns the previous setting.
std::optional<bool> ssd_force_gate_rows(std::optional<bool> force);
// With z given, the fused forward's two halves of a state tile of 256 both take output
// tiles (SsdChunkScanLaunch::fused_split_share): the same bits as the first half's block
// taking them all. Tests and benchmarks only: `force` false keeps them on the first half's
// block, true shares them wherever there are two halves (z or not), std::nullopt restores
// the plan's choice. Returns the previous setting.
std::optional<bool> ssd_force_split_share(std::optional<bool> force);
// With FusedMmaCb on an sm_90 device with the build's sm_90a code, the fused forward is
// launched as a programmatic dependent of the C·Bᵀ table kernel
// (SsdChunkScanLaunch::fused_pdl): the same bits. Tests and benchmarks only: `force` false
// launches it after the table as any kernel; true or std::nullopt restores the plan's
// choice. Returns the previous setting.
std::optional<bool> ssd_force_fused_pdl(std::optional<bool> force);

// Shared memory of the staged tensor-core scan kernel (kernels/cuda/ssd_chunk_scan_tc.cuh's
// ssd_launch_tc_scan) without its cache of Lft·Rgtᵀ tiles, for a contraction over k1 (N for
// y and dx, `multi` false; D for dC and dB, `multi` true): an Lft tile, a V tile, an Rgt tile
// and the larger of the S tile and another V and Rgt pair, 64 rows each (S: k1 rows) of
// 16-bit values padded by 16 bytes. The kernel keeps kSsdTcStaticSmem of the device's
// opt-in limit for its static arrays. With 16-bit inputs on tensor cores the state passes
// write H_c only rounded to the input type (and, with the group products, Gn_c), which the
// tensor-core kernels read and the SIMT ones cannot, so the plan runs every stage on tensor
// cores only where this fits the device for N and D (on a 99 KB device, N and D up to 192),
// else every stage on SIMT.
constexpr int64_t kSsdTcStaticSmem = 2048;
constexpr int64_t ssd_tc_scan_smem_bytes(int64_t k1, bool multi) {
  const int64_t k1p = (k1 + 15) / 16 * 16;
  const int64_t lft = (64 * (k1p + 8) * 2 + 15) / 16 * 16;
  const int64_t s = multi ? (k1p * (64 + 8) * 2 + 15) / 16 * 16 : lft;
  const int64_t v = 64 * (64 + 8) * 2;
  return 2 * lft + v + (s > v + lft ? s : v + lft);
}

// The fused forward's geometry, shared by the plan and the kernels: a block owns one chunk
// (up to kSsdFusedMaxChunk positions) of one head and kSsdFusedHeadTile of its head_dim
// columns; the state columns are padded to a tile of 64, 128 or 256. A tile of 256
// (state_dim above 128) FusedMmaCb alone takes, and the plan takes it there whatever the
// heads per group, as two halves of 128 columns in blocks of their own (each half's state
// is a chain of its own; the second half's block hands its H_c to the first's, which
// multiplies C·H_cᵀ over both and finishes the output), so that its blocks are those of N = 128 (108 KB, two a
// multiprocessor). Measured on an H200 at B2 L4096 H16 P128 N256 G16 (one head per
// group), µs of kernels: the staged kernels 767; one block of the whole tile (175 KB, one
// block a multiprocessor) 352–357 with its C·Bᵀ table of 100–103 (BENCHMARKS.md, "SSD:
// dCB stored in 16 bits by its kernel, …"); the halves 323, the fused kernel 251 → 218.
constexpr int64_t kSsdFusedMaxChunk = 256;
constexpr int64_t kSsdFusedHeadTile = 64;
constexpr int64_t kSsdFusedMaxState = 256;
// Dynamic shared memory of a fused forward for a state tile of `ns` columns: x [256][64],
// B and C [256][ns] (FusedMmaCb: no C tile), the incoming state [64][ns] (16-bit;
// FusedMmaCb keeps it where B was, once the chunk state is done; the mma.sync kernels pad
// each row by 16 bytes for ldmatrix), the wgmma kernel's float32 exchange of its two
// warpgroups' chunk-state halves [64][ns], the cumsum, dt and weight vectors (float32),
// 64 bytes of per-warp scan totals and the block's ticket, and with seq_idx (`seq`: the
// mma.sync kernels) the sequence starts (int32, a position each and a per-warp maximum each).
// The wgmma kernel's 16-bit tiles are 128-byte swizzled (1024-byte aligned: 1024 bytes
// more to align the base).
constexpr int64_t ssd_fused_smem_bytes(SsdCudaForward kernel, int64_t ns, bool seq = false) {
  const int64_t pad = kernel == SsdCudaForward::FusedWgmma ? 0 : 8;
  const int64_t exchange = kernel == SsdCudaForward::FusedWgmma ? kSsdFusedHeadTile * ns * 4 + 1024 : 0;
  const int64_t bch_rows =
      kernel == SsdCudaForward::FusedMmaCb ? kSsdFusedMaxChunk : 2 * kSsdFusedMaxChunk + kSsdFusedHeadTile;
  const int64_t starts = seq ? (kSsdFusedMaxChunk + 8) * 4 : 0;
  return (kSsdFusedMaxChunk * (kSsdFusedHeadTile + pad) + bch_rows * (ns + pad)) * 2 + exchange +
         4 * kSsdFusedMaxChunk * 4 + 64 + starts;
}
// FusedMmaCb's C·Bᵀ table: per (batch, chunk, group), the causal 16 × 16 tiles (row tile
// i, column tile j <= i; i·(i+1)/2 + j in order) of float32, each as the 32 lanes'
// mma.sync accumulator fragments: the first n8 tile's 4 floats of each lane (lane-major),
// then the second's, so that a warp's 16-byte load of either is 512 contiguous bytes.
constexpr int64_t ssd_fused_cb_tiles(int64_t chunk) {
  const int64_t t = (chunk + 15) / 16;
  return t * (t + 1) / 2;
}

// The group products' dx kernel (kernels/cuda/ssd_chunk_scan_backward_group.cu): a block
// takes up to kSsdGroupDxHeads heads of a group for one 64-row tile of a chunk. Its
// dynamic shared memory: the B rows [64][N16 + 8], a head's state tile [64][N16 + 8] (Gn_c
// rounded by the state pass), two dy tiles [64][72] and two heads' x tiles [64][72], all
// 16-bit; N16 = state_dim rounded up to 16 (at N = 128, 70 KB: three blocks an SM fit the
// plain kernel's registers).
// Heads per block, measured at the 2.7B shape (H100, bf16; 80 heads a group): dx took
// 1163 us with 4, 1239 with 8, 1353 with 16 and 2277 with all 80 (fewer heads: more,
// shorter blocks and a shorter tail; the B rows are loaded once a block). With the
// kernel of 2026-12 (two blocks an SM with D, addresses once a block) 8 won on an H200:
// dx with D and dD's partials 652-657 us against 666-667 with 4, 621 against 620-626
// with z, 528 without the options.
constexpr int64_t kSsdGroupDxHeads = 8;
constexpr int64_t ssd_group_dx_smem_bytes(int64_t state_dim) {
  const int64_t ld = (state_dim + 15) / 16 * 16 + 8;
  return 64 * ld * 2 + 64 * ld * 2 + 2 * 64 * 72 * 2 * 2;
}

// The group products' dCB kernel (ssd_group_dcb_kernel in the same file): its dynamic
// shared memory holds two heads' dy and x tiles [2][64][P16 + 8] each, which the block's C
// and B rows [64][N16 + 8] use before the heads; with `overlap`
// (SsdChunkScanLaunch::dcb_overlap) one head's dy and x tiles and, beside them, the C and
// B rows, all 16-bit. Its static shared memory (the heads' decays, dt and crossing sums)
// is at most kSsdGroupDcbStaticSmem bytes (the kernel asserts it).
constexpr int64_t kSsdGroupDcbStaticSmem = 8192;
constexpr int64_t ssd_group_dcb_smem_bytes(int64_t head_dim, int64_t state_dim, bool overlap) {
  const int64_t tile = 64 * ((head_dim + 15) / 16 * 16 + 8), rows = 64 * ((state_dim + 15) / 16 * 16 + 8);
  return 2 * (overlap ? 2 * tile + 2 * rows : (4 * tile > 2 * rows ? 4 * tile : 2 * rows));
}

// The group products' dC and dB kernel (ssd_group_grad_kernel in the same file): its
// dynamic shared memory holds a ring of heads' rows of dy (dC) or x (dB), [64][P16 + 8]
// (the first two also phase 1's [64][72] dCB and B or C tiles), and their state tiles
// [P16][72], all 16-bit, and for dC a float32 copy of the block's C tile [64][72]; each
// part starts at a 16-byte boundary. P16 = head_dim rounded up to 16. With wgmma
// (group_wgmma) the ring's tiles are unpadded and 128-byte swizzled, [64][P64] (P16
// rounded up to 64) and [P16][64], at 1024-byte boundaries (1024 bytes more for that). The
// ring: dB three heads (two in flight during one's products: dB 180 -> 166 us at the
// Mamba-2 2.7B shape, H200), dC two (it spends that memory on its C tile; 229 us with
// either ring).
constexpr int ssd_group_grad_stages(bool db) { return db ? 3 : 2; }
// The elements of one Lft row in a ring buffer (padded rows; wgmma: P16 rounded up to 64,
// the swizzled panels), byte offsets (from the aligned base) of the state tiles and of dC's
// C tile, and the dynamic shared memory in all: the plan checks `bytes`, the kernel's
// launcher uses the lot.
struct SsdGroupGradSmem {
  int64_t lrow, off_s, off_c, bytes;
};
constexpr SsdGroupGradSmem ssd_group_grad_smem(int64_t head_dim, bool db, bool wgmma) {
  const int64_t kp = (head_dim + 15) / 16 * 16, s = ssd_group_grad_stages(db);
  const int64_t lrow = wgmma ? (kp + 63) / 64 * 64 : kp + 8, srow = wgmma ? 64 : 72, align = wgmma ? 1024 : 16;
  const int64_t rows = s * 64 * lrow > 2 * 64 * 72 ? s * 64 * lrow : 2 * 64 * 72;
  const int64_t off_s = (rows * 2 + align - 1) / align * align;
  const int64_t off_c = off_s + (s * kp * srow * 2 + 15) / 16 * 16;
  return {lrow, off_s, off_c, (wgmma ? 1024 : 0) + off_c + (db ? 0 : 64 * 72 * 4)};
}
constexpr int64_t ssd_group_grad_smem_bytes(int64_t head_dim, bool db, bool wgmma) {
  return ssd_group_grad_smem(head_dim, db, wgmma).bytes;
}

// The mamba_ssm `mamba_chunk_scan_combined` contract on top of the recurrence above
// (every option is absent when its pointer is null / its flag is false, and then the
// kernels compute exactly the plain scan):
//   dt_t  <- dt_t + dt_bias_h;  dt_t <- softplus(dt_t) where dt_t <= 20 (dt_softplus);
//   dt_t  <- min(max(dt_t, dt_min), dt_max)      (always: the default (0, inf) maps a
//            negative dt to 0); computed in the compute type, before anything else.
//   h_{-1} = initial_states[b, h]; the state resets to 0 at every t > 0 where
//            seq_idx[b, t] != seq_idx[b, t-1] (initial_states belong to the first
//            sequence); final_states[b, h] = h_{L-1}.
//   y_t   += D_h · x_t  (or D_{h,d} · x_t[d]);   then, with z: y_pre = y,
//   out_t  = y_pre_t · silu(z_t).
// Backward: ddt is the gradient of the *raw* dt: zero where the processed dt lies strictly
// outside [dt_min, dt_max], times sigmoid(dt + dt_bias) where softplus applied;
// ddt_bias[h] = Σ_{b,t} ddt; dD, dz, dinitial_states as the formulas give; the incoming
// gradient of final_states (dfinal_states) seeds the reverse recurrence.
// Reductions over b and t (dA, dD, ddt_bias) are in a fixed order: deterministic.
struct SsdChunkScanLaunch {
  ElementKind element = ElementKind::F32;  // dtype of x, B, C, z, dy, y, dx, dB, dC, dz
  // The compute type: F32 for F16/BF16/F32 inputs, F64 for F64. A, D, dt_bias,
  // initial_states, final_states, dfinal_states and dA, dD, ddt_bias, dinitial_states
  // are in this type (the op layer converts the caller's small parameter tensors).
  ElementKind compute = ElementKind::F32;
  // dt's dtype (and ddt's): `element` or `compute`.
  ElementKind dt_element = ElementKind::F32;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0, state_dim = 0, groups = 0;
  int64_t chunk_size = 0;
  // CUDA forward: the kernel the plan chose, and a fused kernel's state tile (64, 128, or
  // 256 for FusedMmaCb), which FusedMmaCb's blocks take in fused_state_split parts (2 at
  // 256: see kSsdFusedMaxState).
  SsdCudaForward cuda_forward = SsdCudaForward::Staged;
  int64_t fused_state_tile = 0;
  int64_t fused_state_split = 1;
  // With fused_state_split 2: each half's block hands its rounded H_c to the other's, and
  // both take output rows (the second half's 128 .. 255), where otherwise the second half's
  // block stops after its hand-over and the first's takes every row (split_share in
  // ssd_chunk_scan_plan.cpp; ssd_force_split_share).
  bool fused_split_share = false;
  // FusedMmaCb: the fused kernel is launched as a programmatic dependent of the C·Bᵀ table
  // kernel (Hopper's programmatic dependent launch), its blocks' loads, chunk states and
  // hand-overs running during the table's last wave and each warp waiting for the table
  // only before its first read of it (fused_pdl in ssd_chunk_scan_plan.cpp;
  // ssd_force_fused_pdl).
  bool fused_pdl = false;
  // CUDA backward: the intra-chunk dB/dC products once per group and dx from the
  // group's B·Cᵀ tiles (see ssd_force_group_products); the workspace then holds dCB and
  // those tiles.
  bool group_products = false;
  // With group_products: the dC/dB kernel's per-head products on wgmma (sm_90a, the
  // plan's choice there; see ssd_force_group_wgmma).
  bool group_wgmma = false;
  // With group_products: the dCB kernel runs on a side stream beside the backward's state
  // kernels (it needs only the cumsum; joined before dx), and with seq_idx each SEG
  // launch of the dCB and dx kernels beside its plain one (kernels/cuda/side_stream.cuh;
  // see ssd_force_backward_side_stream).
  bool side_stream = false;
  // With group_products: the dCB pass splits each group's heads over this many blocks
  // per tile pair, each writing its own partial dCB (summed in split order where dC and
  // dB read it), so that its blocks fill whole rounds of the GPU (see ssd_dcb_splits).
  int64_t dcb_splits = 1;
  // With group_products and one head a dCB block (dcb_splits == heads per group): the
  // block's one head's dy and x tiles are copied beside its C and B rows, in flight while
  // it computes C·Bᵀ, where they would wait for it (see ssd_dcb_overlap).
  bool dcb_overlap = false;
  // With group_products: the dx kernel, which holds dy_pre and x of each (row tile,
  // column tile, head) in shared memory for its D term and ddt dots, writes dD's partials
  // (one per chunk row tile); the gate kernel, there for them alone without z, does not
  // run then, and with z reads no x. See ssd_dD_segments.
  bool dD_in_dx = false;
  // With z given and dD_in_dx (the gate kernel computes dy_pre and dz alone): the gate
  // kernel as an element-wise map over the positions' rows in 16-byte vectors
  // (ssd_gate_rows_kernel; gate_rows in ssd_chunk_scan_plan.cpp), where the launch finds
  // every operand's d contiguous and 16-byte aligned (as for the segment kernel's vectors);
  // the segment kernel otherwise.
  bool gate_rows = false;
  // dt >= 0 after its clamp (dt_min >= 0, the default): each head's cumsum is monotone, so
  // the mma.sync fused forwards and the group dCB and dx kernels weigh the pairs of a tile that lies
  // after its reference position by a row factor times a column factor, exp2 once a
  // position instead of once a pair (kernels/cuda/ssd_chunk_scan_tc.cuh, "factored
  // weights"). With dt of both signs they keep one exp2 a pair.
  bool factored_decays = false;
  // CUDA tensor-core path: the state columns (64 or 128) one block of the chunk-state
  // kernel computes (H_c's S_c and the backward's local dstate), reading each x (or dy)
  // tile once for all of them (state_tile_n in ssd_chunk_scan_plan.cpp). 0 elsewhere.
  int64_t state_tile_n = 0;
  // With state_tile_n 128 on an sm_90 device with the build's sm_90a code: the chunk-state
  // kernel's products on wgmma (m64n128, A from registers), the same bits as its mma.sync
  // ones, in less time (state_wgmma in ssd_chunk_scan_plan.cpp; ssd_force_state_wgmma),
  // with or without seq_idx.
  bool state_wgmma = false;
  // With group_products on an sm_90 device with the build's sm_90a code: the dx kernel's
  // P·dy on wgmma (its plain instantiation; the SEG one keeps mma.sync), the same bits
  // (dx_wgmma in ssd_chunk_scan_plan.cpp; ssd_force_dx_wgmma).
  bool dx_wgmma = false;
  // z is given (the plan knows before the pointers arrive): the CUDA backward's workspace
  // then holds dy_pre = dy·silu(z), which its kernels read in place of dy.
  bool gated = false;
  // The device the plan was made for (DeviceInfo): whether the 16-bit inputs run on the
  // tensor-core kernels (sm_80+), its multiprocessors (grid sizes, head splits) and the
  // shared memory a block may opt into (which tensor-core kernels fit). The kernels take
  // these from here: no device query at launch.
  bool tensor_cores = false;
  int sm_count = 1;
  int64_t smem_optin_bytes = 48 * 1024;
  int64_t nchunks() const { return chunk_size > 0 ? (seqlen + chunk_size - 1) / chunk_size : 0; }
  // Q' of the group products: the longest chunk rounded up to the 64-position tile.
  int64_t dcb_ld() const { return ((chunk_size < seqlen ? chunk_size : seqlen) + 63) / 64 * 64; }

  // Element strides of the inputs, in the order of their dims (any value, 0 included):
  //   x, dy [B, L, H, D]   dt [B, L, H]   A [H] (compute)   B, C [B, L, G, N]
  int64_t x_stride[4] = {}, dt_stride[3] = {}, A_stride = 0, B_stride[4] = {},
          C_stride[4] = {}, dy_stride[4] = {};
  const void* x = nullptr;
  const void* dt = nullptr;
  const void* A = nullptr;
  const void* B = nullptr;
  const void* C = nullptr;
  const void* dy = nullptr;  // backward only

  // Outputs, dense and contiguous:
  //   forward:  y [B, L, H, D] (element: `out` above, after D and the z gate)
  //   backward: dx [B, L, H, D], dB, dC [B, L, G, N] (element), ddt [B, L, H]
  //             (dt_element), dA [H] (compute)
  // Every element of every output is written (no zero-initialisation is assumed).
  void* y = nullptr;
  void* dx = nullptr;
  void* ddt = nullptr;
  void* dA = nullptr;
  void* dB = nullptr;
  void* dC = nullptr;

  // ---- mamba_chunk_scan_combined options ----------------------------------------
  // Inputs (any strides, in the order of their dims):
  //   D [H] (D_per_dim false) or [H, D] (true)   z [B, L, H, D] (element)
  //   dt_bias [H]   initial_states [B, H, D, N]   seq_idx [B, L] (int32, or int64)
  //   dfinal_states [B, H, D, N] (backward; null: zero gradient)
  //   y_pre [B, L, H, D] (backward with z: the forward's pre-gate output)
  const void* D = nullptr;
  bool D_per_dim = false;
  int64_t D_stride[2] = {};
  const void* z = nullptr;
  int64_t z_stride[4] = {};
  const void* dt_bias = nullptr;
  int64_t dt_bias_stride = 0;
  bool dt_softplus = false;
  double dt_min = 0.0, dt_max = __builtin_inf();
  const void* initial_states = nullptr;
  int64_t init_stride[4] = {};
  const void* seq_idx = nullptr;
  bool seq_idx_int64 = false;
  int64_t seq_idx_stride[2] = {};
  const void* dfinal_states = nullptr;
  int64_t dfinal_stride[4] = {};
  const void* y_pre = nullptr;
  int64_t y_pre_stride[4] = {};
  // Outputs, dense and contiguous, written in full when non-null:
  //   forward:  final_states [B, H, D, N] (compute), y_pre [B, L, H, D] (element; only
  //             with z, to be saved for the backward)
  //   backward: dD (D's shape), ddt_bias [H], dinitial_states [B, H, D, N] (compute),
  //             dz [B, L, H, D] (element). Each is non-null exactly when its input is.
  void* final_states = nullptr;
  void* y_pre_out = nullptr;
  // The chunk states kept for the backward: H_c, the state entering chunk c, rounded to
  // the element type, dense [B, H, nc, D, N] (element). Forward (16-bit inputs,
  // SsdChunkScanOptions::keep_states, ssd_keeps_states): written in full, by every kernel
  // of either backend. Backward (the CUDA tensor-core path,
  // SsdChunkScanBackwardDescriptor::has_states): read in place of recomputing them, so the
  // backward runs no chunk-state kernel and no forward state pass.
  bool keep_states = false;
  void* states = nullptr;
  void* dD = nullptr;
  void* ddt_bias = nullptr;
  void* dinitial_states = nullptr;
  void* dz = nullptr;

  // Scratch of at least the matching *_workspace() bytes, 256-byte aligned, contents
  // undefined on entry.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Largest D and N the CUDA kernels are wired for (the CPU has no limit).
constexpr int64_t kSsdCudaMaxDim = 256;

// One operand of the problem as the shared checks see it: dtype and sizes (int64_t, or
// c10::SymInt in a meta kernel).
template <class Int>
struct SsdOperand {
  const char* name;
  ElementKind dtype;
  int rank;
  const Int* sizes;
};

template <class Int>
struct SsdSizes {
  Int batch, seqlen, heads, head_dim, groups, state_dim;
};

namespace ssd_detail {
template <class Int>
std::string shape_of(const SsdOperand<Int>& t) {
  return sizes_str(t.sizes, t.rank);
}
template <class Int>
void check_floating(const std::string& op, const SsdOperand<Int>& t) {
  if (!is_floating(t.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(t.name) + " must be float32, float16, bfloat16 or float64, got " +
             element_name(t.dtype));
}
}  // namespace ssd_detail

// Whether a forward asked to keep its chunk states writes them (SsdChunkScanLaunch::states):
// with float16 or bfloat16 inputs, whatever kernel runs, on either backend (the op's meta
// kernel gives the kept tensor's shape by this rule, and it sees no device). Only the CUDA
// tensor-core backward reads them; every other backward recomputes them.
inline bool ssd_keeps_states(ElementKind element) {
  return element == ElementKind::F16 || element == ElementKind::BF16;
}

// The compute type of an activation dtype: float64 for float64, else float32.
inline ElementKind ssd_compute_type(ElementKind element) {
  return element == ElementKind::F64 ? ElementKind::F64 : ElementKind::F32;
}

namespace ssd_detail {
// TypeError unless t is float32 or the activation dtype (the mixed-dtype rule of the
// small operands: dt, A, D, dt_bias, initial_states).
template <class Int>
void check_f32_or(const std::string& op, const SsdOperand<Int>& t, ElementKind act) {
  if (t.dtype != ElementKind::F32 && t.dtype != act)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(t.name) + " must be float32 or x's dtype " + element_name(act) + ", got " +
             element_name(t.dtype));
}
template <class Int>
bool same_sizes(const SsdOperand<Int>& t, std::initializer_list<Int> want) {
  if (t.rank != static_cast<int>(want.size())) return false;
  int d = 0;
  for (const Int& w : want)
    if (t.sizes[d++] != w) return false;
  return true;
}
template <class Int>
std::string list_str(std::initializer_list<Int> v) {
  std::string s = "[";
  int d = 0;
  for (const Int& w : v) s += (d++ ? ", " : "") + size_str(w);
  return s + "]";
}
// ValueError naming t unless its sizes are `want` (described as `what`).
template <class Int>
void check_shape(const std::string& op, const SsdOperand<Int>& t, const char* what,
                 std::initializer_list<Int> want) {
  if (!same_sizes(t, want))
    fail(PlanErrorKind::InvalidProblem, op,
         std::string(t.name) + " must have shape " + what + " = " + list_str(want) + ", got " +
             shape_of(t));
}
}  // namespace ssd_detail

// Problem checks shared by the plans and the shape-only (meta) kernels, so that a
// compiled graph rejects what eager execution rejects. `cuda` is true when the problem
// is known to run on CUDA (false on the CPU and in meta kernels, where the device is
// not known): only then are D and N limited to kSsdCudaMaxDim. `strict` (the plain
// ssd_chunk_scan op): dt and A in x's dtype; otherwise (ssd_chunk_scan_combined, and
// the plans, which see A in the compute type) each may also be float32.
template <class Int>
SsdSizes<Int> check_ssd_problem(const std::string& op, const SsdOperand<Int>& x,
                                const SsdOperand<Int>& dt, const SsdOperand<Int>& A,
                                const SsdOperand<Int>& B, const SsdOperand<Int>& C,
                                int64_t chunk_size, bool cuda, bool strict = true) {
  using ssd_detail::shape_of;
  for (const SsdOperand<Int>* t : {&x, &dt, &A, &B, &C}) ssd_detail::check_floating(op, *t);
  for (const SsdOperand<Int>* t : {&dt, &A, &B, &C}) {
    if (!strict && t != &B && t != &C) {
      ssd_detail::check_f32_or(op, *t, x.dtype);
      continue;
    }
    if (t->dtype != x.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("x and ") + t->name + " must have the same dtype, got " +
               element_name(x.dtype) + " and " + element_name(t->dtype));
  }

  if (x.rank != 4)
    fail(PlanErrorKind::InvalidProblem, op,
         "x must have shape [B, L, H, D] (4 dims), got " + shape_of(x));
  const Int* xs = x.sizes;
  const std::string bl = size_str(xs[0]) + ", " + size_str(xs[1]);
  if (dt.rank != 3 || dt.sizes[0] != xs[0] || dt.sizes[1] != xs[1] || dt.sizes[2] != xs[2])
    fail(PlanErrorKind::InvalidProblem, op,
         "dt must have shape [B, L, H] = [" + bl + ", " + size_str(xs[2]) + "], got " +
             shape_of(dt));
  if (A.rank != 1 || A.sizes[0] != xs[2])
    fail(PlanErrorKind::InvalidProblem, op,
         "A must have shape [H] = [" + size_str(xs[2]) + "], got " + shape_of(A));
  if (B.rank != 4 || B.sizes[0] != xs[0] || B.sizes[1] != xs[1])
    fail(PlanErrorKind::InvalidProblem, op,
         "B must have shape [B, L, G, N] = [" + bl + ", G, N], got " + shape_of(B));
  bool same = C.rank == 4;
  for (int d = 0; same && d < 4; ++d) same = C.sizes[d] == B.sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "C must have B's shape " + shape_of(B) + ", got " + shape_of(C));

  const Int& H = xs[2];
  const Int& G = B.sizes[2];
  // G == 0 is only consistent with H == 0 (no heads, nothing to read).
  if (G == 0 ? H != 0 : H % G != 0)
    fail(PlanErrorKind::InvalidProblem, op,
         "the number of heads H = x.size(2) must be a multiple of the number of groups "
         "G = B.size(2), got H = " +
             size_str(H) + " and G = " + size_str(G));
  if (chunk_size < 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "chunk_size must be at least 1, got " + std::to_string(chunk_size));
  if (cuda && (xs[3] > kSsdCudaMaxDim || B.sizes[3] > kSsdCudaMaxDim))
    fail(PlanErrorKind::Unsupported, op,
         "D and N up to " + std::to_string(kSsdCudaMaxDim) +
             " are wired on CUDA (the CPU has no limit), got D = " + size_str(xs[3]) +
             " and N = " + size_str(B.sizes[3]));
  return {xs[0], xs[1], xs[2], xs[3], B.sizes[2], B.sizes[3]};
}

// dy must have x's shape and dtype.
template <class Int>
void check_ssd_dy(const std::string& op, const SsdOperand<Int>& x, const SsdOperand<Int>& dy) {
  bool same = dy.rank == x.rank;
  for (int d = 0; same && d < x.rank; ++d) same = dy.sizes[d] == x.sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must have x's shape " + ssd_detail::shape_of(x) + ", got " +
             ssd_detail::shape_of(dy));
  if (dy.dtype != x.dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have x's dtype ") + element_name(x.dtype) + ", got " +
             element_name(dy.dtype));
}

// The backward's kept chunk states (the forward's, SsdChunkScanLaunch::states): x's dtype
// and [B, H, nc, D, N], nc = ceil(L / chunk_size).
template <class Int>
void check_ssd_kept_states(const std::string& op, const SsdOperand<Int>& x, const SsdSizes<Int>& s,
                           int64_t chunk_size, const SsdOperand<Int>& states) {
  const Int nc = (s.seqlen + (chunk_size - 1)) / chunk_size;
  ssd_detail::check_shape(op, states, "[B, H, nc, D, N]", {s.batch, s.heads, nc, s.head_dim, s.state_dim});
  if (states.dtype != x.dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("states (the forward's kept chunk states) must have x's dtype ") +
             element_name(x.dtype) + ", got " + element_name(states.dtype));
}

// The optional operands of ssd_chunk_scan_combined (null: absent), checked against the
// problem's sizes: D [H] or [H, D], z [B, L, H, D] in x's dtype, dt_bias [H],
// initial_states [B, H, D, N] (D, dt_bias and initial_states float32 or x's dtype; in
// the plans, after the op layer's conversion, the compute type), seq_idx [B, L] int32
// or int64; and dt_min <= dt_max. Backward: dfinal_states [B, H, D, N] floating,
// y_pre (required exactly with z) x's shape and dtype.
template <class Int>
struct SsdOptionOperands {
  const SsdOperand<Int>* D = nullptr;
  const SsdOperand<Int>* z = nullptr;
  const SsdOperand<Int>* dt_bias = nullptr;
  const SsdOperand<Int>* initial_states = nullptr;
  const SsdOperand<Int>* seq_idx = nullptr;
  const SsdOperand<Int>* dfinal_states = nullptr;
  const SsdOperand<Int>* y_pre = nullptr;
};

template <class Int>
void check_ssd_options(const std::string& op, const SsdOperand<Int>& x, const SsdSizes<Int>& s,
                       const SsdOptionOperands<Int>& o, double dt_min, double dt_max,
                       bool backward) {
  using namespace ssd_detail;
  if (o.D) {
    check_floating(op, *o.D);
    if (!same_sizes(*o.D, {s.heads}) && !same_sizes(*o.D, {s.heads, s.head_dim}))
      fail(PlanErrorKind::InvalidProblem, op,
           "D must have shape [H] = " + list_str({s.heads}) + " or [H, D] = " +
               list_str({s.heads, s.head_dim}) + ", got " + shape_of(*o.D));
    check_f32_or(op, *o.D, x.dtype);
  }
  if (o.z) {
    check_floating(op, *o.z);
    check_shape(op, *o.z, "[B, L, H, D]", {s.batch, s.seqlen, s.heads, s.head_dim});
    if (o.z->dtype != x.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("z must have x's dtype ") + element_name(x.dtype) + ", got " +
               element_name(o.z->dtype));
  }
  if (o.dt_bias) {
    check_floating(op, *o.dt_bias);
    check_shape(op, *o.dt_bias, "[H]", {s.heads});
    check_f32_or(op, *o.dt_bias, x.dtype);
  }
  if (o.initial_states) {
    check_floating(op, *o.initial_states);
    check_shape(op, *o.initial_states, "[B, H, D, N]",
                {s.batch, s.heads, s.head_dim, s.state_dim});
    check_f32_or(op, *o.initial_states, x.dtype);
  }
  if (o.seq_idx) {
    if (o.seq_idx->dtype != ElementKind::I32 && o.seq_idx->dtype != ElementKind::I64)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("seq_idx must be int32 or int64, got ") + element_name(o.seq_idx->dtype));
    check_shape(op, *o.seq_idx, "[B, L]", {s.batch, s.seqlen});
  }
  if (!(dt_min <= dt_max))
    fail(PlanErrorKind::InvalidProblem, op,
         "dt_limit must satisfy dt_min <= dt_max, got dt_min = " + std::to_string(dt_min) +
             " and dt_max = " + std::to_string(dt_max));
  if (!backward) return;
  if (o.dfinal_states) {
    check_floating(op, *o.dfinal_states);
    check_shape(op, *o.dfinal_states, "[B, H, D, N]",
                {s.batch, s.heads, s.head_dim, s.state_dim});
  }
  if (static_cast<bool>(o.y_pre) != static_cast<bool>(o.z))
    fail(PlanErrorKind::InvalidProblem, op,
         o.z ? "y_pre (the forward's pre-gate output) is required when z is given"
             : "y_pre must be None when z is None");
  if (o.y_pre) {
    check_shape(op, *o.y_pre, "[B, L, H, D]", {s.batch, s.seqlen, s.heads, s.head_dim});
    if (o.y_pre->dtype != x.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("y_pre must have x's dtype ") + element_name(x.dtype) + ", got " +
               element_name(o.y_pre->dtype));
  }
}

// The options of mamba_chunk_scan_combined (SsdChunkScanLaunch gives their
// semantics). The layouts of absent operands (has_* false) are not read.
struct SsdChunkScanOptions {
  TensorLayout D, z, dt_bias, initial_states, seq_idx;
  bool has_D = false, has_z = false, has_dt_bias = false, has_initial_states = false,
       has_seq_idx = false;
  bool dt_softplus = false;
  double dt_min = 0.0, dt_max = __builtin_inf();
  bool final_states = false;  // write final_states
  // Forward: keep the chunk states for the backward (SsdChunkScanLaunch::states) where the
  // plan can (ssd_keeps_states); the op returns them, an empty tensor elsewhere.
  bool keep_states = false;
};

// The plans take A, D, dt_bias and initial_states in the compute type
// (ssd_compute_type(x.dtype)) and dt in x's dtype or the compute type: the op layer
// converts the caller's tensors.
struct SsdChunkScanDescriptor {
  TensorLayout x, dt, A, B, C;
  int64_t chunk_size = 256;
  DeviceInfo device;
  SsdChunkScanOptions options;
};

struct SsdChunkScanBackwardDescriptor {
  SsdChunkScanDescriptor forward;
  TensorLayout dy;
  // dfinal_states in the compute type; y_pre exactly when the forward has z.
  TensorLayout dfinal_states, y_pre;
  bool has_dfinal_states = false;
  // The forward's kept chunk states (x's dtype, [B, H, nc, D, N], dense), or absent: the
  // tensor-core backward reads them, any other recomputes them.
  TensorLayout states;
  bool has_states = false;
};

// Optional operands have a null data pointer when absent.
struct SsdChunkScanArgs {
  TensorRef x, dt, A, B, C;
  MutTensorRef y;
  TensorRef D, z, dt_bias, initial_states, seq_idx;
  MutTensorRef final_states, y_pre;  // final_states with options.final_states; y_pre with z
  MutTensorRef states;               // with keeps_states()
};

struct SsdChunkScanBackwardArgs {
  TensorRef dy, x, dt, A, B, C;
  MutTensorRef dx, ddt, dA, dB, dC;
  TensorRef D, z, dt_bias, initial_states, seq_idx, dfinal_states, y_pre;
  TensorRef states;                                 // with has_states
  MutTensorRef dD, dz, ddt_bias, dinitial_states;  // each exactly with its input
};

// Sequential: the CPU's float64 recurrence (preference "precise"); CpuChunked: the CPU's
// chunked algorithm in float32/float64 (the CPU default); Chunked: the CUDA kernels.
enum class SsdVariant : uint8_t { Sequential, CpuChunked, Chunked, Zeros };

class SsdChunkScanPlan : public OneOutputPlanOf<SsdChunkScanDescriptor, SsdChunkScanLaunch> {
 public:
  static SsdChunkScanPlan select(const SsdChunkScanDescriptor& desc, PlanPreference pref);
  // output_layout() (y): x's sizes, contiguous.
  // final_states [B, H, D, N] in the compute type, contiguous.
  const TensorLayout& final_states_layout() const { return final_; }
  // Whether run() writes the kept chunk states (options.keep_states with 16-bit inputs:
  // ssd_keeps_states), and their layout: [B, H, nc, D, N] in x's dtype, contiguous.
  bool keeps_states() const { return launch_.keep_states; }
  const TensorLayout& states_layout() const { return states_; }
  // True for the "zeros" variant: run() launches nothing and y must be zero-filled by
  // the caller (y is empty, or N == 0 and y is a sum over an empty state).
  bool zero_fill_outputs() const { return variant_ == SsdVariant::Zeros; }
  void can_implement(const SsdChunkScanArgs& args) const;
  void run(void* stream, Workspace workspace, const SsdChunkScanArgs& args) const;

 private:
  SsdVariant variant_ = SsdVariant::Sequential;
  TensorLayout final_, states_;
  size_t kernel_workspace_ = 0;  // what the kernel needs; workspace_ adds slack to align it
};

class SsdChunkScanBackwardPlan
    : public PlanOf<SsdChunkScanBackwardDescriptor, SsdChunkScanLaunch> {
 public:
  static SsdChunkScanBackwardPlan select(const SsdChunkScanBackwardDescriptor& desc,
                                         PlanPreference pref);
  // Layouts of (dx, ddt, dA, dB, dC): the shapes of (x, dt, A, B, C), contiguous.
  const std::array<TensorLayout, 5>& output_layouts() const { return out_; }
  // Layouts of (dD, dz, ddt_bias, dinitial_states) (meaningful only where the input is present).
  const std::array<TensorLayout, 4>& option_output_layouts() const { return opt_out_; }
  // True for the "zeros" variant: every gradient is empty or identically zero, run()
  // launches nothing and the caller zero-fills the outputs.
  bool zero_fill_outputs() const { return variant_ == SsdVariant::Zeros; }
  void can_implement(const SsdChunkScanBackwardArgs& args) const;
  // workspace_size(): O(B·H·⌈L/Q⌉·D·N): states at chunk boundaries, never per-step states.
  void run(void* stream, Workspace workspace, const SsdChunkScanBackwardArgs& args) const;

 private:
  SsdVariant variant_ = SsdVariant::Sequential;
  std::array<TensorLayout, 5> out_;
  std::array<TensorLayout, 4> opt_out_;
  size_t kernel_workspace_ = 0;  // what the kernel needs; workspace_ adds slack to align it
};

}  // namespace baracuda
