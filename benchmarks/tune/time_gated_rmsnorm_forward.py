"""Dev tool: the gated RMSNorm forward at the Mamba-2 2.7B layer ([16384, 5120] bf16; one group and
groups of 640, each gate order), µs (``harness.time_us``: do_bench, L2 flushed), staged (the plan's
choice where the ring fits) and unstaged (``bt._C._rms_norm_allow_stage(False)``) in one process,
with the plan's variant and a digest of y and rstd (the same for both). Run on the GPU from the
repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_gated_rmsnorm_forward.py [label]"""
import hashlib
import sys
import torch
import baracuda_torch as bt
sys.path.insert(0, "benchmarks")
from harness import time_us  # noqa: E402
ops = torch.ops.baracuda
x, z = (torch.randn(16384, 5120, dtype=torch.bfloat16, device="cuda") for _ in range(2))
w = torch.randn(5120, dtype=torch.bfloat16, device="cuda")
for rnd in range(2):
    for allow in (True, False):
        previous = bt._C._rms_norm_allow_stage(allow)
        try:
            out = []
            for gs in (None, 640):
                for nbg in (False, True):
                    digest = hashlib.sha1()
                    for t in ops.gated_rms_norm(x, w, None, z, 1e-5, gs, nbg):
                        digest.update(t.float().cpu().numpy().tobytes())
                    us = time_us(lambda: ops.gated_rms_norm(x, w, None, z, 1e-5, gs, nbg))[0]
                    out.append(f"gs={gs} nbg={nbg} {us:.1f} ({digest.hexdigest()[:8]})")
            variant = bt.explain("gated_rms_norm", x, w, None, z, 1e-5).variant
            print(sys.argv[1] if len(sys.argv) > 1 else "", f"round {rnd}", variant, " | ".join(out))
        finally:
            bt._C._rms_norm_allow_stage(previous)
