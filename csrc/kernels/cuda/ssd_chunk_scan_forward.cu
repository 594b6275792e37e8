// Mamba-2 SSD chunk scan, CUDA forward: cumsum → chunk states and state passing
// (ssd_chunk_scan_states.cu) → chunk scan (see ssd_chunk_scan.cuh for the formulas, the options and the workspace layout;
// float16 and bfloat16 run the tensor-core kernels of ssd_chunk_scan_tc.cuh on sm_80+).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels {

namespace cuda {
// ssd_chunk_scan_states.cu
void ssd_run_forward_states(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t s);
}  // namespace cuda

size_t ssd_chunk_scan_cuda_forward_workspace(const SsdChunkScanLaunch& l) {
  return cuda::ssd_workspace_layout(l, /*backward=*/false).total;
}

void ssd_chunk_scan_cuda_forward(const SsdChunkScanLaunch& l, void* stream) {
  using namespace cuda;
  if (l.batch == 0 || l.heads == 0 || l.head_dim == 0) return;  // y and final_states are empty
  ssd_check_launch_struct(l, /*backward=*/false);
  const SsdWorkspace w = ssd_workspace_layout(l, /*backward=*/false);
  auto s = static_cast<cudaStream_t>(stream);
  ssd_run_forward_states(l, w, l.final_states, s);  // Acs, dt; S_c → H_c, final_states
  if (l.seqlen == 0) return;                        // y is empty
  dispatch_floating(l.element, [&](auto tag) { ssd_run_scan<decltype(tag), kSsdY>(l, w, s); });  // y (D, y_pre, z gate)
}

}  // namespace baracuda::kernels
