// RMSNorm over the last dim, with an optional residual add before it.
//
// Per row of N = x.size(-1) elements (h = x, or h = round_x(x + residual) with a residual):
//   rstd = 1 / sqrt(Σ h² / N + eps)            (float32; float64 for float64 x)
//   n    = h · rstd                            (float32)
//   y    = n · w                 convention "torch" (torch.nn.RMSNorm), cast once to x's dtype
//        = w · round_x(n)        convention "llama" (transformers' LlamaRMSNorm and most HF
//                                models): the normalized value rounded to x's dtype first,
//                                then multiplied in the weight's dtype; y has the promoted
//                                dtype of x and w
//        = n · (1 + w)           convention "gemma" (GemmaRMSNorm), cast once to x's dtype
//        = n                     without a weight (every convention)
// round_x rounds to x's dtype (a no-op for float32 and float64).
//
// Backward (the casts are passed straight through, as autograd does), with s = w (torch,
// llama), 1 + w (gemma) or 1, g = dy·s and c = Σ g·n / N per row:
//   dx = rstd · (g − n·c) [+ dh]       (dh: the gradient of h, the residual-add variant;
//                                       dresidual = dx)
//   dw = Σ_rows dy · m,  m = round_x(n) (llama) or n
// dw is reduced deterministically: per-block partial sums in float32 (float64) into the
// workspace, then a column sum over the blocks in a fixed order.
#pragma once

#include <optional>
#include <string>

#include "core/plan.h"

namespace baracuda {

enum class RmsNormConvention : uint8_t { Torch, Llama, Gemma };

const char* rms_norm_convention_name(RmsNormConvention c);
// ValueError naming the op and the accepted names for anything else.
RmsNormConvention parse_rms_norm_convention(const std::string& name, const std::string& op);

// How a kernel walks a row.
//  Rows:    every operand has a unit inner stride; CUDA: 16-byte vectors (N, row strides
//           and addresses multiples of 16 bytes), a row per group of `group` threads
//           (a warp or less: "warp_vec16"; several warps: "block_vec16") holding the row in
//           registers, so x is read once; CPU: AVX2 ("rows_simd") or scalar ("rows").
//  Strided: any strides (inner stride too), any N: a row per block of kRmsNormLoopThreads
//           threads on CUDA, two passes over the row ("strided").
enum class RmsNormLayout : uint8_t { Rows, Strided };

// CUDA: threads a row in the strided variant (one row per block).
constexpr int kRmsNormLoopThreads = 256;
// CUDA, rows variant: vectors a thread holds (registers) and threads a row, at most
// (ptxas for sm_90: 8 vectors spill within the 64 registers of a 1024-thread block), so
// rows of up to 4096 vectors (32768 16-bit, 16384 float32 elements) are held; wider ones
// take the strided variant. The backward holds dy, x and the dw partials: groups of up
// to 512 threads, the fewest vectors a thread that fit.
constexpr int kRmsNormMaxVecs = 4;
constexpr int kRmsNormMaxGroup = 1024;
constexpr int kRmsNormMaxBackwardGroup = 512;
// CUDA, rows variant: threads a forward block at least (rows of small groups share a
// block).
constexpr int kRmsNormBlockThreads = 256;
// CUDA, rows variant: threads a backward block (the kernels' launch bounds: up to 128
// registers a thread; ptxas for sm_90 uses 78 for one bfloat16 vector a thread, 93 for
// two). Its row groups add their dw partials in shared memory, so the workspace holds
// one partial row per block, and the grid is the blocks that are resident at once
// (kernels::rms_norm_cuda_backward_blocks asks the occupancy calculator).
constexpr int kRmsNormBackwardThreads = 512;
// CPU: blocks of rows whose dw partials the backward sums (fixed, so the result does not
// depend on the thread count).
constexpr int64_t kRmsNormCpuDwBlocks = 64;
// CUDA: threads a block of the dw column-sum kernel.
constexpr int kRmsNormReduceThreads = 256;

// Operands of the leading dims (per-row offsets), forward and backward.
enum RmsNormOperand : int { kRmsX = 0, kRmsResidual = 1 };                    // forward
enum RmsNormBackwardOperand : int { kRmsDy = 0, kRmsBx = 1, kRmsDh = 2, kRmsRstd = 3 };  // backward

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// Row r (row-major over x's leading dims) of input operand k starts at element offset
// Σ_d coord_d(r) · lead.strides[k][d] (coords over lead.sizes), its element j at
// + j · col_stride[k]. Outputs are contiguous: y, h and dx at r·cols, rstd at r.
struct RmsNormLaunch {
  bool backward = false;
  ElementKind element = ElementKind::F32;         // x, residual, h, dh, dx
  ElementKind weight_element = ElementKind::F32;  // w and dw: x's dtype or float32
  ElementKind out_element = ElementKind::F32;     // y and dy
  RmsNormConvention convention = RmsNormConvention::Torch;
  bool has_weight = false;
  bool has_residual = false;  // forward: h = x + residual; backward: dh given
  RmsNormLayout layout = RmsNormLayout::Strided;
  int64_t rows = 0, cols = 0;
  CoalescedDims lead;                      // leading dims, strides of the input operands
  int64_t col_stride[kMaxOperands] = {};   // inner stride of each input operand
  int64_t w_stride = 0;
  float eps = 0.0f;                        // in the compute type (float64: eps64)
  double eps64 = 0.0;
  float inv_cols = 0.0f;                   // 1 / N, rounded to the compute type
  double inv_cols64 = 0.0;
  // CUDA work decomposition (rows variant: `vec` elements a vector, `vecs` vectors a
  // thread, `group` threads a row, `rows_per_block` rows a block; strided: group =
  // kRmsNormLoopThreads, one row a block). Block b walks the row groups b, b + grid, ...:
  // the forward's grid is ceil(rows / rows_per_block) (at most 2^31 - 1), the
  // backward's the blocks resident at once (CPU: its fixed row blocks), each writing its
  // dw partial to workspace row b.
  int vec = 1, vecs = 1, group = 1, rows_per_block = 1;
  int64_t grid = 0;
  int sm_count = 0;  // the device's, for the backward's grid
  // Backward: rows of float32 (float64) dw partials in the workspace (0 without a weight).
  int64_t dw_blocks = 0;

  const void* x = nullptr;         // forward: x; backward: x (h of the residual variant)
  const void* residual = nullptr;  // forward
  const void* weight = nullptr;
  const void* dy = nullptr;        // backward
  const void* dh = nullptr;        // backward, optional
  const void* rstd_in = nullptr;   // backward
  void* y = nullptr;               // forward
  void* h = nullptr;               // forward, residual variant
  void* rstd = nullptr;            // forward
  void* dx = nullptr;              // backward
  void* dw = nullptr;              // backward, with a weight
  void* workspace = nullptr;       // backward: dw partials [dw_blocks, cols]
};

// The dtype of y (and dy): x's, except the llama convention with a float32 weight and a
// 16-bit x, whose product is float32 (torch's type promotion).
ElementKind rms_norm_out_dtype(ElementKind x, bool has_weight, ElementKind w,
                               RmsNormConvention c);
// The dtype of rstd: float32 (float64 for float64 x).
inline ElementKind rms_norm_rstd_dtype(ElementKind x) {
  return x == ElementKind::F64 ? ElementKind::F64 : ElementKind::F32;
}

// Problem checks shared by the plans and the meta kernels (Int: int64_t, or a symbolic
// integer in a meta kernel). w_rank < 0: no weight; r_rank < 0: no residual.
template <class Int>
void check_rms_norm_problem(const std::string& op, const char* x_name, ElementKind x_dtype,
                            int rank, const Int* sizes, ElementKind w_dtype, int w_rank,
                            const Int* w_sizes, const char* r_name, ElementKind r_dtype,
                            int r_rank, const Int* r_sizes) {
  if (!is_floating(x_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(x_name) + " must be float32, float16, bfloat16 or float64, got " +
             element_name(x_dtype));
  if (rank == 0)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string(x_name) +
             " must have at least one dimension (the normalized one), got a 0-dim tensor");
  check_rank(op, x_name, rank);
  if (w_rank >= 0) {
    if (w_dtype != x_dtype && w_dtype != ElementKind::F32)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("weight must have ") + x_name + "'s dtype " + element_name(x_dtype) +
               (x_dtype == ElementKind::F32 ? "" : " or float32") + ", got " +
               element_name(w_dtype));
    if (w_rank != 1 || !(w_sizes[0] == sizes[rank - 1]))
      fail(PlanErrorKind::InvalidProblem, op,
           "weight must have shape [N] = [" + size_str(sizes[rank - 1]) + "] (" + x_name +
               ".size(-1)), got " + sizes_str(w_sizes, w_rank));
  }
  if (r_rank >= 0) {
    bool same = r_rank == rank;
    for (int d = 0; same && d < rank; ++d) same = r_sizes[d] == sizes[d];
    if (!same)
      fail(PlanErrorKind::InvalidProblem, op,
           std::string(r_name) + " must have " + x_name + "'s sizes " + sizes_str(sizes, rank) +
               ", got " + sizes_str(r_sizes, r_rank));
    if (r_dtype != x_dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string(r_name) + " must have " + x_name + "'s dtype " + element_name(x_dtype) +
               ", got " + element_name(r_dtype));
  }
}

// The backward's operands besides x, weight and dh (checked as the forward's x, weight
// and residual): dy has x's sizes and the output's dtype; rstd has x's leading sizes and
// rstd's dtype.
template <class Int>
void check_rms_norm_backward(const std::string& op, ElementKind x_dtype, int rank,
                             const Int* sizes, ElementKind out_dtype, ElementKind dy_dtype,
                             int dy_rank, const Int* dy_sizes, ElementKind rstd_dtype,
                             int rstd_rank, const Int* rstd_sizes) {
  bool same = dy_rank == rank;
  for (int d = 0; same && d < rank; ++d) same = dy_sizes[d] == sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must have x's sizes " + sizes_str(sizes, rank) + ", got " +
             sizes_str(dy_sizes, dy_rank));
  if (dy_dtype != out_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have the output's dtype ") + element_name(out_dtype) + ", got " +
             element_name(dy_dtype));
  same = rstd_rank == rank - 1;
  for (int d = 0; same && d < rank - 1; ++d) same = rstd_sizes[d] == sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "rstd must have x's sizes without the last, " + sizes_str(sizes, rank - 1) + ", got " +
             sizes_str(rstd_sizes, rstd_rank));
  if (rstd_dtype != rms_norm_rstd_dtype(x_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("rstd must be ") + element_name(rms_norm_rstd_dtype(x_dtype)) + " for " +
             element_name(x_dtype) + " x, got " + element_name(rstd_dtype));
}

// eps: finite and >= 0; None (no value) is the compute dtype's machine epsilon, as in
// torch.nn.functional.rms_norm. Returns the eps the kernels use.
double resolve_rms_norm_eps(const std::string& op, std::optional<double> eps, ElementKind x);

struct RmsNormDescriptor {
  TensorLayout x;
  bool has_residual = false;
  TensorLayout residual;
  bool has_weight = false;
  TensorLayout weight;
  std::optional<double> eps;
  RmsNormConvention convention = RmsNormConvention::Torch;
  DeviceInfo device;
};

struct RmsNormBackwardDescriptor {
  TensorLayout dy;
  TensorLayout x;  // h for the residual variant
  bool has_weight = false;
  TensorLayout weight;
  TensorLayout rstd;
  bool has_dh = false;
  TensorLayout dh;
  RmsNormConvention convention = RmsNormConvention::Torch;
  DeviceInfo device;
};

struct RmsNormArgs {
  TensorRef x;
  TensorRef residual;  // data null without one
  TensorRef weight;    // data null without one
  MutTensorRef y;
  MutTensorRef h;      // residual variant only
  MutTensorRef rstd;
};

struct RmsNormBackwardArgs {
  TensorRef dy;
  TensorRef x;
  TensorRef weight;  // data null without one
  TensorRef rstd;
  TensorRef dh;      // data null without one
  MutTensorRef dx;
  MutTensorRef dw;   // with a weight only
};

class RmsNormPlan : public PlanOf<RmsNormDescriptor, RmsNormLaunch> {
 public:
  static RmsNormPlan select(const RmsNormDescriptor& desc, PlanPreference pref);
  // What the caller allocates: y (x's sizes, the output dtype), h (x's sizes and dtype;
  // the residual variant), rstd (x's sizes without the last), all contiguous.
  const TensorLayout& y_layout() const { return y_; }
  const TensorLayout& h_layout() const { return h_; }
  const TensorLayout& rstd_layout() const { return rstd_; }
  void can_implement(const RmsNormArgs& args) const;
  void run(void* stream, Workspace workspace, const RmsNormArgs& args) const;

 private:
  TensorLayout y_, h_, rstd_;
};

class RmsNormBackwardPlan : public PlanOf<RmsNormBackwardDescriptor, RmsNormLaunch> {
 public:
  static RmsNormBackwardPlan select(const RmsNormBackwardDescriptor& desc, PlanPreference pref);
  // dx (x's sizes and dtype) and dw (the weight's sizes and dtype), contiguous.
  const TensorLayout& dx_layout() const { return dx_; }
  const TensorLayout& dw_layout() const { return dw_; }
  void can_implement(const RmsNormBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const RmsNormBackwardArgs& args) const;

 private:
  TensorLayout dx_, dw_;
};

}  // namespace baracuda
