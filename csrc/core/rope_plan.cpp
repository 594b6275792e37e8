#include "core/rope_plan.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "kernels/rope.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "rope";

// CUDA decomposition (kRopeThreads a block; see RopeLaunch):
//  - a thread walks up to kRowsPerThread rows of its column (kRowsPerThreadPerBatch with
//    per-batch positions, whose table is B times larger), so that its table entries
//    (loaded once, from L2) cost at most 1/rows of a load per row item; measured on an
//    H200 at [8, 32, 4096, 128] (benchmarks/tune/tune_rope.cu), 4 rows beat 8, 16 and 32
//    by 1-4 % (more blocks in flight over a compacter span of memory), except with
//    per-batch positions, where 16 rows beat 4 by 14 %;
//  - fewer rows per thread when that would leave fewer than kMinBlocksPerSm blocks per
//    SM (8 blocks of 256 threads fill an SM once), down to one;
//  - the workspace is aligned to kTableAlign by the plan itself (any allocator will do).
constexpr int64_t kRowsPerThread = 4;
constexpr int64_t kRowsPerThreadPerBatch = 16;
constexpr int64_t kMinBlocksPerSm = 8;
constexpr size_t kTableAlign = 16;

std::string op_name(const RopeDescriptor& desc) { return desc.backward ? "rope_backward" : "rope"; }

void validate(const RopeDescriptor& desc, const std::string& op) {
  const TensorLayout& p = desc.positions;
  check_rope_problem(op, desc.backward ? "dy" : "x", desc.x.dtype, desc.x.rank,
                     desc.x.sizes.data(), desc.base, desc.rotary_dim,
                     desc.has_positions ? p.rank : -1, p.dtype, p.sizes.data());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Picks the access variant and the work decomposition, and fills the launch
// description (without data pointers).
RopeLaunch plan_launch(const RopeDescriptor& desc, const TensorLayout& out) {
  const TensorLayout& x = desc.x;
  RopeLaunch l;
  l.element = x.dtype;
  l.backward = desc.backward;
  l.interleaved = desc.interleaved;
  l.B = x.sizes[0];
  l.H = x.sizes[1];
  l.S = x.sizes[2];
  l.D = x.sizes[3];
  l.R = desc.rotary_dim == -1 ? l.D : desc.rotary_dim;
  for (int d = 0; d < 4; ++d) {
    l.x_strides[d] = x.strides[d];
    l.y_strides[d] = out.strides[d];
  }
  l.base = desc.base;

  l.has_positions = desc.has_positions;
  if (desc.has_positions) {
    const TensorLayout& p = desc.positions;
    l.pos_stride_s = p.strides[p.rank - 1];
    l.pos_stride_b = p.rank == 2 ? p.strides[0] : 0;
    // [B, S] positions that do not differ between batches (B == 1, or expanded from
    // [S]) are [S] positions: a task then covers every batch.
    l.per_batch = p.rank == 2 && l.B > 1 && l.pos_stride_b != 0;
    if (!l.per_batch) l.pos_stride_b = 0;
  }

  // Access variant. D >= 2 always (R >= 2), so the feature stride is meaningful.
  const bool unit = x.strides[3] == 1 && out.strides[3] == 1;
  l.access = unit ? RopeAccess::Rows : RopeAccess::Strided;
  l.vec = 1;
  if (unit && desc.device.backend == Backend::Cuda) {
    const int v = 16 / element_size(x.dtype);
    const int64_t rot_unit = desc.interleaved ? l.R : l.R / 2;  // features per half
    bool ok = l.D % v == 0 && rot_unit % v == 0 && l.R % v == 0 && x.alignment >= 16 &&
              out.alignment >= 16;
    for (int d = 0; d < 3; ++d)
      if (x.sizes[d] > 1) ok = ok && x.strides[d] % v == 0 && out.strides[d] % v == 0;
    if (ok) {
      l.access = RopeAccess::Vec16;
      l.vec = v;
    }
  }

  const int64_t extent = std::max({x.max_offset(), out.max_offset(), x.numel()}) + 1;
  l.index64 = !fits_int32(extent);

  // Row items.
  l.pairs_per_item = desc.interleaved ? std::max(l.vec / 2, 1) : l.vec;
  l.n_rot = (l.R / 2) / l.pairs_per_item;
  l.n_pass = (l.D - l.R) / l.vec;
  if (x.numel() == 0 || desc.device.backend != Backend::Cuda) return l;

  // CUDA: the cos/sin table and the streaming decomposition.
  l.table_groups = l.per_batch ? l.B : 1;
  const int64_t acc_size = x.dtype == ElementKind::F64 ? 8 : 4;
  l.table_bytes = static_cast<size_t>(l.table_groups * l.S * (l.R / 2) * 2 * acc_size);
  l.n_cols = l.table_groups * l.S * (l.n_rot + l.n_pass);
  const int64_t nrows = l.per_batch ? l.H : l.B * l.H;
  l.col_shift = 0;  // columns per block: the smallest power of two >= n_cols, at most 256
  while ((int64_t{1} << l.col_shift) < std::min<int64_t>(l.n_cols, kRopeThreads)) ++l.col_shift;
  const int64_t row_slots = kRopeThreads >> l.col_shift;  // row chunks per block
  const int64_t grid_x = ceil_div(l.n_cols, int64_t{1} << l.col_shift);
  if (grid_x > INT32_MAX)
    fail(PlanErrorKind::Unsupported, desc.backward ? "rope_backward" : "rope",
         "too many (position, feature) columns for one launch, got " + std::to_string(l.n_cols));
  const auto blocks = [&](int64_t rpt) { return grid_x * ceil_div(ceil_div(nrows, rpt), row_slots); };
  int64_t rpt = std::min(l.per_batch ? kRowsPerThreadPerBatch : kRowsPerThread, nrows);
  const int64_t target = kMinBlocksPerSm * std::max(desc.device.sm_count, 1);
  while (rpt > 1 && blocks(rpt) < target) rpt = (rpt + 1) / 2;
  // gridDim.y is at most 65535.
  rpt = std::max(rpt, ceil_div(ceil_div(nrows, kCudaMaxGridY), row_slots));
  l.rows_per_thread = rpt;

  // The linear traversal (items in memory order, a table lookup per item) measured faster
  // than the row walk for interleaved 16-byte items when x and y are laid out as
  // [B, H, S, D] (streaming kernels alone at [8, 32, 4096, 128] on an H200: 0.985 vs 0.969
  // × copy in bfloat16, 1.001 vs 0.980 in float32); the row walk stays for half-split
  // items (0.962 vs 0.894 in bfloat16), for other memory orders (a [B, S, H, D] view walks
  // its rows contiguously) and for per-batch positions.
  const auto s_inside_h = [&](const TensorLayout& t) {
    return l.H == 1 || std::abs(t.strides[2]) <= std::abs(t.strides[1]);
  };
  const int64_t items = l.B * l.H * l.S * (l.n_rot + l.n_pass);
  l.linear = desc.interleaved && l.access == RopeAccess::Vec16 && !l.per_batch &&
             s_inside_h(x) && s_inside_h(out) && ceil_div(items, kRopeThreads) <= INT32_MAX;
  return l;
}

std::string variant_name(const RopeLaunch& l) {
  const char* v = l.access == RopeAccess::Vec16 ? "vec16"
                  : l.access == RopeAccess::Rows ? "rows"
                                                 : "strided";
  return std::string(v) + (l.linear ? "_linear" : "") + (l.index64 ? "_i64" : "");
}

KernelSku make_sku(const RopeDescriptor& desc, const RopeLaunch& l) {
  // Elementwise rotation, no reduction: deterministic and bit-stable.
  KernelSku sku = kernel_sku(
      kFamily,
      std::string(desc.interleaved ? "interleaved" : "half_split") +
          (desc.backward ? "_backward" : ""),
      desc.x.dtype, variant_name(l), desc.device);
  if (desc.has_positions) sku.index_element = ElementKind::I64;
  return sku;
}

}  // namespace

RopePlan RopePlan::select(const RopeDescriptor& desc, PlanPreference) {
  validate(desc, op_name(desc));
  RopePlan p;
  p.desc_ = desc;
  p.out_ = output_layout_like(desc.x);
  p.launch_ = plan_launch(desc, p.out_);
  p.workspace_ = p.launch_.table_bytes ? p.launch_.table_bytes + kTableAlign - 1 : 0;
  p.sku_ = make_sku(desc, p.launch_);
  return p;
}

void RopePlan::can_implement(const RopeArgs& args) const {
  const std::string op = op_name(desc_);
  check_same_layout(op, desc_.backward ? "dy" : "x", desc_.x, args.x.layout);
  if (!desc_.has_positions && args.positions.data != nullptr)
    fail(PlanErrorKind::Internal, op, "positions were not planned for");
  if (desc_.has_positions) {
    check_same_layout(op, "positions", desc_.positions, args.positions.layout);
    // (An empty problem may come with empty positions, which have no data.)
    if (out_.numel() > 0 && args.positions.data == nullptr)
      fail(PlanErrorKind::Internal, op, "positions have no data");
  }
  check_output(op, desc_.backward ? "dx" : "y", out_, args.y);
}

void RopePlan::run(void* stream, Workspace workspace, const RopeArgs& args) const {
  const std::string op = op_name(desc_);
  can_implement(args);
  check_workspace(op, workspace_size(), workspace);
  if (out_.numel() == 0) return;
  RopeLaunch l = launch_;
  l.x = args.x.data;
  l.positions = static_cast<const int64_t*>(args.positions.data);
  l.y = args.y.data;
  if (l.table_bytes) {  // the table's 16-byte aligned start inside the workspace
    const auto addr = reinterpret_cast<uintptr_t>(workspace.data);
    l.table = reinterpret_cast<void*>((addr + kTableAlign - 1) / kTableAlign * kTableAlign);
  }
  run_on_backend(desc_.device.backend, op, kernels::rope_cpu,
                 BARACUDA_CUDA_ENTRY(kernels::rope_cuda), l, stream);
}

}  // namespace baracuda
