// Causal depthwise conv1d over time with an optional SiLU (the semantics of the
// causal-conv1d package, which Mamba and Mamba-2 layers run on their xBC channels),
// forward and backward.
//
// x [B, D, L] (any strides), weight [D, W] (tap W−1 multiplies the current step), bias [D],
// initial_states [B, D, W−1] (x at the times −(W−1) .. −1; zeros without), seq_idx [B, L]
// (int32: the packed sequence of each step). With x̃ = x at τ ≥ 0 and initial_states[.., τ + W − 1]
// (or 0) at τ < 0, per (b, d) and τ_k = t − (W−1) + k:
//   pre[t]   = bias + Σ_{k<W} weight[k] · x̃[τ_k]            over the taps with m(t, k)
//   m(t, k)  = 1 without seq_idx; with it, τ_k ≥ 0 and seq_idx[τ_k] == seq_idx[t] (the
//              same sequence id: a tap never reads another packed sequence)
//   out[t]   = act(pre[t]), act = SiLU (pre / (1 + exp(−pre))) or the identity; 0 where
//              seq_idx[t] < 0 (a padding step)
//   final_states[j] = x̃[L − (W−1) + j], j < W − 1: the last W − 1 inputs (the decode
//              cache's conv state; initial states where L < W − 1)
// Every sum runs in float32 (float64 for float64 x), taps in order k = 0 .. W−1, one
// rounding to x's dtype at the end. Backward, with g[t] = dout[t] · act'(pre[t]) (0 at a
// padding step; act' = σ(pre)(1 + pre(1 − σ(pre))) for SiLU):
//   dx[s]         = Σ_k weight[k] · g[s + W−1−k]  over the taps (t = s + W−1−k < L) with m(t, k)
//                   + dfinal[s − (L − (W−1))] where s ≥ L − (W−1)
//   dweight[d, k] = Σ_{b,t} g[t] · x̃[τ_k] (with m(t, k)),   dbias[d] = Σ_{b,t} g[t]
//   dinit[i]      = Σ_k weight[k] · g[i − k] (0 ≤ i − k < L) + dfinal[i − L] (i ≥ L)
// dweight and dbias are reduced deterministically: each thread (CUDA) or task (CPU) sums
// its time chunk into float32 (float64) partials, a CUDA block adds its chunks' partials
// in a fixed order into one workspace row, and a last pass sums the rows in order.
#pragma once

#include <optional>
#include <string>

#include "core/plan.h"

namespace baracuda {

// How a CUDA thread walks its chunk of time steps; the CPU kernel takes any strides
// ("strided" in explain).
//  ChannelsLastVec: x's channel stride is 1 (a channel-last view, e.g. a slice of a
//    [B, L, D'] projection transposed): a thread holds a vector of consecutive channels
//    (causal_conv1d_channel_vec of them: 8 bytes of 16-bit data, 16 bytes of float32 or
//    float64) and walks time, keeping the last W − 1 inputs of each in registers; a warp
//    reads 256 or 512 contiguous bytes a step.
//  RowsVec16: x's time stride is 1 ([B, D, L] contiguous): a thread walks one channel's
//    time steps 16 bytes a load (the forward: a warp's lanes on consecutive chunks of
//    one row).
//  Strided: anything else (or sizes, strides, addresses that do not allow the vectors):
//    one channel a thread, scalar loads.
// The CUDA kernels on RowsVec16 without seq_idx or initial states (the backward: nor
// dfinal_states), of 2- or 4-byte elements and with enough rows
// (CausalConv1dLaunch::rows_warp, explain "rows_vec16_warp") walk a row a warp instead:
// lane i holds steps [t + V·i, t + V·i + V) of a tile of 32·V steps, so that a warp's
// loads and stores are 512 contiguous bytes where one channel a thread read 32 rows a
// warp load.
enum class CausalConv1dLayout : uint8_t { ChannelsLastVec, RowsVec16, Strided };

// CUDA: widths with kernels (template instances); the CPU takes any width >= 1.
constexpr int kCausalConv1dMinCudaWidth = 2;
constexpr int kCausalConv1dMaxCudaWidth = 4;
// CUDA: threads a block: `block_channels` channel groups (a power of two, a warp's worth
// at least where there are that many) by `block_chunks` time chunks.
constexpr int kCausalConv1dThreads = 256;
constexpr int kCausalConv1dMinBlockChannels = 32;
// CUDA, channel-last: channels a thread, at most 4 (and at most 16 bytes). A thread's
// weights, window and in-flight steps live in registers: ptxas for sm_90 gave the W = 4
// bfloat16 forward 166 registers with 8 channels a thread (one block of 256 an SM) and
// 128 with 4 (two blocks), for the same 64 bytes in flight a thread.
constexpr int causal_conv1d_channel_vec(int element_bytes) {
  return 16 / element_bytes < 4 ? 16 / element_bytes : 4;
}
// CUDA: bytes of one operand a thread loads together an iteration (the steps of an
// iteration: 64 / (channels · element bytes) channel-last, 32 / element bytes on rows,
// kCausalConv1dStridedSteps strided); a chunk is a whole number of iterations.
constexpr int kCausalConv1dChannelLastLoadBytes = 64;
constexpr int kCausalConv1dRowsLoadBytes = 32;
constexpr int kCausalConv1dStridedSteps = 4;
constexpr int causal_conv1d_steps(CausalConv1dLayout layout, int element_bytes) {
  return layout == CausalConv1dLayout::ChannelsLastVec
             ? kCausalConv1dChannelLastLoadBytes /
                   (causal_conv1d_channel_vec(element_bytes) * element_bytes)
         : layout == CausalConv1dLayout::RowsVec16 ? kCausalConv1dRowsLoadBytes / element_bytes
                                                   : kCausalConv1dStridedSteps;
}
// CUDA, the warp walks over rows (rows_warp): at least this many rows (batch ×
// channels) an SM, so that the resident warps all have a row (a first choice, not yet
// measured).
constexpr int64_t kCausalConv1dRowsWarpMinRowsPerSm = 32;
// CUDA: time steps a thread at least (its W − 1 halo steps are re-read: at most 3/32 of
// the loads).
constexpr int64_t kCausalConv1dMinChunk = 32;
// CUDA, the rows forward: iterations a chunk (the forward splits rows along time so that a
// warp's lanes walk consecutive chunks of one row; see causal_conv1d_work).
constexpr int64_t kCausalConv1dRowsForwardChunkIters = 2;
// CPU: channels and time steps a task (fixed, so that dweight's partials, one row per
// (batch, chunk), do not depend on the thread count).
constexpr int64_t kCausalConv1dCpuChannels = 64;
constexpr int64_t kCausalConv1dCpuChunk = 1024;

// A 3-d operand's element strides [batch, channel, time] (seq_idx: [batch, time, 0]).
struct Strides3 {
  int64_t b = 0, d = 0, t = 0;
};

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// Work: `chunks` time chunks of `chunk` steps per (batch, channel group); a channel group
// is `vec` channels (ChannelsLastVec) or one; `vec` is the elements of a vector load
// (channels, or RowsVec16's time steps). CUDA: a block is block_channels ×
// block_chunks threads (channel group fastest) covering one item of block_channels
// groups × block_chunks chunks of one batch; items are numbered channel block fastest,
// then chunk block, then batch, and `grid` blocks take items b, b + grid, .... The
// backward writes one partial row per (batch, chunk block): partial_rows =
// B · ⌈chunks / block_chunks⌉ (CPU: block_chunks = 1), each D × (W + 1) values
// (W dweight taps, then dbias) in float32 (float64) in the workspace.
struct CausalConv1dLaunch {
  bool backward = false;
  ElementKind element = ElementKind::F32;         // x, out, initial/final states, dout, dx
  ElementKind weight_element = ElementKind::F32;  // weight, bias, dweight, dbias
  bool silu = false;
  bool has_bias = false;
  bool has_seq_idx = false;
  bool has_initial_states = false;
  bool has_dfinal_states = false;  // backward
  CausalConv1dLayout layout = CausalConv1dLayout::Strided;
  // CUDA backward, ChannelsLastVec without seq_idx or dfinal_states: the walk built
  // without their per-step checks (explain: "channels_last_vec_plain").
  bool plain_walk = false;
  // CUDA, RowsVec16: a warp a row (see CausalConv1dLayout; explain "rows_vec16_warp").
  // Its work: one chunk a row (chunk = L), blocks of kCausalConv1dThreads threads
  // (block_channels; block_chunks = 1) taking kCausalConv1dThreads / 32 rows at a time;
  // the backward's dweight/dbias: one partial row a batch element.
  bool rows_warp = false;
  int64_t batch = 0, dim = 0, seqlen = 0;
  int width = 0;
  Strides3 x, out;       // out: the forward's out, the backward's dx
  Strides3 dout;         // backward
  Strides3 init, final;  // initial_states; final_states (forward) or dfinal_states (backward)
  Strides3 dinit;        // backward
  Strides3 seq;          // seq_idx: b, t
  int64_t w_stride_d = 0, w_stride_k = 0, bias_stride = 0;
  // Work decomposition (see above).
  int vec = 1;
  int64_t chunk = 0, chunks = 0, groups = 0;
  int block_channels = 1, block_chunks = 1;
  int64_t grid = 0;
  int sm_count = 0;
  int64_t partial_rows = 0;

  const void* x_data = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const int32_t* seq_idx = nullptr;
  const void* initial_states = nullptr;
  const void* dout_data = nullptr;       // backward
  const void* dfinal_states = nullptr;   // backward, optional
  void* out_data = nullptr;              // forward: out; backward: dx
  void* final_states = nullptr;          // forward
  void* dweight = nullptr;               // backward
  void* dbias = nullptr;                 // backward, with a bias
  void* dinitial_states = nullptr;       // backward, with initial states
  void* workspace = nullptr;             // backward: partial_rows × D × (W + 1)
};

// The backend's work split, from a launch whose layout, vec, sizes and groups are set:
// the time steps a thread (CUDA) or task (CPU) walks, the CUDA block shape and grid (1, 1
// and 0 on the CPU).
struct CausalConv1dWork {
  int64_t chunk = 0;
  int64_t grid = 0;
  int block_channels = 1, block_chunks = 1;
};

template <class Int>
using ConvOperand = ProblemOperand<Int>;

// None, "silu" or "swish" (SiLU): whether the op applies SiLU; ValueError otherwise.
bool parse_causal_conv1d_activation(const std::optional<std::string>& activation,
                                    const std::string& op);

template <class Int>
bool conv_sizes_are(const ConvOperand<Int>& t, std::initializer_list<Int> expected) {
  if (t.rank != static_cast<int>(expected.size())) return false;
  int d = 0;
  for (const Int& e : expected)
    if (!(t.sizes[d++] == e)) return false;
  return true;
}

template <class Int>
[[noreturn]] void fail_conv_shape(const std::string& op, const char* what, const char* expected,
                                  std::initializer_list<Int> sizes, const ConvOperand<Int>& t) {
  fail(PlanErrorKind::InvalidProblem, op,
       std::string(what) + " must have shape " + expected + " = " +
           sizes_str(std::data(sizes), static_cast<int>(sizes.size())) + ", got " +
           sizes_str(t.sizes, t.rank));
}

template <class Int>
void check_conv_dtype(const std::string& op, const char* what, const ConvOperand<Int>& t,
                      const char* owner, ElementKind expected) {
  if (t.dtype != expected)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(what) + " must have " + owner + "'s dtype " + element_name(expected) +
             ", got " + element_name(t.dtype));
}

// The problem checks shared by the plans and the meta kernels, in this order: x (floating,
// 3-d), weight (x's dtype or float32, [D, W], W >= 1), bias (weight's dtype, [D]),
// seq_idx (int32, [B, L]), initial_states (x's dtype, [B, D, W − 1]; not with seq_idx).
template <class Int>
void check_causal_conv1d_problem(const std::string& op, const ConvOperand<Int>& x,
                                 const ConvOperand<Int>& weight, const ConvOperand<Int>& bias,
                                 const ConvOperand<Int>& seq_idx,
                                 const ConvOperand<Int>& initial_states) {
  if (!is_floating(x.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("x must be float32, float16, bfloat16 or float64, got ") +
             element_name(x.dtype));
  if (x.rank != 3)
    fail(PlanErrorKind::InvalidProblem, op,
         "x must be 3-d [batch, dim, seqlen], got " + sizes_str(x.sizes, x.rank));
  const Int &B = x.sizes[0], &D = x.sizes[1], &L = x.sizes[2];
  if (weight.dtype != x.dtype && weight.dtype != ElementKind::F32)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("weight must have x's dtype ") + element_name(x.dtype) +
             (x.dtype == ElementKind::F32 ? "" : " or float32") + ", got " +
             element_name(weight.dtype));
  if (weight.rank != 2 || !(weight.sizes[0] == D))
    fail(PlanErrorKind::InvalidProblem, op,
         "weight must have shape [dim, width] with dim = x.size(1) = " + size_str(D) + ", got " +
             sizes_str(weight.sizes, weight.rank));
  const Int& W = weight.sizes[1];
  if (W < 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "weight's width (weight.size(1)) must be at least 1, got " + size_str(W));
  if (bias.present) {
    check_conv_dtype(op, "bias", bias, "weight", weight.dtype);
    if (!conv_sizes_are(bias, {D})) fail_conv_shape(op, "bias", "[dim]", {D}, bias);
  }
  if (seq_idx.present) {
    if (seq_idx.dtype != ElementKind::I32)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("seq_idx must be int32, got ") + element_name(seq_idx.dtype));
    if (!conv_sizes_are(seq_idx, {B, L}))
      fail_conv_shape(op, "seq_idx", "[batch, seqlen]", {B, L}, seq_idx);
  }
  if (initial_states.present) {
    check_conv_dtype(op, "initial_states", initial_states, "x", x.dtype);
    if (!conv_sizes_are(initial_states, {B, D, W - 1}))
      fail_conv_shape(op, "initial_states", "[batch, dim, width - 1]", {B, D, W - 1},
                      initial_states);
    if (seq_idx.present)
      fail(PlanErrorKind::InvalidProblem, op,
           "initial_states must be None when seq_idx is given (the states of packed "
           "sequences are not defined), got both");
  }
}

// The backward's own operands: dout (x's sizes and dtype), dfinal_states (x's dtype,
// [B, D, W − 1]), and causal_conv1d_backward_into's dx (x's sizes and dtype).
template <class Int>
void check_causal_conv1d_backward(const std::string& op, const ConvOperand<Int>& x,
                                  const ConvOperand<Int>& weight, const ConvOperand<Int>& dout,
                                  const ConvOperand<Int>& dfinal_states,
                                  const ConvOperand<Int>& dx) {
  const Int &B = x.sizes[0], &D = x.sizes[1], &L = x.sizes[2], &W = weight.sizes[1];
  if (!conv_sizes_are(dout, {B, D, L})) fail_conv_shape(op, "dout", "x's sizes", {B, D, L}, dout);
  check_conv_dtype(op, "dout", dout, "x", x.dtype);
  if (dfinal_states.present) {
    if (!conv_sizes_are(dfinal_states, {B, D, W - 1}))
      fail_conv_shape(op, "dfinal_states", "[batch, dim, width - 1]", {B, D, W - 1},
                      dfinal_states);
    check_conv_dtype(op, "dfinal_states", dfinal_states, "x", x.dtype);
  }
  if (dx.present) {
    if (!conv_sizes_are(dx, {B, D, L})) fail_conv_shape(op, "dx", "x's sizes", {B, D, L}, dx);
    check_conv_dtype(op, "dx", dx, "x", x.dtype);
  }
}

struct CausalConv1dDescriptor {
  TensorLayout x, weight;
  bool has_bias = false, has_seq_idx = false, has_initial_states = false;
  TensorLayout bias, seq_idx, initial_states;
  bool silu = false;
  DeviceInfo device;
};

struct CausalConv1dBackwardDescriptor {
  CausalConv1dDescriptor forward;  // x, weight, bias, seq_idx, initial_states, activation
  TensorLayout dout;
  bool has_dfinal_states = false;
  TensorLayout dfinal_states;
  // causal_conv1d_backward_into: dx is the caller's tensor (x's sizes and dtype, any strides
  // under which no two elements share memory), written in place; else the plan allocates
  // it in x's layout.
  bool has_dx = false;
  TensorLayout dx;
};

struct CausalConv1dArgs {
  TensorRef x, weight, bias, seq_idx, initial_states;  // data null where absent
  MutTensorRef out, final_states;
};

struct CausalConv1dBackwardArgs {
  TensorRef dout, dfinal_states, x, weight, bias, seq_idx, initial_states;  // null where absent
  MutTensorRef dx, dweight, dbias, dinitial_states;
};

class CausalConv1dPlan : public PlanOf<CausalConv1dDescriptor, CausalConv1dLaunch> {
 public:
  static CausalConv1dPlan select(const CausalConv1dDescriptor& desc, PlanPreference pref);
  // out: x's sizes and dtype in x's memory layout (torch.empty_like(x); contiguous when
  // neither x's channel nor its time stride is 1); final_states: [B, D, W − 1] in x's
  // dtype, channel-last (strides ((W − 1)·D, 1, D)).
  const TensorLayout& out_layout() const { return out_; }
  const TensorLayout& final_states_layout() const { return final_; }
  void can_implement(const CausalConv1dArgs& args) const;
  void run(void* stream, Workspace workspace, const CausalConv1dArgs& args) const;

 private:
  TensorLayout out_, final_;
};

class CausalConv1dBackwardPlan
    : public PlanOf<CausalConv1dBackwardDescriptor, CausalConv1dLaunch> {
 public:
  static CausalConv1dBackwardPlan select(const CausalConv1dBackwardDescriptor& desc,
                                         PlanPreference pref);
  // dx: out's layout; dweight [D, W] and dbias [D] (weight's dtype), contiguous, dbias
  // empty without a bias; dinitial_states: final_states' layout, empty without initial
  // states.
  const TensorLayout& dx_layout() const { return dx_; }
  const TensorLayout& dweight_layout() const { return dweight_; }
  const TensorLayout& dbias_layout() const { return dbias_; }
  const TensorLayout& dinitial_states_layout() const { return dinit_; }
  void can_implement(const CausalConv1dBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const CausalConv1dBackwardArgs& args) const;

 private:
  TensorLayout dx_, dweight_, dbias_, dinit_;
};

}  // namespace baracuda
