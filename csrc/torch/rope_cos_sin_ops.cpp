// baracuda::rope_cos_sin / rope_qk_cos_sin and their backwards: RoPE from caller-given
// cos/sin tables (core/rope_cos_sin_plan.h has the math and the two table layouts).
// CPU/CUDA kernels (tensor -> plan -> run), meta kernels, the autograd Functions (written
// by hand: the cos/sin gradients are ATen ops) and the ops' declarations.
//
// Gradients: the op is linear in q and k (y = M(cos, sin)·x), so dx = Mᵀ·dy is the
// backward op, and the backward op's own derivative is the forward op again (any order).
// cos and sin get a gradient only when they require one; it is
//   dcos[e] = Σ dy[f]·x[f],   dsin[e] = Σ dy[f]·rotate(x)[f]
// over the heads (and the batch for a shared table) of every feature f that reads entry
// e, computed with ATen ops (differentiable, no extra kernel: the rare path).
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <array>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "core/rope_cos_sin_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
using TensorPair = std::tuple<at::Tensor, at::Tensor>;

const char* op_name(bool has_k, bool backward) { return rope_cos_sin_op_name(has_k, backward); }
const char* q_name(bool has_k, bool backward) { return rope_cos_sin_q_name(has_k, backward); }

void check_devices(bool has_k, bool backward, const at::Tensor& q, const at::Tensor* k,
                   const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = op_name(has_k, backward);
  const char* qn = q_name(has_k, backward);
  if (k)
    check_same_device(op, {{qn, &q}, {backward ? "dk" : "k", k}, {"cos", &cos}, {"sin", &sin}});
  else
    check_same_device(op, {{qn, &q}, {"cos", &cos}, {"sin", &sin}});
}

// The meta kernels' checks: devices, then the problem on (possibly symbolic) sizes, as
// RopeCosSinPlan::select checks it.
template <class Int>
void check_problem(bool has_k, bool backward, const at::Tensor& q, const at::Tensor* k,
                   const at::Tensor& cos, const at::Tensor& sin, c10::ArrayRef<Int> qs,
                   c10::ArrayRef<Int> ks, c10::ArrayRef<Int> cs, c10::ArrayRef<Int> ss) {
  const char* op = op_name(has_k, backward);
  const char* qn = q_name(has_k, backward);
  const char* kn = backward ? "dk" : "k";
  check_devices(has_k, backward, q, k, cos, sin);
  check_rope_cos_sin_problem<Int>(
      op, qn, kn, element_of(q, op, qn), static_cast<int>(qs.size()), qs.data(),
      k ? element_of(*k, op, kn) : ElementKind::F32, k ? static_cast<int>(ks.size()) : -1,
      ks.data(), element_of(cos, op, "cos"), static_cast<int>(cs.size()), cs.data(),
      element_of(sin, op, "sin"), static_cast<int>(ss.size()), ss.data());
}

RopeCosSinPlan make_plan(bool backward, const at::Tensor& q, const at::Tensor* k,
                         const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const bool has_k = k != nullptr;
  // The problem is validated once, by RopeCosSinPlan::select (see exceeds_layout_rank).
  if (exceeds_layout_rank({&q, k, &cos, &sin}))
    check_problem<int64_t>(has_k, backward, q, k, cos, sin, q.sizes(),
                           k ? k->sizes() : c10::IntArrayRef(), cos.sizes(), sin.sizes());
  check_devices(has_k, backward, q, k, cos, sin);
  const char* op = op_name(has_k, backward);
  RopeCosSinDescriptor d;
  d.backward = backward;
  d.q = layout_of(q, op, q_name(has_k, backward));
  d.has_k = has_k;
  if (k) d.k = layout_of(*k, op, backward ? "dk" : "k");
  d.cos = layout_of(cos, op, "cos");
  d.sin = layout_of(sin, op, "sin");
  d.interleaved = interleaved;
  d.device = device_info(q, op);
  return RopeCosSinPlan::select(d, current_preference());
}

TensorPair run(bool backward, const at::Tensor& q, const at::Tensor* k, const at::Tensor& cos,
               const at::Tensor& sin, bool interleaved) {
  return translate_errors([&] {
    c10::DeviceGuard guard(q.device());
    const bool has_k = k != nullptr;
    const char* op = op_name(has_k, backward);
    const auto plan = make_plan(backward, q, k, cos, sin, interleaved);
    at::Tensor yq = allocate(plan.q_output_layout(), q);
    at::Tensor yk;
    RopeCosSinArgs args;
    args.q = ref_of(q, op, "q");
    args.cos = ref_of(cos, op, "cos");
    args.sin = ref_of(sin, op, "sin");
    args.yq = mut_ref_of(yq, op, "q_out");
    if (k) {
      yk = allocate(plan.k_output_layout(), *k);
      args.k = ref_of(*k, op, "k");
      args.yk = mut_ref_of(yk, op, "k_out");
    }
    plan.run(current_stream(q), Workspace{}, args);
    return TensorPair(yq, yk);
  });
}

at::Tensor one_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) {
  return std::get<0>(run(false, x, nullptr, cos, sin, interleaved));
}
at::Tensor one_backward_kernel(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                               bool interleaved) {
  return std::get<0>(run(true, dy, nullptr, cos, sin, interleaved));
}
TensorPair qk_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                     const at::Tensor& sin, bool interleaved) {
  return run(false, q, &k, cos, sin, interleaved);
}
TensorPair qk_backward_kernel(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                              const at::Tensor& sin, bool interleaved) {
  return run(true, dq, &dk, cos, sin, interleaved);
}

// ---- meta ------------------------------------------------------------------------
at::Tensor like_meta(const at::Tensor& x) {
  if (x.is_non_overlapping_and_dense())
    return at::empty_strided_symint(x.sym_sizes(), x.sym_strides(), x.options());
  return at::empty_symint(x.sym_sizes(), x.options());
}

TensorPair meta_impl(bool backward, const at::Tensor& q, const at::Tensor* k,
                     const at::Tensor& cos, const at::Tensor& sin) {
  return translate_errors([&] {
    check_problem<c10::SymInt>(k != nullptr, backward, q, k, cos, sin, q.sym_sizes(),
                               k ? k->sym_sizes() : c10::SymIntArrayRef(), cos.sym_sizes(),
                               sin.sym_sizes());
    return TensorPair(like_meta(q), k ? like_meta(*k) : at::Tensor());
  });
}

at::Tensor one_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool) {
  return std::get<0>(meta_impl(false, x, nullptr, cos, sin));
}
at::Tensor one_backward_meta(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                             bool) {
  return std::get<0>(meta_impl(true, dy, nullptr, cos, sin));
}
TensorPair qk_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                   const at::Tensor& sin, bool) {
  return meta_impl(false, q, &k, cos, sin);
}
TensorPair qk_backward_meta(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                            const at::Tensor& sin, bool) {
  return meta_impl(true, dq, &dk, cos, sin);
}

// ---- autograd --------------------------------------------------------------------

using OneSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool);
using QkSignature = TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, bool);

at::Tensor call_one(bool backward, const at::Tensor& x, const at::Tensor& cos,
                    const at::Tensor& sin, bool interleaved) {
  static auto fwd = op_handle<OneSignature>("baracuda::rope_cos_sin");
  static auto bwd = op_handle<OneSignature>("baracuda::rope_cos_sin_backward");
  return (backward ? bwd : fwd).call(x, cos, sin, interleaved);
}

TensorPair call_qk(bool backward, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                   const at::Tensor& sin, bool interleaved) {
  static auto fwd = op_handle<QkSignature>("baracuda::rope_qk_cos_sin");
  static auto bwd = op_handle<QkSignature>("baracuda::rope_qk_cos_sin_backward");
  return (backward ? bwd : fwd).call(q, k, cos, sin, interleaved);
}

// rotate(x) over the first R features: (−x_v, x_u) at (u, v) of every pair.
at::Tensor rotate(const at::Tensor& xr, int64_t R, bool interleaved) {
  if (interleaved) {
    auto u = xr.slice(-1, 0, R, 2);
    auto v = xr.slice(-1, 1, R, 2);
    return at::stack({-v, u}, -1).flatten(-2);
  }
  return at::cat({-xr.narrow(-1, R / 2, R / 2), xr.narrow(-1, 0, R / 2)}, -1);
}

// d<g, M(cos, sin)·x>/d(cos, sin), accumulated into (dcos, dsin) (float32/float64 sums,
// undefined on entry means zero). Also the derivative of <x, Mᵀ·g> (the backward op's
// cos/sin gradient, with x the incoming gradient and g the op's input).
void add_table_grads(const at::Tensor& x, const at::Tensor& g, const at::Tensor& cos,
                     bool interleaved, bool want_cos, bool want_sin, at::Tensor& dcos,
                     at::Tensor& dsin) {
  if (!x.defined() || !g.defined() || x.size(1) == 0) return;
  const bool full = cos.dim() == 3;
  const int64_t R = full ? cos.size(2) : 2 * cos.size(1);
  const auto acc = cos.scalar_type() == at::kDouble || x.scalar_type() == at::kDouble
                       ? at::kDouble
                       : at::kFloat;
  const at::Tensor xr = x.narrow(-1, 0, R).to(acc);
  const at::Tensor gr = g.narrow(-1, 0, R).to(acc);
  const auto reduce = [&](const at::Tensor& prod) {  // [B, H, S, R] -> cos's shape
    at::Tensor p = prod.sum(1);                      // [B, S, R]
    if (full) return cos.size(0) == 1 ? p.sum(0, /*keepdim=*/true) : p;
    p = p.sum(0);  // [S, R]
    if (interleaved) {
      return p.slice(-1, 0, R, 2) + p.slice(-1, 1, R, 2);
    }
    return p.narrow(-1, 0, R / 2) + p.narrow(-1, R / 2, R / 2);
  };
  if (want_cos) {
    at::Tensor d = reduce(gr * xr);
    dcos = dcos.defined() ? dcos + d : d;
  }
  if (want_sin) {
    at::Tensor d = reduce(gr * rotate(xr, R, interleaved));
    dsin = dsin.defined() ? dsin + d : d;
  }
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Shared by the four Functions: the forward (Backward = false) computes M·x and its
// derivative is Mᵀ·g; the backward op computes Mᵀ·x and its derivative is M·g. The
// table gradient has the same form for both, with (x, g) swapped for the backward op.
template <bool HasK, bool Backward>
variable_list rope_cos_sin_forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  ctx->saved_data["interleaved"] = interleaved;
  const bool table_grad = cos.requires_grad() || sin.requires_grad();
  ctx->saved_data["table_grad"] = table_grad;
  if (table_grad)
    ctx->save_for_backward({cos, sin, q, HasK ? k : at::Tensor()});
  else
    ctx->save_for_backward({cos, sin});
  at::AutoDispatchBelowADInplaceOrView below;
  if constexpr (HasK) {
    auto [yq, yk] = call_qk(Backward, q, k, cos, sin, interleaved);
    return {yq, yk};
  } else {
    return {call_one(Backward, q, cos, sin, interleaved)};
  }
}

// Returns (dq, dk, dcos, dsin); dk undefined without k.
template <bool HasK, bool Backward>
std::array<at::Tensor, 4> rope_cos_sin_backward(AutogradContext* ctx, const variable_list& grads,
                                                bool want_cos, bool want_sin) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& cos = saved[0];
  const at::Tensor& sin = saved[1];
  const bool interleaved = ctx->saved_data["interleaved"].toBool();
  const at::Tensor& gq = grads[0];
  const at::Tensor gk = HasK ? grads[1] : at::Tensor();
  at::Tensor dq, dk, dcos, dsin;
  // (Undefined output gradients arrive as zeros: materialize_grads is on.)
  if constexpr (HasK) {
    auto r = call_qk(!Backward, gq, gk, cos, sin, interleaved);
    dq = std::get<0>(r);
    dk = std::get<1>(r);
  } else {
    dq = call_one(!Backward, gq, cos, sin, interleaved);
  }
  if (ctx->saved_data["table_grad"].toBool() && (want_cos || want_sin)) {
    const at::Tensor& q = saved[2];
    const at::Tensor& k = saved[3];
    // Forward: d<g, M·x>; backward op: d<g, Mᵀ·x> = d<x, M·g>.
    if (Backward) {
      add_table_grads(gq, q, cos, interleaved, want_cos, want_sin, dcos, dsin);
      if (HasK) add_table_grads(gk, k, cos, interleaved, want_cos, want_sin, dcos, dsin);
    } else {
      add_table_grads(q, gq, cos, interleaved, want_cos, want_sin, dcos, dsin);
      if (HasK) add_table_grads(k, gk, cos, interleaved, want_cos, want_sin, dcos, dsin);
    }
    if (dcos.defined()) dcos = dcos.to(cos.scalar_type());
    else if (want_cos) dcos = at::zeros_like(cos);
    if (dsin.defined()) dsin = dsin.to(sin.scalar_type());
    else if (want_sin) dsin = at::zeros_like(sin);
  }
  return {dq, dk, dcos, dsin};
}

// The q/k ops: inputs (q, k, cos, sin, interleaved).
template <bool Backward>
struct RopeQkFunction : torch::autograd::Function<RopeQkFunction<Backward>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
    return rope_cos_sin_forward<true, Backward>(ctx, q, k, cos, sin, interleaved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = rope_cos_sin_backward<true, Backward>(ctx, grads, ctx->needs_input_grad(2),
                                                   ctx->needs_input_grad(3));
    return {r[0], r[1], r[2], r[3], at::Tensor()};
  }
};

// The one-tensor ops: inputs (x, cos, sin, interleaved).
template <bool Backward>
struct RopeOneFunction : torch::autograd::Function<RopeOneFunction<Backward>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin, bool interleaved) {
    return rope_cos_sin_forward<false, Backward>(ctx, x, at::Tensor(), cos, sin, interleaved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = rope_cos_sin_backward<false, Backward>(ctx, grads, ctx->needs_input_grad(1),
                                                    ctx->needs_input_grad(2));
    return {r[0], r[2], r[3], at::Tensor()};
  }
};

at::Tensor one_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        bool interleaved) {
  return RopeOneFunction<false>::apply(x, cos, sin, interleaved)[0];
}
at::Tensor one_backward_autograd(const at::Tensor& dy, const at::Tensor& cos,
                                 const at::Tensor& sin, bool interleaved) {
  return RopeOneFunction<true>::apply(dy, cos, sin, interleaved)[0];
}
TensorPair qk_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, bool interleaved) {
  auto r = RopeQkFunction<false>::apply(q, k, cos, sin, interleaved);
  return TensorPair(r[0], r[1]);
}
TensorPair qk_backward_autograd(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                const at::Tensor& sin, bool interleaved) {
  auto r = RopeQkFunction<true>::apply(dq, dk, cos, sin, interleaved);
  return TensorPair(r[0], r[1]);
}

// The plans explain reports, one per op (the preference does not change them).
RopeCosSinPlan one_plan(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        bool interleaved, PlanPreference) {
  return make_plan(false, x, nullptr, cos, sin, interleaved);
}
RopeCosSinPlan one_backward_plan(const at::Tensor& dy, const at::Tensor& cos,
                                 const at::Tensor& sin, bool interleaved, PlanPreference) {
  return make_plan(true, dy, nullptr, cos, sin, interleaved);
}
RopeCosSinPlan qk_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, bool interleaved, PlanPreference) {
  return make_plan(false, q, &k, cos, sin, interleaved);
}
RopeCosSinPlan qk_backward_plan(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                const at::Tensor& sin, bool interleaved, PlanPreference) {
  return make_plan(true, dq, &dk, cos, sin, interleaved);
}
}  // namespace

// Hugging Face's apply_rotary_pos_emb and flash-attention's apply_rotary_emb: cos/sin are
// [1 or B, S, R] (one entry per feature) or [S, R/2] (one per pair), float32 or the
// activation dtype; q [B, Hq, S, D] and k [B, Hk, S, D] (any strides) are rotated in one
// launch. Each backward is the transpose (dx from dy); cos/sin get gradients when they
// require them.
TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m, "rope_cos_sin(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor")
      .kernel(&one_kernel)
      .meta(&one_meta)
      .explain(&one_plan)
      .autograd(&one_autograd);
  OpDef(m,
        "rope_cos_sin_backward(Tensor dy, Tensor cos, Tensor sin, bool interleaved=False) -> "
        "Tensor")
      .kernel(&one_backward_kernel)
      .meta(&one_backward_meta)
      .explain(&one_backward_plan)
      .autograd(&one_backward_autograd);
  OpDef(m,
        "rope_qk_cos_sin(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved=False) "
        "-> (Tensor, Tensor)")
      .kernel(&qk_kernel)
      .meta(&qk_meta)
      .explain(&qk_plan)
      .autograd(&qk_autograd);
  OpDef(m,
        "rope_qk_cos_sin_backward(Tensor dq, Tensor dk, Tensor cos, Tensor sin, "
        "bool interleaved=False) -> (Tensor, Tensor)")
      .kernel(&qk_backward_kernel)
      .meta(&qk_backward_meta)
      .explain(&qk_backward_plan)
      .autograd(&qk_backward_autograd);
}

}  // namespace baracuda::torch_ops
