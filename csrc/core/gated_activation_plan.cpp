#include "core/gated_activation_plan.h"

#include <algorithm>

#include "kernels/gated_activation.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "gated_activation";
constexpr const char* kPairFamily = "gated_activation_pair";
constexpr const char* kKinds[] = {"glu", "reglu", "swiglu", "geglu", "geglu_tanh"};

// Validation shared by the forward and backward plans; returns the normalized dim.
int validate_forward_problem(const GatedActivationDescriptor& desc, const std::string& op) {
  return check_gated_problem(op, desc.x.dtype, desc.x.rank, desc.x.sizes.data(), desc.dim);
}

TensorLayout dense_layout(const TensorLayout& like, int64_t split_dim, bool halve) {
  TensorLayout out = like;
  if (halve) out.sizes[split_dim] /= 2;
  return dense_output_layout(out);
}

// Coalesces the index space over the operands' strides, picks the layout variant (rows
// when every operand has a unit inner stride over at most 2 dims; 16-byte vectors on the
// GPU when sizes, row strides, half offsets and alignments allow) and the index width.
// `min_alignment` is the smallest data alignment of the inputs (outputs are 16-aligned);
// `extent` bounds every element offset + 1.
void finish_launch(GatedActivationLaunch& l, const DeviceInfo& device, int rank,
                   const std::array<int64_t, kMaxRank>& space,
                   const std::array<int64_t, kMaxRank>* const* operands, int num_operands,
                   int min_alignment, int64_t extent) {
  l.dims = coalesce_dims(rank, space, operands, num_operands);
  const int last = l.dims.rank - 1;
  bool rows = l.dims.rank <= 2;
  for (int k = 0; k < num_operands; ++k) rows = rows && l.dims.strides[k][last] == 1;
  l.layout = rows ? GatedLayout::Rows : GatedLayout::Strided;
  l.index64 = !fits_int32(extent);

  // 16-byte vectors on the GPU; the CPU kernels pick their own vector width.
  if (rows && device.backend == Backend::Cuda) {
    const int vec = 16 / element_size(l.element);
    bool ok = l.dims.sizes[last] % vec == 0 && min_alignment >= 16;
    if (l.dims.rank == 2)
      for (int k = 0; k < num_operands; ++k) ok = ok && l.dims.strides[k][0] % vec == 0;
    for (int64_t off : {l.x_a_offset, l.x_b_offset, l.out_a_offset, l.out_b_offset})
      ok = ok && off % vec == 0;
    l.vec = ok ? vec : 1;
  }
}

// The single-tensor op's launch. `dy` is null in the forward. `out` is y (forward) or dx
// (backward), both dense.
GatedActivationLaunch plan_launch(const GatedActivationDescriptor& desc, int dim,
                                  const TensorLayout& out, const TensorLayout* dy) {
  const TensorLayout& x = desc.x;
  const bool backward = dy != nullptr;
  const int64_t half = x.sizes[dim] / 2;

  GatedActivationLaunch l;
  l.kind = desc.kind;
  l.element = x.dtype;
  l.backward = backward;

  // Offsets of the two halves: the gate half b and the value half a.
  const int64_t x_second = half * x.strides[dim];
  const int64_t out_second = backward ? half * out.strides[dim] : 0;
  l.x_a_offset = desc.gate_first ? x_second : 0;
  l.x_b_offset = desc.gate_first ? 0 : x_second;
  l.out_a_offset = desc.gate_first ? out_second : 0;
  l.out_b_offset = desc.gate_first ? 0 : out_second;

  // The index space is the half-size output shape.
  std::array<int64_t, kMaxRank> space = x.sizes;
  space[dim] = half;
  std::array<int64_t, kMaxRank> y_strides = contiguous_strides(space, x.rank);
  const std::array<int64_t, kMaxRank>* operands[3] = {
      &x.strides, backward ? &out.strides : &y_strides, backward ? &dy->strides : nullptr};
  int64_t extent = std::max<int64_t>(x.max_offset(), out.numel()) + 1;
  if (backward) extent = std::max(extent, dy->max_offset() + 1);
  const int align = backward ? std::min(x.alignment, dy->alignment) : x.alignment;
  finish_launch(l, desc.device, x.rank, space, operands, backward ? 3 : 2, align, extent);
  return l;
}

// The pair op's launch: operands gate (0), out (1), dy (2; out's strides as a
// placeholder in the forward), up (3).
GatedActivationLaunch plan_pair_launch(const GatedPairDescriptor& desc, const TensorLayout& out,
                                       const TensorLayout* dy) {
  const bool backward = dy != nullptr;
  GatedActivationLaunch l;
  l.kind = desc.kind;
  l.element = desc.gate.dtype;
  l.backward = backward;
  l.pair = true;
  const std::array<int64_t, kMaxRank>* operands[4] = {
      &desc.gate.strides, &out.strides, backward ? &dy->strides : &out.strides,
      &desc.up.strides};
  int64_t extent =
      std::max({desc.gate.max_offset(), desc.up.max_offset(), out.numel()}) + 1;
  int align = std::min(desc.gate.alignment, desc.up.alignment);
  if (backward) {
    extent = std::max(extent, dy->max_offset() + 1);
    align = std::min(align, dy->alignment);
  }
  finish_launch(l, desc.device, desc.gate.rank, desc.gate.sizes, operands, 4, align, extent);
  return l;
}

std::string variant_name(const GatedActivationLaunch& l) {
  std::string v = l.layout == GatedLayout::Strided ? "strided"
                  : l.vec > 1                      ? "rows_vec16"
                                                   : "rows";
  return l.index64 ? v + "_i64" : v;
}

KernelSku make_sku(const char* family, GatedKind kind, ElementKind element,
                   const DeviceInfo& device, const GatedActivationLaunch& l, bool backward) {
  // Elementwise: no reduction, so every kernel is deterministic and bit-stable.
  return kernel_sku(family, std::string(gated_kind_name(kind)) + (backward ? "_backward" : ""),
                    element, variant_name(l), device);
}

// The data pointers of one run (see GatedActivationLaunch): x is the gate operand b, a the
// value operand's base, out and out_a where db and da (or y) go; dy null in the forward.
struct GatedPointers {
  const void* x;
  const void* a;
  const void* dy;
  void* out;
  void* out_a;
};

// run() of every gated plan after can_implement: the workspace check (the kernels take
// none), then the planned launch with the run's pointers, unless the output is empty.
void launch(GatedActivationLaunch l, const TensorLayout& out, const Workspace& workspace,
            Backend backend, void* stream, const std::string& op, const GatedPointers& p) {
  check_workspace(op, 0, workspace);
  if (out.numel() == 0) return;
  l.x = p.x;
  l.a = p.a;
  l.dy = p.dy;
  l.out = p.out;
  l.out_a = p.out_a;
  run_on_backend(backend, op, kernels::gated_activation_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::gated_activation_cuda), l, stream);
}
}  // namespace

const char* gated_kind_name(GatedKind k) { return kKinds[static_cast<int>(k)]; }

GatedKind parse_gated_kind(const std::string& kind, const std::string& op) {
  for (int i = 0; i < 5; ++i)
    if (kind == kKinds[i]) return static_cast<GatedKind>(i);
  fail(PlanErrorKind::InvalidProblem, op,
       "kind must be one of 'glu', 'reglu', 'swiglu', 'geglu', 'geglu_tanh', got '" + kind +
           "'");
}

GatedActivationPlan GatedActivationPlan::select(const GatedActivationDescriptor& desc,
                                                PlanPreference) {
  const std::string op = kFamily;
  const int dim = validate_forward_problem(desc, op);
  GatedActivationPlan p;
  p.desc_ = desc;
  p.out_ = dense_layout(desc.x, dim, /*halve=*/true);
  p.launch_ = plan_launch(desc, dim, p.out_, nullptr);
  p.sku_ = make_sku(kFamily, desc.kind, desc.x.dtype, desc.device, p.launch_, false);
  return p;
}

void GatedActivationPlan::can_implement(const GatedActivationArgs& args) const {
  const std::string op = kFamily;
  check_same_layout(op, "x", desc_.x, args.x.layout);
  check_output(op, "y", out_, args.y);
}

void GatedActivationPlan::run(void* stream, Workspace workspace,
                              const GatedActivationArgs& args) const {
  can_implement(args);
  launch(launch_, out_, workspace, desc_.device.backend, stream, kFamily,
         {args.x.data, args.x.data, nullptr, args.y.data, args.y.data});
}

GatedActivationBackwardPlan GatedActivationBackwardPlan::select(
    const GatedActivationBackwardDescriptor& desc, PlanPreference) {
  const std::string op = std::string(kFamily) + "_backward";
  const int dim = validate_forward_problem(desc.forward, op);
  const TensorLayout& x = desc.forward.x;
  check_gated_dy(op, x.rank, x.sizes.data(), dim, x.dtype, desc.dy.rank, desc.dy.sizes.data(),
                 desc.dy.dtype);
  GatedActivationBackwardPlan p;
  p.desc_ = desc;
  p.out_ = dense_layout(desc.forward.x, dim, /*halve=*/false);
  p.launch_ = plan_launch(desc.forward, dim, p.out_, &desc.dy);
  p.sku_ = make_sku(kFamily, desc.forward.kind, desc.forward.x.dtype, desc.forward.device,
                     p.launch_, true);
  return p;
}

void GatedActivationBackwardPlan::can_implement(const GatedActivationBackwardArgs& args) const {
  const std::string op = std::string(kFamily) + "_backward";
  check_same_layout(op, "dy", desc_.dy, args.dy.layout);
  check_same_layout(op, "x", desc_.forward.x, args.x.layout);
  check_output(op, "dx", out_, args.dx);
}

void GatedActivationBackwardPlan::run(void* stream, Workspace workspace,
                                      const GatedActivationBackwardArgs& args) const {
  can_implement(args);
  launch(launch_, out_, workspace, desc_.forward.device.backend, stream,
         std::string(kFamily) + "_backward",
         {args.x.data, args.x.data, args.dy.data, args.dx.data, args.dx.data});
}

// ---- gated_activation_pair ----------------------------------------------------------

namespace {
void validate_pair_problem(const GatedPairDescriptor& desc, const std::string& op) {
  check_gated_pair_problem(op, desc.gate.dtype, desc.gate.rank, desc.gate.sizes.data(),
                           desc.up.dtype, desc.up.rank, desc.up.sizes.data());
}
}  // namespace

GatedPairPlan GatedPairPlan::select(const GatedPairDescriptor& desc, PlanPreference) {
  validate_pair_problem(desc, kPairFamily);
  GatedPairPlan p;
  p.desc_ = desc;
  p.out_ = dense_layout(desc.gate, 0, /*halve=*/false);
  p.launch_ = plan_pair_launch(desc, p.out_, nullptr);
  p.sku_ = make_sku(kPairFamily, desc.kind, desc.gate.dtype, desc.device, p.launch_, false);
  return p;
}

void GatedPairPlan::can_implement(const GatedPairArgs& args) const {
  check_same_layout(kPairFamily, "gate", desc_.gate, args.gate.layout);
  check_same_layout(kPairFamily, "up", desc_.up, args.up.layout);
  check_output(kPairFamily, "y", out_, args.y);
}

void GatedPairPlan::run(void* stream, Workspace workspace, const GatedPairArgs& args) const {
  can_implement(args);
  launch(launch_, out_, workspace, desc_.device.backend, stream, kPairFamily,
         {args.gate.data, args.up.data, nullptr, args.y.data, args.y.data});
}

namespace {
std::string pair_backward_op(const GatedPairBackwardDescriptor& desc) {
  return std::string(kPairFamily) + (desc.in_place ? "_backward_" : "_backward");
}
}  // namespace

GatedPairBackwardPlan GatedPairBackwardPlan::select(const GatedPairBackwardDescriptor& desc,
                                                    PlanPreference) {
  const std::string op = pair_backward_op(desc);
  validate_pair_problem(desc.forward, op);
  const TensorLayout& g = desc.forward.gate;
  check_gated_pair_dy(op, g.rank, g.sizes.data(), g.dtype, desc.dy.rank, desc.dy.sizes.data(),
                      desc.dy.dtype);
  GatedPairBackwardPlan p;
  p.desc_ = desc;
  p.out_ = dense_layout(g, 0, /*halve=*/false);
  if (desc.in_place) {  // the outputs are gate and up: the output layout at their alignment
    for (const auto& [name, t] : {std::pair{"gate", &g}, std::pair{"up", &desc.forward.up}})
      check_gated_pair_overwritable(op, name, t->is_contiguous(), t->strides.data(), t->rank);
    p.out_.alignment = std::min(g.alignment, desc.forward.up.alignment);
  }
  p.launch_ = plan_pair_launch(desc.forward, p.out_, &desc.dy);
  p.sku_ = make_sku(kPairFamily, desc.forward.kind, g.dtype, desc.forward.device, p.launch_, true);
  return p;
}

void GatedPairBackwardPlan::can_implement(const GatedPairBackwardArgs& args) const {
  const std::string op = pair_backward_op(desc_);
  check_same_layout(op, "dy", desc_.dy, args.dy.layout);
  check_same_layout(op, "gate", desc_.forward.gate, args.gate.layout);
  check_same_layout(op, "up", desc_.forward.up, args.up.layout);
  check_output(op, "dgate", out_, args.dgate);
  check_output(op, "dup", out_, args.dup);
}

void GatedPairBackwardPlan::run(void* stream, Workspace workspace,
                                const GatedPairBackwardArgs& args) const {
  can_implement(args);
  launch(launch_, out_, workspace, desc_.forward.device.backend, stream, pair_backward_op(desc_),
         {args.gate.data, args.up.data, args.dy.data, args.dgate.data, args.dup.data});
}

}  // namespace baracuda
