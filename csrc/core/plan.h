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
#include <cstddef>
#include <cstdint>
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
  int64_t l2_bytes = 0;  // L2 cache size (0 on the CPU)
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

// NotImplementedError naming the op above kMaxRank dims.
void check_rank(const std::string& op, const char* what, int rank);

// Normalizes `dim` for a rank-`rank` tensor; IndexError naming the op otherwise.
int normalize_dim(const std::string& op, const char* what, int64_t dim, int rank);

inline bool fits_int32(int64_t v) { return v <= INT32_MAX; }

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

}  // namespace baracuda
