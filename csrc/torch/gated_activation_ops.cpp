// baracuda::gated_activation(_backward) and baracuda::gated_activation_pair(_backward):
// CPU/CUDA kernels (tensor -> plan -> run), meta kernels (shapes only), and each op's
// declaration (schema, explain, derivative; see torch/op_def.h).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/strides.h>

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

constexpr const char* kPairInPlaceOp = "gated_activation_pair_backward_";

GatedPairBackwardPlan pair_backward_plan_of(const at::Tensor& dy, const at::Tensor& gate,
                                            const at::Tensor& up, c10::string_view kind,
                                            PlanPreference pref, bool in_place) {
  const char* op = in_place ? kPairInPlaceOp : kPairBackwardOp;
  check_same_device(op, {{"dy", &dy}, {"gate", &gate}, {"up", &up}});
  GatedPairBackwardDescriptor desc;
  desc.forward = describe_pair(gate, up, kind, op);
  desc.dy = layout_of(dy, op, "dy");
  desc.in_place = in_place;
  return GatedPairBackwardPlan::select(desc, pref);
}

GatedPairBackwardPlan pair_backward_plan(const at::Tensor& dy, const at::Tensor& gate,
                                         const at::Tensor& up, c10::string_view kind,
                                         PlanPreference pref) {
  return pair_backward_plan_of(dy, gate, up, kind, pref, /*in_place=*/false);
}

// gated_activation_pair_backward_: gate, up and dy in three storages (a gradient written
// over its input must not land where another operand is read).
void check_in_place_apart(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) {
  using Pair = std::tuple<const at::Tensor*, const char*, const at::Tensor*, const char*>;
  for (const auto& [a, an, b, bn] :
       {Pair{&gate, "gate", &up, "up"}, Pair{&dy, "dy", &gate, "gate"}, Pair{&dy, "dy", &up, "up"}})
    if (a->is_alias_of(*b))
      fail(PlanErrorKind::InvalidProblem, kPairInPlaceOp,
           std::string(an) + " and " + bn + " must not share a storage (each gradient is written over its own "
           "input)");
}

GatedPairBackwardPlan pair_in_place_plan(const at::Tensor& dy, const at::Tensor& gate,
                                         const at::Tensor& up, c10::string_view kind,
                                         PlanPreference pref) {
  auto plan = pair_backward_plan_of(dy, gate, up, kind, pref, /*in_place=*/true);
  check_in_place_apart(dy, gate, up);
  return plan;
}

// A contiguous tensor with the row-major strides torch and the plan's output layout give
// (a size-1 dim's stride may be anything in a contiguous tensor).
at::Tensor canonical(const at::Tensor& t) {
  if (!t.is_contiguous()) return t;
  const auto strides = c10::contiguous_strides(t.sizes());
  return t.strides() == c10::IntArrayRef(strides) ? t : t.as_strided(t.sizes(), strides);
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

// dgate and dup written over gate and up (the autograd's reuse_saved: see op_def.h).
void gated_activation_pair_backward_in_place_kernel(const at::Tensor& dy, const at::Tensor& gate_in,
                                                    const at::Tensor& up_in, c10::string_view kind) {
  translate_errors([&] {
    c10::DeviceGuard guard(gate_in.device());
    at::Tensor gate = canonical(gate_in), up = canonical(up_in);
    const auto plan = pair_in_place_plan(dy, gate, up, kind, current_preference());
    at::Tensor ws = allocate_workspace(plan.workspace_size(), gate);
    plan.run(current_stream(gate), workspace_of(ws),
             {ref_of(dy, kPairInPlaceOp, "dy"), ref_of(gate, kPairInPlaceOp, "gate"),
              ref_of(up, kPairInPlaceOp, "up"), mut_ref_of(gate, kPairInPlaceOp, "gate"),
              mut_ref_of(up, kPairInPlaceOp, "up")});
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

// The backward ops' problem checks on symbolic sizes (`op` names the op in errors).
void check_pair_backward_meta(const char* op, const at::Tensor& dy, const at::Tensor& gate,
                              const at::Tensor& up, c10::string_view kind) {
  check_same_device(op, {{"dy", &dy}, {"gate", &gate}, {"up", &up}});
  parse_gated_kind(std::string(kind), op);
  const auto gs = sym_sizes_of(gate);
  const auto us = sym_sizes_of(up);
  const auto ds = sym_sizes_of(dy);
  const ElementKind dtype = element_of(gate, op, "gate");
  const ElementKind up_dtype = element_of(up, op, "up");
  const int rank = static_cast<int>(gs.size());
  check_gated_pair_problem(op, dtype, rank, gs.data(), up_dtype, static_cast<int>(us.size()), us.data());
  check_gated_pair_dy(op, rank, gs.data(), dtype, static_cast<int>(ds.size()), ds.data(),
                      element_of(dy, op, "dy"));
}

std::tuple<at::Tensor, at::Tensor> gated_activation_pair_backward_meta(const at::Tensor& dy,
                                                                       const at::Tensor& gate,
                                                                       const at::Tensor& up,
                                                                       c10::string_view kind) {
  return translate_errors([&] {
    check_pair_backward_meta(kPairBackwardOp, dy, gate, up, kind);
    return std::make_tuple(at::empty_symint(gate.sym_sizes(), gate.options()),
                           at::empty_symint(gate.sym_sizes(), gate.options()));
  });
}

void gated_activation_pair_backward_in_place_meta(const at::Tensor& dy, const at::Tensor& gate,
                                                  const at::Tensor& up, c10::string_view kind) {
  translate_errors([&] {
    check_pair_backward_meta(kPairInPlaceOp, dy, gate, up, kind);
    for (const auto& [t, name] : {std::pair{&gate, "gate"}, std::pair{&up, "up"}})
      check_gated_pair_overwritable(kPairInPlaceOp, name, t->is_contiguous(), t->sym_strides().data(),
                                    static_cast<int>(t->dim()));
    check_in_place_apart(dy, gate, up);
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
      .reuse_saved("gated_activation_pair_backward_", {{0, "gate"}, {1, "up"}})
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
  // The backward written over its inputs: gate becomes dgate and up dup (what the pair's
  // autograd calls where nothing else can see gate and up: OpDef::reuse_saved).
  OpDef(m,
        "gated_activation_pair_backward_(Tensor dy, Tensor(a!) gate, Tensor(b!) up, "
        "str kind=\"swiglu\") -> ()")
      .kernel(&gated_activation_pair_backward_in_place_kernel)
      .meta(&gated_activation_pair_backward_in_place_meta)
      .explain(&pair_in_place_plan)
      .not_differentiable("baracuda::gated_activation_pair_backward_ is a backward (not differentiable)");
}

}  // namespace baracuda::torch_ops
