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
//                           When dim is not the innermost and src is large ("atomic_slab"),
//                           the work goes slab by slab (below), each dsrc slab zeroed just
//                           before its atomics so that both stay in L2.
//   sorted (deterministic): key = dsrc offset, value = dout offset, stable radix sort by
//                           key, then each run of equal keys is summed in ascending source
//                           order. Same bits on every run.
// The CPU backward reduces each line (all coordinates but dim) on one thread, in index
// order: deterministic.
//
// Column slabs (CUDA, "slab_vec16" / "slab" forward, "atomic_slab..." backward). Along a
// dim that is not the innermost, every element reads (or atomically updates) a random row
// of src: with src far larger than L2, each access fetches a 32-byte sector from DRAM,
// and a sector shared by neighbouring columns is fetched again for each of them. The slab
// variants cut the columns (index's dims after dim, coalesced into one unit-stride dim of
// src) into slabs of W = 2^k columns and walk the index space slab-major: all of slab 0
// (every index row, W columns), then slab 1, ... A slab's src region, src.size(dim) rows
// × W columns, is sized to a fraction of L2, and a persistent grid bounds the work in
// flight, so the region stays in L2 while its slab is processed: DRAM sees about one read
// of each src line (the forward's loads also ask L2 to fetch whole 128-byte lines) instead
// of one per element. The backward zeroes each slab of dsrc (float16/bfloat16: of a float32
// accumulator ring of a few slabs) just before its atomics, so the zeros are never read
// back from DRAM, and converts each accumulator slab to dsrc right after its atomics.
// Work items come in order from an atomic ticket, each slab phase waiting on per-slab
// completion counters of earlier items only, which cannot deadlock.
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
//  SlabVec: column slabs (GatherSlab) with 16-byte index loads and vector value accesses.
//  Slab:    column slabs with scalar index and value accesses (any strides but src's
//           unit column stride).
enum class GatherLayout : uint8_t { RowsVec, Rows, Strided, SlabVec, Slab };
inline bool is_slab(GatherLayout l) { return l == GatherLayout::SlabVec || l == GatherLayout::Slab; }

enum class GatherBackwardAlgo : uint8_t { CpuLines, Atomic, AtomicLines, Sorted };

// Largest shared-memory line accumulator of the atomic_lines variant: under the 48 KiB a
// block may use without an opt-in attribute, with room for the kernel's static shared
// memory.
constexpr int64_t kGatherLinesSmemBytes = 44 * 1024;

// Elements per group on the vector paths (GatherLaunch::vec and lines_vec are 1 or this):
// the plan checks sizes, strides and alignments against it, the kernels load and store
// groups of it.
constexpr int kGatherGroup = 4;
// Alignment of the buffers the kernels carve out of the workspace (slab counters and
// ring, sort keys and values), in bytes.
constexpr size_t kGatherWorkspaceAlign = 256;

// ---- column slabs -------------------------------------------------------------------
// The slab kernels' tile: kGatherSlabThreads threads × kGatherSlabGroups groups of G
// elements (G = 4 on SlabVec, else 1); a tile is 2^k index rows × W columns of one slab.
constexpr int kGatherSlabThreads = 256;
constexpr int kGatherSlabGroups = 4;
// The backward's zero and convert items: kGatherSlabThreads threads × 16 groups of 4
// elements (large, so that the per-item ticket, wait and signal stay cheap).
constexpr int kGatherSlabZcGroups = 16;
constexpr int64_t kGatherSlabMaxWidth = 1024;  // <= the smallest tile (256 · 4 · 1)
// Budgets as shares of the device's L2: one slab region (src.size(dim) rows × W columns of
// src, or of the backward's accumulator) at most L2 / kGatherSlabL2Share; the elements in
// flight about the count whose slabs' regions add up to L2 / kGatherWindowL2Share (E
// elements in flight span E / (rows·W) slabs, i.e. E·src_rows/rows·elt bytes of regions).
// The live set (the window plus a region; the backward: plus `lead` regions zeroed ahead)
// then stays under the L2 of one partition. Tune with benchmarks/tune/tune_gather_slab.cu.
constexpr int kGatherSlabL2Share = 8;
constexpr int kGatherWindowL2Share = 4;
// Persistent grid caps: the forward's static tile order needs every block resident (its
// __launch_bounds__ minimum); the backward takes tiles from a ticket, any grid works.
constexpr int kGatherSlabForwardBlocksPerSm = 2;
constexpr int kGatherSlabBackwardBlocksPerSm = 2;

// log2 of the slab width W: the widest power of two whose region src_rows × W ×
// region_elt fits slab_bytes, but at least 256 bytes per row (coalescing) and at most
// kGatherSlabMaxWidth and `cols` rounded up to a power of two.
inline int gather_slab_width_log2(int64_t src_rows, int64_t cols, int region_elt,
                                  int64_t slab_bytes) {
  int lg = 0;
  while ((int64_t{1} << (lg + 1)) <= kGatherSlabMaxWidth &&
         src_rows * (int64_t{2} << lg) * region_elt <= slab_bytes)
    ++lg;
  int min_lg = 0;
  while ((int64_t{1} << min_lg) * region_elt < 256) ++min_lg;
  int max_lg = 0;
  while ((int64_t{1} << max_lg) < cols && (int64_t{1} << max_lg) < kGatherSlabMaxWidth) ++max_lg;
  return std::min(std::max(lg, min_lg), std::max(max_lg, min_lg));
}

// Persistent grid: enough tiles in flight that their random rows span about window_bytes
// of the slab regions, as a whole number (1 .. per_sm) of blocks per SM so that every SM
// runs its share of the tile order at the same pace.
inline int gather_slab_blocks(int64_t src_rows, int64_t rows, int region_elt,
                              int64_t window_bytes, int64_t tile_elems, int sm_count, int per_sm) {
  const double elems = static_cast<double>(window_bytes) / region_elt *
                       static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(src_rows, 1));
  const int sms = std::max(sm_count, 1);
  const double blocks_per_sm = elems / static_cast<double>(tile_elems) / sms;
  const int k = static_cast<int>(std::clamp(blocks_per_sm + 0.5, 1.0, static_cast<double>(per_sm)));
  return k * sms;
}

// Forward: L2 fetches whole 128-byte lines of src per miss once a line of a region is
// expected to be read about twice or more (rows/src_rows · 128/elt >= 2); else a sector.
inline int gather_slab_prefetch(int64_t rows, int64_t src_rows, int elt) {
  return rows * 128 >= 2 * src_rows * elt ? 128 : 0;
}

// The slab walk (both directions). Index space = outer × rows × cols: outer = index's
// dims before dim (coalesced), rows = index.size(dim), cols = index's dims after dim
// (coalesced into one dim on which src/dsrc has stride 1).
struct GatherSlab {
  int64_t rows = 0;      // R = index.size(dim)
  int64_t src_rows = 0;  // N = src.size(dim)
  int64_t cols = 0;      // C
  std::array<int64_t, 3> row_strides{};  // index, value (out/dout), src/dsrc along dim
  std::array<int64_t, 2> col_strides{};  // index, value along the columns (src/dsrc: 1)
  CoalescedDims outer;   // operands index, value, src/dsrc; sizes [1] when dim is 0
  int64_t outer_count = 1;
  int width_log2 = 0;    // W = 2^width_log2 columns per slab
  int64_t slabs_per_outer = 0;  // ceil(C / W)
  int64_t slabs = 0;            // outer_count · slabs_per_outer
  int blocks = 0;               // persistent grid
  int prefetch = 0;             // forward: bytes L2 fetches per src miss (0: a sector)
  // Backward. Items come in steps; step t holds the zero items of slab t, the atomic
  // items of slab t - zero_lead and the conversion items of slab t - zero_lead - lead.
  bool zero_slabs = false;   // zero each slab (of dsrc, or of the accumulator ring) first
  bool convert = false;      // float16/bfloat16: accumulate in the float32 ring, convert
  bool vec_target = false;   // dsrc slab rows take groups of 4 (16-byte f32 / 8-byte half)
  int lead = 1;              // steps between the phases of one slab
  int ring = 0;              // accumulator slabs (convert only); slab s uses s % ring
  size_t counter_bytes = 0;  // ticket + per-slab counters, zeroed before each launch
  size_t ring_offset = 0;    // byte offset of the ring in the workspace
  size_t ring_slab_bytes = 0;
};

// The backward's schedule (GatherSlab's backward fields, from the walk and geometry) and
// its workspace bytes. vec: elements per group of the atomic tiles (4 or 1).
inline size_t gather_slab_backward_schedule(GatherSlab& s, bool half, bool f64, bool zero_fill,
                                            int vec, int64_t l2_bytes) {
  const int region_elt = f64 ? 8 : 4;
  s.convert = half;
  // float32/float64 accumulate in dsrc itself; when some dsrc elements lie outside every
  // slab (index smaller than src in a dim other than dim), one memset zeroes dsrc first.
  s.zero_slabs = half || !zero_fill;
  const int64_t zc_rows = (int64_t{kGatherSlabThreads} * kGatherSlabZcGroups * 4) >> s.width_log2;
  const int64_t a_rows = (int64_t{kGatherSlabThreads} * kGatherSlabGroups * vec) >> s.width_log2;
  const int64_t zc_items = (s.src_rows + zc_rows - 1) / zc_rows;
  const int64_t nz = s.zero_slabs ? zc_items : 0;
  const int64_t na = (s.rows + a_rows - 1) / a_rows;
  const int64_t nc = s.convert ? zc_items : 0;
  // A slab's phases are `lead` steps apart, so that the blocks in flight rarely wait on
  // an earlier phase, but no more steps than a window's worth of regions.
  const int64_t region = s.src_rows * (int64_t{1} << s.width_log2) * region_elt;
  const int64_t max_lead =
      std::max<int64_t>(2, l2_bytes / kGatherWindowL2Share / std::max<int64_t>(region, 1));
  const int64_t per_step = nz + na + nc;
  s.lead = static_cast<int>(std::clamp<int64_t>((s.blocks + per_step - 1) / per_step, 1, max_lead));
  // Slab t reuses the ring slot of slab t - ring, converted 2 steps before it is zeroed.
  s.ring = s.convert ? 2 * s.lead + 2 : 0;
  const int64_t steps = s.slabs + (s.zero_slabs ? s.lead : 0) + (s.convert ? s.lead : 0);
  s.blocks = static_cast<int>(std::min<int64_t>(s.blocks, steps * per_step));
  auto up = [](size_t b) {
    return (b + kGatherWorkspaceAlign - 1) / kGatherWorkspaceAlign * kGatherWorkspaceAlign;
  };
  s.counter_bytes = 8 + 3 * sizeof(uint32_t) * static_cast<size_t>(s.slabs);
  s.ring_offset = up(s.counter_bytes);
  s.ring_slab_bytes = s.convert ? static_cast<size_t>(region) : 0;
  return s.ring_offset + static_cast<size_t>(s.ring) * s.ring_slab_bytes;
}

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

  GatherSlab slab;  // layout SlabVec / Slab

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
  auto up = [](size_t b) {
    return (b + kGatherWorkspaceAlign - 1) / kGatherWorkspaceAlign * kGatherWorkspaceAlign;
  };
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

class GatherPlan : public OneOutputPlanOf<GatherDescriptor, GatherLaunch> {
 public:
  static GatherPlan select(const GatherDescriptor& desc, PlanPreference pref);
  // output_layout() (out): index's sizes, src's dtype, contiguous.
  void can_implement(const GatherArgs& args) const;
  void run(void* stream, Workspace workspace, const GatherArgs& args) const;
};

class GatherBackwardPlan : public OneOutputPlanOf<GatherBackwardDescriptor, GatherLaunch> {
 public:
  static GatherBackwardPlan select(const GatherBackwardDescriptor& desc, PlanPreference pref);
  // output_layout() (dsrc): src_sizes, dout's dtype, contiguous.
  void can_implement(const GatherBackwardArgs& args) const;
  // workspace_size() (GatherLaunch::workspace_bytes): atomic float16/bfloat16: a float32
  // accumulator of dsrc's size (atomic_slab: a ring of a few float32 slabs, plus the slab
  // counters). Sorted: keys and values double buffers plus CUB's temp storage. Otherwise 0.
  void run(void* stream, Workspace workspace, const GatherBackwardArgs& args) const;
};

}  // namespace baracuda
