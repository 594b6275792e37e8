// A second (and third) CUDA stream beside the caller's, for kernels of one op that do not
// depend on each other and leave each other room: the SSD backward runs its dCB kernel
// beside the state kernels, and with seq_idx each SEG launch beside its plain one
// (SsdChunkScanLaunch::side_stream). The op stays ordered on the caller's stream: a fork
// makes the side stream wait for everything the caller's stream holds so far, and a join
// makes the caller's stream wait for everything given to the side stream since, before
// anything else of the op (or after it) runs there. Outputs and workspace written on the
// side stream are therefore done before the caller's stream reads or frees them.
//
// Each host thread has its own side streams and events per device (created on first use,
// kept for the thread's life): two threads never order each other's work, and a thread
// that captures a CUDA graph (the fork and join are events, which capture follows) never
// draws another thread's launches into it. The streams are created with the capture mode
// relaxed, so a first use inside a capture is allowed. They have the default priority,
// whatever the caller's stream's (a high-priority caller's op runs partly at the default).
#pragma once

#include <cuda_runtime.h>

namespace baracuda::kernels::cuda {

constexpr int kSideStreams = 2;

// Side stream k (0 <= k < kSideStreams) of this thread on the current device, after it
// has been made to wait for the work so far on `from`.
cudaStream_t side_stream_fork(cudaStream_t from, int k);

// Makes `to` wait for the work so far on side stream k of this thread (current device).
void side_stream_join(cudaStream_t to, int k);

}  // namespace baracuda::kernels::cuda
