// Dev tool: time the RoPE CUDA kernels at the benchmark shape, q [8, 32, 4096, 128], against
// a device-to-device copy of the same bytes (read x, write y), without PyTorch:
//  - the whole op as the library plans it (table kernel + streaming kernel);
//  - the table kernel alone;
//  - the row-walking streaming kernel alone over rows per thread (RPT) × rows per step (U);
//  - the linear streaming kernel alone over items per thread (U), and with the table.
// Before timing, a float64 check of a sample of every case's output (max error relative
// to the norm of the element's pair; bf16 passes under 8e-3, float32 under 1e-5).
// Build and run on the GPU (about 10 s of running after the build):
//   nvcc -O3 -std=c++17 -arch=sm_90 -DBARACUDA_WITH_CUDA -I csrc benchmarks/tune/tune_rope.cu \
//     csrc/core/plan.cpp csrc/core/rope_plan.cpp -o /tmp/tune_rope && /tmp/tune_rope
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/rope_plan.h"
#include "kernels/cuda/rope.cuh"
#include "tune_common.cuh"

using namespace baracuda;
using namespace baracuda::kernels::cuda;

// The plan's launch() references both launchers; this tool only runs the CUDA ones.
namespace baracuda::kernels {
void rope_cpu(const RopeLaunch&) { fail(PlanErrorKind::Internal, "tune_rope", "no CPU kernels here"); }
void rope_cuda(const RopeLaunch& l, void* stream) {
  if (l.interleaved)
    launch_rope_layout<true>(l, static_cast<cudaStream_t>(stream));
  else
    launch_rope_layout<false>(l, static_cast<cudaStream_t>(stream));
}
}  // namespace baracuda::kernels

cudaStream_t g_stream;  // every launch and event

template <typename F>
float time_us(F&& f) {
  return median_us(f, 5, 31, g_stream);
}

__device__ uint32_t hash32(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = T(4.0f * (hash32(i * 7 + seed) * 2.3283064e-10f) - 2.0f);  // uniform in [-2, 2)
}

__global__ void fill_positions(int64_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = hash32(i + 12345) % 1000000;
}

__device__ double as_double(float v) { return v; }
__device__ double as_double(__nv_bfloat16 v) { return __bfloat162float(v); }

// max over sampled elements of |y − ref| / |(u, v)|, the reference in float64; NaN → 1e30.
template <typename T>
__global__ void check_kernel(const T* x, const T* y, const int64_t* pos, int64_t B, int64_t H, int64_t S,
                             int64_t D, int64_t xs0, int64_t xs1, int64_t xs2, bool interleaved,
                             int64_t step, unsigned int* max_err) {
  const int64_t n = B * H * S * D;
  for (int64_t e = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * step; e < n;
       e += int64_t(gridDim.x) * blockDim.x * step) {
    const int64_t d = e % D, s = (e / D) % S, h = (e / (D * S)) % H, b = e / (D * S * H);
    const int64_t half = D / 2;
    const int64_t i = interleaved ? d / 2 : d % half;
    const int64_t du = interleaved ? 2 * i : i, dv = interleaved ? 2 * i + 1 : i + half;
    const int64_t row = b * xs0 + h * xs1 + s * xs2;
    const double u = as_double(x[row + du]), v = as_double(x[row + dv]);
    const double p = pos ? static_cast<double>(pos[b * S + s]) : static_cast<double>(s);
    const double th = p * pow(10000.0, -static_cast<double>(2 * i) / static_cast<double>(D));
    const double c = cos(th), sn = sin(th);
    const double ref = d == du ? u * c - v * sn : u * sn + v * c;
    double err = fabs(as_double(y[row + d]) - ref) / fmax(sqrt(u * u + v * v), 1e-30);
    if (!(err <= 1e30)) err = 1e30;
    atomicMax(max_err, __float_as_uint(static_cast<float>(err)));
  }
}

struct Case {
  const char* name;
  bool bf16, interleaved, transposed, per_batch;
};

template <typename T, bool IL, int U>
float time_stream(RopeLaunch l, int64_t rpt) {
  constexpr int V = 16 / sizeof(T);
  l.rows_per_thread = rpt;
  return time_us([&] { launch_rope_stream<T, V, IL, uint32_t, U>(l, g_stream); });
}

template <typename T, bool IL, int U>
float time_linear(const RopeLaunch& l) {
  constexpr int V = 16 / sizeof(T);
  return time_us([&] { launch_rope_linear<T, V, IL, uint32_t, U>(l, g_stream); });
}

template <typename T, bool IL>
void run_case(const Case& c, double* summary) {
  constexpr int64_t B = 8, H = 32, S = 4096, D = 128;
  const int64_t n = B * H * S * D;
  const ElementKind ek = sizeof(T) == 2 ? ElementKind::BF16 : ElementKind::F32;
  T *x, *y;
  int64_t* pos = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(T)));
  CHECK(cudaMalloc(&y, n * sizeof(T)));
  fill_kernel<<<4096, 256, 0, g_stream>>>(x, n, 1);
  if (c.per_batch) {
    CHECK(cudaMalloc(&pos, B * S * sizeof(int64_t)));
    fill_positions<<<128, 256, 0, g_stream>>>(pos, B * S);
  }
  CHECK(cudaGetLastError());

  RopeDescriptor desc;
  desc.x.dtype = ek;
  desc.x.rank = 4;
  desc.x.sizes = {B, H, S, D};
  if (c.transposed)  // [B, S, H, D] storage seen as [B, H, S, D]
    desc.x.strides = {S * H * D, D, H * D, 1};
  else
    desc.x.strides = {H * S * D, S * D, D, 1};
  desc.x.alignment = 16;
  desc.has_positions = c.per_batch;
  if (c.per_batch) {
    desc.positions.dtype = ElementKind::I64;
    desc.positions.rank = 2;
    desc.positions.sizes = {B, S};
    desc.positions.strides = {S, 1};
    desc.positions.alignment = 16;
  }
  desc.interleaved = IL;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  desc.device = {Backend::Cuda, 0, 90, sms};
  const RopePlan plan = RopePlan::select(desc, PlanPreference::Fastest);
  void* ws;
  CHECK(cudaMalloc(&ws, plan.workspace_size()));
  RopeArgs args;
  args.x = {desc.x, x};
  if (c.per_batch) args.positions = {desc.positions, pos};
  args.y = {plan.output_layout(), y};

  unsigned int* err_d;
  CHECK(cudaMalloc(&err_d, sizeof(unsigned int)));
  // Max error of y against the float64 reference (y poisoned before `run` writes it).
  const auto check = [&](auto&& run) {
    CHECK(cudaMemsetAsync(y, 0xff, n * sizeof(T), g_stream));
    run();
    CHECK(cudaMemsetAsync(err_d, 0, sizeof(unsigned int), g_stream));
    check_kernel<T><<<2048, 256, 0, g_stream>>>(x, y, pos, B, H, S, D, desc.x.strides[0],
                                                desc.x.strides[1], desc.x.strides[2], IL, 61, err_d);
    unsigned int err_bits;
    CHECK(cudaStreamSynchronize(g_stream));
    CHECK(cudaMemcpy(&err_bits, err_d, sizeof(err_bits), cudaMemcpyDeviceToHost));
    float err;
    memcpy(&err, &err_bits, 4);
    return err;
  };
  const float tol = sizeof(T) == 2 ? 8e-3f : 1e-5f;
  constexpr int V = 16 / sizeof(T);
  RopeLaunch l = plan.launch_description();
  l.x = x;
  l.y = y;
  l.positions = pos;
  l.table = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws) + 15) / 16 * 16);
  const float err = check([&] { plan.run(g_stream, Workspace{ws, plan.workspace_size()}, args); });
  float err_lin = 0;
  const auto linear_op = [&] {
    launch_rope_table<acc_t<T>>(l, g_stream);
    launch_rope_linear<T, V, IL, uint32_t, 1>(l, g_stream);
  };
  err_lin = std::max(err_lin, check(linear_op));
  err_lin = std::max(err_lin, check([&] {
                       launch_rope_table<acc_t<T>>(l, g_stream);
                       launch_rope_linear<T, V, IL, uint32_t, 2>(l, g_stream);
                     }));
  err_lin = std::max(err_lin, check([&] {
                       launch_rope_table<acc_t<T>>(l, g_stream);
                       launch_rope_linear<T, V, IL, uint32_t, 4>(l, g_stream);
                     }));
  const float copy = time_us([&] {
    CHECK(cudaMemcpyAsync(y, x, n * sizeof(T), cudaMemcpyDeviceToDevice, g_stream));
  });
  const float full = time_us([&] { launch_rope_layout<IL>(l, g_stream); });
  const float table = time_us([&] { launch_rope_table<acc_t<T>>(l, g_stream); });
  printf("\n%s: check max rel err: plan %.3g (%s), linear %.3g (%s); plan: rows/thread %lld, unroll %d, "
         "table %.1f KB\n",
         c.name, err, err <= tol ? "ok" : "FAILED", err_lin, err_lin <= tol ? "ok" : "FAILED",
         (long long)l.rows_per_thread, rope_default_unroll<T, V, IL>(), l.table_bytes / 1024.0);
  printf("  copy %.1f us | op as planned (table + %s kernel) %.1f us (%.3f) | table alone %.1f us\n", copy,
         l.linear ? "linear" : "rows", full, copy / full, table);
  printf("  rows kernel alone, us (ratio to copy):\n");
  const int64_t rpts[] = {1, 2, 4, 8, 16};
  for (int64_t rpt : rpts) {
    float t1 = time_stream<T, IL, 1>(l, rpt), t2 = time_stream<T, IL, 2>(l, rpt),
          t4 = time_stream<T, IL, 4>(l, rpt);
    printf("    RPT %2lld  U1 %6.1f (%.3f)  U2 %6.1f (%.3f)  U4 %6.1f (%.3f)", (long long)rpt, t1,
           copy / t1, t2, copy / t2, t4, copy / t4);
    if constexpr (IL) {
      const float t8 = time_stream<T, IL, 8>(l, rpt);
      printf("  U8 %6.1f (%.3f)", t8, copy / t8);
    }
    printf("\n");
  }
  const float lin[4] = {time_linear<T, IL, 1>(l), time_linear<T, IL, 2>(l), time_linear<T, IL, 4>(l),
                        time_linear<T, IL, 8>(l)};
  printf("  linear kernel alone: U1 %6.1f (%.3f)  U2 %6.1f (%.3f)  U4 %6.1f (%.3f)  U8 %6.1f (%.3f)\n", lin[0],
         copy / lin[0], lin[1], copy / lin[1], lin[2], copy / lin[2], lin[3], copy / lin[3]);
  const float full_lin = time_us(linear_op);
  printf("  op (table + linear U1) %.1f us (%.3f)\n", full_lin, copy / full_lin);
  summary[0] = copy;
  summary[1] = full;
  summary[2] = full_lin;
  summary[3] = err <= tol && err_lin <= tol;
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(ws));
  CHECK(cudaFree(err_d));
  if (pos) CHECK(cudaFree(pos));
}

int main() {
  CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const Case cases[] = {
      {"bf16 interleaved", true, true, false, false},
      {"bf16 half_split", true, false, false, false},
      {"bf16 interleaved [B,S,H,D].transpose(1,2)", true, true, true, false},
      {"f32 interleaved", false, true, false, false},
      {"f32 half_split", false, false, false, false},
      {"bf16 half_split, positions [B,S]", true, false, false, true},
  };
  double s[6][4];
  run_case<__nv_bfloat16, true>(cases[0], s[0]);
  run_case<__nv_bfloat16, false>(cases[1], s[1]);
  run_case<__nv_bfloat16, true>(cases[2], s[2]);
  run_case<float, true>(cases[3], s[3]);
  run_case<float, false>(cases[4], s[4]);
  run_case<__nv_bfloat16, false>(cases[5], s[5]);
  printf("\nsummary, q [8, 32, 4096, 128] (ratio = copy time / op time)\n");
  for (int i = 0; i < 6; ++i)
    printf("  %-44s copy %6.1f us  op(planned) %6.1f us %.3f  op(linear U1) %6.1f us %.3f  %s\n", cases[i].name,
           s[i][0], s[i][1], s[i][0] / s[i][1], s[i][2], s[i][0] / s[i][2], s[i][3] ? "ok" : "CHECK FAILED");
  return 0;
}
