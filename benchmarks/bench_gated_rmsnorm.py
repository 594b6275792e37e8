"""The gated RMSNorm of a Mamba-2 layer at the 2.7B shape: y, z [4·4096, 5120] bf16
(d_inner 5120), one group (ngroups 1) and 8 groups of 640, norm_before_gate=False (the
Mamba2 module's default), a bf16 weight; ``baracuda`` (``gated_rms_norm``) against the
PyTorch chain it replaces, ``reference.gated_rms_norm`` (float32 math for 16-bit data, as
mamba_ssm's own PyTorch reference) eager (``torch``) and under torch.compile (``compile``), and mamba_ssm's Triton ``rmsnorm_fn`` (``mamba_ssm``,
when peers/site has it: ``scripts/peers.sh install``).

Bytes (R rows of N channels in G groups, e bytes an element; rstd 4 bytes a row group):
  forward    3·R·N·e + N·e + 4·R·G          (x, z read, y written; w; rstd written)
  backward   5·R·N·e + 2·N·e + 4·R·G        (dy, x, z read, dx, dz written; w, dw; rstd)
  full       the sum of both
The dw partials the backward writes and sums (one float32 row of N per block) are not
counted: they are the kernel's own overhead.
"""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
import peers
from baracuda_torch import reference
from harness import Row, backward_fn, format_table, full_fn, measure, measure_interleaved

FAMILY = "gated_rmsnorm"
EPS = 1e-5
NORM_BEFORE_GATE = False


def nbytes(rows: int, hidden: int, groups: int, elt: int) -> dict:
    fwd = 3 * rows * hidden * elt + hidden * elt + 4 * rows * groups
    bwd = 5 * rows * hidden * elt + 2 * hidden * elt + 4 * rows * groups
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}


def chain(x, z, w, eps: float, group_size: int, norm_before_gate: bool) -> torch.Tensor:
    """The PyTorch chain: reference.gated_rms_norm's output."""
    return reference.gated_rms_norm(x, w, None, z, eps, group_size, norm_before_gate)[0]


def providers(x, z, w, group_size: int, with_compile: bool) -> dict:
    """{provider: () -> y} on the same tensors."""
    fns = {"baracuda": lambda: bt.gated_rms_norm(x, w, z, EPS, group_size, NORM_BEFORE_GATE),
           "torch": lambda: chain(x, z, w, EPS, group_size, NORM_BEFORE_GATE)}
    if with_compile:
        torch._dynamo.reset()  # a fresh cache: no recompile limit across cases
        compiled = torch.compile(chain)
        fns["compile"] = lambda: compiled(x, z, w, EPS, group_size, NORM_BEFORE_GATE)
    theirs = peers.mamba_rmsnorm_fn() if x.is_cuda else None
    if theirs is not None:
        note = peers.agree(fns["baracuda"](), theirs(x, w, None, z, EPS, group_size, NORM_BEFORE_GATE),
                           f"gated_rms_norm group_size {group_size} mamba_ssm", 2e-2)
        fns["mamba_ssm"] = lambda: theirs(x, w, None, z, EPS, group_size, NORM_BEFORE_GATE)
        fns["mamba_ssm"].note = note
    return fns


def run(cases=((16384, 5120, 1, torch.bfloat16), (16384, 5120, 8, torch.bfloat16)),
        with_compile: bool = True) -> list[Row]:
    out: list[Row] = []
    for rows, hidden, groups, dtype in cases:
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_()
        z = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_()
        w = (1 + 0.1 * torch.randn(hidden, device="cuda", dtype=dtype)).requires_grad_()
        group_size = hidden // groups
        case = f"[{rows}, {hidden}] ngroups {groups}"
        b = nbytes(rows, hidden, groups, elt)
        dy = torch.randn_like(x)
        for provider, fn in providers(x, z, w, group_size, with_compile).items():
            note = getattr(fn, "note", "")
            with torch.no_grad():
                out.append(measure(FAMILY, case, dtype, provider, "forward", fn, nbytes=b["forward"],
                                   note=note))
            out.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(fn, [x, z, w], dy),
                               nbytes=b["backward"], note=note))
            out.append(measure(FAMILY, case, dtype, provider, "full", full_fn(fn, [x, z, w], dy),
                               nbytes=b["full"], with_memory=True, note=note))
        del x, z, w, dy
        torch.cuda.empty_cache()
    return out


def run_cpu(cases=((2048, 5120, 1, torch.float32), (2048, 5120, 8, torch.bfloat16)),
            repeats: int = 15) -> list[Row]:
    """CPU: baracuda against the eager PyTorch chain, timed alternately on the same
    tensors, forward and backward."""
    out: list[Row] = []
    for rows, hidden, groups, dtype in cases:
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(rows, hidden, dtype=dtype).requires_grad_()
        z = torch.randn(rows, hidden, dtype=dtype).requires_grad_()
        w = (1 + 0.1 * torch.randn(hidden, dtype=dtype)).requires_grad_()
        case = f"[{rows}, {hidden}] ngroups {groups}"
        b = nbytes(rows, hidden, groups, elt)
        fns = providers(x, z, w, hidden // groups, with_compile=False)
        dy = torch.randn_like(x)
        with torch.no_grad():
            out += measure_interleaved(FAMILY, case, dtype, "forward", fns, nbytes=b["forward"], repeats=repeats)
        bwd = {p: backward_fn(f, [x, z, w], dy) for p, f in fns.items()}
        out += measure_interleaved(FAMILY, case, dtype, "backward", bwd, nbytes=b["backward"], repeats=repeats)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    rows = run(with_compile=not args.no_compile) if args.device == "cuda" else run_cpu()
    print(format_table(rows))
