"""Dev tool: RoPE from cos/sin tables, forward µs (``harness.time_us``: do_bench, L2 flushed) against a
device copy of the same tensor: flash-attention's layout (x [8, 4096, 32, 128] bf16 seen as
[B, H, S, D], float32 [S, 64] tables) and the Hugging Face q/k path (q [8, 32, 4096, 128], k with 8
heads, bf16 [1, S, 128] tables; q and k together and q alone). ``--table-vectors`` times the
kernel under each setting of ``_rope_cos_sin_table_vectors`` (auto, any, never) in the same run, a
line each; ``--walk auto,off`` likewise for ``_rope_cos_sin_walk32`` (the plan's walk on 32-bit offsets or
the 64-bit kernel), each line also timing the flash layout's interleaved pairs and its backward (the same
kernel, the transposed coefficients). ``--positions`` adds a line for ``rope`` from positions on the same tensors (its own
table kernel and streaming kernel), the in-run reference for the cos/sin kernel. Run on the GPU
from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_rope_cos_sin.py LABEL [--table-vectors auto,any,never] [--walk auto,off]
      [--positions]"""
import sys

import torch

import baracuda_torch as bt
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
bf = torch.bfloat16
B, S, H, Hk, D = 8, 4096, 32, 8, 128
xf = torch.randn(B, S, H, D, dtype=bf, device="cuda")
pos = torch.arange(S, device="cuda", dtype=torch.float32)[:, None] * torch.rand(D // 2, device="cuda")
cf, sf = pos.cos(), pos.sin()
x = xf.transpose(1, 2)
args = sys.argv[1:]
label = args[0] if args and not args[0].startswith("--") else ""
modes = [("_rope_cos_sin_table_vectors", "auto")]
if "--table-vectors" in args:
    modes = [("_rope_cos_sin_table_vectors", m) for m in args[args.index("--table-vectors") + 1].split(",")]
if "--walk" in args:
    modes = [("_rope_cos_sin_walk32", m) for m in args[args.index("--walk") + 1].split(",")]
q = torch.randn(B, H, S, D, dtype=bf, device="cuda")
k = torch.randn(B, Hk, S, D, dtype=bf, device="cuda")
emb = torch.cat([pos, pos], -1)[None]
c, s = emb.cos().to(bf), emb.sin().to(bf)
copies = {"flash copy": time_us(lambda: xf.clone())[0],
          "hf qk copy": time_us(lambda: (q.clone(), k.clone()))[0],
          "hf q copy": time_us(lambda: q.clone())[0]}
for switch, mode in modes:
    previous = getattr(bt._C, switch)(mode)
    res = {"flash fwd": time_us(lambda: bt.rope_cos_sin(x, cf, sf))[0], "flash copy": copies["flash copy"],
           "hf qk fwd": time_us(lambda: bt.rope_qk_cos_sin(q, k, c, s))[0], "hf qk copy": copies["hf qk copy"],
           "hf q fwd": time_us(lambda: bt.rope_cos_sin(q, c, s))[0], "hf q copy": copies["hf q copy"]}
    if switch == "_rope_cos_sin_walk32":
        res["flash il fwd"] = time_us(lambda: bt.rope_cos_sin(x, cf, sf, True))[0]
        res["flash bwd"] = time_us(lambda: torch.ops.baracuda.rope_cos_sin_backward(x, cf, sf, False))[0]
    getattr(bt._C, switch)(previous)
    print(label + (f" [{mode}]" if len(modes) > 1 else ""), " | ".join(f"{k} {v:.1f}" for k, v in res.items()),
          f"| flash x copy {res['flash copy'] / res['flash fwd']:.3f} | hf qk x copy {res['hf qk copy'] / res['hf qk fwd']:.3f}",
          flush=True)
if "--positions" in args:
    res = {"flash fwd": time_us(lambda: bt.rope(x))[0], "hf q fwd": time_us(lambda: bt.rope(q))[0],
           "hf k fwd": time_us(lambda: bt.rope(k))[0]}
    print(label + " [rope from positions]", " | ".join(f"{k} {v:.1f}" for k, v in res.items()),
          f"| flash x copy {copies['flash copy'] / res['flash fwd']:.3f} | hf q x copy {copies['hf q copy'] / res['hf q fwd']:.3f}",
          flush=True)
