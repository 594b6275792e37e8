// baracuda::ssd_chunk_scan and baracuda::ssd_chunk_scan_backward: CPU/CUDA kernels
// (tensors -> plan -> run), meta kernels (shapes only), and the autograd Function that
// connects the forward plan to the backward op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "core/ssd_chunk_scan_plan.h"
#include "torch/common.h"
#include "torch/ops.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "ssd_chunk_scan";
constexpr const char* kBackwardOp = "ssd_chunk_scan_backward";

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <class Int>
SsdOperand<Int> operand(const at::Tensor& t, const std::string& op, const char* name,
                        const std::vector<Int>& sizes) {
  return {name, element_of(t, op, name), static_cast<int>(sizes.size()), sizes.data()};
}

// The problem checks on the tensors' sizes, before anything else looks at them, so that
// eager calls and meta kernels raise the same error for the same bad input (a 9-dim x
// is a ValueError here too, not the layout's rank limit). `sizes_of` gives int64_t
// sizes (eager) or SymInts (meta).
template <class Int, class SizesOf>
void check_problem(const std::string& op, const at::Tensor& x, const at::Tensor& dt,
                   const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                   int64_t chunk_size, bool cuda, const at::Tensor* dy, SizesOf sizes_of) {
  check_same_device(op, {{"x", &x}, {"dt", &dt}, {"A", &A}, {"B", &B}, {"C", &C}});
  if (dy) check_same_device(op, {{"x", &x}, {"dy", dy}});
  const std::vector<Int> xs = sizes_of(x), dts = sizes_of(dt), As = sizes_of(A),
                         Bs = sizes_of(B), Cs = sizes_of(C);
  const SsdOperand<Int> xo = operand(x, op, "x", xs);
  check_ssd_problem(op, xo, operand(dt, op, "dt", dts), operand(A, op, "A", As),
                    operand(B, op, "B", Bs), operand(C, op, "C", Cs), chunk_size, cuda);
  if (dy) {
    const std::vector<Int> dys = sizes_of(*dy);
    check_ssd_dy(op, xo, operand(*dy, op, "dy", dys));
  }
}

std::vector<int64_t> concrete_sizes(const at::Tensor& t) { return t.sizes().vec(); }

SsdChunkScanDescriptor describe(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                                const std::string& op, const at::Tensor* dy) {
  const DeviceInfo device = device_info(x);
  check_problem<int64_t>(op, x, dt, A, B, C, chunk_size, device.backend == Backend::Cuda, dy,
                         concrete_sizes);
  SsdChunkScanDescriptor desc;
  desc.x = layout_of(x, op, "x");
  desc.dt = layout_of(dt, op, "dt");
  desc.A = layout_of(A, op, "A");
  desc.B = layout_of(B, op, "B");
  desc.C = layout_of(C, op, "C");
  desc.chunk_size = chunk_size;
  desc.device = device;
  return desc;
}

SsdChunkScanPlan forward_plan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                              const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                              PlanPreference pref) {
  return SsdChunkScanPlan::select(describe(x, dt, A, B, C, chunk_size, kOp, nullptr), pref);
}

SsdChunkScanBackwardPlan backward_plan(const at::Tensor& dy, const at::Tensor& x,
                                       const at::Tensor& dt, const at::Tensor& A,
                                       const at::Tensor& B, const at::Tensor& C,
                                       int64_t chunk_size, PlanPreference pref) {
  SsdChunkScanBackwardDescriptor desc;
  desc.forward = describe(x, dt, A, B, C, chunk_size, kBackwardOp, &dy);
  desc.dy = layout_of(dy, kBackwardOp, "dy");
  return SsdChunkScanBackwardPlan::select(desc, pref);
}

at::Tensor ssd_chunk_scan_kernel(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, int64_t chunk_size) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = forward_plan(x, dt, A, B, C, chunk_size, current_preference());
    at::Tensor y = allocate(plan.output_layout(), x);
    if (plan.zero_fill_outputs()) y.zero_();
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    plan.run(current_stream(x), workspace_of(ws),
             {ref_of(x, kOp, "x"), ref_of(dt, kOp, "dt"), ref_of(A, kOp, "A"),
              ref_of(B, kOp, "B"), ref_of(C, kOp, "C"), mut_ref_of(y, kOp, "y")});
    return y;
  });
}

Grads ssd_chunk_scan_backward_kernel(const at::Tensor& dy, const at::Tensor& x,
                                     const at::Tensor& dt, const at::Tensor& A,
                                     const at::Tensor& B, const at::Tensor& C,
                                     int64_t chunk_size) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const auto plan = backward_plan(dy, x, dt, A, B, C, chunk_size, current_preference());
    const auto& layouts = plan.output_layouts();
    at::Tensor out[5];
    for (int i = 0; i < 5; ++i) {
      out[i] = allocate(layouts[i], x);
      if (plan.zero_fill_outputs()) out[i].zero_();
    }
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    const std::string op = kBackwardOp;
    plan.run(current_stream(x), workspace_of(ws),
             {ref_of(dy, op, "dy"), ref_of(x, op, "x"), ref_of(dt, op, "dt"),
              ref_of(A, op, "A"), ref_of(B, op, "B"), ref_of(C, op, "C"),
              mut_ref_of(out[0], op, "dx"), mut_ref_of(out[1], op, "ddt"),
              mut_ref_of(out[2], op, "dA"), mut_ref_of(out[3], op, "dB"),
              mut_ref_of(out[4], op, "dC")});
    return Grads{out[0], out[1], out[2], out[3], out[4]};
  });
}

// Meta (fake) kernels: the plans' problem checks on symbolic sizes, then the shapes.
// The device is unknown here, so the CUDA-only D, N limit is left to the real kernel.
at::Tensor ssd_chunk_scan_meta(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                               const at::Tensor& B, const at::Tensor& C, int64_t chunk_size) {
  return translate_errors([&] {
    check_problem<c10::SymInt>(kOp, x, dt, A, B, C, chunk_size, false, nullptr, sym_sizes_of);
    return at::empty_symint(x.sym_sizes(), x.options());
  });
}

Grads ssd_chunk_scan_backward_meta(const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& dt, const at::Tensor& A,
                                   const at::Tensor& B, const at::Tensor& C,
                                   int64_t chunk_size) {
  return translate_errors([&] {
    check_problem<c10::SymInt>(kBackwardOp, x, dt, A, B, C, chunk_size, false, &dy,
                               sym_sizes_of);
    const auto o = x.options();
    return Grads{at::empty_symint(x.sym_sizes(), o), at::empty_symint(dt.sym_sizes(), o),
                 at::empty_symint(A.sym_sizes(), o), at::empty_symint(B.sym_sizes(), o),
                 at::empty_symint(C.sym_sizes(), o)};
  });
}

// ---- autograd --------------------------------------------------------------------

at::Tensor call_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                        const at::Tensor& B, const at::Tensor& C, int64_t chunk_size) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("baracuda::ssd_chunk_scan", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(x, dt, A, B, C, chunk_size);
}

Grads call_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dt,
                    const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                    int64_t chunk_size) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("baracuda::ssd_chunk_scan_backward", "")
                       .typed<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    int64_t)>();
  return op.call(dy, x, dt, A, B, C, chunk_size);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class SsdChunkScanFunction : public torch::autograd::Function<SsdChunkScanFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& dt,
                            const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                            int64_t chunk_size) {
    ctx->saved_data["chunk_size"] = chunk_size;
    ctx->save_for_backward({x, dt, A, B, C});
    at::AutoDispatchBelowADInplaceOrView below;
    return call_forward(x, dt, A, B, C, chunk_size);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(6);
    if (!grads[0].defined()) return out;
    const variable_list s = ctx->get_saved_variables();
    auto [dx, ddt, dA, dB, dC] =
        call_backward(grads[0], s[0], s[1], s[2], s[3], s[4], ctx->saved_data["chunk_size"].toInt());
    out = {dx, ddt, dA, dB, dC, at::Tensor()};
    for (size_t i = 0; i < 5; ++i)
      if (!ctx->needs_input_grad(i)) out[i] = at::Tensor();
    return out;
  }
};

// The backward op is differentiable only to say clearly that its own backward (the
// forward's second derivative) is not implemented.
class SsdChunkScanBackwardFunction
    : public torch::autograd::Function<SsdChunkScanBackwardFunction> {
 public:
  static variable_list forward(AutogradContext*, const at::Tensor& dy, const at::Tensor& x,
                               const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
                               const at::Tensor& C, int64_t chunk_size) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [dx, ddt, dA, dB, dC] = call_backward(dy, x, dt, A, B, C, chunk_size);
    return {dx, ddt, dA, dB, dC};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    C10_THROW_ERROR(NotImplementedError,
                    "baracuda::ssd_chunk_scan: double backward is not implemented");
  }
};

at::Tensor ssd_chunk_scan_autograd(const at::Tensor& x, const at::Tensor& dt,
                                   const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                                   int64_t chunk_size) {
  return SsdChunkScanFunction::apply(x, dt, A, B, C, chunk_size);
}

Grads ssd_chunk_scan_backward_autograd(const at::Tensor& dy, const at::Tensor& x,
                                       const at::Tensor& dt, const at::Tensor& A,
                                       const at::Tensor& B, const at::Tensor& C,
                                       int64_t chunk_size) {
  const variable_list g = SsdChunkScanBackwardFunction::apply(dy, x, dt, A, B, C, chunk_size);
  return Grads{g[0], g[1], g[2], g[3], g[4]};
}
}  // namespace

PlanInfo explain_ssd_chunk_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                                const std::optional<std::string>& preference) {
  return translate_errors([&] {
    const PlanPreference pref = preference_or_current(preference);
    return plan_info(forward_plan(x, dt, A, B, C, chunk_size, pref), pref);
  });
}

PlanInfo explain_ssd_chunk_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                         const at::Tensor& dt, const at::Tensor& A,
                                         const at::Tensor& B, const at::Tensor& C,
                                         int64_t chunk_size,
                                         const std::optional<std::string>& preference) {
  return translate_errors([&] {
    const PlanPreference pref = preference_or_current(preference);
    return plan_info(backward_plan(dy, x, dt, A, B, C, chunk_size, pref), pref);
  });
}

TORCH_LIBRARY_IMPL(baracuda, CPU, m) {
  m.impl("ssd_chunk_scan", &ssd_chunk_scan_kernel);
  m.impl("ssd_chunk_scan_backward", &ssd_chunk_scan_backward_kernel);
}

#ifdef BARACUDA_WITH_CUDA
TORCH_LIBRARY_IMPL(baracuda, CUDA, m) {
  m.impl("ssd_chunk_scan", &ssd_chunk_scan_kernel);
  m.impl("ssd_chunk_scan_backward", &ssd_chunk_scan_backward_kernel);
}
#endif

TORCH_LIBRARY_IMPL(baracuda, Meta, m) {
  m.impl("ssd_chunk_scan", &ssd_chunk_scan_meta);
  m.impl("ssd_chunk_scan_backward", &ssd_chunk_scan_backward_meta);
}

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("ssd_chunk_scan", &ssd_chunk_scan_autograd);
  m.impl("ssd_chunk_scan_backward", &ssd_chunk_scan_backward_autograd);
}

}  // namespace baracuda::torch_ops
