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
    """Transformer feed-forward block with a gated activation, laid out as Hugging Face's
    LLaMA/Mistral/Qwen/Gemma MLPs so their checkpoints load as they are::

        forward(x) = down_proj(gated_activation_pair(gate_proj(x), up_proj(x), kind))
                   = down_proj(act(gate_proj(x)) * up_proj(x))

    Parameters (``nn.Linear`` each, with a bias only when ``bias=True``):
    ``gate_proj`` (in_features -> hidden_features), ``up_proj`` (in_features ->
    hidden_features) and ``down_proj`` (hidden_features -> out_features), so
    ``load_state_dict`` takes the ``mlp.*`` entries of such a checkpoint (``kind="swiglu"``
    for ``hidden_act="silu"``, ``"geglu_tanh"`` for ``"gelu_pytorch_tanh"``, ``"geglu"``
    for ``"gelu"``). The activation is :func:`baracuda_torch.gated_activation_pair`: one
    fused pass over the two projections, forward and backward.

    Args:
        in_features: model width.
        hidden_features: intermediate width.
        out_features: output width (``in_features`` when None).
        kind: ``"swiglu"``, ``"geglu"``, ``"geglu_tanh"``, ``"reglu"`` or ``"glu"``.
        bias: give the three projections a bias.
        device, dtype: for the parameters.
    """

    def __init__(self, in_features: int, hidden_features: int, out_features: Optional[int] = None,
                 kind: GatedKind = "swiglu", bias: bool = False,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if kind not in ("glu", "reglu", "swiglu", "geglu", "geglu_tanh"):
            raise ValueError("baracuda_torch.nn.GatedMLP: kind must be one of 'glu', 'reglu', "
                             f"'swiglu', 'geglu', 'geglu_tanh', got {kind!r}")
        factory = {"device": device, "dtype": dtype}
        self.kind = kind
        self.gate_proj = nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.up_proj = nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.down_proj = nn.Linear(hidden_features, out_features or in_features, bias=bias, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(bf.gated_activation_pair(self.gate_proj(x), self.up_proj(x), self.kind))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


# ---- rope -------------------------------------------------------------------------
import math  # noqa: E402

__all__ += ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding of queries and keys; see :func:`baracuda_torch.rope`.

    ``forward(q, k, positions=None)`` takes ``q`` ``[B, Hq, S, head_dim]`` and ``k``
    ``[B, Hk, S, head_dim]`` (any strides: ``[B, S, H, D]`` projections may be passed as
    ``.transpose(1, 2)`` without a copy) and returns the rotated ``(q, k)``. There are no
    parameters or buffers: the angles are computed in the kernel.

    Args:
        head_dim: ``D``.
        base: frequency base (finite, > 0).
        interleaved: pairs ``(2i, 2i+1)`` (True) or ``(i, i + R/2)`` (False, the
            ``rotate_half`` convention of LLaMA-style checkpoints).
        rotary_dim: number of rotated features ``R`` (even, ``<= head_dim``); None for all.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = True,
                 rotary_dim: Optional[int] = None) -> None:
        super().__init__()
        R = head_dim if rotary_dim is None else rotary_dim
        if head_dim <= 0 or R <= 0 or R % 2 != 0 or R > head_dim:
            raise ValueError("baracuda_torch.nn.RotaryEmbedding: need 0 < rotary_dim <= head_dim "
                             f"with rotary_dim even, got head_dim={head_dim}, rotary_dim={rotary_dim}")
        if not (math.isfinite(base) and base > 0):
            raise ValueError(f"baracuda_torch.nn.RotaryEmbedding: base must be finite and > 0, got {base}")
        self.head_dim = head_dim
        self.base = float(base)
        self.interleaved = interleaved
        self.rotary_dim = rotary_dim

    def forward(self, q: Tensor, k: Tensor, positions: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"baracuda_torch.nn.RotaryEmbedding: expected head_dim {self.head_dim}, "
                             f"got q of shape {list(q.shape)}")
        return bf.rope_qk(q, k, positions, self.base, self.interleaved, self.rotary_dim)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, base={self.base}, interleaved={self.interleaved}, "
                f"rotary_dim={self.rotary_dim}")



# ---- ssd_chunk_scan ---------------------------------------------------------------

import math as _math  # noqa: E402
from typing import Callable, Tuple  # noqa: E402

import torch.nn.functional as _F  # noqa: E402

__all__ += ["Mamba2SSDMixer"]


class Mamba2SSDMixer(nn.Module):
    """A minimal Mamba-2 mixer layer (the block of Mamba-2 that replaces attention) on
    :func:`baracuda_torch.ssd_chunk_scan`.

    With ``d_inner = expand · d_model``, ``H = d_inner // headdim`` heads, ``G = ngroups``
    and ``N = d_state``, for ``u`` of shape ``[B, L, d_model]``::

        z, xBC, dt = in_proj(u)            split into d_inner, d_inner + 2·G·N, H
        xBC = silu(conv1d(xBC))            causal depthwise conv over L (d_conv taps;
                                           skipped when d_conv = 0)
        x, B, C = xBC                      split; x [B, L, H, headdim], B, C [B, L, G, N]
        dt = softplus(dt + dt_bias);  A = -exp(A_log)
        y = ssd_chunk_scan(x, dt, A, B, C, chunk_size) + D · x
        y = y · silu(z);  y = RMSNorm(y)   (per group of d_inner / G channels; optional)
        out = out_proj(y)

    Parameters are initialised as in Mamba-2: ``dt_bias`` so that ``softplus(dt_bias)``
    is log-uniform in ``[dt_min, dt_max]``, ``A_log = log(U[A_init_range])``, ``D = 1``.
    x, B and C reach the scan as strided slices of one tensor, without copies. The scan
    takes one dtype: dt and A are cast to x's dtype (so the layer also runs under
    autocast). Left out of this minimal layer: initial states, ``seq_idx`` packing,
    ``dt_limit`` and the inference cache.

    ``scan`` replaces the scan function (same signature as
    :func:`baracuda_torch.ssd_chunk_scan`), for example
    :func:`baracuda_torch.reference.ssd_chunk_scan` to check the layer against PyTorch.
    """

    def __init__(self, d_model: int, d_state: int = 64, headdim: int = 64, ngroups: int = 1,
                 expand: int = 2, chunk_size: int = 256, d_conv: int = 4, rmsnorm: bool = True,
                 norm_eps: float = 1e-5, dt_min: float = 0.001, dt_max: float = 0.1,
                 A_init_range: Tuple[float, float] = (1.0, 16.0), bias: bool = False,
                 conv_bias: bool = True, scan: Optional[Callable[..., Tensor]] = None,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        d_inner = expand * d_model
        if d_inner % headdim != 0:
            raise ValueError(f"Mamba2SSDMixer: expand * d_model = {d_inner} must be a multiple of "
                             f"headdim = {headdim}")
        nheads = d_inner // headdim
        if nheads % ngroups != 0:
            raise ValueError(f"Mamba2SSDMixer: the number of heads {nheads} must be a multiple of "
                             f"ngroups = {ngroups}")
        self.d_model, self.d_state, self.headdim, self.ngroups = d_model, d_state, headdim, ngroups
        self.d_inner, self.nheads, self.chunk_size, self.d_conv = d_inner, nheads, chunk_size, d_conv
        self.norm_eps = norm_eps
        self.scan = scan if scan is not None else bf.ssd_chunk_scan
        conv_dim = d_inner + 2 * ngroups * d_state
        self.in_proj = nn.Linear(d_model, d_inner + conv_dim + nheads, bias=bias, **factory)
        self.conv1d = (nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1,
                                 bias=conv_bias, **factory) if d_conv > 0 else None)
        dt = torch.exp(torch.rand(nheads) * (_math.log(dt_max) - _math.log(dt_min))
                       + _math.log(dt_min)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(**factory))  # softplus⁻¹
        self.A_log = nn.Parameter(torch.log(torch.empty(nheads).uniform_(*A_init_range)).to(**factory))
        self.D = nn.Parameter(torch.ones(nheads, **factory))
        self.norm_weight = nn.Parameter(torch.ones(d_inner, **factory)) if rmsnorm else None
        self.out_proj = nn.Linear(d_inner, d_model, bias=bias, **factory)

    def forward(self, u: Tensor) -> Tensor:
        batch, L, _ = u.shape
        H, P, G, N = self.nheads, self.headdim, self.ngroups, self.d_state
        z, xBC, dt = torch.split(self.in_proj(u), [self.d_inner, self.d_inner + 2 * G * N, H], dim=-1)
        if self.conv1d is not None:
            # Causal: pad both ends, keep the first L outputs. One copy back to [B, L, C]
            # so that x, B and C below are unit-stride slices (coalesced on CUDA).
            xBC = _F.silu(self.conv1d(xBC.transpose(1, 2))[..., :L]).transpose(1, 2).contiguous()
        x, B, C = torch.split(xBC, [self.d_inner, G * N, G * N], dim=-1)
        x = x.unflatten(-1, (H, P))
        B = B.unflatten(-1, (G, N))
        C = C.unflatten(-1, (G, N))
        dt = _F.softplus(dt + self.dt_bias).to(x.dtype)
        A = -torch.exp(self.A_log).to(x.dtype)
        y = self.scan(x, dt, A, B, C, self.chunk_size)
        y = (y + x * self.D.to(x.dtype)[:, None]).flatten(-2)
        y = y * _F.silu(z)
        if self.norm_weight is not None:
            yg = y.float().unflatten(-1, (G, -1))
            yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + self.norm_eps)
            y = (yg.flatten(-2) * self.norm_weight.float()).to(y.dtype)
        return self.out_proj(y)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, headdim={self.headdim}, "
                f"nheads={self.nheads}, ngroups={self.ngroups}, chunk_size={self.chunk_size}, "
                f"d_conv={self.d_conv}, rmsnorm={self.norm_weight is not None}")

