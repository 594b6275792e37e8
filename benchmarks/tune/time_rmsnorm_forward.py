"""Dev tool: RMSNorm forwards, µs (do_bench, L2 flushed): the LLaMA-7B layer's [8192, 4096] bf16
(llama convention; with a residual too) and the Mamba-2 2.7B layer's gated [16384, 5120] bf16 (one
group: both gates; 8 groups of 640). Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_rmsnorm_forward.py LABEL"""
import sys
import torch
import baracuda_torch  # noqa: F401
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
ops = torch.ops.baracuda
bf = torch.bfloat16
x, r = (torch.randn(8192, 4096, dtype=bf, device="cuda") for _ in range(2))
w = torch.randn(4096, dtype=bf, device="cuda")
res = {"rms": time_us(lambda: ops.rms_norm(x, w, 1e-6, "llama"))[0],
       "add+rms": time_us(lambda: ops.add_rms_norm(x, r, w, 1e-6, "llama"))[0]}
xg, zg = (torch.randn(16384, 5120, dtype=bf, device="cuda") for _ in range(2))
wg = torch.randn(5120, dtype=bf, device="cuda")
for gs in (None, 640):
    for nbg in (True, False):
        res[f"gated gs={gs} nbg={nbg}"] = time_us(lambda: ops.gated_rms_norm(xg, wg, None, zg, 1e-5, gs, nbg))[0]
print(sys.argv[1] + ": " + " | ".join(f"{k} {v:.1f}" for k, v in res.items()))
