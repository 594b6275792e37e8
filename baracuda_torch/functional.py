"""Typed, documented wrappers over ``torch.ops.baracuda.*``.

Every function here is differentiable (its backward runs the matching ``*_backward``
op), works on CPU and CUDA tensors of float32, float16, bfloat16 and float64 (half types
compute in float32), accepts any strides, and traces under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__: list = []

# ---- gated activations ----------------------------------------------------------

__all__ += ["gated_activation", "glu", "reglu", "swiglu", "geglu"]

GatedKind = Literal["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]


def gated_activation(x: Tensor, kind: GatedKind, dim: int = -1, gate_first: bool = False) -> Tensor:
    """Gated activation ``a * gate(b)`` where ``x`` splits along ``dim`` into halves ``(a, b)``.

    Args:
        x: input; ``x.size(dim)`` must be even.
        kind: ``"glu"`` (σ(b)), ``"reglu"`` (max(b, 0)), ``"swiglu"`` (b·σ(b)),
            ``"geglu"`` (exact GELU, b·Φ(b)) or ``"geglu_tanh"`` (tanh-approximated GELU).
        dim: the dimension to split (negative counts from the end).
        gate_first: if True the *first* half is the gate: ``gate(x1) * x2``, the
            ``silu(gate) * up`` convention of LLaMA-style fused gate/up projections.
            The default (False) is ``torch.nn.functional.glu``'s convention.

    Returns:
        A new contiguous tensor of ``x``'s shape with ``size(dim)`` halved.

    Raises:
        ValueError: odd ``x.size(dim)``, unknown ``kind``, 0-dim ``x``.
        IndexError: ``dim`` out of range.
        TypeError: non-floating ``x``.
    """
    return torch.ops.baracuda.gated_activation(x, kind, dim, gate_first)


def glu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """GLU: ``a * sigmoid(b)``, same as ``torch.nn.functional.glu(x, dim)``."""
    return gated_activation(x, "glu", dim, gate_first)


def reglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """ReGLU: ``a * relu(b)`` (NaN in ``b`` propagates, as in ``torch.relu``)."""
    return gated_activation(x, "reglu", dim, gate_first)


def swiglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """SwiGLU: ``a * silu(b)``; with ``gate_first=True``, ``silu(gate) * up`` for ``x = [gate, up]``."""
    return gated_activation(x, "swiglu", dim, gate_first)


def geglu(x: Tensor, dim: int = -1, approximate: Literal["none", "tanh"] = "none",
          gate_first: bool = False) -> Tensor:
    """GeGLU: ``a * gelu(b)``; ``approximate`` as in ``torch.nn.functional.gelu``.

    Raises:
        ValueError: ``approximate`` other than ``"none"`` or ``"tanh"``.
    """
    if approximate == "none":
        return gated_activation(x, "geglu", dim, gate_first)
    if approximate == "tanh":
        return gated_activation(x, "geglu_tanh", dim, gate_first)
    raise ValueError(f"baracuda_torch.geglu: approximate must be 'none' or 'tanh', got {approximate!r}")


# ---- rope -------------------------------------------------------------------------


# ---- lerp -------------------------------------------------------------------------

__all__ += ["lerp"]


def lerp(a: Tensor, b: Tensor, weight: float | Tensor) -> Tensor:
    """Linear interpolation ``a + weight * (b - a)``, as ``torch.lerp(a, b, weight)``.

    Evaluated with PyTorch's two-branch form, exact at both ends and free of the
    cancellation of ``a + w·(b − a)`` near ``w = 1``::

        |w| < 0.5 ?  a + w·(b − a)  :  b − (b − a)·(1 − w)

    in float32 (float64 for float64 data). Weights outside ``[0, 1]`` extrapolate.

    Args:
        a: start values.
        b: end values; ``a`` and ``b`` broadcast against each other (NumPy rules).
        weight: a Python number (no gradient flows to it), or a tensor that broadcasts
            with ``a`` and ``b`` and receives the gradient ``dy·(b − a)``, summed down
            to its own shape.

    Gradients: ``da = (1 − w)·dy`` and ``db = w·dy`` (and ``dw``), computed by one
    kernel in one pass and summed down to each input's shape where it was broadcast.
    With a scalar weight the second derivative is supported too.

    Returns:
        A new contiguous tensor of the broadcast shape and the inputs' dtype.

    Raises:
        ValueError: shapes that do not broadcast.
        TypeError: a non-floating dtype, or inputs of different dtypes.
        RuntimeError: inputs on different devices.
    """
    if isinstance(weight, Tensor):
        return torch.ops.baracuda.lerp.Tensor(a, b, weight)
    return torch.ops.baracuda.lerp.default(a, b, float(weight))


# ---- gather -----------------------------------------------------------------------


# ---- ssd_chunk_scan ---------------------------------------------------------------
