// Mamba-2 SSD chunk scan backward, dC summed over the group's heads and the per-head
// dy·y partials (ssd_scan_kernel in mode DC; see ssd_chunk_scan.cuh).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_backward_scan_dc(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_run_scan<decltype(tag), kSsdDC>(l, w, s); });
}

}  // namespace baracuda::kernels::cuda
