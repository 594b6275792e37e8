// Gated activations: y = a * gate(b), where x splits along `dim` into halves (a, b)
// (or (b, a) with gate_first), and their backward dx = (da, db).
//
//   kind        gate(b)        da                db
//   glu         σ(b)           dy·σ(b)           dy·a·σ(b)(1−σ(b))
//   reglu       max(b, 0)      dy·max(b, 0)      (b<=0) ? 0 : dy·a
//   swiglu      b·σ(b)         dy·b·σ(b)         dy·a·σ(b)(1 + b(1−σ(b)))
//   geglu       b·Φ(b)         dy·b·Φ(b)         dy·a·(Φ(b) + b·φ(b))
//   geglu_tanh  gelu_tanh(b)   dy·gelu_tanh(b)   dy·a·gelu_tanh'(b)
#pragma once

#include <string>

#include "core/plan.h"

namespace baracuda {

enum class GatedKind : uint8_t { Glu, Reglu, Swiglu, Geglu, GegluTanh };

const char* gated_kind_name(GatedKind k);
// ValueError (InvalidProblem) naming the op and the accepted kinds for anything else.
GatedKind parse_gated_kind(const std::string& kind, const std::string& op);

// How a gated kernel walks its index space. Every variant writes a dense output.
//  Rows:    [rows, cols] with unit inner stride for every operand; vec > 1 means
//           16-byte vector accesses (cols, row strides and offsets multiples of vec).
//  Strided: any strides over up to 8 (coalesced) dims.
enum class GatedLayout : uint8_t { Rows, Strided };

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// The index space is the output's (the half-size shape), coalesced. Operand 0 is x (the
// gate b; the split tensor in the single-tensor op), operand 1 the dense output (y, or
// dx/dgate in the backward), operand 2 dy (backward only), operand 3 the value a in the
// two-tensor (pair) op; the single-tensor op reads a from x, at x_a_offset.
//
// Element (i) of the index space, with off_k its offset in operand k:
//   a = a_ptr[off_{a_op} + x_a_offset]     b = x[off_0 + x_b_offset]
//   y = out[off_1]                          (forward)
//   da -> out_a[off_1 + out_a_offset]       db -> out[off_1 + out_b_offset]   (backward)
// where a_op = 3 for the pair op and 0 otherwise, a_ptr = a (pair) or x, and out_a =
// the second output (pair backward: dup) or out.
struct GatedActivationLaunch {
  GatedKind kind = GatedKind::Swiglu;
  ElementKind element = ElementKind::F32;
  bool backward = false;
  bool pair = false;     // a and b are separate tensors (gated_activation_pair)
  GatedLayout layout = GatedLayout::Strided;
  int vec = 1;           // elements per vector access
  bool index64 = false;  // offsets need 64 bits
  CoalescedDims dims;    // index space and strides of x, out, dy, a
  int64_t x_a_offset = 0, x_b_offset = 0;      // element offsets of the halves in x
  int64_t out_a_offset = 0, out_b_offset = 0;  // ... and in dx (backward); y: 0, 0
  const void* x = nullptr;
  const void* a = nullptr;  // the value operand's base: x, or up in the pair op
  const void* dy = nullptr;
  void* out = nullptr;
  void* out_a = nullptr;    // where da goes: out, or dup in the pair op's backward
  int a_operand() const { return pair ? 3 : 0; }
};

// Problem checks shared by the plans and the shape-only (meta) kernels, so that a
// compiled graph rejects what eager execution rejects. Int is int64_t, or a symbolic
// integer in a meta kernel. Returns the normalized split dim.
template <class Int>
int check_gated_problem(const std::string& op, ElementKind dtype, int rank, const Int* sizes,
                        int64_t dim) {
  if (!is_floating(dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("x must be float32, float16, bfloat16 or float64, got ") +
             element_name(dtype));
  if (rank == 0)
    fail(PlanErrorKind::InvalidProblem, op,
         "x must have at least one dimension to split, got a 0-dim tensor");
  check_rank(op, "x", rank);
  const int d = normalize_dim(op, "dim", dim, rank);
  if (sizes[d] % 2 != 0)
    fail(PlanErrorKind::InvalidProblem, op,
         "x.size(" + std::to_string(dim) + ") must be even, got " + size_str(sizes[d]));
  return d;
}

// dy must have y's sizes (x's with size(dim) halved) and x's dtype.
template <class Int>
void check_gated_dy(const std::string& op, int rank, const Int* x_sizes, int dim,
                    ElementKind x_dtype, int dy_rank, const Int* dy_sizes, ElementKind dy_dtype) {
  bool same = dy_rank == rank;
  for (int d = 0; same && d < rank; ++d)
    same = d == dim ? dy_sizes[d] * 2 == x_sizes[d] : dy_sizes[d] == x_sizes[d];
  if (!same) {
    std::string want = "[";
    for (int d = 0; d < rank; ++d)
      want += (d ? ", " : "") + (d == dim ? size_str(x_sizes[d] / 2) : size_str(x_sizes[d]));
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must have x's sizes with size(dim) halved, " + want + "], got " +
             sizes_str(dy_sizes, dy_rank));
  }
  if (dy_dtype != x_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have x's dtype ") + element_name(x_dtype) + ", got " +
             element_name(dy_dtype));
}

// gated_activation_pair: gate and up must have the same sizes and one floating dtype
// (any strides, stride 0 included).
template <class Int>
void check_gated_pair_problem(const std::string& op, ElementKind gate_dtype, int gate_rank,
                              const Int* gate_sizes, ElementKind up_dtype, int up_rank,
                              const Int* up_sizes) {
  if (!is_floating(gate_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("gate must be float32, float16, bfloat16 or float64, got ") +
             element_name(gate_dtype));
  if (up_dtype != gate_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("up must have gate's dtype ") + element_name(gate_dtype) + ", got " +
             element_name(up_dtype));
  bool same = up_rank == gate_rank;
  for (int d = 0; same && d < gate_rank; ++d) same = up_sizes[d] == gate_sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "gate and up must have the same sizes, got gate " + sizes_str(gate_sizes, gate_rank) +
             " and up " + sizes_str(up_sizes, up_rank));
  check_rank(op, "gate", gate_rank);
}

// The pair backward's dy must have gate's sizes and dtype.
template <class Int>
void check_gated_pair_dy(const std::string& op, int rank, const Int* sizes, ElementKind dtype,
                         int dy_rank, const Int* dy_sizes, ElementKind dy_dtype) {
  bool same = dy_rank == rank;
  for (int d = 0; same && d < rank; ++d) same = dy_sizes[d] == sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must have gate's sizes " + sizes_str(sizes, rank) + ", got " +
             sizes_str(dy_sizes, dy_rank));
  if (dy_dtype != dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have gate's dtype ") + element_name(dtype) + ", got " +
             element_name(dy_dtype));
}

// gated_activation_pair_backward_: gate's and up's gradients are written over them, so
// each (`name`) must have the output layout, contiguous.
template <class Int>
void check_gated_pair_overwritable(const std::string& op, const char* name, bool contiguous, const Int* strides,
                                   int rank) {
  if (!contiguous)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string(name) + " must be contiguous (its gradient is written over it), got strides " +
             sizes_str(strides, rank));
}

struct GatedActivationDescriptor {
  GatedKind kind = GatedKind::Swiglu;
  int64_t dim = -1;  // as the caller gave it; negative counts from the end
  bool gate_first = false;
  TensorLayout x;
  DeviceInfo device;
};

struct GatedActivationBackwardDescriptor {
  GatedActivationDescriptor forward;
  TensorLayout dy;
};

struct GatedActivationArgs {
  TensorRef x;
  MutTensorRef y;
};

struct GatedActivationBackwardArgs {
  TensorRef dy;
  TensorRef x;
  MutTensorRef dx;
};

class GatedActivationPlan
    : public OneOutputPlanOf<GatedActivationDescriptor, GatedActivationLaunch> {
 public:
  static GatedActivationPlan select(const GatedActivationDescriptor& desc,
                                    PlanPreference pref);
  // output_layout() (y): x's sizes with size(dim) halved, contiguous.
  void can_implement(const GatedActivationArgs& args) const;
  void run(void* stream, Workspace workspace, const GatedActivationArgs& args) const;
};

class GatedActivationBackwardPlan
    : public OneOutputPlanOf<GatedActivationBackwardDescriptor, GatedActivationLaunch> {
 public:
  static GatedActivationBackwardPlan select(const GatedActivationBackwardDescriptor& desc,
                                            PlanPreference pref);
  // output_layout() (dx): x's sizes, contiguous.
  void can_implement(const GatedActivationBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const GatedActivationBackwardArgs& args) const;
};

// ---- gated_activation_pair: y = act(gate) * up, gate and up separate tensors ----------
// The same kernels with b = gate and a = up read from two tensors (see the launch above).

struct GatedPairDescriptor {
  GatedKind kind = GatedKind::Swiglu;
  TensorLayout gate;
  TensorLayout up;
  DeviceInfo device;
};

struct GatedPairBackwardDescriptor {
  GatedPairDescriptor forward;
  TensorLayout dy;
  // gated_activation_pair_backward_: dgate and dup are written over gate and up, which
  // must then have the output layout (contiguous)
  bool in_place = false;
};

struct GatedPairArgs {
  TensorRef gate;
  TensorRef up;
  MutTensorRef y;
};

struct GatedPairBackwardArgs {
  TensorRef dy;
  TensorRef gate;
  TensorRef up;
  MutTensorRef dgate;
  MutTensorRef dup;
};

class GatedPairPlan : public OneOutputPlanOf<GatedPairDescriptor, GatedActivationLaunch> {
 public:
  static GatedPairPlan select(const GatedPairDescriptor& desc, PlanPreference pref);
  // output_layout() (y): gate's sizes, contiguous.
  void can_implement(const GatedPairArgs& args) const;
  void run(void* stream, Workspace workspace, const GatedPairArgs& args) const;
};

class GatedPairBackwardPlan
    : public OneOutputPlanOf<GatedPairBackwardDescriptor, GatedActivationLaunch> {
 public:
  static GatedPairBackwardPlan select(const GatedPairBackwardDescriptor& desc,
                                      PlanPreference pref);
  // output_layout() (dgate and dup): gate's sizes, contiguous (in place: gate and up).
  void can_implement(const GatedPairBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const GatedPairBackwardArgs& args) const;
};

}  // namespace baracuda
