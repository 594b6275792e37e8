"""Derivatives and batching rules of lerp / lerp.Tensor and their backward ops (see
_autograd.py). The gradients run lerp_backward(.Tensor); broadcast gradients are summed
down to each input's shape here."""
from __future__ import annotations

import torch

from ._autograd import logical_rank, move_bdim, not_differentiable, register

ops = torch.ops.baracuda


def _sum_to(g, sizes):
    return g if g is None or tuple(g.shape) == tuple(sizes) else g.sum_to_size(sizes)


def _aligned(args, in_dims, size):
    """Batched lerp operands with the batch dim first and the logical dims right-aligned,
    so that broadcasting the batched tensors together is broadcasting the logical ones.
    Unbatched operands are left alone (they broadcast from the right)."""
    r = max(logical_rank(t, d) for t, d in zip(args, in_dims))
    out = []
    for t, d in zip(args, in_dims):
        if d is None:
            out.append(t)
        else:
            t = t.movedim(d, 0)
            out.append(t.reshape(size, *([1] * (r - (t.dim() - 1))), *t.shape[1:]))
    return out


# ---- lerp (scalar weight): linear in (a, b), differentiable to any order ----------------

def _lerp_setup(ctx, inputs, output):
    a, b, w = inputs
    ctx.w = w
    ctx.sizes = (a.shape, b.shape)
    ctx.out_shape = output.shape


def _lerp_backward(ctx, dy):
    if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        return None, None, None
    da, db = ops.lerp_backward(dy, ctx.w)
    return (_sum_to(da, ctx.sizes[0]) if ctx.needs_input_grad[0] else None,
            _sum_to(db, ctx.sizes[1]) if ctx.needs_input_grad[1] else None, None)


def _lerp_jvp(ctx, ta, tb, _tw):
    if ta is not None and tb is not None:
        t = ops.lerp(ta, tb, ctx.w)
    elif ta is not None:
        t = ta * (1.0 - ctx.w)
    elif tb is not None:
        t = tb * ctx.w
    else:
        return None
    return t.expand(ctx.out_shape) if tuple(t.shape) != tuple(ctx.out_shape) else t


def _lerp_vmap(info, in_dims, a, b, w):
    a, b = _aligned((a, b), in_dims[:2], info.batch_size)
    return ops.lerp(a, b, w), 0


register("lerp", setup_context=_lerp_setup, backward=_lerp_backward, jvp=_lerp_jvp,
         vmap=_lerp_vmap)


# lerp_backward is linear in dy; its own backward is d(dy) = lerp(g_da, g_db, w).
def _lerp_backward_setup(ctx, inputs, output):
    ctx.w = inputs[1]


def _lerp_backward_backward(ctx, g_da, g_db):
    w = ctx.w
    if g_da is not None and g_db is not None:
        ddy = ops.lerp(g_da, g_db, w)
    elif g_da is not None:
        ddy = g_da * (1.0 - w)
    else:
        ddy = g_db * w
    return ddy, None


def _lerp_backward_jvp(ctx, tdy, _tw):
    return ops.lerp_backward(tdy, ctx.w)


def _lerp_backward_vmap(info, in_dims, dy, w):
    d = in_dims[0]
    return ops.lerp_backward(dy, w), (d, d)


register("lerp_backward", setup_context=_lerp_backward_setup, backward=_lerp_backward_backward,
         jvp=_lerp_backward_jvp, vmap=_lerp_backward_vmap)


# ---- lerp.Tensor: first derivatives only ----------------------------------------------

def _lerp_t_setup(ctx, inputs, output):
    a, b, w = inputs
    ctx.save_for_backward(a, b, w)
    ctx.save_for_forward(a, b, w)
    ctx.out_shape = output.shape


def _lerp_t_backward(ctx, dy):
    a, b, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not any(need[:3]):
        return None, None, None
    da, db, dw = ops.lerp_backward.Tensor(dy, a, b, w)
    return tuple(_sum_to(g, t.shape) if n else None for g, t, n in zip((da, db, dw), (a, b, w), need))


def _lerp_t_jvp(ctx, ta, tb, tw):
    a, b, w = ctx.saved_tensors
    t = None
    if ta is not None or tb is not None:
        t = ops.lerp.Tensor(torch.zeros_like(a) if ta is None else ta,
                            torch.zeros_like(b) if tb is None else tb, w)
    if tw is not None:
        t = tw * (b - a) if t is None else t + tw * (b - a)
    if t is None:
        return None
    return t.expand(ctx.out_shape) if tuple(t.shape) != tuple(ctx.out_shape) else t


def _lerp_t_vmap(info, in_dims, a, b, w):
    a, b, w = _aligned((a, b, w), in_dims, info.batch_size)
    return ops.lerp.Tensor(a, b, w), 0


register("lerp.Tensor", setup_context=_lerp_t_setup, backward=_lerp_t_backward,
         jvp=_lerp_t_jvp, vmap=_lerp_t_vmap)


def _lerp_backward_t_vmap(info, in_dims, dy, a, b, w):
    # The gradients have dy's shape: dy gets the batch dim (expanded if it has none).
    dy = move_bdim(dy, in_dims[0], info.batch_size)
    dy, a, b, w = _aligned((dy, a, b, w), (0, *in_dims[1:]), info.batch_size)
    da, db, dw = ops.lerp_backward.Tensor(dy, a, b, w)
    return (da, db, dw), (0, 0, 0)


not_differentiable("lerp_backward.Tensor",
                   "baracuda::lerp: double backward with a tensor weight is not implemented",
                   vmap=_lerp_backward_t_vmap)
