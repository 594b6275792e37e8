"""Lerp at the benchmark size: 2^28 elements, scalar weight 0.3, bf16 and f32; plus one
tensor-weight row (bf16, weight of the same shape); forward, backward, full.
Bytes (each input read once, each output written once), n elements of elt bytes:
  scalar weight: forward 3·n·elt (a, b read; y written), backward 3·n·elt (dy read;
                 da, db written), full 6·n·elt;
  tensor weight: forward 4·n·elt, backward 7·n·elt (dy, a, b, w read; da, db, dw
                 written), full 11·n·elt."""
from __future__ import annotations

import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, full_fn, measure, measure_interleaved

FAMILY = "lerp"
WEIGHT = 0.3


def _rows(case, dtype, providers, fwd, inputs, dy, nbytes):
    rows = []
    for provider in providers:
        f = fwd[provider]
        with torch.no_grad():
            rows.append(measure(FAMILY, case, dtype, provider, "forward", f, nbytes=nbytes[0]))
        rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(f, inputs, dy),
                            nbytes=nbytes[1]))
        rows.append(measure(FAMILY, case, dtype, provider, "full", full_fn(f, inputs, dy),
                            nbytes=nbytes[2]))
    return rows


def run(n=2**28, dtypes=(torch.bfloat16, torch.float32), tensor_weight_dtypes=(torch.bfloat16,),
        providers=("baracuda", "torch", "compile")) -> list[Row]:
    rows: list[Row] = []
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        a = torch.randn(n, device="cuda", dtype=dtype).requires_grad_()
        b = torch.randn(n, device="cuda", dtype=dtype).requires_grad_()
        dy = torch.randn(n, device="cuda", dtype=dtype)
        fwd = {
            "baracuda": lambda: bt.lerp(a, b, WEIGHT),
            "torch": lambda: ref.lerp(a, b, WEIGHT),
        }
        if "compile" in providers:
            torch._dynamo.reset()  # a fresh cache: no recompile limit across cases
            compiled = torch.compile(lambda x, y: ref.lerp(x, y, WEIGHT))
            fwd["compile"] = lambda: compiled(a, b)
        case = f"scalar w={WEIGHT} [2^{n.bit_length() - 1}]"
        rows += _rows(case, dtype, providers, fwd, [a, b], dy, (3 * n * elt, 3 * n * elt, 6 * n * elt))
        torch.cuda.empty_cache()

        if dtype in tensor_weight_dtypes:
            w = (torch.rand(n, device="cuda", dtype=dtype) * 1.5 - 0.25).requires_grad_()
            fwd = {
                "baracuda": lambda: bt.lerp(a, b, w),
                "torch": lambda: ref.lerp(a, b, w),
            }
            if "compile" in providers:
                torch._dynamo.reset()
                compiled_t = torch.compile(lambda x, y, z: ref.lerp(x, y, z))
                fwd["compile"] = lambda: compiled_t(a, b, w)
            case = f"tensor w [2^{n.bit_length() - 1}]"
            rows += _rows(case, dtype, providers, fwd, [a, b, w], dy,
                          (4 * n * elt, 7 * n * elt, 11 * n * elt))
            del w
        del a, b, dy
        torch.cuda.empty_cache()
    return rows


def run_cpu(n=2**24, dtypes=(torch.float32, torch.bfloat16), repeats=15) -> list[Row]:
    """CPU: baracuda against eager torch.lerp, timed alternately on the same tensors,
    forward and backward, scalar weight and a tensor weight of the same shape."""
    rows: list[Row] = []
    for dtype in dtypes:
        elt = torch.finfo(dtype).bits // 8
        a = torch.randn(n, dtype=dtype).requires_grad_()
        b = torch.randn(n, dtype=dtype).requires_grad_()
        w = (torch.rand(n, dtype=dtype) * 1.5 - 0.25).requires_grad_()
        dy = torch.randn(n, dtype=dtype)
        cases = (
            (f"scalar w={WEIGHT} [2^{n.bit_length() - 1}]", [a, b], (3, 3),
             {"baracuda": lambda: bt.lerp(a, b, WEIGHT), "torch": lambda: ref.lerp(a, b, WEIGHT)}),
            (f"tensor w [2^{n.bit_length() - 1}]", [a, b, w], (4, 7),
             {"baracuda": lambda: bt.lerp(a, b, w), "torch": lambda: ref.lerp(a, b, w)}),
        )
        for case, inputs, (fb, bb), fwd in cases:
            with torch.no_grad():
                rows += measure_interleaved(FAMILY, case, dtype, "forward", fwd,
                                            nbytes=fb * n * elt, repeats=repeats)
            bwd = {p: backward_fn(f, inputs, dy) for p, f in fwd.items()}
            rows += measure_interleaved(FAMILY, case, dtype, "backward", bwd,
                                        nbytes=bb * n * elt, repeats=repeats)
        del a, b, w, dy
    return rows


if __name__ == "__main__":
    print(format_table(run()))
