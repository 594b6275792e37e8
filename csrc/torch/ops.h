// The `explain_*` functions behind baracuda_torch.explain: for each public op, the plan
// a call with these arguments would run, selected but not run. Same arguments as the
// op, plus an optional preference ("fastest" | "deterministic") overriding the current
// one.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "torch/common.h"

namespace baracuda::torch_ops {

PlanInfo explain_gated_activation(const at::Tensor& x, const std::string& kind, int64_t dim,
                                  bool gate_first, const std::optional<std::string>& preference);
PlanInfo explain_gated_activation_backward(const at::Tensor& dy, const at::Tensor& x,
                                           const std::string& kind, int64_t dim, bool gate_first,
                                           const std::optional<std::string>& preference);

// ---- rope

// ---- lerp

// ---- gather

// ---- ssd_chunk_scan
PlanInfo explain_ssd_chunk_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                                const std::optional<std::string>& preference);
PlanInfo explain_ssd_chunk_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                         const at::Tensor& dt, const at::Tensor& A,
                                         const at::Tensor& B, const at::Tensor& C,
                                         int64_t chunk_size,
                                         const std::optional<std::string>& preference);

}  // namespace baracuda::torch_ops
