"""RMSNorm (rms_norm, add_rms_norm, rms_norm_backward) beyond the table of tests/op_db.py:
each convention against the module it mirrors (transformers' LlamaRMSNorm, Qwen3RMSNorm,
GemmaRMSNorm, torch.nn.RMSNorm; bit for bit where the sum of squares is exact),
forward and gradients against reference.py in every dtype and layout, the residual
variant, NaN-poisoned outputs, NaN/Inf rows, a bitwise reproducible dw, explain,
torch.func, the nn module and, on CUDA, CPU agreement, every variant, graph capture and
wide rows."""
import pytest
import torch
from torch.func import grad, jacfwd, vjp, vmap

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, assert_close_to_reference, check_compiled, layouts_2d,
                     poison_fresh_outputs, randn, requires_cuda)

ops = torch.ops.baracuda
CONVENTIONS = ["torch", "llama", "gemma"]
HALF = (torch.float16, torch.bfloat16)

transformers = pytest.importorskip("transformers")
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402


def run_and_check(x, weight, eps, convention, residual=None, dy=None, dh=None):
    """Our forward and every gradient (x, residual, weight) on these tensors (any layout)
    against reference.py in float64 and in the tensors' own dtypes (the 2x rule)."""
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, residual, weight)]

    def ours(x, r, w):
        if r is None:
            return (bt.rms_norm(x, x.shape[-1], w, eps, convention=convention),)
        return bt.rms_norm(x, x.shape[-1], w, eps, convention=convention, residual=r)

    def theirs(x, r, w):
        if r is None:
            return (ref.rms_norm(x, w, eps, convention)[0],)
        y, h, _ = ref.add_rms_norm(x, r, w, eps, convention)
        return y, h

    def grads(fn, ts, cast, seeds):
        ts = [t.detach().to(cast if cast else t.dtype).requires_grad_() if t is not None else None for t in ts]
        outs = fn(*ts)
        g = [t.to(cast) if cast else t.to(o.dtype) for t, o in zip(seeds, outs)]
        return outs, torch.autograd.grad(outs, [t for t in ts if t is not None], g)

    with torch.no_grad():
        first = ours(*leaves)
    seeds = [dy if dy is not None else randn(first[0].shape, first[0].dtype, x.device)]
    if len(first) > 1:
        seeds.append(dh if dh is not None else randn(first[1].shape, first[1].dtype, x.device))
    outs, gs = grads(ours, leaves, None, seeds)
    outs64, gs64 = grads(theirs, leaves, torch.float64, seeds)
    base, gbase = grads(theirs, leaves, None, seeds)
    what = f"{convention} {x.dtype} {tuple(x.shape)} weight={None if weight is None else weight.dtype}"
    for name, a, e, b in zip(("y", "h"), outs, outs64, base):
        assert a.dtype == b.dtype and a.is_contiguous(), what
        assert_close_to_reference(a, e, b, f"{name} of {what}")
    names = ["dx"] + (["dresidual"] if residual is not None else []) + (["dw"] if weight is not None else [])
    for name, a, e, b in zip(names, gs, gs64, gbase):
        assert a.dtype == b.dtype, (name, what)
        assert_close_to_reference(a, e, b, f"{name} of {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_matches_reference(device, dtype, convention):
    """Odd and vector-friendly widths, 1-d to 4-d, a weight in x's dtype and in float32,
    without a weight, with a residual."""
    w_dtypes = [dtype] + ([torch.float32] if dtype in HALF else [])
    for shape in [(7, 33), (4, 64), (2, 3, 5, 96), (128,), (3, 1000)]:
        x = randn(shape, dtype, device, 2.0)
        for wd in w_dtypes:
            w = randn(shape[-1:], wd, device) + 1.0
            run_and_check(x, w, 1e-5, convention)
            run_and_check(x, w, 1e-6, convention, residual=randn(shape, dtype, device))
        run_and_check(x, None, None, convention)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    """x, residual and dy in every layout of layouts_2d; weights sliced and expanded."""
    rows, cols = 12, 48
    xs = layouts_2d(device, dtype, rows, cols, 2.0)
    w_sliced = randn((2 * cols,), dtype, device)[::2]
    w_expanded = randn((1,), dtype, device).expand(cols)
    for name, x in xs.items():
        for conv, w in (("llama", w_sliced), ("gemma", w_expanded), ("torch", None)):
            run_and_check(x, w, 1e-6, conv)
            run_and_check(x, w, 1e-6, conv, residual=xs["transposed"], dy=xs["every_other_row"],
                          dh=xs["broadcast_cols"])


# ---- the modules each convention mirrors ---------------------------------------------------


def dyadic(shape, dtype, device):
    """Multiples of 1/8 in [-2, 2]: their squares and every partial sum are exact in
    float32, so the mean square does not depend on the order of the sum."""
    return (torch.randint(-16, 17, shape, dtype=torch.float64) / 8).to(device=device, dtype=dtype)


def modules(hidden, dtype, device):
    torch.manual_seed(0)
    w = torch.randn(hidden, dtype=torch.float64)
    out = {"llama": LlamaRMSNorm(hidden, eps=1e-6), "qwen3": Qwen3RMSNorm(hidden, eps=1e-5),
           "gemma": GemmaRMSNorm(hidden, eps=1e-6), "torch": torch.nn.RMSNorm(hidden, eps=1e-6),
           "torch_eps_none": torch.nn.RMSNorm(hidden)}
    for m in out.values():
        m.to(device=device, dtype=dtype)
        m.weight.data.copy_(w)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bitwise_equal_to_the_modules_it_mirrors(device, dtype):
    """Where the sum of squares is exact (dyadic values, a power-of-two width), the result
    is the module's to the bit: the casts, rsqrt and products happen in the same order."""
    x = dyadic((64, 256), dtype, device)
    for name, m in modules(256, dtype, device).items():
        ours = bt.rms_norm_like(m, x)
        theirs = m(x)
        assert ours.dtype == theirs.dtype, name
        assert torch.equal(ours, theirs), f"{name}: {(ours.double() - theirs.double()).abs().max()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_close_to_the_modules_and_their_gradients(device, dtype):
    """On random rows (the sum order differs) within the 2x rule of the module's own error
    against float64, and the weight's and input's gradients likewise."""
    x = randn((8, 5, 320), dtype, device, 3.0)
    dy = randn((8, 5, 320), dtype, device)
    for name, m in modules(320, dtype, device).items():
        m64 = modules(320, torch.float64, device)[name]
        xl, x64 = x.detach().requires_grad_(), x.detach().double().requires_grad_()
        xm = x.detach().requires_grad_()
        y, y64, ym = bt.rms_norm_like(m, xl), m64(x64), m(xm)
        what = f"{name} {dtype}"
        assert_close_to_reference(y, y64, ym, "y of " + what)
        g = torch.autograd.grad(y, (xl, m.weight), dy.to(y.dtype))
        g64 = torch.autograd.grad(y64, (x64, m64.weight), dy.double())
        gm = torch.autograd.grad(ym, (xm, m.weight), dy.to(ym.dtype))
        assert_close_to_reference(g[0], g64[0], gm[0], "dx of " + what)
        assert_close_to_reference(g[1], g64[1], gm[1], "dw of " + what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, rtol", [(torch.bfloat16, 2e-4), (torch.float16, 1e-4)])
def test_llama_weight_gradient_of_the_rounded_value(device, dtype, rtol):
    """LlamaRMSNorm multiplies its (float32) weight by the normalized value rounded to x's
    dtype, so its weight gradient is Σ dy·round(n): ours agrees with the module's own
    autograd (within 1e-6 to 7e-5 here, by the sum orders) far closer than Σ dy·n is to
    it (1.7e-3 and 2.4e-4)."""
    torch.manual_seed(0)
    m = LlamaRMSNorm(512, eps=1e-6).to(device)
    m.weight.data.normal_()
    x, dy = torch.randn(300, 512, device=device).to(dtype), torch.randn(300, 512, device=device)
    (theirs,) = torch.autograd.grad(m(x), m.weight, dy)
    for layout in (x, x.t().contiguous().t()):  # the rows and the strided kernels
        (ours,) = torch.autograd.grad(bt.rms_norm_like(m, layout), m.weight, dy)
        assert ((ours - theirs).abs().max() / theirs.abs().max()).item() < rtol


def test_rms_norm_convention_recognizes_only_what_it_reproduces():
    assert bt.rms_norm_convention(LlamaRMSNorm(8, eps=1e-5)) == ("llama", 1e-5, (8,))
    assert bt.rms_norm_convention(Qwen3RMSNorm(8)) == ("llama", 1e-6, (8,))
    assert bt.rms_norm_convention(GemmaRMSNorm(8, eps=1e-5)) == ("gemma", 1e-5, (8,))
    assert bt.rms_norm_convention(torch.nn.RMSNorm([2, 4])) == ("torch", None, (2, 4))
    assert bt.rms_norm_convention(bt.nn.RMSNorm(8, 1e-3, convention="gemma")) == ("gemma", 1e-3, (8,))
    from transformers.models.t5.modeling_t5 import T5LayerNorm  # casts to a half weight's dtype first

    with pytest.raises(ValueError, match="T5LayerNorm is not an RMSNorm whose computation baracuda reproduces"):
        bt.rms_norm_convention(T5LayerNorm(8))
    with pytest.raises(ValueError, match="LayerNorm is not an RMSNorm"):
        bt.rms_norm_convention(torch.nn.LayerNorm(8))


@pytest.mark.parametrize("device", DEVICES)
def test_residual_is_the_decoder_layers_add(device):
    """rms_norm_like(m, x, residual=r) is (m(x + r), x + r), and the gradients of x and r
    are the same tensor: dx + dh."""
    m = modules(64, torch.bfloat16, device)["llama"]
    x, r = dyadic((6, 64), torch.bfloat16, device), dyadic((6, 64), torch.bfloat16, device)
    y, h = bt.rms_norm_like(m, x, residual=r)
    assert torch.equal(h, x + r) and torch.equal(y, m(x + r))
    xl, rl = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    y, h = bt.rms_norm(xl, 64, m.weight.detach().double(), 1e-6, convention="llama", residual=rl)
    dx, dr = torch.autograd.grad((y * y).sum() + (h * 3).sum(), (xl, rl))
    torch.testing.assert_close(dx, dr, rtol=0, atol=0)
    hl = (x.double() + r.double()).requires_grad_()
    y_ref, _ = ref.rms_norm(hl, m.weight.detach().double(), 1e-6, "llama")
    (expected,) = torch.autograd.grad((y_ref * y_ref).sum() + (hl * 3).sum(), hl)
    torch.testing.assert_close(dx, expected)


# ---- dx written over an incoming dy that no one else holds (OpDef::reuse_grad) ------------


def _norm_step(device, dtype, residual=False, hold=False, retain=False, hooks=False, keep=None,
               weight_dtype=None):
    """A decoder block's norm between two Linear layers (dy comes from the second one's
    backward, a gradient no one else holds): the gradients of the input, the residual, the
    norm's weight and the first layer's weight, and whether dx came in dy's memory. hold: the
    caller passes dy to the norm's output itself (and keeps it: it must be unchanged);
    retain: the graph is kept for a second backward; hooks: saved-tensor hooks; keep: the
    norm output's gradient kept by a hook ("hook": that tensor itself; it must still be dy
    after the backward) or as its .grad ("retain_grad", which torch stores as a copy)."""
    torch.manual_seed(0)
    lin1 = torch.nn.Linear(16, 32, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(32, device=device)).to(weight_dtype or dtype).requires_grad_()
    x = torch.randn(6, 16, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(6, 32, device=device, dtype=dtype, requires_grad=True)
    h = lin1(x)
    seen = {}
    h.register_hook(lambda g: seen.__setitem__("dx", g.data_ptr()))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooks else torch.enable_grad():
        if residual:
            y, hh = bt.rms_norm(h, 32, w, 1e-6, convention="llama", residual=r)
        else:
            y = bt.rms_norm(h, 32, w, 1e-6, convention="llama")
    y.register_hook(lambda g: seen.__setitem__("dy", g.data_ptr()))
    lin2 = torch.nn.Linear(32, 24, device=device, dtype=y.dtype)  # (y: float32 for a float32 llama weight)
    dout = torch.randn(6, 24, device=device, dtype=y.dtype)
    kept_dy = []
    if keep == "hook":
        y.register_hook(kept_dy.append)
    elif keep == "retain_grad":
        y.retain_grad()
    leaves = (x, r, w, lin1.weight) if residual else (x, w, lin1.weight)
    if hold:
        dy = torch.randn_like(y)
        kept = dy.clone()
        outs, seeds = ((y, hh), (dy, torch.ones_like(hh))) if residual else ((y,), (dy,))
    else:
        outs = (lin2(y), hh) if residual else (lin2(y),)
        seeds = (dout, torch.ones_like(hh)) if residual else (dout,)
    del h
    grads = torch.autograd.grad(outs, leaves, seeds, retain_graph=retain)
    reused = seen["dx"] == seen["dy"]
    if retain:  # the graph's last backward (it may reuse dy now): the same gradients
        again = torch.autograd.grad(outs, leaves, seeds)
        assert all(torch.equal(a, b) for a, b in zip(grads, again))
    if hold:
        assert torch.equal(dy, kept)
    if keep is not None:
        grads = grads + ((kept_dy[0] if keep == "hook" else y.grad).clone(),)
    return grads, reused


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("residual", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_backward_writes_dx_over_dy_only_when_no_one_else_sees_it(device, dtype, residual):
    """Between two layers, dy (the next layer's input gradient) is the norm backward's alone:
    dx is written over it, as Liger's RMSNorm backward does, and the gradients are the same
    bits as with a fresh dx. Where anything else could read dy (the caller passed it, the
    graph is kept, saved-tensor hooks, the output's .grad) a fresh dx is made."""
    plain, reused = _norm_step(device, dtype, residual)
    assert reused
    for kw in ({"retain": True}, {"hooks": True}, {"keep": "hook"}):
        grads, reused = _norm_step(device, dtype, residual, **kw)
        assert not reused, kw
        assert all(torch.equal(a, b) for a, b in zip(grads, plain)), kw
    _, reused = _norm_step(device, dtype, residual, hold=True)
    assert not reused
    # .grad is a copy of dy (torch's retain_grad): dx may go over dy, and .grad is still dy
    grads, reused = _norm_step(device, dtype, residual, keep="retain_grad")
    kept, _ = _norm_step(device, dtype, residual, keep="hook")
    assert reused and all(torch.equal(a, b) for a, b in zip(grads, kept))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_backward_keeps_a_fresh_dx_for_a_dy_of_another_dtype(device):
    """A float32 weight under the llama convention makes a bfloat16 x's output (and dy)
    float32: dx (bfloat16) cannot go over it, and the gradients are the reference's."""
    grads, reused = _norm_step(device, torch.bfloat16, weight_dtype=torch.float32)
    assert not reused
    again, _ = _norm_step(device, torch.bfloat16, weight_dtype=torch.float32, retain=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, again))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_in_place_backward_op(device, dtype):
    """rms_norm_backward_ writes dx over dy: the same bits as rms_norm_backward."""
    torch.manual_seed(3)
    x, dy, dh = (randn((3, 5, 40), dtype, device) for _ in range(3))
    w = randn((40,), dtype, device)
    rstd = torch.rsqrt(x.to(torch.float64 if dtype == torch.float64 else torch.float32).pow(2).mean(-1) + 1e-6)
    for conv, d in (("torch", None), ("llama", dh), ("gemma", None)):
        dx, dw = ops.rms_norm_backward(dy, x, w, rstd, conv, d)
        g = dy.clone()
        dw2 = ops.rms_norm_backward_(g, x, w, rstd, conv, d)
        assert torch.equal(g, dx) and torch.equal(dw2, dw), conv


# ---- every element written, NaN/Inf, determinism ------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_output_element_written(device, dtype):
    """NaN-filled fresh outputs (y, h, rstd, dx, dw): none survives, for widths that take
    each variant (a fraction of a warp, a warp, a block, a row wider than the registers
    hold, an unaligned row) and row counts that leave a block partly empty."""
    for rows, cols, sl in [(37, 8, None), (5, 256, None), (9, 4096, None), (3, 40000, None), (7, 66, (1, 65))]:
        x = randn((rows, cols), dtype, device)
        if sl:
            x = x[:, sl[0]:sl[1]]
        w, r = randn(x.shape[-1:], dtype, device), randn(x.shape, dtype, device)
        poison_fresh_outputs()
        xl, rl, wl = (t.detach().requires_grad_() for t in (x, r, w))
        y, h = bt.rms_norm(xl, x.shape[-1], wl, 1e-6, residual=rl)
        _, rstd = ops.rms_norm(x, w, 1e-6, "llama")
        g = torch.autograd.grad((y, h), (xl, rl, wl), (torch.ones_like(y), torch.ones_like(h)))
        for name, t in zip(("y", "h", "rstd", "dx", "dresidual", "dw"), (y, h, rstd, *g)):
            assert not t.isnan().any(), f"{name} [{rows}, {cols}] {dtype} {device}"
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_rows(device):
    """A NaN or Inf in a row makes that row's output and rstd NaN (or 0 for a lone +-inf
    scaled by rsqrt(inf) = 0, as the reference), and leaves the other rows alone."""
    x = randn((4, 16), torch.float32, device)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    w = randn((16,), torch.float32, device)
    for conv in CONVENTIONS:
        y, rstd = ops.rms_norm(x, w, 1e-6, conv)
        y64, rstd64 = ref.rms_norm(x.double(), w.double(), 1e-6, conv)
        assert_close_to_reference(y, y64, ref.rms_norm(x, w, 1e-6, conv)[0], conv)
        assert torch.equal(rstd.isnan(), rstd64.isnan())
        assert torch.isfinite(y[[0, 3]]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dw_is_bitwise_reproducible(device, dtype):
    """The weight's gradient sums rows per fixed block, then blocks in order: the same bits
    on every run (and, on the CPU, whatever the thread count)."""
    x = randn((3000, 96), dtype, device)
    dy = randn((3000, 96), dtype, device)
    w = randn((96,), dtype, device)
    _, rstd = ops.rms_norm(x, w, 1e-6, "torch")
    first = ops.rms_norm_backward(dy, x, w, rstd, "torch")
    for _ in range(3):
        again = ops.rms_norm_backward(dy, x, w, rstd, "torch")
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    if device == "cpu":
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = ops.rms_norm_backward(dy, x, w, rstd, "torch")
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one[1], first[1])
    info = bt.explain("rms_norm_backward", dy, x, w, rstd)
    assert info.deterministic and info.bit_stable


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """No rows: empty outputs and a zero dw; no columns: empty y, NaN rstd (0/0, as the
    reference), empty dx and dw."""
    x, w = torch.randn(0, 8, device=device), torch.randn(8, device=device)
    y, rstd = ops.rms_norm(x, w)
    assert y.shape == (0, 8) and rstd.shape == (0,)
    dx, dw = ops.rms_norm_backward(torch.randn(0, 8, device=device), x, w, rstd)
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8, device=device))
    x0 = torch.randn(3, 0, device=device)
    y, rstd = ops.rms_norm(x0, torch.randn(0, device=device), 1e-6)
    assert y.shape == (3, 0) and rstd.isnan().all()
    dx, dw = ops.rms_norm_backward(torch.randn(3, 0, device=device), x0, torch.randn(0, device=device), rstd)
    assert dx.shape == (3, 0) and dw.shape == (0,)


# ---- explain, autograd limits, torch.func ---------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    x = torch.randn(16, 4096, dtype=torch.bfloat16, device=device)
    w = torch.randn(4096, dtype=torch.bfloat16, device=device)
    info = bt.explain("rms_norm", x, w, 1e-6, "llama")
    assert info.family == "rms_norm" and info.op == "llama" and info.dtype == "bfloat16"
    assert info.math_precision == "float32" and info.accumulator == "float32"
    assert info.deterministic and info.workspace_bytes == 0
    assert bt.explain("add_rms_norm", x, x, w).op == "add_torch"
    assert bt.explain("rms_norm", x, w, convention="gemma").op == "gemma"
    rstd = ops.rms_norm(x, w)[1]
    b = bt.explain("rms_norm_backward", x, x, w, rstd, "gemma")
    assert b.op == "gemma_backward" and b.workspace_bytes % (4 * 4096) == 0 and b.workspace_bytes > 0
    assert bt.explain("rms_norm_backward", x, x, None, rstd).workspace_bytes == 0
    assert bt.explain("rms_norm", x.double(), w.double()).math_precision == "float64"
    # The variants: unit inner stride or not.
    expect_rows = "rows_simd" if device == "cpu" else "block_vec16"
    assert bt.explain("rms_norm", x, w).variant == expect_rows
    assert bt.explain("rms_norm", x.t().contiguous().t(), w).variant == "strided"
    if device == "cpu":
        assert bt.explain("rms_norm", x.double(), w.double()).variant == "rows"


@pytest.mark.parametrize("device", DEVICES)
def test_second_derivative_raises(device):
    x = torch.randn(3, 8, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, device=device, requires_grad=True)
    (g,) = torch.autograd.grad(bt.rms_norm(x, 8, w).pow(2).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"baracuda::rms_norm: double backward"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_func(device):
    """grad, vjp and vmap (forward, per-sample gradients with per-sample weights, the
    backward op batched) against torch.autograd of the same ops and the reference;
    forward-mode AD raises naming the op."""
    x = torch.randn(3, 4, 10, dtype=torch.float64, device=device)
    r = torch.randn(3, 4, 10, dtype=torch.float64, device=device)
    w = torch.randn(3, 10, dtype=torch.float64, device=device)

    def loss(x, w, r):
        y, h = bt.rms_norm(x, 10, w, 1e-5, convention="gemma", residual=r)
        return y.sin().sum() + (h * h).sum()

    def loss_ref(x, w, r):
        y, h, _ = ref.add_rms_norm(x, r, w, 1e-5, "gemma")
        return y.sin().sum() + (h * h).sum()

    got = vmap(grad(loss, argnums=(0, 1, 2)))(x, w, r)
    for k in range(3):
        leaves = [t[k].detach().requires_grad_() for t in (x, w, r)]
        expected = torch.autograd.grad(loss_ref(*leaves), leaves)
        for a, e in zip(got, expected):
            torch.testing.assert_close(a[k], e)
    y, pullback = vjp(lambda t: bt.rms_norm(t, 10, w[0]), x)
    torch.testing.assert_close(y, ref.rms_norm(x, w[0])[0])
    v = torch.randn_like(y)
    (dx,) = pullback(v)
    xl = x.detach().requires_grad_()
    torch.testing.assert_close(dx, torch.autograd.grad(bt.rms_norm(xl, 10, w[0]), xl, v)[0])
    ys = vmap(lambda t: bt.rms_norm(t, 10, w[0], convention="llama"))(x)
    torch.testing.assert_close(ys, ref.rms_norm(x, w[0], None, "llama")[0])
    with pytest.raises(NotImplementedError, match=r"baracuda::rms_norm: forward-mode AD"):
        jacfwd(lambda t: bt.rms_norm(t, 10, w[0]))(x[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_inductor(device, dynamic):
    """torch.compile's default backend (Inductor) around the ops, with pointwise work
    before and after, two row counts: eager's outputs and gradients."""
    def layer(x, r, w):
        y, h = bt.rms_norm(x * 2, x.shape[-1], w, 1e-6, convention="llama", residual=r)
        return torch.cat((y.sin().flatten(), (h + bt.rms_norm(h, h.shape[-1], None)).flatten()))

    inputs = [(torch.randn(n, 64, device=device, requires_grad=True),
               torch.randn(n, 64, device=device, requires_grad=True),
               torch.randn(64, device=device, requires_grad=True)) for n in (5, 9)]
    check_compiled(layer, inputs, dynamic)


# ---- the module and the functional wrapper ---------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_nn_rmsnorm_is_a_drop_in_for_torch(device):
    for args, kwargs in [((12,), {}), ((12,), {"eps": 1e-5}), (([3, 4],), {"eps": 1e-6}),
                         ((12,), {"elementwise_affine": False})]:
        theirs = torch.nn.RMSNorm(*args, **kwargs, device=device)
        ours = bt.nn.RMSNorm(*args, **kwargs, device=device)
        assert repr(ours).replace("RMSNorm", "") == repr(theirs).replace("RMSNorm", "")
        if theirs.weight is not None:
            theirs.weight.data.normal_()
        ours.load_state_dict(theirs.state_dict())
        assert set(ours.state_dict()) == set(theirs.state_dict())
        x = torch.randn(5, 2, 12, device=device).view(5, 2, *theirs.normalized_shape)
        torch.testing.assert_close(ours(x), theirs(x))
        y, h = ours(x, x)
        torch.testing.assert_close(h, 2 * x)
        torch.testing.assert_close(y, theirs(2 * x))
    with pytest.raises(ValueError, match="convention must be"):
        bt.nn.RMSNorm(8, convention="t5")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_functional_mirrors_torch_rms_norm(device, dtype):
    """torch.nn.functional.rms_norm's arguments and results (eps None included), any
    number of normalized dims."""
    x = randn((4, 3, 5, 6), dtype, device, 2.0)
    for shape in [(6,), (5, 6), (3, 5, 6)]:
        w = randn(shape, dtype, device)
        for weight, eps in [(w, 1e-5), (None, None), (w, None)]:
            ours = bt.rms_norm(x, shape, weight, eps)
            theirs = torch.nn.functional.rms_norm(x, shape, weight, eps)
            y64 = torch.nn.functional.rms_norm(x.double(), shape, None if weight is None else weight.double(),
                                               eps if eps is not None else torch.finfo(
                                                   torch.float64 if dtype == torch.float64 else torch.float32).eps)
            assert ours.dtype == theirs.dtype
            assert_close_to_reference(ours, y64, theirs, f"{shape} {eps} {dtype}")
    with pytest.raises(ValueError, match="weight must have shape normalized_shape"):
        bt.rms_norm(x, (5, 6), randn((30,), dtype, device))


# ---- CUDA ----------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_matches_cpu(dtype):
    """Both backends on the same inputs, every convention, with a residual: within the
    2x rule of each other's reference error (the sum orders differ)."""
    for cols in (8, 100, 1024, 4096, 5000):
        x, r = randn((33, cols), dtype, "cpu", 2.0), randn((33, cols), dtype, "cpu")
        w = randn((cols,), dtype, "cpu")
        for conv in CONVENTIONS:
            cpu = bt.rms_norm(x, cols, w, 1e-6, convention=conv, residual=r)
            cuda = bt.rms_norm(x.cuda(), cols, w.cuda(), 1e-6, convention=conv, residual=r.cuda())
            y64, h64, _ = ref.add_rms_norm(x.double(), r.double(), w.double(), 1e-6, conv)
            torch.testing.assert_close(cuda[1].cpu(), cpu[1], rtol=0, atol=0)  # h: one rounding
            assert_close_to_reference(cuda[0], y64, cpu[0], f"cuda vs cpu {conv} {cols} {dtype}")


@requires_cuda
def test_cuda_variants_chosen():
    bf = torch.bfloat16

    def variant(cols, op="rms_norm", **kw):
        x = torch.randn(64, cols, dtype=bf, device="cuda")
        w = torch.randn(cols, dtype=bf, device="cuda")
        if op == "rms_norm":
            return bt.explain(op, x, w, **kw).variant
        rstd = ops.rms_norm(x, w)[1]
        return bt.explain(op, x, x, w, rstd, **kw).variant

    assert variant(64) == "warp_vec16" and variant(256) == "warp_vec16"
    assert variant(4096) == "block_vec16" and variant(8192) == "block_vec16"
    assert variant(32768) == "block_vec16" and variant(65536) == "strided"
    # The plain backward stages dy and x where its rings fit (sm_80+): a 512-thread block
    # of 4 rows of 4096 holds its dw partial row and 2 rows of each (16 KB + 128 KB).
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    staged = lambda smem: "_staged" if torch.cuda.get_device_capability() >= (8, 0) and smem <= optin else ""
    assert variant(4096, "rms_norm_backward") == "block_vec16" + staged(4096 * 4 + 4 * 2 * 4096 * 4)
    assert variant(16384, "rms_norm_backward") == "block_vec16" + staged(2 * 16384 * 4)
    assert variant(256, "rms_norm_backward") == "warp_vec16" + staged(256 * 4 + 16 * 2 * 256 * 4)
    assert variant(32768, "rms_norm_backward") == "strided"
    assert variant(100) == "strided"  # 100 bf16 = 200 bytes: not whole 16-byte vectors
    x = torch.randn(64, 4104, dtype=bf, device="cuda")[:, 8:]  # 16-byte aligned row slice
    assert bt.explain("rms_norm", x, None).variant == "block_vec16"
    assert bt.explain("rms_norm", x[:, 1:4089], None).variant == "strided"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_backward_staged_and_unstaged_agree(dtype):
    """The plain backward with dy and x staged through shared memory (the plan's choice
    where the rings fit) and unstaged (what devices with less shared memory run) do the
    same operations in the same order: the same bits, for every convention, with and
    without a weight and dh, a float32 dy beside 16-bit x, and more rows than the resident
    grid takes at once."""
    torch.manual_seed(5)
    half = dtype in (torch.float16, torch.bfloat16)
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    for rows, cols in ((3001, 4096), (77, 256), (9, 40)):
        x, dh = randn((rows, cols), dtype, "cuda"), randn((rows, cols), dtype, "cuda")
        for conv in CONVENTIONS:
            for w_dtype in ((dtype, None, torch.float32) if half and conv == "llama" else (dtype, None)):
                w = None if w_dtype is None else randn((cols,), w_dtype, "cuda")
                y, rstd = ops.rms_norm(x, w, 1e-6, conv)
                dy = randn(tuple(y.shape), y.dtype, "cuda")
                results = []
                for allow in (True, False):
                    previous = bt._C._rms_norm_allow_stage(allow)
                    try:
                        staged = bt.explain("rms_norm_backward", dy, x, w, rstd, conv, dh).variant.endswith("_staged")
                        # (every case here fits a Hopper block's 227 KB)
                        assert staged == allow or (allow and optin < 227 * 1024), (allow, staged)
                        results.append(ops.rms_norm_backward(dy, x, w, rstd, conv, dh))
                    finally:
                        bt._C._rms_norm_allow_stage(previous)
                for a, b in zip(*results):
                    assert torch.equal(a, b), (rows, cols, conv, w_dtype, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_wide_rows(dtype):
    """Rows of 65536 and 100003 elements (the strided variant) and 32768 (the widest the
    registers hold), forward and backward, against the reference."""
    for cols in (32768, 65536, 100003):
        run_and_check(randn((6, cols), dtype, "cuda"), randn((cols,), dtype, "cuda"), 1e-6, "llama",
                      residual=randn((6, cols), dtype, "cuda"))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_many_rows(dtype):
    """Thousands of row groups (more than a resident grid holds): 40000 rows of 256 (8 rows a
    forward block) and 3001 of 4096, with and without a residual, against the reference."""
    for rows, cols in ((40000, 256), (3001, 4096)):
        x, w = randn((rows, cols), dtype, "cuda"), randn((cols,), dtype, "cuda")
        run_and_check(x, w, 1e-6, "llama")
        run_and_check(x, w, 1e-6, "llama", residual=randn((rows, cols), dtype, "cuda"))


@requires_cuda
def test_cuda_graph_capture():
    """Forward and backward (dw's two kernels and workspace included) captured in a CUDA
    graph and replayed on new inputs give the eager results."""
    x = torch.randn(256, 4096, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        xl, rl = x.detach().requires_grad_(), r.detach().requires_grad_()
        y, h = bt.rms_norm(xl, 4096, w, 1e-6, convention="llama", residual=rl)
        return (y, h, *torch.autograd.grad((y, h), (xl, rl, w), (dy, dy)))

    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
        g.replay()
        torch.cuda.synchronize()
        for a, e in zip(outs, step()):
            assert torch.equal(a, e)


@requires_cuda
def test_cuda_mixed_devices():
    x, w = torch.randn(3, 8, device="cuda"), torch.randn(8)
    with pytest.raises(RuntimeError, match=r"baracuda::rms_norm: expected all tensors on one device"):
        ops.rms_norm(x, w)
    with pytest.raises(RuntimeError, match=r"baracuda::add_rms_norm: expected all tensors on one device"):
        ops.add_rms_norm(x, x.cpu(), None)
    rstd = ops.rms_norm(x, None)[1]
    with pytest.raises(RuntimeError, match=r"baracuda::rms_norm_backward: expected all tensors on one device"):
        ops.rms_norm_backward(x, x, None, rstd.cpu())
