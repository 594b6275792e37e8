"""The CPU SSD scan's two variants: "chunked" (the default: the state-space-duality
algorithm in float32, float64 for float64 inputs) and "sequential" (the float64
step-by-step recurrence, picked by the preference "precise").

Against the float64 step-by-step reference: every option of ssd_chunk_scan_combined in
every dtype, forward and backward (the helpers and tolerances of test_mamba and
test_ssd_chunk_scan); seq_idx boundaries inside a chunk and on chunk edges; L not a
multiple of the chunk; zero-size dims; strided inputs; gradcheck in float64; the same
bits for 1 and 2 threads; "precise" matching the reference at float64 tolerance; explain.
"""
import random

import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import mamba
from baracuda_torch import reference as ref
from helpers import FLOAT_DTYPES
from test_mamba import check_case, make_case, run_ours
from test_ssd_chunk_scan import NAMES, check, run_and_check, ssd_inputs, strided_layouts

ops = torch.ops.baracuda


def combined_args(t):
    return [t[k] for k in ("x", "dt", "A", "B", "C")]


def untie(t, kw):
    """Moves a raw dt whose dt + dt_bias lands exactly on a dt limit (a kink: possible in
    bfloat16, where -0.3 + 0.3 can be exactly 0) clearly below it. The kernels take the
    gradient 1 there (the contract zeroes it strictly outside the limits) and the
    reference's clamp 0; both are valid subgradients, so the tests avoid the tie."""
    if "dt_bias" not in t or kw["dt_softplus"]:
        return t
    v = t["dt"].double() + t["dt_bias"].double()
    tie = (v == kw["dt_limit"][0]) | (v == kw["dt_limit"][1])
    t["dt"] = torch.where(tie, torch.full_like(t["dt"], -1.0), t["dt"])
    return t


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_every_option_combination(dtype, chunk):
    """All 2^6 on/off combinations of D, z, dt_bias, initial_states, seq_idx, softplus
    (D per head or per dim, mixed dtypes and dt limits at random), L = 37 (never a
    multiple of the chunk but 1), three group layouts."""
    rng = random.Random(100 + chunk + FLOAT_DTYPES.index(dtype))
    torch.manual_seed(chunk)
    shapes = [(2, 37, 4, 6, 5, 2), (1, 37, 3, 4, 3, 3), (2, 37, 2, 3, 7, 1)]
    for mask in range(64):
        on = [bool(mask >> k & 1) for k in range(6)]
        b, L, H, P, N, G = shapes[mask % len(shapes)]
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cpu", D=on[0] and None, z=on[1],
                          dt_bias=on[2], init=on[3], seq_idx=on[4], softplus=on[5])
        check_case(untie(t, kw), kw, chunk, f"{dtype} chunk {chunk} options {sorted(t)} {kw}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_seq_idx_boundaries_inside_and_on_chunk_edges(dtype):
    """Sequence starts at every interesting place for chunk 8: the first step of a chunk,
    its last step, inside it, two in one chunk, consecutive steps, the last step of L."""
    rng = random.Random(5)
    b, L, H, P, N, G, Q = 2, 43, 2, 4, 3, 1, 8
    for starts in ([8, 16], [7, 15, 23], [3, 5], [9, 10, 11], [42], [1], [8, 9, 31, 32, 40]):
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cpu", D="h", z=False, dt_bias=True,
                          init=True, seq_idx=False, softplus=True, limit=False, mixed=False)
        flags = torch.zeros(b, L, dtype=torch.int64)
        flags[0, starts] = 1
        flags[1, [s // 2 + 1 for s in starts]] = 1
        t["seq_idx"] = flags.cumsum(1).to(torch.int32)
        check_case(t, kw, Q, f"{dtype} sequence starts {starts}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_loops_without_blas(dtype):
    """The chunked variant's products on its own loops (what runs where libtorch exports
    no BLAS; forced here through bt._C._ssd_cpu_blas): every option, a reset inside a
    chunk and L not a multiple of the chunk, forward and backward against the float64
    reference; and the same results as the BLAS products up to rounding."""
    rng = random.Random(11)
    for mask in (0, 21, 42, 63):
        on = [bool(mask >> k & 1) for k in range(6)]
        t, kw = make_case(rng, 2, 37, 4, 6, 5, 2, dtype, "cpu", D=on[0] and None, z=on[1],
                          dt_bias=on[2], init=on[3], seq_idx=on[4], softplus=on[5])
        t = untie(t, kw)
        dout = torch.randn_like(t["x"])
        dfinal = torch.randn(2, 4, 6, 5, dtype=torch.float64).to(dtype)
        with_blas = run_ours(t, kw, 8, dout, dfinal)
        previous = bt._C._ssd_cpu_blas(False)
        try:
            check_case(t, kw, 8, f"{dtype} plain loops, options {sorted(t)} {kw}")
            without = run_ours(t, kw, 8, dout, dfinal)
        finally:
            bt._C._ssd_cpu_blas(previous)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        pairs = [(without[0], with_blas[0]), (without[1], with_blas[1])]
        pairs += [(without[2][k], with_blas[2][k]) for k in with_blas[2]]
        for a, b in pairs:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_backward_waves_keep_the_bits(dtype):
    """The chunked backward runs its (b, h) tasks in waves and adds each wave's per-head
    dB and dC to the group's sums in head order (bt._C._ssd_cpu_wave_bytes: a budget of
    one byte gives waves of 4 tasks a thread, which split the groups of 3 and 5 heads
    below): every gradient the same bits as in one wave, at 1, 2 and 3 threads, with
    packed sequences and every option; and the workspace follows the wave."""
    rng = random.Random(17)
    threads = torch.get_num_threads()
    for b, L, H, G in [(2, 37, 6, 2), (3, 21, 10, 2)]:
        t, kw = make_case(rng, b, L, H, 4, 5, G, dtype, "cpu", D="h", z=True, dt_bias=True,
                          init=True, seq_idx=True, softplus=True, limit=False, mixed=False)
        t = untie(t, kw)
        dout = torch.randn_like(t["x"])
        dfinal = torch.randn(b, H, 4, 5).to(dtype)
        whole = run_ours(t, kw, 8, dout, dfinal)
        x, dt, A, B, C = combined_args(t)
        ws_whole = bt.explain("ssd_chunk_scan_backward", x, x, dt, A, B, C, chunk_size=8).workspace_bytes
        previous = bt._C._ssd_cpu_wave_bytes(1)
        try:
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                ws = bt.explain("ssd_chunk_scan_backward", x, x, dt, A, B, C, chunk_size=8).workspace_bytes
                assert (ws < ws_whole) == (4 * n < b * H), (n, ws, ws_whole)  # waves of 4·n tasks
                waves = run_ours(t, kw, 8, dout, dfinal)
                assert set(waves[2]) == set(whole[2])
                for k in whole[2]:
                    assert torch.equal(waves[2][k], whole[2][k]), (b, L, H, G, n, k)
        finally:
            bt._C._ssd_cpu_wave_bytes(previous)
            torch.set_num_threads(threads)


def test_plain_op_every_dtype_and_layout():
    """The plain op's CASES (L not a multiple of the chunk, L < chunk, chunk 1, every
    group layout) and strided inputs, in every dtype, through the default variant."""
    for dtype in FLOAT_DTYPES:
        for b, L, H, D, N, G, Q in [(2, 37, 4, 8, 6, 1, 16), (1, 130, 4, 8, 8, 2, 64),
                                    (2, 9, 6, 4, 3, 2, 1), (1, 100, 6, 4, 4, 3, 7)]:
            run_and_check(ssd_inputs(b, L, H, D, N, G, dtype, "cpu"), Q,
                          f"{dtype} {(b, L, H, D, N, G, Q)}")
        for name, inputs in strided_layouts(2, 33, 4, 6, 5, 2, dtype, "cpu"):
            run_and_check(inputs, 8, f"{dtype} {name}")


def test_zero_size_dims():
    """An empty batch, sequence, head, head_dim or state dim: zero outputs and gradients
    of the inputs' shapes, nothing NaN."""
    for b, L, H, D, N in [(0, 5, 2, 3, 4), (2, 0, 2, 3, 4), (1, 5, 0, 3, 4), (1, 5, 2, 0, 4),
                          (1, 5, 2, 3, 0)]:
        x = torch.randn(b, L, H, D)
        dt = torch.rand(b, L, H)
        A = -torch.rand(H)
        B = torch.randn(b, L, 1, N)
        C = torch.randn(b, L, 1, N)
        leaves = [t.requires_grad_() for t in (x, dt, A, B, C)]
        y = bt.ssd_chunk_scan(*leaves, chunk_size=4)
        assert y.shape == (b, L, H, D) and (y == 0).all()
        grads = torch.autograd.grad(y, leaves, torch.randn(b, L, H, D))
        for g, t in zip(grads, leaves):
            assert g.shape == t.shape and (g == 0).all()


def test_gradcheck_float64_chunked():
    """gradcheck through the chunked variant, every option, a boundary inside a chunk."""
    rng = random.Random(3)
    t, kw = make_case(rng, 2, 11, 2, 3, 2, 1, torch.float64, "cpu", D="hdim", z=True,
                      dt_bias=True, init=True, seq_idx=False, softplus=True, limit=False,
                      mixed=False)
    seq = torch.tensor([[0] * 5 + [1] * 6, [0] * 9 + [1] * 2], dtype=torch.int32)
    names = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"]
    leaves = [t[k].clone().requires_grad_() for k in names]
    assert bt.explain("ssd_chunk_scan", *leaves[:5], 4).variant == "chunked"

    def fn(*a):
        return mamba.mamba_chunk_scan_combined(
            *a[:5], 4, D=a[5], z=a[6], dt_bias=a[7], initial_states=a[8], seq_idx=seq,
            return_final_states=True, **kw)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


def _run_all(t, kw, chunk):
    torch.manual_seed(0)
    dout = torch.randn_like(t["x"])
    b, _, H, P = t["x"].shape
    dfinal = torch.randn(b, H, P, t["B"].size(-1), dtype=torch.float32)
    out, final, grads = run_ours(t, kw, chunk, dout, dfinal)
    return [out, final] + [grads[k] for k in sorted(grads)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_bits_for_one_and_two_threads(dtype):
    """Every output of the forward and backward, a group of four heads (dB and dC sum
    over heads through partials) and batch 3 (dA, dD, ddt_bias sum over b)."""
    rng = random.Random(21)
    t, kw = make_case(rng, 3, 150, 8, 16, 32, 2, dtype, "cpu", D="hdim", z=True, dt_bias=True,
                      init=True, seq_idx=True, softplus=True, limit=False, mixed=True)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run_all(t, kw, 64)
        torch.set_num_threads(2)
        two = _run_all(t, kw, 64)
    finally:
        torch.set_num_threads(old)
    for i, (a, e) in enumerate(zip(one, two)):
        assert torch.equal(a, e), f"output {i} differs between 1 and 2 threads"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_precise_selects_the_float64_recurrence(dtype):
    """"precise" runs "sequential": float64 math for every dtype, so float32 and
    float64 results sit within a rounding of the float64 reference (forward and
    gradients), tighter than the chunked float32 path promises."""
    rng = random.Random(8)
    t, kw = make_case(rng, 2, 45, 4, 5, 6, 2, dtype, "cpu", D="h", z=True, dt_bias=True,
                      init=True, seq_idx=True, softplus=True, limit=True, mixed=False)
    args = combined_args(t)
    with bt.preference("precise"):
        info = bt.explain("ssd_chunk_scan_combined", *args, 8, D=t["D"], z=t["z"])
        assert info.variant == "sequential" and info.math_precision == "float64"
        assert info.preference == "precise" and info.deterministic
        torch.manual_seed(1)
        dout = torch.randn_like(t["x"])
        dfinal = torch.randn(2, 4, 5, 6, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        from test_mamba import run_reference
        out, final, grads = run_ours(t, kw, 8, dout, dfinal)
    out64, final64, g64 = run_reference(t, kw, dout, dfinal)
    # float64 math: one rounding of the result (float64: the reference's own rounding).
    rtol = 1e-12 if dtype == torch.float64 else torch.finfo(dtype).eps
    check(out, out64, rtol, "precise out")
    check(final, final64, max(rtol, 1.2e-7), "precise final_states")
    for k, g in grads.items():
        check(g, g64[k], max(rtol, 1.2e-7 if g.dtype == torch.float32 else rtol), f"precise d{k}")


def test_explain_names_both_variants():
    b, L, H, D, N, G, Q = 2, 100, 4, 8, 6, 2, 32
    for dtype, math in [(torch.float32, "float32"), (torch.bfloat16, "float32"),
                        (torch.float16, "float32"), (torch.float64, "float64")]:
        x, dt, A, B, C = ssd_inputs(b, L, H, D, N, G, dtype, "cpu")
        for pref in (None, "fastest", "deterministic"):
            info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, Q, preference=pref)
            binfo = bt.explain("ssd_chunk_scan_backward", x, x, dt, A, B, C, Q, preference=pref)
            assert info.variant == binfo.variant == "chunked"
            assert info.math_precision == info.accumulator == math
            assert info.deterministic and info.bit_stable and binfo.deterministic
            assert info.workspace_bytes == 0 and binfo.workspace_bytes > 0
        info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, Q, preference="precise")
        assert info.variant == "sequential" and info.math_precision == "float64"
        assert info.name == f"ssd_chunk_scan.ssd_chunk_scan/{x.dtype}".replace("torch.", "") + \
            "/sequential/cpu"
    # torch.use_deterministic_algorithms keeps the chunked variant (it is deterministic).
    torch.use_deterministic_algorithms(True)
    try:
        info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, Q)
        assert info.variant == "chunked" and info.preference == "deterministic"
    finally:
        torch.use_deterministic_algorithms(False)


def test_precise_preference_api():
    assert bt.get_preference() == "fastest"
    with bt.preference("precise"):
        assert bt.get_preference() == "precise"
        torch.use_deterministic_algorithms(True)
        try:
            assert bt._C.effective_preference() == "precise"
        finally:
            torch.use_deterministic_algorithms(False)
    assert bt.get_preference() == "fastest"
    with pytest.raises(ValueError, match="'fastest', 'deterministic' or 'precise'"):
        bt.set_preference("exact")
    # Every other family treats "precise" as "deterministic".
    src = torch.randn(50, 8)
    index = torch.randint(0, 50, (30, 8))
    a = bt.explain("gather", src, 0, index, preference="precise")
    e = bt.explain("gather", src, 0, index, preference="deterministic")
    assert a.variant == e.variant and a.deterministic


def test_chunked_matches_precise_closely_at_a_long_sequence():
    """Many chunks carrying the state (L = 1000, chunk 64 and the default 256), float32:
    the chunked result within the float32 tolerance of the float64 recurrence."""
    inputs = ssd_inputs(1, 1000, 4, 16, 16, 1, torch.float32, "cpu")
    dy = torch.randn(1, 1000, 4, 16)
    for Q in (64, 256):
        y = ops.ssd_chunk_scan(*inputs, Q)
        g = ops.ssd_chunk_scan_backward(dy, *inputs, Q)
        with bt.preference("precise"):
            y64 = ops.ssd_chunk_scan(*[t.double() for t in inputs], Q)
            g64 = ops.ssd_chunk_scan_backward(dy.double(), *[t.double() for t in inputs], Q)
        check(y, y64, 1e-4, f"y chunk {Q}")
        for name, a, e in zip(NAMES, g, g64):
            check(a, e, 1e-4, f"{name} chunk {Q}")
    assert ref is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("what", ["dt", "x", "B", "C"])
def test_a_later_step_leaves_earlier_outputs_bits(dtype, what):
    """The chunked forward's outputs before a step do not depend on that step: a NaN in its
    dt, x, B or C leaves every earlier output of the chunk bitwise as it was (each decay
    row is formed from the steps up to it: the factored decays once centred on the whole
    chunk's range, which a later NaN moved). Steps 1, 7 and 13 of a 16-step chunk, L = 40."""
    inputs = ssd_inputs(2, 40, 3, 5, 4, 1, dtype, "cpu")
    clean = ops.ssd_chunk_scan(*inputs, 16)
    k = ["x", "dt", "A", "B", "C"].index(what)
    for t in (1, 7, 13):
        dirty = [a.clone() for a in inputs]
        dirty[k][1, t] = float("nan")  # batch 1, step t (every head or group, feature)
        y = ops.ssd_chunk_scan(*dirty, 16)
        assert torch.equal(y[:, :t], clean[:, :t]) and torch.equal(y[0], clean[0]), f"a NaN in {what} at step {t}"
        assert y[1, t].isnan().any()


def test_float64_chunked_within_a_few_ulps_of_the_recurrence():
    """float64: the chunked algorithm's output and gradients lie within 32 ulps (of each
    one's largest magnitude) of the float64 step-by-step recurrence ("precise"). The
    factored decays once took every exponent from an offset of 600 below the chunk's first
    cumsum, which rounds each factor by about 600·ε: some 1e-13 of every output and
    gradient (hundreds of ulps; a fuzz draw found dA 2000 ulps off)."""
    torch.manual_seed(5)
    inputs = ssd_inputs(2, 100, 3, 5, 4, 1, torch.float64, "cpu")
    dy = torch.randn(2, 100, 3, 5, dtype=torch.float64)

    def run(pref):
        leaves = [t.clone().requires_grad_() for t in inputs]
        with bt.preference(pref):
            y = bt.ssd_chunk_scan(*leaves, chunk_size=16)
            return [y, *torch.autograd.grad(y, leaves, dy)]

    assert bt.explain("ssd_chunk_scan", *inputs, 16).variant == "chunked"
    for name, a, e in zip(("y",) + NAMES, run("deterministic"), run("precise")):
        err, scale = (a - e).abs().max().item(), e.abs().max().item()
        assert err <= 32 * torch.finfo(torch.float64).eps * scale, f"{name}: {err:.3g} at scale {scale:.3g}"
