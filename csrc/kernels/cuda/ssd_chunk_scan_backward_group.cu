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
//                           products), written to the workspace (zeros where s > q or
//                           outside the chunk)
//   ssd_group_apply_kernel  block per (b, g, c, 64-row tile, 64-column tile of N), for dC
//                           (rows q) or dB (rows s): the inter-chunk term, summed over
//                           the head splits that ssd_tc_scan_kernel<DC/DB, INTER> wrote, plus
//                           dCB (rounded to the input type, as mamba_ssm rounds its dCB)
//                           times B or C, written in the input type
// Determinism: every sum has an order fixed by the shapes (heads in order, k-steps in
// order, then the splits in order); no atomics.
// Non-finite values: as the other tensor-core kernels, a diagonal tile's products run
// over whole 16-position k-steps, so a NaN or Inf in B, C (or in dy, x through dCB) can
// also reach up to 15 other positions of its 16-position block.
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {
namespace {

// The (row tile, column tile) of lower-triangular tile pair `pair`: (0,0), (1,0), (1,1), ...
__device__ __forceinline__ void tile_pair(int pair, int& ti, int& tj) {
  ti = 0;
  while ((ti + 1) * (ti + 2) / 2 <= pair) ++ti;
  tj = pair - ti * (ti + 1) / 2;
}

template <typename T>
struct SsdGroupDcbParams {
  int64_t seqlen, heads, groups, hpg, chunk, nchunks, total_blocks;
  int P, KP, ld;     // head_dim, rounded up to the k-step, shared-memory row stride
  int pairs, qp;     // tile pairs per chunk; Q' (dCB's row length)
  SsdOperand<T> x, dy;
  const double* acs;
  const float* dtf;
  float* dcb;        // [B, G, nc, Q', Q']
};

template <typename T>
__global__ void __launch_bounds__(kTcThreads) ssd_group_dcb_kernel(const SsdGroupDcbParams<T> p) {
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  const int tile_elems = kSsdTile * p.ld;
  T* sDy = reinterpret_cast<T*>(ssd_dyn_smem);  // [2][64][ld]: q rows of dy, per head buffer
  T* sX = sDy + 2 * tile_elems;                 // [2][64][ld]: s rows of x
  __shared__ double sRowAcs[2][kSsdTile], sColAcs[2][kSsdTile];
  __shared__ float sColDt[2][kSsdTile];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int ti, tj;
    tile_pair(static_cast<int>(vb % p.pairs), ti, tj);
    int64_t rest = vb / p.pairs;
    const int64_t c = rest % p.nchunks;
    rest /= p.nchunks;
    const int64_t g = rest % p.groups, b = rest / p.groups;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = ti * kSsdTile, c0 = tj * kSsdTile;
    if (r0 >= len) continue;  // a tile past the end of the last (short) chunk: never read
    const int rows = min(kSsdTile, len - r0), cols = min(kSsdTile, len - c0);
    const bool live = rw < rows;
    const int hi_np = ti == tj ? warp + 1 : 4;  // column pairs holding s <= q for the warp's rows
    // Copies head h's dy rows, x rows and row / column data into buffer `buf`.
    auto load = [&](int64_t h, int buf) {
      const T* dyp = p.dy.p + b * p.dy.s[0] + (t0 + r0) * p.dy.s[1] + h * p.dy.s[2];
      const T* xp = p.x.p + b * p.x.s[0] + (t0 + c0) * p.x.s[1] + h * p.x.s[2];
      tc_fill<T, true>(sDy + buf * tile_elems, p.ld, kSsdTile, p.KP, dyp, p.dy.s[1], p.dy.s[3], rows, p.P);
      tc_fill<T, true>(sX + buf * tile_elems, p.ld, kSsdTile, p.KP, xp, p.x.s[1], p.x.s[3], cols, p.P);
      if (tid < kSsdTile) {
        const int64_t at = (b * p.heads + h) * p.seqlen + t0;
        sRowAcs[buf][tid] = tid < rows ? p.acs[at + r0 + tid] : 0.0;
        sColAcs[buf][tid] = tid < cols ? p.acs[at + c0 + tid] : 0.0;
        sColDt[buf][tid] = tid < cols ? p.dtf[at + c0 + tid] : 0.0f;
      }
    };
    float acc[8][4];
    tc_zero(acc);
    const int64_t h0 = g * p.hpg;
    __syncthreads();  // the previous virtual block is done with shared memory
    load(h0, 0);
    ssd_cp_async_commit();
    for (int hi = 0; hi < p.hpg; ++hi) {
      const int buf = hi & 1;
      if (hi + 1 < p.hpg) load(h0 + hi + 1, buf ^ 1);
      ssd_cp_async_commit();
      ssd_cp_async_wait<1>();  // head hi's copies are done
      __syncthreads();
      if (live) {
        float m[8][4];
        tc_zero(m);
        tc_warp_gemm<T, false, false>(m, sDy + buf * tile_elems + rw * p.ld, p.ld, sX + buf * tile_elems, p.ld,
                                      p.KP / 16, 0, hi_np);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int ql = rw + g8 + 8 * half;
          const double ra = sRowAcs[buf][ql];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int sl = nt * 8 + 2 * t4 + e;
              // selected, not multiplied: masked pairs add exactly nothing
              if (ql < rows && sl < cols && c0 + sl <= r0 + ql)
                acc[nt][2 * half + e] += m[nt][2 * half + e] *
                                         (ssd_decay<float>(ra - sColAcs[buf][sl]) * sColDt[buf][sl]);
            }
        }
      }
      __syncthreads();  // buffer `buf` is free for head hi + 2
    }
    ssd_cp_async_wait<0>();
    float* tile = p.dcb + ((b * p.groups + g) * p.nchunks + c) * static_cast<int64_t>(p.qp) * p.qp +
                  static_cast<int64_t>(r0) * p.qp;
#pragma unroll
    for (int half = 0; half < 2; ++half)
      tc_store_row<float>(tile + static_cast<int64_t>(rw + g8 + 8 * half) * p.qp, c0, p.qp, true, acc, half, 1.0f);
  }
}

template <typename T>
struct SsdGroupApplyParams {
  int64_t batch, seqlen, groups, chunk, nchunks, total_blocks, nsplit;
  int N, qp, r_tiles, j_tiles;
  SsdOperand<T> v;     // B (dC) or C (dB), [B, L, G, N]
  const float* dcb;    // [B, G, nc, Q', Q']
  const float* split;  // [nsplit, B, L, G, N]: the inter-chunk terms per head split
  T* out;              // dC or dB, [B, L, G, N] contiguous
};

// acc += A·V over k-steps kk_lo <= kk < kk_hi of one 64-deep tile: A is the warp's 16
// rows, stored [m][k] (A_KM false) or [k][m] (true; sA then points at the warp's first
// column); V is stored [k][n] with 64 columns.
template <typename T, bool A_KM>
__device__ __forceinline__ void apply_steps(float (&acc)[8][4], const T* sA, const T* sV, int kk_lo, int kk_hi) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk < kk_lo || kk >= kk_hi) continue;
    uint32_t a[4];
    if constexpr (A_KM)
      ssd_ldsm_x4_t(a, sA + (kk * 16 + (lane / 16) * 8 + lane % 8) * kTcLd + ((lane / 8) % 2) * 8);
    else
      ssd_ldsm_x4(a, sA + (lane % 16) * kTcLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      ssd_ldsm_x4_t(bf, sV + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kTcLd + np * 16 + (lane / 16) * 8);
      ssd_mma16816<T>(acc[2 * np], a, bf[0], bf[1]);
      ssd_mma16816<T>(acc[2 * np + 1], a, bf[2], bf[3]);
    }
  }
}

// DB false: dC (rows q, partners s <= q, A = dCB[q][s] as stored); DB true: dB (rows s,
// partners q >= s, A = dCBᵀ, i.e. the stored tile read k-major).
template <typename T, bool DB>
__global__ void __launch_bounds__(kTcThreads) ssd_group_apply_kernel(const SsdGroupApplyParams<T> p) {
  __shared__ __align__(16) T sA[kSsdTile * kTcLd];
  __shared__ __align__(16) T sV[kSsdTile * kTcLd];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g8 = lane / 4, t4 = lane % 4;
  const int rw = 16 * warp;
  for (int64_t vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int64_t rest = vb;
    const int jt = static_cast<int>(rest % p.j_tiles);
    rest /= p.j_tiles;
    const int rt = static_cast<int>(rest % p.r_tiles);
    rest /= p.r_tiles;
    const int64_t c = rest % p.nchunks;
    rest /= p.nchunks;
    const int64_t g = rest % p.groups, b = rest / p.groups;
    const int64_t t0 = c * p.chunk;
    const int len = static_cast<int>(min(p.chunk, p.seqlen - t0));
    const int r0 = rt * kSsdTile, j0 = jt * kSsdTile;
    if (r0 >= len) continue;
    const int n_t = (len + kSsdTile - 1) / kSsdTile;
    const float* mat = p.dcb + ((b * p.groups + g) * p.nchunks + c) * static_cast<int64_t>(p.qp) * p.qp;
    const T* vbase = p.v.p + b * p.v.s[0] + t0 * p.v.s[1] + g * p.v.s[2];
    float acc[8][4];
    tc_zero(acc);
    const int k_first = DB ? rt : 0, k_last = DB ? n_t - 1 : rt;
    for (int kt = k_first; kt <= k_last; ++kt) {
      __syncthreads();  // the previous step (or virtual block) is done with sA, sV
      // dC: dCB[q = rt rows][s = kt cols]; dB: dCB[q = kt rows][s = rt cols] (read k-major)
      const float* src = DB ? mat + static_cast<int64_t>(kt * kSsdTile) * p.qp + r0
                            : mat + static_cast<int64_t>(r0) * p.qp + kt * kSsdTile;
      tc_fill_f32<T>(sA, kTcLd, kSsdTile, kSsdTile, src, p.qp, kSsdTile, kSsdTile);
      tc_fill<T>(sV, kTcLd, kSsdTile, kSsdTile, vbase + static_cast<int64_t>(kt * kSsdTile) * p.v.s[1] + j0 * p.v.s[3],
                 p.v.s[1], p.v.s[3], min(kSsdTile, len - kt * kSsdTile), p.N - j0);
      __syncthreads();
      // The diagonal tile: only the 16-position k-steps with causal partners.
      const int lo = kt == rt && DB ? warp : 0, hi = kt == rt && !DB ? warp + 1 : 4;
      if constexpr (DB)
        apply_steps<T, true>(acc, sA + rw, sV, lo, hi);
      else
        apply_steps<T, false>(acc, sA + rw * kTcLd, sV, lo, hi);
    }
    const int64_t count = p.batch * p.seqlen * p.groups * p.N;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = r0 + rw + g8 + 8 * half;
      if (r >= len) continue;
      const int64_t row = ((b * p.seqlen + t0 + r) * p.groups + g) * p.N;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t4 + e;
          if (j >= p.N) continue;
          float v = 0.0f;
          for (int64_t sp = 0; sp < p.nsplit; ++sp) v += p.split[sp * count + row + j];
          p.out[row + j] = from_acc<T>(v + acc[nt][2 * half + e]);
        }
    }
  }
}

template <typename T>
void launch_dcb(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdGroupDcbParams<T> p;
  p.seqlen = l.seqlen, p.heads = l.heads, p.groups = l.groups, p.hpg = l.heads / l.groups;
  p.chunk = l.chunk_size, p.nchunks = l.nchunks();
  p.P = static_cast<int>(l.head_dim);
  p.KP = ssd_k16(p.P);
  p.ld = p.KP + 8;
  p.qp = static_cast<int>(w.dcb_ld);
  const int tiles = p.qp / kSsdTile;
  p.pairs = tiles * (tiles + 1) / 2;
  p.total_blocks = l.batch * l.groups * p.nchunks * p.pairs;
  p.x = ssd_operand<T>(l.x, l.x_stride, true);
  p.dy = ssd_operand<T>(l.dy, l.dy_stride, true);
  p.acs = ssd_ws<double>(l, w.acs);
  p.dtf = ssd_ws<float>(l, w.dtf);
  p.dcb = ssd_ws<float>(l, w.dcb);
  if (p.total_blocks == 0) return;
  const int smem = 4 * kSsdTile * p.ld * static_cast<int>(sizeof(T));
  ssd_tc_smem(ssd_group_dcb_kernel<T>, smem, "ssd_chunk_scan_backward(group_dcb)");
  ssd_group_dcb_kernel<T><<<ssd_grid(p.total_blocks), kTcThreads, smem, stream>>>(p);
  check_launch("ssd_chunk_scan_backward(group_dcb)");
}

template <typename T, bool DB>
void launch_apply(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  SsdGroupApplyParams<T> p;
  p.batch = l.batch, p.seqlen = l.seqlen, p.groups = l.groups, p.chunk = l.chunk_size;
  p.nchunks = l.nchunks(), p.nsplit = w.nsplit;
  p.N = static_cast<int>(l.state_dim);
  p.qp = static_cast<int>(w.dcb_ld);
  p.r_tiles = p.qp / kSsdTile;
  p.j_tiles = static_cast<int>((l.state_dim + kSsdTile - 1) / kSsdTile);
  p.total_blocks = l.batch * l.groups * p.nchunks * p.r_tiles * p.j_tiles;
  p.v = DB ? ssd_operand<T>(l.C, l.C_stride, false) : ssd_operand<T>(l.B, l.B_stride, false);
  p.dcb = ssd_ws<float>(l, w.dcb);
  p.split = ssd_ws<float>(l, w.split);
  p.out = static_cast<T*>(DB ? l.dB : l.dC);
  if (p.total_blocks == 0) return;
  ssd_group_apply_kernel<T, DB><<<ssd_grid(p.total_blocks), kTcThreads, 0, stream>>>(p);
  check_launch(DB ? "ssd_chunk_scan_backward(group_db)" : "ssd_chunk_scan_backward(group_dc)");
}

template <typename F>
void dispatch_half(ElementKind e, F&& f) {
  if (e == ElementKind::F16)
    f(__half{});
  else if (e == ElementKind::BF16)
    f(__nv_bfloat16{});
  else
    fail(PlanErrorKind::Internal, "ssd_chunk_scan_backward", "group products planned for a non-16-bit input");
}

}  // namespace

void ssd_backward_group_dcb(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_half(l.element, [&](auto tag) { launch_dcb<decltype(tag)>(l, w, s); });
}

void ssd_backward_group_apply(const SsdChunkScanLaunch& l, const SsdWorkspace& w, bool db, cudaStream_t s) {
  dispatch_half(l.element, [&](auto tag) {
    using T = decltype(tag);
    db ? launch_apply<T, true>(l, w, s) : launch_apply<T, false>(l, w, s);
  });
}

}  // namespace baracuda::kernels::cuda
