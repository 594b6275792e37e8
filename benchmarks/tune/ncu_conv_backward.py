"""Dev tool: one launch each (after a warm-up) for ncu: our conv backward over the Mamba-2 2.7B
layer's x range (5120 channels of the xBC slice, dx into dzxbcdt), then causal-conv1d's channel-last
backward over all 5376 (needs peers/); the tensors of time_conv_backward.py. From the repo root on the GPU:
  PYTHONPATH=$PWD ncu --profile-from-start off --kernel-name regex:"causal_conv1d.*bwd|causal_conv1d_backward" \
      [--section ...] python benchmarks/tune/ncu_conv_backward.py"""
import os
import sys

import torch
import baracuda_torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_conv_backward import layer, x_range_args  # noqa: E402 (also puts peers/site on sys.path)
import causal_conv1d_cuda  # noqa: E402,F401
from causal_conv1d.cpp_functions import causal_conv1d_bwd_function as cc_bwd  # noqa: E402

t = layer()
args = x_range_args(t)
ours = lambda: torch.ops.baracuda.causal_conv1d_backward_into(*args)  # noqa: E731
theirs = lambda: cc_bwd(t.xBC.transpose(1, 2), t.cw, t.cb, t.gall.transpose(1, 2), None, None, None,  # noqa: E731
                        t.dxBC.transpose(1, 2), False, True)
for _ in range(3):
    ours(), theirs()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
ours()
theirs()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print(baracuda_torch.explain("causal_conv1d_backward_into", *args))
