// What module.cpp binds besides the declared ops (torch/op_def.h, whose explain is
// served from their declaration): gather's CUDA index-error checks.
#pragma once

#include <cstdint>
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

}  // namespace baracuda::torch_ops
