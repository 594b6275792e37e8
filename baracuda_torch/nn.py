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
        interleaved: pairs ``(i, i + R/2)`` (False, the default: the ``rotate_half``
            convention of LLaMA-style checkpoints) or ``(2i, 2i+1)`` (True).
        rotary_dim: number of rotated features ``R`` (even, ``<= head_dim``); None for all.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False,
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



# ---- rms_norm ---------------------------------------------------------------------
import numbers  # noqa: E402
from typing import Sequence, Tuple, Union  # noqa: E402

from .functional import RmsNormConvention  # noqa: E402

__all__ += ["RMSNorm"]


class RMSNorm(nn.Module):
    """Drop-in for :class:`torch.nn.RMSNorm` on :func:`baracuda_torch.rms_norm`: the same
    constructor, attributes (``normalized_shape``, ``eps``, ``elementwise_affine``) and
    parameter (``weight``, ones), so its state dict is torch's; one fused pass forward and
    backward.

    ``forward(x)`` returns the normalized ``x``; ``forward(x, residual)`` normalizes
    ``h = x + residual`` and returns ``(y, h)`` (the residual add of a decoder layer fused
    in).

    Args:
        normalized_shape: the trailing shape to normalize over (an int for the last dim).
        eps: added to the mean square; None for the compute dtype's machine epsilon
            (torch's default).
        elementwise_affine: give the module a ``weight`` (initialized to ones).
        device, dtype: for the weight.
        convention: keyword only; ``"torch"`` (default: torch.nn.RMSNorm's arithmetic),
            ``"llama"`` or ``"gemma"`` (transformers' LlamaRMSNorm / GemmaRMSNorm
            arithmetic; a gemma checkpoint's weight is the offset from 1, so initialize it
            to zeros, as GemmaRMSNorm does, before loading anything else). See
            :func:`baracuda_torch.rms_norm`.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: Tuple[int, ...]
    eps: Optional[float]
    elementwise_affine: bool

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: Optional[float] = None,
                 elementwise_affine: bool = True, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None, *, convention: RmsNormConvention = "torch") -> None:
        super().__init__()
        if convention not in ("torch", "llama", "gemma"):
            raise ValueError("baracuda_torch.nn.RMSNorm: convention must be 'torch', 'llama' or "
                             f"'gemma', got {convention!r}")
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.convention = convention
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Ones, as torch.nn.RMSNorm."""
        if self.elementwise_affine:
            nn.init.ones_(self.weight)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        return bf.rms_norm(x, self.normalized_shape, self.weight, self.eps, convention=self.convention,
                           residual=residual)

    def extra_repr(self) -> str:
        extra = "" if self.convention == "torch" else f", convention={self.convention!r}"
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}{extra}")


# ---- ssd_chunk_scan ---------------------------------------------------------------

from .mamba import Mamba2, RMSNormGated  # noqa: E402

__all__ += ["Mamba2", "RMSNormGated", "Mamba2SSDMixer"]

#: The Mamba-2 mixer layer (:class:`baracuda_torch.mamba.Mamba2`, mamba_ssm's
#: interface and parameter names); kept under its former name too.
Mamba2SSDMixer = Mamba2


