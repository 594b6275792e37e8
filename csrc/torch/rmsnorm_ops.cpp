// baracuda::rms_norm, baracuda::add_rms_norm (the residual add before it) and their
// backward baracuda::rms_norm_backward: CPU/CUDA kernels (tensor -> plan -> run), meta
// kernels (shapes only), and the ops' declarations (torch/op_def.h).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include <tuple>

#include "core/rmsnorm_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "rms_norm";
constexpr const char* kAddOp = "add_rms_norm";
constexpr const char* kBackwardOp = "rms_norm_backward";

using OptTensor = std::optional<at::Tensor>;
using Tensors2 = std::tuple<at::Tensor, at::Tensor>;
using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

const at::Tensor* given(const OptTensor& t) { return t && t->defined() ? &*t : nullptr; }

// `residual` null: rms_norm; else add_rms_norm.
RmsNormPlan forward_plan(const at::Tensor& x, const at::Tensor* residual, const at::Tensor* weight,
                         std::optional<double> eps, c10::string_view convention,
                         PlanPreference pref) {
  const char* op = residual ? kAddOp : kOp;
  const at::Tensor none;
  check_same_device(op, {{"x", &x}, {"residual", residual ? residual : &none},
                         {"weight", weight ? weight : &none}});
  RmsNormDescriptor d;
  d.convention = parse_rms_norm_convention(std::string(convention), op);
  d.x = layout_of(x, op, "x");
  d.has_residual = residual != nullptr;
  if (residual) d.residual = layout_of(*residual, op, "residual");
  d.has_weight = weight != nullptr;
  if (weight) d.weight = layout_of(*weight, op, "weight");
  d.eps = eps;
  d.device = device_info(x, op);
  return RmsNormPlan::select(d, pref);
}

RmsNormBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                  const at::Tensor* weight, const at::Tensor& rstd,
                                  c10::string_view convention, const at::Tensor* dh,
                                  PlanPreference pref) {
  const at::Tensor none;
  check_same_device(kBackwardOp, {{"dy", &dy}, {"x", &x}, {"weight", weight ? weight : &none},
                                  {"rstd", &rstd}, {"dh", dh ? dh : &none}});
  RmsNormBackwardDescriptor d;
  d.convention = parse_rms_norm_convention(std::string(convention), kBackwardOp);
  d.dy = layout_of(dy, kBackwardOp, "dy");
  d.x = layout_of(x, kBackwardOp, "x");
  d.has_weight = weight != nullptr;
  if (weight) d.weight = layout_of(*weight, kBackwardOp, "weight");
  d.rstd = layout_of(rstd, kBackwardOp, "rstd");
  d.has_dh = dh != nullptr;
  if (dh) d.dh = layout_of(*dh, kBackwardOp, "dh");
  d.device = device_info(x, kBackwardOp);
  return RmsNormBackwardPlan::select(d, pref);
}

// (y, h, rstd); h undefined for rms_norm.
Tensors3 run_forward(const at::Tensor& x, const at::Tensor* residual, const OptTensor& weight,
                     std::optional<double> eps, c10::string_view convention) {
  return translate_errors([&] {
    const char* op = residual ? kAddOp : kOp;
    c10::DeviceGuard guard(x.device());
    const auto plan = forward_plan(x, residual, given(weight), eps, convention, current_preference());
    at::Tensor y = allocate(plan.y_layout(), x);
    at::Tensor h = residual ? allocate(plan.h_layout(), x) : at::Tensor();
    at::Tensor rstd = allocate(plan.rstd_layout(), x);
    RmsNormArgs a;
    a.x = ref_of(x, op, "x");
    if (residual) a.residual = ref_of(*residual, op, "residual");
    if (given(weight)) a.weight = ref_of(*weight, op, "weight");
    a.y = mut_ref_of(y, op, "y");
    if (residual) a.h = mut_ref_of(h, op, "h");
    a.rstd = mut_ref_of(rstd, op, "rstd");
    plan.run(current_stream(x), Workspace{}, a);
    return Tensors3(y, h, rstd);
  });
}

Tensors2 rms_norm_kernel(const at::Tensor& x, const OptTensor& weight, std::optional<double> eps,
                         c10::string_view convention) {
  auto [y, h, rstd] = run_forward(x, nullptr, weight, eps, convention);
  return Tensors2(y, rstd);
}

Tensors3 add_rms_norm_kernel(const at::Tensor& x, const at::Tensor& residual,
                             const OptTensor& weight, std::optional<double> eps,
                             c10::string_view convention) {
  return run_forward(x, &residual, weight, eps, convention);
}

Tensors2 rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                  const OptTensor& weight, const at::Tensor& rstd,
                                  c10::string_view convention, const OptTensor& dh) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = backward_plan(dy, x, given(weight), rstd, convention, given(dh),
                                    current_preference());
    at::Tensor dx = allocate(plan.dx_layout(), x);
    at::Tensor dw = allocate(plan.dw_layout(), x);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    RmsNormBackwardArgs a;
    a.dy = ref_of(dy, kBackwardOp, "dy");
    a.x = ref_of(x, kBackwardOp, "x");
    if (given(weight)) a.weight = ref_of(*weight, kBackwardOp, "weight");
    a.rstd = ref_of(rstd, kBackwardOp, "rstd");
    if (given(dh)) a.dh = ref_of(*dh, kBackwardOp, "dh");
    a.dx = mut_ref_of(dx, kBackwardOp, "dx");
    a.dw = mut_ref_of(dw, kBackwardOp, "dw");
    plan.run(current_stream(x), workspace_of(ws), a);
    return Tensors2(dx, dw);
  });
}

// ---- meta (fake) kernels: the plans' checks on symbolic sizes, in the real kernels'
// order, then the shapes -----------------------------------------------------------------

struct SymOperand {
  ElementKind dtype = ElementKind::F32;
  std::vector<c10::SymInt> sizes;
  int rank() const { return static_cast<int>(sizes.size()); }
};

SymOperand sym_operand(const at::Tensor* t, const std::string& op, const char* what) {
  SymOperand o;
  if (t) {
    o.dtype = element_of(*t, op, what);
    o.sizes = sym_sizes_of(*t);
  }
  return o;
}

Tensors3 forward_meta(const at::Tensor& x, const at::Tensor* residual, const OptTensor& weight_opt,
                      std::optional<double> eps, c10::string_view convention) {
  return translate_errors([&] {
    const char* op = residual ? kAddOp : kOp;
    const at::Tensor* weight = given(weight_opt);
    const at::Tensor none;
    check_same_device(op, {{"x", &x}, {"residual", residual ? residual : &none},
                           {"weight", weight ? weight : &none}});
    const RmsNormConvention c = parse_rms_norm_convention(std::string(convention), op);
    const SymOperand xs = sym_operand(&x, op, "x"), rs = sym_operand(residual, op, "residual"),
                     ws = sym_operand(weight, op, "weight");
    check_rms_norm_problem(op, "x", xs.dtype, xs.rank(), xs.sizes.data(), ws.dtype,
                           weight ? ws.rank() : -1, ws.sizes.data(), "residual", rs.dtype,
                           residual ? rs.rank() : -1, rs.sizes.data());
    resolve_rms_norm_eps(op, eps, xs.dtype);
    const auto out = scalar_type_of(rms_norm_out_dtype(xs.dtype, weight != nullptr, ws.dtype, c));
    const std::vector<c10::SymInt> lead(xs.sizes.begin(), xs.sizes.end() - 1);
    return Tensors3(at::empty_symint(xs.sizes, x.options().dtype(out)),
                    residual ? at::empty_symint(xs.sizes, x.options()) : at::Tensor(),
                    at::empty_symint(lead, x.options().dtype(
                                               scalar_type_of(rms_norm_rstd_dtype(xs.dtype)))));
  });
}

Tensors2 rms_norm_meta(const at::Tensor& x, const OptTensor& weight, std::optional<double> eps,
                       c10::string_view convention) {
  auto [y, h, rstd] = forward_meta(x, nullptr, weight, eps, convention);
  return Tensors2(y, rstd);
}

Tensors3 add_rms_norm_meta(const at::Tensor& x, const at::Tensor& residual, const OptTensor& weight,
                           std::optional<double> eps, c10::string_view convention) {
  return forward_meta(x, &residual, weight, eps, convention);
}

Tensors2 rms_norm_backward_meta(const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight_opt,
                                const at::Tensor& rstd, c10::string_view convention,
                                const OptTensor& dh_opt) {
  return translate_errors([&] {
    const at::Tensor* weight = given(weight_opt);
    const at::Tensor* dh = given(dh_opt);
    const at::Tensor none;
    check_same_device(kBackwardOp, {{"dy", &dy}, {"x", &x}, {"weight", weight ? weight : &none},
                                    {"rstd", &rstd}, {"dh", dh ? dh : &none}});
    const RmsNormConvention c = parse_rms_norm_convention(std::string(convention), kBackwardOp);
    const SymOperand ds = sym_operand(&dy, kBackwardOp, "dy"), xs = sym_operand(&x, kBackwardOp, "x"),
                     ws = sym_operand(weight, kBackwardOp, "weight"),
                     rs = sym_operand(&rstd, kBackwardOp, "rstd"),
                     hs = sym_operand(dh, kBackwardOp, "dh");
    check_rms_norm_problem(kBackwardOp, "x", xs.dtype, xs.rank(), xs.sizes.data(), ws.dtype,
                           weight ? ws.rank() : -1, ws.sizes.data(), "dh", hs.dtype,
                           dh ? hs.rank() : -1, hs.sizes.data());
    check_rms_norm_backward(kBackwardOp, xs.dtype, xs.rank(), xs.sizes.data(),
                            rms_norm_out_dtype(xs.dtype, weight != nullptr, ws.dtype, c), ds.dtype,
                            ds.rank(), ds.sizes.data(), rs.dtype, rs.rank(), rs.sizes.data());
    std::vector<c10::SymInt> dw_sizes{weight ? xs.sizes.back() : c10::SymInt(0)};
    return Tensors2(at::empty_symint(xs.sizes, x.options()),
                    at::empty_symint(dw_sizes, x.options().dtype(scalar_type_of(
                                                   weight ? ws.dtype : xs.dtype))));
  });
}

// The plans explain reports, one per op.
RmsNormPlan rms_norm_plan(const at::Tensor& x, const OptTensor& weight, std::optional<double> eps,
                          c10::string_view convention, PlanPreference pref) {
  return forward_plan(x, nullptr, given(weight), eps, convention, pref);
}

RmsNormPlan add_rms_norm_plan(const at::Tensor& x, const at::Tensor& residual,
                              const OptTensor& weight, std::optional<double> eps,
                              c10::string_view convention, PlanPreference pref) {
  return forward_plan(x, &residual, given(weight), eps, convention, pref);
}

RmsNormBackwardPlan rms_norm_backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                           const OptTensor& weight, const at::Tensor& rstd,
                                           c10::string_view convention, const OptTensor& dh,
                                           PlanPreference pref) {
  return backward_plan(dy, x, given(weight), rstd, convention, given(dh), pref);
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  // -> (y, rstd); rstd [x.shape[:-1]] float32 (float64 for float64 x), saved for the backward.
  OpDef(m,
        "rms_norm(Tensor x, Tensor? weight=None, float? eps=None, str convention=\"torch\") "
        "-> (Tensor, Tensor)")
      .kernel(&rms_norm_kernel)
      .meta(&rms_norm_meta)
      .explain(&rms_norm_plan)
      .derivative("rms_norm_backward",
                  {grad(0), arg("x"), arg("weight"), output(1), arg("convention"), none()},
                  {{"x", 0}, {"weight", 1}})
      .vmap_rows({"x"});
  // h = x + residual, normalized: -> (y, h, rstd). The backward normalizes h, and h's own
  // gradient (its later uses in the residual stream) joins dx: dresidual = dx.
  OpDef(m,
        "add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, float? eps=None, "
        "str convention=\"torch\") -> (Tensor, Tensor, Tensor)")
      .kernel(&add_rms_norm_kernel)
      .meta(&add_rms_norm_meta)
      .explain(&add_rms_norm_plan)
      .derivative("rms_norm_backward",
                  {grad(0), output(1), arg("weight"), output(2), arg("convention"), grad(1)},
                  {{"x", 0}, {"residual", 0}, {"weight", 1}})
      .vmap_rows({"x", "residual"});
  // -> (dx (+ dh), dw); dw is an empty tensor without a weight. vmap runs it once per
  // sample (dw sums over the rows).
  OpDef(m,
        "rms_norm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, "
        "str convention=\"torch\", Tensor? dh=None) -> (Tensor, Tensor)")
      .kernel(&rms_norm_backward_kernel)
      .meta(&rms_norm_backward_meta)
      .explain(&rms_norm_backward_plan)
      .not_differentiable("baracuda::rms_norm: double backward (the second derivative) is not "
                          "implemented");
}

}  // namespace baracuda::torch_ops
