// Loads and stores between memory of a floating type T and float32 Vectorized registers,
// for the AVX2 sections of the CPU kernels (include after vec_avx2_begin.h). Every type
// moves 16 elements per step as two float32 registers of 8 lanes (float16/bfloat16
// converted in registers, as ATen's reduced-precision kernels do): two independent
// registers per step keep more loads in flight than one.
#pragma once

#if BARACUDA_CPU_AVX2
#include <algorithm>
#include <type_traits>

namespace baracuda::kernels::cpu::avx2 {

using FVec = at::vec::Vectorized<float>;

// float32 registers per step, and elements per step.
template <typename T>
constexpr int kLanes = 2;
template <typename T>
constexpr int64_t kStep = kLanes<T> * FVec::size();

// Loads `count` (<= kStep<T>) elements from p into kLanes<T> registers; lanes past count
// are zero.
template <typename T>
inline void load(const T* p, int64_t count, FVec* out) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t W = FVec::size();
    if (count == 2 * W) {
      out[0] = FVec::loadu(p);
      out[1] = FVec::loadu(p + W);
    } else {
      out[0] = count >= W ? FVec::loadu(p) : FVec::loadu(p, count);
      out[1] = count > W ? FVec::loadu(p + W, count - W) : FVec(0.0f);
    }
  } else {
    using TVec = at::vec::Vectorized<T>;
    const TVec t = count == TVec::size() ? TVec::loadu(p) : TVec::loadu(p, count);
    std::tie(out[0], out[1]) = at::vec::convert_to_float<T>(t);
  }
}

// Stores the first `count` (<= kStep<T>) elements of kLanes<T> registers to p, rounding
// to T (round to nearest even).
template <typename T>
inline void store(T* p, int64_t count, const FVec* in) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t W = FVec::size();
    if (count == 2 * W) {
      in[0].store(p);
      in[1].store(p + W);
    } else {
      in[0].store(p, std::min<int64_t>(count, W));
      if (count > W) in[1].store(p + W, count - W);
    }
  } else {
    const auto t = at::vec::convert_from_float<T>(in[0], in[1]);
    if (count == decltype(t)::size())
      t.store(p);
    else
      t.store(p, count);
  }
}

// The logistic sigmoid, silu'(b) from s = sigmoid(b), and SwiGLU's a·silu(b) with its
// gradients (da, db) from dy: gated_activation_math.h's formulas, term for term, on
// registers (exp is Sleef's, 1 ulp).
inline FVec sigmoid(FVec b) { return FVec(1.0f) / (FVec(1.0f) + b.neg().exp()); }
inline FVec silu_grad(FVec b, FVec s) { return s * (FVec(1.0f) + b * (FVec(1.0f) - s)); }
inline FVec swiglu(FVec a, FVec b) { return a * (b * sigmoid(b)); }
inline void swiglu_backward(FVec dy, FVec a, FVec b, FVec& da, FVec& db) {
  const FVec s = sigmoid(b);
  da = dy * (b * s);
  db = dy * a * silu_grad(b, s);
}

// Calls body(i, count) for i = 0, kStep, 2·kStep, ... < n, with count = kStep except for
// a shorter last step.
template <typename T, typename Body>
inline void for_steps(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + kStep<T> <= n; i += kStep<T>) body(i, kStep<T>);
  if (i < n) body(i, n - i);
}

}  // namespace baracuda::kernels::cpu::avx2
#endif
