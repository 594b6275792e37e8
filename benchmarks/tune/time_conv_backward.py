"""Dev tool: the causal conv1d's backward, µs (``harness.time_us``: do_bench, L2 flushed) — the Mamba-2
2.7B layer's x range (5120 channels of the channel-last xBC slice, dx into dzxbcdt) and all 5376
channels, bf16 rows ([B, D, L] contiguous, forward too), float32 channel-last; where peers/ has
causal-conv1d, its backward on the same tensors (channel-last 5376, rows) and its rows forward.
Run on the GPU from the repo root (peers/ after ``scripts/peers.sh install``):
  PYTHONPATH=$PWD python benchmarks/tune/time_conv_backward.py [label]"""
import sys
import torch
import baracuda_torch  # noqa: F401
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
import peers  # noqa: E402,F401 (peers/site on sys.path)
ops = torch.ops.baracuda
bf = torch.bfloat16
B, L, W, dim, GN, H = 4, 4096, 4, 5120, 128, 80
zx = torch.randn(B, L, 2 * dim + 2 * GN + H, dtype=bf, device="cuda")
xBC = zx[..., dim:2 * dim + 2 * GN]
cw = torch.randn(dim + 2 * GN, W, dtype=bf, device="cuda") * 0.3
cb = torch.randn(dim + 2 * GN, dtype=bf, device="cuda")
dxBC = torch.empty_like(zx)[..., dim:2 * dim + 2 * GN]
g = torch.randn(B, L, dim, dtype=bf, device="cuda")
gall = torch.randn(B, L, dim + 2 * GN, dtype=bf, device="cuda")
res = {}
res["x 5120"] = time_us(lambda: ops.causal_conv1d_backward_into(
    g.transpose(1, 2), None, xBC[..., :dim].transpose(1, 2), cw[:dim], dxBC[..., :dim].transpose(1, 2), cb[:dim],
    None, None, "silu"))[0]
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
res["cl fp32 2560"] = time_us(lambda: ops.causal_conv1d_backward(gf, None, xf, wf, wf[:, 0], None, None, "silu"))[0]
try:
    import causal_conv1d_cuda  # noqa
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as cc_bwd  # 1.7.0
    dxr = torch.empty_like(xr)
    res["causal-conv1d rows bf16 5120"] = time_us(lambda: cc_bwd(xr, cw[:dim], cb[:dim], gr, None, None, None, dxr,
                                                                  False, True))[0]
    from causal_conv1d.cpp_functions import causal_conv1d_fwd_function as cc_fwd
    res["causal-conv1d rows fwd"] = time_us(lambda: cc_fwd(xr, cw[:dim], cb[:dim], None, None, None, True))[0]
    res["causal-conv1d 5376"] = time_us(lambda: cc_bwd(xBC.transpose(1, 2), cw, cb, gall.transpose(1, 2), None, None,
                                                        None, dxBC.transpose(1, 2), False, True))[0]
except Exception as e:  # noqa
    print("causal-conv1d:", repr(e)[:300])
print((sys.argv[1] if len(sys.argv) > 1 else "") + ": " + " | ".join(f"{k} {v:.1f}" for k, v in res.items()))
