// Dev tool: sweep the gated rows kernel's unroll factor at the benchmark shape against a
// device-to-device copy of the same bytes, without PyTorch. Build and run on the GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc benchmarks/tune/tune_gated_rows.cu csrc/core/plan.cpp -o /tmp/tune && /tmp/tune
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/cuda/gated_activation.cuh"
#include "tune_common.cuh"

using namespace baracuda;
using namespace baracuda::kernels::cuda;

template <typename T, bool BW, int U>
float run(const GatedRowsParams<uint32_t>& p) {
  constexpr int V = 16 / sizeof(T);
  const unsigned blocks = blocks_for(p.total_vecs, kGatedThreads * U);
  return median_us([&] {
    gated_activation_rows_kernel<T, GatedKind::Swiglu, BW, V, uint32_t, U>
        <<<blocks, kGatedThreads>>>(p);
  });
}

template <typename T>
void sweep(const char* name) {
  const int64_t rows = 16384, half = 11008;
  const size_t elt = sizeof(T);
  void *x, *dy, *out;
  CHECK(cudaMalloc(&x, rows * 2 * half * elt));
  CHECK(cudaMalloc(&dy, rows * half * elt));
  CHECK(cudaMalloc(&out, rows * 2 * half * elt));
  CHECK(cudaMemset(x, 0x3c, rows * 2 * half * elt));  // finite, non-zero values
  CHECK(cudaMemset(dy, 0x3c, rows * half * elt));
  constexpr int V = 16 / sizeof(T);
  GatedRowsParams<uint32_t> p{};
  p.vecs_per_row_n = half / V;
  p.vecs_per_row = FastDivmod(half / V);
  p.total_vecs = rows * half / V;
  p.x_row = 2 * half;
  p.dy_row = half;
  p.x_a = 0;
  p.x_b = half;
  p.x = x;
  p.dy = dy;
  p.out = out;
  const double fwd_bytes = 3.0 * rows * half * elt, bwd_bytes = 5.0 * rows * half * elt;
  void* buf;
  CHECK(cudaMalloc(&buf, (size_t)bwd_bytes));
  auto copy = [&](double bytes) {
    return median_us([&] {
      CHECK(cudaMemcpyAsync(buf, static_cast<char*>(buf) + (size_t)bytes / 2, (size_t)bytes / 2,
                            cudaMemcpyDeviceToDevice));
    });
  };
  const float cf = copy(fwd_bytes), cb = copy(bwd_bytes);
  printf("%s copy: fwd-bytes %.1f us (%.0f GB/s), bwd-bytes %.1f us (%.0f GB/s)\n", name, cf,
         fwd_bytes / cf / 1e3, cb, bwd_bytes / cb / 1e3);
  GatedRowsParams<uint32_t> pf = p;
  pf.out_row = half;
  GatedRowsParams<uint32_t> pb = p;
  pb.out_row = 2 * half;
  pb.out_b = half;
  const float f1 = run<T, false, 1>(pf), f2 = run<T, false, 2>(pf), f4 = run<T, false, 4>(pf),
              f8 = run<T, false, 8>(pf);
  const float b1 = run<T, true, 1>(pb), b2 = run<T, true, 2>(pb), b4 = run<T, true, 4>(pb),
              b8 = run<T, true, 8>(pb);
  printf("%s swiglu fwd us  U1 %.1f  U2 %.1f  U4 %.1f  U8 %.1f   (x copy: %.3f %.3f %.3f %.3f)\n",
         name, f1, f2, f4, f8, cf / f1, cf / f2, cf / f4, cf / f8);
  printf("%s swiglu bwd us  U1 %.1f  U2 %.1f  U4 %.1f  U8 %.1f   (x copy: %.3f %.3f %.3f %.3f)\n",
         name, b1, b2, b4, b8, cb / b1, cb / b2, cb / b4, cb / b8);
  CHECK(cudaFree(x));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(out));
  CHECK(cudaFree(buf));
}

int main() {
  sweep<__nv_bfloat16>("bf16");
  sweep<float>("f32");
  return 0;
}
