"""Gather: forward and gradients against torch.gather / reference.py on every dtype, index
dtype, dim and layout; gradcheck and gradgradcheck; empty and 0-dim tensors; duplicate
indices; out-of-range indices (CPU: IndexError at once; CUDA: recorded, raised by
check_errors / the next call / sync mode, context still usable); the deterministic
backward (bitwise stable, chosen under both deterministic switches); explain; CUDA
graphs; mixed devices. (Opcheck, torch.compile and the bad-input table: tests/op_db.py,
run by tests/test_ops.py.)"""
import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES, FLOAT_DTYPES, HAS_CUDA, assert_close_to_reference, randn, requires_cuda

ops = torch.ops.baracuda
INDEX_DTYPES = [torch.int64, torch.int32]

# (src shape, index shape, dim): odd sizes, index longer than src along dim (duplicates),
# index smaller than src elsewhere, 1-d, 4-d, vector-friendly rows along both dims.
CASES = [((5, 7), (3, 4), 0), ((5, 7), (5, 3), 1), ((5, 7), (4, 12), 1), ((3, 5, 7), (2, 9, 4), 1),
         ((6,), (10,), 0), ((2, 3, 4, 5), (2, 3, 4, 2), -1), ((2, 3, 4, 5), (1, 3, 2, 5), 0),
         ((33, 40), (33, 40), 1), ((64, 48), (16, 48), 0), ((4, 1, 6), (4, 1, 9), 2),
         ((3, 8, 16), (3, 5, 16), 1)]


@pytest.fixture(autouse=True)
def _index_checks_and_pending_errors():
    """Every test starts in "async" mode and must leave no CUDA index error recorded
    (check_errors raises in teardown otherwise)."""
    bt.set_index_checks("async")
    yield
    bt.set_index_checks("async")
    bt.check_errors()


def rand_index(shape, size, dtype=torch.int64, device="cpu"):
    return torch.randint(0, max(size, 1), shape, dtype=torch.int64).to(device=device, dtype=dtype)


def make_case(src_shape, index_shape, dim, dtype, index_dtype, device):
    src = randn(src_shape, dtype, device, 3.0)
    index = rand_index(index_shape, src_shape[dim] if src_shape else 1, index_dtype, device)
    return src, index


def run_and_check(src, dim, index, dout=None):
    """Ours against torch.gather (forward: exactly; it is a copy) and the gradient against
    reference.py in float64 and in src's dtype."""
    src = src.detach().requires_grad_()
    out = bt.gather(src, dim, index)
    what = f"{src.dtype} src {tuple(src.shape)} index {tuple(index.shape)} {index.dtype} dim={dim}"
    assert out.dtype == src.dtype and out.device == src.device and out.is_contiguous(), what
    assert out.shape == index.shape, what
    assert torch.equal(out.detach(), torch.gather(src.detach(), dim, index.long())), "out of " + what
    if dout is None:
        dout = randn(index.shape, src.dtype, src.device)
    (dsrc,) = torch.autograd.grad(out, src, dout)

    src64 = src.detach().double().requires_grad_()
    (d64,) = torch.autograd.grad(ref.gather(src64, dim, index.long()), src64, dout.double())
    srcl = src.detach().clone().requires_grad_()
    (dl,) = torch.autograd.grad(ref.gather(srcl, dim, index.long()), srcl, dout)
    assert dsrc.dtype == src.dtype and dsrc.shape == src.shape
    assert_close_to_reference(dsrc, d64, dl, "dsrc of " + what)
    return out, dsrc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_matches_reference(device, dtype, index_dtype):
    for src_shape, index_shape, dim in CASES:
        src, index = make_case(src_shape, index_shape, dim, dtype, index_dtype, device)
        run_and_check(src, dim, index)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_every_dim(device, preference):
    src_shape = (3, 4, 5, 6)
    with bt.preference(preference):
        for dim in range(-4, 4):
            index_shape = [s - 1 for s in src_shape]
            index_shape[dim] = 7
            for dtype in (torch.float32, torch.bfloat16):
                src, index = make_case(src_shape, index_shape, dim, dtype, torch.int64, device)
                run_and_check(src, dim, index)


def src_layouts(device, dtype):
    """src of logical shape [6, 8] in several memory layouts."""
    return {
        "contiguous": randn((6, 8), dtype, device, 3.0),
        "transposed": randn((8, 6), dtype, device, 3.0).t(),
        "sliced": randn((6, 20), dtype, device, 3.0)[:, 5:13],
        "every_other_row": randn((12, 8), dtype, device, 3.0)[::2],
        "expanded_rows": randn((1, 8), dtype, device, 3.0).expand(6, 8),
        "expanded_cols": randn((6, 1), dtype, device, 3.0).expand(6, 8),
    }


def index_layouts(device, index_dtype, dim):
    """index of logical shape [6, 8] (size 8 along dim) in several layouts."""
    size = 8 if dim == 1 else 6
    r = lambda shape: rand_index(shape, size, index_dtype, device)  # noqa: E731
    return {
        "contiguous": r((6, 8)),
        "transposed": r((8, 6)).t(),
        "sliced_offset": r((6, 11))[:, 1:9],
        "inner_stride_2": r((6, 16))[:, ::2],
        "expanded_rows": r((1, 8)).expand(6, 8),
        "expanded_all": r((1, 1)).expand(6, 8),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_strided_inputs(device, dtype, preference):
    with bt.preference(preference):
        for dim in (0, 1):
            for sname, src in src_layouts(device, dtype).items():
                for iname, index in index_layouts(device, torch.int64, dim).items():
                    run_and_check(src, dim, index)
            src = randn((6, 8), dtype, device)
            index = index_layouts(device, torch.int32, dim)["sliced_offset"]
            # non-contiguous dout: transposed, and expanded (stride 0) as from .sum()
            run_and_check(src, dim, index, dout=randn((8, 6), dtype, device).t())
            run_and_check(src, dim, index, dout=randn((1, 8), dtype, device).expand(6, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim(device):
    """0-dim src and index behave as torch.gather (a 0-dim tensor counts as 1-d of size 1)."""
    s0 = randn((), torch.float64, device)
    s1 = randn((5,), torch.float64, device)
    cases = [(s0, torch.tensor(0)), (s0, torch.tensor([0, 0, 0])), (s1, torch.tensor(3)),
             (s1, torch.tensor([4, 0, 4]))]
    for src, index in cases:
        index = index.to(device)
        for dim in (0, -1):
            out = bt.gather(src, dim, index)
            expected = torch.gather(src, dim, index)
            assert out.shape == expected.shape and torch.equal(out, expected)
            x = src.clone().requires_grad_()
            (g,) = torch.autograd.grad(bt.gather(x, dim, index), x, torch.ones_like(expected) * 1.5)
            xr = src.clone().requires_grad_()
            (gr,) = torch.autograd.grad(torch.gather(xr, dim, index), xr, torch.ones_like(expected) * 1.5)
            assert g.shape == src.shape and torch.equal(g, gr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_empty_tensors(device, preference):
    cases = [((3, 4), (0, 4), 0), ((3, 4), (3, 0), 1), ((0, 4), (0, 2), 1), ((3, 0), (2, 0), 0),
             ((3, 0), (3, 0), 1), ((2, 3, 4), (2, 0, 4), 1)]
    with bt.preference(preference):
        for src_shape, index_shape, dim in cases:
            src = randn(src_shape, torch.float32, device).requires_grad_()
            index = rand_index(index_shape, src_shape[dim], device=device)
            out = bt.gather(src, dim, index)
            assert out.shape == index.shape
            (dsrc,) = torch.autograd.grad(out, src, torch.empty_like(out))
            # nothing is scattered: every element of dsrc must be written with zero
            assert dsrc.shape == src.shape and torch.equal(dsrc, torch.zeros_like(dsrc))
            d = ops.gather_backward(torch.empty(index_shape, device=device), dim, index, list(src_shape))
            assert torch.equal(d, torch.zeros(src_shape, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_duplicate_indices(device, dtype, preference):
    """Every index equal, and a few hot rows: dsrc sums all their contributions."""
    with bt.preference(preference):
        src = randn((5, 9), dtype, device)
        index = torch.full((40, 9), 3, dtype=torch.int64, device=device)
        _, dsrc = run_and_check(src, 0, index)
        assert torch.equal(dsrc[[0, 1, 2, 4]], torch.zeros_like(dsrc[[0, 1, 2, 4]]))
        hot = rand_index((300, 9), 2, device=device) * 2  # rows 0 and 2 only
        run_and_check(src, 0, hot)
        run_and_check(randn((9, 5), dtype, device), 1, hot.t().contiguous())


@pytest.mark.parametrize("device", DEVICES)
def test_int32_and_int64_agree(device):
    torch.use_deterministic_algorithms(True)  # bitwise-comparable backward on CUDA too
    for src_shape, index_shape, dim in CASES:
        src, index = make_case(src_shape, index_shape, dim, torch.float32, torch.int64, device)
        dout = randn(index_shape, torch.float32, device)
        a = bt.gather(src, dim, index)
        b = bt.gather(src, dim, index.int())
        assert torch.equal(a, b)
        da = ops.gather_backward(dout, dim, index, list(src_shape))
        db = ops.gather_backward(dout, dim, index.int(), list(src_shape))
        assert torch.equal(da, db)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_gradcheck_and_gradgradcheck_float64(device, preference):
    with bt.preference(preference):
        for src_shape, index_shape, dim in [((4, 5), (6, 5), 0), ((3, 4, 5), (3, 2, 7), -1)]:
            src = randn(src_shape, torch.float64, device).requires_grad_()
            index = rand_index(index_shape, src_shape[dim], device=device)
            fn = lambda t: bt.gather(t, dim, index)  # noqa: E731
            assert torch.autograd.gradcheck(fn, (src,))
            assert torch.autograd.gradgradcheck(fn, (src,))
        src_t = randn((7, 4), torch.float64, device).t().requires_grad_()
        index_t = rand_index((6, 4), 7, device=device).t()
        assert torch.autograd.gradcheck(lambda t: bt.gather(t, 1, index_t), (src_t,))
        # gather_backward's own gradient (it is linear in dout: its adjoint is gather)
        index = rand_index((3, 6), 4, device=device)
        dout = randn((3, 6), torch.float64, device).requires_grad_()
        fn_b = lambda g: ops.gather_backward(g, 1, index, [3, 4])  # noqa: E731
        assert torch.autograd.gradcheck(fn_b, (dout,))
        assert torch.autograd.gradgradcheck(fn_b, (dout,))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_is_gather(device):
    src = randn((4, 6), torch.float64, device).requires_grad_()
    index = rand_index((4, 9), 6, device=device)
    dout = randn((4, 9), torch.float64, device).requires_grad_()
    (dsrc,) = torch.autograd.grad(bt.gather(src, 1, index), src, dout, create_graph=True)
    g = randn((4, 6), torch.float64, device)
    (ddout,) = torch.autograd.grad(dsrc, dout, g)
    assert torch.equal(ddout, torch.gather(g, 1, index))
    assert not index.requires_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """With deterministic algorithms on, PyTorch fills fresh outputs with NaN: a kernel that
    skips an element (or a dsrc element no index points at) leaves a NaN behind."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    for dim in (0, 1):
        for src in src_layouts(device, dtype).values():
            for index in index_layouts(device, torch.int64, dim).values():
                x = src.detach().requires_grad_()
                out = bt.gather(x, dim, index)
                (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
                assert torch.isfinite(out).all() and torch.isfinite(dx).all()
    # index smaller than src in a non-gather dim: dsrc lines no index reaches are zeros
    for dim in (0, 1):
        src = randn((5, 8), dtype, device).requires_grad_()
        index = rand_index((3, 4), src.size(dim), device=device)
        (dx,) = torch.autograd.grad(bt.gather(src, dim, index), src, randn((3, 4), dtype, device))
        assert torch.isfinite(dx).all()
        rest = dx[3:] if dim == 1 else dx[:, 4:]
        assert torch.equal(rest, torch.zeros_like(rest))
    # index touching only row 0: all other rows of dsrc must be exact zeros
    src = randn((5, 8), dtype, device).requires_grad_()
    (dx,) = torch.autograd.grad(bt.gather(src, 0, torch.zeros(3, 8, dtype=torch.long, device=device)),
                                src, randn((3, 8), dtype, device))
    assert torch.equal(dx[1:], torch.zeros_like(dx[1:]))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_are_copied(device):
    src = randn((4, 6), torch.float32, device)
    src[0, 1], src[2, 3], src[3, 0] = float("nan"), float("inf"), float("-inf")
    index = rand_index((4, 10), 6, device=device)
    index[0, 0], index[2, 5], index[3, 9] = 1, 3, 0
    torch.testing.assert_close(bt.gather(src, 1, index), torch.gather(src, 1, index), equal_nan=True)
    dout = randn((4, 10), torch.float32, device)
    dout[1, 2] = float("nan")
    d = ops.gather_backward(dout, 1, index, [4, 6])
    expected = torch.zeros(4, 6, device=device).scatter_add_(1, index, dout)
    torch.testing.assert_close(d, expected, equal_nan=True)


# ---- out-of-range indices -------------------------------------------------------------

OOB_MSG = r"index {v} is out of bounds for dim {d} with size {s}"


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_cpu_extreme_indices_raise(index_dtype):
    """The CPU check's unsigned arithmetic (v | (size - 1 - v)) at the index type's extremes,
    along dim (a run of one src row) and across it, among in-range indices."""
    info = torch.iinfo(index_dtype)
    src = randn((6, 8), torch.float32, "cpu")
    for bad in (info.min, info.max, info.min + 1, 8, -1):
        index = rand_index((6, 40), 8, index_dtype)
        index[3, 17] = bad
        with pytest.raises(IndexError, match=OOB_MSG.format(v=bad, d=1, s=8)):
            bt.gather(src, 1, index)
        index_t = rand_index((40, 8), 6, index_dtype)
        index_t[29, 5] = bad
        with pytest.raises(IndexError, match=OOB_MSG.format(v=bad, d=0, s=6)):
            bt.gather(src, 0, index_t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", [12, -1, -9])
def test_cpu_out_of_range_raises_at_once(dtype, index_dtype, bad):
    src = randn((6, 8), dtype, "cpu").requires_grad_()
    index = rand_index((6, 5), 8, index_dtype)
    index[2, 3] = bad
    msg = "baracuda::gather: " + OOB_MSG.format(v=bad, d=1, s=8)
    with pytest.raises(IndexError, match=msg):
        bt.gather(src, 1, index)
    with pytest.raises(IndexError, match=msg):
        bt.gather(src, -1, index)
    with pytest.raises(IndexError, match="baracuda::gather_backward: " + OOB_MSG.format(v=bad, d=1, s=8)):
        ops.gather_backward(randn((6, 5), dtype, "cpu"), 1, index, [6, 8])
    index_t = rand_index((5, 8), 6, index_dtype)
    index_t[4, 7] = bad if bad != 12 else 6
    with pytest.raises(IndexError, match=OOB_MSG.format(v=bad if bad != 12 else 6, d=0, s=6)):
        bt.gather(src, 0, index_t)
    # size(dim) == 0: every index is out of range
    with pytest.raises(IndexError, match=OOB_MSG.format(v=0, d=1, s=0)):
        bt.gather(torch.empty(3, 0), 1, torch.zeros(3, 2, dtype=index_dtype))
    with pytest.raises(IndexError, match="gather_backward: " + OOB_MSG.format(v=0, d=1, s=0)):
        ops.gather_backward(torch.ones(3, 2), 1, torch.zeros(3, 2, dtype=index_dtype), [3, 0])


def cuda_usable_after_error():
    """The context is not poisoned: plain torch work and our ops still give right answers."""
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close((x * 2 + 1).cpu(), x.cpu() * 2 + 1)
    src = randn((7, 9), torch.float32, "cuda")
    index = rand_index((7, 4), 9, device="cuda")
    assert torch.equal(bt.gather(src, 1, index), torch.gather(src, 1, index))
    dout = randn((7, 4), torch.float32, "cuda")
    torch.testing.assert_close(ops.gather_backward(dout, 1, index, [7, 9]),
                               torch.zeros(7, 9, device="cuda").scatter_add_(1, index, dout))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", [12, -3])
def test_cuda_out_of_range_forward(dtype, index_dtype, bad):
    layouts = {  # (src, index) for the three kernel layouts; index[2, 3] is made bad
        "rows_vec16": (randn((6, 8), dtype, "cuda"), rand_index((6, 4), 8, index_dtype, "cuda")),
        "rows": (randn((6, 7), dtype, "cuda"), rand_index((6, 5), 7, index_dtype, "cuda")),
        "strided": (randn((8, 6), dtype, "cuda").t(), rand_index((4, 6), 6, index_dtype, "cuda").t()),
    }
    for layout, (src, index) in layouts.items():
        assert bt.explain("gather", src, 1, index).variant == layout
        cols = src.size(1)
        index[2, 3] = bad
        out = bt.gather(src, 1, index)  # async mode: no error yet
        with pytest.raises(IndexError, match="baracuda::gather: " + OOB_MSG.format(v=bad, d=1, s=cols)):
            bt.check_errors()
        bt.check_errors()  # reported once, then cleared
        valid = torch.ones(index.shape, dtype=torch.bool, device="cuda")
        valid[2, 3] = False
        expected = torch.gather(src, 1, index.long().clamp(0, cols - 1))
        assert torch.equal(out[valid], expected[valid]), layout
        assert out[2, 3].item() == 0, layout
        cuda_usable_after_error()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("bad", [8, -1])
def test_cuda_out_of_range_backward(dtype, preference, dim, bad):
    """The bad element is skipped; every other contribution lands (atomic_lines for dim=1
    under "fastest", atomic_rows_vec16 for dim=0, sorted under "deterministic")."""
    shape = (12, 8) if dim == 1 else (8, 12)
    sizes = [12, 8] if dim == 1 else [8, 12]
    index = rand_index(shape, 8, device="cuda")
    index[4, 5] = bad
    dout = randn(shape, dtype, "cuda")
    with bt.preference(preference):
        d = ops.gather_backward(dout, dim, index, sizes)
        with pytest.raises(IndexError, match="baracuda::gather_backward: " + OOB_MSG.format(v=bad, d=dim, s=8)):
            bt.check_errors()
    keep = dout.clone()
    keep[4, 5] = 0
    expected = torch.zeros(sizes, dtype=torch.float64, device="cuda").scatter_add_(
        dim, index.clamp(0, 7), keep.double())
    baseline = torch.zeros(sizes, dtype=dtype, device="cuda").scatter_add_(dim, index.clamp(0, 7), keep)
    assert_close_to_reference(d, expected, baseline, f"dsrc with a bad index ({preference}, dim {dim})")
    cuda_usable_after_error()


@requires_cuda
def test_cuda_error_surfaces_at_the_next_call():
    src = randn((4, 8), torch.float32, "cuda")
    index = rand_index((4, 8), 8, device="cuda")
    bad = index.clone()
    bad[1, 1] = 100
    bt.gather(src, 1, bad)
    torch.cuda.synchronize()  # the bad kernel has finished: the next call sees its record
    with pytest.raises(IndexError, match=r"baracuda::gather: index 100 is out of bounds for dim 1 with size 8 "
                                         r"\(recorded on cuda:\d+ by a gather kernel"):
        bt.gather(src, 1, index)
    assert torch.equal(bt.gather(src, 1, index), torch.gather(src, 1, index))  # cleared
    ops.gather_backward(randn((4, 8), torch.float32, "cuda"), 1, bad, [4, 8])
    torch.cuda.synchronize()
    with pytest.raises(IndexError, match=r"baracuda::gather_backward: index 100 .*skipped that element"):
        bt.gather(src, 1, index)


@requires_cuda
def test_cuda_many_bad_indices_report_one():
    src = randn((64, 32), torch.float32, "cuda")
    index = rand_index((64, 4096), 32, device="cuda")
    index[::3] += 32  # thousands of blocks with bad indices
    out = bt.gather(src, 1, index)
    with pytest.raises(IndexError, match=r"index (3[2-9]|[4-6]\d) is out of bounds for dim 1 with size 32"):
        bt.check_errors()
    ok = index < 32
    assert torch.equal(out[ok], torch.gather(src, 1, index.clamp(max=31))[ok])
    assert torch.equal(out[~ok], torch.zeros_like(out[~ok]))
    cuda_usable_after_error()


@requires_cuda
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_cuda_sync_mode_raises_at_once(preference):
    assert bt._C.get_index_checks() == "async"
    bt.set_index_checks("sync")
    assert bt._C.get_index_checks() == "sync"
    src = randn((5, 8), torch.bfloat16, "cuda")
    index = rand_index((5, 3), 8, device="cuda")
    bad = index.clone()
    bad[4, 2] = -2
    with bt.preference(preference):
        with pytest.raises(IndexError, match="baracuda::gather: " + OOB_MSG.format(v=-2, d=1, s=8)):
            bt.gather(src, 1, bad)
        with pytest.raises(IndexError, match="baracuda::gather_backward: " + OOB_MSG.format(v=-2, d=1, s=8)):
            ops.gather_backward(randn((5, 3), torch.bfloat16, "cuda"), 1, bad, [5, 8])
        assert torch.equal(bt.gather(src, 1, index), torch.gather(src, 1, index))
    bt.check_errors()  # nothing left over
    cuda_usable_after_error()


def test_index_check_mode_errors():
    assert bt._C.get_index_checks() == "async"
    with pytest.raises(ValueError, match="mode must be 'async' or 'sync', got 'eager'"):
        bt.set_index_checks("eager")
    bt.check_errors()  # nothing recorded: quiet (also without CUDA)
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        bt.check_errors("cpu")
    if HAS_CUDA:
        bt.check_errors(0)
        bt.check_errors("cuda")


# ---- plans -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_explain_gather(device):
    src = randn((16, 32), torch.bfloat16, device)
    index = rand_index((16, 8), 32, torch.int32, device)
    info = bt.explain("gather", src, 1, index)
    assert info.family == "gather" and info.op == "gather"
    assert info.dtype == "bfloat16" and info.index_dtype == "int32"
    assert info.backend == device and info.deterministic and info.bit_stable
    assert info.workspace_bytes == 0
    assert info.name.startswith("gather.gather/bfloat16+int32/")
    dout = randn((16, 8), torch.bfloat16, device)
    b = bt.explain("gather_backward", dout, 1, index.long(), [16, 32])
    assert b.op == "gather_backward" and b.index_dtype == "int64" and b.accumulator == "float32"
    b64 = bt.explain(ops.gather_backward, dout.double(), 1, index, [16, 32])
    assert b64.accumulator == "float64" and b64.math_precision == "float64"
    if device == "cpu":
        assert info.variant in ("rows", "strided")
        assert b.variant == "lines" and b.deterministic and b.bit_stable
    with pytest.raises(TypeError, match="index must be int32 or int64, got float32"):
        bt.explain("gather", src, 1, index.float())


@requires_cuda
def test_explain_cuda_variants():
    src = randn((16, 32), torch.float32, "cuda")
    expect = {  # index for dim=0 (values < 16), by the variant it must take
        "rows_vec16": rand_index((12, 32), 16, device="cuda"),
        "rows": rand_index((12, 31), 16, device="cuda"),
        "strided": rand_index((32, 12), 16, device="cuda").t(),
    }
    for variant, index in expect.items():
        assert bt.explain("gather", src, 0, index).variant == variant
        dout = randn(index.shape, torch.float32, "cuda")
        assert bt.explain("gather_backward", dout, 0, index, [16, 32]).variant == "atomic_" + variant
    # int32 rows with a 16-byte-misaligned start (offset 1 element) cannot use vectors
    assert bt.explain("gather", src, 1, rand_index((16, 17), 32, torch.int32, "cuda")[:, 1:]).variant == "rows"
    assert bt.explain("gather", src, 1, rand_index((16, 8), 32, device="cuda")).variant == "rows_vec16"
    # dim = dsrc's innermost dim and a line that fits in shared memory: one block per line
    for index in (rand_index((16, 8), 32, device="cuda"), rand_index((8, 16), 32, device="cuda").t()):
        dout = randn(index.shape, torch.float32, "cuda")
        assert bt.explain("gather_backward", dout, 1, index, [16, 32]).variant == "atomic_lines"
        assert bt.explain("gather_backward", dout, -1, index, [16, 32]).workspace_bytes == 0
    assert bt.explain("gather_backward", randn((4, 5, 1), torch.float32, "cuda"), 1,
                      rand_index((4, 5, 1), 7, device="cuda"), [4, 7, 1]).variant == "atomic_lines"
    # a line too long for shared memory (44 KiB of float32 accumulators) falls back
    idx = rand_index((2, 8), 20000, device="cuda")
    assert bt.explain("gather_backward", randn((2, 8), torch.float32, "cuda"), 1, idx,
                      [2, 11264]).variant == "atomic_lines"
    assert bt.explain("gather_backward", randn((2, 8), torch.float32, "cuda"), 1, idx,
                      [2, 11265]).variant == "atomic_rows_vec16"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_explain_backward_algorithm_follows_preference(dtype):
    half = dtype in (torch.float16, torch.bfloat16)
    index = rand_index((64, 16), 40, device="cuda")
    cases = [  # (args, fastest variant, its workspace bytes)
        ((randn((64, 16), dtype, "cuda"), 1, index, [64, 40]), "atomic_lines", 0),
        ((randn((64, 16), dtype, "cuda"), 0, index, [40, 16]), "atomic_rows_vec16",
         40 * 16 * 4 if half else 0),
    ]
    for args, variant, ws in cases:
        fast = bt.explain("gather_backward", *args)
        assert fast.variant == variant and not fast.deterministic and not fast.bit_stable
        assert fast.accumulator == ("float64" if dtype == torch.float64 else "float32")
        assert fast.workspace_bytes == ws and fast.preference == "fastest"
        torch.use_deterministic_algorithms(True)
        det = bt.explain("gather_backward", *args)
        assert det.variant == "sorted" and det.deterministic and det.bit_stable
        assert det.preference == "deterministic" and det.workspace_bytes >= 4 * 64 * 16 * 4
        torch.use_deterministic_algorithms(False)
        with bt.preference("deterministic"):
            assert bt.explain("gather_backward", *args).variant == "sorted"
        assert bt.explain("gather_backward", *args).variant == variant
        assert bt.explain("gather_backward", *args, preference="deterministic").variant == "sorted"
    # the forward is a copy: one kernel whatever the preference
    with bt.preference("deterministic"):
        assert bt.explain("gather", randn((64, 40), dtype, "cuda"), 1, index).deterministic


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_atomic_lines(dtype):
    """The one-block-per-line backward: vector and scalar loads, lines no index reaches,
    line lengths not a multiple of 4, heavy duplicates, a line at the shared-memory limit."""
    cases = [  # (src shape, index, dim)
        ((12, 40), rand_index((12, 24), 40, device="cuda"), 1),            # vector loads
        ((12, 40), rand_index((24, 12), 40, device="cuda").t(), 1),        # strided along dim
        ((12, 41), rand_index((12, 30), 41, device="cuda")[:, 1:], 1),     # misaligned, odd line
        ((12, 40), rand_index((5, 8), 40, device="cuda"), -1),              # lines left for the memset
        ((3, 4, 9, 1), rand_index((3, 2, 50, 1), 9, device="cuda"), 2),     # dim before a size-1 dim
        ((6, 16), torch.full((6, 500), 7, device="cuda"), 1),               # one hot slot per line
        ((2, 5632 if dtype == torch.float64 else 11264), rand_index((2, 3000), 11264, device="cuda") %
         (5632 if dtype == torch.float64 else 11264), 1),                   # 44 KiB accumulator
    ]
    for src_shape, index, dim in cases:
        src = randn(src_shape, dtype, "cuda")
        dout = randn(index.shape, dtype, "cuda")
        assert bt.explain("gather_backward", dout, dim, index, list(src_shape)).variant == "atomic_lines"
        run_and_check(src, dim, index, dout)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("switch", ["torch", "baracuda"])
def test_deterministic_backward_is_bitwise_stable(dtype, switch):
    """Many duplicate indices: the sorted kernel gives the same bits on every run, and the
    same bits as the CPU kernel (both sum each element's contributions in ascending source
    order, in float32 / float64)."""
    if switch == "torch":
        torch.use_deterministic_algorithms(True)
    else:
        bt.set_preference("deterministic")
    src = randn((8, 64), dtype, "cuda")
    for index, dim in ((rand_index((2000, 64), 8, device="cuda"), 0),
                       (rand_index((8, 3000), 5, device="cuda"), 1),
                       (rand_index((1, 4096), 64, device="cuda").expand(8, 4096), 1)):
        x = src.clone().requires_grad_()
        dout = randn(index.shape, dtype, "cuda", 10.0)
        out = bt.gather(x, dim, index)
        runs = [torch.autograd.grad(out, x, dout, retain_graph=True)[0] for _ in range(3)]
        assert all(torch.equal(runs[0], r) for r in runs[1:])
        cpu = ops.gather_backward(dout.cpu(), dim, index.cpu(), list(src.shape))
        assert torch.equal(runs[0].cpu(), cpu)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_cuda_agree(dtype):
    src = randn((40, 70), dtype, "cpu", 3.0)
    index = rand_index((40, 90), 70)
    dout = randn((40, 90), dtype, "cpu")
    for dim, idx, d in ((1, index, dout), (0, rand_index((90, 70), 40), randn((90, 70), dtype, "cpu"))):
        assert torch.equal(bt.gather(src.cuda(), dim, idx.cuda()).cpu(), bt.gather(src, dim, idx))
        gc = ops.gather_backward(d, dim, idx, list(src.shape))
        gg = ops.gather_backward(d.cuda(), dim, idx.cuda(), list(src.shape)).cpu()
        tol = dict(atol=1e-5, rtol=1e-5) if dtype in (torch.float32, torch.float64) else {}
        torch.testing.assert_close(gg, gc, **tol)


@requires_cuda
@pytest.mark.parametrize("preference", ["fastest", "deterministic"])
def test_cuda_graph_capture(preference):
    """No host synchronization inside the ops: forward and both backwards capture and replay."""
    bt.set_preference(preference)
    src = randn((64, 128), torch.bfloat16, "cuda").requires_grad_()
    index = rand_index((64, 96), 128, device="cuda")
    dout = randn((64, 96), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph
        for _ in range(2):
            (g,) = torch.autograd.grad(bt.gather(src, 1, index), src, dout)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = bt.gather(src, 1, index)
        (g,) = torch.autograd.grad(out, src, dout)
    with torch.no_grad():
        src.copy_(randn((64, 128), torch.bfloat16, "cuda"))
        index.copy_(rand_index((64, 96), 128, device="cuda"))
        dout.copy_(randn((64, 96), torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.gather(src.detach(), 1, index))
    expected = torch.zeros(64, 128, device="cuda").scatter_add_(1, index, dout.float())
    torch.testing.assert_close(g.float(), expected, atol=1e-2, rtol=1e-2)
    # an out-of-range index inside a replayed graph is recorded like any other
    index[0, 0] = 500
    graph.replay()
    with pytest.raises(IndexError, match="index 500 is out of bounds for dim 1 with size 128"):
        bt.check_errors()


@requires_cuda
def test_more_than_2_31_elements():
    """Offsets beyond int32 take the 64-bit variants (and 64-bit sort keys) and stay correct."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    rows, cols = 2**16 + 3, 2**15
    src = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    picked = torch.tensor([0, 1, 12345, 40000, 65535, rows - 2, rows - 1], device="cuda")
    index = picked.view(-1, 1).expand(-1, cols).contiguous()
    assert bt.explain("gather", src, 0, index).variant == "rows_vec16_i64"
    out = bt.gather(src, 0, index)
    assert torch.equal(out, src[picked])
    dout = torch.randn(index.shape, dtype=torch.bfloat16, device="cuda")
    del src, out
    for preference, variant in (("fastest", "atomic_rows_vec16_i64"), ("deterministic", "sorted_i64")):
        with bt.preference(preference):
            assert bt.explain("gather_backward", dout, 0, index, [rows, cols]).variant == variant
            d = ops.gather_backward(dout, 0, index, [rows, cols])
        assert torch.equal(d[picked], dout), preference  # distinct rows: one contribution each
        mask = torch.ones(rows, dtype=torch.bool, device="cuda")
        mask[picked] = False
        assert d[mask].abs().amax().item() == 0, preference
        del d, mask
        torch.cuda.empty_cache()


# ---- column slabs (CUDA) ---------------------------------------------------------------------
# Along a non-innermost dim of a src larger than about half of L2, the CUDA kernels walk
# column slabs (core/gather_plan.h). The shapes below are sized from the device's L2 so
# that the plan takes them; SLAB_COLS > 2 · 1024 (the widest slab) and not a multiple of
# 64 gives at least 3 slabs per row, the last one partial, whatever width the plan picks.

SLAB_COLS = 2348


def l2_bytes():
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)


def slab_rows(dtype, cols=SLAB_COLS):
    """src.size(dim) for which src [rows, cols] is about the size of L2 (the plan takes the
    slab variants from L2 / 2 up; the backward's float32 ring regions are as large or larger)."""
    return -(-l2_bytes() // (cols * (torch.finfo(dtype).bits // 8)))


def poison_next_block(nbytes):
    """Leaves a freed block of nbytes of all-ones bits (NaN in every float dtype) in the
    caching allocator, which hands it to the next allocation of that size: an output
    element a kernel does not write then reads as NaN."""
    torch.full((nbytes,), 255, dtype=torch.uint8, device="cuda")


def check_slab_variants(src, dim, index, forward, backward, dout=None):
    """explain names the slab variants; every element of out and dsrc is written (finite
    after poisoning); forward and gradient match the references."""
    assert bt.explain("gather", src, dim, index).variant == forward
    d = dout if dout is not None else randn(index.shape, src.dtype, "cuda")
    assert bt.explain("gather_backward", d, dim, index, list(src.shape)).variant == backward
    poison_next_block(index.numel() * src.element_size())
    assert torch.isfinite(bt.gather(src, dim, index)).all()
    poison_next_block(src.numel() * src.element_size())
    assert torch.isfinite(ops.gather_backward(d, dim, index, list(src.shape))).all()
    run_and_check(src, dim, index, dout)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_cuda_slabs_match_reference(dtype, index_dtype):
    n = slab_rows(dtype)
    rows = n // 2
    src = randn((n, SLAB_COLS), dtype, "cuda", 3.0)
    index = rand_index((rows, SLAB_COLS), n, index_dtype, "cuda")
    check_slab_variants(src, 0, index, "slab_vec16", "atomic_slab_vec16")
    # index rows 2349 elements apart: scalar index and value accesses
    index_odd = rand_index((rows, SLAB_COLS + 1), n, index_dtype, "cuda")[:, :SLAB_COLS]
    check_slab_variants(src, 0, index_odd, "slab", "atomic_slab")
    # more index rows than src rows (every src row read many times), negative dim
    index_long = rand_index((2 * n, SLAB_COLS), n, index_dtype, "cuda")
    check_slab_variants(src, -2, index_long, "slab_vec16", "atomic_slab_vec16")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_cuda_slabs_layouts(dtype):
    """Outer dims, inner dims that coalesce, index smaller than src in other dims (the
    backward zero-fills what no slab covers), a sliced src, stride-0 and transposed dout."""
    n = slab_rows(dtype, 1200)
    src3 = randn((2, n, 1200), dtype, "cuda")
    check_slab_variants(src3, 1, rand_index((2, n // 2, 1200), n, device="cuda"),
                        "slab_vec16", "atomic_slab_vec16")
    check_slab_variants(src3, 1, rand_index((1, n // 2, 1000), n, torch.int32, "cuda"),
                        "slab_vec16", "atomic_slab_vec16")
    check_slab_variants(src3, 1, rand_index((2, n // 2, 998), n, device="cuda"), "slab", "atomic_slab")
    del src3
    m = slab_rows(dtype)
    src4 = randn((m, 4, SLAB_COLS // 4), dtype, "cuda")
    check_slab_variants(src4, 0, rand_index((m // 2, 4, SLAB_COLS // 4), m, device="cuda"),
                        "slab_vec16", "atomic_slab_vec16")
    del src4
    # src rows 2360 apart from an odd offset (src is read element by element anyway)
    sliced = randn((m, SLAB_COLS + 12), dtype, "cuda")[:, 5:SLAB_COLS + 5]
    index = rand_index((m // 2, SLAB_COLS), m, device="cuda")
    check_slab_variants(sliced, 0, index, "slab_vec16", "atomic_slab_vec16")
    del sliced
    src = randn((m, SLAB_COLS), dtype, "cuda")
    dout = randn((1, SLAB_COLS), dtype, "cuda").expand(m // 2, SLAB_COLS)
    check_slab_variants(src, 0, index, "slab_vec16", "atomic_slab_vec16", dout=dout)
    dout_t = randn((SLAB_COLS, m // 2), dtype, "cuda").t()
    check_slab_variants(src, 0, index, "slab_vec16", "atomic_slab", dout=dout_t)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_cuda_slabs_out_of_range(dtype, index_dtype):
    """Bad indices inside slabs (the last, partial one too): never dereferenced, the
    forward writes 0, the backward skips them, and the first one is reported."""
    n = slab_rows(dtype)
    rows = n // 2
    src = randn((n, SLAB_COLS), dtype, "cuda")
    index = rand_index((rows, SLAB_COLS), n, index_dtype, "cuda")
    bad = [(rows // 2, 700, n), (3, SLAB_COLS - 5, -1), (rows - 1, SLAB_COLS - 1, 2**30)]
    valid = torch.ones(index.shape, dtype=torch.bool, device="cuda")
    for r, c, v in bad:
        index[r, c] = v
        valid[r, c] = False
    assert bt.explain("gather", src, 0, index).variant == "slab_vec16"
    out = bt.gather(src, 0, index)
    with pytest.raises(IndexError, match=r"baracuda::gather: index (-1|\d+) is out of bounds for dim 0 "
                                         rf"with size {n}"):
        bt.check_errors()
    clamped = index.long().clamp(0, n - 1)
    assert torch.equal(out[valid], torch.gather(src, 0, clamped)[valid])
    assert torch.equal(out[~valid], torch.zeros_like(out[~valid]))

    dout = randn(index.shape, dtype, "cuda")
    assert bt.explain("gather_backward", dout, 0, index, [n, SLAB_COLS]).variant == "atomic_slab_vec16"
    d = ops.gather_backward(dout, 0, index, [n, SLAB_COLS])
    with pytest.raises(IndexError, match=r"baracuda::gather_backward: index (-1|\d+) is out of bounds "
                                         rf"for dim 0 with size {n}"):
        bt.check_errors()
    keep = torch.where(valid, dout, torch.zeros_like(dout))
    expected = torch.zeros(n, SLAB_COLS, dtype=torch.float64, device="cuda").scatter_add_(
        0, clamped, keep.double())
    baseline = torch.zeros(n, SLAB_COLS, dtype=dtype, device="cuda").scatter_add_(0, clamped, keep)
    assert_close_to_reference(d, expected, baseline, "dsrc with bad indices in slabs")
    cuda_usable_after_error()


@requires_cuda
def test_cuda_slabs_workspace_and_preference():
    """The float16/bfloat16 slab backward accumulates in a ring of a few float32 slabs, not
    a float32 copy of dsrc; the deterministic preference keeps the sorted backward."""
    n = slab_rows(torch.bfloat16)
    index = rand_index((n // 2, SLAB_COLS), n, device="cuda")
    dout = randn(index.shape, torch.bfloat16, "cuda")
    info = bt.explain("gather_backward", dout, 0, index, [n, SLAB_COLS])
    assert info.variant == "atomic_slab_vec16" and not info.deterministic
    assert 0 < info.workspace_bytes < n * SLAB_COLS * 4 // 2
    f32 = bt.explain("gather_backward", dout.float(), 0, index, [n, SLAB_COLS])
    assert 0 < f32.workspace_bytes < 2**20  # the slab counters only
    det = bt.explain("gather_backward", dout, 0, index, [n, SLAB_COLS], preference="deterministic")
    assert det.variant == "sorted" and det.deterministic
    fwd = bt.explain("gather", torch.empty(n, SLAB_COLS, dtype=torch.bfloat16, device="cuda"), 0, index,
                     preference="deterministic")
    assert fwd.variant == "slab_vec16" and fwd.deterministic and fwd.workspace_bytes == 0


@requires_cuda
def test_cuda_slabs_graph_capture():
    """The slab kernels (and the backward's counter memset) capture and replay."""
    n = slab_rows(torch.bfloat16)
    src = randn((n, SLAB_COLS), torch.bfloat16, "cuda").requires_grad_()
    index = rand_index((n // 2, SLAB_COLS), n, device="cuda")
    dout = randn(index.shape, torch.bfloat16, "cuda")
    assert bt.explain("gather", src, 0, index).variant == "slab_vec16"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            (g,) = torch.autograd.grad(bt.gather(src, 0, index), src, dout)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = bt.gather(src, 0, index)
        (g,) = torch.autograd.grad(out, src, dout)
    for _ in range(2):  # replays reset the slab counters
        with torch.no_grad():
            src.copy_(randn((n, SLAB_COLS), torch.bfloat16, "cuda"))
            index.copy_(rand_index(index.shape, n, device="cuda"))
            dout.copy_(randn(index.shape, torch.bfloat16, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.gather(src.detach(), 0, index))
        expected = torch.zeros(n, SLAB_COLS, device="cuda").scatter_add_(0, index, dout.float())
        torch.testing.assert_close(g.float(), expected, atol=1e-2, rtol=1e-2)


@requires_cuda
def test_cuda_slabs_more_than_2_31_elements():
    """A slab-sized gather over a src of more than 2^31 elements takes the 64-bit slab
    variants and stays correct."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    rows, cols = 2**16 + 3, 2**15
    src = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    index = torch.randint(0, rows, (4100, cols), device="cuda")
    assert bt.explain("gather", src, 0, index).variant == "slab_vec16_i64"
    out = bt.gather(src, 0, index)
    assert torch.equal(out, torch.gather(src, 0, index))
    del src, out
    torch.cuda.empty_cache()
    dout = torch.randn(index.shape, dtype=torch.bfloat16, device="cuda")
    assert bt.explain("gather_backward", dout, 0, index, [rows, cols]).variant == "atomic_slab_vec16_i64"
    d = ops.gather_backward(dout, 0, index, [rows, cols])
    expected = torch.zeros(rows, cols, device="cuda").scatter_add_(0, index, dout.float())
    del dout, index
    torch.cuda.empty_cache()
    # bfloat16 rounding of float32 sums (relative 2^-9), plus slack for the summation order
    err = d.float().sub_(expected).abs_()
    del d
    tol = expected.abs_().mul_(2**-8).add_(1e-5)
    assert bool((err <= tol).all())
    del expected, err, tol
    torch.cuda.empty_cache()


@requires_cuda
def test_mixed_devices():
    with pytest.raises(RuntimeError, match=r"baracuda::gather: expected all tensors on one device"):
        bt.gather(torch.randn(3, 4, device="cuda"), 1, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"baracuda::gather_backward: expected all tensors on one device"):
        ops.gather_backward(torch.randn(3, 2), 1, torch.zeros(3, 2, dtype=torch.long, device="cuda"), [3, 4])
