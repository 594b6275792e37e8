"""Dev tool: the SSD chunk scan against mamba_ssm's Triton mamba_chunk_scan_combined, kernel
by kernel, on the same tensors (bf16). Run on the GPU from the repo root, after
``scripts/peers.sh install`` (without peers/ only our side is shown):
  PYTHONPATH=$PWD python benchmarks/tune/profile_ssd_chunk_scan.py [--options [--no-z]] [--shapes 0,1]
      [--forwards auto,fused_mma] [--backwards auto,staged,group_mma] [--dtype float32] [--seqs 8]
      [--one-stream] [--graph] [--no-peer]
For each shape and pass (forward; backward = the backward pass alone, autograd with a
retained graph): the median time of the whole pass (CUDA events, benchmarks/harness.py's
time_us) for both, then each side's kernels (torch.profiler, µs per call over REPS
calls), largest first. ``--dtype``: the activations' dtype (bfloat16; float32 runs our
SIMT kernels, and mamba_ssm's Triton dots in TF32). ``--seqs K``: seq_idx with K packed
sequences a row of nearly equal lengths (K = 7: every start inside a chunk of 256 at
L = 4096 and 8192). ``--options`` passes what a Mamba2 layer passes (D, z, dt_bias
with softplus, float32 initial states; A, D and dt_bias in float32); ``--no-z`` leaves z out
(a Mamba2 layer with rmsnorm=True, mamba_ssm's default, gives z to its gated RMSNorm and
not to the scan). ``--forwards``: our
CUDA forward kernels to compare ("auto": the plan's choice; "staged", "fused_mma", "fused_mma_cb",
"fused_wgmma": forced through the test switch where the kernel takes the problem);
``--backwards`` likewise for the backward ("staged": the per-head dB/dC products,
"group_mma": the per-group ones, "group_wgmma": those with the dC/dB kernel on wgmma). Every pair of the two lists is measured.
``--one-stream``: our backward with every kernel on the caller's stream
(``_ssd_cuda_backward_side_stream("off")``); by default the plan runs some of the group
products' kernels on side streams, where the kernels' sum counts the overlapped kernels in
full and only the pass's time says what the overlap gains.
``--graph``: each side also replayed from a CUDA graph of 5 calls (harness.time_us_graph:
no host launch cost, as a training step captured whole runs): the forward, and the forward
with its backward (the backward is their difference), so that the two sides' passes compare
without mamba_ssm's Python and Triton launches, which the eager times include.
``--no-peer``: ours only (mamba_ssm's first calls autotune its Triton kernels, most of a
run's minutes at the four shapes).
``--once``: our forward and backward (first of each list), three times each and nothing
else (no timing, profiler or mamba_ssm), for a profiler that wraps the process:
  ncu --clock-control none -k regex:ssd_tc_scan_kernel --launch-skip 2 --launch-count 1 \
      python benchmarks/tune/profile_ssd_chunk_scan.py --shapes 0 --once
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import peers  # noqa: E402
from harness import time_us, time_us_graph  # noqa: E402

import baracuda_torch as bt  # noqa: E402
from baracuda_torch.mamba import mamba_chunk_scan_combined  # noqa: E402

# B, L, H, P, N, G: the Mamba-2 2.7B layer, the same with per-head groups, and two more
# layouts of the table.
SHAPES = [(4, 4096, 80, 64, 128, 1), (4, 4096, 80, 64, 128, 80), (2, 8192, 32, 64, 64, 32),
          (2, 4096, 16, 128, 256, 16)]
CHUNK = 256
REPS = 10


def make_inputs(b, L, H, P, N, G, options, dtype=torch.bfloat16, z=True, seqs=0):
    x = torch.randn(b, L, H, P, device="cuda", dtype=dtype)
    dt = F.softplus(torch.randn(b, L, H, device="cuda") - 2).to(dtype)
    A = -torch.exp(0.5 * torch.randn(H, device="cuda")).to(dtype)
    B = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    C = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    args = [x, dt, A, B, C]
    kw = {}
    if options:
        f32 = dict(device="cuda", dtype=torch.float32)
        args[1] = (dt.float() - 1).to(dtype)
        args[2] = -torch.exp(0.5 * torch.randn(H, **f32))
        kw = dict(D=torch.randn(H, **f32), z=torch.randn_like(x), dt_bias=0.1 * torch.randn(H, **f32),
                  initial_states=torch.randn(b, H, P, N, **f32), dt_softplus=True)
        if not z:  # (drawn all the same: the other inputs stay those of the run with z)
            del kw["z"]
    if seqs > 1:
        kw["seq_idx"] = (torch.arange(L, device="cuda", dtype=torch.int32) * seqs // L).expand(b, L).contiguous()
    leaves = [t.requires_grad_() for t in args] + [v.requires_grad_() for v in kw.values()
                                                   if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return args, kw, leaves


def kernels(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / REPS, e.count / REPS) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows


def show(title, rows):
    total = sum(r[1] for r in rows)  # (kernels that overlap on side streams count in full)
    print(f"  {title}: {total:.0f} µs of kernels per call")
    for name, us, n in rows:
        short = name if len(name) < 100 else name[:97] + "..."
        print(f"    {us:9.1f} µs  x{n:<4g} {short}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--options", action="store_true")
    ap.add_argument("--no-z", action="store_true", help="with --options: no z")
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))))
    ap.add_argument("--forwards", default="auto")
    ap.add_argument("--backwards", default="auto")
    ap.add_argument("--once", action="store_true", help="run ours 3 times, nothing else (for ncu)")
    ap.add_argument("--one-stream", action="store_true", help="our backward's kernels all on one stream")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seqs", type=int, default=0, help="packed sequences a row (seq_idx; 0: none)")
    ap.add_argument("--graph", action="store_true", help="also time the passes replayed from CUDA graphs")
    ap.add_argument("--no-peer", action="store_true",
                    help="ours only: mamba_ssm's Triton autotuning takes most of a run's minutes")
    a = ap.parse_args()
    theirs = None if a.once or a.no_peer else peers.mamba_chunk_scan_combined()
    if a.one_stream:
        bt._C._ssd_cuda_backward_side_stream("off")
    summary, graphed = [], []
    for i in [int(s) for s in a.shapes.split(",")]:
        b, L, H, P, N, G = SHAPES[i]
        case = f"B{b} L{L} H{H} P{P} N{N} G{G} Q{CHUNK}" + (" +options" if a.options else "") + \
            (" -z" if a.options and a.no_z else "") + (f" {a.dtype}" if a.dtype != "bfloat16" else "") + \
            (f" seqs={a.seqs}" if a.seqs > 1 else "")
        args, kw, leaves = make_inputs(b, L, H, P, N, G, a.options, getattr(torch, a.dtype), z=not a.no_z,
                                       seqs=a.seqs)
        info = bt.explain(torch.ops.baracuda.ssd_chunk_scan_combined, *[t.detach() for t in args], CHUNK)
        print(f"\n== {case}: our forward {info.variant}")
        impls = {}
        for fk in a.forwards.split(","):
            for bk in a.backwards.split(","):
                name = "ours" if (fk, bk) == ("auto", "auto") else f"ours[{fk}/{bk}]"
                impls[name] = (mamba_chunk_scan_combined, fk, bk)
        if theirs is not None:
            impls["mamba_ssm"] = (theirs, None, None)
        dy = torch.randn_like(args[0])
        if a.once:
            bt._C._ssd_cuda_forward(a.forwards.split(",")[0])
            bt._C._ssd_cuda_backward(a.backwards.split(",")[0])
            for _ in range(3):
                torch.autograd.grad(mamba_chunk_scan_combined(*args, CHUNK, **kw), leaves, dy)
            torch.cuda.synchronize()
            continue
        outs = {}
        for name, (f, forward, backward) in impls.items():
            if forward is not None:
                bt._C._ssd_cuda_forward(forward)
                bt._C._ssd_cuda_backward(backward)
                d = [t.detach() for t in args]
                name += " " + bt.explain(torch.ops.baracuda.ssd_chunk_scan_combined, *d, CHUNK).variant
                try:  # (the plain op refuses the options' float32 A; same plan otherwise)
                    name += "/" + bt.explain(torch.ops.baracuda.ssd_chunk_scan_backward, d[0],
                                             d[0], d[1], d[2].to(d[0].dtype), d[3], d[4], CHUNK).variant
                except Exception:  # noqa: BLE001
                    name += "/?"

            fwd = lambda f=f: f(*args, CHUNK, **kw)  # noqa: E731
            with torch.no_grad():
                outs[name] = fwd().float()
            y = fwd()
            bwd = lambda y=y: torch.autograd.grad(y, leaves, dy, retain_graph=True)  # noqa: E731
            with torch.no_grad():
                tf = time_us(fwd)[0]
            tb = time_us(bwd)[0]
            print(f" {name}: forward {tf:.0f} µs, backward {tb:.0f} µs")
            with torch.no_grad():
                show(f"{name} forward", kernels(fwd))
            show(f"{name} backward", kernels(bwd))
            summary.append((case, name, tf, tb))
            del y, bwd
            if a.graph:  # (after y's gone: torch 2.11 fails to capture an autograd pass while an
                # eager output is alive, cudaErrorStreamCaptureImplicit, plain torch ops too)
                def fwd_nograd(f=f):
                    with torch.no_grad():
                        return f(*args, CHUNK, **kw)
                step = lambda f=f: torch.autograd.grad(f(*args, CHUNK, **kw), leaves, dy)  # noqa: E731
                gf, gs = time_us_graph(fwd_nograd, calls=5)[0], time_us_graph(step, calls=5)[0]
                print(f" {name} from a CUDA graph: forward {gf:.0f} µs, forward + backward {gs:.0f} µs "
                      f"(backward {gs - gf:.0f})")
                graphed.append((case, name, gf, gs - gf))
            bt._C._ssd_cuda_forward("auto")
            bt._C._ssd_cuda_backward("auto")
            torch.cuda.empty_cache()
        if "mamba_ssm" in outs:
            b_ = outs.pop("mamba_ssm").double()
            for name, o in outs.items():
                rel = ((o.double() - b_).norm() / b_.norm()).item()
                print(f" {name} vs mamba_ssm output: rel L2 {rel:.2e}")
        args = kw = leaves = outs = dy = None  # (freed before the next shape)
        torch.cuda.empty_cache()
    print("\ncase | provider | forward µs | backward µs")
    for case, name, tf, tb in summary:
        print(f"{case} | {name} | {tf:.0f} | {tb:.0f}")
    if graphed:
        print("\nfrom CUDA graphs: case | provider | forward µs | backward µs")
        for case, name, gf, gb in graphed:
            print(f"{case} | {name} | {gf:.0f} | {gb:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
