// Gather: out[..j..] = src[.., index[..j..], ..] along `dim` (torch.gather), and its
// backward dsrc = zeros(src_sizes) with dout scatter-added at index along dim.
//
// The backward has two CUDA algorithms, chosen by the plan preference:
//   atomic (fastest):       zero dsrc, then atomicAdd every dout element into its slot
//                           (float16/bfloat16 accumulate into a float32 workspace and are
//                           converted once at the end). Summation order varies per run.
//                           When dim is dsrc's innermost dim and a dsrc line fits in
//                           shared memory ("atomic_lines"), each block owns one line
//                           instead: zero it in shared memory, atomicAdd there, write it
//                           once (no zero-fill pass, no workspace, no global atomics).
//   sorted (deterministic): key = dsrc offset, value = dout offset, stable radix sort by
//                           key, then each run of equal keys is summed in ascending source
//                           order. Same bits on every run.
// The CPU backward reduces each line (all coordinates but dim) on one thread, in index
// order: deterministic.
//
// Out-of-range indices never touch memory: the CPU raises IndexError; CUDA kernels write
// 0 (forward) or skip the element (backward) and record the first bad index in a small
// per-device record that the torch layer turns into an IndexError (kernels/gather.h).
#pragma once

#include <algorithm>
#include <string>

#include "core/plan.h"

namespace baracuda {

// How a gather kernel walks the index space. All variants read `index` once per element.
//  RowsVec: innermost coalesced dim has unit stride for index and out/dout; groups of 4
//           elements with 16-byte index loads and vector value accesses.
//  Rows:    the same with scalar accesses (sizes or addresses not multiples of 4).
//  Strided: any strides.
enum class GatherLayout : uint8_t { RowsVec, Rows, Strided };

enum class GatherBackwardAlgo : uint8_t { CpuLines, Atomic, AtomicLines, Sorted };

// Largest shared-memory line accumulator of the atomic_lines variant: under the 48 KiB a
// block may use without an opt-in attribute, with room for the kernel's static shared
// memory.
constexpr int64_t kGatherLinesSmemBytes = 44 * 1024;

// Everything a kernel needs; filled by the plans, consumed by the CPU and CUDA launchers.
struct GatherLaunch {
  ElementKind element = ElementKind::F32;        // src / out / dout / dsrc
  ElementKind index_element = ElementKind::I64;  // int32 or int64
  bool backward = false;
  GatherBackwardAlgo algo = GatherBackwardAlgo::Atomic;
  GatherLayout layout = GatherLayout::Strided;
  int vec = 1;           // elements per group: 4 on RowsVec, else 1
  bool index64 = false;  // offsets (and sort keys) need 64 bits
  int device = -1;       // CUDA device index (error record)

  // The index space is index's shape (0-dim as [1]), coalesced. Operand 0 is index,
  // operand 1 out (forward, dense) or dout (backward), operand 2 src (forward) or the
  // dense dsrc (backward) with its stride at `dim` set to 0: the dim coordinate comes
  // from the index value, offset2 = coalesced_offset2 + idx * dim_stride.
  CoalescedDims dims;
  int64_t numel = 0;       // index.numel()
  int dim = 0;             // normalized gather dim (error messages)
  int64_t dim_size = 0;    // src.size(dim): an index must lie in [0, dim_size)
  int64_t dim_stride = 0;  // src's (or dense dsrc's) stride at dim
  int64_t out_numel = 0;   // dsrc.numel() (backward)

  // Lines backward (CPU, CUDA atomic_lines): the "lines" (index space with dim dropped;
  // operands index, dout, dense dsrc) and the strides along dim.
  CoalescedDims lines;
  int lines_vec = 1;              // atomic_lines: 4 = 16-byte index / dout loads along dim
  int64_t line_len = 0;           // index.size(dim)
  int64_t index_line_stride = 0;  // index.stride(dim)
  int64_t dout_line_stride = 0;   // dout.stride(dim)
  bool zero_fill = false;         // some dsrc lines receive nothing: zero them first

  // CUDA sorted backward: keys < 2^end_bit (the largest key is the out-of-range
  // sentinel out_numel), and CUB's temp-storage bytes for that sort.
  int sort_end_bit = 0;
  size_t sort_temp_bytes = 0;
  size_t workspace_bytes = 0;

  const void* index = nullptr;
  const void* value = nullptr;  // src (forward) or dout (backward)
  void* out = nullptr;          // out (forward) or dsrc (backward)
  Workspace workspace;
};

// Byte offsets of the sorted backward's buffers inside its workspace: double-buffered
// keys and values (n items of 4 or 8 bytes each), then CUB's temp storage.
struct GatherSortWorkspace {
  size_t keys[2] = {0, 0}, values[2] = {0, 0}, temp = 0, total = 0;
};
inline GatherSortWorkspace gather_sort_workspace(int64_t n, bool index64, size_t temp_bytes) {
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t buf = up(static_cast<size_t>(n) * (index64 ? 8 : 4));
  GatherSortWorkspace w;
  w.keys[0] = 0;
  w.keys[1] = buf;
  w.values[0] = 2 * buf;
  w.values[1] = 3 * buf;
  w.temp = 4 * buf;
  w.total = 4 * buf + up(temp_bytes);
  return w;
}

// "baracuda::<op>: index 12 is out of bounds for dim 1 with size 8<note>" as IndexError.
[[noreturn]] void fail_index_out_of_bounds(const std::string& op, int64_t value, int dim,
                                           int64_t size, const std::string& note = "");

// Problem checks shared by the plans and the meta kernels (Int is int64_t or c10::SymInt).
// Dtypes: `value` is src (forward) or dout (backward).
inline void check_gather_dtypes(const std::string& op, const char* value_name,
                                ElementKind value_dtype, ElementKind index_dtype) {
  if (index_dtype != ElementKind::I32 && index_dtype != ElementKind::I64)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("index must be int32 or int64, got ") + element_name(index_dtype));
  if (!is_floating(value_dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(value_name) + " must be float32, float16, bfloat16 or float64, got " +
             element_name(value_dtype));
}

// Shapes, as torch.gather: a 0-dim tensor counts as 1-d of size 1; same number of dims;
// dim in range; index.size(d) <= src.size(d) for every d != dim. Returns the normalized
// dim. `src_name` is "src" (forward) or "src_sizes" (backward).
template <class Int>
int check_gather_shapes(const std::string& op, const char* src_name, int src_rank,
                        const Int* src_sizes, int index_rank, const Int* index_sizes,
                        int64_t dim) {
  check_rank(op, src_name, src_rank);
  check_rank(op, "index", index_rank);
  const int rank = std::max(src_rank, 1);
  if (std::max(index_rank, 1) != rank)
    fail(PlanErrorKind::InvalidProblem, op,
         std::string("index must have as many dims as ") + src_name + " (" +
             std::to_string(src_rank) + "), got " + std::to_string(index_rank));
  const int d = normalize_dim(op, "dim", dim, rank);
  for (int k = 0; k < rank; ++k) {
    if (k == d) continue;
    const Int isz = index_rank > 0 ? index_sizes[k] : Int(1);
    const Int ssz = src_rank > 0 ? src_sizes[k] : Int(1);
    if (isz > ssz)
      fail(PlanErrorKind::InvalidProblem, op,
           "index.size(" + std::to_string(k) + ") must be <= " + src_name + "[" +
               std::to_string(k) + "] for every dim but " + std::to_string(d) + ", got " +
               size_str(isz) + " > " + size_str(ssz));
  }
  return d;
}

// Backward: src_sizes non-negative (checked before the shapes, whose size comparison
// would otherwise report it less clearly).
template <class Int>
void check_gather_src_sizes(const std::string& op, int src_rank, const Int* src_sizes) {
  for (int k = 0; k < src_rank; ++k)
    if (src_sizes[k] < 0)
      fail(PlanErrorKind::InvalidProblem, op,
           "src_sizes must be non-negative, got " + sizes_str(src_sizes, src_rank));
}

// Backward: dout has index's shape (the forward's output shape).
template <class Int>
void check_gather_dout(const std::string& op, int index_rank, const Int* index_sizes,
                       int dout_rank, const Int* dout_sizes) {
  bool same = dout_rank == index_rank;
  for (int k = 0; same && k < index_rank; ++k) same = dout_sizes[k] == index_sizes[k];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dout must have index's shape " + sizes_str(index_sizes, index_rank) + ", got " +
             sizes_str(dout_sizes, dout_rank));
}

struct GatherDescriptor {
  int64_t dim = 0;  // as the caller gave it; negative counts from the end
  TensorLayout src;
  TensorLayout index;
  DeviceInfo device;
};

struct GatherArgs {
  TensorRef src;
  TensorRef index;
  MutTensorRef out;
};

struct GatherBackwardDescriptor {
  int64_t dim = 0;
  TensorLayout dout;
  TensorLayout index;
  int src_rank = 0;  // dsrc's shape: the forward's src sizes
  std::array<int64_t, kMaxRank> src_sizes{};
  DeviceInfo device;
};

struct GatherBackwardArgs {
  TensorRef dout;
  TensorRef index;
  MutTensorRef dsrc;
};

class GatherPlan {
 public:
  static GatherPlan select(const GatherDescriptor& desc, PlanPreference pref);
  // out's layout: index's sizes, src's dtype, contiguous.
  const TensorLayout& output_layout() const { return out_; }
  void can_implement(const GatherArgs& args) const;
  size_t workspace_size() const { return 0; }
  const KernelSku& sku() const { return sku_; }
  const PrecisionGuarantee& precision_guarantee() const { return sku_.precision; }
  void run(void* stream, Workspace workspace, const GatherArgs& args) const;

 private:
  GatherDescriptor desc_;
  TensorLayout out_;
  GatherLaunch launch_;
  KernelSku sku_;
};

class GatherBackwardPlan {
 public:
  static GatherBackwardPlan select(const GatherBackwardDescriptor& desc, PlanPreference pref);
  // dsrc's layout: src_sizes, dout's dtype, contiguous.
  const TensorLayout& output_layout() const { return out_; }
  void can_implement(const GatherBackwardArgs& args) const;
  // Atomic float16/bfloat16: a float32 accumulator of dsrc's size. Sorted: keys and
  // values double buffers plus CUB's temp storage. Otherwise 0.
  size_t workspace_size() const { return launch_.workspace_bytes; }
  const KernelSku& sku() const { return sku_; }
  const PrecisionGuarantee& precision_guarantee() const { return sku_.precision; }
  void run(void* stream, Workspace workspace, const GatherBackwardArgs& args) const;

 private:
  GatherBackwardDescriptor desc_;
  TensorLayout out_;
  GatherLaunch launch_;
  KernelSku sku_;
};

}  // namespace baracuda
