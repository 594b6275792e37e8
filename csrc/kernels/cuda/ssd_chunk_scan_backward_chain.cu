// Mamba-2 SSD chunk scan, CUDA backward: the local dstates and the reverse state pass in
// one launch (SsdChunkScanLaunch::dstate_chain: the group products' backward with the
// chunk-state kernel's products on wgmma, 16-bit inputs, no seq_idx). With the notation of
// ssd_chunk_scan.cuh (G_c = dL/dH_c, Gn_c = G_{c+1}, local_c the chunk's own dstate):
//
// One block per (chunk c, batch b, head h, 64-row tile of head_dim, 128 state columns),
// 4 warps (one warpgroup):
//   1. local_c[d][n] = Σ_q exp(Acs_q)·dy_q[d]·C_q[n] (tc_chunk_state_tile: the chunk-state
//      kernel's wgmma products, the same bits as its DSTATE launch), while H_c (the
//      forward's 16-bit copy: states_t or the kept states) is copied into shared memory;
//   2. waits for the block of chunk c + 1 of the same chain (b, h, tile) to publish G_{c+1}
//      and copies it from the chain's ring (L2) into the products' shared memory, now free
//      (the last chunk takes dfinal_states, or zeros);
//   3. Gn_c = G_{c+1} rounded to T → gstates_t; kpart[b, h, c, tile] = Σ_tile Gn_c·H_c;
//      G_c = local_c + exp(Acs_last(c))·G_{c+1} → the ring for chunk c − 1, published
//      (after chunk 0: dinitial_states).
// That is ssd_tc_chunk_state_kernel<T, true, 2, false, true> and ssd_state_pass_bwd_kernel
// in one pass, without the local dstate's float32 round trip through memory (B·H·nc·D·N
// floats written, then read: 168 MB each way at the Mamba-2 2.7B shape) and without the
// pass's window of whole-row loads. Gn_c (so dx, dC and dB) and dinitial_states are the
// same bits as the two kernels'; ⟨Gn_c, H_c⟩ is summed per tile (64 × 128) rather than per
// 1024 consecutive elements, so ddt, dA and ddt_bias can differ in their last bits.
//
// Ordering and progress, as in the fused forward (ssd_fused_forward.cu): blocks take a
// ticket (atomicAdd) when they start and work on the ticket's problem, chunk-major from the
// last chunk down, so the block a block waits for (chunk c + 1, the same chain) has a
// smaller ticket: it has started, is resident, and waits only for smaller tickets itself.
// The hand-over uses a ring of two float32 tiles per chain and a counter per chain (chunks
// published), both in the workspace; the launcher zeroes the ticket and the counters on the
// stream first (cudaMemsetAsync: graph-capturable). Every sum has an order fixed by the
// shapes: results are bitwise reproducible.
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels {
namespace cuda {
namespace {

constexpr int kChainN = 2 * kSsdTile;   // state columns a block (the chunk-state kernel's NT = 2)
constexpr int kChainLdH = kChainN + 8;  // H_c's 16-bit rows in shared memory
constexpr int kChainLdG = kChainN + 8;  // G_{c+1}'s float32 rows there
constexpr int kChainTile = kSsdTile * kChainN;  // elements of a ring tile, [64][128]
constexpr int kChainRing = kSsdCsStages * 3 * kSsdTileBytes;  // the products' ring (NT = 2)
static_assert(kSsdTile * kChainLdG * 4 <= kChainRing, "G_{c+1} fits the products' ring once they are done");
constexpr int kChainSmem = ssd_cs_smem<2>() + kSsdTile * kChainLdH * 2;

template <typename T>
struct SsdChainParams {
  SsdStateParams<T> st;  // the products' operands (dy, C), acs (st.out unused)
  int n_blocks;          // 128-column blocks of N
  int64_t chains;        // B·H·d_tiles·n_blocks
  int64_t kparts;        // d_tiles·n_blocks (SsdWorkspace::kparts)
  const T* hcopy;        // [B, H, nc, D, N]: H_c rounded to T
  T* gcopy;              // [B, H, nc, D, N]: Gn_c rounded to T (gstates_t)
  float* kpart;          // [B, H, nc, kparts]
  int* ticket;           // then one counter a chain: chunks published, from the last down
  float* ring;           // [chains][2][64][128]: G_c for chunk c − 1, slot c % 2
  const float* seed;     // dfinal_states [B, H, D, N] at seed_s strides, or null (zeros)
  int64_t seed_s[4];
  float* last;           // dinitial_states, dense [B, H, D, N], or null
};

template <typename T>
__global__ void __launch_bounds__(kTcThreads) ssd_dstate_chain_kernel(const SsdChainParams<T> p) {
  extern __shared__ __align__(16) unsigned char ssd_dyn_smem[];
  unsigned char* ring = gmma_align1024(ssd_dyn_smem);
  T* const sH = reinterpret_cast<T*>(ring + kChainRing);  // [64][kChainLdH]
  float* const sG = reinterpret_cast<float*>(ring);         // [64][kChainLdG], after the products
  __shared__ __align__(16) float sW[kSsdCsStages][kSsdTile];
  __shared__ int sCut;  // (tc_chunk_state_tile's, for seq_idx: unused here)
  __shared__ int sTicket;
  __shared__ float sRed[kTcThreads / 32];
  const SsdStateParams<T>& s = p.st;
  if (threadIdx.x == 0) sTicket = atomicAdd(p.ticket, 1);
  __syncthreads();
  const int64_t u = sTicket;
  const int64_t chain = u % p.chains, c = s.nchunks - 1 - u / p.chains;
  int64_t rest = chain;
  const int nb = static_cast<int>(rest % p.n_blocks);
  rest /= p.n_blocks;
  const int dtl = static_cast<int>(rest % s.d_tiles);
  rest /= s.d_tiles;
  const int64_t h = rest % s.heads, b = rest / s.heads, bh = b * s.heads + h;
  const int d0 = dtl * kSsdTile, n0 = nb * kChainN;
  const int dv = static_cast<int>(min(static_cast<int64_t>(kSsdTile), s.D - d0));
  const int nv = static_cast<int>(min(static_cast<int64_t>(kChainN), s.N - n0));
  const int64_t dn = s.D * s.N;
  const int64_t at = (bh * s.nchunks + c) * dn + static_cast<int64_t>(d0) * s.N + n0;  // the tile in [B, H, nc, D, N]
  // H_c's tile into sH (zeros past D and N): 16-byte copies where N keeps every row's
  // groups aligned, else one value at a time; a commit group of its own, which the
  // products' first wait includes.
  {
    const T* src = p.hcopy + at;
    const bool vec = s.N % 8 == 0;
    for (int i = threadIdx.x; i < kSsdTile * (kChainN / 8); i += kTcThreads) {
      const int r = i / (kChainN / 8), c8 = (i % (kChainN / 8)) * 8;
      T* dst = sH + r * kChainLdH + c8;
      if (vec && r < dv && c8 + 8 <= nv) {
        ssd_cp_async16(dst, src + static_cast<int64_t>(r) * s.N + c8);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          dst[k] = r < dv && c8 + k < nv ? src[static_cast<int64_t>(r) * s.N + c8 + k] : from_acc<T>(0.0f);
      }
    }
    ssd_cp_async_commit();
  }
  float acc[2][8][4];
  tc_chunk_state_tile<T, /*DSTATE=*/true, 2, /*SEG=*/false, /*WG=*/true>(s, b, h, c, d0, n0, dv, nv, ring, sW, sCut,
                                                                         acc);
  __syncthreads();  // every warp is done with the ring (G_{c+1} goes there) and sH is visible
  const bool top = c == s.nchunks - 1;
  if (!top) {
    if (threadIdx.x == 0) {
      const int want = static_cast<int>(s.nchunks - 1 - c);  // chunks nc − 1 .. c + 1 published
      for (int64_t spins = 0; ld_acquire(p.ticket + 1 + chain) < want; ++spins) {
        if (spins > (int64_t{1} << 26)) __trap();  // (a wait of seconds can only be a bug)
        __nanosleep(32);
      }
    }
    __syncthreads();
    const float* src = p.ring + (chain * 2 + ((c + 1) & 1)) * kChainTile;
    for (int i = threadIdx.x; i < kChainTile / 4; i += kTcThreads) {
      const int r = i / (kChainN / 4), c4 = (i % (kChainN / 4)) * 4;
      ssd_cp_async16(sG + r * kChainLdG + c4, src + r * kChainN + c4);
    }
    ssd_cp_async_commit();
    ssd_cp_async_wait<0>();
    __syncthreads();
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g8 = lane / 4, t4 = lane % 4;
  const double* acs = s.acs + bh * s.seqlen;
  const float dec = ssd_decay<float>(acs[min(c * s.chunk + s.chunk, s.seqlen) - 1]);
  float* const next = c > 0 ? p.ring + (chain * 2 + (c & 1)) * kChainTile : nullptr;
  T* const gn = p.gcopy + at;
  const bool pairs = s.N % 2 == 0;
  float kd = 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 16 * warp + g8 + 8 * half, col = j * kSsdTile + nt * 8 + 2 * t4;
        const bool in0 = r < dv && col < nv, in1 = r < dv && col + 1 < nv;
        float2 g = make_float2(0.0f, 0.0f);  // G_{c+1}
        if (!top) {
          g = *reinterpret_cast<const float2*>(sG + r * kChainLdG + col);
        } else if (p.seed != nullptr) {
          const float* sp = p.seed + b * p.seed_s[0] + h * p.seed_s[1] + (d0 + r) * p.seed_s[2];
          if (in0) g.x = sp[(n0 + col) * p.seed_s[3]];
          if (in1) g.y = sp[(n0 + col + 1) * p.seed_s[3]];
        }
        T hv[2];
        memcpy(hv, sH + r * kChainLdH + col, sizeof(hv));
        if (in0) kd += g.x * to_acc(hv[0]);
        if (in1) kd += g.y * to_acc(hv[1]);
        T* const o = gn + static_cast<int64_t>(r) * s.N + col;
        if (pairs && in1) {
          *reinterpret_cast<uint32_t*>(o) = ssd_pack2<T>(g.x, g.y);
        } else {
          if (in0) o[0] = from_acc<T>(g.x);
          if (in1) o[1] = from_acc<T>(g.y);
        }
        // G_c (past D and N the products and G are zeros: the ring's tile is whole)
        const float2 gc = make_float2(acc[j][nt][2 * half] + dec * g.x, acc[j][nt][2 * half + 1] + dec * g.y);
        if (next != nullptr) {
          __stcg(reinterpret_cast<float2*>(next + r * kChainN + col), gc);
        } else if (p.last != nullptr) {
          float* const lp = p.last + (bh * s.D + d0 + r) * s.N + n0 + col;
          if (in0) lp[0] = gc.x;
          if (in1) lp[1] = gc.y;
        }
      }
    }
  }
  kd = ssd_sum32(kd);
  if (lane == 0) sRed[warp] = kd;
  // The barrier orders the block's ring stores before thread 0's release (cumulative: it
  // covers what its thread has observed), as fused_publish_state does.
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kTcThreads / 32; ++w) t += sRed[w];
    p.kpart[(bh * s.nchunks + c) * p.kparts + dtl * p.n_blocks + nb] = t;
    if (c > 0) st_release(p.ticket + 1 + chain, static_cast<int>(s.nchunks - c));
  }
}

template <typename T>
void launch_chain(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  constexpr const char* op = "ssd_chunk_scan_backward(dstate_chain)";
  SsdChainParams<T> p;
  SsdStateParams<T>& s = p.st;
  s.batch = l.batch, s.seqlen = l.seqlen, s.heads = l.heads, s.hpg = l.heads / l.groups;
  s.chunk = l.chunk_size, s.nchunks = l.nchunks(), s.D = l.head_dim, s.N = l.state_dim;
  s.d_tiles = static_cast<int>(w.d_tiles), s.n_tiles = static_cast<int>(w.n_tiles);
  s.xo = ssd_operand<T>(l.dy, l.dy_stride, true);
  s.yo = ssd_operand<T>(l.C, l.C_stride, false);
  s.acs = ssd_ws<double>(l, w.acs);
  s.dtf = ssd_ws<float>(l, w.dtf);
  s.seg = nullptr;
  s.out = nullptr;
  s.total_blocks = 0;
  p.n_blocks = static_cast<int>((l.state_dim + kChainN - 1) / kChainN);
  p.chains = w.chains;
  p.kparts = w.kparts;
  if (p.kparts != w.d_tiles * p.n_blocks || p.chains != l.batch * l.heads * p.kparts)
    fail(PlanErrorKind::Internal, op, "the workspace's chains do not match the launch");
  p.hcopy = ssd_h_copy<T>(l, w);
  p.gcopy = ssd_ws<T>(l, w.gstates_t);
  p.kpart = ssd_ws<float>(l, w.kpart);
  p.ticket = ssd_ws<int>(l, w.chain_ctr);
  p.ring = ssd_ws<float>(l, w.chain_ring);
  p.seed = static_cast<const float*>(l.dfinal_states);
  for (int i = 0; i < 4; ++i) p.seed_s[i] = l.dfinal_stride[i];
  p.last = static_cast<float*>(l.dinitial_states);
  const int64_t blocks = s.nchunks * p.chains;
  if (blocks > 0x7fffffff) fail(PlanErrorKind::Internal, op, "too many blocks for one launch");
  if (cudaMemsetAsync(p.ticket, 0, (1 + p.chains) * sizeof(int), stream) != cudaSuccess)
    fail(PlanErrorKind::Internal, op, "zeroing the chain's counters failed");
  allow_dynamic_smem(ssd_dstate_chain_kernel<T>, kChainSmem, op);
  ssd_dstate_chain_kernel<T><<<static_cast<unsigned>(blocks), kTcThreads, kChainSmem, stream>>>(p);
  check_launch(op);
}

}  // namespace

// Gn_c (gstates_t), the ⟨Gn_c, H_c⟩ partials (kpart) and dinitial_states, where
// ssd_run_states<T, true> would compute them (SsdChunkScanLaunch::dstate_chain).
void ssd_backward_dstate_chain(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t stream) {
  if (l.element == ElementKind::F16)
    launch_chain<__half>(l, w, stream);
  else if (l.element == ElementKind::BF16)
    launch_chain<__nv_bfloat16>(l, w, stream);
  else
    fail(PlanErrorKind::Internal, "ssd_chunk_scan_backward(dstate_chain)", "the chain takes 16-bit inputs");
}

}  // namespace cuda
}  // namespace baracuda::kernels
