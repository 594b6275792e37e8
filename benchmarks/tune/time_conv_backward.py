"""Dev tool: the causal conv1d's backward, µs (``harness.time_us``: do_bench, L2 flushed) — the Mamba-2
2.7B layer's x range (5120 channels of the channel-last xBC slice, dx into dzxbcdt) and all 5376
channels, bf16 rows ([B, D, L] contiguous, forward too), float32 channel-last; where peers/ has
causal-conv1d, its backward on the same tensors (channel-last 5376, rows) and its rows forward.
Run on the GPU from the repo root (peers/ after ``scripts/peers.sh install``):
  PYTHONPATH=$PWD python benchmarks/tune/time_conv_backward.py [label]
``layer()`` and ``x_range_args()`` are the layer's tensors and our x-range call, shared with
ncu_conv_backward.py."""
import sys
from types import SimpleNamespace

import torch
import baracuda_torch  # noqa: F401
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
import peers  # noqa: E402,F401 (peers/site on sys.path)
ops = torch.ops.baracuda
bf = torch.bfloat16
B, L, W, dim, GN, H = 4, 4096, 4, 5120, 128, 80


def layer() -> SimpleNamespace:
    """The 2.7B layer's channel-last xBC slice of zxbcdt (and dx's slice of its gradient), the conv's
    weight and bias over its 5376 channels, and output gradients for the x range and for all of it."""
    zx = torch.randn(B, L, 2 * dim + 2 * GN + H, dtype=bf, device="cuda")
    return SimpleNamespace(
        xBC=zx[..., dim:2 * dim + 2 * GN], dxBC=torch.empty_like(zx)[..., dim:2 * dim + 2 * GN],
        cw=torch.randn(dim + 2 * GN, W, dtype=bf, device="cuda") * 0.3,
        cb=torch.randn(dim + 2 * GN, dtype=bf, device="cuda"),
        g=torch.randn(B, L, dim, dtype=bf, device="cuda"),
        gall=torch.randn(B, L, dim + 2 * GN, dtype=bf, device="cuda"))


def x_range_args(t: SimpleNamespace) -> tuple:
    """causal_conv1d_backward_into's arguments over the x range (the first 5120 channels)."""
    return (t.g.transpose(1, 2), None, t.xBC[..., :dim].transpose(1, 2), t.cw[:dim],
            t.dxBC[..., :dim].transpose(1, 2), t.cb[:dim], None, None, "silu")


def main():
    t = layer()
    xBC, dxBC, cw, cb, gall = t.xBC, t.dxBC, t.cw, t.cb, t.gall
    res = {}
    res["x 5120"] = time_us(lambda: ops.causal_conv1d_backward_into(*x_range_args(t)))[0]
    res["5376"] = time_us(lambda: ops.causal_conv1d_backward_into(
        gall.transpose(1, 2), None, xBC.transpose(1, 2), cw, dxBC.transpose(1, 2), cb, None, None, "silu"))[0]
    xr = torch.randn(B, dim, L, dtype=bf, device="cuda")
    gr = torch.randn(B, dim, L, dtype=bf, device="cuda")
    res["rows bf16 5120"] = time_us(lambda: ops.causal_conv1d_backward(gr, None, xr, cw[:dim], cb[:dim], None, None,
                                                                       "silu"))[0]
    res["rows bf16 fwd"] = time_us(lambda: ops.causal_conv1d(xr, cw[:dim], cb[:dim], None, None, "silu"))[0]
    xf = torch.randn(B, L, 2560, device="cuda").transpose(1, 2)
    gf = torch.randn(B, L, 2560, device="cuda").transpose(1, 2)
    wf = torch.randn(2560, W, device="cuda")
    res["cl fp32 2560"] = time_us(lambda: ops.causal_conv1d_backward(gf, None, xf, wf, wf[:, 0], None, None,
                                                                     "silu"))[0]
    try:
        import causal_conv1d_cuda  # noqa
        from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as cc_bwd  # 1.7.0
        dxr = torch.empty_like(xr)
        res["causal-conv1d rows bf16 5120"] = time_us(lambda: cc_bwd(xr, cw[:dim], cb[:dim], gr, None, None, None,
                                                                      dxr, False, True))[0]
        from causal_conv1d.cpp_functions import causal_conv1d_fwd_function as cc_fwd
        res["causal-conv1d rows fwd"] = time_us(lambda: cc_fwd(xr, cw[:dim], cb[:dim], None, None, None, True))[0]
        res["causal-conv1d 5376"] = time_us(lambda: cc_bwd(xBC.transpose(1, 2), cw, cb, gall.transpose(1, 2), None,
                                                            None, None, dxBC.transpose(1, 2), False, True))[0]
    except Exception as e:  # noqa
        print("causal-conv1d:", repr(e)[:300])
    print((sys.argv[1] if len(sys.argv) > 1 else "") + ": " + " | ".join(f"{k} {v:.1f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
