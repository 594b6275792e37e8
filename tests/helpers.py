"""Shared test helpers: devices, dtypes, and the reference-comparison rule."""
from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def compute_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of the precision the kernels compute in (float32 for half types)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def assert_close_to_reference(actual: torch.Tensor, expected64: torch.Tensor,
                              baseline: torch.Tensor | None, what: str, floor_ulps: float = 32) -> None:
    """FlashAttention's rule for low precision: the kernel's error against a float64
    reference is at most twice the error of PyTorch computing the same thing in the same
    dtype (``baseline``), plus a floor of a few units of the compute precision at the
    largest magnitude. NaNs must sit exactly where the reference has them."""
    assert actual.shape == expected64.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected64.shape)}"
    a = actual.detach().double().cpu()
    e = expected64.detach().double().cpu()
    nan_a, nan_e = a.isnan(), e.isnan()
    assert torch.equal(nan_a, nan_e), f"{what}: NaN at {int((nan_a ^ nan_e).sum())} places the reference disagrees on"
    inf_e = e.isinf()
    assert torch.equal(a[inf_e], e[inf_e]), f"{what}: infinities differ from the reference"
    mask = ~(nan_e | inf_e)
    if mask.sum() == 0:
        return
    err = (a - e)[mask].abs().max().item()
    base = 0.0
    if baseline is not None:
        b = baseline.detach().double().cpu()
        base = (b - e)[mask].abs().max().item()
    scale = e[mask].abs().max().item()
    tol = 2 * base + floor_ulps * compute_eps(actual.dtype) * max(scale, 1e-30)
    assert err <= tol, (f"{what}: max abs error {err:.3g} exceeds tolerance {tol:.3g} "
                        f"(PyTorch in {actual.dtype}: {base:.3g}; scale {scale:.3g})")


def randn(shape, dtype, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def check_compiled(fn, inputs, dynamic=False):
    """torch.compile(fn, fullgraph=True) gives eager's outputs and input gradients on
    each argument tuple of `inputs` (fresh leaf copies for each side)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for args in inputs:
        eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        comp_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out_e = fn(*eager_args)
        out_c = compiled(*comp_args)
        torch.testing.assert_close(out_c, out_e)
        out_e.sum().backward()
        out_c.sum().backward()
        for a, b in zip(comp_args, eager_args):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad)


def expect_bad_case(cases, name: str) -> None:
    """Runs the case called `name` of a bad-input table (rows of name, thunk, exception
    type, message regex) and checks that it raises that exception with that message."""
    _, fn, exc, msg = next(c for c in cases if c[0] == name)
    with pytest.raises(exc, match=msg):
        fn()
