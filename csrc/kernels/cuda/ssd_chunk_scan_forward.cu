// Mamba-2 SSD chunk scan, CUDA forward: cumsum → chunk states and state passing → chunk
// scan (see ssd_chunk_scan.cuh for the formulas, the options and the workspace layout;
// float16 and bfloat16 run the tensor-core kernels of ssd_chunk_scan_tc.cuh on sm_80+).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels {

size_t ssd_chunk_scan_cuda_forward_workspace(const SsdChunkScanLaunch& l) {
  return cuda::ssd_workspace_layout(l, /*backward=*/false).total;
}

void ssd_chunk_scan_cuda_forward(const SsdChunkScanLaunch& l, void* stream) {
  using namespace cuda;
  if (l.batch == 0 || l.heads == 0 || l.head_dim == 0) return;  // y and final_states are empty
  ssd_check_launch_struct(l, /*backward=*/false);
  const SsdWorkspace w = ssd_workspace_layout(l, /*backward=*/false);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    if (l.seqlen == 0) {  // y is empty; final_states = initial_states (or 0)
      ssd_launch_state_pass<T, /*BW=*/false>(l, w, l.final_states, s);
      return;
    }
    ssd_launch_cumsum<T>(l, w, s);                                // Acs, dt → workspace
    ssd_run_states<T, /*BW=*/false>(l, w, l.final_states, s);     // S_c → H_c, final_states
    ssd_run_scan<T, kSsdY>(l, w, s);                              // y (D, y_pre, z gate)
  });
}

}  // namespace baracuda::kernels
