"""``torch.nn`` modules built on the baracuda ops."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import functional as bf
from .functional import GatedKind

__all__ = ["GatedActivation", "GatedMLP"]  # each family adds its modules below


class GatedActivation(nn.Module):
    """``a * gate(b)`` over halves of the input's ``dim``; see :func:`baracuda_torch.gated_activation`."""

    def __init__(self, kind: GatedKind = "swiglu", dim: int = -1, gate_first: bool = False) -> None:
        super().__init__()
        self.kind = kind
        self.dim = dim
        self.gate_first = gate_first

    def forward(self, x: Tensor) -> Tensor:
        return bf.gated_activation(x, self.kind, self.dim, self.gate_first)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, dim={self.dim}, gate_first={self.gate_first}"


class GatedMLP(nn.Module):
    """Transformer feed-forward block ``down(act(up_gate(x)))`` with one fused up/gate
    projection to ``2 * hidden_features`` and a baracuda gated activation.

    With ``gate_first=True`` (the default, as in LLaMA-style checkpoints) the first half
    of the projection is the gate: ``down(silu(x @ W_gate) * (x @ W_up))``.
    """

    def __init__(self, in_features: int, hidden_features: int, out_features: Optional[int] = None,
                 kind: GatedKind = "swiglu", gate_first: bool = True, bias: bool = False,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.up_gate = nn.Linear(in_features, 2 * hidden_features, bias=bias, **factory)
        self.act = GatedActivation(kind, dim=-1, gate_first=gate_first)
        self.down = nn.Linear(hidden_features, out_features or in_features, bias=bias, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up_gate(x)))


# ---- rope -------------------------------------------------------------------------


# ---- ssd_chunk_scan ---------------------------------------------------------------
