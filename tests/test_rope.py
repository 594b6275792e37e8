"""RoPE (rope, rope_backward): forward and gradients against reference.py on every dtype,
layout, pair convention, rotary_dim and positions form; angle accuracy for large
positions; gradcheck and gradgradcheck; NaN/Inf; empty tensors; poisoned outputs;
compiled double backward; plan variants; CUDA-only checks. (Opcheck, torch.compile and
the bad-input table: tests/op_db.py, run by tests/test_ops.py.)"""
import math

import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES, FLOAT_DTYPES, HAS_CUDA, assert_close_to_reference, randn, requires_cuda

ops = torch.ops.baracuda


# ---- helpers -------------------------------------------------------------------------

def make_positions(kind, B, S, device, high=10**6):
    """None | "s" ([S]) | "bs" ([B, S]) | "neg" ([S] with negatives) | "expanded" ([B, S],
    stride 0 over B) | "strided" ([S] with stride 3) | "bs_t" ([B, S] transposed from [S, B])."""
    if kind is None:
        return None
    if kind == "s":
        return torch.randint(0, high, (S,), device=device)
    if kind == "bs":
        return torch.randint(0, high, (B, S), device=device)
    if kind == "neg":
        return torch.randint(-high, high, (S,), device=device)
    if kind == "expanded":
        return torch.randint(0, high, (S,), device=device).expand(B, S)
    if kind == "strided":
        return torch.randint(0, high, (3 * S,), device=device)[::3]
    if kind == "bs_t":
        return torch.randint(0, high, (S, B), device=device).t()
    raise ValueError(kind)


POSITION_KINDS = [None, "s", "bs", "neg", "expanded", "strided", "bs_t"]


def expected_strides(x):
    """The output layout rule: x's strides when x is non-overlapping and dense (torch's
    rule, as empty_like(preserve_format) applies it), else contiguous."""
    return x.stride() if non_overlapping_and_dense(x) else torch.empty(x.shape).stride()


def non_overlapping_and_dense(x):
    if x.numel() == 0:
        return True
    dims = sorted((i for i in range(x.dim()) if x.shape[i] >= 2), key=lambda i: x.stride(i))
    need = 1
    for i in dims:
        if x.stride(i) != need:
            return False
        need *= x.shape[i]
    return True


def angle_ulps(x, positions):
    """Extra float64 tolerance, in ulps of the largest value: θ = p·inv_freq is only known
    to about |p|·eps (inv_freq = base^(−2i/R) differs by an ulp or two between libms: torch's
    pow, glibc's and CUDA's), which moves a float64 output by |x|·|p|·eps. Negligible for
    the float32 compute of the other dtypes."""
    if x.dtype != torch.float64:
        return 0.0
    pmax = x.shape[2] if positions is None else (positions.abs().max().item() if positions.numel() else 0)
    return 4.0 * pmax


def run_and_check(x, positions=None, interleaved=True, rotary_dim=None, base=10000.0, dy=None):
    """Our forward and backward on x (any layout) against reference.py in float64 and in
    x's dtype; also the rope_backward op on its own, and the output layout rule."""
    x = x.detach().requires_grad_()
    y = bt.rope(x, positions, base, interleaved, rotary_dim)
    if dy is None:
        dy = randn(y.shape, x.dtype, x.device)
    (dx,) = torch.autograd.grad(y, x, dy)

    x64 = x.detach().double().requires_grad_()
    y64 = ref.rope(x64, positions, base, interleaved, rotary_dim)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())

    xl = x.detach().clone().requires_grad_()
    yl = ref.rope(xl, positions, base, interleaved, rotary_dim)
    (dxl,) = torch.autograd.grad(yl, xl, dy)

    pos = None if positions is None else tuple(positions.shape)
    what = (f"{x.dtype} {tuple(x.shape)} strides={x.stride()} interleaved={interleaved} "
            f"rotary_dim={rotary_dim} positions={pos} base={base}")
    assert y.dtype == x.dtype and y.device == x.device and y.shape == x.shape
    assert y.stride() == expected_strides(x), f"output strides {y.stride()} for x strides {x.stride()}"
    floor = 8 + angle_ulps(x, positions)
    assert_close_to_reference(y, y64, yl, "y of " + what, floor)
    assert_close_to_reference(dx, dx64, dxl, "dx of " + what, floor)
    # The backward op directly, on a dy of any layout.
    dxo = ops.rope_backward(dy, positions, base, interleaved, -1 if rotary_dim is None else rotary_dim)
    assert dxo.stride() == expected_strides(dy)
    assert_close_to_reference(dxo, ref.rope_backward(dy.double(), positions, base, interleaved, rotary_dim),
                              ref.rope_backward(dy, positions, base, interleaved, rotary_dim),
                              "rope_backward of " + what, floor)


# (shape [B, H, S, D], rotary_dim): odd sizes, partial rotary (even and odd D), tiny and
# vector-friendly head dims.
CASES = [((2, 3, 5, 8), None), ((1, 4, 7, 6), 4), ((3, 2, 4, 16), None), ((2, 3, 5, 7), 4),
         ((1, 1, 1, 2), None), ((2, 2, 9, 64), None), ((2, 2, 6, 128), 64), ((1, 3, 4, 12), 12),
         ((2, 1, 3, 10), 2), ((2, 2, 5, 80), 32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_matches_reference(device, dtype, interleaved):
    for i, (shape, rd) in enumerate(CASES):
        kind = POSITION_KINDS[i % len(POSITION_KINDS)]
        pos = make_positions(kind, shape[0], shape[2], device)
        run_and_check(randn(shape, dtype, device, 2.0), pos, interleaved, rd)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", POSITION_KINDS)
def test_positions_forms(device, kind):
    for interleaved in (True, False):
        for rd in (None, 6):
            pos = make_positions(kind, 3, 5, device)
            run_and_check(randn((3, 2, 5, 10), torch.float32, device, 2.0), pos, interleaved, rd)


@pytest.mark.parametrize("device", DEVICES)
def test_positions_equivalences(device):
    """No positions == arange(S); [B, S] rows all equal (or expanded) == [S]; bit for bit."""
    x = randn((3, 4, 6, 16), torch.float32, device)
    s = torch.arange(6, device=device)
    for il in (True, False):
        assert torch.equal(bt.rope(x, None, interleaved=il), bt.rope(x, s, interleaved=il))
        p = torch.randint(-50, 10**6, (6,), device=device)
        y = bt.rope(x, p, interleaved=il)
        assert torch.equal(y, bt.rope(x, p.expand(3, 6), interleaved=il))
        assert torch.equal(y, bt.rope(x, p.repeat(3, 1), interleaved=il))
        # θ = 0 everywhere: the identity, exactly
        assert torch.equal(bt.rope(x, torch.zeros(6, dtype=torch.long, device=device), interleaved=il), x)


@pytest.mark.parametrize("device", DEVICES)
def test_bases_and_rotary_dims(device):
    x = randn((2, 3, 7, 24), torch.float32, device, 2.0)
    pos = make_positions("s", 2, 7, device)
    for base in (10000.0, 500000.0, 1e6, 2.0, 1.0, 0.5):
        for rd in (None, 2, 8, 22, 24):
            for il in (True, False):
                run_and_check(x, pos, il, rd, base=base)
    # rotary_dim == D is the same as the default
    assert torch.equal(bt.rope(x, pos, rotary_dim=24), bt.rope(x, pos))


def layouts(device, dtype, B=2, H=3, S=5, D=16):
    """x of logical shape [B, H, S, D] in several memory layouts."""
    return {
        "contiguous": randn((B, H, S, D), dtype, device, 2.0),
        "bshd_transposed": randn((B, S, H, D), dtype, device, 2.0).transpose(1, 2),
        "shbd_permuted": randn((S, H, B, D), dtype, device, 2.0).permute(2, 1, 0, 3),
        "feature_slice": randn((B, H, S, D + 8), dtype, device, 2.0)[..., :D],
        "feature_offset": randn((B, H, S, D + 2), dtype, device, 2.0)[..., 1:D + 1],
        "feature_stride_2": randn((B, H, S, 2 * D), dtype, device, 2.0)[..., ::2],
        "d_outer": randn((D, B, H, S), dtype, device, 2.0).permute(1, 2, 3, 0),
        "every_other_s": randn((B, H, 2 * S, D), dtype, device, 2.0)[:, :, ::2],
        "expanded_heads": randn((B, 1, S, D), dtype, device, 2.0).expand(B, H, S, D),
        "size_one_odd_stride": randn((1, H, S, D), dtype, device, 2.0).as_strided(
            (1, H, S, D), (12345, S * D, D, 1)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_strided_inputs(device, dtype, interleaved):
    for name, x in layouts(device, dtype).items():
        B, H, S, D = x.shape
        for kind, rd in ((None, None), ("bs", 8), ("s", 12)):
            pos = make_positions(kind, B, S, device)
            run_and_check(x, pos, interleaved, rd)
        # non-contiguous dy: transposed, and expanded (stride 0) as from .sum()
        dy_t = randn((B, S, H, D), dtype, device).transpose(1, 2)
        run_and_check(x, None, interleaved, None, dy=dy_t)
        dy_e = randn((1, 1, 1, D), dtype, device).expand(B, H, S, D)
        run_and_check(x, None, interleaved, 8, dy=dy_e)


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_layout_kept(device):
    """y of a [B, S, H, D] tensor's transpose(1, 2) is laid out [B, S, H, D] (no copy, no
    layout change), so y.transpose(1, 2) is contiguous again."""
    q = randn((2, 7, 4, 32), torch.bfloat16, device).transpose(1, 2)
    y = bt.rope(q)
    assert y.stride() == q.stride()
    assert y.transpose(1, 2).is_contiguous()
    x = q.detach().requires_grad_()
    out = bt.rope(x)
    dy = randn((2, 7, 4, 32), torch.bfloat16, device).transpose(1, 2)
    (dx,) = torch.autograd.grad(out, x, dy)
    assert dx.stride() == dy.stride()


# ---- accuracy of the angles -----------------------------------------------------------

def pair_relative_error(y, y64, interleaved, R):
    """max over rotated features of |y − y64| / |pair|, where |pair| is the norm of the
    feature's (u, v) pair (what the rotation preserves)."""
    e = (y.double() - y64).abs()[..., :R]
    t = y64[..., :R]
    if interleaved:
        n = (t[..., 0::2] ** 2 + t[..., 1::2] ** 2).sqrt().repeat_interleave(2, dim=-1)
    else:
        h = R // 2
        n = (t[..., :h] ** 2 + t[..., h:] ** 2).sqrt()
        n = torch.cat((n, n), dim=-1)
    return (e / n).max().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_large_positions_float32_accuracy(device, interleaved):
    """docs/ops.md: angles match a float64 reference for positions up to 1,000,000 (and far
    beyond): float32 relative error <= 1e-5, forward and backward. (An implementation that
    forms θ in float32 misses this by orders of magnitude at p ~ 1e6.)"""
    S = 64
    pos = torch.cat([torch.tensor([0, 1, 999_999, 1_000_000, 2**24 + 1, 2**24 - 1, 123_456_789,
                                   -1_000_000, 2**31 + 11, 10**12 + 7]),
                     torch.randint(0, 1_000_001, (S - 10,))]).to(device)
    for base, D, rd in ((10000.0, 128, None), (500000.0, 128, None), (10000.0, 64, 32), (1e6, 256, None)):
        x = randn((2, 3, S, D), torch.float32, device)
        y = bt.rope(x, pos, base, interleaved, rd)
        R = D if rd is None else rd
        y64 = ref.rope(x.double(), pos, base, interleaved, rd)
        err = pair_relative_error(y, y64, interleaved, R)
        assert err <= 1e-5, f"forward: relative error {err:.3g} (base={base}, D={D}, R={R})"
        torch.testing.assert_close(y[..., R:], x[..., R:], rtol=0, atol=0)
        dx = ops.rope_backward(x, pos, base, interleaved, -1 if rd is None else rd)
        dx64 = ref.rope_backward(x.double(), pos, base, interleaved, rd)
        err = pair_relative_error(dx, dx64, interleaved, R)
        assert err <= 1e-5, f"backward: relative error {err:.3g} (base={base}, D={D}, R={R})"


@pytest.mark.parametrize("device", DEVICES)
def test_large_positions_float64_accuracy(device):
    """float64 data get float64 sin/cos of θ (float32 trig would be off by ~1e-7); the
    bound is what θ's own uncertainty allows (see angle_ulps)."""
    pos = torch.tensor([0, 1, 12345, 1_000_000, -777_777], device=device)
    x = randn((1, 2, 5, 64), torch.float64, device)
    for il in (True, False):
        y = bt.rope(x, pos, 10000.0, il)
        y64 = ref.rope(x, pos, 10000.0, il)
        assert pair_relative_error(y, y64, il, 64) <= 4 * 1_000_000 * 2.2e-16 + 1e-14


@pytest.mark.parametrize("device", DEVICES)
def test_rotation_is_orthogonal(device):
    """rope_backward(rope(x)) == x, and norms of pairs are kept."""
    x = randn((2, 3, 9, 32), torch.float64, device)
    pos = make_positions("bs", 2, 9, device)
    for il in (True, False):
        y = bt.rope(x, pos, interleaved=il, rotary_dim=24)
        torch.testing.assert_close(ops.rope_backward(y, pos, 10000.0, il, 24), x, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_half_split_matches_hugging_face(device):
    """interleaved=False is the rotate_half convention: HF's apply_rotary_pos_emb with
    cos/sin = cat(freqs, freqs), including GPT-NeoX-style partial rotary."""
    B, H, S, D = 2, 4, 11, 64
    x = randn((B, H, S, D), torch.float64, device)
    pos = make_positions("bs", B, S, device, high=4096)
    for rd in (None, 16):
        R = D if rd is None else rd
        theta = ref.rope_angles(S, pos, R, 10000.0, device)
        emb = torch.cat((theta, theta), dim=-1)
        torch.testing.assert_close(bt.rope(x, pos, interleaved=False, rotary_dim=rd),
                                   ref.rope_hf(x, emb.cos(), emb.sin()), rtol=1e-10, atol=1e-10)


# ---- autograd ------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_gradcheck_float64(device, interleaved):
    for shape, kind, rd in (((2, 3, 4, 8), None, None), ((2, 2, 3, 10), "bs", 6), ((1, 2, 5, 6), "s", 4)):
        pos = make_positions(kind, shape[0], shape[2], device, high=1000)
        x = randn(shape, torch.float64, device).requires_grad_()
        fn = lambda t: bt.rope(t, pos, 10000.0, interleaved, rd)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))
        dy = randn(shape, torch.float64, device).requires_grad_()
        bw = lambda t: ops.rope_backward(t, pos, 10000.0, interleaved, -1 if rd is None else rd)  # noqa: E731
        assert torch.autograd.gradcheck(bw, (dy,))
        assert torch.autograd.gradgradcheck(bw, (dy,))
    xt = randn((2, 5, 3, 8), torch.float64, device).transpose(1, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: bt.rope(t, None, 10.0, interleaved), (xt,))
    assert torch.autograd.gradgradcheck(lambda t: bt.rope(t, None, 10.0, interleaved), (xt,))


@pytest.mark.parametrize("device", DEVICES)
def test_higher_order_gradients_match_reference(device):
    """d²/dx² of a nonlinear loss through rope matches the reference's."""
    pos = make_positions("s", 2, 4, device, high=100)
    for il in (True, False):
        x = randn((2, 2, 4, 8), torch.float64, device).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        (g,) = torch.autograd.grad((bt.rope(x, pos, interleaved=il) ** 3).sum(), x, create_graph=True)
        (gr,) = torch.autograd.grad((ref.rope(xr, pos, interleaved=il) ** 3).sum(), xr, create_graph=True)
        torch.testing.assert_close(g, gr)
        (h,) = torch.autograd.grad((g * g).sum(), x)
        (hr,) = torch.autograd.grad((gr * gr).sum(), xr)
        torch.testing.assert_close(h, hr)


# ---- special values, empty tensors, unwritten outputs -----------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_nan_inf_propagate_like_reference(device, interleaved):
    x = randn((2, 2, 6, 16), torch.float32, device, 3.0)
    x[0, 0, 0, 0] = float("nan")   # position 0 (θ = 0)
    x[0, 1, 3, 5] = float("nan")
    x[1, 0, 2, 2] = float("inf")
    x[1, 1, 4, 9] = float("-inf")
    x[1, 1, 5, 14] = float("inf")  # pass-through feature with rotary_dim=12
    for rd in (None, 12):
        y = bt.rope(x, None, interleaved=interleaved, rotary_dim=rd)
        torch.testing.assert_close(y, ref.rope(x, None, interleaved=interleaved, rotary_dim=rd),
                                   equal_nan=True)
        assert_close_to_reference(y, ref.rope(x.double(), None, interleaved=interleaved, rotary_dim=rd),
                                  ref.rope(x, None, interleaved=interleaved, rotary_dim=rd), "nan/inf")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tensors(device):
    for shape, pos_shape in (((0, 3, 4, 8), (0, 4)), ((2, 0, 4, 8), (4,)), ((2, 3, 0, 8), (2, 0)),
                             ((2, 3, 0, 8), (0,)), ((0, 0, 0, 2), None)):
        pos = None if pos_shape is None else torch.zeros(pos_shape, dtype=torch.long, device=device)
        for il in (True, False):
            x = torch.empty(shape, device=device).requires_grad_()
            y = bt.rope(x, pos, interleaved=il)
            assert y.shape == x.shape
            (dx,) = torch.autograd.grad(y, x, torch.empty_like(y))
            assert dx.shape == x.shape
            assert ops.rope_backward(torch.empty(shape, device=device), pos).shape == x.shape
    # an empty transposed view keeps its strides, as empty_like would
    xt = torch.empty(2, 0, 3, 8, device=device).transpose(1, 2)
    assert bt.rope(xt).stride() == torch.empty_like(xt).stride()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """With deterministic algorithms on, PyTorch fills fresh outputs with NaN: a kernel that
    skips an element (a pass-through feature, a tail position, a head) leaves a NaN."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    xs = list(layouts(device, dtype).values()) + [randn((3, 5, 7, 14), dtype, device),
                                                  randn((2, 3, 37, 40), dtype, device)]
    for x in xs:
        D = x.shape[-1]
        for il in (True, False):
            for rd in (None, 2, D - 2):
                xg = x.detach().requires_grad_()
                y = bt.rope(xg, make_positions("bs", x.shape[0], x.shape[2], device), interleaved=il,
                            rotary_dim=rd)
                (dx,) = torch.autograd.grad(y, xg, torch.ones_like(y))
                assert torch.isfinite(y).all() and torch.isfinite(dx).all(), (x.shape, x.stride(), il, rd)


# (shape [B, H, S, D], rotary_dim) for the CPU row kernels: head dims and rotated widths
# that are not multiples of the 8- and 16-feature vector steps (and are), partial rotary
# with short and long pass-through tails, and S past one block of positions (16 at most)
# with a short last block.
VECTOR_TAIL_CASES = [((2, 3, 37, 2), None), ((1, 2, 19, 6), None), ((2, 1, 17, 14), 10),
                     ((1, 2, 33, 18), None), ((2, 2, 5, 30), 6), ((1, 3, 20, 34), 32),
                     ((1, 1, 40, 48), 16), ((2, 2, 9, 62), 46), ((1, 2, 18, 66), None),
                     ((2, 1, 7, 130), 128), ((1, 2, 3, 136), 98), ((1, 1, 35, 256), None)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_cpu_row_kernel_tails(dtype, interleaved):
    """Every vector step and tail of the CPU row kernel (unit feature stride, contiguous
    and [B, S, H, D] storage) against float64, with fresh outputs NaN-filled (deterministic
    mode), so an element the kernel skips fails; positions none, [S] and per-batch [B, S]."""
    torch.use_deterministic_algorithms(True)
    for i, (shape, rd) in enumerate(VECTOR_TAIL_CASES):
        B, H, S, D = shape
        kind = (None, "s", "bs")[i % 3]
        pos = make_positions(kind, B, S, "cpu")
        run_and_check(randn(shape, dtype, "cpu", 2.0), pos, interleaved, rd)
        bshd = randn((B, S, H, D), dtype, "cpu", 2.0).transpose(1, 2)
        run_and_check(bshd, make_positions("bs", B, S, "cpu"), interleaved, rd)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_cpu_row_kernel_matches_strided_fallback(dtype, interleaved):
    """The same values through the unit-stride row kernel and through the strided scalar
    loop (feature stride 2, and a feature-outer layout) agree within a rounding or two, and
    both meet the float64 reference."""
    torch.use_deterministic_algorithms(True)
    for shape, rd in (((2, 3, 21, 38), 22), ((1, 2, 18, 64), None), ((2, 2, 9, 136), 98)):
        B, H, S, D = shape
        pos = make_positions("bs", B, S, "cpu")
        x = randn(shape, dtype, "cpu", 2.0)
        wide = torch.zeros((B, H, S, 2 * D), dtype=dtype)
        wide[..., ::2] = x
        strided = wide[..., ::2]
        d_outer = x.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0)
        assert strided.stride(-1) == 2 and d_outer.stride(-1) == B * H * S
        y = bt.rope(x, pos, interleaved=interleaved, rotary_dim=rd)
        eps = 2 * torch.finfo(dtype).eps * y.abs().max().item() + 1e-300
        for xs in (strided, d_outer):
            run_and_check(xs, pos, interleaved, rd)
            ys = bt.rope(xs, pos, interleaved=interleaved, rotary_dim=rd)
            assert (ys.double() - y.double()).abs().max().item() <= eps, (dtype, shape, xs.stride())


# ---- modules and wrappers ----------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_rope_qk_and_module(device):
    B, S, D = 2, 9, 32
    q = randn((B, 8, S, D), torch.float32, device)
    k = randn((B, S, 2, D), torch.float32, device).transpose(1, 2)  # GQA: 2 KV heads, [B, S, H, D] storage
    pos = make_positions("bs", B, S, device)
    for il in (True, False):
        qr, kr = bt.rope_qk(q, k, pos, 500000.0, il, 16)
        torch.testing.assert_close(qr, bt.rope(q, pos, 500000.0, il, 16), rtol=0, atol=0)
        torch.testing.assert_close(kr, bt.rope(k, pos, 500000.0, il, 16), rtol=0, atol=0)
        m = bt.nn.RotaryEmbedding(D, base=500000.0, interleaved=il, rotary_dim=16)
        mq, mk = m(q, k, pos)
        torch.testing.assert_close(mq, qr, rtol=0, atol=0)
        torch.testing.assert_close(mk, kr, rtol=0, atol=0)
        assert "head_dim=32" in repr(m) and f"interleaved={il}" in repr(m)
    # gradients flow to both
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    a, b = bt.nn.RotaryEmbedding(D)(qg, kg)
    (a.sum() + b.sum()).backward()
    assert qg.grad is not None and kg.grad is not None
    with pytest.raises(ValueError, match=r"baracuda_torch.rope_qk: q \[B, Hq, S, D\] and k"):
        bt.rope_qk(q, randn((B, 2, S + 1, D), torch.float32, device))
    with pytest.raises(ValueError, match="expected head_dim 16"):
        bt.nn.RotaryEmbedding(16)(q, k)
    for args in ((0,), (8, 10000.0, True, 10), (8, 10000.0, True, 3), (7,)):
        with pytest.raises(ValueError, match="RotaryEmbedding: need 0 < rotary_dim <= head_dim"):
            bt.nn.RotaryEmbedding(*args)
    with pytest.raises(ValueError, match="base must be finite and > 0"):
        bt.nn.RotaryEmbedding(8, base=-1.0)


def test_wrapper_defaults():
    x = randn((1, 2, 3, 8), torch.float32, "cpu")
    assert torch.equal(bt.rope(x), ops.rope(x))
    assert torch.equal(bt.rope(x, rotary_dim=4, interleaved=False), ops.rope(x, None, 10000.0, False, 4))
    assert torch.equal(bt.rope(x, base=10000), ops.rope(x))  # an int base is fine
    # the default pair layout is half-split (rotate_half), in the wrappers, the op and nn
    half = ops.rope(x, None, 10000.0, False, -1)
    assert torch.equal(bt.rope(x), half) and torch.equal(ops.rope(x), half)
    assert not torch.equal(bt.rope(x), bt.rope(x, interleaved=True))
    assert torch.equal(bt.rope_qk(x, x)[0], half)
    assert bt.nn.RotaryEmbedding(8).interleaved is False
    assert "rope" in bt.__all__ and "rope_qk" in bt.__all__


# ---- torch.compile --------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_compile_double_backward(device):
    torch._dynamo.reset()

    def fn(x):
        (g,) = torch.autograd.grad((bt.rope(x, None, 100.0, False) ** 3).sum(), x, create_graph=True)
        return g

    x = randn((1, 2, 4, 8), torch.float64, device).requires_grad_()
    torch.testing.assert_close(torch.compile(fn)(x), fn(x))


@requires_cuda
def test_mixed_devices():
    with pytest.raises(RuntimeError, match=r"baracuda::rope: expected all tensors on one device, but x is on "
                                           r"cuda:0 and positions is on cpu"):
        bt.rope(torch.randn(1, 2, 3, 4, device="cuda"), torch.arange(3))
    with pytest.raises(RuntimeError, match=r"baracuda::rope_backward: expected all tensors on one device"):
        ops.rope_backward(torch.randn(1, 2, 3, 4), torch.arange(3, device="cuda"))


# ---- plans ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    x = torch.randn(2, 4, 8, 64, dtype=torch.bfloat16, device=device)
    pos = torch.arange(8, device=device)
    info = bt.explain("rope", x)  # the default pair layout is half-split
    assert info.family == "rope" and info.op == "half_split" and info.dtype == "bfloat16"
    assert bt.explain("rope", x, None, 10000.0, True).op == "interleaved"
    assert info.index_dtype is None and info.backend == device
    # CUDA: the cos/sin table, one float pair per (position, pair) [per batch when positions
    # are [B, S]], plus 15 bytes of alignment slack; the CPU kernel needs none.
    cuda = device == "cuda"
    assert info.workspace_bytes == (8 * 32 * 8 + 15 if cuda else 0)
    pos_b = torch.randint(0, 100, (2, 8), device=device)
    assert bt.explain("rope", x, pos_b).workspace_bytes == (2 * 8 * 32 * 8 + 15 if cuda else 0)
    # [B, S] positions expanded from [1, S] are shared: one table for all batches
    assert bt.explain("rope", x, pos_b[:1].expand(2, 8)).workspace_bytes == (8 * 32 * 8 + 15 if cuda else 0)
    assert bt.explain("rope", x.double(), rotary_dim=16).workspace_bytes == (8 * 8 * 16 + 15 if cuda else 0)
    assert bt.explain("rope", x[:, :, :0]).workspace_bytes == 0
    assert info.math_precision == "float32" and info.accumulator == "float32"
    assert info.deterministic and info.bit_stable
    info = bt.explain(ops.rope_backward, x.double(), pos, interleaved=False)
    assert info.op == "half_split_backward" and info.index_dtype == "int64"
    assert info.math_precision == "float64" and info.name.startswith("rope.half_split_backward/float64+int64/")
    assert bt.explain("rope", x, preference="deterministic").preference == "deterministic"
    if device == "cpu":
        lay = layouts(device, torch.float32)
        assert bt.explain("rope", lay["contiguous"]).variant == "rows"
        assert bt.explain("rope", lay["bshd_transposed"]).variant == "rows"
        assert bt.explain("rope", lay["feature_stride_2"]).variant == "strided"
        assert bt.explain("rope", lay["d_outer"]).variant == "strided"


@requires_cuda
def test_cuda_variants_chosen():
    """The plan picks 16-byte vectors wherever sizes, strides and addresses allow, and the
    linear traversal for interleaved pairs when positions vary faster than heads in memory
    and positions are not per batch."""
    for dtype in FLOAT_DTYPES:
        lay = layouts("cuda", dtype, D=32)
        expect = {"contiguous": "vec16", "bshd_transposed": "vec16", "shbd_permuted": "vec16",
                  "feature_slice": "vec16", "every_other_s": "vec16", "expanded_heads": "vec16",
                  "size_one_odd_stride": "vec16", "feature_offset": "rows",
                  "feature_stride_2": "strided", "d_outer": "strided"}
        linear = {"contiguous", "feature_slice", "every_other_s", "size_one_odd_stride"}
        for name, variant in expect.items():
            for il in (True, False):
                want = variant + ("_linear" if il and name in linear else "")
                got = bt.explain("rope", lay[name], interleaved=il).variant
                assert got == want, (dtype, name, il, got)
                assert bt.explain("rope_backward", lay[name], interleaved=il).variant == want
                B, _, S, _ = lay[name].shape
                if B > 1:  # per-batch positions: the row walk, which reuses table entries
                    pos_b = torch.arange(B * S, device="cuda").view(B, S)
                    assert bt.explain("rope", lay[name], pos_b, interleaved=il).variant == variant
        # partial rotary: vectors only when R (interleaved) or R/2 (half-split) is a multiple of
        # the vector width
        vec = 16 // lay["contiguous"].element_size()
        x = lay["contiguous"]
        assert bt.explain("rope", x, None, 10000.0, True, 2 * vec).variant == "vec16_linear"
        assert bt.explain("rope", x, None, 10000.0, False, 2 * vec).variant == "vec16"
        if vec > 2:
            assert bt.explain("rope", x, None, 10000.0, True, vec + 2).variant == "rows"
            assert bt.explain("rope", x, None, 10000.0, False, vec).variant == "rows"


# ---- CUDA only -------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_cuda_agree(dtype):
    for shape, kind, rd, il in (((2, 8, 33, 128), "bs", None, True), ((2, 8, 33, 128), "s", 64, False),
                                ((3, 5, 17, 24), None, 16, True), ((1, 4, 9, 10), "neg", 6, False)):
        x = randn(shape, dtype, "cpu", 2.0)
        pos = make_positions(kind, shape[0], shape[2], "cpu")
        dy = randn(shape, dtype, "cpu")
        xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
        posg = None if pos is None else pos.cuda()
        yc, yg = bt.rope(xc, pos, 10000.0, il, rd), bt.rope(xg, posg, 10000.0, il, rd)
        yc.backward(dy)
        yg.backward(dy.cuda())
        # float64: positions up to 1e6 make θ uncertain to ~1e6·eps (pow differs between libms)
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else (
            dict(atol=1e-8, rtol=1e-8) if dtype == torch.float64 else {})
        torch.testing.assert_close(yg.cpu(), yc, **tol)
        torch.testing.assert_close(xg.grad.cpu(), xc.grad, **tol)


@requires_cuda
@pytest.mark.parametrize("interleaved", [True, False])
def test_cuda_decomposition(interleaved):
    """Shapes that exercise every part of the CUDA work split (a thread owns one (position,
    row item) column and walks rows_per_thread rows (b, h); a block covers up to 256
    columns × row chunks). rows_per_thread as planned on an H200 (132 SMs; other GPUs plan
    other values, and the shapes still cover the paths): 16 or 8 rows with a remainder
    shorter than a step and rows that cross from one batch to the next (B·H rows), or per
    batch (H rows); narrow problems with fewer than 256 columns (several row chunks per
    block, a column count that is not a power of two, a single column); decode-like S = 1;
    pass-through items; scalar and float64 paths."""
    cases = [
        ((3, 47, 4096, 64), None, None, torch.bfloat16),   # 141 rows: 16 (8) rows/thread + 13 (5)
        ((2, 37, 4096, 64), "bs", None, torch.bfloat16),   # per-batch: 37 rows, 8 rows/thread + 5
        ((16, 3, 4096, 64), "s", 48, torch.float16),       # 4 rows/thread across batches of 3 heads
        ((2, 3, 37, 64), "s", None, torch.bfloat16),
        ((3, 2, 29, 128), "bs", 96, torch.float16),        # per-batch, partial rotary
        ((64, 32, 1, 128), "s", None, torch.bfloat16),     # decode: 16 columns, 2048 rows
        ((1, 300, 1, 8), "s", None, torch.bfloat16),       # one column, 300 rows over 2 blocks
        ((2, 5, 3, 24), None, 16, torch.float16),          # 9 columns (rotation and pass-through)
        ((16, 64, 3, 64), "bs", None, torch.float32),      # per-batch with many heads
        ((1, 2, 5, 4096), "s", None, torch.float32),       # long rows
        ((1, 2, 3, 8192), None, 4096, torch.bfloat16),     # long pass-through
        ((2, 2, 7, 6000), "s", 5998, torch.float32),       # scalar path (R % 4 != 0)
        ((1, 3, 19, 2048), "bs", None, torch.float64),     # f64 vectors
        ((2, 4, 1000, 16), None, 8, torch.bfloat16),       # small D, many positions
    ]
    for shape, kind, rd, dtype in cases:
        pos = make_positions(kind, shape[0], shape[2], "cuda")
        run_and_check(randn(shape, dtype, "cuda", 2.0), pos, interleaved, rd)
        xt = randn((shape[0], shape[2], shape[1], shape[3]), dtype, "cuda", 2.0).transpose(1, 2)
        run_and_check(xt, pos, interleaved, rd)
    # [S, H, B, D] storage: stepping from (b, H−1) to (b+1, 0) moves backwards in memory
    # (the row step's wrap term is negative; 32-bit offsets wrap modulo 2^32).
    B, H, S, D = 16, 3, 4096, 64
    xp = randn((S, H, B, D), torch.bfloat16, "cuda", 2.0).permute(2, 1, 0, 3)
    run_and_check(xp, make_positions("s", B, S, "cuda"), interleaved, None)


@requires_cuda
@pytest.mark.parametrize("interleaved", [True, False])
def test_cuda_narrow_columns_many_rows(interleaved):
    """One position (16 or 8 columns of row items, D = 128 bf16) and 272,384 rows: blocks of
    16 (32) columns × 16 (8) row chunks, each thread walking 16 rows across 133-head batches."""
    x = randn((2048, 133, 1, 128), torch.bfloat16, "cuda", 2.0)
    run_and_check(x, torch.randint(0, 10**6, (1,), device="cuda"), interleaved, None)


@requires_cuda
def test_cuda_back_to_back_calls_see_their_own_table():
    """Each call's streaming kernel must read the cos/sin table its own table kernel wrote:
    back-to-back calls with different positions (the caching allocator hands every call the
    same workspace block, so a read that raced ahead of the table kernel would see the
    previous call's table), no synchronization in between, forward and backward, then
    every result against the reference."""
    x = randn((2, 8, 512, 128), torch.float32, "cuda")
    results = []
    for i in range(24):
        pos = torch.randint(0, 10**6, (2, 512), device="cuda") if i % 3 else torch.randint(0, 10**6, (512,), device="cuda")
        il = i % 2 == 0
        out = bt.rope(x, pos, 10000.0, il) if i % 4 < 2 else ops.rope_backward(x, pos, 10000.0, il)
        results.append((i % 4 < 2, pos, il, out))
    torch.cuda.synchronize()
    for forward, pos, il, out in results:
        fn = ref.rope if forward else ref.rope_backward
        assert pair_relative_error(out, fn(x.double(), pos, 10000.0, il), il, 128) <= 1e-5, (forward, il)


@requires_cuda
def test_cuda_large_positions_benchmark_shape():
    """The benchmark's head dim and dtype with positions in the millions, both layouts."""
    x = randn((1, 8, 256, 128), torch.float32, "cuda")
    pos = torch.randint(0, 2**24 + 2, (256,), device="cuda")
    for il in (True, False):
        for xx in (x, x.transpose(1, 2).contiguous().transpose(1, 2)):
            y = bt.rope(xx, pos, 500000.0, il)
            y64 = ref.rope(xx.double(), pos, 500000.0, il)
            assert pair_relative_error(y, y64, il, 128) <= 1e-5
        xb = x.bfloat16()
        run_and_check(xb, pos, il, None, base=500000.0)


@requires_cuda
def test_cuda_graph_capture():
    """No host synchronization inside the ops: forward and backward capture and replay."""
    x = randn((2, 4, 64, 64), torch.bfloat16, "cuda").requires_grad_()
    pos = torch.randint(0, 10**6, (2, 64), device="cuda")
    dy = randn((2, 4, 64, 64), torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph
        for _ in range(2):
            (g,) = torch.autograd.grad(bt.rope(x, pos, interleaved=False), x, dy)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bt.rope(x, pos, interleaved=False)
        (g,) = torch.autograd.grad(y, x, dy)
    with torch.no_grad():
        x.copy_(randn((2, 4, 64, 64), torch.bfloat16, "cuda"))
        pos.copy_(torch.randint(0, 10**6, (2, 64), device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, bt.rope(x.detach(), pos, interleaved=False), rtol=0, atol=0)
    torch.testing.assert_close(g, ops.rope_backward(dy, pos, 10000.0, False), rtol=0, atol=0)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_large_with_positions(dtype):
    """The self-check's shapes, large enough that the table and streaming kernels could
    overlap (a programmatic dependent launch of the streaming kernel got them wrong):
    positions per batch with partial rotary, and [S] positions on a [B, S, H, D] view."""
    B, H, S, D = 4, 32, 2048, 128
    pos = torch.randint(0, 1_000_000, (B, S), device="cuda")
    for _ in range(3):  # fresh workspace contents each time
        for interleaved, rd, positions, transposed in ((False, D // 2, pos, False),
                                                       (True, None, pos[0], True)):
            if transposed:
                x = randn((B, S, H, D), dtype, "cuda").transpose(1, 2)
            else:
                x = randn((B, H, S, D), dtype, "cuda")
            y = bt.rope(x, positions, 10000.0, interleaved, rd)
            y64 = ref.rope(x.double(), positions, 10000.0, interleaved, rd)
            yl = ref.rope(x, positions, 10000.0, interleaved, rd)
            assert_close_to_reference(y, y64, yl, f"rope {dtype} interleaved={interleaved} R={rd}")


@requires_cuda
def test_cuda_non_default_stream_and_device_guard():
    x = randn((2, 4, 16, 32), torch.float32, "cuda")
    expected = bt.rope(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = bt.rope(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@requires_cuda
def test_more_than_2_31_elements():
    """Offsets beyond int32 take the 64-bit plan variant and stay correct, in both layouts."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    B, H, S, D = 2, 8, 65537, 2048  # 2^31 + 32768 elements
    pos_bs = torch.randint(0, 10**6, (B, S), device="cuda")
    # (per-batch positions: the row walk; [S] positions on [B, H, S, D]: the linear kernel
    # for interleaved pairs)
    for transposed, pos in ((False, pos_bs), (True, pos_bs), (False, pos_bs[0])):
        if transposed:
            x = torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        else:
            x = torch.randn(B, H, S, D, dtype=torch.bfloat16, device="cuda")
        assert x.numel() > 2**31

        def pos_at(b, s):
            return pos[b:b + 1, s:s + 1] if pos.dim() == 2 else pos[s:s + 1]

        for il in (True, False):
            linear = il and pos.dim() == 1 and not transposed
            want = "vec16_linear_i64" if linear else "vec16_i64"
            assert bt.explain("rope", x, pos, interleaved=il).variant == want
            y = bt.rope(x, pos, interleaved=il)
            assert y.stride() == x.stride()
            for b, h, s in ((0, 0, 0), (1, 7, S - 1), (1, 3, 40000), (0, 5, 2**15 + 1)):
                xs, ps = x[b:b + 1, h:h + 1, s:s + 1], pos_at(b, s)
                assert_close_to_reference(y[b:b + 1, h:h + 1, s:s + 1],
                                          ref.rope(xs.double(), ps, 10000.0, il), ref.rope(xs, ps, 10000.0, il),
                                          f"y[{b}, {h}, {s}] transposed={transposed} interleaved={il}")
            del y
            dx = ops.rope_backward(x, pos, 10000.0, il)
            for b, h, s in ((0, 0, 1), (1, 7, S - 1)):
                xs, ps = x[b:b + 1, h:h + 1, s:s + 1], pos_at(b, s)
                assert_close_to_reference(dx[b:b + 1, h:h + 1, s:s + 1],
                                          ref.rope_backward(xs.double(), ps, 10000.0, il),
                                          ref.rope_backward(xs, ps, 10000.0, il), f"dx[{b}, {h}, {s}]")
            del dx
        del x
        torch.cuda.empty_cache()
