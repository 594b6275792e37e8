"""Lerp (scalar and tensor weight): forward and every gradient against reference.py on
every dtype, weight, broadcasting direction and layout; gradcheck and gradgradcheck;
NaN/Inf; empty tensors; poisoned outputs; and, on a GPU, variants, CPU agreement,
graphs, > 2^31, mixed devices. (Opcheck, torch.compile and the bad-input table:
tests/op_db.py, run by tests/test_ops.py.)"""
import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, HAS_CUDA, assert_close_to_reference, layouts_2d,
                     poison_fresh_outputs, randn, requires_cuda)

ops = torch.ops.baracuda

# Exact ends, both formula branches, and extrapolation on either side.
WEIGHTS = [0.0, 1.0, 0.3, 0.7, -0.5, 1.5]

# (a, b) shapes: equal, a smaller, b smaller, both broadcast, scalar-shaped, size-1.
SCALAR_CASES = [((3, 5, 7), (3, 5, 7)), ((5, 7), (3, 5, 7)), ((3, 5, 7), (7,)),
                ((3, 1, 7), (1, 5, 1)), ((), (4, 6)), ((4, 6), ()), ((), ()), ((1,), (2, 1)),
                ((33, 40), (33, 40)), ((2, 3, 2, 3, 2), (3, 1, 3, 1))]
# (a, b, weight) shapes: weight equal, smaller, a column, scalar-shaped, larger than a
# and b, everything broadcast.
TENSOR_CASES = [((3, 5, 7), (3, 5, 7), (3, 5, 7)), ((4, 6), (4, 6), (6,)), ((4, 16), (4, 16), (4, 1)),
                ((4, 6), (4, 6), ()), ((6,), (6,), (3, 6)), ((4, 1, 6), (1, 5, 1), (5, 6)),
                ((5, 7), (3, 5, 7), (3, 1, 1)), ((), (), ()), ((33, 40), (40,), (33, 1))]


def random_weight(shape, dtype, device):
    """Weights over [-0.75, 1.75], with the exact points 0, 1, ±0.5 where there is room."""
    w = torch.rand(shape, dtype=torch.float64) * 2.5 - 0.75
    flat = w.view(-1)
    if flat.numel() >= 12:
        for i, v in enumerate([0.0, 1.0, 0.5, -0.5]):
            flat[i * 3] = v
    return w.to(device=device, dtype=dtype)


def grads_of(fn, inputs, dy):
    inputs = [t.detach().requires_grad_() for t in inputs]
    y = fn(*inputs)
    return y, torch.autograd.grad(y, inputs, dy)


def run_and_check(a, b, weight, dy=None):
    """Our forward and gradients against reference.py in float64 and in the inputs' dtype."""
    tensor_w = isinstance(weight, torch.Tensor)
    inputs = [a, b] + ([weight] if tensor_w else [])

    def ours(*t):
        return bt.lerp(t[0], t[1], t[2] if tensor_w else weight)

    def theirs(*t):
        return ref.lerp(t[0], t[1], t[2] if tensor_w else weight)

    with torch.no_grad():
        shape = ours(*inputs).shape
    if dy is None:
        dy = randn(shape, a.dtype, a.device)
    y, g = grads_of(ours, inputs, dy)
    y64, g64 = grads_of(theirs, [t.double() for t in inputs], dy.double())
    yl, gl = grads_of(theirs, [t.clone() for t in inputs], dy)

    what = (f"{a.dtype} a{tuple(a.shape)} b{tuple(b.shape)} "
            f"w{tuple(weight.shape) if tensor_w else weight}")
    assert y.dtype == a.dtype and y.device == a.device and y.is_contiguous()
    assert_close_to_reference(y, y64, yl, "y of " + what)
    for name, t, gi, gi64, gil in zip(["da", "db", "dw"], inputs, g, g64, gl):
        assert gi.shape == t.shape and gi.dtype == t.dtype, f"{name} of {what}: shape {tuple(gi.shape)}"
        assert_close_to_reference(gi, gi64, gil, f"{name} of {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("weight", WEIGHTS)
def test_scalar_weight_matches_reference(device, dtype, weight):
    for sa, sb in SCALAR_CASES:
        run_and_check(randn(sa, dtype, device, 2.0), randn(sb, dtype, device, 2.0), weight)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_tensor_weight_matches_reference(device, dtype):
    for sa, sb, sw in TENSOR_CASES:
        run_and_check(randn(sa, dtype, device, 2.0), randn(sb, dtype, device, 2.0),
                      random_weight(sw, dtype, device))


@pytest.mark.parametrize("device", DEVICES)
def test_exact_at_the_ends(device):
    """w = 0 gives a and w = 1 gives b bit for bit (the two-branch formula), any dtype."""
    for dtype in FLOAT_DTYPES:
        a, b = randn((7, 9), dtype, device, 1e3), randn((7, 9), dtype, device, 1e-3)
        assert torch.equal(bt.lerp(a, b, 0.0), a) and torch.equal(bt.lerp(a, b, 1.0), b)
        w = torch.tensor([0.0, 1.0] * 4 + [0.0], dtype=dtype, device=device)
        y = bt.lerp(a, b, w)
        assert torch.equal(y[:, w == 0], a[:, w == 0]) and torch.equal(y[:, w == 1], b[:, w == 1])


@pytest.mark.parametrize("device", DEVICES)
def test_float32_matches_torch_closely(device):
    """Same formula and rounding as torch.lerp: float32 results within one ulp of it."""
    a, b = randn((64, 130), torch.float32, device, 3.0), randn((64, 130), torch.float32, device, 3.0)
    w = random_weight((64, 130), torch.float32, device)
    for weight in WEIGHTS + [w]:
        torch.testing.assert_close(bt.lerp(a, b, weight), torch.lerp(a, b, weight),
                                   rtol=2.5e-7, atol=1e-6)


def layouts(device, dtype, rows=12, cols=40):
    """Tensors of logical shape [rows, cols] in several memory layouts."""
    return layouts_2d(device, dtype, rows, cols, 2.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    lay = layouts(device, dtype)
    names = list(lay)
    for i, name in enumerate(names):
        other = lay[names[(i + 3) % len(names)]]
        run_and_check(lay[name], other, 0.3)
        run_and_check(other, lay[name], 0.8)
        w = random_weight((12, 40), dtype, device)
        run_and_check(lay[name], other, w)
        run_and_check(other, lay["contiguous"], w.t().contiguous().t() if i % 2 else w[:, :1].expand(12, 40))
        # non-contiguous dy: transposed, and expanded (stride 0) as from .sum()
        dy_t = randn((40, 12), dtype, device).t()
        dy_e = randn((), dtype, device).expand(12, 40)
        run_and_check(lay[name], other, 1.5, dy=dy_t)
        run_and_check(lay[name], other, w, dy=dy_e)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_ops_directly(device):
    """lerp_backward(.Tensor) return every gradient at dy's shape, contiguous, unreduced."""
    dy = randn((5, 6), torch.float64, device)
    da, db = ops.lerp_backward(dy, 0.3)
    torch.testing.assert_close(da, 0.7 * dy, rtol=1e-15, atol=0)
    torch.testing.assert_close(db, 0.3 * dy, rtol=1e-15, atol=0)
    a, b, w = randn((6,), torch.float64, device), randn((5, 1), torch.float64, device), randn((), torch.float64, device)
    da, db, dw = ops.lerp_backward.Tensor(dy.t().contiguous().t(), a, b, w)
    for g in (da, db, dw):
        assert g.shape == (5, 6) and g.is_contiguous()
    torch.testing.assert_close(da, (1 - w) * dy)
    torch.testing.assert_close(db, w * dy)
    torch.testing.assert_close(dw, dy * (b - a))


@pytest.mark.parametrize("device", DEVICES)
def test_only_needed_gradients(device):
    a = randn((4, 5), torch.float32, device).requires_grad_()
    b = randn((5,), torch.float32, device)
    w = random_weight((4, 1), torch.float32, device)
    bt.lerp(a, b, 0.25).sum().backward()
    assert b.grad is None and torch.allclose(a.grad, torch.full_like(a, 0.75))
    a.grad = None
    w.requires_grad_()
    bt.lerp(a, b, w).sum().backward()
    assert b.grad is None and a.grad is not None and w.grad.shape == (4, 1)
    torch.testing.assert_close(w.grad, (b - a.detach()).sum(1, keepdim=True))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    for sa, sb in [((3, 4), (3, 4)), ((3, 4), (4,)), ((1, 4), (3, 1)), ((), (2, 3))]:
        a = randn(sa, torch.float64, device).requires_grad_()
        b = randn(sb, torch.float64, device).requires_grad_()
        for w in (0.3, 0.7, -0.5, 1.5):
            assert torch.autograd.gradcheck(lambda x, y: bt.lerp(x, y, w), (a, b))
    for sa, sb, sw in [((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((4,), (2, 1), ()),
                       ((2, 1, 3), (1, 4, 1), (4, 3))]:
        a = randn(sa, torch.float64, device).requires_grad_()
        b = randn(sb, torch.float64, device).requires_grad_()
        w = random_weight(sw, torch.float64, device).requires_grad_()
        assert torch.autograd.gradcheck(bt.lerp, (a, b, w))
    a_t = randn((5, 3), torch.float64, device).t().requires_grad_()
    b_s = randn((3, 10), torch.float64, device)[:, ::2].requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: bt.lerp(x, y, 0.6), (a_t, b_s))
    w_s = random_weight((5, 3), torch.float64, device).t().requires_grad_()
    assert torch.autograd.gradcheck(bt.lerp, (a_t, b_s, w_s))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_scalar_weight(device):
    """lerp_backward is linear in dy; its backward is lerp(g_da, g_db, w)."""
    for sa, sb in [((3, 4), (3, 4)), ((3, 4), (4,)), ((), (2, 3))]:
        a = randn(sa, torch.float64, device).requires_grad_()
        b = randn(sb, torch.float64, device).requires_grad_()
        for w in (0.3, 1.5):
            assert torch.autograd.gradgradcheck(lambda x, y: bt.lerp(x, y, w), (a, b))
    dy = randn((3, 4), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(lambda g: ops.lerp_backward(g, 0.3), (dy,))
    assert torch.autograd.gradcheck(lambda g: ops.lerp_backward(g, -0.5)[1], (dy,))
    # A second derivative with only one of the two gradients used downstream.
    g_da, g_db = randn((3, 4), torch.float64, device), randn((3, 4), torch.float64, device)
    da, db = ops.lerp_backward(dy, 0.3)
    (d1,) = torch.autograd.grad((da * g_da).sum() + (db * g_db).sum(), dy)
    torch.testing.assert_close(d1, 0.7 * g_da + 0.3 * g_db)
    (d2,) = torch.autograd.grad(ops.lerp_backward(dy, 0.3)[1], dy, g_db)
    torch.testing.assert_close(d2, 0.3 * g_db)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_tensor_weight_raises_clearly(device):
    a, b = randn((3, 4), torch.float64, device), randn((3, 4), torch.float64, device)
    w = random_weight((3, 4), torch.float64, device).requires_grad_()
    (g,) = torch.autograd.grad(bt.lerp(a, b, w).pow(2).sum(), w, create_graph=True)
    with pytest.raises(NotImplementedError,
                       match="baracuda::lerp: double backward with a tensor weight is not implemented"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_propagate_like_torch(device):
    a, b = randn((4, 8), torch.float32, device, 3.0), randn((4, 8), torch.float32, device, 3.0)
    a[0, 0] = float("nan")
    b[0, 1] = float("nan")
    a[1, 2] = float("inf")
    b[1, 3] = float("-inf")
    a[2, 4], b[2, 4] = float("inf"), float("inf")
    a[3, 5], b[3, 5] = float("inf"), float("-inf")
    for weight in WEIGHTS + [float("nan"), float("inf")]:
        torch.testing.assert_close(bt.lerp(a, b, weight), torch.lerp(a, b, weight), equal_nan=True)
    w = random_weight((4, 8), torch.float32, device)
    w[0, 6], w[1, 7], w[2, 0] = float("nan"), float("inf"), float("-inf")
    torch.testing.assert_close(bt.lerp(a, b, w), torch.lerp(a, b, w), equal_nan=True)
    dy = randn((4, 8), torch.float32, device)
    dy[3, 3] = float("nan")
    ga = ops.lerp_backward(dy, 0.3)
    torch.testing.assert_close(ga[0], dy * (1 - 0.3), equal_nan=True)
    gt = ops.lerp_backward.Tensor(dy, a, b, w)
    torch.testing.assert_close(gt[2], dy * (b - a), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tensors(device):
    for sa, sb, shape in [((0, 4), (4,), (0, 4)), ((4, 0), (4, 0), (4, 0)), ((2, 0, 3), (1, 1, 3), (2, 0, 3)),
                          ((0,), (1,), (0,)), ((0,), (), (0,))]:
        a = torch.empty(sa, device=device).requires_grad_()
        b = torch.empty(sb, device=device).requires_grad_()
        w = torch.empty(sb, device=device).requires_grad_()
        for weight in (0.3, w):
            y = bt.lerp(a, b, weight)
            assert tuple(y.shape) == shape
            grads = torch.autograd.grad(y, [a, b] + ([w] if weight is w else []), torch.empty_like(y))
            assert grads[0].shape == a.shape and grads[1].shape == b.shape
            if weight is w:
                assert grads[2].shape == w.shape
            # a broadcast dim of size 1 receives a zero gradient from an empty sum
            assert (grads[1] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """With deterministic algorithms on, PyTorch fills fresh outputs with NaN: a kernel that
    skips an element leaves a NaN behind."""
    poison_fresh_outputs()
    lay = layouts(device, dtype)
    cases = [(x, lay["contiguous"]) for x in lay.values()] + [
        (randn((3, 5, 17), dtype, device), randn((17,), dtype, device)),
        (randn((1, 24), dtype, device), randn((8, 1), dtype, device))]
    for a, b in cases:
        a = a.detach().requires_grad_()
        b = b.detach().requires_grad_()
        w = random_weight(b.shape, dtype, device).requires_grad_()
        for weight in (0.3, w):
            y = bt.lerp(a, b, weight)
            grads = torch.autograd.grad(y, [a, b] + ([w] if weight is w else []), torch.ones_like(y))
            assert torch.isfinite(y).all()
            assert all(torch.isfinite(g).all() for g in grads)
        dy = randn(y.shape, dtype, device)
        assert all(torch.isfinite(g).all() for g in ops.lerp_backward(dy, 0.7))
        assert all(torch.isfinite(g).all() for g in ops.lerp_backward.Tensor(dy, a, b, w))


# ---- introspection ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    a = torch.randn(4, 32, dtype=torch.bfloat16, device=device)
    w = torch.rand(4, 32, dtype=torch.bfloat16, device=device)
    info = bt.explain("lerp", a, a, 0.5)
    assert info.family == "lerp" and info.op == "lerp" and info.dtype == "bfloat16"
    assert info.backend == device and info.deterministic and info.bit_stable
    assert info.math_precision == "float32" and info.workspace_bytes == 0
    assert bt.explain("lerp.Tensor", a, a, w).op == "lerp_tensor"
    assert bt.explain(ops.lerp.Tensor, a, a, w).op == "lerp_tensor"
    assert bt.explain(ops.lerp.default, a, a, weight=0.1).op == "lerp"
    assert bt.explain("lerp_backward", a, 0.5).op == "lerp_backward"
    assert bt.explain("lerp_backward.Tensor", a, a, a, w).op == "lerp_backward_tensor"
    assert bt.explain(ops.lerp_backward.Tensor, a.double(), a.double(), a.double(),
                      w.double()).math_precision == "float64"
    assert bt.explain("lerp", a, a, 0.5, preference="deterministic").preference == "deterministic"
    with pytest.raises(ValueError, match="must broadcast"):
        bt.explain("lerp", a, a[:, :5], 0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_cpu_variants_chosen(device):
    lay = layouts(device, torch.float32)
    c = lay["contiguous"]
    assert bt.explain("lerp", c, c, 0.5).variant.startswith("rows")
    assert bt.explain("lerp", lay["transposed"], c, 0.5).variant == "strided"
    assert bt.explain("lerp", lay["inner_stride_2"], c, 0.5).variant == "strided"


@requires_cuda
def test_cuda_variants_chosen():
    """The plan picks the vectorized rows kernel wherever it may, and says so."""
    lay = layouts("cuda", torch.bfloat16, rows=12, cols=40)
    c = lay["contiguous"]
    expect = {"contiguous": "rows_vec16", "row_slice_aligned": "rows_vec16",
              "every_other_row": "rows_vec16", "broadcast_rows": "rows_vec16",
              "broadcast_cols": "rows_vec16", "row_slice_offset": "rows",
              "transposed": "strided", "inner_stride_2": "strided"}
    for name, variant in expect.items():
        assert bt.explain("lerp", lay[name], c, 0.3).variant == variant, name
        assert bt.explain("lerp", c, lay[name], 0.3).variant == variant, name
        assert bt.explain("lerp.Tensor", c, c, lay[name]).variant == variant, name
        assert bt.explain("lerp_backward", lay[name], 0.3).variant == variant, name
        assert bt.explain("lerp_backward.Tensor", c, c, lay[name], c).variant == variant, name
    # Broadcasting without views: a [M, N] with b [N] and a weight [M, 1] stays on rows.
    a, b, w = c, c[0], c[:, :1].contiguous()
    assert bt.explain("lerp", a, b, 0.3).variant == "rows_vec16"
    assert bt.explain("lerp.Tensor", a, b, w).variant == "rows_vec16"
    assert bt.explain("lerp_backward.Tensor", a, a, b, w).variant == "rows_vec16"
    # dy of y.sum(): every stride 0.
    assert bt.explain("lerp_backward", torch.ones((), device="cuda").expand(64, 64), 0.3).variant == "rows_vec16"
    # cols not a multiple of the vector (8 for bf16); and a 3-d broadcast that cannot coalesce.
    odd = randn((12, 41), torch.bfloat16, "cuda")
    assert bt.explain("lerp", odd, odd, 0.3).variant == "rows"
    a3, b3 = randn((4, 1, 16), torch.float32, "cuda"), randn((1, 3, 16), torch.float32, "cuda")
    assert bt.explain("lerp", a3, b3, 0.3).variant == "strided"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_variants_are_correct(dtype):
    """Every variant on the GPU against reference.py (the layouts above hit each one), with
    sizes that leave partial blocks and partial vectors."""
    for rows, cols in [(12, 40), (3, 1000), (1, 8 * 1024 * 4 + 8), (257, 24), (5, 7)]:
        lay = layouts("cuda", dtype, rows, cols)
        for name, x in lay.items():
            c = lay["contiguous"]
            run_and_check(x, c, 0.3)
            run_and_check(c, x, random_weight((rows, cols), dtype, "cuda"))
            run_and_check(c, c, x.clamp(-0.75, 1.75), dy=x)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_cuda_agree(dtype):
    a, b = randn((64, 200), dtype, "cpu", 2.0), randn((200,), dtype, "cpu", 2.0)
    w = random_weight((64, 1), dtype, "cpu")
    dy = randn((64, 200), dtype, "cpu")
    tol = dict(atol=1e-5, rtol=1e-5) if dtype in (torch.float32, torch.float64) else {}
    for weight in (0.3, 1.5, w):
        ins_c = [t.clone().requires_grad_() for t in (a, b, w)]
        ins_g = [t.cuda().requires_grad_() for t in (a, b, w)]
        yc = bt.lerp(ins_c[0], ins_c[1], ins_c[2] if weight is w else weight)
        yg = bt.lerp(ins_g[0], ins_g[1], ins_g[2] if weight is w else weight)
        torch.testing.assert_close(yg.cpu(), yc, **tol)
        yc.backward(dy)
        yg.backward(dy.cuda())
        for tc, tg in zip(ins_c, ins_g):
            if tc.grad is not None:
                torch.testing.assert_close(tg.grad.cpu(), tc.grad, **tol)


@requires_cuda
def test_cuda_graph_capture():
    """No host synchronization inside the ops: forward and backward capture and replay."""
    a = randn((64, 256), torch.bfloat16, "cuda").requires_grad_()
    b = randn((256,), torch.bfloat16, "cuda").requires_grad_()
    w = random_weight((64, 1), torch.bfloat16, "cuda").requires_grad_()
    dy = randn((64, 256), torch.bfloat16, "cuda")

    def step():
        y1 = bt.lerp(a, b, 0.3)
        y2 = bt.lerp(a, b, w)
        return (y1, y2) + torch.autograd.grad((y1, y2), (a, b, w), (dy, dy))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    with torch.no_grad():
        a.copy_(randn((64, 256), torch.bfloat16, "cuda"))
        w.copy_(random_weight((64, 1), torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    expected = step()
    for o, e in zip(out, expected):
        torch.testing.assert_close(o, e)


@requires_cuda
def test_more_than_2_31_elements():
    """Offsets beyond int32 take the 64-bit plan variants and stay correct."""
    if torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs 48 GiB of GPU memory")
    rows, cols = 2**15 + 1, 2**16  # 2^31 + 2^16 elements
    dt = torch.bfloat16

    def check_rows(got, expect64, expect_low, what):
        for r in (0, rows // 2, rows - 1):
            assert_close_to_reference(got[r], expect64(r), expect_low(r), f"{what} row {r}")

    a = torch.randn(rows, cols, dtype=dt, device="cuda")
    b = torch.randn(cols, dtype=dt, device="cuda")
    assert bt.explain("lerp", a, b, 0.3).variant == "rows_vec16_i64"
    y = bt.lerp(a, b, 0.3)
    check_rows(y, lambda r: torch.lerp(a[r].double(), b.double(), 0.3),
               lambda r: torch.lerp(a[r], b, 0.3), "y")
    del y
    dy = torch.randn(rows, cols, dtype=dt, device="cuda")
    assert bt.explain("lerp_backward", dy, 0.3).variant == "rows_vec16_i64"
    da, db = ops.lerp_backward(dy, 0.3)
    check_rows(da, lambda r: dy[r].double() * 0.7, lambda r: dy[r] * 0.7, "da")
    check_rows(db, lambda r: dy[r].double() * 0.3, lambda r: dy[r] * 0.3, "db")
    del da, db
    w = torch.rand(rows, 1, dtype=dt, device="cuda")
    assert bt.explain("lerp_backward.Tensor", dy, a, b, w).variant == "rows_vec16_i64"
    da, db, dw = ops.lerp_backward.Tensor(dy, a, b, w)
    check_rows(da, lambda r: dy[r].double() * (1 - w[r].double()), lambda r: dy[r] * (1 - w[r]), "da")
    check_rows(db, lambda r: dy[r].double() * w[r].double(), lambda r: dy[r] * w[r], "db")
    check_rows(dw, lambda r: dy[r].double() * (b.double() - a[r].double()), lambda r: dy[r] * (b - a[r]), "dw")
    del da, db, dw, dy, w
    # A broadcast that cannot coalesce: the strided 64-bit kernel.
    a3 = a.view(rows, 1, cols)[:, :, : cols // 2]
    b3 = torch.randn(1, 2, cols // 2, dtype=dt, device="cuda")
    assert bt.explain("lerp", a3, b3, 0.7).variant == "strided_i64"
    y3 = bt.lerp(a3, b3, 0.7)
    assert y3.shape == (rows, 2, cols // 2)
    check_rows(y3, lambda r: torch.lerp(a3[r].double(), b3[0].double(), 0.7),
               lambda r: torch.lerp(a3[r], b3[0], 0.7), "strided y")
    del a, b, a3, b3, y3
    torch.cuda.empty_cache()


@requires_cuda
def test_mixed_devices():
    g, c = torch.randn(3, 4, device="cuda"), torch.randn(3, 4)
    with pytest.raises(RuntimeError, match=r"baracuda::lerp: expected all tensors on one device"):
        bt.lerp(g, c, 0.5)
    with pytest.raises(RuntimeError, match=r"baracuda::lerp: expected all tensors on one device"):
        bt.lerp(g, g, torch.tensor(0.5))
    with pytest.raises(RuntimeError, match=r"baracuda::lerp_backward: expected all tensors on one device"):
        ops.lerp_backward.Tensor(g, g, c, g)


def test_functional_wrapper():
    a, b = randn((5, 6), torch.float32, "cpu"), randn((6,), torch.float32, "cpu")
    torch.testing.assert_close(bt.lerp(a, b, 1), torch.lerp(a, b, 1.0))  # an int weight
    w0 = torch.tensor(0.25)
    torch.testing.assert_close(bt.lerp(a, b, w0), torch.lerp(a, b, w0))
    assert "lerp" in bt.functional.__all__ and bt.lerp is bt.functional.lerp
    assert "|w| < 0.5" in bt.lerp.__doc__
