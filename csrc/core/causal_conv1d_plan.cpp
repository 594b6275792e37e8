#include "core/causal_conv1d_plan.h"

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <tuple>
#include <utility>

#include "kernels/causal_conv1d.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "causal_conv1d";
constexpr const char* kOp = "causal_conv1d";
constexpr const char* kBackwardOp = "causal_conv1d_backward";
constexpr const char* kBackwardIntoOp = "causal_conv1d_backward_into";

const char* backward_op(const CausalConv1dBackwardDescriptor& d) { return d.has_dx ? kBackwardIntoOp : kBackwardOp; }

ConvOperand<int64_t> operand(bool present, const TensorLayout& t) {
  return {present, t.dtype, t.rank, t.sizes.data()};
}

Strides3 strides_of(const TensorLayout& t) {
  if (t.rank == 2) return {t.strides[0], 0, t.strides[1]};  // seq_idx [B, L]
  return {t.strides[0], t.strides[1], t.strides[2]};
}

// [B, D, W − 1] in x's dtype, channel-last, as causal-conv1d allocates its states.
TensorLayout states_layout(const TensorLayout& x, int64_t width) {
  const int64_t sizes[3] = {x.sizes[0], x.sizes[1], width - 1};
  TensorLayout t = dense_output_layout(x.dtype, 3, sizes);
  // [B, W − 1, D] contiguous, transposed (torch's strides, size-0 dims counted as 1).
  const int64_t d = std::max<int64_t>(sizes[1], 1), w = std::max<int64_t>(sizes[2], 1);
  t.strides = {w * d, 1, d};
  return t;
}

// out and dx: torch.empty_like(x), or contiguous when neither the channel nor the time
// stride of x is 1 (where causal-conv1d makes x contiguous first).
TensorLayout out_layout_of(const TensorLayout& x) {
  if (x.strides[1] != 1 && x.strides[2] != 1) return dense_output_layout(x);
  return empty_like_layout(x);
}

// Whether a vector of `vec` elements along dim `inner` of every operand is one aligned
// load: unit stride there, the other dims' strides (of size > 1) multiples of vec, the
// data aligned to the vector, and `count` (the extent the vectors tile) a multiple of vec.
bool vectorizable(const TensorLayout* const* ts, int n, int inner, int vec, int64_t count) {
  if (count % vec != 0) return false;
  for (int k = 0; k < n; ++k) {
    const TensorLayout& t = *ts[k];
    if (t.strides[inner] != 1 || t.alignment < vec * element_size(t.dtype)) return false;
    for (int d = 0; d < 3; ++d)
      if (d != inner && t.sizes[d] > 1 && t.strides[d] % vec != 0) return false;
  }
  return true;
}

// The layout for the streamed operands, and its vector's elements.
std::pair<CausalConv1dLayout, int> pick_layout(const TensorLayout* const* ts, int n,
                                               ElementKind e, int64_t dim) {
  const int channels = causal_conv1d_channel_vec(element_size(e));
  if (vectorizable(ts, n, 1, channels, dim)) return {CausalConv1dLayout::ChannelsLastVec, channels};
  // Rows: the time extent need not be a multiple of the vector (the last one of a row is
  // loaded element by element); a thread's chunk starts at a multiple of it.
  const int steps = 16 / element_size(e);
  if (vectorizable(ts, n, 2, steps, 0)) return {CausalConv1dLayout::RowsVec16, steps};
  return {CausalConv1dLayout::Strided, 1};
}

const char* variant_name(const CausalConv1dLaunch& l) {
  switch (l.layout) {
    case CausalConv1dLayout::ChannelsLastVec: return l.plain_walk ? "channels_last_vec_plain" : "channels_last_vec";
    case CausalConv1dLayout::RowsVec16: return l.rows_warp ? "rows_vec16_warp" : "rows_vec16";
    default: return "strided";
  }
}

// Validates the forward problem (the backward's too) and fills the launch's problem fields.
void plan_problem(CausalConv1dLaunch& l, const CausalConv1dDescriptor& d, const std::string& op) {
  check_causal_conv1d_problem(op, operand(true, d.x), operand(true, d.weight),
                              operand(d.has_bias, d.bias), operand(d.has_seq_idx, d.seq_idx),
                              operand(d.has_initial_states, d.initial_states));
  const int64_t width = d.weight.sizes[1];
  if (d.device.backend == Backend::Cuda &&
      (width < kCausalConv1dMinCudaWidth || width > kCausalConv1dMaxCudaWidth))
    fail(PlanErrorKind::Unsupported, op,
         "widths " + std::to_string(kCausalConv1dMinCudaWidth) + " to " +
             std::to_string(kCausalConv1dMaxCudaWidth) + " are wired on CUDA, got " +
             std::to_string(width));
  l.element = d.x.dtype;
  l.weight_element = d.weight.dtype;
  l.silu = d.silu;
  l.has_bias = d.has_bias;
  l.has_seq_idx = d.has_seq_idx;
  l.has_initial_states = d.has_initial_states;
  l.batch = d.x.sizes[0];
  l.dim = d.x.sizes[1];
  l.seqlen = d.x.sizes[2];
  l.width = static_cast<int>(width);
  l.x = strides_of(d.x);
  if (d.has_initial_states) l.init = strides_of(d.initial_states);
  if (d.has_seq_idx) l.seq = strides_of(d.seq_idx);
  l.w_stride_d = d.weight.strides[0];
  l.w_stride_k = d.weight.strides[1];
  l.bias_stride = d.has_bias ? d.bias.strides[0] : 0;
}

// The CUDA layout from the streamed operands (x and out; dout and dx too backward); the
// CPU kernel walks any strides.
void plan_layout(CausalConv1dLaunch& l, const DeviceInfo& device,
                 std::initializer_list<const TensorLayout*> streamed) {
  if (device.backend != Backend::Cuda) return;
  l.sm_count = device.sm_count;
  std::tie(l.layout, l.vec) =
      pick_layout(std::data(streamed), static_cast<int>(streamed.size()), l.element, l.dim);
}

// CausalConv1dLaunch::rows_warp without the backward's dfinal_states condition.
bool rows_warp(const CausalConv1dLaunch& l, const DeviceInfo& device) {
  return l.layout == CausalConv1dLayout::RowsVec16 && !l.has_seq_idx && !l.has_initial_states &&
         element_size(l.element) <= 4 &&
         l.batch * l.dim >= kCausalConv1dRowsWarpMinRowsPerSm * std::max(device.sm_count, 1);
}

// The work split: the backend's chunk (and grid), then the counts that follow from it.
void plan_work(CausalConv1dLaunch& l, const DeviceInfo& device, const std::string& op) {
  const int per_group = l.layout == CausalConv1dLayout::ChannelsLastVec ? l.vec : 1;
  l.groups = (l.dim + per_group - 1) / per_group;
  const CausalConv1dWork w = query_backend(device.backend, op, kernels::causal_conv1d_cpu_work,
                                           BARACUDA_CUDA_ENTRY(kernels::causal_conv1d_cuda_work), l);
  l.chunk = w.chunk;
  l.grid = w.grid;
  l.block_channels = w.block_channels;
  l.block_chunks = w.block_chunks;
  l.chunks = (std::max<int64_t>(l.seqlen, 1) + l.chunk - 1) / l.chunk;
  l.partial_rows = l.batch * ((l.chunks + l.block_chunks - 1) / l.block_chunks);
}

KernelSku make_sku(const CausalConv1dLaunch& l, const CausalConv1dDescriptor& d) {
  KernelSku sku = kernel_sku(kFamily, std::string(l.silu ? "silu" : "linear") +
                                          (l.backward ? "_backward" : ""),
                             d.x.dtype, variant_name(l), d.device);
  if (d.has_seq_idx) sku.index_element = ElementKind::I32;
  return sku;
}

void check_inputs(const std::string& op, const CausalConv1dDescriptor& d, const TensorRef& x,
                  const TensorRef& weight, const TensorRef& bias, const TensorRef& seq_idx,
                  const TensorRef& initial_states) {
  check_same_layout(op, "x", d.x, x.layout);
  check_same_layout(op, "weight", d.weight, weight.layout);
  if (d.has_bias) check_same_layout(op, "bias", d.bias, bias.layout);
  if (d.has_seq_idx) check_same_layout(op, "seq_idx", d.seq_idx, seq_idx.layout);
  if (d.has_initial_states)
    check_same_layout(op, "initial_states", d.initial_states, initial_states.layout);
}

void set_inputs(CausalConv1dLaunch& l, const TensorRef& x, const TensorRef& weight,
                const TensorRef& bias, const TensorRef& seq_idx, const TensorRef& initial_states) {
  l.x_data = x.data;
  l.weight = weight.data;
  l.bias = bias.data;
  l.seq_idx = static_cast<const int32_t*>(seq_idx.data);
  l.initial_states = initial_states.data;
}
}  // namespace

bool parse_causal_conv1d_activation(const std::optional<std::string>& activation,
                                    const std::string& op) {
  if (!activation) return false;
  if (*activation == "silu" || *activation == "swish") return true;
  fail(PlanErrorKind::InvalidProblem, op,
       "activation must be None, 'silu' or 'swish', got '" + *activation + "'");
}

CausalConv1dPlan CausalConv1dPlan::select(const CausalConv1dDescriptor& d, PlanPreference) {
  CausalConv1dPlan p;
  p.desc_ = d;
  CausalConv1dLaunch& l = p.launch_;
  plan_problem(l, d, kOp);
  p.out_ = out_layout_of(d.x);
  p.final_ = states_layout(d.x, l.width);
  plan_layout(l, d.device, {&d.x, &p.out_});
  l.rows_warp = rows_warp(l, d.device);
  l.out = strides_of(p.out_);
  l.final = strides_of(p.final_);
  plan_work(l, d.device, kOp);
  // Every reduction (the taps of one output) has a fixed order.
  p.sku_ = make_sku(l, d);
  return p;
}

void CausalConv1dPlan::can_implement(const CausalConv1dArgs& a) const {
  check_inputs(kOp, desc_, a.x, a.weight, a.bias, a.seq_idx, a.initial_states);
  check_output(kOp, "out", out_, a.out);
  check_output(kOp, "final_states", final_, a.final_states);
}

void CausalConv1dPlan::run(void* stream, Workspace workspace, const CausalConv1dArgs& a) const {
  can_implement(a);
  check_workspace(kOp, 0, workspace);
  if (launch_.batch == 0 || launch_.dim == 0) return;
  CausalConv1dLaunch l = launch_;
  set_inputs(l, a.x, a.weight, a.bias, a.seq_idx, a.initial_states);
  l.out_data = a.out.data;
  l.final_states = a.final_states.data;
  run_on_backend(desc_.device.backend, kOp, kernels::causal_conv1d_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::causal_conv1d_cuda), l, stream);
}

CausalConv1dBackwardPlan CausalConv1dBackwardPlan::select(const CausalConv1dBackwardDescriptor& d,
                                                          PlanPreference) {
  CausalConv1dBackwardPlan p;
  p.desc_ = d;
  const char* op = backward_op(d);
  const CausalConv1dDescriptor& f = d.forward;
  CausalConv1dLaunch& l = p.launch_;
  l.backward = true;
  plan_problem(l, f, op);
  check_causal_conv1d_backward(op, operand(true, f.x), operand(true, f.weight), operand(true, d.dout),
                               operand(d.has_dfinal_states, d.dfinal_states), operand(d.has_dx, d.dx));
  if (d.has_dx && !d.dx.is_non_overlapping())
    fail(PlanErrorKind::InvalidProblem, op,
         "dx must not overlap itself (no two of its elements at one address), got strides " +
             sizes_str(d.dx.strides.data(), d.dx.rank));
  // (the caller's dx: the kernels write through its strides)
  p.dx_ = d.has_dx ? d.dx : out_layout_of(f.x);
  plan_layout(l, f.device, {&f.x, &p.dx_, &d.dout});
  l.has_dfinal_states = d.has_dfinal_states;
  l.plain_walk = l.layout == CausalConv1dLayout::ChannelsLastVec && !l.has_seq_idx && !l.has_dfinal_states;
  l.rows_warp = rows_warp(l, f.device) && !l.has_dfinal_states;
  l.out = strides_of(p.dx_);
  l.dout = strides_of(d.dout);
  if (d.has_dfinal_states) l.final = strides_of(d.dfinal_states);
  const TensorLayout states = states_layout(f.x, l.width);
  l.dinit = strides_of(states);
  const int64_t none = 0;
  p.dinit_ = f.has_initial_states ? states : dense_output_layout(f.x.dtype, 1, &none);
  const int64_t w_sizes[2] = {l.dim, l.width};
  p.dweight_ = dense_output_layout(f.weight.dtype, 2, w_sizes);
  const int64_t bias_size = f.has_bias ? l.dim : 0;
  p.dbias_ = dense_output_layout(f.weight.dtype, 1, &bias_size);
  plan_work(l, f.device, op);
  const int acc = l.element == ElementKind::F64 ? 8 : 4;
  p.workspace_ = static_cast<size_t>(l.partial_rows * l.dim * (l.width + 1)) * acc;
  // dweight and dbias: per-thread chunk sums, then per-block and per-row sums in a fixed
  // order (no atomics): deterministic and bit-stable.
  p.sku_ = make_sku(l, f);
  return p;
}

void CausalConv1dBackwardPlan::can_implement(const CausalConv1dBackwardArgs& a) const {
  const CausalConv1dDescriptor& f = desc_.forward;
  const char* op = backward_op(desc_);
  check_inputs(op, f, a.x, a.weight, a.bias, a.seq_idx, a.initial_states);
  check_same_layout(op, "dout", desc_.dout, a.dout.layout);
  if (desc_.has_dfinal_states) check_same_layout(op, "dfinal_states", desc_.dfinal_states, a.dfinal_states.layout);
  check_output(op, "dx", dx_, a.dx);
  check_output(op, "dweight", dweight_, a.dweight);
  check_output(op, "dbias", dbias_, a.dbias);
  check_output(op, "dinitial_states", dinit_, a.dinitial_states);
}

void CausalConv1dBackwardPlan::run(void* stream, Workspace workspace,
                                   const CausalConv1dBackwardArgs& a) const {
  can_implement(a);
  const char* op = backward_op(desc_);
  check_workspace(op, workspace_, workspace);
  // No channels: every output is empty. No batch: dweight and dbias are zeros.
  if (launch_.dim == 0) return;
  CausalConv1dLaunch l = launch_;
  set_inputs(l, a.x, a.weight, a.bias, a.seq_idx, a.initial_states);
  l.dout_data = a.dout.data;
  l.dfinal_states = a.dfinal_states.data;
  l.out_data = a.dx.data;
  l.dweight = a.dweight.data;
  l.dbias = a.dbias.data;
  l.dinitial_states = a.dinitial_states.data;
  l.workspace = workspace.data;
  run_on_backend(desc_.forward.device.backend, op, kernels::causal_conv1d_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::causal_conv1d_cuda), l, stream);
}

}  // namespace baracuda
