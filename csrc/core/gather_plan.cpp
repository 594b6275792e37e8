#include "core/gather_plan.h"

#include "kernels/gather.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "gather";
constexpr const char* kOp = "gather";
constexpr const char* kBackwardOp = "gather_backward";
constexpr int kGroup = 4;  // elements per group on the RowsVec path

// torch.gather treats a 0-dim tensor as 1-d of size 1; the kernels always see rank >= 1.
TensorLayout at_least_1d(TensorLayout t) {
  if (t.rank == 0) {
    t.rank = 1;
    t.sizes[0] = 1;
    t.strides[0] = 1;
  }
  return t;
}

TensorLayout dense_layout(ElementKind dtype, int rank, const std::array<int64_t, kMaxRank>& sizes) {
  TensorLayout t;
  t.dtype = dtype;
  t.rank = rank;
  t.sizes = sizes;
  t.strides = contiguous_strides(sizes, rank);
  t.alignment = 16;  // the torch layer allocates outputs through the caching allocator
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

std::string layout_name(const GatherLaunch& l) {
  switch (l.layout) {
    case GatherLayout::RowsVec: return "rows_vec16";
    case GatherLayout::Rows: return "rows";
    case GatherLayout::Strided: return "strided";
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
  KernelSku sku;
  sku.family = kFamily;
  sku.op = l.backward ? kBackwardOp : kOp;
  sku.element = l.element;
  sku.index_element = l.index_element;
  sku.variant = variant_name(l);
  sku.backend = device.backend;
  sku.arch = device.arch;
  const bool f64 = l.element == ElementKind::F64;
  // The forward is a copy; every backward except the atomic ones sums in a fixed order.
  const bool fixed_order = !l.backward || l.algo == GatherBackwardAlgo::CpuLines ||
                           l.algo == GatherBackwardAlgo::Sorted;
  sku.precision = {f64 ? MathPrecision::F64 : MathPrecision::F32,
                   f64 ? ElementKind::F64 : ElementKind::F32, fixed_order, fixed_order};
  return sku;
}

void launch(const Backend backend, const GatherLaunch& l, void* stream, const std::string& op) {
  if (backend == Backend::Cpu) {
    kernels::gather_cpu(l);
    return;
  }
#ifdef BARACUDA_WITH_CUDA
  kernels::gather_cuda(l, stream);
#else
  (void)stream;
  fail(PlanErrorKind::Unsupported, op, "this build of baracuda_torch has no CUDA kernels");
#endif
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
  p.out_ = dense_layout(desc.src.dtype, desc.index.rank, desc.index.sizes);

  const TensorLayout index = at_least_1d(desc.index);
  const TensorLayout out = dense_layout(desc.src.dtype, index.rank, index.sizes);
  GatherLaunch& l = p.launch_;
  l.element = desc.src.dtype;
  l.index_element = desc.index.dtype;
  l.backward = false;
  plan_walk(l, index, out, at_least_1d(desc.src), dim, desc.device);
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
  p.out_ = dense_layout(desc.dout.dtype, desc.src_rank, desc.src_sizes);

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
  } else if (pref == PlanPreference::Deterministic) {
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
  }
  p.sku_ = make_sku(l, desc.device);
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
