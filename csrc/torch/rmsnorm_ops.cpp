// baracuda::rms_norm, baracuda::add_rms_norm (the residual add before it) and their
// backward baracuda::rms_norm_backward (and rms_norm_backward_, which writes dx over dy:
// the autograd's reuse_grad), and the gated RMSNorm baracuda::gated_rms_norm and
// its backward baracuda::gated_rms_norm_backward (and gated_rms_norm_backward_into, which
// writes dz into the caller's tensor and can recompute y): CPU/CUDA kernels (tensor ->
// plan -> run), meta kernels (shapes only), and the ops' declarations (torch/op_def.h).
#include <ATen/MemoryOverlap.h>
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
constexpr const char* kBackwardInPlaceOp = "rms_norm_backward_";
constexpr const char* kGatedOp = "gated_rms_norm";
constexpr const char* kGatedBackwardOp = "gated_rms_norm_backward";
constexpr const char* kGatedBackwardIntoOp = "gated_rms_norm_backward_into";

using OptTensor = std::optional<at::Tensor>;
using Tensors2 = std::tuple<at::Tensor, at::Tensor>;
using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensors4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

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

// rms_norm_backward_: dy shares no storage with the other tensors (dx is written over it).
void check_dy_apart(const at::Tensor& dy, const at::Tensor& x, const at::Tensor* weight, const at::Tensor& rstd,
                    const at::Tensor* dh) {
  for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{weight, "weight"}, std::pair{&rstd, "rstd"},
                                std::pair{dh, "dh"}})
    if (t && dy.is_alias_of(*t))
      fail(PlanErrorKind::InvalidProblem, kBackwardInPlaceOp,
           std::string("dy and ") + name + " must not share a storage (dx is written over dy)");
}

// dx_over_dy: rms_norm_backward_ (dx written over dy).
RmsNormBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                  const at::Tensor* weight, const at::Tensor& rstd,
                                  c10::string_view convention, const at::Tensor* dh,
                                  PlanPreference pref, bool dx_over_dy = false) {
  const char* op = dx_over_dy ? kBackwardInPlaceOp : kBackwardOp;
  const at::Tensor none;
  check_same_device(op, {{"dy", &dy}, {"x", &x}, {"weight", weight ? weight : &none},
                         {"rstd", &rstd}, {"dh", dh ? dh : &none}});
  RmsNormBackwardDescriptor d;
  d.convention = parse_rms_norm_convention(std::string(convention), op);
  d.dy = layout_of(dy, op, "dy");
  d.x = layout_of(x, op, "x");
  d.has_weight = weight != nullptr;
  if (weight) d.weight = layout_of(*weight, op, "weight");
  d.rstd = layout_of(rstd, op, "rstd");
  d.has_dh = dh != nullptr;
  if (dh) d.dh = layout_of(*dh, op, "dh");
  d.dx_over_dy = dx_over_dy;
  d.device = device_info(x, op);
  auto plan = RmsNormBackwardPlan::select(d, pref);
  if (dx_over_dy) check_dy_apart(dy, x, weight, rstd, dh);
  return plan;
}

RmsNormGated gated_options(const at::Tensor* bias, const at::Tensor* z,
                           std::optional<int64_t> group_size, bool norm_before_gate,
                           const char* op) {
  RmsNormGated g;
  g.on = true;
  g.has_bias = bias != nullptr;
  if (bias) g.bias = layout_of(*bias, op, "bias");
  g.has_z = z != nullptr;
  if (z) g.z = layout_of(*z, op, "z");
  g.group_size = group_size;
  g.norm_before_gate = norm_before_gate;
  return g;
}

RmsNormPlan gated_forward_plan(const at::Tensor& x, const at::Tensor& weight,
                               const OptTensor& bias_opt, const OptTensor& z_opt, double eps,
                               std::optional<int64_t> group_size, bool norm_before_gate,
                               PlanPreference pref) {
  const at::Tensor *bias = given(bias_opt), *z = given(z_opt);
  const at::Tensor none;
  check_same_device(kGatedOp, {{"x", &x}, {"weight", &weight}, {"bias", bias ? bias : &none},
                               {"z", z ? z : &none}});
  RmsNormDescriptor d;
  d.x = layout_of(x, kGatedOp, "x");
  d.has_weight = true;
  d.weight = layout_of(weight, kGatedOp, "weight");
  d.eps = eps;
  d.gated = gated_options(bias, z, group_size, norm_before_gate, kGatedOp);
  d.device = device_info(x, kGatedOp);
  return RmsNormPlan::select(d, pref);
}

// dz_into: gated_rms_norm_backward_into's dz (null: gated_rms_norm_backward).
RmsNormBackwardPlan gated_backward_plan_of(const at::Tensor& dy, const at::Tensor& x,
                                           const at::Tensor& weight, const OptTensor& bias_opt,
                                           const OptTensor& z_opt, const at::Tensor& rstd,
                                           const at::Tensor* dz_into, std::optional<int64_t> group_size,
                                           bool norm_before_gate, bool recompute_output,
                                           PlanPreference pref) {
  const char* op = dz_into ? kGatedBackwardIntoOp : kGatedBackwardOp;
  const at::Tensor *bias = given(bias_opt), *z = given(z_opt);
  const at::Tensor none;
  check_same_device(op, {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"bias", bias ? bias : &none},
                         {"z", z ? z : &none}, {"rstd", &rstd}, {"dz", dz_into ? dz_into : &none}});
  RmsNormBackwardDescriptor d;
  d.dy = layout_of(dy, op, "dy");
  d.x = layout_of(x, op, "x");
  d.has_weight = true;
  d.weight = layout_of(weight, op, "weight");
  d.rstd = layout_of(rstd, op, "rstd");
  d.gated = gated_options(bias, z, group_size, norm_before_gate, op);
  d.has_dz_into = dz_into != nullptr;
  if (dz_into) d.dz_into = layout_of(*dz_into, op, "dz");
  d.recompute_output = recompute_output;
  d.device = device_info(x, op);
  return RmsNormBackwardPlan::select(d, pref);
}

RmsNormBackwardPlan gated_backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                        const at::Tensor& weight, const OptTensor& bias,
                                        const OptTensor& z, const at::Tensor& rstd,
                                        std::optional<int64_t> group_size, bool norm_before_gate,
                                        PlanPreference pref) {
  return gated_backward_plan_of(dy, x, weight, bias, z, rstd, nullptr, group_size, norm_before_gate, false,
                                pref);
}

RmsNormBackwardPlan gated_backward_into_plan(const at::Tensor& dy, const at::Tensor& x,
                                             const at::Tensor& weight, const OptTensor& bias,
                                             const at::Tensor& z, const at::Tensor& rstd, const at::Tensor& dz,
                                             std::optional<int64_t> group_size, bool norm_before_gate,
                                             bool recompute_output, PlanPreference pref) {
  return gated_backward_plan_of(dy, x, weight, bias, z, rstd, &dz, group_size, norm_before_gate,
                                recompute_output, pref);
}

// A call's optional operands (null: absent).
struct Operands {
  const at::Tensor* residual = nullptr;
  const at::Tensor* weight = nullptr;
  const at::Tensor* bias = nullptr;
  const at::Tensor* z = nullptr;
  const at::Tensor* dh = nullptr;
};

// Runs a forward plan: (y, h, rstd); h undefined without a residual.
Tensors3 run_forward(const RmsNormPlan& plan, const char* op, const at::Tensor& x,
                     const Operands& o) {
  at::Tensor y = allocate(plan.y_layout(), x);
  at::Tensor h = o.residual ? allocate(plan.h_layout(), x) : at::Tensor();
  at::Tensor rstd = allocate(plan.rstd_layout(), x);
  RmsNormArgs a;
  a.x = ref_of(x, op, "x");
  if (o.residual) a.residual = ref_of(*o.residual, op, "residual");
  if (o.weight) a.weight = ref_of(*o.weight, op, "weight");
  if (o.bias) a.bias = ref_of(*o.bias, op, "bias");
  if (o.z) a.z = ref_of(*o.z, op, "z");
  a.y = mut_ref_of(y, op, "y");
  if (o.residual) a.h = mut_ref_of(h, op, "h");
  a.rstd = mut_ref_of(rstd, op, "rstd");
  plan.run(current_stream(x), Workspace{}, a);
  return Tensors3(y, h, rstd);
}

// Runs a backward plan: (dx, dw, db, dz, y); db, dz and y undefined for
// rms_norm_backward; dz: the caller's (gated_rms_norm_backward_into), or allocated; dx:
// dy itself (rms_norm_backward_, dx_over_dy), or allocated.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_backward(
    const RmsNormBackwardPlan& plan, const char* op, const at::Tensor& dy, const at::Tensor& x,
    const at::Tensor& rstd, const Operands& o, bool gated, const at::Tensor* dz_into = nullptr,
    bool dx_over_dy = false) {
  if (dz_into)
    check_no_shared_memory(op, "dz", *dz_into, {{"dy", &dy}, {"x", &x}, {"weight", o.weight}, {"bias", o.bias},
                                                {"z", o.z}, {"rstd", &rstd}});
  at::Tensor dx = dx_over_dy ? dy : allocate(plan.dx_layout(), x);
  at::Tensor dw = allocate(plan.dw_layout(), x);
  at::Tensor db = gated ? allocate(plan.db_layout(), x) : at::Tensor();
  at::Tensor dz = dz_into ? *dz_into : gated ? allocate(plan.dz_layout(), x) : at::Tensor();
  at::Tensor y = gated ? allocate(plan.y_layout(), x) : at::Tensor();
  at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
  RmsNormBackwardArgs a;
  a.dy = ref_of(dy, op, "dy");
  a.x = ref_of(x, op, "x");
  if (o.weight) a.weight = ref_of(*o.weight, op, "weight");
  a.rstd = ref_of(rstd, op, "rstd");
  if (o.dh) a.dh = ref_of(*o.dh, op, "dh");
  if (o.bias) a.bias = ref_of(*o.bias, op, "bias");
  if (o.z) a.z = ref_of(*o.z, op, "z");
  a.dx = mut_ref_of(dx, op, "dx");
  a.dw = mut_ref_of(dw, op, "dw");
  if (gated) {
    a.db = mut_ref_of(db, op, "db");
    a.dz = mut_ref_of(dz, op, "dz");
    a.y = mut_ref_of(y, op, "y");
  }
  plan.run(current_stream(x), workspace_of(ws), a);
  return {dx, dw, db, dz, y};
}

// (y, h, rstd); h undefined for rms_norm.
Tensors3 plain_forward(const at::Tensor& x, const at::Tensor* residual, const OptTensor& weight,
                       std::optional<double> eps, c10::string_view convention) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = forward_plan(x, residual, given(weight), eps, convention, current_preference());
    return run_forward(plan, residual ? kAddOp : kOp, x, {residual, given(weight)});
  });
}

Tensors2 rms_norm_kernel(const at::Tensor& x, const OptTensor& weight, std::optional<double> eps,
                         c10::string_view convention) {
  auto [y, h, rstd] = plain_forward(x, nullptr, weight, eps, convention);
  return Tensors2(y, rstd);
}

Tensors3 add_rms_norm_kernel(const at::Tensor& x, const at::Tensor& residual,
                             const OptTensor& weight, std::optional<double> eps,
                             c10::string_view convention) {
  return plain_forward(x, &residual, weight, eps, convention);
}

// (dx, dw); dx_over_dy: rms_norm_backward_'s (dx is dy).
Tensors2 plain_backward(const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight, const at::Tensor& rstd,
                        c10::string_view convention, const OptTensor& dh, bool dx_over_dy) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = backward_plan(dy, x, given(weight), rstd, convention, given(dh), current_preference(),
                                    dx_over_dy);
    Operands o;
    o.weight = given(weight);
    o.dh = given(dh);
    auto [dx, dw, db, dz, y] = run_backward(plan, dx_over_dy ? kBackwardInPlaceOp : kBackwardOp, dy, x, rstd, o,
                                            false, nullptr, dx_over_dy);
    return Tensors2(dx, dw);
  });
}

Tensors2 rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                  const OptTensor& weight, const at::Tensor& rstd,
                                  c10::string_view convention, const OptTensor& dh) {
  return plain_backward(dy, x, weight, rstd, convention, dh, false);
}

// dx written over dy (the autograd's reuse_grad: see op_def.h) -> dw.
at::Tensor rms_norm_backward_in_place_kernel(const at::Tensor& dy, const at::Tensor& x,
                                             const OptTensor& weight, const at::Tensor& rstd,
                                             c10::string_view convention, const OptTensor& dh) {
  return std::get<1>(plain_backward(dy, x, weight, rstd, convention, dh, true));
}

Tensors2 gated_rms_norm_kernel(const at::Tensor& x, const at::Tensor& weight,
                               const OptTensor& bias, const OptTensor& z, double eps,
                               std::optional<int64_t> group_size, bool norm_before_gate) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = gated_forward_plan(x, weight, bias, z, eps, group_size, norm_before_gate,
                                         current_preference());
    auto [y, h, rstd] = run_forward(plan, kGatedOp, x, {nullptr, &weight, given(bias), given(z)});
    return Tensors2(y, rstd);
  });
}

Tensors4 gated_rms_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                        const at::Tensor& weight, const OptTensor& bias,
                                        const OptTensor& z, const at::Tensor& rstd,
                                        std::optional<int64_t> group_size, bool norm_before_gate) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = gated_backward_plan(dy, x, weight, bias, z, rstd, group_size,
                                          norm_before_gate, current_preference());
    auto [dx, dw, db, dz, y] =
        run_backward(plan, kGatedBackwardOp, dy, x, rstd, {nullptr, &weight, given(bias), given(z)}, true);
    return Tensors4(dx, dw, db, dz);
  });
}

// dz written into the caller's tensor -> (dx, dw, db, y); y is [0] unless recompute_output.
Tensors4 gated_rms_norm_backward_into_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                             const OptTensor& bias, const at::Tensor& z, const at::Tensor& rstd,
                                             const at::Tensor& dz, std::optional<int64_t> group_size,
                                             bool norm_before_gate, bool recompute_output) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = gated_backward_into_plan(dy, x, weight, bias, z, rstd, dz, group_size, norm_before_gate,
                                               recompute_output, current_preference());
    auto [dx, dw, db, dz_out, y] = run_backward(plan, kGatedBackwardIntoOp, dy, x, rstd,
                                                {nullptr, &weight, given(bias), &z}, true, &dz);
    return Tensors4(dx, dw, db, y);
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

// rms_norm_backward's checks on symbolic sizes (`op` names it in errors) -> (dx, dw);
// dx_over_dy: rms_norm_backward_'s too (the plan's, in its order).
Tensors2 backward_meta(const char* op, const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight_opt,
                       const at::Tensor& rstd, c10::string_view convention, const OptTensor& dh_opt,
                       bool dx_over_dy) {
  return translate_errors([&] {
    const at::Tensor* weight = given(weight_opt);
    const at::Tensor* dh = given(dh_opt);
    const at::Tensor none;
    check_same_device(op, {{"dy", &dy}, {"x", &x}, {"weight", weight ? weight : &none},
                           {"rstd", &rstd}, {"dh", dh ? dh : &none}});
    const RmsNormConvention c = parse_rms_norm_convention(std::string(convention), op);
    const SymOperand ds = sym_operand(&dy, op, "dy"), xs = sym_operand(&x, op, "x"),
                     ws = sym_operand(weight, op, "weight"), rs = sym_operand(&rstd, op, "rstd"),
                     hs = sym_operand(dh, op, "dh");
    check_rms_norm_problem(op, "x", xs.dtype, xs.rank(), xs.sizes.data(), ws.dtype,
                           weight ? ws.rank() : -1, ws.sizes.data(), "dh", hs.dtype,
                           dh ? hs.rank() : -1, hs.sizes.data());
    check_rms_norm_backward(op, xs.dtype, xs.rank(), xs.sizes.data(),
                            rms_norm_out_dtype(xs.dtype, weight != nullptr, ws.dtype, c), ds.dtype,
                            ds.rank(), ds.sizes.data(), rs.dtype, rs.rank(), rs.sizes.data());
    if (dx_over_dy) {
      check_rms_norm_dy_overwritable(op, xs.dtype, ds.dtype, dy.is_contiguous(), dy.sym_strides().data(),
                                     static_cast<int>(dy.dim()));
      check_dy_apart(dy, x, weight, rstd, dh);
    }
    std::vector<c10::SymInt> dw_sizes{weight ? xs.sizes.back() : c10::SymInt(0)};
    return Tensors2(dx_over_dy ? dy : at::empty_symint(xs.sizes, x.options()),
                    at::empty_symint(dw_sizes, x.options().dtype(scalar_type_of(
                                                   weight ? ws.dtype : xs.dtype))));
  });
}

Tensors2 rms_norm_backward_meta(const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight,
                                const at::Tensor& rstd, c10::string_view convention, const OptTensor& dh) {
  return backward_meta(kBackwardOp, dy, x, weight, rstd, convention, dh, false);
}

at::Tensor rms_norm_backward_in_place_meta(const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight,
                                           const at::Tensor& rstd, c10::string_view convention,
                                           const OptTensor& dh) {
  return std::get<1>(backward_meta(kBackwardInPlaceOp, dy, x, weight, rstd, convention, dh, true));
}

// The gated op's checks on symbolic sizes (gated_forward_plan's and the plan's, in their
// order); returns ngroups.
c10::SymInt gated_meta_checks(const char* op, const SymOperand& xs, const SymOperand& ws,
                              const at::Tensor* bias, const SymOperand& bs, const at::Tensor* z,
                              const SymOperand& zs, std::optional<int64_t> group_size) {
  return check_gated_rms_norm_problem(op, xs.dtype, xs.rank(), xs.sizes.data(), ws.dtype, ws.rank(),
                                      ws.sizes.data(), bs.dtype, bias ? bs.rank() : -1,
                                      bs.sizes.data(), zs.dtype, z ? zs.rank() : -1,
                                      zs.sizes.data(), group_size);
}

Tensors2 gated_rms_norm_meta(const at::Tensor& x, const at::Tensor& weight,
                             const OptTensor& bias_opt, const OptTensor& z_opt, double eps,
                             std::optional<int64_t> group_size, bool) {
  return translate_errors([&] {
    const at::Tensor *bias = given(bias_opt), *z = given(z_opt);
    const at::Tensor none;
    check_same_device(kGatedOp, {{"x", &x}, {"weight", &weight}, {"bias", bias ? bias : &none},
                                 {"z", z ? z : &none}});
    const SymOperand xs = sym_operand(&x, kGatedOp, "x"),
                     ws = sym_operand(&weight, kGatedOp, "weight"),
                     bs = sym_operand(bias, kGatedOp, "bias"), zs = sym_operand(z, kGatedOp, "z");
    const c10::SymInt groups = gated_meta_checks(kGatedOp, xs, ws, bias, bs, z, zs, group_size);
    resolve_rms_norm_eps(kGatedOp, eps, xs.dtype);
    std::vector<c10::SymInt> rstd_sizes(xs.sizes.begin(), xs.sizes.end() - 1);
    rstd_sizes.push_back(groups);
    return Tensors2(at::empty_symint(xs.sizes, x.options()),
                    at::empty_symint(rstd_sizes, x.options().dtype(scalar_type_of(
                                                     rms_norm_rstd_dtype(xs.dtype)))));
  });
}

// (dz_into: the into op's dz, whose checks are its caller's)
Tensors4 gated_backward_meta(const char* op, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                             const OptTensor& bias_opt, const OptTensor& z_opt, const at::Tensor& rstd,
                             const at::Tensor* dz_into, std::optional<int64_t> group_size) {
  return translate_errors([&] {
    const at::Tensor *bias = given(bias_opt), *z = given(z_opt);
    const at::Tensor none;
    check_same_device(op, {{"dy", &dy}, {"x", &x}, {"weight", &weight}, {"bias", bias ? bias : &none},
                           {"z", z ? z : &none}, {"rstd", &rstd}, {"dz", dz_into ? dz_into : &none}});
    const SymOperand ds = sym_operand(&dy, op, "dy"), xs = sym_operand(&x, op, "x"),
                     ws = sym_operand(&weight, op, "weight"), rs = sym_operand(&rstd, op, "rstd"),
                     bs = sym_operand(bias, op, "bias"), zs = sym_operand(z, op, "z");
    const c10::SymInt groups = gated_meta_checks(op, xs, ws, bias, bs, z, zs, group_size);
    check_rms_norm_backward(op, xs.dtype, xs.rank(), xs.sizes.data(), xs.dtype, ds.dtype, ds.rank(),
                            ds.sizes.data(), rs.dtype, rs.rank(), rs.sizes.data(), &groups);
    const auto w_options = x.options().dtype(scalar_type_of(ws.dtype));
    const std::vector<c10::SymInt> n{xs.sizes.back()}, zero{c10::SymInt(0)};
    return Tensors4(at::empty_symint(xs.sizes, x.options()), at::empty_symint(n, w_options),
                    at::empty_symint(bias ? n : zero, w_options),
                    at::empty_symint(z ? xs.sizes : zero, x.options()));
  });
}

Tensors4 gated_rms_norm_backward_meta(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                      const OptTensor& bias, const OptTensor& z, const at::Tensor& rstd,
                                      std::optional<int64_t> group_size, bool) {
  return gated_backward_meta(kGatedBackwardOp, dy, x, weight, bias, z, rstd, nullptr, group_size);
}

Tensors4 gated_rms_norm_backward_into_meta(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                           const OptTensor& bias, const at::Tensor& z, const at::Tensor& rstd,
                                           const at::Tensor& dz, std::optional<int64_t> group_size, bool,
                                           bool recompute_output) {
  return translate_errors([&] {
    const char* op = kGatedBackwardIntoOp;
    auto [dx, dw, db, dz_alloc] = gated_backward_meta(op, dy, x, weight, bias, z, rstd, &dz, group_size);
    // (the plan's rules on concrete strides; here what torch can tell on symbolic ones)
    const SymOperand ds = sym_operand(&dz, op, "dz"), xs = sym_operand(&x, op, "x");
    check_dz_into_problem(op, xs.dtype, xs.rank(), xs.sizes.data(), ds.dtype, ds.rank(), ds.sizes.data());
    if (at::has_internal_overlap(dz) == at::MemOverlap::Yes)
      fail(PlanErrorKind::InvalidProblem, op,
           "dz must not overlap itself (no two of its elements at one address), got strides " +
               sizes_str(dz.sym_strides().data(), static_cast<int>(dz.dim())));
    if (!(dz.sym_numel() == 0))
      check_dz_into_strides(std::string(op), ds.rank(), ds.sizes.data(), dz.sym_strides().data());
    const std::vector<c10::SymInt> zero{c10::SymInt(0)};
    return Tensors4(dx, dw, db, recompute_output ? at::empty_symint(x.sym_sizes(), x.options())
                                                 : at::empty_symint(zero, x.options()));
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

RmsNormBackwardPlan rms_norm_backward_in_place_plan(const at::Tensor& dy, const at::Tensor& x,
                                                    const OptTensor& weight, const at::Tensor& rstd,
                                                    c10::string_view convention, const OptTensor& dh,
                                                    PlanPreference pref) {
  return backward_plan(dy, x, given(weight), rstd, convention, given(dh), pref, true);
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
      .reuse_grad("rms_norm_backward_", 0, "dy", "x")
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
      .reuse_grad("rms_norm_backward_", 0, "dy", "x")
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
  // rms_norm_backward with dx written over dy (contiguous, x's dtype; sharing no memory with
  // the other arguments) -> dw: what the autograd calls where nothing else can see dy
  // (OpDef::reuse_grad).
  OpDef(m,
        "rms_norm_backward_(Tensor(a!) dy, Tensor x, Tensor? weight, Tensor rstd, "
        "str convention=\"torch\", Tensor? dh=None) -> Tensor")
      .kernel(&rms_norm_backward_in_place_kernel)
      .meta(&rms_norm_backward_in_place_meta)
      .explain(&rms_norm_backward_in_place_plan)
      .not_differentiable("baracuda::rms_norm_backward_ is a backward (not differentiable)");
  // The gated RMSNorm of a Mamba-2 layer (mamba_ssm's rmsnorm_fn: its arguments, order and
  // defaults): -> (y, rstd); rstd [x.shape[:-1], ngroups] float32 (float64 for float64 x),
  // saved for the backward with x, weight, bias and z (no Σx² or output recomputed).
  OpDef(m,
        "gated_rms_norm(Tensor x, Tensor weight, Tensor? bias=None, Tensor? z=None, "
        "float eps=1e-6, int? group_size=None, bool norm_before_gate=True) -> (Tensor, Tensor)")
      .kernel(&gated_rms_norm_kernel)
      .meta(&gated_rms_norm_meta)
      .explain(&gated_forward_plan)
      .derivative("gated_rms_norm_backward",
                  {grad(0), arg("x"), arg("weight"), arg("bias"), arg("z"), output(1),
                   arg("group_size"), arg("norm_before_gate")},
                  {{"x", 0}, {"weight", 1}, {"bias", 2}, {"z", 3}})
      .vmap_rows({"x", "z"});
  // -> (dx, dw, db, dz); db and dz are empty tensors without a bias, a z. vmap runs it
  // once per sample (dw and db sum over the rows).
  OpDef(m,
        "gated_rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor? z, "
        "Tensor rstd, int? group_size=None, bool norm_before_gate=True) "
        "-> (Tensor, Tensor, Tensor, Tensor)")
      .kernel(&gated_rms_norm_backward_kernel)
      .meta(&gated_rms_norm_backward_meta)
      .explain(&gated_backward_plan)
      .not_differentiable("baracuda::gated_rms_norm: double backward (the second derivative) is "
                          "not implemented");
  // gated_rms_norm_backward with dz written into the caller's tensor (x's sizes and dtype,
  // a unit inner stride and one row stride: a slice of a larger gradient buffer, as
  // mamba_ssm's _layer_norm_bwd takes its dz) and, with recompute_output, the forward's
  // output recomputed from the saved rstd (what out_proj's weight gradient needs)
  // -> (dx, dw, db, y); y is an empty tensor unless recompute_output.
  OpDef(m,
        "gated_rms_norm_backward_into(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor z, "
        "Tensor rstd, Tensor(a!) dz, int? group_size=None, bool norm_before_gate=True, "
        "bool recompute_output=False) -> (Tensor, Tensor, Tensor, Tensor)")
      .kernel(&gated_rms_norm_backward_into_kernel)
      .meta(&gated_rms_norm_backward_into_meta)
      .explain(&gated_backward_into_plan)
      .not_differentiable("baracuda::gated_rms_norm_backward_into is a backward (not differentiable)");
}

}  // namespace baracuda::torch_ops
