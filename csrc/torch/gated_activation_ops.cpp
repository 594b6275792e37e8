// baracuda::gated_activation(_backward) and baracuda::gated_activation_pair(_backward):
// CPU/CUDA kernels (tensor -> plan -> run), meta kernels (shapes only), and each op's
// declaration (schema, explain, derivative; see torch/op_def.h).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include <tuple>

#include "core/gated_activation_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "gated_activation";
constexpr const char* kBackwardOp = "gated_activation_backward";

GatedActivationDescriptor describe_forward(const at::Tensor& x, c10::string_view kind,
                                           int64_t dim, bool gate_first, const std::string& op) {
  GatedActivationDescriptor desc;
  desc.kind = parse_gated_kind(std::string(kind), op);
  desc.dim = dim;
  desc.gate_first = gate_first;
  desc.x = layout_of(x, op, "x");
  desc.device = device_info(x, op);
  return desc;
}

GatedActivationPlan forward_plan(const at::Tensor& x, c10::string_view kind, int64_t dim,
                                 bool gate_first, PlanPreference pref) {
  return GatedActivationPlan::select(describe_forward(x, kind, dim, gate_first, kOp), pref);
}

GatedActivationBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                          c10::string_view kind, int64_t dim, bool gate_first,
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
    const auto plan = forward_plan(x, kind, dim, gate_first, current_preference());
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
    const auto plan = backward_plan(dy, x, kind, dim, gate_first, current_preference());
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

// ---- gated_activation_pair: act(gate) * up -------------------------------------------

constexpr const char* kPairOp = "gated_activation_pair";
constexpr const char* kPairBackwardOp = "gated_activation_pair_backward";

GatedPairDescriptor describe_pair(const at::Tensor& gate, const at::Tensor& up,
                                  c10::string_view kind, const std::string& op) {
  check_same_device(op, {{"gate", &gate}, {"up", &up}});
  GatedPairDescriptor desc;
  desc.kind = parse_gated_kind(std::string(kind), op);
  desc.gate = layout_of(gate, op, "gate");
  desc.up = layout_of(up, op, "up");
  desc.device = device_info(gate, op);
  return desc;
}

GatedPairPlan pair_plan(const at::Tensor& gate, const at::Tensor& up, c10::string_view kind,
                        PlanPreference pref) {
  return GatedPairPlan::select(describe_pair(gate, up, kind, kPairOp), pref);
}

GatedPairBackwardPlan pair_backward_plan(const at::Tensor& dy, const at::Tensor& gate,
                                         const at::Tensor& up, c10::string_view kind,
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
    const auto plan = pair_plan(gate, up, kind, current_preference());
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
    const auto plan = pair_backward_plan(dy, gate, up, kind, current_preference());
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m, "gated_activation(Tensor x, str kind, int dim=-1, bool gate_first=False) -> Tensor")
      .kernel(&gated_activation_kernel)
      .meta(&gated_activation_meta)
      .explain(&forward_plan)
      .derivative("gated_activation_backward",
                  {grad(0), arg("x"), arg("kind"), arg("dim"), arg("gate_first")}, {{"x", 0}})
      .vmap_rows({"x"}, {"dim"});
  OpDef(m,
        "gated_activation_backward(Tensor dy, Tensor x, str kind, int dim=-1, "
        "bool gate_first=False) -> Tensor")
      .kernel(&gated_activation_backward_kernel)
      .meta(&gated_activation_backward_meta)
      .explain(&backward_plan)
      .not_differentiable("baracuda::gated_activation: double backward (the second derivative) "
                          "is not implemented")
      .vmap_rows({"dy", "x"}, {"dim"});

  // act(gate) * up with gate and up separate tensors of one shape (HF's
  // act(gate_proj(x)) * up_proj(x)); the backward returns (dgate, dup).
  OpDef(m, "gated_activation_pair(Tensor gate, Tensor up, str kind=\"swiglu\") -> Tensor")
      .kernel(&gated_activation_pair_kernel)
      .meta(&gated_activation_pair_meta)
      .explain(&pair_plan)
      .derivative("gated_activation_pair_backward",
                  {grad(0), arg("gate"), arg("up"), arg("kind")}, {{"gate", 0}, {"up", 1}})
      .vmap_rows({"gate", "up"});
  OpDef(m,
        "gated_activation_pair_backward(Tensor dy, Tensor gate, Tensor up, "
        "str kind=\"swiglu\") -> (Tensor, Tensor)")
      .kernel(&gated_activation_pair_backward_kernel)
      .meta(&gated_activation_pair_backward_meta)
      .explain(&pair_backward_plan)
      .not_differentiable("baracuda::gated_activation_pair: double backward (the second "
                          "derivative) is not implemented")
      .vmap_rows({"dy", "gate", "up"});
}

}  // namespace baracuda::torch_ops
