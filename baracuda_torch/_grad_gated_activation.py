"""Forward-mode AD of gated_activation and gated_activation_pair (see _autograd.py).
Their backward and vmap rules come from the ops' C++ declarations
(csrc/torch/gated_activation_ops.cpp); the backward ops are not differentiable."""
from __future__ import annotations

import torch

from ._autograd import declared, saved

ops = torch.ops.baracuda


def _jvp(ctx, tx, *_):
    # y = a·g(b) elementwise over the halves (a, b) of x, so the backward of a unit dy is
    # [∂y/∂a, ∂y/∂b] laid out like x, and ẏ = ∂y/∂a·ȧ + ∂y/∂b·ḃ is the sum of the halves
    # of that times the tangent.
    if tx is None:
        return None
    x, kind, dim = saved(ctx, "x"), saved(ctx, "kind"), saved(ctx, "dim")
    shape, dtype, device = ctx.out_meta[0]
    d = ops.gated_activation_backward(torch.ones(shape, dtype=dtype, device=device), x, kind, dim,
                                      saved(ctx, "gate_first"))
    first, second = (d * tx).chunk(2, dim)
    return first + second


def _pair_jvp(ctx, tgate, tup, _kind):
    # y = act(gate)·up elementwise: the backward of a unit dy gives ∂y/∂gate and ∂y/∂up.
    if tgate is None and tup is None:
        return None
    gate, up = saved(ctx, "gate"), saved(ctx, "up")
    dgate, dup = ops.gated_activation_pair_backward(torch.ones_like(gate), gate, up,
                                                    saved(ctx, "kind"))
    out = None
    if tgate is not None:
        out = dgate * tgate
    if tup is not None:
        out = dup * tup if out is None else out + dup * tup
    return out


declared("gated_activation", jvp=_jvp)
declared("gated_activation_pair", jvp=_pair_jvp)
