// AVX2 row kernel of the CPU RoPE ops (rope_rows.h): rows of unit feature stride, float32
// or float16/bfloat16 converted to float32 in registers, 8 or 16 features per step with
// the coefficients of rope_rows.h (y = A⊙x + B⊙partner(x), one multiply and one fused
// multiply-add per float32 vector). Interleaved rows swap adjacent lanes in registers;
// half-split rows load the two halves side by side. Pass-through features are copied.
#include <cstring>

#include "kernels/common.h"
#include "kernels/cpu/rope_rows.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
template <typename T>
void rope_rows_avx2(int64_t n, const T* x, int64_t x_step, T* y, int64_t y_step,
                    const float* A, const float* B, int64_t ab_step, int64_t R, int64_t D,
                    bool interleaved) {
  using avx2::FVec;
  constexpr int L = avx2::kLanes<T>;
  constexpr int W = FVec::size();
  const int64_t half = R / 2;
  for (int64_t k = 0; k < n; ++k, x += x_step, y += y_step, A += ab_step, B += ab_step) {
    if (interleaved) {
      avx2::for_steps<T>(R, [&](int64_t i, int64_t count) {
        FVec v[L], out[L];
        avx2::load(x + i, count, v);
        for (int j = 0; j < L; ++j) {
          const FVec swapped(_mm256_permute_ps(v[j], 0xB1));  // (x1, x0, x3, x2, ...)
          out[j] = at::vec::fmadd(FVec::loadu(A + i + j * W), v[j],
                                  FVec::loadu(B + i + j * W) * swapped);
        }
        avx2::store(y + i, count, out);
      });
    } else {
      avx2::for_steps<T>(half, [&](int64_t i, int64_t count) {
        FVec u[L], v[L], yu[L], yv[L];
        avx2::load(x + i, count, u);
        avx2::load(x + half + i, count, v);
        for (int j = 0; j < L; ++j) {
          const int64_t fu = i + j * W, fv = half + fu;
          yu[j] = at::vec::fmadd(FVec::loadu(A + fu), u[j], FVec::loadu(B + fu) * v[j]);
          yv[j] = at::vec::fmadd(FVec::loadu(A + fv), v[j], FVec::loadu(B + fv) * u[j]);
        }
        avx2::store(y + i, count, yu);
        avx2::store(y + half + i, count, yv);
      });
    }
    if (D > R) std::memcpy(y + R, x + R, static_cast<size_t>(D - R) * sizeof(T));
  }
}
#else
template <typename T>
void rope_rows_avx2(int64_t, const T*, int64_t, T*, int64_t, const float*, const float*,
                    int64_t, int64_t, int64_t, bool) {
  fail(PlanErrorKind::Internal, "rope", "this build has no AVX2 kernels");
}
#endif

#define BARACUDA_ROPE_ROWS_AVX2(T)                                                            \
  template void rope_rows_avx2<T>(int64_t, const T*, int64_t, T*, int64_t, const float*,      \
                                  const float*, int64_t, int64_t, int64_t, bool);
BARACUDA_ROPE_ROWS_AVX2(float)
BARACUDA_ROPE_ROWS_AVX2(c10::Half)
BARACUDA_ROPE_ROWS_AVX2(c10::BFloat16)
#undef BARACUDA_ROPE_ROWS_AVX2

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
