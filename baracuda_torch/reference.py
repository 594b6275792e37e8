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


def rope_angles(seq_len: int, positions: Tensor | None, rotary_dim: int, base: float,
                device: torch.device | str | None = None) -> Tensor:
    """θ(s, i) = p_s · base^(−2i/R) in float64: ``[S, R/2]``, or ``[B, 1, S, R/2]`` for
    per-batch positions ``[B, S]`` (so it broadcasts against ``[B, H, S, R/2]``)."""
    if positions is None:
        pos = torch.arange(seq_len, dtype=torch.float64, device=device)
    else:
        pos = positions.to(torch.float64)
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=pos.device) / rotary_dim)
    theta = pos[..., None] * inv_freq
    return theta[:, None] if theta.dim() == 3 else theta


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = True) -> Tensor:
    """Rotates the first ``R = 2 * cos.size(-1)`` features of ``x`` by the angles whose
    cosines and sines are given (broadcast against ``x[..., :R // 2]``); the rest pass
    through. Pairs are ``(2i, 2i+1)`` (interleaved) or ``(i, i + R/2)`` (half-split)."""
    R = 2 * cos.shape[-1]
    xr, xp = x[..., :R], x[..., R:]
    if interleaved:
        u, v = xr[..., 0::2], xr[..., 1::2]
        yr = torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2)
    else:
        u, v = xr[..., :R // 2], xr[..., R // 2:]
        yr = torch.cat((u * cos - v * sin, u * sin + v * cos), dim=-1)
    return torch.cat((yr, xp), dim=-1)


def rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0, interleaved: bool = True,
         rotary_dim: int | None = None) -> Tensor:
    """RoPE of ``x`` ``[B, H, S, D]``: cos/sin from float64 angles, cast to ``x``'s dtype,
    rotation in ``x``'s dtype (in float64 this is the ground truth; in a low dtype it is
    what PyTorch itself gives)."""
    R = x.shape[-1] if rotary_dim in (None, -1) else rotary_dim
    theta = rope_angles(x.shape[-2], positions, R, base, x.device)
    return apply_rope(x, theta.cos().to(x.dtype), theta.sin().to(x.dtype), interleaved)


def rope_backward(dy: Tensor, positions: Tensor | None = None, base: float = 10000.0,
                  interleaved: bool = True, rotary_dim: int | None = None) -> Tensor:
    """The gradient of :func:`rope` with respect to ``x``: the rotation by −θ."""
    R = dy.shape[-1] if rotary_dim in (None, -1) else rotary_dim
    theta = rope_angles(dy.shape[-2], positions, R, base, dy.device)
    return apply_rope(dy, theta.cos().to(dy.dtype), -theta.sin().to(dy.dtype), interleaved)


def rotate_half(x: Tensor) -> Tensor:
    """Hugging Face transformers' ``rotate_half``: ``cat(-x2, x1)`` for halves ``(x1, x2)``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_hf(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Hugging Face's ``apply_rotary_pos_emb`` for one tensor (half-split RoPE), with
    ``cos``/``sin`` of shape ``[..., S, R]`` (each angle twice: ``cat(freqs, freqs)``);
    features past ``R`` pass through (partial rotary, as in GPT-NeoX)."""
    R = cos.shape[-1]
    xr, xp = x[..., :R], x[..., R:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


# ---- lerp -------------------------------------------------------------------------


def lerp(a: Tensor, b: Tensor, weight) -> Tensor:
    """``a + weight * (b - a)`` with broadcasting; ``weight`` a number or a tensor.
    PyTorch's own ``torch.lerp`` (its gradients come from PyTorch's autograd)."""
    return torch.lerp(a, b, weight)


# ---- gather -----------------------------------------------------------------------


def gather(src: Tensor, dim: int, index: Tensor) -> Tensor:
    return torch.gather(src, dim, index)


# ---- ssd_chunk_scan ---------------------------------------------------------------
