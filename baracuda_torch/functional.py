"""Typed, documented wrappers over ``torch.ops.baracuda.*``.

Every function here is differentiable (its backward runs the matching ``*_backward``
op), works on CPU and CUDA tensors of float32, float16, bfloat16 and float64 (half types
compute in float32), accepts any strides, and traces under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__: list = []

# ---- gated activations ----------------------------------------------------------

__all__ += ["gated_activation", "glu", "reglu", "swiglu", "geglu"]

GatedKind = Literal["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]


def gated_activation(x: Tensor, kind: GatedKind, dim: int = -1, gate_first: bool = False) -> Tensor:
    """Gated activation ``a * gate(b)`` where ``x`` splits along ``dim`` into halves ``(a, b)``.

    Args:
        x: input; ``x.size(dim)`` must be even.
        kind: ``"glu"`` (σ(b)), ``"reglu"`` (max(b, 0)), ``"swiglu"`` (b·σ(b)),
            ``"geglu"`` (exact GELU, b·Φ(b)) or ``"geglu_tanh"`` (tanh-approximated GELU).
        dim: the dimension to split (negative counts from the end).
        gate_first: if True the *first* half is the gate: ``gate(x1) * x2``, the
            ``silu(gate) * up`` convention of LLaMA-style fused gate/up projections.
            The default (False) is ``torch.nn.functional.glu``'s convention.

    Returns:
        A new contiguous tensor of ``x``'s shape with ``size(dim)`` halved.

    Raises:
        ValueError: odd ``x.size(dim)``, unknown ``kind``, 0-dim ``x``.
        IndexError: ``dim`` out of range.
        TypeError: non-floating ``x``.
    """
    return torch.ops.baracuda.gated_activation(x, kind, dim, gate_first)


def glu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """GLU: ``a * sigmoid(b)``, same as ``torch.nn.functional.glu(x, dim)``."""
    return gated_activation(x, "glu", dim, gate_first)


def reglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """ReGLU: ``a * relu(b)`` (NaN in ``b`` propagates, as in ``torch.relu``)."""
    return gated_activation(x, "reglu", dim, gate_first)


def swiglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """SwiGLU: ``a * silu(b)``; with ``gate_first=True``, ``silu(gate) * up`` for ``x = [gate, up]``."""
    return gated_activation(x, "swiglu", dim, gate_first)


def geglu(x: Tensor, dim: int = -1, approximate: Literal["none", "tanh"] = "none",
          gate_first: bool = False) -> Tensor:
    """GeGLU: ``a * gelu(b)``; ``approximate`` as in ``torch.nn.functional.gelu``.

    Raises:
        ValueError: ``approximate`` other than ``"none"`` or ``"tanh"``.
    """
    if approximate == "none":
        return gated_activation(x, "geglu", dim, gate_first)
    if approximate == "tanh":
        return gated_activation(x, "geglu_tanh", dim, gate_first)
    raise ValueError(f"baracuda_torch.geglu: approximate must be 'none' or 'tanh', got {approximate!r}")


# ---- rope -------------------------------------------------------------------------


# ---- lerp -------------------------------------------------------------------------


# ---- gather -----------------------------------------------------------------------

__all__ += ["gather", "check_errors", "set_index_checks"]

from . import _C as _gather_C  # noqa: E402  (check_errors / set_index_checks live in _C)


def gather(src: Tensor, dim: int, index: Tensor) -> Tensor:
    """``torch.gather``: ``out[i][j][k] = src[index[i][j][k]][j][k]`` for ``dim=0`` (and so on).

    Args:
        src: float32, float16, bfloat16 or float64; any strides.
        dim: the dimension to index along (negative counts from the end).
        index: int32 or int64, with as many dims as ``src``; ``index.size(d) <= src.size(d)``
            for every ``d != dim``; any strides (expanded indices too). A 0-dim tensor
            counts as 1-d of size 1, as in ``torch.gather``.

    Returns:
        A new contiguous tensor of ``index``'s shape and ``src``'s dtype. Its backward
        scatter-adds the gradient into zeros of ``src``'s shape (``gather_backward``); on
        CUDA, under the ``"deterministic"`` preference or
        ``torch.use_deterministic_algorithms(True)`` it runs a sort-based kernel that gives
        the same bits on every run, otherwise a faster atomic one (see :func:`explain`).
        No gradient flows to ``index``. Double backward works.

    Raises:
        IndexError: ``dim`` out of range; an index outside ``[0, src.size(dim))``
            (negative ones too). No memory is ever read or written with a bad index.
            On the CPU it is raised by this call. On CUDA the kernel writes 0 for that
            output element (the backward skips it), records the first bad index on the
            device, and the ``IndexError`` surfaces, with the same message, at the start
            of the next ``gather``/``gather_backward`` call on that device once the bad
            kernel has finished, or from :func:`check_errors`, which synchronizes first.
            After :func:`set_index_checks` ``("sync")`` this call raises it itself. The
            CUDA context stays usable either way.
        ValueError: ``index`` with another number of dims than ``src``, or larger than
            ``src`` in a dim other than ``dim``.
        TypeError: a non-integer (or other integer) ``index``, or a non-floating ``src``.
    """
    return torch.ops.baracuda.gather(src, dim, index)


def check_errors(device: "torch.device | str | int | None" = None) -> None:
    """Raise the out-of-range index a CUDA gather kernel recorded, if any.

    Synchronizes ``device`` (default: the current CUDA device), then raises
    ``IndexError("baracuda::gather: index 12 is out of bounds for dim 1 with size 8 ...")``
    (or ``baracuda::gather_backward: ...``) for the first bad index met since the last
    report, and clears it. Returns quietly when nothing was recorded, when CUDA is not
    initialized, or in a build without CUDA. CPU ops raise at once and never record.
    """
    d = None
    if device is not None:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"baracuda_torch.check_errors: device must be a CUDA device, got {d}")
    if not (_gather_C.with_cuda and torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    index = d.index if d is not None and d.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    _gather_C.gather_check_errors(index)


def set_index_checks(mode: Literal["async", "sync"]) -> None:
    """When an out-of-range index in a CUDA ``gather``/``gather_backward`` raises.

    ``"async"`` (the default): without any synchronization, at the start of the next
    gather op on that device once the bad kernel has finished, or from
    :func:`check_errors`. ``"sync"``: each CUDA gather op synchronizes its stream after
    the launch and raises ``IndexError`` itself (skipped while the stream is captured into
    a CUDA graph, where the error surfaces as in ``"async"`` mode). Raises ``ValueError``
    for any other mode.
    """
    _gather_C.set_index_checks(mode)


# ---- ssd_chunk_scan ---------------------------------------------------------------
