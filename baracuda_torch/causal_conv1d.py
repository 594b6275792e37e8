"""The causal-conv1d package's Python API on baracuda's kernels, so that its users switch
by import::

    from baracuda_torch.causal_conv1d import causal_conv1d_fn   # was: from causal_conv1d import ...

:func:`causal_conv1d_fn` takes the same arguments with the same defaults and returns what
causal-conv1d returns (``out``, or ``(out, final_states)``), on CPU and CUDA tensors of
every float dtype and any strides (causal-conv1d requires channel-last x for seq_idx,
initial_states and final states, and ``dim % 8 == 0`` there; baracuda does not). The
computation is :func:`baracuda_torch.causal_depthwise_conv1d` (``torch.ops.baracuda.causal_conv1d``).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

from torch import Tensor

from .functional import causal_depthwise_conv1d

__all__ = ["causal_conv1d_fn"]

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
