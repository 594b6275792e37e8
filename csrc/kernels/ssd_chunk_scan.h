// Mamba-2 SSD chunk scan: the interface between the plan (core/ssd_chunk_scan_plan.cpp)
// and the CPU and CUDA kernels.
//
// Per batch b and head h (group g = h / (H / G)), with h_{-1} = 0:
//   decay_t = exp(dt_t · A_h)
//   h_t     = decay_t · h_{t-1} + dt_t · x_t ⊗ B_t          (h_t is D × N)
//   y_t[d]  = Σ_n C_t[n] · h_t[d, n]
// and the backward maps dy to (dx, ddt, dA, dB, dC).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/plan.h"

namespace baracuda {

// The mamba_ssm `mamba_chunk_scan_combined` contract on top of the recurrence above
// (every option is absent when its pointer is null / its flag is false, and then the
// kernels compute exactly the plain scan):
//   dt_t  <- dt_t + dt_bias_h;  dt_t <- softplus(dt_t) where dt_t <= 20 (dt_softplus);
//   dt_t  <- min(max(dt_t, dt_min), dt_max)      (always: the default (0, inf) maps a
//            negative dt to 0); computed in the compute type, before anything else.
//   h_{-1} = initial_states[b, h]; the state resets to 0 at every t > 0 where
//            seq_idx[b, t] != seq_idx[b, t-1] (initial_states belong to the first
//            sequence); final_states[b, h] = h_{L-1}.
//   y_t   += D_h · x_t  (or D_{h,d} · x_t[d]);   then, with z: y_pre = y,
//   out_t  = y_pre_t · silu(z_t).
// Backward: ddt is the gradient of the *raw* dt: zero where the processed dt lies strictly
// outside [dt_min, dt_max], times sigmoid(dt + dt_bias) where softplus applied;
// ddt_bias[h] = Σ_{b,t} ddt; dD, dz, dinitial_states as the formulas give; the incoming
// gradient of final_states (dfinal_states) seeds the reverse recurrence.
// Reductions over b and t (dA, dD, ddt_bias) are in a fixed order: deterministic.
struct SsdChunkScanLaunch {
  ElementKind element = ElementKind::F32;  // dtype of x, B, C, z, dy, y, dx, dB, dC, dz
  // The compute type: F32 for F16/BF16/F32 inputs, F64 for F64. A, D, dt_bias,
  // initial_states, final_states, dfinal_states and dA, dD, ddt_bias, dinitial_states
  // are in this type (the op layer converts the caller's small parameter tensors).
  ElementKind compute = ElementKind::F32;
  // dt's dtype (and ddt's): `element` or `compute`.
  ElementKind dt_element = ElementKind::F32;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0, state_dim = 0, groups = 0;
  int64_t chunk_size = 0;
  int64_t nchunks() const { return chunk_size > 0 ? (seqlen + chunk_size - 1) / chunk_size : 0; }

  // Element strides of the inputs, in the order of their dims (any value, 0 included):
  //   x, dy [B, L, H, D]   dt [B, L, H]   A [H] (compute)   B, C [B, L, G, N]
  int64_t x_stride[4] = {}, dt_stride[3] = {}, A_stride = 0, B_stride[4] = {},
          C_stride[4] = {}, dy_stride[4] = {};
  const void* x = nullptr;
  const void* dt = nullptr;
  const void* A = nullptr;
  const void* B = nullptr;
  const void* C = nullptr;
  const void* dy = nullptr;  // backward only

  // Outputs, dense and contiguous:
  //   forward:  y [B, L, H, D] (element: `out` above, after D and the z gate)
  //   backward: dx [B, L, H, D], dB, dC [B, L, G, N] (element), ddt [B, L, H]
  //             (dt_element), dA [H] (compute)
  // Every element of every output is written (no zero-initialisation is assumed).
  void* y = nullptr;
  void* dx = nullptr;
  void* ddt = nullptr;
  void* dA = nullptr;
  void* dB = nullptr;
  void* dC = nullptr;

  // ---- mamba_chunk_scan_combined options ----------------------------------------
  // Inputs (any strides, in the order of their dims):
  //   D [H] (D_per_dim false) or [H, D] (true)   z [B, L, H, D] (element)
  //   dt_bias [H]   initial_states [B, H, D, N]   seq_idx [B, L] (int32, or int64)
  //   dfinal_states [B, H, D, N] (backward; null: zero gradient)
  //   y_pre [B, L, H, D] (backward with z: the forward's pre-gate output)
  const void* D = nullptr;
  bool D_per_dim = false;
  int64_t D_stride[2] = {};
  const void* z = nullptr;
  int64_t z_stride[4] = {};
  const void* dt_bias = nullptr;
  int64_t dt_bias_stride = 0;
  bool dt_softplus = false;
  double dt_min = 0.0, dt_max = __builtin_inf();
  const void* initial_states = nullptr;
  int64_t init_stride[4] = {};
  const void* seq_idx = nullptr;
  bool seq_idx_int64 = false;
  int64_t seq_idx_stride[2] = {};
  const void* dfinal_states = nullptr;
  int64_t dfinal_stride[4] = {};
  const void* y_pre = nullptr;
  int64_t y_pre_stride[4] = {};
  // Outputs, dense and contiguous, written in full when non-null:
  //   forward:  final_states [B, H, D, N] (compute), y_pre [B, L, H, D] (element; only
  //             with z, to be saved for the backward)
  //   backward: dD (D's shape), ddt_bias [H], dinitial_states [B, H, D, N] (compute),
  //             dz [B, L, H, D] (element). Each is non-null exactly when its input is.
  void* final_states = nullptr;
  void* y_pre_out = nullptr;
  void* dD = nullptr;
  void* ddt_bias = nullptr;
  void* dinitial_states = nullptr;
  void* dz = nullptr;

  // Scratch of at least the matching *_workspace() bytes, 256-byte aligned, contents
  // undefined on entry.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace kernels {

// CPU: the exact sequential recurrence in float64 (float64 states and accumulation for
// every dtype); the backward keeps states only at chunk boundaries
// (O(B·H·⌈L/Q⌉·D·N)) and recomputes the steps inside a chunk.
size_t ssd_chunk_scan_cpu_forward_workspace(const SsdChunkScanLaunch& l);
size_t ssd_chunk_scan_cpu_backward_workspace(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cpu_forward(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cpu_backward(const SsdChunkScanLaunch& l);

// CPU: the chunked state-space-duality algorithm (the CUDA kernels' formulation) in
// float32 (float64 for float64 inputs), matrix products per chunk through libtorch's BLAS;
// parallel over (b, h), deterministic and the same bits for any thread count (every
// reduction across tasks goes through per-task partials summed in a fixed order).
// Forward workspace 0; backward O(B·H·⌈L/Q⌉·D·N) chunk states, copies of x and dy
// packed per head (2·B·H·L·D), plus per-head dB/dC partials (2·B·H·L·N) when a group
// has several heads. Any chunk_size >= 1 and L.
size_t ssd_chunk_scan_cpu_chunked_forward_workspace(const SsdChunkScanLaunch& l);
size_t ssd_chunk_scan_cpu_chunked_backward_workspace(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cpu_chunked_forward(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cpu_chunked_backward(const SsdChunkScanLaunch& l);

#ifdef BARACUDA_WITH_CUDA
// CUDA: the chunked state-space-duality algorithm, float32 (float64 for float64 inputs)
// states and accumulation; deterministic (no float atomics); workspace
// O(B·H·⌈L/Q⌉·D·N). Enqueued on `stream` (a cudaStream_t); no host synchronization.
// Supports 1 <= D, N <= 256, any chunk_size >= 1, any L, any G dividing H.
size_t ssd_chunk_scan_cuda_forward_workspace(const SsdChunkScanLaunch& l);
size_t ssd_chunk_scan_cuda_backward_workspace(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cuda_forward(const SsdChunkScanLaunch& l, void* stream);
void ssd_chunk_scan_cuda_backward(const SsdChunkScanLaunch& l, void* stream);
#endif

}  // namespace kernels
}  // namespace baracuda
