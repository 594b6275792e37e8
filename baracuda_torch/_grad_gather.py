"""Forward-mode AD and batching rules of gather and gather_backward (see _autograd.py);
their backward rules come from the ops' declarations (csrc/torch/gather_ops.cpp). gather
is linear in src and gather_backward linear in dout, each the other's adjoint, so both
are differentiable to any order."""
from __future__ import annotations

import torch

from ._autograd import declared, logical_rank, move_bdim, saved

ops = torch.ops.baracuda


def _gather_jvp(ctx, tsrc, _tdim, _tindex):
    return None if tsrc is None else ops.gather(tsrc, saved(ctx, "dim"), saved(ctx, "index"))


def _batched_dim(dim, rank):
    """`dim` of a logical tensor of rank `rank` (0-dim counts as 1-d) with a batch dim in front."""
    r = max(rank, 1)
    return (dim % r if -r <= dim < r else dim) + 1


def _gather_vmap(info, in_dims, src, dim, index):
    n = info.batch_size
    rs, ri = logical_rank(src, in_dims[0]), logical_rank(index, in_dims[2])
    src, index = move_bdim(src, in_dims[0], n), move_bdim(index, in_dims[2], n)
    if rs == 0:
        src = src.unsqueeze(1)
    if ri == 0:
        index = index.unsqueeze(1)
    out = ops.gather(src, _batched_dim(dim, rs), index)
    return (out.squeeze(1) if ri == 0 else out), 0


declared("gather", jvp=_gather_jvp, vmap=_gather_vmap)


def _gather_backward_jvp(ctx, tdout, _tdim, _tindex, _tsizes):
    if tdout is None:
        return None
    return ops.gather_backward(tdout, saved(ctx, "dim"), saved(ctx, "index"), saved(ctx, "src_sizes"))


def _gather_backward_vmap(info, in_dims, dout, dim, index, src_sizes):
    n = info.batch_size
    rs, ri = len(src_sizes), logical_rank(index, in_dims[2])
    dout, index = move_bdim(dout, in_dims[0], n), move_bdim(index, in_dims[2], n)
    sizes = [n, *src_sizes] if rs else [n, 1]
    if ri == 0:
        dout, index = dout.unsqueeze(1), index.unsqueeze(1)
    out = ops.gather_backward(dout, _batched_dim(dim, rs), index, sizes)
    return (out.squeeze(1) if rs == 0 else out), 0


declared("gather_backward", jvp=_gather_backward_jvp, vmap=_gather_backward_vmap)
