#include "core/rope_cos_sin_plan.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/rope_cos_sin.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "rope_cos_sin";
// CUDA: kRopeCosSinThreads a block; a thread walks up to kRowsPerThread heads of its
// column (fewer when that would leave fewer than kMinBlocksPerSm blocks per SM), as rope's
// plan.
constexpr int64_t kRowsPerThread = 8;
constexpr int64_t kMinBlocksPerSm = 8;

std::string op_name(const RopeCosSinDescriptor& d) {
  return rope_cos_sin_op_name(d.has_k, d.backward);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void validate(const RopeCosSinDescriptor& d, const std::string& op) {
  check_rope_cos_sin_problem<int64_t>(
      op, rope_cos_sin_q_name(d.has_k, d.backward), d.backward ? "dk" : "k", d.q.dtype, d.q.rank,
      d.q.sizes.data(), d.k.dtype, d.has_k ? d.k.rank : -1, d.k.sizes.data(), d.cos.dtype,
      d.cos.rank, d.cos.sizes.data(), d.sin.dtype, d.sin.rank, d.sin.sizes.data());
}

void table_strides(const TensorLayout& t, int64_t B, int64_t out[3]) {
  if (t.rank == 3) {
    out[0] = (t.sizes[0] == 1 || B == 1) ? 0 : t.strides[0];
    out[1] = t.strides[1];
    out[2] = t.strides[2];
  } else {
    out[0] = 0;
    out[1] = t.strides[0];
    out[2] = t.strides[1];
  }
}

// Whether the kernel's table runs load as 16-byte vectors (RopeCosSinLaunch::table_vec16):
// for a float32 table with 16-bit data, where it was measured to gain. H200, ncu,
// flash-attention's layout x [8, 4096, 32, 128] bf16 with float32 [S, 64] tables: one
// entry a load (16 a thread), 58 % of the kernel's L2 sectors were excess (the 8 lanes of
// a position 32 bytes apart each load), L2 at 76 % and DRAM at 62 %; with the vectors
// 181.1 → 173.5 µs (benchmarks/tune/time_rope_cos_sin.py). A bfloat16 [1, S, 128] table
// (Hugging Face's q + k) stays entry by entry: in one run (rope_cos_sin_force_table_vectors,
// `time_rope_cos_sin.py LABEL --table-vectors auto,any,never`) this rule 209.0 µs, vectors
// for that table too 212.3, none at all 209.5 (and 173.7 / 173.7 / 180.2 on the flash layout).
std::atomic<int> g_table_vectors{-1};  // -1: the rule above; 0: never; 1: every whole-vector table
bool table_vec16(const RopeCosSinDescriptor& d, const RopeCosSinLaunch& l) {
  const int forced = g_table_vectors.load(std::memory_order_relaxed);
  if (l.access != RopeCosSinAccess::Vec16 || forced == 0) return false;
  if (forced < 0 && (d.cos.dtype != ElementKind::F32 || element_size(d.q.dtype) != 2)) return false;
  const int64_t esz = element_size(d.cos.dtype), per = 16 / esz;
  const int64_t run = (l.interleaved && l.full_table ? 2 : 1) * l.pairs_per_item;
  if (run % per != 0) return false;
  if (l.full_table && !l.interleaved && (l.R / 2) % per != 0) return false;  // the v run's start
  const auto fits = [&](const TensorLayout& t, const int64_t st[3]) {
    const int64_t rows = t.rank == 3 ? t.sizes[1] : t.sizes[0];
    return t.alignment >= 16 && st[2] == 1 && st[0] % per == 0 && (rows == 1 || st[1] % per == 0);
  };
  return fits(d.cos, l.cos_strides) && fits(d.sin, l.sin_strides);
}

// Whether the Vec16 path takes the walk on 32-bit offsets (RopeCosSinLaunch::walk32):
// wherever it can (H100, bf16, [8, 32, 4096, 128]: 198-199 against 215-216 µs on
// flash-attention's layout, 239 against 263 for q and k together, level with interleaved
// pairs), unless the test switch says never (rope_cos_sin_force_walk32).
std::atomic<int> g_walk32{-1};  // -1: the plan's rule (wherever it can); 0: never
bool walk32(const RopeCosSinDescriptor& d, const RopeCosSinLaunch& l, const TensorLayout& oq,
            const TensorLayout& ok) {
  if (g_walk32.load(std::memory_order_relaxed) == 0) return false;
  const auto fits = [](const TensorLayout& t) { return t.max_offset() < INT32_MAX - 16; };
  return l.access == RopeCosSinAccess::Vec16 && element_size(d.q.dtype) <= 4 && l.cos_strides[2] == 1 &&
         l.sin_strides[2] == 1 && l.n_cols < INT32_MAX && fits(d.q) && fits(oq) && fits(d.cos) &&
         fits(d.sin) && (!d.has_k || d.k.numel() == 0 || (fits(d.k) && fits(ok)));
}

RopeCosSinLaunch plan_launch(const RopeCosSinDescriptor& d, const TensorLayout& oq,
                             const TensorLayout& ok) {
  RopeCosSinLaunch l;
  l.element = d.q.dtype;
  l.table_element = d.cos.dtype;
  l.backward = d.backward;
  l.interleaved = d.interleaved;
  l.full_table = d.cos.rank == 3;
  l.B = d.q.sizes[0];
  l.Hq = d.q.sizes[1];
  l.Hk = d.has_k ? d.k.sizes[1] : 0;
  l.S = d.q.sizes[2];
  l.D = d.q.sizes[3];
  l.R = l.full_table ? d.cos.sizes[2] : 2 * d.cos.sizes[1];
  for (int i = 0; i < 4; ++i) {
    l.q_strides[i] = d.q.strides[i];
    l.yq_strides[i] = oq.strides[i];
    l.k_strides[i] = d.has_k ? d.k.strides[i] : 0;
    l.yk_strides[i] = d.has_k ? ok.strides[i] : 0;
  }
  table_strides(d.cos, l.B, l.cos_strides);
  table_strides(d.sin, l.B, l.sin_strides);

  // Access: 16-byte vectors when every q/k row is unit-stride and 16-byte aligned in
  // every (b, h, s) and the rotation halves / pass-through split into whole vectors.
  l.access = RopeCosSinAccess::Scalar;
  l.vec = 1;
  if (d.device.backend == Backend::Cuda) {
    const int v = 16 / element_size(d.q.dtype);
    const int64_t rot_unit = d.interleaved ? l.R : l.R / 2;
    bool ok_vec = l.D % v == 0 && rot_unit % v == 0 && l.R % v == 0;
    const auto fits = [&](const TensorLayout& t) {
      if (t.strides[3] != 1 || t.alignment < 16) return false;
      for (int i = 0; i < 3; ++i)
        if (t.sizes[i] > 1 && t.strides[i] % v != 0) return false;
      return true;
    };
    ok_vec = ok_vec && fits(d.q) && fits(oq);
    if (d.has_k && d.k.numel() > 0) ok_vec = ok_vec && fits(d.k) && fits(ok);
    if (ok_vec) {
      l.access = RopeCosSinAccess::Vec16;
      l.vec = v;
    }
  }
  l.pairs_per_item = d.interleaved ? std::max(l.vec / 2, 1) : l.vec;
  l.n_rot = (l.R / 2) / l.pairs_per_item;
  l.n_pass = (l.D - l.R) / l.vec;
  l.n_cols = l.B * l.S * (l.n_rot + l.n_pass);
  if (d.device.backend != Backend::Cuda || l.n_cols == 0) return l;
  l.table_vec16 = table_vec16(d, l);
  l.walk32 = walk32(d, l, oq, ok);

  const int64_t rows = l.Hq + l.Hk;
  const int64_t grid_x = ceil_div(l.n_cols, int64_t{kRopeCosSinThreads});
  if (grid_x > INT32_MAX)
    fail(PlanErrorKind::Unsupported, op_name(d),
         "too many (batch, position, feature) columns for one launch, got " +
             std::to_string(l.n_cols));
  int64_t rpt = std::min(kRowsPerThread, std::max<int64_t>(rows, 1));
  const int64_t target = kMinBlocksPerSm * std::max(d.device.sm_count, 1);
  while (rpt > 1 && grid_x * ceil_div(rows, rpt) < target) rpt = (rpt + 1) / 2;
  rpt = std::max(rpt, ceil_div(rows, kCudaMaxGridY));
  l.rows_per_thread = rpt;
  return l;
}

KernelSku make_sku(const RopeCosSinDescriptor& d, const RopeCosSinLaunch& l) {
  // (as rope's: the vector variants on 64-bit offsets carry "_i64")
  std::string variant = l.access == RopeCosSinAccess::Vec16 ? (l.table_vec16 ? "vec16_table16" : "vec16") : "scalar";
  if (l.access == RopeCosSinAccess::Vec16 && !l.walk32) variant += "_i64";
  if (d.device.backend == Backend::Cpu)
    variant = d.q.strides[3] == 1 && d.q.dtype != ElementKind::F64 ? "rows_simd" : "rows";
  // Elementwise, no reduction: deterministic and bit-stable.
  return kernel_sku(kFamily,
                    std::string(d.interleaved ? "interleaved" : "half_split") +
                        (l.full_table ? "_full_table" : "_half_table") +
                        (d.backward ? "_backward" : ""),
                    d.q.dtype, variant, d.device);
}
}  // namespace

RopeCosSinPlan RopeCosSinPlan::select(const RopeCosSinDescriptor& desc, PlanPreference) {
  const std::string op = op_name(desc);
  validate(desc, op);
  RopeCosSinPlan p;
  p.desc_ = desc;
  p.out_q_ = output_layout_like(desc.q);
  if (desc.has_k) p.out_k_ = output_layout_like(desc.k);
  p.launch_ = plan_launch(desc, p.out_q_, p.out_k_);
  p.sku_ = make_sku(desc, p.launch_);
  return p;
}

void RopeCosSinPlan::can_implement(const RopeCosSinArgs& args) const {
  const std::string op = op_name(desc_);
  check_same_layout(op, rope_cos_sin_q_name(desc_.has_k, desc_.backward), desc_.q, args.q.layout);
  if (desc_.has_k) check_same_layout(op, desc_.backward ? "dk" : "k", desc_.k, args.k.layout);
  check_same_layout(op, "cos", desc_.cos, args.cos.layout);
  check_same_layout(op, "sin", desc_.sin, args.sin.layout);
  check_output(op, desc_.backward ? "dq_in" : "q_out", out_q_, args.yq);
  if (desc_.has_k) check_output(op, desc_.backward ? "dk_in" : "k_out", out_k_, args.yk);
}

void RopeCosSinPlan::run(void* stream, Workspace, const RopeCosSinArgs& args) const {
  const std::string op = op_name(desc_);
  can_implement(args);
  if (launch_.n_cols == 0 || launch_.Hq + launch_.Hk == 0) return;
  RopeCosSinLaunch l = launch_;
  l.q = args.q.data;
  l.k = desc_.has_k ? args.k.data : nullptr;
  l.cos = args.cos.data;
  l.sin = args.sin.data;
  l.yq = args.yq.data;
  l.yk = desc_.has_k ? args.yk.data : nullptr;
  run_on_backend(desc_.device.backend, op, kernels::rope_cos_sin_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::rope_cos_sin_cuda), l, stream);
}

std::optional<bool> rope_cos_sin_force_table_vectors(std::optional<bool> force) {
  return exchange_forced(g_table_vectors, force);
}

std::optional<bool> rope_cos_sin_force_walk32(std::optional<bool> force) {
  return exchange_forced(g_walk32, force);
}

const char* rope_cos_sin_op_name(bool has_k, bool backward) {
  if (has_k) return backward ? "rope_qk_cos_sin_backward" : "rope_qk_cos_sin";
  return backward ? "rope_cos_sin_backward" : "rope_cos_sin";
}

const char* rope_cos_sin_q_name(bool has_k, bool backward) {
  if (has_k) return backward ? "dq" : "q";
  return backward ? "dy" : "x";
}

}  // namespace baracuda
