// Rotary position embedding (RoPE) and its backward.
//
// x is [B, H, S, D] with any strides; R = rotary_dim (D when -1); p_s = positions[s]
// (positions [S]), positions[b, s] (positions [B, S]), or s (no positions). For i < R/2
//
//   θ(s, i) = p_s · base^(−2i/R)
//   (u, v) = (x[2i], x[2i+1])   interleaved      (u, v) = (x[i], x[i+R/2])   half-split
//   y_u = u·cos θ − v·sin θ,    y_v = u·sin θ + v·cos θ
//
// and features R..D−1 pass through. The rotation is orthogonal, so the backward is the
// same map with −θ (dx from dy, nothing saved but positions); it is linear in dy, and its
// own derivative is the forward again.
//
// Numerics: θ = p·inv_freq and its reduction modulo π/2 are computed in float64 (so
// positions in the millions keep float32 accuracy), then sin/cos of the reduced angle in
// float32 for float32/float16/bfloat16 data (float64 sin/cos of θ itself for float64
// data); the rotation is evaluated in float32 (float64 for float64).
#pragma once

#include <cmath>
#include <string>

#include "core/plan.h"

namespace baracuda {

// How a RoPE kernel accesses a row of D features.
//  Vec16:   unit feature stride, 16-byte vector loads and stores (sizes, strides and
//           addresses allow it).
//  Rows:    unit feature stride, one element at a time.
//  Strided: any feature stride, one element at a time.
enum class RopeAccess : uint8_t { Vec16, Rows, Strided };

// Threads a block of every CUDA RoPE kernel (table, streaming, linear): the plan's
// decomposition below (columns per block, row chunks per block) and the kernels' indexing
// both rest on it.
constexpr int kRopeThreads = 256;

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
//
// CUDA runs two kernels (the CPU kernel walks rows and keeps its own per-position table):
//  1. the *table* kernel writes (cos θ, ±sin θ) for every distinct (g, s, i) into the
//     workspace: table[(g·S + s)·R/2 + i], g < table_groups (B when positions are
//     per-batch [B, S], else 1), as pairs of the math type (float; double for float64
//     data). The backward's table holds −sin.
//  2. the *streaming* kernel rotates x into y. Its index space is columns × rows: a
//     column is one (g, s, row item), a row one (b, h) (H rows when positions are
//     per-batch, B·H otherwise). A thread takes one column, loads the column's table
//     entries once, then walks `rows_per_thread` consecutive rows, so the table is read
//     from L2 once per rows_per_thread row items. A block of kRopeThreads threads covers
//     2^col_shift consecutive columns (coalesced across a warp) × kRopeThreads /
//     2^col_shift row chunks (so that narrow problems, e.g. one position, still fill the block).
//     With `linear` (Vec16 only) the streaming kernel instead walks every (b, h, s, item)
//     in that order, one item per thread, each reading its own table entries.
//
// Row items: `n_rot` rotation items of `pairs_per_item` pairs each (interleaved: the
// 2·pairs_per_item adjacent features; half-split: pairs_per_item features in each half),
// then `n_pass` pass-through items of `vec` features each.
struct RopeLaunch {
  ElementKind element = ElementKind::F32;
  bool backward = false;
  bool interleaved = true;
  RopeAccess access = RopeAccess::Strided;
  int vec = 1;           // features per vector access (16 bytes on Vec16, else 1)
  bool index64 = false;  // offsets of x or y need 64 bits

  int64_t B = 0, H = 0, S = 0, D = 0, R = 0;
  std::array<int64_t, 4> x_strides{};  // elements, [B, H, S, D] order
  std::array<int64_t, 4> y_strides{};

  bool has_positions = false;
  bool per_batch = false;  // positions differ between batches ([B, S], B > 1, stride_b != 0)
  int64_t pos_stride_b = 0, pos_stride_s = 0;
  double base = 10000.0;

  int pairs_per_item = 1;
  int64_t n_rot = 0, n_pass = 0;

  // CUDA decomposition (see above).
  int64_t table_groups = 1;
  size_t table_bytes = 0;  // table_groups · S · R/2 · 2 · sizeof(math type)
  int64_t n_cols = 0;      // table_groups · S · (n_rot + n_pass)
  int col_shift = 0;
  int64_t rows_per_thread = 1;
  bool linear = false;  // Vec16 only: the linear streaming kernel (see above)

  const void* x = nullptr;
  const int64_t* positions = nullptr;
  void* y = nullptr;
  void* table = nullptr;  // 16-byte aligned workspace of table_bytes
};

// Problem checks shared by the plan and the shape-only (meta) kernels, so that a
// compiled graph rejects what eager execution rejects. Int is int64_t, or a symbolic
// integer in a meta kernel. `what` names the rotated operand ("x", or "dy" in the
// backward); pos_rank < 0 means no positions.
template <class Int>
void check_rope_problem(const std::string& op, const char* what, ElementKind dtype, int rank,
                        const Int* sizes, double base, int64_t rotary_dim, int pos_rank,
                        ElementKind pos_dtype, const Int* pos_sizes) {
  const std::string w(what);
  if (!is_floating(dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         w + " must be float32, float16, bfloat16 or float64, got " + element_name(dtype));
  if (rank != 4)
    fail(PlanErrorKind::InvalidProblem, op,
         w + " must be 4-D [B, H, S, D], got a " + std::to_string(rank) + "-d tensor of sizes " +
             sizes_str(sizes, rank));
  const Int& D = sizes[3];
  if (rotary_dim == -1) {
    if (D % 2 != 0)
      fail(PlanErrorKind::InvalidProblem, op,
           w + ".size(-1) must be even when rotary_dim is -1 (all features rotate), got " +
               size_str(D));
  } else if (rotary_dim <= 0 || rotary_dim % 2 != 0 || D < rotary_dim) {
    fail(PlanErrorKind::InvalidProblem, op,
         "rotary_dim must be -1 or even with 0 < rotary_dim <= " + w + ".size(-1) = " +
             size_str(D) + ", got " + std::to_string(rotary_dim));
  }
  if (!std::isfinite(base) || !(base > 0))
    fail(PlanErrorKind::InvalidProblem, op, "base must be finite and > 0, got " + double_str(base));
  if (pos_rank < 0) return;
  if (pos_dtype != ElementKind::I64)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("positions must be int64, got ") + element_name(pos_dtype));
  const bool ok = (pos_rank == 1 && pos_sizes[0] == sizes[2]) ||
                  (pos_rank == 2 && pos_sizes[0] == sizes[0] && pos_sizes[1] == sizes[2]);
  if (!ok)
    fail(PlanErrorKind::InvalidProblem, op,
         "positions must have shape [S] = [" + size_str(sizes[2]) + "] or [B, S] = [" +
             size_str(sizes[0]) + ", " + size_str(sizes[2]) + "], got " +
             sizes_str(pos_sizes, pos_rank));
}

struct RopeDescriptor {
  bool backward = false;  // rope_backward: x is dy, the rotation is by −θ
  TensorLayout x;         // [B, H, S, D]
  bool has_positions = false;
  TensorLayout positions;  // int64 [S] or [B, S]
  double base = 10000.0;
  bool interleaved = true;
  int64_t rotary_dim = -1;
  DeviceInfo device;
};

struct RopeArgs {
  TensorRef x;          // dy in the backward
  TensorRef positions;  // data == nullptr when absent
  MutTensorRef y;       // dx in the backward
};

// One plan for both directions: the backward is the forward's kernel with −θ.
class RopePlan : public OneOutputPlanOf<RopeDescriptor, RopeLaunch> {
 public:
  static RopePlan select(const RopeDescriptor& desc, PlanPreference pref);
  // output_layout() (y): x's sizes, and x's strides when x is non-overlapping and dense
  // (so y of a [B, S, H, D] tensor's transpose(1, 2) is laid out [B, S, H, D] too), else
  // contiguous.
  void can_implement(const RopeArgs& args) const;
  // workspace_size(): CUDA: the cos/sin table (RopeLaunch::table_bytes) plus alignment
  // slack; CPU: 0.
  void run(void* stream, Workspace workspace, const RopeArgs& args) const;
};

}  // namespace baracuda
