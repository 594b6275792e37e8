// The per-device index-error record of the CUDA gather kernels (kernels/gather.h): pinned,
// device-mapped host memory, so kernels write it and the host reads it without a copy or
// a synchronization. Allocated once per device on first use, never freed (a few bytes
// per device for the life of the process).
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/gather.h"

namespace baracuda::kernels {

namespace {
constexpr int kMaxDevices = 256;
std::array<std::atomic<GatherErrorRecord*>, kMaxDevices> g_host{};    // host view
std::array<std::atomic<GatherErrorRecord*>, kMaxDevices> g_device{};  // device view
std::mutex g_alloc_mutex;

void check_device(int device) {
  if (device < 0 || device >= kMaxDevices)
    fail(PlanErrorKind::Internal, "gather",
         "CUDA device index " + std::to_string(device) + " is out of the supported range");
}
}  // namespace

GatherErrorRecord* gather_error_record(int device) {
  check_device(device);
  if (GatherErrorRecord* d = g_device[device].load(std::memory_order_acquire)) return d;
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  if (GatherErrorRecord* d = g_device[device].load(std::memory_order_acquire)) return d;

  // cudaHostAlloc is refused while this thread captures a CUDA graph in the default
  // (global) mode; a one-time allocation is safe to allow there.
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&capture_mode);
  int previous = -1;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess && previous != device) err = cudaSetDevice(device);
  void* host = nullptr;
  void* dev = nullptr;
  if (err == cudaSuccess) err = cudaHostAlloc(&host, sizeof(GatherErrorRecord), cudaHostAllocMapped);
  if (err == cudaSuccess) {
    std::memset(host, 0, sizeof(GatherErrorRecord));
    err = cudaHostGetDevicePointer(&dev, host, 0);
  }
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
  cudaThreadExchangeStreamCaptureMode(&capture_mode);
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, "gather",
         std::string("could not allocate the index-error record: ") + cudaGetErrorString(err));
  g_host[device].store(static_cast<GatherErrorRecord*>(host), std::memory_order_release);
  g_device[device].store(static_cast<GatherErrorRecord*>(dev), std::memory_order_release);
  return static_cast<GatherErrorRecord*>(dev);
}

bool gather_take_index_error(int device, GatherIndexError* error) {
  check_device(device);
  GatherErrorRecord* r = g_host[device].load(std::memory_order_acquire);
  if (r == nullptr) return false;  // no gather kernel ever ran on this device
  volatile GatherErrorRecord* vr = r;
  if (vr->ready == 0) return false;
  std::atomic_thread_fence(std::memory_order_acquire);  // fields after `ready`
  error->op = static_cast<GatherErrorOp>(vr->op);
  error->dim = vr->dim;
  error->value = vr->value;
  error->size = vr->size;
  vr->ready = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  vr->claimed = 0;  // the next bad index may claim the record again
  return true;
}

}  // namespace baracuda::kernels
