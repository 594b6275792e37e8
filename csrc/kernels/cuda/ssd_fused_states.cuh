// The CUDA backward's chunk states by the fused forward's kernel (SsdChunkScanLaunch::
// fused_states, fused_dstates): what ssd_chunk_scan_backward.cu and the workspace layout
// (ssd_chunk_scan.cuh) need of ssd_fused_forward.cu, which defines these.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ssd_chunk_scan.h"

namespace baracuda::kernels::cuda {

// The workspace's buffers these kernels read and write.
struct FusedStatesBuffers {
  void* workspace = nullptr;  // ssd_fused_states_workspace bytes: the ticket, counters and ring
  void* states_t = nullptr;   // H_c rounded to the input type [B, H, nc, D, N]
  void* gstates_t = nullptr;  // Gn_c rounded, likewise (dstates)
  float* kpart = nullptr;     // ⟨Gn_c, H_c⟩ partials [B, H, nc, ssd_fused_kslots] (dstates)
};

// Bytes of `workspace`.
size_t ssd_fused_states_workspace(const SsdChunkScanLaunch& l);
// The ⟨Gn_c, H_c⟩ partials per (b, h, c) with fused_dstates: one per block (head_dim tile
// and half of the state columns).
int64_t ssd_fused_kslots(const SsdChunkScanLaunch& l);
// H_c into states_t (dstates false: l.fused_states), or the reverse chain (true:
// l.fused_dstates): Gn_c into gstates_t, the kpart partials and dinitial_states, reading
// l.dy (dy_pre with z), C, dfinal_states and states_t.
void ssd_fused_states(const SsdChunkScanLaunch& l, const FusedStatesBuffers& buf, bool dstates, cudaStream_t stream);

}  // namespace baracuda::kernels::cuda
