"""Dev tool: our SSD backward alone (with --forward: the forward), µs of each kernel per
call (torch.profiler over profile_ssd_chunk_scan.REPS calls after three), at one of that
file's shapes, optionally with seq_idx and a forced CUDA forward — for A/B runs of one
kernel's variants, where the side-by-side tables of profile_ssd_chunk_scan.py take too
long. Run on the GPU from the repo root:
  PYTHONPATH=$PWD python benchmarks/tune/time_ssd_backward.py LABEL [--options [--no-z]] [--shape 0 | --dims B,L,H,P,N,G]
      [--forward] [--seq K] [--kernel fused_mma_cb] [--one-stream] [--keep off] [--settings S --rounds R]
``--no-z``: the options without z (what the Mamba-2 layer passes: its gated norm takes z).
``--one-stream``: every backward kernel on the caller's stream (the plan overlaps some of
the group products' kernels on side streams, where each overlapped kernel takes longer than
alone and the total counts them in full: for one kernel's A/B, run both sides with it).
``--keep off``: the forward keeps no chunk states (mamba.set_keep_chunk_states(False)): the
backward recomputes them, as before the plan kept them.
``--settings "base;NAME=1;NAME=2" --rounds 3``: an A/B in one process, for a build whose
code reads environment switches (an experiment's getenv, not in the package) or through the
package's test switches (a NAME starting with ``_``: ``bt._C.NAME(value)``, e.g.
``_ssd_cuda_dx_wgmma=off``, "auto" where a setting does not name it): each round runs every
setting in turn (``base``: none of the named variables set; a setting may set several,
comma-separated), a line each, so that the settings alternate on one machine.
Prints one line (with settings: one a setting and round): the label, the pass's wall time
(benchmarks/harness.py's time_us: what the side streams' overlap gains shows there, not in
the kernels' sum), the kernels' total, every kernel above 5 µs and a digest of the output
(forward) or the gradients (backward) — the inputs come from seed 0, so two builds (or two
settings) that compute the same bits print the same digest."""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys

import torch

import baracuda_torch as bt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_ssd_chunk_scan as ps  # noqa: E402

from baracuda_torch.mamba import mamba_chunk_scan_combined  # noqa: E402


def short(name: str) -> str:
    m = re.search(r"(ssd_\w+(<[^>(]*>)?)", name)
    return m.group(1).replace("__nv_bfloat16", "bf16") if m else name[:30]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--options", action="store_true")
    ap.add_argument("--no-z", action="store_true", help="with --options: no z (the layer's options)")
    ap.add_argument("--shape", type=int, default=0)
    ap.add_argument("--dims", help="B,L,H,P,N,G in place of --shape's")
    ap.add_argument("--forward", action="store_true", help="time the forward (inputs requiring grad)")
    ap.add_argument("--seq", type=int, default=0, help="seq_idx: K packed sequences a row, random lengths")
    ap.add_argument("--kernel", default="auto", help="the CUDA forward, through the test switch")
    ap.add_argument("--one-stream", action="store_true", help="the backward's kernels all on one stream")
    ap.add_argument("--keep", choices=("on", "off"), default="on", help="the forward keeps its chunk states")
    ap.add_argument("--settings", default="base", help='switches to alternate: "base;NAME=1;_switch=off;..."')
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    settings = [dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv) for s in a.settings.split(";")]
    switches = {k for s in settings for k in s}
    bt._C._ssd_cuda_forward(a.kernel)
    if a.one_stream:
        bt._C._ssd_cuda_backward_side_stream("off")
    bt.mamba.set_keep_chunk_states(a.keep == "on")
    torch.manual_seed(0)
    dims = tuple(int(v) for v in a.dims.split(",")) if a.dims else ps.SHAPES[a.shape]
    args, kw, leaves = ps.make_inputs(*dims, a.options, z=not a.no_z)
    if a.seq > 1:
        b, L = args[0].shape[:2]
        g = torch.Generator().manual_seed(0)
        seq_idx = torch.zeros(b, L, dtype=torch.int32)
        for row in range(b):
            for t in torch.randperm(L - 1, generator=g)[:a.seq - 1].tolist():
                seq_idx[row, t + 1:] += 1
        kw["seq_idx"] = seq_idx.cuda()
    if a.forward:
        run = lambda: mamba_chunk_scan_combined(*args, ps.CHUNK, **kw)  # noqa: E731
    else:
        dy = torch.randn_like(args[0])
        y = mamba_chunk_scan_combined(*args, ps.CHUNK, **kw)
        run = lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)  # noqa: E731
    for _ in range(a.rounds):
        for setting, text in zip(settings, a.settings.split(";")):
            for k in switches:
                if k.startswith("_"):
                    getattr(bt._C, k)(setting.get(k, "auto"))
                else:
                    os.environ.pop(k, None)
            os.environ.update({k: v for k, v in setting.items() if not k.startswith("_")})
            out = run()
            digest = hashlib.sha1(b"".join(t.detach().float().cpu().numpy().tobytes()
                                           for t in (out if isinstance(out, tuple) else (out,)))).hexdigest()[:10]
            rows = ps.kernels(run)
            wall = ps.time_us(run)[0]
            print(a.label, text if len(settings) > 1 else "", "forward" if a.forward else "backward",
                  ("options without z" if a.no_z else "options") if a.options else "plain",
                  f"dims {a.dims}" if a.dims else f"shape {a.shape}",
                  f"seq {a.seq}" if a.seq else "", a.kernel if a.kernel != "auto" else "",
                  "one stream" if a.one_stream else "", "states recomputed" if a.keep == "off" else "",
                  f"wall {wall:.0f} µs, kernels {sum(r[1] for r in rows):.0f} µs:",
                  " | ".join(f"{short(n)} {us:.1f}" for n, us, _ in rows if us > 5), f"| digest {digest}", flush=True)


if __name__ == "__main__":
    main()
