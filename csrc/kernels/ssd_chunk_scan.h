// Mamba-2 SSD chunk scan: the kernel entry points the plan (core/ssd_chunk_scan_plan.cpp)
// calls. They trust the launch description (SsdChunkScanLaunch, in
// core/ssd_chunk_scan_plan.h, with the recurrence and the options' formulas) that the plan
// filled in.
#pragma once

#include <cstddef>

#include "core/ssd_chunk_scan_plan.h"

namespace baracuda::kernels {

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
// Chunks end at every seq_idx reset. Forward workspace 0; backward per-(b, h) partials
// (B·H·(2 + D)) plus, when a group has several heads, dB/dC summed over the group's heads
// (2·B·G·L·N) and the per-head dB/dC of a wave of (b, h) tasks (2·wave·L·N: at least 4
// tasks a thread, else what ssd_chunk_scan_cpu_chunked_wave_bytes holds, 256 MiB by
// default; each task keeps one (b, h)'s chunk states and packed x and dy in its own
// memory). Any chunk_size >= 1 and L. Where libtorch exports no BLAS, or after
// ssd_chunk_scan_cpu_chunked_use_blas(false) (tests), the products run on plain loops;
// it returns the previous setting. ssd_chunk_scan_cpu_chunked_wave_bytes (tests: smaller
// waves, the same bits) sets that budget (<= 0: the default) and returns the previous one.
bool ssd_chunk_scan_cpu_chunked_use_blas(bool enabled);
int64_t ssd_chunk_scan_cpu_chunked_wave_bytes(int64_t bytes);
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
// CUDA: the one-launch forwards (l.cuda_forward FusedMma and FusedMmaCb, sm_80+, and
// FusedWgmma, sm_90a; see SsdCudaForward for the problems they take). Workspace (all): a
// ticket and one counter per chain ((b, h, head_dim tile), and the half of the state
// columns with fused_state_split 2), and two float32 state tiles per chain; FusedMmaCb's
// also holds its C·Bᵀ table (ssd_fused_cb_tiles), and with two halves the second half's
// H_c (with fused_split_share each half's) in the input dtype and a flag per (b, h,
// head_dim tile, chunk) and H_c.
size_t ssd_chunk_scan_cuda_fused_forward_workspace(const SsdChunkScanLaunch& l);
void ssd_chunk_scan_cuda_fused_forward(const SsdChunkScanLaunch& l, void* stream);
void ssd_chunk_scan_cuda_fused_forward_sm90(const SsdChunkScanLaunch& l, void* stream);
#endif

}  // namespace baracuda::kernels
