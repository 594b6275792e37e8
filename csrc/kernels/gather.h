// Launchers for the gather kernels (CPU and CUDA), and the CUDA index-error record. They
// trust the launch description the plan filled in; validation lives in
// core/gather_plan.cpp.
#pragma once

#include <cstdint>

#include "core/gather_plan.h"

namespace baracuda::kernels {

// Throws IndexError (PlanError IndexOutOfRange) at the first out-of-range index it meets.
void gather_cpu(const GatherLaunch& launch);

// Which op recorded an index error.
enum class GatherErrorOp : int { Gather = 0, GatherBackward = 1 };

// The first out-of-range index a CUDA gather kernel met on one device. Lives in pinned,
// device-mapped host memory (one per device, allocated on first use), so the host reads
// it without synchronizing; it sees a record once the kernel that wrote it has written
// it. Kernels claim it with atomicCAS on `claimed` (the first error wins), write the
// fields, then set `ready`; the host reads the fields only after seeing `ready`.
struct GatherErrorRecord {
  int claimed;
  int ready;
  int op;
  int dim;
  long long value;
  long long size;
};

struct GatherIndexError {
  GatherErrorOp op = GatherErrorOp::Gather;
  int dim = 0;
  int64_t value = 0;
  int64_t size = 0;
};

#ifdef BARACUDA_WITH_CUDA
// Enqueues on `stream` (a cudaStream_t); throws PlanError(Internal) on a launch error.
void gather_cuda(const GatherLaunch& launch, void* stream);

// CUB's temp-storage bytes for sorting n (key, value) pairs of 4 (or 8, index64) bytes on
// bits [0, end_bit) on the current device. Host-only: no device work, no allocation.
size_t gather_sort_temp_bytes(int64_t n, int end_bit, bool index64);

// The record of `device` as the kernels see it (device pointer); allocated on first use.
GatherErrorRecord* gather_error_record(int device);

// If a kernel on `device` recorded an error, copies it to *error, clears the record and
// returns true. Does not synchronize. False if nothing (or nothing yet) was recorded.
bool gather_take_index_error(int device, GatherIndexError* error);
#endif

}  // namespace baracuda::kernels
