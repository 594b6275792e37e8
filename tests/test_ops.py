"""The generic checks, run over every entry of tests/op_db.py (one per op overload of
torch.ops.baracuda) and every sample, on CPU and CUDA: results against the float64
reference in every dtype, gradcheck/gradgradcheck in float64, torch.library.opcheck,
torch.compile(fullgraph=True) against eager (static and dynamic shapes, gradients too),
fake-tensor outputs against eager ones, and the bad-input table (eagerly, through the
meta kernels, through explain and through a compiled call)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

import baracuda_torch as bt
from baracuda_torch import mamba
from helpers import DEVICES, assert_close_to_reference, check_compiled, compute_eps, poison_fresh_outputs
from op_db import OP_DB, OPS_BY_NAME, cos_sin_table


def registered_overloads():
    """Every overload of the baracuda namespace, as "packet" or "packet.overload"."""
    return sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("baracuda::"))


def sample_params(pred=lambda info: True):
    """(op name, sample index) pairs with readable ids, for the entries `pred` accepts."""
    return [pytest.param(info.name, i, id=f"{info.name}-{s.desc}")
            for info in OP_DB if pred(info)
            for i, s in enumerate(info.samples("cpu", torch.float32))]


def bad_params(pred=lambda case: True):
    return [pytest.param(info.name, case.name, id=f"{info.name}-{case.name}")
            for info in OP_DB for case in info.bad_inputs("cpu") if pred(case)]


def to64(a):
    """A floating tensor as a float64 CPU copy (the reference's inputs); others on the CPU."""
    if not isinstance(a, torch.Tensor):
        return a
    return a.detach().cpu().double() if a.is_floating_point() else a.cpu()


def as_tuple(out):
    """An op's outputs as a tuple (none for an op that only updates its arguments)."""
    return () if out is None else out if isinstance(out, (tuple, list)) else (out,)


def test_every_op_has_an_entry():
    assert sorted(OPS_BY_NAME) == registered_overloads()


def test_every_entry_is_complete():
    """The op x check matrix has no hole: every entry has samples, bad inputs and a
    float64 reference."""
    for info in OP_DB:
        assert info.samples("cpu", torch.float32), info.name
        assert info.bad_inputs("cpu"), info.name
        assert info.ref is not None, info.name


# ---- results -------------------------------------------------------------------------------


def reference_params():
    return [pytest.param(p.values[0], p.values[1], dtype, id=f"{p.id}-{str(dtype)[6:]}")
            for p in sample_params(lambda info: info.ref is not None)
            for dtype in OPS_BY_NAME[p.values[0]].dtypes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, index, dtype", reference_params())
def test_matches_reference(name, index, dtype, device):
    """Every output (and every argument the op updates in place) against the float64
    reference: at most twice PyTorch's own error in the same dtype plus a floor
    (assert_close_to_reference), or the entry's relative bound. Outputs are fresh tensors of the input's device; NaN-poisoned allocations
    (deterministic mode) show any element left unwritten."""
    info = OPS_BY_NAME[name]
    sample = info.samples(device, dtype)[index]
    expected = as_tuple(info.ref(*tree_map(to64, sample.args), **tree_map(to64, sample.kwargs)))
    # PyTorch's own error: the reference computed in the sample's dtype (every operand).
    cast = lambda a: a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa: E731
    baseline = (as_tuple(info.ref(*tree_map(cast, sample.args), **tree_map(cast, sample.kwargs)))
                if info.rtol is None else (None,) * len(expected))
    poison_fresh_outputs()
    outs = as_tuple(info.op(*sample.args, **sample.kwargs)) + tuple(sample.args[i] for i in info.mutates)
    for k, (out, exp, base) in enumerate(zip(outs, expected, baseline)):
        what = f"output {k} of {name} ({sample.desc}, {dtype}, {device})"
        assert out.device.type == device, what
        if info.rtol is None:
            assert_close_to_reference(out, exp, base, what, info.floor_ulps)
        else:
            rtol = max(info.rtol(out.dtype, device), info.rtol(dtype, device))
            assert_close_to_reference(out, exp, None, what, floor_ulps=rtol / compute_eps(out.dtype))


# ---- gradients -----------------------------------------------------------------------------


def gradient_params():
    """gradcheck on every sample of a differentiable op, gradgradcheck on those of a
    twice-differentiable one."""
    return ([pytest.param(*p.values, torch.autograd.gradcheck, id=p.id)
             for p in sample_params(lambda info: info.supports_autograd)]
            + [pytest.param(*p.values, torch.autograd.gradgradcheck, id="gradgrad-" + p.id)
               for p in sample_params(lambda info: info.supports_gradgrad)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, index, check", gradient_params())
def test_gradients_float64(name, index, check, device):
    info = OPS_BY_NAME[name]
    sample = info.samples(device, torch.float64, requires_grad=True)[index]
    # gradcheck cannot perturb an input whose elements share memory (an expanded view).
    fix = lambda a: (a.detach().contiguous().requires_grad_()  # noqa: E731
                     if isinstance(a, torch.Tensor) and a.requires_grad and torch._debug_has_internal_overlap(a) == 1
                     else a)
    # nondet_tol: the atomic-add backward kernels (gather on CUDA) may sum in another order.
    assert check(lambda *t: info.op(*t, **sample.kwargs), tuple(fix(a) for a in sample.args), nondet_tol=1e-12)


# ---- torch.library.opcheck, fake tensors, torch.compile ------------------------------------


def _dtype_for(info, index):
    """The dtype of sample `index` in the dtype-cycling checks: every sample list covers
    float32, float64, float16 and bfloat16 in turn."""
    return info.dtypes[index % len(info.dtypes)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, index", sample_params())
def test_opcheck(name, index, device):
    """Schema, autograd registration, fake (meta) kernel and AOT dispatch with dynamic
    shapes."""
    info = OPS_BY_NAME[name]
    sample = info.samples(device, _dtype_for(info, index), requires_grad=info.supports_autograd)[index]
    torch.library.opcheck(info.op, sample.args, sample.kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, index", sample_params())
def test_fake_matches_eager(name, index, device):
    """The fake (meta) kernels give eager's output shapes, dtypes, strides and devices."""
    info = OPS_BY_NAME[name]
    sample = info.samples(device, _dtype_for(info, index))[index]
    eager = as_tuple(info.op(*sample.args, **sample.kwargs))
    with FakeTensorMode() as mode:
        to_fake = lambda a: mode.from_tensor(a) if isinstance(a, torch.Tensor) else a  # noqa: E731
        fake = as_tuple(info.op(*tree_map(to_fake, sample.args), **tree_map(to_fake, sample.kwargs)))
    assert len(fake) == len(eager)
    for f, e in zip(fake, eager):
        assert (f.shape, f.dtype, f.device) == (e.shape, e.dtype, e.device)
        if e.numel() > 1:
            assert f.stride() == e.stride()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [info.name for info in OP_DB])
def test_compile(name, device):
    """torch.compile(fullgraph=True, dynamic=True) of the op (through AOTAutograd and the
    fake kernels; test_compile_inductor runs Inductor) gives eager's outputs (and the
    arguments it updates in place), and, for a differentiable op, eager's input
    gradients, on every sample."""
    info = OPS_BY_NAME[name]
    torch._dynamo.reset()
    fn = lambda *a, **k: info.op(*a, **k)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    clone = lambda a: (a.detach().clone().requires_grad_(a.requires_grad)  # noqa: E731
                       if isinstance(a, torch.Tensor) else a)
    for sample in info.samples(device, torch.float32, requires_grad=info.supports_autograd):
        ea, ca = [clone(a) for a in sample.args], [clone(a) for a in sample.args]
        out_e, out_c = as_tuple(fn(*ea, **sample.kwargs)), as_tuple(compiled(*ca, **sample.kwargs))
        torch.testing.assert_close(out_c, out_e)
        for i in info.mutates:  # the in-place updates too
            torch.testing.assert_close(ca[i], ea[i])
        leaves_e = [a for a in ea if isinstance(a, torch.Tensor) and a.requires_grad]
        leaves_c = [a for a in ca if isinstance(a, torch.Tensor) and a.requires_grad]
        if leaves_e:
            diff = [(o_e, o_c) for o_e, o_c in zip(out_e, out_c) if o_e.requires_grad]
            ge = torch.autograd.grad([o.sum() for o, _ in diff], leaves_e, allow_unused=True)
            gc = torch.autograd.grad([o.sum() for _, o in diff], leaves_c, allow_unused=True)
            torch.testing.assert_close(gc, ge)


def every_family(x, pos, cos, sin, index, w, dt, A, BC):
    """One forward op of each family in one graph, with pointwise ops between them."""
    g = bt.swiglu(x) + bt.gated_activation_pair(x[..., :8], x[..., 8:], "geglu")   # [2, 4, S, 8]
    r = bt.rope(g, pos, rotary_dim=4)
    q, k = bt.rope_qk_cos_sin(r, r[:, :2], cos, sin)
    m = bt.lerp(q, k[:, :1], 0.3) + bt.lerp(q, r, w)
    xs = m.transpose(1, 2)                                                           # [B, L=S, H=4, P=8]
    y = bt.ssd_chunk_scan(xs, dt, A, BC, BC, chunk_size=4)
    out = mamba.mamba_chunk_scan_combined(xs, dt, A, BC, BC, 4, z=xs)
    return torch.cat((bt.gather(m.flatten(0, 2), 1, index).flatten(), (y + out).flatten()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_inductor(device, dynamic):
    """The default backend with static and dynamic shapes (two sequence lengths), forward
    and backward, against eager."""
    inputs = []
    for S in (6, 10):
        cos, sin = cos_sin_table(2, S, 8, "full", False, device, torch.float32)
        inputs.append((torch.randn(2, 4, S, 16, device=device, requires_grad=True),
                       torch.randint(0, 1000, (S,), device=device), cos, sin,
                       torch.randint(0, 8, (2 * 4 * S, 5), device=device),
                       torch.rand(2, 4, 1, 8, device=device, requires_grad=True),
                       torch.rand(2, S, 4, device=device, requires_grad=True),
                       (-torch.rand(4, device=device)).requires_grad_(),
                       torch.randn(2, S, 1, 3, device=device, requires_grad=True)))
    check_compiled(every_family, inputs, dynamic)


# ---- bad inputs ----------------------------------------------------------------------------


def _bad_case(name, case, device):
    info = OPS_BY_NAME[name]
    bad = next(c for c in info.bad_inputs(device) if c.name == case)
    a, kw = bad.args()
    return info, bad, a, kw


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name, case", bad_params())
def test_bad_inputs(name, case, device):
    """Each rule's exception with a message naming the op and the rule, from the real
    kernels and from the meta kernels (what a compiled graph sees)."""
    info, bad, a, kw = _bad_case(name, case, device)
    with pytest.raises(bad.exc, match=bad.match):
        (bad.call or info.op)(*a, **kw)


@pytest.mark.parametrize("name, case", bad_params(lambda case: case.call is None))
def test_bad_inputs_explain(name, case):
    """explain asks the plan without running anything, and raises what the op raises."""
    info, bad, a, kw = _bad_case(name, case, "cpu")
    with pytest.raises(bad.exc, match=bad.match):
        bt.explain(info.op, *a, **kw)


@pytest.mark.parametrize("name", [info.name for info in OP_DB if info.bad_inputs("cpu")])
def test_bad_input_compiled(name):
    """A compiled call raises the first bad case's message at trace time."""
    info = OPS_BY_NAME[name]
    bad = next(c for c in info.bad_inputs("cpu") if c.call is None)
    a, kw = bad.args()
    torch._dynamo.reset()
    with pytest.raises(Exception, match=bad.match):
        torch.compile(lambda *t: info.op(*t, **kw), fullgraph=True)(*a)
