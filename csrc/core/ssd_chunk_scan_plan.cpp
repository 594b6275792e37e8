#include "core/ssd_chunk_scan_plan.h"

#include <algorithm>
#include <atomic>

#include "kernels/ssd_chunk_scan.h"

namespace baracuda {

namespace {
constexpr const char* kFamily = "ssd_chunk_scan";
const std::string kOp = "ssd_chunk_scan";
const std::string kBackwardOp = "ssd_chunk_scan_backward";
// The kernels want a 256-byte aligned workspace; the plan asks for this much more and
// aligns the pointer itself, so any allocator will do.
constexpr size_t kWorkspaceAlign = 256;

SsdOperand<int64_t> operand(const char* name, const TensorLayout& t) {
  return {name, t.dtype, t.rank, t.sizes.data()};
}

void check_compute(const std::string& op, const char* name, const TensorLayout& t,
                   ElementKind ck) {
  if (t.dtype != ck)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(name) + " must be in the compute type " + element_name(ck) +
             " here (the op layer converts it), got " + element_name(t.dtype));
}

// The problem checks, with the options; `bwd` for the backward's extra operands.
SsdSizes<int64_t> validate(const SsdChunkScanDescriptor& desc, const std::string& op,
                           const SsdChunkScanBackwardDescriptor* bwd = nullptr) {
  const SsdOperand<int64_t> x = operand("x", desc.x);
  const SsdSizes<int64_t> s =
      check_ssd_problem(op, x, operand("dt", desc.dt), operand("A", desc.A),
                        operand("B", desc.B), operand("C", desc.C), desc.chunk_size,
                        desc.device.backend == Backend::Cuda, /*strict=*/false);
  const SsdChunkScanOptions& o = desc.options;
  const SsdOperand<int64_t> D = operand("D", o.D), z = operand("z", o.z),
                            bias = operand("dt_bias", o.dt_bias),
                            init = operand("initial_states", o.initial_states),
                            seq = operand("seq_idx", o.seq_idx);
  SsdOptionOperands<int64_t> opts;
  if (o.has_D) opts.D = &D;
  if (o.has_z) opts.z = &z;
  if (o.has_dt_bias) opts.dt_bias = &bias;
  if (o.has_initial_states) opts.initial_states = &init;
  if (o.has_seq_idx) opts.seq_idx = &seq;
  SsdOperand<int64_t> dfinal{}, y_pre{};
  if (bwd) {
    dfinal = operand("dfinal_states", bwd->dfinal_states);
    y_pre = operand("y_pre", bwd->y_pre);
    if (bwd->has_dfinal_states) opts.dfinal_states = &dfinal;
    if (o.has_z) opts.y_pre = &y_pre;
  }
  check_ssd_options(op, x, s, opts, o.dt_min, o.dt_max, bwd != nullptr);
  const ElementKind ck = ssd_compute_type(desc.x.dtype);
  check_compute(op, "A", desc.A, ck);
  if (desc.dt.dtype != desc.x.dtype) check_compute(op, "dt", desc.dt, ck);
  if (o.has_D) check_compute(op, "D", o.D, ck);
  if (o.has_dt_bias) check_compute(op, "dt_bias", o.dt_bias, ck);
  if (o.has_initial_states) check_compute(op, "initial_states", o.initial_states, ck);
  if (bwd && bwd->has_dfinal_states) check_compute(op, "dfinal_states", bwd->dfinal_states, ck);
  if (bwd && bwd->has_states) {
    check_ssd_kept_states(op, x, s, desc.chunk_size, operand("states", bwd->states));
    if (!bwd->states.is_contiguous())
      fail(PlanErrorKind::InvalidProblem, op, "states (the forward's kept chunk states) must be contiguous");
  }
  return s;
}

// Where a variant's kernels run: the CUDA chunked kernels, or one of the two CPU ones.
Backend backend_of(SsdVariant v) {
  return v == SsdVariant::Chunked ? Backend::Cuda : Backend::Cpu;
}

// The CPU runs the chunked algorithm (deterministic, so also under "deterministic")
// unless "precise" asks for the float64 recurrence.
SsdVariant pick_variant(const SsdSizes<int64_t>& s, const DeviceInfo& device,
                        PlanPreference pref) {
  if (s.batch == 0 || s.seqlen == 0 || s.heads == 0 || s.head_dim == 0 || s.state_dim == 0)
    return SsdVariant::Zeros;
  if (device.backend == Backend::Cuda) return SsdVariant::Chunked;
  return pref == PlanPreference::Precise ? SsdVariant::Sequential : SsdVariant::CpuChunked;
}

// The launch description without data pointers.
SsdChunkScanLaunch plan_launch(const SsdChunkScanDescriptor& desc, const SsdSizes<int64_t>& s,
                               const SsdChunkScanBackwardDescriptor* bwd) {
  const TensorLayout* dy = bwd ? &bwd->dy : nullptr;
  SsdChunkScanLaunch l;
  l.element = desc.x.dtype;
  l.compute = ssd_compute_type(desc.x.dtype);
  l.dt_element = desc.dt.dtype;
  l.batch = s.batch;
  l.seqlen = s.seqlen;
  l.heads = s.heads;
  l.head_dim = s.head_dim;
  l.state_dim = s.state_dim;
  l.groups = s.groups;
  // A chunk longer than the sequence is one chunk of length L: the same function, and
  // the kernels never see a chunk_size beyond L (nchunks() cannot overflow).
  l.chunk_size = std::min(desc.chunk_size, std::max<int64_t>(s.seqlen, 1));
  l.sm_count = std::max(desc.device.sm_count, 1);
  if (desc.device.smem_optin_bytes > 0) l.smem_optin_bytes = desc.device.smem_optin_bytes;
  for (int d = 0; d < 4; ++d) {
    l.x_stride[d] = desc.x.strides[d];
    l.B_stride[d] = desc.B.strides[d];
    l.C_stride[d] = desc.C.strides[d];
    if (dy) l.dy_stride[d] = dy->strides[d];
  }
  for (int d = 0; d < 3; ++d) l.dt_stride[d] = desc.dt.strides[d];
  l.A_stride = desc.A.strides[0];
  const SsdChunkScanOptions& o = desc.options;
  if (o.has_D) {
    l.D_per_dim = o.D.rank == 2;
    l.D_stride[0] = o.D.strides[0];
    if (l.D_per_dim) l.D_stride[1] = o.D.strides[1];
  }
  if (o.has_dt_bias) l.dt_bias_stride = o.dt_bias.strides[0];
  l.gated = o.has_z;
  if (o.has_seq_idx) {
    l.seq_idx_int64 = o.seq_idx.dtype == ElementKind::I64;
    for (int d = 0; d < 2; ++d) l.seq_idx_stride[d] = o.seq_idx.strides[d];
  }
  for (int d = 0; d < 4; ++d) {
    if (o.has_z) l.z_stride[d] = o.z.strides[d];
    if (o.has_initial_states) l.init_stride[d] = o.initial_states.strides[d];
    if (bwd && bwd->has_dfinal_states) l.dfinal_stride[d] = bwd->dfinal_states.strides[d];
    if (bwd && o.has_z) l.y_pre_stride[d] = bwd->y_pre.strides[d];
  }
  l.dt_softplus = o.dt_softplus;
  l.dt_min = o.dt_min;
  l.dt_max = o.dt_max;
  l.factored_decays = o.dt_min >= 0.0;
  return l;
}

TensorLayout dense_of(ElementKind dtype, std::initializer_list<int64_t> sizes) {
  return dense_output_layout(dtype, static_cast<int>(sizes.size()), sizes.begin());
}

// NotImplementedError instead of a wrapped-around size when B·H·⌈L/Q⌉·D·N·8 bytes of
// chunk states (the backward workspace, on either backend) cannot be addressed.
void check_workspace_addressable(const SsdChunkScanLaunch& l, const std::string& op) {
  const double bytes = 8.0 * static_cast<double>(l.batch) * static_cast<double>(l.heads) *
                       static_cast<double>(l.nchunks()) * static_cast<double>(l.head_dim) *
                       static_cast<double>(l.state_dim);
  if (bytes > 4.0e18)
    fail(PlanErrorKind::Unsupported, op,
         "problem too large: its chunk states would take more than 2^61 bytes");
}

size_t kernel_workspace(SsdVariant v, const SsdChunkScanLaunch& l, bool backward,
                        const std::string& op) {
  if (v == SsdVariant::Zeros) return 0;
  check_workspace_addressable(l, op);
  const Backend b = backend_of(v);
  const bool chunked = v == SsdVariant::CpuChunked;
  if (!backward && l.cuda_forward != SsdCudaForward::Staged)
    return query_backend(b, op, kernels::ssd_chunk_scan_cpu_forward_workspace,
                         BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_fused_forward_workspace), l);
  if (backward)
    return query_backend(b, op,
                         chunked ? kernels::ssd_chunk_scan_cpu_chunked_backward_workspace
                                 : kernels::ssd_chunk_scan_cpu_backward_workspace,
                         BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_backward_workspace), l);
  return query_backend(b, op,
                       chunked ? kernels::ssd_chunk_scan_cpu_chunked_forward_workspace
                               : kernels::ssd_chunk_scan_cpu_forward_workspace,
                       BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_forward_workspace), l);
}

size_t with_alignment_slack(size_t bytes) { return bytes ? bytes + kWorkspaceAlign - 1 : 0; }

// Points the launch at the aligned start of the workspace.
void attach_workspace(SsdChunkScanLaunch& l, const Workspace& ws, size_t kernel_bytes) {
  if (kernel_bytes == 0) return;
  const auto addr = reinterpret_cast<uintptr_t>(ws.data);
  const uintptr_t aligned = (addr + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  l.workspace = reinterpret_cast<void*>(aligned);
  l.workspace_bytes = kernel_bytes;
}

// The wgmma kernels (sm_90a) can run: an sm_90 device and a build holding sm_90a code.
bool wgmma_device(const SsdChunkScanDescriptor& desc) {
  return desc.device.arch == 90 && desc.device.arch_specific_kernels;
}

// The CUDA kernels run float16/bfloat16 on tensor cores where the device has mma.sync
// with 16-bit operands (sm_80+) and gives the staged tensor-core scan its shared memory
// for this problem's N and D (ssd_tc_scan_smem_bytes: every stage on tensor cores, or none).
bool uses_tensor_cores(const SsdChunkScanDescriptor& desc, SsdVariant v) {
  const bool half = desc.x.dtype == ElementKind::F16 || desc.x.dtype == ElementKind::BF16;
  const int64_t room = desc.device.smem_optin_bytes - kSsdTcStaticSmem;
  return v == SsdVariant::Chunked && half && desc.device.arch >= 80 &&
         ssd_tc_scan_smem_bytes(desc.B.sizes[3], false) <= room &&
         ssd_tc_scan_smem_bytes(desc.x.sizes[3], true) <= room;
}

// The tensor-core chunk-state kernel's state columns per block (see
// SsdChunkScanLaunch::state_tile_n): 128 where N > 64, so that each x (or dy) tile is read
// once for both 64-column halves. Measured at the Mamba-2 2.7B shape (H200, bf16, N = 128;
// BENCHMARKS.md "SSD chunk states with a copy ring"): the recomputed S_c 226 µs with 128
// columns against 321 with 64, the backward's local dstate 194 against 234.
int64_t state_tile_n(const SsdChunkScanDescriptor& desc, SsdVariant v, const SsdChunkScanLaunch& l) {
  if (!uses_tensor_cores(desc, v)) return 0;
  return l.state_dim > 64 ? 128 : 64;
}

// ssd_force_state_wgmma's setting: -1 for the plan's own choice, 0 never, 1 where the plan
// would take it.
std::atomic<int> g_forced_state_wgmma{-1};

// Whether the chunk-state kernel runs its products on wgmma (tc_wgmma_wk): where a block
// computes 128 state columns on an sm_90 device with the build's sm_90a code. Measured on
// an H100 (bf16, two rounds; BENCHMARKS.md "SSD chunk states on wgmma"): at the Mamba-2
// 2.7B shape the backward's recomputed S_c 145.8 / 145.5 -> 131.3 / 131.2 us and its local
// dstates 149.4 / 144.2 -> 134.6 / 134.2 (the backward pass 1895 / 1902 -> 1872 / 1874),
// at B2 L4096 H16 P128 N256 63.0 and 67.0 against 65.8 and 70.0, the same bits; with 64
// columns (N = 64) level or slower (S_c 63.2 against 62.5, dstates 66.3 against 66.1), so
// those keep mma.sync. With seq_idx (the SEG instantiation; 2.7B shape, 7 sequences a row,
// one round) the dstates 136.3 -> 122.7 us and S_c level (140.9 against 142.2).
bool state_wgmma(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  return g_forced_state_wgmma.load(std::memory_order_relaxed) != 0 && l.state_tile_n == 128 && wgmma_device(desc);
}

// ssd_force_dx_wgmma's setting: -1 for the plan's own choice, 0 never, 1 wherever the
// kernel can.
std::atomic<int> g_forced_dx_wgmma{-1};

// Whether the group dx kernel runs P·dy on wgmma (A: the P fragments in registers; B: the
// dy tile, 128-byte swizzled): with D given (its epilogue), on an sm_90 device with the
// build's sm_90a code. Measured on an H100 (bf16, the 2.7B shape, rounds alternating; the
// same bits): with D and z dx 577.1-583.7 µs against 591.8-595.6 (the backward's wall
// time 2319-2337 against 2333-2350); with D without z (dD's partials in dx, as in the
// Mamba-2 layer) 605.7-611.4 against 623.6-624.1 (wall 1992-2004 against 1996-2007);
// without D 520.5-523.0 against 509.4-512.6, kept on mma.sync.
bool dx_wgmma(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  const int forced = g_forced_dx_wgmma.load(std::memory_order_relaxed);
  if (forced == 0 || !l.group_products || !wgmma_device(desc)) return false;
  return forced == 1 || desc.options.has_D;
}

// ssd_force_split_share's setting: -1 for the plan's own choice, 0 never, 1 wherever the
// kernel can.
std::atomic<int> g_forced_split_share{-1};

// Whether the fused forward's two halves of a state tile of 256 share the output rows
// (SsdChunkScanLaunch::fused_split_share): with z, whose loads and y_pre's stores then
// split over both blocks. H100, B2 L4096 H16 P128 N256 G16, bf16 (the same bits): with D,
// z, dt_bias, softplus and initial states the fused kernel 274.1–274.4 µs against
// 303.1–304.0; the same without z 241.9–243.5 against 243.1–243.4; plain 244.3–245.8
// against 238.8–239.3, kept on the first half's block (seventy-second session,
// BENCHMARKS.md).
bool split_share(const SsdChunkScanLaunch& l) {
  const int forced = g_forced_split_share.load(std::memory_order_relaxed);
  if (forced == 0 || l.fused_state_split != 2) return false;
  return forced == 1 || l.gated;
}

// ssd_force_fused_pdl's setting: -1 for the plan's own choice, 0 never.
std::atomic<int> g_forced_fused_pdl{-1};

// Whether the fused forward is launched as a programmatic dependent of the C·Bᵀ table
// kernel (SsdChunkScanLaunch::fused_pdl): with FusedMmaCb on an sm_90 device running the
// build's sm_90a code, whose kernels hold the grid-dependency instructions (the table
// kernel's trigger and the fused kernel's wait; a build without sm_90a code may run
// compute_80 code there, which has no wait). H100, bf16, the same bits, the forward pass's
// time (the kernels' sum counts their overlap twice): B2 L4096 H16 P128 N256 G16 323–324
// µs against 335–337, with D, z, dt_bias, softplus and initial states 351–353 against
// 364–369, B4 L4096 H80 P64 N128 G1 547–550 against 553–560 (seventy-fourth session,
// BENCHMARKS.md; the same kernels behind an experiment's switch).
bool fused_pdl(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  return g_forced_fused_pdl.load(std::memory_order_relaxed) != 0 &&
         l.cuda_forward == SsdCudaForward::FusedMmaCb && wgmma_device(desc);
}

// ssd_force_gate_rows's setting: -1 for the plan's own choice, 0 never.
std::atomic<int> g_forced_gate_rows{-1};

// Whether the gate kernel runs by positions' rows (ssd_gate_rows_kernel): with z given and
// dD's partials from the dx kernel, where its 32-bit indices reach every element (B·L·H·P
// below 2^31). H100, the 2.7B shape with D and z: the gate kernel 276-279 against 309-310
// µs, the backward's wall time 2286-2288 against 2308-2320 (the same bits).
bool gate_rows(const SsdChunkScanLaunch& l) {
  const int64_t elements = l.batch * l.seqlen * l.heads * l.head_dim;
  return g_forced_gate_rows.load(std::memory_order_relaxed) != 0 && l.gated && l.dD_in_dx &&
         elements < (int64_t{1} << 31);
}

// Bytes of one dCB (B·nc·G·Q'² float32) and of x (16-bit), which the dCB head splits'
// memory is held against.
double dcb_bytes(const SsdChunkScanLaunch& l) {
  const double qp = static_cast<double>(l.dcb_ld());
  return 4.0 * static_cast<double>(l.batch) * static_cast<double>(l.nchunks()) * static_cast<double>(l.groups) *
         qp * qp;
}
double x_bytes(const SsdChunkScanLaunch& l) {
  return 2.0 * static_cast<double>(l.batch) * static_cast<double>(l.seqlen) * static_cast<double>(l.heads) *
         static_cast<double>(l.head_dim);
}

// The dCB pass's head splits (SsdChunkScanLaunch::dcb_splits): 1 to 4, the fewest with the
// least rounds × heads per block, counting 3 blocks per multiprocessor (the dCB kernel's
// occupancy), as long as the partial dCBs together take no more memory than x. At the
// Mamba-2 2.7B shape (640 tile pairs and 80 heads, 132 multiprocessors) that is 3: 5 rounds
// of 27 heads in place of 2 rounds of 80. (Counting 4, the kernel's occupancy when the count
// was first chosen, picked 4 splits there: the backward took 25 µs more, H100, BENCHMARKS.md
// fifty-second session.)
int64_t ssd_dcb_splits(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  const int64_t hpg = l.groups > 0 ? l.heads / l.groups : 1;
  const int64_t tiles = l.dcb_ld() / 64;
  const int64_t blocks = l.batch * l.groups * l.nchunks() * tiles * (tiles + 1) / 2;
  const int64_t slots = 3 * static_cast<int64_t>(std::max(desc.device.sm_count, 1));
  const double dcb = dcb_bytes(l), x = x_bytes(l);
  int64_t best = 1, best_cost = -1;
  for (int64_t s = 1; s <= std::min<int64_t>(4, hpg); ++s) {
    if (s > 1 && dcb * static_cast<double>(s) > x) break;
    if ((s - 1) * ((hpg + s - 1) / s) >= hpg) continue;  // every split gets a head
    const int64_t cost = (blocks * s + slots - 1) / slots * ((hpg + s - 1) / s);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// Whether the dCB kernel copies its one head's tiles beside the C and B rows
// (SsdChunkScanLaunch::dcb_overlap): with one head a block, where that keeps as many of its
// blocks on a multiprocessor (at most 3, its launch bounds; a multiprocessor holds the
// opt-in limit + 1 KB, each block its shared memory + 1 KB the runtime reserves).
// Measured on an H200 (bf16, the same bits; BENCHMARKS.md fifty-third session): dCB
// 1576-1581 -> 1524-1530 µs at B4 L4096 H80 P64 N128 G80 (3 blocks an SM), 595-596 ->
// 559-562 at B2 L8192 H32 P64 N64 G32 (3), 258-260 -> 250-251 at B2 L4096 H16 P128 N256
// G16 (2 either way).
bool ssd_dcb_overlap(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  if (l.groups <= 0 || l.dcb_splits != l.heads / l.groups) return false;
  auto resident = [&](bool overlap) {
    const int64_t block = ssd_group_dcb_smem_bytes(l.head_dim, l.state_dim, overlap) + kSsdGroupDcbStaticSmem + 1024;
    return std::min<int64_t>(3, (desc.device.smem_optin_bytes + 1024) / block);
  };
  const int64_t with = resident(true);
  return with > 0 && with >= resident(false);
}

// ssd_force_cuda_forward's setting: -1 for the plan's own choice, else a SsdCudaForward.
std::atomic<int> g_forced_forward{-1};

struct CudaForwardChoice {
  SsdCudaForward kernel = SsdCudaForward::Staged;
  int64_t state_tile = 0;
};

// The CUDA forward for this problem and, for a fused one, its state tile (see
// SsdCudaForward). Measured on an H100 (BENCHMARKS.md, "SSD per kernel"; bf16, chunk 256):
// the mma.sync fused forward takes 940 / 1017 / 267 µs at B4 L4096 H80 P64 N128 with G = 1
// / G = 80 and at B2 L8192 H32 P64 N64 G32 where the staged kernels took 2138 / 2095 /
// 944; in one run the wgmma fused forward took 1123 / 1190 / 306 against mma.sync's
// 966 / 1040 / 274. With the C·Bᵀ table (FusedMmaCb; H200, same run, BENCHMARKS.md "SSD
// forward with the group's C·Bᵀ table"): 603 µs at the first shape, table included,
// against 684 for FusedMma. It takes kSsdFusedCbMinHeads heads per group or more, where
// the table (about 136 KB per chunk and group at chunk 256) is no larger than x's tiles
// of those heads and is read by each of them; with one head per group it would only add
// memory traffic.
CudaForwardChoice cuda_forward(const SsdChunkScanDescriptor& desc, SsdVariant v,
                               const SsdChunkScanLaunch& l) {
  const int forced = g_forced_forward.load(std::memory_order_relaxed);
  CudaForwardChoice c;
  c.state_tile = l.state_dim <= 64 ? 64 : l.state_dim <= 128 ? 128 : 256;
  // A tile of 256 FusedMmaCb alone takes, in two halves, whatever the heads per group (see
  // kSsdFusedMaxState): twice the blocks.
  const bool wide = c.state_tile > 128;
  const int64_t blocks = l.batch * l.heads * (l.head_dim / kSsdFusedHeadTile) * l.nchunks() * (wide ? 2 : 1);
  if (forced == static_cast<int>(SsdCudaForward::Staged) || !uses_tensor_cores(desc, v) ||
      l.chunk_size > kSsdFusedMaxChunk ||
      l.head_dim % kSsdFusedHeadTile != 0 || l.state_dim > kSsdFusedMaxState ||
      l.seqlen >= (int64_t{1} << 31) - kSsdFusedMaxChunk ||  // the kernels count positions in int
      blocks >= (int64_t{1} << 31))                           // and blocks in int
    return {};
  if (wide && forced >= 0 && forced != static_cast<int>(SsdCudaForward::FusedMmaCb)) return {};
  // seq_idx: the mma.sync kernels mask the sequence starts (fused_dt_cumsum), the wgmma
  // kernel does not. Measured at B4 L4096 H80 P64 N128 G1 chunk 256 with 8 sequences a row
  // (H200, bf16): 971 µs of kernels staged, 576 on fused_mma_cb (567 without seq_idx).
  if (desc.options.has_seq_idx && forced == static_cast<int>(SsdCudaForward::FusedWgmma)) return {};
  if (forced == static_cast<int>(SsdCudaForward::FusedWgmma) && wgmma_device(desc))
    c.kernel = SsdCudaForward::FusedWgmma;
  else if (wide || forced == static_cast<int>(SsdCudaForward::FusedMmaCb) ||
           (forced < 0 && l.heads / l.groups >= kSsdFusedCbMinHeads))
    c.kernel = SsdCudaForward::FusedMmaCb;
  else
    c.kernel = SsdCudaForward::FusedMma;
  if (desc.device.smem_optin_bytes <
      ssd_fused_smem_bytes(c.kernel, wide ? c.state_tile / 2 : c.state_tile, desc.options.has_seq_idx))
    return {};
  return c;
}

// ssd_force_group_products's setting: -1 for the plan's own choice, 0 never, 1 wherever
// it can run.
std::atomic<int> g_forced_group{-1};

// Whether the CUDA backward runs the intra-chunk dB/dC products once per group (see
// ssd_force_group_products): the tensor-core backward, head_dim <= 128 and state_dim <=
// 256 (the kernels' tiles), the dx, dC and dB kernels' shared memory within the device's
// opt-in limit (dx at state_dim 256 84 KB, dB at head_dim 128 105 KB), and dCB
// (B·nc·G·Q'² float32, Q' the longest chunk rounded up to 64: the size of mamba_ssm's own
// dcb) at most 8× x, counted per chunk: 4·Q'² bytes a group against 2·Q·P·H/G, Q the
// longest chunk. The per-head products need no such memory. At the Mamba-2 2.7B shape
// (H = 80, G = 1) dCB is 10 % of x; with one head per group and chunk 256 it is 4× x at
// P = 128, 8× at P = 64, 16× at P = 32 (not measured: per-head products).
// Measured at the 2.7B shape (H100, bf16; BENCHMARKS.md "SSD backward with the group
// products"): backward kernels 5.6 ms with them, 9.2 ms with the per-head products. One
// head a group (H200, bf16): B2 L4096 H16 P128 N256 G16 (4×) 1492 µs on group_wgmma
// against 2310, B2 L8192 H32 P64 N64 G32 (8×) 1703 against 1930.
bool group_products(const SsdChunkScanDescriptor& desc, SsdVariant v, const SsdChunkScanLaunch& l) {
  const int forced = g_forced_group.load(std::memory_order_relaxed);
  if (forced == 0 || !uses_tensor_cores(desc, v) || l.head_dim > 128 || l.state_dim > 256 ||
      desc.device.smem_optin_bytes < ssd_group_dx_smem_bytes(l.state_dim) ||
      desc.device.smem_optin_bytes < ssd_group_grad_smem_bytes(l.head_dim, true, false) ||
      desc.device.smem_optin_bytes < ssd_group_grad_smem_bytes(l.head_dim, false, false) ||
      l.batch * l.seqlen * l.heads == 0)
    return false;
  if (forced == 1) return true;
  const double qp = static_cast<double>(l.dcb_ld());
  const double q = static_cast<double>(std::min(l.chunk_size, l.seqlen));
  return 4.0 * qp * qp * static_cast<double>(l.groups) <=
         8.0 * 2.0 * q * static_cast<double>(l.head_dim) * static_cast<double>(l.heads);
}

// ssd_force_group_wgmma's setting: -1 for the plan's own choice, 0 never, 1 wherever it can
// run (the plan's choice too).
std::atomic<int> g_forced_group_wgmma{-1};

// Whether the group products' dC/dB kernel runs its per-head products on wgmma: wherever
// it can, an sm_90 device with the build's sm_90a code and its swizzled tiles within the
// opt-in limit. Measured at the Mamba-2 2.7B shape (H200, bf16, BENCHMARKS.md): dC 207 ->
// 175 us, dB 163 -> 144 against mma.sync.
bool group_wgmma(const SsdChunkScanDescriptor& desc, const SsdChunkScanLaunch& l) {
  const int forced = g_forced_group_wgmma.load(std::memory_order_relaxed);
  return l.group_products && forced != 0 && wgmma_device(desc) &&
         desc.device.smem_optin_bytes >= ssd_group_grad_smem_bytes(l.head_dim, true, true) &&
         desc.device.smem_optin_bytes >= ssd_group_grad_smem_bytes(l.head_dim, false, true);
}

// ssd_force_backward_side_stream's setting: -1 for the plan's own choice, 0 never, 1
// wherever the group products run (the plan's choice too).
std::atomic<int> g_forced_side_stream{-1};

// Whether the group products' backward overlaps kernels on side streams: wherever they run
// (the same kernels; a fork and a join cost a few µs of launches). Measured on an H200
// (bf16, torch 2.11; BENCHMARKS.md "SSD backward on side streams"), the backward pass at
// the Mamba-2 2.7B shape B4 L4096 H80 P64 N128 G1: 2048–2053 → 1999–2000 µs, with 7
// packed sequences a row 2456–2460 → 2322–2323; level (within 1 %) at the other
// three shapes.
bool backward_side_stream(const SsdChunkScanLaunch& l) {
  return l.group_products && g_forced_side_stream.load(std::memory_order_relaxed) != 0;
}

const char* variant_name(const SsdChunkScanDescriptor& desc, SsdVariant v,
                         SsdCudaForward forward = SsdCudaForward::Staged, bool group = false,
                         bool group_wgmma = false) {
  switch (v) {
    case SsdVariant::Sequential: return "sequential";
    case SsdVariant::CpuChunked: return "chunked";
    case SsdVariant::Chunked:
      if (forward == SsdCudaForward::FusedMma) return "fused_mma";
      if (forward == SsdCudaForward::FusedMmaCb) return "fused_mma_cb";
      if (forward == SsdCudaForward::FusedWgmma) return "fused_wgmma";
      if (group) return group_wgmma ? "group_wgmma" : "group_mma";
      return uses_tensor_cores(desc, v) ? "chunked_mma" : "chunked";
    case SsdVariant::Zeros: return "zeros";
  }
  return "?";
}

KernelSku make_sku(const SsdChunkScanDescriptor& desc, SsdVariant v, bool backward,
                   SsdCudaForward forward = SsdCudaForward::Staged, bool group = false,
                   bool group_wgmma = false) {
  KernelSku sku;
  sku.family = kFamily;
  sku.op = backward ? kBackwardOp : kOp;
  sku.element = desc.x.dtype;
  sku.variant = variant_name(desc, v, forward, group, group_wgmma);
  sku.backend = desc.device.backend;
  sku.arch = desc.device.arch;
  // The CPU's "sequential" runs the recurrence in float64 for every dtype; the chunked
  // variants compute in float32 (float64 for float64; "chunked_mma" accumulates in
  // float32 from 16-bit tensor-core operands, see the header). Every reduction has a
  // fixed order everywhere (no float atomics; per-task partials summed in order), so
  // every variant is deterministic and bit-stable, whatever the preference.
  const bool f64 = v == SsdVariant::Sequential || desc.x.dtype == ElementKind::F64;
  sku.precision = {f64 ? MathPrecision::F64 : MathPrecision::F32,
                   f64 ? ElementKind::F64 : ElementKind::F32, true, true};
  return sku;
}

void launch_forward(SsdVariant v, const SsdChunkScanLaunch& l, void* stream) {
  const auto cpu = v == SsdVariant::CpuChunked ? kernels::ssd_chunk_scan_cpu_chunked_forward
                                               : kernels::ssd_chunk_scan_cpu_forward;
  const auto cuda = l.cuda_forward == SsdCudaForward::FusedMma || l.cuda_forward == SsdCudaForward::FusedMmaCb
                        ? BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_fused_forward)
                    : l.cuda_forward == SsdCudaForward::FusedWgmma
                        ? BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_fused_forward_sm90)
                        : BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_forward);
  run_on_backend(backend_of(v), kOp, cpu, cuda, l, stream);
}

void launch_backward(SsdVariant v, const SsdChunkScanLaunch& l, void* stream) {
  run_on_backend(backend_of(v), kBackwardOp,
                 v == SsdVariant::CpuChunked ? kernels::ssd_chunk_scan_cpu_chunked_backward
                                             : kernels::ssd_chunk_scan_cpu_backward,
                 BARACUDA_CUDA_ENTRY(kernels::ssd_chunk_scan_cuda_backward), l, stream);
}
}  // namespace

std::optional<SsdCudaForward> ssd_force_cuda_forward(std::optional<SsdCudaForward> kernel) {
  return exchange_forced(g_forced_forward, kernel);
}

std::optional<bool> ssd_force_group_products(std::optional<bool> force) {
  return exchange_forced(g_forced_group, force);
}

std::optional<bool> ssd_force_group_wgmma(std::optional<bool> force) {
  return exchange_forced(g_forced_group_wgmma, force);
}

std::optional<bool> ssd_force_backward_side_stream(std::optional<bool> force) {
  return exchange_forced(g_forced_side_stream, force);
}

std::optional<bool> ssd_force_state_wgmma(std::optional<bool> force) {
  return exchange_forced(g_forced_state_wgmma, force);
}

std::optional<bool> ssd_force_dx_wgmma(std::optional<bool> force) {
  return exchange_forced(g_forced_dx_wgmma, force);
}

std::optional<bool> ssd_force_split_share(std::optional<bool> force) {
  return exchange_forced(g_forced_split_share, force);
}

std::optional<bool> ssd_force_fused_pdl(std::optional<bool> force) {
  return exchange_forced(g_forced_fused_pdl, force);
}

std::optional<bool> ssd_force_gate_rows(std::optional<bool> force) {
  return exchange_forced(g_forced_gate_rows, force);
}

SsdChunkScanPlan SsdChunkScanPlan::select(const SsdChunkScanDescriptor& desc,
                                          PlanPreference pref) {
  const SsdSizes<int64_t> s = validate(desc, kOp);
  SsdChunkScanPlan p;
  p.desc_ = desc;
  p.variant_ = pick_variant(s, desc.device, pref);
  p.out_ = dense_output_layout(desc.x);
  p.final_ = dense_of(ssd_compute_type(desc.x.dtype),
                      {s.batch, s.heads, s.head_dim, s.state_dim});
  p.launch_ = plan_launch(desc, s, nullptr);
  const CudaForwardChoice forward = cuda_forward(desc, p.variant_, p.launch_);
  p.launch_.cuda_forward = forward.kernel;
  p.launch_.fused_state_tile = forward.state_tile;
  p.launch_.fused_state_split = forward.state_tile > 128 ? 2 : 1;
  p.launch_.fused_split_share = split_share(p.launch_);
  p.launch_.fused_pdl = fused_pdl(desc, p.launch_);
  p.launch_.tensor_cores = uses_tensor_cores(desc, p.variant_);
  p.launch_.state_tile_n = state_tile_n(desc, p.variant_, p.launch_);
  p.launch_.state_wgmma = state_wgmma(desc, p.launch_);
  p.launch_.keep_states =
      desc.options.keep_states && p.variant_ != SsdVariant::Zeros && ssd_keeps_states(desc.x.dtype);
  p.states_ = dense_of(desc.x.dtype, {s.batch, s.heads, p.launch_.nchunks(), s.head_dim, s.state_dim});
  p.kernel_workspace_ = kernel_workspace(p.variant_, p.launch_, false, kOp);
  p.workspace_ = with_alignment_slack(p.kernel_workspace_);
  p.sku_ = make_sku(desc, p.variant_, false, p.launch_.cuda_forward);
  return p;
}

void SsdChunkScanPlan::can_implement(const SsdChunkScanArgs& args) const {
  check_same_layout(kOp, "x", desc_.x, args.x.layout);
  check_same_layout(kOp, "dt", desc_.dt, args.dt.layout);
  check_same_layout(kOp, "A", desc_.A, args.A.layout);
  check_same_layout(kOp, "B", desc_.B, args.B.layout);
  check_same_layout(kOp, "C", desc_.C, args.C.layout);
  check_output(kOp, "y", out_, args.y);
  const SsdChunkScanOptions& o = desc_.options;
  if (o.has_D) check_same_layout(kOp, "D", o.D, args.D.layout);
  if (o.has_z) check_same_layout(kOp, "z", o.z, args.z.layout);
  if (o.has_dt_bias) check_same_layout(kOp, "dt_bias", o.dt_bias, args.dt_bias.layout);
  if (o.has_initial_states)
    check_same_layout(kOp, "initial_states", o.initial_states, args.initial_states.layout);
  if (o.has_seq_idx) check_same_layout(kOp, "seq_idx", o.seq_idx, args.seq_idx.layout);
  if (o.final_states) check_output(kOp, "final_states", final_, args.final_states);
  if (o.has_z) check_output(kOp, "y_pre", out_, args.y_pre);
  if (launch_.keep_states) check_output(kOp, "states", states_, args.states);
}

void SsdChunkScanPlan::run(void* stream, Workspace workspace, const SsdChunkScanArgs& args) const {
  can_implement(args);
  check_workspace(kOp, workspace_size(), workspace);
  if (variant_ == SsdVariant::Zeros) return;  // the caller zero-filled y
  SsdChunkScanLaunch l = launch_;
  l.x = args.x.data;
  l.dt = args.dt.data;
  l.A = args.A.data;
  l.B = args.B.data;
  l.C = args.C.data;
  l.y = args.y.data;
  const SsdChunkScanOptions& o = desc_.options;
  if (o.has_D) l.D = args.D.data;
  if (o.has_z) {
    l.z = args.z.data;
    l.y_pre_out = args.y_pre.data;
  }
  if (o.has_dt_bias) l.dt_bias = args.dt_bias.data;
  if (o.has_initial_states) l.initial_states = args.initial_states.data;
  if (o.has_seq_idx) l.seq_idx = args.seq_idx.data;
  if (o.final_states) l.final_states = args.final_states.data;
  if (l.keep_states) l.states = args.states.data;
  attach_workspace(l, workspace, kernel_workspace_);
  launch_forward(variant_, l, stream);
}

SsdChunkScanBackwardPlan SsdChunkScanBackwardPlan::select(
    const SsdChunkScanBackwardDescriptor& desc, PlanPreference pref) {
  const SsdSizes<int64_t> s = validate(desc.forward, kBackwardOp, &desc);
  check_ssd_dy(kBackwardOp, operand("x", desc.forward.x), operand("dy", desc.dy));
  SsdChunkScanBackwardPlan p;
  p.desc_ = desc;
  p.variant_ = pick_variant(s, desc.forward.device, pref);
  const SsdChunkScanDescriptor& f = desc.forward;
  p.out_ = {dense_output_layout(f.x), dense_output_layout(f.dt), dense_output_layout(f.A),
            dense_output_layout(f.B), dense_output_layout(f.C)};
  const SsdChunkScanOptions& o = f.options;
  if (o.has_D) p.opt_out_[0] = dense_output_layout(o.D);
  if (o.has_z) p.opt_out_[1] = dense_output_layout(f.x);
  if (o.has_dt_bias) p.opt_out_[2] = dense_output_layout(o.dt_bias);
  if (o.has_initial_states) p.opt_out_[3] = dense_output_layout(o.initial_states);
  p.launch_ = plan_launch(f, s, &desc);
  p.launch_.group_products = group_products(f, p.variant_, p.launch_);
  p.launch_.group_wgmma = group_wgmma(f, p.launch_);
  p.launch_.side_stream = backward_side_stream(p.launch_);
  p.launch_.dcb_splits = p.launch_.group_products ? ssd_dcb_splits(f, p.launch_) : 1;
  p.launch_.dcb_overlap = p.launch_.group_products && ssd_dcb_overlap(f, p.launch_);
  // dD's partials from the group dx kernel, with z or without. Without z the gate kernel
  // would run for them alone (D without z, as in a Mamba2 layer whose gated RMSNorm takes
  // z; H200, the 2.7B shape's options backward without z: dx 650 → 679–684 µs, the gate
  // kernel's 96.9 gone, the backward's kernels 2300 → 2229–2238). With z the gate kernel
  // runs anyway and then reads no x: H100, the 2.7B shape with D and z, gate 308–309
  // against 359 µs, dx 606–607 against 578–579, the pass 2306–2312 against 2332–2335
  // (on the H200 of the twenty-seventh session, before dx ran P·dy on wgmma with D, x cost
  // the gate kernel no more than the partials cost dx).
  p.launch_.dD_in_dx = p.launch_.group_products;
  p.launch_.gate_rows = gate_rows(p.launch_);
  p.launch_.tensor_cores = uses_tensor_cores(f, p.variant_);
  p.launch_.state_tile_n = state_tile_n(f, p.variant_, p.launch_);
  p.launch_.state_wgmma = state_wgmma(f, p.launch_);
  p.launch_.dx_wgmma = dx_wgmma(f, p.launch_);
  // The forward's kept chunk states replace the recomputed ones on the tensor-core path,
  // which reads H_c in 16 bits (the SIMT kernels read them in float32 and recompute):
  // H100, the 2.7B shape's backward 1882-1888 -> 1645-1655 us, its forward 540 -> 559
  // (BENCHMARKS.md, "The SSD's chunk states kept from the forward").
  p.launch_.keep_states = desc.has_states && p.launch_.tensor_cores;
  p.kernel_workspace_ = kernel_workspace(p.variant_, p.launch_, true, kBackwardOp);
  p.workspace_ = with_alignment_slack(p.kernel_workspace_);
  p.sku_ = make_sku(f, p.variant_, true, SsdCudaForward::Staged, p.launch_.group_products, p.launch_.group_wgmma);
  return p;
}

void SsdChunkScanBackwardPlan::can_implement(const SsdChunkScanBackwardArgs& args) const {
  const std::string& op = kBackwardOp;
  const SsdChunkScanDescriptor& f = desc_.forward;
  check_same_layout(op, "dy", desc_.dy, args.dy.layout);
  check_same_layout(op, "x", f.x, args.x.layout);
  check_same_layout(op, "dt", f.dt, args.dt.layout);
  check_same_layout(op, "A", f.A, args.A.layout);
  check_same_layout(op, "B", f.B, args.B.layout);
  check_same_layout(op, "C", f.C, args.C.layout);
  check_output(op, "dx", out_[0], args.dx);
  check_output(op, "ddt", out_[1], args.ddt);
  check_output(op, "dA", out_[2], args.dA);
  check_output(op, "dB", out_[3], args.dB);
  check_output(op, "dC", out_[4], args.dC);
  const SsdChunkScanOptions& o = f.options;
  if (o.has_D) {
    check_same_layout(op, "D", o.D, args.D.layout);
    check_output(op, "dD", opt_out_[0], args.dD);
  }
  if (o.has_z) {
    check_same_layout(op, "z", o.z, args.z.layout);
    check_same_layout(op, "y_pre", desc_.y_pre, args.y_pre.layout);
    check_output(op, "dz", opt_out_[1], args.dz);
  }
  if (o.has_dt_bias) {
    check_same_layout(op, "dt_bias", o.dt_bias, args.dt_bias.layout);
    check_output(op, "ddt_bias", opt_out_[2], args.ddt_bias);
  }
  if (o.has_initial_states) {
    check_same_layout(op, "initial_states", o.initial_states, args.initial_states.layout);
    check_output(op, "dinitial_states", opt_out_[3], args.dinitial_states);
  }
  if (o.has_seq_idx) check_same_layout(op, "seq_idx", o.seq_idx, args.seq_idx.layout);
  if (desc_.has_dfinal_states)
    check_same_layout(op, "dfinal_states", desc_.dfinal_states, args.dfinal_states.layout);
  if (desc_.has_states) check_same_layout(op, "states", desc_.states, args.states.layout);
}

void SsdChunkScanBackwardPlan::run(void* stream, Workspace workspace,
                                   const SsdChunkScanBackwardArgs& args) const {
  can_implement(args);
  check_workspace(kBackwardOp, workspace_size(), workspace);
  if (variant_ == SsdVariant::Zeros) return;  // the caller zero-filled the gradients
  SsdChunkScanLaunch l = launch_;
  l.dy = args.dy.data;
  l.x = args.x.data;
  l.dt = args.dt.data;
  l.A = args.A.data;
  l.B = args.B.data;
  l.C = args.C.data;
  l.dx = args.dx.data;
  l.ddt = args.ddt.data;
  l.dA = args.dA.data;
  l.dB = args.dB.data;
  l.dC = args.dC.data;
  const SsdChunkScanOptions& o = desc_.forward.options;
  if (o.has_D) {
    l.D = args.D.data;
    l.dD = args.dD.data;
  }
  if (o.has_z) {
    l.z = args.z.data;
    l.y_pre = args.y_pre.data;
    l.dz = args.dz.data;
  }
  if (o.has_dt_bias) {
    l.dt_bias = args.dt_bias.data;
    l.ddt_bias = args.ddt_bias.data;
  }
  if (o.has_initial_states) {
    l.initial_states = args.initial_states.data;
    l.dinitial_states = args.dinitial_states.data;
  }
  if (o.has_seq_idx) l.seq_idx = args.seq_idx.data;
  if (desc_.has_dfinal_states) l.dfinal_states = args.dfinal_states.data;
  if (l.keep_states) l.states = const_cast<void*>(args.states.data);
  attach_workspace(l, workspace, kernel_workspace_);
  launch_backward(variant_, l, stream);
}

}  // namespace baracuda
