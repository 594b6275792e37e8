// Side streams: see side_stream.cuh.
#include "kernels/cuda/side_stream.cuh"

#include <string>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace baracuda::kernels::cuda {
namespace {

struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, "side_stream", std::string(what) + ": " + cudaGetErrorString(err));
}

SideStream& side(int k) {
  // [device][k], this thread's; never destroyed (a thread's few streams and events live as
  // long as it does, as torch's own stream pool lives as long as the process)
  thread_local std::vector<SideStream> sides;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  if (sides.size() <= static_cast<size_t>(dev) * kSideStreams + k)
    sides.resize((static_cast<size_t>(dev) + 1) * kSideStreams);
  SideStream& s = sides[static_cast<size_t>(dev) * kSideStreams + k];
  if (s.stream == nullptr) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    SideStream made;
    const cudaError_t e1 = cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking);
    const cudaError_t e2 = cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming);
    const cudaError_t e3 = cudaEventCreateWithFlags(&made.join, cudaEventDisableTiming);
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    check(e1, "cudaStreamCreateWithFlags");
    check(e2, "cudaEventCreateWithFlags");
    check(e3, "cudaEventCreateWithFlags");
    s = made;
  }
  return s;
}

}  // namespace

cudaStream_t side_stream_fork(cudaStream_t from, int k) {
  SideStream& s = side(k);
  check(cudaEventRecord(s.fork, from), "cudaEventRecord");
  check(cudaStreamWaitEvent(s.stream, s.fork, 0), "cudaStreamWaitEvent");
  return s.stream;
}

void side_stream_join(cudaStream_t to, int k) {
  SideStream& s = side(k);
  check(cudaEventRecord(s.join, s.stream), "cudaEventRecord");
  check(cudaStreamWaitEvent(to, s.join, 0), "cudaStreamWaitEvent");
}

}  // namespace baracuda::kernels::cuda
