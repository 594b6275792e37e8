#include "core/rmsnorm_plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/rmsnorm.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "rms_norm";
constexpr const char* kOp = "rms_norm";
constexpr const char* kAddOp = "add_rms_norm";
constexpr const char* kBackwardOp = "rms_norm_backward";
constexpr const char* kBackwardInPlaceOp = "rms_norm_backward_";
constexpr const char* kGatedOp = "gated_rms_norm";
constexpr const char* kGatedBackwardOp = "gated_rms_norm_backward";
constexpr const char* kGatedBackwardIntoOp = "gated_rms_norm_backward_into";
constexpr const char* kConventions[] = {"torch", "llama", "gemma"};

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// Leading dims (all but the last) coalesced over the input operands, and each operand's
// inner stride.
void plan_rows(RmsNormLaunch& l, const TensorLayout& x, const TensorLayout* const* inputs,
               int n) {
  const int lead_rank = x.rank - 1;
  l.cols = x.sizes[x.rank - 1];
  l.rows = 1;
  for (int d = 0; d < lead_rank; ++d) l.rows *= x.sizes[d];
  const std::array<int64_t, kMaxRank>* strides[kMaxOperands];
  for (int k = 0; k < n; ++k) {
    strides[k] = &inputs[k]->strides;
    l.col_stride[k] = inputs[k]->strides[x.rank - 1];
  }
  l.lead = coalesce_dims(lead_rank, x.sizes, strides, n);
}

// The variant and its CUDA work decomposition (the backward's grid: plan_backward_blocks).
// `unit_inner`: every operand has a unit inner stride (w included); 16-byte vectors also
// need the inputs' addresses (min_alignment), row strides and N to allow them.
void plan_variant(RmsNormLaunch& l, const DeviceInfo& device, bool unit_inner, int min_alignment,
                  int num_inputs) {
  l.layout = unit_inner ? RmsNormLayout::Rows : RmsNormLayout::Strided;
  l.sm_count = device.sm_count;
  if (device.backend != Backend::Cuda) return;
  const int vec = 16 / element_size(l.element);
  bool vec_ok = unit_inner && min_alignment >= 16 && l.cols % vec == 0 && l.cols > 0;
  for (int k = 0; vec_ok && k < num_inputs; ++k)
    for (int d = 0; d < l.lead.rank; ++d)
      vec_ok = vec_ok && (l.lead.sizes[d] == 1 || l.lead.strides[k][d] % vec == 0);
  const int64_t v = l.cols / vec;
  int vecs = 1;
  const int max_group = !l.backward ? (l.gated ? kRmsNormGatedMaxGroup : kRmsNormMaxGroup)
                        : l.gated   ? kRmsNormGatedBackwardThreads
                                    : kRmsNormMaxBackwardGroup;
  if (l.backward && l.gated) {
    while (vecs < kRmsNormMaxVecs && (v + vecs - 1) / vecs > max_group) vecs *= 2;
  } else {
    // Up to 4 16-byte loads in flight a thread, with groups of about 128 threads: a
    // 256-thread block holds two rows of 512 vectors (4096 bf16), so a multiprocessor
    // (4 blocks at these registers) keeps twice the rows' loads in flight as with one row
    // a block. Measured (H200, [8192, 4096] bf16, llama convention): 67.0 -> 60.1 µs
    // forward, add + norm 90.8 -> 86.1; rows of 1024+ vectors (8192 bf16, 4096 float32)
    // get 4 vectors a thread either way (BENCHMARKS.md). The forward is still latency
    // bound (ncu: 39 % of DRAM bandwidth, long-scoreboard stalls on the row's loads).
    // The backward the same way (its 512-thread block four such rows, where one vector a
    // thread gave a row the whole block): 149 -> 114 µs at that shape. The gated op keeps
    // groups of about 256 threads forward and its backward's one group a block: the change
    // was not timed for it.
    const int64_t per_group = l.gated ? 256 : 128;
    vecs = static_cast<int>(std::clamp<int64_t>(pow2_floor(v / per_group), 1, kRmsNormMaxVecs));
    while (vecs < kRmsNormMaxVecs && (v + vecs - 1) / vecs > max_group) vecs *= 2;
  }
  int64_t group = (v + vecs - 1) / vecs;
  // Groups smaller than a warp share it (a power of two, for the shuffles); larger ones
  // are whole warps.
  group = group <= 32 ? pow2_ceil(group) : (group + 31) / 32 * 32;
  if (vec_ok && group <= max_group) {
    l.vec = vec;
    l.vecs = vecs;
    l.group = static_cast<int>(group);
    const int threads = !l.backward ? kRmsNormBlockThreads
                        : l.gated   ? kRmsNormGatedBackwardThreads
                                    : kRmsNormBackwardThreads;
    l.rows_per_block = std::max(1, threads / l.group);
  } else {  // not vectorizable, or wider than the registers hold
    l.layout = RmsNormLayout::Strided;
    l.group = kRmsNormLoopThreads;
  }
  // The row groups on y (at least one block: with no groups the kernels do nothing).
  l.grid_y = std::clamp<int64_t>(l.ngroups, 1, kCudaMaxGridY);  // the kernels loop over more
  if (!l.backward)
    l.grid = std::min<int64_t>((l.rows + l.rows_per_block - 1) / l.rows_per_block,
                               INT32_MAX);  // the kernels loop over more
  // The plain rows forward: a resident grid (kRmsNormForwardBlocksPerSm).
  if (!l.backward && !l.gated && !l.has_residual && l.layout == RmsNormLayout::Rows && l.sm_count > 0)
    l.grid = std::min<int64_t>(
        l.grid, std::max<int64_t>(1, int64_t{l.sm_count} * kRmsNormForwardBlocksPerSm / l.grid_y));
}

// The backward's (and the staged forward's) grid: the blocks that run at once (CPU: its
// fixed row blocks), split over the row groups on y, at most one a group of
// rows_per_block rows.
void plan_resident_grid(RmsNormLaunch& l, Backend backend, const std::string& op) {
  const int64_t blocks =
      query_backend(backend, op, kernels::rms_norm_cpu_backward_blocks,
                    BARACUDA_CUDA_ENTRY(kernels::rms_norm_cuda_resident_blocks), l);
  const int64_t row_groups = (l.rows + l.rows_per_block - 1) / l.rows_per_block;
  l.grid = std::min(row_groups, std::max<int64_t>(1, blocks / l.grid_y));
  if (l.backward) l.dw_blocks = l.has_weight ? l.grid : 0;
}

// rms_norm_allow_stage's setting (tests only).
std::atomic<bool> g_allow_stage{true};

// RmsNormLaunch::stage where the rows' rings fit: the backward (not with the gated op's
// bias) and the gated op's forward where a thread holds one vector of a row (vecs 1).
// The gated forward measured (H100, [16384, 5120] bf16, staged against unstaged, the same
// bits): 8 row groups of 640 (one vector a thread) 291.2 / 255.3 µs against 345.8 /
// 316.0 (gate after / before the norm); one group of 5120 (two vectors a thread; the staged
// kernel's first form, its row's work in a lambda) 208.1 / 196.2 against 210.3 / 193.2,
// not staged.
void plan_stage(RmsNormLaunch& l, const DeviceInfo& device) {
  l.stage = false;
  if (device.backend != Backend::Cuda || l.layout != RmsNormLayout::Rows || device.arch < 80 ||
      !g_allow_stage.load(std::memory_order_relaxed) || (l.backward ? l.has_bias : !l.gated || l.vecs > 1))
    return;
  l.stage = true;  // (rms_norm_smem_bytes counts the rings only when staged)
  if (rms_norm_smem_bytes(l) > device.smem_optin_bytes) l.stage = false;
}

std::string variant_name(const RmsNormLaunch& l, const DeviceInfo& device) {
  if (l.layout == RmsNormLayout::Strided) return "strided";
  if (device.backend == Backend::Cpu)  // AVX2: the plain ops, not float64
    return l.element == ElementKind::F64 || l.gated ? "rows" : "rows_simd";
  return std::string(l.group <= 32 ? "warp_vec16" : "block_vec16") + (l.stage ? "_staged" : "");
}

void set_scalars(RmsNormLaunch& l, double eps) {
  l.eps64 = eps;
  l.eps = static_cast<float>(eps);
  l.inv_cols64 = 1.0 / static_cast<double>(l.cols);  // inf for N = 0: rstd is NaN there
  l.inv_cols = static_cast<float>(l.inv_cols64);
}

TensorLayout rows_layout(ElementKind dtype, const TensorLayout& x, bool drop_last) {
  return dense_output_layout(dtype, x.rank - (drop_last ? 1 : 0), x.sizes.data());
}

// rstd's layout: x's leading sizes (the gated op: then ngroups).
TensorLayout rstd_output_layout(const RmsNormLaunch& l, const TensorLayout& x) {
  const ElementKind dtype = rms_norm_rstd_dtype(x.dtype);
  if (!l.gated) return rows_layout(dtype, x, true);
  auto sizes = x.sizes;
  sizes[x.rank - 1] = l.ngroups;
  return dense_output_layout(dtype, x.rank, sizes.data());
}

// A 1-d output of `n` elements (0 when the operand is absent).
TensorLayout vector_layout(ElementKind dtype, bool present, int64_t n) {
  const int64_t size = present ? n : 0;
  return dense_output_layout(dtype, 1, &size);
}

// The gated op's checks (x, weight, bias, z, group_size) and launch fields; returns
// whether every gated operand has a unit inner stride, and lowers `align` to theirs.
bool plan_gated(RmsNormLaunch& l, const RmsNormGated& g, const TensorLayout& x,
                const TensorLayout& weight, const std::string& op, int& align) {
  l.ngroups = check_gated_rms_norm_problem(
      op, x.dtype, x.rank, x.sizes.data(), weight.dtype, weight.rank, weight.sizes.data(),
      g.bias.dtype, g.has_bias ? g.bias.rank : -1, g.bias.sizes.data(), g.z.dtype,
      g.has_z ? g.z.rank : -1, g.z.sizes.data(), g.group_size);
  l.gated = true;
  l.gate = !g.has_z ? RmsNormGate::None
           : g.norm_before_gate ? RmsNormGate::After : RmsNormGate::Before;
  l.has_bias = g.has_bias;
  l.b_stride = g.has_bias ? g.bias.strides[0] : 0;
  if (g.has_bias) align = std::min(align, g.bias.alignment);
  if (g.has_z) align = std::min(align, g.z.alignment);
  return !g.has_bias || l.b_stride == 1;
}

// After plan_rows: the gated op's row groups of `cols` channels.
void split_groups(RmsNormLaunch& l) {
  if (l.gated && l.ngroups > 0) l.cols /= l.ngroups;
}

const char* op_name(const RmsNormDescriptor& d) {
  return d.gated.on ? kGatedOp : d.has_residual ? kAddOp : kOp;
}

const char* op_name(const RmsNormBackwardDescriptor& d) {
  return d.has_dz_into ? kGatedBackwardIntoOp
         : d.gated.on  ? kGatedBackwardOp
         : d.dx_over_dy ? kBackwardInPlaceOp
                        : kBackwardOp;
}

// The largest power of two (<= 16) dividing `bytes` (16 for 0).
int alignment_of(int64_t bytes) {
  int a = 16;
  while (a > 1 && bytes % a != 0) a /= 2;
  return a;
}

// gated_rms_norm_backward_into's dz (after plan_gated): x's sizes and dtype, no two
// elements at one address, a unit inner stride and one row stride over the leading dims
// (a [rows, N] view: a slice of a wider gradient buffer's last dim). Returns that row
// stride (N for at most one row) and lowers `align` to every row's start.
int64_t plan_dz_into(const RmsNormBackwardDescriptor& d, const std::string& op, int& align) {
  const TensorLayout &x = d.x, &dz = d.dz_into;
  if (!d.gated.has_z)
    fail(PlanErrorKind::InvalidProblem, op, "dz needs z (the gate whose gradient it is), got z=None");
  check_dz_into_problem(op, x.dtype, x.rank, x.sizes.data(), dz.dtype, dz.rank, dz.sizes.data());
  if (!dz.is_non_overlapping())
    fail(PlanErrorKind::InvalidProblem, op,
         "dz must not overlap itself (no two of its elements at one address), got strides " +
             sizes_str(dz.strides.data(), dz.rank));
  if (dz.numel() == 0) return x.sizes[x.rank - 1];
  const int64_t row_stride = check_dz_into_strides(op, dz.rank, dz.sizes.data(), dz.strides.data());
  align = std::min({align, dz.alignment, alignment_of(row_stride * element_size(dz.dtype))});
  return row_stride;
}

void check_forward(const RmsNormDescriptor& d, const std::string& op) {
  const TensorLayout& x = d.x;
  check_rms_norm_problem(op, "x", x.dtype, x.rank, x.sizes.data(), d.weight.dtype,
                         d.has_weight ? d.weight.rank : -1, d.weight.sizes.data(), "residual",
                         d.residual.dtype, d.has_residual ? d.residual.rank : -1,
                         d.residual.sizes.data());
}
}  // namespace

const char* rms_norm_convention_name(RmsNormConvention c) {
  return kConventions[static_cast<int>(c)];
}

RmsNormConvention parse_rms_norm_convention(const std::string& name, const std::string& op) {
  for (int i = 0; i < 3; ++i)
    if (name == kConventions[i]) return static_cast<RmsNormConvention>(i);
  fail(PlanErrorKind::InvalidProblem, op,
       "convention must be 'torch', 'llama' or 'gemma', got '" + name + "'");
}

bool rms_norm_allow_stage(bool allow) { return g_allow_stage.exchange(allow); }

int64_t rms_norm_dw_smem_bytes(const RmsNormLaunch& l) {
  return l.backward && l.rows_per_block > 1 && l.has_weight ? l.cols * element_size(rms_norm_rstd_dtype(l.element))
                                                             : 0;
}

int64_t rms_norm_stage_row_bytes(const RmsNormLaunch& l) {  // (dy,) x (and the gated op's z)
  const int64_t z = l.gated && l.gate != RmsNormGate::None ? element_size(l.element) : 0;
  return l.cols * ((l.backward ? element_size(l.out_element) : 0) + element_size(l.element) + z);
}

int64_t rms_norm_smem_bytes(const RmsNormLaunch& l) {
  return rms_norm_dw_smem_bytes(l) + (l.stage ? l.rows_per_block * 2 * rms_norm_stage_row_bytes(l) : 0);
}

ElementKind rms_norm_out_dtype(ElementKind x, bool has_weight, ElementKind w,
                               RmsNormConvention c) {
  if (has_weight && c == RmsNormConvention::Llama && w == ElementKind::F32 &&
      (x == ElementKind::F16 || x == ElementKind::BF16))
    return ElementKind::F32;
  return x;
}

double resolve_rms_norm_eps(const std::string& op, std::optional<double> eps, ElementKind x) {
  if (!eps)
    return x == ElementKind::F64 ? std::numeric_limits<double>::epsilon()
                                 : static_cast<double>(std::numeric_limits<float>::epsilon());
  if (!std::isfinite(*eps) || *eps < 0)
    fail(PlanErrorKind::InvalidProblem, op, "eps must be finite and >= 0, got " + double_str(*eps));
  return *eps;
}

RmsNormPlan RmsNormPlan::select(const RmsNormDescriptor& d, PlanPreference) {
  const std::string op = op_name(d);
  RmsNormPlan p;
  p.desc_ = d;
  RmsNormLaunch& l = p.launch_;
  int align = d.x.alignment;
  bool gated_unit = true;
  if (d.gated.on)
    gated_unit = plan_gated(l, d.gated, d.x, d.weight, op, align);
  else
    check_forward(d, op);
  const double eps = resolve_rms_norm_eps(op, d.eps, d.x.dtype);
  l.element = d.x.dtype;
  l.weight_element = d.has_weight ? d.weight.dtype : d.x.dtype;
  l.out_element = rms_norm_out_dtype(d.x.dtype, d.has_weight, d.weight.dtype, d.convention);
  l.convention = d.convention;
  l.has_weight = d.has_weight;
  l.has_residual = d.has_residual;
  const TensorLayout* second = d.has_residual ? &d.residual : d.gated.has_z ? &d.gated.z : &d.x;
  const TensorLayout* inputs[2] = {&d.x, second};
  plan_rows(l, d.x, inputs, 2);
  split_groups(l);
  l.w_stride = d.has_weight ? d.weight.strides[0] : 0;
  set_scalars(l, eps);
  const bool unit_inner = l.col_stride[kRmsX] == 1 && l.col_stride[kRmsResidual] == 1 &&
                          (!d.has_weight || l.w_stride == 1) && gated_unit;
  if (d.has_residual) align = std::min(align, d.residual.alignment);
  if (d.has_weight) align = std::min(align, d.weight.alignment);
  plan_variant(l, d.device, unit_inner || (l.cols <= 1 && l.ngroups <= 1), align, 2);
  plan_stage(l, d.device);
  if (l.stage) plan_resident_grid(l, d.device.backend, op);
  p.y_ = rows_layout(l.out_element, d.x, false);
  p.h_ = d.has_residual ? rows_layout(d.x.dtype, d.x, false) : TensorLayout{};
  p.rstd_ = rstd_output_layout(l, d.x);
  // "rms_norm.llama/...", "rms_norm.add_llama/...": the convention names the kernel;
  // "rms_norm.gated/...": the gated op's (either gate, with or without a bias).
  p.sku_ = kernel_sku(kFamily,
                      d.gated.on ? std::string("gated")
                                 : std::string(d.has_residual ? "add_" : "") +
                                       rms_norm_convention_name(d.convention),
                      d.x.dtype, variant_name(l, d.device), d.device);
  return p;
}

void RmsNormPlan::can_implement(const RmsNormArgs& a) const {
  const std::string op = op_name(desc_);
  check_same_layout(op, "x", desc_.x, a.x.layout);
  if (desc_.has_residual) check_same_layout(op, "residual", desc_.residual, a.residual.layout);
  if (desc_.has_weight) check_same_layout(op, "weight", desc_.weight, a.weight.layout);
  if (desc_.gated.has_z) check_same_layout(op, "z", desc_.gated.z, a.z.layout);
  if (desc_.gated.has_bias) check_same_layout(op, "bias", desc_.gated.bias, a.bias.layout);
  check_output(op, "y", y_, a.y);
  if (desc_.has_residual) check_output(op, "h", h_, a.h);
  check_output(op, "rstd", rstd_, a.rstd);
}

void RmsNormPlan::run(void* stream, Workspace workspace, const RmsNormArgs& a) const {
  can_implement(a);
  const std::string op = op_name(desc_);
  check_workspace(op, 0, workspace);
  if (launch_.rows == 0 || launch_.ngroups == 0) return;
  RmsNormLaunch l = launch_;
  l.x = a.x.data;
  l.residual = a.residual.data;
  l.weight = a.weight.data;
  l.z = a.z.data;
  l.bias = a.bias.data;
  l.y = a.y.data;
  l.h = a.h.data;
  l.rstd = a.rstd.data;
  run_on_backend(desc_.device.backend, op, kernels::rms_norm_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::rms_norm_cuda), l, stream);
}

RmsNormBackwardPlan RmsNormBackwardPlan::select(const RmsNormBackwardDescriptor& d,
                                                PlanPreference) {
  const std::string op = op_name(d);
  const TensorLayout& x = d.x;
  RmsNormBackwardPlan p;
  p.desc_ = d;
  RmsNormLaunch& l = p.launch_;
  int align = std::min(d.dy.alignment, x.alignment);
  bool gated_unit = true;
  if (d.gated.on)
    gated_unit = plan_gated(l, d.gated, x, d.weight, op, align);
  else
    check_rms_norm_problem(op, "x", x.dtype, x.rank, x.sizes.data(), d.weight.dtype,
                           d.has_weight ? d.weight.rank : -1, d.weight.sizes.data(), "dh",
                           d.dh.dtype, d.has_dh ? d.dh.rank : -1, d.dh.sizes.data());
  const ElementKind out = rms_norm_out_dtype(x.dtype, d.has_weight, d.weight.dtype, d.convention);
  check_rms_norm_backward(op, x.dtype, x.rank, x.sizes.data(), out, d.dy.dtype, d.dy.rank,
                          d.dy.sizes.data(), d.rstd.dtype, d.rstd.rank, d.rstd.sizes.data(),
                          d.gated.on ? &l.ngroups : nullptr);
  l.backward = true;
  l.element = x.dtype;
  l.weight_element = d.has_weight ? d.weight.dtype : x.dtype;
  l.out_element = out;
  l.convention = d.convention;
  l.has_weight = d.has_weight;
  l.has_residual = d.has_dh;
  // rstd has one dim fewer (the gated op: its last dim is the row group): give it x's
  // rank, with the row groups' stride last (never used by the plain ops).
  TensorLayout rstd = d.rstd;
  rstd.rank = x.rank;
  rstd.sizes = x.sizes;
  if (!d.gated.on) rstd.strides[x.rank - 1] = 0;
  const TensorLayout* third = d.has_dh ? &d.dh : d.gated.has_z ? &d.gated.z : &x;
  const TensorLayout* inputs[4] = {&d.dy, &x, third, &rstd};
  plan_rows(l, x, inputs, 4);
  split_groups(l);
  l.w_stride = d.has_weight ? d.weight.strides[0] : 0;
  set_scalars(l, 0.0);
  const bool unit_inner = l.col_stride[kRmsDy] == 1 && l.col_stride[kRmsBx] == 1 &&
                          l.col_stride[kRmsDh] == 1 && (!d.has_weight || l.w_stride == 1) &&
                          gated_unit;
  if (d.has_dh) align = std::min(align, d.dh.alignment);
  if (d.has_weight) align = std::min(align, d.weight.alignment);
  if ((d.has_dz_into || d.recompute_output) && !d.gated.on)
    fail(PlanErrorKind::Internal, op, "dz and the recomputed output belong to the gated op");
  if (d.dx_over_dy) {  // (dx is written over dy: each element read before it is written)
    if (d.gated.on) fail(PlanErrorKind::Internal, op, "dx over dy belongs to the plain op");
    check_rms_norm_dy_overwritable(op, x.dtype, d.dy.dtype, d.dy.is_contiguous(), d.dy.strides.data(), d.dy.rank);
  }
  l.dz_row_stride = d.has_dz_into ? plan_dz_into(d, op, align) : l.width();
  plan_variant(l, d.device, unit_inner || (l.cols <= 1 && l.ngroups <= 1), align, 3);
  plan_stage(l, d.device);
  plan_resident_grid(l, d.device.backend, op);
  p.dx_ = d.dx_over_dy ? d.dy : rows_layout(x.dtype, x, false);
  p.dw_ = vector_layout(l.weight_element, d.has_weight, l.width());
  if (d.gated.on) {
    p.dz_ = d.has_dz_into    ? d.dz_into  // the kernels write through its row stride
            : d.gated.has_z ? rows_layout(x.dtype, x, false)
                            : vector_layout(x.dtype, false, 0);
    p.db_ = vector_layout(l.weight_element, d.gated.has_bias, l.width());
    p.y_ = d.recompute_output ? rows_layout(x.dtype, x, false) : vector_layout(x.dtype, false, 0);
  }
  p.workspace_ = static_cast<size_t>(l.dw_blocks * l.width() * (l.has_bias ? 2 : 1)) *
                 static_cast<size_t>(element_size(rms_norm_rstd_dtype(x.dtype)));
  // Every sum has a fixed order (rows within a block, then blocks in order): deterministic.
  p.sku_ = kernel_sku(kFamily,
                      std::string(d.gated.on ? "gated" : rms_norm_convention_name(d.convention)) +
                          "_backward",
                      x.dtype, variant_name(l, d.device), d.device);
  return p;
}

void RmsNormBackwardPlan::can_implement(const RmsNormBackwardArgs& a) const {
  const std::string op = op_name(desc_);
  check_same_layout(op, "dy", desc_.dy, a.dy.layout);
  check_same_layout(op, "x", desc_.x, a.x.layout);
  if (desc_.has_weight) check_same_layout(op, "weight", desc_.weight, a.weight.layout);
  check_same_layout(op, "rstd", desc_.rstd, a.rstd.layout);
  if (desc_.has_dh) check_same_layout(op, "dh", desc_.dh, a.dh.layout);
  if (desc_.gated.has_z) check_same_layout(op, "z", desc_.gated.z, a.z.layout);
  if (desc_.gated.has_bias) check_same_layout(op, "bias", desc_.gated.bias, a.bias.layout);
  check_output(op, "dx", dx_, a.dx);
  check_output(op, "dw", dw_, a.dw);
  if (desc_.gated.on) {
    check_output(op, "dz", dz_, a.dz);
    check_output(op, "db", db_, a.db);
    check_output(op, "y", y_, a.y);
  }
}

void RmsNormBackwardPlan::run(void* stream, Workspace workspace,
                              const RmsNormBackwardArgs& a) const {
  can_implement(a);
  const std::string op = op_name(desc_);
  check_workspace(op, workspace_, workspace);
  // No rows: dw (and db) are still written (zeros) when there is a weight.
  if (launch_.rows == 0 && !desc_.has_weight) return;
  RmsNormLaunch l = launch_;
  l.dy = a.dy.data;
  l.x = a.x.data;
  l.weight = a.weight.data;
  l.rstd_in = a.rstd.data;
  l.dh = a.dh.data;
  l.z = a.z.data;
  l.bias = a.bias.data;
  l.dx = a.dx.data;
  l.dw = a.dw.data;
  l.dz = a.dz.data;
  l.db = a.db.data;
  l.y = desc_.recompute_output ? a.y.data : nullptr;
  l.workspace = workspace.data;
  run_on_backend(desc_.device.backend, op, kernels::rms_norm_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::rms_norm_cuda), l, stream);
}

}  // namespace baracuda
