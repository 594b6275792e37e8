"""RoPE at the benchmark shape: q [8, 32, 4096, 128] (B, H, S, D), one tensor, no positions.

Cases: interleaved and half-split on a contiguous [B, H, S, D] tensor (bf16; interleaved
also f32), and the strided case: a contiguous [B, S, H, D] tensor passed as
.transpose(1, 2) (no copy; the output keeps that layout).

Providers:
  baracuda  bt.rope (CUDA: a cos/sin table kernel, then a streaming kernel that reads x once)
  torch     reference.rope, eager (cos/sin from float64 angles, rotation in the dtype)
  torch_hf  (half-split) Hugging Face's apply_rotary_pos_emb, eager, with cos/sin [S, D]
            precomputed outside the timed region as a model caches them
  compile   torch.compile of the reference's rotation (reference.apply_rope; for half-split
            of the HF form) with cos/sin tables precomputed outside the timed region: the
            strongest compiled baseline (no trig inside the timed kernel)
Bytes: forward and backward 2·numel·elt (read one tensor, write one), full 4·numel·elt.

CPU (``run_cpu``, ``run_all.py --device cpu``): baracuda against eager PyTorch on the same
tensors, timed alternately, at x [4, 16, 1024, 128]: bt.rope against reference.rope
(half-split and interleaved, forward and backward), and the Hugging Face form with q and
k [4, 4, 1024, 128] and model-dtype cos/sin [1, S, D] precomputed outside the timed
region: bt.apply_rotary_pos_emb against reference.rope_hf on q and on k.
"""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import (Row, backward_fn, format_cpu_table, format_table, full_fn, measure,
                     measure_interleaved)

FAMILY = "rope"


def _tables(S: int, R: int, dtype: torch.dtype, half_split_hf: bool, device: str = "cuda"):
    theta = ref.rope_angles(S, None, R, 10000.0, device)
    if half_split_hf:
        theta = torch.cat((theta, theta), dim=-1)  # HF's emb = cat(freqs, freqs)
    return theta.cos().to(dtype), theta.sin().to(dtype)


def _case_rows(case: str, x: torch.Tensor, dy: torch.Tensor, interleaved: bool,
               providers: tuple) -> list[Row]:
    S, D = x.shape[2], x.shape[3]
    dtype = x.dtype
    nbytes = 2 * x.numel() * x.element_size()
    fns = {}
    if "baracuda" in providers:
        fns["baracuda"] = lambda: bt.rope(x, None, 10000.0, interleaved)
    if "torch" in providers:
        fns["torch"] = lambda: ref.rope(x, None, 10000.0, interleaved)
    if "torch_hf" in providers and not interleaved:
        cos_hf, sin_hf = _tables(S, D, dtype, True)
        fns["torch_hf"] = lambda: ref.rope_hf(x, cos_hf, sin_hf)
    if "compile" in providers:
        if interleaved:
            cos, sin = _tables(S, D, dtype, False)
            compiled = torch.compile(lambda t, c, s: ref.apply_rope(t, c, s, True))
        else:
            cos, sin = _tables(S, D, dtype, True)
            compiled = torch.compile(ref.rope_hf)
        fns["compile"] = lambda: compiled(x, cos, sin)
    rows = []
    for provider, f in fns.items():
        f()  # compile / warm up outside the timed region
        with torch.no_grad():
            rows.append(measure(FAMILY, case, dtype, provider, "forward", f, nbytes=nbytes))
        rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(f, [x], dy), nbytes=nbytes))
        rows.append(measure(FAMILY, case, dtype, provider, "full", full_fn(f, [x], dy), nbytes=2 * nbytes))
    return rows


def run(shape=(8, 32, 4096, 128), providers=("baracuda", "torch", "torch_hf", "compile")) -> list[Row]:
    B, H, S, D = shape
    rows: list[Row] = []
    dims = f"[{B}, {H}, {S}, {D}]"
    for dtype, cases in ((torch.bfloat16, ("interleaved", "half_split", "strided")),
                         (torch.float32, ("interleaved",))):
        x = torch.randn(shape, device="cuda", dtype=dtype).requires_grad_()
        dy = torch.randn(shape, device="cuda", dtype=dtype)
        for case in cases:
            if case == "strided":
                xs = torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
                dys = torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2)
                rows += _case_rows(f"interleaved {dims} as [B,S,H,D].transpose(1,2)", xs, dys, True,
                                   tuple(p for p in providers if p != "torch_hf"))
                del xs, dys
            else:
                p = providers if dtype == torch.bfloat16 else tuple(q for q in providers if q in ("baracuda", "compile"))
                rows += _case_rows(f"{case} {dims}", x, dy, case == "interleaved", p)
            torch.cuda.empty_cache()
        del x, dy
        torch.cuda.empty_cache()
    return rows


def run_cpu(shape=(4, 16, 1024, 128), kv_heads=4, dtypes=(torch.float32, torch.bfloat16),
            repeats=15) -> list[Row]:
    """CPU: baracuda against eager PyTorch (reference.py), timed alternately on the same
    tensors, forward and backward (see the module docstring)."""
    B, H, S, D = shape
    rows: list[Row] = []
    for dtype in dtypes:
        nbytes = 2 * B * H * S * D * (torch.finfo(dtype).bits // 8)
        x = torch.randn(shape, dtype=dtype).requires_grad_()
        dy = torch.randn(shape, dtype=dtype)
        for interleaved in (False, True):
            name = f"{'interleaved' if interleaved else 'half_split'} [{B}, {H}, {S}, {D}]"
            fwd = {"baracuda": lambda il=interleaved: bt.rope(x, None, 10000.0, il),
                   "torch": lambda il=interleaved: ref.rope(x, None, 10000.0, il)}
            with torch.no_grad():
                rows += measure_interleaved(FAMILY, name, dtype, "forward", fwd, nbytes=nbytes,
                                            repeats=repeats)
            bwd = {p: backward_fn(f, [x], dy) for p, f in fwd.items()}
            rows += measure_interleaved(FAMILY, name, dtype, "backward", bwd, nbytes=nbytes,
                                        repeats=repeats)
        # Hugging Face's apply_rotary_pos_emb: q and k (GQA), the model's cos/sin [1, S, D]
        q = x
        k = torch.randn(B, kv_heads, S, D, dtype=dtype).requires_grad_()
        dk = torch.randn(B, kv_heads, S, D, dtype=dtype)
        cos, sin = (t[None] for t in _tables(S, D, dtype, True, "cpu"))
        c4, s4 = cos[:, None], sin[:, None]
        name = f"hf apply_rotary_pos_emb q [{B}, {H}, {S}, {D}] k [{B}, {kv_heads}, {S}, {D}]"
        fwd = {"baracuda": lambda: bt.apply_rotary_pos_emb(q, k, cos, sin),
               "torch": lambda: (ref.rope_hf(q, c4, s4), ref.rope_hf(k, c4, s4))}
        qk_bytes = nbytes * (H + kv_heads) // H
        with torch.no_grad():
            rows += measure_interleaved(FAMILY, name, dtype, "forward", fwd, nbytes=qk_bytes,
                                        repeats=repeats)
        bwd = {}
        for p, f in fwd.items():
            outs = f()
            bwd[p] = lambda outs=outs: torch.autograd.grad(outs, [q, k], (dy, dk), retain_graph=True)
        rows += measure_interleaved(FAMILY, name, dtype, "backward", bwd, nbytes=qk_bytes,
                                    repeats=repeats)
        del x, dy, k, dk
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--providers", default="baracuda,torch,torch_hf,compile")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: run_cpu (baracuda against eager PyTorch; --providers ignored)")
    p.add_argument("--repeats", type=int, default=15, help="CPU: alternating rounds per case")
    args = p.parse_args()
    if args.device == "cpu":
        print(format_cpu_table(run_cpu(repeats=args.repeats)))
    else:
        print(format_table(run(providers=tuple(args.providers.split(",")))))
