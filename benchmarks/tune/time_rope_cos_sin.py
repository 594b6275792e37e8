"""Dev tool: RoPE from cos/sin tables, forward µs (``harness.time_us``: do_bench, L2 flushed) against a
device copy of the same tensor: flash-attention's layout (x [8, 4096, 32, 128] bf16 seen as
[B, H, S, D], float32 [S, 64] tables) and the Hugging Face q/k path (q [8, 32, 4096, 128], k with 8
heads, bf16 [1, S, 128] tables; q and k together and q alone). Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_rope_cos_sin.py LABEL"""
import sys

import torch

import baracuda_torch as bt
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
bf = torch.bfloat16
B, S, H, Hk, D = 8, 4096, 32, 8, 128
res = {}
xf = torch.randn(B, S, H, D, dtype=bf, device="cuda")
pos = torch.arange(S, device="cuda", dtype=torch.float32)[:, None] * torch.rand(D // 2, device="cuda")
cf, sf = pos.cos(), pos.sin()
x = xf.transpose(1, 2)
res["flash fwd"] = time_us(lambda: bt.rope_cos_sin(x, cf, sf))[0]
res["flash copy"] = time_us(lambda: xf.clone())[0]
q = torch.randn(B, H, S, D, dtype=bf, device="cuda")
k = torch.randn(B, Hk, S, D, dtype=bf, device="cuda")
emb = torch.cat([pos, pos], -1)[None]
c, s = emb.cos().to(bf), emb.sin().to(bf)
res["hf qk fwd"] = time_us(lambda: bt.rope_qk_cos_sin(q, k, c, s))[0]
res["hf qk copy"] = time_us(lambda: (q.clone(), k.clone()))[0]
res["hf q fwd"] = time_us(lambda: bt.rope_cos_sin(q, c, s))[0]
res["hf q copy"] = time_us(lambda: q.clone())[0]
print(sys.argv[1] if len(sys.argv) > 1 else "", " | ".join(f"{k} {v:.1f}" for k, v in res.items()),
      f"| flash x copy {res['flash copy'] / res['flash fwd']:.3f} | hf qk x copy {res['hf qk copy'] / res['hf qk fwd']:.3f}",
      flush=True)
