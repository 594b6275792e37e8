// Run-time processor features for the CPU kernels' vectorized paths.
#pragma once

namespace baracuda::kernels::cpu {

// True when the processor runs AVX2 and FMA instructions (and the build has the AVX2
// kernels: GCC or Clang on x86-64); the vectorized kernels run only then.
inline bool cpu_has_avx2() {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

}  // namespace baracuda::kernels::cpu
