// The lerp formulas, once, for the CPU and CUDA kernels. `Acc` is float for
// float32/float16/bfloat16 data and double for float64.
#pragma once

#include "core/lerp_plan.h"
#include "kernels/common.h"

namespace baracuda::kernels {

// torch.lerp's two-branch form: exact at both ends (w = 0 gives a, w = 1 gives b) and
// without the cancellation of a + w·(b − a) for w near 1:
//   |w| < 0.5 ? a + w·(b − a) : b − (b − a)·(1 − w)
// A NaN weight takes the second branch and gives NaN, as in PyTorch.
template <typename Acc>
BARACUDA_HD Acc lerp_value(Acc a, Acc b, Acc w) {
  return (w > Acc(-0.5) && w < Acc(0.5)) ? a + w * (b - a) : b - (b - a) * (Acc(1) - w);
}

// Scalars of one launch in the math type: the scalar weight w and 1 − w (computed in
// float64 on the host, then rounded once, as torch's lerp backward does).
template <typename Acc>
struct LerpScalars {
  Acc w, one_minus_w;
};

// One element of op `Op`: `in` holds the inputs in LerpOp's order, `out` receives the
// outputs (see LerpOp):
//   Forward         y  = lerp(a, b, w)
//   ForwardTensor   y  = lerp(a, b, w[i])
//   Backward        da = (1 − w)·dy,    db = w·dy
//   BackwardTensor  da = (1 − w[i])·dy, db = w[i]·dy, dw = dy·(b − a)
template <LerpOp Op, typename Acc>
BARACUDA_HD void lerp_element(const Acc* in, const LerpScalars<Acc>& s, Acc* out) {
  if constexpr (Op == LerpOp::Forward) {
    out[0] = lerp_value(in[0], in[1], s.w);
  } else if constexpr (Op == LerpOp::ForwardTensor) {
    out[0] = lerp_value(in[0], in[1], in[2]);
  } else if constexpr (Op == LerpOp::Backward) {
    out[0] = s.one_minus_w * in[0];
    out[1] = s.w * in[0];
  } else {
    const Acc dy = in[0], a = in[1], b = in[2], w = in[3];
    out[0] = (Acc(1) - w) * dy;
    out[1] = w * dy;
    out[2] = dy * (b - a);
  }
}

}  // namespace baracuda::kernels
