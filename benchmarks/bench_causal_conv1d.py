"""Causal depthwise conv1d at a Mamba-2 2.7B layer's shape, bf16: B4 L4096, D = 5120 + 2·128
= 5376 channels (x, B and C: d_inner 5120, one group of d_state 128), width 4, bias, SiLU,
x the channel-last slice of the in_proj output [B, L, 10576] (xBC = zxbcdt[..., 5120:10496],
transposed to [B, D, L] without a copy, as the layer passes it). A second case takes a
contiguous x [B, D, L] of the same size (the rows layout).
Providers: baracuda (causal_depthwise_conv1d); torch = F.conv1d eager on the same view
(padding W - 1, groups D, cut to L, then SiLU: what a Mamba layer runs without the
causal-conv1d package; cuDNN copies the channel-last view to its own layout); compile =
torch.compile of reference.causal_conv1d (the tap formula); causal_conv1d = the
causal-conv1d package's causal_conv1d_fn where peers/ has it (benchmarks/peers.py), after a
check that its output agrees with ours.
Modes: forward, backward (the backward pass alone, gradients of x, weight and bias), full.
Bytes (the fewest each mode must move, n = B·L·D elements of e bytes; weight and bias are
negligible):
  forward   2·n·e   x read, out written
  backward  3·n·e   x and dout read, dx written (SiLU recomputed from x; dweight and dbias
                    are reductions)
  full      5·n·e

CPU (``run_cpu``): float32, B2 L2048 D1024 channel-last, baracuda against F.conv1d eager,
timed alternately, forward and backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, full_fn, measure, measure_interleaved
import peers

FAMILY = "causal_conv1d"
B, L, D, W = 4, 4096, 5376, 4
PROJ, START = 10576, 5120  # in_proj's output width, and where xBC starts in it


def conv1d_eager(x, w, b):
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.size(1) - 1, groups=w.size(0))[..., :x.size(-1)])


def make(layout: str, dtype, device="cuda", b=B, L_=L, d=D):
    if layout == "channel-last slice":
        proj = torch.randn(b, L_, PROJ if d == D else d + 64, device=device, dtype=dtype)
        start = START if d == D else 32
        x = proj[..., start:start + d].transpose(1, 2)
    else:
        x = torch.randn(b, d, L_, device=device, dtype=dtype)
    x = x.detach().requires_grad_()  # a leaf view: dx is returned as is, not scattered into proj
    w = (0.5 * torch.randn(d, W, device=device, dtype=dtype)).requires_grad_()
    bias = torch.randn(d, device=device, dtype=dtype).requires_grad_()
    return x, w, bias


def run(dtype=torch.bfloat16, providers=("baracuda", "torch", "compile", "causal_conv1d")) -> list[Row]:
    rows: list[Row] = []
    elt = torch.finfo(dtype).bits // 8
    n = B * L * D
    nbytes = (2 * n * elt, 3 * n * elt, 5 * n * elt)
    for layout in ("channel-last slice", "contiguous"):
        x, w, b = make(layout, dtype)
        case = f"B{B} L{L} D{D} W{W} silu {layout}"
        variant = bt.explain("causal_conv1d", x, w, b, None, None, "silu").variant
        fwd = {"baracuda": lambda: bt.causal_depthwise_conv1d(x, w, b, activation="silu"),
               "torch": lambda: conv1d_eager(x, w, b)}
        notes = {"baracuda": f"variant {variant}"}
        if "compile" in providers:
            torch._dynamo.reset()
            compiled = torch.compile(lambda x, w, b: ref.causal_conv1d(x, w, b, activation="silu")[0])
            fwd["compile"] = lambda: compiled(x, w, b)
        peer = peers.causal_conv1d_fn() if "causal_conv1d" in providers else None
        if peer is not None:
            with torch.no_grad():
                notes["causal_conv1d"] = peers.agree(bt.causal_depthwise_conv1d(x, w, b, activation="silu"),
                                                     peer(x, w, b, activation="silu"), "causal_conv1d", 1e-2)
            fwd["causal_conv1d"] = lambda: peer(x, w, b, activation="silu")
        dy = torch.randn_like(fwd["baracuda"]())
        for provider in [p for p in providers if p in fwd]:
            f, note = fwd[provider], notes.get(provider, "")
            with torch.no_grad():
                rows.append(measure(FAMILY, case, dtype, provider, "forward", f, nbytes=nbytes[0],
                                    with_memory=True, note=note))
            rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(f, [x, w, b], dy),
                                nbytes=nbytes[1], with_memory=True, note=note))
            rows.append(measure(FAMILY, case, dtype, provider, "full", full_fn(f, [x, w, b], dy),
                                nbytes=nbytes[2], note=note))
        del x, w, b, dy, fwd
        torch.cuda.empty_cache()
    return rows


def run_cpu(repeats=15, dtype=torch.float32) -> list[Row]:
    """CPU: baracuda against F.conv1d eager on the same channel-last view, timed
    alternately, forward and backward."""
    b, L_, d = 2, 2048, 1024
    x, w, bias = make("channel-last slice", dtype, "cpu", b, L_, d)
    n, elt = b * L_ * d, torch.finfo(dtype).bits // 8
    case = f"B{b} L{L_} D{d} W{W} silu channel-last slice"
    fwd = {"baracuda": lambda: bt.causal_depthwise_conv1d(x, w, bias, activation="silu"),
           "torch": lambda: conv1d_eager(x, w, bias)}
    rows = []
    with torch.no_grad():
        rows += measure_interleaved(FAMILY, case, dtype, "forward", fwd, nbytes=2 * n * elt, repeats=repeats)
    dy = torch.randn(b, d, L_, dtype=dtype)
    bwd = {p: backward_fn(f, [x, w, bias], dy) for p, f in fwd.items()}
    rows += measure_interleaved(FAMILY, case, dtype, "backward", bwd, nbytes=3 * n * elt, repeats=repeats)
    return rows


if __name__ == "__main__":
    print(format_table(run()))
