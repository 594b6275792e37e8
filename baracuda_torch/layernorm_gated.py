"""mamba_ssm's gated RMSNorm (its ``ops.triton.layernorm_gated`` module, RMSNorm path) with
the same names, signatures, defaults and parameter names, on
``torch.ops.baracuda.gated_rms_norm``: switch by import.

* ``rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True)``
* ``RMSNorm(hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None,
  dtype=None)`` with ``forward(x, z=None)``; parameter ``weight`` (ones), no ``bias``
  (registered as None), so state dicts load either way.

With groups of ``group_size`` channels (all of them when None), each normalized by its
own rstd in float32 (float64 for float64 x): ``norm_before_gate`` gives
``rmsnorm(x)·w (+ b) · silu(z)``, otherwise ``rmsnorm(x·silu(z))·w (+ b)``; the result
has x's dtype (:func:`baracuda_torch.gated_rms_norm` has the whole contract).

Differences from mamba_ssm: z must have x's dtype, the weight x's dtype or float32 and
the bias the weight's dtype (``TypeError`` otherwise; mamba_ssm converts whatever it is
given to float32); float64 inputs are computed in float64; any group size and any
strides run (no 64 KB limit, no copies); no LayerNorm path (``layernorm_fn``,
``LayerNorm``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)

__all__ = ["rmsnorm_fn", "RMSNorm"]


def rmsnorm_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor], z: Optional[Tensor] = None,
               eps: float = 1e-6, group_size: Optional[int] = None,
               norm_before_gate: bool = True) -> Tensor:
    """mamba_ssm's ``rmsnorm_fn``: the gated RMSNorm over groups of ``group_size``
    channels of x's last dim (see the module docstring), differentiable in x, weight,
    bias and z."""
    return torch.ops.baracuda.gated_rms_norm(x, weight, bias, z, eps, group_size, norm_before_gate)[0]


class RMSNorm(nn.Module):
    """mamba_ssm's gated ``RMSNorm`` module: ``forward(x, z=None)`` normalizes groups of
    ``group_size`` channels (None: all ``hidden_size`` of them), gated by ``silu(z)``
    after the norm (``norm_before_gate``) or before it."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = True, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Ones, as mamba_ssm."""
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor, z: Optional[Tensor] = None) -> Tensor:
        return rmsnorm_fn(x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
                          norm_before_gate=self.norm_before_gate)
