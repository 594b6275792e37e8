"""Gated activations: forward and gradients against reference.py on every dtype,
layout and kind; explain; gradcheck; NaN/Inf; empty tensors; poisoned outputs; mixed
devices; modules. (Opcheck, torch.compile and the bad-input table: tests/op_db.py, run
by tests/test_ops.py.)"""
import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, assert_close_to_reference, layouts_2d,
                     poison_fresh_outputs, randn, requires_cuda)

KINDS = ["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]
# (shape, dim): odd sizes, every split position, 1-d, vector-friendly rows.
CASES = [((8, 64), -1), ((3, 5, 14), -1), ((4, 6, 7), 1), ((6,), 0), ((2, 3, 4, 10), 2),
         ((33, 528), -1), ((6, 2), 0), ((2, 8, 3), -2)]


def run_and_check(x, kind, dim, gate_first, dy=None):
    """Our forward and backward on x (any layout) against reference.py in float64 and in x's dtype."""
    x = x.detach().requires_grad_()
    y = bt.gated_activation(x, kind, dim, gate_first)
    if dy is None:
        dy = randn(y.shape, x.dtype, x.device)
    (dx,) = torch.autograd.grad(y, x, dy)

    x64 = x.detach().double().requires_grad_()
    y64 = ref.gated_activation(x64, kind, dim, gate_first)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())

    xl = x.detach().clone().requires_grad_()
    yl = ref.gated_activation(xl, kind, dim, gate_first)
    (dxl,) = torch.autograd.grad(yl, xl, dy)

    what = f"{kind} {x.dtype} {tuple(x.shape)} dim={dim} gate_first={gate_first}"
    assert y.dtype == x.dtype and y.device == x.device and y.is_contiguous()
    assert_close_to_reference(y, y64, yl, "y of " + what)
    assert_close_to_reference(dx, dx64, dxl, "dx of " + what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gate_first", [False, True])
def test_matches_reference(device, dtype, kind, gate_first):
    for shape, dim in CASES:
        run_and_check(randn(shape, dtype, device, scale=3.0), kind, dim, gate_first)


def layouts(device, dtype, rows=12, half=40):
    """x of logical shape [rows, 2*half] in several memory layouts; dim = -1."""
    return layouts_2d(device, dtype, rows, 2 * half, 3.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("gate_first", [False, True])
def test_strided_inputs(device, dtype, gate_first):
    for name, x in layouts(device, dtype).items():
        for kind in ("swiglu", "geglu"):
            run_and_check(x, kind, -1, gate_first)
            # non-contiguous dy: transposed, and expanded (stride 0) as from .sum()
            dy_t = randn((x.shape[1] // 2, x.shape[0]), dtype, device).t()
            run_and_check(x, kind, -1, gate_first, dy=dy_t)
            dy_e = randn((1, x.shape[1] // 2), dtype, device).expand(x.shape[0], -1)
            run_and_check(x, kind, -1, gate_first, dy=dy_e)


@requires_cuda
def test_cuda_variants_chosen():
    """The plan picks the vectorized kernel where it may, and says so."""
    x = layouts("cuda", torch.bfloat16)
    dy = randn((12, 40), torch.bfloat16, "cuda")
    expect = {"contiguous": "rows_vec16", "row_slice_aligned": "rows_vec16",
              "row_slice_offset": "rows", "every_other_row": "rows_vec16",
              "transposed": "strided", "inner_stride_2": "strided"}
    for name, variant in expect.items():
        assert bt.explain("gated_activation", x[name], "swiglu").variant == variant, name
        assert bt.explain("gated_activation_backward", dy, x[name], "swiglu").variant == variant, name
    # A split dim other than the last on a contiguous tensor is still a row problem.
    x3 = randn((4, 16, 24), torch.float32, "cuda")
    assert bt.explain("gated_activation", x3, "glu", 1).variant == "rows_vec16"


@pytest.mark.parametrize("device", DEVICES)
def test_cpu_variants_chosen(device):
    x = layouts(device, torch.float32)
    assert bt.explain("gated_activation", x["contiguous"], "swiglu").variant.startswith("rows")
    assert bt.explain("gated_activation", x["transposed"], "swiglu").variant == "strided"


@pytest.mark.parametrize("device", DEVICES)
def test_explain_gated(device):
    x = torch.randn(4, 32, dtype=torch.bfloat16, device=device)
    info = bt.explain("gated_activation", x, "swiglu")
    assert isinstance(info, bt.PlanInfo)
    assert info.family == "gated_activation"
    assert info.op == "swiglu"
    assert info.dtype == "bfloat16"
    assert info.index_dtype is None
    assert info.backend == device
    assert (info.arch >= 50) if device == "cuda" else (info.arch == 0)
    assert info.math_precision == "float32" and info.accumulator == "float32"
    assert info.deterministic and info.bit_stable
    assert info.workspace_bytes == 0
    assert info.name.startswith("gated_activation.swiglu/bfloat16/")
    assert "PlanInfo(gated_activation.swiglu" in repr(info)
    # The op object and keyword arguments work too; nothing runs.
    info2 = bt.explain(torch.ops.baracuda.gated_activation, x, kind="geglu_tanh", dim=0, gate_first=True)
    assert info2.op == "geglu_tanh"
    x64 = x.double()
    info3 = bt.explain(torch.ops.baracuda.gated_activation_backward.default, x64[:, :16], x64, "glu")
    assert info3.op == "glu_backward" and info3.math_precision == "float64"


@requires_cuda
def test_gated_mixed_devices():
    with pytest.raises(RuntimeError, match=r"baracuda::gated_activation_backward: expected all tensors on one device"):
        torch.ops.baracuda.gated_activation_backward(torch.randn(3, 4, device="cuda"), torch.randn(3, 8), "swiglu")
    with pytest.raises(RuntimeError, match=r"expected all tensors on one device"):
        torch.ops.baracuda.gated_activation_backward(torch.randn(3, 4), torch.randn(3, 8, device="cuda"), "swiglu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_float64(device, kind):
    for shape, dim in [((3, 8), -1), ((4, 6, 5), 1)]:
        for gate_first in (False, True):
            x = randn(shape, torch.float64, device, 2.0).requires_grad_()
            assert torch.autograd.gradcheck(lambda t: bt.gated_activation(t, kind, dim, gate_first), (x,))
    xt = randn((8, 5), torch.float64, device, 2.0).t().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: bt.gated_activation(t, kind, -1, True), (xt,))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises_clearly(device):
    x = randn((4, 8), torch.float64, device).requires_grad_()
    (g,) = torch.autograd.grad(bt.swiglu(x).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="baracuda::gated_activation: double backward"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_nan_inf_propagate_like_reference(device, kind):
    x = randn((4, 16), torch.float32, device, 3.0)
    x[0, 0] = float("nan")   # a
    x[1, 8] = float("nan")   # b
    x[2, 9] = float("inf")
    x[3, 10] = float("-inf")
    x[2, 1] = float("inf")
    y = bt.gated_activation(x, kind)
    torch.testing.assert_close(y, ref.gated_activation(x, kind), equal_nan=True)


# The lower tail on the CPU's scalar kernels (float64 here; the AVX2 rows' last elements
# too), the CPU's AVX2 rows (float32, and bfloat16, whose range holds the tail) and the
# CUDA kernels' float32 and float64 paths and their 16-bit one (bfloat16: Φ from the
# fitted erfc polynomial, within 1.3e-5 relative, docs/ops.md).
@pytest.mark.parametrize("device, dtype, lo, rtol", [
    ("cpu", torch.float64, -30.0, 1e-12),
    ("cpu", torch.float32, -12.0, 1e-6),
    ("cpu", torch.bfloat16, -12.0, 8e-3),
    pytest.param("cuda", torch.float32, -9.0, 1e-5, marks=requires_cuda),
    pytest.param("cuda", torch.float64, -30.0, 1e-12, marks=requires_cuda),
    pytest.param("cuda", torch.bfloat16, -9.0, 8e-3, marks=requires_cuda)])
def test_geglu_lower_tail_keeps_its_relative_accuracy(device, dtype, lo, rtol):
    """GeGLU's Φ from erfc(−b/√2)/2: in the gate's lower tail, where (1 + erf(b/√2))/2
    cancels (to 0 in float32 below b ≈ −5.9), y and both gradients stay within `rtol` of
    the float64 reference, relatively (bfloat16: a unit of its rounding), on the same
    inputs (values of the dtype)."""
    g = torch.Generator().manual_seed(0)
    b = torch.linspace(lo, -3.0, 301, dtype=torch.float64)
    a = 1.0 + torch.rand(301, dtype=torch.float64, generator=g)
    x64 = torch.cat([a, b]).unsqueeze(0).to(dtype).double().requires_grad_()
    dy = (1.0 + torch.rand(1, 301, dtype=torch.float64, generator=g)).to(dtype).double()
    y64 = ref.gated_activation(x64, "geglu")
    (dx64,) = torch.autograd.grad(y64, x64, dy)
    x = x64.detach().to(device, dtype).requires_grad_()
    y = bt.gated_activation(x, "geglu")
    (dx,) = torch.autograd.grad(y, x, dy.to(device, dtype))
    for name, got, want in [("y", y, y64), ("dx", dx, dx64)]:
        rel = ((got.double().cpu() - want) / want).abs().max().item()
        assert rel <= rtol, f"geglu {dtype} on {device}: {name}'s largest relative error {rel:.3g} > {rtol}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reglu_gradient_at_special_gates(device, dtype):
    """reglu's gradients where the gate is 0, ±0, ±inf or NaN equal torch.relu's: zero
    where b <= 0, dy·a everywhere else (a NaN gate passes it). Across every vector
    position of the CPU's AVX2 loop and the GPU's vector loads, and the scalar tail."""
    gates = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -1.5],
                         dtype=torch.float64)
    n = 37                                   # not a multiple of any vector width
    b = gates.repeat(n // len(gates) + 1)[:n].to(dtype)
    a = randn((n,), dtype, device, 2.0)
    x = torch.cat([a, b.to(device)]).requires_grad_()
    dy = randn((n,), dtype, device)
    y = bt.reglu(x, 0)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().clone().requires_grad_()
    yr = xr[:n] * torch.relu(xr[n:])
    (dxr,) = torch.autograd.grad(yr, xr, dy)
    torch.testing.assert_close(y, yr, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(dx, dxr, equal_nan=True, rtol=0, atol=0)
    # the two-tensor form shares the math: gated_activation_pair(gate=b, up=a)
    g = xr.detach()[n:].clone().requires_grad_()
    u = xr.detach()[:n].clone().requires_grad_()
    dg, du = torch.autograd.grad(bt.gated_activation_pair(g, u, "reglu"), (g, u), dy)
    torch.testing.assert_close(torch.cat([du, dg]), dxr, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tensors(device):
    for shape, dim in [((0, 8), -1), ((4, 0), -1), ((2, 0, 6), -1), ((0,), 0)]:
        x = torch.empty(shape, device=device).requires_grad_()
        y = bt.swiglu(x, dim)
        expected = list(shape)
        expected[dim] //= 2
        assert list(y.shape) == expected
        (dx,) = torch.autograd.grad(y, x, torch.empty_like(y))
        assert dx.shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """With deterministic algorithms on, PyTorch fills fresh outputs with NaN: a kernel that
    skips an element leaves a NaN behind."""
    poison_fresh_outputs()
    for x in list(layouts(device, dtype).values()) + [randn((3, 5, 14), dtype, device)]:
        x = x.detach().requires_grad_()
        y = bt.geglu(x, gate_first=True)
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        assert torch.isfinite(y).all() and torch.isfinite(dx).all()


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_cuda_agree(dtype):
    x = randn((64, 200), dtype, "cpu", 3.0)
    dy = randn((64, 100), dtype, "cpu")
    for kind in KINDS:
        xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
        yc, yg = bt.gated_activation(xc, kind), bt.gated_activation(xg, kind)
        yc.backward(dy)
        yg.backward(dy.cuda())
        tol = dict(atol=1e-5, rtol=1e-5) if dtype in (torch.float32, torch.float64) else {}
        torch.testing.assert_close(yg.cpu(), yc, **tol)
        torch.testing.assert_close(xg.grad.cpu(), xc.grad, **tol)


@requires_cuda
def test_more_than_2_31_elements():
    """Offsets beyond int32 take the 64-bit plan variant and stay correct."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    rows, half = 2**16 + 3, 2**15
    x = torch.randn(rows, 2 * half, dtype=torch.bfloat16, device="cuda")
    info = bt.explain("gated_activation", x, "swiglu")
    assert info.variant == "rows_vec16_i64"
    y = bt.swiglu(x)
    for r in (0, 12345, rows - 1):
        assert_close_to_reference(y[r], ref.gated_activation(x[r].double(), "swiglu"),
                                  ref.gated_activation(x[r], "swiglu"), f"row {r}")
    dy = torch.randn_like(y)
    dx = torch.ops.baracuda.gated_activation_backward(dy, x, "swiglu")
    for r in (0, rows - 1):
        xr = x[r].double().requires_grad_()
        (g64,) = torch.autograd.grad(ref.gated_activation(xr, "swiglu"), xr, dy[r].double())
        xl = x[r].clone().requires_grad_()
        (gl,) = torch.autograd.grad(ref.gated_activation(xl, "swiglu"), xl, dy[r])
        assert_close_to_reference(dx[r], g64, gl, f"dx row {r}")
    del x, y, dx, dy
    torch.cuda.empty_cache()


@requires_cuda
def test_cuda_graph_capture():
    """No host synchronization inside the ops: forward and backward capture and replay."""
    x = randn((64, 256), torch.bfloat16, "cuda").requires_grad_()
    dy = randn((64, 128), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph
        for _ in range(2):
            (g,) = torch.autograd.grad(bt.swiglu(x), x, dy)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bt.swiglu(x)
        (g,) = torch.autograd.grad(y, x, dy)
    with torch.no_grad():
        x.copy_(randn((64, 256), torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, bt.swiglu(x.detach()))
    torch.testing.assert_close(g, torch.ops.baracuda.gated_activation_backward(dy, x.detach(), "swiglu"))


@pytest.mark.parametrize("device", DEVICES)
def test_modules(device):
    mlp = bt.nn.GatedMLP(16, 24, device=device, dtype=torch.float64)
    x = randn((3, 5, 16), torch.float64, device).requires_grad_()
    expected = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected)
    mlp(x).sum().backward()
    assert mlp.gate_proj.weight.grad is not None and x.grad is not None
    act = bt.nn.GatedActivation("geglu_tanh", dim=1)
    z = randn((2, 6, 3), torch.float32, device)
    torch.testing.assert_close(act(z), ref.gated_activation(z, "geglu_tanh", 1))
    assert "geglu_tanh" in repr(act)


@pytest.mark.parametrize("device", DEVICES)
def test_functional_wrappers(device):
    x = randn((5, 12), torch.float32, device, 2.0)
    torch.testing.assert_close(bt.glu(x), torch.nn.functional.glu(x))
    torch.testing.assert_close(bt.reglu(x, gate_first=True), ref.gated_activation(x, "reglu", -1, True))
    torch.testing.assert_close(bt.swiglu(x), ref.gated_activation(x, "swiglu"))
    torch.testing.assert_close(bt.geglu(x), ref.gated_activation(x, "geglu"))
    torch.testing.assert_close(bt.geglu(x, approximate="tanh"), ref.gated_activation(x, "geglu_tanh"))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        bt.geglu(x, approximate="erf")
