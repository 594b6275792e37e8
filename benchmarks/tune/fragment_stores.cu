// Dev tool: what the MMA accumulator fragments' store pattern costs on its own. The SSD's
// group dx kernel (and the fused forward's y, the dC/dB kernel's rows) store each warp's
// 16 × 64 output tile straight from m16n8 fragments: a lane's two 16-bit values at (row
// g8 or g8 + 8, columns 8·nt + 2·t4), one 4-byte store each, so that a quad writes 16 of a
// 32-byte sector per instruction (ncu on the 2.7B backward: 16.5 of 32 bytes a sector
// used by dx's stores). This writes dx's layout at the Mamba-2 2.7B shape, [B 4, L 4096,
// H 80, P 64] bf16 (168 MB; each 64-column row of a head is 128 bytes, rows H·P apart),
// from the same fragments, in a grid like dx's (a block per 64-row tile and 8 heads, 4
// warps of 16 rows), by
//   MODE 0: the fragments' 4-byte stores (tc_store_row's pattern);
//   MODE 1: the tile staged in shared memory by stmatrix (4 an x4 a warp: sm_90), then
//           16-byte loads and stores, 8 lanes a row (a row's 128 bytes at once);
//   MODE 2: the same with 4-byte shared-memory stores in place of stmatrix (sm_80);
// against MODE 3, each lane computing and storing its 16 bytes of a row (meant as the
// floor; on an H100 it ran as slow as MODE 0, 188 against 182 µs, while MODE 1 and 2 took
// 62: not profiled, BENCHMARKS.md). Each mode's output is compared with MODE 0's on the
// host. Build and run on the GPU from the repo root:
//   nvcc -O3 -std=c++17 -arch=sm_90a benchmarks/tune/fragment_stores.cu -o /tmp/fragment_stores && /tmp/fragment_stores
// Alone these kernels are bound by the bytes they write; inside dx (518 µs for the same
// 168 MB at the 2.7B shape, latency-bound) a mode that costs nothing here may still save
// instructions (MODE 1: 4 stmatrix + 4 loads + 4 stores a head against 16 stores), and one
// that costs time here will cost it there only where dx's stores queue: an A/B inside the
// kernel decides. For L2's view: ncu --metrics lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tune_common.cuh"

using bf16 = __nv_bfloat16;
constexpr int B = 4, L = 4096, H = 80, P = 64, HEADS_A_BLOCK = 8, PITCH = P + 8;

// The value at (row, head, column): exact in bf16's 8 bits, different across the tile.
__device__ __forceinline__ float value(int64_t row, int head, int col) {
  return static_cast<float>(static_cast<int>((row * 7 + head * 3 + col) & 255) - 128);
}

__device__ __forceinline__ uint32_t pack(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// One head's 16 × 64 tile of a warp, from its fragments (MODE 0 to 2), through `s` (the
// warp's [16][PITCH] staging rows) for MODE 1 and 2.
template <int MODE>
__device__ __forceinline__ void tile_stores(bf16* out, bf16* s, int64_t row0, int h, int lane) {
  const int g8 = lane / 4, t4 = lane % 4;
  // the fragments: p[nt][half] holds (row g8 + 8·half, columns 8·nt + 2·t4, + 1)
  uint32_t p[8][2];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = row0 + g8 + 8 * half;
      p[nt][half] = pack(value(r, h, 8 * nt + 2 * t4), value(r, h, 8 * nt + 2 * t4 + 1));
    }
  if constexpr (MODE == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      bf16* orow = out + ((row0 + g8 + 8 * half) * H + h) * P;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) *reinterpret_cast<uint32_t*>(orow + 8 * nt + 2 * t4) = p[nt][half];
    }
  } else {
    if constexpr (MODE == 1) {
      // x4: matrices (rows 0-7 | 8-15) × (columns 8·nt | 8·nt + 8); lane l gives row l % 16
      // of column block l / 16
      const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(s + (lane % 16) * PITCH + 8 * (lane / 16)));
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at + 16 * nt),
                     "r"(p[nt][0]), "r"(p[nt][1]), "r"(p[nt + 1][0]), "r"(p[nt + 1][1])
                     : "memory");
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          *reinterpret_cast<uint32_t*>(s + (g8 + 8 * half) * PITCH + 8 * nt + 2 * t4) = p[nt][half];
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 8 lanes a row: its 128 bytes
      const int c = lane + 32 * i, r = c / 8, col = 8 * (c % 8);
      *reinterpret_cast<uint4*>(out + ((row0 + r) * H + h) * P + col) =
          *reinterpret_cast<const uint4*>(s + r * PITCH + col);
    }
    __syncwarp();  // (the next head's fragments go where these were read)
  }
}

template <int MODE>
__global__ void __launch_bounds__(128) store_tiles(bf16* out) {
  __shared__ __align__(16) bf16 stage[4][16 * PITCH];  // a warp's 16 × 64 tile (padded rows)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tiles = L / 64, hblocks = H / HEADS_A_BLOCK;
  const int hb = blockIdx.x % hblocks, rt = (blockIdx.x / hblocks) % tiles, b = blockIdx.x / (hblocks * tiles);
  const int64_t row0 = static_cast<int64_t>(b) * L + rt * 64 + warp * 16;  // the warp's first row
  for (int hi = 0; hi < HEADS_A_BLOCK; ++hi) {
    const int h = hb * HEADS_A_BLOCK + hi;
    if constexpr (MODE == 3) {  // 16-byte writes of the warp's rows, 8 lanes a row
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = lane + 32 * i, r = c / 8, col = 8 * (c % 8);
        uint32_t u[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) u[k] = pack(value(row0 + r, h, col + 2 * k), value(row0 + r, h, col + 2 * k + 1));
        *reinterpret_cast<uint4*>(out + ((row0 + r) * H + h) * P + col) = make_uint4(u[0], u[1], u[2], u[3]);
      }
    } else {
      tile_stores<MODE>(out, stage[warp], row0, h, lane);
    }
  }
}

int main() {
  const size_t n = static_cast<size_t>(B) * L * H * P;
  bf16 *out, *ref;
  CHECK(cudaMalloc(&out, n * sizeof(bf16)));
  CHECK(cudaMalloc(&ref, n * sizeof(bf16)));
  const int blocks = B * (L / 64) * (H / HEADS_A_BLOCK);
  std::vector<uint16_t> want(n), got(n);
  CHECK(cudaMemset(ref, 0xff, n * sizeof(bf16)));
  store_tiles<0><<<blocks, 128>>>(ref);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(want.data(), ref, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  const char* names[] = {"fragments, 4-byte stores", "stmatrix staged, 16-byte stores",
                         "4-byte smem staged, 16-byte stores", "16-byte writes (floor)"};
  auto run = [&](int mode) {
    switch (mode) {
      case 0: store_tiles<0><<<blocks, 128>>>(out); break;
      case 1: store_tiles<1><<<blocks, 128>>>(out); break;
      case 2: store_tiles<2><<<blocks, 128>>>(out); break;
      default: store_tiles<3><<<blocks, 128>>>(out); break;
    }
  };
  printf("dx's layout [%d, %d, %d, %d] bf16, %.1f MB written, %d blocks of 128 threads\n", B, L, H, P,
         n * 2 / 1e6, blocks);
  for (int round = 0; round < 2; ++round)
    for (int mode = 0; mode < 4; ++mode) {
      CHECK(cudaMemset(out, 0xff, n * sizeof(bf16)));
      run(mode);
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(got.data(), out, n * sizeof(bf16), cudaMemcpyDeviceToHost));
      const bool same = memcmp(got.data(), want.data(), n * sizeof(bf16)) == 0;
      const float us = median_us([&] { run(mode); });
      printf("MODE %d %-36s %8.1f us  %6.2f TB/s  %s\n", mode, names[mode], us, n * 2 / us / 1e6,
             same ? "same bytes as MODE 0" : "DIFFERENT BYTES");
    }
  CHECK(cudaFree(out));
  CHECK(cudaFree(ref));
  return 0;
}
