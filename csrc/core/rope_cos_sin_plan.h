// RoPE from caller-given cos/sin tables (Hugging Face and flash-attention layouts), for
// queries and keys in one launch, and its backward.
//
// q is [B, Hq, S, D] and k [B, Hk, S, D] (Hk may differ from Hq, and may be 0 for the
// one-tensor op), any strides. The table comes in one of two layouts, told apart by rank:
//
//   full width  cos, sin [Bc, S, R], Bc ∈ {1, B}: one entry per feature, as Hugging Face's
//               rotary embeddings return them (cat(freqs, freqs) for half-split pairs,
//               repeat_interleave(freqs, 2) for interleaved ones);
//   half width  cos, sin [S, R/2]: one entry per pair (flash-attention's layout).
//
// For pair i (features (u, v) = (i, i + R/2) half-split, (2i, 2i+1) interleaved) and the
// table entries of u and v (c_u, s_u, c_v, s_v; c_u = c_v and s_u = s_v for a half-width
// table), the forward is Hugging Face's x·cos + rotate(x)·sin:
//
//   y_u = u·c_u − v·s_u        y_v = v·c_v + u·s_v
//
// and features R..D−1 pass through. Its transpose (the backward, dx from dy) is
//
//   dx_u = dy_u·c_u + dy_v·s_v   dx_v = dy_v·c_v − dy_u·s_u
//
// (the rotation by −θ when the entries are a true cos/sin pair). Math in float32 (float64
// for float64 data); the table may be float32 or the activation dtype.
#pragma once

#include <optional>
#include <string>

#include "core/plan.h"

namespace baracuda {

// How a kernel accesses a row of D features (see RopeAccess in rope_plan.h):
//  Vec16: unit feature stride, 16-byte vector loads and stores (CUDA only);
//  Scalar: any strides, one element at a time (the CPU kernel vectorizes unit-stride
//          half-split rows itself).
enum class RopeCosSinAccess : uint8_t { Vec16, Scalar };

// Threads a block of the CUDA kernel; the plan's grid (columns per block) rests on it.
constexpr int kRopeCosSinThreads = 256;

// Everything a kernel needs; filled by the plan.
//
// CUDA decomposition: a *column* is (b, s, row item), the item fastest; a *row* is one
// head of q (r < Hq) or of k (r − Hq). A thread takes one column, loads its table entries
// once into registers and walks `rows_per_thread` consecutive rows (blockIdx.y picks the
// chunk), so the table costs 1/rows_per_thread of a load per row item. Row items: n_rot
// rotation items of `pairs_per_item` pairs (half-split: `vec` features in each half;
// interleaved: `vec` adjacent features), then n_pass pass-through items of `vec` features.
struct RopeCosSinLaunch {
  ElementKind element = ElementKind::F32;  // q, k, outputs
  ElementKind table_element = ElementKind::F32;
  bool backward = false;
  bool interleaved = false;
  bool full_table = true;  // [Bc, S, R] (true) or [S, R/2]
  RopeCosSinAccess access = RopeCosSinAccess::Scalar;
  int vec = 1;
  int64_t B = 0, Hq = 0, Hk = 0, S = 0, D = 0, R = 0;
  int64_t q_strides[4] = {}, k_strides[4] = {}, yq_strides[4] = {}, yk_strides[4] = {};
  // Table strides: batch (0 when shared by every batch), position, entry.
  int64_t cos_strides[3] = {}, sin_strides[3] = {};

  // CUDA work decomposition.
  int64_t pairs_per_item = 1, n_rot = 0, n_pass = 0, n_cols = 0, rows_per_thread = 1;
  // CUDA, Vec16, a float32 table of 16-bit data: a thread's table entries (one run of
  // pairs_per_item entries a table and half, or 2·pairs_per_item with a full interleaved
  // table) load as 16-byte vectors: the runs are whole vectors, the entry stride 1, the
  // rows and data 16-byte aligned (table_vec16 in rope_cos_sin_plan.cpp). One entry a load
  // otherwise.
  bool table_vec16 = false;
  // CUDA, Vec16 with 16-bit or float32 data, unit table entry strides, and every offset
  // of q, k, their outputs and the tables (and the columns' count) below 2^31, unless the
  // test switch says never (rope_cos_sin_force_walk32): the walk on 32-bit offsets
  // (rope_cos_sin_walk_kernel); rope_cos_sin_kernel otherwise (explain's `_i64` variants).
  bool walk32 = false;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* yq = nullptr;
  void* yk = nullptr;
};

// The problem rules, on concrete or symbolic sizes (`Int` is int64_t or c10::SymInt), for
// the real and the meta kernels. `k_rank` < 0: no k (the one-tensor op).
template <class Int>
void check_rope_cos_sin_problem(const std::string& op, const char* qname, const char* kname,
                                ElementKind qdtype, int q_rank, const Int* q,
                                ElementKind kdtype, int k_rank, const Int* k,
                                ElementKind cos_dtype, int cos_rank, const Int* cos,
                                ElementKind sin_dtype, int sin_rank, const Int* sin) {
  const std::string qn(qname), kn(kname);
  if (!is_floating(qdtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         qn + " must be float32, float16, bfloat16 or float64, got " + element_name(qdtype));
  if (q_rank != 4)
    fail(PlanErrorKind::InvalidProblem, op,
         qn + " must be 4-D [B, H, S, D], got a " + std::to_string(q_rank) +
             "-d tensor of sizes " + sizes_str(q, q_rank));
  if (k_rank >= 0) {
    if (kdtype != qdtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           kn + " must have " + qn + "'s dtype " + element_name(qdtype) + ", got " +
               element_name(kdtype));
    if (k_rank != 4 || k[0] != q[0] || k[2] != q[2] || k[3] != q[3])
      fail(PlanErrorKind::InvalidProblem, op,
           qn + " [B, Hq, S, D] and " + kn + " [B, Hk, S, D] must agree in B, S and D, got " +
               sizes_str(q, q_rank) + " and " + sizes_str(k, k_rank));
  }
  if (cos_dtype != sin_dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("cos and sin must have the same dtype, got ") + element_name(cos_dtype) +
             " and " + element_name(sin_dtype));
  if (cos_dtype != qdtype && cos_dtype != ElementKind::F32)
    fail(PlanErrorKind::UnsupportedDtype, op,
         "cos/sin must be float32 or " + qn + "'s dtype " + element_name(qdtype) + ", got " +
             element_name(cos_dtype));
  bool same = cos_rank == sin_rank;
  for (int d = 0; same && d < cos_rank; ++d) same = cos[d] == sin[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "cos and sin must have the same shape, got " + sizes_str(cos, cos_rank) + " and " +
             sizes_str(sin, sin_rank));
  const Int& B = q[0];
  const Int& S = q[2];
  const Int& D = q[3];
  if (cos_rank == 3) {
    const Int& R = cos[2];
    if (!((cos[0] == 1 || cos[0] == B) && cos[1] == S) || R % 2 != 0 || R < 2 || D < R)
      fail(PlanErrorKind::InvalidProblem, op,
           "cos/sin of rank 3 must be [1 or B, S, R] = [1 or " + size_str(B) + ", " +
               size_str(S) + ", R] with R even and 2 <= R <= D = " + size_str(D) + ", got " +
               sizes_str(cos, cos_rank));
  } else if (cos_rank == 2) {
    const Int& half = cos[1];
    if (!(cos[0] == S) || half < 1 || D < 2 * half)
      fail(PlanErrorKind::InvalidProblem, op,
           "cos/sin of rank 2 must be [S, R/2] = [" + size_str(S) +
               ", R/2] with 1 <= R/2 and R <= D = " + size_str(D) + ", got " +
               sizes_str(cos, cos_rank));
  } else {
    fail(PlanErrorKind::InvalidProblem, op,
         "cos/sin must be [1 or B, S, R] (Hugging Face layout) or [S, R/2] (flash-attention "
         "layout), got a " + std::to_string(cos_rank) + "-d tensor of sizes " +
             sizes_str(cos, cos_rank));
  }
}

// The op a problem belongs to and the name of its first operand, for messages:
// rope_cos_sin (x, dy in the backward) or rope_qk_cos_sin (q, dq).
const char* rope_cos_sin_op_name(bool has_k, bool backward);
const char* rope_cos_sin_q_name(bool has_k, bool backward);

struct RopeCosSinDescriptor {
  bool backward = false;  // inputs are dq, dk; outputs dq_in, dk_in
  TensorLayout q, k;
  bool has_k = true;
  TensorLayout cos, sin;
  bool interleaved = false;
  DeviceInfo device;
};

struct RopeCosSinArgs {
  TensorRef q, k, cos, sin;  // k.data may be null when !has_k or k is empty
  MutTensorRef yq, yk;
};

// Tests and benchmarks only: whether the CUDA plans read the table in 16-byte vectors
// (RopeCosSinLaunch::table_vec16): nullopt for the plan's rule (float32 tables of 16-bit
// data), true wherever the table's runs are whole aligned vectors, false never. Returns
// the previous setting.
std::optional<bool> rope_cos_sin_force_table_vectors(std::optional<bool> force);

// Tests and benchmarks only: whether the CUDA plans take the walk on 32-bit offsets
// (RopeCosSinLaunch::walk32): nullopt the plan's rule (wherever it can), false never (the
// 64-bit kernel, explain's `_i64` variants). Returns the previous setting.
std::optional<bool> rope_cos_sin_force_walk32(std::optional<bool> force);

class RopeCosSinPlan : public PlanOf<RopeCosSinDescriptor, RopeCosSinLaunch> {
 public:
  static RopeCosSinPlan select(const RopeCosSinDescriptor& desc, PlanPreference pref);
  // Outputs keep their input's strides when it is non-overlapping and dense, else are
  // contiguous (as rope's).
  const TensorLayout& q_output_layout() const { return out_q_; }
  const TensorLayout& k_output_layout() const { return out_k_; }
  void can_implement(const RopeCosSinArgs& args) const;
  void run(void* stream, Workspace workspace, const RopeCosSinArgs& args) const;

 private:
  TensorLayout out_q_, out_k_;
};

}  // namespace baracuda
