// CUDA gather backward: dsrc = zeros(src_sizes); dsrc[offset(p) + index[p]·stride(dim)] +=
// dout[p] for every index-space position p with index[p] in range.
//
// atomic: zero-fill, then one atomicAdd per element (float32/float64 straight into dsrc;
//   float16/bfloat16 into a zeroed float32 workspace, then one conversion pass). The
//   order of the additions into one element varies from run to run.
// atomic_slab (when dim is not the innermost and src is large): column slabs
//   (gather_slab.cuh): each dsrc slab (f16/bf16: float32 ring slot) zeroed just before its
//   atomics and converted right after, all in L2.
// atomic_lines (fastest, when dim is dsrc's innermost dim and a line fits in shared
//   memory): one block per line of the index space; it zeroes the line's accumulator in
//   shared memory, atomicAdds its dout values there, and writes the whole dsrc line once
//   (coalesced). No zero-fill pass, no workspace, no global atomics: dsrc is written
//   exactly once. dsrc lines no index line reaches are zeroed by a memset first.
// sorted: the walker writes key = dsrc offset (the sentinel out_numel where the index is
//   out of range) and value = dout offset in index-space order; a stable radix sort on
//   the key bits groups each dsrc element's contributions in ascending source position;
//   the thread at the start of each run sums it in that order, in float32 (float64 for
//   float64), and writes it. dsrc elements without a run keep the zero fill. Same order,
//   hence the same bits, on every run (and as the CPU kernel).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/gather_slab.cuh"

namespace baracuda::kernels::cuda {

namespace {
constexpr const char* kOp = "gather_backward";
constexpr int kThreads = 256;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, kOp, std::string(what) + ": " + cudaGetErrorString(err));
}

// dsrc[i] = T(acc[i]): four elements per thread, vector accesses except at the tail.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    gather_convert_kernel(const float* __restrict__ acc, T* __restrict__ out, int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 4;
  if (i + 4 <= n) {
    const float4 a = __ldcs(reinterpret_cast<const float4*>(acc + i));
    const T v[4] = {from_acc<T>(a.x), from_acc<T>(a.y), from_acc<T>(a.z), from_acc<T>(a.w)};
    store_group<T, 4>(out + i, v);
  } else {
    for (int64_t j = i; j < n; ++j) out[j] = from_acc<T>(acc[j]);
  }
}

// One thread per sorted position; the first position of each run of equal keys sums the
// run in order and writes dsrc[key]. Out-of-range entries carry the sentinel key, which
// is larger than every valid one, so they sort last and are skipped.
template <typename T, typename Key>
__global__ void __launch_bounds__(kThreads)
    gather_runs_kernel(const Key* __restrict__ keys, const Key* __restrict__ values, int64_t n,
                       Key sentinel, const T* __restrict__ dout, T* __restrict__ dsrc) {
  using Acc = acc_t<T>;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= n) return;
  const Key key = keys[k];
  if (key >= sentinel || (k > 0 && keys[k - 1] == key)) return;
  Acc acc = Acc(0);
  for (int64_t j = k; j < n && keys[j] == key; ++j) acc += to_acc(dout[values[j]]);
  dsrc[key] = from_acc<T>(acc);
}

struct GatherLinesParams {
  int rank;  // coalesced lines space (index's shape with dim dropped)
  uint32_t sizes[kMaxRank];
  uint32_t strides[3][kMaxRank];  // index, dout, dsrc
  uint32_t line_len;              // index.size(dim)
  uint32_t index_step, dout_step;  // index.stride(dim), dout.stride(dim)
  uint32_t dim_size;               // dsrc.size(dim): the line length in dsrc (stride 1)
  int dim;
  const void* index;
  const void* dout;
  void* dsrc;
  GatherErrorRecord* error;
};

// One block per line. acc (dynamic shared memory) holds the line's dim_size sums.
//   acc[s] = Σ_{j : index[j] = s} dout[j];   dsrc_line[s] = acc[s]
// G = 4: index and dout are contiguous along dim and 16-byte aligned: group loads.
template <typename T, typename I, int G>
__global__ void __launch_bounds__(kThreads) gather_lines_kernel(const GatherLinesParams p) {
  using Acc = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* acc = reinterpret_cast<Acc*>(smem_raw);

  uint32_t rest = blockIdx.x, o0 = 0, o1 = 0, o2 = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    const uint32_t c = rest % p.sizes[d];
    rest /= p.sizes[d];
    o0 += c * p.strides[0][d];
    o1 += c * p.strides[1][d];
    o2 += c * p.strides[2][d];
  }
  const I* index = static_cast<const I*>(p.index) + o0;
  const T* dout = static_cast<const T*>(p.dout) + o1;
  T* dsrc = static_cast<T*>(p.dsrc) + o2;

  for (uint32_t s = threadIdx.x; s < p.dim_size; s += kThreads) acc[s] = Acc(0);
  __syncthreads();

  bool bad = false;
  long long bad_value = 0;
  constexpr uint32_t kStep = kThreads * G * kGatherUnroll;
  for (uint32_t base = threadIdx.x * G; base < p.line_len; base += kStep) {
    I idx[kGatherUnroll][G];
    T val[kGatherUnroll][G];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {  // every load before any atomic
      const uint32_t j = base + u * kThreads * G;
      if (j < p.line_len) {
        if constexpr (G == 1) {
          idx[u][0] = index[j * p.index_step];
          val[u][0] = dout[j * p.dout_step];
        } else {
          load_group<I, G>(index + j, idx[u]);
          load_group<T, G>(dout + j, val[u]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      if (base + u * kThreads * G < p.line_len) {
#pragma unroll
        for (int e = 0; e < G; ++e) {
          const long long v = static_cast<long long>(idx[u][e]);
          if (static_cast<unsigned long long>(v) < p.dim_size) {
            atomicAdd(acc + v, to_acc(val[u][e]));
          } else if (!bad) {
            bad = true;
            bad_value = v;
          }
        }
      }
    }
  }
  __syncthreads();

  if (p.dim_size % 4 == 0) {  // the line starts at a multiple of dim_size: 4-aligned
    for (uint32_t s = threadIdx.x * 4; s < p.dim_size; s += kThreads * 4) {
      const T v[4] = {from_acc<T>(acc[s]), from_acc<T>(acc[s + 1]), from_acc<T>(acc[s + 2]),
                      from_acc<T>(acc[s + 3])};
      store_group<T, 4>(dsrc + s, v);
    }
  } else {
    for (uint32_t s = threadIdx.x; s < p.dim_size; s += kThreads) dsrc[s] = from_acc<T>(acc[s]);
  }
  report_block_error(bad, bad_value, p.dim_size,
                     static_cast<int>(GatherErrorOp::GatherBackward), p.dim, p.error);
}

// The one SortPairs instantiation per offset width, used both for the temp-storage query
// and for the sort itself (the query must see the same types).
template <typename Idx>
cudaError_t sort_pairs(void* temp, size_t& temp_bytes, cub::DoubleBuffer<GatherKey<Idx>>& keys,
                       cub::DoubleBuffer<GatherKey<Idx>>& values, int64_t n, int end_bit,
                       cudaStream_t stream) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, values, static_cast<Idx>(n), 0,
                                         end_bit, stream);
}

bool is_half(ElementKind e) { return e == ElementKind::F16 || e == ElementKind::BF16; }

template <typename Idx>
void launch_atomic(const GatherLaunch& l, cudaStream_t stream) {
  const bool half = is_half(l.element);
  void* acc = half ? l.workspace.data : l.out;
  const size_t acc_bytes =
      static_cast<size_t>(l.out_numel) * (half ? sizeof(float) : element_size(l.element));
  if (acc_bytes > 0) check_cuda(cudaMemsetAsync(acc, 0, acc_bytes, stream), "zero-filling dsrc");
  if (l.numel > 0) {
    GatherWalkParams<Idx> p = make_walk_params<Idx>(l);
    p.target = acc;
    dispatch_floating(l.element, [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(l.index_element, [&](auto index_tag) {
        launch_walk<T, decltype(index_tag), Idx, WalkMode::Scatter>(l, p, stream);
      });
    });
    check_launch(kOp);
  }
  if (half && l.out_numel > 0) {
    const unsigned int blocks = blocks_for((l.out_numel + 3) / 4, kThreads);
    const float* a = static_cast<const float*>(acc);
    if (l.element == ElementKind::F16)
      gather_convert_kernel<__half><<<blocks, kThreads, 0, stream>>>(
          a, static_cast<__half*>(l.out), l.out_numel);
    else
      gather_convert_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          a, static_cast<__nv_bfloat16*>(l.out), l.out_numel);
    check_launch(kOp);
  }
}

void launch_atomic_lines(const GatherLaunch& l, cudaStream_t stream) {
  const size_t dsrc_bytes = static_cast<size_t>(l.out_numel) * element_size(l.element);
  if (l.zero_fill) check_cuda(cudaMemsetAsync(l.out, 0, dsrc_bytes, stream), "zero-filling dsrc");
  const CoalescedDims& d = l.lines;
  GatherLinesParams p{};
  p.rank = d.rank;
  int64_t lines = 1;
  for (int i = 0; i < d.rank; ++i) {
    lines *= d.sizes[i];
    p.sizes[i] = static_cast<uint32_t>(d.sizes[i]);
    for (int k = 0; k < 3; ++k) p.strides[k][i] = static_cast<uint32_t>(d.strides[k][i]);
  }
  p.line_len = static_cast<uint32_t>(l.line_len);
  p.index_step = static_cast<uint32_t>(l.index_line_stride);
  p.dout_step = static_cast<uint32_t>(l.dout_line_stride);
  p.dim_size = static_cast<uint32_t>(l.dim_size);
  p.dim = l.dim;
  p.index = l.index;
  p.dout = l.value;
  p.dsrc = l.out;
  p.error = gather_error_record(l.device);
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = static_cast<size_t>(l.dim_size) * sizeof(acc_t<T>);
    dispatch_index(l.index_element, [&](auto index_tag) {
      using I = decltype(index_tag);
      const auto blocks = static_cast<unsigned int>(lines);
      if (l.lines_vec == 4)
        gather_lines_kernel<T, I, 4><<<blocks, kThreads, smem, stream>>>(p);
      else
        gather_lines_kernel<T, I, 1><<<blocks, kThreads, smem, stream>>>(p);
    });
  });
  check_launch(kOp);
}

template <typename Idx>
void launch_sorted(const GatherLaunch& l, cudaStream_t stream) {
  using Key = GatherKey<Idx>;
  const size_t dsrc_bytes = static_cast<size_t>(l.out_numel) * element_size(l.element);
  if (dsrc_bytes > 0) check_cuda(cudaMemsetAsync(l.out, 0, dsrc_bytes, stream), "zero-filling dsrc");
  if (l.numel == 0) return;

  const GatherSortWorkspace w = gather_sort_workspace(l.numel, l.index64, l.sort_temp_bytes);
  char* ws = static_cast<char*>(l.workspace.data);
  Key* keys[2] = {reinterpret_cast<Key*>(ws + w.keys[0]), reinterpret_cast<Key*>(ws + w.keys[1])};
  Key* values[2] = {reinterpret_cast<Key*>(ws + w.values[0]),
                    reinterpret_cast<Key*>(ws + w.values[1])};

  GatherWalkParams<Idx> p = make_walk_params<Idx>(l);
  p.keys = keys[0];
  p.values = values[0];
  dispatch_index(l.index_element, [&](auto index_tag) {
    launch_walk<float, decltype(index_tag), Idx, WalkMode::Keys>(l, p, stream);
  });
  check_launch(kOp);
  if (l.out_numel == 0) return;  // every index was out of range (size(dim) == 0)

  cub::DoubleBuffer<Key> key_buf(keys[0], keys[1]);
  cub::DoubleBuffer<Key> value_buf(values[0], values[1]);
  size_t temp_bytes = l.sort_temp_bytes;
  check_cuda(sort_pairs<Idx>(ws + w.temp, temp_bytes, key_buf, value_buf, l.numel, l.sort_end_bit,
                             stream),
             "radix sort");
  const unsigned int blocks = blocks_for(l.numel, kThreads);
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    gather_runs_kernel<T, Key><<<blocks, kThreads, 0, stream>>>(
        key_buf.Current(), value_buf.Current(), l.numel, static_cast<Key>(l.out_numel),
        static_cast<const T*>(l.value), static_cast<T*>(l.out));
  });
  check_launch(kOp);
}
}  // namespace

void launch_gather_backward(const GatherLaunch& l, cudaStream_t stream) {
  if (l.algo == GatherBackwardAlgo::Sorted) {
    if (l.index64)
      launch_sorted<int64_t>(l, stream);
    else
      launch_sorted<uint32_t>(l, stream);
  } else if (l.algo == GatherBackwardAlgo::AtomicLines) {
    launch_atomic_lines(l, stream);  // the plan picks it for 32-bit offsets only
  } else if (is_slab(l.layout)) {
    if (l.index64)
      launch_slab_backward<int64_t>(l, stream);
    else
      launch_slab_backward<uint32_t>(l, stream);
  } else {
    if (l.index64)
      launch_atomic<int64_t>(l, stream);
    else
      launch_atomic<uint32_t>(l, stream);
  }
}

}  // namespace baracuda::kernels::cuda

namespace baracuda::kernels {

size_t gather_sort_temp_bytes(int64_t n, int end_bit, bool index64) {
  size_t bytes = 0;
  cudaError_t err;
  if (index64) {
    cub::DoubleBuffer<cuda::GatherKey<int64_t>> k(nullptr, nullptr), v(nullptr, nullptr);
    err = cuda::sort_pairs<int64_t>(nullptr, bytes, k, v, n, end_bit, nullptr);
  } else {
    cub::DoubleBuffer<cuda::GatherKey<uint32_t>> k(nullptr, nullptr), v(nullptr, nullptr);
    err = cuda::sort_pairs<uint32_t>(nullptr, bytes, k, v, n, end_bit, nullptr);
  }
  cuda::check_cuda(err, "radix sort temp-storage query");
  return bytes;
}

}  // namespace baracuda::kernels
