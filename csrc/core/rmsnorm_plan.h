// RMSNorm over the last dim, with an optional residual add before it, and the gated
// RMSNorm of a Mamba-2 layer's output (gated_rms_norm).
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
//
// Gated RMSNorm (mamba_ssm's RMSNorm of layernorm_gated): the torch convention over row
// groups, the N channels of a row split into N / group_size groups of `cols` = group_size
// channels, each normalized by its own rstd (saved per row group, [..., ngroups]), with an
// optional bias b and gate z (x's shape), all in float32 (float64), y cast once to x's
// dtype:
//   gate after the norm (norm_before_gate):  h = x,            y = (n·w + b) · silu(z)
//   gate before it:                          h = x · silu(z),  y = n·w + b
// Backward, with u = dy·silu(z) (gate after) or dy, and silu'(z) = σ(z)(1 + z(1 − σ(z))):
//   dh = rstd · (u·w − n·c),  c = Σ u·w·n / cols per row group
//   gate after:  dx = dh,              dz = dy · (n·w + b) · silu'(z)
//   gate before: dx = dh · silu(z),    dz = dh · x · silu'(z)
//   dw = Σ_rows u·n,  db = Σ_rows u   (per-block partials, as dw above)
// gated_rms_norm_backward_into is that backward with dz written into the caller's tensor
// (a slice of a larger gradient buffer: x's sizes and dtype, a unit inner stride and one
// row stride, so dz of row r, row group g starts at r·dz_row_stride + g·cols) and, with
// recompute_output, y of the forward written too (from the same n, z and w: what an
// out_proj's weight gradient needs, without a second pass over x and z).
// It is this family's plan with options rather than a family of its own: a row group is
// a row of `cols` elements at column g·cols, so the variants, the work decomposition, the
// walks and the deterministic partial sums are RMSNorm's; z takes the residual's operand
// slot (the gated op has no residual), and on CUDA the gate and bias are compiled only
// into the gated op's kernel instantiations.
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

// Where the gated op applies silu(z): nowhere (no z, and the plain ops), after the norm
// (norm_before_gate) or before it.
enum class RmsNormGate : uint8_t { None, After, Before };

// CUDA: threads a row in the strided variant (one row per block).
constexpr int kRmsNormLoopThreads = 256;
// CUDA, rows variant: vectors a thread holds (registers) and threads a row, at most
// (ptxas for sm_90: 8 vectors spill within the 64 registers of a 1024-thread block), so
// rows of up to 4096 vectors (32768 16-bit, 16384 float32 elements) are held; wider ones
// take the strided variant. The backward holds dy, x and the dw partials: groups of up
// to 512 threads, sized as the forward's (about 128 threads, up to 4 vectors each).
constexpr int kRmsNormMaxVecs = 4;
constexpr int kRmsNormMaxGroup = 1024;
constexpr int kRmsNormMaxBackwardGroup = 512;
// The gated op's forward holds z too: groups of up to 512 threads, so that 4 vectors a
// thread fit in the 128 registers its launch bounds allow (ptxas for sm_90 spills them
// within 64), rows of up to 2048 vectors (16384 16-bit elements) a row group.
constexpr int kRmsNormGatedMaxGroup = 512;
// CUDA, rows variant: threads a forward block at least (rows of small groups share a
// block).
constexpr int kRmsNormBlockThreads = 256;
// CUDA, rows variant, the plain forward (no residual, no gate): blocks an SM in its grid
// (each block loops over row groups). Measured (H200, torch 2.11, [8192, 4096] bf16;
// BENCHMARKS.md, "The RMSNorm forward's loop and grid"): 60.8 -> 49.9 µs with the
// forward's loop of that commit. The residual and gated forwards keep a block per row
// group.
constexpr int kRmsNormForwardBlocksPerSm = 8;
// CUDA, rows variant: threads a backward block (the kernels' launch bounds: up to 128
// registers a thread; ptxas for sm_90a uses 90 for one bfloat16 vector a thread, 105 for
// two, 128 for four, with 44 bytes of spills where W and O are float32 and x 16-bit;
// staged, 89, 88 and 112, reading dy and x from shared memory again for dx). Its
// row groups add their dw partials in shared memory, so the workspace holds one partial
// row per block, and the grid is the blocks that are resident at once
// (kernels::rms_norm_cuda_backward_blocks asks the occupancy calculator).
constexpr int kRmsNormBackwardThreads = 512;
// CUDA, the gated op's rows backward: threads a row group at most, and a block; up to 2
// vectors a thread, two blocks share an SM (the kernels' launch bounds cap them at 96
// registers; ptxas for sm_90: no spills for 16-bit data without a bias, where it takes
// 101 uncapped; with a bias, 2 vectors spill 40 bytes, 56 with a float32 weight), so
// that rows of 5120 16-bit elements (Mamba-2 2.7B's d_inner, 320 threads of 2 vectors)
// overlap one block's loads with the other's reduction.
constexpr int kRmsNormGatedBackwardThreads = 320;
// CPU: blocks of rows whose dw partials the backward sums (fixed, so the result does not
// depend on the thread count).
constexpr int64_t kRmsNormCpuDwBlocks = 64;
// CUDA: threads a block of the dw column-sum kernel.
constexpr int kRmsNormReduceThreads = 256;

// Operands of the leading dims (per-row offsets), forward and backward. The gated op's z
// takes the slot of the residual (forward) and of dh (backward), which it does not have.
enum RmsNormOperand : int { kRmsX = 0, kRmsResidual = 1, kRmsZ = 1 };  // forward
enum RmsNormBackwardOperand : int {
  kRmsDy = 0, kRmsBx = 1, kRmsDh = 2, kRmsBz = 2, kRmsRstd = 3  // backward
};

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// Row r (row-major over x's leading dims) of input operand k starts at element offset
// Σ_d coord_d(r) · lead.strides[k][d] (coords over lead.sizes), its element j at
// + j · col_stride[k]. Row group g of row r (the gated op; g = 0 and ngroups = 1
// otherwise) is that row's elements [g·cols, (g + 1)·cols); its saved rstd is backward
// rstd operand's row offset + g · col_stride[kRmsRstd]. Outputs are contiguous: y, h, dx
// (and the backward's recomputed y) at (r·ngroups + g)·cols, rstd at r·ngroups + g;
// except dz, at r·dz_row_stride + g·cols (ngroups·cols, or the caller's row stride).
struct RmsNormLaunch {
  bool backward = false;
  ElementKind element = ElementKind::F32;         // x, residual, h, dh, dx
  ElementKind weight_element = ElementKind::F32;  // w and dw: x's dtype or float32
  ElementKind out_element = ElementKind::F32;     // y and dy
  RmsNormConvention convention = RmsNormConvention::Torch;
  bool has_weight = false;
  bool has_residual = false;  // forward: h = x + residual; backward: dh given
  // The gated op (torch convention, y in x's dtype): its gate, bias and row groups.
  bool gated = false;
  RmsNormGate gate = RmsNormGate::None;
  bool has_bias = false;
  int64_t ngroups = 1;
  RmsNormLayout layout = RmsNormLayout::Strided;
  int64_t rows = 0, cols = 0;
  CoalescedDims lead;                      // leading dims, strides of the input operands
  int64_t col_stride[kMaxOperands] = {};   // inner stride of each input operand
  int64_t w_stride = 0;
  int64_t b_stride = 0;
  float eps = 0.0f;                        // in the compute type (float64: eps64)
  double eps64 = 0.0;
  float inv_cols = 0.0f;                   // 1 / N, rounded to the compute type
  double inv_cols64 = 0.0;
  // CUDA work decomposition (rows variant: `vec` elements a vector, `vecs` vectors a
  // thread, `group` threads a row, `rows_per_block` rows a block; strided: group =
  // kRmsNormLoopThreads, one row a block). Block (b, y) walks the groups of rows b,
  // b + grid, ... (`rows_per_block` rows each) in the row groups g = y, y + grid_y, ...:
  // the forward's grid is ceil(rows / rows_per_block) (at most 2^31 - 1) by
  // min(ngroups, kCudaMaxGridY), the backward's the blocks resident at once split over
  // the same y (CPU: its fixed row blocks, each over every row group), block b writing
  // its dw (db) partials to workspace row b.
  int vec = 1, vecs = 1, group = 1, rows_per_block = 1;
  int64_t grid = 0, grid_y = 1;
  int sm_count = 0;  // the device's, for the backward's and the plain forward's grid
  // CUDA, the rows backward (the gated op's without a bias too) and the gated op's rows
  // forward with one vector a thread: each row group copies its next row of dy and x (and
  // z; the forward: x and z) into shared memory (cp.async, a ring of two rows) while it
  // computes the current one from there, where the block's rings fit (rms_norm_smem_bytes)
  // on an sm_80+ device; the staged forward runs a resident grid (its blocks loop over the
  // row groups; plan_stage has its numbers).
  // A group otherwise holds one row's loads in flight at a time, and a multiprocessor
  // (one 512-thread block at 128 registers) too few of them to cover the latency: on an
  // H200 at [8192, 4096] bf16 (llama convention) 91.7 µs unstaged, 75.1 staged; the gated
  // backward at the Mamba-2 2.7B layer's [16384, 5120] bf16 (dz into dzxbcdt, y
  // recomputed; two 320-thread blocks an SM) 482.9 -> 391.2 µs with one row group, 562.2
  // -> 494.6 with 8 (H100, the same bits).
  bool stage = false;
  // Backward: rows of float32 (float64) dw partials in the workspace (0 without a weight),
  // each ngroups·cols wide; with a bias, as many rows of db partials after them.
  int64_t dw_blocks = 0;
  int64_t dz_row_stride = 0;       // backward, gated with a gate: elements between dz's rows

  const void* x = nullptr;         // forward: x; backward: x (h of the residual variant)
  const void* residual = nullptr;  // forward
  const void* weight = nullptr;
  const void* z = nullptr;         // gated, with a gate
  const void* bias = nullptr;      // gated, optional
  const void* dy = nullptr;        // backward
  const void* dh = nullptr;        // backward, optional
  const void* rstd_in = nullptr;   // backward
  void* y = nullptr;               // forward; backward with recompute_output (gated)
  void* h = nullptr;               // forward, residual variant
  void* rstd = nullptr;            // forward
  void* dx = nullptr;              // backward
  void* dw = nullptr;              // backward, with a weight
  void* dz = nullptr;              // backward, gated with a gate
  void* db = nullptr;              // backward, gated with a bias
  void* workspace = nullptr;       // backward: dw (then db) partials [dw_blocks, ngroups·cols]

  int64_t width() const { return ngroups * cols; }  // x.size(-1)
};

// The CUDA rows kernels' shared memory in bytes: the backward block's dw (then db) partial
// row in the compute type where it has several row groups (rms_norm_dw_smem_bytes), then
// with `stage` two rows of (the backward's dy,) x (then the gated op's z) for each group
// (rms_norm_stage_row_bytes a row).
int64_t rms_norm_dw_smem_bytes(const RmsNormLaunch& l);
int64_t rms_norm_stage_row_bytes(const RmsNormLaunch& l);
int64_t rms_norm_smem_bytes(const RmsNormLaunch& l);
// Tests only: whether the plans may stage the rows kernels (RmsNormLaunch::stage;
// true by default), so that the unstaged kernel, which devices with less shared memory
// run, is tested on the others too. Returns the previous setting.
bool rms_norm_allow_stage(bool allow);

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

// "[s0, ..., s(rank-1)]", then `last` as one more size when it is not null.
template <class Int>
std::string sizes_str(const Int* sizes, int rank, const Int* last) {
  std::string s = sizes_str(sizes, rank);
  if (!last) return s;
  s.pop_back();
  return s + (rank ? ", " : "") + size_str(*last) + "]";
}

// The gated op's problem: x and weight as rms_norm's; z (z_rank < 0: none) x's sizes
// and dtype; bias (b_rank < 0: none) the weight's shape and dtype; group_size (none: one
// group of all N channels) at least 1 and dividing N. Returns ngroups.
template <class Int>
Int check_gated_rms_norm_problem(const std::string& op, ElementKind x_dtype, int rank,
                                 const Int* sizes, ElementKind w_dtype, int w_rank,
                                 const Int* w_sizes, ElementKind b_dtype, int b_rank,
                                 const Int* b_sizes, ElementKind z_dtype, int z_rank,
                                 const Int* z_sizes, std::optional<int64_t> group_size) {
  check_rms_norm_problem(op, "x", x_dtype, rank, sizes, w_dtype, w_rank, w_sizes, "z", z_dtype,
                         z_rank, z_sizes);
  const Int& n = sizes[rank - 1];
  if (b_rank >= 0) {
    if (b_rank != 1 || !(b_sizes[0] == n))
      fail(PlanErrorKind::InvalidProblem, op,
           "bias must have shape [N] = [" + size_str(n) + "] (x.size(-1)), got " +
               sizes_str(b_sizes, b_rank));
    if (b_dtype != w_dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("bias must have weight's dtype ") + element_name(w_dtype) + ", got " +
               element_name(b_dtype));
  }
  if (!group_size) return Int(1);
  if (*group_size < 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "group_size must be >= 1, got " + size_str(*group_size));
  if (!(n % *group_size == 0))
    fail(PlanErrorKind::InvalidProblem, op,
         "group_size must divide x.size(-1) = " + size_str(n) + ", got " +
             size_str(*group_size));
  return n / *group_size;
}

// The backward's operands besides x, weight and dh (checked as the forward's x, weight
// and residual): dy has x's sizes and the output's dtype; rstd has x's leading sizes
// (then ngroups, for the gated op: `groups` not null) and rstd's dtype.
template <class Int>
void check_rms_norm_backward(const std::string& op, ElementKind x_dtype, int rank,
                             const Int* sizes, ElementKind out_dtype, ElementKind dy_dtype,
                             int dy_rank, const Int* dy_sizes, ElementKind rstd_dtype,
                             int rstd_rank, const Int* rstd_sizes, const Int* groups = nullptr) {
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
  const int lead = rank - 1;
  same = rstd_rank == lead + (groups ? 1 : 0);
  for (int d = 0; same && d < lead; ++d) same = rstd_sizes[d] == sizes[d];
  if (same && groups) same = rstd_sizes[lead] == *groups;
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string("rstd must have x's sizes without the last") +
             (groups ? ", then ngroups, " : ", ") + sizes_str(sizes, lead, groups) + ", got " +
             sizes_str(rstd_sizes, rstd_rank));
  if (rstd_dtype != rms_norm_rstd_dtype(x_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("rstd must be ") + element_name(rms_norm_rstd_dtype(x_dtype)) + " for " +
             element_name(x_dtype) + " x, got " + element_name(rstd_dtype));
}

// rms_norm_backward_ (after check_rms_norm_backward): dx is written over dy, so dy has x's
// dtype and is contiguous (dx's layout).
template <class Int>
void check_rms_norm_dy_overwritable(const std::string& op, ElementKind x_dtype, ElementKind dy_dtype,
                                    bool contiguous, const Int* dy_strides, int rank) {
  if (dy_dtype != x_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have x's dtype (dx is written over it), got ") + element_name(dy_dtype) + " and " +
             element_name(x_dtype));
  if (!contiguous)
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must be contiguous (dx is written over it), got strides " + sizes_str(dy_strides, rank));
}

// gated_rms_norm_backward_into's dz: x's sizes and dtype.
template <class Int>
void check_dz_into_problem(const std::string& op, ElementKind x_dtype, int rank, const Int* sizes,
                           ElementKind dz_dtype, int dz_rank, const Int* dz_sizes) {
  bool same = dz_rank == rank;
  for (int k = 0; same && k < rank; ++k) same = dz_sizes[k] == sizes[k];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dz must have x's sizes " + sizes_str(sizes, rank) + ", got " + sizes_str(dz_sizes, dz_rank));
  if (dz_dtype != x_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dz must have x's dtype ") + element_name(x_dtype) + ", got " + element_name(dz_dtype));
}

// gated_rms_norm_backward_into's rules on the strides of a dz with x's sizes, no two
// elements at one address and at least one element: a unit stride along the last dim (N > 1) and
// one row stride over the leading dims (a [rows, N] view: a slice of a wider gradient
// buffer's last dim). Returns that row stride (N for one row).
template <class Int>
Int check_dz_into_strides(const std::string& op, int rank, const Int* sizes, const Int* strides) {
  const int last = rank - 1;
  if (sizes[last] > 1 && strides[last] != 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "dz must have a unit stride along its last dim, got strides " + sizes_str(strides, rank));
  Int row_stride = sizes[last], rows = 1;  // rows: of the leading dims after k
  bool first = true;
  for (int k = last - 1; k >= 0; --k) {
    if (sizes[k] == 1) continue;
    if (first)
      row_stride = strides[k];
    else if (strides[k] != row_stride * rows)
      fail(PlanErrorKind::InvalidProblem, op,
           "dz's leading dims must have one row stride (a [rows, N] view of a wider buffer), "
           "got strides " + sizes_str(strides, rank));
    first = false;
    rows = rows * sizes[k];
  }
  return row_stride;
}

// eps: finite and >= 0; None (no value) is the compute dtype's machine epsilon, as in
// torch.nn.functional.rms_norm. Returns the eps the kernels use.
double resolve_rms_norm_eps(const std::string& op, std::optional<double> eps, ElementKind x);

// The gated op's options (`on`: gated_rms_norm, with a weight, the torch convention, no
// residual or dh).
struct RmsNormGated {
  bool on = false;
  bool has_z = false;
  TensorLayout z;
  bool has_bias = false;
  TensorLayout bias;
  std::optional<int64_t> group_size;  // none: one group of all N channels
  bool norm_before_gate = true;
};

struct RmsNormDescriptor {
  TensorLayout x;
  bool has_residual = false;
  TensorLayout residual;
  bool has_weight = false;
  TensorLayout weight;
  std::optional<double> eps;
  RmsNormConvention convention = RmsNormConvention::Torch;
  RmsNormGated gated;
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
  RmsNormGated gated;
  // gated_rms_norm_backward_into: dz is the caller's (this layout), and y is recomputed
  // when asked.
  bool has_dz_into = false;
  TensorLayout dz_into;
  bool recompute_output = false;
  // rms_norm_backward_: dx is written over dy (the plain op: dy contiguous, of x's dtype).
  bool dx_over_dy = false;
  DeviceInfo device;
};

struct RmsNormArgs {
  TensorRef x;
  TensorRef residual;  // data null without one
  TensorRef weight;    // data null without one
  TensorRef z;         // gated with a gate only
  TensorRef bias;      // gated with a bias only
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
  TensorRef z;       // gated with a gate only
  TensorRef bias;    // gated with a bias only
  MutTensorRef dx;
  MutTensorRef dw;   // with a weight only
  MutTensorRef dz;   // gated with a gate only
  MutTensorRef db;   // gated with a bias only
  MutTensorRef y;    // gated with recompute_output only
};

class RmsNormPlan : public PlanOf<RmsNormDescriptor, RmsNormLaunch> {
 public:
  static RmsNormPlan select(const RmsNormDescriptor& desc, PlanPreference pref);
  // What the caller allocates: y (x's sizes, the output dtype), h (x's sizes and dtype;
  // the residual variant), rstd (x's sizes without the last; the gated op: then ngroups),
  // all contiguous.
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
  // dx (x's sizes and dtype), dw (the weight's sizes and dtype; [0] without a weight),
  // and for the gated op dz (z's, or [0] without a gate; the into op: the caller's), db
  // (the bias's, or [0] without one) and y (x's with recompute_output, else [0]),
  // contiguous.
  const TensorLayout& dx_layout() const { return dx_; }
  const TensorLayout& dw_layout() const { return dw_; }
  const TensorLayout& dz_layout() const { return dz_; }
  const TensorLayout& db_layout() const { return db_; }
  const TensorLayout& y_layout() const { return y_; }
  void can_implement(const RmsNormBackwardArgs& args) const;
  void run(void* stream, Workspace workspace, const RmsNormBackwardArgs& args) const;

 private:
  TensorLayout dx_, dw_, dz_, db_, y_;
};

}  // namespace baracuda
