"""Pure-PyTorch references: the single source of truth for tests and benchmarks.

Each function computes what the matching ``baracuda_torch.functional`` op computes,
with plain PyTorch ops (so its gradients come from PyTorch's autograd). Run them on
float64 inputs for a ground truth, or on the op's own dtype for "what PyTorch gives".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# ---- gated activations ----------------------------------------------------------


def gated_activation(x: Tensor, kind: str, dim: int = -1, gate_first: bool = False) -> Tensor:
    a, b = x.chunk(2, dim)
    if gate_first:
        a, b = b, a
    if kind == "glu":
        gate = torch.sigmoid(b)
    elif kind == "reglu":
        gate = F.relu(b)
    elif kind == "swiglu":
        gate = F.silu(b)
    elif kind == "geglu":
        gate = F.gelu(b)
    elif kind == "geglu_tanh":
        gate = F.gelu(b, approximate="tanh")
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return a * gate


# ---- rope -------------------------------------------------------------------------


# ---- lerp -------------------------------------------------------------------------


# ---- gather -----------------------------------------------------------------------


def gather(src: Tensor, dim: int, index: Tensor) -> Tensor:
    return torch.gather(src, dim, index)


# ---- ssd_chunk_scan ---------------------------------------------------------------
