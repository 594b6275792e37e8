// Dev tool: the RMSNorm rows forward at the LLaMA-7B layer's [8192, 4096] bf16 (llama
// convention, with a weight), the library's kernel at several grids against variants of
// its row loop, and a device-to-device copy of the same bytes (the floor), without
// PyTorch. Every variant's y and rstd are checked bitwise against the library kernel's.
// Build and run on the GPU from the repo root:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc benchmarks/tune/tune_rmsnorm_rows.cu -o /tmp/tune_rms && /tmp/tune_rms
// Variants (rms_rows_variant): W, the thread's weight vectors loaded once before its row
// loop instead of after each row's sum; PF, the next row's x loads issued before this row's
// sum (two register buffers); CS, x loaded and y stored with the streaming cache hint;
// MINB, __launch_bounds__' blocks an SM (a register cap).
#include <cstring>
#include <vector>

#include "kernels/cuda/rmsnorm.cuh"
#include "tune_common.cuh"

using namespace baracuda;
using namespace baracuda::kernels;
using namespace baracuda::kernels::cuda;
using bf16 = __nv_bfloat16;

template <int VPT, int G, int RPB, bool W, bool PF, bool CS, int MINB = 1>
__global__ void __launch_bounds__(G * RPB, MINB) rms_rows_variant(const RmsNormParams p) {
  constexpr int V = 8;
  __shared__ float red[32];
  const int lane = threadIdx.x % G, sub = threadIdx.x / G;
  const bf16* X = static_cast<const bf16*>(p.x);
  const bf16* Wt = static_cast<const bf16*>(p.weight);
  bf16* Y = static_cast<bf16*>(p.y);
  const int64_t cols = p.cols;  // G·VPT·V here
  uint4 wv[VPT];
  if constexpr (W)
#pragma unroll
    for (int k = 0; k < VPT; ++k) wv[k] = __ldg(reinterpret_cast<const uint4*>(Wt + (lane + k * G) * V));
  const auto load = [&](int64_t row, uint4 (&d)[VPT]) {
    if (row >= p.rows) return;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const uint4* a = reinterpret_cast<const uint4*>(X + row * cols + (lane + k * G) * V);
      d[k] = CS ? __ldcs(a) : __ldg(a);
    }
  };
  const int64_t step = static_cast<int64_t>(gridDim.x) * RPB;
  uint4 xv[VPT], nx[VPT];
  int64_t row = static_cast<int64_t>(blockIdx.x) * RPB + sub;
  if constexpr (PF) load(row, nx);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * RPB; base < p.rows; base += step, row += step) {
    if constexpr (PF) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) xv[k] = nx[k];
      load(row + step, nx);
    } else {
      load(row, xv);
    }
    float ss = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      bf16 v[V];
      memcpy(v, &xv[k], 16);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float a = to_acc(v[i]);
        ss += a * a;
      }
    }
    ss = group_sum(ss, G, red);
    const float rstd = rsqrtf(ss * p.inv_cols + p.eps);
    if (row < p.rows) {
      if (lane == 0) static_cast<float*>(p.rstd)[row] = rstd;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t c = (lane + k * G) * V;
        uint4 wk;
        if constexpr (W) wk = wv[k]; else wk = __ldg(reinterpret_cast<const uint4*>(Wt + c));
        bf16 v[V], w[V], o[V];
        memcpy(v, &xv[k], 16);
        memcpy(w, &wk, 16);
#pragma unroll
        for (int i = 0; i < V; ++i)
          o[i] = from_acc<bf16>(rms_norm_output<float>(RmsNormConvention::Llama, true, to_acc(v[i]) * rstd,
                                                       to_acc(w[i]), RoundTo<bf16>()));
        uint4 out;
        memcpy(&out, o, 16);
        uint4* dst = reinterpret_cast<uint4*>(Y + row * cols + c);
        if constexpr (CS) __stcs(dst, out); else *dst = out;
      }
    }
  }
}

int main() {
  const int64_t rows = 8192, cols = 4096;
  const size_t bytes = rows * cols * sizeof(bf16);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<bf16> hx(rows * cols), hw(cols);
  uint32_t s = 12345;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return (static_cast<int>(s >> 9) % 2001 - 1000) / 500.0f; };
  for (auto& v : hx) v = __float2bfloat16(rnd());
  for (auto& v : hw) v = __float2bfloat16(rnd());
  bf16 *x, *w, *y, *yref, *copy;
  float *rstd, *rref;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&copy, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&yref, bytes));
  CHECK(cudaMalloc(&w, cols * sizeof(bf16)));
  CHECK(cudaMalloc(&rstd, rows * 4));
  CHECK(cudaMalloc(&rref, rows * 4));
  CHECK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w, hw.data(), cols * sizeof(bf16), cudaMemcpyHostToDevice));
  RmsNormParams p{};
  p.rows = rows;
  p.cols = cols;
  p.lead_rank = 1;
  p.lead_sizes[0] = rows;
  for (int k = 0; k < kMaxOperands; ++k) { p.lead_strides[k][0] = cols; p.col_stride[k] = 1; }
  p.w_stride = 1;
  p.conv = RmsNormConvention::Llama;
  p.has_weight = true;
  p.gate = RmsNormGate::None;
  p.ngroups = 1;
  p.eps = 1e-6f;
  p.inv_cols = 1.0f / cols;
  p.eps64 = 1e-6;
  p.inv_cols64 = 1.0 / cols;
  p.group = 128;
  p.rows_per_block = 2;
  p.x = x;
  p.weight = w;
  p.y = yref;
  p.rstd = rref;
  const auto timed = [&](auto f) {
    return median_us([&] { f(); }, 5, 41);
  };
  const float cp = timed([&] { CHECK(cudaMemcpyAsync(copy, x, bytes, cudaMemcpyDeviceToDevice)); });
  printf("sms %d; copy of the same bytes (64 MiB in, 64 MiB out): %.1f us (%.2f TB/s)\n", sms, cp,
         2.0 * bytes / cp * 1e-6);
  auto lib = rms_norm_rows_forward<bf16, bf16, bf16, 4, false, false>;
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, lib));
  int occ = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, lib, 256, 0));
  printf("library kernel: %d registers, %d blocks of 256 an SM\n", fa.numRegs, occ);
  for (int bps : {2, 4, 8, 16, 0}) {
    const unsigned grid = bps ? sms * bps : rows / 2;
    lib<<<grid, 256>>>(p);
    const float t = timed([&] { lib<<<grid, 256>>>(p); });
    printf("library, grid %u (%d an SM): %.1f us, %.2f x copy\n", grid, bps, t, cp / t);
  }
  lib<<<sms * 8, 256>>>(p);
  CHECK(cudaDeviceSynchronize());
  std::vector<bf16> href(rows * cols), hy(rows * cols);
  std::vector<float> hr(rows), hrr(rows);
  CHECK(cudaMemcpy(href.data(), yref, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hrr.data(), rref, rows * 4, cudaMemcpyDeviceToHost));
  RmsNormParams q = p;
  q.y = y;
  q.rstd = rstd;
  const auto variant = [&](const char* name, auto kernel, int G, int RPB) {
    q.group = G;
    q.rows_per_block = RPB;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, G * RPB, 0));
    for (int bps : {4, 8, 16, 0}) {
      const unsigned grid = bps ? sms * bps : rows / RPB;
      CHECK(cudaMemset(y, 0xff, bytes));
      kernel<<<grid, G * RPB>>>(q);
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hr.data(), rstd, rows * 4, cudaMemcpyDeviceToHost));
      const bool same = !memcmp(hy.data(), href.data(), bytes) && !memcmp(hr.data(), hrr.data(), rows * 4);
      const float t = timed([&] { kernel<<<grid, G * RPB>>>(q); });
      printf("%-28s %3d regs, %2d blocks/SM resident; grid %5u: %.1f us, %.2f x copy%s\n", name, fa.numRegs, occ,
             grid, t, cp / t, same ? "" : "  ** DIFFERENT BITS **");
    }
  };
  variant("G128 R2 (library loop)", rms_rows_variant<4, 128, 2, false, false, false>, 128, 2);
  variant("G128 R2 W", rms_rows_variant<4, 128, 2, true, false, false>, 128, 2);
  variant("G128 R2 W PF", rms_rows_variant<4, 128, 2, true, true, false>, 128, 2);
  variant("G128 R2 W PF CS", rms_rows_variant<4, 128, 2, true, true, true>, 128, 2);
  variant("G128 R2 W CS", rms_rows_variant<4, 128, 2, true, false, true>, 128, 2);
  variant("G128 R1 W PF", rms_rows_variant<4, 128, 1, true, true, false>, 128, 1);
  variant("G256 R1 W", rms_rows_variant<2, 256, 1, true, false, false>, 256, 1);
  variant("G256 R1 W PF", rms_rows_variant<2, 256, 1, true, true, false>, 256, 1);
  variant("G512 R1 W PF", rms_rows_variant<1, 512, 1, true, true, false>, 512, 1);
  variant("G64 R4 W PF", rms_rows_variant<8, 64, 4, true, true, false>, 64, 4);
  variant("G128 R2 W PF min4",  rms_rows_variant<4, 128, 2, true, true, false, 4>, 128, 2);
  variant("G128 R2 min8", rms_rows_variant<4, 128, 2, false, false, false, 8>, 128, 2);
  variant("G128 R2 W min6", rms_rows_variant<4, 128, 2, true, false, false, 6>, 128, 2);
  variant("G512 R1 W PF min4", rms_rows_variant<1, 512, 1, true, true, false, 4>, 512, 1);
  variant("G512 R1 W min4", rms_rows_variant<1, 512, 1, true, false, false, 4>, 512, 1);
  variant("G256 R2 W PF min2", rms_rows_variant<2, 256, 2, true, true, false, 2>, 256, 2);
  variant("G32 R8 PF", rms_rows_variant<16, 32, 8, false, true, false>, 32, 8);
  variant("G32 R8", rms_rows_variant<16, 32, 8, false, false, false>, 32, 8);
  return 0;
}
