// What module.cpp binds besides the declared ops (torch/op_def.h, whose explain is
// served from their declaration): gather's CUDA index-error checks, and the `explain_*`
// functions of the SSD scan (the plan a call with these arguments would run, selected
// but not run; the op's arguments plus an optional preference overriding the current
// one).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "torch/common.h"

namespace baracuda::torch_ops {

// ---- gather
// Raises IndexError if a CUDA gather kernel on `device` recorded an out-of-range index
// (and clears the record). Does not synchronize: baracuda_torch.check_errors does that.
void gather_check_errors(int64_t device);
// "async" (default) or "sync": whether CUDA gather ops synchronize after the launch to
// raise an out-of-range index at once. ValueError for anything else.
void set_index_checks(const std::string& mode);
std::string get_index_checks();

// ---- ssd_chunk_scan
PlanInfo explain_ssd_chunk_scan(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                const at::Tensor& B, const at::Tensor& C, int64_t chunk_size,
                                const std::optional<std::string>& preference);
PlanInfo explain_ssd_chunk_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                         const at::Tensor& dt, const at::Tensor& A,
                                         const at::Tensor& B, const at::Tensor& C,
                                         int64_t chunk_size,
                                         const std::optional<std::string>& preference);
PlanInfo explain_ssd_chunk_scan_combined(
    const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
    const at::Tensor& C, int64_t chunk_size, const std::optional<at::Tensor>& D,
    const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& dt_bias,
    const std::optional<at::Tensor>& initial_states, const std::optional<at::Tensor>& seq_idx,
    bool dt_softplus, double dt_min, std::optional<double> dt_max,
    std::optional<at::ScalarType> state_dtype, const std::optional<std::string>& preference);
PlanInfo explain_ssd_chunk_scan_combined_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_states, const at::Tensor& x,
    const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
    int64_t chunk_size, const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& z,
    const std::optional<at::Tensor>& dt_bias, const std::optional<at::Tensor>& initial_states,
    const std::optional<at::Tensor>& seq_idx, const std::optional<at::Tensor>& y_pre,
    bool dt_softplus, double dt_min, std::optional<double> dt_max,
    const std::optional<std::string>& preference);

}  // namespace baracuda::torch_ops
