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
"""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, full_fn, measure

FAMILY = "rope"


def _tables(S: int, R: int, dtype: torch.dtype, half_split_hf: bool):
    theta = ref.rope_angles(S, None, R, 10000.0, "cuda")
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


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--providers", default="baracuda,torch,torch_hf,compile")
    args = p.parse_args()
    print(format_table(run(providers=tuple(args.providers.split(",")))))
