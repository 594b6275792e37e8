"""torch.func on every op: grad, vjp, jacrev, jacfwd (where forward-mode AD is
implemented), hessian (where double backward is), and vmap of the forward and of the
backward, in float64 against torch.autograd on the same ops (and the reference), with
the C++ forward and backward ops doing the work. Unsupported transforms raise an error
naming the op.

Support matrix (README, Limitations):
  op                 grad/vjp/jacrev  jacfwd/jvp  vmap (fwd, bwd)  second derivatives
  gated_activation   yes              yes         yes              NotImplementedError
  rope               yes              yes         yes              yes
  lerp (scalar w)    yes              yes         yes              yes
  lerp.Tensor        yes              yes         yes              NotImplementedError
  gather             yes              yes         yes              yes
  ssd_chunk_scan     yes              NotImplementedError  yes     NotImplementedError
  rope_cos_sin, rope_qk_cos_sin (and their backward ops; x/q/k and cos/sin gradients)
                     yes              yes         yes              yes
  ssd_chunk_scan_combined (D, z, dt_bias, initial_states, seq_idx, dt_softplus)
                     yes              NotImplementedError  yes     NotImplementedError
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES

ops = torch.ops.baracuda
D64 = torch.float64


@dataclass
class FuncCase:
    name: str
    ours: Callable           # (*float inputs) -> Tensor
    ref: Callable            # the same function in plain PyTorch
    make: Callable           # (device, batch: tuple) -> list of float64 inputs with leading `batch` dims
    forward_ad: bool = True  # jvp / jacfwd implemented
    double: bool = True      # second derivatives implemented
    error: str = ""          # the op named by the NotImplementedError of what is not


def _r(device, *shape, low=None, high=None):
    if low is not None:
        return torch.rand(shape, dtype=D64, device=device) * (high - low) + low
    return torch.randn(shape, dtype=D64, device=device)


def _flat(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


def _rope_cos_sin_cases(device):
    """x [B, H, S, D] with cos/sin [Bc, S, R] (Bc = B or 1, R <= D) or [S, R/2]; every
    input (tables included) differentiable."""
    def ref_qk(q, k, cos, sin, interleaved=False, backward=False):
        return _flat(ref.rope_cos_sin(q, cos, sin, interleaved, backward),
                     ref.rope_cos_sin(k, cos, sin, interleaved, backward))

    def hf_ref(q, k, cos, sin):  # transformers' apply_rotary_pos_emb, unsqueeze_dim=2
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        return _flat(q * c + ref.rotate_half(q) * s, k * c + ref.rotate_half(k) * s)

    return [
        FuncCase("rope_cos_sin_table_per_row_partial", lambda x, c, s: bt.rope_cos_sin(x, c, s),
                 lambda x, c, s: ref.rope_cos_sin(x, c, s),
                 lambda dev, b: [_r(dev, *b, 2, 2, 3, 6), _r(dev, *b, 2, 3, 4), _r(dev, *b, 2, 3, 4)]),
        FuncCase("rope_cos_sin_shared_table_interleaved",
                 lambda x, c, s: bt.rope_cos_sin(x, c, s, interleaved=True),
                 lambda x, c, s: ref.rope_cos_sin(x, c, s, True),
                 lambda dev, b: [_r(dev, *b, 2, 1, 3, 4), _r(dev, *b, 1, 3, 4), _r(dev, *b, 1, 3, 4)]),
        FuncCase("rope_cos_sin_pair_table",
                 lambda x, c, s: bt.rope_cos_sin(x, c, s),
                 lambda x, c, s: ref.rope_cos_sin(x, c, s),
                 lambda dev, b: [_r(dev, *b, 1, 2, 3, 6), _r(dev, *b, 3, 2), _r(dev, *b, 3, 2)]),
        FuncCase("rope_cos_sin_backward_pair_table_interleaved",
                 lambda g, c, s: ops.rope_cos_sin_backward(g, c, s, True),
                 lambda g, c, s: ref.rope_cos_sin(g, c, s, True, backward=True),
                 lambda dev, b: [_r(dev, *b, 2, 1, 3, 4), _r(dev, *b, 3, 2), _r(dev, *b, 3, 2)]),
        FuncCase("rope_qk_cos_sin_gqa", lambda q, k, c, s: _flat(*bt.rope_qk_cos_sin(q, k, c, s)),
                 ref_qk,
                 lambda dev, b: [_r(dev, *b, 2, 3, 3, 4), _r(dev, *b, 2, 1, 3, 4), _r(dev, *b, 2, 3, 2),
                                 _r(dev, *b, 2, 3, 2)]),
        FuncCase("rope_qk_cos_sin_backward",
                 lambda q, k, c, s: _flat(*ops.rope_qk_cos_sin_backward(q, k, c, s, True)),
                 lambda q, k, c, s: ref_qk(q, k, c, s, True, True),
                 lambda dev, b: [_r(dev, *b, 1, 2, 3, 6), _r(dev, *b, 1, 1, 3, 6), _r(dev, *b, 1, 3, 4),
                                 _r(dev, *b, 1, 3, 4)]),
        FuncCase("apply_rotary_pos_emb_bshd",
                 lambda q, k, c, s: _flat(*bt.apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=2)),
                 hf_ref,
                 lambda dev, b: [_r(dev, *b, 2, 3, 2, 4), _r(dev, *b, 2, 3, 1, 4), _r(dev, *b, 1, 3, 4),
                                 _r(dev, *b, 1, 3, 4)]),
    ]


def _ssd_inputs(dev, b, *, hdim_D=True):
    """x, dt (raw: dt_softplus), A, B, C, D, z, dt_bias, initial_states of a
    [B=2, L=5, H=4, P=2] problem with G=2 groups of N=3 (leading `b` batch dims)."""
    return [_r(dev, *b, 2, 5, 4, 2), _r(dev, *b, 2, 5, 4, low=-2.0, high=0.5),
            _r(dev, *b, 4, low=-1.0, high=-0.1), _r(dev, *b, 2, 5, 2, 3), _r(dev, *b, 2, 5, 2, 3),
            _r(dev, *b, *((4, 2) if hdim_D else (4,))), _r(dev, *b, 2, 5, 4, 2),
            _r(dev, *b, 4, low=-0.3, high=0.3), _r(dev, *b, 2, 4, 2, 3)]


def _ssd_combined_cases(device):
    seq_idx = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 2, 2]], dtype=torch.int32, device=device)

    def ours(x, dt, A, B, C, D, z, dt_bias, init):  # (out, final_states), flattened
        return _flat(*bt.mamba.mamba_chunk_scan_combined(
            x, dt, A, B, C, 2, D=D, z=z, dt_bias=dt_bias, initial_states=init, seq_idx=seq_idx,
            dt_softplus=True, return_final_states=True))

    def ours_op(x, dt, A, B, C, D, dt_bias):  # the op itself: D [H], no z / states / seq_idx
        out, final, _, _ = ops.ssd_chunk_scan_combined(x, dt, A, B, C, 4, D, None, dt_bias, None,
                                                    None, False, 0.02, 0.9)
        return _flat(out, final)

    def theirs(x, dt, A, B, C, D, z, dt_bias, init):
        return _flat(*ref.ssd_chunk_scan_combined(
            x, dt, A, B, C, 2, D=D, z=z, dt_bias=dt_bias, initial_states=init, seq_idx=seq_idx,
            dt_softplus=True, return_final_states=True))

    def theirs_op(x, dt, A, B, C, D, dt_bias):
        return _flat(*ref.ssd_chunk_scan_combined(x, dt, A, B, C, D=D, dt_bias=dt_bias,
                                                  dt_limit=(0.02, 0.9), return_final_states=True))

    def make_op(dev, b):
        x, dt, A, B, C, D, _, dt_bias, _ = _ssd_inputs(dev, b, hdim_D=False)
        return [x, dt.abs(), A, B, C, D, dt_bias]

    return [
        FuncCase("ssd_chunk_scan_combined_all_options", ours, theirs, _ssd_inputs,
                 forward_ad=False, double=False, error="baracuda::ssd_chunk_scan_combined"),
        FuncCase("ssd_chunk_scan_combined_op_dt_limit", ours_op,
                 lambda x, dt, *t: theirs_op(x, dt, *t), make_op,
                 forward_ad=False, double=False, error="baracuda::ssd_chunk_scan_combined"),
    ]


def _cases(device):
    idx = torch.tensor([[0, 2, 2, 1], [1, 0, 1, 1], [3, 3, 0, 2]], device=device)
    pos = torch.tensor([[3, 100, 7, 1], [0, 5, 9, 2]], device=device)
    pos_s = torch.tensor([-4, 0, 1000, 7], device=device)
    return [
        FuncCase("swiglu", lambda x: bt.swiglu(x), lambda x: ref.gated_activation(x, "swiglu"),
                 lambda dev, b: [_r(dev, *b, 3, 8)], double=False,
                 error="baracuda::gated_activation"),
        FuncCase("geglu_tanh_dim0_gate_first", lambda x: bt.geglu(x, 0, "tanh", True),
                 lambda x: ref.gated_activation(x, "geglu_tanh", 0, True),
                 lambda dev, b: [_r(dev, *b, 4, 3)], double=False,
                 error="baracuda::gated_activation"),
        FuncCase("reglu_glu", lambda x: bt.reglu(x) + bt.glu(x),
                 lambda x: ref.gated_activation(x, "reglu") + ref.gated_activation(x, "glu"),
                 lambda dev, b: [_r(dev, *b, 2, 6)], double=False,
                 error="baracuda::gated_activation"),
        FuncCase("swiglu_pair", lambda g, u: bt.gated_activation_pair(g, u, "swiglu"),
                 lambda g, u: ref.gated_activation_pair(g, u, "swiglu"),
                 lambda dev, b: [_r(dev, *b, 3, 4), _r(dev, *b, 3, 4)], double=False,
                 error="baracuda::gated_activation_pair"),
        FuncCase("geglu_tanh_pair", lambda g, u: bt.gated_activation_pair(g, u, "geglu_tanh"),
                 lambda g, u: ref.gated_activation_pair(g, u, "geglu_tanh"),
                 lambda dev, b: [_r(dev, *b, 2, 5), _r(dev, *b, 2, 5)], double=False,
                 error="baracuda::gated_activation_pair"),
        FuncCase("rope", lambda x: bt.rope(x, interleaved=False), lambda x: ref.rope(x, None, 10000.0, False),
                 lambda dev, b: [_r(dev, *b, 2, 2, 3, 4)]),
        FuncCase("rope_positions_partial", lambda x: bt.rope(x, pos, base=50.0, rotary_dim=2),
                 lambda x: ref.rope(x, pos, 50.0, True, 2), lambda dev, b: [_r(dev, *b, 2, 1, 4, 4)]),
        FuncCase("rope_seq_positions", lambda x: bt.rope(x, pos_s), lambda x: ref.rope(x, pos_s),
                 lambda dev, b: [_r(dev, *b, 1, 2, 4, 2)]),
        FuncCase("lerp", lambda a, b: bt.lerp(a, b, 0.3), lambda a, b: torch.lerp(a, b, 0.3),
                 lambda dev, b: [_r(dev, *b, 3, 4), _r(dev, *b, 4)]),
        FuncCase("lerp_tensor", lambda a, b, w: bt.lerp(a, b, w), lambda a, b, w: torch.lerp(a, b, w),
                 lambda dev, b: [_r(dev, *b, 3, 4), _r(dev, *b, 1, 4), _r(dev, *b, 3, 1, low=-0.5, high=1.5)],
                 double=False, error="baracuda::lerp"),
        FuncCase("gather", lambda s: bt.gather(s, 1, idx), lambda s: torch.gather(s, 1, idx),
                 lambda dev, b: [_r(dev, *b, 3, 5)]),
        *_rope_cos_sin_cases(device),
        *_ssd_combined_cases(device),
        FuncCase("ssd_chunk_scan", lambda x, dt, A, B, C: bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=2),
                 lambda *t: ref.ssd_chunk_scan(*t),
                 lambda dev, b: [_r(dev, *b, 1, 5, 4, 2), _r(dev, *b, 1, 5, 4, low=0.05, high=0.5),
                                 _r(dev, *b, 4, low=-1.0, high=-0.1), _r(dev, *b, 1, 5, 2, 3),
                                 _r(dev, *b, 1, 5, 2, 3)],
                 forward_ad=False, double=False, error="baracuda::ssd_chunk_scan"),
    ]


def _ids():
    return [c.name for c in _cases("cpu")]


def _case(name, device):
    return next(c for c in _cases(device) if c.name == name)


def _argnums(inputs):
    return tuple(range(len(inputs)))


def _loss(fn):
    return lambda *t: fn(*t).sin().sum()


def _autograd_grads(fn, inputs, v=None, create_graph=False):
    leaves = [t.detach().requires_grad_() for t in inputs]
    y = fn(*leaves)
    if v is None:
        y = y.sin().sum()
    return torch.autograd.grad(y, leaves, v, create_graph=create_graph)


def _close(actual, expected):
    for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_grad_and_vjp_match_autograd(name, device):
    c = _case(name, device)
    inputs = c.make(device, ())
    an = _argnums(inputs)
    expected = _autograd_grads(c.ours, inputs)
    _close(grad(_loss(c.ours), argnums=an)(*inputs), expected)
    _close(expected, _autograd_grads(c.ref, inputs))
    y, pullback = vjp(c.ours, *inputs)
    _close(y, c.ref(*inputs))
    v = torch.randn_like(y)
    _close(pullback(v), _autograd_grads(c.ours, inputs, v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_jacrev_matches_autograd_jacobian(name, device):
    c = _case(name, device)
    inputs = c.make(device, ())
    an = _argnums(inputs)
    ours = jacrev(c.ours, argnums=an)(*inputs)
    _close(ours, torch.autograd.functional.jacobian(c.ours, tuple(inputs)))
    _close(ours, jacrev(c.ref, argnums=an)(*inputs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_jacfwd_and_jvp(name, device):
    c = _case(name, device)
    inputs = c.make(device, ())
    an = _argnums(inputs)
    if not c.forward_ad:
        with pytest.raises(NotImplementedError, match=f"{c.error}: forward-mode AD"):
            jacfwd(c.ours, argnums=an)(*inputs)
        return
    _close(jacfwd(c.ours, argnums=an)(*inputs), jacrev(c.ours, argnums=an)(*inputs))
    tangents = [torch.randn_like(t) for t in inputs]
    y, t = jvp(c.ours, tuple(inputs), tuple(tangents))
    y_ref, t_ref = jvp(c.ref, tuple(inputs), tuple(tangents))
    _close((y, t), (y_ref, t_ref))
    # Some inputs without a tangent.
    if len(inputs) > 1:
        fixed = lambda first: c.ours(first, *inputs[1:])  # noqa: E731
        fixed_ref = lambda first: c.ref(first, *inputs[1:])  # noqa: E731
        _close(jvp(fixed, (inputs[0],), (tangents[0],)), jvp(fixed_ref, (inputs[0],), (tangents[0],)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_vmap_forward(name, device):
    c = _case(name, device)
    batched = c.make(device, (3,))
    expected = torch.stack([c.ours(*[t[k] for t in batched]) for k in range(3)])
    _close(vmap(c.ours)(*batched), expected)
    _close(expected, vmap(c.ref)(*batched))
    # The batch dim elsewhere, and only the first input batched.
    moved = [t.movedim(0, -1) for t in batched]
    _close(vmap(c.ours, in_dims=-1)(*moved), expected)
    single = c.make(device, ())
    only_first = vmap(lambda first: c.ours(first, *single[1:]))(batched[0])
    _close(only_first, torch.stack([c.ours(batched[0][k], *single[1:]) for k in range(3)]))
    # Nested vmap.
    nested = c.make(device, (2, 3))
    _close(vmap(vmap(c.ours))(*nested), torch.stack([vmap(c.ours)(*[t[j] for t in nested]) for j in range(2)]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_vmap_backward(name, device):
    """vmap of grad (per-sample gradients) and of a vjp's pullback (the backward ops
    batched over the output gradient)."""
    c = _case(name, device)
    batched = c.make(device, (3,))
    an = _argnums(batched)
    expected = [_autograd_grads(c.ours, [t[k] for t in batched]) for k in range(3)]
    got = vmap(grad(_loss(c.ours), argnums=an))(*batched)
    for i in range(len(batched)):
        _close(got[i], torch.stack([e[i] for e in expected]))
    single = c.make(device, ())
    y, pullback = vjp(c.ours, *single)
    vs = torch.randn(3, *y.shape, dtype=D64, device=device)
    got = vmap(pullback)(vs)
    for k in range(3):
        _close([g[k] for g in got], _autograd_grads(c.ours, single, vs[k]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ids())
def test_second_derivatives(name, device):
    c = _case(name, device)
    inputs = c.make(device, ())
    first = inputs[0]
    rest = inputs[1:]
    f = lambda x: _loss(c.ours)(x, *rest)  # noqa: E731
    if not c.double:
        with pytest.raises(NotImplementedError, match=c.error):
            hessian(f)(first)
        with pytest.raises(NotImplementedError, match=c.error):
            grad(lambda x: grad(f)(x).sum())(first)
        return
    h = hessian(f)(first)
    h_ref = hessian(lambda x: _loss(c.ref)(x, *rest))(first)
    _close(h, h_ref)
    # jacrev of grad against torch.autograd's double backward of the same ops.
    leaf = first.detach().requires_grad_()
    (g,) = torch.autograd.grad(f(leaf), leaf, create_graph=True)
    rows = [torch.autograd.grad(g.reshape(-1)[i], leaf, retain_graph=True)[0]
            for i in range(g.numel())]
    _close(h.reshape(g.numel(), -1), torch.stack(rows).reshape(g.numel(), -1))


def test_direct_op_calls_work_under_transforms():
    """torch.ops.baracuda.* themselves, not only the functional wrappers."""
    x = torch.randn(3, 8, dtype=D64)
    g = grad(lambda t: ops.gated_activation(t, "swiglu", -1, False).sum())(x)
    _close(g, _autograd_grads(lambda t: ops.gated_activation(t, "swiglu", -1, False), [x],
                              torch.ones(3, 4, dtype=D64))[0])
    dy = torch.randn(2, 3, 4, dtype=D64)
    got = vmap(lambda d: ops.gated_activation_backward(d, x, "swiglu"))(dy)
    _close(got, torch.stack([ops.gated_activation_backward(d, x, "swiglu") for d in dy]))
    da, db = vmap(lambda d: ops.lerp_backward(d, 0.25))(dy)
    _close((da, db), (dy * 0.75, dy * 0.25))


def test_the_cpp_ops_do_the_work():
    """Under torch.func the forward and backward still run the C++ ops (seen by the
    profiler), not a PyTorch decomposition."""
    x = torch.randn(3, 8, dtype=D64)
    xs = torch.randn(1, 6, 2, 3, dtype=D64)
    dt = torch.rand(1, 6, 2, dtype=D64)
    A = -torch.rand(2, dtype=D64)
    Bm = torch.randn(1, 6, 1, 2, dtype=D64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        grad(lambda t: bt.swiglu(t).sum())(x)
        vmap(grad(lambda a: bt.lerp(a, x, 0.5).sum()))(x)
        grad(lambda s: bt.gather(s, 1, torch.zeros(3, 2, dtype=torch.long)).sum())(x)
        jacfwd(lambda t: bt.rope(t))(torch.randn(1, 1, 2, 2, dtype=D64))
        grad(lambda t: bt.ssd_chunk_scan(t, dt, A, Bm, Bm, 4).sum())(xs)
        grad(lambda t: bt.mamba.mamba_chunk_scan_combined(t, dt, A, Bm, Bm, 4, D=A).sum())(xs)
        cs = torch.randn(2, 1, dtype=D64)
        jacfwd(lambda t, c: bt.rope_cos_sin(t, c, cs), argnums=(0, 1))(torch.randn(1, 1, 2, 2, dtype=D64), cs)
        grad(lambda t, c: bt.rope_cos_sin(t, c, cs).sum(), argnums=(0, 1))(torch.randn(1, 1, 2, 2, dtype=D64), cs)
        vmap(grad(lambda q: bt.rope_qk_cos_sin(q, q, cs, cs)[1].sum()))(torch.randn(2, 1, 1, 2, 2, dtype=D64))
    names = {e.name for e in prof.events()}
    for op in ["gated_activation", "gated_activation_backward", "lerp", "lerp_backward", "gather",
               "gather_backward", "rope", "ssd_chunk_scan", "ssd_chunk_scan_backward",
               "ssd_chunk_scan_combined", "ssd_chunk_scan_combined_backward", "rope_cos_sin",
               "rope_cos_sin_backward", "rope_qk_cos_sin", "rope_qk_cos_sin_backward"]:
        assert f"baracuda::{op}" in names, op


@pytest.mark.parametrize("device", DEVICES)
def test_rope_cos_sin_hessian_in_every_input(device):
    """Second derivatives through the cos/sin gradient (ATen ops) as well as through x's
    (the adjoint op), against the reference's."""
    cases = [((2, 1, 3, 6), (2, 3, 4), False), ((1, 2, 3, 4), (3, 2), True), ((2, 2, 2, 4), (1, 2, 4), True)]
    for xs, ts, il in cases:
        inputs = (_r(device, *xs), _r(device, *ts), _r(device, *ts))
        an = (0, 1, 2)
        h = hessian(_loss(lambda x, c, s: bt.rope_cos_sin(x, c, s, il)), argnums=an)(*inputs)
        h_ref = hessian(_loss(lambda x, c, s: ref.rope_cos_sin(x, c, s, il)), argnums=an)(*inputs)
        _close(h, h_ref)
        hb = hessian(_loss(lambda x, c, s: ops.rope_cos_sin_backward(x, c, s, il)), argnums=an)(*inputs)
        hb_ref = hessian(_loss(lambda x, c, s: ref.rope_cos_sin(x, c, s, il, True)), argnums=an)(*inputs)
        _close(hb, hb_ref)
        ks = (xs[0], 1) + xs[2:]
        qk_inputs = inputs[:1] + (_r(device, *ks),) + inputs[1:]
        f = _loss(lambda q, k, c, s: _flat(*ops.rope_qk_cos_sin(q, k, c, s, il)))
        f_ref = _loss(lambda q, k, c, s: _flat(ref.rope_cos_sin(q, c, s, il), ref.rope_cos_sin(k, c, s, il)))
        _close(hessian(f, argnums=(0, 1, 2, 3))(*qk_inputs), hessian(f_ref, argnums=(0, 1, 2, 3))(*qk_inputs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_cos_sin_grads_match_eager_in_low_precision(device, dtype):
    """x in a low precision with float32 tables: the torch.func gradients (x, q, k, cos,
    sin) are the eager C++ autograd kernel's (same ops, same float32 sums)."""
    x = torch.randn(2, 3, 4, 8, device=device).to(dtype)
    k = torch.randn(2, 1, 4, 8, device=device).to(dtype)
    cos, sin = torch.randn(2, 4, 6, device=device), torch.randn(2, 4, 6, device=device)
    pair_cos, pair_sin = torch.randn(4, 3, device=device), torch.randn(4, 3, device=device)
    for c, s, il in [(cos, sin, False), (pair_cos, pair_sin, True)]:
        def f(x, c, s):
            return bt.rope_cos_sin(x, c, s, il).float().square().sum()

        def fqk(q, k, c, s):
            yq, yk = bt.rope_qk_cos_sin(q, k, c, s, il)
            return yq.float().square().sum() + yk.float().sin().sum()

        for fn, inputs in [(f, (x, c, s)), (fqk, (x, k, c, s))]:
            got = grad(fn, argnums=tuple(range(len(inputs))))(*inputs)
            leaves = [t.detach().requires_grad_() for t in inputs]
            expected = torch.autograd.grad(fn(*leaves), leaves)
            for g, e, t in zip(got, expected, inputs):
                assert g.dtype == t.dtype and g.shape == t.shape
                torch.testing.assert_close(g, e)


_ROPE_TABLE_CASES = [c.name for c in _rope_cos_sin_cases("cpu")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", _ROPE_TABLE_CASES)
def test_rope_cos_sin_vmap_every_subset_batched(name, device):
    """vmap of the forward and of grad with every subset of (x/q/k, cos, sin) batched:
    tables shared, per row, per pair, batched or not (folded into x's batch dim)."""
    import itertools

    c = _case(name, device)
    single, batched = c.make(device, ()), c.make(device, (2,))
    an = _argnums(single)
    for mask in itertools.product((False, True), repeat=len(single)):
        if not any(mask):
            continue
        args = [b if m else s for m, b, s in zip(mask, batched, single)]
        dims = tuple(0 if m else None for m in mask)
        samples = [[t[k] if m else t for t, m in zip(args, mask)] for k in range(2)]
        _close(vmap(c.ours, in_dims=dims)(*args), torch.stack([c.ours(*t) for t in samples]))
        got = vmap(grad(_loss(c.ours), argnums=an), in_dims=dims)(*args)
        expected = [_autograd_grads(c.ref, t) for t in samples]
        for i in range(len(single)):
            _close(got[i], torch.stack([e[i] for e in expected]))


def _ssd_per_sample(fn, batched, in_dims, n):
    outs = [fn(*[t if d is None else t.select(d, k) for t, d in zip(batched, in_dims)]) for k in range(n)]
    return [torch.stack(o) for o in zip(*outs)]


@pytest.mark.parametrize("device", DEVICES)
def test_ssd_combined_vmap_every_folding(device):
    """vmap of the op's four outputs (final_states, y_pre and the kept states included) and of its
    backward op's nine: the vmapped dim folded into the batch (per-head parameters not
    batched), into the heads (per-head parameters batched), and one call per sample (a
    batched seq_idx with batched per-head parameters)."""
    n = 3
    single = _ssd_inputs(device, ())
    batched = _ssd_inputs(device, (n,))
    seq = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 2, 2]], dtype=torch.int32, device=device)
    seqs = torch.stack([seq, seq.roll(1, 1).cummax(1).values, torch.zeros_like(seq)])

    def fwd(x, dt, A, B, C, D, z, dt_bias, init, seq_idx):
        return ops.ssd_chunk_scan_combined(x, dt, A, B, C, 2, D, z, dt_bias, init, seq_idx, True)

    names = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "init", "seq_idx"]
    layouts = {
        "batch": {"x", "B", "z", "init", "seq_idx"},      # per-head parameters shared
        "heads": {"x", "A", "D", "dt_bias", "C"},         # seq_idx shared
        "loop": {"A", "dt", "seq_idx"},                   # neither
        "all": set(names),
    }
    for what, which in layouts.items():
        args = [b if nm in which else s for nm, b, s in zip(names, batched + [seqs], single + [seq])]
        dims = [0 if nm in which else None for nm in names]
        got = vmap(fwd, in_dims=tuple(dims))(*args)
        expected = _ssd_per_sample(fwd, args, dims, n)
        _close(got, expected)
        assert got[2].shape == (n, 2, 5, 4, 2), what
        # The backward op, every operand batched as the forward's, plus dout/dfinal.
        out, final, y_pre, _ = got
        dout, dfinal = torch.randn_like(out), torch.randn_like(final)

        def bwd(dout, dfinal, x, dt, A, B, C, D, z, dt_bias, init, seq_idx, y_pre):
            return ops.ssd_chunk_scan_combined_backward(dout, dfinal, x, dt, A, B, C, 2, D, z,
                                                        dt_bias, init, seq_idx, y_pre, True)

        bargs = [dout, dfinal] + args + [y_pre]
        bdims = (0, 0, *dims, 0)
        _close(vmap(bwd, in_dims=bdims)(*bargs), _ssd_per_sample(bwd, bargs, bdims, n))
    # Without the options: y_pre and the absent gradients are empty in every sample.
    plain = lambda x: ops.ssd_chunk_scan_combined(x, *single[1:5], 2)  # noqa: E731
    out, final, y_pre, _ = vmap(plain)(batched[0])
    _close((out, final), _ssd_per_sample(lambda x: plain(x)[:2], [batched[0]], [0], n))
    assert y_pre.numel() == 0
    plain_bwd = lambda d: ops.ssd_chunk_scan_combined_backward(d, None, *single[:5], 2)  # noqa: E731
    douts = torch.randn_like(out)
    grads = vmap(plain_bwd)(douts)
    assert [g.numel() for g in grads[5:]] == [0] * 4
    _close(grads[:5], _ssd_per_sample(lambda d: plain_bwd(d)[:5], [douts], [0], n))


@pytest.mark.parametrize("device", DEVICES)
def test_ssd_combined_per_sample_grads_with_batched_seq_idx(device):
    """vmap(grad) with a per-sample seq_idx: the backward runs once per sample."""
    n = 3
    batched = _ssd_inputs(device, (n,))
    seq = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 2, 2]], dtype=torch.int32, device=device)
    seqs = torch.stack([seq, torch.zeros_like(seq), seq.flip(1).neg().add(2)])

    def loss(x, dt, A, B, C, D, z, dt_bias, init, seq_idx):
        out, final = bt.mamba.mamba_chunk_scan_combined(
            x, dt, A, B, C, 2, D=D, z=z, dt_bias=dt_bias, initial_states=init, seq_idx=seq_idx,
            dt_softplus=True, return_final_states=True)
        return _flat(out, final).sin().sum()

    an = tuple(range(9))
    got = vmap(grad(loss, argnums=an))(*batched, seqs)
    for k in range(n):
        sample = [t[k] for t in batched]
        leaves = [t.detach().requires_grad_() for t in sample]
        ref_leaves = [t.detach().requires_grad_() for t in sample]
        expected = torch.autograd.grad(loss(*leaves, seqs[k]), leaves)
        out, final = ref.ssd_chunk_scan_combined(
            *ref_leaves[:5], D=ref_leaves[5], z=ref_leaves[6], dt_bias=ref_leaves[7],
            initial_states=ref_leaves[8], seq_idx=seqs[k], dt_softplus=True, return_final_states=True)
        theirs = torch.autograd.grad(_flat(out, final).sin().sum(), ref_leaves)
        _close([g[k] for g in got], expected)
        _close(expected, theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_ssd_combined_state_dtype_grads_match_eager(device):
    """float32 final_states of float64 inputs (state_dtype): grad and vmap(grad) give
    the eager C++ autograd kernel's gradients (the same backward op)."""
    def loss(x, dt, A, B, C, D, z, dt_bias, init):
        out, fin = bt.mamba.mamba_chunk_scan_combined(
            x, dt, A, B, C, 2, D=D, z=z, dt_bias=dt_bias, initial_states=init, dt_softplus=True,
            return_final_states=True, state_dtype=torch.float32)
        assert fin.dtype == torch.float32
        return out.sin().sum() + fin.double().cos().sum()

    an = tuple(range(9))
    inputs = _ssd_inputs(device, ())
    _close(grad(loss, argnums=an)(*inputs), _autograd_grads(loss, inputs, torch.tensor(1.0, dtype=D64)))
    batched = _ssd_inputs(device, (2,))
    got = vmap(grad(loss, argnums=an))(*batched)
    for k in range(2):
        expected = _autograd_grads(loss, [t[k] for t in batched], torch.tensor(1.0, dtype=D64))
        _close([g[k] for g in got], expected)


def test_autograd_outside_transforms_stays_in_cpp():
    """Without a torch.func transform the ops keep their C++ autograd kernels (the
    Python rules are registered for the functorch key only)."""
    x = torch.randn(3, 8, requires_grad=True)
    y = bt.swiglu(x)
    assert "CppNode" in type(y.grad_fn).__name__ or "Cpp" in y.grad_fn.name(), y.grad_fn.name()


def _all_ops():
    return sorted(q for q in torch._C._dispatch_get_all_op_names() if q.startswith("baracuda::"))


def test_every_op_is_hooked():
    """A new op must get its torch.func rules (baracuda_torch/_autograd.py says how)."""
    from baracuda_torch import _autograd

    overloads = set(_all_ops())  # "baracuda::name" and "baracuda::name.overload"
    assert len(overloads) >= 12
    missing = sorted(overloads - _autograd.HOOKED)
    assert not missing, f"ops without torch.func rules: {missing}"


def test_unhooked_op_raises_naming_it():
    """What an op without rules does under a transform (the fallback of
    name_unhooked_ops), shown on a throwaway op with a C++-style autograd kernel."""
    from baracuda_torch import _autograd

    lib = torch.library.Library("baracuda_test_unhooked", "DEF")
    lib.define("double_it(Tensor x) -> Tensor")
    lib.impl("double_it", lambda x: x * 2, "CompositeExplicitAutograd")
    message = "baracuda_test_unhooked::double_it: torch.func transforms"

    def raiser(*args):
        raise NotImplementedError(message)

    lib.impl("double_it", raiser, "FuncTorchDynamicLayerFrontMode")
    op = torch.ops.baracuda_test_unhooked.double_it.default
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(NotImplementedError, match=message):
        vmap(op)(torch.ones(3, 2))
    with pytest.raises(NotImplementedError, match=message):
        grad(lambda t: op(t).sum())(torch.ones(2))
    # And the real fallback has nothing left to name in this build.
    assert _autograd.name_unhooked_ops() == []


def test_transforms_compile_fullgraph():
    """torch.compile(fullgraph=True) of a torch.func transform of the ops."""
    torch._dynamo.reset()
    x = torch.randn(3, 8, dtype=D64)
    g = grad(lambda t: bt.swiglu(t).sin().sum())
    v = vmap(lambda t: bt.lerp(t, t * 2, 0.3))
    _close(torch.compile(g, fullgraph=True)(x), g(x))
    _close(torch.compile(v, fullgraph=True)(x), v(x))
    # The ops that came later: rope from cos/sin (tables differentiated) and the Mamba scan.
    xr = torch.randn(2, 2, 3, 6, dtype=D64)
    c, s = torch.randn(2, 3, 4, dtype=D64), torch.randn(2, 3, 4, dtype=D64)
    cases = [
        (grad(_loss(lambda t, c, s: bt.rope_cos_sin(t, c, s)), argnums=(0, 1, 2)), (xr, c, s)),
        (vmap(lambda t: bt.rope_qk_cos_sin(t, t, c, s)[0]), (torch.randn(3, 2, 2, 3, 6, dtype=D64),)),
    ]
    ssd = _ssd_inputs("cpu", ())
    cases.append((grad(lambda *t: bt.mamba.mamba_chunk_scan_combined(
        *t[:5], 2, D=t[5], z=t[6], dt_bias=t[7], initial_states=t[8], dt_softplus=True,
        return_final_states=True)[1].sin().sum(), argnums=tuple(range(9))), ssd))
    for fn, args in cases:
        torch._dynamo.reset()
        _close(torch.compile(fn, fullgraph=True)(*args), fn(*args))
