#include "torch/common.h"

#include <ATen/Context.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>

#ifdef BARACUDA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/common.h"
#endif

namespace baracuda {
std::string size_str(const c10::SymInt& v) {
  if (auto concrete = v.maybe_as_int()) return std::to_string(*concrete);
  return v.toSymNodeImplUnowned()->str();
}
}  // namespace baracuda

namespace baracuda::torch_ops {

ElementKind element_of(const at::Tensor& t, const std::string& op, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ElementKind::F32;
    case at::kHalf: return ElementKind::F16;
    case at::kBFloat16: return ElementKind::BF16;
    case at::kDouble: return ElementKind::F64;
    case at::kInt: return ElementKind::I32;
    case at::kLong: return ElementKind::I64;
    default:
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string(what) + " has dtype " + std::string(c10::toString(t.scalar_type())) +
               ", which baracuda does not support");
  }
}

TensorLayout layout_of(const at::Tensor& t, const std::string& op, const char* what) {
  TensorLayout l;
  l.dtype = element_of(t, op, what);
  check_rank(op, what, static_cast<int>(t.dim()));
  l.rank = static_cast<int>(t.dim());
  for (int d = 0; d < l.rank; ++d) {
    l.sizes[d] = t.size(d);
    l.strides[d] = t.stride(d);
  }
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  l.alignment = 16;
  while (l.alignment > 1 && addr % l.alignment != 0) l.alignment /= 2;
  return l;
}

TensorRef ref_of(const at::Tensor& t, const std::string& op, const char* what) {
  return TensorRef{layout_of(t, op, what), t.data_ptr()};
}

MutTensorRef mut_ref_of(at::Tensor& t, const std::string& op, const char* what) {
  return MutTensorRef{layout_of(t, op, what), t.data_ptr()};
}

namespace {
std::atomic<int64_t> g_smem_optin_cap{0};
}  // namespace

int64_t set_smem_optin_cap(int64_t bytes) { return g_smem_optin_cap.exchange(bytes); }

DeviceInfo device_info(const at::Tensor& t, const std::string& op) {
  DeviceInfo info;
  if (t.is_cuda()) {
    info.backend = Backend::Cuda;
    info.index = t.get_device();
#ifdef BARACUDA_WITH_CUDA
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(info.index);
    info.arch = prop->major * 10 + prop->minor;
    info.sm_count = prop->multiProcessorCount;
    info.l2_bytes = prop->l2CacheSize;
    info.smem_optin_bytes = static_cast<int64_t>(prop->sharedMemPerBlockOptin);
    const int64_t cap = g_smem_optin_cap.load(std::memory_order_relaxed);
    if (cap > 0 && cap < info.smem_optin_bytes) info.smem_optin_bytes = cap;
    info.arch_specific_kernels = kernels::cuda_arch_specific_kernels(info.arch);
    // An older GPU than the kernels are written for, or one this build has no code for,
    // fails here with the reason instead of a "no kernel image" error inside a launch.
    const std::string gpu = std::string(prop->name) + " (sm_" + std::to_string(info.arch) + ")";
    if (info.arch < kMinCudaArch)
      fail(PlanErrorKind::Unsupported, op,
           "CUDA device " + std::to_string(info.index) + " is a " + gpu +
               "; baracuda's CUDA kernels need sm_80 or newer (use CPU tensors on this machine)");
    if (!kernels::cuda_kernels_run_on(info.index))
      fail(PlanErrorKind::Unsupported, op,
           "this build has no kernels for CUDA device " + std::to_string(info.index) + ", a " +
               gpu + " (built for " + kernels::cuda_arch_list() +
               "); rebuild with TORCH_CUDA_ARCH_LIST including " +
               std::to_string(info.arch / 10) + "." + std::to_string(info.arch % 10));
#else
    fail(PlanErrorKind::Unsupported, op,
         "this build of baracuda_torch has no CUDA kernels (it was built CPU-only); "
         "rebuild where nvcc matches torch's CUDA version");
#endif
  } else if (!t.is_cpu() && !t.is_meta()) {
    fail(PlanErrorKind::Unsupported, "device",
         "tensors on " + t.device().str() + " are not supported (only cpu and cuda)");
  }
  return info;
}

void* current_stream(const at::Tensor& t) {
#ifdef BARACUDA_WITH_CUDA
  if (t.is_cuda()) return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
#endif
  (void)t;
  return nullptr;
}

void check_same_device(const std::string& op,
                       std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  const std::pair<const char*, const at::Tensor*>* first = nullptr;
  for (const auto& entry : tensors) {
    if (!entry.second->defined()) continue;
    if (!first) {
      first = &entry;
      continue;
    }
    if (entry.second->device() != first->second->device())
      fail(PlanErrorKind::DeviceMismatch, op,
           "expected all tensors on one device, but " + std::string(first->first) + " is on " +
               first->second->device().str() + " and " + entry.first + " is on " +
               entry.second->device().str());
  }
}

at::ScalarType scalar_type_of(ElementKind e) {
  switch (e) {
    case ElementKind::F32: return at::kFloat;
    case ElementKind::F16: return at::kHalf;
    case ElementKind::BF16: return at::kBFloat16;
    case ElementKind::F64: return at::kDouble;
    case ElementKind::I32: return at::kInt;
    case ElementKind::I64: return at::kLong;
  }
  return at::kFloat;
}

at::Tensor allocate(const TensorLayout& layout, const at::Tensor& like) {
  return at::empty_strided(c10::IntArrayRef(layout.sizes.data(), layout.rank),
                           c10::IntArrayRef(layout.strides.data(), layout.rank),
                           like.options().dtype(scalar_type_of(layout.dtype)));
}

at::Tensor allocate_workspace(size_t bytes, const at::Tensor& like) {
  if (bytes == 0) return at::Tensor();
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

bool may_share_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage() ||
      !a.storage().is_alias_of(b.storage()))
    return false;
  const at::MemOverlapStatus status = at::get_overlap_status(a, b);
  if (status != at::MemOverlapStatus::TooHard) return status != at::MemOverlapStatus::No;
  const auto range = [](const at::Tensor& t) {
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    return std::pair<uintptr_t, uintptr_t>(begin, begin + (last + 1) * t.element_size());
  };
  const auto [a0, a1] = range(a);
  const auto [b0, b1] = range(b);
  return a0 < b1 && b0 < a1;
}

void check_no_shared_memory(const std::string& op, const char* what, const at::Tensor& out,
                            std::initializer_list<std::pair<const char*, const at::Tensor*>> inputs) {
  for (const auto& [name, in] : inputs)
    if (in && may_share_memory(out, *in))
      fail(PlanErrorKind::InvalidProblem, op, std::string(what) + " must not share memory with " + name);
}

namespace {
std::atomic<PlanPreference> g_preference{PlanPreference::Fastest};
}

PlanPreference library_preference() { return g_preference.load(); }
void set_library_preference(PlanPreference p) { g_preference.store(p); }

PlanPreference current_preference() {
  const PlanPreference p = g_preference.load();
  if (p == PlanPreference::Fastest && at::globalContext().deterministicAlgorithms())
    return PlanPreference::Deterministic;
  return p;  // "precise" is deterministic too
}

PlanPreference parse_preference(const std::string& s) {
  if (s == "fastest") return PlanPreference::Fastest;
  if (s == "deterministic") return PlanPreference::Deterministic;
  if (s == "precise") return PlanPreference::Precise;
  fail(PlanErrorKind::InvalidProblem, "preference",
       "preference must be 'fastest', 'deterministic' or 'precise', got '" + s + "'");
}

void rethrow(const PlanError& e) {
  switch (e.kind()) {
    case PlanErrorKind::InvalidProblem: C10_THROW_ERROR(ValueError, e.what());
    case PlanErrorKind::IndexOutOfRange: C10_THROW_ERROR(IndexError, e.what());
    case PlanErrorKind::UnsupportedDtype: C10_THROW_ERROR(TypeError, e.what());
    case PlanErrorKind::Unsupported: C10_THROW_ERROR(NotImplementedError, e.what());
    case PlanErrorKind::DeviceMismatch:
    case PlanErrorKind::Internal: C10_THROW_ERROR(Error, e.what());
  }
  C10_THROW_ERROR(Error, e.what());
}

}  // namespace baracuda::torch_ops
