// AVX2 CPU lerp kernels (all four ops) for the rows layout of float32, float16 and
// bfloat16 data: every input's inner stride is 1 (loaded 8 or 16 elements per step) or
// 0 (one value broadcast along the run), outputs are dense. The formulas are
// lerp_math.h's on at::vec::Vectorized<float> (the same two-branch lerp as torch.lerp,
// chosen per lane). Other layouts and float64 take the scalar kernels of lerp.cpp.
#include "core/lerp_plan.h"
#include "kernels/cpu/loops.h"

#include "kernels/cpu/vec_avx2_begin.h"
#include "kernels/cpu/vec_avx2_util.h"

namespace baracuda::kernels::cpu {

#if BARACUDA_CPU_AVX2
namespace {
using avx2::FVec;

// lerp_value of lerp_math.h, per lane: |w| < 0.5 ? a + w·(b − a) : b − (b − a)·(1 − w).
inline FVec vlerp(FVec a, FVec b, FVec w) {
  const FVec d = b - a;
  const FVec small = (w > FVec(-0.5f)) & (w < FVec(0.5f));
  return FVec::blendv(b - d * (FVec(1.0f) - w), a + w * d, small);
}

template <typename T, LerpOp Op, bool AllUnit>
void run(const LerpLaunch& l) {
  constexpr int NI = kLerpInputs<Op>;
  constexpr int NO = kLerpOutputs<Op>;
  constexpr int L = avx2::kLanes<T>;
  const T* in[NI];
  bool unit[NI];  // inner stride 1 (else 0: broadcast along the run)
  const int last = l.dims.rank - 1;
  for (int k = 0; k < NI; ++k) {
    in[k] = static_cast<const T*>(l.in[k]);
    unit[k] = l.dims.strides[k][last] == 1;
  }
  T* out[NO];
  for (int j = 0; j < NO; ++j) out[j] = static_cast<T*>(l.out[j]);
  const float w_s = static_cast<float>(l.weight);
  const float omw_s = static_cast<float>(l.one_minus_w);
  const bool w_small = w_s > -0.5f && w_s < 0.5f;

  int64_t numel = 1;
  for (int d = 0; d < l.dims.rank; ++d) numel *= l.dims.sizes[d];
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    int64_t o = begin;  // linear index = offset in every output
    for_each_run<NI>(l.dims, begin, end, [&](const int64_t* off, int64_t n) {
      const T* p[NI];
      FVec bcast[NI];
      for (int k = 0; k < NI; ++k) {
        p[k] = in[k] + off[k];
        bcast[k] = FVec(static_cast<float>(p[k][0]));
      }
      avx2::for_steps<T>(n, [&](int64_t i, int64_t count) {
        FVec x[NI][L], y[NO][L];
        for (int k = 0; k < NI; ++k) {
          if (AllUnit || unit[k])
            avx2::load(p[k] + i, count, x[k]);
          else
            for (int j = 0; j < L; ++j) x[k][j] = bcast[k];
        }
        for (int j = 0; j < L; ++j) {
          if constexpr (Op == LerpOp::Forward) {
            const FVec a = x[0][j], b = x[1][j], w(w_s);
            const FVec d = b - a;
            y[0][j] = w_small ? a + w * d : b - d * (FVec(1.0f) - w);
          } else if constexpr (Op == LerpOp::ForwardTensor) {
            y[0][j] = vlerp(x[0][j], x[1][j], x[2][j]);
          } else if constexpr (Op == LerpOp::Backward) {
            y[0][j] = FVec(omw_s) * x[0][j];
            y[1][j] = FVec(w_s) * x[0][j];
          } else {
            const FVec dy = x[0][j], a = x[1][j], b = x[2][j], w = x[3][j];
            y[0][j] = (FVec(1.0f) - w) * dy;
            y[1][j] = w * dy;
            y[2][j] = dy * (b - a);
          }
        }
        for (int q = 0; q < NO; ++q) avx2::store(out[q] + o + i, count, y[q]);
      });
      o += n;
    });
  });
}

// AllUnit: every input is unit-stride along the run (no broadcast operand), the common
// case, compiled without the per-step broadcast choice.
template <typename T, LerpOp Op>
void dispatch_unit(const LerpLaunch& l) {
  bool all_unit = true;
  for (int k = 0; k < kLerpInputs<Op>; ++k) all_unit &= l.dims.strides[k][l.dims.rank - 1] == 1;
  if (all_unit)
    run<T, Op, true>(l);
  else
    run<T, Op, false>(l);
}

template <typename T>
void dispatch_op(const LerpLaunch& l) {
  switch (l.op) {
    case LerpOp::Forward: dispatch_unit<T, LerpOp::Forward>(l); break;
    case LerpOp::ForwardTensor: dispatch_unit<T, LerpOp::ForwardTensor>(l); break;
    case LerpOp::Backward: dispatch_unit<T, LerpOp::Backward>(l); break;
    case LerpOp::BackwardTensor: dispatch_unit<T, LerpOp::BackwardTensor>(l); break;
  }
}
}  // namespace

bool lerp_avx2(const LerpLaunch& l) {
  if (l.layout != LerpLayout::Rows) return false;
  switch (l.element) {
    case ElementKind::F32: dispatch_op<float>(l); return true;
    case ElementKind::F16: dispatch_op<c10::Half>(l); return true;
    case ElementKind::BF16: dispatch_op<c10::BFloat16>(l); return true;
    default: return false;
  }
}
#else
bool lerp_avx2(const LerpLaunch&) { return false; }
#endif

}  // namespace baracuda::kernels::cpu

#include "kernels/cpu/vec_avx2_end.h"
