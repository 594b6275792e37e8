// The thin glue between at::Tensor and the plan layer, shared by every family's ops:
// tensor -> layout/ref conversion, device and stream, output and workspace allocation,
// the plan preference, and PlanError -> Python exception translation.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/SymInt.h>

#include <deque>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/plan.h"

namespace baracuda::torch_ops {

// ElementKind of a tensor; TypeError naming the op and operand for dtypes the library
// does not know (bool, int8, complex, ...).
ElementKind element_of(const at::Tensor& t, const std::string& op, const char* what);

// Layout of a tensor with concrete sizes. NotImplementedError above rank 8.
TensorLayout layout_of(const at::Tensor& t, const std::string& op, const char* what);
TensorRef ref_of(const at::Tensor& t, const std::string& op, const char* what);
MutTensorRef mut_ref_of(at::Tensor& t, const std::string& op, const char* what);

// The oldest GPU architecture the CUDA kernels are written for (sm_80: Ampere).
constexpr int kMinCudaArch = 80;

// Backend and properties of t's device. For a CUDA tensor, fails (NotImplementedError
// naming `op`) when the GPU is older than kMinCudaArch or this build has no code for it.
DeviceInfo device_info(const at::Tensor& t, const std::string& op);
// Tests only: caps DeviceInfo::smem_optin_bytes as every plan sees it (a 99 KB device on a
// larger one), 0 for the device's own; returns the previous cap.
int64_t set_smem_optin_cap(int64_t bytes);

// The cudaStream_t (as void*) of the current stream on t's device; nullptr on the CPU.
void* current_stream(const at::Tensor& t);

// RuntimeError unless every defined tensor is on `first`'s device.
void check_same_device(const std::string& op,
                       std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors);

at::ScalarType scalar_type_of(ElementKind e);

// A tensor with `layout`'s dtype, sizes and strides (as a plan's output_layout() says)
// on `like`'s device, from PyTorch's allocator.
at::Tensor allocate(const TensorLayout& layout, const at::Tensor& like);
// Scratch bytes from PyTorch's caching allocator; keep the tensor alive across run().
at::Tensor allocate_workspace(size_t bytes, const at::Tensor& like);
inline Workspace workspace_of(const at::Tensor& ws) {
  return ws.defined() ? Workspace{ws.data_ptr(), static_cast<size_t>(ws.numel())} : Workspace{};
}

// Whether a and b may have an element at the same address: the same storage and, where
// torch cannot tell (strided views), intersecting byte ranges.
bool may_share_memory(const at::Tensor& a, const at::Tensor& b);
// An `_into` op's output `what` against the inputs it must not share memory with (null
// entries: absent operands): ValueError naming the op and the input otherwise (addresses
// are not the plan's to see).
void check_no_shared_memory(const std::string& op, const char* what, const at::Tensor& out,
                            std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs);

// The library preference (baracuda_torch.set_preference), with "fastest" raised to
// "deterministic" while torch.use_deterministic_algorithms(True) is on ("precise" is
// deterministic already).
PlanPreference current_preference();
PlanPreference library_preference();
void set_library_preference(PlanPreference p);
PlanPreference parse_preference(const std::string& s);

// Converts a PlanError into the c10 error that becomes the right Python exception.
[[noreturn]] void rethrow(const PlanError& e);

// Runs f, translating PlanErrors.
template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const PlanError& e) {
    rethrow(e);
  }
}

// The typed dispatcher handle of an op ("baracuda::rope"; overload "" or "Tensor"), to call
// it through the dispatcher (from an autograd Function, so that every key below runs).
template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Signature>();
}

// What `baracuda_torch.explain` returns: the plan's choice and its guarantees.
struct PlanInfo {
  KernelSku sku;
  size_t workspace_bytes = 0;
  PlanPreference preference = PlanPreference::Fastest;
};

template <typename Plan>
PlanInfo plan_info(const Plan& plan, PlanPreference pref) {
  return PlanInfo{plan.sku(), plan.workspace_size(), pref};
}

inline PlanPreference preference_or_current(const std::optional<std::string>& p) {
  return p ? parse_preference(*p) : current_preference();
}

// Whether a defined tensor among `tensors` (null entries skipped) has more dims than a
// TensorLayout holds (kMaxRank). A plan validates its problem once, in select(), from
// layouts; a make_plan function runs the problem's shared checks itself only for such
// inputs, so that they get the problem's error (ValueError "must be 4-D ...") rather
// than layout_of's rank limit.
inline bool exceeds_layout_rank(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    if (t && t->defined() && t->dim() > kMaxRank) return true;
  return false;
}

// Symbolic sizes of a tensor in a meta kernel, as a vector the core's templated shape
// checks accept.
inline std::vector<c10::SymInt> sym_sizes_of(const at::Tensor& t) {
  return t.sym_sizes().vec();
}

// A tensor's sizes as the integer type of a templated problem check: int64_t in a real
// kernel, c10::SymInt (sym_sizes_of) in a meta kernel.
template <class Int>
std::vector<Int> sizes_of(const at::Tensor& t);
template <>
inline std::vector<int64_t> sizes_of(const at::Tensor& t) { return t.sizes().vec(); }
template <>
inline std::vector<c10::SymInt> sizes_of(const at::Tensor& t) { return sym_sizes_of(t); }

// Tensors as the ProblemOperands of a templated problem check, named in its errors as
// arguments of `op`: `views(t, "x")` (absent for a null t). The sizes a view points at
// live as long as this object.
template <class Int>
class ProblemViews {
 public:
  explicit ProblemViews(std::string op) : op_(std::move(op)) {}
  ProblemOperand<Int> operator()(const at::Tensor* t, const char* what) {
    ProblemOperand<Int> o;
    if (!t) return o;
    o.present = true;
    o.dtype = element_of(*t, op_, what);
    const std::vector<Int>& s = sizes_.emplace_back(sizes_of<Int>(*t));
    o.rank = static_cast<int>(s.size());
    o.sizes = s.data();
    return o;
  }

 private:
  std::string op_;
  std::deque<std::vector<Int>> sizes_;
};

}  // namespace baracuda::torch_ops
