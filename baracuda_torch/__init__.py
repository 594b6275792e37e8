"""baracuda_torch: fused forward and backward training kernels for PyTorch.

Importing the package registers the ops under ``torch.ops.baracuda`` (CPU, CUDA, Meta
and Autograd kernels) and exposes documented wrappers:

* gated activations: :func:`gated_activation`, :func:`glu`, :func:`reglu`,
  :func:`swiglu`, :func:`geglu`; :func:`gated_activation_pair` (``act(gate) * up``); modules :class:`nn.GatedActivation`,
  :class:`nn.GatedMLP`
* rotary position embedding: :func:`rope`, :func:`rope_qk` (angles from positions);
  :func:`rope_cos_sin`, :func:`rope_qk_cos_sin`, :func:`apply_rotary_pos_emb` (caller-given
  cos/sin); module :class:`nn.RotaryEmbedding`
* linear interpolation: :func:`lerp` (scalar or tensor weight, as ``torch.lerp``)
* gather: :func:`gather` (``torch.gather`` semantics), :func:`check_errors`,
  :func:`set_index_checks` (when an out-of-range CUDA index raises)
* RMSNorm: :func:`rms_norm` (torch, LLaMA and Gemma conventions; an optional fused
  residual add), :func:`rms_norm_like` (what a given RMSNorm module computes); module
  :class:`nn.RMSNorm`
* gated RMSNorm (Mamba-2's output norm): :func:`gated_rms_norm`, and
  :mod:`baracuda_torch.layernorm_gated` with mamba_ssm's ``rmsnorm_fn`` and ``RMSNorm``
* causal depthwise conv1d: :func:`causal_depthwise_conv1d`, and
  :mod:`baracuda_torch.causal_conv1d` with the causal-conv1d package's ``causal_conv1d_fn``
  and ``causal_conv1d_update`` (the decoding step)
* Mamba-2: :func:`ssd_chunk_scan`, and :mod:`baracuda_torch.mamba` with mamba_ssm's
  ``mamba_chunk_scan_combined``, ``mamba_split_conv1d_scan_combined`` and ``Mamba2``
  (also :class:`nn.Mamba2`)
* Mamba decoding: :func:`selective_state_update` (mamba_ssm's, in place on the state),
  :func:`selective_state_update_tokens` (T new tokens at once)
* Hugging Face transformers: ``baracuda_torch.integrations.huggingface.apply_baracuda``

Plan introspection: :func:`explain` tells which kernel a call would run and what it
guarantees, without running it; :func:`set_preference` / :func:`preference` choose
between the fastest and the deterministic kernels. Each op's full contract (formulas,
shapes, errors, precision, determinism) is in the repository's ``docs/ops.md``.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)
from . import causal_conv1d, functional, layernorm_gated, mamba, nn, reference
# torch.func rules (grad, vjp, jacrev, jacfwd, vmap) of every op; see _autograd.py.
from . import _grad_gated_activation  # noqa: F401
from . import _grad_gather  # noqa: F401
from . import _grad_lerp  # noqa: F401
from . import _grad_rope  # noqa: F401
from . import _grad_rope_cos_sin  # noqa: F401
from . import _grad_ssd_chunk_scan  # noqa: F401
from . import _grad_ssd_chunk_scan_combined  # noqa: F401
from ._autograd import name_unhooked_ops as _name_unhooked_ops
from ._autograd import register_declared as _register_declared

_register_declared()  # the declared ops no module above hooked: rules from their declarations
_name_unhooked_ops()  # any op still without rules raises an error naming it under torch.func
from ._plan import PlanInfo, explain, get_preference, preference, set_preference
from .functional import *  # noqa: F401,F403  (every wrapper in functional.__all__)

__version__ = "0.1.0"

#: True when the extension was built with its CUDA kernels.
with_cuda: bool = _C.with_cuda

__all__ = [
    "PlanInfo", "explain", "get_preference", "set_preference", "preference", "with_cuda",
    "causal_conv1d", "functional", "layernorm_gated", "mamba", "nn", "reference",
] + functional.__all__
