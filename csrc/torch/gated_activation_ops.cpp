// baracuda::gated_activation(_backward) and baracuda::gated_activation_pair(_backward):
// CPU/CUDA kernels
// (tensor -> plan -> run), meta kernels (shapes only), and the autograd Function that
// connects the forward plan to the backward op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "core/gated_activation_plan.h"
#include "torch/common.h"
#include "torch/ops.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "gated_activation";
constexpr const char* kBackwardOp = "gated_activation_backward";

GatedActivationDescriptor describe_forward(const at::Tensor& x, const std::string& kind,
                                           int64_t dim, bool gate_first, const std::string& op) {
  GatedActivationDescriptor desc;
  desc.kind = parse_gated_kind(kind, op);
  desc.dim = dim;
  desc.gate_first = gate_first;
  desc.x = layout_of(x, op, "x");
  desc.device = device_info(x, op);
  return desc;
}

GatedActivationPlan forward_plan(const at::Tensor& x, const std::string& kind, int64_t dim,
                                 bool gate_first, PlanPreference pref) {
  return GatedActivationPlan::select(describe_forward(x, kind, dim, gate_first, kOp), pref);
}

GatedActivationBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                          const std::string& kind, int64_t dim, bool gate_first,
                                          PlanPreference pref) {
  check_same_device(kBackwardOp, {{"dy", &dy}, {"x", &x}});
  GatedActivationBackwardDescriptor desc;
  desc.forward = describe_forward(x, kind, dim, gate_first, kBackwardOp);
  desc.dy = layout_of(dy, kBackwardOp, "dy");
  return GatedActivationBackwardPlan::select(desc, pref);
}

at::Tensor gated_activation_kernel(const at::Tensor& x, c10::string_view kind, int64_t dim,
                                   bool gate_first) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = forward_plan(x, std::string(kind), dim, gate_first, current_preference());
    at::Tensor y = allocate(plan.output_layout(), x);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    plan.run(current_stream(x), workspace_of(ws),
             {ref_of(x, kOp, "x"), mut_ref_of(y, kOp, "y")});
    return y;
  });
}

at::Tensor gated_activation_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                            c10::string_view kind, int64_t dim,
                                            bool gate_first) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan =
        backward_plan(dy, x, std::string(kind), dim, gate_first, current_preference());
    at::Tensor dx = allocate(plan.output_layout(), x);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    plan.run(current_stream(x), workspace_of(ws),
             {ref_of(dy, kBackwardOp, "dy"), ref_of(x, kBackwardOp, "x"),
              mut_ref_of(dx, kBackwardOp, "dx")});
    return dx;
  });
}

// Meta (fake) kernels: the plans' problem checks on symbolic sizes, then the shape.
at::Tensor gated_activation_meta(const at::Tensor& x, c10::string_view kind, int64_t dim,
                                 bool) {
  return translate_errors([&] {
    parse_gated_kind(std::string(kind), kOp);
    auto sizes = sym_sizes_of(x);
    const int d = check_gated_problem(kOp, element_of(x, kOp, "x"), static_cast<int>(sizes.size()),
                                      sizes.data(), dim);
    sizes[d] = sizes[d] / 2;
    return at::empty_symint(sizes, x.options());
  });
}

at::Tensor gated_activation_backward_meta(const at::Tensor& dy, const at::Tensor& x,
                                          c10::string_view kind, int64_t dim, bool) {
  return translate_errors([&] {
    check_same_device(kBackwardOp, {{"dy", &dy}, {"x", &x}});
    parse_gated_kind(std::string(kind), kBackwardOp);
    const auto sizes = sym_sizes_of(x);
    const auto dy_sizes = sym_sizes_of(dy);
    const int rank = static_cast<int>(sizes.size());
    const ElementKind dtype = element_of(x, kBackwardOp, "x");
    const int d = check_gated_problem(kBackwardOp, dtype, rank, sizes.data(), dim);
    check_gated_dy(kBackwardOp, rank, sizes.data(), d, dtype, static_cast<int>(dy_sizes.size()),
                   dy_sizes.data(), element_of(dy, kBackwardOp, "dy"));
    return at::empty_symint(sizes, x.options());
  });
}

// ---- autograd --------------------------------------------------------------------

at::Tensor call_forward(const at::Tensor& x, const std::string& kind, int64_t dim,
                        bool gate_first) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, c10::string_view, int64_t, bool)>(
      "baracuda::gated_activation");
  return op.call(x, kind, dim, gate_first);
}

at::Tensor call_backward(const at::Tensor& dy, const at::Tensor& x, const std::string& kind,
                         int64_t dim, bool gate_first) {
  static auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t, bool)>(
          "baracuda::gated_activation_backward");
  return op.call(dy, x, kind, dim, gate_first);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GatedActivationFunction : public torch::autograd::Function<GatedActivationFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& kind,
                            int64_t dim, bool gate_first) {
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["gate_first"] = gate_first;
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView below;
    return call_forward(x, kind, dim, gate_first);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor dx;
    if (grads[0].defined())
      dx = call_backward(grads[0], x, ctx->saved_data["kind"].toStringRef(),
                         ctx->saved_data["dim"].toInt(), ctx->saved_data["gate_first"].toBool());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The backward op is differentiable only to say clearly that its own backward (the
// forward's second derivative) is not implemented.
class GatedActivationBackwardFunction
    : public torch::autograd::Function<GatedActivationBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& dy, const at::Tensor& x,
                            const std::string& kind, int64_t dim, bool gate_first) {
    at::AutoDispatchBelowADInplaceOrView below;
    return call_backward(dy, x, kind, dim, gate_first);
  }

  static variable_list backward(AutogradContext*, variable_list) {
    C10_THROW_ERROR(NotImplementedError,
                    "baracuda::gated_activation: double backward (the second derivative) is "
                    "not implemented");
  }
};

at::Tensor gated_activation_autograd(const at::Tensor& x, c10::string_view kind, int64_t dim,
                                     bool gate_first) {
  return GatedActivationFunction::apply(x, std::string(kind), dim, gate_first);
}

at::Tensor gated_activation_backward_autograd(const at::Tensor& dy, const at::Tensor& x,
                                              c10::string_view kind, int64_t dim,
                                              bool gate_first) {
  return GatedActivationBackwardFunction::apply(dy, x, std::string(kind), dim, gate_first);
}

// ---- gated_activation_pair: act(gate) * up -------------------------------------------

constexpr const char* kPairOp = "gated_activation_pair";
constexpr const char* kPairBackwardOp = "gated_activation_pair_backward";

GatedPairDescriptor describe_pair(const at::Tensor& gate, const at::Tensor& up,
                                  const std::string& kind, const std::string& op) {
  check_same_device(op, {{"gate", &gate}, {"up", &up}});
  GatedPairDescriptor desc;
  desc.kind = parse_gated_kind(kind, op);
  desc.gate = layout_of(gate, op, "gate");
  desc.up = layout_of(up, op, "up");
  desc.device = device_info(gate, op);
  return desc;
}

GatedPairPlan pair_plan(const at::Tensor& gate, const at::Tensor& up, const std::string& kind,
                        PlanPreference pref) {
  return GatedPairPlan::select(describe_pair(gate, up, kind, kPairOp), pref);
}

GatedPairBackwardPlan pair_backward_plan(const at::Tensor& dy, const at::Tensor& gate,
                                         const at::Tensor& up, const std::string& kind,
                                         PlanPreference pref) {
  check_same_device(kPairBackwardOp, {{"dy", &dy}, {"gate", &gate}, {"up", &up}});
  GatedPairBackwardDescriptor desc;
  desc.forward = describe_pair(gate, up, kind, kPairBackwardOp);
  desc.dy = layout_of(dy, kPairBackwardOp, "dy");
  return GatedPairBackwardPlan::select(desc, pref);
}

at::Tensor gated_activation_pair_kernel(const at::Tensor& gate, const at::Tensor& up,
                                        c10::string_view kind) {
  return translate_errors([&] {
    c10::DeviceGuard guard(gate.device());
    const auto plan = pair_plan(gate, up, std::string(kind), current_preference());
    at::Tensor y = allocate(plan.output_layout(), gate);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), gate);
    plan.run(current_stream(gate), workspace_of(ws),
             {ref_of(gate, kPairOp, "gate"), ref_of(up, kPairOp, "up"),
              mut_ref_of(y, kPairOp, "y")});
    return y;
  });
}

std::tuple<at::Tensor, at::Tensor> gated_activation_pair_backward_kernel(
    const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up, c10::string_view kind) {
  return translate_errors([&] {
    c10::DeviceGuard guard(gate.device());
    const auto plan = pair_backward_plan(dy, gate, up, std::string(kind), current_preference());
    at::Tensor dgate = allocate(plan.output_layout(), gate);
    at::Tensor dup = allocate(plan.output_layout(), gate);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), gate);
    plan.run(current_stream(gate), workspace_of(ws),
             {ref_of(dy, kPairBackwardOp, "dy"), ref_of(gate, kPairBackwardOp, "gate"),
              ref_of(up, kPairBackwardOp, "up"), mut_ref_of(dgate, kPairBackwardOp, "dgate"),
              mut_ref_of(dup, kPairBackwardOp, "dup")});
    return std::make_tuple(dgate, dup);
  });
}

// Meta kernels: the plans' problem checks on symbolic sizes, then the shapes.
at::Tensor gated_activation_pair_meta(const at::Tensor& gate, const at::Tensor& up,
                                      c10::string_view kind) {
  return translate_errors([&] {
    check_same_device(kPairOp, {{"gate", &gate}, {"up", &up}});
    parse_gated_kind(std::string(kind), kPairOp);
    const auto gs = sym_sizes_of(gate);
    const auto us = sym_sizes_of(up);
    const ElementKind gate_dtype = element_of(gate, kPairOp, "gate");  // gate's error first
    const ElementKind up_dtype = element_of(up, kPairOp, "up");
    check_gated_pair_problem(kPairOp, gate_dtype, static_cast<int>(gs.size()), gs.data(),
                             up_dtype, static_cast<int>(us.size()), us.data());
    return at::empty_symint(gs, gate.options());
  });
}

std::tuple<at::Tensor, at::Tensor> gated_activation_pair_backward_meta(const at::Tensor& dy,
                                                                       const at::Tensor& gate,
                                                                       const at::Tensor& up,
                                                                       c10::string_view kind) {
  return translate_errors([&] {
    check_same_device(kPairBackwardOp, {{"dy", &dy}, {"gate", &gate}, {"up", &up}});
    parse_gated_kind(std::string(kind), kPairBackwardOp);
    const auto gs = sym_sizes_of(gate);
    const auto us = sym_sizes_of(up);
    const auto ds = sym_sizes_of(dy);
    const ElementKind dtype = element_of(gate, kPairBackwardOp, "gate");
    const ElementKind up_dtype = element_of(up, kPairBackwardOp, "up");
    const int rank = static_cast<int>(gs.size());
    check_gated_pair_problem(kPairBackwardOp, dtype, rank, gs.data(), up_dtype,
                             static_cast<int>(us.size()), us.data());
    check_gated_pair_dy(kPairBackwardOp, rank, gs.data(), dtype, static_cast<int>(ds.size()),
                        ds.data(), element_of(dy, kPairBackwardOp, "dy"));
    return std::make_tuple(at::empty_symint(gs, gate.options()),
                           at::empty_symint(gs, gate.options()));
  });
}

at::Tensor call_pair_forward(const at::Tensor& gate, const at::Tensor& up,
                             const std::string& kind) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>(
      "baracuda::gated_activation_pair");
  return op.call(gate, up, kind);
}

std::tuple<at::Tensor, at::Tensor> call_pair_backward(const at::Tensor& dy,
                                                      const at::Tensor& gate,
                                                      const at::Tensor& up,
                                                      const std::string& kind) {
  static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view)>(
      "baracuda::gated_activation_pair_backward");
  return op.call(dy, gate, up, kind);
}

class GatedPairFunction : public torch::autograd::Function<GatedPairFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const std::string& kind) {
    ctx->saved_data["kind"] = kind;
    ctx->save_for_backward({gate, up});
    at::AutoDispatchBelowADInplaceOrView below;
    return call_pair_forward(gate, up, kind);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dgate, dup] =
        call_pair_backward(grads[0], saved[0], saved[1], ctx->saved_data["kind"].toStringRef());
    return {dgate, dup, at::Tensor()};
  }
};

// Differentiable only to say clearly that the second derivative is not implemented.
class GatedPairBackwardFunction : public torch::autograd::Function<GatedPairBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& dy, const at::Tensor& gate,
                               const at::Tensor& up, const std::string& kind) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [dgate, dup] = call_pair_backward(dy, gate, up, kind);
    return {dgate, dup};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    C10_THROW_ERROR(NotImplementedError,
                    "baracuda::gated_activation_pair: double backward (the second derivative) "
                    "is not implemented");
  }
};

at::Tensor gated_activation_pair_autograd(const at::Tensor& gate, const at::Tensor& up,
                                          c10::string_view kind) {
  return GatedPairFunction::apply(gate, up, std::string(kind));
}

std::tuple<at::Tensor, at::Tensor> gated_activation_pair_backward_autograd(
    const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up, c10::string_view kind) {
  auto out = GatedPairBackwardFunction::apply(dy, gate, up, std::string(kind));
  return std::make_tuple(out[0], out[1]);
}
}  // namespace

PlanInfo explain_gated_activation(const at::Tensor& x, const std::string& kind, int64_t dim,
                                  bool gate_first, const std::optional<std::string>& preference) {
  return explain_plan(preference, [&](PlanPreference pref) {
    return forward_plan(x, kind, dim, gate_first, pref);
  });
}

PlanInfo explain_gated_activation_backward(const at::Tensor& dy, const at::Tensor& x,
                                           const std::string& kind, int64_t dim, bool gate_first,
                                           const std::optional<std::string>& preference) {
  return explain_plan(preference, [&](PlanPreference pref) {
    return backward_plan(dy, x, kind, dim, gate_first, pref);
  });
}

PlanInfo explain_gated_activation_pair(const at::Tensor& gate, const at::Tensor& up,
                                       const std::string& kind,
                                       const std::optional<std::string>& preference) {
  return explain_plan(preference, [&](PlanPreference pref) {
    return pair_plan(gate, up, kind, pref);
  });
}

PlanInfo explain_gated_activation_pair_backward(const at::Tensor& dy, const at::Tensor& gate,
                                                const at::Tensor& up, const std::string& kind,
                                                const std::optional<std::string>& preference) {
  return explain_plan(preference, [&](PlanPreference pref) {
    return pair_backward_plan(dy, gate, up, kind, pref);
  });
}

BARACUDA_IMPL_OPS(
    op_impls("gated_activation", &gated_activation_kernel,
             &gated_activation_meta, &gated_activation_autograd),
    op_impls("gated_activation_backward", &gated_activation_backward_kernel,
             &gated_activation_backward_meta, &gated_activation_backward_autograd),
    op_impls("gated_activation_pair", &gated_activation_pair_kernel,
             &gated_activation_pair_meta, &gated_activation_pair_autograd),
    op_impls("gated_activation_pair_backward", &gated_activation_pair_backward_kernel,
             &gated_activation_pair_backward_meta, &gated_activation_pair_backward_autograd))

}  // namespace baracuda::torch_ops
