"""Derivatives and batching rules of gated_activation_pair and its backward op (see
_autograd.py). First derivatives only: the backward op is not differentiable."""
from __future__ import annotations

import torch

from ._autograd import move_bdim, not_differentiable, register

ops = torch.ops.baracuda


def _setup(ctx, inputs, output):
    gate, up, kind = inputs
    ctx.kind = kind
    ctx.save_for_backward(gate, up)
    ctx.save_for_forward(gate, up)


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    if not any(ctx.needs_input_grad[:2]):
        return None, None, None
    dgate, dup = ops.gated_activation_pair_backward(dy, gate, up, ctx.kind)
    return (dgate if ctx.needs_input_grad[0] else None,
            dup if ctx.needs_input_grad[1] else None, None)


def _jvp(ctx, tgate, tup, _kind):
    # y = act(gate)·up elementwise: the backward of a unit dy gives ∂y/∂gate and ∂y/∂up.
    if tgate is None and tup is None:
        return None
    gate, up = ctx.saved_tensors
    dgate, dup = ops.gated_activation_pair_backward(torch.ones_like(gate), gate, up, ctx.kind)
    out = None
    if tgate is not None:
        out = dgate * tgate
    if tup is not None:
        out = dup * tup if out is None else out + dup * tup
    return out


def _vmap(info, in_dims, gate, up, kind):
    n = info.batch_size
    return ops.gated_activation_pair(move_bdim(gate, in_dims[0], n),
                                     move_bdim(up, in_dims[1], n), kind), 0


register("gated_activation_pair", setup_context=_setup, backward=_backward, jvp=_jvp,
         vmap=_vmap)


def _backward_vmap(info, in_dims, dy, gate, up, kind):
    n = info.batch_size
    dgate, dup = ops.gated_activation_pair_backward(
        move_bdim(dy, in_dims[0], n), move_bdim(gate, in_dims[1], n),
        move_bdim(up, in_dims[2], n), kind)
    return (dgate, dup), (0, 0)


not_differentiable("gated_activation_pair_backward",
                   "baracuda::gated_activation_pair: double backward (the second derivative) "
                   "is not implemented", vmap=_backward_vmap)
