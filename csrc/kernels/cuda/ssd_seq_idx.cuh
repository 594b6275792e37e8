// seq_idx (packed sequences) in the SSD's CUDA kernels: the staged cumsum
// (ssd_chunk_scan.cuh) and the fused forwards (ssd_fused_common.cuh) read sequence starts
// the same way.
#pragma once

#include <cstdint>

namespace baracuda::kernels::cuda {

// Whether a packed sequence starts at position t > 0 of batch row b: seq_idx [B, L] (int32,
// or int64 where `i64`; strides s[0], s[1] in elements) changes from t − 1 to t.
__device__ __forceinline__ int seq_starts_at(const void* seq, bool i64, const int64_t* s, int64_t b, int64_t t) {
  const int64_t at = b * s[0] + t * s[1];
  if (i64) {
    const int64_t* q = static_cast<const int64_t*>(seq);
    return q[at] != q[at - s[1]];
  }
  const int32_t* q = static_cast<const int32_t*>(seq);
  return q[at] != q[at - s[1]];
}

}  // namespace baracuda::kernels::cuda
