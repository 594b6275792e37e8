// Mamba-2 SSD chunk scan backward, the crossing sums X_s of the stable da (ssd_dacs_kernel;
// see ssd_chunk_scan.cuh).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_backward_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_run_dacs<decltype(tag)>(l, w, s); });
}

}  // namespace baracuda::kernels::cuda
