"""Mamba-2 SSD chunk scan: the forward and all five gradients against the float64
sequential recurrence (reference.ssd_chunk_scan) on odd shapes, every dtype and
layout; the chunked reference; gradcheck; empty problems; NaN; poisoned outputs;
determinism; workspace bounds; the Mamba-2 mixer module (opcheck, torch.compile and
the bad-input table: tests/op_db.py, run by tests/test_ops.py). CUDA only: CPU agreement, D = N = 256, long sequences,
CUDA graphs, more than 2^31 elements.

Tolerances: the largest absolute error of each output against the float64 reference,
relative to the reference's largest magnitude (``rtol_for``):
  float64             1e-10 (CPU and CUDA)
  float32             1e-4 on both (the default CPU variant and CUDA run the chunked
                      algorithm with float32 states; it multiplies cumulative decays
                      exp(Σ dt·A) over a chunk). The CPU's "precise" variant (float64
                      recurrence) earns one rounding: test_ssd_cpu checks it.
  float16, bfloat16   2 eps of the dtype (≈2e-3, 1.6e-2): the result's rounding (½ eps)
                      plus float32 math (on CUDA sm_80+, "chunked_mma": tensor-core
                      products with float32 accumulation whose intermediate operands,
                      P = C·Bᵀ∘decay, decay-weighted x and dy and the chunk states, are
                      rounded to the dtype once). The same-dtype PyTorch reference (a
                      recurrence carried in half precision) is far worse, so
                      FlashAttention's 2x rule would accept much larger errors; this
                      bound is the stricter one.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES, FLOAT_DTYPES, assert_close_to_reference, compute_eps, requires_cuda

ops = torch.ops.baracuda
NAMES = ("dx", "ddt", "dA", "dB", "dC")

# (B, L, H, D, N, G, chunk): L not a multiple of the chunk, L < chunk, chunk 1, G = 1,
# G = H, 1 < G < H, odd D and N, the fast chunk sizes and odd ones.
CASES = [
    (2, 37, 4, 8, 6, 1, 16),
    (1, 10, 3, 3, 5, 3, 64),      # L < chunk, G = H, D = 3, N = 5
    (2, 9, 6, 4, 3, 2, 1),        # chunk 1, 1 < G < H
    (1, 130, 4, 8, 8, 2, 64),     # two chunks and a tail of 2
    (2, 64, 2, 5, 7, 1, 64),      # exactly one chunk
    (1, 100, 6, 4, 4, 3, 7),      # odd chunk
    (1, 300, 2, 8, 8, 1, 100),
    (1, 200, 2, 8, 4, 1, 128),
    (1, 257, 2, 16, 16, 2, 256),  # one step past a 256 chunk
]


def rtol_for(dtype, device):
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        return 1e-4
    return 2 * torch.finfo(dtype).eps


def check(actual, expected64, rtol, what):
    """|actual - expected| <= rtol · max|expected| elementwise; NaN/Inf where the reference has them."""
    assert_close_to_reference(actual, expected64, None, what, floor_ulps=rtol / compute_eps(actual.dtype))


def ssd_inputs(b, L, H, D, N, G, dtype, device):
    """x, dt, A, B, C with realistic values: dt = softplus(·) > 0 with one step in ten
    eight times larger (decays from ~0.7 down to ~0.05), A = -exp(·) < 0."""
    x = torch.randn(b, L, H, D, dtype=torch.float64)
    dt = F.softplus(torch.randn(b, L, H, dtype=torch.float64) - 1)
    dt = torch.where(torch.rand(b, L, H) < 0.1, dt * 8, dt)
    A = -torch.exp(0.5 * torch.randn(H, dtype=torch.float64))
    B = torch.randn(b, L, G, N, dtype=torch.float64)
    C = torch.randn(b, L, G, N, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype) for t in (x, dt, A, B, C)]


def reference_grads(inputs, dy, chunked=False):
    """y and the five gradients of the float64 reference, on the CPU."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in inputs]
    fn = ref.ssd_chunk_scan_chunked if chunked else ref.ssd_chunk_scan
    y = fn(*leaves)
    return y.detach(), torch.autograd.grad(y, leaves, dy.detach().cpu().double())


def run_and_check(inputs, chunk, what, dy=None, rtol=None):
    """Our forward and backward on `inputs` (any layout) against the float64 recurrence."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    x = leaves[0]
    y = bt.ssd_chunk_scan(*leaves, chunk_size=chunk)
    if dy is None:
        dy = torch.randn(y.shape, dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    y64, g64 = reference_grads(inputs, dy)
    rtol = rtol or rtol_for(x.dtype, x.device.type)
    assert y.dtype == x.dtype and y.device == x.device and y.is_contiguous()
    check(y, y64, rtol, "y of " + what)
    for name, g, e, t in zip(NAMES, grads, g64, inputs):
        assert g.shape == t.shape and g.dtype == t.dtype and g.is_contiguous(), name
        check(g, e, rtol, f"{name} of {what}")
    return y, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_reference(device, dtype):
    for case in CASES:
        b, L, H, D, N, G, Q = case
        run_and_check(ssd_inputs(b, L, H, D, N, G, dtype, device), Q, f"{dtype} {case}")


def test_chunked_reference_matches_sequential():
    """The two references compute one function (forward and gradients), for any L."""
    for b, L, H, D, N, G, Q in CASES + [(2, 5, 2, 3, 2, 2, 8), (1, 1, 1, 1, 1, 1, 1)]:
        inputs = ssd_inputs(b, L, H, D, N, G, torch.float64, "cpu")
        dy = torch.randn(b, L, H, D, dtype=torch.float64)
        y_seq, g_seq = reference_grads(inputs, dy)
        leaves = [t.clone().requires_grad_() for t in inputs]
        y_chk = ref.ssd_chunk_scan_chunked(*leaves, chunk_size=Q)
        g_chk = torch.autograd.grad(y_chk, leaves, dy)
        check(y_chk, y_seq, 1e-10, f"chunked reference y {(b, L, H, D, N, G, Q)}")
        for name, a, e in zip(NAMES, g_chk, g_seq):
            check(a, e, 1e-10, f"chunked reference {name}")


def strided_layouts(b, L, H, D, N, G, dtype, device):
    """(name, [x, dt, A, B, C]) in several memory layouts, none of them copied."""
    def pos(t):  # positive step sizes
        return F.softplus(t - 1)

    out = []
    # x, B, C and dt as slices of one input projection, as in a Mamba-2 layer.
    W = H * D + 2 * G * N + H
    proj = torch.randn(b, L, W, dtype=torch.float64)
    proj[..., -H:] = pos(proj[..., -H:])
    proj = proj.to(device=device, dtype=dtype)
    out.append(("projection slices", [
        proj[..., :H * D].unflatten(-1, (H, D)), proj[..., -H:],
        -torch.exp(torch.randn(H, dtype=torch.float64)).to(device=device, dtype=dtype),
        proj[..., H * D:H * D + G * N].unflatten(-1, (G, N)),
        proj[..., H * D + G * N:H * D + 2 * G * N].unflatten(-1, (G, N))]))
    # [B, H, L, ·] storage seen as [B, L, H, ·] (a transposed view).
    x, dt, A, B, C = ssd_inputs(b, L, H, D, N, G, dtype, device)
    out.append(("transposed", [
        x.transpose(1, 2).contiguous().transpose(1, 2), dt.transpose(1, 2).contiguous().transpose(1, 2),
        A, B.transpose(1, 2).contiguous().transpose(1, 2), C.transpose(1, 2).contiguous().transpose(1, 2)]))
    # Non-unit innermost strides, and offsets into a larger tensor.
    x2 = torch.zeros(b, L, H, 2 * D, dtype=dtype, device=device)
    x2[..., ::2] = x
    A2 = torch.zeros(2 * H, dtype=dtype, device=device)
    A2[1::2] = A
    C2 = torch.zeros(b, L, G, N + 3, dtype=dtype, device=device)
    C2[..., 3:] = C
    out.append(("inner strides", [x2[..., ::2], dt, A2[1::2], B.transpose(2, 3).contiguous().transpose(2, 3),
                                  C2[..., 3:]]))
    # Broadcast (stride 0) dims.
    out.append(("broadcast", [x, dt[..., :1].expand(b, L, H), A[:1].expand(H),
                              B[:, :1].expand(b, L, G, N), C]))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    b, L, H, D, N, G, Q = 2, 23, 4, 6, 5, 2, 8
    for name, inputs in strided_layouts(b, L, H, D, N, G, dtype, device):
        assert not all(t.is_contiguous() for t in inputs), name
        run_and_check(inputs, Q, f"{dtype} {name}")
    # Non-contiguous dy: expanded (stride 0, as from y.sum()) and transposed.
    inputs = ssd_inputs(b, L, H, D, N, G, dtype, device)
    dy_e = torch.randn(1, L, H, D, dtype=torch.float64).to(device=device, dtype=dtype).expand(b, L, H, D)
    run_and_check(inputs, Q, f"{dtype} expanded dy", dy=dy_e)
    dy_t = torch.randn(b, H, L, D, dtype=torch.float64).to(device=device, dtype=dtype).transpose(1, 2)
    run_and_check(inputs, Q, f"{dtype} transposed dy", dy=dy_t)


@pytest.mark.parametrize("device", DEVICES)
def test_only_some_inputs_need_gradients(device):
    x, dt, A, B, C = ssd_inputs(1, 12, 2, 3, 4, 1, torch.float64, device)
    x.requires_grad_()
    C.requires_grad_()
    y = bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=5)
    dy = torch.randn_like(y)
    gx, gC = torch.autograd.grad(y, [x, C], dy)
    _, g64 = reference_grads([x, dt, A, B, C], dy)
    check(gx, g64[0], 1e-10, "dx")
    check(gC, g64[4], 1e-10, "dC")


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    for b, L, H, D, N, G, Q in [(1, 5, 2, 3, 2, 1, 2), (2, 4, 4, 2, 3, 2, 3), (1, 3, 3, 2, 2, 3, 8)]:
        inputs = [t.requires_grad_() for t in ssd_inputs(b, L, H, D, N, G, torch.float64, device)]
        assert torch.autograd.gradcheck(lambda *t, q=Q: bt.ssd_chunk_scan(*t, chunk_size=q), inputs)
    # strided: slices of one projection
    _, strided = strided_layouts(1, 4, 2, 2, 3, 1, torch.float64, device)[0]
    strided = [t.detach().requires_grad_() for t in strided]
    assert torch.autograd.gradcheck(lambda *t: bt.ssd_chunk_scan(*t, chunk_size=3), strided)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises_clearly(device):
    x, dt, A, B, C = ssd_inputs(1, 4, 2, 2, 2, 1, torch.float64, device)
    x.requires_grad_()
    (g,) = torch.autograd.grad(bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=2).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="baracuda::ssd_chunk_scan: double backward is not implemented"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty_and_degenerate(device, dtype):
    """An extent of 0 among B, L, H, D, N: empty outputs, or exact zeros (a sum over an
    empty state); dA is [H] and zero even for an empty batch or sequence. Deterministic
    mode poisons fresh outputs with NaN, so an output left unwritten shows."""
    torch.use_deterministic_algorithms(True)
    for b, L, H, D, N, G in [(0, 5, 2, 3, 4, 1), (2, 0, 2, 3, 4, 2), (2, 5, 0, 3, 4, 1),
                             (2, 5, 2, 0, 4, 1), (2, 5, 2, 3, 0, 2), (0, 0, 0, 0, 0, 0)]:
        inputs = [t.requires_grad_() for t in ssd_inputs(b, L, H, D, N, G, dtype, device)]
        y = bt.ssd_chunk_scan(*inputs, chunk_size=4)
        assert y.shape == (b, L, H, D) and y.dtype == dtype
        assert torch.equal(y, torch.zeros_like(y))
        grads = torch.autograd.grad(y, inputs, torch.randn_like(y))
        for name, g, t in zip(NAMES, grads, inputs):
            assert g.shape == t.shape, name
            assert torch.equal(g, torch.zeros_like(g)), f"{name} of {(b, L, H, D, N, G)}"
        info = bt.explain("ssd_chunk_scan_backward", y, *inputs, chunk_size=4)
        assert info.variant == "zeros" and info.workspace_bytes == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    for b, L, H, D, N, G, Q in [(2, 37, 4, 8, 6, 2, 16), (1, 70, 2, 16, 8, 1, 64), (3, 5, 3, 3, 5, 3, 256)]:
        inputs = [t.requires_grad_() for t in ssd_inputs(b, L, H, D, N, G, dtype, device)]
        y = bt.ssd_chunk_scan(*inputs, chunk_size=Q)
        grads = ops.ssd_chunk_scan_backward(torch.ones_like(y), *[t.detach() for t in inputs], Q)
        assert torch.isfinite(y).all()
        for name, g in zip(NAMES, grads):
            assert torch.isfinite(g).all(), name


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_like_reference(device):
    """A NaN in x at (b, t, h, d) reaches y[b, t', h, d] for t' >= t. The CPU matches the
    recurrence exactly. The chunked CUDA kernel may also spread it to earlier steps of
    the same chunk (0 · NaN in its masked matmuls), never to another batch, head or
    feature or to an earlier chunk."""
    b, L, H, D, N, G, Q = 2, 40, 3, 4, 3, 1, 16
    x, dt, A, B, C = ssd_inputs(b, L, H, D, N, G, torch.float32, device)
    x[1, 21, 2, 1] = float("nan")
    y = bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=Q)
    y64 = ref.ssd_chunk_scan(*[t.cpu().double() for t in (x, dt, A, B, C)])
    nan_ref = y64.isnan()
    assert nan_ref[1, 21:, 2, 1].all() and nan_ref.sum() == L - 21
    if device == "cpu":
        check(y, y64, rtol_for(torch.float32, device), "y with a NaN in x")
        return
    nan = y.isnan().cpu()
    assert nan[nan_ref].all(), "a NaN of the reference is missing"
    allowed = torch.zeros_like(nan_ref)
    allowed[1, 16:, 2, 1] = True  # the NaN's chunk starts at 16
    assert not (nan & ~allowed).any(), "NaN spread outside its (batch, head, feature) or to an earlier chunk"
    keep = ~allowed
    check(y.cpu()[keep], y64[keep], rtol_for(torch.float32, device), "y away from the NaN")


@pytest.mark.parametrize("device", DEVICES)
def test_cpu_result_does_not_depend_on_chunk(device):
    """The chunk changes the order of operations only: results agree to the tolerance.
    The CPU's float64 recurrence ("precise") gives the same bits for every chunk size
    (the backward's recomputation from chunk-boundary states included)."""
    inputs = ssd_inputs(2, 50, 4, 5, 6, 2, torch.float32, device)
    dy = torch.randn(2, 50, 4, 5, device=device)
    outs = []
    for Q in (1, 7, 16, 50, 64, 1000):
        y = ops.ssd_chunk_scan(*inputs, Q)
        outs.append((y,) + tuple(ops.ssd_chunk_scan_backward(dy, *inputs, Q)))
    for other in outs[1:]:
        for a, e in zip(other, outs[0]):
            check(a, e.double(), rtol_for(torch.float32, device), "chunk-size independence")
    if device == "cpu":
        with bt.preference("precise"):
            outs = [(ops.ssd_chunk_scan(*inputs, Q),) + tuple(ops.ssd_chunk_scan_backward(dy, *inputs, Q))
                    for Q in (1, 7, 16, 50, 64, 1000)]
        for other in outs[1:]:
            for a, e in zip(other, outs[0]):
                assert torch.equal(a, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_bitwise(device, dtype):
    """Two runs give the same bits, forward and every gradient (dB and dC sum over the
    heads of a group, dA over the batch: in a fixed order, without atomics)."""
    torch.use_deterministic_algorithms(True)
    shape = (2, 600, 8, 64, 64, 1, 256) if device == "cuda" else (2, 60, 4, 8, 8, 2, 16)
    b, L, H, D, N, G, Q = shape
    inputs = ssd_inputs(b, L, H, D, N, G, dtype, device)
    dy = torch.randn(b, L, H, D, device=device, dtype=dtype)
    info = bt.explain("ssd_chunk_scan_backward", dy, *inputs, chunk_size=Q)
    assert info.deterministic and info.bit_stable and info.preference == "deterministic"
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = bt.ssd_chunk_scan(*leaves, chunk_size=Q)
        runs.append([y] + list(torch.autograd.grad(y, leaves, dy)))
    for name, a, e in zip(("y",) + NAMES, runs[0], runs[1]):
        assert torch.equal(a, e), f"{name} differs between two runs"


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    b, L, H, D, N, G, Q = 2, 1000, 4, 16, 8, 2, 128
    x, dt, A, B, C = ssd_inputs(b, L, H, D, N, G, torch.bfloat16, device)
    info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=Q)
    binfo = bt.explain(ops.ssd_chunk_scan_backward, x, x, dt, A, B, C, Q)
    assert info.family == binfo.family == "ssd_chunk_scan"
    assert info.op == "ssd_chunk_scan" and binfo.op == "ssd_chunk_scan_backward"
    assert info.dtype == "bfloat16" and info.backend == device
    assert info.deterministic and info.bit_stable and binfo.deterministic and binfo.bit_stable
    if device == "cpu":
        # The chunked algorithm in float32; the backward's workspace holds per-(b, h)
        # partial sums of dA, ddt_bias and dD [D], dB and dC summed over each group's heads
        # and, for a wave of (b, h) tasks (all 8 here: far below 256 MiB), per-head dB and
        # dC (two heads per group here), and 255 bytes of alignment slack; each task keeps
        # its own chunk states and packed x and dy.
        assert info.variant == binfo.variant == "chunked"
        assert info.math_precision == "float32" and info.accumulator == "float32"
        assert info.workspace_bytes == 0
        nc = math.ceil(L / Q)
        assert binfo.workspace_bytes == 4 * (b * H * (2 + D) + 2 * b * G * L * N + 2 * b * H * L * N) + 255
        # "precise": the float64 recurrence, with float64 chunk states and partials.
        pinfo = bt.explain(ops.ssd_chunk_scan_backward, x, x, dt, A, B, C, Q, preference="precise")
        assert pinfo.variant == "sequential" and pinfo.math_precision == "float64"
        assert pinfo.workspace_bytes == 8 * (b * H * nc * D * N + b * H * (2 + D)) + 255
    else:
        # bfloat16 (and float16) run on tensor cores from sm_80 on, float32 and float64
        # on the SIMT kernels. The backward takes the per-group products where their dCB
        # rows cost no more than the per-head products (4·Q'²·G <= 16·Q·D·H: 4·128²·2 =
        # 16·128·16·4 here), on wgmma where the device and the build have sm_90a.
        tc = torch.cuda.get_device_capability(x.device)[0] >= 8
        assert info.variant == ("chunked_mma" if tc else "chunked")
        assert binfo.variant in (("group_mma", "group_wgmma") if tc else ("chunked",)), binfo.variant
        if torch.cuda.get_device_capability(x.device)[0] < 9:
            assert binfo.variant != "group_wgmma"
        assert info.math_precision == "float32" and info.accumulator == "float32"
        half = bt.explain("ssd_chunk_scan", *[t.half() for t in (x, dt, A, B, C)])
        assert half.variant == info.variant
        f32 = bt.explain("ssd_chunk_scan", *[t.float() for t in (x, dt, A, B, C)])
        assert f32.variant == "chunked" and f32.math_precision == "float32"
        f64 = bt.explain("ssd_chunk_scan", *[t.double() for t in (x, dt, A, B, C)])
        assert f64.variant == "chunked" and f64.math_precision == "float64"
    assert info.name == f"ssd_chunk_scan.ssd_chunk_scan/bfloat16/{info.variant}/" + (
        "cpu" if device == "cpu" else f"cuda_sm{info.arch}")
    # "deterministic" changes nothing: every variant is deterministic already.
    assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, preference="deterministic").variant == info.variant


@pytest.mark.parametrize("device", DEVICES)
def test_backward_workspace_is_per_chunk(device):
    """O(B·H·⌈L/Q⌉·D·N) bytes: far below the B·H·L·D·N float32 per-step states of the
    seed's backward, on a long sequence."""
    b, L, H, D, N, G, Q = 1, 8192, 8, 64, 64, 1, 256
    x = torch.empty(b, L, H, D, device=device)
    dt, A = torch.empty(b, L, H, device=device), torch.empty(H, device=device)
    B = torch.empty(b, L, G, N, device=device)
    ws = bt.explain("ssd_chunk_scan_backward", x, x, dt, A, B, B, chunk_size=Q).workspace_bytes
    nc = math.ceil(L / Q)
    per_step_states = 4 * b * H * L * D * N
    # The CPU chunked backward adds input-sized copies (x and dy packed per head, per-head
    # dB and dC): 8·B·L·H·(D + N) bytes, still O(inputs).
    bound = 16 * b * H * nc * D * N + 64 * b * H * L + 64 * b * L * G * N + 2**20
    if device == "cpu":
        bound += 8 * b * L * H * (D + N)
    assert 0 < ws <= bound, (ws, bound)
    assert ws < per_step_states / (8 if device == "cpu" else 16)
    assert bt.explain("ssd_chunk_scan", x, dt, A, B, B, chunk_size=Q).workspace_bytes <= bound


def test_cpu_has_no_dim_limit():
    """D and N above 256 run on the CPU (the limit is the CUDA kernels')."""
    inputs = ssd_inputs(1, 6, 1, 300, 2, 1, torch.float32, "cpu")
    run_and_check(inputs, 4, "D = 300 on the CPU")
    inputs = ssd_inputs(1, 5, 2, 2, 260, 1, torch.float32, "cpu")
    run_and_check(inputs, 4, "N = 260 on the CPU")


# ---- CUDA only ----------------------------------------------------------------------


def cpu_truth(inputs, dy, chunk):
    """y and gradients from the CPU kernel in float64 (itself checked against the
    reference above): the ground truth for shapes too long for the Python loop."""
    args = [t.detach().cpu().double() for t in inputs]
    y = ops.ssd_chunk_scan(*args, chunk)
    return y, ops.ssd_chunk_scan_backward(dy.detach().cpu().double(), *args, chunk)


def check_against(inputs, chunk, truth, what, dy, rtol=None):
    y = ops.ssd_chunk_scan(*inputs, chunk)
    grads = ops.ssd_chunk_scan_backward(dy, *inputs, chunk)
    y64, g64 = truth
    rtol = rtol or rtol_for(inputs[0].dtype, inputs[0].device.type)
    check(y, y64, rtol, "y of " + what)
    for name, a, e in zip(NAMES, grads, g64):
        check(a, e, rtol, f"{name} of {what}")


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_cpu_agree(dtype):
    # The benchmark layouts (80 heads sharing one group: the tensor-core kernels split a
    # group's heads over blocks and cache C·Bᵀ), a chunk of 512 (more column tiles than
    # the C·Bᵀ cache holds), and odd D, N with head splits and a short last chunk.
    for b, L, H, D, N, G, Q in CASES + [(3, 300, 80, 64, 128, 1, 256), (2, 520, 32, 64, 64, 32, 256),
                                        (1, 1100, 4, 32, 48, 2, 512), (2, 300, 40, 72, 24, 2, 100)]:
        inputs = ssd_inputs(b, L, H, D, N, G, dtype, "cpu")
        dy = torch.randn(b, L, H, D, dtype=torch.float64).to(dtype)
        y_c = ops.ssd_chunk_scan(*inputs, Q)
        g_c = ops.ssd_chunk_scan_backward(dy, *inputs, Q)
        cuda_in = [t.cuda() for t in inputs]
        y_g = ops.ssd_chunk_scan(*cuda_in, Q)
        g_g = ops.ssd_chunk_scan_backward(dy.cuda(), *cuda_in, Q)
        rtol = rtol_for(dtype, "cuda")
        check(y_g, y_c.double(), rtol, f"CUDA vs CPU y {dtype} {(b, L, H, D, N, G, Q)}")
        for name, a, e in zip(NAMES, g_g, g_c):
            check(a, e.double(), rtol, f"CUDA vs CPU {name} {dtype} {(b, L, H, D, N, G, Q)}")


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_largest_dims(dtype):
    """D and N up to 256, both directions, and just past the limit a clear error."""
    for b, L, H, D, N, G, Q in [(1, 70, 2, 256, 256, 1, 64), (2, 40, 2, 256, 16, 2, 32),
                                (1, 33, 4, 16, 256, 2, 256), (1, 20, 2, 129, 200, 1, 8)]:
        inputs = ssd_inputs(b, L, H, D, N, G, dtype, "cuda")
        dy = torch.randn(b, L, H, D, dtype=torch.float64).to(device="cuda", dtype=dtype)
        check_against(inputs, Q, cpu_truth(inputs, dy, Q), f"{dtype} D={D} N={N}", dy)
    for D, N in [(257, 8), (8, 257), (512, 512)]:
        inputs = ssd_inputs(1, 4, 2, D, N, 1, dtype, "cuda")
        with pytest.raises(NotImplementedError,
                           match=rf"baracuda::ssd_chunk_scan: D and N up to 256 are wired on CUDA .*got D = {D} and N = {N}"):
            bt.ssd_chunk_scan(*inputs)
        with pytest.raises(NotImplementedError, match="baracuda::ssd_chunk_scan_backward: D and N up to 256"):
            ops.ssd_chunk_scan_backward(inputs[0], *inputs)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_99kb_device_keeps_every_stage_on_one_path(dtype):
    """A device whose blocks may opt into 99 KB of shared memory (sm_86, sm_89, sm_120;
    simulated by capping what the plans see): the staged tensor-core scan does not fit at N
    or D above 192, so the plan runs every stage on the SIMT kernels there (`explain`:
    chunked), forward and backward against the float64 recurrence over several chunks;
    at 192 the tensor cores stay. (Before, only the scan fell back to SIMT, at launch, and
    read the float32 state buffer, which with 16-bit inputs holds S_c, not H_c.)"""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernels need sm_80+")
    previous = bt._C._cuda_smem_optin_cap(99 * 1024)
    try:
        for b, L, H, D, N, G, Q in [(1, 300, 2, 64, 256, 1, 64), (1, 200, 2, 256, 64, 2, 64),
                                    (1, 150, 2, 64, 200, 1, 32)]:
            inputs = ssd_inputs(b, L, H, D, N, G, dtype, "cuda")
            assert bt.explain("ssd_chunk_scan", *inputs, chunk_size=Q).variant == "chunked", (D, N)
            assert bt.explain(ops.ssd_chunk_scan_backward, inputs[0], *inputs, Q).variant == "chunked", (D, N)
            dy = torch.randn(b, L, H, D, dtype=torch.float64).to(device="cuda", dtype=dtype)
            check_against(inputs, Q, cpu_truth(inputs, dy, Q), f"{dtype} D={D} N={N} on 99 KB", dy)
        inputs = ssd_inputs(1, 200, 2, 192, 192, 1, dtype, "cuda")
        assert bt.explain("ssd_chunk_scan", *inputs, chunk_size=64).variant == "chunked_mma"
    finally:
        bt._C._cuda_smem_optin_cap(previous)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_long_sequence(dtype):
    """Many chunks (state passing over 24 chunks) at the benchmark head layouts."""
    for b, L, H, D, N, G, Q in [(1, 6000, 4, 64, 128, 1, 256), (1, 3000, 4, 64, 64, 4, 128), (1, 2000, 2, 32, 32, 1, 64)]:
        inputs = ssd_inputs(b, L, H, D, N, G, dtype, "cuda")
        dy = torch.randn(b, L, H, D, dtype=torch.float64).to(device="cuda", dtype=dtype)
        check_against(inputs, Q, cpu_truth(inputs, dy, Q), f"{dtype} L={L} Q={Q}", dy)


@requires_cuda
def test_cuda_mixed_devices():
    x, dt, A, B, C = ssd_inputs(1, 4, 2, 2, 2, 1, torch.float32, "cuda")
    with pytest.raises(RuntimeError, match=r"baracuda::ssd_chunk_scan: expected all tensors on one device"):
        bt.ssd_chunk_scan(x, dt.cpu(), A, B, C)
    with pytest.raises(RuntimeError, match=r"expected all tensors on one device"):
        bt.ssd_chunk_scan(x.cpu(), dt.cpu(), A.cpu(), B.cpu(), C)
    with pytest.raises(RuntimeError, match=r"baracuda::ssd_chunk_scan_backward: expected all tensors on one device"):
        ops.ssd_chunk_scan_backward(x.cpu(), x, dt, A, B, C)


@requires_cuda
def test_cuda_graph_capture():
    """No host synchronization inside the ops: forward and backward capture and replay."""
    b, L, H, D, N, G, Q = 2, 300, 4, 64, 64, 1, 128
    inputs = [t.requires_grad_() for t in ssd_inputs(b, L, H, D, N, G, torch.bfloat16, "cuda")]
    dy = torch.randn(b, L, H, D, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph
        for _ in range(2):
            torch.autograd.grad(bt.ssd_chunk_scan(*inputs, chunk_size=Q), inputs, dy)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = bt.ssd_chunk_scan(*inputs, chunk_size=Q)
        grads = torch.autograd.grad(y, inputs, dy)
    fresh = ssd_inputs(b, L, H, D, N, G, torch.bfloat16, "cuda")
    with torch.no_grad():
        for t, f in zip(inputs, fresh):
            t.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    plain = [t.detach() for t in inputs]
    assert torch.equal(y, ops.ssd_chunk_scan(*plain, Q))
    for a, e in zip(grads, ops.ssd_chunk_scan_backward(dy, *plain, Q)):
        assert torch.equal(a, e)


@requires_cuda
def test_cuda_more_than_2_31_elements():
    """x with more than 2^31 elements (offsets past int32) stays correct. Two resets
    (dt huge and x = 0 at the last step of a chunk: decay exactly 0, no input) cut the
    sequence so that its first and last few hundred steps are independent problems,
    small enough for the float64 reference, forward and gradients (dA excepted)."""
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs 40 GiB of GPU memory")
    H, D, N, Q, dtype = 16, 64, 64, 256, torch.bfloat16
    k = 8192
    L = k * Q + 301                     # 2^21 + 301 steps, x has 2^31 + 301·2^10 elements
    assert L * H * D > 2**31
    head, tail = Q - 1, k * Q           # resets at steps Q - 1 and k·Q - 1
    x = torch.randn(1, L, H, D, device="cuda", dtype=dtype)
    dt = F.softplus(torch.randn(1, L, H, device="cuda") - 1).to(dtype)
    A = -torch.exp(0.5 * torch.randn(H, device="cuda")).to(dtype)
    B = torch.randn(1, L, 1, N, device="cuda", dtype=dtype)
    C = torch.randn(1, L, 1, N, device="cuda", dtype=dtype)
    for t in (head, tail - 1):
        x[:, t] = 0
        dt[:, t] = 1e4
    dy = torch.randn_like(x)
    y = ops.ssd_chunk_scan(x, dt, A, B, C, Q)
    grads = ops.ssd_chunk_scan_backward(dy, x, dt, A, B, C, Q)
    rtol = rtol_for(dtype, "cuda")
    for lo, hi in ((0, head), (tail, L)):
        piece = [x[:, lo:hi], dt[:, lo:hi], A, B[:, lo:hi], C[:, lo:hi]]
        y64, g64 = reference_grads(piece, dy[:, lo:hi])
        check(y[:, lo:hi], y64, rtol, f"y[{lo}:{hi}]")
        for i in (0, 1, 3, 4):
            check(grads[i][:, lo:hi], g64[i], rtol, f"{NAMES[i]}[{lo}:{hi}]")
    del x, y, dy, grads
    torch.cuda.empty_cache()
