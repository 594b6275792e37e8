#include "core/selective_state_update_plan.h"

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <utility>

#include "kernels/selective_state_update.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "selective_state_update";
constexpr const char* kOp = "selective_state_update";
constexpr const char* kTokensOp = "selective_state_update_tokens";

const char* op_name(bool tokens) { return tokens ? kTokensOp : kOp; }

StateUpdateOperand<int64_t> operand(bool present, const TensorLayout& t) {
  return {present, t.dtype, t.rank, t.sizes.data()};
}

// t's strides in its full form of `full_rank` dims: a short operand (its heads/groups dim
// of size 1 left out) gets stride 0 there.
void full_strides(const TensorLayout& t, int full_rank, int heads_at, int64_t* out) {
  for (int d = 0, s = 0; d < full_rank; ++d)
    out[d] = (t.rank == full_rank || d != heads_at) ? t.strides[s++] : 0;
}

// x-shaped strides [b, t, h, p] (b, t, g, n for B and C): the single-token op's operands
// have no t dim (stride 0 there).
void token_strides(const TensorLayout& t, bool tokens, int64_t* out) {
  if (tokens) return full_strides(t, 4, 2, out);
  int64_t s[3];
  full_strides(t, 3, 1, s);
  out[0] = s[0];
  out[1] = 0;
  out[2] = s[1];
  out[3] = s[2];
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// The CUDA layout: 4-element vectors along N where the state allows them.
StateUpdateLayout pick_layout(const TensorLayout& state, const int64_t* s, int64_t dstate) {
  const int esize = element_size(state.dtype);
  if (s[3] != 1 || dstate % kStateUpdateLaneElems != 0 ||
      state.alignment < std::min(16, kStateUpdateLaneElems * esize))
    return StateUpdateLayout::Strided;
  // The pool, head and row strides (where the dim has more than one element).
  const int64_t sizes[3] = {state.sizes[0], state.rank == 4 ? state.sizes[1] : 1,
                            state.sizes[state.rank - 2]};
  for (int d = 0; d < 3; ++d)
    if (sizes[d] > 1 && s[d] % kStateUpdateLaneElems != 0) return StateUpdateLayout::Strided;
  return StateUpdateLayout::Vec;
}

// The largest element offset of an operand: Σ (size − 1)·stride over its dims (strides are
// not negative).
int64_t max_offset(std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  int64_t m = 0;
  for (const auto& [size, stride] : dims) m += size > 0 ? (size - 1) * stride : 0;
  return m;
}

// Whether the lean kernel's 32-bit offsets reach every element it touches (one token, no
// z, no indices: the state row of batch b is b's own).
bool lean_offsets_fit(const StateUpdateLaunch& l) {
  const int64_t B = l.batch, H = l.nheads, P = l.headdim, N = l.dstate, G = l.ngroups;
  const auto bhp = [&](const int64_t* s) { return max_offset({{B, s[0]}, {H, s[2]}, {P, s[3]}}); };
  const auto bgn = [&](const int64_t* s) { return max_offset({{B, s[0]}, {G, s[2]}, {N, s[3]}}); };
  const int64_t m = std::max({max_offset({{B, l.state_s[0]}, {H, l.state_s[1]}, {P, l.state_s[2]}, {N, l.state_s[3]}}),
                              bhp(l.x_s), bhp(l.dt_s), bhp(l.out_s), bgn(l.B_s), bgn(l.C_s),
                              max_offset({{H, l.A_s[0]}, {P, l.A_s[1]}, {N, l.A_s[2]}}),
                              l.has_D ? max_offset({{H, l.D_s[0]}, {P, l.D_s[1]}}) : 0,
                              l.has_dt_bias ? max_offset({{H, l.dt_bias_s[0]}, {P, l.dt_bias_s[1]}}) : 0});
  return m < (int64_t{1} << 30);  // (with room for the in-block offsets added to a row's)
}

// B or C ([b, t, g, n] strides s) as StateUpdateLaunch::bc_vec needs it.
// (The batch and group strides matter only where those dims have more than one element.)
bool bc_vectors(const TensorLayout& t, const int64_t* s, const StateUpdateLaunch& l) {
  const int esize = element_size(t.dtype);
  if (t.dtype != l.x_el || esize > 4 || s[3] != 1 || l.dstate % kStateUpdateLaneElems != 0 ||
      t.alignment < kStateUpdateLaneElems * esize)
    return false;
  return (l.batch <= 1 || s[0] % kStateUpdateLaneElems == 0) && (l.ngroups <= 1 || s[2] % kStateUpdateLaneElems == 0);
}

// The CUDA work split (StateUpdateLaunch's comment). Each state row is N elements split
// over `lanes` threads of kStateUpdateLaneElems elements a chunk: lanes for its 4-element
// pieces (a power of two from 4 to a warp; the kernel is compiled for those), then chunks
// that cover N. (Fewer lanes with more chunks each, measured at B64 H80 P64 N128 on an
// H200: 16 lanes of 2 chunks 345 µs a step, 8 of 4 178 to 250, against 139 for 32 of 1.)
// A block's passes over its head_dim slice are doubled while the grid keeps at least
// kMinBlocksPerSm (4) blocks an SM: fewer, longer blocks spend fewer block launches, B/C
// loads and per-block index work per row, and 4 blocks of 4 warps still keep every SM
// busy. Measured at H80 P64 N128 on an H200 (µs a step from a CUDA graph, bf16 x, float32
// state): batch 1 4.57 at 1 pass (1280 blocks), 3.95 at 2, 4.51 at 4; batch 8 23.7 at 1,
// 15.8 at 2, 10.7 at 8; batch 32 50.6 at 4, 48.4 at 8 (a rule of 64 blocks an SM had
// chosen 1, 1 and 4). The block's rows are staged in shared memory where the layout, A and
// their size allow (stage_bytes).
void plan_cuda_work(StateUpdateLaunch& l, const DeviceInfo& device, const std::string& op) {
  const int64_t quads = std::max<int64_t>(1, (l.dstate + kStateUpdateLaneElems - 1) / kStateUpdateLaneElems);
  l.lanes = static_cast<int>(std::clamp<int64_t>(pow2_ceil(quads), 4, 32));
  const int64_t chunks = pow2_ceil((quads + l.lanes - 1) / l.lanes);
  if (chunks > kStateUpdateMaxChunks)
    fail(PlanErrorKind::Unsupported, op,
         "dstate up to " + std::to_string(kStateUpdateCudaMaxState) + " is wired on CUDA, got " +
             std::to_string(l.dstate));
  l.chunks = static_cast<int>(chunks);
  l.rows_per_pass = kStateUpdateThreads / l.lanes;
  constexpr int64_t kMinBlocksPerSm = 4;
  const int64_t target = kMinBlocksPerSm * std::max(device.sm_count, 1);
  const auto blocks = [&](int64_t passes) {
    const int64_t rows = l.rows_per_pass * passes;
    return l.batch * l.nheads * ((l.headdim + rows - 1) / rows);
  };
  int passes = 1;
  while (passes < kStateUpdateMaxPasses && l.rows_per_pass * passes < l.headdim &&
         blocks(passes * 2) >= target)
    passes *= 2;
  l.passes = passes;
  // (one pair a group: nothing to share, and its lane would read D and x after the sum:
  // B1 at the 2.7B shape 12.4 µs without, 13.2 with; H200)
  l.lane_scalars = passes * l.tokens > 1 && passes * l.tokens <= l.lanes;
  const int64_t rows = static_cast<int64_t>(l.rows_per_pass) * passes;
  // Staged: a block's rows copied into shared memory at its start (StateUpdateLaunch).
  const int64_t stage = rows * l.dstate * element_size(l.state_el);
  l.stage_bytes = l.layout == StateUpdateLayout::Vec && l.A_per_row && stage <= kStateUpdateMaxStage
                      ? static_cast<int>(stage)
                      : 0;
  // (passes <= lanes: lane q of a group holds pass q's row values; past that, rows of later
  // passes took an earlier pass's values by the shuffle's wrap and their out was never written)
  l.lean = l.stage_bytes > 0 && l.chunks == 1 && l.tokens == 1 && passes <= l.lanes && !l.has_z && !l.has_indices &&
           lean_offsets_fit(l);
  const int64_t bc = l.tokens * 2 * l.dstate * (l.x_el == ElementKind::F64 ? 8 : 4);  // as float or double
  l.bc_bytes = l.tokens > 1 && l.stage_bytes + bc <= kStateUpdateMaxStage ? static_cast<int>(bc) : 0;
  l.ptiles = (l.headdim + rows - 1) / rows;
  l.grid = l.batch * l.nheads * l.ptiles;
  if (l.grid > INT32_MAX)
    fail(PlanErrorKind::Unsupported, op,
         "batch · nheads · head_dim tiles must fit in a CUDA grid (2^31 − 1 blocks), got " +
             std::to_string(l.grid));
}

// state_update_force_whole_tiles's setting: -1 for the plan's own choice, 0 never, 1
// wherever the kernel can.
std::atomic<int> g_forced_whole_tiles{-1};

// Whether a lean launch takes the whole-tiles kernel (StateUpdateLaunch::whole_tiles):
// wherever it can, unless a test or benchmark turns it off (state_update_force_whole_tiles).
// Measured on an H100 at the 2.7B decode shape (H80 P64 N128, bf16 x, float32 state, from a
// CUDA graph, the same bits; µs, against the generic lean kernel): B1 3.10-3.30 against
// 3.76-3.95 (mamba_ssm 3.12-3.17), B2 4.05-4.12 against 4.89-4.96, B4 5.99-6.12 against
// 6.79-6.84, B8 9.90-9.92 against 11.09-11.13, B64 116.0 against 117.2.
bool whole_tiles(const StateUpdateLaunch& l) {
  const bool can = l.lean && l.bc_vec && (l.lanes == 16 || l.lanes == 32) &&
                   l.dstate == int64_t{l.lanes} * kStateUpdateLaneElems &&
                   l.headdim % (int64_t{l.rows_per_pass} * l.passes) == 0;
  return can && g_forced_whole_tiles.load(std::memory_order_relaxed) != 0;
}

const char* variant_name(const StateUpdateLaunch& l, Backend backend) {
  if (backend != Backend::Cuda) return "rows";
  if (l.stage_bytes > 0) return "tile_staged";
  return l.layout == StateUpdateLayout::Vec ? "tile_vec4" : "tile_strided";
}
}  // namespace

std::optional<bool> state_update_force_whole_tiles(std::optional<bool> force) {
  return exchange_forced(g_forced_whole_tiles, force);
}

StateUpdatePlan StateUpdatePlan::select(const StateUpdateDescriptor& d, PlanPreference) {
  const std::string op = op_name(d.tokens);
  StateUpdatePlan p;
  p.desc_ = d;
  const StateUpdateOperands<int64_t> ops = {
      operand(true, d.state), operand(true, d.x),     operand(true, d.dt),
      operand(true, d.A),     operand(true, d.B),     operand(true, d.C),
      operand(d.has_D, d.D),  operand(d.has_z, d.z),  operand(d.has_dt_bias, d.dt_bias),
      operand(d.has_indices, d.indices)};
  const StateUpdateSizes<int64_t> s = check_state_update_problem(op, d.tokens, ops);
  const std::vector<int64_t> out_sizes = state_update_out_sizes(d.tokens, s);
  p.out_ = dense_output_layout(d.x.dtype, static_cast<int>(out_sizes.size()), out_sizes.data());

  StateUpdateLaunch& l = p.launch_;
  l.tokens_op = d.tokens;
  l.x_el = d.x.dtype;
  l.state_el = d.state.dtype;
  l.dt_el = d.dt.dtype;
  l.A_el = d.A.dtype;
  l.B_el = d.B.dtype;
  l.C_el = d.C.dtype;
  l.has_D = d.has_D;
  l.has_z = d.has_z;
  l.has_dt_bias = d.has_dt_bias;
  l.has_indices = d.has_indices;
  if (d.has_D) l.D_el = d.D.dtype;
  if (d.has_dt_bias) l.dt_bias_el = d.dt_bias.dtype;
  if (d.has_indices) {
    l.index_el = d.indices.dtype;
    l.index_s = d.indices.strides[0];
  }
  l.dt_softplus = d.dt_softplus;
  l.batch = s.batch;
  l.tokens = s.tokens;
  l.nheads = s.heads;
  l.headdim = s.dim;
  l.dstate = s.dstate;
  l.ngroups = s.groups;
  l.heads_per_group = s.heads / s.groups;
  l.pool = s.pool;
  full_strides(d.state, 4, 1, l.state_s);
  token_strides(d.x, d.tokens, l.x_s);
  token_strides(d.dt, d.tokens, l.dt_s);
  token_strides(d.B, d.tokens, l.B_s);
  token_strides(d.C, d.tokens, l.C_s);
  if (d.has_z) token_strides(d.z, d.tokens, l.z_s);
  // out: [b, (t,) (h,) p] contiguous.
  {
    TensorLayout o = p.out_;
    if (!s.state_has_heads) {  // give it the heads dim (size 1) back
      const int r = o.rank;
      o.sizes[r] = o.sizes[r - 1];
      o.strides[r] = o.strides[r - 1];
      o.sizes[r - 1] = 1;
      o.strides[r - 1] = 0;
      o.rank = r + 1;
    }
    token_strides(o, d.tokens, l.out_s);
  }
  full_strides(d.A, 3, 0, l.A_s);
  if (d.has_D) full_strides(d.D, 2, 0, l.D_s);
  if (d.has_dt_bias) full_strides(d.dt_bias, 2, 0, l.dt_bias_s);
  l.A_per_row = (l.A_s[1] == 0 || l.headdim <= 1) && (l.A_s[2] == 0 || l.dstate <= 1);

  if (d.device.backend == Backend::Cuda) {
    l.layout = pick_layout(d.state, l.state_s, l.dstate);
    plan_cuda_work(l, d.device, op);
    l.bc_vec = l.lean && bc_vectors(d.B, l.B_s, l) && bc_vectors(d.C, l.C_s, l);
    l.whole_tiles = whole_tiles(l);
  }
  // Sums over n in a fixed order (see the header): deterministic and bit-stable.
  p.sku_ = kernel_sku(kFamily, op, d.x.dtype, variant_name(l, d.device.backend), d.device);
  if (d.has_indices) p.sku_.index_element = d.indices.dtype;
  return p;
}

void StateUpdatePlan::can_implement(const StateUpdateArgs& a) const {
  const std::string op = op_name(desc_.tokens);
  const StateUpdateDescriptor& d = desc_;
  check_same_layout(op, "state", d.state, a.state.layout);
  check_same_layout(op, "x", d.x, a.x.layout);
  check_same_layout(op, "dt", d.dt, a.dt.layout);
  check_same_layout(op, "A", d.A, a.A.layout);
  check_same_layout(op, "B", d.B, a.B.layout);
  check_same_layout(op, "C", d.C, a.C.layout);
  if (d.has_D) check_same_layout(op, "D", d.D, a.D.layout);
  if (d.has_z) check_same_layout(op, "z", d.z, a.z.layout);
  if (d.has_dt_bias) check_same_layout(op, "dt_bias", d.dt_bias, a.dt_bias.layout);
  if (d.has_indices) check_same_layout(op, "state_batch_indices", d.indices, a.indices.layout);
  check_output(op, "out", out_, a.out);
}

void StateUpdatePlan::run(void* stream, Workspace workspace, const StateUpdateArgs& a) const {
  const std::string op = op_name(desc_.tokens);
  can_implement(a);
  check_workspace(op, 0, workspace);
  const StateUpdateLaunch& p = launch_;
  if (p.batch == 0 || p.tokens == 0 || p.nheads == 0 || p.headdim == 0) return;
  StateUpdateLaunch l = p;
  l.state = a.state.data;
  l.x = a.x.data;
  l.dt = a.dt.data;
  l.A = a.A.data;
  l.B = a.B.data;
  l.C = a.C.data;
  l.D = a.D.data;
  l.z = a.z.data;
  l.dt_bias = a.dt_bias.data;
  l.indices = a.indices.data;
  l.out = a.out.data;
  run_on_backend(desc_.device.backend, op, kernels::selective_state_update_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::selective_state_update_cuda), l, stream);
}

}  // namespace baracuda
