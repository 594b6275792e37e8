// baracuda::causal_conv1d and its backward baracuda::causal_conv1d_backward (and
// causal_conv1d_backward_into, which writes dx into the caller's tensor): CPU/CUDA
// kernels (tensor -> plan -> run), meta kernels (the plans' checks on symbolic sizes, then
// the outputs), and the ops' declarations (torch/op_def.h).
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>

#include <tuple>

#include "core/causal_conv1d_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "causal_conv1d";
constexpr const char* kBackwardOp = "causal_conv1d_backward";
constexpr const char* kBackwardIntoOp = "causal_conv1d_backward_into";

using OptTensor = std::optional<at::Tensor>;
using OptStr = std::optional<c10::string_view>;
using Tensors2 = std::tuple<at::Tensor, at::Tensor>;
using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensors4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

const at::Tensor* given(const OptTensor& t) { return t && t->defined() ? &*t : nullptr; }

std::optional<std::string> activation_name(const OptStr& a) {
  return a ? std::optional<std::string>(std::string(*a)) : std::nullopt;
}

// The tensor arguments of one call: the forward's five, and the backward's dout and
// dfinal_states (null where absent or not an argument).
struct ConvTensors {
  const at::Tensor* x;
  const at::Tensor* weight;
  const at::Tensor* bias;
  const at::Tensor* seq_idx;
  const at::Tensor* initial_states;
  const at::Tensor* dout = nullptr;
  const at::Tensor* dfinal_states = nullptr;
  const at::Tensor* dx = nullptr;  // causal_conv1d_backward_into's
  bool backward = false;

  const char* op() const { return dx ? kBackwardIntoOp : backward ? kBackwardOp : kOp; }

  void check_devices() const {
    const at::Tensor none;
    const auto or_none = [&](const at::Tensor* t) { return t ? t : &none; };
    check_same_device(op(), {{"x", x},
                             {"weight", weight},
                             {"bias", or_none(bias)},
                             {"seq_idx", or_none(seq_idx)},
                             {"initial_states", or_none(initial_states)},
                             {"dout", or_none(dout)},
                             {"dfinal_states", or_none(dfinal_states)},
                             {"dx", or_none(dx)}});
  }
};

// The problem checks of the plans on the tensors' own sizes (symbolic in a meta kernel),
// devices first: what the meta kernels run, and what make_plan runs for an operand of
// more dims than a TensorLayout holds (exceeds_layout_rank).
template <class Int>
void check_problem(const ConvTensors& a) {
  a.check_devices();
  ProblemViews<Int> view(a.op());
  const ConvOperand<Int> x = view(a.x, "x"), weight = view(a.weight, "weight");
  check_causal_conv1d_problem(a.op(), x, weight, view(a.bias, "bias"), view(a.seq_idx, "seq_idx"),
                              view(a.initial_states, "initial_states"));
  if (a.backward)
    check_causal_conv1d_backward(a.op(), x, weight, view(a.dout, "dout"),
                                 view(a.dfinal_states, "dfinal_states"), view(a.dx, "dx"));
}

CausalConv1dDescriptor describe(const ConvTensors& a, const OptStr& activation) {
  const char* op = a.op();
  const bool silu = parse_causal_conv1d_activation(activation_name(activation), op);
  if (exceeds_layout_rank({a.x, a.weight, a.bias, a.seq_idx, a.initial_states, a.dout,
                           a.dfinal_states, a.dx}))
    check_problem<int64_t>(a);
  a.check_devices();
  CausalConv1dDescriptor d;
  d.x = layout_of(*a.x, op, "x");
  d.weight = layout_of(*a.weight, op, "weight");
  d.has_bias = a.bias != nullptr;
  if (a.bias) d.bias = layout_of(*a.bias, op, "bias");
  d.has_seq_idx = a.seq_idx != nullptr;
  if (a.seq_idx) d.seq_idx = layout_of(*a.seq_idx, op, "seq_idx");
  d.has_initial_states = a.initial_states != nullptr;
  if (a.initial_states) d.initial_states = layout_of(*a.initial_states, op, "initial_states");
  d.silu = silu;
  d.device = device_info(*a.x, op);
  return d;
}

ConvTensors forward_tensors(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                            const OptTensor& seq_idx, const OptTensor& initial_states) {
  return {&x, &weight, given(bias), given(seq_idx), given(initial_states)};
}

ConvTensors backward_tensors(const at::Tensor& dout, const OptTensor& dfinal_states,
                             const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                             const OptTensor& seq_idx, const OptTensor& initial_states) {
  ConvTensors a = forward_tensors(x, weight, bias, seq_idx, initial_states);
  a.dout = &dout;
  a.dfinal_states = given(dfinal_states);
  a.backward = true;
  return a;
}

// The plans a call runs, and explain reports.
CausalConv1dPlan forward_plan(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                              const OptTensor& seq_idx, const OptTensor& initial_states,
                              OptStr activation, PlanPreference pref) {
  return CausalConv1dPlan::select(
      describe(forward_tensors(x, weight, bias, seq_idx, initial_states), activation), pref);
}

// (dx: causal_conv1d_backward_into's, or null)
CausalConv1dBackwardPlan backward_plan_of(const at::Tensor& dout, const OptTensor& dfinal_states,
                                          const at::Tensor& x, const at::Tensor& weight,
                                          const OptTensor& bias, const OptTensor& seq_idx,
                                          const OptTensor& initial_states, OptStr activation,
                                          const at::Tensor* dx, PlanPreference pref) {
  ConvTensors a = backward_tensors(dout, dfinal_states, x, weight, bias, seq_idx, initial_states);
  a.dx = dx;
  const char* op = a.op();
  CausalConv1dBackwardDescriptor d;
  d.forward = describe(a, activation);
  d.dout = layout_of(dout, op, "dout");
  d.has_dfinal_states = a.dfinal_states != nullptr;
  if (a.dfinal_states) d.dfinal_states = layout_of(*a.dfinal_states, op, "dfinal_states");
  d.has_dx = dx != nullptr;
  if (dx) d.dx = layout_of(*dx, op, "dx");
  return CausalConv1dBackwardPlan::select(d, pref);
}

CausalConv1dBackwardPlan backward_plan(const at::Tensor& dout, const OptTensor& dfinal_states,
                                       const at::Tensor& x, const at::Tensor& weight,
                                       const OptTensor& bias, const OptTensor& seq_idx,
                                       const OptTensor& initial_states, OptStr activation,
                                       PlanPreference pref) {
  return backward_plan_of(dout, dfinal_states, x, weight, bias, seq_idx, initial_states, activation, nullptr,
                          pref);
}

CausalConv1dBackwardPlan backward_into_plan(const at::Tensor& dout, const OptTensor& dfinal_states,
                                            const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& dx, const OptTensor& bias,
                                            const OptTensor& seq_idx, const OptTensor& initial_states,
                                            OptStr activation, PlanPreference pref) {
  return backward_plan_of(dout, dfinal_states, x, weight, bias, seq_idx, initial_states, activation, &dx, pref);
}

TensorRef optional_ref(const at::Tensor* t, const std::string& op, const char* what) {
  return t ? ref_of(*t, op, what) : TensorRef{};
}

// The forward's five inputs of CausalConv1dArgs or CausalConv1dBackwardArgs.
template <class Args>
void set_input_refs(Args& args, const ConvTensors& t) {
  const char* op = t.op();
  args.x = ref_of(*t.x, op, "x");
  args.weight = ref_of(*t.weight, op, "weight");
  args.bias = optional_ref(t.bias, op, "bias");
  args.seq_idx = optional_ref(t.seq_idx, op, "seq_idx");
  args.initial_states = optional_ref(t.initial_states, op, "initial_states");
}

// -> (out, final_states)
Tensors2 causal_conv1d_kernel(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                              const OptTensor& seq_idx, const OptTensor& initial_states,
                              OptStr activation) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan =
        forward_plan(x, weight, bias, seq_idx, initial_states, activation, current_preference());
    at::Tensor out = allocate(plan.out_layout(), x);
    at::Tensor final_states = allocate(plan.final_states_layout(), x);
    CausalConv1dArgs a;
    set_input_refs(a, forward_tensors(x, weight, bias, seq_idx, initial_states));
    a.out = mut_ref_of(out, kOp, "out");
    a.final_states = mut_ref_of(final_states, kOp, "final_states");
    plan.run(current_stream(x), Workspace{}, a);
    return Tensors2(out, final_states);
  });
}

// The backward on a selected plan: dx allocated, or (into) the caller's, which must not
// share memory with an input the kernels read. -> (dx, dweight, dbias, dinitial_states).
Tensors4 run_backward(const CausalConv1dBackwardPlan& plan, const at::Tensor& dout,
                      const OptTensor& dfinal_states, const at::Tensor& x, const at::Tensor& weight,
                      const OptTensor& bias, const OptTensor& seq_idx, const OptTensor& initial_states,
                      const at::Tensor* dx_into) {
  ConvTensors t = backward_tensors(dout, dfinal_states, x, weight, bias, seq_idx, initial_states);
  t.dx = dx_into;
  const char* op = t.op();
  at::Tensor dx = dx_into ? *dx_into : allocate(plan.dx_layout(), x);
  if (dx_into)
    check_no_shared_memory(op, "dx", dx, {{"dout", &dout}, {"x", &x}, {"dfinal_states", given(dfinal_states)},
                                          {"initial_states", given(initial_states)}});
  at::Tensor dweight = allocate(plan.dweight_layout(), x);
  at::Tensor dbias = allocate(plan.dbias_layout(), x);
  at::Tensor dinit = allocate(plan.dinitial_states_layout(), x);
  at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
  CausalConv1dBackwardArgs a;
  set_input_refs(a, t);
  a.dout = ref_of(dout, op, "dout");
  a.dfinal_states = optional_ref(given(dfinal_states), op, "dfinal_states");
  a.dx = mut_ref_of(dx, op, "dx");
  a.dweight = mut_ref_of(dweight, op, "dweight");
  a.dbias = mut_ref_of(dbias, op, "dbias");
  a.dinitial_states = mut_ref_of(dinit, op, "dinitial_states");
  plan.run(current_stream(x), workspace_of(ws), a);
  return Tensors4(dx, dweight, dbias, dinit);
}

// -> (dx, dweight, dbias, dinitial_states); dbias and dinitial_states are empty tensors
// where bias and initial_states are None.
Tensors4 causal_conv1d_backward_kernel(const at::Tensor& dout, const OptTensor& dfinal_states,
                                       const at::Tensor& x, const at::Tensor& weight,
                                       const OptTensor& bias, const OptTensor& seq_idx,
                                       const OptTensor& initial_states, OptStr activation) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = backward_plan(dout, dfinal_states, x, weight, bias, seq_idx, initial_states,
                                    activation, current_preference());
    return run_backward(plan, dout, dfinal_states, x, weight, bias, seq_idx, initial_states, nullptr);
  });
}

// dx written into the caller's tensor -> (dweight, dbias, dinitial_states).
Tensors3 causal_conv1d_backward_into_kernel(const at::Tensor& dout, const OptTensor& dfinal_states,
                                            const at::Tensor& x, const at::Tensor& weight, const at::Tensor& dx,
                                            const OptTensor& bias, const OptTensor& seq_idx,
                                            const OptTensor& initial_states, OptStr activation) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = backward_into_plan(dout, dfinal_states, x, weight, dx, bias, seq_idx, initial_states,
                                         activation, current_preference());
    const Tensors4 r = run_backward(plan, dout, dfinal_states, x, weight, bias, seq_idx, initial_states, &dx);
    return Tensors3(std::get<1>(r), std::get<2>(r), std::get<3>(r));
  });
}

// ---- meta (fake) kernels -----------------------------------------------------------------

// out and dx: x's layout (torch.empty_like), contiguous when neither x's channel nor its
// time stride is 1 (CausalConv1dPlan::out_layout).
at::Tensor out_like(const at::Tensor& x) {
  if (x.sym_stride(1) != 1 && x.sym_stride(2) != 1) return at::empty_symint(x.sym_sizes(), x.options());
  return at::empty_like(x);
}

// [B, D, W − 1] in x's dtype, channel-last (the plans' final_states layout).
at::Tensor states_like(const at::Tensor& x, const at::Tensor& weight) {
  return at::empty_symint({x.sym_size(0), weight.sym_size(1) - 1, x.sym_size(1)}, x.options())
      .transpose(1, 2);
}

// The backward's parameter gradients as the kernels return them: dweight, dbias (empty
// without bias) and dinitial_states (empty without initial_states).
Tensors3 param_grads_like(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                          const OptTensor& initial_states) {
  const auto w_options = x.options().dtype(weight.scalar_type());
  const c10::SymInt none(0);
  return Tensors3(at::empty_symint(weight.sym_sizes(), w_options),
                  at::empty_symint({given(bias) ? x.sym_size(1) : none}, w_options),
                  given(initial_states) ? states_like(x, weight) : at::empty_symint({none}, x.options()));
}

Tensors2 causal_conv1d_meta(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                            const OptTensor& seq_idx, const OptTensor& initial_states,
                            OptStr activation) {
  return translate_errors([&] {
    parse_causal_conv1d_activation(activation_name(activation), kOp);
    check_problem<c10::SymInt>(forward_tensors(x, weight, bias, seq_idx, initial_states));
    return Tensors2(out_like(x), states_like(x, weight));
  });
}

Tensors4 causal_conv1d_backward_meta(const at::Tensor& dout, const OptTensor& dfinal_states,
                                     const at::Tensor& x, const at::Tensor& weight,
                                     const OptTensor& bias, const OptTensor& seq_idx,
                                     const OptTensor& initial_states, OptStr activation) {
  return translate_errors([&] {
    parse_causal_conv1d_activation(activation_name(activation), kBackwardOp);
    check_problem<c10::SymInt>(
        backward_tensors(dout, dfinal_states, x, weight, bias, seq_idx, initial_states));
    const auto [dweight, dbias, dinit] = param_grads_like(x, weight, bias, initial_states);
    return Tensors4(out_like(x), dweight, dbias, dinit);
  });
}

Tensors3 causal_conv1d_backward_into_meta(const at::Tensor& dout, const OptTensor& dfinal_states,
                                          const at::Tensor& x, const at::Tensor& weight, const at::Tensor& dx,
                                          const OptTensor& bias, const OptTensor& seq_idx,
                                          const OptTensor& initial_states, OptStr activation) {
  return translate_errors([&] {
    ConvTensors t = backward_tensors(dout, dfinal_states, x, weight, bias, seq_idx, initial_states);
    t.dx = &dx;
    parse_causal_conv1d_activation(activation_name(activation), kBackwardIntoOp);
    check_problem<c10::SymInt>(t);
    // (the plan's rule on concrete strides; here what torch can tell on symbolic ones)
    if (at::has_internal_overlap(dx) == at::MemOverlap::Yes)
      fail(PlanErrorKind::InvalidProblem, kBackwardIntoOp,
           "dx must not overlap itself (no two of its elements at one address), got strides " +
               sizes_str(dx.sym_strides().data(), static_cast<int>(dx.dim())));
    return param_grads_like(x, weight, bias, initial_states);
  });
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  // -> (out, final_states): out in x's memory layout; final_states [B, D, W - 1], the last
  // W - 1 inputs (computed whatever the caller asks for: B·D·(W − 1) values).
  OpDef(m,
        "causal_conv1d(Tensor x, Tensor weight, Tensor? bias=None, Tensor? seq_idx=None, "
        "Tensor? initial_states=None, str? activation=None) -> (Tensor, Tensor)")
      .kernel(&causal_conv1d_kernel)
      .meta(&causal_conv1d_meta)
      .explain(&forward_plan)
      .derivative("causal_conv1d_backward",
                  {grad(0), grad(1), arg("x"), arg("weight"), arg("bias"), arg("seq_idx"),
                   arg("initial_states"), arg("activation")},
                  {{"x", 0}, {"weight", 1}, {"bias", 2}, {"initial_states", 3}});
  // -> (dx, dweight, dbias, dinitial_states). vmap runs it once per sample (dweight and
  // dbias sum over the batch).
  OpDef(m,
        "causal_conv1d_backward(Tensor dout, Tensor? dfinal_states, Tensor x, Tensor weight, "
        "Tensor? bias=None, Tensor? seq_idx=None, Tensor? initial_states=None, "
        "str? activation=None) -> (Tensor, Tensor, Tensor, Tensor)")
      .kernel(&causal_conv1d_backward_kernel)
      .meta(&causal_conv1d_backward_meta)
      .explain(&backward_plan)
      .not_differentiable("baracuda::causal_conv1d: double backward (the second derivative) is "
                          "not implemented");
  // causal_conv1d_backward with dx written into the caller's tensor (x's sizes and dtype,
  // any strides without self-overlap: a slice of a larger gradient buffer, as
  // causal-conv1d's causal_conv1d_bwd takes its dx) -> (dweight, dbias, dinitial_states).
  OpDef(m,
        "causal_conv1d_backward_into(Tensor dout, Tensor? dfinal_states, Tensor x, Tensor weight, "
        "Tensor(a!) dx, Tensor? bias=None, Tensor? seq_idx=None, Tensor? initial_states=None, "
        "str? activation=None) -> (Tensor, Tensor, Tensor)")
      .kernel(&causal_conv1d_backward_into_kernel)
      .meta(&causal_conv1d_backward_into_meta)
      .explain(&backward_into_plan)
      .not_differentiable("baracuda::causal_conv1d_backward_into is a backward (not differentiable)");
}

}  // namespace baracuda::torch_ops
