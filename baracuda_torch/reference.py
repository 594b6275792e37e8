"""Pure-PyTorch references: the single source of truth for tests and benchmarks.

Each function computes what the matching ``baracuda_torch.functional`` op computes,
with plain PyTorch ops (so its gradients come from PyTorch's autograd). Run them on
float64 inputs for a ground truth, or on the op's own dtype for "what PyTorch gives".
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

# ---- gated activations ----------------------------------------------------------


def _gelu_tanh(t: Tensor) -> Tensor:
    """``F.gelu(t, approximate="tanh")``; in float64 (the ground truth) the same function as
    t·σ(2u), u = √(2/π)·(t + 0.044715·t³), since 0.5·(1 + tanh u) = σ(2u): F.gelu's
    float64 kernel cancels in 1 + tanh u for negative t (it loses 1e-12 of the value at
    t = −4 and 3e-7 at t = −6, and its autograd the same in the derivative), where the
    kernels under test compute σ(2u)."""
    if t.dtype != torch.float64:
        return F.gelu(t, approximate="tanh")
    u = 0.7978845608028654 * (t + 0.044715 * t * t * t)
    return t * torch.sigmoid(2.0 * u)


def _gelu(t: Tensor) -> Tensor:
    """``F.gelu(t)``; in float64 (the ground truth) the same function as t·Φ(t) with
    Φ(t) = erfc(−t/√2)/2: F.gelu's 1 + erf(t/√2) cancels for negative t (it loses 1.3e-10
    of Φ at t = −6 and 1.8 % at t = −8)."""
    if t.dtype != torch.float64:
        return F.gelu(t)
    return 0.5 * t * torch.special.erfc(-0.7071067811865476 * t)


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
        gate = _gelu(b)
    elif kind == "geglu_tanh":
        gate = _gelu_tanh(b)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return a * gate


def gated_activation_pair(gate: Tensor, up: Tensor, kind: str = "swiglu") -> Tensor:
    """``act(gate) * up``, as Hugging Face's ``act_fn(gate_proj(x)) * up_proj(x)``."""
    acts = {"glu": torch.sigmoid, "reglu": F.relu, "swiglu": F.silu, "geglu": _gelu,
            "geglu_tanh": _gelu_tanh}
    if kind not in acts:
        raise ValueError(f"unknown kind {kind!r}")
    return acts[kind](gate) * up


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


def rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0, interleaved: bool = False,
         rotary_dim: int | None = None) -> Tensor:
    """RoPE of ``x`` ``[B, H, S, D]``: cos/sin from float64 angles, cast to ``x``'s dtype,
    rotation in ``x``'s dtype (in float64 this is the ground truth; in a low dtype it is
    what PyTorch itself gives)."""
    R = x.shape[-1] if rotary_dim in (None, -1) else rotary_dim
    theta = rope_angles(x.shape[-2], positions, R, base, x.device)
    return apply_rope(x, theta.cos().to(x.dtype), theta.sin().to(x.dtype), interleaved)


def rope_backward(dy: Tensor, positions: Tensor | None = None, base: float = 10000.0,
                  interleaved: bool = False, rotary_dim: int | None = None) -> Tensor:
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


def rope_cos_sin(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                 backward: bool = False) -> Tensor:
    """``x·cos + rotate(x)·sin`` on the first ``R`` features of ``x`` ``[B, H, S, D]`` (the
    rest pass through), in the dtype of the operands, for a ``[Bc, S, R]`` table (one entry
    per feature) or a ``[S, R/2]`` one (one per pair). ``backward=True`` gives the
    transpose (the gradient with respect to ``x`` of the forward, applied to ``x``)."""
    if cos.dim() == 2:  # one entry per pair -> one per feature
        cos = (cos.repeat_interleave(2, -1) if interleaved else torch.cat((cos, cos), -1))[None]
        sin = (sin.repeat_interleave(2, -1) if interleaved else torch.cat((sin, sin), -1))[None]
    R = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [Bc, 1, S, R]
    xr, xp = x[..., :R], x[..., R:]

    def rot(t: Tensor) -> Tensor:
        if interleaved:
            return torch.stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2)
        return torch.cat((-t[..., R // 2:], t[..., :R // 2]), -1)

    def rot_t(t: Tensor) -> Tensor:  # the transpose of rot
        if interleaved:
            return torch.stack((t[..., 1::2], -t[..., 0::2]), -1).flatten(-2)
        return torch.cat((t[..., R // 2:], -t[..., :R // 2]), -1)

    yr = xr * cos + (rot_t(xr * sin) if backward else rot(xr) * sin)
    return torch.cat((yr, xp), -1)


# ---- lerp -------------------------------------------------------------------------


def lerp(a: Tensor, b: Tensor, weight) -> Tensor:
    """``a + weight * (b - a)`` with broadcasting; ``weight`` a number or a tensor.
    PyTorch's own ``torch.lerp`` (its gradients come from PyTorch's autograd)."""
    return torch.lerp(a, b, weight)


# ---- gather -----------------------------------------------------------------------


def gather(src: Tensor, dim: int, index: Tensor) -> Tensor:
    return torch.gather(src, dim, index)


# ---- rms_norm ---------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None,
             convention: str = "torch") -> Tuple[Tensor, Tensor]:
    """RMSNorm over the last dim as each convention's own PyTorch code computes it:
    ``(y, rstd)``, ``rstd = rsqrt(mean(x²) + eps)`` in float32 (float64 for float64 x).

    - ``"torch"`` (``torch.nn.functional.rms_norm``): ``(x·rstd·w)`` cast to x's dtype;
    - ``"llama"`` (transformers' ``LlamaRMSNorm``): ``w · (x·rstd).to(x.dtype)``, in the
      promoted dtype of x and w;
    - ``"gemma"`` (``GemmaRMSNorm``): ``(x·rstd·(1 + w))`` cast to x's dtype.

    ``eps=None`` is the compute dtype's machine epsilon, as in torch."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if eps is None:
        eps = torch.finfo(compute).eps
    xf = x.to(compute)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * rstd
    if weight is None:
        y = n.to(x.dtype)
    elif convention == "torch":
        y = (n * weight).to(x.dtype)
    elif convention == "llama":
        y = weight * n.to(x.dtype)
    elif convention == "gemma":
        y = (n * (1.0 + weight.to(compute))).to(x.dtype)
    else:
        raise ValueError(f"unknown convention {convention!r}")
    return y, rstd.squeeze(-1)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None,
                 eps: Optional[float] = None, convention: str = "torch") -> Tuple[Tensor, Tensor, Tensor]:
    """The residual add of a decoder layer, then :func:`rms_norm`: ``(y, h, rstd)`` for
    ``h = x + residual`` (in x's dtype, as the layer adds them)."""
    h = x + residual
    y, rstd = rms_norm(h, weight, eps, convention)
    return y, h, rstd


def gated_rms_norm(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, z: Optional[Tensor] = None,
                   eps: float = 1e-6, group_size: Optional[int] = None,
                   norm_before_gate: bool = True) -> Tuple[Tensor, Tensor]:
    """mamba_ssm's gated RMSNorm (``rmsnorm_fn``): ``(y, rstd)``, each group of
    ``group_size`` channels (all of them when None) normalized by its own
    ``rstd = rsqrt(mean(h²) + eps)`` ([..., ngroups]), in float32 (float64 for float64 x):
    ``y = (h·rstd·w + b)·silu(z)`` with ``h = x`` (``norm_before_gate``), or
    ``y = h·rstd·w + b`` with ``h = x·silu(z)``; y in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(compute)
    zf = z.to(compute) if z is not None else None
    if zf is not None and not norm_before_gate:
        h = h * F.silu(zf)
    size = x.shape[-1] if group_size is None else group_size
    groups = 1 if group_size is None else x.shape[-1] // group_size
    hg = h.unflatten(-1, (groups, size))
    rstd = torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    y = (hg * rstd).flatten(-2) * weight.to(compute)
    if bias is not None:
        y = y + bias.to(compute)
    if zf is not None and norm_before_gate:
        y = y * F.silu(zf)
    return y.to(x.dtype), rstd.squeeze(-1)


# ---- causal_conv1d ----------------------------------------------------------------


def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                  activation: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """Causal depthwise conv1d over time, as causal-conv1d defines it: ``(out, final_states)``.

    x [B, D, L], weight [D, W] (tap W-1 on the current step), bias [D], initial_states
    [B, D, W-1] (x at times -(W-1) .. -1; zeros without), seq_idx [B, L]::

        out[t] = act(bias + Σ_k weight[:, k] · x̃[t - (W-1) + k])

    over the taps whose step has t's seq_idx (none before time 0 then), and 0 at a
    padding step (seq_idx < 0); act is SiLU for ``"silu"``/``"swish"``.
    ``final_states = x̃[..., L - (W-1):]``, the last W-1 inputs. In the inputs' promoted
    dtype, cast to x's at the end."""
    B, D, L = x.shape
    W = weight.shape[1]
    pad = initial_states if initial_states is not None else x.new_zeros(B, D, W - 1)
    xt = torch.cat([pad, x], dim=-1)  # x̃ at times -(W-1) .. L-1
    out = bias[:, None].expand(D, L) if bias is not None else None
    t = torch.arange(L, device=x.device)
    for k in range(W):
        tap = xt[..., k:k + L] * weight[:, k, None]
        if seq_idx is not None:
            tau = t - (W - 1) + k
            same = (tau >= 0) & (seq_idx.gather(1, tau.clamp_min(0).expand(B, L)) == seq_idx)
            tap = torch.where(same[:, None, :], tap, 0)
        out = tap if out is None else out + tap
    if activation in ("silu", "swish"):
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    if seq_idx is not None:
        out = torch.where((seq_idx < 0)[:, None, :], 0, out)
    return out.to(x.dtype), xt[..., L:]


def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                         activation: Optional[str] = None, cache_seqlens: Optional[Tensor] = None,
                         conv_state_indices: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """causal-conv1d's ``causal_conv1d_update`` without side effects: ``(out, new_state)``,
    ``new_state`` a fresh pool (``conv_state`` is not modified).

    x [B, D] or [B, D, L], conv_state [S, D, M] (M >= W - 1), weight [D, W]. Per row b,
    with st = conv_state[i] (i = conv_state_indices[b], or b): the window is st's last
    W - 1 values, or with ``cache_seqlens`` (a circular buffer, c = cache_seqlens[b] mod M)
    st[(c - (W-1) + j) mod M]; ``out[t] = act(bias + Σ_k weight[:, k] · [window, x][t + k])``;
    the new st is the last M values of [st, x], or st with x written at (c + t) mod M (a
    later step wins). A negative index is a padding row: out 0, its pool row untouched.
    In the promoted dtype of x and weight, out cast to x's dtype."""
    squeeze = x.dim() == 2
    x3 = x[..., None] if squeeze else x
    batch, D, L = x3.shape
    W = weight.shape[1]
    M = conv_state.shape[2]
    rows = (conv_state_indices.long() if conv_state_indices is not None
            else torch.arange(batch, device=x.device))
    pad = rows < 0
    st = conv_state[rows.clamp_min(0)] if conv_state.size(0) else x3.new_zeros(batch, D, M)
    ar = torch.arange(W - 1, device=x.device)
    if cache_seqlens is None:
        window = st[..., M - (W - 1):]
        cat = torch.cat([st, x3], -1)
        new_rows = cat[..., cat.shape[-1] - M:]
    else:
        c = cache_seqlens.long()[:, None]
        window = st.gather(2, torch.remainder(c - (W - 1) + ar, max(M, 1))[:, None, :].expand(batch, D, W - 1))
        new_rows = st
        for t in range(L if M else 0):  # in order: a later step wins
            at = torch.remainder(c + t, M)[:, None, :].expand(batch, D, 1)
            new_rows = new_rows.scatter(2, at, x3[..., t:t + 1].to(st.dtype))
    xt = torch.cat([window, x3], -1).to(torch.promote_types(x.dtype, weight.dtype))
    out = bias[:, None].expand(D, L).to(xt.dtype) if bias is not None else None
    for k in range(W):
        tap = xt[..., k:k + L] * weight[:, k, None]
        out = tap if out is None else out + tap
    if activation in ("silu", "swish"):
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    out = torch.where(pad[:, None, None], 0, out).to(x.dtype)
    new = conv_state.clone()
    keep = ~pad
    new[rows[keep]] = new_rows[keep].to(new.dtype)
    return (out[..., 0] if squeeze else out), new


# ---- ssd_chunk_scan ---------------------------------------------------------------


def _expand_groups(t: Tensor, heads: int) -> Tensor:
    """[B, L, G, N] -> [B, L, H, N]: head h reads group h // (H // G)."""
    return t.repeat_interleave(heads // t.size(2), dim=2)


def ssd_chunk_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   chunk_size: int = 256) -> Tensor:
    """Mamba-2 SSD as the sequential recurrence (a Python loop over L): the ground truth.

    Shapes: x [B, L, H, D], dt [B, L, H], A [H], B and C [B, L, G, N] with H % G == 0.
    Per batch and head, with h_{-1} = 0:
    ``decay_t = exp(dt_t A)``, ``h_t = decay_t h_{t-1} + (dt_t x_t) ⊗ B_t``,
    ``y_t = h_t C_t``. ``chunk_size`` does not change the function and is ignored.
    Slow (L steps of small ops); meant for float64 on small shapes.
    """
    del chunk_size
    batch, L, H, D = x.shape
    Bh, Ch = _expand_groups(B, H), _expand_groups(C, H)
    decay = torch.exp(dt * A)                                  # [B, L, H]
    state = x.new_zeros(batch, H, D, B.size(-1))
    ys = []
    for t in range(L):
        u = dt[:, t, :, None] * x[:, t]                        # [B, H, D]
        state = decay[:, t, :, None, None] * state + u[..., None] * Bh[:, t, :, None, :]
        ys.append((state * Ch[:, t, :, None, :]).sum(-1))      # [B, H, D]
    if not ys:
        return x.new_zeros(x.shape)
    return torch.stack(ys, dim=1)


def _segment_sums(a: Tensor) -> Tensor:
    """a [..., T] -> [..., T, T] with out[..., i, j] = a[j+1] + ... + a[i] for j <= i and
    -inf above the diagonal, so that exp(out) is the decay from step j to step i (a
    cumulative sum of masked copies rather than a difference of cumsums, which would
    lose the small sums next to large ones)."""
    T = a.size(-1)
    below = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    s = a[..., :, None].expand(*a.shape, T).masked_fill(~below, 0).cumsum(-2)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=a.device).tril(), -torch.inf)


def ssd_chunk_scan_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           chunk_size: int = 256) -> Tensor:
    """The same function as :func:`ssd_chunk_scan`, computed by the chunked
    state-space-duality algorithm in plain PyTorch (the ``ssd_minimal_discrete`` recipe
    of the Mamba-2 paper, with B/C groups): per chunk of Q steps, (1) the intra-chunk
    output ``(C Bᵀ ∘ decay) (dt x)``, (2) each chunk's own final state, (3) the states
    entering the chunks by a recurrence over chunks, (4) their contribution ``C h``.
    Any L: the sequence is padded with dt = 0 steps (decay 1, no input) to a multiple
    of Q. Memory is O(B·H·L·Q); eager PyTorch's best without a fused kernel."""
    batch, L, H, D = x.shape
    G, N = B.shape[2], B.shape[3]
    P = H // G if G else 0
    Q = chunk_size
    if batch * L * H * D == 0:
        return x.new_zeros(x.shape)
    nc = -(-L // Q)
    pad = nc * Q - L
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    xs = (x * dt[..., None]).reshape(batch, nc, Q, G, P, D)
    a = (dt * A).reshape(batch, nc, Q, G, P).permute(0, 3, 4, 1, 2)   # [b, g, p, c, l]
    Bc = B.reshape(batch, nc, Q, G, N)
    Cc = C.reshape(batch, nc, Q, G, N)
    a_cum = a.cumsum(-1)
    # 1. Intra-chunk: y[l] = sum_{s <= l} (C_l . B_s) decay(s -> l) xs_s.
    decay_ls = torch.exp(_segment_sums(a))                             # [b, g, p, c, l, s]
    CB = torch.einsum("bclgn,bcsgn->bgcls", Cc, Bc)
    y_diag = torch.einsum("bgcls,bgpcls,bcsgpd->bclgpd", CB, decay_ls, xs)
    # 2. Each chunk's final state from its own inputs.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)                  # [b, g, p, c, s]
    local = torch.einsum("bcsgn,bgpcs,bcsgpd->bcgpdn", Bc, decay_to_end, xs)
    # 3. States entering each chunk: a recurrence over chunks with the chunk totals.
    local = torch.cat([torch.zeros_like(local[:, :1]), local], dim=1)  # [b, c+1, g, p, d, n]
    totals = F.pad(a_cum[..., -1], (1, 0))                             # [b, g, p, c+1]
    decay_chunks = torch.exp(_segment_sums(totals))                    # [b, g, p, c+1, c+1]
    entering = torch.einsum("bgpzc,bcgpdn->bzgpdn", decay_chunks, local)[:, :-1]
    # 4. Their contribution: y[l] += decay(chunk start -> l) C_l . h_entering.
    y_off = torch.einsum("bclgn,bcgpdn,bgpcl->bclgpd", Cc, entering, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(batch, nc * Q, H, D)
    return y[:, :L]



def process_dt(dt: Tensor, dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
               dt_limit: Tuple[float, float] = (0.0, float("inf"))) -> Tensor:
    """mamba_ssm's dt preprocessing: ``dt + dt_bias``, then softplus where the sum is at
    most 20 (``dt_softplus``), then a clamp to ``dt_limit`` (always; the default
    ``(0, inf)`` maps a negative dt to 0). Autograd gives the gradient the kernels use:
    zero where the value is strictly outside ``dt_limit`` and passed unchanged on the
    bounds themselves (mamba_ssm's mask is ``dt < dt_min or dt > dt_max``; ``Tensor.clamp``'s
    own gradient is zero on a bound, which a bf16 ``dt + dt_bias`` or a dt of 0 under the
    default limit reaches exactly), ``sigmoid`` of the pre-softplus value where softplus
    applied."""
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt, threshold=20.0)
    inside = (dt >= dt_limit[0]) & (dt <= dt_limit[1])
    return torch.where(inside, dt, dt.clamp(min=dt_limit[0], max=dt_limit[1]))


def ssd_chunk_scan_combined(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                            chunk_size: int = 256, D: Optional[Tensor] = None,
                            z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                            initial_states: Optional[Tensor] = None,
                            seq_idx: Optional[Tensor] = None, dt_softplus: bool = False,
                            dt_limit: Tuple[float, float] = (0.0, float("inf")),
                            return_final_states: bool = False):
    """mamba_ssm's ``mamba_chunk_scan_combined`` as the step-by-step recurrence (a
    Python loop over L): the ground truth for every option. Computes in the dtype of its
    inputs (pass float64).

    ``dt <- process_dt(dt, dt_bias, dt_softplus, dt_limit)``; per batch and head, with
    ``h_{-1} = initial_states`` (or 0) and the state reset to 0 before every step t > 0
    where ``seq_idx[b, t] != seq_idx[b, t-1]``::

        h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) ⊗ B_t,   y_t = h_t C_t + D ∘ x_t
        out_t = y_t · silu(z_t)   (with z)

    Returns ``out``, or ``(out, final_states)`` with ``final_states = h_{L-1}``
    (``initial_states`` or zeros when L = 0). ``chunk_size`` does not change the
    function and is ignored."""
    del chunk_size
    batch, L, H, Dh = x.shape
    N = B.size(-1)
    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit)
    Bh, Ch = _expand_groups(B, H), _expand_groups(C, H)
    decay = torch.exp(dt * A)                                  # [B, L, H]
    state = (initial_states.to(x.dtype) if initial_states is not None
             else x.new_zeros(batch, H, Dh, N))
    ys = []
    for t in range(L):
        if seq_idx is not None and t > 0:
            keep = (seq_idx[:, t] == seq_idx[:, t - 1])[:, None, None, None]
            state = torch.where(keep, state, torch.zeros_like(state))
        u = dt[:, t, :, None] * x[:, t]                        # [B, H, D]
        state = decay[:, t, :, None, None] * state + u[..., None] * Bh[:, t, :, None, :]
        ys.append((state * Ch[:, t, :, None, :]).sum(-1))      # [B, H, D]
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(x.shape)
    if D is not None:
        y = y + x * (D.to(x.dtype) if D.dim() == 2 else D.to(x.dtype)[:, None])
    if z is not None:
        y = y * F.silu(z)
    return (y, state) if return_final_states else y


# ---- selective state update -------------------------------------------------------


def selective_state_update(state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                           dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
                           state_batch_indices: Optional[Tensor] = None,
                           tokens: bool = False) -> Tuple[Tensor, Tensor]:
    """mamba_ssm's ``selective_state_update`` as plain PyTorch, without side effects:
    ``(out, new_state)``, ``new_state`` a fresh pool with the updated rows (``state`` is
    not modified). ``tokens``: x, dt, z ``[B, T, H, P]`` and B, C ``[B, T, G, N]`` (the
    ``selective_state_update_tokens`` form), the tokens applied in order. Any operand may
    leave out its heads/groups dim of size 1. A negative ``state_batch_indices`` entry is
    a padding row: out 0, its pool row untouched. Per step (``δ = softplus?(dt + dt_bias)``)::

        s = exp(A δ) s + B (δ x),   y = Σ_n s C + D x,   out = y · silu(z)

    In the dtype of the inputs (pass float64); ``out`` in x's dtype, ``new_state`` in
    state's."""
    hx, xr = (2, 4) if tokens else (1, 3)

    def full(t, rank, at):
        return t if t is None or t.dim() == rank else t.unsqueeze(at)

    st = full(state, 4, 1)
    x, dt, z, B, C = (full(t, xr, hx) for t in (x, dt, z, B, C))
    A, D, dt_bias = full(A, 3, 0), full(D, 2, 0), full(dt_bias, 2, 0)
    if not tokens:
        x, dt, z, B, C = (None if t is None else t.unsqueeze(1) for t in (x, dt, z, B, C))
    batch, T, H, P = x.shape
    rows = (state_batch_indices.long() if state_batch_indices is not None
            else torch.arange(batch, device=x.device))
    pad = rows < 0
    s = st[rows.clamp_min(0)].to(x.dtype) if st.size(0) else x.new_zeros(batch, *st.shape[1:])
    Bh = B.repeat_interleave(H // B.size(2), dim=2)
    Ch = C.repeat_interleave(H // C.size(2), dim=2)
    delta = dt + dt_bias if dt_bias is not None else dt
    if dt_softplus:
        delta = F.softplus(delta, threshold=20.0)
    ys = []
    for t in range(T):
        d = delta[:, t]                                              # [B, H, P]
        s = torch.exp(A * d[..., None]) * s + Bh[:, t, :, None, :] * (d * x[:, t])[..., None]
        y = (s * Ch[:, t, :, None, :]).sum(-1)
        if D is not None:
            y = y + D * x[:, t]
        if z is not None:
            y = y * F.silu(z[:, t])
        ys.append(y)
    out = torch.stack(ys, 1) if ys else x.new_zeros(x.shape)
    out = torch.where(pad[:, None, None, None], 0, out).to(x.dtype)
    new = st.clone()
    keep = ~pad
    new[rows[keep]] = s[keep].to(new.dtype)
    if not tokens:
        out = out[:, 0]
    if state.dim() == 3:
        out = out.squeeze(-2)
        new = new.squeeze(1)
    return out, new
