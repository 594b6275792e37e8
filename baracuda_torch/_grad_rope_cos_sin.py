"""Derivatives and batching rules of rope_cos_sin, rope_qk_cos_sin and their backward
ops (see _autograd.py).

Each op is bilinear in its activations (x, or q and k) and its tables (cos, sin): the
forward is y = M(cos, sin)·x and the backward op is Mᵀ(cos, sin)·g. So

* the activation gradient of each is the other op (any order, as in C++);
* the table gradient is the one the C++ autograd kernels compute (rope_cos_sin_ops.cpp),
  here with ATen ops so that it is itself differentiable and batchable::

      dcos[e] = Σ dy[f]·x[f],   dsin[e] = Σ dy[f]·rotate(x)[f]

  over the heads (and the batch, for a shared table) of every feature f < R that reads
  entry e; for the backward op (x, dy) trade places (<w, Mᵀ·g> = <M·w, g>);
* the tangent is op(tx, cos, sin) + op(x, tcos, tsin) with the pass-through features
  (R..D-1) of the second term zeroed (the op is linear in the tables on the first R).

vmap folds the vmapped dim into the batch dim B of x/q/k; a [1 or B, S, R] table is
expanded (and a batched [S, R/2] one turned into its per-feature [S, R] form) to match.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._autograd import logical_rank, move_bdim, register

ops = torch.ops.baracuda


def _rotary_dim(cos: Tensor) -> int:
    return cos.size(2) if cos.dim() == 3 else 2 * cos.size(1)


def _rotate(xr: Tensor, interleaved: bool) -> Tensor:
    """(−x_v, x_u) at (u, v) of every pair of the last dim."""
    if interleaved:
        return torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    half = xr.size(-1) // 2
    return torch.cat((-xr[..., half:], xr[..., :half]), -1)


def _table_grads(x: Optional[Tensor], g: Optional[Tensor], cos: Tensor, sin: Tensor,
                 interleaved: bool, want_cos: bool, want_sin: bool, acc: list) -> None:
    """Adds d<g, M(cos, sin)·x>/d(cos, sin) to acc = [dcos, dsin] (None: zero), summed in
    float32 (float64 when x or the table is float64), as the C++ autograd kernel does."""
    if x is None or g is None or x.size(1) == 0:
        return
    full = cos.dim() == 3
    R = _rotary_dim(cos)
    wide = torch.float64 if torch.float64 in (cos.dtype, x.dtype) else torch.float32
    xr = x[..., :R].to(wide)
    gr = g[..., :R].to(wide)

    def reduce(prod: Tensor) -> Tensor:     # [B, H, S, R] -> the table's shape
        p = prod.sum(1)                     # [B, S, R]
        if full:
            return p.sum(0, keepdim=True) if cos.size(0) == 1 else p
        p = p.sum(0)                        # [S, R]
        if interleaved:
            return p[..., 0::2] + p[..., 1::2]
        return p[..., :R // 2] + p[..., R // 2:]

    if want_cos:
        d = reduce(gr * xr)
        acc[0] = d if acc[0] is None else acc[0] + d
    if want_sin:
        d = reduce(gr * _rotate(xr, interleaved))
        acc[1] = d if acc[1] is None else acc[1] + d


def _finish_table_grads(acc: list, cos: Tensor, sin: Tensor, want_cos: bool, want_sin: bool):
    dcos, dsin = acc
    if want_cos:
        dcos = torch.zeros_like(cos) if dcos is None else dcos.to(cos.dtype)
    if want_sin:
        dsin = torch.zeros_like(sin) if dsin is None else dsin.to(sin.dtype)
    return (dcos if want_cos else None), (dsin if want_sin else None)


def _zero_pass_through(t: Tensor, R: int) -> Tensor:
    """t with features R..D-1 zeroed (the table tangent's term there is zero)."""
    if R >= t.size(-1):
        return t
    return torch.cat((t[..., :R], torch.zeros_like(t[..., R:])), -1)


# ---- vmap: fold the vmapped dim into x's batch dim ------------------------------------

def _per_feature(t: Tensor, interleaved: bool) -> Tensor:
    """A [..., S, R/2] per-pair table -> its [..., S, R] per-feature form."""
    return t.repeat_interleave(2, -1) if interleaved else torch.cat((t, t), -1)


def _fold_table(t: Tensor, bdim: Optional[int], n: int, b: int, interleaved: bool) -> Tensor:
    """The table for x folded to [n·b, H, S, D]: shared tables stay as they are; others
    become [n·b, S, R] (a batched [S, R/2] table in its per-feature form)."""
    rank = logical_rank(t, bdim)
    if bdim is None and (rank == 2 or t.size(0) == 1):
        return t                                         # shared by every sample and row
    t = move_bdim(t, bdim, n)                            # [n, S, R/2] or [n, Bc, S, R]
    if rank == 2:
        t = _per_feature(t, interleaved)[:, None]        # [n, 1, S, R]
    t = t.expand(n, b, *t.shape[2:])
    return t.reshape(n * b, *t.shape[2:])


def _fold_tables(cos, sin, in_dims, n, b, interleaved):
    cos = _fold_table(cos, in_dims[0], n, b, interleaved)
    sin = _fold_table(sin, in_dims[1], n, b, interleaved)
    if cos.shape != sin.shape:  # one shared, the other folded: both [n·b, S, R]
        cos, sin = [(_per_feature(t, interleaved)[None] if t.dim() == 2 else t)
                    .expand(n * b, *t.shape[-2:-1], -1).contiguous() for t in (cos, sin)]
    return cos, sin


def _tables_ok(cos, sin, in_dims):
    rc, rs = logical_rank(cos, in_dims[0]), logical_rank(sin, in_dims[1])
    if rc != rs or rc not in (2, 3):
        return False
    c = cos.movedim(in_dims[0], 0)[0] if in_dims[0] is not None else cos
    s = sin.movedim(in_dims[1], 0)[0] if in_dims[1] is not None else sin
    return c.shape == s.shape


def _vmap_one(op):
    def vmap(info, in_dims, x, cos, sin, interleaved):
        n = info.batch_size
        x = move_bdim(x, in_dims[0], n)
        if x.dim() != 5 or not _tables_ok(cos, sin, in_dims[1:3]):
            # Not a valid sample: the op's own error, on sample 0.
            return op(x[0], move_bdim(cos, in_dims[1], n)[0], move_bdim(sin, in_dims[2], n)[0],
                      interleaved), 0
        _, b, h, s, d = x.shape
        cos, sin = _fold_tables(cos, sin, in_dims[1:3], n, b, interleaved)
        y = op(x.reshape(n * b, h, s, d), cos, sin, interleaved)
        return y.reshape(n, b, h, s, d), 0
    return vmap


def _vmap_qk(op):
    def vmap(info, in_dims, q, k, cos, sin, interleaved):
        n = info.batch_size
        q = move_bdim(q, in_dims[0], n)
        k = move_bdim(k, in_dims[1], n)
        if q.dim() != 5 or k.dim() != 5 or q.size(1) != k.size(1) or \
                not _tables_ok(cos, sin, in_dims[2:4]):
            yq, yk = op(q[0], k[0], move_bdim(cos, in_dims[2], n)[0],
                        move_bdim(sin, in_dims[3], n)[0], interleaved)
            return (yq, yk), (0, 0)
        b = q.size(1)
        cos, sin = _fold_tables(cos, sin, in_dims[2:4], n, b, interleaved)
        yq, yk = op(q.reshape(n * b, *q.shape[2:]), k.reshape(n * b, *k.shape[2:]), cos, sin,
                    interleaved)
        return (yq.reshape(n, b, *yq.shape[1:]), yk.reshape(n, b, *yk.shape[1:])), (0, 0)
    return vmap


# ---- rope_cos_sin / rope_cos_sin_backward ---------------------------------------------

def _make_one(op, adjoint, is_backward: bool):
    def setup(ctx, inputs, output):
        x, cos, sin, interleaved = inputs
        ctx.interleaved = interleaved
        ctx.save_for_backward(x, cos, sin)
        ctx.save_for_forward(x, cos, sin)

    def backward(ctx, dy):
        x, cos, sin = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = adjoint(dy, cos, sin, ctx.interleaved) if need[0] else None
        dcos = dsin = None
        if need[1] or need[2]:
            acc = [None, None]
            # forward: d<dy, M·x>; backward op: d<dy, Mᵀ·x> = d<x, M·dy>.
            a, g = (dy, x) if is_backward else (x, dy)
            _table_grads(a, g, cos, sin, ctx.interleaved, need[1], need[2], acc)
            dcos, dsin = _finish_table_grads(acc, cos, sin, need[1], need[2])
        return dx, dcos, dsin, None

    def jvp(ctx, tx, tcos, tsin, _):
        x, cos, sin = ctx.saved_tensors
        t = None if tx is None else op(tx, cos, sin, ctx.interleaved)
        if tcos is not None or tsin is not None:
            tt = _zero_pass_through(
                op(x, torch.zeros_like(cos) if tcos is None else tcos,
                   torch.zeros_like(sin) if tsin is None else tsin, ctx.interleaved),
                _rotary_dim(cos))
            t = tt if t is None else t + tt
        return t

    return dict(setup_context=setup, backward=backward, jvp=jvp, vmap=_vmap_one(op))


register("rope_cos_sin", **_make_one(ops.rope_cos_sin, ops.rope_cos_sin_backward, False))
register("rope_cos_sin_backward",
         **_make_one(ops.rope_cos_sin_backward, ops.rope_cos_sin, True))


# ---- rope_qk_cos_sin / rope_qk_cos_sin_backward ---------------------------------------

def _make_qk(op, adjoint, is_backward: bool):
    def setup(ctx, inputs, output):
        q, k, cos, sin, interleaved = inputs
        ctx.interleaved = interleaved
        ctx.save_for_backward(q, k, cos, sin)
        ctx.save_for_forward(q, k, cos, sin)

    def backward(ctx, gq, gk):
        q, k, cos, sin = ctx.saved_tensors
        need = ctx.needs_input_grad
        dq = dk = None
        if need[0] or need[1]:
            dq, dk = adjoint(torch.zeros_like(q) if gq is None else gq,
                             torch.zeros_like(k) if gk is None else gk, cos, sin,
                             ctx.interleaved)
        dcos = dsin = None
        if need[2] or need[3]:
            acc = [None, None]
            for t, g in ((q, gq), (k, gk)):
                a, b = (g, t) if is_backward else (t, g)
                _table_grads(a, b, cos, sin, ctx.interleaved, need[2], need[3], acc)
            dcos, dsin = _finish_table_grads(acc, cos, sin, need[2], need[3])
        return (dq if need[0] else None), (dk if need[1] else None), dcos, dsin, None

    def jvp(ctx, tq, tk, tcos, tsin, _):
        q, k, cos, sin = ctx.saved_tensors
        outs = [None, None]
        if tq is not None or tk is not None:
            outs = list(op(torch.zeros_like(q) if tq is None else tq,
                           torch.zeros_like(k) if tk is None else tk, cos, sin,
                           ctx.interleaved))
        if tcos is not None or tsin is not None:
            R = _rotary_dim(cos)
            tq2, tk2 = op(q, k, torch.zeros_like(cos) if tcos is None else tcos,
                          torch.zeros_like(sin) if tsin is None else tsin, ctx.interleaved)
            extra = (_zero_pass_through(tq2, R), _zero_pass_through(tk2, R))
            outs = [e if o is None else o + e for o, e in zip(outs, extra)]
        return tuple(outs)

    return dict(setup_context=setup, backward=backward, jvp=jvp, vmap=_vmap_qk(op))


register("rope_qk_cos_sin", **_make_qk(ops.rope_qk_cos_sin, ops.rope_qk_cos_sin_backward, False))
register("rope_qk_cos_sin_backward",
         **_make_qk(ops.rope_qk_cos_sin_backward, ops.rope_qk_cos_sin, True))
