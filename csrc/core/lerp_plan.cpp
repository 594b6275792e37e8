#include "core/lerp_plan.h"

#include <algorithm>

#include "kernels/lerp.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "lerp";
constexpr const char* kForwardOp = "lerp";
constexpr const char* kBackwardOp = "lerp_backward";

// `t`'s strides over the index space `space` (right-aligned, as broadcasting aligns
// shapes): 0 along dims `t` lacks or has size 1 in.
std::array<int64_t, kMaxRank> broadcast_strides(const TensorLayout& t, const TensorLayout& space) {
  std::array<int64_t, kMaxRank> st{};
  const int lead = space.rank - t.rank;
  for (int d = 0; d < space.rank; ++d) {
    const int td = d - lead;
    st[d] = (td < 0 || t.sizes[td] == 1) ? 0 : t.strides[td];
  }
  return st;
}

// Picks the layout variant and fills the launch description for the index space
// `space` (the dense output) and the inputs, in LerpOp's order.
LerpLaunch plan_launch(LerpOp op, const DeviceInfo& device, const TensorLayout& space,
                       const TensorLayout* const* inputs) {
  const int n = lerp_num_inputs(op);
  LerpLaunch l;
  l.op = op;
  l.element = space.dtype;

  // The dense outputs never stop two dims from merging (a contiguous tensor is linear
  // across every pair of adjacent dims), so coalescing the inputs alone leaves the
  // outputs dense over the coalesced space: an output's offset is the linear index.
  std::array<std::array<int64_t, kMaxRank>, kMaxOperands> strides{};
  const std::array<int64_t, kMaxRank>* operands[kMaxOperands] = {};
  int64_t extent = space.numel();
  for (int k = 0; k < n; ++k) {
    strides[k] = broadcast_strides(*inputs[k], space);
    operands[k] = &strides[k];
    extent = std::max(extent, inputs[k]->max_offset() + 1);
  }
  l.dims = coalesce_dims(space.rank, space.sizes, operands, n);
  l.index64 = !fits_int32(extent);

  const int last = l.dims.rank - 1;
  bool rows = l.dims.rank <= 2;
  for (int k = 0; k < n; ++k)
    rows = rows && (l.dims.strides[k][last] == 0 || l.dims.strides[k][last] == 1);
  l.layout = rows ? LerpLayout::Rows : LerpLayout::Strided;

  // 16-byte vectors on the GPU; the CPU loop is vectorized by the compiler, if at all.
  // An input with inner stride 0 is read one value per vector, so it needs no alignment.
  if (rows && device.backend == Backend::Cuda) {
    const int vec = 16 / element_size(space.dtype);
    bool ok = l.dims.sizes[last] % vec == 0;
    for (int k = 0; k < n; ++k) {
      if (l.dims.strides[k][last] == 0) continue;
      ok = ok && inputs[k]->alignment >= 16;
      if (l.dims.rank == 2) ok = ok && l.dims.strides[k][0] % vec == 0;
    }
    l.vec = ok ? vec : 1;
  }
  return l;
}

std::string variant_name(const LerpLaunch& l) {
  std::string v = l.layout == LerpLayout::Strided ? "strided"
                  : l.vec > 1                     ? "rows_vec16"
                                                  : "rows";
  return l.index64 ? v + "_i64" : v;
}

const char* op_name(LerpOp op) {
  switch (op) {
    case LerpOp::Forward: return "lerp";
    case LerpOp::ForwardTensor: return "lerp_tensor";
    case LerpOp::Backward: return "lerp_backward";
    case LerpOp::BackwardTensor: return "lerp_backward_tensor";
  }
  return "?";
}

KernelSku make_sku(const DeviceInfo& device, const LerpLaunch& l) {
  // Elementwise: no reduction, so every kernel is deterministic and bit-stable.
  return kernel_sku(kFamily, op_name(l.op), l.element, variant_name(l), device);
}

void launch(const Backend backend, const LerpLaunch& l, void* stream, const std::string& op) {
  run_on_backend(backend, op, kernels::lerp_cpu, BARACUDA_CUDA_ENTRY(kernels::lerp_cuda), l,
                 stream);
}
}  // namespace

void check_lerp_dtypes(const std::string& op, int n, const char* const* names,
                       const ElementKind* dtypes) {
  if (!is_floating(dtypes[0]))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(names[0]) + " must be float32, float16, bfloat16 or float64, got " +
             element_name(dtypes[0]));
  for (int k = 1; k < n; ++k)
    if (dtypes[k] != dtypes[0])
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string(names[k]) + " must have " + names[0] + "'s dtype " +
               element_name(dtypes[0]) + ", got " + element_name(dtypes[k]));
}

LerpPlan LerpPlan::select(const LerpDescriptor& desc, PlanPreference) {
  const std::string op = kForwardOp;
  const int n = desc.tensor_weight ? 3 : 2;
  const TensorLayout* inputs[3] = {&desc.a, &desc.b, &desc.w};
  const char* names[3] = {"a", "b", "weight"};
  ElementKind dtypes[3];
  int ranks[3];
  const int64_t* sizes[3];
  for (int k = 0; k < n; ++k) {
    check_rank(op, names[k], inputs[k]->rank);
    dtypes[k] = inputs[k]->dtype;
    ranks[k] = inputs[k]->rank;
    sizes[k] = inputs[k]->sizes.data();
  }
  check_lerp_dtypes(op, n, names, dtypes);
  const std::vector<int64_t> shape = lerp_broadcast_shape<int64_t>(op, n, names, ranks, sizes);

  LerpPlan p;
  p.desc_ = desc;
  p.out_ = dense_output_layout(desc.a.dtype, static_cast<int>(shape.size()), shape.data());
  p.launch_ = plan_launch(desc.tensor_weight ? LerpOp::ForwardTensor : LerpOp::Forward,
                          desc.device, p.out_, inputs);
  p.launch_.weight = desc.weight;
  p.launch_.one_minus_w = 1.0 - desc.weight;
  p.sku_ = make_sku(desc.device, p.launch_);
  return p;
}

void LerpPlan::can_implement(const LerpArgs& args) const {
  check_same_layout(kForwardOp, "a", desc_.a, args.a.layout);
  check_same_layout(kForwardOp, "b", desc_.b, args.b.layout);
  if (desc_.tensor_weight) check_same_layout(kForwardOp, "weight", desc_.w, args.w.layout);
  check_output(kForwardOp, "y", out_, args.y);
}

void LerpPlan::run(void* stream, Workspace workspace, const LerpArgs& args) const {
  can_implement(args);
  check_workspace(kForwardOp, workspace_size(), workspace);
  if (out_.numel() == 0) return;
  LerpLaunch l = launch_;
  l.in[0] = args.a.data;
  l.in[1] = args.b.data;
  if (desc_.tensor_weight) l.in[2] = args.w.data;
  l.out[0] = args.y.data;
  launch(desc_.device.backend, l, stream, kForwardOp);
}

LerpBackwardPlan LerpBackwardPlan::select(const LerpBackwardDescriptor& desc, PlanPreference) {
  const std::string op = kBackwardOp;
  const int n = desc.tensor_weight ? 4 : 1;
  const TensorLayout* inputs[4] = {&desc.dy, &desc.a, &desc.b, &desc.w};
  const char* names[4] = {"dy", "a", "b", "weight"};
  ElementKind dtypes[4];
  for (int k = 0; k < n; ++k) {
    check_rank(op, names[k], inputs[k]->rank);
    dtypes[k] = inputs[k]->dtype;
  }
  check_lerp_dtypes(op, n, names, dtypes);
  for (int k = 1; k < n; ++k)
    check_lerp_broadcasts_to<int64_t>(op, names[k], inputs[k]->rank, inputs[k]->sizes.data(),
                                      desc.dy.rank, desc.dy.sizes.data());

  LerpBackwardPlan p;
  p.desc_ = desc;
  p.out_ = dense_output_layout(desc.dy.dtype, desc.dy.rank, desc.dy.sizes.data());
  p.launch_ = plan_launch(desc.tensor_weight ? LerpOp::BackwardTensor : LerpOp::Backward,
                          desc.device, p.out_, inputs);
  p.launch_.weight = desc.weight;
  p.launch_.one_minus_w = 1.0 - desc.weight;
  p.sku_ = make_sku(desc.device, p.launch_);
  return p;
}

void LerpBackwardPlan::can_implement(const LerpBackwardArgs& args) const {
  check_same_layout(kBackwardOp, "dy", desc_.dy, args.dy.layout);
  check_output(kBackwardOp, "da", out_, args.da);
  check_output(kBackwardOp, "db", out_, args.db);
  if (desc_.tensor_weight) {
    check_same_layout(kBackwardOp, "a", desc_.a, args.a.layout);
    check_same_layout(kBackwardOp, "b", desc_.b, args.b.layout);
    check_same_layout(kBackwardOp, "weight", desc_.w, args.w.layout);
    check_output(kBackwardOp, "dw", out_, args.dw);
  }
}

void LerpBackwardPlan::run(void* stream, Workspace workspace,
                           const LerpBackwardArgs& args) const {
  can_implement(args);
  check_workspace(kBackwardOp, workspace_size(), workspace);
  if (out_.numel() == 0) return;
  LerpLaunch l = launch_;
  l.in[0] = args.dy.data;
  l.out[0] = args.da.data;
  l.out[1] = args.db.data;
  if (desc_.tensor_weight) {
    l.in[1] = args.a.data;
    l.in[2] = args.b.data;
    l.in[3] = args.w.data;
    l.out[2] = args.dw.data;
  }
  launch(desc_.device.backend, l, stream, kBackwardOp);
}

}  // namespace baracuda
