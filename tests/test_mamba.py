"""mamba_chunk_scan_combined's contract (torch.ops.baracuda.ssd_chunk_scan_combined and
baracuda_torch.mamba): every option (D [H] / [H, P], z, dt_bias, dt_softplus, dt_limit,
initial and final states, seq_idx) and mixed dtypes, forward and all gradients against
the float64 step-by-step reference (reference.ssd_chunk_scan_combined); gradcheck;
degenerate extents; poisoned outputs; explain (opcheck, torch.compile and the
bad-input table: tests/op_db.py, run by tests/test_ops.py); the Python wrapper's return conventions and varlen states;
mamba_split_conv1d_scan_combined against a pure-PyTorch composition; Mamba2's
state_dict against mamba_ssm's names and shapes.

Tolerances: those of test_ssd_chunk_scan (rtol_for), applied to every output.
"""
import contextlib
import random

import pytest
import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import mamba
from baracuda_torch import reference as ref
from helpers import DEVICES, FLOAT_DTYPES, requires_cuda
from test_ssd_chunk_scan import check, rtol_for

ops = torch.ops.baracuda
INF = float("inf")
OPT_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def make_case(rng, b, L, H, P, N, G, dtype, device, *, D=None, z=None, dt_bias=None,
              init=None, seq_idx=None, softplus=None, limit=None, mixed=None):
    """Inputs of one problem; each option drawn at random unless given (True/False,
    or "hdim" for D [H, P]). dt, A, D, dt_bias and initial_states are float32 or the
    activation dtype at random when `mixed`."""
    pick = lambda v, p=0.5: rng.random() < p if v is None else v  # noqa: E731
    mixed = pick(mixed)
    small = lambda: torch.float32 if mixed and rng.random() < 0.5 else dtype  # noqa: E731
    softplus = pick(softplus)
    x = torch.randn(b, L, H, P, dtype=torch.float64)
    if softplus:
        dt = torch.randn(b, L, H, dtype=torch.float64) - 1.5   # raw: softplus makes it > 0
        dt[..., 0] = 21.0 if L else 0.0                        # above the softplus threshold
    else:
        dt = F.softplus(torch.randn(b, L, H, dtype=torch.float64) - 1)
        if L > 1:
            dt[:, 1] = -0.3                                    # negative: clamped to dt_min
    A = -torch.exp(0.5 * torch.randn(H, dtype=torch.float64))
    Bm = torch.randn(b, L, G, N, dtype=torch.float64)
    Cm = torch.randn(b, L, G, N, dtype=torch.float64)
    t = {"x": x.to(dtype), "dt": dt.to(small()), "A": A.to(small()), "B": Bm.to(dtype),
         "C": Cm.to(dtype)}
    D = pick(D) and (rng.choice(["h", "hdim"]) if D is None else D)
    if D:
        shape = (H, P) if D == "hdim" else (H,)
        t["D"] = torch.randn(shape, dtype=torch.float64).to(small())
    if pick(z):
        t["z"] = torch.randn(b, L, H, P, dtype=torch.float64).to(dtype)
    if pick(dt_bias):
        t["dt_bias"] = (0.3 * torch.randn(H, dtype=torch.float64)).to(small())
    if pick(init):
        t["initial_states"] = torch.randn(b, H, P, N, dtype=torch.float64).to(small())
    if pick(seq_idx):
        # Sequence starts anywhere (inside chunks too), int32 or int64.
        starts = (torch.rand(b, L) < 0.15)
        if L:
            starts[:, 0] = False
        t["seq_idx"] = starts.cumsum(1).to(rng.choice([torch.int32, torch.int64]))
    limit = pick(limit, 0.3)
    kw = {"dt_softplus": softplus,
          "dt_limit": (0.02, 0.8) if limit else (0.0, INF)}
    return {k: v.to(device) for k, v in t.items()}, kw


def run_ours(t, kw, chunk, dout, dfinal):
    leaves = {k: (v.detach().requires_grad_() if v.is_floating_point() else v) for k, v in t.items()}
    out, final = mamba.mamba_chunk_scan_combined(
        leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], chunk,
        D=leaves.get("D"), z=leaves.get("z"), dt_bias=leaves.get("dt_bias"),
        initial_states=leaves.get("initial_states"), seq_idx=leaves.get("seq_idx"),
        return_final_states=True, **kw)
    names = [k for k in OPT_NAMES if k in leaves]
    grads = torch.autograd.grad([out, final], [leaves[k] for k in names], [dout, dfinal])
    return out, final, dict(zip(names, grads))


def run_reference(t, kw, dout, dfinal):
    leaves = {k: (v.detach().cpu().double().requires_grad_() if v.is_floating_point()
                  else v.cpu()) for k, v in t.items()}
    out, final = ref.ssd_chunk_scan_combined(
        leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], 1,
        D=leaves.get("D"), z=leaves.get("z"), dt_bias=leaves.get("dt_bias"),
        initial_states=leaves.get("initial_states"), seq_idx=leaves.get("seq_idx"),
        return_final_states=True, **kw)
    names = [k for k in OPT_NAMES if k in leaves]
    grads = torch.autograd.grad([out, final], [leaves[k] for k in names],
                                [dout.cpu().double(), dfinal.cpu().double()], allow_unused=True)
    return out.detach(), final.detach(), {k: (g if g is not None else torch.zeros_like(leaves[k]))
                                          for k, g in zip(names, grads)}


def check_case(t, kw, chunk, what):
    x = t["x"]
    dtype, device = x.dtype, x.device
    out_shape = x.shape
    b, L, H, P = x.shape
    N = t["B"].size(-1)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    dout = torch.randn(out_shape, dtype=torch.float64).to(device=device, dtype=dtype)
    dfinal = torch.randn(b, H, P, N, dtype=torch.float64).to(device=device, dtype=state_dtype)
    out, final, grads = run_ours(t, kw, chunk, dout, dfinal)
    out64, final64, g64 = run_reference(t, kw, dout, dfinal)
    rtol = rtol_for(dtype, device.type)
    assert out.dtype == dtype and out.shape == out_shape and out.is_contiguous()
    assert final.dtype == state_dtype and final.shape == (b, H, P, N)
    check(out, out64, rtol, "out of " + what)
    check(final, final64, rtol, "final_states of " + what)
    grad_rtol = rtol
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and "z" in t:
        # On the tensor-core path the gated gradient dy·silu(z) is stored in x's dtype
        # before it feeds the products (as mamba_ssm does): one more rounding of every dy.
        # Measured on an H200: dA off by 2.8 bfloat16 eps of its scale in one case, and by
        # 4.5 float16 eps in another (head_dim 80, the same error with each of the three
        # CUDA backwards: the rounding, not a kernel).
        grad_rtol = 8 * torch.finfo(dtype).eps
    for k, g in grads.items():
        assert g.shape == t[k].shape and g.dtype == t[k].dtype, k
        # A float32 gradient of a float64 problem is rounded to float32 once.
        tol = max(grad_rtol, rtol_for(g.dtype, device.type))
        if k == "dt_bias":
            # ddt_bias is the sum over batch and positions of ddt, each with its own
            # rounding: its error grows with the terms' 2-norm (per head), not with their
            # sum, which may cancel. Measured on an H200 (float16, B1 L333 H2 P64 N32 chunk
            # 100, seq_idx, the staged backward): sums -32.6 and -60.2 of terms with 2-norms
            # 953 and 302 (absolute sums 11063 and 3417), off by 0.397 = 6.6 eps of 60.2,
            # at most 1.3 eps of a 2-norm, while every ddt was within 2 eps of its scale.
            spread = g64["dt"].reshape(-1, H).norm(dim=0).max().item()
            tol *= max(1.0, spread / max(g64[k].abs().max().item(), 1e-30))
        check(g, g64[k], tol, f"d{k} of {what}")


# (B, L, H, P, N, G, chunk): odd L, chunks not dividing L, chunk 1, G = 1, G = H, 1 < G < H.
SHAPES = [
    (2, 37, 4, 8, 6, 2, 16),
    (1, 10, 3, 3, 5, 3, 64),
    (2, 9, 6, 4, 3, 2, 1),
    (1, 70, 4, 5, 4, 1, 32),
    (2, 23, 2, 4, 8, 1, 7),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_random_option_combinations(device, dtype):
    rng = random.Random(1234 + FLOAT_DTYPES.index(dtype))
    torch.manual_seed(99)
    for i in range(12):
        b, L, H, P, N, G, Q = SHAPES[i % len(SHAPES)]
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, device)
        opts = sorted(k for k in t if k not in ("x", "dt", "A", "B", "C"))
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} {opts} {kw}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_dt_of_both_signs(device, dtype):
    """dt_limit's lower end below 0 keeps negative dt: a head's cumsum then rises and falls,
    and every kernel still matches the float64 recurrence (the CUDA tensor-core kernels
    keep one exp a pair then, the plan's factored_decays being off: test_ssd_fused's
    test_dt_of_both_signs runs this at their shapes)."""
    rng = random.Random(4321 + FLOAT_DTYPES.index(dtype))
    torch.manual_seed(21)
    for i in range(6):
        b, L, H, P, N, G, Q = SHAPES[i % len(SHAPES)]
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, device, softplus=False, limit=False)
        t["dt"] = negative_dt(t["dt"])
        kw["dt_limit"] = (-0.5, INF)
        check_case(t, kw, Q, f"{dtype} {(b, L, H, P, N, G, Q)} {sorted(t)} dt of both signs")


def negative_dt(dt):
    """make_case's dt (softplus(N(0, 1) − 1) > 0) with every fifth step −0.3 and step 2 at
    −0.7 (which dt_limit = (−0.5, inf) clamps): the cumsum rises at those steps and falls
    at the others, while the values stay of the order of a monotone run's."""
    d = dt.double().clone()
    d[:, ::5] = -0.3
    d[:, 2:3] = -0.7
    return d.to(dt.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_every_option_at_once(device):
    rng = random.Random(7)
    for D in ("h", "hdim"):
        t, kw = make_case(rng, 2, 41, 4, 6, 5, 2, torch.float32, device, D=D, z=True,
                          dt_bias=True, init=True, seq_idx=True, softplus=True, limit=True,
                          mixed=False)
        check_case(t, kw, 8, f"all options, D {D}")


@pytest.mark.parametrize("device", DEVICES)
def test_seq_idx_resets_state(device):
    """A boundary inside a chunk: the second sequence's output equals the scan run on it
    alone, and its final state is independent of the first sequence."""
    rng = random.Random(3)
    t, kw = make_case(rng, 1, 30, 2, 4, 3, 1, torch.float64, device, D=False, z=False,
                      dt_bias=False, init=False, seq_idx=False, softplus=False, limit=False)
    seq = torch.zeros(1, 30, dtype=torch.int32, device=device)
    seq[:, 13:] = 1
    full, fin = mamba.mamba_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], 8,
                                                seq_idx=seq, return_final_states=True)
    part, fin2 = mamba.mamba_chunk_scan_combined(t["x"][:, 13:], t["dt"][:, 13:], t["A"],
                                                 t["B"][:, 13:], t["C"][:, 13:], 8,
                                                 return_final_states=True)
    torch.testing.assert_close(full[:, 13:], part, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin, fin2, rtol=1e-12, atol=1e-12)


@contextlib.contextmanager
def _cuda_routes(forward, backward):
    """The SSD's CUDA forward and backward forced (bt._C._ssd_cuda_forward / _backward; no
    effect on the CPU), restored on exit."""
    previous = bt._C._ssd_cuda_forward(forward), bt._C._ssd_cuda_backward(backward)
    try:
        yield
    finally:
        bt._C._ssd_cuda_forward(previous[0])
        bt._C._ssd_cuda_backward(previous[1])


def _packed_grads(t, seq, dy, chunk, sl):
    """Output and gradients of the packed scan, restricted to steps `sl`; initial states
    only with the first sequence (they do not reach the later ones)."""
    names = ("x", "dt", "B", "C", "z", "initial_states")
    leaves = {k: t[k].detach().clone().requires_grad_() for k in names if k in t}
    kw = {k: v for k, v in leaves.items() if k in ("z", "initial_states")}
    y = mamba.mamba_chunk_scan_combined(leaves["x"], leaves["dt"], t["A"], leaves["B"],
                                        leaves["C"], chunk, D=t.get("D"), seq_idx=seq, **kw)
    grads = torch.autograd.grad(y, [leaves[k] for k in ("x", "dt", "B", "C")], dy)
    return [y[:, sl].detach()] + [g[:, sl] for g in grads]


# (float32: on CUDA the SIMT kernels, which end their products at every start as the CPU
# kernels do; the 16-bit types' tensor-core kernels: the tests below.)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preference", ["fastest", "precise"])
@pytest.mark.parametrize("chunk,cut", [(8, 13), (5, 15), (16, 1), (64, 39)])
def test_packed_sequences_keep_nan_to_themselves(device, preference, chunk, cut):
    """A NaN or Inf in one packed sequence (x, B, C, dt, z, the initial states, or the
    output gradient) stays there: every output and per-step gradient of the other
    sequence is what it is when that sequence holds finite values, forward and backward,
    for a boundary inside a chunk, on a chunk edge and next to the row's ends."""
    rng = random.Random(cut)
    L = 40
    t, _ = make_case(rng, 1, L, 3, 4, 5, 1, torch.float32, device, D=True, z=True,
                     dt_bias=False, init=True, seq_idx=False, softplus=False, limit=False)
    seq = torch.zeros(1, L, dtype=torch.int32, device=device)
    seq[:, cut:] = 1
    dy = torch.randn(1, L, 3, 4, device=device)
    first, second = slice(0, cut), slice(cut, L)
    with bt.preference(preference):
        clean_first = _packed_grads(t, seq, dy, chunk, first)
        clean_second = _packed_grads(t, seq, dy, chunk, second)
        for bad, keep, clean in ((first, second, clean_second), (second, first, clean_first)):
            for name in ("x", "B", "C", "dt", "z", "dy", "initial_states"):
                if name == "initial_states" and bad is second:
                    continue
                u = {k: v.clone() for k, v in t.items()}
                g = dy.clone()
                target = g if name == "dy" else u[name]
                if name == "initial_states":
                    target[0, 1, 2, 3] = float("nan")
                else:
                    step = bad.start + (bad.stop - bad.start) // 2
                    target[0, step] = float("inf") if name == "dt" else float("nan")
                got = _packed_grads(u, seq, g, chunk, keep)
                for what, a, b in zip(("y", "dx", "ddt", "dB", "dC"), got, clean):
                    where = f"a non-finite {name} in one sequence reaches the other's {what}"
                    assert torch.isfinite(a).all(), where
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=where)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_many_packed_sequences_keep_nan_to_themselves(device, dtype):
    """Two rows of several packed sequences (some of a few steps, several starts inside
    one 64-position tile and one 16-position step, one sequence across chunks,
    non-monotone ids): a NaN in one sequence's x, B, C or output gradient, or an Inf in its
    dt, changes no value of any other sequence's output or per-step gradients, on every
    chunk size. On CUDA the staged kernels (forced; at this head_dim the plan's choice
    too): SIMT for float32 and float64, tensor cores for the 16-bit types, with the
    per-head backward products and with the group products (mma.sync, and wgmma where
    the device has it)."""
    rng = random.Random(17)
    L, H = 150, 4
    t, _ = make_case(rng, 2, L, H, 6, 7, 2, dtype, device, D=True, z=False, dt_bias=False,
                     init=True, seq_idx=False, softplus=False, limit=False, mixed=False)
    cuts = [[0, 3, 5, 40, 44, 47, 52, 120, 150], [0, 1, 64, 66, 128, 150]]
    seq = torch.zeros(2, L, dtype=torch.int32)
    for r, cs in enumerate(cuts):
        for k in range(len(cs) - 1):
            seq[r, cs[k]:cs[k + 1]] = k % 3   # ids repeat: a start is where the id changes
    seq = seq.to(device)
    dy = torch.randn(2, L, H, 6, dtype=dtype, device=device)
    half = dtype in (torch.float16, torch.bfloat16)
    for backward in ("staged", "group_mma", "group_wgmma") if half and device == "cuda" else ("staged",):
        _many_packed_sequences(t, seq, dy, cuts, backward)


def _many_packed_sequences(t, seq, dy, cuts, backward):
    """test_many_packed_sequences_keep_nan_to_themselves on one CUDA backward route."""
    L, device = seq.shape[1], seq.device

    def run(u, g, chunk):
        with _cuda_routes("staged", backward):
            return _packed_grads(u, seq, g, chunk, slice(None))

    for chunk in (16, 64, 100):
        clean = run(t, dy, chunk)
        for r, cs in enumerate(cuts):
            for k in (1, len(cs) - 3):   # a short sequence and one across chunks
                lo, hi = cs[k], cs[k + 1]
                bad = torch.zeros(2, L, dtype=torch.bool, device=device)
                bad[r, lo:hi] = True
                for name in ("x", "dt", "B", "C", "dy"):
                    u = dict(t)
                    g = dy.clone()
                    target = g if name == "dy" else u[name].clone()
                    target[r, (lo + hi) // 2] = float("inf") if name == "dt" else float("nan")
                    if name != "dy":
                        u[name] = target
                    got = run(u, g, chunk)
                    for what, a, b in zip(("y", "dx", "ddt", "dB", "dC"), got, clean):
                        msg = f"chunk {chunk}, {backward}, a non-finite {name} in [{lo}, {hi}) of row {r}: {what}"
                        torch.testing.assert_close(a[~bad], b[~bad], rtol=0, atol=0, msg=msg)


@pytest.mark.parametrize("device,backward", [
    ("cpu", "auto"), pytest.param("cuda", "auto", marks=requires_cuda),
    pytest.param("cuda", "staged", marks=requires_cuda), pytest.param("cuda", "group_mma", marks=requires_cuda)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_packed_sequences_16bit_nan(device, backward, dtype):
    """A NaN in x of the first of two packed sequences, at the head_dim of the fused
    forward (64): the second sequence's output and per-step gradients are those of the
    run without it; on CUDA the plan's forward (fused) and backward (the group products,
    on wgmma on Hopper), the group products on mma.sync, or the staged forward with the
    per-head backward products."""
    rng = random.Random(23)
    L, cut = 300, 150
    t, _ = make_case(rng, 1, L, 2, 64, 64, 1, dtype, device, D=False, z=False, dt_bias=False,
                     init=False, seq_idx=False, softplus=False, limit=False, mixed=False)
    seq = torch.zeros(1, L, dtype=torch.int32, device=device)
    seq[:, cut:] = 1
    dy = torch.randn(1, L, 2, 64, dtype=dtype, device=device)
    u = dict(t)
    u["x"] = t["x"].clone()
    u["x"][0, 100] = float("nan")
    with _cuda_routes("staged" if backward == "staged" else "auto", backward):
        clean = _packed_grads(t, seq, dy, 64, slice(cut, L))
        got = _packed_grads(u, seq, dy, 64, slice(cut, L))
    for what, a, b in zip(("y", "dx", "ddt", "dB", "dC"), got, clean):
        assert torch.isfinite(a).all(), f"a NaN in the first sequence reaches the second's {what}"
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cut", [150, 128, 133])
def test_packed_sequences_16bit_nan_forward(device, dtype, cut):
    """The forward alone (on CUDA the fused kernels at head_dim 64: both C·Bᵀ routes, and
    the state's two halves at N = 256; and the staged tensor-core kernels, forced): a NaN
    in x, B or C, or an Inf in dt, of either of two packed sequences leaves the other's
    output bitwise unchanged; starts inside a 16-position step, on a chunk edge and inside
    a step that also holds the row tile's first rows."""
    rng = random.Random(29)
    L = 300
    # FusedMma (2 heads a group), FusedMmaCb (4), FusedMmaCb's two state halves (N = 256),
    # the staged kernels
    for heads, groups, N, forward in ((2, 1, 64, "auto"), (4, 1, 64, "auto"), (2, 2, 256, "auto"),
                                      (2, 1, 64, "staged")):
        t, _ = make_case(rng, 1, L, heads, 64, N, groups, dtype, device, D=False, z=False,
                         dt_bias=False, init=True, seq_idx=False, softplus=False, limit=False,
                         mixed=False)
        seq = torch.zeros(1, L, dtype=torch.int32, device=device)
        seq[:, cut:] = 1

        def run(u, forward=forward):
            with _cuda_routes(forward, "auto"):
                return mamba.mamba_chunk_scan_combined(u["x"], u["dt"], u["A"], u["B"], u["C"], 64,
                                                       seq_idx=seq, initial_states=u["initial_states"])

        clean = run(t)
        for bad, keep in ((slice(0, cut), slice(cut, L)), (slice(cut, L), slice(0, cut))):
            for name in ("x", "B", "C", "dt"):
                for step in (bad.start, (bad.start + bad.stop) // 2, bad.stop - 1):
                    u = dict(t)
                    u[name] = t[name].clone()
                    u[name][0, step] = float("inf") if name == "dt" else float("nan")
                    y = run(u)
                    msg = f"{name} at {step} (start {cut}, {heads} heads, N {N}, {forward}) reaches the other sequence's y"
                    assert torch.isfinite(y[:, keep]).all(), msg
                    torch.testing.assert_close(y[:, keep], clean[:, keep], rtol=0, atol=0, msg=msg)


def test_gradcheck_float64_all_options():
    rng = random.Random(11)
    for D in ("h", "hdim"):
        t, kw = make_case(rng, 2, 7, 2, 3, 2, 1, torch.float64, "cpu", D=D, z=True,
                          dt_bias=True, init=True, seq_idx=True, softplus=True, limit=False,
                          mixed=False)
        t["dt"] = t["dt"].clamp(max=3.0)   # away from the softplus threshold's kink
        seq = t["seq_idx"]
        names = [k for k in OPT_NAMES if k in t]

        def fn(*args, kw=kw, seq=seq, names=names):
            a = dict(zip(names, args))
            return mamba.mamba_chunk_scan_combined(
                a["x"], a["dt"], a["A"], a["B"], a["C"], 3, D=a["D"], z=a["z"],
                dt_bias=a["dt_bias"], initial_states=a["initial_states"], seq_idx=seq,
                return_final_states=True, **kw)

        torch.autograd.gradcheck(fn, [t[k].detach().requires_grad_() for k in names])


def test_gradcheck_dt_limit():
    """The clamp's gradient: zero where dt is strictly outside the limits."""
    rng = random.Random(5)
    t, kw = make_case(rng, 1, 9, 2, 3, 2, 2, torch.float64, "cpu", D=False, z=False,
                      dt_bias=True, init=False, seq_idx=False, softplus=False, limit=False,
                      mixed=False)
    t["dt"] = torch.tensor([0.01, 0.2, 0.5, 0.9, 0.3, 1.4, 0.05, 0.6, 0.7],
                           dtype=torch.float64)[None, :, None].expand(1, 9, 2).contiguous()
    t["dt_bias"] = torch.tensor([0.013, -0.021], dtype=torch.float64)

    def fn(x, dt, A, B, C, bias):
        return mamba.mamba_chunk_scan_combined(x, dt, A, B, C, 4, dt_bias=bias,
                                               dt_limit=(0.1, 0.8))

    args = [t[k].detach().requires_grad_() for k in ("x", "dt", "A", "B", "C", "dt_bias")]
    torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("device", DEVICES)
def test_dt_limit_gradient_on_the_bounds(device):
    """A processed dt exactly on dt_min or dt_max keeps its gradient (mamba_ssm masks only
    strictly outside the limits): against the float64 reference, and against one-sided
    finite differences taken from inside the limits."""
    torch.manual_seed(3)
    f = torch.float64
    x, B, C = (torch.randn(1, 4, 1, n, dtype=f, device=device) for n in (2, 3, 3))
    A = torch.tensor([-0.7], dtype=f, device=device)
    dt = torch.tensor([0.25, 0.5, 0.0, 0.1], dtype=f, device=device)[None, :, None]
    ours = mamba.mamba_chunk_scan_combined
    grads = []
    for fn in (ours, ref.ssd_chunk_scan_combined):
        d = dt.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(x, d, A, B, C, 2, dt_limit=(0.0, 0.5)).sum(), d)[0])
    torch.testing.assert_close(grads[0], grads[1])
    assert (grads[0][0, 1:3, 0] != 0).all()  # dt_max and dt_min themselves
    eps = 1e-7  # one-sided differences from inside the limits
    for t, sign in ((1, -1.0), (2, 1.0)):
        step = torch.zeros_like(dt)
        step[0, t, 0] = sign * eps
        fd = (ours(x, dt + step, A, B, C, 2, dt_limit=(0.0, 0.5)).sum()
              - ours(x, dt, A, B, C, 2, dt_limit=(0.0, 0.5)).sum()) / (sign * eps)
        assert abs(fd.item() - grads[0][0, t, 0].item()) < 1e-5 * max(1.0, abs(fd.item()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_outputs_fully_written(device, dtype):
    """Deterministic mode fills fresh allocations with NaN: every output and gradient
    must come back finite."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    rng = random.Random(21)
    for D in ("h", "hdim"):
        t, kw = make_case(rng, 2, 19, 4, 5, 3, 2, dtype, device, D=D, z=True, dt_bias=True,
                          init=True, seq_idx=True, softplus=True, limit=True)
        args = [t[k] for k in ("x", "dt", "A", "B", "C")]
        opt = dict(D=t["D"], z=t["z"], dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                   seq_idx=t["seq_idx"], dt_softplus=True, dt_min=0.02, dt_max=0.8)
        out, final, y_pre, _ = ops.ssd_chunk_scan_combined(*args, 8, **opt)
        for o in (out, final, y_pre):
            assert torch.isfinite(o).all()
        opt.pop("D"), opt.pop("z"), opt.pop("dt_bias"), opt.pop("initial_states"), opt.pop("seq_idx")
        grads = ops.ssd_chunk_scan_combined_backward(
            torch.ones_like(out), torch.ones_like(final), *args, 8, t["D"], t["z"], t["dt_bias"],
            t["initial_states"], t["seq_idx"], y_pre, True, 0.02, 0.8)
        for name, g in zip(("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinit"), grads):
            assert torch.isfinite(g).all(), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_degenerate_extents(device, dtype):
    """L = 0: final_states are the initial states and their gradient passes through;
    N = 0: y = D·x gated by z; empty batch: empty outputs. Poisoned allocations."""
    torch.use_deterministic_algorithms(True)
    rng = random.Random(4)
    for b, L, H, P, N, G in [(2, 0, 2, 3, 4, 1), (2, 5, 2, 3, 0, 2), (0, 5, 2, 3, 4, 1),
                             (2, 5, 2, 0, 4, 1)]:
        t, kw = make_case(rng, b, L, H, P, N, G, dtype, device, D="hdim", z=True,
                          dt_bias=True, init=True, seq_idx=True, softplus=True, limit=False,
                          mixed=False)
        check_case(t, kw, 4, f"degenerate {(b, L, H, P, N, G)}")
        info = bt.explain("ssd_chunk_scan_combined", t["x"], t["dt"], t["A"], t["B"], t["C"], 4,
                          D=t["D"], z=t["z"], initial_states=t["initial_states"])
        assert info.variant == "zeros"


@pytest.mark.parametrize("device", DEVICES)
def test_plain_op_is_the_combined_op_without_options(device):
    rng = random.Random(8)
    for dtype in (torch.float32, torch.bfloat16):
        t, _ = make_case(rng, 2, 29, 4, 4, 3, 2, dtype, device, D=False, z=False, dt_bias=False,
                         init=False, seq_idx=False, softplus=False, limit=False, mixed=False)
        args = [t[k] for k in ("x", "dt", "A", "B", "C")]
        plain = ops.ssd_chunk_scan(*[a.clamp(min=0) if i == 1 else a for i, a in enumerate(args)], 8)
        comb, final, y_pre, states = ops.ssd_chunk_scan_combined(*args, 8)
        assert torch.equal(plain, comb)
        assert y_pre.numel() == 0 and states.numel() == 0  # (keep_states is off by default)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_bitwise(device):
    rng = random.Random(12)
    t, kw = make_case(rng, 3, 45, 4, 4, 3, 2, torch.float32, device, D="h", z=True, dt_bias=True,
                      init=True, seq_idx=True, softplus=True, limit=False, mixed=True)
    dout = torch.randn_like(t["x"])
    dfinal = torch.randn(3, 4, 4, 3, device=device)
    runs = [run_ours(t, kw, 16, dout, dfinal) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    for k in runs[0][2]:
        assert torch.equal(runs[0][2][k], runs[1][2][k]), k


# ---- explain -------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_explain(device):
    rng = random.Random(2)
    t, kw = make_case(rng, 1, 10, 2, 3, 4, 1, torch.float16, device, D="h", z=True,
                      dt_bias=True, init=True, seq_idx=True, softplus=True, limit=False,
                      mixed=True)
    args = [t[k] for k in ("x", "dt", "A", "B", "C")]
    info = bt.explain("ssd_chunk_scan_combined", *args, 4, D=t["D"], z=t["z"],
                      dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                      seq_idx=t["seq_idx"], dt_softplus=True)
    assert info.op == "ssd_chunk_scan" and info.deterministic
    assert info.variant == ("chunked" if device == "cpu" else info.variant)
    out, final, y_pre, _ = ops.ssd_chunk_scan_combined(*args, 4, t["D"], t["z"], t["dt_bias"],
                                                    t["initial_states"], t["seq_idx"], True)
    binfo = bt.explain(ops.ssd_chunk_scan_combined_backward, out, final, *args, 4, D=t["D"],
                       z=t["z"], dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                       seq_idx=t["seq_idx"], y_pre=y_pre, dt_softplus=True)
    assert binfo.op == "ssd_chunk_scan_backward" and binfo.workspace_bytes > 0


def test_device_mismatch_names_the_argument():
    rng = random.Random(0)
    t, _ = make_case(rng, 1, 4, 2, 2, 2, 1, torch.float32, "cpu", D="h", z=False, dt_bias=False,
                     init=False, seq_idx=False, softplus=False, limit=False, mixed=False)
    with pytest.raises(RuntimeError, match="x is on cpu and D is on meta"):
        ops.ssd_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], 4,
                                    t["D"].to("meta"))


def kept_states_reference(x, dt, A, B, C, Q, init, seq_idx):
    """What keep_states returns, [B, H, nc, P, N] in float64 on the CPU: H_c, the state
    entering chunk c, as the float64 recurrence's state after the first c·Q steps (the
    op's default dt limits), from `init`."""
    x, dt, A, B, C, init = [t.double().cpu() for t in (x, dt, A, B, C, init)]
    seq_idx = None if seq_idx is None else seq_idx.cpu()
    want = [init] + [ref.ssd_chunk_scan_combined(x[:, :e], dt[:, :e], A, B[:, :e], C[:, :e], Q,
                                                 initial_states=init,
                                                 seq_idx=None if seq_idx is None else seq_idx[:, :e],
                                                 return_final_states=True)[1]
                     for e in range(Q, x.size(1), Q)]
    return torch.stack(want, 2)


@pytest.mark.parametrize("precise", [False, True], ids=["chunked", "sequential"])
def test_kept_states_on_the_cpu(precise):
    """keep_states with 16-bit inputs: the CPU forward (both variants) returns H_c, the state
    entering each chunk (the float64 recurrence's state after the chunks before it, rounded),
    as the CUDA kernels do, so that a meta kernel, which sees no device, gives the same
    shapes (FakeTensorMode); the CPU backward recomputes them (given ones are not read).
    With float32 inputs nothing is kept."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    rng = random.Random(5)
    b, L, H, P, N, G, Q = 2, 23, 4, 3, 5, 2, 8
    t, _ = make_case(rng, b, L, H, P, N, G, torch.bfloat16, "cpu", D=False, z=False, dt_bias=False,
                     init=True, seq_idx=True, softplus=False, limit=False, mixed=True)
    args = [t[k] for k in ("x", "dt", "A", "B", "C")]
    kw = dict(initial_states=t["initial_states"], seq_idx=t["seq_idx"], keep_states=True)
    with bt.preference("precise" if precise else "fastest"):
        out, final, _, states = ops.ssd_chunk_scan_combined(*args, Q, **kw)
    nc = (L + Q - 1) // Q
    assert states.shape == (b, H, nc, P, N) and states.dtype == torch.bfloat16
    want = kept_states_reference(*args, Q, t["initial_states"], t["seq_idx"])
    check(states, want, rtol_for(torch.bfloat16, "cpu"), "kept states")
    with FakeTensorMode() as mode:
        fake = ops.ssd_chunk_scan_combined(*[mode.from_tensor(a) for a in args], Q,
                                           initial_states=mode.from_tensor(t["initial_states"]),
                                           seq_idx=mode.from_tensor(t["seq_idx"]), keep_states=True)
    assert [tuple(f.shape) for f in fake] == [tuple(r.shape) for r in (out, final, _, states)]
    # the backward: given states are not read on the CPU (the same gradients), but checked
    dy = torch.randn_like(out)
    bargs = (dy, None, *args, Q, None, None, None, t["initial_states"], t["seq_idx"])
    plain = ops.ssd_chunk_scan_combined_backward(*bargs)
    given = ops.ssd_chunk_scan_combined_backward(*bargs, states=torch.full_like(states, float("nan")))
    for g, e in zip(given, plain):
        assert torch.equal(g, e)
    with pytest.raises(ValueError, match=r"states must have shape \[B, H, nc, D, N\] = \[2, 4, 3, 3, 5\]"):
        ops.ssd_chunk_scan_combined_backward(*bargs, states=states[:, :, :2])
    with pytest.raises(TypeError, match="must have x's dtype bfloat16, got float32"):
        ops.ssd_chunk_scan_combined_backward(*bargs, states=states.float())
    # float32: nothing kept
    f32 = [a.float() for a in args]
    assert ops.ssd_chunk_scan_combined(*f32, Q, keep_states=True)[3].numel() == 0


def test_set_keep_chunk_states():
    from torch._subclasses.fake_tensor import FakeTensorMode
    previous = mamba.set_keep_chunk_states(False)
    try:
        assert mamba.set_keep_chunk_states(True) is False
        with FakeTensorMode():  # (a CUDA tensor without a GPU)
            x = torch.empty(2, 3, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            assert mamba._keep_chunk_states(x, None)
            assert not mamba._keep_chunk_states(x.detach(), None)
            assert not mamba._keep_chunk_states(x.float())  # 32-bit: nothing to keep
            with torch.no_grad():
                assert not mamba._keep_chunk_states(x)
            mamba.set_keep_chunk_states(False)
            assert not mamba._keep_chunk_states(x)
        cpu = torch.ones(2, dtype=torch.bfloat16, requires_grad=True)
        mamba.set_keep_chunk_states(True)
        assert not mamba._keep_chunk_states(cpu)  # the CPU backward recomputes them
        with pytest.raises(TypeError, match="enabled must be a bool"):
            mamba.set_keep_chunk_states(1)
    finally:
        mamba.set_keep_chunk_states(previous)


# ---- the Python wrapper ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_return_conventions(device):
    rng = random.Random(6)
    t, kw = make_case(rng, 1, 20, 2, 3, 4, 1, torch.float32, device, D="h", z=True,
                      dt_bias=True, init=True, seq_idx=False, softplus=True, limit=False,
                      mixed=False)
    args = [t[k] for k in ("x", "dt", "A", "B", "C")]
    cu = torch.tensor([0, 7, 8, 20], device=device)
    seq = torch.repeat_interleave(torch.arange(3, device=device), cu.diff())[None].int()
    common = dict(D=t["D"], z=t["z"], dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                  seq_idx=seq, **kw)
    out = mamba.mamba_chunk_scan_combined(*args, 8, **common)
    assert isinstance(out, torch.Tensor) and out.shape == t["x"].shape
    out2, final = mamba.mamba_chunk_scan_combined(*args, 8, return_final_states=True, **common)
    assert torch.equal(out, out2) and final.shape == (1, 2, 3, 4)
    out3, varlen = mamba.mamba_chunk_scan_combined(*args, 8, cu_seqlens=cu,
                                                   return_varlen_states=True, **common)
    assert torch.equal(out, out3) and varlen.shape == (3, 2, 3, 4)
    out4, final4, varlen4 = mamba.mamba_chunk_scan_combined(
        *args, 8, cu_seqlens=cu, return_final_states=True, return_varlen_states=True, **common)
    assert torch.equal(out, out4) and torch.equal(final, final4) and torch.equal(varlen, varlen4)
    # The last sequence's state is the final state; each against the reference run on
    # the sequence alone (the first from initial_states).
    torch.testing.assert_close(varlen[-1], final[0], rtol=1e-5, atol=1e-5)
    for i in range(3):
        s, e = cu[i].item(), cu[i + 1].item()
        sl = lambda v: v[:, s:e].cpu().double()  # noqa: E731
        _, st = ref.ssd_chunk_scan_combined(
            sl(t["x"]), sl(t["dt"]), t["A"].cpu().double(), sl(t["B"]), sl(t["C"]),
            dt_bias=t["dt_bias"].cpu().double(),
            initial_states=t["initial_states"].cpu().double() if i == 0 else None,
            dt_softplus=True, return_final_states=True)
        check(varlen[i], st[0], rtol_for(torch.float32, device), f"varlen state {i}")
    with pytest.raises(ValueError, match="cu_seqlens must be provided"):
        mamba.mamba_chunk_scan_combined(*args, 8, return_varlen_states=True)
    two = [torch.cat([a, a]) if a.dim() >= 3 else a for a in args]
    with pytest.raises(ValueError, match="batch size 1"):
        mamba.mamba_chunk_scan_combined(*two, 8, cu_seqlens=cu, return_varlen_states=True)
    # state_dtype
    _, f16 = mamba.mamba_chunk_scan_combined(*args, 8, return_final_states=True,
                                             state_dtype=torch.float64)
    assert f16.dtype == torch.float64


def conv_reference(xBC, weight, bias, seq_idx):
    """Causal depthwise conv as a loop over steps and taps, float64."""
    b, L, Cdim = xBC.shape
    W = weight.size(1)
    out = torch.zeros_like(xBC)
    for t in range(L):
        acc = bias.clone().expand(b, Cdim).clone() if bias is not None else xBC.new_zeros(b, Cdim)
        for k in range(W):
            s = t - k
            if s < 0:
                break
            w = weight[:, W - 1 - k]
            if seq_idx is not None:
                same = (seq_idx[:, s] == seq_idx[:, t]).to(xBC.dtype)[:, None]
                acc = acc + same * w * xBC[:, s]
            else:
                acc = acc + w * xBC[:, s]
        out[:, t] = acc
    return F.silu(out)


def split_reference(zxbcdt, conv_w, conv_b, dt_bias, A, D, chunk, initial_states, seq_idx,
                    dt_limit, rms_w, eps, out_w, out_b, headdim, ngroups, norm_before_gate):
    """mamba_split_conv1d_scan_combined composed from the float64 references."""
    if D.dim() == 1:
        H = D.size(0)
    else:
        H, headdim = D.shape
    dim = H * headdim
    N = (conv_w.size(0) - dim) // ngroups // 2
    d_mlp = (zxbcdt.size(-1) - 2 * dim - 2 * ngroups * N - H) // 2
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_mlp, dim, dim + 2 * ngroups * N, H], -1)
    xBC = conv_reference(xBC, conv_w, conv_b, seq_idx)
    x, B, C = torch.split(xBC, [dim, ngroups * N, ngroups * N], -1)
    y, final = ref.ssd_chunk_scan_combined(
        x.unflatten(-1, (H, headdim)), dt, A, B.unflatten(-1, (ngroups, N)),
        C.unflatten(-1, (ngroups, N)), D=D, z=None if rms_w is not None else z.unflatten(-1, (H, headdim)),
        dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx, dt_softplus=True,
        dt_limit=dt_limit, return_final_states=True)
    y = y.flatten(-2)
    if rms_w is not None:
        if not norm_before_gate:
            y = y * F.silu(z)
        g = y.unflatten(-1, (ngroups, -1))
        y = (g / torch.sqrt(g.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * rms_w
        if norm_before_gate:
            y = y * F.silu(z)
    if d_mlp:
        y = torch.cat([F.silu(zx0[..., :d_mlp]) * zx0[..., d_mlp:], y], -1)
    return F.linear(y, out_w, out_b), final


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [
    dict(rms=True, nbg=True, D_hdim=False, d_mlp=0, ngroups=1, seq=False, init=False),
    dict(rms=True, nbg=False, D_hdim=True, d_mlp=3, ngroups=2, seq=True, init=True),
    dict(rms=False, nbg=True, D_hdim=False, d_mlp=0, ngroups=2, seq=True, init=False),
    dict(rms=False, nbg=False, D_hdim=True, d_mlp=2, ngroups=1, seq=False, init=True),
])
def test_split_conv1d_scan_matches_composition(device, config):
    torch.manual_seed(5)
    b, L, H, P, N, G, W = 2, 19, 4, 3, 5, config["ngroups"], 4
    dim = H * P
    d_mlp = config["d_mlp"]
    f64 = dict(dtype=torch.float64)
    zxbcdt = torch.randn(b, L, 2 * d_mlp + 2 * dim + 2 * G * N + H, **f64)
    conv_w = 0.5 * torch.randn(dim + 2 * G * N, W, **f64)
    conv_b = 0.1 * torch.randn(dim + 2 * G * N, **f64)
    dt_bias = 0.3 * torch.randn(H, **f64) - 1
    A = -torch.exp(0.5 * torch.randn(H, **f64))
    D = torch.randn(H, P, **f64) if config["D_hdim"] else torch.randn(H, **f64)
    init = torch.randn(b, H, P, N, **f64) if config["init"] else None
    seq = (torch.rand(b, L) < 0.2).cumsum(1).int() if config["seq"] else None
    rms_w = 1 + 0.1 * torch.randn(dim, **f64) if config["rms"] else None
    out_w = torch.randn(7, d_mlp + dim, **f64) / 4
    out_b = torch.randn(7, **f64)
    leaves = [zxbcdt, conv_w, conv_b, dt_bias, A, D] + ([init] if init is not None else []) \
        + ([rms_w] if rms_w is not None else []) + [out_w, out_b]
    leaves = [t.requires_grad_() for t in leaves]

    def unpack(ts):
        it = iter(ts)
        zx, cw, cb, bias, a, d = (next(it) for _ in range(6))
        i0 = next(it) if init is not None else None
        rw = next(it) if rms_w is not None else None
        return zx, cw, cb, bias, a, d, i0, rw, next(it), next(it)

    zx, cw, cb, bias, a, d, i0, rw, ow, ob = unpack(leaves)
    expected, efinal = split_reference(zx, cw, cb, bias, a, d, 6, i0, seq, (0.0, INF), rw, 1e-6,
                                       ow, ob, P, G, config["nbg"])
    dev = [t.detach().to(device).requires_grad_() for t in leaves]
    zx, cw, cb, bias, a, d, i0, rw, ow, ob = unpack(dev)
    out, final = mamba.mamba_split_conv1d_scan_combined(
        zx, cw, cb, bias, a, d, 6, initial_states=i0,
        seq_idx=seq.to(device) if seq is not None else None, return_final_states=True,
        rmsnorm_weight=rw, rmsnorm_eps=1e-6, outproj_weight=ow, outproj_bias=ob,
        headdim=None if config["D_hdim"] else P, ngroups=G, norm_before_gate=config["nbg"])
    check(out, expected.detach(), 1e-10, "out")
    check(final, efinal.detach(), 1e-10, "final_states")
    gout = torch.randn_like(expected)
    gfin = torch.randn_like(efinal)
    ge = torch.autograd.grad([expected, efinal], leaves, [gout, gfin])
    go = torch.autograd.grad([out, final], dev, [gout.to(device), gfin.to(device)])
    for i, (g, e) in enumerate(zip(go, ge)):
        check(g, e, 1e-10, f"gradient {i}")


# mamba_ssm.modules.mamba2.Mamba2(d_model=64, d_state=16, headdim=16, ngroups=2) (expand 2,
# d_conv 4, bias False, conv_bias True, rmsnorm True, D_has_hdim False): its state_dict.
MAMBA_SSM_STATE_DICT = [
    ("dt_bias", (8,)),
    ("A_log", (8,)),
    ("D", (8,)),
    ("in_proj.weight", (2 * 128 + 2 * 2 * 16 + 8, 64)),
    ("conv1d.weight", (128 + 2 * 2 * 16, 1, 4)),
    ("conv1d.bias", (128 + 2 * 2 * 16,)),
    ("norm.weight", (128,)),
    ("out_proj.weight", (64, 128)),
]


def test_mamba2_state_dict_matches_mamba_ssm():
    m = mamba.Mamba2(d_model=64, d_state=16, headdim=16, ngroups=2)
    sd = m.state_dict()
    assert sorted((k, tuple(v.shape)) for k, v in sd.items()) == sorted(MAMBA_SSM_STATE_DICT)
    assert [k for k, _ in m.named_parameters()] == [k for k, _ in MAMBA_SSM_STATE_DICT]
    # D_has_hdim, biases, no norm
    m2 = mamba.Mamba2(d_model=32, d_state=8, headdim=8, D_has_hdim=True, rmsnorm=False, bias=True)
    shapes = {k: tuple(v.shape) for k, v in m2.state_dict().items()}
    assert shapes["D"] == (64,) and "norm.weight" not in shapes
    assert shapes["in_proj.bias"] == (2 * 64 + 2 * 8 + 8,) and shapes["out_proj.bias"] == (32,)


def test_mamba2_init_matches_mamba_ssm():
    torch.manual_seed(0)
    m = mamba.Mamba2(d_model=64, d_state=16, headdim=8, dt_min=0.01, dt_max=0.05,
                     A_init_range=(2, 4))
    dt = F.softplus(m.dt_bias.detach())
    assert (dt >= 0.01 - 1e-6).all() and (dt <= 0.05 + 1e-6).all()
    A = torch.exp(m.A_log.detach())
    assert (A >= 2).all() and (A <= 4).all()
    assert torch.equal(m.D.detach(), torch.ones(16)) and torch.equal(m.norm.weight.detach(), torch.ones(128))
    assert m.A_log.dtype == torch.float32 and getattr(m.A_log, "_no_weight_decay", False)


@pytest.mark.parametrize("device", DEVICES)
def test_mamba2_forward_matches_reference(device):
    torch.manual_seed(1)
    m = mamba.Mamba2(d_model=16, d_state=8, headdim=4, ngroups=2, chunk_size=8,
                     dtype=torch.float64).to(device)
    u = torch.randn(2, 13, 16, dtype=torch.float64, device=device)
    seq = torch.tensor([[0] * 6 + [1] * 7, [0] * 13], dtype=torch.int32, device=device)
    out = m(u, seq_idx=seq)
    zxbcdt = m.in_proj(u)
    expected, _ = split_reference(
        zxbcdt.cpu(), m.conv1d.weight.squeeze(1).cpu(), m.conv1d.bias.cpu(), m.dt_bias.cpu(),
        -torch.exp(m.A_log.float()).cpu(), m.D.cpu(), 8, None, seq.cpu(), (0.0, INF), m.norm.weight.cpu(),
        1e-5, m.out_proj.weight.cpu(), None, 4, 2, False)
    check(out, expected.detach(), 1e-10, "Mamba2 out")
    out.sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    flat = m(u.flatten(0, 1), seqlen=13, seq_idx=seq)
    torch.testing.assert_close(flat, out.flatten(0, 1))


def test_mamba2_unsupported():
    with pytest.raises(NotImplementedError, match="process_group"):
        mamba.Mamba2(d_model=16, d_state=8, headdim=4, process_group=object())
    m = mamba.Mamba2(d_model=16, d_state=8, headdim=4)  # (no layer_idx: no cache key)
    with pytest.raises(ValueError, match="Mamba2: decoding with inference_params needs the layer's layer_idx"):
        m(torch.randn(1, 3, 16), inference_params=mamba.InferenceParams(4, 1))
    with pytest.raises(ValueError, match="multiple of headdim"):
        mamba.Mamba2(d_model=10, d_state=8, headdim=4, expand=1)


def strided(t, kind):
    """The same values as t in a non-contiguous layout."""
    if kind == "transpose" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if kind == "stride2":
        big = torch.empty(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        return big[..., ::2]
    return t.expand(*t.shape) if kind == "expand" else t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_options(device, dtype):
    """Every optional operand (and dfinal_states, dout) as a strided view gives the
    contiguous result: bitwise on the CPU, whose float64 math reads values only."""
    rng = random.Random(13)
    t, kw = make_case(rng, 2, 25, 4, 6, 5, 2, dtype, device, D="hdim", z=True, dt_bias=True,
                      init=True, seq_idx=True, softplus=True, limit=False, mixed=True)
    dout = torch.randn_like(t["x"])
    state_dtype = torch.float32
    dfinal = torch.randn(2, 4, 6, 5, device=device, dtype=state_dtype)
    base = run_ours(t, kw, 8, dout, dfinal)
    s = {k: strided(v, "stride2" if k in ("dt_bias", "seq_idx", "z") else "transpose")
         for k, v in t.items()}
    for k in ("D", "z", "dt_bias", "initial_states", "seq_idx"):
        assert not s[k].is_contiguous(), k
    other = run_ours(s, kw, 8, strided(dout, "transpose"), strided(dfinal, "stride2"))
    same = torch.equal if device == "cpu" else (lambda a, b: torch.testing.assert_close(a, b) or True)
    assert same(base[0], other[0]) and same(base[1], other[1])
    for k in base[2]:
        assert same(base[2][k], other[2][k]), k


@pytest.mark.parametrize("device", DEVICES)
def test_mamba2_bfloat16_and_compile(device):
    """A bfloat16 layer (float32 D and A, as mamba_ssm) runs forward and backward, and
    torch.compile(fullgraph=True) of it gives eager's result."""
    torch.manual_seed(2)
    m = mamba.Mamba2(d_model=32, d_state=8, headdim=8, ngroups=2, chunk_size=8, D_has_hdim=True,
                     dtype=torch.bfloat16).to(device)
    assert m.D.dtype == torch.float32 and m.dt_bias.dtype == torch.bfloat16
    u = torch.randn(2, 21, 32, dtype=torch.bfloat16, device=device)
    seq = (torch.rand(2, 21, device=device) < 0.2).cumsum(1).int()
    out = m(u, seq_idx=seq)
    assert out.dtype == torch.bfloat16 and out.shape == u.shape
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    # Compiled vs eager in float32 (in bfloat16 inductor fuses the ops around the scan
    # without their intermediate roundings, so the two differ by bfloat16 rounding).
    m = m.float()
    u = u.float()
    out = m(u, seq_idx=seq)
    m.zero_grad()
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    torch._dynamo.reset()
    m.zero_grad()
    compiled = torch.compile(m, fullgraph=True)
    out_c = compiled(u, seq_idx=seq)
    torch.testing.assert_close(out_c, out)
    out_c.sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_double_backward_raises_clearly():
    rng = random.Random(9)
    t, kw = make_case(rng, 1, 6, 2, 3, 2, 1, torch.float64, "cpu", D="h", z=True, dt_bias=True,
                      init=True, seq_idx=False, softplus=True, limit=False, mixed=False)
    x = t["x"].requires_grad_()
    out = mamba.mamba_chunk_scan_combined(x, t["dt"], t["A"], t["B"], t["C"], 4, D=t["D"],
                                          z=t["z"], dt_bias=t["dt_bias"],
                                          initial_states=t["initial_states"], **kw)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward is not implemented"):
        gx.sum().backward()


def _small_case():
    torch.manual_seed(0)
    B, L, H, P, G, N = 1, 20, 2, 4, 1, 8
    return (torch.randn(B, L, H, P), torch.rand(B, L, H), -torch.rand(H), torch.randn(B, L, G, N),
            torch.randn(B, L, G, N))


@pytest.mark.parametrize("cu", [[0, 5, 30], [0, 12, 5, 20], [0, -1, 20], [2, 10, 20], [0, 10], [],
                                [[0, 20]]])
def test_cu_seqlens_validated(cu):
    """Issue 20 case 6: cu_seqlens past L, decreasing, negative, not starting at 0 or not
    ending at L gave truncated or zero states; now a ValueError naming the rule."""
    args = _small_case()
    with pytest.raises(ValueError, match=r"cu_seqlens must (start at 0, be non-decreasing and end at "
                                         r"L = 20|be a 1-D integer tensor)"):
        mamba.mamba_chunk_scan_combined(*args, 8, cu_seqlens=torch.tensor(cu, dtype=torch.int64),
                                        return_varlen_states=True)
    with pytest.raises(ValueError, match=r"cu_seqlens must be a 1-D integer tensor"):
        mamba.mamba_chunk_scan_combined(*args, 8, cu_seqlens=torch.tensor([0.0, 20.0]),
                                        return_varlen_states=True)
    # empty sequences are allowed (non-decreasing), and the states still come back
    _, st = mamba.mamba_chunk_scan_combined(*args, 8, cu_seqlens=torch.tensor([0, 0, 20, 20]),
                                            return_varlen_states=True)
    assert st.shape[0] == 3


def test_argument_errors_name_the_argument():
    """Issue 20 case 8: dt_limit, chunk_size, rmsnorm_eps and seq_idx errors name the
    argument and the rule."""
    args = _small_case()
    for bad in [(0.1,), (0.1, 0.2, 0.3), 0.5, ("a", "b")]:
        with pytest.raises(ValueError, match=r"mamba_chunk_scan_combined: dt_limit must be a pair "
                                             r"\(low, high\) of floats"):
            mamba.mamba_chunk_scan_combined(*args, 8, dt_limit=bad)
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int that fits in int64, "
                                         r"got 1180591620717411303424"):
        mamba.mamba_chunk_scan_combined(*args, 2 ** 70)
    with pytest.raises(ValueError, match=r"chunk_size must be a positive int"):
        mamba.mamba_chunk_scan_combined(*args, 0)
    with pytest.raises(TypeError, match=r"chunk_size must be a positive int .* got float 8.0"):
        mamba.mamba_chunk_scan_combined(*args, 8.0)
    m = mamba.Mamba2(32, d_state=8, headdim=16, chunk_size=8)
    zxbcdt = torch.randn(2, 20, m.in_proj.out_features)
    split = dict(conv1d_weight=m.conv1d.weight.squeeze(1), conv1d_bias=m.conv1d.bias, dt_bias=m.dt_bias,
                 A=-torch.exp(m.A_log), D=m.D, chunk_size=8, headdim=16)
    with pytest.raises(TypeError, match=r"rmsnorm_eps must be a float when rmsnorm_weight is given, "
                                        r"got NoneType"):
        mamba.mamba_split_conv1d_scan_combined(zxbcdt, rmsnorm_weight=m.norm.weight, rmsnorm_eps=None,
                                               **split)
    # without rmsnorm_weight the eps is unused (as in mamba_ssm)
    mamba.mamba_split_conv1d_scan_combined(zxbcdt, rmsnorm_eps=None, **split)
    with pytest.raises(ValueError, match=r"mamba_split_conv1d_scan_combined: dt_limit must be a pair"):
        mamba.mamba_split_conv1d_scan_combined(zxbcdt, dt_limit=(0.1,), **split)
    with pytest.raises(ValueError, match=r"mamba_split_conv1d_scan_combined: chunk_size must be a "
                                         r"positive int"):
        mamba.mamba_split_conv1d_scan_combined(zxbcdt, **{**split, "chunk_size": 2 ** 70})
    with pytest.raises(ValueError, match=r"seq_idx must have shape \[B, L\] = \[2, 20\], got \[2, 19\]"):
        m(torch.randn(2, 20, 32), seq_idx=torch.zeros(2, 19, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"seq_idx must have shape \[B, L\] = \[2, 20\], got \[20\]"):
        m(torch.randn(2, 20, 32), seq_idx=torch.zeros(20, dtype=torch.int32))
