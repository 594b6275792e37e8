"""Dev tool: one launch each (after a warm-up) for ncu: our conv backward over the Mamba-2 2.7B
layer's x range (5120 channels of the xBC slice, dx into dzxbcdt), then causal-conv1d's channel-last
backward over all 5376 (needs peers/). From the repo root on the GPU:
  PYTHONPATH=$PWD ncu --profile-from-start off --kernel-name regex:"causal_conv1d.*bwd|causal_conv1d_backward" \
      [--section ...] python benchmarks/tune/ncu_conv_backward.py"""
import sys
import torch
import baracuda_torch  # noqa: F401
sys.path.insert(0, "benchmarks")
import peers  # noqa: E402,F401 (peers/site on sys.path)
import causal_conv1d_cuda  # noqa: F401
from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as cc_bwd

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
ours = lambda: ops.causal_conv1d_backward_into(g.transpose(1, 2), None, xBC[..., :dim].transpose(1, 2), cw[:dim],  # noqa
                                               dxBC[..., :dim].transpose(1, 2), cb[:dim], None, None, "silu")
theirs = lambda: cc_bwd(xBC.transpose(1, 2), cw, cb, gall.transpose(1, 2), None, None, None,  # noqa
                        dxBC.transpose(1, 2), False, True)
for _ in range(3):
    ours(), theirs()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
ours()
theirs()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print(baracuda_torch.explain("causal_conv1d_backward_into", g.transpose(1, 2), None,
                         xBC[..., :dim].transpose(1, 2), cw[:dim], dxBC[..., :dim].transpose(1, 2),
                         cb[:dim], None, None, "silu"))
