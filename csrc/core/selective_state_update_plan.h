// Mamba's selective state update: the SSM recurrence of one decoding step (or of T new
// tokens at once), in place on the caller's state; mamba_ssm's selective_state_update.
//
// Shapes (the heads form; any operand may leave out its heads/groups dim when that dim is
// 1, as mamba_ssm allows):
//   state [S, H, P, N]       S: the state pool (= batch without state_batch_indices)
//   x, dt, z [B, H, P]       selective_state_update_tokens: [B, T, H, P]
//   A [H, P, N]              (mamba's A is a per-head value expanded with stride 0)
//   B, C [B, G, N]           tokens: [B, T, G, N]; H % G == 0, head h reads group h / (H / G)
//   D, dt_bias [H, P]
//   state_batch_indices [B]  int32 or int64: the pool row of each batch row
// Per (b, h, p), with s = state[i, h, p, :], i = state_batch_indices[b] (or b), for each
// token t in order:
//   δ    = dt[b,t,h,p] + dt_bias[h,p];  δ ← log(1 + exp(δ)) where δ ≤ 20 (dt_softplus)
//   s[n] ← exp(A[h,p,n]·δ) · s[n] + B[b,t,g,n] · (δ · x[b,t,h,p])
//   y    = Σ_n s[n] · C[b,t,g,n] + D[h,p] · x[b,t,h,p]
//   out[b,t,h,p] = y · z·σ(z) with z = z[b,t,h,p], else y
// and after the last token state[i, h, p, :] = s. The state is read once and written once
// (T tokens: the intermediate states stay in float32 registers; T = 1 calls of the
// single-token op give the same bits on a float32 state). An index i < 0 is a padding row
// (mamba_ssm's rule): out[b] = 0 and the pool is not touched. An index i ≥ S is an error:
// the CPU kernel raises IndexError before it touches anything; a CUDA kernel cannot raise
// without synchronizing, so it writes NaN to out[b] and leaves the pool alone. Two batch
// rows naming one pool row race (undefined, as in mamba_ssm).
//
// Every value is computed in float32 (float64 when x is float64): the sum over n in a fixed
// order (CPU: n ascending; CUDA: each lane's elements in order, then a butterfly over the
// lanes of the row), so the result is deterministic and bit-stable. out is rounded once to
// x's dtype, the state once to its own dtype.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/plan.h"

namespace baracuda {

// CUDA: threads a block; a block holds `rows_per_pass` = kStateUpdateThreads / lanes rows
// of the state at once (`lanes` threads a row, a power of two from 4 to a warp), each thread
// kStateUpdateLaneElems consecutive state elements in each of `chunks` chunks (registers:
// chunks · 4 state values, and as many of B and C while T = 1).
constexpr int kStateUpdateThreads = 128;
constexpr int kStateUpdateLaneElems = 4;
constexpr int kStateUpdateMaxChunks = 8;
// CUDA: d_state (N) at most 32 lanes × 4 elements × 8 chunks.
constexpr int64_t kStateUpdateCudaMaxState = 32 * kStateUpdateLaneElems * kStateUpdateMaxChunks;
// CUDA: passes of a block over its head_dim slice, at most (a block covers
// rows_per_pass · passes rows of one (batch, head)).
constexpr int kStateUpdateMaxPasses = 8;
// CUDA: the most shared memory a block's staged state rows take (the static limit, so no
// opt-in; 16 KiB at the Mamba-2 2.7B shape).
constexpr int64_t kStateUpdateMaxStage = 48 * 1024;
// Blocks a multiprocessor the lean staged kernel is compiled for (StateUpdateLaunch::lean).
constexpr int kStateUpdateLeanBlocks = 10;
// CPU: state rows a task at least.
constexpr int64_t kStateUpdateCpuGrain = 64;

// How a CUDA thread reads its state elements.
//  Vec:     the state's N stride is 1, N and the other strides are multiples of 4 and the
//           data is aligned to 4 elements (16 bytes at most): one vector load and store of
//           4 elements a chunk ("tile_vec4").
//  Strided: anything else: 4 scalar loads ("tile_strided").
// The CPU kernel takes any strides ("rows").
enum class StateUpdateLayout : uint8_t { Vec, Strided };

// Everything a kernel needs; filled by the plan, consumed by the CPU and CUDA launchers.
// Every operand's strides are given for its full form (the dims a short operand leaves
// out have stride 0): x, dt, z and out [b, t, h, p]; B and C [b, t, g, n]; state [i, h,
// p, n]; A [h, p, n]; D and dt_bias [h, p] (t strides are 0 for the single-token op).
struct StateUpdateLaunch {
  bool tokens_op = false;  // selective_state_update_tokens (for error messages)
  ElementKind x_el = ElementKind::F32;      // x, z, out
  ElementKind state_el = ElementKind::F32;
  ElementKind dt_el = ElementKind::F32, A_el = ElementKind::F32, B_el = ElementKind::F32,
              C_el = ElementKind::F32, D_el = ElementKind::F32, dt_bias_el = ElementKind::F32;
  ElementKind index_el = ElementKind::I64;
  bool has_D = false, has_z = false, has_dt_bias = false, has_indices = false;
  bool dt_softplus = false;
  // A's p and n strides are 0 (mamba's per-head A expanded): exp(A·δ) once a row and token.
  bool A_per_row = false;
  int64_t batch = 0, tokens = 0, nheads = 0, headdim = 0, dstate = 0, ngroups = 0;
  int64_t heads_per_group = 1;
  int64_t pool = 0;  // state.size(0)
  int64_t state_s[4] = {}, x_s[4] = {}, dt_s[4] = {}, z_s[4] = {}, out_s[4] = {};
  int64_t B_s[4] = {}, C_s[4] = {};
  int64_t A_s[3] = {}, D_s[2] = {}, dt_bias_s[2] = {};
  int64_t index_s = 0;
  // CUDA work: lanes a row, chunks a lane, rows a block pass, passes, head_dim tiles
  // (ceil(P / (rows_per_pass · passes))) and blocks (B · H · tiles).
  StateUpdateLayout layout = StateUpdateLayout::Strided;
  int lanes = 32, chunks = 1, rows_per_pass = 4, passes = 1;
  int64_t ptiles = 0, grid = 0;
  // 1 < passes · tokens <= lanes: the values of a (row, token) pair that do not depend on
  // n (x, δ, exp(A·δ), D, z, out) are computed by one lane of the row's group each, and
  // shuffled to the others, instead of by every lane of the group.
  bool lane_scalars = false;
  // Staged (> 0): the vector layout with a per-row A, and the block's rows · N state
  // elements fit kStateUpdateMaxStage: the block copies its state rows into this many bytes
  // of shared memory at its start (cp.async, every row's loads in flight at once), then
  // computes from there; otherwise each thread group loads a row a pass from global memory
  // (the next while it computes the current one, for up to 2 chunks a lane).
  int stage_bytes = 0;
  // Lean: a staged launch of 1 chunk a lane with one token, at most `lanes` passes and
  // neither z nor batch indices (Mamba-2's decode step) runs a kernel with those compiled
  // in, and with lane scalars even at one pass (one lane computes the row's values, the
  // others take them by shuffle), and 32-bit offsets where every operand's elements are
  // within 2^30 of its start: fewer registers, kStateUpdateLeanBlocks blocks a
  // multiprocessor instead of 7.
  bool lean = false;
  // Lean, with B and C of x's dtype (2 or 4 bytes), N stride 1, N and the batch and group
  // strides multiples of 4 and the data aligned to 4 elements (as Mamba2.step passes its
  // split of xBC): a lane loads its 4 elements of each as one vector instead of 4 scalar
  // loads with their index arithmetic.
  bool bc_vec = false;
  // Whole tiles: a lean launch with bc_vec whose rows and lanes are all inside the problem
  // (d_state = lanes · 4 with 16 or 32 lanes, head_dim a multiple of the block's
  // rows_per_pass · passes) runs a kernel with the passes and d_state compiled in and no
  // bounds test: every global load of the block (its state rows' cp.async, B, C and the
  // lanes' row values) issues before the first result is needed, one round trip to memory
  // instead of three (the generic lean kernel converts B and C inside their bounds branch,
  // then loads the row values).
  bool whole_tiles = false;
  // B and C staged (> 0, several tokens): every token's B and C, converted to the kernel's
  // arithmetic type, in this many bytes of shared memory after the state rows; the block
  // copies them once instead of each (row pass, token) pair reading them from global
  // memory. 0 where they do not fit kStateUpdateMaxStage with the rows.
  int bc_bytes = 0;

  void* state = nullptr;
  const void* x = nullptr;
  const void* dt = nullptr;
  const void* A = nullptr;
  const void* B = nullptr;
  const void* C = nullptr;
  const void* D = nullptr;
  const void* z = nullptr;
  const void* dt_bias = nullptr;
  const void* indices = nullptr;
  void* out = nullptr;
};

template <class Int>
using StateUpdateOperand = ProblemOperand<Int>;

// The operands in the order of the checks.
template <class Int>
struct StateUpdateOperands {
  StateUpdateOperand<Int> state, x, dt, A, B, C, D, z, dt_bias, indices;
};

// The problem's sizes, from the checked operands.
template <class Int>
struct StateUpdateSizes {
  Int pool, heads, dim, dstate, batch, tokens, groups;
  bool state_has_heads = true;
};

namespace state_update_detail {

// Whether t has the sizes `full`, or `full` without dim `heads_at` where that dim is 1
// (mamba_ssm unsqueezes a short operand there).
template <class Int>
bool has_sizes(const StateUpdateOperand<Int>& t, const std::vector<Int>& full, int heads_at) {
  const int n = static_cast<int>(full.size());
  if (t.rank == n) {
    for (int d = 0; d < n; ++d)
      if (!(t.sizes[d] == full[d])) return false;
    return true;
  }
  if (t.rank != n - 1 || !(full[heads_at] == 1)) return false;
  for (int d = 0, s = 0; d < n; ++d) {
    if (d == heads_at) continue;
    if (!(t.sizes[s++] == full[d])) return false;
  }
  return true;
}

template <class Int>
std::string dims_text(const std::vector<const char*>& names, const std::vector<Int>& full,
                      int heads_at) {
  std::string s = "[";
  for (size_t d = 0; d < names.size(); ++d) s += (d ? ", " : "") + std::string(names[d]);
  s += "] = " + sizes_str(full.data(), static_cast<int>(full.size())) + " (or without " +
       names[heads_at] + " when it is 1)";
  return s;
}

template <class Int>
void check_shape(const std::string& op, const char* what, const StateUpdateOperand<Int>& t,
                 const std::vector<const char*>& names, const std::vector<Int>& full,
                 int heads_at) {
  if (!has_sizes(t, full, heads_at))
    fail(PlanErrorKind::InvalidProblem, op,
         std::string(what) + " must have shape " + dims_text(names, full, heads_at) + ", got " +
             sizes_str(t.sizes, t.rank));
}

template <class Int>
void check_small_dtype(const std::string& op, const char* what, const StateUpdateOperand<Int>& t,
                       ElementKind x) {
  if (t.dtype != x && t.dtype != ElementKind::F32)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(what) + " must be float32 or x's dtype " + element_name(x) + ", got " +
             element_name(t.dtype));
}

}  // namespace state_update_detail

// The problem checks shared by the plans and the meta kernels, in this order: state
// (floating, 4-d or 3-d), x (floating; [B, (T,) H, P]), state's dtype (float32 or x's),
// dt (x's shape; float32 or x's dtype), A ([H, P, N]), B ([B, (T,) G, N], H % G == 0),
// C (B's shape), D ([H, P]), z (x's shape and dtype), dt_bias ([H, P]), the small
// operands' dtypes (float32 or x's), state_batch_indices (int32/int64, [B]; without it
// state.size(0) == B). Returns the sizes.
template <class Int>
StateUpdateSizes<Int> check_state_update_problem(const std::string& op, bool tokens,
                                                 const StateUpdateOperands<Int>& a) {
  using namespace state_update_detail;
  const auto& st = a.state;
  if (!is_floating(st.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("state must be float32, float16, bfloat16 or float64, got ") +
             element_name(st.dtype));
  if (st.rank != 4 && st.rank != 3)
    fail(PlanErrorKind::InvalidProblem, op,
         "state must be 4-d [batch, nheads, dim, dstate] or 3-d [batch, dim, dstate], got " +
             sizes_str(st.sizes, st.rank));
  StateUpdateSizes<Int> s{};
  s.state_has_heads = st.rank == 4;
  s.pool = st.sizes[0];
  s.heads = s.state_has_heads ? st.sizes[1] : Int(1);
  s.dim = st.sizes[st.rank - 2];
  s.dstate = st.sizes[st.rank - 1];
  const auto& x = a.x;
  if (!is_floating(x.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("x must be float32, float16, bfloat16 or float64, got ") +
             element_name(x.dtype));
  const int xr = tokens ? 4 : 3;  // x's full rank
  const int hx = tokens ? 2 : 1;  // its heads dim
  if (x.rank != xr && x.rank != xr - 1)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string("x must be ") + (tokens ? "[batch, tokens, nheads, dim] or [batch, tokens, dim]"
                                             : "[batch, nheads, dim] or [batch, dim]") +
             ", got " + sizes_str(x.sizes, x.rank));
  s.batch = x.sizes[0];
  s.tokens = tokens ? x.sizes[1] : Int(1);
  std::vector<const char*> xn = {"batch", "nheads", "dim"};
  std::vector<Int> xf = {s.batch, s.heads, s.dim};
  std::vector<const char*> bn = {"batch", "ngroups", "dstate"};
  if (tokens) {
    xn = {"batch", "tokens", "nheads", "dim"};
    xf = {s.batch, s.tokens, s.heads, s.dim};
    bn = {"batch", "tokens", "ngroups", "dstate"};
  }
  check_shape(op, "x", x, xn, xf, hx);
  if (st.dtype != x.dtype && st.dtype != ElementKind::F32)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("state must be float32 or x's dtype ") + element_name(x.dtype) + ", got " +
             element_name(st.dtype));
  check_shape(op, "dt", a.dt, xn, xf, hx);
  check_shape(op, "A", a.A, {"nheads", "dim", "dstate"}, std::vector<Int>{s.heads, s.dim, s.dstate}, 0);
  // B's groups: its full form, or 1 without the groups dim.
  if (a.B.rank != xr && a.B.rank != xr - 1)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string("B must be ") + (tokens ? "[batch, tokens, ngroups, dstate] or [batch, tokens, dstate]"
                                             : "[batch, ngroups, dstate] or [batch, dstate]") +
             ", got " + sizes_str(a.B.sizes, a.B.rank));
  s.groups = a.B.rank == xr ? a.B.sizes[hx] : Int(1);
  std::vector<Int> bf = xf;
  bf[hx] = s.groups;
  bf[xr - 1] = s.dstate;
  check_shape(op, "B", a.B, bn, bf, hx);
  if (s.groups == 0 || !(s.heads % s.groups == 0))
    fail(PlanErrorKind::InvalidProblem, op,
         "nheads must be a multiple of ngroups (B.size(" + std::to_string(hx) + ")), got nheads = " +
             size_str(s.heads) + " and ngroups = " + size_str(s.groups));
  check_shape(op, "C", a.C, bn, bf, hx);
  const std::vector<const char*> hp = {"nheads", "dim"};
  const std::vector<Int> hpf = {s.heads, s.dim};
  if (a.D.present) check_shape(op, "D", a.D, hp, hpf, 0);
  if (a.z.present) {
    check_shape(op, "z", a.z, xn, xf, hx);
    if (a.z.dtype != x.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("z must have x's dtype ") + element_name(x.dtype) + ", got " +
               element_name(a.z.dtype));
  }
  if (a.dt_bias.present) check_shape(op, "dt_bias", a.dt_bias, hp, hpf, 0);
  check_small_dtype(op, "dt", a.dt, x.dtype);
  check_small_dtype(op, "A", a.A, x.dtype);
  check_small_dtype(op, "B", a.B, x.dtype);
  check_small_dtype(op, "C", a.C, x.dtype);
  if (a.D.present) check_small_dtype(op, "D", a.D, x.dtype);
  if (a.dt_bias.present) check_small_dtype(op, "dt_bias", a.dt_bias, x.dtype);
  if (a.indices.present) {
    if (a.indices.dtype != ElementKind::I32 && a.indices.dtype != ElementKind::I64)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("state_batch_indices must be int32 or int64, got ") +
               element_name(a.indices.dtype));
    if (a.indices.rank != 1 || !(a.indices.sizes[0] == s.batch))
      fail(PlanErrorKind::InvalidProblem, op,
           "state_batch_indices must have shape [batch] = [" + size_str(s.batch) + "], got " +
               sizes_str(a.indices.sizes, a.indices.rank));
  } else if (!(s.pool == s.batch)) {
    fail(PlanErrorKind::InvalidProblem, op,
         "state.size(0) must be x's batch " + size_str(s.batch) +
             " without state_batch_indices, got " + size_str(s.pool));
  }
  return s;
}

// out's sizes: [B, (T,) H, P], without H when state is 3-d (mamba_ssm squeezes it).
template <class Int>
std::vector<Int> state_update_out_sizes(bool tokens, const StateUpdateSizes<Int>& s) {
  std::vector<Int> out = {s.batch};
  if (tokens) out.push_back(s.tokens);
  if (s.state_has_heads) out.push_back(s.heads);
  out.push_back(s.dim);
  return out;
}

// Tests and benchmarks only: `force` false never runs the whole-tiles kernel
// (StateUpdateLaunch::whole_tiles: the generic lean kernel instead); true or std::nullopt
// runs it wherever it can, the plan's own choice. Returns the previous setting.
std::optional<bool> state_update_force_whole_tiles(std::optional<bool> force);

struct StateUpdateDescriptor {
  bool tokens = false;  // selective_state_update_tokens: x [B, T, H, P]
  TensorLayout state, x, dt, A, B, C;
  bool has_D = false, has_z = false, has_dt_bias = false, has_indices = false;
  TensorLayout D, z, dt_bias, indices;
  bool dt_softplus = false;
  DeviceInfo device;
};

struct StateUpdateArgs {
  MutTensorRef state;
  TensorRef x, dt, A, B, C, D, z, dt_bias, indices;  // data null where absent
  MutTensorRef out;
};

class StateUpdatePlan : public OneOutputPlanOf<StateUpdateDescriptor, StateUpdateLaunch> {
 public:
  static StateUpdatePlan select(const StateUpdateDescriptor& desc, PlanPreference pref);
  // output_layout(): out, contiguous, state_update_out_sizes in x's dtype.
  void can_implement(const StateUpdateArgs& args) const;
  void run(void* stream, Workspace workspace, const StateUpdateArgs& args) const;
};

}  // namespace baracuda
