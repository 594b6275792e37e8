#include "core/gather_plan.h"

#include "kernels/gather.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "gather";
constexpr const char* kOp = "gather";
constexpr const char* kBackwardOp = "gather_backward";
constexpr int kGroup = kGatherGroup;  // elements per group on the vector paths

// torch.gather treats a 0-dim tensor as 1-d of size 1; the kernels always see rank >= 1.
TensorLayout at_least_1d(TensorLayout t) {
  if (t.rank == 0) {
    t.rank = 1;
    t.sizes[0] = 1;
    t.strides[0] = 1;
  }
  return t;
}

// Coalesces the index space and picks the layout variant. `index`, `value` (out or dout)
// and `target` (src or dense dsrc) are at least 1-d, of one rank; `target` may be larger
// than the index space in every dim.
void plan_walk(GatherLaunch& l, const TensorLayout& index, const TensorLayout& value,
               const TensorLayout& target, int dim, const DeviceInfo& device) {
  std::array<int64_t, kMaxRank> target_strides = target.strides;
  target_strides[dim] = 0;
  const std::array<int64_t, kMaxRank>* operands[3] = {&index.strides, &value.strides,
                                                      &target_strides};
  l.dims = coalesce_dims(index.rank, index.sizes, operands, 3);
  l.numel = index.numel();
  l.dim = dim;
  l.dim_size = target.sizes[dim];
  l.dim_stride = target.strides[dim];
  l.device = device.index;

  const int last = l.dims.rank - 1;
  const bool rows = l.dims.strides[0][last] == 1 && l.dims.strides[1][last] == 1;
  bool vec = false;
  if (rows && device.backend == Backend::Cuda) {
    // Groups of 4 start at multiples of 4 elements of index and value: 16-byte index
    // loads need a 16-byte-aligned index; value groups need min(16, 4·elt) bytes.
    vec = l.dims.sizes[last] % kGroup == 0 && index.alignment >= 16 &&
          value.alignment >= std::min(16, kGroup * element_size(value.dtype));
    for (int d = 0; d < last; ++d)
      vec = vec && l.dims.strides[0][d] % kGroup == 0 && l.dims.strides[1][d] % kGroup == 0;
  }
  l.layout = vec ? GatherLayout::RowsVec : rows ? GatherLayout::Rows : GatherLayout::Strided;
  l.vec = vec ? kGroup : 1;

  const int64_t extent = std::max({index.max_offset() + 1, value.max_offset() + 1,
                                   target.max_offset() + 1, l.numel});
  l.index64 = !fits_int32(extent);
}

// Column slabs (see gather_plan.h) for a gather along a dim that is not the innermost,
// when they pay: src (`target`; the dense dsrc for the backward) has unit stride along
// index's coalesced dims after dim, its rows are re-read (about half a read or more per
// 32-byte sector of a slab region), and the regions together outgrow L2. region_elt:
// bytes per element of the L2-resident region (src, or the backward's accumulator).
// Fills l.slab's walk and geometry and sets l.layout and l.vec; false (l unchanged)
// otherwise.
bool plan_slab(GatherLaunch& l, const TensorLayout& index, const TensorLayout& value,
               const TensorLayout& target, int dim, const DeviceInfo& device, int region_elt,
               int blocks_per_sm) {
  if (device.backend != Backend::Cuda || device.l2_bytes <= 0 || device.sm_count <= 0) return false;
  if (l.numel == 0 || l.dim_size == 0) return false;
  const int rank = index.rank;
  const TensorLayout* ops[3] = {&index, &value, &target};

  // Columns: index's dims after dim, one unit-stride dim of src.
  const int n_inner = rank - dim - 1;
  if (n_inner <= 0) return false;
  std::array<int64_t, kMaxRank> sizes{};
  std::array<std::array<int64_t, kMaxRank>, 3> strides{};
  for (int d = 0; d < n_inner; ++d) {
    sizes[d] = index.sizes[dim + 1 + d];
    for (int k = 0; k < 3; ++k) strides[k][d] = ops[k]->strides[dim + 1 + d];
  }
  const std::array<int64_t, kMaxRank>* inner_ops[3] = {&strides[0], &strides[1], &strides[2]};
  const CoalescedDims inner = coalesce_dims(n_inner, sizes, inner_ops, 3);
  const int64_t min_width = 256 / region_elt;  // slab rows of at least 256 bytes
  if (inner.rank != 1 || inner.strides[2][0] != 1 || inner.sizes[0] < min_width) return false;
  const int64_t cols = inner.sizes[0];
  const int64_t rows = index.sizes[dim], src_rows = target.sizes[dim];
  // Expected reads per 32-byte sector of a region: rows/src_rows · 32/region_elt >= 1/2.
  if (rows * 64 < src_rows * region_elt) return false;

  // Outer: index's dims before dim.
  sizes = {};
  strides = {};
  for (int d = 0; d < dim; ++d) {
    sizes[d] = index.sizes[d];
    for (int k = 0; k < 3; ++k) strides[k][d] = ops[k]->strides[d];
  }
  GatherSlab s;
  s.outer = coalesce_dims(dim, sizes, inner_ops, 3);
  s.outer_count = 1;
  for (int d = 0; d < s.outer.rank; ++d) s.outer_count *= s.outer.sizes[d];
  // The regions together must outgrow L2; below that every walk order hits L2.
  if (s.outer_count * src_rows * cols * region_elt < device.l2_bytes / 2) return false;

  s.rows = rows;
  s.src_rows = src_rows;
  s.cols = cols;
  for (int k = 0; k < 3; ++k) s.row_strides[k] = ops[k]->strides[dim];
  for (int k = 0; k < 2; ++k) s.col_strides[k] = inner.strides[k][0];

  // Groups of 4 (16-byte index loads, vector value accesses): unit column strides, and
  // every group start a multiple of 4 elements from 16-byte (value: 4·elt) aligned bases.
  auto mult4 = [](int64_t size, int64_t stride) { return size == 1 || stride % kGroup == 0; };
  bool vec = s.col_strides[0] == 1 && s.col_strides[1] == 1 && cols % kGroup == 0 &&
             index.alignment >= 16 &&
             value.alignment >= std::min(16, kGroup * element_size(value.dtype)) &&
             mult4(rows, s.row_strides[0]) && mult4(rows, s.row_strides[1]);
  for (int d = 0; d < s.outer.rank; ++d)
    vec = vec && mult4(s.outer.sizes[d], s.outer.strides[0][d]) &&
          mult4(s.outer.sizes[d], s.outer.strides[1][d]);
  s.vec_target = cols % kGroup == 0 && target.alignment >= 16 && mult4(src_rows, s.row_strides[2]);
  for (int d = 0; d < s.outer.rank; ++d)
    s.vec_target = s.vec_target && mult4(s.outer.sizes[d], s.outer.strides[2][d]);

  s.width_log2 = gather_slab_width_log2(src_rows, cols, region_elt,
                                        device.l2_bytes / kGatherSlabL2Share);
  const int64_t width = int64_t{1} << s.width_log2;
  s.slabs_per_outer = (cols + width - 1) / width;
  s.slabs = s.outer_count * s.slabs_per_outer;
  const int64_t tile = int64_t{kGatherSlabThreads} * kGatherSlabGroups * (vec ? kGroup : 1);
  s.blocks = gather_slab_blocks(src_rows, rows, region_elt,
                                device.l2_bytes / kGatherWindowL2Share, tile, device.sm_count,
                                blocks_per_sm);
  l.slab = s;
  l.layout = vec ? GatherLayout::SlabVec : GatherLayout::Slab;
  l.vec = vec ? kGroup : 1;
  // Accumulator offsets (idx·W + column) stay below src_rows·W.
  l.index64 = l.index64 || !fits_int32(src_rows * width);
  return true;
}

std::string layout_name(const GatherLaunch& l) {
  switch (l.layout) {
    case GatherLayout::RowsVec: return "rows_vec16";
    case GatherLayout::Rows: return "rows";
    case GatherLayout::Strided: return "strided";
    case GatherLayout::SlabVec: return "slab_vec16";
    case GatherLayout::Slab: return "slab";
  }
  return "?";
}

std::string variant_name(const GatherLaunch& l) {
  std::string v;
  if (!l.backward)
    v = layout_name(l);
  else if (l.algo == GatherBackwardAlgo::CpuLines)
    v = "lines";
  else if (l.algo == GatherBackwardAlgo::Sorted)
    v = "sorted";
  else if (l.algo == GatherBackwardAlgo::AtomicLines)
    v = "atomic_lines";
  else
    v = "atomic_" + layout_name(l);
  return l.index64 ? v + "_i64" : v;
}

KernelSku make_sku(const GatherLaunch& l, const DeviceInfo& device) {
  // The forward is a copy; every backward except the atomic ones sums in a fixed order.
  const bool fixed_order = !l.backward || l.algo == GatherBackwardAlgo::CpuLines ||
                           l.algo == GatherBackwardAlgo::Sorted;
  KernelSku sku = kernel_sku(kFamily, l.backward ? kBackwardOp : kOp, l.element,
                             variant_name(l), device, fixed_order);
  sku.index_element = l.index_element;
  return sku;
}

void launch(const Backend backend, const GatherLaunch& l, void* stream, const std::string& op) {
  run_on_backend(backend, op, kernels::gather_cpu, BARACUDA_CUDA_ENTRY(kernels::gather_cuda), l,
                 stream);
}
}  // namespace

void fail_index_out_of_bounds(const std::string& op, int64_t value, int dim, int64_t size,
                              const std::string& note) {
  fail(PlanErrorKind::IndexOutOfRange, op,
       "index " + std::to_string(value) + " is out of bounds for dim " + std::to_string(dim) +
           " with size " + std::to_string(size) + note);
}

GatherPlan GatherPlan::select(const GatherDescriptor& desc, PlanPreference) {
  check_gather_dtypes(kOp, "src", desc.src.dtype, desc.index.dtype);
  const int dim = check_gather_shapes(kOp, "src", desc.src.rank, desc.src.sizes.data(),
                                      desc.index.rank, desc.index.sizes.data(), desc.dim);
  GatherPlan p;
  p.desc_ = desc;
  p.out_ = dense_output_layout(desc.src.dtype, desc.index.rank, desc.index.sizes.data());

  const TensorLayout index = at_least_1d(desc.index);
  const TensorLayout out = dense_output_layout(desc.src.dtype, index.rank, index.sizes.data());
  GatherLaunch& l = p.launch_;
  l.element = desc.src.dtype;
  l.index_element = desc.index.dtype;
  l.backward = false;
  const TensorLayout src = at_least_1d(desc.src);
  plan_walk(l, index, out, src, dim, desc.device);
  const int elt = element_size(l.element);
  if (plan_slab(l, index, out, src, dim, desc.device, elt, kGatherSlabForwardBlocksPerSm)) {
    GatherSlab& s = l.slab;
    const int64_t tile_rows = (int64_t{kGatherSlabThreads} * kGatherSlabGroups * l.vec) >> s.width_log2;
    const int64_t tiles = s.slabs * ((s.rows + tile_rows - 1) / tile_rows);
    s.blocks = static_cast<int>(std::min<int64_t>(s.blocks, tiles));
    s.prefetch = gather_slab_prefetch(s.rows, s.src_rows, elt);
  }
  p.sku_ = make_sku(l, desc.device);
  return p;
}

void GatherPlan::can_implement(const GatherArgs& args) const {
  check_same_layout(kOp, "src", desc_.src, args.src.layout);
  check_same_layout(kOp, "index", desc_.index, args.index.layout);
  check_output(kOp, "out", out_, args.out);
}

void GatherPlan::run(void* stream, Workspace workspace, const GatherArgs& args) const {
  can_implement(args);
  check_workspace(kOp, workspace_size(), workspace);
  if (launch_.numel == 0) return;
  GatherLaunch l = launch_;
  l.index = args.index.data;
  l.value = args.src.data;
  l.out = args.out.data;
  launch(desc_.device.backend, l, stream, kOp);
}

GatherBackwardPlan GatherBackwardPlan::select(const GatherBackwardDescriptor& desc,
                                              PlanPreference pref) {
  check_gather_dtypes(kBackwardOp, "dout", desc.dout.dtype, desc.index.dtype);
  check_rank(kBackwardOp, "src_sizes", desc.src_rank);
  check_gather_src_sizes(kBackwardOp, desc.src_rank, desc.src_sizes.data());
  const int dim =
      check_gather_shapes(kBackwardOp, "src_sizes", desc.src_rank, desc.src_sizes.data(),
                          desc.index.rank, desc.index.sizes.data(), desc.dim);
  check_gather_dout(kBackwardOp, desc.index.rank, desc.index.sizes.data(), desc.dout.rank,
                    desc.dout.sizes.data());
  GatherBackwardPlan p;
  p.desc_ = desc;
  p.out_ = dense_output_layout(desc.dout.dtype, desc.src_rank, desc.src_sizes.data());

  const TensorLayout index = at_least_1d(desc.index);
  const TensorLayout dout = at_least_1d(desc.dout);
  const TensorLayout dsrc = at_least_1d(p.out_);
  GatherLaunch& l = p.launch_;
  l.element = desc.dout.dtype;
  l.index_element = desc.index.dtype;
  l.backward = true;
  plan_walk(l, index, dout, dsrc, dim, desc.device);
  l.out_numel = dsrc.numel();

  // Lines: the index space with dim dropped. The CPU kernel reduces each on one thread;
  // the CUDA atomic_lines kernel gives each to one block.
  std::array<int64_t, kMaxRank> line_space = index.sizes;
  line_space[dim] = 1;
  const std::array<int64_t, kMaxRank>* operands[3] = {&index.strides, &dout.strides,
                                                      &dsrc.strides};
  l.lines = coalesce_dims(index.rank, line_space, operands, 3);
  l.line_len = index.sizes[dim];
  l.index_line_stride = index.strides[dim];
  l.dout_line_stride = dout.strides[dim];
  l.zero_fill = l.numel == 0;
  for (int d = 0; d < index.rank; ++d)
    if (d != dim && index.sizes[d] < dsrc.sizes[d]) l.zero_fill = true;

  const bool f64 = l.element == ElementKind::F64;
  if (desc.device.backend == Backend::Cpu) {
    l.algo = GatherBackwardAlgo::CpuLines;
  } else if (pref != PlanPreference::Fastest) {  // "deterministic" or "precise"
    l.algo = GatherBackwardAlgo::Sorted;
    // The largest key is the sentinel out_numel, which sorts out-of-range entries last.
    l.sort_end_bit = 0;
    while (l.sort_end_bit < 64 && (l.out_numel >> l.sort_end_bit) != 0) ++l.sort_end_bit;
#ifdef BARACUDA_WITH_CUDA
    if (l.numel > 0 && l.out_numel > 0)
      l.sort_temp_bytes = kernels::gather_sort_temp_bytes(l.numel, l.sort_end_bit, l.index64);
#endif
    l.workspace_bytes =
        l.numel > 0 ? gather_sort_workspace(l.numel, l.index64, l.sort_temp_bytes).total : 0;
  } else if (dsrc.strides[dim] == 1 && l.dim_size > 0 && l.numel > 0 && !l.index64 &&
             l.dim_size * (f64 ? 8 : 4) <= kGatherLinesSmemBytes) {
    // dim is dsrc's innermost dim, so a line is contiguous and written coalesced.
    l.algo = GatherBackwardAlgo::AtomicLines;
    bool vec = l.index_line_stride == 1 && l.dout_line_stride == 1 && l.line_len % kGroup == 0 &&
               index.alignment >= 16 &&
               dout.alignment >= std::min(16, kGroup * element_size(dout.dtype));
    for (int d = 0; d < l.lines.rank; ++d)
      vec = vec && (l.lines.sizes[d] == 1 ||
                    (l.lines.strides[0][d] % kGroup == 0 && l.lines.strides[1][d] % kGroup == 0));
    l.lines_vec = vec ? kGroup : 1;
  } else {
    l.algo = GatherBackwardAlgo::Atomic;
    const bool half = l.element == ElementKind::F16 || l.element == ElementKind::BF16;
    l.workspace_bytes = half ? static_cast<size_t>(l.out_numel) * sizeof(float) : 0;
    if (plan_slab(l, index, dout, dsrc, dim, desc.device, f64 ? 8 : 4,
                  kGatherSlabBackwardBlocksPerSm))
      l.workspace_bytes = gather_slab_backward_schedule(l.slab, half, f64, l.zero_fill, l.vec,
                                                        desc.device.l2_bytes);
  }
  p.sku_ = make_sku(l, desc.device);
  p.workspace_ = l.workspace_bytes;
  return p;
}

void GatherBackwardPlan::can_implement(const GatherBackwardArgs& args) const {
  check_same_layout(kBackwardOp, "dout", desc_.dout, args.dout.layout);
  check_same_layout(kBackwardOp, "index", desc_.index, args.index.layout);
  check_output(kBackwardOp, "dsrc", out_, args.dsrc);
}

void GatherBackwardPlan::run(void* stream, Workspace workspace,
                             const GatherBackwardArgs& args) const {
  can_implement(args);
  check_workspace(kBackwardOp, workspace_size(), workspace);
  if (launch_.numel == 0 && launch_.out_numel == 0) return;
  GatherLaunch l = launch_;
  l.index = args.index.data;
  l.value = args.dout.data;
  l.out = args.dsrc.data;
  l.workspace = workspace;
  launch(desc_.device.backend, l, stream, kBackwardOp);
}

}  // namespace baracuda
