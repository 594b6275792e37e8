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


# ---- gather -----------------------------------------------------------------------


# ---- ssd_chunk_scan ---------------------------------------------------------------

__all__ += ["ssd_chunk_scan"]


def ssd_chunk_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   chunk_size: int = 256) -> Tensor:
    """Mamba-2's selective state-space scan (SSD), forward and backward fused.

    For each batch ``b`` and head ``h`` (reading B/C group ``g = h // (H // G)``), with a
    ``D × N`` state ``h_{-1} = 0``::

        decay_t = exp(dt_t · A_h)
        h_t     = decay_t · h_{t-1} + dt_t · x_t ⊗ B_t        # [D, N]
        y_t[d]  = Σ_n C_t[n] · h_t[d, n]

    This is ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size)`` of the
    ``mamba_ssm`` package without its optional ``D``, ``z``, ``dt_bias`` and initial
    states (add the ``D·x`` skip and the gate outside; see
    :class:`baracuda_torch.nn.Mamba2SSDMixer`).

    Args:
        x: ``[B, L, H, D]`` inputs per head.
        dt: ``[B, L, H]`` step sizes, usually positive (``softplus(dt_raw + dt_bias)``).
        A: ``[H]`` per-head decay rates, usually negative (``-exp(A_log)``), so that
            ``decay_t`` lies in ``(0, 1]``.
        B: ``[B, L, G, N]`` input projections of the state, ``H % G == 0``; ``G = 1``
            (one B shared by every head) is Mamba-2's usual layout, ``G = H`` gives
            every head its own.
        C: ``[B, L, G, N]`` output projections, B's shape.
        chunk_size: the chunk length Q of the CUDA kernel's chunked
            (state-space-duality) algorithm: any value ``>= 1``; 64, 128 and 256 are
            the fast ones. It does not change the function computed, only the order of
            the floating-point operations on CUDA (the CPU computes the recurrence
            step by step whatever Q).

    Returns:
        ``y`` of shape ``[B, L, H, D]``, contiguous, in the inputs' dtype.

    Every tensor must have one floating dtype (float32, float16, bfloat16 or
    float64) and be on one device; any strides are accepted without a copy (for
    example x, B, C and dt as slices of one input projection). On CUDA, states and
    accumulation are float32 (float64 for float64 inputs) and D, N <= 256; the CPU
    computes in float64 for every dtype, with no limit on D and N. Both are
    deterministic (the same bits on every run, the backward included) and the
    backward keeps O(B·H·⌈L/Q⌉·D·N) memory (states at chunk boundaries). Gradients
    flow to all five inputs; double backward is not implemented.
    ``baracuda_torch.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size)`` tells
    which kernel runs and its workspace.

    Raises:
        ValueError: a shape that does not match (the message names the tensor, its
            shape and the expected one), ``H % G != 0``, ``chunk_size < 1``.
        TypeError: a non-floating tensor, or tensors of different dtypes.
        RuntimeError: tensors on different devices.
        NotImplementedError: D or N above 256 on CUDA.
    """
    return torch.ops.baracuda.ssd_chunk_scan(x, dt, A, B, C, chunk_size)

