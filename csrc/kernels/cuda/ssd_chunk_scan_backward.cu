// Mamba-2 SSD chunk scan, CUDA backward: dy_pre, dz and the dD partials (with z or D), then
// recompute the chunk states H_c (ssd_chunk_scan_states.cu, shared with the forward; not
// where the forward kept them, SsdChunkScanLaunch::states), the
// reverse state pass for Gn_c = G_{c+1} (seeded by dfinal_states, ending in
// dinitial_states), the per-chunk products for dx, dC and dB and the crossing sums X_s (each
// in its own translation unit so they compile in parallel), then the finalize kernels for
// ddt, dA, ddt_bias, and last dD (see ssd_chunk_scan.cuh for the formulas and the workspace
// layout; float16 and bfloat16 run the tensor-core kernels of ssd_chunk_scan_tc.cuh on
// sm_80+).
#include "kernels/cuda/side_stream.cuh"
#include "kernels/cuda/ssd_chunk_scan_tc.cuh"

namespace baracuda::kernels {

namespace cuda {
// ssd_chunk_scan_states.cu
void ssd_run_forward_states(const SsdChunkScanLaunch& l, const SsdWorkspace& w, void* last, cudaStream_t s);
void ssd_run_cumsum(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
// ssd_chunk_scan_backward_{dx,dc,db,dacs}.cu
void ssd_backward_scan_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_scan_dc(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_scan_db(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_dacs(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
// ssd_chunk_scan_backward_group.cu (group_products)
void ssd_backward_group_dcb(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
void ssd_backward_group_grad(const SsdChunkScanLaunch& l, const SsdWorkspace& w, bool db, cudaStream_t s);
void ssd_backward_group_dx(const SsdChunkScanLaunch& l, const SsdWorkspace& w, cudaStream_t s);
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
  // With z, every kernel below reads dy_pre = dy·silu(z) in place of dy: the gate kernel
  // writes it into the workspace (dense), with dz.
  SsdChunkScanLaunch lb = l;
  if (l.z != nullptr) {
    lb.dy = ssd_ws<void>(l, w.dyp);
    lb.dy_stride[3] = 1;
    lb.dy_stride[2] = l.head_dim;
    lb.dy_stride[1] = l.heads * l.head_dim;
    lb.dy_stride[0] = l.seqlen * l.heads * l.head_dim;
  }
  // With B·L == 0 only dA, ddt_bias, dD and dinitial_states can be non-empty: every
  // launch below but theirs has no work and is skipped; they are written as zeros (and
  // dinitial_states = dfinal_states).
  dispatch_floating(l.element, [&](auto tag) { ssd_launch_gate<decltype(tag)>(l, w, s); });  // dy_pre, dz, dD partials
  if (l.keep_states)
    ssd_run_cumsum(lb, w, s);  // Acs, dt; H_c is the forward's (SsdChunkScanLaunch::states)
  else
    ssd_run_forward_states(lb, w, nullptr, s);  // Acs, dt; S_c → H_c (recomputed)
  // dCB = Σ_heads of the intra-chunk weights; X_s; B·Cᵀ tiles. It reads only the cumsum's
  // Acs and dt (and seq_idx's counts): with side_stream it runs beside the state kernels,
  // whose chunk states and passes (about 450 µs at the 2.7B shape) leave most of the GPU
  // idle at times (the passes walk the chunks in order).
  const cudaStream_t sd = l.side_stream ? side_stream_fork(s, 0) : s;
  if (l.group_products) ssd_backward_group_dcb(lb, w, sd);
  dispatch_floating(l.element, [&](auto tag) {
    ssd_run_states<decltype(tag), /*BW=*/true>(lb, w, l.dinitial_states, s);  // local dstate → Gn_c, ⟨Gn_c, H_c⟩ partials
  });
  if (l.side_stream) side_stream_join(s, 0);
  if (l.group_products) {
    ssd_backward_group_dx(lb, w, s);           // dx (+ D·dy_pre) from those tiles; partials of ddt(direct) and V
    ssd_backward_group_grad(lb, w, false, s);  // dC = dCB·B + the heads' inter-chunk terms; partials of U
    ssd_backward_group_grad(lb, w, true, s);   // dB = dCBᵀ·C + the heads' inter-chunk terms
  } else {
    ssd_backward_scan_dx(lb, w, s);  // dx (+ D·dy_pre); partials of ddt(direct) and V
    ssd_backward_scan_dc(lb, w, s);  // dC; partials of U
    ssd_backward_scan_db(lb, w, s);  // dB
    ssd_backward_dacs(lb, w, s);     // X_s
  }
  dispatch_floating(l.element, [&](auto tag) {
    using T = decltype(tag);
    ssd_launch_finalize<T>(lb, w, s);  // da → ddt, dA, ddt_bias
    ssd_launch_dD<T>(l, w, s);         // dD from its partials
  });
}

}  // namespace baracuda::kernels
