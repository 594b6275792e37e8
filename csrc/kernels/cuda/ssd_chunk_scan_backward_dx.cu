// Mamba-2 SSD chunk scan backward, dx = dt·dxpre and the ddt(direct) = x·dxpre partials
// (ssd_scan_kernel in mode DX; see ssd_chunk_scan.cuh).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_backward_scan_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_run_scan<decltype(tag), kSsdDX>(l, w, s); });
}

}  // namespace baracuda::kernels::cuda
