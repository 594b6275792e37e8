// Mamba-2 SSD chunk scan, CUDA: the stages that the forward and the backward share (the
// cumsum of dt·A, the chunk states S_c and the forward state pass to H_c; the backward
// recomputes them), in one translation unit so that their kernels are compiled once.
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_run_forward_states(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.seqlen == 0) {  // no chunk: the run is only seed → last (final_states = initial_states)
      ssd_launch_state_pass<T, /*BW=*/false>(l, w, last, s);
      return;
    }
    ssd_launch_cumsum<T>(l, w, s);                 // Acs, dt → workspace
    ssd_run_states<T, /*BW=*/false>(l, w, last, s);  // S_c → H_c (and its 16-bit copy), `last`
  });
}

}  // namespace baracuda::kernels::cuda
