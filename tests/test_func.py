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
    names = {e.name for e in prof.events()}
    for op in ["gated_activation", "gated_activation_backward", "lerp", "lerp_backward", "gather",
               "gather_backward", "rope", "ssd_chunk_scan", "ssd_chunk_scan_backward"]:
        assert f"baracuda::{op}" in names, op


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
