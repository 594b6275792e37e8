// Dev tool: sweep the gather column-slab kernels (kernels/cuda/gather_slab.cuh) at the
// benchmark's dim=0 shape, src [16384, 8192], int64 index [4096, 8192], float32 and bfloat16,
// against the index-space walker (the variant used before slabs), without PyTorch.
// Knobs: slab region (-> width W), persistent grid (blocks per SM), the forward's L2
// prefetch size, the backward's L2 discard of the accumulator ring. The row marked '*'
// is what the plan picks with the constants in core/gather_plan.h; 'err' is the max abs
// difference to the walker's result (0 for the forward; atomics reorder the backward).
// Build and run on the GPU (about 10 s):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc -DBARACUDA_WITH_CUDA benchmarks/tune/tune_gather_slab.cu \
//     csrc/kernels/cuda/gather_errors.cu csrc/core/plan.cpp -o /tmp/tune_gather && /tmp/tune_gather
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/gather_slab.cuh"
#include "tune_common.cuh"

using namespace baracuda;
using namespace baracuda::kernels::cuda;

constexpr int64_t kN = 16384, kC = 8192, kR = 4096;  // src rows, columns, index rows

template <typename F>
float time_us(F&& f) {
  return median_us(f, 3, 15);
}

__device__ uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_values(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x)
    p[i] = static_cast<T>(static_cast<float>(mix(seed + i) >> 40) / (1 << 24) * 2.f - 1.f);
}

__global__ void fill_index(int64_t* p, int64_t n, int64_t size, uint64_t seed) {
  for (int64_t i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x)
    p[i] = static_cast<int64_t>(mix(seed + i) % static_cast<uint64_t>(size));
}

// max |a - b| into *out (float bits of non-negative values order like integers).
template <typename A, typename B>
__global__ void max_diff(const A* a, const B* b, int64_t n, unsigned* out) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x)
    m = fmaxf(m, fabsf(static_cast<float>(a[i]) - static_cast<float>(b[i])));
  atomicMax(out, __float_as_uint(m));
}

template <typename A, typename B>
float diff(const A* a, const B* b, int64_t n) {
  unsigned* d;
  CHECK(cudaMalloc(&d, 4));
  CHECK(cudaMemset(d, 0, 4));
  max_diff<<<1024, 256>>>(a, b, n, d);
  unsigned h;
  CHECK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  float f;
  memcpy(&f, &h, 4);
  return f;
}

// The launch the plan would fill for this 2-D contiguous dim=0 problem.
GatherLaunch make_launch(ElementKind e, bool backward, const void* index, const void* value,
                         void* out, int device) {
  GatherLaunch l;
  l.element = e;
  l.index_element = ElementKind::I64;
  l.backward = backward;
  l.algo = GatherBackwardAlgo::Atomic;
  l.vec = 4;
  l.index64 = false;
  l.device = device;
  l.dims.rank = 2;
  l.dims.sizes[0] = kR;
  l.dims.sizes[1] = kC;
  for (int k = 0; k < 2; ++k) {
    l.dims.strides[k][0] = kC;
    l.dims.strides[k][1] = 1;
  }
  l.dims.strides[2][0] = 0;
  l.dims.strides[2][1] = 1;
  l.numel = kR * kC;
  l.dim = 0;
  l.dim_size = kN;
  l.dim_stride = kC;
  l.out_numel = kN * kC;
  GatherSlab& s = l.slab;
  s.rows = kR;
  s.src_rows = kN;
  s.cols = kC;
  s.row_strides = {kC, kC, kC};
  s.col_strides = {1, 1};
  s.outer.rank = 1;
  s.outer.sizes[0] = 1;
  for (int k = 0; k < 3; ++k) s.outer.strides[k][0] = 1;
  s.outer_count = 1;
  l.index = index;
  l.value = value;
  l.out = out;
  return l;
}

void set_geometry(GatherLaunch& l, int width_log2, int blocks) {
  GatherSlab& s = l.slab;
  s.width_log2 = width_log2;
  s.slabs_per_outer = (kC + (int64_t{1} << width_log2) - 1) >> width_log2;
  s.slabs = s.slabs_per_outer;
  s.blocks = blocks;
}

template <typename T>
void sweep(const char* name, ElementKind e, const cudaDeviceProp& prop, const int64_t* index) {
  const int sms = prop.multiProcessorCount;
  const int64_t l2 = prop.l2CacheSize;
  const int elt = sizeof(T);
  T *src, *out, *ref_out, *dout, *dsrc;
  float* acc;
  CHECK(cudaMalloc(&src, kN * kC * elt));
  CHECK(cudaMalloc(&out, kR * kC * elt));
  CHECK(cudaMalloc(&ref_out, kR * kC * elt));
  CHECK(cudaMalloc(&dout, kR * kC * elt));
  CHECK(cudaMalloc(&dsrc, kN * kC * elt));
  CHECK(cudaMalloc(&acc, kN * kC * sizeof(float)));
  fill_values<<<1024, 256>>>(src, kN * kC, 1);
  fill_values<<<1024, 256>>>(dout, kR * kC, 2);

  // Baselines: the walker forward; backward = zero fill + walker atomics into float32
  // (bfloat16's conversion pass not included).
  GatherLaunch base = make_launch(e, false, index, src, ref_out, 0);
  base.layout = GatherLayout::RowsVec;
  const GatherWalkParams<uint32_t> wp = make_walk_params<uint32_t>(base);
  const float t_walk = time_us([&] {
    launch_walk<T, int64_t, uint32_t, WalkMode::Forward>(base, wp, nullptr);
  });
  GatherLaunch bbase = make_launch(e, true, index, dout, acc, 0);
  GatherWalkParams<uint32_t> bp = make_walk_params<uint32_t>(bbase);
  bp.target = acc;
  const float t_walk_b = time_us([&] {
    CHECK(cudaMemsetAsync(acc, 0, kN * kC * sizeof(float)));
    launch_walk<T, int64_t, uint32_t, WalkMode::Scatter>(bbase, bp, nullptr);
  });
  printf("%s walker: forward %.1f us, backward (fill + atomics) %.1f us\n", name, t_walk, t_walk_b);

  // Forward sweep; the first row is the plan's choice.
  float best = 1e30f;
  auto forward = [&](char mark, int w, int blocks, int pf) {
    GatherLaunch l = make_launch(e, false, index, src, out, 0);
    set_geometry(l, w, blocks);
    const GatherSlabParams<uint32_t> p = make_slab_params<uint32_t>(l);
    auto run = [&] {
      if (pf == 0) launch_slab_forward_kernel<T, int64_t, uint32_t, 4, 0>(p, blocks, nullptr);
      if (pf == 128) launch_slab_forward_kernel<T, int64_t, uint32_t, 4, 128>(p, blocks, nullptr);
      if (pf == 256) launch_slab_forward_kernel<T, int64_t, uint32_t, 4, 256>(p, blocks, nullptr);
    };
    CHECK(cudaMemset(out, 0xff, kR * kC * elt));
    const float t = time_us(run);
    best = std::min(best, t);
    printf("%c %s fwd W=%4d (region %5.1f MB) blocks=%4d pf=%3d: %7.1f us  err %g\n", mark, name,
           1 << w, double(kN << w) * elt / (1 << 20), blocks, pf, t, diff(out, ref_out, kR * kC));
  };
  forward('*', gather_slab_width_log2(kN, kC, elt, l2 / kGatherSlabL2Share),
          gather_slab_blocks(kN, kR, elt, l2 / kGatherWindowL2Share, 4096, sms,
                             kGatherSlabForwardBlocksPerSm),
          gather_slab_prefetch(kR, kN, elt));
  for (int64_t mb : {1, 2, 4, 8, 16, 32})
    for (int per_sm2 : {2, 3, 4})  // blocks per SM × 2 (the kernel keeps 2 resident)
      for (int pf : {0, 128, 256})
        forward(' ', gather_slab_width_log2(kN, kC, elt, mb << 20), sms * per_sm2 / 2, pf);
  printf("%s forward: best %.1f us (walker %.1f us)\n", name, best, t_walk);

  // Backward sweep (reference: the walker's float32 sums); the first row is the plan's.
  const bool half = sizeof(T) == 2;
  best = 1e30f;
  auto backward = [&](char mark, int w, int blocks, bool discard) {
    GatherLaunch l = make_launch(e, true, index, dout, dsrc, 0);
    set_geometry(l, w, blocks);
    const size_t ws_bytes = gather_slab_backward_schedule(l.slab, half, false, false, 4, l2);
    void* ws;
    CHECK(cudaMalloc(&ws, ws_bytes));
    l.workspace = {ws, ws_bytes};
    auto run = [&] {
      GatherSlabParams<uint32_t> p = make_slab_backward_params<uint32_t>(l, nullptr);
      p.discard = discard;
      launch_slab_backward_kernel<T, int64_t, uint32_t, 4>(p, l.slab.blocks, nullptr);
    };
    CHECK(cudaMemset(dsrc, 0xff, kN * kC * elt));
    const float t = time_us(run);
    best = std::min(best, t);
    printf("%c %s bwd W=%4d (region %5.1f MB) blocks=%4d lead=%d ring=%2d discard=%d: %7.1f us  err %g\n",
           mark, name, 1 << w, double(kN << w) * 4 / (1 << 20), l.slab.blocks, l.slab.lead,
           l.slab.ring, int(discard), t, diff(dsrc, acc, kN * kC));
    CHECK(cudaFree(ws));
  };
  backward('*', gather_slab_width_log2(kN, kC, 4, l2 / kGatherSlabL2Share),
           gather_slab_blocks(kN, kR, 4, l2 / kGatherWindowL2Share, 4096, sms,
                              kGatherSlabBackwardBlocksPerSm),
           true);
  for (int64_t mb : {1, 2, 4, 8, 16})
    for (int per_sm2 : {2, 3, 4, 6})
      for (bool discard : {true, false})
        if (half || discard)
          backward(' ', gather_slab_width_log2(kN, kC, 4, mb << 20), sms * per_sm2 / 2, discard);
  printf("%s backward: best %.1f us (walker %.1f us)\n\n", name, best, t_walk_b);
  CHECK(cudaFree(src));
  CHECK(cudaFree(out));
  CHECK(cudaFree(ref_out));
  CHECK(cudaFree(dout));
  CHECK(cudaFree(dsrc));
  CHECK(cudaFree(acc));
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("%s: %d SMs, L2 %.1f MB; src [%lld, %lld], int64 index [%lld, %lld], dim=0\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, (long long)kN, (long long)kC,
         (long long)kR, (long long)kC);
  int64_t* index;
  CHECK(cudaMalloc(&index, kR * kC * sizeof(int64_t)));
  fill_index<<<1024, 256>>>(index, kR * kC, kN, 7);
  sweep<float>("f32 ", ElementKind::F32, prop, index);
  sweep<__nv_bfloat16>("bf16", ElementKind::BF16, prop, index);
  CHECK(cudaFree(index));
  return 0;
}
