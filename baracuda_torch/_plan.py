"""Plan preference and introspection: which kernel a call would run, and its guarantees."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Literal, Union

import torch

from . import _C

PlanInfo = _C.PlanInfo
Preference = Literal["fastest", "deterministic", "precise"]


def get_preference() -> str:
    """The library-wide plan preference set by :func:`set_preference` (default ``"fastest"``).

    Ops also run deterministic kernels whenever
    ``torch.use_deterministic_algorithms(True)`` is on, whatever this says.
    """
    return _C.get_preference()


def set_preference(preference: Preference) -> None:
    """Set the library-wide plan preference.

    ``"fastest"`` lets a plan pick a kernel whose floating-point reductions may run in a
    different order from one call to the next (for example gather's atomic backward);
    ``"deterministic"`` makes every plan pick a kernel that gives the same bits on every
    run; ``"precise"`` is ``"deterministic"`` that also picks a kernel evaluating in
    float64 where the op has one (today the CPU SSD scan: the float64 step-by-step
    recurrence instead of the float32 chunked algorithm). Raises ``ValueError`` for
    anything else.
    """
    _C.set_preference(preference)


@contextlib.contextmanager
def preference(value: Preference) -> Iterator[None]:
    """Context manager that sets the plan preference and restores the previous one."""
    old = get_preference()
    set_preference(value)
    try:
        yield
    finally:
        set_preference(old)


def _op_name(op: Any) -> str:
    if isinstance(op, str):
        name = op
    elif isinstance(op, torch._ops.OpOverloadPacket):
        name = op._qualified_op_name
    elif isinstance(op, torch._ops.OpOverload):
        name = op._schema.name + ("." + op._overloadname if op._overloadname != "default" else "")
    else:
        raise TypeError(
            f"baracuda_torch.explain: op must be an op name or a torch.ops.baracuda op, got {op!r}")
    return name.split("::", 1)[-1]


#: Ops whose explain is declared with their schema (csrc/torch/op_def.h).
_DECLARED = frozenset(e["name"] for e in _C._op_table() if e["explain"])


def _explainer(name: str):
    if name in _DECLARED:
        return lambda *args, preference=None, **kwargs: _C._explain(name, preference, *args, **kwargs)
    # An op that binds its explain function in module.cpp by hand: _C.explain_<op>.
    fn = getattr(_C, "explain_" + name.replace(".", "_").lower(), None)
    if fn is None:
        known = sorted(_DECLARED | {n[len("explain_"):] for n in dir(_C) if n.startswith("explain_")})
        raise ValueError(f"baracuda_torch.explain: unknown op {name!r}; known ops: {known}")
    return fn


def explain(op: Union[str, Any], *args: Any, preference: Preference | None = None,
            **kwargs: Any) -> PlanInfo:
    """Select, without running it, the plan that ``torch.ops.baracuda.<op>(*args, **kwargs)``
    would run, and describe it.

    ``op`` is an op name (``"gated_activation"``, ``"lerp.Tensor"``) or a
    ``torch.ops.baracuda`` op; ``args``/``kwargs`` are the op's own arguments (tensors
    may live on any device; nothing is read from them). ``preference`` overrides the
    current preference for this question only.

    Returns a :class:`PlanInfo` with the SKU (``name``, ``family``, ``op``, ``dtype``,
    ``index_dtype``, ``variant``, ``backend``, ``arch``) and the precision guarantee
    (``math_precision``, ``accumulator``, ``deterministic``, ``bit_stable``), plus
    ``workspace_bytes``. Raises the same errors the op would for invalid arguments.

    Example::

        >>> x = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda")
        >>> baracuda_torch.explain("gated_activation", x, "swiglu").variant
        'rows_vec16'
    """
    return _explainer(_op_name(op))(*args, preference=preference, **kwargs)
