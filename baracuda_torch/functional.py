"""Typed, documented wrappers over ``torch.ops.baracuda.*``.

Every function here is differentiable (its backward runs the matching ``*_backward``
op), works on CPU and CUDA tensors of float32, float16, bfloat16 and float64 (half types
compute in float32), accepts any strides, and traces under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

from typing import Literal, Optional, Sequence, Tuple, Union, overload

import torch
from torch import Tensor

__all__: list = []

# ---- gated activations ----------------------------------------------------------

__all__ += ["gated_activation", "glu", "reglu", "swiglu", "geglu"]

GatedKind = Literal["glu", "reglu", "swiglu", "geglu", "geglu_tanh"]


def gated_activation(x: Tensor, kind: GatedKind, dim: int = -1, gate_first: bool = False) -> Tensor:
    """Gated activation ``a * gate(b)`` where ``x`` splits along ``dim`` into halves ``(a, b)``.

    Args:
        x: input; ``x.size(dim)`` must be even.
        kind: ``"glu"`` (σ(b)), ``"reglu"`` (max(b, 0)), ``"swiglu"`` (b·σ(b)),
            ``"geglu"`` (exact GELU, b·Φ(b)) or ``"geglu_tanh"`` (tanh-approximated GELU).
        dim: the dimension to split (negative counts from the end).
        gate_first: if True the *first* half is the gate: ``gate(x1) * x2``, the
            ``silu(gate) * up`` convention of LLaMA-style fused gate/up projections.
            The default (False) is ``torch.nn.functional.glu``'s convention.

    Returns:
        A new contiguous tensor of ``x``'s shape with ``size(dim)`` halved.

    Raises:
        ValueError: odd ``x.size(dim)``, unknown ``kind``, 0-dim ``x``.
        IndexError: ``dim`` out of range.
        TypeError: non-floating ``x``.
    """
    return torch.ops.baracuda.gated_activation(x, kind, dim, gate_first)


def glu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """GLU: ``a * sigmoid(b)``, same as ``torch.nn.functional.glu(x, dim)``."""
    return gated_activation(x, "glu", dim, gate_first)


def reglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """ReGLU: ``a * relu(b)`` (NaN in ``b`` propagates, as in ``torch.relu``)."""
    return gated_activation(x, "reglu", dim, gate_first)


def swiglu(x: Tensor, dim: int = -1, gate_first: bool = False) -> Tensor:
    """SwiGLU: ``a * silu(b)``; with ``gate_first=True``, ``silu(gate) * up`` for ``x = [gate, up]``."""
    return gated_activation(x, "swiglu", dim, gate_first)


def geglu(x: Tensor, dim: int = -1, approximate: Literal["none", "tanh"] = "none",
          gate_first: bool = False) -> Tensor:
    """GeGLU: ``a * gelu(b)``; ``approximate`` as in ``torch.nn.functional.gelu``.

    Raises:
        ValueError: ``approximate`` other than ``"none"`` or ``"tanh"``.
    """
    if approximate == "none":
        return gated_activation(x, "geglu", dim, gate_first)
    if approximate == "tanh":
        return gated_activation(x, "geglu_tanh", dim, gate_first)
    raise ValueError(f"baracuda_torch.geglu: approximate must be 'none' or 'tanh', got {approximate!r}")


__all__ += ["gated_activation_pair"]


def gated_activation_pair(gate: Tensor, up: Tensor, kind: GatedKind = "swiglu") -> Tensor:
    """Gated activation of two separate tensors: ``act(gate) * up``.

    Exactly the feed-forward gate of Hugging Face models,
    ``act_fn(gate_proj(x)) * up_proj(x)``, in one pass without concatenating the
    projections::

        kind          result
        "swiglu"      silu(gate) * up
        "geglu"       gelu(gate) * up                      (exact, erf-based GELU)
        "geglu_tanh"  gelu(gate, approximate="tanh") * up
        "reglu"       relu(gate) * up                      (NaN in gate propagates)
        "glu"         sigmoid(gate) * up

    ``gate`` and ``up`` may have any strides (transposed, sliced, expanded with stride 0);
    the backward returns ``(dgate, dup)`` contiguous. Differentiable once (a second
    derivative raises ``NotImplementedError``).

    Args:
        gate: the tensor the activation is applied to; float32, float16, bfloat16 or
            float64 (half types compute in float32).
        up: the multiplier, with ``gate``'s shape, dtype and device.
        kind: the activation, see above.

    Returns:
        A new contiguous tensor of ``gate``'s shape and dtype.

    Raises:
        ValueError: ``gate`` and ``up`` of different shapes, unknown ``kind``.
        TypeError: non-floating ``gate``, or ``up`` of another dtype.
        RuntimeError: ``gate`` and ``up`` on different devices.

    Example::

        >>> h = baracuda_torch.gated_activation_pair(gate_proj(x), up_proj(x), "swiglu")
    """
    return torch.ops.baracuda.gated_activation_pair(gate, up, kind)


# ---- rope -------------------------------------------------------------------------

__all__ += ["rope", "rope_qk"]


def rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0, interleaved: bool = False,
         rotary_dim: int | None = None) -> Tensor:
    """Rotary position embedding (RoPE) of ``x`` ``[B, H, S, D]``.

    For ``R = rotary_dim`` (``D`` when None) and ``p_s = positions[s]`` (``positions[b, s]``
    for per-sequence positions; ``s`` when ``positions`` is None), each pair ``(u, v)`` of
    features is rotated by ``θ(s, i) = p_s · base^(−2i/R)``, ``i < R/2``::

        y_u = u·cos θ − v·sin θ        y_v = u·sin θ + v·cos θ

    The pairs are ``(i, i + R/2)`` with ``interleaved=False`` (the default: the
    ``rotate_half`` convention of LLaMA / GPT-NeoX / Hugging Face models) and ``(2i, 2i+1)``
    with ``interleaved=True`` (GPT-J, the original RoFormer). Features ``R..D-1`` pass through unchanged
    (partial rotary).

    ``x`` may have any strides: a ``[B, S, H, D]`` tensor passed as ``x.transpose(1, 2)``
    is read in place (no copy), and the result keeps ``x``'s memory layout whenever ``x``
    is non-overlapping and dense (so it is laid out ``[B, S, H, D]`` too); otherwise the
    result is contiguous. Differentiable to any order (the backward is the rotation by
    −θ; nothing is saved but ``positions``).

    Angles are computed in float64 and reduced before a float32 sin/cos (float64 for
    float64 data), so positions in the millions keep full float32 accuracy; the rotation
    is evaluated in float32 (float64 for float64).

    Args:
        x: ``[B, H, S, D]``, float32, float16, bfloat16 or float64.
        positions: optional int64 ``[S]`` or ``[B, S]`` (any strides, on ``x``'s
            device); negative values are allowed.
        base: the frequency base, finite and > 0.
        interleaved: pair layout, see above.
        rotary_dim: number of rotated features ``R`` (even, ``0 < R <= D``); None for all
            (then ``D`` must be even).

    Returns:
        A new tensor of ``x``'s shape and dtype.

    Raises:
        ValueError: ``x`` not 4-D, bad ``rotary_dim``, odd ``D`` with ``rotary_dim=None``,
            ``base`` not finite and positive, ``positions`` of the wrong shape.
        TypeError: non-floating ``x``, ``positions`` not int64.
        RuntimeError: ``positions`` on another device.

    Example::

        >>> q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
        >>> q_rot = baracuda_torch.rope(q)   # LLaMA-style (half-split pairs)
    """
    return torch.ops.baracuda.rope(x, positions, float(base), interleaved,
                                   -1 if rotary_dim is None else rotary_dim)


def rope_qk(q: Tensor, k: Tensor, positions: Tensor | None = None, base: float = 10000.0,
            interleaved: bool = False, rotary_dim: int | None = None) -> tuple[Tensor, Tensor]:
    """RoPE of queries and keys with the same angles, the usual model-side call:
    ``(rope(q, ...), rope(k, ...))``.

    ``q`` is ``[B, Hq, S, D]`` and ``k`` ``[B, Hk, S, D]``: head counts may differ
    (grouped-query attention), batch, sequence length and head dim may not. Everything
    else is as in :func:`rope`.

    Raises:
        ValueError: ``q`` and ``k`` (both 4-D) differ in ``B``, ``S`` or ``D``; and
            everything :func:`rope` raises.
    """
    if q.dim() == 4 and k.dim() == 4 and (q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]
                                          or q.shape[3] != k.shape[3]):
        raise ValueError("baracuda_torch.rope_qk: q [B, Hq, S, D] and k [B, Hk, S, D] must agree "
                         f"in B, S and D, got {list(q.shape)} and {list(k.shape)}")
    return (rope(q, positions, base, interleaved, rotary_dim),
            rope(k, positions, base, interleaved, rotary_dim))



# ---- rope from given cos/sin tables ------------------------------------------------

__all__ += ["rope_cos_sin", "rope_qk_cos_sin", "apply_rotary_pos_emb"]


def _as_op_table(t: Tensor, name: str, what: str) -> Tensor:
    """cos/sin as the op takes them: ``[S, R/2]`` or ``[Bc, S, R]``; a Hugging Face table
    already unsqueezed to ``[Bc, 1, S, R]`` loses its head dim."""
    if t.dim() == 4 and t.shape[1] == 1:
        return t.squeeze(1)
    if t.dim() not in (2, 3):
        raise ValueError(f"baracuda_torch.{name}: {what} must be [S, R/2], [1 or B, S, R] or "
                         f"[1 or B, 1, S, R], got shape {list(t.shape)}")
    return t


def rope_cos_sin(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotary position embedding of ``x`` ``[B, H, S, D]`` with caller-given ``cos``/``sin``.

    Two table layouts, told apart by rank:

    * ``[1 or B, S, R]`` (Hugging Face: one entry per feature, ``cat(freqs, freqs)`` for
      half-split pairs, ``repeat_interleave(freqs, 2)`` for interleaved ones; a
      ``[1 or B, 1, S, R]`` table is accepted too). The result is exactly
      ``x·cos + rotate(x)·sin`` on the first ``R`` features, for any table values.
    * ``[S, R/2]`` (flash-attention: one entry per pair).

    Pairs are ``(i, i + R/2)`` (``interleaved=False``, ``rotate_half``) or ``(2i, 2i+1)``;
    features ``R..D-1`` pass through (partial rotary). ``x`` may have any strides (a
    ``[B, S, H, D]`` tensor passed as ``.transpose(1, 2)`` is read in place and the result
    keeps that layout). ``cos``/``sin`` are float32 or ``x``'s dtype (math in float32,
    float64 for float64 data). Differentiable in ``x`` to any order, and in ``cos``/``sin``
    when they require grad.

    Raises:
        ValueError: ``x`` not 4-D, or cos/sin of a shape that does not match ``x``.
        TypeError: non-floating ``x``, cos/sin neither float32 nor ``x``'s dtype, or of
            different dtypes.
        RuntimeError: operands on different devices.
    """
    return torch.ops.baracuda.rope_cos_sin(x, _as_op_table(cos, "rope_cos_sin", "cos"),
                                           _as_op_table(sin, "rope_cos_sin", "sin"), interleaved)


def rope_qk_cos_sin(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                    interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`rope_cos_sin` of queries ``[B, Hq, S, D]`` and keys ``[B, Hk, S, D]`` (head
    counts may differ: grouped-query attention) in one kernel launch. Returns
    ``(q_embed, k_embed)``."""
    return torch.ops.baracuda.rope_qk_cos_sin(q, k, _as_op_table(cos, "rope_qk_cos_sin", "cos"),
                                              _as_op_table(sin, "rope_qk_cos_sin", "sin"),
                                              interleaved)


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                         position_ids: Tensor | None = None,
                         unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Drop-in for Hugging Face transformers' ``apply_rotary_pos_emb`` (LLaMA family):
    ``(q·cos + rotate_half(q)·sin, k·cos + rotate_half(k)·sin)`` in one fused launch.

    Args:
        q: ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``unsqueeze_dim=2``).
        k: the same layout with ``Hk`` heads.
        cos, sin: ``[B or 1, S, R]`` as the model's rotary embedding returns them (``R <=
            D``; features past ``R`` pass through), or ``[S, R]``.
        position_ids: kept from older transformers signatures: when given, ``cos`` and
            ``sin`` are ``[max_positions, R]`` tables indexed by it (``cos[position_ids]``).
        unsqueeze_dim: 1 for ``[B, H, S, D]`` heads-first tensors, 2 for ``[B, S, H, D]``.

    Returns:
        ``(q_embed, k_embed)`` in the inputs' layout.

    Raises:
        ValueError: bad ``unsqueeze_dim``, or cos/sin shapes that do not match ``q``/``k``.
    """
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    if unsqueeze_dim not in (1, 2, -3, -2) or q.dim() != 4:
        raise ValueError("baracuda_torch.apply_rotary_pos_emb: q and k must be 4-D with "
                         "unsqueeze_dim 1 ([B, H, S, D]) or 2 ([B, S, H, D]), got q of shape "
                         f"{list(q.shape)} and unsqueeze_dim={unsqueeze_dim}")
    if cos.dim() == 2:  # [S, R]: one table for every batch
        cos, sin = cos[None], sin[None]
    if cos.dim() != 3 or sin.shape != cos.shape:
        raise ValueError("baracuda_torch.apply_rotary_pos_emb: cos and sin must both be "
                         f"[B or 1, S, R] or [S, R], got {list(cos.shape)} and {list(sin.shape)}")
    heads_first = unsqueeze_dim in (1, -3)
    seq = q.size(2 if heads_first else 1)
    if cos.size(1) == 1 and seq != 1:  # one position's table broadcast over the sequence
        cos, sin = cos.expand(-1, seq, -1), sin.expand(-1, seq, -1)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    fits = (k.dim() == 4 and cos.size(1) == seq and cos.size(0) in (1, q.size(0))
            and k.size(0) == q.size(0) and k.size(2 if heads_first else 1) == seq)
    if not fits and _broadcasts(q.shape, c.shape) and _broadcasts(k.shape, c.shape):
        # another broadcast transformers' formula allows (q or k taking the table's batch or
        # length): that formula as it is, with its result shape. Shapes that broadcast
        # nowhere go on to the op, whose error names them.
        from .reference import rotate_half
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    if not heads_first:
        qe, ke = torch.ops.baracuda.rope_qk_cos_sin(q.transpose(1, 2), k.transpose(1, 2), cos,
                                                     sin, False)
        return qe.transpose(1, 2), ke.transpose(1, 2)
    return torch.ops.baracuda.rope_qk_cos_sin(q, k, cos, sin, False)


# ---- lerp -------------------------------------------------------------------------

__all__ += ["lerp"]


def lerp(a: Tensor, b: Tensor, weight: float | Tensor) -> Tensor:
    """Linear interpolation ``a + weight * (b - a)``, as ``torch.lerp(a, b, weight)``.

    Evaluated with PyTorch's two-branch form, exact at both ends and free of the
    cancellation of ``a + w·(b − a)`` near ``w = 1``::

        |w| < 0.5 ?  a + w·(b − a)  :  b − (b − a)·(1 − w)

    in float32 (float64 for float64 data). Weights outside ``[0, 1]`` extrapolate.

    Args:
        a: start values.
        b: end values; ``a`` and ``b`` broadcast against each other (NumPy rules).
        weight: a Python number (no gradient flows to it), or a tensor that broadcasts
            with ``a`` and ``b`` and receives the gradient ``dy·(b − a)``, summed down
            to its own shape.

    Gradients: ``da = (1 − w)·dy`` and ``db = w·dy`` (and ``dw``), computed by one
    kernel in one pass and summed down to each input's shape where it was broadcast.
    With a scalar weight the second derivative is supported too.

    Returns:
        A new contiguous tensor of the broadcast shape and the inputs' dtype.

    Raises:
        ValueError: shapes that do not broadcast.
        TypeError: a non-floating dtype, or inputs of different dtypes.
        RuntimeError: inputs on different devices.
    """
    if isinstance(weight, Tensor):
        return torch.ops.baracuda.lerp.Tensor(a, b, weight)
    return torch.ops.baracuda.lerp.default(a, b, float(weight))


# ---- gather -----------------------------------------------------------------------

__all__ += ["gather", "check_errors", "set_index_checks"]

from . import _C as _gather_C  # noqa: E402  (check_errors / set_index_checks live in _C)


def gather(src: Tensor, dim: int, index: Tensor) -> Tensor:
    """``torch.gather``: ``out[i][j][k] = src[index[i][j][k]][j][k]`` for ``dim=0`` (and so on).

    Args:
        src: float32, float16, bfloat16 or float64; any strides.
        dim: the dimension to index along (negative counts from the end).
        index: int32 or int64, with as many dims as ``src``; ``index.size(d) <= src.size(d)``
            for every ``d != dim``; any strides (expanded indices too). A 0-dim tensor
            counts as 1-d of size 1, as in ``torch.gather``.

    Returns:
        A new contiguous tensor of ``index``'s shape and ``src``'s dtype. Its backward
        scatter-adds the gradient into zeros of ``src``'s shape (``gather_backward``); on
        CUDA, under the ``"deterministic"`` preference or
        ``torch.use_deterministic_algorithms(True)`` it runs a sort-based kernel that gives
        the same bits on every run, otherwise a faster atomic one (see :func:`explain`).
        No gradient flows to ``index``. Double backward works.

    Raises:
        IndexError: ``dim`` out of range; an index outside ``[0, src.size(dim))``
            (negative ones too). No memory is ever read or written with a bad index.
            On the CPU it is raised by this call. On CUDA the kernel writes 0 for that
            output element (the backward skips it), records the first bad index on the
            device, and the ``IndexError`` surfaces, with the same message, at the start
            of the next ``gather``/``gather_backward`` call on that device once the bad
            kernel has finished, or from :func:`check_errors`, which synchronizes first.
            After :func:`set_index_checks` ``("sync")`` this call raises it itself. The
            CUDA context stays usable either way.
        ValueError: ``index`` with another number of dims than ``src``, or larger than
            ``src`` in a dim other than ``dim``.
        TypeError: a non-integer (or other integer) ``index``, or a non-floating ``src``.
    """
    return torch.ops.baracuda.gather(src, dim, index)


def check_errors(device: "torch.device | str | int | None" = None) -> None:
    """Raise the out-of-range index a CUDA gather kernel recorded, if any.

    Synchronizes ``device`` (default: the current CUDA device), then raises
    ``IndexError("baracuda::gather: index 12 is out of bounds for dim 1 with size 8 ...")``
    (or ``baracuda::gather_backward: ...``) for the first bad index met since the last
    report, and clears it. Returns quietly when nothing was recorded, when CUDA is not
    initialized, or in a build without CUDA. CPU ops raise at once and never record.
    """
    d = None
    if device is not None:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"baracuda_torch.check_errors: device must be a CUDA device, got {d}")
    if not (_gather_C.with_cuda and torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    index = d.index if d is not None and d.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    _gather_C.gather_check_errors(index)


def set_index_checks(mode: Literal["async", "sync"]) -> None:
    """When an out-of-range index in a CUDA ``gather``/``gather_backward`` raises.

    ``"async"`` (the default): without any synchronization, at the start of the next
    gather op on that device once the bad kernel has finished, or from
    :func:`check_errors`. ``"sync"``: each CUDA gather op synchronizes its stream after
    the launch and raises ``IndexError`` itself (skipped while the stream is captured into
    a CUDA graph, where the error surfaces as in ``"async"`` mode). Raises ``ValueError``
    for any other mode.
    """
    _gather_C.set_index_checks(mode)


# ---- rms_norm ---------------------------------------------------------------------

__all__ += ["rms_norm", "rms_norm_like", "rms_norm_convention"]

RmsNormConvention = Literal["torch", "llama", "gemma"]


@overload
def rms_norm(input: Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[Tensor] = None,
             eps: Optional[float] = None, *, convention: RmsNormConvention = "torch",
             residual: None = None) -> Tensor: ...


@overload
def rms_norm(input: Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[Tensor] = None,
             eps: Optional[float] = None, *, convention: RmsNormConvention = "torch",
             residual: Tensor) -> Tuple[Tensor, Tensor]: ...


def rms_norm(input: Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[Tensor] = None,
             eps: Optional[float] = None, *, convention: RmsNormConvention = "torch",
             residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Root-mean-square normalization over the last ``len(normalized_shape)`` dims, as
    ``torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)`` (same arguments),
    in one pass (forward and backward), optionally after a fused residual add.

    With ``h = input`` (or ``h = input + residual`` in input's dtype, as a decoder layer
    adds them) and ``n = h · rsqrt(mean(h²) + eps)`` computed in float32 (float64 for
    float64 input)::

        convention   result                                  matches
        "torch"      (n · weight).to(input.dtype)            torch.nn.RMSNorm, F.rms_norm
        "llama"      weight · n.to(input.dtype)               transformers' LlamaRMSNorm
                     (in the promoted dtype of input and      (Mistral, Qwen2/3 and most
                     weight: float32 for a float32 weight     other HF models)
                     and 16-bit input)
        "gemma"      (n · (1 + weight)).to(input.dtype)       transformers' GemmaRMSNorm

    Without a weight every convention gives ``n.to(input.dtype)``. ``eps=None`` is the
    machine epsilon of the compute dtype (float32's for float32/float16/bfloat16 input,
    float64's for float64), as in torch. Float64 input is normalized in float64 whatever
    the convention (transformers' modules compute in float32).

    Differentiable once (gradients for input, residual and weight; a second derivative
    raises ``NotImplementedError``); the weight's gradient is summed in a fixed order
    (bitwise reproducible). Any strides (the last dim's too), every float dtype.

    Args:
        input: ``[*, *normalized_shape]``; float32, float16, bfloat16 or float64.
        normalized_shape: the trailing shape to normalize over (an int for the last dim).
        weight: ``normalized_shape``-shaped scale (input's dtype or float32), or None.
        eps: added to the mean square; None for the machine epsilon (see above).
        convention: ``"torch"``, ``"llama"`` or ``"gemma"`` (see above).
        residual: a tensor of input's shape and dtype to add first; then the result is
            ``(y, h)`` with ``h = input + residual`` (the next residual stream).

    Returns:
        ``y`` (input's shape; input's dtype except as noted for "llama"), or ``(y, h)``
        with a residual.

    Raises:
        ValueError: ``normalized_shape`` not the trailing shape of input, a weight of
            another shape, a residual of another shape, eps negative or not finite, an
            unknown convention, a 0-dim input.
        TypeError: non-floating input, a weight other than input's dtype or float32, a
            residual of another dtype.
        RuntimeError: tensors on different devices.

    Example::

        >>> y = baracuda_torch.rms_norm(x, (4096,), weight, 1e-6, convention="llama")
        >>> y, h = baracuda_torch.rms_norm(attn_out, (4096,), weight, 1e-6, residual=h)
    """
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.dim() < k or tuple(input.shape[input.dim() - k:]) != shape:
        raise ValueError(f"baracuda_torch.rms_norm: normalized_shape {list(shape)} must be the "
                         f"trailing shape of input, got input of shape {list(input.shape)}")
    if weight is not None and tuple(weight.shape) != shape:
        raise ValueError(f"baracuda_torch.rms_norm: weight must have shape normalized_shape "
                         f"{list(shape)}, got {list(weight.shape)}")
    x, r, w = input, residual, weight
    if k > 1:  # one normalized dim for the op
        x = input.flatten(-k)
        r = residual.flatten(-k) if residual is not None and residual.dim() >= k else residual
        w = weight.flatten() if weight is not None else None
    if residual is None:
        y, _ = torch.ops.baracuda.rms_norm(x, w, eps, convention)
        return y.view(input.shape) if k > 1 else y
    y, h, _ = torch.ops.baracuda.add_rms_norm(x, r, w, eps, convention)
    return (y.view(input.shape), h.view(input.shape)) if k > 1 else (y, h)


def rms_norm_convention(module: torch.nn.Module) -> Tuple[RmsNormConvention, Optional[float], Tuple[int, ...]]:
    """``(convention, eps, normalized_shape)`` of an RMSNorm module whose computation
    :func:`rms_norm` reproduces: ``torch.nn.RMSNorm``, :class:`baracuda_torch.nn.RMSNorm`,
    or a transformers module whose ``forward`` is the code of ``LlamaRMSNorm`` ("llama":
    Llama, Mistral, Qwen2, Qwen3, ... every copy of it) or of ``GemmaRMSNorm`` ("gemma":
    Gemma, Gemma 2, Gemma 3, ...). Raises ``ValueError`` naming the class otherwise (other
    RMSNorm variants compute something else: rather no answer than a wrong one)."""
    from . import nn as bnn

    if isinstance(module, bnn.RMSNorm):
        return module.convention, module.eps, tuple(module.normalized_shape)
    if type(module) is torch.nn.RMSNorm:
        return "torch", module.eps, tuple(module.normalized_shape)
    for convention, reference, eps_name, methods in _hf_rms_norms():
        if all(_same_code(getattr(type(module), m, None), getattr(reference, m)) for m in methods):
            weight = module.weight
            return convention, float(getattr(module, eps_name)), tuple(weight.shape)
    raise ValueError(f"baracuda_torch.rms_norm_convention: {type(module).__name__} is not an RMSNorm "
                     "whose computation baracuda reproduces (torch.nn.RMSNorm, or transformers' "
                     "LlamaRMSNorm or GemmaRMSNorm code)")


def rms_norm_like(module: torch.nn.Module, input: Tensor, *,
                  residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """What ``module(input)`` computes (``module(input + residual)`` with a residual,
    returned with ``h = input + residual`` as ``(y, h)``), as one :func:`rms_norm` call, for
    any module :func:`rms_norm_convention` recognizes, with the module's own weight and eps
    (so its weight receives the gradient).

    Example::

        >>> layer = model.model.layers[0]
        >>> y = baracuda_torch.rms_norm_like(layer.input_layernorm, hidden_states)
    """
    convention, eps, shape = rms_norm_convention(module)
    return rms_norm(input, shape, getattr(module, "weight", None), eps, convention=convention,
                    residual=residual)


def _same_code(f, g) -> bool:
    """Whether two functions run the same bytecode on the same names and constants."""
    a, b = getattr(f, "__code__", None), getattr(g, "__code__", None)
    return a is not None and b is not None and (a.co_code, a.co_consts, a.co_names, a.co_varnames) == (
        b.co_code, b.co_consts, b.co_names, b.co_varnames)


def _hf_rms_norms() -> list:
    """(convention, transformers' reference class, its eps attribute, the methods that
    define the computation); empty without transformers."""
    try:
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return []
    return [("llama", LlamaRMSNorm, "variance_epsilon", ("forward",)),
            ("gemma", GemmaRMSNorm, "eps", ("forward", "_norm"))]


# ---- gated_rms_norm ---------------------------------------------------------------

__all__ += ["gated_rms_norm"]


def gated_rms_norm(x: Tensor, weight: Tensor, z: Optional[Tensor] = None, eps: float = 1e-6,
                   group_size: Optional[int] = None, norm_before_gate: bool = True, *,
                   bias: Optional[Tensor] = None) -> Tensor:
    """The gated RMSNorm of a Mamba-2 layer (mamba_ssm's ``rmsnorm_fn``; the same
    function under mamba_ssm's names and signatures is in
    :mod:`baracuda_torch.layernorm_gated`), forward and backward in one pass each.

    The last dim's N channels split into groups of ``group_size`` (all N when None), each
    normalized by its own ``rstd = rsqrt(mean(h²) + eps)``, in float32 (float64 for
    float64 x)::

        norm_before_gate=True:   h = x,            y = (h·rstd·weight + bias) · silu(z)
        norm_before_gate=False:  h = x · silu(z),  y = h·rstd·weight + bias

    without z, ``y = h·rstd·weight + bias`` with ``h = x``; y is cast once to x's dtype
    (:func:`baracuda_torch.reference.gated_rms_norm` states it in PyTorch, its first
    output).

    Differentiable once (x, weight, z, bias; a second derivative raises
    ``NotImplementedError``). The backward reuses the forward's per-group rstd (saved with
    x, z, weight and bias) and sums the weight's and bias's gradients per fixed block of
    rows, then over the blocks in order (bitwise reproducible). Any strides, every float
    dtype.

    Args:
        x: ``[*, N]``; float32, float16, bfloat16 or float64.
        weight: ``[N]``, x's dtype or float32.
        z: the gate, x's shape and dtype, or None.
        eps: added to each group's mean square; finite and >= 0.
        group_size: channels a group (>= 1, dividing N), or None for one group.
        norm_before_gate: normalize, then gate (True), or gate, then normalize.
        bias: ``[N]``, the weight's dtype, or None (keyword only: mamba_ssm's RMSNorm
            module has none).

    Returns:
        ``y``, contiguous, x's shape and dtype.

    Raises:
        ValueError: a weight, bias or z of another shape, group_size < 1 or not dividing
            N, eps negative or not finite, a 0-dim x.
        TypeError: non-floating x, a weight other than x's dtype or float32, a bias
            other than the weight's dtype, a z other than x's dtype.
        NotImplementedError: more than 8 dims.
        RuntimeError: tensors on different devices.

    Example::

        >>> y = baracuda_torch.gated_rms_norm(y, norm.weight, z, 1e-5, group_size=d_ssm // ngroups,
        ...                                    norm_before_gate=False)
    """
    return torch.ops.baracuda.gated_rms_norm(x, weight, bias, z, eps, group_size, norm_before_gate)[0]


# ---- causal conv1d ---------------------------------------------------------------

__all__ += ["causal_depthwise_conv1d"]

ConvActivation = Optional[Literal["silu", "swish"]]


@overload
def causal_depthwise_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                            seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                            activation: ConvActivation = None,
                            return_final_states: Literal[False] = False) -> Tensor: ...


@overload
def causal_depthwise_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                            seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                            activation: ConvActivation = None,
                            return_final_states: Literal[True]) -> Tuple[Tensor, Tensor]: ...


def causal_depthwise_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
                            seq_idx: Optional[Tensor] = None, initial_states: Optional[Tensor] = None,
                            activation: ConvActivation = None,
                            return_final_states: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Causal depthwise conv1d over time with an optional SiLU: the causal-conv1d package's
    ``causal_conv1d_fn`` (the conv of Mamba and Mamba-2 layers), forward and backward fused.
    :func:`baracuda_torch.causal_conv1d.causal_conv1d_fn` has that function's exact signature
    and return convention.

    Per batch ``b``, channel ``d`` and step ``t``, with ``x̃`` = x at times ``>= 0`` and
    ``initial_states[b, d, τ + W - 1]`` (or 0) at ``τ < 0``::

        out[b, d, t] = act(bias[d] + Σ_k weight[d, k] · x̃[b, d, t - (W-1) + k])

    (tap ``W - 1`` multiplies the current step). With ``seq_idx``, a tap counts only when
    its step has ``seq_idx[b, t]`` (so no tap reads another packed sequence, nor time < 0),
    and a step with ``seq_idx < 0`` (padding) gives 0. ``act`` is SiLU for ``"silu"`` or
    ``"swish"``, the identity for None. Computed in float32 (float64 for float64 x), taps
    in order, rounded once to x's dtype.

    Args:
        x: ``[B, D, L]``, any strides: the channel-last view of a projection's slice
            (``t[..., a:b].transpose(1, 2)`` of a ``[B, L, D']`` tensor) is read in place.
        weight: ``[D, W]`` (``conv1d.weight.squeeze(1)``), x's dtype or float32. Width 2 to
            4 on CUDA; any width >= 1 on the CPU.
        bias: ``[D]``, weight's dtype, or None.
        seq_idx: ``[B, L]`` int32 ids of the packed sequences, or None.
        initial_states: ``[B, D, W - 1]`` in x's dtype (the inputs before time 0), or None;
            not together with ``seq_idx``.
        activation: None, ``"silu"`` or ``"swish"``.
        return_final_states: also return ``final_states [B, D, W - 1]``, the last ``W - 1``
            inputs (initial states where L < W - 1): the conv state a decoder continues
            from. Its gradient flows back into x (and initial_states).

    Returns:
        ``out`` (x's shape and dtype, in x's memory layout: channel-last in, channel-last
        out), or ``(out, final_states)`` (final_states channel-last, as causal-conv1d
        allocates it).

    Differentiable once (x, weight, bias, initial_states; dweight and dbias summed in a
    fixed order: bitwise reproducible); a second derivative raises NotImplementedError.

    Raises:
        ValueError: x not 3-d, a shape that does not match (the message names the tensor,
            its shape and the expected one), ``initial_states`` with ``seq_idx``, an
            unknown activation.
        TypeError: non-floating x, a weight other than x's dtype or float32, a bias other
            than weight's dtype, initial_states other than x's dtype, seq_idx not int32.
        NotImplementedError: a width outside 2 to 4 on CUDA.
        RuntimeError: tensors on different devices.
    """
    out, final_states = torch.ops.baracuda.causal_conv1d(x, weight, bias, seq_idx, initial_states,
                                                         activation)
    return (out, final_states) if return_final_states else out


# ---- ssd_chunk_scan ---------------------------------------------------------------

__all__ += ["ssd_chunk_scan"]


def ssd_chunk_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   chunk_size: int = 256) -> Tensor:
    """Mamba-2's selective state-space scan (SSD), forward and backward fused.

    For each batch ``b`` and head ``h`` (reading B/C group ``g = h // (H // G)``), with a
    ``D × N`` state ``h_{-1} = 0``::

        decay_t = exp(dt_t · A_h)
        h_t     = decay_t · h_{t-1} + dt_t · x_t ⊗ B_t        # [D, N]
        y_t[d]  = Σ_n C_t[n] · h_t[d, n]

    This is ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size)`` of the
    ``mamba_ssm`` package without its options (and without its clamp of a negative dt
    to 0: dt is used as given); :func:`baracuda_torch.mamba.mamba_chunk_scan_combined`
    takes them all (D, z, dt_bias, dt_softplus, dt_limit, initial and final states,
    seq_idx), and :class:`baracuda_torch.mamba.Mamba2` is the whole layer.

    Args:
        x: ``[B, L, H, D]`` inputs per head.
        dt: ``[B, L, H]`` step sizes, usually positive (``softplus(dt_raw + dt_bias)``).
        A: ``[H]`` per-head decay rates, usually negative (``-exp(A_log)``), so that
            ``decay_t`` lies in ``(0, 1]``.
        B: ``[B, L, G, N]`` input projections of the state, ``H % G == 0``; ``G = 1``
            (one B shared by every head) is Mamba-2's usual layout, ``G = H`` gives
            every head its own.
        C: ``[B, L, G, N]`` output projections, B's shape.
        chunk_size: the chunk length Q of the CUDA kernel's chunked
            (state-space-duality) algorithm: any value ``>= 1``; 64, 128 and 256 are
            the fast ones. It does not change the function computed, only the order of
            the floating-point operations on CUDA (the CPU computes the recurrence
            step by step whatever Q).

    Returns:
        ``y`` of shape ``[B, L, H, D]``, contiguous, in the inputs' dtype.

    Every tensor must have one floating dtype (float32, float16, bfloat16 or
    float64) and be on one device; any strides are accepted without a copy (for
    example x, B, C and dt as slices of one input projection). On CUDA, states and
    accumulation are float32 (float64 for float64 inputs) and D, N <= 256; for
    float16/bfloat16 inputs the chunk products run on tensor cores with operands in the
    input dtype (the decay-weighted products and chunk states are rounded to it, as in
    mamba_ssm), accumulating in float32 (variant ``chunked_mma``); the CPU
    computes in float64 for every dtype, with no limit on D and N. Both are
    deterministic (the same bits on every run, the backward included) and the
    backward keeps O(B·H·⌈L/Q⌉·D·N) memory (states at chunk boundaries). Gradients
    flow to all five inputs; double backward is not implemented.
    ``baracuda_torch.explain("ssd_chunk_scan", x, dt, A, B, C, chunk_size)`` tells
    which kernel runs and its workspace.

    Raises:
        ValueError: a shape that does not match (the message names the tensor, its
            shape and the expected one), ``H % G != 0``, ``chunk_size < 1``.
        TypeError: a non-floating tensor, or tensors of different dtypes.
        RuntimeError: tensors on different devices.
        NotImplementedError: D or N above 256 on CUDA.
    """
    return torch.ops.baracuda.ssd_chunk_scan(x, dt, A, B, C, chunk_size)



# ---- selective state update (Mamba decoding) ------------------------------------------

__all__ += ["selective_state_update", "selective_state_update_tokens"]


def selective_state_update(state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                           D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                           dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
                           state_batch_indices: Optional[Tensor] = None) -> Tensor:
    """One decoding step of a Mamba (Mamba-2) SSM: mamba_ssm's ``selective_state_update``
    (same arguments, defaults and return convention), updating ``state`` in place.

    Per batch row ``b``, head ``h`` (reading B/C group ``g = h // (H // G)``) and row
    ``p`` of the head, with ``s = state[i, h, p, :]`` (``i = state_batch_indices[b]``, or
    ``b``)::

        δ    = dt[b, h, p] + dt_bias[h, p];  δ = softplus(δ) where δ <= 20 (dt_softplus)
        s    = exp(A[h, p, :] · δ) · s + B[b, g, :] · (δ · x[b, h, p])     # written back
        y    = Σ_n s[n] · C[b, g, n] + D[h, p] · x[b, h, p]
        out  = y · silu(z[b, h, p])   (with z)

    Args:
        state: ``[S, H, P, N]`` (or ``[S, P, N]``: one head), float32 or x's dtype;
            updated in place. ``S`` is the batch, or the size of a state pool that
            ``state_batch_indices`` indexes. Any strides.
        x: ``[B, H, P]`` (or ``[B, P]`` when H = 1), float32, float16, bfloat16 or float64.
        dt: x's shape (Mamba-2 passes ``[B, H]`` expanded over P), float32 or x's dtype.
        A: ``[H, P, N]`` (or ``[P, N]``), float32 or x's dtype; Mamba-2's per-head ``A``
            expanded with stride 0 takes one exp per row and step.
        B, C: ``[B, G, N]`` (or ``[B, N]``: G = 1), H % G == 0, float32 or x's dtype.
        D: ``[H, P]`` (or ``[P]``), float32 or x's dtype, or None.
        z: x's shape and dtype, or None.
        dt_bias: ``[H, P]`` (or ``[P]``), float32 or x's dtype, or None.
        dt_softplus: apply softplus to ``dt + dt_bias``.
        state_batch_indices: ``[B]`` int32 or int64, the pool row of each batch row, or
            None (then ``S == B``). A negative index marks a padding row: its ``out`` is 0
            and the pool is not touched (mamba_ssm's rule). An index ``>= S`` raises
            IndexError on the CPU (nothing is written); a CUDA kernel cannot raise without
            synchronizing, so it writes NaN to that row's ``out`` and leaves the pool
            alone. Two rows naming one pool row race (undefined, as in mamba_ssm).

    Returns:
        ``out``: ``[B, H, P]`` for a 4-d state, ``[B, P]`` for a 3-d one, x's dtype,
        contiguous.

    Computed in float32 (float64 for float64 x), the sum over N in a fixed order
    (deterministic); ``out`` rounded once to x's dtype, the state once to its dtype. On
    CUDA one block per (batch, head, slice of P) reads each state row once and writes it
    once, with no allocation and no host synchronization (capturable in a CUDA graph);
    N up to 1024 there. Not differentiable (an inference op, as mamba_ssm's): a backward
    through ``out`` raises NotImplementedError, and so does a ``state`` that requires
    grad while grad mode is on.

    Raises:
        ValueError: a shape that does not match (the message names the tensor, its shape
            and the expected one), ``H % G != 0``, ``state.size(0) != B`` without indices.
        TypeError: non-floating x or state, a state or small operand neither float32 nor
            x's dtype, z not x's dtype, indices neither int32 nor int64.
        IndexError: (CPU) an index ``>= S``.
        NotImplementedError: N above 1024 on CUDA; a gradient.
        RuntimeError: tensors on different devices.
    """
    return torch.ops.baracuda.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias,
                                                     dt_softplus, state_batch_indices)


def selective_state_update_tokens(state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor,
                                  C: Tensor, D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                                  dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
                                  state_batch_indices: Optional[Tensor] = None) -> Tensor:
    """:func:`selective_state_update` over ``T`` new tokens at once (speculative decoding,
    a short continuation): x, dt and z ``[B, T, H, P]`` (or ``[B, T, P]``), B and C
    ``[B, T, G, N]`` (or ``[B, T, N]``), the other arguments as there. The tokens run in
    order; returns every token's ``out`` ``[B, T, H, P]`` (``[B, T, P]`` for a 3-d state)
    and leaves in ``state`` the state after the last token (T = 0: unchanged). The state
    row stays in float32 registers between tokens (read once, written once); on a float32
    state the result equals T calls of :func:`selective_state_update` bit for bit. A
    padding row (negative index) gives 0 for every token. Raises what
    :func:`selective_state_update` raises."""
    return torch.ops.baracuda.selective_state_update_tokens(state, x, dt, A, B, C, D, z, dt_bias,
                                                            dt_softplus, state_batch_indices)
