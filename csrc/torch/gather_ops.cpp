// baracuda::gather and baracuda::gather_backward: CPU/CUDA kernels (tensor -> plan ->
// run), meta kernels (shapes only), the ops' declarations (each op's backward is the
// other op: gather_backward is linear in dout, and its adjoint is gather), and the CUDA
// index-error reporting (check_errors, set_index_checks).
//
// When a CUDA out-of-range index surfaces (the kernels never touch memory with it; they
// write 0 / skip it and record it on the device, see kernels/gather.h):
//   - "async" (default): as an IndexError at the start of the next gather or
//     gather_backward call on that device once the bad kernel has finished, or from
//     baracuda_torch.check_errors(), which synchronizes the device first;
//   - "sync": the op synchronizes its stream after the launch and raises at once (not
//     while the stream is being captured into a CUDA graph).
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>

#include "core/gather_plan.h"
#include "kernels/gather.h"
#include "torch/op_def.h"
#include "torch/ops.h"

#ifdef BARACUDA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace baracuda::torch_ops {

namespace {
constexpr const char* kOp = "gather";
constexpr const char* kBackwardOp = "gather_backward";

std::atomic<bool> g_sync_index_checks{false};

GatherPlan forward_plan(const at::Tensor& src, int64_t dim, const at::Tensor& index,
                        PlanPreference pref) {
  check_same_device(kOp, {{"src", &src}, {"index", &index}});
  GatherDescriptor desc;
  desc.dim = dim;
  desc.src = layout_of(src, kOp, "src");
  desc.index = layout_of(index, kOp, "index");
  desc.device = device_info(src, kOp);
  return GatherPlan::select(desc, pref);
}

GatherBackwardPlan backward_plan(const at::Tensor& dout, int64_t dim, const at::Tensor& index,
                                 c10::IntArrayRef src_sizes, PlanPreference pref) {
  check_same_device(kBackwardOp, {{"dout", &dout}, {"index", &index}});
  GatherBackwardDescriptor desc;
  desc.dim = dim;
  desc.dout = layout_of(dout, kBackwardOp, "dout");
  desc.index = layout_of(index, kBackwardOp, "index");
  desc.src_rank = static_cast<int>(src_sizes.size());
  check_rank(kBackwardOp, "src_sizes", desc.src_rank);  // before filling the fixed-size array
  for (int d = 0; d < desc.src_rank; ++d) desc.src_sizes[d] = src_sizes[d];
  desc.device = device_info(dout, kBackwardOp);
  // The sorted plan asks CUB for its temp-storage size on the current device.
  c10::OptionalDeviceGuard guard;
  if (dout.is_cuda()) guard.reset_device(dout.device());
  return GatherBackwardPlan::select(desc, pref);
}

#ifdef BARACUDA_WITH_CUDA
[[noreturn]] void raise_recorded(const kernels::GatherIndexError& e, int device) {
  const bool fw = e.op == kernels::GatherErrorOp::Gather;
  fail_index_out_of_bounds(
      fw ? kOp : kBackwardOp, e.value, e.dim, e.size,
      " (recorded on cuda:" + std::to_string(device) + " by a " + (fw ? kOp : kBackwardOp) +
          " kernel, which " +
          (fw ? "set that output element to 0)" : "skipped that element)"));
}
#endif

// An error an earlier kernel recorded on t's device, if that kernel has finished.
void raise_pending_index_error(const at::Tensor& t) {
#ifdef BARACUDA_WITH_CUDA
  if (!t.is_cuda()) return;
  kernels::GatherIndexError e;
  if (kernels::gather_take_index_error(t.get_device(), &e)) raise_recorded(e, t.get_device());
#else
  (void)t;
#endif
}

// "sync" mode: wait for the launch and raise its error now (not while capturing a graph,
// where a synchronization is illegal; the error then surfaces as in "async" mode).
void sync_index_check(const at::Tensor& t) {
#ifdef BARACUDA_WITH_CUDA
  if (!t.is_cuda() || !g_sync_index_checks.load()) return;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return;
  at::cuda::getCurrentCUDAStream(t.get_device()).synchronize();
  raise_pending_index_error(t);
#else
  (void)t;
#endif
}

at::Tensor gather_kernel(const at::Tensor& src, int64_t dim, const at::Tensor& index) {
  return translate_errors([&] {
    c10::DeviceGuard guard(src.device());
    raise_pending_index_error(src);
    const auto plan = forward_plan(src, dim, index, current_preference());
    at::Tensor out = allocate(plan.output_layout(), src);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), src);
    plan.run(current_stream(src), workspace_of(ws),
             {ref_of(src, kOp, "src"), ref_of(index, kOp, "index"), mut_ref_of(out, kOp, "out")});
    sync_index_check(src);
    return out;
  });
}

at::Tensor gather_backward_kernel(const at::Tensor& dout, int64_t dim, const at::Tensor& index,
                                  c10::SymIntArrayRef src_sizes) {
  return translate_errors([&] {
    c10::DeviceGuard guard(dout.device());
    raise_pending_index_error(dout);
    const auto plan = backward_plan(dout, dim, index, C10_AS_INTARRAYREF_SLOW(src_sizes),
                                    current_preference());
    at::Tensor dsrc = allocate(plan.output_layout(), dout);
    at::Tensor ws = allocate_workspace(plan.workspace_size(), dout);
    plan.run(current_stream(dout), workspace_of(ws),
             {ref_of(dout, kBackwardOp, "dout"), ref_of(index, kBackwardOp, "index"),
              mut_ref_of(dsrc, kBackwardOp, "dsrc")});
    sync_index_check(dout);
    return dsrc;
  });
}

// Meta (fake) kernels: the plans' problem checks on symbolic sizes, then the shape.
at::Tensor gather_meta(const at::Tensor& src, int64_t dim, const at::Tensor& index) {
  return translate_errors([&] {
    check_same_device(kOp, {{"src", &src}, {"index", &index}});
    check_gather_dtypes(kOp, "src", element_of(src, kOp, "src"), element_of(index, kOp, "index"));
    const auto src_sizes = sym_sizes_of(src);
    const auto index_sizes = sym_sizes_of(index);
    check_gather_shapes(kOp, "src", static_cast<int>(src_sizes.size()), src_sizes.data(),
                        static_cast<int>(index_sizes.size()), index_sizes.data(), dim);
    return at::empty_symint(index_sizes, src.options());
  });
}

at::Tensor gather_backward_meta(const at::Tensor& dout, int64_t dim, const at::Tensor& index,
                                c10::SymIntArrayRef src_sizes) {
  return translate_errors([&] {
    check_same_device(kBackwardOp, {{"dout", &dout}, {"index", &index}});
    check_gather_dtypes(kBackwardOp, "dout", element_of(dout, kBackwardOp, "dout"),
                        element_of(index, kBackwardOp, "index"));
    const std::vector<c10::SymInt> sizes = src_sizes.vec();
    const auto index_sizes = sym_sizes_of(index);
    const auto dout_sizes = sym_sizes_of(dout);
    const int rank = static_cast<int>(sizes.size());
    const int index_rank = static_cast<int>(index_sizes.size());
    check_rank(kBackwardOp, "src_sizes", rank);
    check_gather_src_sizes(kBackwardOp, rank, sizes.data());
    check_gather_shapes(kBackwardOp, "src_sizes", rank, sizes.data(), index_rank,
                        index_sizes.data(), dim);
    check_gather_dout(kBackwardOp, index_rank, index_sizes.data(),
                      static_cast<int>(dout_sizes.size()), dout_sizes.data());
    return at::empty_symint(sizes, dout.options());
  });
}

}  // namespace

void gather_check_errors(int64_t device) {
  translate_errors([&] {
#ifdef BARACUDA_WITH_CUDA
    kernels::GatherIndexError e;
    if (kernels::gather_take_index_error(static_cast<int>(device), &e))
      raise_recorded(e, static_cast<int>(device));
#else
    (void)device;
#endif
  });
}

void set_index_checks(const std::string& mode) {
  translate_errors([&] {
    if (mode != "async" && mode != "sync")
      fail(PlanErrorKind::InvalidProblem, "set_index_checks",
           "mode must be 'async' or 'sync', got '" + mode + "'");
    g_sync_index_checks.store(mode == "sync");
  });
}

std::string get_index_checks() { return g_sync_index_checks.load() ? "sync" : "async"; }

// d gather / d src = gather_backward (index gets no gradient); gather_backward is linear
// in dout and its adjoint is gather, so both are differentiable to any order.
TORCH_LIBRARY_FRAGMENT(baracuda, m) {
  OpDef(m, "gather(Tensor src, int dim, Tensor index) -> Tensor")
      .kernel(&gather_kernel)
      .meta(&gather_meta)
      .explain(&forward_plan)
      .derivative("gather_backward", {grad(0), arg("dim"), arg("index"), sizes_of("src")},
                  {{"src", 0}});
  OpDef(m, "gather_backward(Tensor dout, int dim, Tensor index, SymInt[] src_sizes) -> Tensor")
      .kernel(&gather_backward_kernel)
      .meta(&gather_backward_meta)
      .explain(&backward_plan)
      .derivative("gather", {grad(0), arg("dim"), arg("index")}, {{"dout", 0}});
}

}  // namespace baracuda::torch_ops
