"""Dev tool: where the SSD chunk scan's time goes, kernel by kernel (torch.profiler), at
the benchmark shapes in bfloat16, forward and backward. Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/profile_ssd_chunk_scan.py
Prints, per shape and pass, each CUDA kernel's total time over REPS calls divided by REPS
(µs per call), largest first.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import baracuda_torch as bt

ops = torch.ops.baracuda
SHAPES = [(4, 4096, 80, 64, 128, 1), (2, 8192, 32, 64, 64, 32)]  # B, L, H, D, N, G
CHUNK = 256
REPS = 10


def inputs(b, L, H, D, N, G, dtype=torch.bfloat16):
    x = torch.randn(b, L, H, D, device="cuda", dtype=dtype)
    dt = F.softplus(torch.randn(b, L, H, device="cuda") - 2).to(dtype)
    A = -torch.exp(0.5 * torch.randn(H, device="cuda")).to(dtype)
    B = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    C = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    return x, dt, A, B, C


def kernel_table(fn, title):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / REPS, e.count // REPS) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"\n{title}: {total:.0f} µs of kernels per call")
    for name, us, n in rows:
        short = name if len(name) < 110 else name[:107] + "..."
        print(f"  {us:9.1f} µs  x{n:<3d} {short}")


def main():
    for b, L, H, D, N, G in SHAPES:
        x, dt, A, B, C = inputs(b, L, H, D, N, G)
        dy = torch.randn_like(x)
        case = f"B{b} L{L} H{H} D{D} N{N} G{G} Q{CHUNK}"
        info = bt.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size=CHUNK)
        print(f"\n== {case}: variant {info.variant}")
        kernel_table(lambda: ops.ssd_chunk_scan(x, dt, A, B, C, CHUNK), f"{case} forward")
        kernel_table(lambda: ops.ssd_chunk_scan_backward(dy, x, dt, A, B, C, CHUNK), f"{case} backward")
        del x, dt, A, B, C, dy
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
