// Small helpers shared by the CPU (.cpp) and CUDA (.cu) kernels.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define BARACUDA_HD __host__ __device__ __forceinline__
#else
#define BARACUDA_HD inline
#endif

namespace baracuda::kernels {

// Math in the accumulation type: float for float32/float16/bfloat16, double for float64.
BARACUDA_HD float math_exp(float v) { return expf(v); }
BARACUDA_HD double math_exp(double v) { return exp(v); }
BARACUDA_HD float math_erf(float v) { return erff(v); }
BARACUDA_HD double math_erf(double v) { return erf(v); }
BARACUDA_HD float math_erfc(float v) { return erfcf(v); }
BARACUDA_HD double math_erfc(double v) { return erfc(v); }

#ifdef BARACUDA_WITH_CUDA
// Host functions (cuda/device_support.cu): whether this build holds code that runs on
// CUDA device `device` (cached per device, no synchronization), and the architectures it
// was compiled for, as nvcc lists them ("800,860,...").
bool cuda_kernels_run_on(int device);
const char* cuda_arch_list();
// Whether the build holds the architecture-specific code of compute capability `arch`
// (sm_90a for 90, from TORCH_CUDA_ARCH_LIST's "9.0a": setup.py defines BARACUDA_SM90A).
bool cuda_arch_specific_kernels(int arch);
#endif

}  // namespace baracuda::kernels
