// baracuda::lerp (scalar weight), baracuda::lerp.Tensor (tensor weight) and their
// backward ops baracuda::lerp_backward(.Tensor): CPU/CUDA kernels (tensor -> plan -> run),
// meta kernels (shapes only), and the autograd Functions that connect each forward to
// its backward op and sum broadcast gradients down to the inputs' shapes (written by
// hand: the sums and the scalar weight's second derivative do not fit a declaration),
// and the ops' declarations.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "core/lerp_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "lerp";
constexpr const char* kBackwardOp = "lerp_backward";

using Grads2 = std::tuple<at::Tensor, at::Tensor>;
using Grads3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// `w` is null for a scalar weight.
LerpPlan forward_plan(const at::Tensor& a, const at::Tensor& b, const at::Tensor* w,
                      double weight, PlanPreference pref) {
  const at::Tensor none;
  check_same_device(kOp, {{"a", &a}, {"b", &b}, {"weight", w ? w : &none}});
  LerpDescriptor desc;
  desc.a = layout_of(a, kOp, "a");
  desc.b = layout_of(b, kOp, "b");
  desc.tensor_weight = w != nullptr;
  if (w) desc.w = layout_of(*w, kOp, "weight");
  desc.weight = weight;
  desc.device = device_info(a, kOp);
  return LerpPlan::select(desc, pref);
}

// `a`, `b`, `w` are null for a scalar weight.
LerpBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor* a, const at::Tensor* b,
                               const at::Tensor* w, double weight, PlanPreference pref) {
  const at::Tensor none;
  check_same_device(kBackwardOp,
                    {{"dy", &dy}, {"a", a ? a : &none}, {"b", b ? b : &none},
                     {"weight", w ? w : &none}});
  LerpBackwardDescriptor desc;
  desc.dy = layout_of(dy, kBackwardOp, "dy");
  desc.tensor_weight = w != nullptr;
  if (w) {
    desc.a = layout_of(*a, kBackwardOp, "a");
    desc.b = layout_of(*b, kBackwardOp, "b");
    desc.w = layout_of(*w, kBackwardOp, "weight");
  }
  desc.weight = weight;
  desc.device = device_info(dy, kBackwardOp);
  return LerpBackwardPlan::select(desc, pref);
}

at::Tensor run_forward(const at::Tensor& a, const at::Tensor& b, const at::Tensor* w,
                       double weight) {
  return translate_errors([&] {
    c10::DeviceGuard guard(a.device());
    const auto plan = forward_plan(a, b, w, weight, current_preference());
    at::Tensor y = allocate(plan.output_layout(), a);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), a);
    plan.run(current_stream(a), workspace_of(ws),
             {ref_of(a, kOp, "a"), ref_of(b, kOp, "b"), w ? ref_of(*w, kOp, "weight") : TensorRef{},
              mut_ref_of(y, kOp, "y")});
    return y;
  });
}

// Returns (da, db) and, with a tensor weight, dw.
std::vector<at::Tensor> run_backward(const at::Tensor& dy, const at::Tensor* a,
                                     const at::Tensor* b, const at::Tensor* w, double weight) {
  return translate_errors([&] {
    c10::DeviceGuard guard(dy.device());
    const auto plan = backward_plan(dy, a, b, w, weight, current_preference());
    at::Tensor da = allocate(plan.output_layout(), dy);
    at::Tensor db = allocate(plan.output_layout(), dy);
    at::Tensor dw = w ? allocate(plan.output_layout(), dy) : at::Tensor();
    at::Tensor ws = allocate_workspace(plan.workspace_size(), dy);
    LerpBackwardArgs args;
    args.dy = ref_of(dy, kBackwardOp, "dy");
    args.da = mut_ref_of(da, kBackwardOp, "da");
    args.db = mut_ref_of(db, kBackwardOp, "db");
    if (w) {
      args.a = ref_of(*a, kBackwardOp, "a");
      args.b = ref_of(*b, kBackwardOp, "b");
      args.w = ref_of(*w, kBackwardOp, "weight");
      args.dw = mut_ref_of(dw, kBackwardOp, "dw");
    }
    plan.run(current_stream(dy), workspace_of(ws), args);
    return w ? std::vector<at::Tensor>{da, db, dw} : std::vector<at::Tensor>{da, db};
  });
}

at::Tensor lerp_kernel(const at::Tensor& a, const at::Tensor& b, double weight) {
  return run_forward(a, b, nullptr, weight);
}

at::Tensor lerp_tensor_kernel(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight) {
  return run_forward(a, b, &weight, 0.0);
}

Grads2 lerp_backward_kernel(const at::Tensor& dy, double weight) {
  auto g = run_backward(dy, nullptr, nullptr, nullptr, weight);
  return {g[0], g[1]};
}

Grads3 lerp_backward_tensor_kernel(const at::Tensor& dy, const at::Tensor& a, const at::Tensor& b,
                                   const at::Tensor& weight) {
  auto g = run_backward(dy, &a, &b, &weight, 0.0);
  return {g[0], g[1], g[2]};
}

// ---- meta (fake) kernels: the plans' checks on symbolic sizes, then the shapes -----

// Dtype and rank checks in the order the real kernels make them.
void check_operands_meta(const std::string& op, int n, const char* const* names,
                         const at::Tensor* const* ts) {
  ElementKind dtypes[kMaxOperands];
  for (int k = 0; k < n; ++k) {
    dtypes[k] = element_of(*ts[k], op, names[k]);
    check_rank(op, names[k], static_cast<int>(ts[k]->dim()));
  }
  check_lerp_dtypes(op, n, names, dtypes);
}

at::Tensor forward_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor* w) {
  return translate_errors([&] {
    const at::Tensor none;
    check_same_device(kOp, {{"a", &a}, {"b", &b}, {"weight", w ? w : &none}});
    const int n = w ? 3 : 2;
    const char* names[3] = {"a", "b", "weight"};
    const at::Tensor* ts[3] = {&a, &b, w};
    check_operands_meta(kOp, n, names, ts);
    std::vector<c10::SymInt> sizes[3];
    int ranks[3];
    const c10::SymInt* ptrs[3];
    for (int k = 0; k < n; ++k) {
      sizes[k] = sym_sizes_of(*ts[k]);
      ranks[k] = static_cast<int>(sizes[k].size());
      ptrs[k] = sizes[k].data();
    }
    const auto shape = lerp_broadcast_shape<c10::SymInt>(kOp, n, names, ranks, ptrs);
    return at::empty_symint(shape, a.options());
  });
}

std::vector<at::Tensor> backward_meta(const at::Tensor& dy, const at::Tensor* a,
                                      const at::Tensor* b, const at::Tensor* w) {
  return translate_errors([&] {
    const at::Tensor none;
    check_same_device(kBackwardOp,
                      {{"dy", &dy}, {"a", a ? a : &none}, {"b", b ? b : &none},
                       {"weight", w ? w : &none}});
    const int n = w ? 4 : 1;
    const char* names[4] = {"dy", "a", "b", "weight"};
    const at::Tensor* ts[4] = {&dy, a, b, w};
    check_operands_meta(kBackwardOp, n, names, ts);
    const auto dy_sizes = sym_sizes_of(dy);
    for (int k = 1; k < n; ++k) {
      const auto s = sym_sizes_of(*ts[k]);
      check_lerp_broadcasts_to<c10::SymInt>(kBackwardOp, names[k], static_cast<int>(s.size()),
                                            s.data(), static_cast<int>(dy_sizes.size()),
                                            dy_sizes.data());
    }
    std::vector<at::Tensor> out;
    for (int j = 0; j < (w ? 3 : 2); ++j) out.push_back(at::empty_symint(dy_sizes, dy.options()));
    return out;
  });
}

at::Tensor lerp_meta(const at::Tensor& a, const at::Tensor& b, double) {
  return forward_meta(a, b, nullptr);
}

at::Tensor lerp_tensor_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight) {
  return forward_meta(a, b, &weight);
}

Grads2 lerp_backward_meta(const at::Tensor& dy, double) {
  auto g = backward_meta(dy, nullptr, nullptr, nullptr);
  return {g[0], g[1]};
}

Grads3 lerp_backward_tensor_meta(const at::Tensor& dy, const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& weight) {
  auto g = backward_meta(dy, &a, &b, &weight);
  return {g[0], g[1], g[2]};
}

// ---- autograd --------------------------------------------------------------------

at::Tensor call_lerp(const at::Tensor& a, const at::Tensor& b, double weight) {
  static auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("baracuda::lerp");
  return op.call(a, b, weight);
}

at::Tensor call_lerp_tensor(const at::Tensor& a, const at::Tensor& b, const at::Tensor& w) {
  static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      "baracuda::lerp", "Tensor");
  return op.call(a, b, w);
}

Grads2 call_lerp_backward(const at::Tensor& dy, double weight) {
  static auto op = op_handle<Grads2(const at::Tensor&, double)>("baracuda::lerp_backward");
  return op.call(dy, weight);
}

Grads3 call_lerp_backward_tensor(const at::Tensor& dy, const at::Tensor& a, const at::Tensor& b,
                                 const at::Tensor& w) {
  static auto op =
      op_handle<Grads3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "baracuda::lerp_backward", "Tensor");
  return op.call(dy, a, b, w);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A gradient at the broadcast shape, summed down to an input's shape (itself when the
// input was not broadcast); undefined when that input needs no gradient.
at::Tensor grad_for(AutogradContext* ctx, int input, const at::Tensor& g,
                    c10::SymIntArrayRef sizes) {
  if (!ctx->needs_input_grad(input)) return at::Tensor();
  return g.sum_to_size_symint(sizes);
}

class LerpFunction : public torch::autograd::Function<LerpFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            double weight) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["a_sizes"] = a.sym_sizes();
    ctx->saved_data["b_sizes"] = b.sym_sizes();
    at::AutoDispatchBelowADInplaceOrView below;
    return call_lerp(a, b, weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    if (!dy.defined() || !(ctx->needs_input_grad(0) || ctx->needs_input_grad(1)))
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto [da, db] = call_lerp_backward(dy, ctx->saved_data["weight"].toDouble());
    return {grad_for(ctx, 0, da, ctx->saved_data["a_sizes"].toSymIntVector()),
            grad_for(ctx, 1, db, ctx->saved_data["b_sizes"].toSymIntVector()), at::Tensor()};
  }
};

// lerp_backward is linear in dy, so its own backward (lerp's second derivative) is
//   d(dy) = (1 − w)·g_da + w·g_db = lerp(g_da, g_db, w).
class LerpBackwardFunction : public torch::autograd::Function<LerpBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& dy, double weight) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["weight"] = weight;
    at::AutoDispatchBelowADInplaceOrView below;
    auto [da, db] = call_lerp_backward(dy, weight);
    return {da, db};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double w = ctx->saved_data["weight"].toDouble();
    const at::Tensor &g_da = grads[0], &g_db = grads[1];
    at::Tensor ddy;
    if (g_da.defined() && g_db.defined())
      ddy = call_lerp(g_da, g_db, w);
    else if (g_da.defined())
      ddy = g_da.mul(1.0 - w);
    else if (g_db.defined())
      ddy = g_db.mul(w);
    return {ddy, at::Tensor()};
  }
};

class LerpTensorFunction : public torch::autograd::Function<LerpTensorFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& w) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({a, b, w});
    at::AutoDispatchBelowADInplaceOrView below;
    return call_lerp_tensor(a, b, w);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    if (!dy.defined() ||
        !(ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2)))
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [da, db, dw] = call_lerp_backward_tensor(dy, saved[0], saved[1], saved[2]);
    return {grad_for(ctx, 0, da, saved[0].sym_sizes()), grad_for(ctx, 1, db, saved[1].sym_sizes()),
            grad_for(ctx, 2, dw, saved[2].sym_sizes())};
  }
};

// Differentiable only to say clearly that its own backward is not implemented.
class LerpBackwardTensorFunction
    : public torch::autograd::Function<LerpBackwardTensorFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& dy, const at::Tensor& a,
                               const at::Tensor& b, const at::Tensor& w) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [da, db, dw] = call_lerp_backward_tensor(dy, a, b, w);
    return {da, db, dw};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    C10_THROW_ERROR(NotImplementedError,
                    "baracuda::lerp: double backward with a tensor weight is not implemented");
  }
};

at::Tensor lerp_autograd(const at::Tensor& a, const at::Tensor& b, double weight) {
  return LerpFunction::apply(a, b, weight);
}

at::Tensor lerp_tensor_autograd(const at::Tensor& a, const at::Tensor& b,
                                const at::Tensor& weight) {
  return LerpTensorFunction::apply(a, b, weight);
}

Grads2 lerp_backward_autograd(const at::Tensor& dy, double weight) {
  auto g = LerpBackwardFunction::apply(dy, weight);
  return {g[0], g[1]};
}

Grads3 lerp_backward_tensor_autograd(const at::Tensor& dy, const at::Tensor& a,
                                     const at::Tensor& b, const at::Tensor& weight) {
  auto g = LerpBackwardTensorFunction::apply(dy, a, b, weight);
  return {g[0], g[1], g[2]};
}

// The plans explain reports, one per op.
LerpPlan lerp_plan(const at::Tensor& a, const at::Tensor& b, double weight, PlanPreference pref) {
  return forward_plan(a, b, nullptr, weight, pref);
}
LerpPlan lerp_tensor_plan(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight,
                          PlanPreference pref) {
  return forward_plan(a, b, &weight, 0.0, pref);
}
LerpBackwardPlan lerp_backward_plan(const at::Tensor& dy, double weight, PlanPreference pref) {
  return backward_plan(dy, nullptr, nullptr, nullptr, weight, pref);
}
LerpBackwardPlan lerp_backward_tensor_plan(const at::Tensor& dy, const at::Tensor& a,
                                           const at::Tensor& b, const at::Tensor& weight,
                                           PlanPreference pref) {
  return backward_plan(dy, &a, &b, &weight, 0.0, pref);
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m, "lerp(Tensor a, Tensor b, float weight) -> Tensor")
      .kernel(&lerp_kernel)
      .meta(&lerp_meta)
      .explain(&lerp_plan)
      .autograd(&lerp_autograd);
  OpDef(m, "lerp_backward(Tensor dy, float weight) -> (Tensor, Tensor)")
      .kernel(&lerp_backward_kernel)
      .meta(&lerp_backward_meta)
      .explain(&lerp_backward_plan)
      .autograd(&lerp_backward_autograd);
  OpDef(m, "lerp.Tensor(Tensor a, Tensor b, Tensor weight) -> Tensor")
      .kernel(&lerp_tensor_kernel)
      .meta(&lerp_tensor_meta)
      .explain(&lerp_tensor_plan)
      .autograd(&lerp_tensor_autograd);
  // Added overload: the tensor-weight backward, (da, db, dw) at dy's shape in one pass.
  OpDef(m,
        "lerp_backward.Tensor(Tensor dy, Tensor a, Tensor b, Tensor weight) -> "
        "(Tensor, Tensor, Tensor)")
      .kernel(&lerp_backward_tensor_kernel)
      .meta(&lerp_backward_tensor_meta)
      .explain(&lerp_backward_tensor_plan)
      .autograd(&lerp_backward_tensor_autograd);
}

}  // namespace baracuda::torch_ops
