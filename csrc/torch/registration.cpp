// The baracuda library (TORCH_LIBRARY: exactly once). Every family defines its ops next to
// its kernels, in a TORCH_LIBRARY_FRAGMENT of its <family>_ops.cpp (torch/op_def.h);
// docs/ops.md documents every op's contract.
#include <torch/library.h>

TORCH_LIBRARY(baracuda, m) {}
