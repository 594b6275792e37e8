"""torch.func support of the ``torch.ops.baracuda`` ops: autograd, forward-mode AD and
vmap rules in Python.

The ops' autograd kernels are C++ ``torch::autograd::Function``s, which torch.func
transforms refuse to run. So every op also gets a kernel for the
``FuncTorchDynamicLayerFrontMode`` dispatch key, which the dispatcher reaches only
while a torch.func transform (grad, vjp, jacrev, jacfwd, jvp, vmap, hessian, ...) is
active: it applies a Python :class:`torch.autograd.Function` (forward without ``ctx``
plus ``setup_context``, the form torch.func accepts) whose forward, backward, jvp and
vmap call the same C++ ops (forward below autograd) and only reshape. Outside
transforms nothing changes: eager autograd, ``torch.compile``, ``opcheck`` and CUDA
graphs run the C++ autograd kernels, without Python overhead. Nothing here
synchronizes.

**Declared ops** (``OpDef(...).derivative(...)`` / ``.not_differentiable(...)`` in
csrc/torch/<family>_ops.cpp, see csrc/torch/op_def.h) need nothing here: the C++
declaration that makes their Autograd kernel is in ``_C._op_table()``, and
:func:`register_declared` builds their rules from it: setup_context saves what the
declaration names, backward calls the derivative op, vmap folds the vmapped dim into the
leading dims (``.vmap_rows``) or runs the op once per sample. A family adds what a
declaration cannot say with :func:`declared` before ``register_declared`` runs: a
forward-mode rule (``jvp``) or its own ``vmap``, e.g.::

    def _foo_jvp(ctx, tx, *_):                   # tangents, one per schema argument
        x = saved(ctx, "x")                      # a declared source, by schema name
        return None if tx is None else ops.foo(tx, saved(ctx, "alpha"))

    declared("foo", jvp=_foo_jvp)

Without a jvp, torch.func.jvp / jacfwd raise NotImplementedError naming the op.

**Ops with a hand-written C++ Function** (``.autograd(&fn)``) get hand-written rules
with :func:`register`::

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
implemented", vmap=...)``), then import the module from ``__init__.py``. An op left
unhooked raises NotImplementedError naming it under every transform
(:func:`name_unhooked_ops`), and tests/test_func.py fails until it is hooked.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from . import _C

ops = torch.ops.baracuda
_LIB = torch.library.Library("baracuda", "IMPL")  # noqa: TOR901 (kept alive for the process)
#: Every op hooked by :func:`register` ("baracuda::name" or "baracuda::name.overload").
HOOKED: set = set()

__all__ = ["register", "not_differentiable", "declared", "register_declared", "saved",
           "name_unhooked_ops"]


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
    HOOKED.add(f"baracuda::{op}")
    return fn_cls


def not_differentiable(op: str, message: str, vmap: Optional[Callable] = None) -> type:
    """Hook a backward op whose own derivative is not implemented: differentiating it
    (double backward, or forward-mode AD of a gradient) raises
    ``NotImplementedError(message)``; ``message`` names the forward op."""

    def raiser(*args: Any):
        raise NotImplementedError(message)

    return register(op, setup_context=lambda ctx, inputs, output: None, backward=raiser,
                    jvp=raiser, vmap=vmap)


# ---- declared ops -----------------------------------------------------------------------

#: The declarations of the ops defined through OpDef, by name ("gated_activation").
TABLE = {e["name"]: e for e in _C._op_table()}


def _opoverload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(ops, packet), overload or "default")


def is_absent(t: Tensor) -> bool:
    """An optional output the op did not compute: the library returns an empty 1-D tensor
    there (op_def.cpp's is_absent_output)."""
    return t.dim() == 1 and t.numel() == 0


def _is_tensor(arg) -> bool:
    t = arg.type
    return isinstance(t, torch.TensorType) or (
        isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType))


def saved(ctx, name: str):
    """A declared op's forward argument, by schema name, inside its rules (a tensor the
    declaration saves, or any non-tensor argument)."""
    i = ctx.arg_names.index(name)
    return ctx.saved_tensors[ctx.saved_at[i]] if i in ctx.saved_at else ctx.args[i]


def _declared_rules(e: dict) -> dict:
    """setup_context and backward of a declared op, from its C++ declaration: what
    csrc/torch/op_def.cpp's DeclaredFunction does, in Python."""
    schema = _opoverload(e["name"])._schema
    names = [a.name for a in schema.arguments]
    tensor = [_is_tensor(a) for a in schema.arguments]
    sources = [tuple(s) for s in e["sources"]]
    read = {i for kind, i in sources if kind == "grad"}
    saved_args = [i for kind, i in sources if kind == "arg" and tensor[i]]
    saved_outs = [k for kind, k in sources if kind == "output"]
    derivative = _opoverload(e["derivative"])
    optional = [isinstance(a.type, torch.OptionalType) for a in derivative._schema.arguments]

    def setup_context(ctx, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        ctx.arg_names = names
        ctx.args = tuple(None if tensor[i] else a for i, a in enumerate(inputs))
        ctx.saved_at = {i: n for n, i in enumerate(saved_args)}
        ctx.out_meta = [(o.shape, o.dtype, o.device) for o in outs]
        ctx.sizes = {i: list(inputs[i].shape) for kind, i in sources if kind == "sizes_of"}
        to_save = [inputs[i] for i in saved_args] + [outs[k] for k in saved_outs]
        ctx.save_for_backward(*to_save)
        ctx.save_for_forward(*to_save)
        constant = [o for k, o in enumerate(outs) if k not in read]
        if constant:
            ctx.mark_non_differentiable(*constant)

    def backward(ctx, *grads):
        n = len(names)
        if all(grads[k] is None for k in read):
            return (None,) * n
        tensors = ctx.saved_tensors
        outs_at = len(saved_args)
        args = []
        for j, (kind, i) in enumerate(sources):
            if kind == "grad":
                g = grads[i]
                if g is None and not optional[j]:
                    shape, dtype, device = ctx.out_meta[i]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                args.append(g)
            elif kind == "arg":
                args.append(tensors[ctx.saved_at[i]] if tensor[i] else ctx.args[i])
            elif kind == "output":
                t = tensors[outs_at + saved_outs.index(i)]
                args.append(None if optional[j] and is_absent(t) else t)  # (None for an optional)
            elif kind == "sizes_of":
                args.append(ctx.sizes[i])
            else:
                args.append(None)
        result = derivative(*args)
        result = result if isinstance(result, tuple) else (result,)
        out = [None] * n
        for i, j in e["gradients"]:
            if ctx.needs_input_grad[i]:
                out[i] = result[j]
        return tuple(out)

    return dict(setup_context=setup_context, backward=backward)


def _vmap_rule(e: dict) -> Callable:
    """vmap of a declared op: the vmapped dim becomes one more leading dim of the
    ``vmap_rows`` tensors (one call), when those are the only batched arguments and no
    sample is 0-dim; otherwise one call per sample."""
    opo = _opoverload(e["name"])
    rows, dims = set(e["vmap_rows"]), e["vmap_dims"]

    def per_sample(n, in_dims, args):
        outs = [opo(*[a if d is None else a.select(d, b) for a, d in zip(args, in_dims)])
                for b in range(n)]
        if isinstance(outs[0], tuple):
            return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])
        return torch.stack(outs), 0

    def rule(info, in_dims, *args):
        n = info.batch_size
        present = [i for i in sorted(rows) if args[i] is not None]
        fold = bool(present) and all(d is None or i in rows for i, d in enumerate(in_dims))
        if fold:
            rank = logical_rank(args[present[0]], in_dims[present[0]])
            # A 0-dim sample, or an int dim argument out of range: the per-sample calls
            # raise the op's own error.
            fold = all(logical_rank(args[i], in_dims[i]) >= 1 for i in present) and all(
                -rank <= args[i] < rank for i in dims)
        if not fold:
            return per_sample(n, in_dims, args)
        args = list(args)
        for i in rows:
            args[i] = move_bdim(args[i], in_dims[i], n)
        for i in dims:
            args[i] = args[i] + 1 if args[i] >= 0 else args[i]
        out = opo(*args)
        return out, ((0,) * len(out) if isinstance(out, tuple) else 0)

    return rule


def declared(op: str, *, jvp: Optional[Callable] = None, vmap: Optional[Callable] = None) -> type:
    """Make a declared op (``OpDef`` in C++) work under torch.func transforms: its rules
    from the declaration, plus a hand-written ``jvp`` (``(ctx, *tangents)``; read the
    forward's arguments with :func:`saved`) or ``vmap`` where the family has one."""
    e = TABLE[op]
    vmap = _vmap_in_place(op, vmap or _vmap_rule(e))
    if e["autograd"] == "not_differentiable":
        return not_differentiable(op, e["message"], vmap=vmap)
    if e["autograd"] != "derivative":
        raise ValueError(f"baracuda::{op}: its autograd is not declared; hook it with register()")
    return register(op, **_declared_rules(e), jvp=jvp, vmap=vmap)


def _vmap_in_place(op: str, rule: Callable) -> Callable:
    """vmap of an op that updates arguments in place (``Tensor(a!)``): as for PyTorch's
    in-place ops, such an argument must be batched whenever another one is (each sample
    then updates its own slice); an unbatched one would be updated by every sample."""
    schema = _opoverload(op)._schema
    written = [(i, a.name) for i, a in enumerate(schema.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return rule

    def checked(info, in_dims, *args):
        for i, name in written:
            if args[i] is not None and in_dims[i] is None:
                raise RuntimeError(f"vmap: baracuda::{op} updates {name} in place, so {name} must be "
                                   "batched when another argument is (each sample updates its own slice)")
        return rule(info, in_dims, *args)

    return checked


def register_declared() -> None:
    """Give every declared op that no family module hooked its generic rules."""
    for name, e in TABLE.items():
        qualname = "baracuda::" + name
        if e["autograd"] in ("derivative", "not_differentiable") and qualname not in HOOKED:
            declared(name)


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
