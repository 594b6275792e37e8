"""``python -m baracuda_torch``: a self-check of every registered op on the best device
present. For each op it prints the kernel the plan picks, the relative error of the
forward output and of the gradients against a float64 run of reference.py, and the
forward/backward time next to eager PyTorch (reference.py in the same dtype).
Exits non-zero if any error is above its tolerance."""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from typing import Callable, Iterator, List, Sequence

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref

# Relative-error tolerance (‖out − ref‖ / ‖ref‖) per dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclasses.dataclass
class Result:
    name: str
    kernel: str
    fwd_err: float
    bwd_err: float
    fwd_us: float
    fwd_torch_us: float
    bwd_us: float
    bwd_torch_us: float
    tolerance: float
    backward: bool = True  # False for an inference op (no gradient: bwd_* are not measured)

    @property
    def ok(self) -> bool:
        return self.fwd_err <= self.tolerance and (not self.backward or self.bwd_err <= self.tolerance)


def rel_err(out: torch.Tensor, expected: torch.Tensor) -> float:
    out, expected = out.detach().double(), expected.detach().double()
    denom = expected.norm().item()
    diff = (out - expected).norm().item()
    return diff / denom if denom > 0 else diff


def median_us(fn: Callable[[], object], device: str) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(15 if device == "cuda" else 5):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def run_case(name: str, ours: Callable, reference: Callable, inputs: Sequence[torch.Tensor],
             explain: tuple, grad_inputs: Sequence[int] | None = None) -> Result:
    """Compare ``ours(*inputs)`` with ``reference`` in float64 and time both in the inputs' dtype.
    ``grad_inputs`` are the positions of the floating inputs that receive gradients."""
    device = inputs[0].device.type
    dtype = inputs[0].dtype
    if grad_inputs is None:
        grad_inputs = [i for i, t in enumerate(inputs) if t.is_floating_point()]

    def prepared(cast=None):
        out = []
        for i, t in enumerate(inputs):
            t = t.detach()
            if cast is not None and t.is_floating_point():
                t = t.to(cast)
            out.append(t.clone().requires_grad_(i in grad_inputs))
        return out

    mine, theirs64, theirs = prepared(), prepared(torch.float64), prepared()
    y = as_tuple(ours(*mine))
    y64 = as_tuple(reference(*theirs64))
    fwd_err = max(rel_err(a, b) for a, b in zip(y, y64))
    dys = [torch.randn_like(t) for t in y]
    diff = [mine[i] for i in grad_inputs]
    g = torch.autograd.grad(y, diff, dys, allow_unused=True)
    g64 = torch.autograd.grad(y64, [theirs64[i] for i in grad_inputs], [d.double() for d in dys],
                              allow_unused=True)
    bwd_err = max(rel_err(a, b) for a, b in zip(g, g64) if b is not None)

    def fwd(fn, args):
        with torch.no_grad():
            return fn(*args)

    def bwd(fn, args):
        out = as_tuple(fn(*args))
        d = [args[i] for i in grad_inputs]
        return lambda: torch.autograd.grad(out, d, dys, retain_graph=True, allow_unused=True)

    return Result(
        name=name, kernel=bt.explain(explain[0], *explain[1]).name, fwd_err=fwd_err, bwd_err=bwd_err,
        fwd_us=median_us(lambda: fwd(ours, mine), device),
        fwd_torch_us=median_us(lambda: fwd(reference, theirs), device),
        bwd_us=median_us(bwd(ours, mine), device),
        bwd_torch_us=median_us(bwd(reference, theirs), device),
        tolerance=TOLERANCE[dtype])


def run_inference_case(name: str, ours: Callable, reference: Callable, inputs: Sequence[torch.Tensor],
                       explain: tuple, dtype: torch.dtype, updated: Sequence[int] = (0,)) -> Result:
    """For an op that updates some inputs in place and has no gradient: ``ours(*inputs)``
    (on copies) against ``reference`` in float64, which returns the outputs followed by the
    updated inputs (positions ``updated``) without modifying anything; timed forward only.
    ``dtype``: the data's dtype (the tolerance's)."""
    device = inputs[0].device.type
    mine = [t.clone() for t in inputs]
    y = as_tuple(ours(*mine)) + tuple(mine[i] for i in updated)
    y64 = as_tuple(reference(*[t.double() if t.is_floating_point() else t for t in inputs]))
    fwd_err = max(rel_err(a, b) for a, b in zip(y, y64))
    scratch = [t.clone() for t in inputs]
    nan = float("nan")
    with torch.no_grad():
        return Result(
            name=name, kernel=bt.explain(explain[0], *explain[1]).name, fwd_err=fwd_err, bwd_err=nan,
            fwd_us=median_us(lambda: ours(*scratch), device),
            fwd_torch_us=median_us(lambda: reference(*scratch), device),
            bwd_us=nan, bwd_torch_us=nan, tolerance=TOLERANCE[dtype], backward=False)


# ---- per-family checks: each yields Results for (device, dtype) ----------------------

CHECKS: List[Callable[[str, torch.dtype, bool], Iterator[Result]]] = []


def check(fn):
    """Register a family's self-check: fn(device, dtype, big) yields Results."""
    CHECKS.append(fn)
    return fn


@check
def check_gated_activation(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    shape = (4096, 8192) if big else (256, 512)
    for kind in ("glu", "reglu", "swiglu", "geglu", "geglu_tanh"):
        x = torch.randn(shape, device=device, dtype=dtype) * 2
        yield run_case(f"gated_activation[{kind}]", lambda t, k=kind: bt.gated_activation(t, k),
                       lambda t, k=kind: ref.gated_activation(t, k), [x],
                       ("gated_activation", (x, kind)))
        g = torch.randn(shape, device=device, dtype=dtype) * 2
        u = torch.randn(shape, device=device, dtype=dtype)
        yield run_case(f"gated_activation_pair[{kind}]",
                       lambda a, b, k=kind: bt.gated_activation_pair(a, b, k),
                       lambda a, b, k=kind: ref.gated_activation_pair(a, b, k), [g, u],
                       ("gated_activation_pair", (g, u, kind)))


# ---- rope

@check
def check_rope(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    B, H, S, D = (4, 32, 2048, 128) if big else (2, 4, 64, 32)
    pos = torch.randint(0, 1_000_000, (B, S), device=device)
    for name, interleaved, rd, positions, transposed in (
            ("rope[interleaved]", True, None, None, False),
            ("rope[half_split]", False, None, None, False),
            ("rope[half_split,pos,R=D/2]", False, D // 2, pos, False),
            ("rope[interleaved,bshd view]", True, None, pos[0], True)):
        if transposed:
            x = torch.randn(B, S, H, D, device=device, dtype=dtype).transpose(1, 2)
        else:
            x = torch.randn(B, H, S, D, device=device, dtype=dtype)
        yield run_case(name,
                       lambda t, p=positions, i=interleaved, r=rd: bt.rope(t, p, 10000.0, i, r),
                       lambda t, p=positions, i=interleaved, r=rd: ref.rope(t, p, 10000.0, i, r), [x],
                       ("rope", (x, positions, 10000.0, interleaved, -1 if rd is None else rd)))



@check
def check_rope_cos_sin(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    B, Hq, Hk, S, D = (4, 32, 8, 2048, 128) if big else (2, 4, 2, 64, 32)
    pos = torch.arange(S, device=device, dtype=torch.float64)
    inv = 10000.0 ** (-torch.arange(0, D, 2, device=device, dtype=torch.float64) / D)
    freqs = torch.cat((pos[:, None] * inv, pos[:, None] * inv), -1)[None]  # HF layout [1, S, D]
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    q = torch.randn(B, S, Hq, D, device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn(B, S, Hk, D, device=device, dtype=dtype).transpose(1, 2)
    yield run_case("rope_qk_cos_sin[hf,bshd view,gqa]",
                   lambda a, b, c, s: bt.rope_qk_cos_sin(a, b, c, s),
                   lambda a, b, c, s: (ref.rope_cos_sin(a, c, s), ref.rope_cos_sin(b, c, s)),
                   [q, k, cos, sin], ("rope_qk_cos_sin", (q, k, cos, sin)), grad_inputs=[0, 1])


# ---- lerp

@check
def check_lerp(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    shape = (4096, 8192) if big else (256, 512)
    a = torch.randn(shape, device=device, dtype=dtype)
    b = torch.randn(shape, device=device, dtype=dtype)
    for w in (0.3, 0.7):
        yield run_case(f"lerp[w={w}]", lambda x, y, w=w: bt.lerp(x, y, w),
                       lambda x, y, w=w: ref.lerp(x, y, w), [a, b], ("lerp", (a, b, w)))
    row = b[:1]  # broadcast along the rows
    yield run_case("lerp[broadcast b]", lambda x, y: bt.lerp(x, y, 0.6), lambda x, y: ref.lerp(x, y, 0.6),
                   [a, row], ("lerp", (a, row, 0.6)))
    w = torch.rand(shape, device=device, dtype=dtype) * 2 - 0.5
    yield run_case("lerp.Tensor", bt.lerp, ref.lerp, [a, b, w], ("lerp.Tensor", (a, b, w)))


# ---- gather
@check
def check_gather(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    rows, cols, picked = (4096, 8192, 2048) if big else (256, 512, 128)
    src = torch.randn(rows, cols, device=device, dtype=dtype)
    for dim, shape in ((1, (rows, picked)), (0, (rows // 4, cols))):
        index = torch.randint(0, src.size(dim), shape, device=device)
        yield run_case(f"gather[dim={dim}]", lambda s, i=index, d=dim: bt.gather(s, d, i),
                       lambda s, i=index, d=dim: ref.gather(s, d, i), [src],
                       ("gather", (src, dim, index)))



# ---- rms_norm
@check
def check_rms_norm(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    rows, hidden = (8192, 4096) if big else (256, 512)
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    res = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = 1 + 0.1 * torch.randn(hidden, device=device, dtype=dtype)
    for conv in ("torch", "llama", "gemma"):
        yield run_case(f"rms_norm[{conv}]",
                       lambda t, v, c=conv: bt.rms_norm(t, hidden, v, 1e-6, convention=c),
                       lambda t, v, c=conv: ref.rms_norm(t, v, 1e-6, c)[0], [x, w],
                       ("rms_norm", (x, w, 1e-6, conv)))
    yield run_case("add_rms_norm[llama]",
                   lambda t, r, v: bt.rms_norm(t, hidden, v, 1e-6, convention="llama", residual=r),
                   lambda t, r, v: ref.add_rms_norm(t, r, v, 1e-6, "llama")[:2], [x, res, w],
                   ("add_rms_norm", (x, res, w, 1e-6, "llama")))

# ---- causal_conv1d
@check
def check_causal_conv1d(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    # A Mamba-2 layer's conv: the channel-last slice of the in_proj output, bias, SiLU; and
    # a contiguous x with initial and final states (the returned tuple's gradients too).
    B, L, D, W = (4, 4096, 5376, 4) if big else (2, 200, 64, 4)
    proj = torch.randn(B, L, D + 64, device=device, dtype=dtype)
    x = proj[..., 32:32 + D].transpose(1, 2)
    w = 0.5 * torch.randn(D, W, device=device, dtype=dtype)
    b = torch.randn(D, device=device, dtype=dtype)
    yield run_case("causal_conv1d[silu,channel-last]",
                   lambda x, w, b: bt.causal_depthwise_conv1d(x, w, b, activation="silu"),
                   lambda x, w, b: ref.causal_conv1d(x, w, b, activation="silu")[0], [x, w, b],
                   ("causal_conv1d", (x, w, b, None, None, "silu")))
    xc = torch.randn(B, D, L, device=device, dtype=dtype)
    init = torch.randn(B, D, W - 1, device=device, dtype=dtype)
    yield run_case("causal_conv1d[states,contiguous]",
                   lambda x, w, i: bt.causal_depthwise_conv1d(x, w, initial_states=i, return_final_states=True),
                   lambda x, w, i: ref.causal_conv1d(x, w, initial_states=i), [xc, w, init],
                   ("causal_conv1d", (xc, w, None, None, init)))

    # The decoding step: one new column into mamba_ssm's width-W channel-last state.
    st = torch.randn(B, W, D, device=device, dtype=dtype).transpose(1, 2)
    xs = torch.randn(B, D, device=device, dtype=dtype)
    yield run_inference_case(
        "causal_conv1d_update[silu]",
        lambda x, s, w, b: bt.causal_conv1d.causal_conv1d_update(x, s, w, b, "silu"),
        lambda x, s, w, b: ref.causal_conv1d_update(x, s, w, b, "silu"), [xs, st, w, b],
        ("causal_conv1d_update", (xs, st, w, b, "silu")), dtype, updated=(1,))


# ---- gated_rms_norm
@check
def check_gated_rms_norm(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    # Mamba-2 2.7B's output norm (d_inner 5120) with one group and with 8.
    rows, hidden = (4096, 5120) if big else (256, 640)
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    z = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = 1 + 0.1 * torch.randn(hidden, device=device, dtype=dtype)
    for groups, before in ((1, True), (8, False)):
        size = hidden // groups
        yield run_case(f"gated_rms_norm[groups={groups},norm_before_gate={before}]",
                       lambda t, g, v, s=size, b=before: bt.gated_rms_norm(t, v, g, 1e-5, s, b),
                       lambda t, g, v, s=size, b=before: ref.gated_rms_norm(t, v, None, g, 1e-5, s, b)[0],
                       [x, z, w], ("gated_rms_norm", (x, w, None, z, 1e-5, size, before)))


# ---- ssd_chunk_scan
@check
def check_ssd_chunk_scan(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    # (B, L, H, D, N, G, chunk): Mamba-2's G = 1 and the per-head layout G = H; the
    # float64 truth is the chunked reference (the sequential one loops over L in Python).
    cases = ([(2, 2048, 16, 64, 128, 1, 256), (2, 2048, 16, 64, 64, 16, 256)] if big
             else [(2, 100, 4, 16, 8, 1, 32), (1, 70, 4, 8, 8, 4, 16)])
    for b, L, H, D, N, G, Q in cases:
        x = torch.randn(b, L, H, D, device=device, dtype=dtype)
        dt = torch.nn.functional.softplus(torch.randn(b, L, H, device=device) - 1).to(dtype)
        A = -torch.exp(torch.randn(H, device=device)).to(dtype)
        B = torch.randn(b, L, G, N, device=device, dtype=dtype)
        C = torch.randn(b, L, G, N, device=device, dtype=dtype)
        yield run_case(f"ssd_chunk_scan[G={G},Q={Q}]",
                       lambda *t, q=Q: bt.ssd_chunk_scan(*t, chunk_size=q),
                       lambda *t, q=Q: ref.ssd_chunk_scan_chunked(*t, chunk_size=q),
                       [x, dt, A, B, C], ("ssd_chunk_scan", (x, dt, A, B, C, Q)))



@check
def check_ssd_chunk_scan_combined(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    # Every option of mamba_chunk_scan_combined (D, z, dt_bias + softplus, initial and
    # final states, seq_idx boundaries inside chunks); the float64 truth is the
    # step-by-step reference (a Python loop over L, hence the moderate L).
    b, L, H, D, N, G, Q = (2, 512, 8, 64, 64, 2, 128) if big else (1, 50, 4, 8, 8, 2, 16)
    x = torch.randn(b, L, H, D, device=device, dtype=dtype)
    dt = (torch.randn(b, L, H, device=device) - 2).to(dtype)
    A = -torch.exp(torch.randn(H, device=device))
    B = torch.randn(b, L, G, N, device=device, dtype=dtype)
    C = torch.randn(b, L, G, N, device=device, dtype=dtype)
    Dp = torch.randn(H, device=device)
    z = torch.randn(b, L, H, D, device=device, dtype=dtype)
    bias = 0.5 * torch.randn(H, device=device)
    init = torch.randn(b, H, D, N, device=device)
    seq = (torch.rand(b, L, device=device) < 4.0 / L).cumsum(1).int()

    def ours(*t):
        return bt.mamba.mamba_chunk_scan_combined(
            *t[:5], Q, D=t[5], z=t[6], dt_bias=t[7], initial_states=t[8], seq_idx=seq,
            dt_softplus=True, return_final_states=True)

    def theirs(*t):
        return ref.ssd_chunk_scan_combined(
            *t[:5], Q, D=t[5], z=t[6], dt_bias=t[7], initial_states=t[8], seq_idx=seq,
            dt_softplus=True, return_final_states=True)

    args = [x, dt, A, B, C, Dp, z, bias, init]
    yield run_case(f"ssd_chunk_scan_combined[G={G},Q={Q}]", ours, theirs, args,
                   ("ssd_chunk_scan_combined", (*args[:5], Q, Dp, z, bias, init, seq, True)))



# ---- selective_state_update
@check
def check_selective_state_update(device: str, dtype: torch.dtype, big: bool) -> Iterator[Result]:
    # A Mamba-2 decoding step (the 2.7B layer's 80 heads of 64, d_state 128, 1 group, at
    # batch 64 on CUDA): a float32 state, Mamba-2's per-head A, dt, D, dt_bias expanded;
    # and 4 tokens at once with every option.
    Bsz, H, P, N = (64, 80, 64, 128) if big else (4, 8, 16, 32)
    state = torch.randn(Bsz, H, P, N, device=device)
    x = torch.randn(Bsz, H, P, device=device, dtype=dtype)
    dt = torch.randn(Bsz, H, device=device, dtype=dtype)[..., None].expand(Bsz, H, P)
    A = (-torch.rand(H, device=device))[:, None, None].expand(H, P, N)  # (negated before the expand: stride 0)
    Bm = torch.randn(Bsz, 1, N, device=device, dtype=dtype)
    Cm = torch.randn(Bsz, 1, N, device=device, dtype=dtype)
    D = torch.randn(H, device=device)[:, None].expand(H, P)
    bias = torch.randn(H, device=device)[:, None].expand(H, P)
    args = [state, x, dt, A, Bm, Cm, D]
    yield run_inference_case(
        "selective_state_update[mamba2]",
        lambda *t: bt.selective_state_update(*t, dt_bias=bias, dt_softplus=True),
        lambda *t: ref.selective_state_update(*t, dt_bias=bias.to(t[0].dtype), dt_softplus=True), args,
        ("selective_state_update", (*args, None, bias, True)), dtype)
    T, G = 4, 2
    xs = torch.randn(Bsz, T, H, P, device=device, dtype=dtype)
    dts = torch.randn(Bsz, T, H, P, device=device, dtype=dtype)
    Bs = torch.randn(Bsz, T, G, N, device=device, dtype=dtype)
    Cs = torch.randn(Bsz, T, G, N, device=device, dtype=dtype)
    zs = torch.randn(Bsz, T, H, P, device=device, dtype=dtype)
    Af = -torch.rand(H, P, N, device=device)
    args = [state, xs, dts, Af, Bs, Cs, D.contiguous(), zs, bias.contiguous()]
    yield run_inference_case(
        f"selective_state_update_tokens[T={T}]",
        lambda *t: bt.selective_state_update_tokens(*t, dt_softplus=True),
        lambda *t: ref.selective_state_update(*t, dt_softplus=True, tokens=True), args,
        ("selective_state_update_tokens", (*args, True)), dtype)


def main(argv: Sequence[str] | None = None) -> int:
    device = "cuda" if torch.cuda.is_available() and bt.with_cuda else "cpu"
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"baracuda_torch {bt.__version__} | torch {torch.__version__} | device: {where} ({device})")
    if device == "cpu":
        print("(no CUDA device" + ("" if bt.with_cuda else "; built without CUDA") +
              ": checking the CPU kernels, small shapes)")
    dtypes = (torch.bfloat16, torch.float32) if device == "cuda" else (torch.float32,)
    header = f"{'op':32} {'dtype':9} {'kernel':58} {'fwd err':>8} {'bwd err':>8} {'fwd µs (torch)':>17} {'bwd µs (torch)':>17}  ok"
    print(header)
    print("-" * len(header))
    failed = 0
    for dtype in dtypes:
        for check in CHECKS:
            for r in check(device, dtype, device == "cuda"):
                failed += not r.ok
                bwd = (f"{r.bwd_err:8.1e}", f"{r.bwd_us:8.1f} ({r.bwd_torch_us:6.1f})") if r.backward \
                    else (f"{'-':>8}", f"{'- (no gradient)':>17}")
                print(f"{r.name:32} {str(dtype).replace('torch.', ''):9} {r.kernel:58} "
                      f"{r.fwd_err:8.1e} {bwd[0]} {r.fwd_us:8.1f} ({r.fwd_torch_us:6.1f}) "
                      f"{bwd[1]}  {'ok' if r.ok else 'FAIL (tol %.0e)' % r.tolerance}",
                      flush=True)
    print("all ops within tolerance" if not failed else f"{failed} check(s) FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
