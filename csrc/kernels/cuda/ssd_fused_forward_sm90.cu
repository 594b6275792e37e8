// Mamba-2 SSD chunk scan, CUDA forward in one launch on Hopper ("fused_wgmma"): the
// algorithm of ssd_fused_forward.cu (read its header comment first) with the products on
// warpgroup MMAs (wgmma, sm_90a), whose operands come straight from shared memory, so a
// product takes one instruction per 64 x 64 x 16 step instead of sixteen mma.sync and
// their ldmatrix loads. Problems and the plan's choice: SsdCudaForward.
//
// A block is two warpgroups. Shared memory holds the chunk's x [256][64], B and C
// [256][N] and the incoming state H_c [64][N] (16-bit) in wgmma's 128-byte swizzle, as
// panels of 64 columns (gmma_sw128_elem; filled by cp.async 16 bytes at a time, a warp
// whole rows, without bank conflicts: the core-matrix layout this kernel had put a
// row's 8 groups in one bank group). The chunk's rows fall
// into four 64-row blocks; warpgroup 0 computes the outputs of blocks 0 and 3, warpgroup
// 1 those of blocks 1 and 2 (the same causal work), each block as
//   Y = (C_i·H_cᵀ)∘exp(Acs_t) + Σ_{j <= i} P_ij·X_j,  P_ij = (C_i·B_jᵀ)∘exp(Acs_t − Acs_s)·dt_s
// (C·Bᵀ on wgmma from shared memory, P formed in the accumulator registers and fed back as
// the register operand of the next product). The chunk state S_c = (x∘wgt)ᵀ·B is split by
// positions between the warpgroups (blocks 0-1 and 2-3, the weighted x as a register
// operand); warpgroup 1 adds warpgroup 0's half through shared memory and hands
// H_{c+1} = exp(Acs_last)·H_c + S_c over to the next chunk. Everything is waited for at
// the start (no overlap of one chunk's loads with another's products yet).
#include "kernels/cuda/ssd_fused_common.cuh"
#include "kernels/cuda/ssd_wgmma.cuh"

namespace baracuda::kernels {
namespace cuda {
namespace {

[[maybe_unused]] constexpr int kRowBlock = 64;  // rows of a warpgroup's output block and of a position block

// A [kFusedQ][COLS] tile, 128-byte swizzled (fused_load_tile; a thread's rows kStep apart,
// a multiple of 8, keep its chunk's swizzle, so 8 rows are 1024 bytes apart).
template <typename T, int COLS>
__device__ __forceinline__ void load_sw_tile(unsigned char* dst, const T* src, int64_t s_row, int64_t s_col, bool vec,
                                             int rows, int K) {
  fused_load_tile<T, COLS>([&](int r, int c) { return dst + gmma_sw128_elem(kFusedQ, r, c); }, 1024, src, s_row,
                           s_col, vec, rows, K);
}

template <typename T, int NS>
__global__ void __launch_bounds__(kFusedThreads, 1) ssd_fused_forward_sm90_kernel(const FusedParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // (the swizzled tiles need 1024-byte alignment; ssd_fused_smem_bytes has room for it)
  unsigned char* smem = gmma_align1024(smem_raw);
  unsigned char* sX = smem;                          // [256][64]
  unsigned char* sB = sX + kFusedQ * kFusedP * 2;    // [256][NS]
  unsigned char* sC = sB + kFusedQ * NS * 2;         // [256][NS]
  unsigned char* sH = sC + kFusedQ * NS * 2;         // [64][NS]: H_c, rounded
  float* sS = reinterpret_cast<float*>(sH + kFusedP * NS * 2);  // [64][NS]: decay·H_c + S_c halves
  float* acs2 = sS + kFusedP * NS;                              // [kFusedQ]
  float* dts = acs2 + kFusedQ;
  float* wgt = dts + kFusedQ;
  float* warp_total = wgt + kFusedQ;
  int& s_ticket = *reinterpret_cast<int*>(warp_total + kFusedWarps);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wl = warp & 3;  // warpgroup, warp in it
  const int g8 = lane >> 2, q4 = lane & 3;
  if (tid == 0) s_ticket = atomicAdd(p.ticket, 1);
  __syncthreads();
  const FusedTile tile = fused_tile(p, s_ticket);
  const int len = tile.len;

  // ---- loads (dt first), dt's cumsum, the incoming state
  const FusedDt dt_in = fused_dt_load<T>(p, tile);
  {
    const T* x = static_cast<const T*>(p.x) + tile.b * p.xs[0] + tile.t0 * p.xs[1] + tile.h * p.xs[2] +
                 tile.p0 * p.xs[3];
    load_sw_tile<T, kFusedP>(sX, x, p.xs[1], p.xs[3], p.x_vec, len, kFusedP);
    const T* Bg = static_cast<const T*>(p.B) + tile.b * p.Bs[0] + tile.t0 * p.Bs[1] + tile.grp * p.Bs[2];
    load_sw_tile<T, NS>(sB, Bg, p.Bs[1], p.Bs[3], p.bc_vec, len, p.state_dim);
    const T* Cg = static_cast<const T*>(p.C) + tile.b * p.Cs[0] + tile.t0 * p.Cs[1] + tile.grp * p.Cs[2];
    load_sw_tile<T, NS>(sC, Cg, p.Cs[1], p.Cs[3], p.bc_vec, len, p.state_dim);
    ssd_cp_async_commit();
  }
  const float last2 = fused_dt_cumsum(p, tile, dt_in, acs2, dts, wgt, warp_total);
  fused_wait_for_state(p, tile);
  const float decay = fast_exp2(last2);
  // H_c rounded into sH, and decay·H_c into sS (the warpgroups add their S_c halves to
  // it); every thread's loads in flight at once
  {
    constexpr int kPer = kFusedP * NS / 4 / kFusedThreads;
    float4 h[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = tid + i * kFusedThreads;
      h[i] = fused_state_in4<NS>(p, tile, e / (NS / 4), (e % (NS / 4)) * 4);
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = tid + i * kFusedThreads, pr = e / (NS / 4), n = (e % (NS / 4)) * 4;
      *reinterpret_cast<float4*>(sS + pr * NS + n) =
          make_float4(decay * h[i].x, decay * h[i].y, decay * h[i].z, decay * h[i].w);
      const uint2 hr = make_uint2(ssd_pack2<T>(h[i].x, h[i].y), ssd_pack2<T>(h[i].z, h[i].w));
      *reinterpret_cast<uint2*>(sH + gmma_sw128_elem(kFusedP, pr, n)) = hr;
      if (p.states != nullptr) fused_keep_states4(p, tile, pr, n, hr);
    }
  }
  ssd_cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  const int nblocks = (len + kRowBlock - 1) / kRowBlock;

  // ---- the chunk state first (the next chunk waits for it): H_{c+1} = decay·H_c + S_c,
  // warpgroup wg summing position blocks 2·wg and 2·wg + 1
  {
    float st[NS / 2];
#pragma unroll
    for (int k = 0; k < NS / 2; ++k) st[k] = 0.0f;
    for (int j = 2 * wg; j < 2 * wg + 2 && j < nblocks; ++j) {
      const int s0 = j * kRowBlock;
      uint32_t af[4][4];  // (x∘wgt)ᵀ: rows p (16 per warp), k = positions
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int sk = s0 + kk * 16;
        // (lane: row sk + 8·(lane / 16) + lane % 8, the 8 columns 16·wl + 8·((lane / 8) % 2))
        ssd_ldsm_x4_t(af[kk], sX + gmma_sw128_off(sk + ((lane >> 4) << 3) + (lane & 7), wl * 2 + ((lane >> 3) & 1)));
        const float2 w01 = *reinterpret_cast<const float2*>(wgt + sk + 2 * q4);
        const float2 w89 = *reinterpret_cast<const float2*>(wgt + sk + 2 * q4 + 8);
        af[kk][0] = scale2<T>(af[kk][0], w01.x, w01.y);
        af[kk][1] = scale2<T>(af[kk][1], w01.x, w01.y);
        af[kk][2] = scale2<T>(af[kk][2], w89.x, w89.y);
        af[kk][3] = scale2<T>(af[kk][3], w89.x, w89.y);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        // B = B rows s, columns n: N-major
        const uint64_t bdesc = gmma_sw128_mnmajor(sB, kFusedQ, s0 + kk * 16);
        if constexpr (NS == 128)
          wgmma_rs_n128<T, 1>(st, af[kk], bdesc);
        else
          wgmma_rs_n64<T, 1>(st, af[kk], bdesc);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(st);
    }
    // warpgroup 0 adds its half into sS, then warpgroup 1 adds its own and hands over
    for (int turn = 0; turn < 2; ++turn) {
      if (wg == turn) {
#pragma unroll
        for (int j = 0; j < NS / 8; ++j) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int pr = wl * 16 + g8 + half * 8, n = j * 8 + 2 * q4;
            float2* cell = reinterpret_cast<float2*>(sS + pr * NS + n);
            const float2 v = make_float2(cell->x + st[4 * j + 2 * half], cell->y + st[4 * j + 2 * half + 1]);
            if (turn == 0)
              *cell = v;
            else
              fused_state_out<NS>(p, tile, pr, n, v);
          }
        }
      }
      if (turn == 0) __syncthreads();
    }
  }
  fused_publish_state(p, tile);

  // ---- the output: warpgroup 0 takes row blocks 0 and 3, warpgroup 1 blocks 1 and 2
  for (int pass = 0; pass < 2; ++pass) {
    const int i = pass == 0 ? wg : 3 - wg;
    if (i >= nblocks) continue;
    const int r0 = i * kRowBlock;
    const int ta = r0 + wl * 16 + g8, tb = ta + 8;  // this thread's two rows
    const float acs_a = acs2[ta], acs_b = acs2[tb];
    uint32_t zr[2][8] = {};  // z of rows ta, tb for the epilogue, loaded early
    if (p.z != nullptr) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if ((half == 0 ? ta : tb) < len) zr[half][j] = fused_z_pair<T>(p, tile, half == 0 ? ta : tb, j * 8 + 2 * q4);
    }
    float y[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) y[k] = 0.0f;
    // inter-chunk: C_i·H_cᵀ (A = C rows, K-major; B = H rows p, K-major)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < NS / 16; ++kk)
      wgmma_ss_n64<T, 0, 0>(y, gmma_sw128_kmajor(sC, kFusedQ, r0, kk), gmma_sw128_kmajor(sH, kFusedP, 0, kk));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(y);
    {
      const float ea = fast_exp2(acs_a), eb = fast_exp2(acs_b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y[4 * j] *= ea;
        y[4 * j + 1] *= ea;
        y[4 * j + 2] *= eb;
        y[4 * j + 3] *= eb;
      }
    }
    // intra-chunk: position blocks j <= i. C_i·B_{j+1}ᵀ runs on the tensor cores while
    // block j's P is formed (two accumulators, the loop unrolled by two).
    auto issue_cb = [&](float (&cb)[32], int j) {
#pragma unroll
      for (int k = 0; k < 32; ++k) cb[k] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < NS / 16; ++kk)
        wgmma_ss_n64<T, 0, 0>(cb, gmma_sw128_kmajor(sC, kFusedQ, r0, kk),
                              gmma_sw128_kmajor(sB, kFusedQ, j * kRowBlock, kk));
      wgmma_commit();
    };
    // P = (C·Bᵀ)∘exp(Acs_t − Acs_s)·dt_s (s <= t) as the register operand, then y += P·X_j
    // (B = x rows s, columns p: N-major). The caller has waited for cb.
    auto consume = [&](float (&cb)[32], int j) {
      wgmma_fence_regs(cb);
      const int s0 = j * kRowBlock;
      uint32_t pf[4][4];  // 16 positions per k-step
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int s = s0 + nt * 8 + 2 * q4;
        const float2 as = *reinterpret_cast<const float2*>(acs2 + s);
        const float2 ds = *reinterpret_cast<const float2*>(dts + s);
        const float pa0 = s <= ta ? cb[4 * nt] * fast_exp2(acs_a - as.x) * ds.x : 0.0f;
        const float pa1 = s + 1 <= ta ? cb[4 * nt + 1] * fast_exp2(acs_a - as.y) * ds.y : 0.0f;
        const float pb0 = s <= tb ? cb[4 * nt + 2] * fast_exp2(acs_b - as.x) * ds.x : 0.0f;
        const float pb1 = s + 1 <= tb ? cb[4 * nt + 3] * fast_exp2(acs_b - as.y) * ds.y : 0.0f;
        pf[nt / 2][(nt % 2) * 2] = ssd_pack2<T>(pa0, pa1);
        pf[nt / 2][(nt % 2) * 2 + 1] = ssd_pack2<T>(pb0, pb1);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs_n64<T, 1>(y, pf[kk], gmma_sw128_mnmajor(sX, kFusedQ, s0 + kk * 16));
      wgmma_commit();
    };
    // Each step waits for everything before it: C·B_jᵀ, and the previous P·X, whose
    // register operand pf the next consume overwrites.
    float cb0[32], cb1[32];
    issue_cb(cb0, 0);
    for (int j = 0; j <= i; j += 2) {
      wgmma_wait<0>();
      if (j + 1 <= i) issue_cb(cb1, j + 1);
      consume(cb0, j);
      if (j + 1 > i) break;
      wgmma_wait<0>();
      if (j + 2 <= i) issue_cb(cb0, j + 2);
      consume(cb1, j + 1);
    }
    wgmma_wait<0>();
    wgmma_fence_regs(y);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int t = half == 0 ? ta : tb;
      if (t >= len) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = j * 8 + 2 * q4;
        fused_store_out<T>(p, tile, t, col, y[4 * j + 2 * half], y[4 * j + 2 * half + 1],
                           *reinterpret_cast<const uint32_t*>(sX + gmma_sw128_elem(kFusedQ, t, col)), zr[half][j],
                           dt_in.D);
      }
    }
  }

#else
  (void)p;
  __trap();  // only sm_90a code runs this kernel (the plan checks that the build has it)
#endif
}

template <typename T, int NS>
void launch_fused_sm90(const SsdChunkScanLaunch& l, cudaStream_t stream) {
  const FusedParams p = fused_params(l, stream);
  const int64_t smem = ssd_fused_smem_bytes(SsdCudaForward::FusedWgmma, NS);
  fused_allow_smem(ssd_fused_forward_sm90_kernel<T, NS>, smem);
  const int64_t blocks = fused_chains(l) * p.nchunks;
  ssd_fused_forward_sm90_kernel<T, NS><<<static_cast<unsigned int>(blocks), kFusedThreads, smem, stream>>>(p);
  check_launch("ssd_chunk_scan");
}

}  // namespace
}  // namespace cuda

void ssd_chunk_scan_cuda_fused_forward_sm90(const SsdChunkScanLaunch& l, void* stream) {
  using namespace cuda;
  fused_check_launch(l, SsdCudaForward::FusedWgmma);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_half(l.element, "ssd_chunk_scan", [&](auto tag) {
    using T = decltype(tag);
    l.fused_state_tile == 128 ? launch_fused_sm90<T, 128>(l, s) : launch_fused_sm90<T, 64>(l, s);
  });
}

}  // namespace baracuda::kernels
