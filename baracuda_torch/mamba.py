"""Mamba-2 on baracuda_torch's SSD scan, with mamba_ssm's interface.

* :func:`mamba_chunk_scan_combined`: mamba_ssm's ``mamba_chunk_scan_combined`` (same
  signature and return convention) on ``torch.ops.baracuda.ssd_chunk_scan_combined``.
* :func:`mamba_split_conv1d_scan_combined`: mamba_ssm's fused Mamba-2 block body
  (in_proj output split, causal depthwise conv1d + SiLU, the scan, gated RMSNorm,
  out_proj) on baracuda's causal conv1d, SSD, gated RMSNorm and SwiGLU ops, in one
  autograd Function that saves what mamba_ssm's does and recomputes the conv in the
  backward.
* :class:`RMSNormGated`: mamba_ssm's gated RMSNorm module
  (:class:`baracuda_torch.layernorm_gated.RMSNorm`).
* :func:`selective_state_update`: mamba_ssm's decoding step of the SSM (same signature),
  in place on the state (:func:`baracuda_torch.selective_state_update`).
* :class:`Mamba2`: the Mamba-2 mixer layer with mamba_ssm's parameter names, shapes and
  initialisation (its ``state_dict`` loads into ``mamba_ssm.modules.mamba2.Mamba2`` and
  back), on :func:`mamba_split_conv1d_scan_combined`.
* :class:`InferenceParams`: mamba_ssm's decoding cache holder (``utils.generation``);
  ``Mamba2.forward(..., inference_params=...)`` prefills through the chunked scan and then
  decodes one token at a time (``Mamba2.step``) on baracuda's decoding ops.

Differences from mamba_ssm: ``final_states`` are float32 (float64 for float64 inputs)
unless ``state_dtype`` says otherwise (mamba_ssm defaults to C's dtype); ``Mamba2.step``
applies ``dt_limit`` (mamba_ssm's step leaves dt unclamped, so that its decoding departs
from its forward when the limit bites); tensor parallelism (``process_group``) is not
implemented. Context parallelism (the sequence split over the ranks of a process group,
``cp_group``): :mod:`baracuda_torch.distributed`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _C  # noqa: F401  (registers torch.ops.baracuda.*)
from .causal_conv1d import causal_conv1d_update
from .functional import selective_state_update
from .layernorm_gated import RMSNorm

__all__ = ["mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "RMSNormGated",
           "Mamba2", "selective_state_update", "InferenceParams", "set_keep_chunk_states"]

_INF = float("inf")
_KEEP_CHUNK_STATES = True


def set_keep_chunk_states(enabled: bool) -> bool:
    """Whether the SSD scan's forward keeps its chunk states for the backward (default
    ``True``); returns the previous setting.

    On CUDA with float16 or bfloat16 inputs, where a gradient will be needed, the forward
    of :func:`mamba_chunk_scan_combined` and :func:`mamba_split_conv1d_scan_combined`
    (and of :class:`Mamba2`) then keeps the state entering each chunk, B·H·⌈L/chunk_size⌉
    ·P·N values of x's dtype (half of x's size at N = 128, chunk_size 256), until the
    backward, which then does not recompute them: about 12 % of the backward's time at the
    Mamba-2 2.7B shape (BENCHMARKS.md). ``False`` recomputes them in the backward, as
    mamba_ssm does, for the memory. Elsewhere (CPU, float32, float64, no gradient) the
    setting changes nothing.
    """
    global _KEEP_CHUNK_STATES
    if not isinstance(enabled, bool):
        raise TypeError(f"set_keep_chunk_states: enabled must be a bool, got {type(enabled).__name__}")
    previous, _KEEP_CHUNK_STATES = _KEEP_CHUNK_STATES, enabled
    return previous


def _keep_chunk_states(x: Tensor, *others: Optional[Tensor]) -> bool:
    """Whether a scan's forward keeps its chunk states (set_keep_chunk_states): on CUDA with
    16-bit activations x (the op keeps them for any 16-bit input, but only the CUDA backward
    reads them), where a gradient will be needed."""
    return (_KEEP_CHUNK_STATES and isinstance(x, Tensor) and x.is_cuda
            and x.dtype in (torch.float16, torch.bfloat16) and torch.is_grad_enabled()
            and any(isinstance(t, Tensor) and t.requires_grad for t in (x,) + others))


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
    out, final_states, _, _ = torch.ops.baracuda.ssd_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
        low, high, state_dtype, _keep_chunk_states(x, dt, A, B, C, D, z, dt_bias, initial_states))
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


def _seq_idx_int32(seq_idx: Optional[Tensor]) -> Optional[Tensor]:
    """seq_idx as the conv op takes it (int32; the scan takes int32 or int64)."""
    return seq_idx if seq_idx is None or seq_idx.dtype == torch.int32 else seq_idx.to(torch.int32)


def _causal_conv1d(xBC: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
                   silu: bool) -> Tensor:
    """The causal depthwise conv over L (+ SiLU) of xBC [B, L, C] with weight [C, W] (tap
    W-1 on the current step; no tap reaches into an earlier sequence of ``seq_idx``, and a
    step with ``seq_idx < 0`` gives 0) on ``torch.ops.baracuda.causal_conv1d``: xBC is read
    where it lies (a channel-last slice of zxbcdt), and the [B, L, C] result is one
    channel-last buffer."""
    out, _ = torch.ops.baracuda.causal_conv1d(xBC.transpose(1, 2), weight, bias,
                                              _seq_idx_int32(seq_idx), None,
                                              "silu" if silu else None)
    return out.transpose(1, 2)


class _SplitConfig(NamedTuple):
    """The non-tensor arguments of the fused split-conv1d-scan, and zxbcdt's split."""
    d_mlp: int
    dim: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    dt_limit: Tuple[float, float]
    silu: bool
    eps: float
    norm_before_gate: bool
    state_dtype: Optional[torch.dtype]
    linear_dtype: Optional[torch.dtype]  # autocast's dtype for out_proj, or None
    keep_states: bool = False  # the scan keeps its chunk states for the backward



def _split_zxbcdt(cfg: _SplitConfig, t: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(zx0, z, xBC, dt): views of zxbcdt (or of its gradient; one slice each, not
    torch.split's multi-output views, so that the backward may write into them)."""
    sizes = (2 * cfg.d_mlp, cfg.dim, cfg.dim + 2 * cfg.ngroups * cfg.dstate, cfg.nheads)
    starts = (0, sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2])
    return tuple(t[..., a:a + n] for a, n in zip(starts, sizes))


def _write_grads(parts, grads) -> None:
    """Each part's gradient into its view of one gradient buffer (zeros for a part without
    one): what the composed path's Functions return instead of autograd's full-size
    gradient per slice."""
    for part, g in zip(parts, grads):
        part.zero_() if g is None else part.copy_(g)


class _ZxbcdtParts(torch.autograd.Function):
    """``_split_zxbcdt`` for the composed (context-parallel) path: the same views, but the
    backward writes the parts' gradients into one zxbcdt-shaped buffer (zeros only for a
    part without one), where autograd's own slicing gives every part a zero-filled
    full-size gradient and adds them up."""

    @staticmethod
    def forward(ctx, zxbcdt: Tensor, cfg: _SplitConfig):
        ctx.cfg, ctx.width = cfg, zxbcdt.size(-1)
        ctx.set_materialize_grads(False)
        return _split_zxbcdt(cfg, zxbcdt)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        ref = next((g for g in grads if g is not None), None)
        if ref is None:
            return None, None
        dzxbcdt = ref.new_empty(*ref.shape[:-1], ctx.width)
        _write_grads(_split_zxbcdt(ctx.cfg, dzxbcdt), grads)
        return dzxbcdt, None


def _conv_parts(cfg: _SplitConfig) -> Tuple[Tuple[int, int], ...]:
    """The channel ranges of x, B and C in xBC."""
    gn = cfg.ngroups * cfg.dstate
    return (0, cfg.dim), (cfg.dim, cfg.dim + gn), (cfg.dim + gn, cfg.dim + 2 * gn)


def _split_xBC(cfg: _SplitConfig, xBC: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """x [B, L, H, P], B and C [B, L, G, N]: views of the conv's output."""
    x, B, C = (xBC[..., a:b] for a, b in _conv_parts(cfg))
    return (x.unflatten(-1, (cfg.nheads, cfg.headdim)), B.unflatten(-1, (cfg.ngroups, cfg.dstate)),
            C.unflatten(-1, (cfg.ngroups, cfg.dstate)))


def _swiglu(zx0: Tensor) -> Tensor:
    """silu(zx0[..., :d]) · zx0[..., d:] (gate first), on the gated-activation op."""
    return torch.ops.baracuda.gated_activation(zx0, "swiglu", -1, True)


class _SplitConv1dScan(torch.autograd.Function):
    """The fused body of :func:`mamba_split_conv1d_scan_combined`, as mamba_ssm's own
    autograd function does it, on baracuda's ops: the causal conv1d op on xBC read in
    place from zxbcdt, the SSD op, the gated RMSNorm op, the SwiGLU op for the d_mlp part.

    A Python Function rather than an op declared through OpDef: the body is a
    composition of several ops (and out_proj's matrix products), not one kernel, and what
    it saves and recomputes is the point: it saves what mamba_ssm saves (zxbcdt, the
    scan's output before the norm or gate, the norm's rstd and the small parameters), so
    the conv's output ([B, L, dim + 2GN]) is not kept between the passes but recomputed
    in the backward; the scan's chunk states are kept too where set_keep_chunk_states
    says so (``cfg.keep_states``), so that its backward does not recompute them. The backward writes every gradient of zxbcdt into one dzxbcdt
    buffer, each part through its view (no large tensor is concatenated): the conv's
    backward runs once over x's channels and once over B's and C's (whose small gradients
    are joined), writing its dx straight into those ranges (causal_conv1d_backward_into),
    so that the scan's x gradient is never copied; the gated RMSNorm's backward writes dz
    into its range too and recomputes the norm's output for out_proj's weight gradient in
    the same pass (gated_rms_norm_backward_into, as mamba_ssm's recompute_output); the
    other outputs are copied once into place (ddt, the ungated dz); and with out_proj the
    d_mlp and SSM parts take their own products (out_proj's input is never concatenated
    either).

    The forward is context-free (setup_context saves), so that torch.func's grad and vjp
    apply (not vmap: the backward writes into its one buffer); what the backward needs
    beyond the inputs (the scan's output, rstd and the kept chunk states, empty where
    none are kept) is returned as three more, non-differentiable outputs that the caller
    drops."""

    @staticmethod
    def forward(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx,
                rmsnorm_weight, outproj_weight, outproj_bias, cfg: _SplitConfig):
        zx0, z, xBC, dt = _split_zxbcdt(cfg, zxbcdt)
        x, B, C = _split_xBC(cfg, _causal_conv1d(xBC, conv1d_weight, conv1d_bias, seq_idx, cfg.silu))
        rms = rmsnorm_weight is not None
        y, final_states, y_pre, states = torch.ops.baracuda.ssd_chunk_scan_combined(
            x, dt, A, B, C, cfg.chunk_size, D, None if rms else z.unflatten(-1, (cfg.nheads, cfg.headdim)),
            dt_bias, initial_states, seq_idx, True, cfg.dt_limit[0], cfg.dt_limit[1], cfg.state_dtype,
            cfg.keep_states)
        rstd = y.new_empty(0, dtype=torch.float32)  # (none without the norm)
        if rms:
            saved = y  # the scan's output, the norm's input
            y, rstd = torch.ops.baracuda.gated_rms_norm(saved.flatten(-2), rmsnorm_weight, None, z, cfg.eps,
                                                        cfg.dim // cfg.ngroups, cfg.norm_before_gate)
        else:
            saved = y_pre  # the scan's output before the gate
            y = y.flatten(-2)
        out = _out_proj(_swiglu(zx0) if cfg.d_mlp else None, y, outproj_weight, outproj_bias,
                        cfg.linear_dtype)
        return out, final_states, saved, rstd, states

    @staticmethod
    def setup_context(ctx, inputs, output):
        (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx, rmsnorm_weight,
         outproj_weight, outproj_bias, cfg) = inputs
        out, _, saved, rstd, states = output
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(saved, rstd, states)
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, saved, A, D, dt_bias, initial_states,
                              seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias, states)
        ctx.cfg = cfg
        ctx.out_meta = (out.shape, out.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the ops have no second derivative
    def backward(ctx, dout, dfinal_states, _dsaved, _drstd, _dstates):
        (zxbcdt, conv1d_weight, conv1d_bias, saved, A, D, dt_bias, initial_states, seq_idx,
         rmsnorm_weight, rstd, outproj_weight, outproj_bias, states) = ctx.saved_tensors
        cfg = ctx.cfg
        proj_dtype = outproj_weight.dtype if outproj_weight is not None else None
        if outproj_weight is not None and cfg.linear_dtype is not None:  # as the forward used it
            outproj_weight = outproj_weight.to(cfg.linear_dtype)
        if dout is None:  # only final_states was used
            dout = zxbcdt.new_zeros(ctx.out_meta[0], dtype=ctx.out_meta[1])
        zx0, z, xBC, dt = _split_zxbcdt(cfg, zxbcdt)
        x, B, C = _split_xBC(cfg, _causal_conv1d(xBC, conv1d_weight, conv1d_bias, seq_idx, cfg.silu))
        z4 = z.unflatten(-1, (cfg.nheads, cfg.headdim))
        rms = rmsnorm_weight is not None
        dzxbcdt = torch.empty_like(zxbcdt)
        dzx0, dz, dxBC, ddt = _split_zxbcdt(cfg, dzxbcdt)
        dtype, d = zxbcdt.dtype, cfg.d_mlp

        doutproj_weight = doutproj_bias = None
        dweight_out = outproj_weight is not None and ctx.needs_input_grad[9]
        if outproj_weight is not None:
            dout = dout.to(outproj_weight.dtype)
            dy = F.linear(dout, outproj_weight[:, d:].t())
            dmlp = F.linear(dout, outproj_weight[:, :d].t()) if d else None
        else:
            dy, dmlp = dout[..., d:], dout[..., :d]
        if d:
            dzx0.copy_(torch.ops.baracuda.gated_activation_backward(dmlp.to(dtype), zx0, "swiglu", -1, True))
        dy = dy.to(dtype)
        drmsnorm_weight = None
        if rms:
            # dz straight into dzxbcdt, and the norm's output recomputed in the same pass
            # for out_proj's weight gradient (mamba_ssm's recompute_output)
            dy, drmsnorm_weight, _, ssm_out = torch.ops.baracuda.gated_rms_norm_backward_into(
                dy, saved.flatten(-2), rmsnorm_weight, None, z, rstd, dz, cfg.dim // cfg.ngroups,
                cfg.norm_before_gate, dweight_out)
        elif dweight_out:  # what the SSM part gave out_proj, recomputed
            ssm_out = torch.ops.baracuda.gated_activation_pair(z4, saved, "swiglu").flatten(-2)
        if dweight_out:
            dout2 = dout.flatten(0, 1)
            parts = [dout2.t().mm(ssm_out.flatten(0, 1).to(dout.dtype))]
            if d:
                parts.insert(0, dout2.t().mm(_swiglu(zx0).flatten(0, 1).to(dout.dtype)))
            doutproj_weight = (torch.cat(parts, 1) if d else parts[0]).to(proj_dtype)  # small
        if outproj_bias is not None and ctx.needs_input_grad[10]:
            doutproj_bias = dout.flatten(0, 1).sum(0).to(outproj_bias.dtype)
        dx, dscan_dt, dA, dB, dC, dD, dz_scan, ddt_bias, dinitial_states = \
            torch.ops.baracuda.ssd_chunk_scan_combined_backward(
                dy.unflatten(-1, (cfg.nheads, cfg.headdim)), dfinal_states, x, dt, A, B, C, cfg.chunk_size, D,
                None if rms else z4, dt_bias, initial_states, seq_idx, None if rms else saved, True,
                cfg.dt_limit[0], cfg.dt_limit[1], states if states.dim() == 5 else None)
        if not rms:
            dz.copy_(dz_scan.flatten(-2))
        ddt.copy_(dscan_dt)
        dweights, dbiases = [], []
        seq32 = _seq_idx_int32(seq_idx)
        # x's channels, then B's and C's together (their gradients joined: 2·G·N channels, a
        # small copy; one launch where two would each leave most of the GPU idle)
        gn2 = 2 * cfg.ngroups * cfg.dstate
        parts = ((0, cfg.dim, dx.flatten(-2)),
                 (cfg.dim, cfg.dim + gn2, torch.cat([dB.flatten(-2), dC.flatten(-2)], -1)))
        for a, b, g in parts:
            dw, db, _ = torch.ops.baracuda.causal_conv1d_backward_into(
                g.transpose(1, 2), None, xBC[..., a:b].transpose(1, 2), conv1d_weight[a:b],
                dxBC[..., a:b].transpose(1, 2), conv1d_bias[a:b] if conv1d_bias is not None else None, seq32,
                None, "silu" if cfg.silu else None)
            dweights.append(dw)
            dbiases.append(db)
        dconv1d_weight = torch.cat(dweights)  # [dim + 2GN, W]: small
        dconv1d_bias = torch.cat(dbiases) if conv1d_bias is not None else None
        return (dzxbcdt, dconv1d_weight, dconv1d_bias, ddt_bias if dt_bias is not None else None, dA, dD,
                dinitial_states if initial_states is not None else None, None, drmsnorm_weight,
                doutproj_weight, doutproj_bias, None)


def _out_proj(mlp: Optional[Tensor], y: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
              linear_dtype: Optional[torch.dtype]) -> Tensor:
    """``F.linear(cat([mlp, y]), weight, bias)`` without building the concatenation (the
    mlp part's product is added into the output in place), in ``linear_dtype`` when
    autocast gives one (mamba_ssm casts there too); without a weight, the concatenation
    itself (the output)."""
    if weight is None:
        return y if mlp is None else torch.cat([mlp, y], dim=-1)
    if linear_dtype is not None:
        weight, y = weight.to(linear_dtype), y.to(linear_dtype)
        bias = bias.to(linear_dtype) if bias is not None else None
        mlp = mlp.to(linear_dtype) if mlp is not None else None
    if mlp is None:
        return F.linear(y, weight, bias)
    d = mlp.size(-1)
    out = F.linear(y, weight[:, d:], bias)
    out.view(-1, out.size(-1)).addmm_(mlp.reshape(-1, d), weight[:, :d].t())
    return out


def _gated_tail(y: Tensor, z: Tensor, zx0: Tensor, cfg: _SplitConfig, rmsnorm_weight: Optional[Tensor],
                outproj_weight: Optional[Tensor], outproj_bias: Optional[Tensor]) -> Tensor:
    """After the scan, composed from the ops (the context-parallel path): the gated
    RMSNorm, the d_mlp part and out_proj."""
    out = y.flatten(-2)
    if rmsnorm_weight is not None:
        out = torch.ops.baracuda.gated_rms_norm(out, rmsnorm_weight, None, z, cfg.eps, cfg.dim // cfg.ngroups,
                                                cfg.norm_before_gate)[0]
    return _out_proj(_swiglu(zx0) if cfg.d_mlp else None, out, outproj_weight, outproj_bias,
                     cfg.linear_dtype)


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

    Computed by baracuda's ops (``causal_conv1d`` reading xBC in place, with ``seq_idx``
    as int32; ``ssd_chunk_scan_combined``; ``gated_rms_norm``; ``gated_activation``'s
    SwiGLU for the d_mlp part) in one autograd Function: between the passes it keeps
    zxbcdt, the scan's output (before the norm or the gate), the norm's rstd and the
    parameters, as mamba_ssm does, recomputes the conv's output in the backward, and
    returns zxbcdt's gradient as one buffer. A conv step whose ``seq_idx`` is negative
    (padding) outputs 0 (the causal conv1d op's rule); under autocast, out_proj runs in
    autocast's dtype, as in mamba_ssm.

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
    linear_dtype = None
    if outproj_weight is not None and torch.is_autocast_enabled(zxbcdt.device.type):
        linear_dtype = torch.get_autocast_dtype(zxbcdt.device.type)
    cfg = _SplitConfig(d_mlp, dim, nheads, headdim, ngroups, dstate, chunk_size, dt_limit,
                       activation is not None, rmsnorm_eps if rmsnorm_weight is not None else 0.0,
                       norm_before_gate, state_dtype, linear_dtype,
                       _keep_chunk_states(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states,
                                          rmsnorm_weight, outproj_weight, outproj_bias))
    if cp_group is None:
        out, final_states, _, _, _ = _SplitConv1dScan.apply(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx,
            rmsnorm_weight, outproj_weight, outproj_bias, cfg)
        return (out, final_states) if return_final_states else out
    from .distributed import _split_conv1d_scan_cp
    zx0, z, xBC, dt = _ZxbcdtParts.apply(zxbcdt, cfg)
    y, final_states = _split_conv1d_scan_cp(
        xBC, dt, conv1d_weight, conv1d_bias, seq_idx, activation is not None, cfg,
        dict(A=A, chunk_size=chunk_size, D=D,
             z=z.unflatten(-1, (nheads, headdim)) if rmsnorm_weight is None else None,
             dt_bias=dt_bias, initial_states=initial_states, dt_softplus=True, dt_limit=dt_limit,
             state_dtype=state_dtype, fn="mamba_split_conv1d_scan_combined"),
        cp_group)
    out = _gated_tail(y, z, zx0, cfg, rmsnorm_weight, outproj_weight, outproj_bias)
    return (out, final_states) if return_final_states else out


# ---- the decoding cache -------------------------------------------------------------


@dataclass
class InferenceParams:
    """mamba_ssm's ``InferenceParams`` (``mamba_ssm.utils.generation``), the same fields:
    what a model's layers share while decoding. ``seqlen_offset`` is the number of tokens
    already in the cache (0: the next forward is the prefill; > 0: each forward is one
    decoding step), ``key_value_memory_dict`` maps a layer's ``layer_idx`` to its states
    (for :class:`Mamba2`: ``(conv_state, ssm_state)``). A mamba_ssm ``InferenceParams``
    works as well (the layers read only these fields)."""

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict = field(default_factory=dict)
    lengths_per_sample: Optional[Tensor] = None

    def reset(self, max_seqlen: int, max_batch_size: int) -> None:
        self.max_seqlen = max_seqlen
        self.max_batch_size = max_batch_size
        self.seqlen_offset = 0
        if self.lengths_per_sample is not None:
            self.lengths_per_sample.zero_()


def _last_inputs(xBC: Tensor, width: int) -> Tensor:
    """The conv state after ``xBC`` [B, L, C]: its last ``width`` steps as [B, C, width],
    zeros in front where L < width (mamba_ssm's ``F.pad(x, (width - L, 0))``)."""
    return F.pad(xBC.transpose(1, 2), (width - xBC.size(1), 0))


# ---- modules -----------------------------------------------------------------------


#: mamba_ssm's gated RMSNorm module (its ``layernorm_gated.RMSNorm``, which its Mamba2
#: imports under this name): :class:`baracuda_torch.layernorm_gated.RMSNorm`, on the
#: gated RMSNorm op.
RMSNormGated = RMSNorm


class Mamba2(nn.Module):
    """The Mamba-2 mixer layer with mamba_ssm's interface
    (``mamba_ssm.modules.mamba2.Mamba2``: the same constructor arguments, parameter
    names, shapes and initialisation, so state dicts load either way), its forward on
    :func:`mamba_split_conv1d_scan_combined` (baracuda's fused ops).

    With ``d_inner = expand · d_model``, ``d_ssm`` (default d_inner) channels through
    the SSM, ``H = d_ssm / headdim`` heads, ``G = ngroups``, ``N = d_state``:
    parameters ``in_proj`` (d_model → 2·d_inner + 2·G·N + H), ``conv1d`` (depthwise over
    d_ssm + 2·G·N channels, ``d_conv`` taps), ``dt_bias`` [H] (``softplus(dt_bias)``
    log-uniform in [dt_min, dt_max], floored at dt_init_floor), ``A_log`` [H]
    (``log U[A_init_range]``; A = -exp(A_log) in float32), ``D`` [H] or [d_ssm]
    (``D_has_hdim``), ``norm.weight`` [d_ssm] (``rmsnorm``), ``out_proj`` (d_inner →
    d_model).

    ``forward(u, seqlen=None, seq_idx=None, cu_seqlens=None, inference_params=None)``:
    u [B, L, d_model], or [B·L, d_model] with ``seqlen`` = L; ``seq_idx`` [B, L] packs
    several sequences per row (the conv and the scan do not cross their boundaries).

    Decoding (mamba_ssm's protocol): with ``inference_params`` (an :class:`InferenceParams`)
    the layer keeps ``(conv_state, ssm_state)`` under its ``layer_idx`` in
    ``inference_params.key_value_memory_dict`` (allocated on first use, like
    :meth:`allocate_inference_cache`). While ``seqlen_offset == 0`` the forward is the
    prefill: the fused path (the chunked scan) runs as without a cache and leaves the last
    ``d_conv`` conv inputs and the scan's final state in the cache (with ``cu_seqlens``,
    batch 1: those of each packed sequence, for one cache row per sequence). Once
    ``seqlen_offset > 0`` each forward is one decoding step (:meth:`step`: u [B, 1,
    d_model]) on ``causal_conv1d_update`` and ``selective_state_update``, updating the
    cache in place; the caller advances ``seqlen_offset``. Not implemented:
    ``process_group`` (tensor parallelism); ``use_mem_eff_path`` and
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
        """u [B, L, d_model] (or [B·L, d_model] with ``seqlen``) -> the same shape. With
        ``inference_params``: the prefill (``seqlen_offset == 0``) or one decoding step."""
        conv_state = ssm_state = None
        if inference_params is not None:
            if self.cp_group is not None:
                raise NotImplementedError("Mamba2: inference_params (decoding) with cp_group is "
                                          "not implemented")
            if cu_seqlens is not None:
                batch = cu_seqlens.shape[0] - 1
            else:
                batch = u.shape[0] if seqlen is None else u.shape[0] // seqlen
            conv_state, ssm_state = self._get_states_from_cache(inference_params, batch)
            if inference_params.seqlen_offset > 0:
                if seqlen is not None:
                    u = u.unflatten(0, (-1, seqlen))
                out, _, _ = self.step(u, conv_state, ssm_state)
                return out.flatten(0, 1) if seqlen is not None else out
        zxbcdt = self.in_proj(u)
        if seqlen is not None:
            zxbcdt = zxbcdt.unflatten(0, (-1, seqlen))
        A = -torch.exp(self.A_log.float())
        result = mamba_split_conv1d_scan_combined(
            zxbcdt, self.conv1d.weight.squeeze(1), self.conv1d.bias, self.dt_bias, A,
            D=self._D(), chunk_size=self.chunk_size, seq_idx=seq_idx, dt_limit=self.dt_limit,
            return_final_states=ssm_state is not None and cu_seqlens is None,
            activation=self.activation,
            rmsnorm_weight=self.norm.weight if self.rmsnorm else None,
            rmsnorm_eps=self.norm.eps if self.rmsnorm else 1e-6,
            outproj_weight=self.out_proj.weight, outproj_bias=self.out_proj.bias,
            headdim=None if self.D_has_hdim else self.headdim, ngroups=self.ngroups,
            norm_before_gate=self.norm_before_gate, cp_group=self.cp_group)
        if ssm_state is None:
            out = result
        else:
            out, final_states = result if cu_seqlens is None else (result, None)
            self._fill_cache(zxbcdt, conv_state, ssm_state, final_states, cu_seqlens, A)
        if seqlen is not None:
            out = out.flatten(0, 1)
        return out

    def _D(self) -> Tensor:
        return self.D.unflatten(0, (-1, self.headdim)) if self.D_has_hdim else self.D

    def _split(self, zxbcdt: Tensor) -> Tuple[Tensor, ...]:
        """``(z0, x0, z, xBC, dt)`` along the last dim (mamba_ssm's split)."""
        d_mlp = (zxbcdt.shape[-1] - 2 * self.d_ssm - 2 * self.ngroups * self.d_state
                 - self.nheads) // 2
        return torch.split(zxbcdt, [d_mlp, d_mlp, self.d_ssm,
                                    self.d_ssm + 2 * self.ngroups * self.d_state, self.nheads],
                           dim=-1)

    def _fill_cache(self, zxbcdt: Tensor, conv_state: Tensor, ssm_state: Tensor,
                    final_states: Optional[Tensor], cu_seqlens: Optional[Tensor],
                    A: Tensor) -> None:
        """The prefill's states into the cache: the last d_conv conv inputs, and the scan's
        final state (``final_states``), or with ``cu_seqlens`` those of each packed
        sequence (batch 1; one extra forward scan per sequence for the state)."""
        xBC = self._split(zxbcdt)[3]
        with torch.no_grad():
            if cu_seqlens is None:
                conv_state.copy_(_last_inputs(xBC, self.d_conv))
                ssm_state.copy_(final_states)
                return
            if zxbcdt.shape[0] != 1:
                raise ValueError("Mamba2: varlen inference (cu_seqlens) needs batch size 1, got "
                                 f"{zxbcdt.shape[0]}")
            bounds = _check_cu_seqlens(cu_seqlens, zxbcdt.shape[1])
            conv_state.copy_(torch.cat([_last_inputs(xBC[:, s:e], self.d_conv)
                                        for s, e in zip(bounds, bounds[1:])]))
            xBC = _causal_conv1d(xBC, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                                 self._seq_idx(bounds, xBC.device), True)
            x, B, C = torch.split(xBC, [self.d_ssm, self.ngroups * self.d_state,
                                        self.ngroups * self.d_state], dim=-1)
            dt = self._split(zxbcdt)[4]
            ssm_state.copy_(_varlen_states(
                x.unflatten(-1, (self.nheads, self.headdim)), dt, A,
                B.unflatten(-1, (self.ngroups, self.d_state)),
                C.unflatten(-1, (self.ngroups, self.d_state)), self.chunk_size, self.dt_bias, None,
                bounds, True, self.dt_limit, ssm_state.dtype))

    @staticmethod
    def _seq_idx(bounds: list, device: torch.device) -> Tensor:
        lengths = torch.tensor([e - s for s, e in zip(bounds, bounds[1:])], device=device)
        return torch.repeat_interleave(torch.arange(len(lengths), device=device, dtype=torch.int32),
                                       lengths)[None]

    def step(self, hidden_states: Tensor, conv_state: Tensor,
             ssm_state: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """One decoding step (mamba_ssm's ``Mamba2.step``): hidden_states [B, 1, d_model] ->
        ``(out [B, 1, d_model], conv_state, ssm_state)``, the states updated in place:
        the conv on ``causal_conv1d_update`` (conv_state [B, conv channels, d_conv]), the
        SSM on ``selective_state_update`` (ssm_state [B, H, headdim, d_state], float32 or the
        activations' dtype) with Mamba-2's per-head A, dt, D and dt_bias expanded (no
        copies), then the gated RMSNorm (or the z gate), the MLP part and out_proj. Unlike
        mamba_ssm's step, ``dt_limit`` is applied (a no-op at its default (0, inf))."""
        if hidden_states.dim() != 3 or hidden_states.shape[1] != 1:
            raise ValueError("Mamba2.step: hidden_states must have shape [batch, 1, d_model] (one "
                             f"token at a time), got {tuple(hidden_states.shape)}")
        z0, x0, z, xBC, dt = self._split(self.in_proj(hidden_states.squeeze(1)))
        xBC = causal_conv1d_update(xBC, conv_state, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                                   self.activation)
        x, B, C = torch.split(xBC, [self.d_ssm, self.ngroups * self.d_state,
                                    self.ngroups * self.d_state], dim=-1)
        H, P, N = self.nheads, self.headdim, self.d_state
        A = -torch.exp(self.A_log.float())
        dt_bias, softplus = self.dt_bias, True
        if self.dt_limit != (0.0, _INF):  # processed here: the op has no limits
            acc = torch.promote_types(dt.dtype, torch.float32)  # (the scan's precision)
            dt = F.softplus(dt.to(acc) + self.dt_bias.to(acc), threshold=20.0)
            dt = dt.clamp(self.dt_limit[0], self.dt_limit[1])
            dt_bias, softplus = None, False
        D = self._D()
        y = selective_state_update(
            ssm_state, x.unflatten(-1, (H, P)), dt[..., None].expand(-1, H, P),
            A[:, None, None].expand(H, P, N), B.unflatten(-1, (self.ngroups, N)),
            C.unflatten(-1, (self.ngroups, N)), D if D.dim() == 2 else D[:, None].expand(H, P),
            z=None if self.rmsnorm else z.unflatten(-1, (H, P)),
            dt_bias=None if dt_bias is None else dt_bias[:, None].expand(H, P), dt_softplus=softplus)
        y = y.flatten(-2)
        if self.rmsnorm:
            y = self.norm(y, z)
        if z0.shape[-1] > 0:
            y = torch.cat([(F.silu(z0) * x0).to(y.dtype), y], dim=-1)
        out = self.out_proj(y)
        return out.unsqueeze(1), conv_state, ssm_state

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int,
                                 dtype: Optional[torch.dtype] = None,
                                 **kwargs) -> Tuple[Tensor, Tensor]:
        """mamba_ssm's: zero ``(conv_state [B, conv channels, d_conv]`` (channel-last, in the
        conv weight's dtype or ``dtype``), ``ssm_state [B, H, headdim, d_state])`` (in_proj's
        dtype or ``dtype``). ``max_seqlen`` is not used (the states do not grow)."""
        device = self.out_proj.weight.device
        conv_dtype = self.conv1d.weight.dtype if dtype is None else dtype
        conv_state = torch.zeros(batch_size, self.d_conv, self.conv1d.weight.shape[0], device=device,
                                 dtype=conv_dtype).transpose(1, 2)
        ssm_dtype = self.in_proj.weight.dtype if dtype is None else dtype
        ssm_state = torch.zeros(batch_size, self.nheads, self.headdim, self.d_state, device=device,
                                dtype=ssm_dtype)
        return conv_state, ssm_state

    def _get_states_from_cache(self, inference_params, batch_size: int,
                               initialize_states: bool = False) -> Tuple[Tensor, Tensor]:
        """This layer's ``(conv_state, ssm_state)`` in ``inference_params``, allocated (zeros)
        on first use; zeroed again with ``initialize_states``."""
        if self.layer_idx is None:
            raise ValueError("Mamba2: decoding with inference_params needs the layer's layer_idx "
                             "(the key of its states in the cache)")
        states = inference_params.key_value_memory_dict
        if self.layer_idx not in states:
            conv_state = torch.zeros(batch_size, self.d_conv, self.conv1d.weight.shape[0],
                                     device=self.conv1d.weight.device,
                                     dtype=self.conv1d.weight.dtype).transpose(1, 2)
            ssm_state = torch.zeros(batch_size, self.nheads, self.headdim, self.d_state,
                                    device=self.in_proj.weight.device, dtype=self.in_proj.weight.dtype)
            states[self.layer_idx] = (conv_state, ssm_state)
        else:
            conv_state, ssm_state = states[self.layer_idx]
            if initialize_states:
                conv_state.zero_()
                ssm_state.zero_()
        return conv_state, ssm_state

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, "
                f"headdim={self.headdim}, nheads={self.nheads}, ngroups={self.ngroups}, "
                f"d_ssm={self.d_ssm}, chunk_size={self.chunk_size}, rmsnorm={self.rmsnorm}")
