"""Batching rules of ssd_chunk_scan_combined (mamba_ssm's mamba_chunk_scan_combined) and
its backward op, and the forward-mode error (see _autograd.py). First derivatives only:
forward-mode AD and double backward raise NotImplementedError naming the op.

The gradient comes from the op's declaration (csrc/torch/ssd_chunk_scan_ops.cpp): it is
ssd_chunk_scan_combined_backward (out and final_states both carry gradients; y_pre, the
pre-gate output kept for the backward when z is given, and states, the chunk states kept
with keep_states, are not differentiable).

vmap folds the vmapped dim into an existing dim of every operand and calls the op once:

* into the batch dim B when the per-head parameters (A, D, dt_bias) are not batched
  (the forward only: the backward's dA, dD and ddt_bias sum over B);
* else into the head dim H (groups G of B and C likewise: head h of sample k becomes
  k·H + h and still reads group k·G + h·G/H) when seq_idx is not batched;
* else (a batched seq_idx with batched per-head parameters, or an operand of the wrong
  rank, which then gets the op's own error) one call per sample, stacked.
"""
from __future__ import annotations

import torch

from ._autograd import declared, is_absent, logical_rank, move_bdim

ops = torch.ops.baracuda
_OP = "baracuda::ssd_chunk_scan_combined"

# Forward tensor operands: x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx.
_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")
_RANKS = {"x": (4,), "dt": (3,), "A": (1,), "B": (4,), "C": (4,), "D": (1, 2), "z": (4,),
          "dt_bias": (1,), "initial_states": (4,), "seq_idx": (2,), "dout": (4,),
          "dfinal_states": (4,), "y_pre": (4,), "states": (5,)}
# Position of the batch dim / the head (or group) dim in each operand (None: has none).
_BATCH_POS = {"x": 0, "dt": 0, "A": None, "B": 0, "C": 0, "D": None, "z": 0, "dt_bias": None,
              "initial_states": 0, "seq_idx": 0, "dout": 0, "dfinal_states": 0, "y_pre": 0,
              "states": 0}
_HEAD_POS = {"x": 2, "dt": 2, "A": 0, "B": 2, "C": 2, "D": 0, "z": 2, "dt_bias": 0,
             "initial_states": 1, "seq_idx": None, "dout": 2, "dfinal_states": 1, "y_pre": 2,
             "states": 1}
_PER_HEAD = ("A", "D", "dt_bias")
# Outputs: forward (out, final_states, y_pre, states [B, H, nc, D, N]); backward (dx, ddt,
# dA, dB, dC, dD, dz, ddt_bias, dinitial_states), named by the entry whose batch and head
# dims they share.
_FWD_OUTS = ("x", "initial_states", "x", "states")
_BWD_OUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def _fold(t, bdim, n, pos):
    """`t` with the vmapped dim merged into its dim `pos` (sample k's entries first)."""
    return move_bdim(t, bdim, n).movedim(0, pos).flatten(pos, pos + 1)


def _unfold(t, n, pos):
    """An output of the folded call -> (the per-sample result, its out_dim); an absent
    optional output (an empty tensor) is returned unbatched."""
    if pos is None or is_absent(t):
        return t, None
    return t.unflatten(pos, (n, -1)), pos


def _ranks_ok(named, in_dims):
    return all(t is None or logical_rank(t, in_dims[k]) in _RANKS[k] for k, t in named.items())


def _batched(named, in_dims, names):
    return any(named[k] is not None and in_dims[k] is not None for k in names)


def _folded_call(call, named, in_dims, n, positions, outs):
    """One call of `call` on every operand folded at `positions`; the outputs unfolded
    at the position of the operand named in `outs`."""
    folded = {k: (None if t is None else _fold(t, in_dims[k], n, positions[k])
                  if positions[k] is not None else t)
              for k, t in named.items()}
    results = call(folded)
    unfolded = [_unfold(r, n, positions[o]) for r, o in zip(results, outs)]
    return tuple(u[0] for u in unfolded), tuple(u[1] for u in unfolded)


def _looped_call(call, named, in_dims, n):
    """One call per sample, results stacked (absent optional outputs unbatched)."""
    per_sample = []
    for k in range(n):
        sample = {name: (None if t is None else t.select(in_dims[name], k)
                         if in_dims[name] is not None else t)
                  for name, t in named.items()}
        per_sample.append(call(sample))
    outs, dims = [], []
    for results in zip(*per_sample):
        if is_absent(results[0]):
            outs.append(results[0])
            dims.append(None)
        else:
            outs.append(torch.stack(results))
            dims.append(0)
    return tuple(outs), tuple(dims)


def _batched_call(call, named, in_dims, n, outs, batch_fold_ok):
    if not _ranks_ok(named, in_dims):       # the op's own error, on sample 0
        return _looped_call(call, named, in_dims, n)
    if batch_fold_ok and not _batched(named, in_dims, _PER_HEAD):
        return _folded_call(call, named, in_dims, n, _BATCH_POS, outs)
    if not _batched(named, in_dims, ("seq_idx",)):
        return _folded_call(call, named, in_dims, n, _HEAD_POS, outs)
    return _looped_call(call, named, in_dims, n)


# ---- ssd_chunk_scan_combined ------------------------------------------------------------

def _jvp(ctx, *tangents):
    raise NotImplementedError(f"{_OP}: forward-mode AD (torch.func.jvp, jacfwd) is not "
                              "implemented")


def _vmap(info, in_dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, init, seq_idx, dt_softplus,
          dt_min, dt_max, state_dtype, keep_states):
    named = dict(zip(_NAMES, (x, dt, A, B, C, D, z, dt_bias, init, seq_idx)))
    dims = dict(zip(_NAMES, in_dims[:5] + in_dims[6:11]))

    def call(t):
        return ops.ssd_chunk_scan_combined(
            t["x"], t["dt"], t["A"], t["B"], t["C"], chunk_size, t["D"], t["z"], t["dt_bias"],
            t["initial_states"], t["seq_idx"], dt_softplus, dt_min, dt_max, state_dtype, keep_states)

    return _batched_call(call, named, dims, info.batch_size, _FWD_OUTS, batch_fold_ok=True)


declared("ssd_chunk_scan_combined", jvp=_jvp, vmap=_vmap)


# ---- ssd_chunk_scan_combined_backward ---------------------------------------------------

_BWD_NAMES = ("dout", "dfinal_states") + _NAMES + ("y_pre", "states")


def _backward_vmap(info, in_dims, dout, dfinal, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                   init, seq_idx, y_pre, dt_softplus, dt_min, dt_max, states=None):
    named = dict(zip(_BWD_NAMES, (dout, dfinal, x, dt, A, B, C, D, z, dt_bias, init, seq_idx,
                                  y_pre, states)))
    dims = dict(zip(_BWD_NAMES, in_dims[:7] + in_dims[8:14] + in_dims[17:18]))

    def call(t):
        return ops.ssd_chunk_scan_combined_backward(
            t["dout"], t["dfinal_states"], t["x"], t["dt"], t["A"], t["B"], t["C"], chunk_size,
            t["D"], t["z"], t["dt_bias"], t["initial_states"], t["seq_idx"], t["y_pre"],
            dt_softplus, dt_min, dt_max, t["states"])

    # Never folded into B: dA, dD and ddt_bias are sums over B.
    return _batched_call(call, named, dims, info.batch_size, _BWD_OUTS, batch_fold_ok=False)


declared("ssd_chunk_scan_combined_backward", vmap=_backward_vmap)
