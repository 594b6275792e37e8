// Hopper warpgroup matrix products (wgmma.mma_async, sm_90a), float32 accumulators,
// 16-bit operands. Only code compiled for sm_90a reaches the instructions; other targets
// trap (the SSD plan runs the kernels that use these only where the build holds sm_90a
// code: DeviceInfo::arch_specific_kernels).
//
// Accumulator layout of an m64nN product (d[N/2] per thread): warp w of the warpgroup holds
// rows 16w + lane/4 (+8), columns 8j + 2(lane%4) (+1): d[4j], d[4j+1] on the first row,
// d[4j+2], d[4j+3] on the second, as mma.sync's m16n8 accumulator repeated over N/8 column
// tiles. A register A operand is, per warp, the mma.sync m16n8k16 A fragment of its 16 rows.
// Shared-memory operands are described by gmma_desc_sw128 (128-byte swizzle).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace baracuda::kernels::cuda {

// A shared-memory operand in wgmma's 128-byte swizzle (CUTLASS's Swizzle<3,4,3>): rows of
// 128 bytes (64 16-bit values) in atoms of 8 rows (1024 bytes, 1024-byte aligned), 16-byte
// chunk c of row r stored at chunk c ^ (r % 8) (gmma_sw128_off). K-major operands (rows = M
// or N, K along the row): `sbo` = bytes between 8-row atoms, `lbo` unused; a 16-wide k-step
// starts 32 bytes further in the row. MN-major ones (rows = K, M or N along the row): `sbo`
// = bytes between atoms of 8 K rows, `lbo` = bytes between 64-wide M (or N) blocks. A warp
// can fill whole 128-byte rows (full L2 lines from global memory) without bank conflicts,
// which the unswizzled core-matrix layout (8 x 16-byte rows stored contiguously) does not
// allow: with it the group dC's kernel took 310 us against 216 swizzled (H200), its fills
// reading half rows.
__device__ __forceinline__ uint64_t gmma_desc_sw128(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// The first 1024-byte aligned address at or after p (shared memory): the base of swizzled
// tiles in dynamic shared memory, whose size leaves 1024 bytes for it.
__device__ __forceinline__ unsigned char* gmma_align1024(unsigned char* p) {
  return p + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(p)) & 1023)) & 1023);
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row r in a 128-byte swizzled tile.
__device__ __forceinline__ int gmma_sw128_off(int r, int chunk) { return r * 128 + ((chunk ^ (r & 7)) << 4); }

// Byte offset of element (r, c) of a 16-bit [rows][cols] tile stored as 128-byte swizzled
// panels of 64 columns, [cols/64][rows][64] (each panel rows·128 bytes).
__device__ __forceinline__ int gmma_sw128_elem(int rows, int r, int c) {
  return (c >> 6) * (rows * 128) + gmma_sw128_off(r, (c >> 3) & 7) + (c & 7) * 2;
}

// Descriptors of such a tile (`rows` rows, 1024-byte aligned): a K-major operand's 64 rows
// from `row` at k-step kk (16 columns: panel kk / 4, 32 bytes a step into its rows), and an
// MN-major operand's 16 K rows from `row` (M or N across the panels, rows·128 bytes apart).
__device__ __forceinline__ uint64_t gmma_sw128_kmajor(const unsigned char* tile, int rows, int row, int kk) {
  return gmma_desc_sw128(tile + (kk >> 2) * (rows * 128) + row * 128 + (kk & 3) * 32, 16, 1024);
}
__device__ __forceinline__ uint64_t gmma_sw128_mnmajor(const unsigned char* tile, int rows, int row) {
  return gmma_desc_sw128(tile + row * 128, rows * 128, 1024);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most N committed groups of this warpgroup's products are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses to accumulator registers across a wait.
template <int R>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared memory written by ordinary stores (or cp.async) becomes visible to the products
// after this in each writing thread and a barrier.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// One asm body per product shape; TY is the operand type's PTX name (f16 or bf16).
#define BARACUDA_WGMMA_SS_N64(TY)  \
  asm volatile(  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {"  \
      "%0, %1, %2, %3, %4, %5, %6, %7, "  \
      "%8, %9, %10, %11, %12, %13, %14, %15, "  \
      "%16, %17, %18, %19, %20, %21, %22, %23, "  \
      "%24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "%32, %33, p, 1, 1, %35, %36;\n}\n"  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
      : "l"(a), "l"(b), "r"(scale_d), "n"(TA), "n"(TB))

#define BARACUDA_WGMMA_RS_N64(TY)  \
  asm volatile(  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." #TY "." #TY " {"  \
      "%0, %1, %2, %3, %4, %5, %6, %7, "  \
      "%8, %9, %10, %11, %12, %13, %14, %15, "  \
      "%16, %17, %18, %19, %20, %21, %22, %23, "  \
      "%24, %25, %26, %27, %28, %29, %30, %31}, "  \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1), "n"(TB))

#define BARACUDA_WGMMA_RS_N128(TY)  \
  asm volatile(  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"  \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." #TY "." #TY " {"  \
      "%0, %1, %2, %3, %4, %5, %6, %7, "  \
      "%8, %9, %10, %11, %12, %13, %14, %15, "  \
      "%16, %17, %18, %19, %20, %21, %22, %23, "  \
      "%24, %25, %26, %27, %28, %29, %30, %31, "  \
      "%32, %33, %34, %35, %36, %37, %38, %39, "  \
      "%40, %41, %42, %43, %44, %45, %46, %47, "  \
      "%48, %49, %50, %51, %52, %53, %54, %55, "  \
      "%56, %57, %58, %59, %60, %61, %62, %63}, "  \
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"  \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1), "n"(TB))

// d (64 x 64) += A (64 x 16, shared memory) · B (16 x 64, shared memory); TA, TB: 1 for an
// MN-major operand. scale_d 0: d = A · B (d's old values ignored).
template <typename T, int TA, int TB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d = 1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __half>)
    BARACUDA_WGMMA_SS_N64(f16);
  else
    BARACUDA_WGMMA_SS_N64(bf16);
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();
#endif
}

// d (64 x 64) += A (64 x 16, registers) · B (16 x 64, shared memory); TB: 1 for an N-major B.
template <typename T, int TB>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __half>)
    BARACUDA_WGMMA_RS_N64(f16);
  else
    BARACUDA_WGMMA_RS_N64(bf16);
#else
  (void)d, (void)a, (void)b;
  __trap();
#endif
}

// d (64 x 128) += A (64 x 16, registers) · B (16 x 128, shared memory); TB: 1 for an N-major B.
template <typename T, int TB>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __half>)
    BARACUDA_WGMMA_RS_N128(f16);
  else
    BARACUDA_WGMMA_RS_N128(bf16);
#else
  (void)d, (void)a, (void)b;
  __trap();
#endif
}

#undef BARACUDA_WGMMA_SS_N64
#undef BARACUDA_WGMMA_RS_N64
#undef BARACUDA_WGMMA_RS_N128

}  // namespace baracuda::kernels::cuda
