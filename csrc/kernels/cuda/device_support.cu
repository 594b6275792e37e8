// Whether this build's kernels can run on a device: the fat binary holds code for a
// fixed list of architectures (TORCH_CUDA_ARCH_LIST at build time), and a device outside
// it would otherwise fail deep inside a launch with "no kernel image is available".
#include <cuda_runtime.h>

#include <atomic>

#include "kernels/common.h"

namespace baracuda::kernels {
namespace {
// Compiled into every architecture of the build, like every other kernel here; asking the
// runtime for its attributes tells whether an image (SASS or JIT-able PTX) fits the device.
__global__ void probe_kernel() {}

#define BARACUDA_STR2(...) #__VA_ARGS__
#define BARACUDA_STR(...) BARACUDA_STR2(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
constexpr const char* kArchList = BARACUDA_STR(__CUDA_ARCH_LIST__);
#else
constexpr const char* kArchList = "unknown";
#endif

constexpr int kMaxDevices = 64;
// 0: not asked yet, 1: runs, 2: no image. Racing first calls ask twice; same answer.
std::atomic<int> g_runs[kMaxDevices];
}  // namespace

bool cuda_kernels_run_on(int device) {
  if (device < 0 || device >= kMaxDevices) return true;  // not cached; the launch decides
  int state = g_runs[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaFuncAttributes attr;
    const cudaError_t err = cudaFuncGetAttributes(&attr, probe_kernel);
    if (err != cudaSuccess) cudaGetLastError();  // not sticky: clear it for the caller
    cudaSetDevice(previous);
    state = (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction)
                ? 2
                : 1;
    g_runs[device].store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

const char* cuda_arch_list() { return kArchList; }

bool cuda_arch_specific_kernels(int arch) {
#ifdef BARACUDA_SM90A
  return arch == 90;
#else
  (void)arch;
  return false;
#endif
}

}  // namespace baracuda::kernels
