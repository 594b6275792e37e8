// The plan layer: the vocabulary every op family shares.
//
// A family describes its problem in a Descriptor, asks `Plan::select(desc, pref)` for a
// kernel (validation and choice happen there, once), and launches it with
// `plan.run(stream, workspace, args)`. `sku()` and `precision_guarantee()` say what was
// picked and what it promises, without running anything: that is what the Python
// introspection API (`baracuda_torch.explain`) reports.
//
// Framework-light on purpose: nothing here knows about at::Tensor or the dispatcher.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

namespace c10 {
class SymInt;
}

namespace baracuda {

constexpr int kMaxRank = 8;

enum class ElementKind : uint8_t { F32, F16, BF16, F64, I32, I64 };

const char* element_name(ElementKind e);
int element_size(ElementKind e);
inline bool is_floating(ElementKind e) {
  return e == ElementKind::F32 || e == ElementKind::F16 || e == ElementKind::BF16 ||
         e == ElementKind::F64;
}

enum class Backend : uint8_t { Cpu, Cuda };
const char* backend_name(Backend b);

// Where a problem runs. `arch` is the SM version (90 for an H100/H200), 0 on the CPU.
struct DeviceInfo {
  Backend backend = Backend::Cpu;
  int index = -1;
  int arch = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;          // L2 cache size (0 on the CPU)
  int64_t smem_optin_bytes = 0;  // shared memory a block may opt into (0 on the CPU)
  // The build holds this device's architecture-specific code (sm_90a on Hopper: wgmma).
  bool arch_specific_kernels = false;
};

// "fastest" may pick a kernel whose float reductions vary in order between runs;
// "deterministic" never does; "precise" is "deterministic" that also picks a kernel
// evaluating in float64 where the family has one (the CPU SSD recurrence).
enum class PlanPreference : uint8_t { Fastest, Deterministic, Precise };
const char* preference_name(PlanPreference p);

enum class MathPrecision : uint8_t { F32, F64 };

struct PrecisionGuarantee {
  MathPrecision math = MathPrecision::F32;  // precision the formula is evaluated in
  ElementKind accumulator = ElementKind::F32;
  bool deterministic = true;                // same inputs -> same bits, every run
  bool bit_stable_on_same_hardware = true;  // ... and on another GPU of the same kind
};

// Identity of the kernel a plan picked.
struct KernelSku {
  std::string family;   // "gated_activation"
  std::string op;       // "swiglu", "swiglu_backward", ...
  ElementKind element = ElementKind::F32;
  std::optional<ElementKind> index_element;  // gather's index dtype
  std::string variant;  // "contiguous_vec16", "strided_i64", ...
  Backend backend = Backend::Cpu;
  int arch = 0;
  PrecisionGuarantee precision;

  // "gated_activation.swiglu/bf16/contiguous_vec16/cuda_sm90"
  std::string name() const;
};

// The KernelSku of a kernel that computes in float32 (float64 for float64 data), with an
// accumulator of the same type. `fixed_order`: every reduction it does (if any) has a
// fixed order, so it is deterministic and bit-stable on the same hardware.
KernelSku kernel_sku(std::string family, std::string op, ElementKind element,
                     std::string variant, const DeviceInfo& device, bool fixed_order = true);

enum class PlanErrorKind : uint8_t {
  InvalidProblem,    // bad shape, axis or scalar            -> ValueError
  IndexOutOfRange,   // dim or index out of range            -> IndexError
  UnsupportedDtype,  // dtype not wired                       -> TypeError
  Unsupported,       // configuration not wired               -> NotImplementedError
  DeviceMismatch,    // operands on different devices         -> RuntimeError
  Internal,          // BufferTooSmall, WorkspaceTooSmall, MisalignedOperand: a bug
};

class PlanError : public std::runtime_error {
 public:
  PlanError(PlanErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  PlanErrorKind kind() const { return kind_; }

 private:
  PlanErrorKind kind_;
};

// Throws a PlanError whose message is "baracuda::<op>: <rule>".
[[noreturn]] void fail(PlanErrorKind kind, const std::string& op, const std::string& rule);

// Shape, strides and alignment of one operand, without its data: what a Descriptor
// holds, so that `select` can pick a layout-specific kernel before anything runs.
struct TensorLayout {
  ElementKind dtype = ElementKind::F32;
  int rank = 0;
  std::array<int64_t, kMaxRank> sizes{};
  std::array<int64_t, kMaxRank> strides{};
  int alignment = 0;  // largest power of two (<= 16) dividing the data address, in bytes

  int64_t numel() const;
  bool is_contiguous() const;  // row-major, size-1 dims' strides ignored
  // Largest element offset reachable from the data pointer (0 for empty tensors).
  int64_t max_offset() const;
  // torch's rule for "non-overlapping and dense" (c10/core/Contiguity.h): every element
  // has its own offset and the offsets fill a range, in some order of the dims.
  bool is_non_overlapping_and_dense() const;
  // No two elements at one address, gaps allowed (a slice of a larger buffer): with the
  // dims of more than one element in stride order, each stride passes the farthest element
  // of the dims before it. Sufficient, not necessary: some interleaved layouts that do not
  // overlap are refused.
  bool is_non_overlapping() const;
};

// An operand: its layout plus its data pointer.
struct TensorRef {
  TensorLayout layout;
  const void* data = nullptr;
};

struct MutTensorRef {
  TensorLayout layout;
  void* data = nullptr;
};

struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// The members every plan class shares (`class GatherPlan : public PlanOf<GatherDescriptor,
// GatherLaunch>`). select() fills desc_ (the problem it validated), launch_ (the launch
// description, without data pointers), sku_ (the kernel it picked) and, when run() needs
// scratch memory, workspace_ (bytes; 0 otherwise).
template <class Descriptor, class Launch>
class PlanOf {
 public:
  const KernelSku& sku() const { return sku_; }
  const PrecisionGuarantee& precision_guarantee() const { return sku_.precision; }
  size_t workspace_size() const { return workspace_; }
  // For dev tools that time a kernel without PyTorch (benchmarks/tune).
  const Launch& launch_description() const { return launch_; }

 protected:
  Descriptor desc_;
  Launch launch_;
  KernelSku sku_;
  size_t workspace_ = 0;
};

// PlanOf for a plan whose outputs have one layout, out_ (filled by select()).
template <class Descriptor, class Launch>
class OneOutputPlanOf : public PlanOf<Descriptor, Launch> {
 public:
  // What the caller allocates for each output (each plan class says which layout).
  const TensorLayout& output_layout() const { return out_; }

 protected:
  TensorLayout out_;
};

// Checks shared by every family's `can_implement`.
void check_same_layout(const std::string& op, const char* what, const TensorLayout& expected,
                       const TensorLayout& got);
// `out` must have exactly the planned layout (dtype, sizes, strides, alignment).
void check_output(const std::string& op, const char* what, const TensorLayout& expected,
                  const MutTensorRef& out);
void check_workspace(const std::string& op, size_t needed, const Workspace& ws);

// Row-major contiguous strides for `sizes`.
std::array<int64_t, kMaxRank> contiguous_strides(const std::array<int64_t, kMaxRank>& sizes,
                                                 int rank);

// Layouts of the outputs a plan asks the torch layer for. Outputs come from PyTorch's
// allocator, so they are 16-byte aligned.
//  - dense_output_layout: `sizes` (or like's dtype and sizes), contiguous;
//  - output_layout_like: like's sizes and, when like is non-overlapping and dense, its
//    strides (as torch's empty_like with preserve_format), else contiguous.
TensorLayout dense_output_layout(ElementKind dtype, int rank, const int64_t* sizes);
TensorLayout dense_output_layout(const TensorLayout& like);
TensorLayout output_layout_like(const TensorLayout& like);
//  - empty_like_layout: torch.empty_like(like)'s layout: like's strides when like is
//    non-overlapping and dense, otherwise dense strides that keep the order of like's
//    dims by stride (torch's infer_dense_strides), so that a sliced channel-last view
//    gives a channel-last output.
TensorLayout empty_like_layout(const TensorLayout& like);

// Text of a size: int64_t, or a symbolic integer in a meta kernel (defined by the torch
// layer). No iostreams anywhere in the library: some toolchains link a static libstdc++
// into extensions, whose stream locale state then crashes next to torch's shared one.
inline std::string size_str(int64_t v) { return std::to_string(v); }
std::string size_str(const c10::SymInt& v);
template <class Int>
std::string sizes_str(const Int* sizes, int rank) {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + size_str(sizes[d]);
  return s + "]";
}

// A tensor argument of a family's templated problem checks (the causal conv1d, its
// update and the state update share them between the plan and the meta kernel): its
// dtype and sizes, or absent. Int: int64_t, or a symbolic integer in a meta kernel.
template <class Int>
struct ProblemOperand {
  bool present = false;
  ElementKind dtype = ElementKind::F32;
  int rank = 0;
  const Int* sizes = nullptr;
};

// Text of a double for error messages ("nan", "-1", "0.5").
inline std::string double_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// NotImplementedError naming the op above kMaxRank dims.
void check_rank(const std::string& op, const char* what, int rank);

// Normalizes `dim` for a rank-`rank` tensor; IndexError naming the op otherwise.
int normalize_dim(const std::string& op, const char* what, int64_t dim, int rank);

inline bool fits_int32(int64_t v) { return v <= INT32_MAX; }

// CUDA's limit on gridDim.y (and .z), which plans that put work on y respect.
constexpr int64_t kCudaMaxGridY = 65535;

// Dims of an index space, each operand's strides over it, after merging every pair of
// adjacent dims across which all operands' offsets stay linear and dropping size-1
// dims. Row-major enumeration order and every operand's offsets are unchanged, so a
// kernel may walk the coalesced space instead of the original one. Rank >= 1.
constexpr int kMaxOperands = 4;
struct CoalescedDims {
  int rank = 0;
  std::array<int64_t, kMaxRank> sizes{};
  std::array<std::array<int64_t, kMaxRank>, kMaxOperands> strides{};
};
CoalescedDims coalesce_dims(int rank, const std::array<int64_t, kMaxRank>& sizes,
                            const std::array<int64_t, kMaxRank>* const* operand_strides,
                            int num_operands);

// ---- The plan -> kernel boundary -------------------------------------------------------
// A family's launch description `<Family>Launch` lives in its plan header
// (core/<family>_plan.h), next to the constants that both the plan's work decomposition
// and the kernels rely on. kernels/<family>.h declares the entry points that take it:
// `<family>_cpu(const Launch&)` always, `<family>_cuda(const Launch&, void* stream)` only
// in CUDA builds (under BARACUDA_WITH_CUDA). A plan's run() hands its launch to both
// through run_on_backend, naming the CUDA entry with BARACUDA_CUDA_ENTRY, which is
// nullptr in a CPU-only build, so the plan needs no #ifdef and a CPU-only build links.
#ifdef BARACUDA_WITH_CUDA
#define BARACUDA_CUDA_ENTRY(fn) (fn)
#else
#define BARACUDA_CUDA_ENTRY(fn) nullptr
#endif

// NotImplementedError naming the op: a CUDA problem reached a build without CUDA kernels.
[[noreturn]] void fail_no_cuda_kernels(const std::string& op);

namespace detail {
template <class T>
struct no_deduce {
  using type = T;
};
}  // namespace detail

// cpu(launch) on the CPU, cuda(launch, stream) on CUDA (stream: a cudaStream_t).
template <class Launch>
void run_on_backend(Backend backend, const std::string& op, void (*cpu)(const Launch&),
                    typename detail::no_deduce<void (*)(const Launch&, void*)>::type cuda,
                    const Launch& launch, void* stream) {
  if (backend == Backend::Cpu) return cpu(launch);
  if (cuda == nullptr) fail_no_cuda_kernels(op);
  cuda(launch, stream);
}

// The same for a host query of the kernels (a workspace size, ...): cpu(launch) or
// cuda(launch).
template <class R, class Launch>
R query_backend(Backend backend, const std::string& op, R (*cpu)(const Launch&),
                typename detail::no_deduce<R (*)(const Launch&)>::type cuda,
                const Launch& launch) {
  if (backend == Backend::Cpu) return cpu(launch);
  if (cuda == nullptr) fail_no_cuda_kernels(op);
  return cuda(launch);
}

// A test switch's setting held in an atomic int (-1: the plan's own choice; otherwise the
// forced value, a bool or an enum): stores `force` and returns the previous setting.
template <class V>
std::optional<V> exchange_forced(std::atomic<int>& setting, std::optional<V> force) {
  const int previous = setting.exchange(force ? static_cast<int>(*force) : -1);
  if (previous < 0) return std::nullopt;
  return static_cast<V>(previous);
}

}  // namespace baracuda
