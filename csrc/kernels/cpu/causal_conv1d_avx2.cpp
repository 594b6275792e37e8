// The CPU causal conv1d's SiLU (forward) and its derivative (backward) on AVX2 registers,
// 16 channels a step (vec_avx2_util.h's steps): causal_conv1d_math.h's formulas, term for
// term, with Sleef's exp (vec_avx2_util.h's sigmoid), where the scalar loop calls std::exp
// per element.
#include "kernels/causal_conv1d.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
bool conv_silu_avx2(float* v, int64_t n) {
  avx2::for_steps<float>(n, [&](int64_t i, int64_t count) {
    avx2::FVec x[2];
    avx2::load(v + i, count, x);
    for (int k = 0; k < 2; ++k) x[k] = x[k] * avx2::sigmoid(x[k]);
    avx2::store(v + i, count, x);
  });
  return true;
}

bool conv_silu_grad_avx2(const float* pre, float* g, int64_t n) {
  avx2::for_steps<float>(n, [&](int64_t i, int64_t count) {
    avx2::FVec x[2], gv[2];
    avx2::load(pre + i, count, x);
    avx2::load(g + i, count, gv);
    for (int k = 0; k < 2; ++k) gv[k] = gv[k] * avx2::silu_grad(x[k], avx2::sigmoid(x[k]));
    avx2::store(g + i, count, gv);
  });
  return true;
}
#else
bool conv_silu_avx2(float*, int64_t) { return false; }
bool conv_silu_grad_avx2(const float*, float*, int64_t) { return false; }
#endif

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
