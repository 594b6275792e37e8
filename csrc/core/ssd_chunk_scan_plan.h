// Mamba-2 SSD chunk scan: y = ssd_chunk_scan(x, dt, A, B, C, chunk_size) and its backward
// dy -> (dx, ddt, dA, dB, dC).
//
//   x, y [B, L, H, D]   dt [B, L, H]   A [H]   B, C [B, L, G, N], H % G == 0
//
// Per batch b and head h (group g = h / (H/G)), with h_{-1} = 0:
//   decay_t = exp(dt_t · A_h),  h_t = decay_t · h_{t-1} + dt_t · x_t ⊗ B_t,
//   y_t[d]  = Σ_n C_t[n] · h_t[d, n]
// (kernels/ssd_chunk_scan.h gives the backward's formulas with the kernels).
//
// Variants: "sequential" (CPU: the exact recurrence in float64), "chunked" (CUDA: the
// state-space-duality algorithm, float32 math, float64 for float64), "chunked_mma"
// (CUDA, float16/bfloat16 on sm_80+: the same algorithm with its tile products on
// tensor cores, float32 accumulation, operands in the input dtype: the inputs exactly,
// and the intermediates that feed a product (P = C·Bᵀ∘decay, decay-weighted x and dy,
// the float32 chunk states) rounded to it once, as mamba_ssm does), and "zeros" when
// an extent among B, L, H, D, N is 0: then every output is empty or identically zero
// (a sum over an empty state), nothing is launched and the caller zero-fills the
// outputs (see zero_fill_outputs()).
#pragma once

#include <array>
#include <string>

#include "core/plan.h"
#include "kernels/ssd_chunk_scan.h"

namespace baracuda {

// Largest D and N the CUDA kernels are wired for (the CPU has no limit).
constexpr int64_t kSsdCudaMaxDim = 256;

// One operand of the problem as the shared checks see it: dtype and sizes (int64_t, or
// c10::SymInt in a meta kernel).
template <class Int>
struct SsdOperand {
  const char* name;
  ElementKind dtype;
  int rank;
  const Int* sizes;
};

template <class Int>
struct SsdSizes {
  Int batch, seqlen, heads, head_dim, groups, state_dim;
};

namespace ssd_detail {
template <class Int>
std::string shape_of(const SsdOperand<Int>& t) {
  return sizes_str(t.sizes, t.rank);
}
template <class Int>
void check_floating(const std::string& op, const SsdOperand<Int>& t) {
  if (!is_floating(t.dtype))
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string(t.name) + " must be float32, float16, bfloat16 or float64, got " +
             element_name(t.dtype));
}
}  // namespace ssd_detail

// Problem checks shared by the plans and the shape-only (meta) kernels, so that a
// compiled graph rejects what eager execution rejects. `cuda` is true when the problem
// is known to run on CUDA (false on the CPU and in meta kernels, where the device is
// not known): only then are D and N limited to kSsdCudaMaxDim.
template <class Int>
SsdSizes<Int> check_ssd_problem(const std::string& op, const SsdOperand<Int>& x,
                                const SsdOperand<Int>& dt, const SsdOperand<Int>& A,
                                const SsdOperand<Int>& B, const SsdOperand<Int>& C,
                                int64_t chunk_size, bool cuda) {
  using ssd_detail::shape_of;
  for (const SsdOperand<Int>* t : {&x, &dt, &A, &B, &C}) ssd_detail::check_floating(op, *t);
  for (const SsdOperand<Int>* t : {&dt, &A, &B, &C})
    if (t->dtype != x.dtype)
      fail(PlanErrorKind::UnsupportedDtype, op,
           std::string("x and ") + t->name + " must have the same dtype, got " +
               element_name(x.dtype) + " and " + element_name(t->dtype));

  if (x.rank != 4)
    fail(PlanErrorKind::InvalidProblem, op,
         "x must have shape [B, L, H, D] (4 dims), got " + shape_of(x));
  const Int* xs = x.sizes;
  const std::string bl = size_str(xs[0]) + ", " + size_str(xs[1]);
  if (dt.rank != 3 || dt.sizes[0] != xs[0] || dt.sizes[1] != xs[1] || dt.sizes[2] != xs[2])
    fail(PlanErrorKind::InvalidProblem, op,
         "dt must have shape [B, L, H] = [" + bl + ", " + size_str(xs[2]) + "], got " +
             shape_of(dt));
  if (A.rank != 1 || A.sizes[0] != xs[2])
    fail(PlanErrorKind::InvalidProblem, op,
         "A must have shape [H] = [" + size_str(xs[2]) + "], got " + shape_of(A));
  if (B.rank != 4 || B.sizes[0] != xs[0] || B.sizes[1] != xs[1])
    fail(PlanErrorKind::InvalidProblem, op,
         "B must have shape [B, L, G, N] = [" + bl + ", G, N], got " + shape_of(B));
  bool same = C.rank == 4;
  for (int d = 0; same && d < 4; ++d) same = C.sizes[d] == B.sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "C must have B's shape " + shape_of(B) + ", got " + shape_of(C));

  const Int& H = xs[2];
  const Int& G = B.sizes[2];
  // G == 0 is only consistent with H == 0 (no heads, nothing to read).
  if (G == 0 ? H != 0 : H % G != 0)
    fail(PlanErrorKind::InvalidProblem, op,
         "the number of heads H = x.size(2) must be a multiple of the number of groups "
         "G = B.size(2), got H = " +
             size_str(H) + " and G = " + size_str(G));
  if (chunk_size < 1)
    fail(PlanErrorKind::InvalidProblem, op,
         "chunk_size must be at least 1, got " + std::to_string(chunk_size));
  if (cuda && (xs[3] > kSsdCudaMaxDim || B.sizes[3] > kSsdCudaMaxDim))
    fail(PlanErrorKind::Unsupported, op,
         "D and N up to " + std::to_string(kSsdCudaMaxDim) +
             " are wired on CUDA (the CPU has no limit), got D = " + size_str(xs[3]) +
             " and N = " + size_str(B.sizes[3]));
  return {xs[0], xs[1], xs[2], xs[3], B.sizes[2], B.sizes[3]};
}

// dy must have x's shape and dtype.
template <class Int>
void check_ssd_dy(const std::string& op, const SsdOperand<Int>& x, const SsdOperand<Int>& dy) {
  bool same = dy.rank == x.rank;
  for (int d = 0; same && d < x.rank; ++d) same = dy.sizes[d] == x.sizes[d];
  if (!same)
    fail(PlanErrorKind::InvalidProblem, op,
         "dy must have x's shape " + ssd_detail::shape_of(x) + ", got " +
             ssd_detail::shape_of(dy));
  if (dy.dtype != x.dtype)
    fail(PlanErrorKind::UnsupportedDtype, op,
         std::string("dy must have x's dtype ") + element_name(x.dtype) + ", got " +
             element_name(dy.dtype));
}

struct SsdChunkScanDescriptor {
  TensorLayout x, dt, A, B, C;
  int64_t chunk_size = 256;
  DeviceInfo device;
};

struct SsdChunkScanBackwardDescriptor {
  SsdChunkScanDescriptor forward;
  TensorLayout dy;
};

struct SsdChunkScanArgs {
  TensorRef x, dt, A, B, C;
  MutTensorRef y;
};

struct SsdChunkScanBackwardArgs {
  TensorRef dy, x, dt, A, B, C;
  MutTensorRef dx, ddt, dA, dB, dC;
};

enum class SsdVariant : uint8_t { Sequential, Chunked, Zeros };

class SsdChunkScanPlan {
 public:
  static SsdChunkScanPlan select(const SsdChunkScanDescriptor& desc, PlanPreference pref);
  // y's layout: x's sizes, contiguous.
  const TensorLayout& output_layout() const { return out_; }
  // True for the "zeros" variant: run() launches nothing and y must be zero-filled by
  // the caller (y is empty, or N == 0 and y is a sum over an empty state).
  bool zero_fill_outputs() const { return variant_ == SsdVariant::Zeros; }
  void can_implement(const SsdChunkScanArgs& args) const;
  size_t workspace_size() const { return workspace_; }
  const KernelSku& sku() const { return sku_; }
  const PrecisionGuarantee& precision_guarantee() const { return sku_.precision; }
  void run(void* stream, Workspace workspace, const SsdChunkScanArgs& args) const;

 private:
  SsdChunkScanDescriptor desc_;
  SsdVariant variant_ = SsdVariant::Sequential;
  TensorLayout out_;
  SsdChunkScanLaunch launch_;
  size_t kernel_workspace_ = 0;  // what the kernel needs
  size_t workspace_ = 0;         // ... plus slack to align it
  KernelSku sku_;
};

class SsdChunkScanBackwardPlan {
 public:
  static SsdChunkScanBackwardPlan select(const SsdChunkScanBackwardDescriptor& desc,
                                         PlanPreference pref);
  // Layouts of (dx, ddt, dA, dB, dC): the shapes of (x, dt, A, B, C), contiguous.
  const std::array<TensorLayout, 5>& output_layouts() const { return out_; }
  // True for the "zeros" variant: every gradient is empty or identically zero, run()
  // launches nothing and the caller zero-fills the outputs.
  bool zero_fill_outputs() const { return variant_ == SsdVariant::Zeros; }
  void can_implement(const SsdChunkScanBackwardArgs& args) const;
  // O(B·H·⌈L/Q⌉·D·N): states at chunk boundaries, never per-step states.
  size_t workspace_size() const { return workspace_; }
  const KernelSku& sku() const { return sku_; }
  const PrecisionGuarantee& precision_guarantee() const { return sku_.precision; }
  void run(void* stream, Workspace workspace, const SsdChunkScanBackwardArgs& args) const;

 private:
  SsdChunkScanBackwardDescriptor desc_;
  SsdVariant variant_ = SsdVariant::Sequential;
  std::array<TensorLayout, 5> out_;
  SsdChunkScanLaunch launch_;
  size_t kernel_workspace_ = 0;  // what the kernel needs
  size_t workspace_ = 0;         // ... plus slack to align it
  KernelSku sku_;
};

}  // namespace baracuda
