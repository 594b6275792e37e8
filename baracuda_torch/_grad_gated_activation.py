"""Derivatives and batching rules of gated_activation and its backward op (see
_autograd.py). First derivatives only: the backward op is not differentiable."""
from __future__ import annotations

import torch

from ._autograd import move_bdim, not_differentiable, register

ops = torch.ops.baracuda


def _setup(ctx, inputs, output):
    x, kind, dim, gate_first = inputs
    ctx.args = (kind, dim, gate_first)
    ctx.out_shape = output.shape
    ctx.save_for_backward(x)
    ctx.save_for_forward(x)


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None
    return ops.gated_activation_backward(dy, x, *ctx.args), None, None, None


def _jvp(ctx, tx, *_):
    # y = a·g(b) elementwise over the halves (a, b) of x, so the backward of a unit dy is
    # [∂y/∂a, ∂y/∂b] laid out like x, and ẏ = ∂y/∂a·ȧ + ∂y/∂b·ḃ is the sum of the halves
    # of that times the tangent.
    if tx is None:
        return None
    (x,) = ctx.saved_tensors
    kind, dim, gate_first = ctx.args
    d = ops.gated_activation_backward(x.new_ones(ctx.out_shape), x, kind, dim, gate_first)
    first, second = (d * tx).chunk(2, dim)
    return first + second


def _batched(dim, x_batched):
    r = x_batched.dim() - 1
    return dim % r + 1 if r > 0 and -r <= dim < r else dim


def _vmap(info, in_dims, x, kind, dim, gate_first):
    x = move_bdim(x, in_dims[0], info.batch_size)
    if x.dim() == 1:  # a 0-dim sample: the op's own error
        return ops.gated_activation(x[0], kind, dim, gate_first), 0
    return ops.gated_activation(x, kind, _batched(dim, x), gate_first), 0


register("gated_activation", setup_context=_setup, backward=_backward, jvp=_jvp, vmap=_vmap)


def _backward_vmap(info, in_dims, dy, x, kind, dim, gate_first):
    n = info.batch_size
    dy, x = move_bdim(dy, in_dims[0], n), move_bdim(x, in_dims[1], n)
    if x.dim() == 1:
        return ops.gated_activation_backward(dy[0], x[0], kind, dim, gate_first), 0
    return ops.gated_activation_backward(dy, x, kind, _batched(dim, x), gate_first), 0


not_differentiable("gated_activation_backward",
                   "baracuda::gated_activation: double backward (the second derivative) is "
                   "not implemented", vmap=_backward_vmap)
