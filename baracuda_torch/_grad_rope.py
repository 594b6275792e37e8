"""Derivatives and batching rules of rope and rope_backward (see _autograd.py). Each is
the other's adjoint (rotation by ±θ), so both are differentiable to any order."""
from __future__ import annotations

import torch

from ._autograd import logical_rank, move_bdim, register

ops = torch.ops.baracuda


def _make(op, adjoint):
    def setup(ctx, inputs, output):
        _x, positions, base, interleaved, rotary_dim = inputs
        ctx.args = (base, interleaved, rotary_dim)
        ctx.has_positions = positions is not None
        saved = (positions,) if positions is not None else ()
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    def positions_of(ctx):
        return ctx.saved_tensors[0] if ctx.has_positions else None

    def backward(ctx, dy):
        if not ctx.needs_input_grad[0]:
            return (None,) * 5
        return (adjoint(dy, positions_of(ctx), *ctx.args),) + (None,) * 4

    def jvp(ctx, tx, *_):
        return None if tx is None else op(tx, positions_of(ctx), *ctx.args)

    def vmap(info, in_dims, x, positions, base, interleaved, rotary_dim):
        # Fold the vmapped dim into the batch dim B of x [B, H, S, D]; positions [S]
        # stay shared, positions [B, S] (or batched ones) become [N·B, S].
        n = info.batch_size
        x = move_bdim(x, in_dims[0], n)
        if x.dim() != 5:  # not a 4-D sample: the op's own error
            return op(x[0], positions, base, interleaved, rotary_dim), 0
        _, b, h, s, d = x.shape
        if positions is not None:
            pd = in_dims[1]
            rp = logical_rank(positions, pd)
            if pd is None and rp == 2:
                positions = positions.expand(n, *positions.shape)
            elif pd is not None:
                positions = positions.movedim(pd, 0)
                if rp == 1:
                    positions = positions[:, None, :].expand(n, b, positions.shape[-1])
            if positions.dim() == 3:
                positions = positions.reshape(n * b, positions.shape[-1])
        y = op(x.reshape(n * b, h, s, d), positions, base, interleaved, rotary_dim)
        return y.reshape(n, b, h, s, d), 0

    return dict(setup_context=setup, backward=backward, jvp=jvp, vmap=vmap)


register("rope", **_make(ops.rope, ops.rope_backward))
register("rope_backward", **_make(ops.rope_backward, ops.rope))
