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

struct SsdChunkScanLaunch {
  ElementKind element = ElementKind::F32;  // dtype of every floating operand
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0, state_dim = 0, groups = 0;
  int64_t chunk_size = 0;
  int64_t nchunks() const { return chunk_size > 0 ? (seqlen + chunk_size - 1) / chunk_size : 0; }

  // Element strides of the inputs, in the order of their dims (any value, 0 included):
  //   x, dy [B, L, H, D]   dt [B, L, H]   A [H]   B, C [B, L, G, N]
  int64_t x_stride[4] = {}, dt_stride[3] = {}, A_stride = 0, B_stride[4] = {},
          C_stride[4] = {}, dy_stride[4] = {};
  const void* x = nullptr;
  const void* dt = nullptr;
  const void* A = nullptr;
  const void* B = nullptr;
  const void* C = nullptr;
  const void* dy = nullptr;  // backward only

  // Outputs, dense and contiguous, of the inputs' dtype:
  //   forward:  y [B, L, H, D]
  //   backward: dx [B, L, H, D], ddt [B, L, H], dA [H], dB, dC [B, L, G, N]
  // Every element of every output is written (no zero-initialisation is assumed).
  void* y = nullptr;
  void* dx = nullptr;
  void* ddt = nullptr;
  void* dA = nullptr;
  void* dB = nullptr;
  void* dC = nullptr;

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
