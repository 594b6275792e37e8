"""Batching rules of ssd_chunk_scan and its backward op, and the forward-mode error (see
_autograd.py; the derivatives come from the ops' declarations in
csrc/torch/ssd_chunk_scan_ops.cpp). First derivatives only (no double backward, no
forward-mode AD)."""
from __future__ import annotations

import torch

from ._autograd import declared, move_bdim

ops = torch.ops.baracuda
_RANKS = (4, 3, 1, 4, 4)  # x [B, L, H, D], dt [B, L, H], A [H], B and C [B, L, G, N]


def _fold_heads(t, bdim, n, rank):
    """A batched SSD operand -> the same operand with the vmapped dim folded into its
    head (or group) dim: head h of sample k becomes head k·H + h, so that group
    g of sample k (k·G + g) is still the one its heads read."""
    t = move_bdim(t, bdim, n)
    if rank == 1:                                   # A [N, H] -> [N·H]
        return t.reshape(-1)
    t = t.movedim(0, 2)                             # [B, L, N, H(, D)]
    return t.reshape(*t.shape[:2], -1, *t.shape[4:])


def _unfold(t, n, rank):
    if rank == 1:
        return t.reshape(n, -1), 0
    return t.reshape(*t.shape[:2], n, -1, *t.shape[3:]), 2


def _samples_ok(tensors, in_dims):
    return all(t.dim() - (d is not None) == r for t, d, r in zip(tensors, in_dims, _RANKS))


def _vmap(info, in_dims, x, dt, A, B, C, chunk_size):
    tensors = (x, dt, A, B, C)
    n = info.batch_size
    if not _samples_ok(tensors, in_dims):  # the op's own shape error, on one sample
        return ops.ssd_chunk_scan(*[move_bdim(t, d, n)[0] for t, d in zip(tensors, in_dims)],
                                  chunk_size), 0
    folded = [_fold_heads(t, d, n, r) for t, d, r in zip(tensors, in_dims, _RANKS)]
    return _unfold(ops.ssd_chunk_scan(*folded, chunk_size), n, 4)


def _jvp(ctx, *tangents):
    raise NotImplementedError("baracuda::ssd_chunk_scan: forward-mode AD (torch.func.jvp, "
                              "jacfwd) is not implemented")


declared("ssd_chunk_scan", jvp=_jvp, vmap=_vmap)


def _backward_vmap(info, in_dims, dy, x, dt, A, B, C, chunk_size):
    tensors = (x, dt, A, B, C)
    n = info.batch_size
    if not (_samples_ok(tensors, in_dims[1:6]) and dy.dim() - (in_dims[0] is not None) == 4):
        return ops.ssd_chunk_scan_backward(
            *[move_bdim(t, d, n)[0] for t, d in zip((dy,) + tensors, in_dims[:6])], chunk_size), \
            (0,) * 5
    folded = [_fold_heads(t, d, n, r) for t, d, r in zip((dy,) + tensors, in_dims[:6], (4,) + _RANKS)]
    grads = ops.ssd_chunk_scan_backward(*folded, chunk_size)
    outs = [_unfold(g, n, r) for g, r in zip(grads, _RANKS)]
    return tuple(o[0] for o in outs), tuple(o[1] for o in outs)


declared("ssd_chunk_scan_backward", vmap=_backward_vmap)
