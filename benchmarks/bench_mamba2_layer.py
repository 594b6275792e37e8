"""One Mamba-2 mixer layer, a training step end to end: ``baracuda_torch.mamba.Mamba2``
against mamba_ssm's ``Mamba2`` at the Mamba-2 2.7B layer shape (d_model 2560, d_state
128, headdim 64, ngroups 1, chunk 256, expand 2: 80 heads; batch 4 × 4096 tokens, bf16)
and a small one (d_model 768: 24 heads, batch 4 × 2048).

Providers, all with the same weights (mamba_ssm's layer is built first, seeded, with D
and the norm weight moved off 1; ours loads its ``state_dict`` with ``strict=True``) on
the same input and output gradient:
  mamba_ssm          mamba_ssm's layer on its fused path (``use_mem_eff_path=True``:
                     ``mamba_split_conv1d_scan_combined``), which needs the causal-conv1d
                     package's compiled functions (left out with a note without them)
  mamba_ssm_unfused  the same layer with ``use_mem_eff_path=False``: in_proj, the conv
                     (causal-conv1d's ``causal_conv1d_fn`` where installed, else
                     ``nn.Conv1d``), ``mamba_chunk_scan_combined``, its gated RMSNorm,
                     out_proj as separate calls
  baracuda           ours (``mamba_split_conv1d_scan_combined``: baracuda's SSD scan;
                     the conv and the gated norm are what ``baracuda_torch.mamba`` calls,
                     the breakdown names their kernels)
mamba_ssm comes from peers/site (``scripts/peers.sh install``; its Python files only:
Mamba2 needs no compiled mamba_ssm extension, its scan is Triton) with causal-conv1d
from the wheel that ``scripts/peers.sh install`` unpacks there too. Without mamba_ssm
only ours runs; on the CPU mamba_ssm's layer is built (to check the weights load) but
not run (its kernels are Triton).

Each provider's output, input gradient and parameter gradients are compared with the
first provider that ran (max |Δ| / max |reference|; a relative L2 difference of the
output above ``--rtol`` is flagged in the note). Times: median (p20–p80) of ``--iters``
steps after ``--warmup`` (CUDA events, ``harness.time_steps``) of the forward alone
(autograd recording) and of the step (forward, the loss ``(output * dy).sum()``, then
``torch.autograd.grad`` of the input and every parameter: ``layers.py``); peak memory
is one step's ``max_memory_allocated`` above what was allocated before it. The
per-kernel breakdown (torch.profiler, on by default; ``--no-profile``) buckets one
step's kernel time into the SSD scan (ours: names with ``ssd``; mamba_ssm:
``_chunk_scan``, ``_chunk_state``, ``_state_passing``, ``_bmm_chunk``,
``_chunk_cumsum``), the causal conv1d (names with ``conv``), GEMMs and the rest.

  PYTHONPATH=$PWD python benchmarks/bench_mamba2_layer.py [--shapes 2.7b,small] [--keep-states off] [--csv out.csv]
  PYTHONPATH=$PWD python benchmarks/bench_mamba2_layer.py --device cpu --tiny   # smoke test
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (puts peers/site on sys.path)
from harness import format_table, write_csv  # noqa: E402
from layers import Provider, format_bucket_table, format_results, run_providers, to_rows  # noqa: E402

FAMILY = "mamba2_layer"
PROVIDERS = ("mamba_ssm", "mamba_ssm_unfused", "baracuda")
RTOL = 2e-2  # relative L2 of bf16 outputs from different kernels

#: the layer's constructor arguments and (batch, seqlen) of each named shape
SHAPES = {
    "2.7b": (dict(d_model=2560, d_state=128, headdim=64, ngroups=1, chunk_size=256, expand=2), (4, 4096)),
    "small": (dict(d_model=768, d_state=128, headdim=64, ngroups=1, chunk_size=256, expand=2), (4, 2048)),
    "tiny": (dict(d_model=64, d_state=16, headdim=16, ngroups=1, chunk_size=32, expand=2), (2, 128)),
}

_MAMBA_SSM_SSD = ("_chunk_scan", "_chunk_state", "_state_passing", "_bmm_chunk", "_chunk_cumsum")
#: kernel buckets of the breakdown: (name, predicate on the lower-cased kernel name)
BUCKETS = [
    ("SSD", lambda n: "ssd" in n or any(s in n for s in _MAMBA_SSM_SSD)),
    ("conv1d", lambda n: "conv" in n),
    ("GEMM", lambda n: any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul",
                                             "aten::mm", "aten::addmm", "aten::bmm", "triton_tem"))),
]


def mamba_ssm_mamba2():
    """mamba_ssm's Mamba2 class, or None (the reason printed)."""
    def mamba_ssm():
        from mamba_ssm.modules.mamba2 import Mamba2
        return Mamba2
    return peers._try(mamba_ssm)


def mamba_ssm_fused_ready() -> str:
    """Why mamba_ssm's fused path cannot run here ("" when it can): it calls
    causal-conv1d's compiled forward and backward."""
    try:
        from mamba_ssm.ops.triton import ssd_combined
    except Exception as e:
        return f"mamba_ssm's ssd_combined does not import: {type(e).__name__}: {e}"
    if ssd_combined.causal_conv1d_fwd_function is None:
        try:
            import causal_conv1d.cpp_functions  # noqa: F401  (for the reason alone)
            why = "its functions did not import into mamba_ssm"
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        return ("its fused path needs the causal-conv1d package's compiled causal_conv1d_cuda "
                f"({why}): scripts/peers.sh build-causal-conv1d, then install")
    return ""


def mamba_ssm_conv() -> str:
    """The conv mamba_ssm's unfused path runs: causal-conv1d's kernel or nn.Conv1d."""
    try:
        from mamba_ssm.modules import mamba2
    except Exception:
        return ""
    return "conv: causal_conv1d_fn" if mamba2.causal_conv1d_fn is not None else "conv: nn.Conv1d (no causal-conv1d)"


def build(kwargs: dict, device: str, dtype: torch.dtype, seed: int = 0):
    """(mamba_ssm's layer or None, ours with the same weights)."""
    from baracuda_torch.mamba import Mamba2

    cls = mamba_ssm_mamba2()
    torch.manual_seed(seed)
    src = (cls or Mamba2)(**kwargs, device=device, dtype=dtype)
    with torch.no_grad():  # D and the norm weight start at 1: move them off it
        src.D.add_(0.2 * torch.randn_like(src.D))
        src.norm.weight.add_(0.2 * torch.randn_like(src.norm.weight))
    ours = Mamba2(**kwargs, device=device, dtype=dtype)
    ours.load_state_dict(src.state_dict(), strict=True)
    return (src if cls is not None else None), ours


def providers(theirs, ours, device: str, wanted) -> list:
    out = []
    for name in wanted:
        if name == "baracuda":
            out.append(Provider("baracuda", lambda: copy.deepcopy(ours)))
        elif name in ("mamba_ssm", "mamba_ssm_unfused"):
            if theirs is None:
                print(f"[{name}] skipped: mamba_ssm is not importable (peers/site: bash scripts/peers.sh "
                      "install)", flush=True)
                continue
            fused = name == "mamba_ssm"

            def make(fused=fused):
                m = copy.deepcopy(theirs)
                m.use_mem_eff_path = fused
                return m
            why = mamba_ssm_fused_ready() if fused else ""
            if why:
                print(f"[{name}] skipped: {why}", flush=True)
                continue
            skip = "mamba_ssm's kernels are Triton (CUDA only)" if device == "cpu" else ""
            out.append(Provider(name, make, skip=skip, note="" if fused else mamba_ssm_conv()))
        else:
            raise ValueError(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")
    return out


def call(model, u):
    return model(u)


def bench(shape: str = "2.7b", device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
          batch: int = None, seqlen: int = None, wanted=PROVIDERS, warmup: int = 3, iters: int = 20,
          profile: bool = True, rtol: float = RTOL, overrides: dict = None) -> list:
    kwargs, (B, L) = SHAPES[shape]
    kwargs = dict(kwargs, **(overrides or {}))
    B, L = batch or B, seqlen or L
    theirs, ours = build(kwargs, device, dtype)
    H = kwargs["expand"] * kwargs["d_model"] // kwargs["headdim"]
    case = (f"B{B} L{L} d{kwargs['d_model']} H{H} P{kwargs['headdim']} N{kwargs['d_state']} "
            f"G{kwargs['ngroups']} Q{kwargs['chunk_size']}")
    print(f"== {FAMILY} {case} {str(dtype).replace('torch.', '')} on {device}", flush=True)
    torch.manual_seed(1)
    u = torch.randn(B, L, kwargs["d_model"], device=device, dtype=dtype).requires_grad_()
    dy = torch.randn_like(u)
    results = run_providers(providers(theirs, ours, device, wanted), call, u, dy, device, warmup,
                            iters, profile, BUCKETS, rtol)
    del theirs, ours
    print(format_results(f"{FAMILY} {case}", results), flush=True)
    if profile:
        print(format_bucket_table(f"{FAMILY} {case}", results, BUCKETS), flush=True)
    return to_rows(FAMILY, case, dtype, results)


def run() -> list:
    """run_all.py's entry: both shapes on the GPU, every provider, with the breakdown."""
    rows = []
    for shape in ("2.7b", "small"):
        rows += bench(shape)
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shapes", default="2.7b,small", help="comma-separated, from: " + ", ".join(SHAPES))
    p.add_argument("--tiny", action="store_true", help="the tiny shape alone (smoke test): --shapes tiny")
    p.add_argument("--batch", type=int)
    p.add_argument("--seqlen", type=int)
    for k in ("d_model", "d_state", "headdim", "ngroups", "chunk_size", "expand"):
        p.add_argument("--" + k.replace("_", "-"), type=int, dest=k, help="override the shapes' " + k)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated, from: " + ", ".join(PROVIDERS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rtol", type=float, default=RTOL)
    p.add_argument("--no-profile", action="store_true", help="leave out the per-kernel breakdown")
    p.add_argument("--csv", help="append the rows to this CSV (harness.write_csv)")
    p.add_argument("--keep-states", choices=("on", "off"), default="on",
                   help="ours: the SSD's forward keeps its chunk states for the backward "
                        "(baracuda_torch.mamba.set_keep_chunk_states; off: recomputed, as mamba_ssm does)")
    a = p.parse_args(argv)
    from baracuda_torch import mamba as bt_mamba
    bt_mamba.set_keep_chunk_states(a.keep_states == "on")
    shapes = ["tiny"] if a.tiny else a.shapes.split(",")
    overrides = {k: getattr(a, k) for k in ("d_model", "d_state", "headdim", "ngroups", "chunk_size", "expand")
                 if getattr(a, k) is not None}
    rows = []
    for shape in shapes:
        rows += bench(shape, a.device, getattr(torch, a.dtype), a.batch, a.seqlen,
                      [w for w in a.providers.split(",") if w], a.warmup, a.iters,
                      not a.no_profile, a.rtol, overrides)
        if a.device != "cpu":
            torch.cuda.empty_cache()
    print(format_table(rows))
    if a.csv:
        write_csv(rows, a.csv)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
