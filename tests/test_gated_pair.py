"""gated_activation_pair: act(gate) * up with gate and up separate tensors. Forward and
gradients against reference.py (float64) for every kind, dtype and layout (strided,
transposed, stride-0 broadcast); gradcheck; poisoned outputs; NaN/Inf; empty and 0-dim
tensors; nn.GatedMLP against Hugging Face's MLP. (Opcheck, torch.compile and the
bad-input table: tests/op_db.py, run by tests/test_ops.py.)"""
import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, HAS_CUDA, assert_close_to_reference, layouts_2d,
                     poison_fresh_outputs, randn, requires_cuda)

ops = torch.ops.baracuda
KINDS = ["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]
SHAPES = [(8, 64), (3, 5, 14), (7,), (33, 528), (2, 3, 4, 10), (1, 1), ()]


def run_and_check(gate, up, kind, dy=None):
    """Our forward and backward against reference.py in float64 and in the inputs' dtype."""
    gate = gate.detach().requires_grad_()
    up = up.detach().requires_grad_()
    y = bt.gated_activation_pair(gate, up, kind)
    if dy is None:
        dy = randn(y.shape, gate.dtype, gate.device)
    dg, du = torch.autograd.grad(y, (gate, up), dy)

    g64 = gate.detach().double().requires_grad_()
    u64 = up.detach().double().requires_grad_()
    y64 = ref.gated_activation_pair(g64, u64, kind)
    dg64, du64 = torch.autograd.grad(y64, (g64, u64), dy.double())

    gl = gate.detach().clone().requires_grad_()
    ul = up.detach().clone().requires_grad_()
    yl = ref.gated_activation_pair(gl, ul, kind)
    dgl, dul = torch.autograd.grad(yl, (gl, ul), dy)

    what = f"{kind} {gate.dtype} {tuple(gate.shape)} strides {gate.stride()}/{up.stride()}"
    assert y.dtype == gate.dtype and y.device == gate.device and y.is_contiguous()
    assert dg.is_contiguous() and du.is_contiguous()
    assert_close_to_reference(y, y64, yl, "y of " + what)
    assert_close_to_reference(dg, dg64, dgl, "dgate of " + what)
    assert_close_to_reference(du, du64, dul, "dup of " + what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference(device, dtype, kind):
    for shape in SHAPES:
        run_and_check(randn(shape, dtype, device, 3.0), randn(shape, dtype, device, 2.0), kind)


def layouts(device, dtype, rows=12, cols=40):
    """Tensors of logical shape [rows, cols] in several memory layouts."""
    return {**layouts_2d(device, dtype, rows, cols, 3.0),
            "scalar_broadcast": randn((), dtype, device, 3.0).expand(rows, cols)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    gates = layouts(device, dtype)
    ups = layouts(device, dtype)
    names = list(gates)
    for i, name in enumerate(names):
        # every layout as gate against a different layout as up, and against itself
        other = names[(i + 3) % len(names)]
        for kind in ("swiglu", "geglu"):
            run_and_check(gates[name], ups[other], kind)
            run_and_check(gates[other], ups[name], kind)
        run_and_check(gates[name], ups[name], "geglu_tanh")
    g, u = gates["contiguous"], ups["transposed"]
    run_and_check(g, u, "swiglu", dy=randn((40, 12), dtype, device).t())
    run_and_check(g, u, "reglu", dy=randn((1, 40), dtype, device).expand(12, 40))
    # gate and up as two column halves of one projection (a fused gate_up output)
    h = randn((12, 80), dtype, device, 3.0)
    run_and_check(h[:, :40], h[:, 40:], "swiglu")
    # the same storage as gate and up
    run_and_check(h, h, "glu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_float64(device, kind):
    g = randn((3, 8), torch.float64, device, 2.0).requires_grad_()
    u = randn((3, 8), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: bt.gated_activation_pair(a, b, kind), (g, u))
    gt = randn((8, 5), torch.float64, device, 2.0).t().requires_grad_()
    ub = randn((1, 8), torch.float64, device).requires_grad_()  # the op sees stride 0
    assert torch.autograd.gradcheck(lambda a, b: bt.gated_activation_pair(a, b.expand(5, 8), kind), (gt, ub))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises_clearly(device):
    g = randn((4, 8), torch.float64, device).requires_grad_()
    u = randn((4, 8), torch.float64, device).requires_grad_()
    (dg,) = torch.autograd.grad(bt.gated_activation_pair(g, u).sum(), g, create_graph=True)
    with pytest.raises(NotImplementedError, match="baracuda::gated_activation_pair: double backward"):
        dg.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_one_input_only(device):
    g = randn((4, 8), torch.float32, device).requires_grad_()
    u = randn((4, 8), torch.float32, device)
    (dg,) = torch.autograd.grad(bt.gated_activation_pair(g, u, "geglu").sum(), g)
    g64 = g.detach().double().requires_grad_()
    (dg64,) = torch.autograd.grad(ref.gated_activation_pair(g64, u.double(), "geglu").sum(), g64)
    assert_close_to_reference(dg, dg64, None, "dgate")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_nan_inf_propagate_like_reference(device, kind):
    g = randn((4, 8), torch.float32, device, 3.0)
    u = randn((4, 8), torch.float32, device)
    g[0, 0] = float("nan")
    u[1, 1] = float("nan")
    g[2, 2] = float("inf")
    g[3, 3] = float("-inf")
    u[2, 4] = float("inf")
    # against the float64 reference: eager float32 GELU's vectorized and scalar paths
    # disagree at ±inf (NaN or inf, depending on the element's position)
    expected = ref.gated_activation_pair(g.double(), u.double(), kind).float()
    torch.testing.assert_close(bt.gated_activation_pair(g, u, kind), expected, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tensors(device):
    for shape in [(0, 8), (4, 0), (2, 0, 6), (0,)]:
        g = torch.empty(shape, device=device).requires_grad_()
        u = torch.empty(shape, device=device).requires_grad_()
        y = bt.gated_activation_pair(g, u)
        assert y.shape == g.shape
        dg, du = torch.autograd.grad(y, (g, u), torch.empty_like(y))
        assert dg.shape == g.shape and du.shape == u.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """With deterministic algorithms on, fresh outputs are NaN-filled: a skipped element shows."""
    poison_fresh_outputs()
    gates = layouts(device, dtype)
    for name, g in gates.items():
        for u in (randn((12, 40), dtype, device), gates["transposed"]):
            g = g.detach().requires_grad_()
            u = u.detach().requires_grad_()
            y = bt.gated_activation_pair(g, u, "geglu")
            dg, du = torch.autograd.grad(y, (g, u), torch.ones_like(y))
            assert torch.isfinite(y).all() and torch.isfinite(dg).all() and torch.isfinite(du).all(), name


@requires_cuda
def test_device_mismatch():
    g = torch.randn(3, 8, device="cuda")
    with pytest.raises(RuntimeError, match="baracuda::gated_activation_pair: expected all tensors on one device"):
        bt.gated_activation_pair(g, g.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    g = torch.randn(4, 64, device=device)
    info = bt.explain("gated_activation_pair", g, g, "swiglu")
    assert info.family == "gated_activation_pair" and info.op == "swiglu"
    assert info.variant.startswith("rows")
    assert bt.explain("gated_activation_pair", g, torch.randn(64, 4, device=device).t()).variant == "strided"
    info = bt.explain("gated_activation_pair_backward", g, g, g, "geglu")
    assert info.op == "geglu_backward" and info.deterministic
    with pytest.raises(ValueError, match="gate and up must have the same sizes"):
        bt.explain("gated_activation_pair", g, g[:, :3])


@requires_cuda
def test_cuda_variants_chosen():
    x = layouts("cuda", torch.bfloat16)
    c = x["contiguous"]
    expect = {"contiguous": "rows_vec16", "row_slice_aligned": "rows_vec16", "row_slice_offset": "rows",
              "every_other_row": "rows_vec16", "transposed": "strided", "inner_stride_2": "strided"}
    for name, variant in expect.items():
        assert bt.explain("gated_activation_pair", x[name], c).variant == variant, name
        assert bt.explain("gated_activation_pair", c, x[name]).variant == variant, name
        assert bt.explain("gated_activation_pair_backward", c, c, x[name]).variant == variant, name


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_cuda_agree(dtype):
    g = randn((64, 200), dtype, "cpu", 3.0)
    u = randn((200, 64), dtype, "cpu").t()
    dy = randn((64, 200), dtype, "cpu")
    for kind in KINDS:
        yc = bt.gated_activation_pair(g, u, kind)
        yg = bt.gated_activation_pair(g.cuda(), u.cuda(), kind)
        dc = ops.gated_activation_pair_backward(dy, g, u, kind)
        dg = ops.gated_activation_pair_backward(dy.cuda(), g.cuda(), u.cuda(), kind)
        tol = dict(atol=1e-5, rtol=1e-5) if dtype in (torch.float32, torch.float64) else {}
        torch.testing.assert_close(yg.cpu(), yc, **tol)
        for a, b in zip(dg, dc):
            torch.testing.assert_close(a.cpu(), b, **tol)


@requires_cuda
def test_cuda_graph_capture():
    g = randn((64, 256), torch.bfloat16, "cuda").requires_grad_()
    u = randn((64, 256), torch.bfloat16, "cuda").requires_grad_()
    dy = randn((64, 256), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            torch.autograd.grad(bt.gated_activation_pair(g, u), (g, u), dy)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bt.gated_activation_pair(g, u)
        dg, du = torch.autograd.grad(y, (g, u), dy)
    with torch.no_grad():
        g.copy_(randn((64, 256), torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, bt.gated_activation_pair(g.detach(), u.detach()))
    ref_dg, ref_du = ops.gated_activation_pair_backward(dy, g.detach(), u.detach(), "swiglu")
    torch.testing.assert_close(dg, ref_dg)
    torch.testing.assert_close(du, ref_du)


# ---- nn.GatedMLP -----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp(device, bias):
    mlp = bt.nn.GatedMLP(16, 24, kind="geglu_tanh", bias=bias, device=device, dtype=torch.float64)
    assert sorted(n for n, _ in mlp.named_parameters()) == sorted(
        f"{p}.{w}" for p in ("gate_proj", "up_proj", "down_proj") for w in (["weight", "bias"] if bias else ["weight"]))
    x = randn((3, 5, 16), torch.float64, device).requires_grad_()
    expected = mlp.down_proj(ref.gated_activation_pair(mlp.gate_proj(x), mlp.up_proj(x), "geglu_tanh"))
    torch.testing.assert_close(mlp(x), expected)
    mlp(x).sum().backward()
    assert mlp.gate_proj.weight.grad is not None and mlp.up_proj.weight.grad is not None
    assert x.grad is not None
    assert "geglu_tanh" in repr(mlp)
    with pytest.raises(ValueError, match="baracuda_torch.nn.GatedMLP: kind must be one of"):
        bt.nn.GatedMLP(16, 24, kind="silu")


@pytest.mark.parametrize("hidden_act,kind", [("silu", "swiglu"), ("gelu_pytorch_tanh", "geglu_tanh"),
                                             ("gelu", "geglu"), ("relu", "reglu"), ("sigmoid", "glu")])
def test_gated_mlp_loads_hf_llama_mlp(hidden_act, kind):
    """A Hugging Face LlamaMLP's state dict loads into GatedMLP unchanged and gives its outputs."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act=hidden_act, mlp_bias=False)
    hf = llama.LlamaMLP(cfg).double()
    mlp = bt.nn.GatedMLP(32, 48, kind=kind, dtype=torch.float64)
    mlp.load_state_dict(hf.state_dict())
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(mlp(x), hf(x))


# ---- the backward written over the saved gate and up (OpDef::reuse_saved) -----------------


def _mlp_step(device, dtype, hold=False, retain=False, hooks=False, kind="swiglu"):
    """A gated MLP's step (gate and up from two Linear layers, as a decoder's MLP makes them):
    the input and weight gradients, whether each of the pair's gradients came in the memory
    of the gate / up tensor it is the gradient of, and (hold) whether the gate and up the
    caller kept are unchanged after the backward."""
    torch.manual_seed(0)
    lin_g, lin_u = (torch.nn.Linear(16, 40, device=device, dtype=dtype) for _ in range(2))
    x = torch.randn(6, 16, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(6, 40, device=device, dtype=dtype)
    gate, up = lin_g(x), lin_u(x)
    ptrs, seen = (gate.data_ptr(), up.data_ptr()), {}
    gate.register_hook(lambda g: seen.__setitem__(0, g.data_ptr()))
    up.register_hook(lambda g: seen.__setitem__(1, g.data_ptr()))
    kept = (gate, up, gate.detach().clone(), up.detach().clone()) if hold else None
    if hooks:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            y = bt.gated_activation_pair(gate, up, kind)
    else:
        y = bt.gated_activation_pair(gate, up, kind)
    del gate, up
    grads = torch.autograd.grad(y, (x, lin_g.weight, lin_u.weight), dy, retain_graph=retain)
    reused = (seen[0] == ptrs[0], seen[1] == ptrs[1])
    if retain:  # the graph's last backward (it may reuse them now): the same gradients
        again = torch.autograd.grad(y, (x, lin_g.weight, lin_u.weight), dy)
        assert all(torch.equal(a, b) for a, b in zip(grads, again))
    if hold:
        assert torch.equal(kept[0], kept[2]) and torch.equal(kept[1], kept[3])
    return grads, reused


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_reuses_gate_and_up_only_when_no_one_else_sees_them(device, dtype):
    """A decoder MLP's gate and up (intermediates no one keeps) take their own gradients:
    the backward writes dgate and dup over them, as Liger's SwiGLU does, and the results are
    the same bits as with fresh gradients. Where anything else could still read them (the
    caller holds them, the graph is kept for another backward, saved-tensor hooks) they are
    left alone and fresh gradients are made."""
    plain, reused = _mlp_step(device, dtype)
    assert reused == (True, True)
    for kw in ({"hold": True}, {"retain": True}, {"hooks": True}):
        grads, reused = _mlp_step(device, dtype, **kw)
        assert reused == (False, False), kw
        assert all(torch.equal(a, b) for a, b in zip(grads, plain)), kw


@pytest.mark.parametrize("device", DEVICES)
def test_backward_reuse_refused_for_shared_or_strided_memory(device):
    """gate and up as views of one buffer (a fused gate_up projection chunked), one tensor
    as both, a transposed gate, a leaf gate: gradients are fresh tensors and equal to the
    out-of-place backward's."""
    torch.manual_seed(1)
    x = torch.randn(5, 8, device=device, requires_grad=True)
    w = torch.randn(48, 8, device=device)
    dy = torch.randn(5, 24, device=device)

    def grads(make):
        gate, up = make(x)
        y = bt.gated_activation_pair(gate, up, "swiglu")
        del gate, up
        return torch.autograd.grad(y, x, dy)[0]

    def ref_grad(make):
        gate, up = make(x)
        return torch.autograd.grad(ref.gated_activation_pair(gate, up, "swiglu"), x, dy)[0]

    makes = {"chunked": lambda x: (x @ w.t()).chunk(2, -1),
             "same tensor": lambda x: ((x @ w[:24].t()),) * 2,
             "transposed gate": lambda x: ((w[:24] @ x.t()).t(), x @ w[24:].t())}
    for name, make in makes.items():
        torch.testing.assert_close(grads(make), ref_grad(make), msg=name)
    leaf = torch.randn(5, 24, device=device, requires_grad=True)
    before = leaf.detach().clone()
    dg, = torch.autograd.grad(bt.gated_activation_pair(leaf, leaf.detach() * 2, "swiglu"), leaf, dy)
    assert torch.equal(leaf, before) and dg.data_ptr() != leaf.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_reuse_under_checkpoint_and_compile(device):
    """Activation checkpointing (saved-tensor hooks: no reuse) and torch.compile (the op
    traced: no reuse) give the eager gradients."""
    torch.manual_seed(2)
    lin_g, lin_u = (torch.nn.Linear(16, 32, device=device) for _ in range(2))
    x = torch.randn(4, 16, device=device, requires_grad=True)
    dy = torch.randn(4, 32, device=device)

    def mlp(x):
        return bt.gated_activation_pair(lin_g(x), lin_u(x), "swiglu")

    eager = torch.autograd.grad(mlp(x), (x, lin_g.weight), dy)
    ckpt = torch.autograd.grad(torch.utils.checkpoint.checkpoint(mlp, x, use_reentrant=False),
                               (x, lin_g.weight), dy)
    torch._dynamo.reset()
    comp = torch.autograd.grad(torch.compile(mlp, backend="aot_eager")(x), (x, lin_g.weight), dy)
    for other in (ckpt, comp):
        torch.testing.assert_close(other, eager, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_backward_op(device):
    """gated_activation_pair_backward_ writes the gradients over gate and up: the same bits
    as gated_activation_pair_backward."""
    torch.manual_seed(3)
    dy, gate, up = (torch.randn(3, 7, 10, device=device) for _ in range(3))
    dg, du = ops.gated_activation_pair_backward(dy, gate, up, "geglu")
    ops.gated_activation_pair_backward_(dy, gate, up, "geglu")
    assert torch.equal(gate, dg) and torch.equal(up, du)
