// Device helpers shared by the CUDA kernels: element types and conversions, 16-byte
// vector access, fast 32-bit division, launch checking.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "core/plan.h"

namespace baracuda::kernels::cuda {

// float for float32/float16/bfloat16, double for float64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return v;
}

// Calls f(tag) with the device type of a floating ElementKind.
template <typename F>
void dispatch_floating(ElementKind e, F&& f) {
  switch (e) {
    case ElementKind::F32: f(float{}); return;
    case ElementKind::F64: f(double{}); return;
    case ElementKind::F16: f(__half{}); return;
    case ElementKind::BF16: f(__nv_bfloat16{}); return;
    default: fail(PlanErrorKind::Internal, "cuda", "non-floating element reached a kernel");
  }
}

// Calls f(tag) with the device type of a 16-bit floating ElementKind (the tensor-core
// kernels' inputs); any other kind is an internal error of `op`'s plan.
template <typename F>
void dispatch_half(ElementKind e, const char* op, F&& f) {
  switch (e) {
    case ElementKind::F16: f(__half{}); return;
    case ElementKind::BF16: f(__nv_bfloat16{}); return;
    default: fail(PlanErrorKind::Internal, op, "a 16-bit kernel was planned for another element type");
  }
}

// V consecutive elements; 16 bytes on the vector path.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Read-only load of V elements; one 16-byte transaction when sizeof(T) * V == 16.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  Pack<T, V> out;
  if constexpr (sizeof(T) * V == 16) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    memcpy(&out, &raw, 16);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = p[i];
  }
  return out;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
  if constexpr (sizeof(T) * V == 16) {
    uint4 raw;
    memcpy(&raw, &v, 16);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = v.v[i];
  }
}

// n / d and n % d for 0 <= n < 2^31 with a multiply-shift instead of a divide
// (Granlund–Montgomery; d fixed per launch).
struct FastDivmod {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    if (d == 1) return;
    uint32_t l = 0;
    while ((1ull << l) < d) ++l;  // ceil(log2(d))
    const uint64_t p = 31 + l;
    mul = static_cast<uint32_t>(((1ull << p) + d - 1) / d);
    shift = static_cast<uint32_t>(p - 32);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return d == 1 ? n : (__umulhi(n, mul) >> shift);
  }
};

// One step of splitting a row-major linear index into coordinates, innermost dim first:
// returns rest's coordinate along a dim of `size` and leaves rest / size in `rest`.
// 32-bit indices divide with `div` (a FastDivmod of size), 64-bit ones with `/`.
template <typename Idx>
__device__ __forceinline__ Idx peel_coord(Idx& rest, const FastDivmod& div, Idx size) {
  Idx q;
  if constexpr (sizeof(Idx) == 4)
    q = div.div(rest);
  else
    q = rest / size;
  const Idx c = rest - q * size;
  rest = q;
  return c;
}

// cp.async (sm_80+; the plans choose no kernel that uses it on older devices): 16 bytes
// from global to shared memory without a register round trip, both addresses 16-byte
// aligned, through L2 only (.cg). A copy belongs to the thread's next committed group and
// is complete, for this thread, once cp_async_wait<N> leaves at most N of its groups in
// flight (a barrier then makes it visible to the block). (The SSD kernels have their own
// in ssd_chunk_scan_mma.cuh, a header that a host emulation can replace.)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  (void)smem, (void)gmem;
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Throws PlanError(Internal) naming the op if the last launch failed.
inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    fail(PlanErrorKind::Internal, op, std::string("CUDA launch failed: ") + cudaGetErrorString(err));
}

// Lets `kernel` use `bytes` of dynamic shared memory. Without the opt-in a block gets 48 KB
// of static and dynamic shared memory together; the kernels' static arrays stay below 16 KB
// (the SSD's dCB pass has 5 KB), so past 32 KB of dynamic memory the opt-in is set (a 45 KB
// dCB pass at head_dim 72 failed its launch with "invalid argument" before). Raises naming
// `op` if the device refuses.
template <typename K>
void allow_dynamic_smem(K kernel, int64_t bytes, const char* op) {
  if (bytes > 32 * 1024 && cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)) != cudaSuccess)
    check_launch(op);
}

// Hopper's programmatic dependent launch (sm_90): grid_dependents_may_start in a kernel
// lets the stream's next kernel, launched by launch_programmatic, start once every block
// of this one has executed it (or exited); grid_dependency_wait in that next kernel waits
// until the kernel before it has completed and its writes are visible. Both are no-ops in
// a kernel launched as any other, and compile to nothing below sm_90: only a plan that
// knows the device runs the build's sm_90 code may launch programmatically.
__device__ __forceinline__ void grid_dependents_may_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches kernel<<<blocks, threads, smem, stream>>>(args...) as a programmatic dependent
// of the stream's previous kernel (graph-capturable). A failure is left for the caller's
// check_launch, as a failed <<<>>> launch is.
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), unsigned int blocks, unsigned int threads, int64_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

inline unsigned int blocks_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned int>((work + per_block - 1) / per_block);
}

}  // namespace baracuda::kernels::cuda
