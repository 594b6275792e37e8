"""Gather at the benchmark shapes: src [16384, 8192], int64 index, dim=1 with index
[16384, 2048] and dim=0 with index [4096, 8192]; float32 and bfloat16.

Providers: baracuda (fastest preference: atomic backward), baracuda_det (deterministic
preference: sorted backward; backward only, its forward is the same kernel), torch
(torch.gather eager; its autograd backward is a zero-fill plus scatter_add), compile
(torch.compile of torch.gather). Modes: forward, backward (the backward pass alone).
Bytes: forward = index read + out written + out.numel()·elt of src read; backward =
dout + index read + dsrc written (the zero fill included)."""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, measure, measure_interleaved

FAMILY = "gather"


def deterministic(fn):
    def run():
        with bt.preference("deterministic"):
            return fn()
    return run


def run(dtypes=(torch.float32, torch.bfloat16), src_shape=(16384, 8192),
        cases=((1, (16384, 2048)), (0, (4096, 8192))),
        providers=("baracuda", "baracuda_det", "torch", "compile")) -> list[Row]:
    rows: list[Row] = []
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        src = torch.randn(src_shape, device="cuda", dtype=dtype).requires_grad_()
        for dim, index_shape in cases:
            index = torch.randint(0, src_shape[dim], index_shape, device="cuda")
            dout = torch.randn(index_shape, device="cuda", dtype=dtype)
            n, m = index.numel(), src.numel()
            fwd_bytes = n * index.element_size() + 2 * n * elt
            bwd_bytes = n * elt + n * index.element_size() + m * elt
            case = f"dim={dim} src {list(src_shape)} index {list(index_shape)}"
            fwd = {
                "baracuda": lambda d=dim, i=index: bt.gather(src, d, i),
                "torch": lambda d=dim, i=index: ref.gather(src, d, i),
            }
            if "compile" in providers:
                compiled = torch.compile(lambda s, i, d=dim: ref.gather(s, d, i))
                fwd["compile"] = lambda c=compiled, i=index: c(src, i)
            # the kernel variants baracuda picks, in the rows' notes
            fwd_variant = bt.explain("gather", src, dim, index).variant
            bwd_variant = {p: bt.explain("gather_backward", dout, dim, index, list(src_shape),
                                         preference=p).variant for p in ("fastest", "deterministic")}
            for provider in providers:
                if provider == "baracuda_det":
                    rows.append(measure(FAMILY, case, dtype, provider, "backward",
                                        deterministic(backward_fn(fwd["baracuda"], [src], dout)),
                                        nbytes=bwd_bytes))
                    rows[-1].note = bwd_variant["deterministic"]
                    continue
                f = fwd[provider]
                with torch.no_grad():
                    rows.append(measure(FAMILY, case, dtype, provider, "forward", f, nbytes=fwd_bytes))
                if provider == "baracuda":
                    rows[-1].note = fwd_variant
                rows.append(measure(FAMILY, case, dtype, provider, "backward",
                                    backward_fn(f, [src], dout), nbytes=bwd_bytes))
                if provider == "baracuda":
                    rows[-1].note = bwd_variant["fastest"]
            del index, dout, fwd
            torch.cuda.empty_cache()
        del src
        torch.cuda.empty_cache()
    return rows


def run_cpu(dtypes=(torch.float32, torch.bfloat16), src_shape=(4096, 4096),
            cases=((0, (4096, 4096)), (1, (4096, 1024))), repeats=15) -> list[Row]:
    """CPU: baracuda against eager torch.gather (backward: zero fill + scatter_add),
    timed alternately on the same tensors, forward and backward."""
    rows: list[Row] = []
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        src = torch.randn(src_shape, dtype=dtype).requires_grad_()
        for dim, index_shape in cases:
            index = torch.randint(0, src_shape[dim], index_shape)
            dout = torch.randn(index_shape, dtype=dtype)
            n, m = index.numel(), src.numel()
            case = f"dim={dim} src {list(src_shape)} index {list(index_shape)}"
            fwd = {"baracuda": lambda d=dim, i=index: bt.gather(src, d, i),
                   "torch": lambda d=dim, i=index: ref.gather(src, d, i)}
            with torch.no_grad():
                rows += measure_interleaved(FAMILY, case, dtype, "forward", fwd,
                                            nbytes=n * index.element_size() + 2 * n * elt,
                                            repeats=repeats)
            bwd = {p: backward_fn(f, [src], dout) for p, f in fwd.items()}
            rows += measure_interleaved(FAMILY, case, dtype, "backward", bwd,
                                        nbytes=n * elt + n * index.element_size() + m * elt,
                                        repeats=repeats)
        del src
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    print(format_table(run(dtypes=tuple(getattr(torch, d) for d in args.dtypes.split(",")))))
