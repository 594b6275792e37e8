// baracuda::gated_activation and baracuda::gated_activation_backward: CPU/CUDA kernels
// (tensor -> plan -> run), meta kernels (shapes only), and the autograd Function that
// connects the forward plan to the backward op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

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
  desc.device = device_info(x);
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
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("baracuda::gated_activation", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t, bool)>();
  return op.call(x, kind, dim, gate_first);
}

at::Tensor call_backward(const at::Tensor& dy, const at::Tensor& x, const std::string& kind,
                         int64_t dim, bool gate_first) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("baracuda::gated_activation_backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                            bool)>();
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
}  // namespace

PlanInfo explain_gated_activation(const at::Tensor& x, const std::string& kind, int64_t dim,
                                  bool gate_first, const std::optional<std::string>& preference) {
  return translate_errors([&] {
    const PlanPreference pref = preference_or_current(preference);
    return plan_info(forward_plan(x, kind, dim, gate_first, pref), pref);
  });
}

PlanInfo explain_gated_activation_backward(const at::Tensor& dy, const at::Tensor& x,
                                           const std::string& kind, int64_t dim, bool gate_first,
                                           const std::optional<std::string>& preference) {
  return translate_errors([&] {
    const PlanPreference pref = preference_or_current(preference);
    return plan_info(backward_plan(dy, x, kind, dim, gate_first, pref), pref);
  });
}

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("gated_activation", &gated_activation_kernel);
  m.impl("gated_activation_backward", &gated_activation_backward_kernel);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("gated_activation", &gated_activation_kernel);
  m.impl("gated_activation_backward", &gated_activation_backward_kernel);
}
#endif

TORCH_LIBRARY_IMPL(baracuda, Meta, m) {
  m.impl("gated_activation", &gated_activation_meta);
  m.impl("gated_activation_backward", &gated_activation_backward_meta);
}

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("gated_activation", &gated_activation_autograd);
  m.impl("gated_activation_backward", &gated_activation_backward_autograd);
}

}  // namespace baracuda::torch_ops
