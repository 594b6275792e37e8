"""Property-based fuzzing of every op with hypothesis (seeded through the "baracuda"
profile of conftest.py: derandomized, bounded examples, no deadline).

Each op has a strategy function below that draws a problem (shapes with sizes 0, 1,
odd and larger, the op's options, a layout per input: contiguous, transposed, sliced
with a step or an offset, stride-0 broadcast) and returns a :class:`Case`. The same
properties run over every case:

* forward and every input gradient against ``baracuda_torch.reference`` in float64,
  with FlashAttention's rule for low precision (``helpers.assert_close_to_reference``),
  or within half a unit of the dtype of the float64 reference on the inputs rounded to
  the dtype (where one gradient does not sum several rounded ones);
* a NaN placed in one element of one input changes only the outputs that element can
  reach (its row for gated activations; its (batch, head, position) for RoPE; the
  outputs it broadcasts to for lerp; the outputs whose index points at it for gather;
  the same batch, head and later timesteps for SSD): every other output keeps its
  exact bits;
* a NaN placed in one element of the output gradient changes only the input gradients
  it can reach, the same way backwards.

The reach maps of the first families above are rules written per op; the later ones
(the gated pair, RoPE from cos/sin tables, RMSNorm, gated RMSNorm, the causal conv and
its update, the state update, ``mamba_chunk_scan_combined``) take theirs from where the
float64 reference carries a NaN (``_reference_reach``). The conv update and the state update
have no gradients: their output is the op's result and the state it updated in place,
forward properties only.

To fuzz a new op: write a ``@st.composite`` strategy returning a Case (its inputs as
float64 *base* tensors, the layout view of each, our op and the reference as functions
of the views, and the two reach maps, ``_reference_reach`` unless the op may spread a
NaN further than its reference), and add it to ``STRATEGIES``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest
import torch
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES, assert_close_to_reference, compute_eps

Tensor = torch.Tensor
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@dataclass
class Case:
    name: str
    bases: list[Tensor]                       # float64 CPU storage of each float input
    views: list[Callable[[Tensor], Tensor]]   # base -> the tensor the op gets (its layout)
    ours: Callable[..., Tensor]               # our op, on the views
    ref: Callable[..., Tensor]                # reference.py, on the views
    # reach(k, mask over input k) -> mask over the output it may change
    reach: Callable[[int, Tensor], Tensor]
    # reach_back(mask over the output) -> masks over each input it may change (gradients)
    reach_back: Callable[[Tensor], list[Tensor]]
    floor_ulps: float = 32
    info: dict = field(default_factory=dict)
    differentiable: bool = True               # False: forward properties only
    # Inputs whose 16-bit gradient is formed from a value the forward stored in the dtype
    # (the SSD's dz from y before the gate, as mamba_ssm keeps its out_x): one more unit.
    stored_16bit: tuple = ()
    # seen(dtype): the float64 reference of what the op computes from inputs in `dtype`,
    # for an op that rounds an intermediate to it (rms_norm's h = x + residual, which the
    # norm then takes, as the decoder layer adds them in its dtype; the llama convention's
    # x·rstd, rounded before the weight); None: ref.
    seen: Optional[Callable[[torch.dtype], Callable[..., Tensor]]] = None
    # term_scales(views in float64, dys): per input, the size of the terms its gradient is
    # made of where the largest float64 gradient (_view_grad_scales) understates them by
    # structure, whatever dy is (0: no such input); None: nowhere.
    term_scales: Optional[Callable[[list, list], list]] = None
    # out_terms(views in float64): the size of the terms the output is made of where they
    # can cancel to far less than it (lerp's a and w·(b − a)); the forward's floor counts
    # it. In float64 the reference is PyTorch's own float64 lerp, whose roundings differ
    # from ours by units of those terms, not of the output. None: the output's own size.
    out_terms: Optional[Callable[[list], float]] = None

    def reduced_grads(self, out_shape) -> list:
        """Inputs whose gradient sums several per-element gradients: broadcast by the op
        (lerp: a view smaller than the output) or by the layout (any op: a stride-0 view of
        a smaller base, whose gradient autograd sums over the view's copies)."""
        out_numel = torch.Size(out_shape).numel()

        def reduced(view: Tensor) -> bool:
            return (self.name.startswith("lerp") and view.numel() != out_numel) or \
                any(s == 0 and n > 1 for s, n in zip(view.stride(), view.shape))
        return [k for k, (b, v) in enumerate(zip(self.bases, self.views)) if reduced(v(b))]

    def __repr__(self):
        return f"Case({self.name}, {self.info})"


# ---- layouts -----------------------------------------------------------------------

LAYOUTS = ["contiguous", "transposed", "sliced_step", "sliced_offset", "broadcast"]


@st.composite
def layout_of(draw, shape, kinds=LAYOUTS):
    """(base_shape, view): view(base) has `shape` and the drawn memory layout."""
    shape = tuple(shape)
    kind = draw(st.sampled_from(kinds))
    n = len(shape)
    if kind == "transposed" and n >= 2:
        i, j = draw(st.sampled_from([(a, b) for a in range(n) for b in range(a + 1, n)]))
        base = list(shape)
        base[i], base[j] = base[j], base[i]
        return tuple(base), lambda t: t.transpose(i, j)
    if kind == "sliced_step" and n >= 1:
        d = draw(st.integers(0, n - 1))
        base = list(shape)
        base[d] = 2 * shape[d]
        return tuple(base), lambda t: t.narrow(d, 0, 2 * shape[d])[(slice(None),) * d + (slice(None, None, 2),)]
    if kind == "sliced_offset" and n >= 1:
        d = n - 1
        base = list(shape)
        base[d] = shape[d] + 3
        return tuple(base), lambda t: t.narrow(d, 1, shape[d])
    if kind == "broadcast" and n >= 1:
        d = draw(st.integers(0, n - 1))
        base = list(shape)
        base[d] = 1
        return tuple(base), lambda t: t.expand(shape)
    return shape, lambda t: t


def _rand(shape, seed, scale=1.0, low=None, high=None):
    g = torch.Generator().manual_seed(seed)
    if low is not None:
        return torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def _heads(mask_g: Tensor, H: int, dim: int) -> Tensor:
    """A mask over B/C groups -> the heads that read them."""
    G = mask_g.size(dim)
    return mask_g.repeat_interleave(H // G, dim=dim) if G else mask_g


def _later(mask: Tensor, dim: int, chunk: Optional[int]) -> Tensor:
    """Every step at or after a marked one along `dim` (from the start of its chunk when
    `chunk` is given: the chunked CUDA kernel may spread NaN within a chunk)."""
    if chunk is not None and mask.size(dim) > 0:
        L = mask.size(dim)
        starts = []
        for c in range(0, L, chunk):
            starts.append(mask.narrow(dim, c, min(chunk, L - c)).any(dim, keepdim=True)
                          .expand_as(mask.narrow(dim, c, min(chunk, L - c))))
        mask = torch.cat(starts, dim)
    return mask.long().cumsum(dim) > 0


def _earlier(mask: Tensor, dim: int, chunk: Optional[int]) -> Tensor:
    return _later(mask.flip(dim), dim, None).flip(dim) if chunk is None else (
        _later(mask.flip(dim), dim, None).flip(dim) | _chunk_any(mask, dim, chunk))


def _chunk_any(mask: Tensor, dim: int, chunk: int) -> Tensor:
    L = mask.size(dim)
    parts = [mask.narrow(dim, c, min(chunk, L - c)).any(dim, keepdim=True)
             .expand_as(mask.narrow(dim, c, min(chunk, L - c))) for c in range(0, L, chunk)]
    return torch.cat(parts, dim) if parts else mask


# ---- per-op strategies -------------------------------------------------------------

GATED_KINDS = ["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]
SIZES = st.sampled_from([0, 1, 2, 3, 5, 8, 17, 64, 133])
SMALL = st.sampled_from([1, 2, 3, 5])


@st.composite
def gated_cases(draw, device):
    ndim = draw(st.integers(1, 4))
    shape = [draw(SIZES) if i == ndim - 1 else draw(SMALL) for i in range(ndim)]
    dim = draw(st.integers(-ndim, ndim - 1))
    shape[dim] = 2 * draw(st.sampled_from([0, 1, 3, 4, 33, 70]))
    kind = draw(st.sampled_from(GATED_KINDS))
    gate_first = draw(st.booleans())
    base_shape, view = draw(layout_of(shape))
    seed = draw(st.integers(0, 2**31 - 1))

    def halves(m):
        a, b = m.chunk(2, dim) if m.size(dim) else (m, m)
        return a | b

    return Case(
        "gated_activation", [_rand(base_shape, seed, 2.0)], [view],
        lambda x: bt.gated_activation(x, kind, dim, gate_first),
        lambda x: ref.gated_activation(x, kind, dim, gate_first),
        reach=lambda k, m: halves(m),
        reach_back=lambda mo: [torch.cat([mo, mo], dim)],
        info=dict(shape=shape, dim=dim, kind=kind, gate_first=gate_first))


@st.composite
def rope_cases(draw, device):
    B, H = draw(SMALL), draw(SMALL)
    S = draw(st.sampled_from([0, 1, 3, 16, 37]))
    D = draw(st.sampled_from([2, 4, 6, 8, 16, 34, 64]))
    rotary = draw(st.sampled_from([None] + [r for r in (2, 4, 6, D - 2) if 0 < r < D]))
    interleaved = draw(st.booleans())
    base_f = draw(st.sampled_from([10000.0, 500.0, 1.5e6]))
    pkind = draw(st.sampled_from(["none", "seq", "batch", "batch_expanded"]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed + 1)
    positions = None
    if pkind == "seq":
        positions = torch.randint(-100, 10**6, (S,), generator=g).to(device)
    elif pkind == "batch":
        positions = torch.randint(0, 5000, (B, S), generator=g).to(device)
    elif pkind == "batch_expanded":
        positions = torch.randint(0, 5000, (1, S), generator=g).expand(B, S).to(device)
    # [B, H, S, D], also as a [B, S, H, D] tensor seen through transpose(1, 2).
    if draw(st.booleans()):
        base_shape, view = draw(layout_of((B, H, S, D)))
    else:
        base_shape, view = (B, S, H, D), (lambda t: t.transpose(1, 2))

    def rows(m):
        return m.any(-1, keepdim=True).expand_as(m)

    return Case(
        "rope", [_rand(base_shape, seed)], [view],
        lambda x: bt.rope(x, positions, base_f, interleaved, rotary),
        lambda x: ref.rope(x, None if positions is None else positions.cpu().to(x.device),
                           base_f, interleaved, rotary),
        reach=lambda k, m: rows(m), reach_back=lambda mo: [rows(mo)],
        # Angles up to 1e6 rad: float32 sin/cos of a float64-reduced angle.
        floor_ulps=64,
        info=dict(shape=(B, H, S, D), rotary=rotary, interleaved=interleaved, base=base_f,
                  positions=pkind,
                  max_angle=0 if positions is None else int(positions.abs().max()) if positions.numel() else 0))


@st.composite
def _broadcast_shapes(draw, n_inputs):
    ndim = draw(st.integers(0, 4))
    out = [draw(st.sampled_from([1, 2, 3, 7, 16, 65])) for _ in range(ndim)]
    if ndim and draw(st.integers(0, 9)) == 0:
        out[draw(st.integers(0, ndim - 1))] = 0
    shapes = []
    for _ in range(n_inputs):
        drop = draw(st.integers(0, ndim))
        s = [1 if draw(st.integers(0, 3)) == 0 else d for d in out[drop:]]
        shapes.append(tuple(s))
    # One input keeps every dim, so that the output shape is `out`.
    keep = draw(st.integers(0, n_inputs - 1))
    shapes[keep] = tuple(out)
    return tuple(out), shapes


def _broadcast_reach(out_shape):
    return lambda k, m: torch.broadcast_to(m, out_shape)


def _sum_to(mo, shape):
    return mo.double().sum_to_size(shape) > 0 if mo.dim() else mo.reshape(shape)


def _lerp_terms(a, b, w) -> float:
    """The largest terms of lerp's two formulas, a + w·(b − a) and b − (1 − w)·(b − a)."""
    d = b - a
    terms = torch.maximum(a.abs() + (w * d).abs(), b.abs() + ((1 - w) * d).abs())
    return terms.max().item() if terms.numel() else 0.0


@st.composite
def lerp_scalar_cases(draw, device):
    out, (sa, sb) = draw(_broadcast_shapes(2))
    w = draw(st.sampled_from([0.0, 1.0, 0.5, -0.5, 0.3, 0.7, 1.5, -2.0]))
    (ba, va), (bb, vb) = draw(layout_of(sa)), draw(layout_of(sb))
    seed = draw(st.integers(0, 2**31 - 1))
    return Case(
        "lerp", [_rand(ba, seed, 2.0), _rand(bb, seed + 1, 2.0)], [va, vb],
        lambda a, b: bt.lerp(a, b, w), lambda a, b: ref.lerp(a, b, w),
        reach=_broadcast_reach(out), reach_back=lambda mo: [_sum_to(mo, sa), _sum_to(mo, sb)],
        info=dict(a=sa, b=sb, weight=w), out_terms=lambda v: _lerp_terms(v[0], v[1], w))


@st.composite
def lerp_tensor_cases(draw, device):
    out, (sa, sb, sw) = draw(_broadcast_shapes(3))
    lays = [draw(layout_of(s)) for s in (sa, sb, sw)]
    seed = draw(st.integers(0, 2**31 - 1))
    bases = [_rand(lays[0][0], seed, 2.0), _rand(lays[1][0], seed + 1, 2.0),
             _rand(lays[2][0], seed + 2, low=-0.75, high=1.75)]
    return Case(
        "lerp.Tensor", bases, [l[1] for l in lays],
        lambda a, b, w: bt.lerp(a, b, w), lambda a, b, w: ref.lerp(a, b, w),
        reach=_broadcast_reach(out),
        reach_back=lambda mo: [_sum_to(mo, sa), _sum_to(mo, sb), _sum_to(mo, sw)],
        info=dict(a=sa, b=sb, w=sw), out_terms=lambda v: _lerp_terms(*v))


@st.composite
def gather_cases(draw, device):
    ndim = draw(st.integers(1, 3))
    src = [draw(st.sampled_from([1, 2, 5, 16, 37])) for _ in range(ndim)]
    dim = draw(st.integers(-ndim, ndim - 1))
    idx_shape = [draw(st.integers(0, s)) if d != dim % ndim else draw(st.sampled_from([0, 1, 4, 50]))
                 for d, s in enumerate(src)]
    index_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed + 7)
    # A small source range along dim makes duplicate indices (summed in the backward).
    high = draw(st.sampled_from([1, 2, src[dim]]))
    index = torch.randint(0, min(high, src[dim]), idx_shape, generator=g).to(index_dtype)
    index_layout = draw(st.sampled_from(["contiguous", "transposed", "expanded"]))
    if index_layout == "transposed" and ndim >= 2:
        index = index.transpose(0, 1).contiguous().transpose(0, 1)
    elif index_layout == "expanded" and all(s > 0 for s in idx_shape):
        index = index.narrow(0, 0, 1).expand(idx_shape)
    index = index.to(device)
    base_shape, view = draw(layout_of(src))
    index_cpu = index.cpu().long()

    def reach(k, m):
        return torch.gather(m, dim, index_cpu.to(m.device))

    def reach_back(mo):
        acc = torch.zeros(src, dtype=torch.float64, device=mo.device)
        return [acc.scatter_add(dim, index_cpu.to(mo.device), mo.double()) > 0]

    return Case(
        "gather", [_rand(base_shape, seed)], [view],
        lambda s: bt.gather(s, dim, index),
        lambda s: ref.gather(s, dim, index.to(s.device).long()),
        reach=reach, reach_back=reach_back,
        info=dict(src=src, dim=dim, index=idx_shape, index_dtype=index_dtype, layout=index_layout))


@st.composite
def ssd_cases(draw, device):
    Bt = draw(st.sampled_from([1, 2]))
    L = draw(st.sampled_from([0, 1, 5, 17, 40]))
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2, 3]))
    D, N = draw(st.sampled_from([1, 3, 8])), draw(st.sampled_from([1, 4, 7]))
    chunk = draw(st.sampled_from([1, 3, 8, 16, 256]))
    shapes = [(Bt, L, H, D), (Bt, L, H), (H,), (Bt, L, G, N), (Bt, L, G, N)]
    lays = [draw(layout_of(s)) for s in shapes]
    seed = draw(st.integers(0, 2**31 - 1))
    bases = [_rand(lays[0][0], seed), _rand(lays[1][0], seed + 1, low=0.01, high=0.6),
             _rand(lays[2][0], seed + 2, low=-1.5, high=-0.05),
             _rand(lays[3][0], seed + 3), _rand(lays[4][0], seed + 4)]
    cq = chunk if device == "cuda" else None

    def reach(k, m):
        if k == 0:    # x[b, t, h, d] -> y[b, t' >= t, h, d]
            return _later(m, 1, cq)
        if k == 1:    # dt[b, t, h] -> y[b, t' >= t, h, :]
            r = _later(m, 1, cq)[..., None]
        elif k == 2:  # A[h] -> y[:, :, h, :]
            r = m[None, None, :, None]
        elif k == 3:  # B[b, t, g, n] -> y[b, t' >= t, heads of g, :]
            r = _later(_heads(m.any(-1), H, 2), 1, cq)[..., None]
        else:         # C[b, t, g, n] -> y[b, t, heads of g, :]
            r = _heads(m.any(-1), H, 2)[..., None]
        return r.expand(Bt, L, H, D)

    def reach_back(mo):
        e = _earlier(mo, 1, cq)                        # [B, L, H, D]
        eh = e.any(-1)                                 # [B, L, H]
        groups = eh.reshape(Bt, L, G, H // G).any(-1)  # [B, L, G]
        now_g = mo.any(-1).reshape(Bt, L, G, H // G).any(-1)
        if cq is not None:
            now_g = _chunk_any(now_g, 1, cq)
        return [e, eh, eh.any(1).any(0), groups[..., None].expand(Bt, L, G, N),
                now_g[..., None].expand(Bt, L, G, N)]

    return Case(
        "ssd_chunk_scan", bases, [l[1] for l in lays],
        lambda *t: bt.ssd_chunk_scan(*t, chunk_size=chunk),
        lambda *t: ref.ssd_chunk_scan(*t),
        reach=reach, reach_back=reach_back,
        # The CPU kernel runs the recurrence in float64, the reference a float64 loop with
        # another summation order: float64 results agree to a few hundred ulps.
        floor_ulps=1024,
        info=dict(B=Bt, L=L, H=H, G=G, D=D, N=N, chunk=chunk))


# The families below take their reach from the float64 reference rather than from a
# rule written per op.

def _reference_reach(fn, bases, views, widen=None):
    """``(reach, reach_back)`` of a Case from where ``fn`` (the float64 reference, one
    output tensor) carries a NaN at the case's own inputs: the outputs that are NaN when
    the marked input elements are, and the input gradients that are NaN when the marked
    output's gradient is (autograd of the reference). The reference selects
    (``torch.where``) where an op must not let a NaN through (a packed sequence's start, a
    padding row) and multiplies where a NaN goes through a 0 (a weight tap on the zeros
    before time 0), so this is the reach the ops must keep. ``widen(mask, k)``: the larger
    reach a device's kernels are allowed (k: the input, or None for the output)."""
    prim = tuple(v(b).detach().clone() for v, b in zip(views, bases))

    def reach(k, m):
        with torch.no_grad():
            r = fn(*(p.masked_fill(m, float("nan")) if i == k else p for i, p in enumerate(prim))).isnan()
        return widen(r, None) if widen else r

    def reach_back(mo):
        leaves = [p.clone().requires_grad_() for p in prim]
        out = fn(*leaves)
        if not out.requires_grad:  # (an empty scan's final states: no input reaches them)
            return [torch.zeros_like(p, dtype=torch.bool) for p in prim]
        dy = torch.zeros_like(out).masked_fill(mo, float("nan"))
        grads = torch.autograd.grad(out, leaves, dy, allow_unused=True)
        masks = [torch.zeros_like(p, dtype=torch.bool) if g is None else g.isnan() for p, g in zip(prim, grads)]
        return [widen(m, k) for k, m in enumerate(masks)] if widen else masks

    return reach, reach_back


def _leads(draw):
    return [draw(st.sampled_from([0, 1, 2, 3, 5])) for _ in range(draw(st.integers(0, 2)))]


def _bases(lays, seed, kinds):
    """A float64 base per layout: kinds[i] is a scale for randn or a (low, high) range."""
    return [_rand(l[0], seed + i, low=k[0], high=k[1]) if isinstance(k, tuple) else _rand(l[0], seed + i, k)
            for i, (l, k) in enumerate(zip(lays, kinds))]


@st.composite
def rms_norm_cases(draw, device):
    # (no single-element norm: x·rsqrt(x² + eps) is sign(x) but for eps, and its gradient
    # the difference of two nearly equal terms, a cancellation every float32 formula loses
    # most bits of, PyTorch's too, so the 2x rule decides by chance)
    norm = [draw(st.sampled_from([2, 3, 8, 33, 130]))]
    if draw(st.integers(0, 3)) == 0:
        norm = [draw(SMALL), draw(st.sampled_from([4, 7]))]
    shape, k = tuple(_leads(draw) + norm), len(norm)
    convention = draw(st.sampled_from(["torch", "llama", "gemma"]))
    eps = draw(st.sampled_from([None, 1e-6, 1e-5, 0.1]))
    weighted, residual = draw(st.booleans()), draw(st.booleans())
    lays = [draw(layout_of(shape)) for _ in range(1 + residual)] + ([draw(layout_of(norm))] if weighted else [])
    bases = _bases(lays, draw(st.integers(0, 2**31 - 1)), [2.0] * len(lays))
    views = [l[1] for l in lays]

    def split(t):
        return t[0], t[1] if residual else None, t[-1] if weighted else None

    def ours(*t):
        x, r, w = split(t)
        out = bt.rms_norm(x, tuple(norm), w, eps, convention=convention, residual=r)
        return torch.stack(out) if residual else out

    def reference(*t, rounding=None):
        x, r, w = split(t)
        h, w = x.flatten(-k), None if w is None else w.flatten()  # one normalized dim
        if residual:  # ref.add_rms_norm, with h rounded to `rounding` (its gradient passed on)
            h = h + r.flatten(-k)
            if rounding is not None:
                h = h + (h.to(rounding).to(h.dtype) - h).detach()
        if rounding is not None and convention == "llama" and w is not None:
            # llama's x·rstd, rounded to the dtype before the weight (the gradient passed on)
            n = ref.rms_norm(h, None, eps, convention)[0]
            y = w * (n + (n.to(rounding).to(n.dtype) - n).detach())
        else:
            y = ref.rms_norm(h, w, eps, convention)[0]
        return torch.stack([y.view(shape), h.view(shape)]) if residual else y.view(shape)

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("rms_norm", bases, views, ours, reference, reach, reach_back,
                info=dict(shape=shape, k=k, convention=convention, eps=eps, weight=weighted, residual=residual),
                seen=(lambda dtype: functools.partial(reference, rounding=dtype))
                if residual or (convention == "llama" and weighted) else None)


@st.composite
def gated_rms_norm_cases(draw, device):
    groups, size = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([2, 5, 8, 32]))  # (rms_norm_cases: not 1)
    N = groups * size
    group_size = None if groups == 1 and draw(st.booleans()) else size
    norm_before_gate = draw(st.booleans())
    has_z, has_bias = draw(st.booleans()), draw(st.booleans())
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.1]))
    shape = tuple(_leads(draw) + [N])
    lays = [draw(layout_of(shape)), draw(layout_of((N,)))]
    lays += ([draw(layout_of(shape))] if has_z else []) + ([draw(layout_of((N,)))] if has_bias else [])
    bases = _bases(lays, draw(st.integers(0, 2**31 - 1)), [2.0] * len(lays))
    views = [l[1] for l in lays]

    def split(t):
        return t[0], t[1], t[2] if has_z else None, t[-1] if has_bias else None

    def ours(*t):
        x, w, z, b = split(t)
        return bt.gated_rms_norm(x, w, z, eps, group_size, norm_before_gate, bias=b)

    def reference(*t):
        x, w, z, b = split(t)
        return ref.gated_rms_norm(x, w, b, z, eps, group_size, norm_before_gate)[0]

    def term_scales(t, dys):
        # The norm's input gradient dh is orthogonal to its input h (x, or x·silu(z) with
        # the gate first) within each group, and made of terms of size |g|·rstd, g the
        # gradient that reaches the normalized h (w·dy, times silu(z) with the gate after
        # the norm). x's gradient is dh (times silu(z) with the gate first), and with the
        # gate first z's is dh·x·silu'(z). At a group of 2, dh ⊥ h fixes the ratio of its
        # two elements, which can leave an element's gradient far below the terms (random
        # draws in float64: with the gate first, dz 86 units of its largest value off, 0.6
        # of a unit of its terms, which were 75 times that value; with the gate after, dx
        # 114 units off, 1.2 units of its terms, 98 times its largest value).
        x, w, z, b = split(t)
        scales = [0.0] * len(t)
        if x.numel() == 0:
            return scales
        size = N if group_size is None else group_size
        first, after = z is not None and not norm_before_gate, z is not None and norm_before_gate
        if z is not None:
            sig = torch.sigmoid(z)
            gate, dgate = z * sig, sig * (1 + z * (1 - sig))  # silu(z), silu'(z)
        hg = (x * gate if first else x).unflatten(-1, (N // size, size))
        rstd = torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
        for dy in dys:
            g = dy * w * gate if after else dy * w
            size_terms = g.unflatten(-1, (N // size, size)).abs().amax(-1, keepdim=True) * rstd
            size_terms = size_terms.expand_as(hg).flatten(-2)
            scales[0] = max(scales[0], (size_terms * (gate.abs() if first else 1)).max().item())
            if first:
                scales[2] = max(scales[2], (size_terms * (x * dgate).abs()).max().item())
        return scales

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("gated_rms_norm", bases, views, ours, reference, reach, reach_back,
                info=dict(shape=shape, group_size=group_size, norm_before_gate=norm_before_gate, z=has_z,
                          bias=has_bias, eps=eps),
                term_scales=term_scales)


def _seq_ids(seed, batch, L, padding):
    """[batch, L] int32 ids of packed sequences (non-decreasing from 0, a start about
    every fifth step), with a run of -1 (padding) at the end where `padding`."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.rand(batch, L, generator=g) < 0.2).long().cumsum(1)
    if padding and L:
        ids[:, L - 1 - int(torch.randint(0, max(L // 3, 1), (1,), generator=g)):] = -1
    return ids.to(torch.int32)


@st.composite
def causal_conv1d_cases(draw, device):
    Bt, D = draw(SMALL), draw(st.sampled_from([1, 2, 3, 8, 17]))
    L = draw(st.sampled_from([0, 1, 2, 5, 17, 40]))
    W = draw(st.sampled_from([2, 3, 4] if device == "cuda" else [1, 2, 3, 4, 5]))
    activation = draw(st.sampled_from([None, "silu", "swish"]))
    has_bias, final = draw(st.booleans()), draw(st.booleans())
    mode = draw(st.sampled_from(["plain", "initial_states", "seq_idx", "seq_idx_padded"]))
    seed = draw(st.integers(0, 2**31 - 1))
    if draw(st.booleans()):
        lays = [draw(layout_of((Bt, D, L)))]
    else:  # the channel-last view of a projection's output
        lays = [((Bt, L, D), lambda t: t.transpose(1, 2))]
    lays.append(draw(layout_of((D, W))))
    lays += ([draw(layout_of((D,)))] if has_bias else []) + \
        ([draw(layout_of((Bt, D, W - 1)))] if mode == "initial_states" else [])
    bases = _bases(lays, seed, [1.0] * len(lays))
    views = [l[1] for l in lays]
    seq = _seq_ids(seed + 99, Bt, L, mode == "seq_idx_padded") if mode.startswith("seq_idx") else None
    seq_dev = None if seq is None else seq.to(device)

    def split(t):
        return t[0], t[1], t[2] if has_bias else None, t[-1] if mode == "initial_states" else None

    def ours(*t):
        x, w, b, init = split(t)
        out = bt.causal_depthwise_conv1d(x, w, b, seq_idx=seq_dev, initial_states=init, activation=activation,
                                         return_final_states=final)
        return torch.cat(out, -1) if final else out

    def reference(*t):
        x, w, b, init = split(t)
        out, fs = ref.causal_conv1d(x, w, b, None if seq is None else seq.to(x.device), init, activation)
        return torch.cat([out, fs], -1) if final else out

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("causal_conv1d", bases, views, ours, reference, reach, reach_back,
                info=dict(B=Bt, D=D, L=L, W=W, activation=activation, bias=has_bias, mode=mode, final=final))


def _pool_rows(seed, batch, pool, padding):
    """[batch] int32 distinct rows of a pool of `pool`, one of them -1 (padding) where
    `padding` and batch > 1."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(pool, generator=g)[:batch]
    if padding and batch > 1:
        rows[int(torch.randint(0, batch, (1,), generator=g))] = -1
    return rows.to(torch.int32)


IN_PLACE_LAYOUTS = [k for k in LAYOUTS if k != "broadcast"]


def _fresh(view):
    """The view of a copy of its base: for an input the op updates in place (each call of
    a Case's views gets its own storage)."""
    return lambda t: view(t.clone())


@st.composite
def causal_conv1d_update_cases(draw, device):
    Bt, D = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3, 8, 17]))
    W = draw(st.sampled_from([2, 3, 4, 6] if device == "cuda" else [1, 2, 3, 4, 6]))
    M = max(W - 1 + draw(st.sampled_from([0, 1, 3])), 1)
    L = draw(st.sampled_from([None, 1, 2, 5]))
    activation = draw(st.sampled_from([None, "silu"]))
    has_bias = draw(st.booleans())
    indexed, circular = draw(st.booleans()), draw(st.booleans())
    pool = Bt + (draw(st.sampled_from([0, 2])) if indexed else 0)
    seed = draw(st.integers(0, 2**31 - 1))
    lays = [draw(layout_of((Bt, D) if L is None else (Bt, D, L))),
            draw(layout_of((pool, D, M), IN_PLACE_LAYOUTS)), draw(layout_of((D, W)))]
    lays += [draw(layout_of((D,)))] if has_bias else []
    bases = _bases(lays, seed, [1.0] * len(lays))
    views = [l[1] for l in lays]
    views[1] = _fresh(views[1])
    rows = _pool_rows(seed + 5, Bt, pool, draw(st.booleans())) if indexed else None
    lens = torch.randint(-3, 40, (Bt,), generator=torch.Generator().manual_seed(seed + 6)).to(torch.int32) \
        if circular else None
    rows_dev, lens_dev = (None if a is None else a.to(device) for a in (rows, lens))

    def ours(x, st_, w, *b):
        out = bt.causal_conv1d.causal_conv1d_update(x, st_, w, b[0] if b else None, activation, lens_dev, rows_dev)
        return torch.cat([out.flatten(), st_.flatten()])

    def reference(x, st_, w, *b):
        cpu = (lambda a: None if a is None else a.to(x.device))
        out, new = ref.causal_conv1d_update(x, st_, w, b[0] if b else None, activation, cpu(lens), cpu(rows))
        return torch.cat([out.flatten(), new.flatten()])

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("causal_conv1d_update", bases, views, ours, reference, reach, reach_back, differentiable=False,
                info=dict(B=Bt, D=D, W=W, M=M, L=L, activation=activation, bias=has_bias, pool=pool,
                          rows=rows, cache_seqlens=lens))


@st.composite
def selective_state_update_cases(draw, device):
    Bt, G = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2]))
    H, P, N = G * draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3, 8])), draw(st.sampled_from([1, 4, 16]))
    T = draw(st.sampled_from([None, 1, 3]))  # None: one step (selective_state_update)
    has_D, has_z, has_bias, softplus = (draw(st.booleans()) for _ in range(4))
    indexed = draw(st.booleans())
    pool = Bt + (draw(st.sampled_from([0, 2])) if indexed else 0)
    seed = draw(st.integers(0, 2**31 - 1))
    tok = () if T is None else (T,)
    xs, bs = (Bt, *tok, H, P), (Bt, *tok, G, N)
    dt_kind = 1.0 if softplus else (0.01, 0.6)
    shapes = [((pool, H, P, N), 1.0), (xs, 1.0), (xs, dt_kind), ((H, P, N), (-1.5, -0.05)), (bs, 1.0), (bs, 1.0)]
    shapes += ([((H, P), 1.0)] if has_D else []) + ([(xs, 1.0)] if has_z else []) + \
        ([((H, P), (0.0, 0.3))] if has_bias else [])
    lays = [draw(layout_of(s, IN_PLACE_LAYOUTS if i == 0 else LAYOUTS)) for i, (s, _) in enumerate(shapes)]
    bases = _bases(lays, seed, [k for _, k in shapes])
    views = [l[1] for l in lays]
    views[0] = _fresh(views[0])
    rows = _pool_rows(seed + 5, Bt, pool, draw(st.booleans())) if indexed else None
    rows_dev = None if rows is None else rows.to(device)

    def split(t):
        rest = list(t[6:])
        D = rest.pop(0) if has_D else None
        z = rest.pop(0) if has_z else None
        return (*t[:6], D, z, rest.pop(0) if has_bias else None)

    op = bt.selective_state_update if T is None else bt.selective_state_update_tokens

    def ours(*t):
        a = split(t)
        out = op(*a, softplus, rows_dev)
        return torch.cat([out.flatten(), a[0].flatten()])

    def reference(*t):
        out, new = ref.selective_state_update(*split(t), softplus, None if rows is None else rows.to(t[0].device),
                                              tokens=T is not None)
        return torch.cat([out.flatten(), new.flatten()])

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("selective_state_update", bases, views, ours, reference, reach, reach_back, differentiable=False,
                info=dict(B=Bt, T=T, H=H, G=G, P=P, N=N, D=has_D, z=has_z, dt_bias=has_bias, softplus=softplus,
                          rows=rows))


@st.composite
def gated_pair_cases(draw, device):
    shape = tuple(_leads(draw) + [draw(SIZES)])
    kind = draw(st.sampled_from(GATED_KINDS))
    lays = [draw(layout_of(shape)) for _ in range(2)]
    bases = _bases(lays, draw(st.integers(0, 2**31 - 1)), [2.0, 2.0])
    views = [l[1] for l in lays]
    reach, reach_back = _reference_reach(lambda g, u: ref.gated_activation_pair(g, u, kind), bases, views)
    return Case("gated_activation_pair", bases, views, lambda g, u: bt.gated_activation_pair(g, u, kind),
                lambda g, u: ref.gated_activation_pair(g, u, kind), reach, reach_back,
                info=dict(shape=shape, kind=kind))


@st.composite
def rope_cos_sin_cases(draw, device):
    B, H, Hk = draw(SMALL), draw(SMALL), draw(SMALL)
    S = draw(st.sampled_from([0, 1, 3, 16, 37]))
    D = draw(st.sampled_from([2, 4, 6, 8, 16, 34, 64]))
    R = draw(st.sampled_from([r for r in (2, 4, 6, D - 2, D) if 0 < r <= D]))
    interleaved, qk = draw(st.booleans()), draw(st.booleans())
    table = draw(st.sampled_from(["hf", "hf_4d", "flash"]))
    Bc = draw(st.sampled_from([1, B]))
    seed = draw(st.integers(0, 2**31 - 1))

    def x_layout(heads):  # [B, H, S, D], or a [B, S, H, D] tensor seen through transpose(1, 2)
        if draw(st.booleans()):
            return draw(layout_of((B, heads, S, D)))
        return (B, S, heads, D), (lambda t: t.transpose(1, 2))

    tshape = {"hf": (Bc, S, R), "hf_4d": (Bc, 1, S, R), "flash": (S, R // 2)}[table]
    lays = [x_layout(H)] + ([x_layout(Hk)] if qk else []) + [draw(layout_of(tshape)) for _ in range(2)]
    bases = _bases(lays, seed, [1.0] * len(lays))
    views = [l[1] for l in lays]

    def ours(*t):
        if qk:
            return torch.cat([y.flatten() for y in bt.rope_qk_cos_sin(*t, interleaved=interleaved)])
        return bt.rope_cos_sin(*t, interleaved=interleaved)

    def reference(*t):
        cos, sin = (c.squeeze(1) if table == "hf_4d" else c for c in t[-2:])
        ys = [ref.rope_cos_sin(x, cos, sin, interleaved) for x in t[:-2]]
        return torch.cat([y.flatten() for y in ys]) if qk else ys[0]

    reach, reach_back = _reference_reach(reference, bases, views)
    return Case("rope_cos_sin", bases, views, ours, reference, reach, reach_back,
                info=dict(B=B, H=H, Hk=Hk if qk else None, S=S, D=D, R=R, interleaved=interleaved, table=table,
                          Bc=Bc))


def _same_chunk_and_sequence(mask, dim, chunk, seq):
    """`mask` widened along `dim` (time) to every step of the same chunk and the same
    packed sequence (seq: [B, L] ids, or None) as a marked one: the spread the chunked
    CUDA kernels allow (a masked tensor-core tile multiplies its zeros by every row)."""
    m = mask.movedim(dim, 1)
    out = m.clone()
    for c0 in range(0, m.size(1), chunk):
        cols = torch.arange(c0, min(c0 + chunk, m.size(1)))
        for b in range(m.size(0)):
            ids = torch.zeros(len(cols), dtype=torch.long) if seq is None else seq[b, cols].long()
            for v in ids.unique():
                at = cols[ids == v]
                out[b, at] = m[b, at].any(0, keepdim=True).expand(len(at), *m.shape[2:])
    return out.movedim(1, dim)


@st.composite
def ssd_combined_cases(draw, device):
    Bt, L = draw(st.sampled_from([1, 2])), draw(st.sampled_from([0, 1, 5, 17, 40]))
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    P, N = draw(st.sampled_from([1, 3, 8])), draw(st.sampled_from([1, 4, 7]))
    chunk = draw(st.sampled_from([1, 3, 8, 16, 256]))
    D_kind = draw(st.sampled_from([None, "H", "HP"]))
    has_z, has_bias, softplus, has_init, final = (draw(st.booleans()) for _ in range(5))
    with_seq = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    shapes = [((Bt, L, H, P), 1.0), ((Bt, L, H), 1.0 if softplus else (0.01, 0.6)), ((H,), (-1.5, -0.05)),
              ((Bt, L, G, N), 1.0), ((Bt, L, G, N), 1.0)]
    names = ["x", "dt", "A", "B", "C"]
    if D_kind:
        shapes.append(((H,) if D_kind == "H" else (H, P), 1.0))
        names.append("D")
    if has_z:
        shapes.append(((Bt, L, H, P), 1.0))
        names.append("z")
    if has_bias:
        shapes.append(((H,), 1.0 if softplus else (0.0, 0.3)))
        names.append("dt_bias")
    if has_init:
        shapes.append(((Bt, H, P, N), 1.0))
        names.append("initial_states")
    lays = [draw(layout_of(s)) for s, _ in shapes]
    bases = _bases(lays, seed, [k for _, k in shapes])
    views = [l[1] for l in lays]
    seq = _seq_ids(seed + 99, Bt, L, False) if with_seq else None
    seq_dev = None if seq is None else seq.to(device)

    def ours(*t):
        kw = dict(zip(names[5:], t[5:]))
        out = bt.mamba.mamba_chunk_scan_combined(*t[:5], chunk, seq_idx=seq_dev, dt_softplus=softplus,
                                                 return_final_states=final, **kw)
        return torch.cat([out[0].flatten(), out[1].to(out[0].dtype).flatten()]) if final else out

    def reference(*t):
        kw = dict(zip(names[5:], t[5:]))
        out = ref.ssd_chunk_scan_combined(*t[:5], chunk, seq_idx=None if seq is None else seq.to(t[0].device),
                                          dt_softplus=softplus, return_final_states=final, **kw)
        return torch.cat([out[0].flatten(), out[1].flatten()]) if final else out

    def widen_cuda(mask, k):  # (y, then the final states; the inputs with a time dim, dim 1)
        if k is not None:
            return _same_chunk_and_sequence(mask, 1, chunk, seq) if names[k] in ("x", "dt", "B", "C", "z") else mask
        n = Bt * L * H * P
        y = _same_chunk_and_sequence(mask.flatten()[:n].view(Bt, L, H, P), 1, chunk, seq)
        return torch.cat([y.flatten(), mask.flatten()[n:]]).view(mask.shape)

    reach, reach_back = _reference_reach(reference, bases, views, widen_cuda if device == "cuda" else None)
    return Case("mamba_chunk_scan_combined", bases, views, ours, reference, reach, reach_back, floor_ulps=1024,
                stored_16bit=(names.index("z"),) if has_z else (),
                info=dict(B=Bt, L=L, H=H, G=G, P=P, N=N, chunk=chunk, options=names[5:], softplus=softplus,
                          seq_idx=with_seq, final=final))


STRATEGIES = {
    "gated_activation": gated_cases,
    "rope": rope_cases,
    "lerp": lerp_scalar_cases,
    "lerp.Tensor": lerp_tensor_cases,
    "gather": gather_cases,
    "ssd_chunk_scan": ssd_cases,
    "gated_activation_pair": gated_pair_cases,
    "rope_cos_sin": rope_cos_sin_cases,
    "rms_norm": rms_norm_cases,
    "gated_rms_norm": gated_rms_norm_cases,
    "causal_conv1d": causal_conv1d_cases,
    "causal_conv1d_update": causal_conv1d_update_cases,
    "selective_state_update": selective_state_update_cases,
    "mamba_chunk_scan_combined": ssd_combined_cases,
}
# Examples per property and op: the SSD references are Python loops over L, so fewer.
EXAMPLES = {"ssd_chunk_scan": 8, "mamba_chunk_scan_combined": 8}
DEFAULT_EXAMPLES = 20


# ---- properties ---------------------------------------------------------------------

def _inputs(case: Case, dtype, device, requires_grad=False):
    bases = [b.to(device=device, dtype=dtype).requires_grad_(requires_grad) for b in case.bases]
    return bases, [v(b) for v, b in zip(case.views, bases)]


def _dy_generator(k: int) -> torch.Generator:
    """Seeded (a failure hypothesis shrinks must fail again on the same draw), from seeds
    no strategy draws: a dy drawn like an input (the same seed and shape) is parallel to
    it, and a norm's input gradient, which removes dy's component along the normalized
    input, cancels to about 0."""
    return torch.Generator().manual_seed(2**32 - 1 - k)  # (the CPU generator keeps 32 bits of a seed)


def _grads(fn, case, dtype, device, dy_fn):
    """(y, the gradient of each base): zeros where y needs none (an op without gradients,
    an empty y, an empty scan's final states, which no input reaches)."""
    bases, views = _inputs(case, dtype, device, requires_grad=case.differentiable)
    y = fn(*views)
    if y.numel() == 0 or not y.requires_grad:
        return y.detach(), [torch.zeros_like(b) for b in bases]
    grads = torch.autograd.grad(y, bases, dy_fn(y).to(y.dtype), allow_unused=True)
    return y.detach(), [torch.zeros_like(b) if g is None else g for b, g in zip(bases, grads)]


def check_matches_reference(case: Case, dtype, device):
    views64 = _inputs(case, torch.float64, "cpu")[1]  # (the views of the float64 bases)
    with torch.no_grad():
        out_shape = case.ref(*views64).shape
    dy = torch.randn(out_shape, dtype=torch.float64, generator=_dy_generator(1)).to(dtype).to(device)
    y, g = _grads(case.ours, case, dtype, device, lambda y: dy)
    y64, g64 = _grads(case.ref, case, torch.float64, "cpu", lambda y: dy.cpu().double())
    # the same on the inputs rounded to the dtype (what our op sees)
    rounded = dataclasses.replace(case, bases=[b.to(dtype).double() for b in case.bases])
    seen = case.seen(dtype) if case.seen is not None else case.ref
    y64r, g64r = _grads(seen, rounded, torch.float64, "cpu", lambda y: dy.cpu().double())
    # PyTorch itself in the same dtype (CPU half-precision math), the 2x baseline.
    yl, gl = _grads(case.ref, case, dtype, "cpu", lambda y: dy.cpu())
    assert y.dtype == dtype and y.device.type == device
    # RoPE: the float64 angle p·ω has magnitude up to max|p| (ω ≤ 1), so a one-ulp
    # difference between the device's and the host's pow/sin/cos moves the output by about
    # max|p|·ε64 of its scale (measured on an H200: 7e-14 at p ~ 1e6, float64 output).
    angle_ulps = 4 * case.info.get("max_angle", 0) * torch.finfo(torch.float64).eps / compute_eps(dtype)
    y_floor = case.floor_ulps + angle_ulps
    if case.out_terms is not None:
        terms = case.out_terms(views64)
        y_floor *= max(1.0, terms / max(y64.abs().max().item() if y64.numel() else 0.0, 1e-30))
    assert_close_to_reference(y, y64, yl, f"y of {case!r} {dtype}", y_floor, y64r)
    if not case.differentiable:
        return
    reduced = case.reduced_grads(out_shape)
    # The floor follows the magnitude of the terms a gradient is made of, which can be far
    # above the gradient's own: a norm's input gradient removes dy's component along the
    # normalized input and cancels to about 0 where dy nearly lies along it; a broadcast
    # input's gradient sums per-element gradients (lerp_backward writes dy-shaped ones; a
    # layout's stride-0 view is summed by autograd) that can cancel the same way. So the
    # scale is the largest of the gradient's and of the reference's gradients with respect
    # to the op's views, for this dy and a second one; a broadcast input's floor counts each
    # of its copies, plus a unit of a 16-bit dtype each where the backward op rounds them
    # to it first (and a unit for a gradient made from a stored 16-bit value).
    dy2 = torch.randn(out_shape, dtype=torch.float64, generator=_dy_generator(3))
    dys = [dy.cpu().double(), dy2]
    terms = _view_grad_scales(case, dys)
    if case.term_scales is not None:
        terms = [max(t, s) for t, s in zip(terms, case.term_scales(views64, dys))]
    for k, (a, e, b, er) in enumerate(zip(g, g64, gl, g64r)):
        floor = case.floor_ulps + angle_ulps
        scale = e.abs().max().item() if e.numel() else 0.0
        half = dtype in (torch.float16, torch.bfloat16)
        copies, unit = 1, torch.finfo(dtype).eps if half and k in case.stored_16bit else 0.0
        if k in reduced:
            view_numel = case.views[k](case.bases[k]).numel()
            copies = max(view_numel // max(case.bases[k].numel(), 1), torch.Size(out_shape).numel() // max(view_numel, 1))
            unit = torch.finfo(dtype).eps if half else 0.0
        floor_abs = (floor * compute_eps(dtype) + unit) * copies * max(terms[k], scale)
        floor = max(floor, floor_abs / (compute_eps(dtype) * max(scale, 1e-30)))
        assert_close_to_reference(a, e, b, f"grad {k} of {case!r} {dtype}", floor,
                                  None if k in reduced else er)


def _view_grad_scales(case: Case, dys) -> list:
    """Per input, max |∂(y·dy)/∂view| of the float64 reference over the given dys (0 for
    an empty view or an output no input reaches)."""
    views = [v(b).detach().clone().requires_grad_() for v, b in zip(case.views, case.bases)]
    y = case.ref(*views)
    scales = [0.0] * len(views)
    if y.numel() == 0 or not y.requires_grad:
        return scales
    for dy in dys:
        grads = torch.autograd.grad(y, views, dy, allow_unused=True, retain_graph=True)
        scales = [max(sc, 0.0 if gk is None or gk.numel() == 0 else gk.abs().max().item())
                  for sc, gk in zip(scales, grads)]
    return scales


def _view_mask(case, k, j):
    """Mask over input k's view of the elements backed by flat element j of its base."""
    mark = torch.zeros(case.bases[k].shape, dtype=torch.float64)
    mark.view(-1)[j] = 1
    return case.views[k](mark) != 0


def check_nan_stays_in_reach(case: Case, dtype, device, data):
    k = data.draw(st.integers(0, len(case.bases) - 1), label="input")
    if case.bases[k].numel() == 0:
        return
    j = data.draw(st.integers(0, case.bases[k].numel() - 1), label="element")
    bases, views = _inputs(case, dtype, device)
    clean = case.ours(*views)
    bases[k].view(-1)[j] = float("nan")
    views = [v(b) for v, b in zip(case.views, bases)]
    dirty = case.ours(*views)
    reach = case.reach(k, _view_mask(case, k, j)).to(device)
    assert reach.shape == clean.shape
    keep = ~reach
    assert torch.equal(dirty[keep], clean[keep]), \
        f"NaN in input {k} element {j} changed {int((dirty[keep] != clean[keep]).sum())} outputs out of its reach, {case!r}"
    if reach.any():
        assert dirty[reach].isnan().any(), f"NaN in input {k} element {j} vanished, {case!r}"


def check_nan_gradient_stays_in_reach(case: Case, dtype, device, data):
    if not case.differentiable:
        return
    with torch.no_grad():
        out_shape = case.ours(*_inputs(case, dtype, device)[1]).shape
    n = 1
    for s in out_shape:
        n *= s
    if n == 0:
        return
    j = data.draw(st.integers(0, n - 1), label="output element")
    dy = torch.randn(out_shape, dtype=torch.float64, generator=_dy_generator(2))
    _, clean = _grads(case.ours, case, dtype, device, lambda y: dy.to(device))
    dy_nan = dy.clone()
    dy_nan.view(-1)[j] = float("nan")
    _, dirty = _grads(case.ours, case, dtype, device, lambda y: dy_nan.to(device))
    mo = torch.zeros(out_shape, dtype=torch.bool)
    mo.view(-1)[j] = True
    reach_views = case.reach_back(mo)
    for k, (c, d, rv) in enumerate(zip(clean, dirty, reach_views)):
        # Back from the view to its base: a base element is reached if any view element
        # backed by it is.
        probe = torch.zeros(case.bases[k].shape, dtype=torch.float64, requires_grad=True)
        (rb,) = torch.autograd.grad(case.views[k](probe), probe, rv.double())
        keep = (rb == 0).to(device)
        assert torch.equal(d[keep], c[keep]), \
            f"NaN in dy[{j}] changed gradient {k} out of its reach, {case!r}"


@pytest.fixture
def deterministic_on_cuda(device):
    if device == "cuda":  # bitwise comparisons need the deterministic gather backward
        bt.set_preference("deterministic")
    yield


def _examples(op):
    return EXAMPLES.get(op, DEFAULT_EXAMPLES)


def _for_each_op(prop):
    """One pytest test per (op, device) running `prop` over that op's strategy."""
    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("op", sorted(STRATEGIES))
    def test(op, device, deterministic_on_cuda):
        @settings(max_examples=_examples(op))
        @given(data=st.data())
        def run(data):
            case = data.draw(STRATEGIES[op](device), label="case")
            dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
            prop(case, dtype, device, data)
        run()
    test.__name__ = prop.__name__
    return test


test_matches_reference = _for_each_op(lambda case, dtype, device, data: check_matches_reference(case, dtype, device))
test_nan_stays_in_reach = _for_each_op(check_nan_stays_in_reach)
test_nan_gradient_stays_in_reach = _for_each_op(check_nan_gradient_stays_in_reach)
