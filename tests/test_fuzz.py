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

To fuzz a new op: write a ``@st.composite`` strategy returning a Case (its inputs as
float64 *base* tensors, the layout view of each, our op and the reference as functions
of the views, and the two reach maps), and add it to ``STRATEGIES``.
"""
from __future__ import annotations

import dataclasses
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
def layout_of(draw, shape):
    """(base_shape, view): view(base) has `shape` and the drawn memory layout."""
    shape = tuple(shape)
    kind = draw(st.sampled_from(LAYOUTS))
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
        info=dict(a=sa, b=sb, weight=w))


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
        info=dict(a=sa, b=sb, w=sw))


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


STRATEGIES = {
    "gated_activation": gated_cases,
    "rope": rope_cases,
    "lerp": lerp_scalar_cases,
    "lerp.Tensor": lerp_tensor_cases,
    "gather": gather_cases,
    "ssd_chunk_scan": ssd_cases,
}
# Examples per property and op: the SSD reference is a Python loop over L, so fewer.
EXAMPLES = {"ssd_chunk_scan": 8}
DEFAULT_EXAMPLES = 20


# ---- properties ---------------------------------------------------------------------

def _inputs(case: Case, dtype, device, requires_grad=False):
    bases = [b.to(device=device, dtype=dtype).requires_grad_(requires_grad) for b in case.bases]
    return bases, [v(b) for v, b in zip(case.views, bases)]


def _grads(fn, case, dtype, device, dy_fn):
    bases, views = _inputs(case, dtype, device, requires_grad=True)
    y = fn(*views)
    dy = dy_fn(y)
    if y.numel() == 0:
        return y.detach(), [torch.zeros_like(b) for b in bases]
    grads = torch.autograd.grad(y, bases, dy.to(y.dtype), allow_unused=True)
    return y.detach(), [torch.zeros_like(b) if g is None else g for b, g in zip(bases, grads)]


def check_matches_reference(case: Case, dtype, device):
    with torch.no_grad():
        out_shape = case.ref(*_inputs(case, torch.float64, "cpu")[1]).shape
    dy64 = torch.randn(out_shape, dtype=torch.float64)
    dy = dy64.to(dtype).to(device)
    y, g = _grads(case.ours, case, dtype, device, lambda y: dy)
    y64, g64 = _grads(case.ref, case, torch.float64, "cpu", lambda y: dy.cpu().double())
    # the same on the inputs rounded to the dtype (what our op sees)
    rounded = dataclasses.replace(case, bases=[b.to(dtype).double() for b in case.bases])
    y64r, g64r = _grads(case.ref, rounded, torch.float64, "cpu", lambda y: dy.cpu().double())
    # PyTorch itself in the same dtype (CPU half-precision math), the 2x baseline.
    yl, gl = _grads(case.ref, case, dtype, "cpu", lambda y: dy.cpu())
    assert y.dtype == dtype and y.device.type == device
    # RoPE: the float64 angle p·ω has magnitude up to max|p| (ω ≤ 1), so a one-ulp
    # difference between the device's and the host's pow/sin/cos moves the output by about
    # max|p|·ε64 of its scale (measured on an H200: 7e-14 at p ~ 1e6, float64 output).
    angle_ulps = 4 * case.info.get("max_angle", 0) * torch.finfo(torch.float64).eps / compute_eps(dtype)
    assert_close_to_reference(y, y64, yl, f"y of {case!r} {dtype}", case.floor_ulps + angle_ulps, y64r)
    reduced = case.reduced_grads(out_shape)
    for k, (a, e, b, er) in enumerate(zip(g, g64, gl, g64r)):
        floor = case.floor_ulps + angle_ulps
        if k in reduced and dtype in (torch.float16, torch.bfloat16):
            # A broadcast input's gradient is the sum of per-element gradients that the
            # backward op rounds to the dtype first (lerp_backward writes dy-shaped
            # gradients; a layout's stride-0 view is summed by autograd), so it may miss
            # PyTorch's 2x bound by up to one unit of the dtype.
            floor = max(floor, torch.finfo(dtype).eps / torch.finfo(torch.float32).eps)
        assert_close_to_reference(a, e, b, f"grad {k} of {case!r} {dtype}", floor,
                                  None if k in reduced else er)


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
    with torch.no_grad():
        out_shape = case.ours(*_inputs(case, dtype, device)[1]).shape
    n = 1
    for s in out_shape:
        n *= s
    if n == 0:
        return
    j = data.draw(st.integers(0, n - 1), label="output element")
    dy = torch.randn(out_shape, dtype=torch.float64)
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
