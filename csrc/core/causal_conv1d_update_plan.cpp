#include "core/causal_conv1d_update_plan.h"

#include "kernels/causal_conv1d_update.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "causal_conv1d";
constexpr const char* kOp = "causal_conv1d_update";

ConvUpdateOperand<int64_t> operand(bool present, const TensorLayout& t) {
  return {present, t.dtype, t.rank, t.sizes.data()};
}

// [b, d, t] strides of a 2-d or 3-d operand (a 2-d one has no time dim: stride 0).
void bdt_strides(const TensorLayout& t, int64_t* out) {
  out[0] = t.strides[0];
  out[1] = t.strides[1];
  out[2] = t.rank == 3 ? t.strides[2] : 0;
}
}  // namespace

ConvUpdatePlan ConvUpdatePlan::select(const ConvUpdateDescriptor& d, PlanPreference) {
  ConvUpdatePlan p;
  p.desc_ = d;
  check_conv_update_problem(kOp, operand(true, d.x), operand(true, d.conv_state),
                            operand(true, d.weight), operand(d.has_bias, d.bias),
                            operand(d.has_cache_seqlens, d.cache_seqlens),
                            operand(d.has_indices, d.indices));
  const int64_t width = d.weight.sizes[1];
  if (d.device.backend == Backend::Cuda && width > kConvUpdateMaxCudaWidth)
    fail(PlanErrorKind::Unsupported, kOp,
         "widths up to " + std::to_string(kConvUpdateMaxCudaWidth) + " are wired on CUDA, got " +
             std::to_string(width));
  p.out_ = dense_output_layout(d.x);
  ConvUpdateLaunch& l = p.launch_;
  l.element = d.x.dtype;
  l.weight_element = d.weight.dtype;
  l.silu = d.silu;
  l.has_bias = d.has_bias;
  l.has_cache_seqlens = d.has_cache_seqlens;
  l.has_indices = d.has_indices;
  l.batch = d.x.sizes[0];
  l.dim = d.x.sizes[1];
  l.seqlen = d.x.rank == 3 ? d.x.sizes[2] : 1;
  l.state_len = d.conv_state.sizes[2];
  l.pool = d.conv_state.sizes[0];
  l.width = static_cast<int>(width);
  bdt_strides(d.x, l.x_s);
  bdt_strides(p.out_, l.out_s);
  bdt_strides(d.conv_state, l.state_s);
  l.w_stride_d = d.weight.strides[0];
  l.w_stride_k = d.weight.strides[1];
  if (d.has_bias) l.bias_stride = d.bias.strides[0];
  if (d.has_cache_seqlens) {
    l.seqlens_element = d.cache_seqlens.dtype;
    l.seqlens_stride = d.cache_seqlens.strides[0];
  }
  if (d.has_indices) {
    l.index_element = d.indices.dtype;
    l.index_stride = d.indices.strides[0];
  }
  l.dim_blocks = (l.dim + kConvUpdateThreads - 1) / kConvUpdateThreads;
  l.grid = l.batch * l.dim_blocks;
  if (d.device.backend == Backend::Cuda && l.grid > INT32_MAX)
    fail(PlanErrorKind::Unsupported, kOp,
         "batch · ceil(dim / 128) must fit in a CUDA grid (2^31 − 1 blocks), got " + std::to_string(l.grid));
  // One thread (CPU: one task) a channel, taps in order: deterministic and bit-stable.
  p.sku_ = kernel_sku(kFamily, std::string(d.silu ? "silu" : "linear") + "_update", d.x.dtype,
                      d.has_cache_seqlens ? "channel_circular" : "channel", d.device);
  if (d.has_indices) p.sku_.index_element = d.indices.dtype;
  return p;
}

void ConvUpdatePlan::can_implement(const ConvUpdateArgs& a) const {
  check_same_layout(kOp, "x", desc_.x, a.x.layout);
  check_same_layout(kOp, "conv_state", desc_.conv_state, a.conv_state.layout);
  check_same_layout(kOp, "weight", desc_.weight, a.weight.layout);
  if (desc_.has_bias) check_same_layout(kOp, "bias", desc_.bias, a.bias.layout);
  if (desc_.has_cache_seqlens)
    check_same_layout(kOp, "cache_seqlens", desc_.cache_seqlens, a.cache_seqlens.layout);
  if (desc_.has_indices) check_same_layout(kOp, "conv_state_indices", desc_.indices, a.indices.layout);
  check_output(kOp, "out", out_, a.out);
}

void ConvUpdatePlan::run(void* stream, Workspace workspace, const ConvUpdateArgs& a) const {
  can_implement(a);
  check_workspace(kOp, 0, workspace);
  if (launch_.batch == 0 || launch_.dim == 0) return;
  ConvUpdateLaunch l = launch_;
  l.x = a.x.data;
  l.conv_state = a.conv_state.data;
  l.weight = a.weight.data;
  l.bias = a.bias.data;
  l.cache_seqlens = a.cache_seqlens.data;
  l.indices = a.indices.data;
  l.out = a.out.data;
  run_on_backend(desc_.device.backend, kOp, kernels::causal_conv1d_update_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::causal_conv1d_update_cuda), l, stream);
}

}  // namespace baracuda
