// Every public schema of the baracuda namespace, in one place (docs/ops.md documents each
// op's contract). The kernels for each key live in <family>_ops.cpp.
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

// Every op passes torch.library.opcheck (tests/test_ops.py), so it is tagged as
// working with torch.compile.
#define BARACUDA_DEF(schema) m.def(schema, {at::Tag::pt2_compliant_tag})

TORCH_LIBRARY(baracuda, m) {
  // ---- rope (rope_ops.cpp)
  BARACUDA_DEF(
      "rope(Tensor x, Tensor? positions=None, float base=10000.0, bool interleaved=False, "
      "int rotary_dim=-1) -> Tensor");
  BARACUDA_DEF(
      "rope_backward(Tensor dy, Tensor? positions=None, float base=10000.0, "
      "bool interleaved=False, int rotary_dim=-1) -> Tensor");

  // ---- rope from given cos/sin tables (rope_cos_sin_ops.cpp). Hugging Face's
  // apply_rotary_pos_emb and flash-attention's apply_rotary_emb: cos/sin are [1 or B, S, R]
  // (one entry per feature) or [S, R/2] (one per pair), float32 or the activation dtype;
  // q [B, Hq, S, D] and k [B, Hk, S, D] (any strides) are rotated in one launch. Each
  // backward is the transpose (dx from dy); cos/sin get gradients when they require them.
  BARACUDA_DEF("rope_cos_sin(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor");
  BARACUDA_DEF(
      "rope_cos_sin_backward(Tensor dy, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor");
  BARACUDA_DEF(
      "rope_qk_cos_sin(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved=False) "
      "-> (Tensor, Tensor)");
  BARACUDA_DEF(
      "rope_qk_cos_sin_backward(Tensor dq, Tensor dk, Tensor cos, Tensor sin, "
      "bool interleaved=False) -> (Tensor, Tensor)");

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
