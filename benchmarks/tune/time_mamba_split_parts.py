"""Dev tool: the Mamba-2 split path's backward parts at the 2.7B layer, µs (``harness.time_us``:
do_bench, L2 flushed) — the conv backward per channel range (x 5120, B 128, C 128) and in one
launch, causal-conv1d's channel-last backward over all 5376 channels, and the gated RMSNorm's
backward: allocating + dz copy + forward recompute against gated_rms_norm_backward_into.
Run on the GPU from the repo root (peers/ after ``scripts/peers.sh install``):
  PYTHONPATH=$PWD python benchmarks/tune/time_mamba_split_parts.py"""
import sys
import torch
import baracuda_torch  # noqa: F401 (the ops)
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
import peers  # noqa: E402,F401 (peers/site on sys.path)

ops = torch.ops.baracuda
bf = torch.bfloat16
B, L, W = 4, 4096, 4
dim, GN, H = 5120, 128, 80
width = 2 * dim + 2 * GN + H
zx = torch.randn(B, L, width, dtype=bf, device="cuda")
xBC = zx[..., dim:2 * dim + 2 * GN]
cw = torch.randn(dim + 2 * GN, W, dtype=bf, device="cuda") * 0.3
cb = torch.randn(dim + 2 * GN, dtype=bf, device="cuda")
dzx = torch.empty_like(zx)
dxBC = dzx[..., dim:2 * dim + 2 * GN]
g_x = torch.randn(B, L, H, 64, dtype=bf, device="cuda")
g_B = torch.randn(B, L, 1, GN, dtype=bf, device="cuda")
g_C = torch.randn(B, L, 1, GN, dtype=bf, device="cuda")
parts = ((0, dim), (dim, dim + GN), (dim + GN, dim + 2 * GN))


def one(k):
    (a, b), g = parts[k], (g_x, g_B, g_C)[k]
    return lambda: ops.causal_conv1d_backward_into(g.flatten(-2).transpose(1, 2), None, xBC[..., a:b].transpose(1, 2),
                                                   cw[a:b], dxBC[..., a:b].transpose(1, 2), cb[a:b], None, None, "silu")


def all3():
    for k in range(3):
        one(k)()


res = {}
for name, fn in (("x 5120", one(0)), ("B 128", one(1)), ("C 128", one(2)), ("all three", all3)):
    res[name] = time_us(fn)[0]
gall = torch.cat([g_x.flatten(-2), g_B.flatten(-2), g_C.flatten(-2)], -1)
res["ours one launch 5376 (contiguous dout)"] = time_us(
    lambda: ops.causal_conv1d_backward_into(gall.transpose(1, 2), None, xBC.transpose(1, 2), cw,
                                            dxBC.transpose(1, 2), cb, None, None, "silu"))[0]
try:
    import causal_conv1d_cuda  # noqa
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as cc_bwd  # 1.7.0
    res["causal-conv1d 5376"] = time_us(lambda: cc_bwd(xBC.transpose(1, 2), cw, cb, gall.transpose(1, 2), None, None,
                                                        None, dxBC.transpose(1, 2), False, True))[0]
except Exception as e:  # noqa
    print("causal-conv1d:", repr(e)[:300])
for k, v in res.items():
    print(f"conv bwd {k}: {v:.1f} us")

# gated RMSNorm backward at the layer: [B, L, 5120], one group (mamba_ssm's Mamba2: norm_before_gate=False)
for nbg in (False, True):
    x = torch.randn(B, L, dim, dtype=bf, device="cuda")
    z = zx[..., :dim]
    w = torch.randn(dim, dtype=bf, device="cuda")
    dy = torch.randn(B, L, dim, dtype=bf, device="cuda")
    rstd = ops.gated_rms_norm(x, w, None, z, 1e-5, None, nbg)[1]
    dz = dzx[..., 0:dim]

    def old():
        dx, dw, db, dzn = ops.gated_rms_norm_backward(dy, x, w, None, z, rstd, None, nbg)
        dz.copy_(dzn)
        return ops.gated_rms_norm(x, w, None, z, 1e-5, None, nbg)[0]

    fw = time_us(lambda: ops.gated_rms_norm(x, w, None, z, 1e-5, None, nbg))[0]
    bw = time_us(lambda: ops.gated_rms_norm_backward(dy, x, w, None, z, rstd, None, nbg))[0]
    o = time_us(old)[0]
    n0 = time_us(lambda: ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, dz, None, nbg, False))[0]
    n1 = time_us(lambda: ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, dz, None, nbg, True))[0]
    print(f"gated rmsnorm norm_before_gate={nbg}: forward {fw:.1f}, backward {bw:.1f}, "
          f"backward+copy+forward {o:.1f}, into {n0:.1f}, into+recompute {n1:.1f} us")
