"""Dev tool: the state update's decode step (Mamba-2 2.7B: H80 P64 N128, bf16 x, float32
state, Mamba2.step's expanded operands) from a CUDA graph at batch 1, 8 and 64, ours and
mamba_ssm's Triton `selective_state_update` (from peers/, when present) in the same
process, three timings each, with a digest of our out and state after one step from seed 0
— for A/B runs of the kernel's variants, a process a setting (an experiment's environment
switch read by its plan), alternating on one machine: two settings that compute the same
bits print the same digest. Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_state_update.py LABEL [--batches 1,8,64] [--whole on]
``--whole``: the package's switch for the whole-tiles kernel (bt._C._state_update_whole_tiles:
auto, on or off).
Prints a line a batch: the label, ours and mamba_ssm's µs, the digest."""
from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch

import baracuda_torch as bt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_mamba2_decode as bd  # noqa: E402
import harness  # noqa: E402
import peers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--whole", default="auto", choices=["auto", "on", "off"])
    a = ap.parse_args()
    bt._C._state_update_whole_tiles(a.whole)
    peer = peers.selective_state_update()
    for batch in (int(v) for v in a.batches.split(",")):
        torch.manual_seed(0)
        s = bd.make_step(batch, "cuda")
        st = s["state"].clone()
        with torch.no_grad():
            out = bd.ours_step(s, st)
        digest = hashlib.sha1(out.float().cpu().numpy().tobytes() + st.cpu().numpy().tobytes()).hexdigest()[:10]
        with torch.no_grad():
            ours = [harness.time_us_graph(lambda: bd.ours_step(s))[0] for _ in range(3)]
            theirs = [harness.time_us_graph(lambda: bd.peer_of(peer, s))[0] for _ in range(3)] if peer else []
        print(f"{a.label} B{batch}: ours {' '.join(f'{u:.2f}' for u in ours)} µs | mamba_ssm "
              f"{' '.join(f'{u:.2f}' for u in theirs) or '-'} µs | digest {digest}", flush=True)


if __name__ == "__main__":
    main()
