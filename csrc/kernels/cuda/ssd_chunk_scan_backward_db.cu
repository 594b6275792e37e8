// Mamba-2 SSD chunk scan backward, dB summed over the group's heads (ssd_scan_kernel in
// mode DB; see ssd_chunk_scan.cuh).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_backward_scan_db(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_run_scan<decltype(tag), kSsdDB>(l, w, s); });
}

}  // namespace baracuda::kernels::cuda
