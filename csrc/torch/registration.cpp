// The baracuda library (TORCH_LIBRARY: exactly once) and the schemas of the families not
// yet declared through OpDef (the SSD scan). The other families define their ops next to
// their kernels, in a TORCH_LIBRARY_FRAGMENT of their <family>_ops.cpp (torch/op_def.h);
// docs/ops.md documents every op's contract.
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

// Every op passes torch.library.opcheck (tests/test_ops.py), so it is tagged as
// working with torch.compile.
#define BARACUDA_DEF(schema) m.def(schema, {at::Tag::pt2_compliant_tag})

TORCH_LIBRARY(baracuda, m) {
  // ---- ssd_chunk_scan (ssd_chunk_scan_ops.cpp)
  BARACUDA_DEF(
      "ssd_chunk_scan(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size=256) "
      "-> Tensor");
  BARACUDA_DEF(
      "ssd_chunk_scan_backward(Tensor dy, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "int chunk_size=256) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // mamba_ssm's mamba_chunk_scan_combined contract: returns (out, final_states, y_pre);
  // y_pre is the pre-gate output saved for the backward when z is given (an empty
  // tensor otherwise); dt_max=None is +inf.
  BARACUDA_DEF(
      "ssd_chunk_scan_combined(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "int chunk_size=256, Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, "
      "Tensor? initial_states=None, Tensor? seq_idx=None, bool dt_softplus=False, "
      "float dt_min=0., float? dt_max=None, ScalarType? state_dtype=None) "
      "-> (Tensor, Tensor, Tensor)");
  // -> (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states); the last four are
  // empty tensors where their input is None.
  BARACUDA_DEF(
      "ssd_chunk_scan_combined_backward(Tensor dout, Tensor? dfinal_states, Tensor x, "
      "Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D=None, "
      "Tensor? z=None, Tensor? dt_bias=None, Tensor? initial_states=None, "
      "Tensor? seq_idx=None, Tensor? y_pre=None, bool dt_softplus=False, float dt_min=0., "
      "float? dt_max=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
      "Tensor, Tensor)");
}
