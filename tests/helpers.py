"""Shared test helpers: devices, dtypes, and the reference-comparison rule."""
from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def compute_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of the precision the kernels compute in (float32 for half types)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def assert_close_to_reference(actual: torch.Tensor, expected64: torch.Tensor,
                              baseline: torch.Tensor | None, what: str, floor_ulps: float = 32,
                              rounded64: torch.Tensor | None = None) -> None:
    """FlashAttention's rule for low precision: the kernel's error against a float64
    reference is at most twice the error of PyTorch computing the same thing in the same
    dtype (``baseline``), plus a floor of a few units of the compute precision at the
    largest magnitude. NaNs must sit exactly where the reference has them.
    ``rounded64``: the float64 reference on the inputs rounded to the kernel's dtype (what
    the kernel sees). Where given, a kernel within half a unit of its dtype (plus the
    floor) of it also passes: that is as near as a kernel can be, and over a few elements
    PyTorch's error, which decides the first rule, can be near 0 by chance (its own
    roundings landing by the unrounded inputs' truth: a one-element fp16 GeGLU failed
    that rule about one draw in ten). Half a unit is that of the largest value, or of the
    dtype's subnormals where every value is one (a correctly rounded fp16 GeGLU of 6.6e-6
    is up to 3e-8 off)."""
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
    floor = floor_ulps * compute_eps(actual.dtype) * max(scale, 1e-30)
    tol = 2 * base + floor
    if err > tol and rounded64 is not None:
        r = rounded64.detach().double().cpu()
        mask_r = mask & ~(r.isnan() | r.isinf())
        if torch.equal(mask_r, mask):
            err_r = (a - r)[mask].abs().max().item()
            fi = torch.finfo(actual.dtype)  # (below fi.tiny the dtype's unit is fi.tiny·eps)
            tol_r = 0.5 * fi.eps * max(r[mask].abs().max().item(), fi.tiny) + floor
            if err_r <= tol_r:
                return
    assert err <= tol, (f"{what}: max abs error {err:.3g} exceeds tolerance {tol:.3g} "
                        f"(PyTorch in {actual.dtype}: {base:.3g}; scale {scale:.3g})")


def poison_fresh_outputs() -> None:
    """Deterministic mode, in which PyTorch fills every fresh allocation with NaN: an output
    element that a kernel skips stays NaN and shows (conftest.py restores the mode)."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory


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


def capture_graph(step, before_capture=None):
    """``step()`` (CUDA work returning tensors) run once on a side stream (warm-up), then
    captured in a CUDA graph (after ``before_capture()``, e.g. to restore in-place state);
    returns the graph and the captured outputs."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def cuda_kernel_names(fn) -> list[str]:
    """The names of the CUDA kernels (and copies) a call of fn runs, by torch.profiler, after
    a first call (its first-call work stays out of the profile)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_time_total > 0]


def check_graph_replay(step, refresh) -> None:
    """``step()`` captured in a CUDA graph (capture_graph), then replayed twice after
    ``refresh()`` writes new inputs in place: each replay gives eager's outputs bit for
    bit."""
    graph, captured = capture_graph(step)
    for _ in range(2):
        refresh()
        graph.replay()
        torch.cuda.synchronize()
        for a, e in zip(captured, step()):
            assert torch.equal(a, e)


def layouts_2d(device, dtype, rows: int, cols: int, scale: float) -> dict[str, torch.Tensor]:
    """Tensors of logical shape [rows, cols] in the memory layouts the plans tell apart:
    contiguous, transposed, row slices at an aligned and an unaligned offset, every other
    row, inner stride 2, and rows or columns broadcast with stride 0."""
    def r(shape):
        return randn(shape, dtype, device, scale)
    return {
        "contiguous": r((rows, cols)),
        "transposed": r((cols, rows)).t(),
        "row_slice_aligned": r((rows, cols + 16))[:, :cols],
        "row_slice_offset": r((rows, cols + 6))[:, 3:cols + 3],
        "every_other_row": r((2 * rows, cols))[::2],
        "inner_stride_2": r((rows, 2 * cols))[:, ::2],
        "broadcast_rows": r((1, cols)).expand(rows, cols),
        "broadcast_cols": r((rows, 1)).expand(rows, cols),
    }


class CountOps(TorchDispatchMode):
    """Counts the ``torch.ops.baracuda`` calls that reach the kernels while active
    (``counts["selective_state_update"]``), to prove which ops a model runs."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("baracuda::"):
            self.counts[name.split("::", 1)[1].split(".")[0]] += 1
        return func(*args, **(kwargs or {}))
