// Lerp: y = a + w·(b − a) with a scalar or tensor weight w, a, b (and a tensor w)
// broadcast to one shape as in torch.lerp, and its backward
//
//   da = (1 − w)·dy,   db = w·dy,   dw = dy·(b − a)   (dw only for a tensor weight)
//
// written by one kernel in one pass. The backward ops return gradients at dy's (the
// broadcast) shape; the autograd Functions sum them down to each input's shape.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/plan.h"

namespace baracuda {

// Which of the four ops a launch runs. Inputs and outputs, in order:
//   Forward         a, b              -> y          (scalar weight)
//   ForwardTensor   a, b, w           -> y
//   Backward        dy                -> da, db     (scalar weight)
//   BackwardTensor  dy, a, b, w       -> da, db, dw
enum class LerpOp : uint8_t { Forward, ForwardTensor, Backward, BackwardTensor };

constexpr int lerp_num_inputs(LerpOp op) {
  return op == LerpOp::Forward ? 2 : op == LerpOp::ForwardTensor ? 3 : op == LerpOp::Backward ? 1 : 4;
}
constexpr int lerp_num_outputs(LerpOp op) {
  return op == LerpOp::Forward || op == LerpOp::ForwardTensor ? 1 : op == LerpOp::Backward ? 2 : 3;
}
// The same as constants, usable in device code.
template <LerpOp Op>
constexpr int kLerpInputs = lerp_num_inputs(Op);
template <LerpOp Op>
constexpr int kLerpOutputs = lerp_num_outputs(Op);

// How a lerp kernel walks its index space (the output shape, coalesced). Outputs are
// always dense over it, so an output's offset is the linear index.
//  Rows:    [rows, cols]; every input's inner stride is 1, or 0 (one value broadcast along
//           the row, e.g. a weight of shape [M, 1]); vec > 1 means 16-byte vector accesses
//           (cols, the unit-stride inputs' row strides and addresses multiples of vec).
//  Strided: any strides (0 for broadcast dims) over up to 8 coalesced dims.
enum class LerpLayout : uint8_t { Rows, Strided };

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// dims.strides[k] are input k's strides over the index space; the outputs' are dense.
struct LerpLaunch {
  LerpOp op = LerpOp::Forward;
  ElementKind element = ElementKind::F32;
  LerpLayout layout = LerpLayout::Strided;
  int vec = 1;           // elements per vector access
  bool index64 = false;  // offsets need 64 bits
  CoalescedDims dims;
  double weight = 0.5;       // scalar weight w (Forward, Backward)
  double one_minus_w = 0.5;  // 1 − w computed in float64, as torch's lerp backward does
  const void* in[kMaxOperands] = {};
  void* out[3] = {};
};

// The broadcast shape of `n` operands (NumPy rules, as torch.lerp); ValueError naming
// every operand's shape when they do not broadcast. Int is int64_t, or a symbolic
// integer in a meta kernel (shared with the shape-only kernels, so that a compiled graph
// rejects what eager execution rejects).
template <class Int>
std::vector<Int> lerp_broadcast_shape(const std::string& op, int n, const char* const* names,
                                      const int* ranks, const Int* const* sizes) {
  int rank = 0;
  for (int k = 0; k < n; ++k) rank = std::max(rank, ranks[k]);
  std::vector<Int> out(rank, Int(1));
  bool ok = true;
  for (int d = 0; d < rank && ok; ++d) {  // d counts from the last dim
    Int& o = out[rank - 1 - d];
    for (int k = 0; k < n && ok; ++k) {
      if (d >= ranks[k]) continue;
      const Int& s = sizes[k][ranks[k] - 1 - d];
      if (s == 1) continue;
      if (o == 1)
        o = s;
      else
        ok = s == o;
    }
  }
  if (!ok) {
    std::string what, got;
    for (int k = 0; k < n; ++k) {
      const char* sep = k == 0 ? "" : k == n - 1 ? " and " : ", ";
      what += sep + std::string(names[k]);
      got += sep + sizes_str(sizes[k], ranks[k]);
    }
    fail(PlanErrorKind::InvalidProblem, op,
         what + " must broadcast to one shape, got " + got);
  }
  return out;
}

// `what` (an input of the tensor-weight backward) must broadcast to dy's shape.
template <class Int>
void check_lerp_broadcasts_to(const std::string& op, const char* what, int rank,
                              const Int* sizes, int dy_rank, const Int* dy_sizes) {
  bool ok = rank <= dy_rank;
  for (int d = 0; ok && d < rank; ++d) {
    const Int& s = sizes[rank - 1 - d];
    ok = s == 1 || s == dy_sizes[dy_rank - 1 - d];
  }
  if (!ok)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string(what) + " must broadcast to dy's shape " + sizes_str(dy_sizes, dy_rank) +
             ", got " + sizes_str(sizes, rank));
}

// dtype rules: the first operand floating, the others of its dtype (TypeError otherwise).
void check_lerp_dtypes(const std::string& op, int n, const char* const* names,
                       const ElementKind* dtypes);

struct LerpDescriptor {
  TensorLayout a, b;
  bool tensor_weight = false;  // lerp.Tensor: `w` is the weight tensor; else `weight`
  TensorLayout w;
  double weight = 0.5;
  DeviceInfo device;
};

struct LerpBackwardDescriptor {
  TensorLayout dy;
  bool tensor_weight = false;  // lerp_backward.Tensor: the forward's a, b, w are given
  TensorLayout a, b, w;
  double weight = 0.5;
  DeviceInfo device;
};

struct LerpArgs {
  TensorRef a, b;
  TensorRef w;  // tensor weight only
  MutTensorRef y;
};

struct LerpBackwardArgs {
  TensorRef dy;
  TensorRef a, b, w;  // tensor weight only
  MutTensorRef da, db;
  MutTensorRef dw;  // tensor weight only
};

class LerpPlan : public OneOutputPlanOf<LerpDescriptor, LerpLaunch> {
 public:
  static LerpPlan select(const LerpDescriptor& desc, PlanPreference pref);
  // output_layout() (y): the broadcast shape of a, b (and w), contiguous.
  void can_implement(const LerpArgs& args) const;
  void run(void* stream, Workspace workspace, const LerpArgs& args) const;
};

class LerpBackwardPlan : public OneOutputPlanOf<LerpBackwardDescriptor, LerpLaunch> {
 public:
  static LerpBackwardPlan select(const LerpBackwardDescriptor& desc, PlanPreference pref);
  // output_layout() (da, db, and dw with a tensor weight): dy's shape, contiguous.
  void can_implement(const LerpBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const LerpBackwardArgs& args) const;
};

}  // namespace baracuda
