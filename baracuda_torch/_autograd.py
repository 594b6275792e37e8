"""torch.func support of the ``torch.ops.baracuda`` ops: autograd, forward-mode AD and
vmap rules in Python.

The ops' autograd kernels are C++ ``torch::autograd::Function``s (csrc/torch/*_ops.cpp),
which torch.func transforms refuse to run. So every op also gets a kernel for the
``FuncTorchDynamicLayerFrontMode`` dispatch key, which the dispatcher reaches only
while a torch.func transform (grad, vjp, jacrev, jacfwd, jvp, vmap, hessian, ...) is
active: it applies a Python :class:`torch.autograd.Function` (forward without ``ctx``
plus ``setup_context``, the form torch.func accepts) whose forward, backward, jvp and
vmap call the same C++ ops (forward below autograd) and only reshape. Outside
transforms nothing changes: eager autograd, ``torch.compile``, ``opcheck`` and CUDA
graphs run the C++ autograd kernels, without Python overhead. Nothing here
synchronizes.

Hooking a new op (its schema, CPU/CUDA/Meta kernels and C++ autograd kernel exist)::

    def _foo_setup(ctx, inputs, output):        # inputs: every schema argument
        x, alpha = inputs
        ctx.save_for_backward(x)
        ctx.alpha = alpha

    def _foo_backward(ctx, dy):                  # one gradient (or None) per argument
        (x,) = ctx.saved_tensors
        return ops.foo_backward(dy, x, ctx.alpha), None

    def _foo_vmap(info, in_dims, x, alpha):      # in_dims[0]: x's vmapped dim
        return ops.foo(x.movedim(in_dims[0], 0), alpha), 0

    register("foo", setup_context=_foo_setup, backward=_foo_backward, vmap=_foo_vmap)

and the same for ``foo_backward`` (``register`` again if it is differentiable, else
``not_differentiable("foo_backward", "baracuda::foo: double backward is not
implemented", vmap=...)``), then import the module from ``__init__.py``. ``jvp=``
(forward-mode AD; tensors it needs saved with ``ctx.save_for_forward``) is optional:
without it torch.func.jvp / jacfwd raise NotImplementedError naming the op. An op
left unhooked raises NotImplementedError naming it under every transform
(:func:`name_unhooked_ops`), and tests/test_func.py fails until it is hooked.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

ops = torch.ops.baracuda
_LIB = torch.library.Library("baracuda", "IMPL")  # noqa: TOR901 (kept alive for the process)
#: Every op hooked by :func:`register` ("baracuda::name" or "baracuda::name.overload").
HOOKED: set = set()

__all__ = ["register", "not_differentiable", "name_unhooked_ops"]


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
    """Make ``torch.ops.baracuda.<op>`` work under torch.func transforms.

    Args:
        op: ``"name"`` or ``"name.overload"``.
        setup_context: ``(ctx, inputs, output)``, ``inputs`` holding every schema argument
            (defaults filled in); saves what ``backward``/``jvp`` need.
        backward: ``(ctx, *grad_outputs) -> one gradient (or None) per schema argument``;
            a grad output is None when that output's gradient is zero.
        jvp: ``(ctx, *tangents) -> tangent of each output``; a tangent is None when that
            input has none. None: forward-mode AD raises NotImplementedError.
        vmap: ``(info, in_dims, *args) -> (output, out_dims)``, the
            ``torch.autograd.Function.vmap`` staticmethod (``in_dims[i]`` is None for an
            unbatched argument). None: vmap raises NotImplementedError.

    Returns the generated ``torch.autograd.Function``.
    """
    name, _, overload = op.partition(".")
    overload_packet = getattr(ops, name)
    opo = getattr(overload_packet, overload or "default")
    schema = opo._schema
    qualname = f"baracuda::{name}"
    jvp_fn = jvp or _unsupported(qualname, f"forward-mode AD (torch.func.jvp/jacfwd) of {op}")
    vmap_fn = vmap or _unsupported(qualname, f"vmap of {op}")

    def forward(*args):
        # Below autograd (this Function is the derivative): the op's CPU/CUDA/Meta kernel.
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
    HOOKED.add(f"baracuda::{op}" if overload else qualname)
    return fn_cls


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


def name_unhooked_ops() -> list:
    """Give every ``baracuda::`` op without rules a functorch kernel that raises
    ``NotImplementedError("baracuda::<op>: torch.func transforms are not supported ...")``
    (instead of PyTorch's error about C++ autograd Functions, which names no op).
    Returns the names of those ops."""
    unhooked = []
    for qualname in torch._C._dispatch_get_all_op_names():
        if not qualname.startswith("baracuda::") or torch._C._dispatch_has_kernel_for_dispatch_key(
                qualname, "FuncTorchDynamicLayerFrontMode"):
            continue
        message = (f"{qualname}: torch.func transforms (grad, vjp, jacrev, jacfwd, vmap) are not "
                   "supported for this op yet (see baracuda_torch/_autograd.py)")

        def raiser(*args: Any, _message: str = message, **kwargs: Any):
            raise NotImplementedError(_message)

        _LIB.impl(qualname.split("::", 1)[1], raiser, "FuncTorchDynamicLayerFrontMode")
        unhooked.append(qualname)
    return unhooked
