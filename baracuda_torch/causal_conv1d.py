"""The causal-conv1d package's Python API on baracuda's kernels, so that its users switch
by import::

    from baracuda_torch.causal_conv1d import causal_conv1d_fn   # was: from causal_conv1d import ...

:func:`causal_conv1d_update` (the decoding step: a few new columns through the conv,
continuing from a rolling ``conv_state`` updated in place) likewise.

:func:`causal_conv1d_fn` takes the same arguments with the same defaults and returns what
causal-conv1d returns (``out``, or ``(out, final_states)``), on CPU and CUDA tensors of
every float dtype and any strides (causal-conv1d requires channel-last x for seq_idx,
initial_states and final states, and ``dim % 8 == 0`` there; baracuda does not). The
computation is :func:`baracuda_torch.causal_depthwise_conv1d` (``torch.ops.baracuda.causal_conv1d``).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .functional import causal_depthwise_conv1d

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]

_NAME = "baracuda_torch.causal_conv1d.causal_conv1d_fn"


def causal_conv1d_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                     return_final_states: bool = False, final_states_out: Optional[Tensor] = None,
                     activation: Optional[str] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """causal-conv1d's ``causal_conv1d_fn``.

    Args:
        x: ``(batch, dim, seqlen)``.
        weight: ``(dim, width)``.
        bias: ``(dim,)``.
        seq_idx: ``(batch, seqlen)`` int32.
        initial_states: ``(batch, dim, width - 1)``.
        return_final_states: also return the final states ``(batch, dim, width - 1)``
            (the last ``width - 1`` inputs).
        final_states_out: with ``return_final_states``, a ``(batch, dim, width - 1)``
            tensor of x's dtype to write the final states to (and return); ignored
            otherwise, as in causal-conv1d.
        activation: None, ``"silu"`` or ``"swish"``.

    Returns:
        ``out`` ``(batch, dim, seqlen)`` in x's memory layout, or ``(out, final_states)``.

    Raises:
        ValueError: ``seq_idx`` with ``return_final_states`` or with ``initial_states``
            (causal-conv1d asserts both), a ``final_states_out`` of another shape, and
            what :func:`baracuda_torch.causal_depthwise_conv1d` raises (an unknown
            activation is a ValueError here, where causal-conv1d raises
            NotImplementedError).
        TypeError: a ``final_states_out`` of another dtype than x's, and the dtype rules of
            :func:`baracuda_torch.causal_depthwise_conv1d`.
    """
    if seq_idx is not None and return_final_states:
        raise ValueError(f"{_NAME}: return_final_states must be False when seq_idx is given "
                         "(the final states of packed sequences are not defined)")
    out, final_states = causal_depthwise_conv1d(x, weight, bias, seq_idx=seq_idx,
                                                initial_states=initial_states, activation=activation,
                                                return_final_states=True)
    if not return_final_states:
        return out
    if final_states_out is not None:
        if final_states_out.shape != final_states.shape:
            raise ValueError(f"{_NAME}: final_states_out must have shape {list(final_states.shape)} "
                             f"(batch, dim, width - 1), got {list(final_states_out.shape)}")
        if final_states_out.dtype != x.dtype:
            raise TypeError(f"{_NAME}: final_states_out must have x's dtype {x.dtype}, "
                            f"got {final_states_out.dtype}")
        final_states = final_states_out.copy_(final_states)
    return out, final_states


def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                         activation: Optional[str] = None, cache_seqlens: Optional[Tensor] = None,
                         conv_state_indices: Optional[Tensor] = None) -> Tensor:
    """causal-conv1d's ``causal_conv1d_update`` (``torch.ops.baracuda.causal_conv1d_update``):
    the conv of a decoding step, in place on ``conv_state``.

    Per batch row ``b`` and channel ``d``, with ``st = conv_state[i, d]`` (``i =
    conv_state_indices[b]``, or ``b``) and ``M = conv_state.size(2)``::

        x̃          = [st[M-(W-1)], ..., st[M-1], x[0], ..., x[L-1]]
        out[b, d, t] = act(bias[d] + Σ_k weight[d, k] · x̃[t + k])
        st         = the last M values of [st, x]               (shifted by L)

    With ``cache_seqlens`` the state is a circular buffer: the window is
    ``st[(c - (W-1) + j) mod M]`` and ``x[t]`` is written to ``st[(c + t) mod M]`` (a later
    step wins) with ``c = cache_seqlens[b]`` (mod M, the floor modulo).

    Args:
        x: ``(batch, dim)`` (one new step) or ``(batch, dim, seqlen)``, any strides.
        conv_state: ``(batch, dim, state_len)`` with ``state_len >= width - 1`` (mamba_ssm
            keeps ``width``), x's dtype, any strides; updated in place. With
            ``conv_state_indices``, a pool of any number of rows.
        weight: ``(dim, width)``, x's dtype or float32 (widths up to 8 on CUDA).
        bias: ``(dim,)``, weight's dtype, or None.
        activation: None, ``"silu"`` or ``"swish"``.
        cache_seqlens: ``(batch,)`` int32 or int64: the circular buffer's write position, or
            None.
        conv_state_indices: ``(batch,)`` int32 or int64: the pool row of each batch row, or
            None. A negative index marks a padding row (out 0, the pool untouched, as in
            causal-conv1d); an index past the pool raises IndexError on the CPU and gives
            NaN in that row's out on CUDA (a kernel cannot raise without synchronizing),
            the pool untouched.

    Returns:
        ``out``, x's shape and dtype, contiguous.

    Computed in float32 (float64 for float64 x), taps in order after the bias, rounded
    once; no allocation but ``out`` and no host synchronization (capturable in a CUDA
    graph). Not differentiable (a gradient raises NotImplementedError), as causal-conv1d's.

    Raises:
        ValueError: a shape that does not match (the message names the tensor, its shape
            and the expected one), ``state_len < width - 1``, an unknown activation
            (causal-conv1d raises NotImplementedError there).
        TypeError: non-floating x, conv_state not x's dtype, weight neither x's dtype nor
            float32, bias not weight's dtype, integer tensors neither int32 nor int64.
        IndexError: (CPU) an index past the pool.
        NotImplementedError: a width above 8 on CUDA.
        RuntimeError: tensors on different devices.
    """
    return torch.ops.baracuda.causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens,
                                                   conv_state_indices)
