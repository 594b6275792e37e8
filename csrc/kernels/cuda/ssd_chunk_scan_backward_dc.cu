// Mamba-2 SSD chunk scan backward, dC summed over the group's heads and the per-head
// dy·y partials (ssd_scan_kernel in mode DC; see ssd_chunk_scan.cuh); and the head
// splits' sum that DC and DB share (ssd_split_sum).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels::cuda {

void ssd_backward_scan_dc(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s) {
  dispatch_floating(l.element, [&](auto tag) { ssd_run_scan<decltype(tag), kSsdDC>(l, w, s); });
}

void ssd_split_sum(const SsdChunkScanLaunch& l, const void* part, int64_t nsplit, void* out, cudaStream_t stream) {
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    const int64_t count = l.batch * l.seqlen * l.groups * l.state_dim;
    ssd_split_sum_kernel<T><<<ssd_grid((count + kSsdThreads - 1) / kSsdThreads), kSsdThreads, 0, stream>>>(
        static_cast<const acc_t<T>*>(part), nsplit, count, static_cast<T*>(out));
    check_launch("ssd_chunk_scan_backward(split_sum)");
  });
}

}  // namespace baracuda::kernels::cuda
