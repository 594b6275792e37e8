"""The gated RMSNorm (gated_rms_norm, gated_rms_norm_backward and its _into form) beyond the table of
tests/op_db.py: both gate orders, one group, several and group_size = N, with and without
z and bias, against reference.py in float64 (the 2x rule, in every dtype, a float32
weight with 16-bit x included) and against mamba_ssm's own PyTorch statement of the op,
mamba_ssm's names and signatures (layernorm_gated), strided
inputs, groups computed independently, NaN-poisoned outputs, a bitwise reproducible dw
and db, explain, torch.func, torch.compile and, on CUDA, CPU agreement, the variants
picked, graph capture, wide row groups and more row groups than a grid's y holds."""
import inspect

import pytest
import torch
from torch.func import grad, vjp, vmap

import baracuda_torch as bt
from baracuda_torch import layernorm_gated, mamba
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, assert_close_to_reference, check_compiled,
                     check_graph_replay, layouts_2d, poison_fresh_outputs, randn, requires_cuda)

ops = torch.ops.baracuda
HALF = (torch.float16, torch.bfloat16)
GATES = [True, False]  # norm_before_gate


def run_and_check(x, weight, z=None, bias=None, eps=1e-6, group_size=None, norm_before_gate=True,
                  dy=None):
    """Our forward and every gradient (x, weight, z, bias) on these tensors (any layout)
    against reference.py in float64 and in the tensors' own dtypes (the 2x rule)."""
    given = [t for t in (x, weight, z, bias) if t is not None]

    def call(fn, ts):
        it = iter(ts)
        xx, w = next(it), next(it)
        zz = next(it) if z is not None else None
        b = next(it) if bias is not None else None
        return fn(xx, w, zz, b)

    def ours(xx, w, zz, b):
        return bt.gated_rms_norm(xx, w, zz, eps, group_size, norm_before_gate, bias=b)

    def theirs(xx, w, zz, b):
        return ref.gated_rms_norm(xx, w, b, zz, eps, group_size, norm_before_gate)[0]

    if dy is None:
        dy = randn(x.shape, x.dtype, x.device)

    def grads(fn, cast):
        ts = [t.detach().to(cast or t.dtype).requires_grad_() for t in given]
        out = call(fn, ts)
        return out, torch.autograd.grad(out, ts, dy.to(out.dtype))

    out, gs = grads(ours, None)
    out64, gs64 = grads(theirs, torch.float64)
    base, gbase = grads(theirs, None)
    what = (f"{x.dtype} {tuple(x.shape)} w={weight.dtype} z={z is not None} bias={bias is not None} "
            f"group_size={group_size} norm_before_gate={norm_before_gate}")
    assert out.dtype == x.dtype and out.is_contiguous(), what
    assert_close_to_reference(out, out64, base, f"y of {what}")
    names = ["dx", "dw"] + (["dz"] if z is not None else []) + (["db"] if bias is not None else [])
    for name, a, e, b, t in zip(names, gs, gs64, gbase, given):
        assert a.dtype == t.dtype and a.shape == t.shape, (name, what)
        assert_close_to_reference(a, e, b, f"{name} of {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("norm_before_gate", GATES)
def test_matches_reference(device, dtype, norm_before_gate):
    """Odd and vector-friendly widths, 1-d to 4-d, one group, several and groups of three
    channels, a weight in x's dtype and in float32, with and without z and bias. (Groups of
    one channel, where dx cancels to rstd·u·w·(1 − n²), are op_db's gradcheck sample.)"""
    w_dtypes = [dtype] + ([torch.float32] if dtype in HALF else [])
    for shape, sizes in [((7, 33), (None, 11, 3)), ((4, 64), (None, 8, 64)), ((2, 3, 5, 96), (24,)),
                         ((128,), (None, 32)), ((3, 1000), (None, 250))]:
        x = randn(shape, dtype, device, 2.0)
        z = randn(shape, dtype, device, 2.0)
        for wd in w_dtypes:
            w = randn(shape[-1:], wd, device) + 1.0
            b = randn(shape[-1:], wd, device)
            for gs in sizes:
                run_and_check(x, w, z, None, 1e-5, gs, norm_before_gate)
            run_and_check(x, w, z, b, 1e-6, sizes[-1], norm_before_gate)
        run_and_check(x, w, None, None, 1e-6, sizes[-1], norm_before_gate)
        run_and_check(x, w, None, b, 1e-6, None, norm_before_gate)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    """x, z and dy in every layout of layouts_2d; weights and biases sliced and expanded."""
    rows, cols = 12, 48
    xs = layouts_2d(device, dtype, rows, cols, 2.0)
    w_sliced = randn((2 * cols,), dtype, device)[::2]
    w_expanded = randn((1,), dtype, device).expand(cols)
    for name, x in xs.items():
        for gs, nbg, w, b in ((None, True, w_sliced, w_expanded), (12, False, w_expanded, None),
                              (4, True, w_sliced, w_sliced)):
            run_and_check(x, w, xs["transposed"], b, 1e-6, gs, nbg, dy=xs["every_other_row"])
            run_and_check(xs["row_slice_offset"], w, x, b, 1e-6, gs, nbg, dy=xs["broadcast_cols"])


# ---- what it replaces and mirrors ----------------------------------------------------------


def mamba_ssm_rms_norm_ref(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """mamba_ssm's own PyTorch statement of its gated RMSNorm (its ``rms_norm_ref`` with
    the default ``upcast=True``), written out here: weight, bias, x and z each converted to
    float32 (float64 too), h = x or x·silu(z), groups of group_size channels (all when
    None) scaled by 1/sqrt(mean(h²) + eps), then ·weight, + bias, ·silu(z) when the gate
    comes after the norm; the result cast to x's dtype."""
    dtype = x.dtype
    weight = weight.float()
    bias = bias.float() if bias is not None else None
    x = x.float()
    z = z.float() if z is not None else None
    if z is not None and not norm_before_gate:
        x = x * torch.nn.functional.silu(z)
    size = x.shape[-1] if group_size is None else group_size
    grouped = x.unflatten(-1, (-1, size))
    rstd = 1 / torch.sqrt(grouped.square().mean(dim=-1, keepdim=True) + eps)
    out = (grouped * rstd).flatten(-2) * weight
    if bias is not None:
        out = out + bias
    if z is not None and norm_before_gate:
        out = out * torch.nn.functional.silu(z)
    return out.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm_before_gate", GATES)
def test_matches_mamba_ssm_reference(device, dtype, norm_before_gate):
    """layernorm_gated.rmsnorm_fn against mamba_ssm's PyTorch reference (transcribed
    above), in the dtypes where both compute in float32: the output and the gradients of
    x, weight, bias and z have the dtypes that reference gives them, and are within twice
    its error against float64 (the reference's own semantics in float64), with and
    without z and bias, one group and several, a weight in x's dtype and in float32."""
    shape = (3, 7, 96)
    x, z, dy = (randn(shape, dtype, device, 2.0) for _ in range(3))
    for wd in {dtype, torch.float32}:
        w, b = randn((96,), wd, device) + 1.0, randn((96,), wd, device)
        for gs, with_z, with_bias in ((None, True, True), (12, True, False), (32, False, True),
                                      (96, True, True), (None, False, False)):
            given = [x, w, b if with_bias else None, z if with_z else None]
            leaves = [t for t in given if t is not None]

            def grads(fn, cast):
                ts = [t.detach().to(cast or t.dtype).requires_grad_() for t in leaves]
                it = iter(ts)
                args = [next(it) if t is not None else None for t in given]
                out = fn(args[0], args[1], args[2], args[3], 1e-5, gs, norm_before_gate)
                return out, torch.autograd.grad(out, ts, dy.to(out.dtype))

            ours, g = grads(layernorm_gated.rmsnorm_fn, None)
            theirs, gt = grads(mamba_ssm_rms_norm_ref, None)
            exact, g64 = grads(mamba_ssm_rms_norm_ref, torch.float64)
            what = f"{dtype} w={wd} group_size={gs} z={with_z} bias={with_bias} nbg={norm_before_gate}"
            assert ours.dtype == theirs.dtype == dtype, what
            assert_close_to_reference(ours, exact, theirs, "y of " + what)
            names = ["dx", "dw"] + (["db"] if with_bias else []) + (["dz"] if with_z else [])
            for name, a, e, t in zip(names, g, g64, gt):
                assert a.dtype == t.dtype and a.shape == t.shape, (name, what)
                assert_close_to_reference(a, e, t, f"{name} of {what}")


def test_float64_is_computed_in_float64():
    """The one difference in results from mamba_ssm's reference: float64 inputs are
    normalized in float64 here (that reference converts them to float32), so the float64
    op agrees with reference.py to float64 rounding, far below float32's."""
    x, z = torch.randn(5, 64, dtype=torch.float64), torch.randn(5, 64, dtype=torch.float64)
    w = torch.randn(64, dtype=torch.float64)
    ours = layernorm_gated.rmsnorm_fn(x, w, None, z, 1e-5, 16, False)
    exact = ref.gated_rms_norm(x, w, None, z, 1e-5, 16, False)[0]
    in_float32 = mamba_ssm_rms_norm_ref(x, w, None, z, 1e-5, 16, False)
    assert in_float32.dtype == torch.float64
    err, err32 = (ours - exact).abs().max().item(), (in_float32 - exact).abs().max().item()
    assert err < 1e-13 and err32 > 1e-9, (err, err32)


def test_layernorm_gated_has_mamba_ssms_signatures():
    """rmsnorm_fn and RMSNorm take mamba_ssm's parameters, in its order, with its
    defaults; the module holds a weight of ones and a bias of None."""
    params = inspect.signature(layernorm_gated.rmsnorm_fn).parameters
    assert [(p.name, p.default) for p in params.values()] == [
        ("x", inspect.Parameter.empty), ("weight", inspect.Parameter.empty),
        ("bias", inspect.Parameter.empty), ("z", None), ("eps", 1e-6), ("group_size", None),
        ("norm_before_gate", True)]
    params = inspect.signature(layernorm_gated.RMSNorm.__init__).parameters
    assert [(p.name, p.default) for p in list(params.values())[1:]] == [
        ("hidden_size", inspect.Parameter.empty), ("eps", 1e-5), ("group_size", None),
        ("norm_before_gate", True), ("device", None), ("dtype", None)]
    assert list(inspect.signature(layernorm_gated.RMSNorm.forward).parameters) == ["self", "x", "z"]
    m = layernorm_gated.RMSNorm(16, dtype=torch.float64)
    assert m.bias is None and set(m.state_dict()) == {"weight"}
    assert torch.equal(m.weight, torch.ones(16, dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_gated_module_computes_mamba_ssms_function(device):
    """RMSNorm(...)(x, z) is mamba_ssm's reference with the module's weight and no bias
    (float32, one group and several, both gates, with and without z); a state dict with a
    weight only loads; mamba.RMSNormGated is this module (mamba_ssm's Mamba2 takes its
    gated RMSNorm under that name)."""
    assert mamba.RMSNormGated is layernorm_gated.RMSNorm
    for gs, nbg in ((None, True), (8, False), (4, True)):
        m = layernorm_gated.RMSNorm(32, group_size=gs, norm_before_gate=nbg, device=device)
        m.load_state_dict({"weight": torch.randn(32)})
        x = torch.randn(3, 7, 32, device=device)
        z = torch.randn_like(x)
        for zz in (z, None):
            theirs = mamba_ssm_rms_norm_ref(x, m.weight, None, zz, 1e-5, gs, nbg)
            torch.testing.assert_close(m(x, zz), theirs, rtol=1e-6, atol=1e-6)


# ---- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_before_gate", GATES)
def test_groups_are_independent_norms(device, norm_before_gate):
    """Groups of 16 of 64 channels give what one group of 16 gives on each slice (the
    same kernels walk both), rstd and gradients included."""
    x, z = torch.randn(9, 64, device=device), torch.randn(9, 64, device=device)
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    dy = torch.randn(9, 64, device=device)
    y, rstd = ops.gated_rms_norm(x, w, b, z, 1e-5, 16, norm_before_gate)
    assert rstd.shape == (9, 4)
    grads = ops.gated_rms_norm_backward(dy, x, w, b, z, rstd, 16, norm_before_gate)
    for g in range(4):
        s = slice(16 * g, 16 * (g + 1))
        yg, rg = ops.gated_rms_norm(x[:, s].contiguous(), w[s], b[s], z[:, s].contiguous(), 1e-5, None,
                                    norm_before_gate)
        torch.testing.assert_close(y[:, s], yg)
        torch.testing.assert_close(rstd[:, g], rg[:, 0])
        gg = ops.gated_rms_norm_backward(dy[:, s].contiguous(), x[:, s].contiguous(), w[s], b[s],
                                         z[:, s].contiguous(), rg, None, norm_before_gate)
        torch.testing.assert_close(grads[0][:, s], gg[0])
        torch.testing.assert_close(grads[1][s], gg[1])
        torch.testing.assert_close(grads[2][s], gg[2])
        torch.testing.assert_close(grads[3][:, s], gg[3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_output_element_written(device, dtype):
    """NaN-filled fresh outputs (y, rstd, dx, dw, dz, db): none survives, for group widths
    that take each variant (a fraction of a warp, a warp, a block, a row group wider than
    the registers hold, an unaligned one), row counts that leave a block partly empty, and
    several groups a row."""
    for rows, cols, gs, sl in [(37, 64, 8, None), (5, 512, 256, None), (9, 5120, None, None),
                               (3, 5120, 640, None), (3, 40000, 20000, None), (7, 66, 8, (1, 65)),
                               (4, 4096, 4096, None)]:
        x, z = randn((rows, cols), dtype, device), randn((rows, cols), dtype, device)
        if sl:
            x, z = x[:, sl[0]:sl[1]], z[:, sl[0]:sl[1]]
        n = x.shape[-1]
        w, b = randn((n,), dtype, device), randn((n,), dtype, device)
        for nbg in GATES:
            poison_fresh_outputs()
            leaves = [t.detach().requires_grad_() for t in (x, z, w, b)]
            y = bt.gated_rms_norm(leaves[0], leaves[2], leaves[1], 1e-6, gs, nbg, bias=leaves[3])
            _, rstd = ops.gated_rms_norm(x, w, None, z, 1e-6, gs, nbg)
            g = torch.autograd.grad(y, leaves, torch.ones_like(y))
            for name, t in zip(("y", "rstd", "dx", "dz", "dw", "db"), (y, rstd, *g)):
                assert not t.isnan().any(), f"{name} [{rows}, {n}] group_size={gs} {dtype} {device}"
            torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_stays_in_its_group(device):
    """A NaN in one group of a row makes that group's output NaN, as the reference, and
    leaves the row's other groups and the other rows alone."""
    x, z = torch.randn(4, 32, device=device), torch.randn(4, 32, device=device)
    x[1, 3] = float("nan")
    w = torch.randn(32, device=device)
    for nbg in GATES:
        y, rstd = ops.gated_rms_norm(x, w, None, z, 1e-6, 8, nbg)
        y64, rstd64 = ref.gated_rms_norm(x.double(), w.double(), None, z.double(), 1e-6, 8, nbg)
        assert_close_to_reference(y, y64, ref.gated_rms_norm(x, w, None, z, 1e-6, 8, nbg)[0], str(nbg))
        assert torch.equal(rstd.isnan(), rstd64.isnan()) and rstd.isnan().sum() == 1
        assert torch.isfinite(y[1, 8:]).all() and torch.isfinite(y[[0, 2, 3]]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dw_and_db_are_bitwise_reproducible(device, dtype):
    """The weight's and bias's gradients sum rows per fixed block, then blocks in order: the
    same bits on every run (and, on the CPU, whatever the thread count)."""
    x, z, dy = (randn((3000, 96), dtype, device) for _ in range(3))
    w, b = randn((96,), dtype, device), randn((96,), dtype, device)
    for gs, nbg in ((None, True), (12, False)):
        _, rstd = ops.gated_rms_norm(x, w, b, z, 1e-6, gs, nbg)
        first = ops.gated_rms_norm_backward(dy, x, w, b, z, rstd, gs, nbg)
        for _ in range(3):
            again = ops.gated_rms_norm_backward(dy, x, w, b, z, rstd, gs, nbg)
            assert all(torch.equal(a, f) for a, f in zip(again, first))
        if device == "cpu":
            threads = torch.get_num_threads()
            try:
                torch.set_num_threads(1)
                one = ops.gated_rms_norm_backward(dy, x, w, b, z, rstd, gs, nbg)
            finally:
                torch.set_num_threads(threads)
            assert torch.equal(one[1], first[1]) and torch.equal(one[2], first[2])
    info = bt.explain("gated_rms_norm_backward", dy, x, w, b, z, rstd, 12, False)
    assert info.deterministic and info.bit_stable


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """No rows: empty outputs and zero dw and db; no channels: empty everything."""
    x, w = torch.randn(0, 8, device=device), torch.randn(8, device=device)
    y, rstd = ops.gated_rms_norm(x, w, w, x, 1e-6, 4)
    assert y.shape == (0, 8) and rstd.shape == (0, 2)
    dx, dw, db, dz = ops.gated_rms_norm_backward(x, x, w, w, x, rstd, 4)
    assert dx.shape == (0, 8) and dz.shape == (0, 8)
    assert torch.equal(dw, torch.zeros(8, device=device)) and torch.equal(db, torch.zeros(8, device=device))
    x0, w0 = torch.randn(3, 0, device=device), torch.randn(0, device=device)
    y, rstd = ops.gated_rms_norm(x0, w0, None, x0, 1e-6, 4)
    assert y.shape == (3, 0) and rstd.shape == (3, 0)
    dx, dw, db, dz = ops.gated_rms_norm_backward(x0, x0, w0, None, x0, rstd, 4)
    assert dx.shape == (3, 0) and dw.shape == (0,) and db.shape == (0,) and dz.shape == (3, 0)


# ---- explain, autograd limits, torch.func, compile -----------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    x = torch.randn(16, 5120, dtype=torch.bfloat16, device=device)
    w = torch.randn(5120, dtype=torch.bfloat16, device=device)
    info = bt.explain("gated_rms_norm", x, w, None, x, 1e-5, 640, False)
    assert info.family == "rms_norm" and info.op == "gated" and info.dtype == "bfloat16"
    assert info.math_precision == "float32" and info.deterministic and info.workspace_bytes == 0
    _, rstd = ops.gated_rms_norm(x, w, None, x, 1e-5, 640)
    b = bt.explain("gated_rms_norm_backward", x, x, w, None, x, rstd, 640)
    assert b.op == "gated_backward" and b.workspace_bytes > 0 and b.workspace_bytes % (4 * 5120) == 0
    with_bias = bt.explain("gated_rms_norm_backward", x, x, w, w, x, rstd, 640)
    # db's partial rows after dw's, as many (on CUDA the bias kernel's occupancy, which
    # sizes the grid, may differ from the other's)
    assert with_bias.workspace_bytes > 0 and with_bias.workspace_bytes % (2 * 4 * 5120) == 0
    if device == "cpu":  # fixed row blocks
        assert with_bias.workspace_bytes == 2 * b.workspace_bytes
    assert bt.explain("gated_rms_norm", x.double(), w.double(), None, x.double()).math_precision == "float64"
    expect_rows = "rows" if device == "cpu" else "block_vec16"
    assert bt.explain("gated_rms_norm", x, w, None, x).variant == expect_rows
    assert bt.explain("gated_rms_norm", x, w, None, x.t().contiguous().t()).variant == "strided"


@pytest.mark.parametrize("device", DEVICES)
def test_second_derivative_raises(device):
    x = torch.randn(3, 8, dtype=torch.float64, device=device, requires_grad=True)
    z = torch.randn(3, 8, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, device=device, requires_grad=True)
    (g,) = torch.autograd.grad(bt.gated_rms_norm(x, w, z, group_size=4).pow(2).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"baracuda::gated_rms_norm: double backward"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_func(device):
    """grad and vjp, and vmap (per-sample gradients with per-sample weights) against
    torch.autograd of the reference."""
    x = torch.randn(3, 4, 12, dtype=torch.float64, device=device)
    z = torch.randn(3, 4, 12, dtype=torch.float64, device=device)
    w = torch.randn(3, 12, dtype=torch.float64, device=device)

    def loss(x, w, z):
        return bt.gated_rms_norm(x, w, z, 1e-5, 4, False).sin().sum()

    def loss_ref(x, w, z):
        return ref.gated_rms_norm(x, w, None, z, 1e-5, 4, False)[0].sin().sum()

    got = vmap(grad(loss, argnums=(0, 1, 2)))(x, w, z)
    for k in range(3):
        leaves = [t[k].detach().requires_grad_() for t in (x, w, z)]
        expected = torch.autograd.grad(loss_ref(*leaves), leaves)
        for a, e in zip(got, expected):
            torch.testing.assert_close(a[k], e)
    y, pullback = vjp(lambda t, u: bt.gated_rms_norm(t, w[0], u, group_size=6), x, z)
    torch.testing.assert_close(y, ref.gated_rms_norm(x, w[0], None, z, 1e-6, 6)[0])
    v = torch.randn_like(y)
    leaves = [t.detach().requires_grad_() for t in (x, z)]
    expected = torch.autograd.grad(ref.gated_rms_norm(leaves[0], w[0], None, leaves[1], 1e-6, 6)[0],
                                   leaves, v)
    for a, e in zip(pullback(v), expected):
        torch.testing.assert_close(a, e)
    ys = vmap(lambda t, u: bt.gated_rms_norm(t, w[0], u))(x, z)
    torch.testing.assert_close(ys, ref.gated_rms_norm(x, w[0], None, z)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_inductor(device, dynamic):
    """torch.compile's default backend (Inductor) around the op, with pointwise work before
    and after, two row counts: eager's outputs and gradients."""
    def layer(x, z, w):
        y = bt.gated_rms_norm(x * 2, w, z, 1e-5, 16, False)
        return (y.sin() + layernorm_gated.rmsnorm_fn(x, w, None, z.cos(), group_size=32)).flatten()

    inputs = [(torch.randn(n, 64, device=device, requires_grad=True),
               torch.randn(n, 64, device=device, requires_grad=True),
               torch.randn(64, device=device, requires_grad=True)) for n in (5, 9)]
    check_compiled(layer, inputs, dynamic)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("norm_before_gate", GATES)
def test_backward_into(device, dtype, norm_before_gate):
    """gated_rms_norm_backward_into writes the dz of gated_rms_norm_backward, bit for bit,
    into a column slice of a wider buffer (Mamba-2's dzxbcdt) or into a contiguous tensor,
    leaving the buffer's other columns alone; its dx, dw and db are the allocating op's bits;
    with recompute_output, y is the forward's output, bit for bit (the same formula from the
    saved rstd; the rows and strided variants on CUDA: 5120 and 100 channels)."""
    for shape, gs, bias in (((3, 2, 5120), None, False), ((7, 1, 100), 25, True), ((5, 64), 16, True)):
        x, z, dy = (randn(shape, dtype, device, 2.0) for _ in range(3))
        cols = shape[-1]
        w = randn((cols,), dtype, device) + 1
        b = randn((cols,), dtype, device) if bias else None
        y, rstd = ops.gated_rms_norm(x, w, b, z, 1e-5, gs, norm_before_gate)
        want = ops.gated_rms_norm_backward(dy, x, w, b, z, rstd, gs, norm_before_gate)
        wide = torch.full((*x.shape[:-1], cols + 24), float("nan"), dtype=dtype, device=device)
        for dz in (wide[..., 8:8 + cols], torch.full_like(x, float("nan"))):
            for recompute in (True, False):
                dx, dw, db, y2 = ops.gated_rms_norm_backward_into(dy, x, w, b, z, rstd, dz, gs, norm_before_gate,
                                                                  recompute)
                for name, got, exp in zip(("dx", "dw", "db", "dz"), (dx, dw, db, dz), want):
                    assert torch.equal(got, exp), f"{name} {cols} {gs} {dtype}"
                if recompute:
                    assert torch.equal(y2, y), f"y {cols} {gs} {dtype}"
                else:
                    assert y2.numel() == 0
        assert wide[..., :8].isnan().all() and wide[..., 8 + cols:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_memory_checks(device):
    """dz may not share memory with an input (ValueError naming it); the sizes, dtype and
    stride rules are tests/op_db.py's bad inputs."""
    x, z, dy = (torch.randn(3, 8, device=device) for _ in range(3))
    w = torch.randn(8, device=device)
    rstd = ops.gated_rms_norm(x, w, None, z, 1e-5, 4)[1]
    op = r"baracuda::gated_rms_norm_backward_into: "
    for name, t in (("dy", dy), ("x", x), ("z", z)):
        with pytest.raises(ValueError, match=op + f"dz must not share memory with {name}$"):
            ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, t, 4)
    both = torch.randn(3, 16, device=device)  # z and dz: overlapping column ranges of one buffer
    with pytest.raises(ValueError, match=op + r"dz must not share memory with z$"):
        ops.gated_rms_norm_backward_into(dy, x, w, None, both[:, 4:12], rstd, both[:, :8], 4)


# ---- CUDA ----------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_matches_cpu(dtype):
    """Both backends on the same inputs, both gates, with a bias: within the 2x rule of each
    other's reference error (the sum orders differ), gradients included."""
    for cols, gs in ((8, None), (100, 25), (1024, 128), (5120, None), (5120, 640), (6000, 3000)):
        x, z, dy = (randn((33, cols), dtype, "cpu", 2.0) for _ in range(3))
        w, b = randn((cols,), dtype, "cpu") + 1, randn((cols,), dtype, "cpu")
        for nbg in GATES:
            def run(*ts):
                leaves = [t.detach().requires_grad_() for t in ts]
                y = bt.gated_rms_norm(leaves[0], leaves[1], leaves[2], 1e-6, gs, nbg, bias=leaves[3])
                return (y, *torch.autograd.grad(y, leaves, dy.to(y.device)))

            cpu = run(x, w, z, b)
            cuda = run(x.cuda(), w.cuda(), z.cuda(), b.cuda())
            leaves = [t.double().requires_grad_() for t in (x, w, z, b)]
            y64 = ref.gated_rms_norm(leaves[0], leaves[1], leaves[3], leaves[2], 1e-6, gs, nbg)[0]
            exp = (y64, *torch.autograd.grad(y64, leaves, dy.double()))
            for name, c, h, e in zip(("y", "dx", "dw", "dz", "db"), cuda, cpu, exp):
                assert_close_to_reference(c, e, h, f"cuda vs cpu {name} {cols} {gs} {nbg} {dtype}")


@requires_cuda
def test_cuda_variants_chosen():
    """The rows kernels for Mamba-2's output norms (5120 channels, one group or 8; 4096),
    a warp's share for small groups, strided for unaligned or too wide row groups."""
    bf = torch.bfloat16

    def variant(cols, gs=None, op="gated_rms_norm", x=None):
        x = torch.randn(64, cols, dtype=bf, device="cuda") if x is None else x
        w = torch.randn(x.shape[-1], dtype=bf, device="cuda")
        if op == "gated_rms_norm":
            return bt.explain(op, x, w, None, x, 1e-5, gs).variant
        rstd = ops.gated_rms_norm(x, w, None, x, 1e-5, gs)[1]
        return bt.explain(op, x, x, w, None, x, rstd, gs).variant

    for op in ("gated_rms_norm", "gated_rms_norm_backward"):
        s = "_staged"  # the rows staged in shared memory (each fits an sm_80+ block)
        # (the forward only where a thread holds one vector of the row group: not 4096+ bf16)
        f = s if op.endswith("backward") else ""
        assert variant(5120, None, op) == "block_vec16" + f and variant(5120, 640, op) == "block_vec16" + s
        assert variant(4096, None, op) == "block_vec16" + f and variant(512, 64, op) == "warp_vec16" + s
        assert variant(100, None, op) == "strided"  # 200 bytes: not whole 16-byte vectors
        assert variant(4104, None, op, torch.randn(64, 4105, dtype=bf, device="cuda")[:, 1:]) == "strided"
    assert variant(16384) == "block_vec16" and variant(32768) == "strided"  # forward: 512 threads of 4
    assert variant(10240, op="gated_rms_norm_backward") == "block_vec16_staged"  # 320 threads of 4
    assert variant(10496, op="gated_rms_norm_backward") == "strided"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_staged_and_unstaged_agree(dtype):
    """The rows kernels with x and z (the backward: dy, x and z) staged through shared
    memory (the plan's choice where the rings fit; the backward's without a bias) and
    unstaged (a bias, or a device with less shared memory) do the same operations in the
    same order: the same bits, forward and backward, both gate positions and none, one row
    group and several, a float32 weight beside 16-bit x, dz into a wider buffer with y
    recomputed, and more rows than the resident grid takes at once."""
    torch.manual_seed(6)
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    for rows, cols, gs in ((2100, 5120, None), (333, 5120, 640), (77, 256, 64), (9, 40, None)):
        x, z, dy = (randn((rows, cols), dtype, "cuda") for _ in range(3))
        for w_dtype in ((dtype, torch.float32) if dtype in HALF else (dtype,)):
            w = randn((cols,), w_dtype, "cuda") + 1
            for nbg, gate in ((True, z), (False, z), (True, None)):
                _, rstd = ops.gated_rms_norm(x, w, None, gate, 1e-5, gs, nbg)
                results = []
                for allow in (True, False):
                    previous = bt._C._rms_norm_allow_stage(allow)
                    try:
                        args = (dy, x, w, None, gate, rstd, gs, nbg)
                        staged = bt.explain("gated_rms_norm_backward", *args).variant.endswith("_staged")
                        # (a ring of two rows of dy, x and z: float64 rows of 5120 do not fit)
                        fits = 6 * (gs or cols) * x.element_size() <= optin
                        assert staged == allow or (allow and not fits), (allow, staged)
                        forward = (x, w, None, gate, 1e-5, gs, nbg)
                        staged = bt.explain("gated_rms_norm", *forward).variant.endswith("_staged")
                        # (the forward where a thread holds one 16-byte vector of the row group:
                        # under 8 KiB of it, with groups of up to 256 threads)
                        assert staged == (allow and (gs or cols) * x.element_size() < 8192), (allow, staged)
                        out = [*ops.gated_rms_norm(*forward), *ops.gated_rms_norm_backward(*args)]
                        if gate is not None:
                            wide = torch.full((rows, cols + 16), float("nan"), dtype=dtype, device="cuda")
                            got = ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, wide[:, 8:8 + cols],
                                                                   gs, nbg, True)
                            out += [*got, wide]
                        results.append(out)
                    finally:
                        bt._C._rms_norm_allow_stage(previous)
                for k, (a, b) in enumerate(zip(*results)):
                    assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(
                        a.nan_to_num(0), b.nan_to_num(0)), (k, rows, cols, gs, w_dtype, nbg, gate is None)


@requires_cuda
def test_cuda_backward_into_mamba2_layout():
    """The into op at a Mamba-2 2.7B layer's layout (dz: the z columns of dzxbcdt, [4, 256,
    10576] here, 5120 channels at column 5120): the rows kernel (row stride and start in whole
    16-byte vectors), matching the allocating backward (rows too) bit for bit, and strided
    for a dz whose rows start off a vector (other sum orders: within the 2x rule of the
    allocating backward's error against float64); y is the forward's, bit for bit."""
    bf, n, width = torch.bfloat16, 5120, 10576
    x, z, dy = (torch.randn(4, 256, n, dtype=bf, device="cuda") for _ in range(3))
    w = torch.randn(n, dtype=bf, device="cuda")
    y, rstd = ops.gated_rms_norm(x, w, None, z, 1e-5)
    want = ops.gated_rms_norm_backward(dy, x, w, None, z, rstd)
    exp = ops.gated_rms_norm_backward(*(t.double() for t in (dy, x, w)), None, z.double(), rstd.double())
    for start, variant in ((n, "block_vec16_staged"), (n + 1, "strided")):
        dz = torch.empty(4, 256, width, dtype=bf, device="cuda")[..., start:start + n]
        assert bt.explain("gated_rms_norm_backward_into", dy, x, w, None, z, rstd, dz).variant == variant
        got = ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, dz, None, True, True)
        assert torch.equal(got[3], y), start
        for name, a, b, e in zip(("dx", "dw", "db", "dz"), (*got[:3], dz), want, exp):
            if start == n:
                assert torch.equal(a, b), name
            else:
                assert_close_to_reference(a, e, b, f"{name} strided")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_wide_row_groups(dtype):
    """Row groups of 10240 and 16384 elements (4 vectors a thread in the rows kernels) and
    of 40000 (strided), forward and backward, against the reference."""
    for cols, gs in ((10240, None), (32768, 16384), (80000, 40000)):
        x, z = randn((4, cols), dtype, "cuda"), randn((4, cols), dtype, "cuda")
        for nbg in GATES:
            run_and_check(x, randn((cols,), dtype, "cuda") + 1, z, None, 1e-6, gs, nbg)


@requires_cuda
def test_cuda_more_row_groups_than_grid_y():
    """70000 row groups a row (CUDA's grid holds 65535 on y; blocks loop over the rest),
    in the rows and the strided kernels, forward and backward."""
    for x in (torch.randn(3, 280000, device="cuda"), torch.randn(280000, 3, device="cuda").t()):
        z = torch.randn_like(x)
        w, b = torch.randn(280000, device="cuda"), torch.randn(280000, device="cuda")
        run_and_check(x, w, z, b, 1e-6, 4, True)


@requires_cuda
def test_cuda_mamba_27b_shape():
    """Mamba-2 2.7B's output norm (y, z [4096, 5120] bf16, a float32 weight too), one group
    and 8, both gates, against the reference; dw bitwise reproducible."""
    x, z, dy = (randn((4096, 5120), torch.bfloat16, "cuda") for _ in range(3))
    for wd in (torch.bfloat16, torch.float32):
        w = randn((5120,), wd, "cuda") + 1
        for gs in (None, 640):
            for nbg in GATES:
                run_and_check(x, w, z, None, 1e-5, gs, nbg, dy=dy)
        _, rstd = ops.gated_rms_norm(x, w, None, z, 1e-5, 640, False)
        first = ops.gated_rms_norm_backward(dy, x, w, None, z, rstd, 640, False)
        again = ops.gated_rms_norm_backward(dy, x, w, None, z, rstd, 640, False)
        assert all(torch.equal(a, f) for a, f in zip(again, first))


@requires_cuda
def test_cuda_graph_capture():
    """Forward and backward (dw's and db's sums and workspace included) captured in a CUDA
    graph and replayed on new inputs give the eager results."""
    x = torch.randn(256, 5120, dtype=torch.bfloat16, device="cuda")
    z = torch.randn_like(x)
    w = torch.randn(5120, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    b = torch.randn(5120, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        xl, zl = x.detach().requires_grad_(), z.detach().requires_grad_()
        y = bt.gated_rms_norm(xl, w, zl, 1e-5, 640, False, bias=b)
        return (y, *torch.autograd.grad(y, (xl, zl, w, b), dy))

    def refresh():
        for t in (x, z, dy):
            t.copy_(torch.randn_like(t))

    check_graph_replay(step, refresh)


@requires_cuda
def test_cuda_mixed_devices():
    x, w = torch.randn(3, 8, device="cuda"), torch.randn(8)
    with pytest.raises(RuntimeError, match=r"baracuda::gated_rms_norm: expected all tensors on one device"):
        ops.gated_rms_norm(x, w)
    with pytest.raises(RuntimeError, match=r"baracuda::gated_rms_norm: expected all tensors on one device"):
        ops.gated_rms_norm(x, w.cuda(), None, x.cpu())
    rstd = ops.gated_rms_norm(x, w.cuda())[1]
    with pytest.raises(RuntimeError,
                       match=r"baracuda::gated_rms_norm_backward: expected all tensors on one device"):
        ops.gated_rms_norm_backward(x, x, w.cuda(), None, None, rstd.cpu())
