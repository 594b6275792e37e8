// baracuda::rope and baracuda::rope_backward: CPU/CUDA kernels (tensor -> plan -> run),
// meta kernels (shapes and output strides only), and the ops' declarations. Both ops
// are rotations, so each one's derivative is the other: rope's backward runs
// rope_backward, rope_backward's backward runs rope, and any order of derivatives works.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>

#include "core/rope_plan.h"
#include "torch/op_def.h"

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "rope";
constexpr const char* kBackwardOp = "rope_backward";

using OptTensor = std::optional<at::Tensor>;

const at::Tensor* positions_ptr(const OptTensor& positions) {
  return positions && positions->defined() ? &*positions : nullptr;
}

void check_devices(const at::Tensor& x, const at::Tensor* positions, bool backward) {
  if (positions)
    check_same_device(backward ? kBackwardOp : kOp,
                      {{backward ? "dy" : "x", &x}, {"positions", positions}});
}

// The meta kernels' checks: devices, then the problem on (possibly symbolic) sizes, as
// RopePlan::select checks it. `Int` is int64_t or c10::SymInt.
template <class Int>
void check_problem(const at::Tensor& x, const at::Tensor* positions, double base,
                   int64_t rotary_dim, bool backward, c10::ArrayRef<Int> sizes,
                   c10::ArrayRef<Int> pos_sizes) {
  const char* op = backward ? kBackwardOp : kOp;
  const char* what = backward ? "dy" : "x";
  check_devices(x, positions, backward);
  check_rope_problem(op, what, element_of(x, op, what), static_cast<int>(sizes.size()),
                     sizes.data(), base, rotary_dim,
                     positions ? static_cast<int>(pos_sizes.size()) : -1,
                     positions ? element_of(*positions, op, "positions") : ElementKind::I64,
                     pos_sizes.data());
}

RopePlan make_plan(const at::Tensor& x, const OptTensor& positions_opt, double base,
                   bool interleaved, int64_t rotary_dim, bool backward, PlanPreference pref) {
  const at::Tensor* positions = positions_ptr(positions_opt);
  // The problem is validated once, by RopePlan::select (see exceeds_layout_rank).
  if (exceeds_layout_rank({&x, positions}))
    check_problem<int64_t>(x, positions, base, rotary_dim, backward, x.sizes(),
                           positions ? positions->sizes() : c10::IntArrayRef());
  check_devices(x, positions, backward);
  const char* op = backward ? kBackwardOp : kOp;
  RopeDescriptor desc;
  desc.backward = backward;
  desc.x = layout_of(x, op, backward ? "dy" : "x");
  desc.has_positions = positions != nullptr;
  if (positions) desc.positions = layout_of(*positions, op, "positions");
  desc.base = base;
  desc.interleaved = interleaved;
  desc.rotary_dim = rotary_dim;
  desc.device = device_info(x, op);
  return RopePlan::select(desc, pref);
}

at::Tensor run_rope(const at::Tensor& x, const OptTensor& positions_opt, double base,
                    bool interleaved, int64_t rotary_dim, bool backward) {
  return translate_errors([&] {
    c10::DeviceGuard guard(x.device());
    const char* op = backward ? kBackwardOp : kOp;
    const auto plan =
        make_plan(x, positions_opt, base, interleaved, rotary_dim, backward, current_preference());
    at::Tensor y = allocate(plan.output_layout(), x);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), x);
    const at::Tensor* positions = positions_ptr(positions_opt);
    RopeArgs args;
    args.x = ref_of(x, op, backward ? "dy" : "x");
    if (positions) args.positions = ref_of(*positions, op, "positions");
    args.y = mut_ref_of(y, op, backward ? "dx" : "y");
    plan.run(current_stream(x), workspace_of(ws), args);
    return y;
  });
}

at::Tensor rope_kernel(const at::Tensor& x, const OptTensor& positions, double base,
                       bool interleaved, int64_t rotary_dim) {
  return run_rope(x, positions, base, interleaved, rotary_dim, /*backward=*/false);
}

at::Tensor rope_backward_kernel(const at::Tensor& dy, const OptTensor& positions, double base,
                                bool interleaved, int64_t rotary_dim) {
  return run_rope(dy, positions, base, interleaved, rotary_dim, /*backward=*/true);
}

// Meta (fake) kernels: the plan's problem checks on symbolic sizes, then the output the
// plan would allocate: x's strides when x is non-overlapping and dense, else contiguous.
at::Tensor rope_meta_impl(const at::Tensor& x, const OptTensor& positions_opt, double base,
                          int64_t rotary_dim, bool backward) {
  return translate_errors([&] {
    const at::Tensor* positions = positions_ptr(positions_opt);
    check_problem<c10::SymInt>(x, positions, base, rotary_dim, backward, x.sym_sizes(),
                               positions ? positions->sym_sizes() : c10::SymIntArrayRef());
    if (x.is_non_overlapping_and_dense())
      return at::empty_strided_symint(x.sym_sizes(), x.sym_strides(), x.options());
    return at::empty_symint(x.sym_sizes(), x.options());
  });
}

at::Tensor rope_meta(const at::Tensor& x, const OptTensor& positions, double base, bool,
                     int64_t rotary_dim) {
  return rope_meta_impl(x, positions, base, rotary_dim, false);
}

at::Tensor rope_backward_meta(const at::Tensor& dy, const OptTensor& positions, double base,
                              bool, int64_t rotary_dim) {
  return rope_meta_impl(dy, positions, base, rotary_dim, true);
}

// The plan explain reports: rope's (Backward = false) or rope_backward's.
template <bool Backward>
RopePlan plan_of(const at::Tensor& x, const OptTensor& positions, double base, bool interleaved,
                 int64_t rotary_dim, PlanPreference pref) {
  return make_plan(x, positions, base, interleaved, rotary_dim, Backward, pref);
}
}  // namespace

// y = rotate(x, ±θ), so dL/dx = rotate(dL/dy, ∓θ): each op's derivative is the other.
TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m,
        "rope(Tensor x, Tensor? positions=None, float base=10000.0, bool interleaved=False, "
        "int rotary_dim=-1) -> Tensor")
      .kernel(&rope_kernel)
      .meta(&rope_meta)
      .explain(&plan_of<false>)
      .derivative("rope_backward",
                  {grad(0), arg("positions"), arg("base"), arg("interleaved"), arg("rotary_dim")},
                  {{"x", 0}});
  OpDef(m,
        "rope_backward(Tensor dy, Tensor? positions=None, float base=10000.0, "
        "bool interleaved=False, int rotary_dim=-1) -> Tensor")
      .kernel(&rope_backward_kernel)
      .meta(&rope_backward_meta)
      .explain(&plan_of<true>)
      .derivative("rope",
                  {grad(0), arg("positions"), arg("base"), arg("interleaved"), arg("rotary_dim")},
                  {{"dy", 0}});
}

}  // namespace baracuda::torch_ops
