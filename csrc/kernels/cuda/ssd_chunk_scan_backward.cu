// Mamba-2 SSD chunk scan, CUDA backward: recompute the chunk states H_c, the reverse
// state pass for Gn_c = G_{c+1}, the per-chunk products for dx, dC and dB and the
// crossing sums X_s (each in its own translation unit so they compile in parallel), then
// the finalize kernels for ddt and dA (see ssd_chunk_scan.cuh for the formulas and the
// workspace layout; float16 and bfloat16 run the tensor-core kernels of
// ssd_chunk_scan_tc.cuh on sm_80+).
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels {

namespace cuda {
// ssd_chunk_scan_backward_{dx,dc,db,dacs}.cu
void ssd_backward_scan_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_scan_dc(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_scan_db(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
}  // namespace cuda

size_t ssd_chunk_scan_cuda_backward_workspace(const SsdChunkScanLaunch& l) {
  return cuda::ssd_workspace_layout(l, /*backward=*/true).total;
}

void ssd_chunk_scan_cuda_backward(const SsdChunkScanLaunch& l, void* stream) {
  using namespace cuda;
  if (l.heads == 0) return;  // every output is empty
  ssd_check_launch_struct(l, /*backward=*/true);
  const SsdWorkspace w = ssd_workspace_layout(l, /*backward=*/true);
  auto s = static_cast<cudaStream_t>(stream);
  // With B·L == 0 only dA is non-empty: every launch below but dA's has no work and is
  // skipped, and dA is written as zeros.
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    ssd_launch_cumsum<T>(l, w, s);                        // Acs, dt → workspace
    ssd_run_states<T, /*BW=*/false>(l, w, s);  // S_c → H_c
    ssd_run_states<T, /*BW=*/true>(l, w, s);   // Σ_q exp(Acs_q)·dy_q ⊗ C_q → Gn_c, ⟨Gn_c, H_c⟩ partials
  });
  ssd_backward_scan_dx(l, w, s);  // dx; partials of ddt(direct) and V
  ssd_backward_scan_dc(l, w, s);  // dC; partials of U
  ssd_backward_scan_db(l, w, s);  // dB
  ssd_backward_dacs(l, w, s);     // X_s
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    ssd_launch_finalize<T>(l, w, s);  // da → ddt, dA
  });
}

}  // namespace baracuda::kernels
