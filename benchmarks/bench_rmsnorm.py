"""RMSNorm at the LLaMA-7B layer shape x [2·4096, 4096] and at [8192, 8192] (bf16; f32
at the first), the llama convention against transformers' LlamaRMSNorm eager
(``torch``), torch.compile of it (``compile``) and Liger-Kernel's RMSNorm (``liger``,
casting_mode "llama", when peers/site has it); and the residual add + norm of a decoder
layer (``h = x + residual; y = norm(h)``) against the same modules after an eager add.

Bytes (R rows of H, e bytes an element; rstd is 4 bytes a row, 8 for float64):
  forward      2·R·H·e + H·e + 4·R             (x read, y written, w, rstd)
  + residual   4·R·H·e + H·e + 4·R             (x, residual read; y, h written)
  backward     3·R·H·e + 2·H·e + 4·R           (dy, x read, dx written; w, dw; rstd)
  + residual   4·R·H·e + 2·H·e + 4·R           (dh read too)
  full         the sum of both
The dw partials the backward writes and sums (one float32 row of H per resident block)
are not counted: they are the kernel's own overhead.
"""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
import peers
from harness import Row, backward_fn, format_table, full_fn, measure, measure_interleaved

FAMILY = "rmsnorm"
EPS = 1e-6


def llama_module(hidden: int, dtype: torch.dtype, device: str):
    """transformers' LlamaRMSNorm (reference.py's llama convention without it)."""
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return None
    m = LlamaRMSNorm(hidden, eps=EPS).to(device=device, dtype=dtype)
    m.weight.data.normal_(1.0, 0.1)
    return m


def liger_rms_norm():
    """``f(x, w) -> y``: Liger-Kernel's RMSNorm (llama casting, dY not overwritten)."""
    def liger():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    return peers._try(liger)


def nbytes(rows: int, hidden: int, elt: int, residual: bool) -> dict:
    fwd = (4 if residual else 2) * rows * hidden * elt + hidden * elt + 4 * rows
    bwd = (4 if residual else 3) * rows * hidden * elt + 2 * hidden * elt + 4 * rows
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}


def providers(x, residual, module, with_compile: bool) -> dict:
    """{provider: () -> output} on the same tensors: y, or (y, h) with a residual."""
    w = module.weight
    hidden = x.shape[-1]
    if residual is None:
        fns = {"baracuda": lambda: bt.rms_norm_like(module, x), "torch": lambda: module(x)}
    else:
        fns = {"baracuda": lambda: bt.rms_norm_like(module, x, residual=residual),
               "torch": lambda: (module(x + residual), x + residual)}
    if with_compile:
        torch._dynamo.reset()  # a fresh cache: no recompile limit across cases
        if residual is None:
            compiled = torch.compile(module)
            fns["compile"] = lambda: compiled(x)
        else:
            compiled = torch.compile(lambda a, r: (module(a + r), a + r))
            fns["compile"] = lambda: compiled(x, residual)
    liger = liger_rms_norm() if x.is_cuda else None
    if liger is not None:
        ours = fns["baracuda"]()
        theirs = liger(x, w) if residual is None else liger(x + residual, w)
        note = peers.agree(ours if residual is None else ours[0], theirs, f"rms_norm {hidden} liger", 2e-2)
        fns["liger"] = ((lambda: liger(x, w)) if residual is None
                        else (lambda: (liger(x + residual, w), x + residual)))
        fns["liger"].note = note
    return fns


def output_grads(x: torch.Tensor, residual: bool):
    """The gradients the backward is fed: dy, and dh with a residual."""
    dy = torch.randn_like(x, requires_grad=False)
    return (dy, torch.randn_like(dy)) if residual else dy


def run(cases=((8192, 4096, torch.bfloat16, False), (8192, 8192, torch.bfloat16, False),
               (8192, 4096, torch.float32, False), (8192, 4096, torch.bfloat16, True)),
        with_compile: bool = True) -> list[Row]:
    rows_out: list[Row] = []
    for rows, hidden, dtype, residual in cases:
        module = llama_module(hidden, dtype, "cuda")
        if module is None:
            print("bench_rmsnorm: transformers is not installed; skipped")
            return rows_out
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_()
        r = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_() if residual else None
        inputs = [x, module.weight] + ([r] if residual else [])
        case = f"{'add+' if residual else ''}llama [{rows}, {hidden}]"
        b = nbytes(rows, hidden, elt, residual)
        fns = providers(x, r, module, with_compile)
        grad = output_grads(x, residual)
        for provider, fn in fns.items():
            note = getattr(fn, "note", "")
            with torch.no_grad():
                rows_out.append(measure(FAMILY, case, dtype, provider, "forward", fn, nbytes=b["forward"],
                                        note=note))
            rows_out.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(fn, inputs, grad),
                                    nbytes=b["backward"], note=note))
            rows_out.append(measure(FAMILY, case, dtype, provider, "full", full_fn(fn, inputs, grad),
                                    nbytes=b["full"], with_memory=True, note=note))
        del x, r, fns, module
        torch.cuda.empty_cache()
    return rows_out


def run_cpu(cases=((2048, 4096, torch.float32, False), (2048, 4096, torch.bfloat16, False),
                   (2048, 4096, torch.bfloat16, True)), repeats: int = 15) -> list[Row]:
    """CPU: baracuda against eager LlamaRMSNorm (after an eager add with a residual),
    timed alternately on the same tensors, forward and backward."""
    out: list[Row] = []
    for rows, hidden, dtype, residual in cases:
        module = llama_module(hidden, dtype, "cpu")
        if module is None:
            return out
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(rows, hidden, dtype=dtype).requires_grad_()
        r = torch.randn(rows, hidden, dtype=dtype).requires_grad_() if residual else None
        inputs = [x, module.weight] + ([r] if residual else [])
        case = f"{'add+' if residual else ''}llama [{rows}, {hidden}]"
        b = nbytes(rows, hidden, elt, residual)
        fns = providers(x, r, module, with_compile=False)
        grad = output_grads(x, residual)
        with torch.no_grad():
            out += measure_interleaved(FAMILY, case, dtype, "forward", fns, nbytes=b["forward"], repeats=repeats)
        bwd = {p: backward_fn(f, inputs, grad) for p, f in fns.items()}
        out += measure_interleaved(FAMILY, case, dtype, "backward", bwd, nbytes=b["backward"], repeats=repeats)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    rows = run(with_compile=not args.no_compile) if args.device == "cuda" else run_cpu()
    print(format_table(rows))
