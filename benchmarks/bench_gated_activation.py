"""Gated activation at the benchmark shape: x [16384, 22016] (F = 11008), split on the
last dim; swiglu, geglu (exact) and geglu_tanh; bf16 and f32; forward, backward, full.
Bytes: forward 3·T·F·elt, backward 5·T·F·elt (dy, x read; dx written), full 8·T·F·elt."""
from __future__ import annotations

import argparse

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, full_fn, measure, measure_interleaved

FAMILY = "gated_activation"


def run(kinds=("swiglu", "geglu", "geglu_tanh"), dtypes=(torch.bfloat16, torch.float32),
        shape=(16384, 22016), providers=("baracuda", "torch", "compile")) -> list[Row]:
    rows: list[Row] = []
    T, F2 = shape
    F = F2 // 2
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(shape, device="cuda", dtype=dtype).requires_grad_()
        dy = torch.randn(T, F, device="cuda", dtype=dtype)
        for kind in kinds:
            case = f"{kind} [{T}, {F2}]"
            fwd = {
                "baracuda": lambda k=kind: bt.gated_activation(x, k),
                "torch": lambda k=kind: ref.gated_activation(x, k),
            }
            if "compile" in providers:
                torch._dynamo.reset()  # a fresh cache: no recompile limit across cases
                compiled = torch.compile(lambda t, k=kind: ref.gated_activation(t, k))
                fwd["compile"] = lambda c=compiled: c(x)
            for provider in providers:
                f = fwd[provider]
                with torch.no_grad():
                    rows.append(measure(FAMILY, case, dtype, provider, "forward", f, nbytes=3 * T * F * elt))
                rows.append(measure(FAMILY, case, dtype, provider, "backward",
                                    backward_fn(f, [x], dy), nbytes=5 * T * F * elt))
                rows.append(measure(FAMILY, case, dtype, provider, "full",
                                    full_fn(f, [x], dy), nbytes=8 * T * F * elt))
            torch.cuda.empty_cache()
        del x, dy
        torch.cuda.empty_cache()
    return rows


def run_cpu(kinds=("swiglu", "geglu", "geglu_tanh"), dtypes=(torch.float32, torch.bfloat16),
            shape=(4096, 8192), repeats=15) -> list[Row]:
    """CPU: baracuda against eager PyTorch (reference.py), timed alternately on the same
    tensors, forward and backward: the single-tensor op on x of `shape` (split on the
    last dim, gate_first as in LLaMA) and the pair op on gate, up of half that width."""
    rows: list[Row] = []
    T, F2 = shape
    F = F2 // 2
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        x = torch.randn(shape, dtype=dtype).requires_grad_()
        gate = torch.randn(T, F, dtype=dtype).requires_grad_()
        up = torch.randn(T, F, dtype=dtype).requires_grad_()
        dy = torch.randn(T, F, dtype=dtype)
        for kind in kinds:
            single = {"baracuda": lambda k=kind: bt.gated_activation(x, k, -1, True),
                      "torch": lambda k=kind: ref.gated_activation(x, k, -1, True)}
            pair = {"baracuda": lambda k=kind: bt.gated_activation_pair(gate, up, k),
                    "torch": lambda k=kind: ref.gated_activation_pair(gate, up, k)}
            for name, fwd, inputs in ((f"{kind} x [{T}, {F2}]", single, [x]),
                                      (f"{kind} pair [{T}, {F}]", pair, [gate, up])):
                with torch.no_grad():
                    rows += measure_interleaved(FAMILY, name, dtype, "forward", fwd,
                                                nbytes=3 * T * F * elt, repeats=repeats)
                bwd = {p: backward_fn(f, inputs, dy) for p, f in fwd.items()}
                rows += measure_interleaved(FAMILY, name, dtype, "backward", bwd,
                                            nbytes=5 * T * F * elt, repeats=repeats)
        del x, gate, up, dy
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--kinds", default="swiglu,geglu,geglu_tanh")
    args = p.parse_args()
    print(format_table(run(kinds=tuple(args.kinds.split(",")))))
