"""Mamba-2 on baracuda_torch's SSD scan, with mamba_ssm's interface.

* :func:`mamba_chunk_scan_combined`: mamba_ssm's ``mamba_chunk_scan_combined`` (same
  signature and return convention) on ``torch.ops.baracuda.ssd_chunk_scan_combined``.
* :func:`mamba_split_conv1d_scan_combined`: mamba_ssm's fused Mamba-2 block body
  (in_proj output split, causal depthwise conv1d + SiLU, the scan, gated RMSNorm,
  out_proj); the parts outside the scan are PyTorch ops.
* :class:`Mamba2`: the Mamba-2 mixer layer with mamba_ssm's parameter names, shapes and
  initialisation (its ``state_dict`` loads into ``mamba_ssm.modules.mamba2.Mamba2`` and
  back), on :func:`mamba_split_conv1d_scan_combined`.

Differences from mamba_ssm: ``final_states`` are float32 (float64 for float64 inputs)
unless ``state_dtype`` says otherwise (mamba_ssm defaults to C's dtype); the
inference cache (``inference_params``, ``step``) and tensor parallelism
(``process_group``) are not implemented. Context parallelism (the sequence split over
the ranks of a process group, ``cp_group``): :mod:`baracuda_torch.distributed`.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)

__all__ = ["mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "RMSNormGated",
           "Mamba2"]

_INF = float("inf")


def _check_chunk_size(fn: str, chunk_size) -> int:
    """chunk_size as the op takes it: a positive int that fits in int64 (a SymInt passes
    through; the op checks it)."""
    if isinstance(chunk_size, torch.SymInt):
        return chunk_size
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"{fn}: chunk_size must be a positive int that fits in int64, got "
                        f"{type(chunk_size).__name__} {chunk_size!r}")
    if not 1 <= chunk_size < 2 ** 63:
        raise ValueError(f"{fn}: chunk_size must be a positive int that fits in int64, got "
                         f"{chunk_size}")
    return chunk_size


def _check_dt_limit(fn: str, dt_limit) -> Tuple[float, float]:
    """dt_limit as a pair of floats (low, high)."""
    if isinstance(dt_limit, Tensor) or not isinstance(dt_limit, (tuple, list)) or len(dt_limit) != 2:
        raise ValueError(f"{fn}: dt_limit must be a pair (low, high) of floats, got {dt_limit!r}")
    try:
        return float(dt_limit[0]), float(dt_limit[1])
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: dt_limit must be a pair (low, high) of floats, got "
                         f"{dt_limit!r}") from None


def _check_cu_seqlens(cu_seqlens: Tensor, seqlen: int) -> list:
    """cu_seqlens read on the host (the one read the varlen states need), checked: a 1-D
    integer tensor, starting at 0, non-decreasing, ending at L."""
    if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex() \
            or cu_seqlens.dtype == torch.bool:
        raise ValueError("mamba_chunk_scan_combined: cu_seqlens must be a 1-D integer "
                         f"tensor, got {cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    bounds = cu_seqlens.tolist()  # host read: the sequences' extents
    if not bounds or bounds[0] != 0 or bounds[-1] != seqlen \
            or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError("mamba_chunk_scan_combined: cu_seqlens must start at 0, be "
                         f"non-decreasing and end at L = {seqlen}, got {bounds}")
    return bounds


def _scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
          D: Optional[Tensor], z: Optional[Tensor], dt_bias: Optional[Tensor],
          initial_states: Optional[Tensor], seq_idx: Optional[Tensor], dt_softplus: bool,
          dt_limit: Tuple[float, float], state_dtype: Optional[torch.dtype],
          fn: str = "mamba_chunk_scan_combined") -> Tuple[Tensor, Tensor]:
    chunk_size = _check_chunk_size(fn, chunk_size)
    low, high = _check_dt_limit(fn, dt_limit)
    out, final_states, _ = torch.ops.baracuda.ssd_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
        low, high, state_dtype)
    return out, final_states


def _varlen_states(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                   dt_bias: Optional[Tensor], initial_states: Optional[Tensor],
                   bounds: list, dt_softplus: bool, dt_limit: Tuple[float, float],
                   state_dtype: Optional[torch.dtype]) -> Tensor:
    """The final state of each packed sequence [bounds[i], bounds[i+1]) (``cu_seqlens``,
    checked), from its own tokens (the first one from ``initial_states``): one forward
    scan per sequence."""
    states = []
    with torch.no_grad():
        for i in range(len(bounds) - 1):
            s, e = bounds[i], bounds[i + 1]
            _, st = _scan(x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], chunk_size, None, None,
                          dt_bias, initial_states if i == 0 else None, None, dt_softplus,
                          dt_limit, state_dtype)
            states.append(st[0])
    if not states:
        return x.new_empty(0, x.size(2), x.size(3), B.size(3),
                           dtype=state_dtype or (torch.float64 if x.dtype == torch.float64
                                                 else torch.float32))
    return torch.stack(states)


def mamba_chunk_scan_combined(
        x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
        D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
        initial_states: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
        cu_seqlens: Optional[Tensor] = None, dt_softplus: bool = False,
        dt_limit: Tuple[float, float] = (0.0, _INF), return_final_states: bool = False,
        return_varlen_states: bool = False, state_dtype: Optional[torch.dtype] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """mamba_ssm's ``mamba_chunk_scan_combined``: the Mamba-2 SSD scan with all its
    options, forward and backward fused (``torch.ops.baracuda.ssd_chunk_scan_combined``).

    Shapes: x [B, L, H, P], dt [B, L, H], A [H], B and C [B, L, G, N] (H % G == 0),
    D [H] or [H, P], z [B, L, H, P], dt_bias [H], initial_states [B, H, P, N],
    seq_idx [B, L] (int32 or int64), cu_seqlens [S + 1].

    ``dt <- clamp(softplus?(dt + dt_bias), *dt_limit)`` (softplus where the sum is at
    most 20, when ``dt_softplus``); per batch and head, from ``h = initial_states`` (or
    0), with the state reset wherever ``seq_idx`` changes::

        h_t = exp(dt_t A) h_{t-1} + dt_t x_t ⊗ B_t,   y_t = C_t·h_t + D x_t,
        out_t = y_t · silu(z_t)   (with z)

    x, B, C and z share one dtype (float16, bfloat16, float32 or float64); dt, A, D,
    dt_bias and initial_states may each be float32 or that dtype. ``out`` has x's dtype;
    ``final_states`` (h after the last step) float32 (float64 for float64 inputs) or
    ``state_dtype``. Gradients flow to x, dt, A, B, C, D, z, dt_bias and initial_states,
    and from ``final_states``.

    Returns ``out``; ``(out, final_states)`` with ``return_final_states``;
    ``(out, varlen_states)`` with ``return_varlen_states``; ``(out, final_states,
    varlen_states)`` with both. ``varlen_states`` [S, H, P, N] is each packed sequence's
    final state (batch must be 1, ``cu_seqlens`` required; forward only, no gradient):
    the state after its last token when the scan resets at every sequence start (pass
    a matching ``seq_idx``), the first sequence starting from ``initial_states``. It
    reads ``cu_seqlens`` on the host and runs one extra forward scan per sequence;
    ``cu_seqlens`` must be a 1-D integer tensor that starts at 0, is non-decreasing and
    ends at L (ValueError otherwise).

    Raises ValueError / TypeError naming the argument for a wrong shape or dtype, a
    ``dt_limit`` that is not a pair of floats, or a ``chunk_size`` that is not a positive
    int fitting in int64.
    """
    if return_varlen_states:
        if cu_seqlens is None:
            raise ValueError("mamba_chunk_scan_combined: cu_seqlens must be provided if "
                             "return_varlen_states is True")
        if x.dim() != 4 or x.size(0) != 1:
            raise ValueError("mamba_chunk_scan_combined: passing cu_seqlens to get the varlen "
                             f"states needs batch size 1, got x of shape {tuple(x.shape)}")
        bounds = _check_cu_seqlens(cu_seqlens, x.size(1))
    out, final_states = _scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                              dt_softplus, dt_limit, state_dtype)
    if not return_varlen_states:
        return (out, final_states) if return_final_states else out
    varlen = _varlen_states(x, dt, A, B, C, chunk_size, dt_bias, initial_states, bounds,
                            dt_softplus, dt_limit, state_dtype)
    return (out, final_states, varlen) if return_final_states else (out, varlen)


# ---- mamba_split_conv1d_scan_combined -----------------------------------------------


def _causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
                   silu: bool) -> Tensor:
    """Causal depthwise conv over L of x [B, L, C] with weight [C, W] (tap W-1 on the
    current step): ``out[t] = bias + Σ_k weight[:, W-1-k] x[t-k]``, without the taps
    that reach into an earlier sequence of ``seq_idx``; then SiLU."""
    L, W = x.size(1), weight.size(1)
    if seq_idx is None:
        out = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=W - 1,
                       groups=weight.size(0))[..., :L].transpose(1, 2)
    else:
        out = x * weight[:, W - 1]
        for k in range(1, W):
            if k >= L:
                break
            shifted = F.pad(x[:, :L - k], (0, 0, k, 0))
            same = F.pad(seq_idx[:, k:] == seq_idx[:, :L - k], (k, 0), value=False)
            out = out + torch.where(same[..., None], shifted, 0) * weight[:, W - 1 - k]
        if bias is not None:
            out = out + bias
    return F.silu(out) if silu else out


def _gated_rmsnorm(x: Tensor, z: Optional[Tensor], weight: Tensor, eps: float, group_size: int,
                   norm_before_gate: bool) -> Tensor:
    """mamba_ssm's gated RMSNorm over groups of ``group_size`` channels, in float32:
    ``rmsnorm(x) · weight · silu(z)`` (norm_before_gate) or
    ``rmsnorm(x · silu(z)) · weight``. Returns x's dtype."""
    dtype = x.dtype
    xf = x.float() if x.dtype != torch.float64 else x
    if z is not None and not norm_before_gate:
        xf = xf * F.silu(z.to(xf.dtype))
    g = xf.unflatten(-1, (-1, group_size))
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    out = g.flatten(-2) * weight.to(xf.dtype)
    if z is not None and norm_before_gate:
        out = out * F.silu(z.to(xf.dtype))
    return out.to(dtype)


def mamba_split_conv1d_scan_combined(
        zxbcdt: Tensor, conv1d_weight: Tensor, conv1d_bias: Optional[Tensor], dt_bias: Tensor,
        A: Tensor, D: Tensor, chunk_size: int, initial_states: Optional[Tensor] = None,
        seq_idx: Optional[Tensor] = None, dt_limit: Tuple[float, float] = (0.0, _INF),
        return_final_states: bool = False, activation: Optional[str] = "silu",
        rmsnorm_weight: Optional[Tensor] = None, rmsnorm_eps: float = 1e-6,
        outproj_weight: Optional[Tensor] = None, outproj_bias: Optional[Tensor] = None,
        headdim: Optional[int] = None, ngroups: int = 1, norm_before_gate: bool = True,
        state_dtype: Optional[torch.dtype] = None, *, cp_group=None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """mamba_ssm's ``mamba_split_conv1d_scan_combined``: the body of a Mamba-2 layer
    after ``in_proj``.

    ``zxbcdt`` [B, L, 2·d_mlp + 2·dim + 2·G·N + H] (dim = H·P) splits into
    ``(zx0, z, xBC, dt)``; ``xBC = silu(causal_conv1d(xBC))`` (depthwise,
    ``conv1d_weight`` [dim + 2·G·N, W], taps not crossing ``seq_idx`` boundaries; no
    SiLU when ``activation`` is None) splits into x [B, L, H, P], B and C [B, L, G, N];
    then the scan (:func:`mamba_chunk_scan_combined` with D, dt_bias, ``dt_softplus=True``,
    ``dt_limit``, ``initial_states``, ``seq_idx``), gated by z, or, with
    ``rmsnorm_weight`` [dim], followed by the gated RMSNorm over groups of dim/G
    channels (``norm_before_gate``: ``rmsnorm(y)·w·silu(z)``, else
    ``rmsnorm(y·silu(z))·w``); with d_mlp > 0, ``silu(zx0[:d_mlp]) · zx0[d_mlp:]`` is
    concatenated in front; finally ``F.linear(·, outproj_weight, outproj_bias)`` when
    ``outproj_weight`` is given. ``headdim`` is required when D is [H]; ``rmsnorm_eps``
    must be a float when ``rmsnorm_weight`` is given (unused otherwise); ``seq_idx`` must
    be [B, L] of ``zxbcdt``.

    Returns ``out``, or ``(out, final_states)`` with ``return_final_states``.

    With ``cp_group`` (a ``torch.distributed`` process group), context parallelism:
    ``zxbcdt`` (and ``seq_idx``) are this rank's contiguous shard of the sequence, the
    shards in the group's rank order; the conv's ``W - 1`` tokens before the shard and
    the scan's state are exchanged over the group (:mod:`baracuda_torch.distributed`), so
    ``out`` is this rank's shard of the single-process output, ``final_states`` the state
    after this shard's last token, and ``initial_states`` is rank 0's.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError("mamba_split_conv1d_scan_combined: activation must be None, 'silu' "
                         f"or 'swish', got {activation!r}")
    if D.dim() == 1:
        if headdim is None:
            raise ValueError("mamba_split_conv1d_scan_combined: headdim is required when D "
                             "has shape [H]")
        nheads = D.size(0)
    elif D.dim() == 2:
        nheads, headdim = D.shape
    else:
        raise ValueError("mamba_split_conv1d_scan_combined: D must have shape [H] or [H, P], "
                         f"got {tuple(D.shape)}")
    if ngroups < 1 or nheads % ngroups != 0:
        raise ValueError(f"mamba_split_conv1d_scan_combined: nheads = {nheads} must be a multiple "
                         f"of ngroups = {ngroups}")
    if zxbcdt.dim() != 3:
        raise ValueError("mamba_split_conv1d_scan_combined: zxbcdt must have shape "
                         f"[B, L, features], got {tuple(zxbcdt.shape)}")
    batch, seqlen, width = zxbcdt.shape
    dim = nheads * headdim
    if conv1d_weight.dim() != 2 or (conv1d_weight.size(0) - dim) % (2 * ngroups) != 0 \
            or conv1d_weight.size(0) < dim:
        raise ValueError("mamba_split_conv1d_scan_combined: conv1d_weight must have shape "
                         f"[dim + 2·ngroups·d_state, width] with dim = {dim}, got "
                         f"{tuple(conv1d_weight.shape)}")
    dstate = (conv1d_weight.size(0) - dim) // ngroups // 2
    rest = width - 2 * dim - 2 * ngroups * dstate - nheads
    if rest < 0 or rest % 2 != 0:
        raise ValueError("mamba_split_conv1d_scan_combined: zxbcdt's last dim must be "
                         f"2·d_mlp + 2·{dim} + 2·{ngroups}·{dstate} + {nheads}, got {width}")
    d_mlp = rest // 2
    if rmsnorm_weight is not None and tuple(rmsnorm_weight.shape) != (dim,):
        raise ValueError(f"mamba_split_conv1d_scan_combined: rmsnorm_weight must have shape "
                         f"[{dim}], got {tuple(rmsnorm_weight.shape)}")
    if outproj_weight is None and outproj_bias is not None:
        raise ValueError("mamba_split_conv1d_scan_combined: outproj_bias needs outproj_weight")
    if rmsnorm_weight is not None:
        if isinstance(rmsnorm_eps, bool) or not isinstance(rmsnorm_eps, (int, float)):
            raise TypeError("mamba_split_conv1d_scan_combined: rmsnorm_eps must be a float when "
                            f"rmsnorm_weight is given, got {type(rmsnorm_eps).__name__} "
                            f"{rmsnorm_eps!r}")
        rmsnorm_eps = float(rmsnorm_eps)
    if seq_idx is not None and tuple(seq_idx.shape) != (batch, seqlen):
        raise ValueError("mamba_split_conv1d_scan_combined: seq_idx must have shape [B, L] = "
                         f"[{batch}, {seqlen}], got {list(seq_idx.shape)}")
    chunk_size = _check_chunk_size("mamba_split_conv1d_scan_combined", chunk_size)
    dt_limit = _check_dt_limit("mamba_split_conv1d_scan_combined", dt_limit)
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_mlp, dim, dim + 2 * ngroups * dstate, nheads],
                                  dim=-1)
    z4 = z.unflatten(-1, (nheads, headdim))

    def split_xBC(xBC):
        x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
        return (x.unflatten(-1, (nheads, headdim)), B.unflatten(-1, (ngroups, dstate)),
                C.unflatten(-1, (ngroups, dstate)))

    if cp_group is not None:
        from .distributed import _split_conv1d_scan_cp
        y, final_states = _split_conv1d_scan_cp(
            _causal_conv1d, xBC, dt, conv1d_weight, conv1d_bias, seq_idx, activation is not None,
            split_xBC, dict(A=A, chunk_size=chunk_size, D=D,
                            z=z4 if rmsnorm_weight is None else None, dt_bias=dt_bias,
                            initial_states=initial_states, dt_softplus=True, dt_limit=dt_limit,
                            state_dtype=state_dtype, fn="mamba_split_conv1d_scan_combined"),
            cp_group)
    else:
        xBC = _causal_conv1d(xBC, conv1d_weight, conv1d_bias, seq_idx, activation is not None)
        x, B, C = split_xBC(xBC)
        y, final_states = _scan(x, dt, A, B, C, chunk_size, D,
                                z4 if rmsnorm_weight is None else None, dt_bias, initial_states,
                                seq_idx, True, dt_limit, state_dtype,
                                "mamba_split_conv1d_scan_combined")
    out = y.flatten(-2)
    if rmsnorm_weight is not None:
        out = _gated_rmsnorm(out, z, rmsnorm_weight, rmsnorm_eps, dim // ngroups,
                             norm_before_gate)
    if d_mlp > 0:
        z0, x0 = zx0.chunk(2, dim=-1)
        out = torch.cat([(F.silu(z0) * x0).to(out.dtype), out], dim=-1)
    if outproj_weight is not None:
        out = F.linear(out, outproj_weight, outproj_bias)
    return (out, final_states) if return_final_states else out


# ---- modules -----------------------------------------------------------------------


class RMSNormGated(nn.Module):
    """mamba_ssm's gated RMSNorm (``mamba_ssm.ops.triton.layernorm_gated.RMSNorm``):
    ``forward(x, z=None)`` normalises groups of ``group_size`` channels (all of them by
    default) and gates with ``silu(z)`` after (``norm_before_gate``) or before the norm."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = True, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, x: Tensor, z: Optional[Tensor] = None) -> Tensor:
        return _gated_rmsnorm(x, z, self.weight, self.eps, self.group_size or x.size(-1),
                              self.norm_before_gate)


class Mamba2(nn.Module):
    """The Mamba-2 mixer layer with mamba_ssm's interface
    (``mamba_ssm.modules.mamba2.Mamba2``: the same constructor arguments, parameter
    names, shapes and initialisation, so state dicts load either way), its forward on
    :func:`mamba_split_conv1d_scan_combined` (baracuda's fused SSD scan).

    With ``d_inner = expand · d_model``, ``d_ssm`` (default d_inner) channels through
    the SSM, ``H = d_ssm / headdim`` heads, ``G = ngroups``, ``N = d_state``:
    parameters ``in_proj`` (d_model → 2·d_inner + 2·G·N + H), ``conv1d`` (depthwise over
    d_ssm + 2·G·N channels, ``d_conv`` taps), ``dt_bias`` [H] (``softplus(dt_bias)``
    log-uniform in [dt_min, dt_max], floored at dt_init_floor), ``A_log`` [H]
    (``log U[A_init_range]``; A = -exp(A_log) in float32), ``D`` [H] or [d_ssm]
    (``D_has_hdim``), ``norm.weight`` [d_ssm] (``rmsnorm``), ``out_proj`` (d_inner →
    d_model).

    ``forward(u, seqlen=None, seq_idx=None, cu_seqlens=None)``: u [B, L, d_model], or
    [B·L, d_model] with ``seqlen`` = L; ``seq_idx`` [B, L] packs several sequences per
    row (the conv and the scan do not cross their boundaries). Not implemented:
    ``inference_params`` (the decoding cache and ``step``) and ``process_group``
    (tensor parallelism); ``layer_idx``, ``use_mem_eff_path`` and
    ``sequence_parallel`` are accepted and stored.

    ``cp_group`` (not in mamba_ssm; default None: one process): a ``torch.distributed``
    process group over which the sequence is split for context parallelism. Each rank
    passes its contiguous shard ``u`` [B, L_r, d_model] (and ``seq_idx`` [B, L_r]), the
    shards in the group's rank order, any lengths; the output is this rank's shard of the
    single-process output, and the parameters' gradients are this rank's share (their
    sum over the group is the single-process gradient). docs/distributed.md.
    """

    def __init__(self, d_model: int, d_state: int = 128, d_conv: int = 4,
                 conv_init: Optional[float] = None, expand: int = 2, headdim: int = 64,
                 d_ssm: Optional[int] = None, ngroups: int = 1,
                 A_init_range: Tuple[float, float] = (1, 16), D_has_hdim: bool = False,
                 rmsnorm: bool = True, norm_before_gate: bool = False, dt_min: float = 0.001,
                 dt_max: float = 0.1, dt_init_floor: float = 1e-4,
                 dt_limit: Tuple[float, float] = (0.0, _INF), bias: bool = False,
                 conv_bias: bool = True, chunk_size: int = 256, use_mem_eff_path: bool = True,
                 layer_idx: Optional[int] = None, process_group=None,
                 sequence_parallel: bool = True, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None, cp_group=None) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        if process_group is not None:
            raise NotImplementedError("Mamba2: process_group (tensor parallelism) is not "
                                      "implemented")
        self.d_model, self.d_state, self.d_conv, self.conv_init = d_model, d_state, d_conv, conv_init
        self.expand = expand
        self.process_group = None
        self.sequence_parallel = sequence_parallel
        self.world_size, self.local_rank = 1, 0
        self.d_inner = expand * d_model
        self.headdim = headdim
        self.d_ssm = self.d_inner if d_ssm is None else d_ssm
        self.ngroups = ngroups
        if self.d_ssm % headdim != 0:
            raise ValueError(f"Mamba2: d_ssm = {self.d_ssm} must be a multiple of headdim = "
                             f"{headdim}")
        self.nheads = self.d_ssm // headdim
        if self.nheads % ngroups != 0:
            raise ValueError(f"Mamba2: the number of heads {self.nheads} must be a multiple of "
                             f"ngroups = {ngroups}")
        if not (A_init_range[0] > 0 and A_init_range[1] >= A_init_range[0]):
            raise ValueError(f"Mamba2: A_init_range must satisfy 0 < low <= high, got "
                             f"{A_init_range}")
        self.D_has_hdim = D_has_hdim
        self.rmsnorm = rmsnorm
        self.norm_before_gate = norm_before_gate
        self.dt_limit = dt_limit
        self.activation = "silu"
        self.chunk_size = chunk_size
        self.use_mem_eff_path = use_mem_eff_path
        self.layer_idx = layer_idx
        self.cp_group = cp_group

        d_in_proj = 2 * self.d_inner + 2 * ngroups * d_state + self.nheads
        self.in_proj = nn.Linear(d_model, d_in_proj, bias=bias, **factory)
        conv_dim = self.d_ssm + 2 * ngroups * d_state
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, kernel_size=d_conv, groups=conv_dim,
                                padding=d_conv - 1, bias=conv_bias, **factory)
        if conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -conv_init, conv_init)
        self.act = nn.SiLU()

        dt = torch.exp(torch.rand(self.nheads, **factory) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        dt = torch.clamp(dt, min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.dt_bias._no_weight_decay = True
        A = torch.empty(self.nheads, dtype=torch.float32, device=device).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A).to(dtype=dtype))
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(self.d_ssm if D_has_hdim else self.nheads, device=device))
        self.D._no_weight_decay = True
        if rmsnorm:
            self.norm = RMSNormGated(self.d_ssm, eps=1e-5, norm_before_gate=norm_before_gate,
                                     group_size=self.d_ssm // ngroups, **factory)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)

    def forward(self, u: Tensor, seqlen: Optional[int] = None, seq_idx: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, inference_params=None) -> Tensor:
        """u [B, L, d_model] (or [B·L, d_model] with ``seqlen``) -> the same shape."""
        if inference_params is not None:
            raise NotImplementedError("Mamba2: inference_params (the decoding cache) is not "
                                      "implemented")
        del cu_seqlens  # only used by the decoding cache in mamba_ssm
        zxbcdt = self.in_proj(u)
        if seqlen is not None:
            zxbcdt = zxbcdt.unflatten(0, (-1, seqlen))
        A = -torch.exp(self.A_log.float())
        out = mamba_split_conv1d_scan_combined(
            zxbcdt, self.conv1d.weight.squeeze(1), self.conv1d.bias, self.dt_bias, A,
            D=self.D.unflatten(0, (-1, self.headdim)) if self.D_has_hdim else self.D,
            chunk_size=self.chunk_size, seq_idx=seq_idx, dt_limit=self.dt_limit,
            activation=self.activation,
            rmsnorm_weight=self.norm.weight if self.rmsnorm else None,
            rmsnorm_eps=self.norm.eps if self.rmsnorm else 1e-6,
            outproj_weight=self.out_proj.weight, outproj_bias=self.out_proj.bias,
            headdim=None if self.D_has_hdim else self.headdim, ngroups=self.ngroups,
            norm_before_gate=self.norm_before_gate, cp_group=self.cp_group)
        if seqlen is not None:
            out = out.flatten(0, 1)
        return out

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, "
                f"headdim={self.headdim}, nheads={self.nheads}, ngroups={self.ngroups}, "
                f"d_ssm={self.d_ssm}, chunk_size={self.chunk_size}, rmsnorm={self.rmsnorm}")
