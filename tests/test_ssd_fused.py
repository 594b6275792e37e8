"""The SSD's one-launch CUDA forwards ("fused_mma": mma.sync, sm_80+, the plan's choice
with fewer than 4 heads per group; "fused_mma_cb": the same reading C·Bᵀ from a table
computed once per (batch, chunk, group), the plan's choice with 4 or more;
"fused_wgmma": Hopper's wgmma, sm_90 with the build's sm_90a code, run through the test
switch; float16/bfloat16, head_dim a multiple of 64, state_dim <= 128 — fused_mma_cb up
to 256, the plan's choice there on Hopper —, chunk <= 256, seq_idx on the mma.sync
kernels): which problems the plan gives
them, and each kernel's forward (out, final_states, y_pre through the backward) against
the float64 recurrence with every option it takes, odd lengths and chunks, strided
inputs, poisoned outputs, bitwise determinism and CUDA-graph replay. Then the backward's
group products ("group_mma", the intra-chunk dB/dC products once per group) likewise,
next to the per-head ones. CUDA only.

Tolerances: those of test_ssd_chunk_scan (rtol_for), through test_mamba's check_case.
"""
import random
import re
import threading

import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import mamba
from helpers import capture_graph, cuda_kernel_names, poison_fresh_outputs, requires_cuda
from test_mamba import check_case, kept_states_reference, make_case, negative_dt, run_ours
from test_ssd_chunk_scan import check, reference_grads, rtol_for, ssd_inputs

ops = torch.ops.baracuda
HALF = [torch.bfloat16, torch.float16]

# (B, L, H, P, N, G, chunk): the 2.7B layer's P/N with a ragged last chunk, two head_dim
# tiles, N = 64 and a small N, N not a multiple of 8 (the scalar loads), G = H, 1 < G < H,
# chunks of 64, 128 and an odd one, and L shorter than the chunk.
SHAPES = [
    (2, 700, 4, 64, 128, 1, 256),
    (1, 600, 3, 128, 64, 3, 256),
    (2, 300, 4, 64, 16, 2, 128),
    (1, 530, 2, 64, 100, 1, 256),
    (1, 77, 2, 64, 128, 2, 64),
    (1, 333, 2, 64, 32, 1, 100),
    (2, 40, 2, 64, 64, 1, 256),
]


def fused_variant(H, G):
    """The fused forward the plan picks: mma.sync on every sm_80+ device (the wgmma kernel is
    slower on an H100 today; tests run it through the switch), with the C·Bᵀ table where a
    group has 4 heads or more."""
    if torch.cuda.get_device_capability()[0] < 8:
        return "chunked"
    return "fused_mma_cb" if H // G >= 4 else "fused_mma"


def staged_variant():
    """The staged forward the plan falls back to: tensor cores on sm_80+, SIMT below."""
    return "chunked_mma" if torch.cuda.get_device_capability()[0] >= 8 else "chunked"


def has_wgmma():
    return torch.cuda.get_device_capability() == (9, 0) and bt._C._arch_specific_kernels(90)


def fused_kernels():
    """The fused forwards this device and build can run (each test runs on all of them)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return []
    return ["fused_mma", "fused_mma_cb"] + (["fused_wgmma"] if has_wgmma() else [])


@pytest.fixture(params=[pytest.param(k, marks=requires_cuda)
                        for k in ("fused_mma", "fused_mma_cb", "fused_wgmma")])
def kernel(request):
    """Runs the test with the plan's CUDA forward forced to this fused kernel (skipped where
    the device or build has no such kernel)."""
    if request.param not in fused_kernels():
        pytest.skip(f"{request.param} does not run on this device or build")
    previous = bt._C._ssd_cuda_forward(request.param)
    yield request.param
    bt._C._ssd_cuda_forward(previous)


@requires_cuda
def test_plan_picks_the_fused_forward_where_it_applies():
    staged = staged_variant()
    for b, L, H, P, N, G, Q in SHAPES:
        x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
        info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=Q)
        assert info.variant == fused_variant(H, G), (b, L, H, P, N, G, Q)
        # the backward has no fused form (staged, or the group products: their own test)
        binfo = bt.explain(ops.ssd_chunk_scan_backward, x, x, dt, A, B, C, Q)
        assert binfo.variant in (staged, "group_mma", "group_wgmma")
    # not for: float32, head_dim 32, a chunk over 256 (N = 256:
    # test_n256_is_fused_mma_cb_where_its_tiles_fit; seq_idx: test_seq_idx)
    x, dt, A, B, C = ssd_inputs(1, 300, 2, 64, 64, 1, torch.float32, "cuda")
    assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=256).variant == "chunked"
    for (P, N, Q) in [(32, 64, 256), (64, 64, 512)]:
        x, dt, A, B, C = ssd_inputs(1, 600, 2, P, N, 1, torch.bfloat16, "cuda")
        assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=Q).variant == staged
    x, dt, A, B, C = ssd_inputs(1, 300, 2, 64, 64, 1, torch.bfloat16, "cuda")
    seq = torch.zeros(1, 300, dtype=torch.int32, device="cuda")
    assert bt.explain(ops.ssd_chunk_scan_combined, x, dt, A, B, C, 256, None, None, None, None,
                      seq).variant == fused_variant(2, 1)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}L{}H{}P{}N{}G{}Q{}".format(*s))
def test_plain_forward_and_backward(dtype, shape, kernel):
    check_plain(dtype, shape, kernel)


def check_plain(dtype, shape, variant):
    """The plan runs `variant` on this problem; out and every gradient against the float64
    recurrence, on poisoned fresh outputs."""
    b, L, H, P, N, G, Q = shape
    inputs = ssd_inputs(b, L, H, P, N, G, dtype, "cuda")
    leaves = [t.detach().requires_grad_() for t in inputs]
    assert bt.explain("ssd_chunk_scan", *inputs, chunk_size=Q).variant == variant
    poison_fresh_outputs()
    y = bt.ssd_chunk_scan(*leaves, chunk_size=Q)
    dy = torch.randn(y.shape, dtype=torch.float64).to(device="cuda", dtype=dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    y64, g64 = reference_grads(inputs, dy)
    rtol = rtol_for(dtype, "cuda")
    check(y, y64, rtol, f"y of {shape}")
    for name, g, e in zip(("dx", "ddt", "dA", "dB", "dC"), grads, g64):
        check(g, e, rtol, f"{name} of {shape}")


def check_option_cases(dtype, expected, rng, count, seq_idx=None):
    """`count` cases over SHAPES in turn with test_mamba.make_case's options (initial states
    every other case, z in two of three) and `seq_idx(i, b, L, Q)` where given: the plan
    runs `expected`; out, final states and gradients against the float64 recurrence."""
    for i in range(count):
        b, L, H, P, N, G, Q = SHAPES[i % len(SHAPES)]
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", seq_idx=False,
                          init=(i % 2 == 0) or None, z=(i % 3 != 2) or None)
        if seq_idx is not None:
            t["seq_idx"] = seq_idx(i, b, L, Q)
        args = [t[k] for k in ("x", "dt", "A", "B", "C")] + [Q] + [t.get(k) for k in (
            "D", "z", "dt_bias", "initial_states", "seq_idx")]
        assert bt.explain(ops.ssd_chunk_scan_combined, *args).variant == expected
        opts = sorted(k for k in t if k not in ("x", "dt", "A", "B", "C"))
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} {opts} {kw}")


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_every_option_but_seq_idx(dtype, kernel):
    torch.manual_seed(5)
    check_option_cases(dtype, kernel, random.Random(31 + HALF.index(dtype)), 10)


def _sequence_ids(b, L, Q, kind, dtype):
    """seq_idx [b, L]: "dense", starts anywhere (15 % of positions); "edges", starts at
    chunk boundaries, one position after one, at a chunk's last position and none in some
    chunks (a sequence over several chunks)."""
    if kind == "dense":
        starts = torch.rand(b, L) < 0.15
    else:
        starts = torch.zeros(b, L, dtype=torch.bool)
        for t in (Q, Q + 1, 2 * Q - 1, 3 * Q, 3 * Q + Q // 2, 5 * Q + 2):
            if t < L:
                starts[:, t] = True
    starts[:, 0] = False
    return starts.cumsum(1).to(dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_seq_idx(dtype, kernel):
    """seq_idx on the mma.sync fused forwards, forced (fused_wgmma leaves it to the staged kernels):
    out and final states against the float64 recurrence with every option, sequences
    starting anywhere and at the chunk edges, seq_idx contiguous or strided; gradients
    through the staged backward."""
    def seq_idx(i, b, L, Q):
        seq = _sequence_ids(b, L, Q, "dense" if i % 2 else "edges", (torch.int32, torch.int64)[i % 2]).cuda()
        return torch.stack([seq, -seq], -1)[..., 0] if i % 4 == 3 else seq  # (time stride 2)

    torch.manual_seed(7)
    check_option_cases(dtype, kernel if kernel != "fused_wgmma" else staged_variant(),
                       random.Random(77 + HALF.index(dtype)), 8, seq_idx)


def _strided(t, kind):
    """The same values in another layout: a slice of a wider tensor, or the last dim
    strided (no 16-byte rows: the scalar loads)."""
    if kind == "slice":
        wide = torch.randn(*t.shape[:-1], t.shape[-1] * 2 + 8, device=t.device, dtype=t.dtype)
        wide[..., 8:8 + t.shape[-1]] = t
        return wide[..., 8:8 + t.shape[-1]]
    wide = torch.randn(*t.shape, 2, device=t.device, dtype=t.dtype)
    wide[..., 0] = t
    return wide[..., 0]


@requires_cuda
@pytest.mark.parametrize("kind", ["slice", "inner_stride"])
def test_strided_inputs(kind, kernel):
    b, L, H, P, N, G, Q = 2, 333, 2, 64, 64, 2, 128
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    dense = bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=Q)
    xs, Bs, Cs = (_strided(t, kind) for t in (x, B, C))
    assert not xs.is_contiguous()
    assert bt.explain("ssd_chunk_scan", xs, dt, A, Bs, Cs, chunk_size=Q).variant == kernel
    out = bt.ssd_chunk_scan(xs, dt, A, Bs, Cs, chunk_size=Q)
    assert torch.equal(out, dense)
    # z through the epilogue's pair loads ("slice") or gathered ("inner_stride"), with D
    z, D = torch.randn_like(x), torch.rand(H, device="cuda")
    gated = mamba.mamba_chunk_scan_combined(x, dt, A, B, C, Q, D=D, z=z)
    zs = _strided(z, kind)
    assert not zs.is_contiguous()
    assert torch.equal(mamba.mamba_chunk_scan_combined(xs, dt, A, Bs, Cs, Q, D=D, z=zs), gated)


@requires_cuda
def test_bitwise_reproducible_and_graph_capture(kernel):
    check_bitwise_and_replay((2, 1100, 8, 64, 128, 1, 256))


def check_bitwise_and_replay(shape):
    """The forward with D, z and initial states, twice: the same bits; then captured in a CUDA
    graph and replayed twice: the same bits again."""
    b, L, H, P, N, G, Q = shape
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    init = torch.randn(b, H, P, N, device="cuda")
    D = torch.randn(H, device="cuda")
    z = torch.randn_like(x)
    run = lambda: mamba.mamba_chunk_scan_combined(  # noqa: E731
        x, dt, A, B, C, Q, D=D, z=z, initial_states=init, return_final_states=True)
    out1, fin1 = run()
    out2, fin2 = run()
    assert torch.equal(out1, out2) and torch.equal(fin1, fin2)
    graph, (out_g, fin_g) = capture_graph(run)
    for _ in range(2):  # replays start from zeroed counters every time
        out_g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_g, out1) and torch.equal(fin_g, fin1)


@requires_cuda
@pytest.mark.parametrize("shape", [(2, 700, 8, 64, 128, 2, 256), (1, 333, 4, 128, 40, 1, 100)],
                         ids=["N128", "N40-chunk100"])
def test_cb_table_gives_fused_mma_bits(shape):
    """fused_mma_cb reads C·Bᵀ from a table computed by the same products in the same order
    as fused_mma's blocks compute them, and C·H_cᵀ from C rows staged per warp: the same
    outputs and final states, bit for bit (options on; a short last chunk; N padded)."""
    if "fused_mma_cb" not in fused_kernels():
        pytest.skip("no fused forward on this device")
    b, L, H, P, N, G, Q = shape
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    init = torch.randn(b, H, P, N, device="cuda")
    D, z = torch.randn(H, P, device="cuda"), torch.randn_like(x)
    results = {}
    for name in ("fused_mma", "fused_mma_cb"):
        previous = bt._C._ssd_cuda_forward(name)
        try:
            assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=Q).variant == name
            results[name] = mamba.mamba_chunk_scan_combined(
                x, dt, A, B, C, Q, D=D, z=z, initial_states=init, return_final_states=True)
        finally:
            bt._C._ssd_cuda_forward(previous)
    for u, v in zip(results["fused_mma"], results["fused_mma_cb"]):
        assert torch.equal(u, v)


@requires_cuda
def test_forced_staged_forward_agrees():
    """The staged kernels (forced) and the fused forward compute the same function."""
    if not fused_kernels():
        pytest.skip("no fused forward on this device")
    b, L, H, P, N, G, Q = 2, 600, 4, 64, 128, 1, 256
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    fused = bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=Q)
    previous = bt._C._ssd_cuda_forward("staged")
    try:
        assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=Q).variant == "chunked_mma"
        staged = bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=Q)
    finally:
        bt._C._ssd_cuda_forward(previous)
    rel = ((fused.double() - staged.double()).norm() / staged.double().norm()).item()
    assert rel < 4 * torch.finfo(torch.bfloat16).eps, rel


# State dims above 128 (tiles of 256 columns): fused_mma_cb only (its blocks take the tile
# in two halves of 128 columns: 108 KB of shared memory, so sm_80 and Hopper), through the
# test switch. One head a group with two head_dim tiles (as the N = 256 shape,
# P = 128), four heads a group, and N = 200 (a padded tile, scalar loads) with an odd chunk.
SHAPES_N256 = [
    (1, 530, 2, 128, 256, 2, 256),
    (2, 300, 4, 64, 256, 1, 256),
    (1, 333, 2, 64, 200, 1, 100),
]


@pytest.fixture
def cb_256():
    """The forward forced to fused_mma_cb, where it takes N = 256 (skipped elsewhere)."""
    if "fused_mma_cb" not in fused_kernels():
        pytest.skip("no fused forward on this device")
    previous = bt._C._ssd_cuda_forward("fused_mma_cb")
    try:
        x, dt, A, B, C = ssd_inputs(1, 64, 1, 64, 256, 1, torch.bfloat16, "cuda")
        if bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=64).variant != "fused_mma_cb":
            assert torch.cuda.get_device_capability() not in ((8, 0), (9, 0)), "its shared memory holds the tiles"
            pytest.skip("this device's shared memory does not hold fused_mma_cb's N = 256 tiles")
        yield
    finally:
        bt._C._ssd_cuda_forward(previous)


@requires_cuda
def test_n256_is_fused_mma_cb_where_its_tiles_fit():
    """Above N = 128 the plan takes fused_mma_cb whatever the heads per group (here one) where
    the device's shared memory holds its blocks of two halves of 128 state columns (108 KB:
    sm_80, Hopper and sm_100, not the 99 KB devices), the staged kernels elsewhere; forced
    to a fused kernel that cannot take N = 256, the staged kernels too."""
    staged = staged_variant()
    fits = torch.cuda.get_device_capability() in ((8, 0), (9, 0), (10, 0)) and "fused_mma_cb" in fused_kernels()
    x, dt, A, B, C = ssd_inputs(1, 300, 2, 64, 256, 2, torch.bfloat16, "cuda")
    assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=256).variant == (
        "fused_mma_cb" if fits else staged)
    for forced in ("fused_mma", "fused_wgmma"):
        if forced not in fused_kernels():
            continue
        previous = bt._C._ssd_cuda_forward(forced)
        try:
            assert bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=256).variant == staged, forced
        finally:
            bt._C._ssd_cuda_forward(previous)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", SHAPES_N256, ids=lambda s: "B{}L{}H{}P{}N{}G{}Q{}".format(*s))
def test_n256_forward_and_backward(dtype, shape, cb_256):
    check_plain(dtype, shape, "fused_mma_cb")


@requires_cuda
def test_n256_every_option_reproducible_and_graph_capture(cb_256):
    """D, z, initial and final states at N = 256 against the float64 recurrence; the same
    bits twice and from a CUDA graph's replays."""
    rng = random.Random(256)
    torch.manual_seed(256)
    for i, (b, L, H, P, N, G, Q) in enumerate(SHAPES_N256):
        t, kw = make_case(rng, b, L, H, P, N, G, torch.bfloat16, "cuda", seq_idx=False, init=i != 1, z=i != 2)
        check_case(t, kw, Q, f"N256 {(b, L, H, P, N, G, Q)} {kw}")
    check_bitwise_and_replay(SHAPES_N256[1])


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_n256_seq_idx(dtype, cb_256):
    """seq_idx at N = 256 (the halves' kernel with the sequence starts: each half masks its
    own chain's state; the first multiplies C·H_cᵀ over both halves): out, final states and gradients against the float64
    recurrence, sequences starting anywhere and at the chunk edges, with the options."""
    rng = random.Random(2560 + HALF.index(dtype))
    torch.manual_seed(2560)
    for i, (b, L, H, P, N, G, Q) in enumerate(SHAPES_N256 * 2):
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", seq_idx=False, init=i % 2 == 0, z=i % 3 != 2)
        t["seq_idx"] = _sequence_ids(b, L, Q, "dense" if i % 2 else "edges", torch.int32).cuda()
        args = [t[k] for k in ("x", "dt", "A", "B", "C")] + [Q] + [t.get(k) for k in (
            "D", "z", "dt_bias", "initial_states", "seq_idx")]
        assert bt.explain(ops.ssd_chunk_scan_combined, *args).variant == "fused_mma_cb"
        check_case(t, kw, Q, f"N256 seq {dtype} {(b, L, H, P, N, G, Q)} {kw}")


def assert_same_run(got, expected, name):
    """run_ours's (out, final states, gradients) of two settings, bit for bit, and finite."""
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), name
    assert got[2].keys() == expected[2].keys(), name
    for k in expected[2]:
        assert torch.equal(got[2][k], expected[2][k]), (name, k)
    assert torch.isfinite(expected[0]).all(), name


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_n256_split_share_keeps_the_bits(dtype, cb_256):
    """The N = 256 halves sharing the output rows (the plan's choice with z; forced on
    without) give the bits of the first half's block taking them all: outputs, final
    states and gradients, NaN-poisoned, with a ragged last chunk, two heads a group,
    seq_idx and the kept chunk states the backward reads."""
    rng = random.Random(2561 + HALF.index(dtype))
    torch.manual_seed(2561)
    cases = [((1, 530, 2, 128, 256, 2, 256), {"z": True, "D": True, "init": True}),
             ((1, 777, 4, 64, 256, 2, 128), {"z": True, "seq_idx": True}),
             ((1, 333, 2, 64, 200, 1, 100), {"z": True, "D": "hdim"}),
             ((2, 300, 4, 64, 256, 1, 256), {"z": False, "D": True, "init": True})]
    for (b, L, H, P, N, G, Q), opts in cases:
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", **opts)
        dout = torch.randn_like(t["x"])
        dfinal = torch.randn(b, H, P, N, device="cuda")
        name = f"{(b, L, H, P, N, G, Q)} {opts}"

        def shared():  # the fused forward's last template argument, SHARE (a run's names)
            names = cuda_kernel_names(lambda: run_ours(t, kw, Q, dout, dfinal))
            last = {m.group(1) for n in names for m in [re.search(r"ssd_fused_forward_kernel<[^>(]*, (\w+)>", n)] if m}
            assert len(last) == 1, (name, names)
            return last == {"true"}

        previous = bt._C._ssd_cuda_split_share("off")
        try:
            expected = run_ours(t, kw, Q, dout, dfinal)
            assert not shared(), name
            bt._C._ssd_cuda_split_share("auto")
            assert shared() == opts["z"], name
            bt._C._ssd_cuda_split_share("on")
            assert shared(), name
            poison_fresh_outputs()
            got = run_ours(t, kw, Q, dout, dfinal)
        finally:
            bt._C._ssd_cuda_split_share(previous)
        assert_same_run(got, expected, name)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_fused_pdl_keeps_the_bits(dtype, cb_256):
    """The fused forward launched as a programmatic dependent of its C·Bᵀ table kernel (the
    plan's choice on sm_90a; elsewhere both settings launch it as any kernel) gives the bits
    of the launch after the table: outputs, final states and gradients, NaN-poisoned (a
    warp that read the table before the table kernel wrote it would read NaN), with the
    table by rows (N <= 128) and by pairs (N = 256, the halves sharing the rows with z or
    not), a ragged last chunk, seq_idx and a chunk of 100."""
    rng = random.Random(2562 + HALF.index(dtype))
    torch.manual_seed(2562)
    cases = [((2, 4096, 16, 64, 128, 4, 256), {"z": False}),
             ((2, 700, 8, 64, 128, 2, 256), {"z": True, "D": True, "init": True}),
             ((1, 530, 2, 128, 256, 2, 256), {"z": True, "seq_idx": True}),
             ((2, 300, 4, 64, 256, 1, 256), {"z": False, "D": True, "init": True}),
             ((1, 333, 2, 64, 200, 1, 100), {"z": False})]
    for (b, L, H, P, N, G, Q), opts in cases:
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", **opts)
        dout = torch.randn_like(t["x"])
        dfinal = torch.randn(b, H, P, N, device="cuda")
        name = f"{(b, L, H, P, N, G, Q)} {opts}"
        previous = bt._C._ssd_cuda_fused_pdl("off")
        try:
            expected = run_ours(t, kw, Q, dout, dfinal)
            bt._C._ssd_cuda_fused_pdl("auto")
            poison_fresh_outputs()
            got = run_ours(t, kw, Q, dout, dfinal)
        finally:
            bt._C._ssd_cuda_fused_pdl(previous)
        assert_same_run(got, expected, name)


def test_forward_switch_names_its_choices():
    assert bt._C._ssd_cuda_forward("auto") == "auto"
    with pytest.raises(ValueError, match="auto, staged, fused_mma, fused_mma_cb or fused_wgmma"):
        bt._C._ssd_cuda_forward("fused")
    assert bt._C._ssd_cuda_forward("auto") == "auto"


# ---- the backward's group products ("group_mma": the intra-chunk dB/dC products once per
# group, on Σ_heads of the per-head weights; the plan's choice where that matrix takes no
# more memory than 8 × x: heads per group >= chunk / (4·head_dim))

# (B, L, H, P, N, G, chunk): many heads per group (the 2.7B layer's G = 1), 4 heads per
# group, P = 128 with N = 256 (four state tiles), N not a multiple of 8 with an odd chunk,
# a ragged last chunk and L shorter than the chunk, a chunk of 384 (the finalize kernel's
# chunks of more than one round of 256 positions).
GROUP_SHAPES = [
    (1, 513, 16, 64, 128, 1, 256),
    (2, 300, 12, 64, 64, 3, 128),
    (1, 200, 8, 128, 256, 2, 64),
    (1, 450, 6, 64, 48, 1, 100),
    (2, 90, 4, 64, 32, 1, 256),
    # head_dim not a multiple of 64 (group_wgmma's swizzled panels of 64 columns, one partial)
    (1, 260, 6, 80, 64, 2, 128),
    (1, 150, 4, 40, 96, 1, 64),
    (1, 700, 4, 64, 64, 1, 384),
]


@pytest.fixture(params=["staged", "group_mma", "group_wgmma"])
def backward(request):
    """Runs the test with the plan's CUDA backward forced to the per-head ("staged") or the
    per-group dB/dC products, with the dC/dB kernel on mma.sync ("group_mma") or on wgmma
    ("group_wgmma": sm_90 with the build's sm_90a code)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the group products need the tensor-core backward (sm_80+)")
    if request.param == "group_wgmma" and not _wgmma_device():
        pytest.skip("group_wgmma needs an sm_90 device and the build's sm_90a code")
    previous = bt._C._ssd_cuda_backward(request.param)
    yield request.param
    bt._C._ssd_cuda_backward(previous)


def _wgmma_device():
    return torch.cuda.get_device_capability() == (9, 0) and bt._C._arch_specific_kernels(90)


def _backward_variant(inputs, Q):
    x = inputs[0]
    return bt.explain(ops.ssd_chunk_scan_backward, x, *inputs, Q).variant


@requires_cuda
def test_plan_picks_the_group_products_where_dcb_is_at_most_8x_x():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the group products need the tensor-core backward (sm_80+)")
    # the 2.7B layer's heads per group: dCB is 10 % of x (its dC/dB products on wgmma on
    # Hopper with the build's sm_90a code)
    inputs = ssd_inputs(1, 1024, 80, 64, 128, 1, torch.bfloat16, "cuda")
    assert _backward_variant(inputs, 256) == ("group_wgmma" if _wgmma_device() else "group_mma")
    # one head per group: dCB 4 x the size of x at P = 128 and 8 x at P = 64, a ragged last
    # chunk or not (the group products); 16 x at P = 32 (the per-head products)
    for L, H, P, N in [(1024, 4, 128, 256), (1000, 8, 64, 128)]:
        inputs = ssd_inputs(1, L, H, P, N, H, torch.bfloat16, "cuda")
        assert _backward_variant(inputs, 256) == ("group_wgmma" if _wgmma_device() else "group_mma"), P
    inputs = ssd_inputs(1, 1024, 8, 32, 128, 8, torch.bfloat16, "cuda")
    assert _backward_variant(inputs, 256) == "chunked_mma"
    # not for float32 (SIMT) or head_dim > 128
    for dtype, P, N in [(torch.float32, 64, 64), (torch.bfloat16, 256, 64)]:
        inputs = ssd_inputs(1, 1024, 64, P, N, 1, dtype, "cuda")
        assert _backward_variant(inputs, 256) not in ("group_mma", "group_wgmma"), (dtype, P, N)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", GROUP_SHAPES + SHAPES[:3], ids=lambda s: "B{}L{}H{}P{}N{}G{}Q{}".format(*s))
def test_backward_against_the_reference(dtype, shape, backward):
    b, L, H, P, N, G, Q = shape
    inputs = ssd_inputs(b, L, H, P, N, G, dtype, "cuda")
    leaves = [t.detach().requires_grad_() for t in inputs]
    assert _backward_variant(inputs, Q) == (backward if backward != "staged" else "chunked_mma")
    y = bt.ssd_chunk_scan(*leaves, chunk_size=Q)
    dy = torch.randn(y.shape, dtype=torch.float64).to(device="cuda", dtype=dtype)
    poison_fresh_outputs()
    grads = torch.autograd.grad(y, leaves, dy)
    _, g64 = reference_grads(inputs, dy)
    rtol = rtol_for(dtype, "cuda")
    for name, g, e in zip(("dx", "ddt", "dA", "dB", "dC"), grads, g64):
        check(g, e, rtol, f"{name} of {shape} ({backward})")


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_backward_every_option(dtype, backward):
    """Every mamba_chunk_scan_combined option, seq_idx included (the group products see
    only the cumsums, which carry the resets)."""
    rng = random.Random(77 + HALF.index(dtype))
    torch.manual_seed(9)
    for i in range(8):
        b, L, H, P, N, G, Q = GROUP_SHAPES[i % len(GROUP_SHAPES)]
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", seq_idx=(i % 2 == 1) or None,
                          init=(i % 2 == 0) or None, z=(i % 3 != 2) or None)
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} {sorted(t)} {kw} ({backward})")


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_dt_of_both_signs(dtype, backward):
    """dt_limit's lower end below 0 keeps negative dt, so a head's cumsum is not monotone:
    the fused forward and the backward's products keep one exp a pair (the plan's
    factored_decays is off: kernels/cuda/ssd_chunk_scan_tc.cuh, "factored weights"). Out,
    final states and gradients against the float64 recurrence, at two group shapes, the
    second with seq_idx."""
    rng = random.Random(41 + HALF.index(dtype))
    torch.manual_seed(17)
    for i, (b, L, H, P, N, G, Q) in enumerate(GROUP_SHAPES[:2]):
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", D=False, z=False, dt_bias=False, init=False,
                          seq_idx=i == 1, softplus=False, limit=False)
        t["dt"] = negative_dt(t["dt"])
        kw["dt_limit"] = (-0.5, float("inf"))
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} dt of both signs ({backward})")


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_decays_that_flush_to_zero(dtype, backward):
    """dt spikes of 100 with A <= -2 (a decay below exp(-200), 0 in float32; x = 0 there, so
    that the spike's own input stays in range) inside chunks, 3 % of the steps: with the
    factored weights (the plan's factored_decays, dt >= 0) a factor flushes to 0 exactly
    where the pair's weight does, so nothing becomes NaN or leaks past a spike. Out, final
    states and gradients against the float64 recurrence, at two group shapes."""
    rng = random.Random(43 + HALF.index(dtype))
    torch.manual_seed(19)
    for b, L, H, P, N, G, Q in GROUP_SHAPES[:2]:
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", D=False, z=False, dt_bias=False, init=True,
                          seq_idx=False, softplus=False, limit=False)
        spikes = torch.rand(t["dt"].shape, device="cuda") < 0.03
        t["dt"] = torch.where(spikes, torch.full_like(t["dt"], 100.0), t["dt"].clamp_min(0))
        t["x"] = torch.where(spikes[..., None], torch.zeros_like(t["x"]), t["x"])
        t["A"] = t["A"] - 2
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} dt spikes ({backward})")


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_backward_dD(dtype, backward):
    """dD of [H] and [H, P], with z and without, every group shape: with the group products
    the dx kernel writes dD's partials (one per row tile of a chunk; zeros for the tiles
    past a short last chunk, the heads split over blocks, P not a multiple of 64), with z
    too, and the gate kernel runs only with z; the per-head backward's gate kernel writes
    them (the group products' with z by positions' rows, having no partials to write)."""
    rng = random.Random(5 + HALF.index(dtype))
    torch.manual_seed(5)
    for i, (b, L, H, P, N, G, Q) in enumerate(GROUP_SHAPES):
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", D=("h", "hdim")[i % 2], z=i % 3 == 0)
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} {sorted(t)} {kw} ({backward})")
    # which kernel sums dy_pre·x: the group dx kernel's DD instantiation (its third template
    # flag), with z or without; the gate kernel runs for z, or for dD in the per-head backward
    b, L, H, P, N, G, Q = GROUP_SHAPES[0]
    for z in (False, True):
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, "cuda", D="h", z=z)
        dout, dfinal = torch.randn_like(t["x"]), torch.randn(b, H, P, N, device="cuda")
        names = cuda_kernel_names(lambda: run_ours(t, kw, Q, dout, dfinal))
        dd = {m.group(1) == "true" for name in names
              for m in [re.search(r"ssd_group_dx_kernel<[^,]+,\s*(?:true|false),\s*(true|false)", name)] if m}
        assert dd == (set() if backward == "staged" else {True}), (backward, z, names)
        segment, rows = (any(k + "<" in n for n in names) for k in ("ssd_gate_kernel", "ssd_gate_rows_kernel"))
        assert (segment, rows) == (backward == "staged", z and backward != "staged"), (backward, z, names)


@requires_cuda
def test_group_products_agree_with_the_per_head_products_and_replay_in_a_graph():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the group products need the tensor-core backward (sm_80+)")
    b, L, H, P, N, G, Q = 2, 700, 16, 64, 128, 2, 256
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    dy = torch.randn_like(x)
    run = lambda: ops.ssd_chunk_scan_backward(dy, x, dt, A, B, C, Q)  # noqa: E731
    results = {}
    names = ("staged", "group_mma") + (("group_wgmma",) if _wgmma_device() else ())
    for name in names:
        previous = bt._C._ssd_cuda_backward(name)
        try:
            assert bt.explain(ops.ssd_chunk_scan_backward, dy, x, dt, A, B, C, Q).variant == \
                (name if name != "staged" else "chunked_mma")
            results[name] = run()
            again = run()
            assert all(torch.equal(u, v) for u, v in zip(results[name], again)), name
            if name != "staged":
                graph, out_g = capture_graph(run)
                for t in out_g:
                    t.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                assert all(torch.equal(u, v) for u, v in zip(out_g, results[name]))
        finally:
            bt._C._ssd_cuda_backward(previous)
    eps = torch.finfo(torch.bfloat16).eps
    for group in names[1:]:
        for name, u, v in zip(("dx", "ddt", "dA", "dB", "dC"), results["staged"], results[group]):
            rel = ((u.double() - v.double()).norm() / v.double().norm()).item()
            assert rel < 8 * eps, (group, name, rel)


def _group_backward(seqs):
    """The group products' backward at B2 L700 H16 P64 N128 G2 (bf16, chunk 256) with `seqs`
    packed sequences a row (starts inside chunks; 0: no seq_idx): (x, backward(dout) →
    dx, ddt, dA, dB, dC). Skips below sm_80 (the tensor-core backward)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the group products need the tensor-core backward (sm_80+)")
    b, L, H, P, N, G, Q = 2, 700, 16, 64, 128, 2, 256
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    seq_idx = (torch.arange(L, device="cuda", dtype=torch.int32) * seqs // L).expand(b, L).contiguous() \
        if seqs else None
    assert bt.explain(ops.ssd_chunk_scan_backward, x, x, dt, A, B, C, Q).variant.startswith("group_")
    return x, lambda dout: ops.ssd_chunk_scan_combined_backward(dout, None, x, dt, A, B, C, Q, seq_idx=seq_idx)[:5]


def _on_one_stream(fn):
    """fn() with every kernel of the SSD backward on the caller's stream."""
    previous = bt._C._ssd_cuda_backward_side_stream("off")
    try:
        return fn()
    finally:
        bt._C._ssd_cuda_backward_side_stream(previous)


@requires_cuda
@pytest.mark.parametrize("seqs", [0, 5], ids=["no_seq_idx", "five_sequences"])
def test_side_streams_keep_the_bits_on_any_stream_and_in_a_graph(seqs):
    """The group products' backward with its kernels on side streams (the plan's choice: dCB
    beside the state kernels; with seq_idx each SEG launch beside its plain one) gives the
    bits of the backward with every kernel on the caller's stream, on the default stream, on
    a stream of the caller's own whose earlier work it must wait for, and replayed from a
    CUDA graph; each pass's outputs NaN-poisoned first. (seqs = 5: starts at 140, 280, 420
    and 560, chunk 1 holding two.)"""
    x, backward = _group_backward(seqs)
    dout = torch.randn_like(x)
    run = lambda: backward(dout)  # noqa: E731
    expected = _on_one_stream(run)
    assert all(torch.isfinite(t).all() for t in expected)
    poison_fresh_outputs()
    assert all(torch.equal(u, v) for u, v in zip(run(), expected))
    # a stream of the caller's own, busy with the inputs' last writes when the op starts:
    # the side streams must wait for them (a missing fork reads the old dout)
    stream = torch.cuda.Stream()
    late = dout.clone()
    dout.fill_(float("nan"))
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000)
        dout.copy_(late)
        got = run()
    torch.cuda.current_stream().wait_stream(stream)
    assert all(torch.equal(u, v) for u, v in zip(got, expected))
    graph, out_g = capture_graph(run)
    for t in out_g:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(u, v) for u, v in zip(out_g, expected))


@requires_cuda
def test_side_streams_of_several_host_threads_stay_apart():
    """Four host threads, each on a stream of its own, run the group products' backward with
    7 packed sequences at once, five times each: every result has the one-stream bits (a
    thread's side streams and events are its own; shared ones would let one thread's fork
    or join order another's work)."""
    x, run = _group_backward(7)
    douts = [torch.randn_like(x) for _ in range(4)]
    expected = _on_one_stream(lambda: [run(d) for d in douts])
    torch.cuda.synchronize()
    got, errors = [[] for _ in douts], []

    def worker(k):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(5):
                    got[k].append(run(douts[k]))
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(douts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, outs in enumerate(got):
        assert len(outs) == 5
        for out in outs:
            assert all(torch.equal(u, v) for u, v in zip(out, expected[k])), k


@pytest.mark.parametrize("switch, choices, expected", [
    ("_ssd_cuda_backward_side_stream", ["off"], "auto or off"),
    ("_ssd_cuda_state_wgmma", ["off"], "auto or off"),
    ("_ssd_cuda_dx_wgmma", ["on", "off"], "auto, off or on"),
    ("_ssd_cuda_gate_rows", ["off"], "auto or off"),
    ("_ssd_cuda_split_share", ["on", "off"], "auto, off or on"),
    ("_ssd_cuda_fused_pdl", ["off"], "auto or off"),
    ("_state_update_whole_tiles", ["on", "off"], "auto, off or on"),
    ("_rope_cos_sin_table_vectors", ["any", "never"], "auto, any or never"),
    ("_rope_cos_sin_walk32", ["off"], "auto or off"),
    ("_ssd_cuda_backward", ["group_mma", "group_wgmma", "staged"], "auto, staged, group_mma or group_wgmma"),
])
def test_switch_names_its_choices(switch, choices, expected):
    """Each setting returns the one before it; a name it does not know raises, naming those
    it does."""
    fn = getattr(bt._C, switch)
    previous = "auto"
    assert fn("auto") == previous
    for name in choices:
        assert fn(name) == previous
        previous = name
    with pytest.raises(ValueError, match=expected):
        fn("sometimes")
    assert fn("auto") == previous


@requires_cuda
@pytest.mark.parametrize("shape", [
    (2, 700, 4, 64, 128, 1, 256),  # the 2.7B layer's P and N: the group products' backward
    (1, 333, 2, 96, 192, 1, 128),  # staged forward; a 32-column head_dim tile, a 64-column state block, short steps
], ids=["P64-N128", "P96-N192"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "seq_idx"])
def test_chunk_states_on_wgmma_keep_the_bits(shape, packed):
    """The chunk-state kernel's products on wgmma (the plan's choice on sm_90a where a block
    computes 128 state columns, with or without seq_idx) give the bits of its mma.sync
    products: the staged forward and the backward, outputs NaN-poisoned; on such a device
    the wgmma instantiation is the one that runs, and only there."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the chunk-state kernel on tensor cores needs sm_80+")
    b, L, H, P, N, G, Q = shape
    torch.manual_seed(11)
    inputs = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    dy = torch.randn_like(inputs[0])
    seq_idx = _sequence_ids(b, L, Q, "dense", torch.int32).cuda() if packed else None

    def run():
        previous = bt._C._ssd_cuda_forward("staged")
        try:
            if packed:
                out = ops.ssd_chunk_scan_combined(*inputs, Q, seq_idx=seq_idx)[:2]
            else:
                out = [ops.ssd_chunk_scan(*inputs, Q)]
        finally:
            bt._C._ssd_cuda_forward(previous)
        if packed:
            grads = ops.ssd_chunk_scan_combined_backward(dy, None, *inputs, Q, seq_idx=seq_idx)[:5]
        else:
            grads = ops.ssd_chunk_scan_backward(dy, *inputs, Q)
        return [*out, *grads]

    def kernels_of(fn):  # (SEG, WG): the instantiations' last two flags
        return {m.groups() for name in cuda_kernel_names(fn)
                for m in [re.search(r"ssd_tc_chunk_state_kernel<[^>]*,\s*(true|false),\s*(true|false)>", name)]
                if m}

    previous = bt._C._ssd_cuda_state_wgmma("off")
    try:
        expected = run()
        assert kernels_of(run) == {(str(packed).lower(), "false")}
    finally:
        bt._C._ssd_cuda_state_wgmma(previous)
    assert all(torch.isfinite(t).all() for t in expected)
    poison_fresh_outputs()
    got = run()
    for k, (u, v) in enumerate(zip(got, expected)):
        assert torch.equal(u, v), k
    assert kernels_of(run) == {(str(packed).lower(), str(has_wgmma()).lower())}


@requires_cuda
@pytest.mark.parametrize("options", ["D_z", "D", "none"])
def test_dx_on_wgmma_keeps_the_bits(options):
    """The group dx kernel's P·dy on wgmma (the plan's choice on sm_90a with D, with or
    without z; "on" takes it without D too) gives the bits of its mma.sync products: every
    gradient, NaN-poisoned outputs; with the plan's choice the wgmma instantiation runs
    exactly where the plan says, and "on" runs it on such a device."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the group products need sm_80+")
    b, L, H, P, N, G, Q = 2, 700, 4, 64, 128, 1, 256
    torch.manual_seed(12)
    inputs = ssd_inputs(b, L, H, P, N, G, torch.bfloat16, "cuda")
    kw = {}
    if options != "none":
        kw["D"] = torch.randn(H, device="cuda")
    if options == "D_z":
        kw["z"] = torch.randn_like(inputs[0])
    leaves = [t.requires_grad_() for t in [*inputs, *kw.values()]]
    dy = torch.randn_like(inputs[0])

    def run():
        y = mamba.mamba_chunk_scan_combined(*inputs, Q, **kw)
        return torch.autograd.grad(y, leaves, dy)

    def wgmma_runs(fn):  # (the plain instantiation's last flag)
        return {m.group(1) == "true" for name in cuda_kernel_names(fn)
                for m in [re.search(r"ssd_group_dx_kernel<[^>]*,\s*false,\s*(true|false)>", name)] if m}

    previous = bt._C._ssd_cuda_dx_wgmma("off")
    try:
        expected = run()
        assert wgmma_runs(run) == {False}
        for setting in ("auto", "on"):
            bt._C._ssd_cuda_dx_wgmma(setting)
            poison_fresh_outputs()
            got = run()
            for k, (u, v) in enumerate(zip(got, expected)):
                assert torch.equal(u, v), (setting, k)
            assert wgmma_runs(run) == {has_wgmma() and (setting == "on" or options != "none")}, setting
    finally:
        bt._C._ssd_cuda_dx_wgmma(previous)
    assert all(torch.isfinite(t).all() for t in expected)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("z_layout", ["dense", "strided", "unaligned"])
def test_gate_rows_keep_the_bits(dtype, z_layout):
    """The backward's gate kernel by positions' rows (the plan's choice with z where dx
    writes dD's partials) gives the segment kernel's bits: every gradient, NaN-poisoned
    outputs; it runs where z's d is contiguous and 16-byte aligned (z a slice of a wider
    projection, as in a Mamba-2 layer, included), the segment kernel where it is not."""
    if torch.cuda.get_device_capability()[0] < 8 and dtype != torch.float32:
        pytest.skip("the group products need sm_80+")
    b, L, H, P, N, G, Q = 2, 700, 4, 64, 128, 1, 256
    torch.manual_seed(13)
    inputs = ssd_inputs(b, L, H, P, N, G, dtype, "cuda")
    wide = torch.randn(b, L, H * P + 8, device="cuda", dtype=dtype)
    z = {"dense": torch.randn_like(inputs[0]),
         "strided": wide[..., 8:].unflatten(-1, (H, P)),
         "unaligned": wide[..., 1:H * P + 1].unflatten(-1, (H, P))}[z_layout]
    kw = {"D": torch.randn(H, device="cuda"), "z": z}
    leaves = [t.requires_grad_() for t in inputs] + [kw["D"].requires_grad_()]
    dy = torch.randn_like(inputs[0])

    def run():
        z_leaf = kw["z"].detach().requires_grad_()
        y = mamba.mamba_chunk_scan_combined(*inputs, Q, D=kw["D"], z=z_leaf)
        return torch.autograd.grad(y, leaves + [z_leaf], dy)

    def rows_run(fn):
        names = " ".join(cuda_kernel_names(fn))
        return "ssd_gate_rows_kernel" in names, "ssd_gate_kernel" in names

    previous = bt._C._ssd_cuda_gate_rows("off")
    try:
        expected = run()
        assert rows_run(run) == (False, True)
        bt._C._ssd_cuda_gate_rows("auto")
        poison_fresh_outputs()
        got = run()
        for k, (u, v) in enumerate(zip(got, expected)):
            assert torch.equal(u, v), k
        rows = _backward_variant(inputs, Q).startswith("group") and z_layout != "unaligned"
        assert rows_run(run) == (rows, not rows)
    finally:
        bt._C._ssd_cuda_gate_rows(previous)
    assert all(torch.isfinite(t).all() for t in expected)


# The SSD kernels each variant `explain` names must run, and those of no other variant
# (names as torch.profiler reports them; a kernel name is matched as a whole word).
_VARIANT_KERNELS = {
    ("forward", "fused_mma"): {"ssd_fused_forward_kernel"},
    ("forward", "fused_mma_cb"): {"ssd_fused_cb_kernel", "ssd_fused_forward_kernel"},
    ("forward", "chunked_mma"): {"ssd_tc_chunk_state_kernel", "ssd_state_pass_kernel", "ssd_tc_scan_kernel"},
    ("forward", "chunked"): {"ssd_chunk_state_kernel", "ssd_state_pass_kernel", "ssd_scan_kernel"},
    ("backward", "group_mma"): {"ssd_tc_chunk_state_kernel", "ssd_state_pass_kernel", "ssd_state_pass_bwd_kernel",
                                "ssd_group_dcb_kernel", "ssd_group_dx_kernel", "ssd_group_grad_kernel"},
    ("backward", "chunked_mma"): {"ssd_tc_chunk_state_kernel", "ssd_state_pass_kernel", "ssd_state_pass_bwd_kernel",
                                  "ssd_tc_scan_kernel", "ssd_tc_dacs_kernel"},
    ("backward", "chunked"): {"ssd_chunk_state_kernel", "ssd_state_pass_kernel", "ssd_state_pass_bwd_kernel",
                              "ssd_scan_kernel", "ssd_dacs_kernel"},
}
# group_wgmma runs group_mma's kernels (the dC/dB kernel's products on wgmma)
_VARIANT_KERNELS[("backward", "group_wgmma")] = _VARIANT_KERNELS[("backward", "group_mma")]
# Kernels no variant shares: each is the mark of the variants that list it.
_MARKS = {"ssd_fused_cb_kernel", "ssd_fused_forward_kernel", "ssd_fused_forward_sm90_kernel",
          "ssd_tc_chunk_state_kernel", "ssd_chunk_state_kernel", "ssd_tc_scan_kernel", "ssd_scan_kernel",
          "ssd_tc_dacs_kernel", "ssd_dacs_kernel",
          "ssd_group_dcb_kernel", "ssd_group_dx_kernel", "ssd_group_grad_kernel"}


def _ssd_kernels_run(fn):
    names = " ".join(cuda_kernel_names(fn))
    return {k for k in _MARKS | {"ssd_state_pass_kernel", "ssd_state_pass_bwd_kernel"}
            if re.search(r"(?<![A-Za-z0-9_])" + k + r"(?![A-Za-z0-9_])", names)}


@requires_cuda
@pytest.mark.parametrize("case", [
    (torch.bfloat16, (2, 700, 16, 64, 128, 1, 256)),  # fused forward, group products
    (torch.bfloat16, (1, 600, 4, 32, 128, 4, 256)),   # staged forward (P = 32), per-head products
    (torch.bfloat16, (1, 600, 4, 64, 256, 2, 256)),   # N = 256: fused_mma_cb on Hopper, else staged
    (torch.float32, (1, 300, 4, 64, 64, 1, 128)),     # the SIMT kernels
], ids=["bf16-group", "bf16-perhead", "bf16-N256", "f32"])
def test_explain_names_the_kernels_that_run(case):
    """What `explain` reports for the forward and the backward is what the profiler sees run:
    every kernel of that variant, and no kernel that marks another (issue: the plan owns
    every SSD choice; before, a tensor-core or SIMT choice at launch could differ)."""
    dtype, (b, L, H, P, N, G, Q) = case
    inputs = ssd_inputs(b, L, H, P, N, G, dtype, "cuda")
    fwd = bt.explain("ssd_chunk_scan", *inputs, chunk_size=Q).variant
    bwd = _backward_variant(inputs, Q)
    dy = torch.randn_like(inputs[0])
    for mode, variant, fn in [
        ("forward", fwd, lambda: ops.ssd_chunk_scan(*inputs, Q)),
        ("backward", bwd, lambda: ops.ssd_chunk_scan_backward(dy, *inputs, Q)),
    ]:
        want = _VARIANT_KERNELS[(mode, variant)]
        ran = _ssd_kernels_run(fn)
        assert want <= ran, (mode, variant, sorted(want - ran))
        assert not (ran & _MARKS) - want, (mode, variant, sorted((ran & _MARKS) - want))


# ---- the chunk states kept for the backward (keep_states) --------------------------------

def _kept_case(shape, dtype, packed):
    b, L, H, P, N, G, Q = shape
    torch.manual_seed(21)
    x, dt, A, B, C = ssd_inputs(b, L, H, P, N, G, dtype, "cuda")
    init = torch.randn(b, H, P, N, dtype=torch.float64).to("cuda", torch.float32)
    seq_idx = _sequence_ids(b, L, Q, "dense", torch.int32).cuda() if packed else None
    return (x, dt, A, B, C), init, seq_idx


@requires_cuda
@pytest.mark.parametrize("forward", ["plan", "staged", "fused_mma", "fused_mma_cb", "fused_wgmma", "simt"])
@pytest.mark.parametrize("case", [
    (torch.bfloat16, (2, 700, 4, 64, 128, 1, 256), False),
    (torch.float16, (1, 530, 2, 64, 100, 1, 256), True),   # N not a multiple of 8
    (torch.bfloat16, (1, 300, 4, 64, 256, 2, 128), False),  # N = 256: two halves on the fused kernels
    (torch.bfloat16, (1, 77, 2, 64, 36, 2, 64), True),      # N not a multiple of 8 (of 4 on wgmma)
], ids=["bf16-N128", "f16-N100-seq", "bf16-N256", "bf16-N36-seq"])
def test_kept_states_are_the_chunk_states(forward, case):
    """keep_states: the forward returns H_c, the state entering each chunk, rounded to x's
    dtype, against the float64 recurrence's state after the chunks before it, from every
    CUDA forward (the fused kernels store it from shared memory or registers, the staged
    one from its state pass, the SIMT one rounds its float32 states); and the backward
    that reads them in place of recomputing them against the one that recomputes: the same
    bits where the forward was the staged one (the same kernels computed them), close to it
    otherwise."""
    dtype, shape, packed = case
    b, L, H, P, N, G, Q = shape
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the fused and tensor-core kernels need sm_80+")
    if forward in fused_kernels() or forward in ("plan", "staged"):
        previous = bt._C._ssd_cuda_forward("auto" if forward == "plan" else forward)
        cap = None
    elif forward == "simt":
        previous = bt._C._ssd_cuda_forward("auto")
        cap = bt._C._cuda_smem_optin_cap(16 * 1024)  # too small for the tensor-core kernels
    else:
        pytest.skip(f"{forward} does not run on this device or build")
    inputs, init, seq_idx = _kept_case(shape, dtype, packed)
    if forward == "fused_wgmma" and packed:
        pytest.skip("fused_wgmma takes no seq_idx")
    try:
        variant = bt.explain(ops.ssd_chunk_scan_combined, *inputs, Q, initial_states=init, seq_idx=seq_idx,
                             keep_states=True).variant
        if forward == "simt":
            assert variant == "chunked"
        elif forward == "staged":
            assert variant == "chunked_mma"
        elif forward != "plan" and variant != forward:
            pytest.skip(f"{forward} does not take {shape}")
        poison_fresh_outputs()
        out, final, _, states = ops.ssd_chunk_scan_combined(*inputs, Q, initial_states=init, seq_idx=seq_idx,
                                                            keep_states=True)
        nc = (L + Q - 1) // Q
        assert states.shape == (b, H, nc, P, N) and states.dtype == dtype and states.is_contiguous()
        want = kept_states_reference(*inputs, Q, init, seq_idx)
        check(states, want, rtol_for(dtype, "cuda"), f"kept states ({forward}, {shape})")
        # the backward with them and without
        dy, dfinal = torch.randn_like(out), torch.randn_like(final)
        args = (dy, dfinal, *inputs, Q, None, None, None, init, seq_idx, None, False, 0.0, None)
        poison_fresh_outputs()
        kept = ops.ssd_chunk_scan_combined_backward(*args, states)
        again = ops.ssd_chunk_scan_combined_backward(*args, None)
        for name, g, e in zip(("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinit"), kept, again):
            if g.numel() == 0:  # (absent: no D, z or dt_bias)
                assert e.numel() == 0, name
            elif forward == "staged" or forward == "simt":  # (the SIMT backward reads no kept states)
                assert torch.equal(g, e), name
            else:
                check(g, e.double(), rtol_for(dtype, "cuda"), f"{name} with the kept states ({forward})")
    finally:
        bt._C._ssd_cuda_forward(previous)
        if cap is not None:
            bt._C._cuda_smem_optin_cap(cap)


@requires_cuda
def test_kept_states_follow_the_setting_and_the_gradients():
    """mamba_chunk_scan_combined keeps the chunk states where a gradient will be needed and
    set_keep_chunk_states allows it (the backward then runs no chunk-state kernel), and
    gives the same gradients either way (close: the fused forward and the recomputing
    backward round the same states from differently ordered sums)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernels need sm_80+")
    inputs = ssd_inputs(2, 600, 8, 64, 128, 1, torch.bfloat16, "cuda")
    dy = torch.randn_like(inputs[0])

    def grads():
        leaves = [t.detach().requires_grad_() for t in inputs]
        out = mamba.mamba_chunk_scan_combined(*leaves, 256)
        return torch.autograd.grad(out, leaves, dy)

    def chunk_state_kernels(fn):
        return [n for n in cuda_kernel_names(fn) if "chunk_state_kernel" in n]

    previous = mamba.set_keep_chunk_states(True)
    try:
        assert previous is True  # the default
        kept = grads()
        assert len(chunk_state_kernels(grads)) == 1  # the backward's local dstates only
        assert mamba.set_keep_chunk_states(False) is True
        again = grads()
        assert len(chunk_state_kernels(grads)) == 2  # and the recomputed S_c
    finally:
        mamba.set_keep_chunk_states(previous)
    for name, g, e in zip(("dx", "ddt", "dA", "dB", "dC"), kept, again):
        check(g, e.double(), rtol_for(torch.bfloat16, "cuda"), name)
    with torch.no_grad():  # no gradient: nothing kept
        out = ops.ssd_chunk_scan_combined(*inputs, 256, keep_states=mamba._keep_chunk_states(*inputs))
    assert out[3].numel() == 0


@requires_cuda
def test_kept_states_under_torch_compile():
    """torch.compile(fullgraph=True) of mamba_chunk_scan_combined in bfloat16 with a gradient,
    the chunk states kept: the fake kernel gives the kept states the real ones' shape (its
    rule is the dtype's: under FakeTensorMode a CUDA tensor reaches a meta kernel as a meta
    tensor), and the compiled forward and backward give eager's bits."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core kernels need sm_80+")
    inputs = ssd_inputs(1, 300, 4, 64, 64, 1, torch.bfloat16, "cuda")
    leaves = [t.detach().requires_grad_() for t in inputs]
    dy = torch.randn_like(inputs[0])

    def f(*ts):
        return mamba.mamba_chunk_scan_combined(*ts, 128)

    eager = f(*leaves)
    want = torch.autograd.grad(eager, leaves, dy)
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(*leaves)
    got = torch.autograd.grad(out, leaves, dy)
    assert torch.equal(out, eager)
    for name, g, e in zip(("dx", "ddt", "dA", "dB", "dC"), got, want):
        assert torch.equal(g, e), name
