"""The peer libraries the benchmarks compare against, when they are present.

``scripts/peers.sh fetch`` downloads them into the git-ignored ``peers/`` folder and
``scripts/peers.sh install`` unpacks them into ``peers/site`` (on the GPU machine, which
has no network); this module puts that folder on ``sys.path``. The package itself never
imports a peer. Each loader returns None when its peer is missing or cannot load (no
Triton, no GPU), so a benchmark simply has fewer providers.

Providers: ``mamba_ssm`` (its Triton ``mamba_chunk_scan_combined``,
``selective_state_update`` and gated RMSNorm ``rmsnorm_fn``), ``causal_conv1d`` (the
causal-conv1d package's ``causal_conv1d_fn`` and ``causal_conv1d_update``, a compiled CUDA
extension: ``scripts/peers.sh build-causal-conv1d`` builds its wheel for the GPU machine
and ``install`` unpacks it; used where it imports), ``liger``
(Liger-Kernel's SwiGLU/GeGLU and HF-layout RoPE), ``flash_attn`` (flash-attention's
Triton rotary kernel, ``[B, S, H, D]`` input and ``[S, R/2]`` cos/sin).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable, Optional

import torch

SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peers", "site")
if os.path.isdir(SITE) and SITE not in sys.path:
    sys.path.append(SITE)


def _try(load: Callable[[], object]) -> Optional[object]:
    try:
        return load()
    except Exception as e:  # a missing peer, or one that cannot load here
        print(f"peers: {load.__name__} unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return None


@functools.lru_cache(None)
def mamba_chunk_scan_combined() -> Optional[Callable]:
    def mamba_ssm():
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as f
        return f
    return _try(mamba_ssm)


@functools.lru_cache(None)
def mamba_rmsnorm_fn() -> Optional[Callable]:
    """mamba_ssm's Triton gated RMSNorm, ``f(x, weight, bias, z=None, eps=1e-6,
    group_size=None, norm_before_gate=True)`` (its ``ops/triton/layernorm_gated.py``:
    torch, triton and einops only)."""
    def mamba_ssm():
        from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn as f
        return f
    return _try(mamba_ssm)


@functools.lru_cache(None)
def causal_conv1d_fn() -> Optional[Callable]:
    """``f(x, weight, bias=None, ..., activation=None)``: causal-conv1d's ``causal_conv1d_fn``."""
    def causal_conv1d():
        from causal_conv1d import causal_conv1d_fn as f
        return f
    return _try(causal_conv1d)


@functools.lru_cache(None)
def selective_state_update() -> Optional[Callable]:
    """mamba_ssm's Triton ``selective_state_update(state, x, dt, A, B, C, D=None, z=None,
    dt_bias=None, dt_softplus=False, state_batch_indices=None)`` (in place on state)."""
    def mamba_ssm():
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update as f
        return f
    return _try(mamba_ssm)


@functools.lru_cache(None)
def causal_conv1d_update() -> Optional[Callable]:
    """``f(x, conv_state, weight, bias=None, activation=None)``: causal-conv1d's
    ``causal_conv1d_update`` (in place on conv_state)."""
    def causal_conv1d():
        from causal_conv1d import causal_conv1d_update as f
        return f
    return _try(causal_conv1d)


@functools.lru_cache(None)
def liger_gated() -> Optional[dict]:
    """``{"swiglu": f, "geglu_tanh": f}`` with ``f(gate, up) -> act(gate) * up``."""
    def liger():
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        return {"swiglu": LigerSiLUMulFunction.apply, "geglu_tanh": LigerGELUMulFunction.apply}
    return _try(liger)


@functools.lru_cache(None)
def liger_rope() -> Optional[Callable]:
    """``f(q, k, cos, sin) -> (q, k)`` for q, k ``[B, H, S, D]`` and HF cos/sin ``[1, S, D]``."""
    def liger():
        from liger_kernel.ops.rope import LigerRopeFunction
        return lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin)
    return _try(liger)


@functools.lru_cache(None)
def flash_attn_rotary() -> Optional[Callable]:
    """``f(x, cos, sin, interleaved) -> x`` for x ``[B, S, H, D]`` and cos/sin ``[S, R/2]``."""
    def flash_attn():
        from flash_attn_triton_rotary import apply_rotary
        return lambda x, cos, sin, interleaved: apply_rotary(x, cos, sin, interleaved=interleaved)
    return _try(flash_attn)


def agree(ours: torch.Tensor, theirs: torch.Tensor, what: str, rtol: float) -> str:
    """A note for the row: the relative L2 difference of two outputs of the same inputs;
    raises when it is above ``rtol`` (a speed comparison of different answers is void)."""
    a, b = ours.detach().double(), theirs.detach().double()
    rel = ((a - b).norm() / b.norm().clamp_min(1e-300)).item()
    if not rel <= rtol:
        raise AssertionError(f"{what}: ours and the peer's outputs differ by {rel:.3g} (> {rtol})")
    return f"agrees with peer to {rel:.1e}"
