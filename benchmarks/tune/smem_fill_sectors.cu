// Dev tool: L2 sectors that cp.async tile fills read, by shared-memory layout. Each of
// 5120 blocks of 128 threads copies four 64-row steps of a tile into a two-step ring, the
// chunk-state kernel's pattern: rows of ROWB bytes, 10240 bytes apart (x or dy's rows of
// one head at the Mamba-2 2.7B shape), or 256-byte rows back to back (B or C at N = 128).
// MODE 0: rows unpadded; 1: rows padded by 16 bytes (ldmatrix's odd multiple of 16, as
// tc_fill lays tiles out); 2: unpadded, 16-byte chunk c of row r at c ^ (r % 8) (the
// 128-byte swizzle); 3: padded, ld.global.v4 + st.shared instead of cp.async; 4: padded,
// cp.async.ca; 5: padded, a warp's 32 copies down a column (thread -> row) instead of
// along the rows. Prints each mode's time; run under ncu for the sectors:
//   nvcc -O3 -arch=sm_90a -o /tmp/smem_fill_sectors benchmarks/tune/smem_fill_sectors.cu
//   /tmp/smem_fill_sectors
//   ncu --metrics lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum \
//       -k regex:fill /tmp/smem_fill_sectors 1     (one launch a mode, untimed)
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__device__ __forceinline__ unsigned su32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
template <int MODE, int ROWB>
__global__ void __launch_bounds__(128) fill(const char* __restrict__ src, char* out, long rowstride, int heads) {
  // (the modes: see the header; MODE 5's copy e takes row e % 64 of group e / 64)
  constexpr int PITCH = (MODE == 0 || MODE == 2) ? ROWB : ROWB + 16;
  constexpr int G = ROWB / 16;  // 16-B groups a row
  extern __shared__ __align__(16) char sm[];
  const int h = blockIdx.x % heads; const long c = blockIdx.x / heads;
  const char* base = src + c * 256 * rowstride + (long)h * ROWB;
  for (int k = 0; k < 4; ++k) {
    char* st = sm + (k % 2) * 64 * PITCH;
    for (int e = threadIdx.x; e < 64 * G; e += 128) {
      int r, g;
      if (MODE == 5) { g = e / 64; r = e % 64; } else { r = e / G; g = e % G; }
      const char* s = base + (long)(k * 64 + r) * rowstride + g * 16;
      int gs = MODE == 2 ? (g ^ (r % 8)) % G : g;
      char* d = st + r * PITCH + gs * 16;
      if (MODE == 3) { *reinterpret_cast<uint4*>(d) = __ldg(reinterpret_cast<const uint4*>(s)); }
      else if (MODE == 4) asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(su32(d)), "l"(s) : "memory");
      else asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(su32(d)), "l"(s) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sm[5];
}
template <int MODE, int ROWB>
void run(const char* src, char* out, long rowstride, int heads, int blocks) {
  extern int g_reps;
  int smem = 2 * 64 * (ROWB + 16);
  cudaFuncSetAttribute(fill<MODE, ROWB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < (g_reps ? 3 : 1); ++i) fill<MODE, ROWB><<<blocks, 128, smem>>>(src, out, rowstride, heads);
  if (!g_reps) return;
  cudaEventRecord(a);
  for (int i = 0; i < 20; ++i) fill<MODE, ROWB><<<blocks, 128, smem>>>(src, out, rowstride, heads);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  double bytes = (double)blocks * 4 * 64 * ROWB;
  printf("MODE %d ROWB %d: %.1f us, %.0f GB/s (%s)\n", MODE, ROWB, ms * 1000 / 20, bytes / (ms / 20 * 1e-3) / 1e9, cudaGetErrorString(cudaGetLastError()));
}
int g_reps = 1;
int main(int argc, char**) {
  g_reps = argc > 1 ? 0 : 1;
  const int heads = 80, blocks = 5120;
  char *src, *out;
  size_t n = (size_t)16384 * 10240 * 2;  // enough for ROWB 256 (Y pattern uses stride 256 x heads)
  cudaMalloc(&src, n); cudaMemset(src, 1, n); cudaMalloc(&out, blocks);
  run<0, 128>(src, out, 10240, heads, blocks);
  run<1, 128>(src, out, 10240, heads, blocks);
  run<2, 128>(src, out, 10240, heads, blocks);
  run<3, 128>(src, out, 10240, heads, blocks);
  run<4, 128>(src, out, 10240, heads, blocks);
  run<5, 128>(src, out, 10240, heads, blocks);
  // Y-like: rows of 256 B (N = 128 bf16), row stride 256 B (G = 1 group), the same rows for every head
  run<0, 256>(src, out, 256, 1, blocks);
  run<1, 256>(src, out, 256, 1, blocks);
  run<2, 256>(src, out, 256, 1, blocks);
  return 0;
}
