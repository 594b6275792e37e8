"""Forward-mode AD and batching rules of rope and rope_backward (see _autograd.py); their
backward rules come from the ops' declarations (csrc/torch/rope_ops.cpp). Each op is the
other's adjoint (rotation by ±θ), so both are differentiable to any order."""
from __future__ import annotations

import torch

from ._autograd import declared, logical_rank, move_bdim, saved

ops = torch.ops.baracuda


def _rules(op):
    def jvp(ctx, tx, *_):
        if tx is None:
            return None
        return op(tx, saved(ctx, "positions"), saved(ctx, "base"), saved(ctx, "interleaved"),
                  saved(ctx, "rotary_dim"))

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

    return dict(jvp=jvp, vmap=vmap)


declared("rope", **_rules(ops.rope))
declared("rope_backward", **_rules(ops.rope_backward))
