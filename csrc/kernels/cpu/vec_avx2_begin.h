// Opens an AVX2+FMA section of a CPU kernel file (close it with vec_avx2_end.h) in which
// at::vec::Vectorized is ATen's AVX2 implementation (8 float lanes, Sleef exp, ATen's
// erf), whatever the extension's own compile flags say.
//
// How: the headers that ATen's vector headers need are included first, compiled for the
// baseline ISA like the rest of the extension; then `#pragma GCC target` turns on AVX2,
// FMA and F16C for what follows, and CPU_CAPABILITY=AVX2 selects ATen's AVX2 classes,
// which live in their own inline namespace (at::vec::AVX2), so they cannot collide with
// baseline copies elsewhere. Only code in the section (the kernel file's own functions
// and ATen's vector classes) is compiled for AVX2, and the kernels call it only when
// cpu_has_avx2() says the processor has AVX2 and FMA.
//
// Include this once, after every other header of the file. BARACUDA_CPU_AVX2 is 1 when
// the section is compiled (GCC or Clang on x86-64), 0 otherwise.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>

#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Load.h>
#include <c10/util/MathConstants.h>
#include <c10/util/copysign.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(CPU_CAPABILITY)
#define BARACUDA_CPU_AVX2 1
#include <mm_malloc.h>
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC diagnostic push
// Every function that passes a 256-bit vector is inside the section (same ABI).
#pragma GCC diagnostic ignored "-Wpsabi"
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
// The pragma does not define the ISA macros that sleef.h tests to declare its 8-lane
// functions (the AVX2 entry points libtorch exports); the section targets these ISAs.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#else
#define BARACUDA_CPU_AVX2 0
#endif
