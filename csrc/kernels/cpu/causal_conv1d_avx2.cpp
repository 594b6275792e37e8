// The CPU causal conv1d's SiLU (forward) and its derivative (backward) on AVX2 registers,
// 8 channels a step: causal_conv1d_math.h's formulas, term for term, with Sleef's exp
// (vec_avx2_util.h's sigmoid), where the scalar loop calls std::exp per element.
#include "kernels/causal_conv1d.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
namespace {
using avx2::FVec;

// f(i, count) for i = 0, 8, 16, ... < n (count = 8 but for a shorter last step).
template <typename F>
inline void for_lanes(int64_t n, F&& f) {
  constexpr int64_t W = FVec::size();
  int64_t i = 0;
  for (; i + W <= n; i += W) f(i, W);
  if (i < n) f(i, n - i);
}

inline FVec load(const float* p, int64_t count) {
  return count == FVec::size() ? FVec::loadu(p) : FVec::loadu(p, count);
}

inline void store(float* p, int64_t count, FVec v) {
  if (count == FVec::size())
    v.store(p);
  else
    v.store(p, count);
}
}  // namespace

bool conv_silu_avx2(float* v, int64_t n) {
  for_lanes(n, [&](int64_t i, int64_t count) {
    const FVec x = load(v + i, count);
    store(v + i, count, x * avx2::sigmoid(x));
  });
  return true;
}

bool conv_silu_grad_avx2(const float* pre, float* g, int64_t n) {
  for_lanes(n, [&](int64_t i, int64_t count) {
    const FVec x = load(pre + i, count), s = avx2::sigmoid(x), one(1.0f);
    store(g + i, count, load(g + i, count) * (s * (one + x * (one - s))));
  });
  return true;
}
#else
bool conv_silu_avx2(float*, int64_t) { return false; }
bool conv_silu_grad_avx2(const float*, float*, int64_t) { return false; }
#endif

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
