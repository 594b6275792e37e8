// The causal conv1d's decoding step: a few new time steps through the depthwise conv,
// continuing from a rolling conv state that is updated in place (the causal-conv1d
// package's causal_conv1d_update).
//
// x [B, D] or [B, D, L] (L new steps), conv_state [S, D, M] with M >= W − 1 (S: the state
// pool; = B without conv_state_indices), weight [D, W] (tap W − 1 on the current step),
// bias [D], cache_seqlens [B], conv_state_indices [B]. Per batch row b and channel d, with
// st = conv_state[i, d, :] (i = conv_state_indices[b], or b):
//   without cache_seqlens (a shift register):
//     x̃       = [st[M − (W−1)], .., st[M − 1], x[0], .., x[L − 1]]    (the window, then x)
//     st      ← the last M values of [st, x]                          (shifted by L)
//   with cache_seqlens (a circular buffer; c = cache_seqlens[b] mod M, floor-mod):
//     x̃       = [st[(c − (W−1)) mod M], .., st[(c − 1) mod M], x[0], .., x[L − 1]]
//     st[(c + t) mod M] ← x[t] for t = 0 .. L − 1 in order (a later step wins)
//   out[b, d, t] = act(bias[d] + Σ_{k<W} weight[d, k] · x̃[t + k])
// act is SiLU or the identity. An index i < 0 is a padding row (causal-conv1d's rule):
// out[b] = 0 and the pool is not touched. An index i ≥ S: the CPU kernel raises IndexError
// before it writes anything; a CUDA kernel writes NaN to out[b] and leaves the pool alone.
// The sums run in float32 (float64 for float64 x), taps in order after the bias, one
// rounding to x's dtype; the state holds x's values unchanged (x's dtype).
#pragma once

#include <optional>
#include <string>

#include "core/plan.h"

namespace baracuda {

// CUDA: threads a block (one channel a thread) and the widths the kernel's register
// window holds.
constexpr int kConvUpdateThreads = 128;
constexpr int kConvUpdateMaxCudaWidth = 8;

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// Strides in elements: x and out [b, d, t] (t stride 0 for a 2-d x), conv_state [i, d, j].
struct ConvUpdateLaunch {
  ElementKind element = ElementKind::F32;         // x, out, conv_state
  ElementKind weight_element = ElementKind::F32;  // weight, bias
  ElementKind seqlens_element = ElementKind::I32, index_element = ElementKind::I32;
  bool silu = false, has_bias = false, has_cache_seqlens = false, has_indices = false;
  int64_t batch = 0, dim = 0, seqlen = 0, state_len = 0, pool = 0;
  int width = 0;
  int64_t x_s[3] = {}, out_s[3] = {}, state_s[3] = {};
  int64_t w_stride_d = 0, w_stride_k = 0, bias_stride = 0, seqlens_stride = 0, index_stride = 0;
  int64_t dim_blocks = 0, grid = 0;  // CUDA: ceil(D / kConvUpdateThreads) per batch row

  const void* x = nullptr;
  void* conv_state = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* cache_seqlens = nullptr;
  const void* indices = nullptr;
  void* out = nullptr;
};

template <class Int>
using ConvUpdateOperand = ProblemOperand<Int>;

// The problem checks shared by the plan and the meta kernel, in this order: x (floating,
// 2-d or 3-d), conv_state (x's dtype, [S, D, M], M >= W − 1), weight (x's dtype or
// float32, [D, W], W >= 1), bias (weight's dtype, [D]), cache_seqlens and
// conv_state_indices (int32/int64, [B]; without indices S == B).
template <class Int>
void check_conv_update_problem(const std::string& op, const ConvUpdateOperand<Int>& x,
                               const ConvUpdateOperand<Int>& state,
                               const ConvUpdateOperand<Int>& weight,
                               const ConvUpdateOperand<Int>& bias,
                               const ConvUpdateOperand<Int>& seqlens,
                               const ConvUpdateOperand<Int>& indices) {
  if (!is_floating(x.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("x must be float32, float16, bfloat16 or float64, got ") + element_name(x.dtype));
  if (x.rank != 2 && x.rank != 3)
    fail(PlanErrorKind::InvalidProblem, op,
         "x must be 2-d [batch, dim] or 3-d [batch, dim, seqlen], got " + sizes_str(x.sizes, x.rank));
  const Int &B = x.sizes[0], &D = x.sizes[1];
  if (state.dtype != x.dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("conv_state must have x's dtype ") + element_name(x.dtype) + ", got " +
             element_name(state.dtype));
  if (state.rank != 3 || !(state.sizes[1] == D))
    fail(PlanErrorKind::InvalidProblem, op,
         "conv_state must have shape [batch, dim, state_len] with dim = x.size(1) = " + size_str(D) +
             ", got " + sizes_str(state.sizes, state.rank));
  if (weight.dtype != x.dtype && weight.dtype != ElementKind::F32)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("weight must have x's dtype ") + element_name(x.dtype) +
             (x.dtype == ElementKind::F32 ? "" : " or float32") + ", got " + element_name(weight.dtype));
  if (weight.rank != 2 || !(weight.sizes[0] == D))
    fail(PlanErrorKind::InvalidProblem, op,
         "weight must have shape [dim, width] with dim = x.size(1) = " + size_str(D) + ", got " +
             sizes_str(weight.sizes, weight.rank));
  const Int& W = weight.sizes[1];
  if (W < 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "weight's width (weight.size(1)) must be at least 1, got " + size_str(W));
  if (state.sizes[2] < W - 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "conv_state's state_len (conv_state.size(2)) must be at least width - 1 = " + size_str(W - 1) +
             ", got " + size_str(state.sizes[2]));
  if (bias.present) {
    if (bias.dtype != weight.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("bias must have weight's dtype ") + element_name(weight.dtype) + ", got " +
               element_name(bias.dtype));
    if (bias.rank != 1 || !(bias.sizes[0] == D))
      fail(PlanErrorKind::InvalidProblem, op,
           "bias must have shape [dim] = [" + size_str(D) + "], got " + sizes_str(bias.sizes, bias.rank));
  }
  const auto check_rows = [&](const ConvUpdateOperand<Int>& t, const char* what) {
    if (!t.present) return;
    if (t.dtype != ElementKind::I32 && t.dtype != ElementKind::I64)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string(what) + " must be int32 or int64, got " + element_name(t.dtype));
    if (t.rank != 1 || !(t.sizes[0] == B))
      fail(PlanErrorKind::InvalidProblem, op,
           std::string(what) + " must have shape [batch] = [" + size_str(B) + "], got " +
               sizes_str(t.sizes, t.rank));
  };
  check_rows(seqlens, "cache_seqlens");
  check_rows(indices, "conv_state_indices");
  if (!indices.present && !(state.sizes[0] == B))
    fail(PlanErrorKind::InvalidProblem, op,
         "conv_state.size(0) must be x's batch " + size_str(B) + " without conv_state_indices, got " +
             size_str(state.sizes[0]));
}

struct ConvUpdateDescriptor {
  TensorLayout x, conv_state, weight;
  bool has_bias = false, has_cache_seqlens = false, has_indices = false;
  TensorLayout bias, cache_seqlens, indices;
  bool silu = false;
  DeviceInfo device;
};

struct ConvUpdateArgs {
  TensorRef x;
  MutTensorRef conv_state;
  TensorRef weight, bias, cache_seqlens, indices;  // data null where absent
  MutTensorRef out;
};

class ConvUpdatePlan : public OneOutputPlanOf<ConvUpdateDescriptor, ConvUpdateLaunch> {
 public:
  static ConvUpdatePlan select(const ConvUpdateDescriptor& desc, PlanPreference pref);
  // output_layout(): out, x's sizes and dtype, contiguous.
  void can_implement(const ConvUpdateArgs& args) const;
  void run(void* stream, Workspace workspace, const ConvUpdateArgs& args) const;
};

}  // namespace baracuda
