// Warp-level tensor-core primitives of the SSD chunk scan's 16-bit path (sm_80+):
// ldmatrix, mma.sync.m16n8k16 with float32 accumulation, and cp.async. Only these few
// functions touch PTX, so that a host emulation can replace this one header. Also the
// order of a chunk's lower-triangular tile pairs, which the tile kernels share.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"; g = lane / 4,
// t = lane % 4; each 32-bit register holds two 16-bit values, the lower column / k index
// in the low half):
//   A (16 × 16, m × k), 4 registers: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..],
//                                    a2 = A[g][2t+8..],  a3 = A[g+8][2t+8..]
//   B (16 × 8,  k × n), 2 registers: b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 × 8,  m × n), 4 floats:    c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = row g + 8
// ldmatrix.x4 loads four 8 × 8 16-bit matrices; lanes 8i..8i+7 give the row addresses of
// matrix i, and register i of lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix
// i (with .trans: column l/4, rows 2(l%4), 2(l%4)+1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace baracuda::kernels::cuda {

// Two floats rounded to T (round to nearest even) and packed, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t ssd_pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

// A pair of 16-bit values at positions k and k + 1 (low half first), each kept where its
// position is in [lo, hi), else 0 (selected: a NaN outside stays out).
__device__ __forceinline__ uint32_t keep2(uint32_t r, int k, int lo, int hi) {
  return (k >= lo && k < hi ? r & 0xffffu : 0u) | (k + 1 >= lo && k + 1 < hi ? r & 0xffff0000u : 0u);
}

__device__ __forceinline__ uint32_t ssd_smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 × 8 matrices of 16-bit values from shared memory (16-byte aligned rows).
__device__ __forceinline__ void ssd_ldsm_x4(uint32_t (&r)[4], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ssd_smem_u32(row))
               : "memory");
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();  // the host dispatch runs this path only on sm_80 and newer
#endif
}

// The same, each matrix transposed.
__device__ __forceinline__ void ssd_ldsm_x4_t(uint32_t (&r)[4], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ssd_smem_u32(row))
               : "memory");
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// ---- a warp's 16 × 64 output tile stored 16 bytes a lane ------------------------------------
// An m16n8 accumulator's lane holds two 16-bit values of a row (rows g8 and g8 + 8, columns
// 8·j + 2·q4): stored as they are, a quad writes 16 bytes of a 32-byte sector per 4-byte
// store. Staged through shared memory, 8 lanes write a row's 128 bytes with one 16-byte
// store each (benchmarks/tune/fragment_stores.cu: 182 against 62 µs for 168 MB in dx's
// layout on an H100). The staging tile is [16][64] 16-bit, row r's 16-byte group g at
// group g ^ (r % 8): the fragments' 8 rows a matrix (stmatrix, ldmatrix) and the lanes'
// 16-byte row reads meet no bank conflict.
__device__ __forceinline__ int ssd_stage_at(int r, int g) { return r * 64 + (g ^ (r & 7)) * 8; }
// The row lane l addresses in an ldmatrix / stmatrix x4 over the fragment pairs (rows
// 0..7, step j), (rows 8..15, j), (rows 0..7, j + 1), (rows 8..15, j + 1): row l % 8 of
// matrix l / 8.
__device__ __forceinline__ int ssd_stage_lane_at(int lane, int j) {
  return ssd_stage_at(((lane >> 3) & 1) * 8 + (lane & 7), j + (lane >> 4));
}
// The warp's tile of fragment pairs v[half][j] (half: rows 8..15) into `stage` (16-byte
// aligned, 2 KB, free when this starts), then put(r, g, value) for the 16-byte group g of
// row r, 4 a lane; `stage` is free again when this returns.
template <typename Put>
__device__ __forceinline__ void ssd_store_staged(unsigned short* stage, const uint32_t (&v)[2][8], int lane,
                                                 Put put) {
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     ssd_smem_u32(stage + ssd_stage_lane_at(lane, j))),
                 "r"(v[0][j]), "r"(v[1][j]), "r"(v[0][j + 1]), "r"(v[1][j + 1])
                 : "memory");
#else  // (before sm_90: the same tile by 4-byte shared stores)
    const int g8 = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int jj = j; jj < j + 2; ++jj)
        *reinterpret_cast<uint32_t*>(stage + ssd_stage_at(g8 + 8 * half, jj) + 2 * q4) = v[half][jj];
#endif
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int i = lane + 32 * k;
    put(i / 8, i % 8, *reinterpret_cast<const uint4*>(stage + ssd_stage_at(i / 8, i % 8)));
  }
  __syncwarp();
}

// d += A · B for one 16 × 8 × 16 tile, A and B of type T (__half or __nv_bfloat16),
// float32 accumulation.
template <typename T>
__device__ __forceinline__ void ssd_mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();
#endif
}

// 16 bytes from global to shared memory without a register round trip (cp.async.cg:
// through L2 only), both addresses 16-byte aligned. The copy belongs to the thread's next
// committed group and is complete (for this thread) after ssd_cp_async_wait.
__device__ __forceinline__ void ssd_cp_async16(void* smem, const void* gmem) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ssd_smem_u32(smem)), "l"(gmem) : "memory");
#else
  (void)smem, (void)gmem;
  __trap();
#endif
}
// An L2 cache policy that evicts first what it tags (createpolicy, sm_80+), for
// ssd_cp_async16_hint: operands read once (a head's x in the fused forward), so that L2
// keeps the ones many blocks read (the group's B and C, the C·Bᵀ table).
__device__ __forceinline__ uint64_t ssd_evict_first_policy() {
  uint64_t pol = 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
#endif
  return pol;
}
// ssd_cp_async16 under the L2 cache policy `pol` (ssd_evict_first_policy).
__device__ __forceinline__ void ssd_cp_async16_hint(void* smem, const void* gmem, uint64_t pol) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(ssd_smem_u32(smem)), "l"(gmem),
               "l"(pol)
               : "memory");
#else
  (void)smem, (void)gmem, (void)pol;
  __trap();
#endif
}

// Bytes (4, 8 or 16) from global to shared memory (cp.async.ca: through L1), both
// addresses aligned to Bytes; committed and waited for as ssd_cp_async16.
template <int Bytes>
__device__ __forceinline__ void ssd_cp_async_ca(void* smem, const void* gmem) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(ssd_smem_u32(smem)), "l"(gmem), "n"(Bytes)
               : "memory");
#else
  (void)smem, (void)gmem;
  __trap();
#endif
}

// Closes the thread's current group of cp.async copies.
__device__ __forceinline__ void ssd_cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of the thread's committed groups are still in flight (a
// __syncthreads after it makes every thread's completed copies visible to the block).
template <int N>
__device__ __forceinline__ void ssd_cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// The (row tile, column tile) of lower-triangular tile pair `pair`: (0,0), (1,0), (1,1),
// (2,0), ... (pair = ti·(ti + 1)/2 + tj).
__device__ __forceinline__ void ssd_tile_pair(int pair, int& ti, int& tj) {
  ti = 0;
  while ((ti + 1) * (ti + 2) / 2 <= pair) ++ti;
  tj = pair - ti * (ti + 1) / 2;
}

}  // namespace baracuda::kernels::cuda
