// Every public schema of the baracuda namespace, in one place (SPEC.md). The kernels for
// each key live in <family>_ops.cpp.
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

// Every op passes torch.library.opcheck (tests/test_opcheck.py), so it is tagged as
// working with torch.compile.
#define BARACUDA_DEF(schema) m.def(schema, {at::Tag::pt2_compliant_tag})

TORCH_LIBRARY(baracuda, m) {
  BARACUDA_DEF("gated_activation(Tensor x, str kind, int dim=-1, bool gate_first=False) -> Tensor");
  BARACUDA_DEF(
      "gated_activation_backward(Tensor dy, Tensor x, str kind, int dim=-1, "
      "bool gate_first=False) -> Tensor");

  // ---- gated_activation_pair (gated_activation_ops.cpp): act(gate) * up with gate and up
  // separate tensors of one shape (HF's act(gate_proj(x)) * up_proj(x)); the backward
  // returns (dgate, dup).
  BARACUDA_DEF("gated_activation_pair(Tensor gate, Tensor up, str kind) -> Tensor");
  BARACUDA_DEF(
      "gated_activation_pair_backward(Tensor dy, Tensor gate, Tensor up, str kind) -> "
      "(Tensor, Tensor)");

  // ---- rope (rope_ops.cpp)
  BARACUDA_DEF(
      "rope(Tensor x, Tensor? positions=None, float base=10000.0, bool interleaved=True, "
      "int rotary_dim=-1) -> Tensor");
  BARACUDA_DEF(
      "rope_backward(Tensor dy, Tensor? positions=None, float base=10000.0, "
      "bool interleaved=True, int rotary_dim=-1) -> Tensor");

  // ---- lerp (lerp_ops.cpp)
  BARACUDA_DEF("lerp(Tensor a, Tensor b, float weight) -> Tensor");
  BARACUDA_DEF("lerp_backward(Tensor dy, float weight) -> (Tensor, Tensor)");
  BARACUDA_DEF("lerp.Tensor(Tensor a, Tensor b, Tensor weight) -> Tensor");
  // Added overload: the tensor-weight backward, (da, db, dw) at dy's shape in one pass.
  BARACUDA_DEF(
      "lerp_backward.Tensor(Tensor dy, Tensor a, Tensor b, Tensor weight) -> "
      "(Tensor, Tensor, Tensor)");

  // ---- gather (gather_ops.cpp)
  BARACUDA_DEF("gather(Tensor src, int dim, Tensor index) -> Tensor");
  BARACUDA_DEF("gather_backward(Tensor dout, int dim, Tensor index, SymInt[] src_sizes) -> Tensor");

  // ---- ssd_chunk_scan (ssd_chunk_scan_ops.cpp)
  BARACUDA_DEF(
      "ssd_chunk_scan(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size=256) "
      "-> Tensor");
  BARACUDA_DEF(
      "ssd_chunk_scan_backward(Tensor dy, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "int chunk_size=256) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}
