// Mamba-2 SSD chunk scan, CUDA: the stages that the forward and the backward share (the
// cumsum of dt·A, the chunk states S_c and the forward state pass to H_c; the backward
// recomputes them unless the forward kept H_c, SsdChunkScanLaunch::states), in one
// translation unit so that their kernels are compiled once.
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {
namespace {

// The kept states (SsdChunkScanLaunch::states) from the float32 H_c where the run keeps no
// 16-bit copy (the SIMT kernels, which read the float32 states): rounded as the copies are.
template <typename T>
__global__ void ssd_keep_states_kernel(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_acc<T>(src[i]);
}

}  // namespace

void ssd_run_forward_states(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.seqlen == 0) {  // no chunk: the run is only seed → last (final_states = initial_states)
      ssd_launch_state_pass<T, /*BW=*/false>(l, w, last, s);
      return;
    }
    ssd_launch_cumsum<T>(l, w, s);                 // Acs, dt → workspace
    ssd_run_states<T, /*BW=*/false>(l, w, last, s);  // S_c → H_c (and its 16-bit copy), `last`
    if constexpr (ssd_is_half<T>) {
      if (l.keep_states && !ssd_state_copies(l)) {
        const int64_t n = l.batch * l.heads * l.nchunks() * l.head_dim * l.state_dim;
        ssd_keep_states_kernel<T><<<ssd_grid((n + kSsdThreads - 1) / kSsdThreads), kSsdThreads, 0, s>>>(
            ssd_ws<float>(l, w.states), static_cast<T*>(l.states), n);
        check_launch("ssd_chunk_scan(keep_states)");
      }
    }
  });
}

void ssd_run_cumsum(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_launch_cumsum<decltype(tag)>(l, w, s); });
}

}  // namespace baracuda::kernels::cuda
