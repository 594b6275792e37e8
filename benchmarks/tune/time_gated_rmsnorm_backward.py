"""Dev tool: the gated RMSNorm backward as the Mamba-2 2.7B layer calls it
(``gated_rms_norm_backward_into``: dy, x, z [16384, 5120] bf16, norm after the gate, dz into a
strided buffer as dzxbcdt, y recomputed), staged (the plan's choice where the ring fits) against
unstaged (``bt._C._rms_norm_allow_stage(False)``), two rounds in one process: one row group, 8
groups of 640, and one group with a float32 weight. Kernel µs a call (torch.profiler) and a digest
of every output, which must match between the two. Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_gated_rmsnorm_backward.py"""
import hashlib
import re
import sys
import torch
import baracuda_torch as bt
sys.path.insert(0, "benchmarks")
from harness import kernel_breakdown  # noqa: E402

ops = torch.ops.baracuda
torch.manual_seed(0)
R, N = 16384, 5120
bf = torch.bfloat16
for ngroups, w_dtype in ((1, bf), (8, bf), (1, torch.float32)):
    gs = N // ngroups
    x, z = (torch.randn(R, N, dtype=bf, device="cuda") for _ in range(2))
    w = (1 + 0.1 * torch.randn(N, device="cuda")).to(w_dtype)
    _, rstd = ops.gated_rms_norm(x, w, None, z, 1e-5, gs, False)
    dy = torch.randn(R, N, dtype=bf, device="cuda")
    dz = torch.empty(R, 2 * N + 336, dtype=bf, device="cuda")[:, :N]

    def call():
        return ops.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, dz, gs, False, True)

    for rnd in range(2):
        for allow in (True, False):
            previous = bt._C._rms_norm_allow_stage(allow)
            try:
                variant = bt.explain("gated_rms_norm_backward_into", dy, x, w, None, z, rstd, dz, gs, False,
                                     True).variant
                digest = hashlib.sha1()
                for t in (*call(), dz):
                    if t.numel():
                        digest.update(t.float().cpu().numpy().tobytes())
                rows = kernel_breakdown(call, "cuda", iters=20)
                kernels = "  ".join(f"{(re.findall(r'rms_norm_[a-z_]+', name) or [name[:30]])[0]} {us:.1f}"
                                    for name, us, *_ in rows)
                print(f"G{ngroups} w {str(w_dtype)[6:]} round {rnd} {variant}: {sum(r[1] for r in rows):.1f} µs "
                      f"[{kernels}] digest {digest.hexdigest()[:10]}")
            finally:
                bt._C._rms_norm_allow_stage(previous)
