"""Hugging Face transformers integration: :func:`apply_baracuda` patches an instantiated
model in place to run baracuda_torch's fused ops.

What is replaced, per module instance (other models in the same process, patched or
not, are unaffected; no parameter or buffer is renamed, so ``state_dict`` keys are
unchanged):

* **attention** of the LLaMA family (Llama, Mistral, Qwen2, Qwen3, Gemma, and every model
  whose attention calls an ``apply_rotary_pos_emb`` with the LLaMA code, or its partial-
  rotary variant as in Bamba, and the half-split ``rotate_half``): the call becomes one
  ``baracuda::rope_qk_cos_sin`` launch for q and k with the model's own cos/sin, so every
  RoPE scaling type (linear, dynamic, yarn, llama3, longrope, ...) works unchanged.
* **MLP** ``down_proj(act(gate_proj(x)) * up_proj(x))``: ``act(gate) * up`` becomes one
  gated op, ``baracuda::gated_activation_pair(gate, up, kind)`` when this build has it,
  else ``baracuda::gated_activation`` on ``cat([gate, up], -1)``. ``config.hidden_act``
  picks the kind: silu/swish -> swiglu, gelu/gelu_python -> geglu, gelu_pytorch_tanh/
  gelu_new/gelu_python_tanh -> geglu_tanh, relu -> reglu, sigmoid -> glu; any other
  activation leaves the MLP as it is (the description says so).
* **Mamba-2 mixers** (Mamba2, Bamba), when ``baracuda_torch.mamba`` is present: the
  mixer's chunked scan and its fused split/conv/scan path call
  ``baracuda_torch.mamba.mamba_chunk_scan_combined`` /
  ``mamba_split_conv1d_scan_combined`` on every device (transformers itself only has
  fused kernels on CUDA, with ``mamba_ssm`` installed).

How: the module's ``forward`` is rebuilt over a copy of its module's globals in which
those functions are replaced (``types.FunctionType`` with the same code; decorators
around ``forward`` are rebuilt around the new function), and bound to the instance. The
copy is taken at patch time: later monkey-patches of the transformers module itself are
not seen by patched instances. :func:`remove_baracuda` undoes the patch.
"""
from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .. import functional as bf

__all__ = ["apply_baracuda", "remove_baracuda", "HF_ACT_TO_GATED_KIND", "gated_pair"]

#: ``config.hidden_act`` -> the gated kind computing ``act(gate) * up``.
HF_ACT_TO_GATED_KIND: dict[str, str] = {
    "silu": "swiglu", "swish": "swiglu",
    "gelu": "geglu", "gelu_python": "geglu",
    "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_python_tanh": "geglu_tanh",
    "relu": "reglu",
    "sigmoid": "glu",
}

_PATCH_ATTR = "_baracuda_patch"


# ---- the replacements ------------------------------------------------------------

def gated_pair(gate: Tensor, up: Tensor, kind: str) -> Tensor:
    """``act(gate) * up`` for a gated ``kind`` (glu, reglu, swiglu, geglu, geglu_tanh): the
    two-input op ``baracuda::gated_activation_pair`` when this build has it, else
    ``baracuda::gated_activation`` on ``cat([gate, up], -1)`` with ``gate_first=True``."""
    if hasattr(torch.ops.baracuda, "gated_activation_pair"):
        return torch.ops.baracuda.gated_activation_pair(gate, up, kind)
    return torch.ops.baracuda.gated_activation(torch.cat([gate, up], -1), kind, -1, True)


def _apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                          unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, fused."""
    return bf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def _make_mlp_forward(kind: str) -> Callable[[nn.Module, Tensor], Tensor]:
    def forward(self: nn.Module, x: Tensor) -> Tensor:
        return self.down_proj(gated_pair(self.gate_proj(x), self.up_proj(x), kind))
    forward.__doc__ = f"down_proj({kind}(gate_proj(x), up_proj(x))) (baracuda_torch)"
    return forward


def _mamba_replacements() -> dict[str, Callable[..., Any]] | None:
    """The Mamba-2 functions of transformers' mixers, routed to baracuda_torch.mamba."""
    if importlib.util.find_spec("baracuda_torch.mamba") is None:
        return None
    mamba = importlib.import_module("baracuda_torch.mamba")

    def chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                   dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                   z=None, seq_idx=None, **kwargs):
        return mamba.mamba_chunk_scan_combined(
            hidden_states, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
            initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
            dt_limit=dt_limit, return_final_states=return_final_states)

    def split_conv1d_scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                          initial_states=None, dt_limit=(0.0, float("inf")), return_final_states=False,
                          activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                          outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True,
                          seq_idx=None, **kwargs):
        return mamba.mamba_split_conv1d_scan_combined(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
            initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit,
            return_final_states=return_final_states, activation=activation,
            rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=rmsnorm_eps, outproj_weight=outproj_weight,
            outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups,
            norm_before_gate=norm_before_gate)

    return {"mamba2_chunk_scan": chunk_scan, "mamba2_split_conv1d_scan_combined": split_conv1d_scan}


# ---- recognising the modules -------------------------------------------------------

def _fingerprint(fn: Any) -> tuple | None:
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_code, code.co_names, code.co_varnames)


_REFS: dict[str, Any] = {}


def _refs() -> dict[str, Any]:
    """Fingerprints of the transformers functions we know the semantics of."""
    if not _REFS:
        llama = importlib.import_module("transformers.models.llama.modeling_llama")
        bamba = importlib.import_module("transformers.models.bamba.modeling_bamba")
        _REFS["apply"] = {_fingerprint(llama.apply_rotary_pos_emb), _fingerprint(bamba.apply_rotary_pos_emb)}
        _REFS["rotate_half"] = _fingerprint(llama.rotate_half)
        _REFS["mlp"] = _fingerprint(llama.LlamaMLP.forward)
    return _REFS


def _unwrap(fn: Any) -> Any:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _rebind(fn: Any, overrides: dict[str, Any]) -> Any:
    """``fn`` with the same code over its globals with ``overrides`` applied; decorator
    wrappers (``__wrapped__`` held in a closure cell) are rebuilt around the new inner
    function, so they keep working."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None and fn.__closure__:
        new_inner = _rebind(inner, overrides)
        cells = []
        for c in fn.__closure__:
            try:
                hit = c.cell_contents is inner
            except ValueError:  # an empty cell
                hit = False
            cells.append(types.CellType(new_inner) if hit else c)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__dict__.update(fn.__dict__)
        new.__wrapped__ = new_inner
        return new
    globs = dict(fn.__globals__)
    globs.update(overrides)
    new = types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    return new


def _uses(fn: Any, name: str) -> bool:
    inner = _unwrap(fn)
    code = getattr(inner, "__code__", None)
    return code is not None and name in code.co_names and name in inner.__globals__


def _rope_attention(module: nn.Module) -> bool:
    fwd = type(module).forward
    if not _uses(fwd, "apply_rotary_pos_emb"):
        return False
    g = _unwrap(fwd).__globals__
    refs = _refs()
    return (_fingerprint(g["apply_rotary_pos_emb"]) in refs["apply"]
            and _fingerprint(g.get("rotate_half")) == refs["rotate_half"])


def _gated_mlp(module: nn.Module) -> bool:
    return (all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
            and hasattr(module, "act_fn")
            and _fingerprint(_unwrap(type(module).forward)) == _refs()["mlp"])


def _mamba_mixer(module: nn.Module) -> bool:
    return _uses(type(module).forward, "mamba2_chunk_scan")


def _act_name(module: nn.Module, config: Any) -> str | None:
    cfg = getattr(module, "config", None) or config
    for attr in ("hidden_act", "hidden_activation"):
        name = getattr(cfg, attr, None)
        if isinstance(name, str):
            return name
    return None


# ---- public API ------------------------------------------------------------------

def apply_baracuda(model: nn.Module) -> str:
    """Patch a Hugging Face transformers model in place to use baracuda_torch's ops; see
    the module docstring for what is replaced and how.

    Args:
        model: an instantiated model (``LlamaForCausalLM``, ``MistralModel``,
            ``Qwen3ForCausalLM``, ``GemmaForCausalLM``, ``Mamba2ForCausalLM``, ...).

    Returns:
        A non-empty, human-readable description of every replacement (and of what was
        left alone: an MLP activation with no gated kind, Mamba-2 mixers without
        ``baracuda_torch.mamba``). Calling it again on a patched model changes nothing.

    Raises:
        ValueError: nothing in ``model`` is supported (the message names its class and
            the supported families).
    """
    counts: dict[str, int] = {}
    notes: list[str] = []
    config = getattr(model, "config", None)
    mamba = None
    for name, module in model.named_modules():
        if getattr(module, _PATCH_ATTR, None) is not None:
            key = f"{type(module).__name__}: already patched ({getattr(module, _PATCH_ATTR)})"
            counts[key] = counts.get(key, 0) + 1
            continue
        what = None
        if _rope_attention(module):
            fwd = _rebind(type(module).forward, {"apply_rotary_pos_emb": _apply_rotary_pos_emb})
            what = "apply_rotary_pos_emb -> baracuda::rope_qk_cos_sin"
        elif _gated_mlp(module):
            act = _act_name(module, config)
            kind = HF_ACT_TO_GATED_KIND.get(act) if act else None
            if kind is None:
                notes.append(f"{name} ({type(module).__name__}): activation {act!r} has no gated kind; "
                             "MLP left unpatched")
                continue
            fwd = _make_mlp_forward(kind)
            op = ("baracuda::gated_activation_pair" if hasattr(torch.ops.baracuda, "gated_activation_pair")
                  else "baracuda::gated_activation(cat)")
            what = f"act(gate_proj) * up_proj [{act}] -> {op} {kind}"
        elif _mamba_mixer(module):
            if mamba is None:
                mamba = _mamba_replacements() or {}
            if not mamba:
                notes.append(f"{name} ({type(module).__name__}): baracuda_torch.mamba is not in this "
                             "build; Mamba-2 mixer left unpatched")
                continue
            fwd = _rebind(type(module).forward, mamba)
            what = ("mamba2_chunk_scan / mamba2_split_conv1d_scan_combined -> "
                    "baracuda_torch.mamba.mamba_chunk_scan_combined / mamba_split_conv1d_scan_combined")
        if what is None:
            continue
        module.forward = types.MethodType(fwd, module)
        setattr(module, _PATCH_ATTR, what)
        key = f"{type(module).__name__}: {what}"
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        detail = ("; " + "; ".join(notes)) if notes else ""
        raise ValueError(
            f"baracuda_torch.apply_baracuda: unsupported model class {type(model).__name__}: no "
            "LLaMA-family attention (apply_rotary_pos_emb + rotate_half), gated MLP "
            "(gate_proj/up_proj/down_proj) or Mamba-2 mixer found to patch (supported: Llama, "
            "Mistral, Qwen2, Qwen3, Gemma and models sharing their attention/MLP code; "
            f"Mamba2, Bamba with baracuda_torch.mamba){detail}")
    lines = [f"baracuda_torch patched {type(model).__name__}:"]
    lines += [f"  {n} x {k}" for k, n in counts.items()]
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)


def remove_baracuda(model: nn.Module) -> int:
    """Undo :func:`apply_baracuda` on ``model``; returns how many modules were restored."""
    n = 0
    for module in model.modules():
        if getattr(module, _PATCH_ATTR, None) is not None:
            module.__dict__.pop("forward", None)
            delattr(module, _PATCH_ATTR)
            n += 1
    return n
