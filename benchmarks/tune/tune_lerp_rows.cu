// Dev tool: sweep the lerp rows kernel's vectors per thread at 2^28 elements against a
// device-to-device copy of the same bytes, without PyTorch. Build and run on the GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc benchmarks/tune/tune_lerp_rows.cu csrc/core/plan.cpp -o /tmp/tune_lerp && /tmp/tune_lerp
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/cuda/lerp.cuh"
#include "tune_common.cuh"

using namespace baracuda;
using namespace baracuda::kernels::cuda;

template <typename T, LerpOp Op, int U>
float run(const LerpRowsParams<uint32_t>& p) {
  constexpr int V = 16 / sizeof(T);
  const unsigned blocks = blocks_for(p.total_vecs, kLerpThreads * U);
  return median_us([&] { lerp_rows_kernel<T, Op, V, uint32_t, U><<<blocks, kLerpThreads>>>(p); });
}

template <typename T>
void sweep(const char* name) {
  const int64_t n = int64_t(1) << 28;
  const size_t bytes = n * sizeof(T);
  void *in0, *in1, *out0, *out1;
  CHECK(cudaMalloc(&in0, bytes));
  CHECK(cudaMalloc(&in1, bytes));
  CHECK(cudaMalloc(&out0, bytes));
  CHECK(cudaMalloc(&out1, bytes));
  CHECK(cudaMemset(in0, 0x3c, bytes));
  CHECK(cudaMemset(in1, 0x3d, bytes));
  constexpr int V = 16 / sizeof(T);
  LerpRowsParams<uint32_t> p{};
  p.total_vecs = n / V;
  p.vecs_per_row_n = n / V;
  p.vecs_per_row = FastDivmod(n / V);
  p.one_row = true;
  p.unit[0] = p.unit[1] = true;
  p.in[0] = in0;
  p.in[1] = in1;
  p.out[0] = out0;
  p.out[1] = out1;
  p.w = 0.3;
  p.one_minus_w = 0.7;
  const float copy = median_us([&] { CHECK(cudaMemcpyAsync(out0, in0, bytes, cudaMemcpyDeviceToDevice)); });
  // forward moves 3n elements, backward 3n: 1.5x the copy's bytes
  const float c3 = copy * 1.5f;
  const float f1 = run<T, LerpOp::Forward, 1>(p), f2 = run<T, LerpOp::Forward, 2>(p),
              f4 = run<T, LerpOp::Forward, 4>(p);
  const float b1 = run<T, LerpOp::Backward, 1>(p), b2 = run<T, LerpOp::Backward, 2>(p),
              b4 = run<T, LerpOp::Backward, 4>(p);
  printf("%s copy(2n) %.1f us; lerp fwd U1 %.1f U2 %.1f U4 %.1f (x copy %.3f %.3f %.3f)\n", name, copy,
         f1, f2, f4, c3 / f1, c3 / f2, c3 / f4);
  printf("%s lerp bwd U1 %.1f U2 %.1f U4 %.1f (x copy %.3f %.3f %.3f)\n", name, b1, b2, b4, c3 / b1,
         c3 / b2, c3 / b4);
  CHECK(cudaFree(in0));
  CHECK(cudaFree(in1));
  CHECK(cudaFree(out0));
  CHECK(cudaFree(out1));
}

int main() {
  sweep<__nv_bfloat16>("bf16");
  sweep<float>("f32");
  return 0;
}
