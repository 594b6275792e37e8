// The selective state update's scalar formulas (core/selective_state_update_plan.h), once
// for the CPU and CUDA kernels. Acc is float (double when x is float64); the accurate
// library exp everywhere (the state update is memory-bound).
#pragma once

#include "core/selective_state_update_plan.h"
#include "kernels/common.h"
#include "kernels/gated_activation_math.h"

namespace baracuda::kernels {

BARACUDA_HD float math_log1p(float v) { return log1pf(v); }
BARACUDA_HD double math_log1p(double v) { return log1p(v); }

// δ = dt + dt_bias, then softplus where δ ≤ 20 (mamba_ssm's threshold; NaN passes through).
template <typename Acc>
BARACUDA_HD Acc state_update_delta(Acc dt, bool softplus) {
  return softplus && dt <= Acc(20) ? math_log1p(math_exp(dt)) : dt;
}

// The output's gate: y · z·σ(z).
template <typename Acc>
BARACUDA_HD Acc state_update_gate(Acc y, Acc z) {
  return y * (z * sigmoid<false>(z));
}

}  // namespace baracuda::kernels
