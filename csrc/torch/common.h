// The thin glue between at::Tensor and the plan layer, shared by every family's ops:
// tensor -> layout/ref conversion, device and stream, output and workspace allocation,
// the plan preference, and PlanError -> Python exception translation.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>
#include <string>
#include <type_traits>
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

// Symbolic sizes of a tensor in a meta kernel, as a vector the core's templated shape
// checks accept.
inline std::vector<c10::SymInt> sym_sizes_of(const at::Tensor& t) {
  return t.sym_sizes().vec();
}

}  // namespace baracuda::torch_ops
