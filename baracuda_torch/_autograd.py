"""Autograd, forward-mode AD and vmap rules of the ``torch.ops.baracuda`` ops.

Every op's derivative is a Python :class:`torch.autograd.Function` (forward without
``ctx`` plus ``setup_context``, the form ``torch.func`` accepts) registered as the op's
``Autograd`` kernel, with a batching rule registered by ``torch.library.register_vmap``.
That makes ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``jacfwd`` / ``jvp`` / ``vmap``
work on the ops (a C++ ``torch::autograd::Function`` cannot run under them), while the
computation stays in the C++ forward and backward ops: the rules below only call
``torch.ops.baracuda.*`` and reshape. ``torch.compile`` traces through the same
kernel (as for ``torch.library.register_autograd``), and nothing here synchronizes.

Hooking a new op (after its schema, CPU/CUDA and Meta kernels exist in C++, with no
C++ ``Autograd`` kernel)::

    def _foo_setup(ctx, inputs, output):         # inputs: every schema argument
        x, alpha = inputs
        ctx.save_for_backward(x)
        ctx.alpha = alpha

    def _foo_backward(ctx, dy):                   # one gradient per schema argument
        (x,) = ctx.saved_tensors
        return ops.foo_backward(dy, x, ctx.alpha), None

    def _foo_vmap(info, in_dims, x, alpha):       # batch dim in_dims[0] of x
        return ops.foo(x.movedim(in_dims[0], 0), alpha), 0

    register("foo", setup_context=_foo_setup, backward=_foo_backward, vmap=_foo_vmap)

``jvp=`` (forward-mode AD, ``ctx`` with tensors saved by ``ctx.save_for_forward``) is
optional: without it ``torch.func.jvp`` / ``jacfwd`` raise ``NotImplementedError``
naming the op; without ``vmap=`` so does ``torch.vmap``. A backward op whose own
derivative is not implemented is hooked with ``not_differentiable("foo_backward",
"baracuda::foo: double backward is not implemented", vmap=...)`` (it still gets a vmap rule, so that ``vmap(grad(f))``
works).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

ops = torch.ops.baracuda
_LIB = torch.library.Library("baracuda", "IMPL")  # noqa: TOR901 (kept alive for the process)

__all__ = ["register", "not_differentiable"]


def _full_args(schema, args: tuple) -> tuple:
    """The dispatcher drops trailing arguments equal to their defaults; put them back."""
    if len(args) == len(schema.arguments):
        return args
    return tuple(args) + tuple(a.default_value for a in schema.arguments[len(args):])


def _unsupported(qualname: str, what: str) -> Callable:
    def raiser(*args: Any, **kwargs: Any):
        raise NotImplementedError(f"{qualname}: {what} is not implemented")
    return raiser


def register(op: str, *, setup_context: Callable, backward: Callable,
             jvp: Optional[Callable] = None, vmap: Optional[Callable] = None) -> type:
    """Make ``torch.ops.baracuda.<op>`` differentiable under autograd and torch.func.

    Args:
        op: ``"name"`` or ``"name.overload"``.
        setup_context: ``(ctx, inputs, output)``, ``inputs`` holding every schema argument
            (defaults filled in); saves what ``backward``/``jvp`` need.
        backward: ``(ctx, *grad_outputs) -> one gradient (or None) per schema argument``;
            a grad output is None when that output's gradient is zero.
        jvp: ``(ctx, *tangents) -> tangent of each output``; a tangent is None when that
            input has none. None: forward-mode AD raises NotImplementedError.
        vmap: a ``torch.library.register_vmap`` rule ``(info, in_dims, *args) ->
            (output, out_dims)``. None: vmap raises NotImplementedError.

    Returns the generated ``torch.autograd.Function`` (for tests).
    """
    name, _, overload = op.partition(".")
    overload_packet = getattr(ops, name)
    opo = getattr(overload_packet, overload or "default")
    schema = opo._schema
    qualname = f"baracuda::{name}"
    jvp_fn = jvp or _unsupported(qualname, f"forward-mode AD (torch.func.jvp/jacfwd) of {op}")
    vmap_fn = vmap or _unsupported(qualname, f"vmap of {op}")

    def forward(*args):
        # Below autograd: this Function records the graph; the op's CPU/CUDA/Meta
        # (or functorch batching) kernel computes.
        with torch._C._AutoDispatchBelowAutograd():
            return opo(*args)

    def _setup(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        setup_context(ctx, inputs, output)

    def _backward(ctx, *grads):
        if all(g is None for g in grads):
            return (None,) * len(schema.arguments)
        return backward(ctx, *grads)

    def _vmap(info, in_dims, *args):
        return vmap_fn(info, in_dims, *args)

    fn_cls = type(f"{name}_{overload or 'default'}_Function", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(_setup),
        "backward": staticmethod(_backward),
        "jvp": staticmethod(jvp_fn),
        "vmap": staticmethod(_vmap),
    })

    def functorch_kernel(*args):
        # Only reached while a torch.func transform is active: the functorch front-mode
        # key is in the dispatch set exactly then. The Function goes through functorch's
        # custom_function_call, which applies the transform's rule (backward, jvp, vmap).
        return fn_cls.apply(*_full_args(schema, args))

    _LIB.impl(op, functorch_kernel, "FuncTorchDynamicLayerFrontMode")
    return fn_cls


def _has_tangent(args: Sequence[Any]) -> bool:
    """Forward-mode AD of torch.autograd.forward_ad (outside torch.func) is active and an
    input carries a tangent."""
    if torch.autograd.forward_ad._current_level < 0:
        return False
    return any(isinstance(a, Tensor) and torch.autograd.forward_ad.unpack_dual(a).tangent is not None
               for a in args)


def not_differentiable(op: str, message: str, vmap: Optional[Callable] = None) -> type:
    """Hook a backward op whose own derivative is not implemented: differentiating it
    (double backward, or forward-mode AD of a gradient) raises
    ``NotImplementedError(message)``; ``message`` names the forward op."""

    def raiser(*args: Any):
        raise NotImplementedError(message)

    return register(op, setup_context=lambda ctx, inputs, output: None, backward=raiser,
                    jvp=raiser, vmap=vmap)


# ---- batching helpers ------------------------------------------------------------------

def move_bdim(t: Optional[Tensor], bdim: Optional[int], size: int) -> Optional[Tensor]:
    """`t` with its batch dim first (expanded, without a copy, when it has none)."""
    if t is None:
        return None
    if bdim is None:
        return t.expand(size, *t.shape)
    return t.movedim(bdim, 0)


def logical_rank(t: Optional[Tensor], bdim: Optional[int]) -> int:
    return 0 if t is None else t.dim() - (bdim is not None)
