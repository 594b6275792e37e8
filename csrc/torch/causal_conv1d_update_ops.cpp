// baracuda::causal_conv1d_update, the causal conv1d's decoding step (in place on
// conv_state): CPU/CUDA kernel (tensor -> plan -> run), meta kernel (the plan's checks on
// symbolic sizes, then `out`), and the op's declaration (torch/op_def.h). An inference op:
// not differentiable (as causal-conv1d's).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>


#include "core/causal_conv1d_plan.h"
#include "core/causal_conv1d_update_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "causal_conv1d_update";

using OptTensor = std::optional<at::Tensor>;
using OptStr = std::optional<c10::string_view>;

const at::Tensor* given(const OptTensor& t) { return t && t->defined() ? &*t : nullptr; }

std::optional<std::string> activation_name(const OptStr& a) {
  return a ? std::optional<std::string>(std::string(*a)) : std::nullopt;
}

struct UpdateTensors {
  const at::Tensor *x, *state, *weight, *bias, *seqlens, *indices;

  void check_devices() const {
    const at::Tensor none;
    const auto n = [&](const at::Tensor* t) { return t ? t : &none; };
    check_same_device(kOp, {{"x", x},
                            {"conv_state", state},
                            {"weight", weight},
                            {"bias", n(bias)},
                            {"cache_seqlens", n(seqlens)},
                            {"conv_state_indices", n(indices)}});
  }
};

UpdateTensors tensors_of(const at::Tensor& x, const at::Tensor& conv_state, const at::Tensor& weight,
                         const OptTensor& bias, const OptTensor& cache_seqlens,
                         const OptTensor& conv_state_indices) {
  return {&x, &conv_state, &weight, given(bias), given(cache_seqlens), given(conv_state_indices)};
}

// The plan's problem checks on the tensors' own sizes (symbolic in the meta kernel),
// devices first.
template <class Int>
void check_problem(const UpdateTensors& a) {
  a.check_devices();
  ProblemViews<Int> view(kOp);
  check_conv_update_problem(kOp, view(a.x, "x"), view(a.state, "conv_state"), view(a.weight, "weight"),
                            view(a.bias, "bias"), view(a.seqlens, "cache_seqlens"),
                            view(a.indices, "conv_state_indices"));
}

// The plan a call runs, and explain reports.
ConvUpdatePlan update_plan(const at::Tensor& x, const at::Tensor& conv_state, const at::Tensor& weight,
                           const OptTensor& bias, OptStr activation, const OptTensor& cache_seqlens,
                           const OptTensor& conv_state_indices, PlanPreference pref) {
  const bool silu = parse_causal_conv1d_activation(activation_name(activation), kOp);
  const UpdateTensors a = tensors_of(x, conv_state, weight, bias, cache_seqlens, conv_state_indices);
  if (exceeds_layout_rank({a.x, a.state, a.weight, a.bias, a.seqlens, a.indices})) check_problem<int64_t>(a);
  a.check_devices();
  ConvUpdateDescriptor d;
  d.x = layout_of(x, kOp, "x");
  d.conv_state = layout_of(conv_state, kOp, "conv_state");
  d.weight = layout_of(weight, kOp, "weight");
  d.has_bias = a.bias != nullptr;
  if (a.bias) d.bias = layout_of(*a.bias, kOp, "bias");
  d.has_cache_seqlens = a.seqlens != nullptr;
  if (a.seqlens) d.cache_seqlens = layout_of(*a.seqlens, kOp, "cache_seqlens");
  d.has_indices = a.indices != nullptr;
  if (a.indices) d.indices = layout_of(*a.indices, kOp, "conv_state_indices");
  d.silu = silu;
  d.device = device_info(x, kOp);
  return ConvUpdatePlan::select(d, pref);
}

TensorRef optional_ref(const at::Tensor* t, const char* what) {
  return t ? ref_of(*t, kOp, what) : TensorRef{};
}

// -> out (x's shape); conv_state updated in place.
at::Tensor update_kernel(const at::Tensor& x, const at::Tensor& conv_state, const at::Tensor& weight,
                         const OptTensor& bias, OptStr activation, const OptTensor& cache_seqlens,
                         const OptTensor& conv_state_indices) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = update_plan(x, conv_state, weight, bias, activation, cache_seqlens,
                                  conv_state_indices, current_preference());
    at::Tensor out = allocate(plan.output_layout(), x);
    at::Tensor st = conv_state;
    ConvUpdateArgs a;
    a.x = ref_of(x, kOp, "x");
    a.conv_state = mut_ref_of(st, kOp, "conv_state");
    a.weight = ref_of(weight, kOp, "weight");
    a.bias = optional_ref(given(bias), "bias");
    a.cache_seqlens = optional_ref(given(cache_seqlens), "cache_seqlens");
    a.indices = optional_ref(given(conv_state_indices), "conv_state_indices");
    a.out = mut_ref_of(out, kOp, "out");
    plan.run(current_stream(x), Workspace{}, a);
    return out;
  });
}

at::Tensor update_meta(const at::Tensor& x, const at::Tensor& conv_state, const at::Tensor& weight,
                       const OptTensor& bias, OptStr activation, const OptTensor& cache_seqlens,
                       const OptTensor& conv_state_indices) {
  return translate_errors([&] {
    parse_causal_conv1d_activation(activation_name(activation), kOp);
    check_problem<c10::SymInt>(tensors_of(x, conv_state, weight, bias, cache_seqlens, conv_state_indices));
    return at::empty_symint(x.sym_sizes(), x.options());
  });
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  // -> out (x's shape: [B, D] or [B, D, L]); conv_state updated in place.
  OpDef(m,
        "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, "
        "str? activation=None, Tensor? cache_seqlens=None, Tensor? conv_state_indices=None) -> Tensor")
      .kernel(&update_kernel)
      .meta(&update_meta)
      .explain(&update_plan)
      .not_differentiable("baracuda::causal_conv1d_update is not differentiable (an inference op, "
                          "like causal-conv1d's; train with causal_conv1d)");
}

}  // namespace baracuda::torch_ops
