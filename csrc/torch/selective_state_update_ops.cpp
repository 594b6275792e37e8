// baracuda::selective_state_update and baracuda::selective_state_update_tokens (T new
// tokens at once): CPU/CUDA kernels (tensor -> plan -> run, in place on `state`), meta
// kernels (the plan's checks on symbolic sizes, then `out`), and the ops' declarations
// (torch/op_def.h). Inference ops: not differentiable (as mamba_ssm's).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>


#include "core/selective_state_update_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "selective_state_update";
constexpr const char* kTokensOp = "selective_state_update_tokens";

using OptTensor = std::optional<at::Tensor>;

const at::Tensor* given(const OptTensor& t) { return t && t->defined() ? &*t : nullptr; }

// The tensor arguments of one call (null where None).
struct UpdateTensors {
  bool tokens;
  const at::Tensor *state, *x, *dt, *A, *B, *C, *D, *z, *dt_bias, *indices;

  const char* op() const { return tokens ? kTokensOp : kOp; }

  void check_devices() const {
    const at::Tensor none;
    const auto n = [&](const at::Tensor* t) { return t ? t : &none; };
    check_same_device(op(), {{"state", state},
                             {"x", x},
                             {"dt", dt},
                             {"A", A},
                             {"B", B},
                             {"C", C},
                             {"D", n(D)},
                             {"z", n(z)},
                             {"dt_bias", n(dt_bias)},
                             {"state_batch_indices", n(indices)}});
  }
};

UpdateTensors tensors_of(bool tokens, const at::Tensor& state, const at::Tensor& x,
                         const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                         const at::Tensor& C, const OptTensor& D, const OptTensor& z,
                         const OptTensor& dt_bias, const OptTensor& indices) {
  return {tokens, &state, &x, &dt, &A, &B, &C, given(D), given(z), given(dt_bias), given(indices)};
}

// The plan's problem checks on the tensors' own sizes (symbolic in a meta kernel), devices
// first: what the meta kernels run, and what make_plan runs for an operand of more dims
// than a TensorLayout holds.
template <class Int>
StateUpdateSizes<Int> check_problem(const UpdateTensors& a) {
  a.check_devices();
  ProblemViews<Int> view(a.op());
  StateUpdateOperands<Int> ops;
  ops.state = view(a.state, "state");
  ops.x = view(a.x, "x");
  ops.dt = view(a.dt, "dt");
  ops.A = view(a.A, "A");
  ops.B = view(a.B, "B");
  ops.C = view(a.C, "C");
  ops.D = view(a.D, "D");
  ops.z = view(a.z, "z");
  ops.dt_bias = view(a.dt_bias, "dt_bias");
  ops.indices = view(a.indices, "state_batch_indices");
  return check_state_update_problem(a.op(), a.tokens, ops);
}

StateUpdateDescriptor describe(const UpdateTensors& a, bool dt_softplus) {
  const char* op = a.op();
  if (exceeds_layout_rank({a.state, a.x, a.dt, a.A, a.B, a.C, a.D, a.z, a.dt_bias, a.indices}))
    check_problem<int64_t>(a);
  a.check_devices();
  StateUpdateDescriptor d;
  d.tokens = a.tokens;
  d.state = layout_of(*a.state, op, "state");
  d.x = layout_of(*a.x, op, "x");
  d.dt = layout_of(*a.dt, op, "dt");
  d.A = layout_of(*a.A, op, "A");
  d.B = layout_of(*a.B, op, "B");
  d.C = layout_of(*a.C, op, "C");
  d.has_D = a.D != nullptr;
  if (a.D) d.D = layout_of(*a.D, op, "D");
  d.has_z = a.z != nullptr;
  if (a.z) d.z = layout_of(*a.z, op, "z");
  d.has_dt_bias = a.dt_bias != nullptr;
  if (a.dt_bias) d.dt_bias = layout_of(*a.dt_bias, op, "dt_bias");
  d.has_indices = a.indices != nullptr;
  if (a.indices) d.indices = layout_of(*a.indices, op, "state_batch_indices");
  d.dt_softplus = dt_softplus;
  d.device = device_info(*a.x, op);
  return d;
}

// The plan a call runs, and explain reports.
template <bool Tokens>
StateUpdatePlan update_plan(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt,
                            const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                            const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                            bool dt_softplus, const OptTensor& state_batch_indices,
                            PlanPreference pref) {
  return StateUpdatePlan::select(
      describe(tensors_of(Tokens, state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices),
               dt_softplus),
      pref);
}

TensorRef optional_ref(const at::Tensor* t, const char* op, const char* what) {
  return t ? ref_of(*t, op, what) : TensorRef{};
}

// -> out; `state` updated in place.
template <bool Tokens>
at::Tensor update_kernel(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt,
                         const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                         const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                         bool dt_softplus, const OptTensor& state_batch_indices) {
  return translate_errors([&] {
    const char* op = Tokens ? kTokensOp : kOp;
    c10::DeviceGuard guard(x.device());
    const auto plan = update_plan<Tokens>(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                          state_batch_indices, current_preference());
    at::Tensor out = allocate(plan.output_layout(), x);
    at::Tensor st = state;
    StateUpdateArgs a;
    a.state = mut_ref_of(st, op, "state");
    a.x = ref_of(x, op, "x");
    a.dt = ref_of(dt, op, "dt");
    a.A = ref_of(A, op, "A");
    a.B = ref_of(B, op, "B");
    a.C = ref_of(C, op, "C");
    a.D = optional_ref(given(D), op, "D");
    a.z = optional_ref(given(z), op, "z");
    a.dt_bias = optional_ref(given(dt_bias), op, "dt_bias");
    a.indices = optional_ref(given(state_batch_indices), op, "state_batch_indices");
    a.out = mut_ref_of(out, op, "out");
    plan.run(current_stream(x), Workspace{}, a);
    return out;
  });
}

template <bool Tokens>
at::Tensor update_meta(const at::Tensor& state, const at::Tensor& x, const at::Tensor& dt,
                       const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                       const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                       bool dt_softplus, const OptTensor& state_batch_indices) {
  (void)dt_softplus;
  return translate_errors([&] {
    const StateUpdateSizes<c10::SymInt> s = check_problem<c10::SymInt>(
        tensors_of(Tokens, state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices));
    return at::empty_symint(state_update_out_sizes(Tokens, s), x.options());
  });
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  // -> out [B, H, P] ([B, P] for a 3-d state); state updated in place.
  OpDef(m,
        "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, "
        "Tensor C, Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, "
        "Tensor? state_batch_indices=None) -> Tensor")
      .kernel(&update_kernel<false>)
      .meta(&update_meta<false>)
      .explain(&update_plan<false>)
      .not_differentiable("baracuda::selective_state_update is not differentiable (an inference "
                          "op, like mamba_ssm's; train with the chunked scan)");
  // -> out [B, T, H, P] ([B, T, P] for a 3-d state): T tokens in order, the state after the
  // last one left in `state`.
  OpDef(m,
        "selective_state_update_tokens(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, "
        "Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, "
        "bool dt_softplus=False, Tensor? state_batch_indices=None) -> Tensor")
      .kernel(&update_kernel<true>)
      .meta(&update_meta<true>)
      .explain(&update_plan<true>)
      .not_differentiable("baracuda::selective_state_update_tokens is not differentiable (an "
                          "inference op, like mamba_ssm's; train with the chunked scan)");
}

}  // namespace baracuda::torch_ops
