"""Hugging Face transformers integration: :func:`apply_baracuda` patches an instantiated
model in place to run baracuda_torch's fused ops.

The rule: the patched model computes the same function as the unpatched one, in every
mode (train/eval, with or without a cache, with or without an ``attention_mask``), on
every device; only the kernels change. Each replacement is decided per module instance
from what that instance computes (the activation object its MLP holds, the gated norm
its mixer calls, whether its forward masks padding), never from a config key or from an
assumption about one transformers version. Where that cannot be shown, the module is
left alone and the returned description says why.

What is replaced, per module instance (other models in the same process, patched or
not, are unaffected; no parameter or buffer is renamed, so ``state_dict`` keys are
unchanged):

* **attention** whose forward calls an ``apply_rotary_pos_emb`` with the LLaMA code (or
  Bamba's partial-rotary variant) and the half-split ``rotate_half`` (Llama, Mistral,
  Qwen2, Qwen3, Gemma, Gemma2, Gemma3, Bamba, FalconH1, ...): the call becomes one
  ``baracuda::rope_qk_cos_sin`` launch for q and k with the model's own cos/sin, so every
  RoPE scaling type (linear, dynamic, yarn, llama3, longrope, ...) works unchanged.
* **MLP** with LlamaMLP's forward ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``:
  ``act_fn(gate) * up`` becomes one gated op (``baracuda::gated_activation_pair``, else
  ``baracuda::gated_activation`` on ``cat([gate, up], -1)``). The kind comes from the
  activation object the MLP holds (``module.act_fn``), evaluated at patch time on probe
  values: SiLU -> swiglu, erf GELU -> geglu, tanh GELU -> geglu_tanh, ReLU -> reglu,
  sigmoid -> glu; any other activation leaves the MLP as it is (the description says so).
* **Mamba-2 mixers** of Mamba2, Bamba and FalconH1, on transformers versions whose mixer
  calls ``mamba2_chunk_scan``, itself or through ``mamba2_scan_forward`` (5.16 through
  5.25 of those tested; older ones compute the scan inline, and 5.15 hides the call behind
  a wrapper: left alone with a note): the
  chunked scan calls
  ``baracuda_torch.mamba.mamba_chunk_scan_combined`` on every device. The training path
  ``mamba2_split_conv1d_scan_combined`` (training without a cache) follows what the
  unpatched model runs there. Where transformers has a fused kernel for it (``mamba_ssm``
  was importable: its fallback decorator records ``is_new_implementation``), it becomes
  ``baracuda_torch.mamba.mamba_split_conv1d_scan_combined`` with the call's arguments
  (the same function as mamba_ssm's: it ignores ``attention_mask`` and takes the call
  site's ``norm_before_gate`` and ``ngroups``, as that kernel does). Otherwise transformers
  runs its PyTorch path, and the fused function replaces it only where it computes the
  same: no ``attention_mask`` in the call (the fused path cannot mask padding), the SiLU
  activation, and a gated norm that, evaluated at patch time, is RMSNorm over groups of
  ``width / n_groups`` with the gate applied before or after the norm (the patch passes
  what the norm does, not the call site's ``norm_before_gate``); elsewhere the mixer runs
  transformers' PyTorch path with only the scan replaced. The decoding step (one token
  with a cache): where the mixer calls ``causal_conv1d_update`` and
  ``mamba2_selective_state_update`` whose fallback decorators name causal-conv1d's and
  mamba_ssm's functions, they become ``baracuda::causal_conv1d_update`` and
  ``baracuda::selective_state_update`` wherever the ops take the call (SiLU or no
  activation for the conv; dtypes the ops accept), the functions the mixer held
  otherwise. Other Mamba-2 mixers (Zamba2, NemotronH, GraniteMoeHybrid, ...) are left
  alone with a note.
* **RMSNorm** modules whose forward is transformers' ``LlamaRMSNorm`` or ``GemmaRMSNorm``
  code, as :func:`baracuda_torch.rms_norm_convention` recognizes it (Llama, Mistral, Qwen2,
  Qwen3 and its q_norm/k_norm, Gemma, Gemma2, Gemma3 and its q_norm/k_norm, the decoder
  layers' and final norms of Mamba2, Bamba and FalconH1, and every other copy of that
  code), and whose instance computes it: no forward of its own on the instance, a 1-d
  weight, and a probe at patch time that evaluates the class forward against
  ``baracuda_torch.rms_norm`` on the module's device with a random weight, for float32,
  bfloat16 and float16 inputs under a weight of that dtype or float32 (equal to the bit
  on exact sums of squares where the width is a power of two; within 8 units in the last
  place plus a relative 1e-5 on other values). The forward becomes one
  ``baracuda::rms_norm`` call (``baracuda::rms_norm_backward`` in the backward) on the
  module's own weight Parameter and eps, read at each call as the module reads them.
  Inputs the op would compute differently (float64, which the module normalizes in
  float32; a weight neither in the input's dtype nor float32) run the class forward.
  Anything else named like an RMSNorm (the Mamba mixers' gated norms, torch.nn.RMSNorm,
  other variants, a module the probe rejects) is left alone with a note. The residual
  add before a norm stays in the decoder layer (fusing it would mean rewriting the
  decoder layers' forward, which differs across the supported transformers versions).

How: the module's ``forward`` is rebuilt over a copy of its module's globals in which
those functions are replaced (``types.FunctionType`` with the same code; decorators
around ``forward`` are rebuilt around the new function) and installed on the instance as
a small callable that survives ``copy.deepcopy`` and ``torch.save``/``torch.load`` (it
is rebuilt from what the patch recorded; loaded under another transformers version than
the one it was patched under, the module runs unpatched until :func:`apply_baracuda` is
called again). ``save_pretrained`` stores weights and config
only: a model from ``from_pretrained`` is unpatched. :func:`remove_baracuda` undoes the
patch.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as bf

__all__ = ["apply_baracuda", "remove_baracuda", "HF_ACT_TO_GATED_KIND", "gated_pair"]

#: transformers' activation names and the gated kind computing ``act(gate) * up``. For
#: reference only: the patch decides from the MLP's activation object itself.
HF_ACT_TO_GATED_KIND: dict[str, str] = {
    "silu": "swiglu", "swish": "swiglu",
    "gelu": "geglu", "gelu_python": "geglu",
    "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_python_tanh": "geglu_tanh",
    "relu": "reglu",
    "sigmoid": "glu",
}

_PATCH_ATTR = "_baracuda_patch"

#: Mamba-2 mixer classes whose forward we verified (tests/test_huggingface.py): the call
#: sites of mamba2_chunk_scan / mamba2_split_conv1d_scan_combined and what follows them.
_VERIFIED_MIXERS = ("Mamba2Mixer", "BambaMixer", "FalconH1Mixer")


def _tf_version() -> str:
    try:
        return importlib.import_module("transformers").__version__
    except Exception:  # pragma: no cover - transformers is what calls us
        return "unknown"


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


#: The input dtypes the patched norm runs baracuda's op for (the module's own float32
#: arithmetic); float64 input (normalized in float32 by transformers' modules, in float64
#: by the op) and anything else runs the class forward.
_NORM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: convention -> the attribute holding eps in the transformers code of that convention.
_NORM_EPS_ATTR = {"llama": "variance_epsilon", "gemma": "eps"}


def _norm_call(module: nn.Module, x: Any, convention: str) -> Tensor | None:
    """``baracuda_torch.rms_norm`` with ``module``'s weight and eps (read at call time, as
    the module's forward reads them) where it computes what the module's forward (the
    transformers code of ``convention``) computes for this input: x float32/float16/
    bfloat16 of at least one dim; a 1-d weight of x's last size, on x's device, in x's
    dtype or float32; a finite eps >= 0. None otherwise (the class forward runs)."""
    if not isinstance(x, Tensor) or x.dtype not in _NORM_DTYPES or x.dim() == 0:
        return None
    w = getattr(module, "weight", None)
    eps = getattr(module, _NORM_EPS_ATTR[convention], None)
    if (not isinstance(w, Tensor) or w.dim() != 1 or w.shape[0] != x.shape[-1]
            or w.dtype not in (x.dtype, torch.float32) or w.device != x.device):
        return None
    if isinstance(eps, int) and not isinstance(eps, bool):
        eps = float(eps)
    if not isinstance(eps, float) or not 0.0 <= eps < float("inf"):
        return None
    return bf.rms_norm(x, x.shape[-1], w, eps, convention=convention)


def _make_norm_forward(convention: str, arg: str) -> Callable[..., Any]:
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if len(args) + len(kwargs) == 1:
            y = _norm_call(self, args[0] if args else kwargs.get(arg), convention)
            if y is not None:
                return y
        return type(self).forward(self, *args, **kwargs)
    forward.__doc__ = f"transformers' RMSNorm ({convention} convention) on baracuda::rms_norm (baracuda_torch)"
    return forward


def _mamba_module():
    if importlib.util.find_spec("baracuda_torch.mamba") is None:
        return None
    return importlib.import_module("baracuda_torch.mamba")


def _make_chunk_scan(mamba: Any) -> Callable[..., Any]:
    def chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                   dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
                   z=None, seq_idx=None, **kwargs):
        """transformers' ``mamba2_chunk_scan`` (mamba_ssm's ``mamba_chunk_scan_combined``
        arguments) on baracuda_torch.mamba."""
        return mamba.mamba_chunk_scan_combined(
            hidden_states, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
            initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
            dt_limit=dt_limit, return_final_states=return_final_states)
    return chunk_scan


def _make_conv_update(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' ``causal_conv1d_update`` (causal-conv1d's contract: the conv of one
    decoding step, in place on the conv state) on ``baracuda::causal_conv1d_update`` where
    the op takes the call (SiLU or no activation, the state in x's dtype, the weight in x's
    dtype or float32, one device); ``original`` (the function the mixer held) otherwise."""
    from ..causal_conv1d import causal_conv1d_update

    def conv_update(hidden_states, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                    conv_state_indices=None, **kwargs):
        x = hidden_states
        if (not kwargs and activation in (None, "silu", "swish") and isinstance(x, Tensor)
                and x.is_floating_point() and conv_state.dtype == x.dtype
                and weight.dtype in (x.dtype, torch.float32) and (bias is None or bias.dtype == weight.dtype)
                and all(t is None or t.device == x.device
                        for t in (conv_state, weight, bias, cache_seqlens, conv_state_indices))):
            return causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens,
                                        conv_state_indices)
        extra = {k: v for k, v in (("cache_seqlens", cache_seqlens), ("conv_state_indices", conv_state_indices))
                 if v is not None}
        return original(hidden_states, conv_state, weight, bias, activation=activation, **extra, **kwargs)
    return conv_update


def _make_state_update(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' ``mamba2_selective_state_update`` (mamba_ssm's
    ``selective_state_update`` contract; transformers' own signature, which puts dt_bias,
    dt_softplus and z after D in that order) on ``baracuda::selective_state_update`` where
    the op takes the call (the state float32 or x's dtype, dt/A/B/C/D/dt_bias float32 or
    x's dtype, z x's, one device); ``original`` otherwise."""
    from ..functional import selective_state_update

    def state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None,
                     state_batch_indices=None, **kwargs):
        x = hidden_states
        ok = (isinstance(x, Tensor) and x.is_floating_point() and state.dtype in (x.dtype, torch.float32)
              and all(t is None or t.dtype in (x.dtype, torch.float32) for t in (dt, A, B, C, D, dt_bias))
              and (z is None or z.dtype == x.dtype)
              and all(t is None or t.device == x.device
                      for t in (state, dt, A, B, C, D, dt_bias, z, state_batch_indices)))
        if ok:
            return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                          state_batch_indices)
        if state_batch_indices is not None:
            kwargs["state_batch_indices"] = state_batch_indices
        return original(state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z,
                        **kwargs)
    return state_update


def _kernel_contract(fn: Any) -> tuple[str, str] | None:
    """``(package, function)`` whose contract a transformers function has, as its fallback
    decorator (``use_kernel_func_from_hub_with_fallback``) records it; None if unknown."""
    while fn is not None:
        cv = _closure_vars(fn)
        if isinstance(cv.get("func_name"), str) and isinstance(cv.get("package"), str):
            return cv["package"], cv["func_name"]
        fn = _inner(fn)
    return None


#: The decoding functions a mixer calls (global name) and the contract each must have.
_DECODE_FUNCTIONS = {"causal_conv1d_update": ("causal_conv1d", "causal_conv1d_update"),
                     "mamba2_selective_state_update": ("mamba_ssm", "selective_state_update")}


def _no_fused_path(*args, **kwargs):
    """``mamba2_split_conv1d_scan_combined`` as transformers' own fallback: ``None``, so
    the mixer takes its PyTorch path (with the scan replaced)."""
    return None


def _make_split_conv1d_scan(mamba: Any, norm_nbg: bool | None, norm_eps: float | None,
                            gate_without_norm: bool) -> Callable[..., Any]:
    """The fused training path for one mixer: ``mamba_split_conv1d_scan_combined`` where
    it computes what the mixer's PyTorch path computes (see the module docstring), else
    ``None`` (that PyTorch path runs). ``norm_nbg``/``norm_eps``: what the mixer's gated
    norm does (None: not a grouped gated RMSNorm the fused path reproduces);
    ``gate_without_norm``: without ``rmsnorm_weight`` the PyTorch path gates the scan's
    output with ``silu(gate)`` (FalconH1 without ``mamba_rms_norm``). The call site's
    ``norm_before_gate`` is not used: transformers passes False whatever its norm does."""

    def split_conv1d_scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                          initial_states=None, dt_limit=(0.0, float("inf")), return_final_states=False,
                          activation="silu", rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                          outproj_bias=None, headdim=None, ngroups=1, norm_before_gate=True,
                          seq_idx=None, **kwargs):
        if activation not in ("silu", "swish"):
            return None
        if rmsnorm_weight is not None:
            if norm_nbg is None or rmsnorm_eps != norm_eps:
                return None
            nbg, eps = norm_nbg, rmsnorm_eps
        elif gate_without_norm:
            nbg, eps = True, 1e-6  # unused without rmsnorm_weight
        else:
            return None
        return mamba.mamba_split_conv1d_scan_combined(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
            initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit,
            return_final_states=return_final_states, activation=activation,
            rmsnorm_weight=rmsnorm_weight, rmsnorm_eps=eps, outproj_weight=outproj_weight,
            outproj_bias=outproj_bias, headdim=headdim, ngroups=ngroups, norm_before_gate=nbg)

    return split_conv1d_scan


def _make_split_conv1d_scan_as_called(mamba: Any) -> Callable[..., Any]:
    """The fused training path where transformers itself runs a fused kernel there
    (``mamba_ssm``'s ``mamba_split_conv1d_scan_combined``): the same function, with the
    call site's arguments as they are (its ``norm_before_gate`` and ``ngroups``; it never
    sees ``attention_mask``, like the kernel it replaces)."""

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

    return split_conv1d_scan


def _closure_vars(fn: Any) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    out: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars if code else (), cells or ()):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def _runs_fused_kernel(fn: Any) -> bool:
    """Whether transformers' ``mamba2_split_conv1d_scan_combined`` (``fn``, the global the
    mixer calls) runs a fused kernel rather than returning None: transformers' fallback
    decorator records it as ``is_new_implementation`` (True when ``mamba_ssm`` was
    importable at transformers' import)."""
    while fn is not None:
        flag = _closure_vars(fn).get("is_new_implementation")
        if flag is not None:
            return bool(flag)
        fn = _inner(fn)
    return False


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
        _REFS["apply"] = {_fingerprint(_unwrap(llama.apply_rotary_pos_emb)),
                          _fingerprint(_unwrap(bamba.apply_rotary_pos_emb))}
        _REFS["rotate_half"] = _fingerprint(_unwrap(llama.rotate_half))
        _REFS["mlp"] = _fingerprint(_unwrap(llama.LlamaMLP.forward))
    return _REFS


def _hub_func(obj: Any) -> Any:
    """The function behind a ``kernels`` function layer, else None. With ``kernels``
    installed (transformers 5.25 requires it), ``use_kernel_forward_from_hub`` on a function
    makes it an ``nn.Module`` instance whose forward calls that function (``func``, a closure
    variable) unless a model's ``kernelize`` made a hub kernel active."""
    if not isinstance(obj, nn.Module):
        return None
    fn = _closure_vars(getattr(type(obj), "forward", None)).get("func")
    return fn if callable(fn) else None


def _inner(fn: Any) -> Any:
    """One wrapper in: a decorator's ``__wrapped__`` or a ``kernels`` function layer's
    function; None where ``fn`` wraps nothing."""
    inner = getattr(fn, "__wrapped__", None)
    return inner if inner is not None else _hub_func(fn)


def _unwrap(fn: Any) -> Any:
    while (inner := _inner(fn)) is not None:
        fn = inner
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
    # Without the module's __name__: torch.compile names a global it reads by the module
    # its function's globals call theirs and guards on that module's attribute, which is
    # transformers' function, not the override (torch 2.8 with transformers 5.25 then
    # fails to compile: a kernels function layer has no __defaults__). Nameless, the
    # globals are guarded as this dict.
    globs.pop("__name__", None)
    new = types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    return new


def _uses(fn: Any, name: str) -> bool:
    inner = _unwrap(fn)
    code = getattr(inner, "__code__", None)
    return code is not None and name in code.co_names and name in inner.__globals__


def _scan_site(fwd: Any) -> Any:
    """The function whose ``mamba2_chunk_scan`` call a Mamba-2 mixer's ``forward`` makes:
    the forward itself (transformers 5.16 through 5.24) or the ``mamba2_scan_forward`` it
    calls (5.25); None where neither calls it (the scan inline, or a call hidden)."""
    if _uses(fwd, "mamba2_chunk_scan"):
        return _unwrap(fwd)
    if _uses(fwd, "mamba2_scan_forward"):
        scan = _unwrap(_unwrap(fwd).__globals__["mamba2_scan_forward"])
        if _uses(scan, "mamba2_chunk_scan"):
            return scan
    return None


def _decode_sites(fwd: Any, scan: Any) -> dict[str, Any]:
    """For each of _DECODE_FUNCTIONS, the function that calls it (None if none): the
    mixer's forward where it makes the scan call itself; on 5.25 the conv step is called in
    the ``causal_conv1d_forward`` the forward calls, the state update beside the scan."""
    top = _unwrap(fwd)
    if scan is top:
        return dict.fromkeys(_DECODE_FUNCTIONS, top)
    conv = _unwrap(top.__globals__["causal_conv1d_forward"]) if _uses(fwd, "causal_conv1d_forward") else None
    return {"causal_conv1d_update": conv, "mamba2_selective_state_update": scan}


def _decode_replaceable(fwd: Any, scan: Any) -> bool:
    """Whether a mixer's decoding step can run on our ops: each of _DECODE_FUNCTIONS is
    called (_decode_sites) and is of the contract its fallback decorator records."""
    sites = _decode_sites(fwd, scan)
    return all(sites[name] is not None and _uses(sites[name], name)
               and _kernel_contract(sites[name].__globals__[name]) == contract
               for name, contract in _DECODE_FUNCTIONS.items())


def _rope_attention(module: nn.Module) -> bool:
    fwd = type(module).forward
    if not _uses(fwd, "apply_rotary_pos_emb"):
        return False
    g = _unwrap(fwd).__globals__
    refs = _refs()
    return (_fingerprint(_unwrap(g["apply_rotary_pos_emb"])) in refs["apply"]
            and _fingerprint(_unwrap(g.get("rotate_half"))) == refs["rotate_half"])


def _gated_mlp(module: nn.Module) -> bool:
    return (all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
            and callable(getattr(module, "act_fn", None))
            and _fingerprint(_unwrap(type(module).forward)) == _refs()["mlp"])


#: gated kind -> the activation it applies to the gate, in float64.
_KIND_ACT: dict[str, Callable[[Tensor], Tensor]] = {
    "swiglu": F.silu,
    "geglu": F.gelu,
    "geglu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "reglu": torch.relu,
    "glu": torch.sigmoid,
}


def _activation_kind(act: Any) -> str | None:
    """The gated kind whose activation ``act`` computes, found by evaluating ``act`` on
    probe values in float64 on the CPU (-12..12 in steps of 0.05, and ±30); None if it
    computes none of them (or cannot be evaluated there)."""
    t = torch.cat([torch.linspace(-12.0, 12.0, 481, dtype=torch.float64),
                   torch.tensor([-30.0, 30.0], dtype=torch.float64)])
    try:
        with torch.no_grad():
            got = act(t.clone())
    except Exception:
        return None
    if not isinstance(got, Tensor) or got.shape != t.shape or not got.is_floating_point():
        return None
    got = got.detach().to("cpu", torch.float64)
    for kind, fn in _KIND_ACT.items():
        if torch.allclose(got, fn(t), rtol=1e-6, atol=1e-9):
            return kind
    return None


def _gated_rmsnorm_ref(x: Tensor, gate: Tensor, weight: Tensor, eps: float, group_size: int,
                       norm_before_gate: bool) -> Tensor:
    """The gated RMSNorm that mamba_split_conv1d_scan_combined computes, in float32."""
    if not norm_before_gate:
        x = x * F.silu(gate)
    g = x.unflatten(-1, (-1, group_size))
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    out = g.flatten(-2) * weight
    return out * F.silu(gate) if norm_before_gate else out


def _probe_gated_norm(norm: Any, width: int, ngroups: int) -> tuple[bool, float] | None:
    """``(norm_before_gate, eps)`` when ``norm(x, gate)`` computes the gated RMSNorm over
    groups of ``width // ngroups`` channels with the gate applied before or after the
    norm, checked by evaluating it (with a random weight, on the CPU in float32, at unit
    scale and at a scale where eps matters); None otherwise."""
    if not isinstance(norm, nn.Module) or ngroups < 1 or width % ngroups:
        return None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(eps, float):
        return None
    params = dict(norm.named_parameters())
    if set(params) != {"weight"} or tuple(params["weight"].shape) != (width,) or list(norm.buffers()):
        return None
    gen = torch.Generator().manual_seed(0)
    w = 1.0 + 0.5 * torch.randn(width, generator=gen)
    x = torch.randn(3, 2, width, generator=gen)
    x[1] *= 1e-3  # variance near eps
    gate = 2.0 * torch.randn(3, 2, width, generator=gen)
    try:
        with torch.no_grad():
            got = torch.func.functional_call(norm, {"weight": w}, (x, gate))
    except Exception:
        return None
    if not isinstance(got, Tensor) or got.shape != x.shape:
        return None
    got = got.detach().float().cpu()  # (a hook may have moved it)
    for nbg in (False, True):
        if torch.allclose(got, _gated_rmsnorm_ref(x, gate, w, eps, width // ngroups, nbg),
                          rtol=1e-4, atol=1e-5):
            return nbg, eps
    return None


def _rms_norm_kind(module: nn.Module) -> str | None:
    """The convention ("llama" or "gemma") of a module whose forward is transformers'
    ``LlamaRMSNorm`` or ``GemmaRMSNorm`` code (``rms_norm_convention``: the same bytecode,
    names and constants as the installed transformers' reference class, so every copy of
    it: Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Mamba2, Bamba, FalconH1, ...); None for
    anything else (torch.nn.RMSNorm and baracuda's own nn.RMSNorm included)."""
    from .. import nn as bnn
    if isinstance(module, (bnn.RMSNorm, torch.nn.RMSNorm)):
        return None
    try:
        convention = bf.rms_norm_convention(module)[0]
    except (ValueError, AttributeError, TypeError):
        return None
    return convention if convention in _NORM_EPS_ATTR else None


def _looks_like_rms_norm(module: nn.Module) -> bool:
    """For the description only (never for a decision): a module named like an RMSNorm
    or holding transformers' ``variance_epsilon``, so the ones left alone get a note."""
    from .. import nn as bnn
    return (not isinstance(module, bnn.RMSNorm)
            and ("rmsnorm" in type(module).__name__.lower() or hasattr(module, "variance_epsilon")))


def _with_weight(module: nn.Module, weight: Tensor) -> nn.Module:
    """A shallow stand-in of ``module`` (same class and attributes) whose ``weight`` is
    ``weight``; the module itself is not touched."""
    proxy = object.__new__(type(module))
    proxy.__dict__.update(module.__dict__)
    object.__setattr__(proxy, "_parameters", {**module._parameters, "weight": weight})
    return proxy


#: (x dtype, weight dtype) pairs the norm probe evaluates: each 16-bit type with its own
#: weight and with a float32 weight (autocast, mixed precision), and float32.
_NORM_PROBE_DTYPES = ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                      (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                      (torch.float16, torch.float32))


def _probe_norm(module: nn.Module, convention: str) -> str | None:
    """None when ``baracuda_torch.rms_norm`` computes what the module's class forward
    computes, evaluated on the module's device with a random weight in every pair of
    ``_NORM_PROBE_DTYPES``: rows of normal values at unit scale, at a scale where eps
    matters (mean square near 1e-6) and at 1e3, within 8 units in the last place of the
    output dtype plus a relative 1e-5 (the sums of squares are added in another order:
    a few float32 units, more for very wide rows); and rows of
    multiples of 1/8 (exact squares and sums) equal to the bit where the width is a power
    of two (the mean's division is then exact too). Otherwise why not, for the note.
    (The "llama" code rounds the normalized value to x's dtype before its float32 weight
    multiplies it: the tolerance is in units of the coarser of x's and the output's dtype.)"""
    w0 = getattr(module, "weight", None)
    if not isinstance(w0, Tensor) or w0.dim() != 1:
        return "its weight is not a 1-d tensor"
    if w0.device.type == "meta":
        return "its weight is on the meta device (nothing to evaluate)"
    width, device = w0.shape[0], w0.device
    gen = torch.Generator().manual_seed(0)
    w = 0.5 * torch.randn(width, generator=gen) + (1.0 if convention == "llama" else 0.0)
    rnd = torch.randn(3, 4, width, generator=gen)
    rnd[1] *= 1e-3
    rnd[2] *= 1e3
    dyadic = torch.randint(-16, 17, (2, 4, width), generator=gen).float() / 8
    dyadic[1] *= 2.0 ** -10
    exact = width & (width - 1) == 0 and width < 2 ** 16
    for xd, wd in _NORM_PROBE_DTYPES:
        proxy = _with_weight(module, w.to(device, wd))
        for values, bitwise in ((rnd, False), (dyadic, exact)):
            x = values.to(device, xd)
            what = f"x {str(xd)[6:]}, weight {str(wd)[6:]} on {device}"
            try:
                with torch.no_grad():
                    want = type(module).forward(proxy, x)
                    got = _norm_call(proxy, x, convention)
            except Exception as e:  # noqa: BLE001 - any failure leaves the module alone
                return f"evaluating it ({what}) raised {type(e).__name__}: {e}"
            if got is None:
                return f"baracuda's rms_norm does not take its weight or eps ({what})"
            if not isinstance(want, Tensor) or want.shape != got.shape or want.dtype != got.dtype:
                return (f"its forward returns {getattr(want, 'dtype', type(want).__name__)} "
                        f"{tuple(getattr(want, 'shape', ()))} where baracuda's rms_norm returns "
                        f"{got.dtype} {tuple(got.shape)} ({what})")
            if bitwise:
                if not torch.equal(got, want):
                    return f"its output differs from baracuda's rms_norm on exact sums of squares ({what})"
                continue
            tol = 8 * max(torch.finfo(xd).eps, torch.finfo(want.dtype).eps) + 1e-5
            err = (got.double() - want.double()).abs()
            if not bool((err <= tol * want.double().abs() + torch.finfo(want.dtype).tiny).all()):
                return (f"its output differs from baracuda's rms_norm by up to {err.max().item():.3g} "
                        f"({what})")
    return None


def _is_mamba2_mixer(module: nn.Module) -> bool:
    """A transformers Mamba-2 mixer (any version): its own class has an SSM's A_log,
    dt_bias, conv1d and in_proj."""
    return (type(module).__module__.startswith("transformers.")
            and all(hasattr(module, n) for n in ("A_log", "dt_bias", "conv1d", "in_proj"))
            and type(module).__name__.endswith(("Mixer", "MambaLayer")))


def _mask_position(fn: Any) -> int | None:
    """Position of ``attention_mask`` among ``fn``'s positional arguments after self."""
    try:
        names = list(inspect.signature(_unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("attention_mask") - 1 if "attention_mask" in names else None


# ---- the plan of one module, and the callable installed on it ----------------------

def _plan_norm(module: nn.Module, convention: str | None) -> tuple[dict | None, str]:
    """``(spec, description)`` for an RMSNorm module to patch, or ``(None, why not)``."""
    cls = type(module).__name__
    if convention is None:
        if isinstance(module, torch.nn.RMSNorm):
            return None, "torch.nn.RMSNorm (torch's own op) is not replaced"
        return None, ("its forward is not transformers' LlamaRMSNorm or GemmaRMSNorm code "
                      "(what baracuda's rms_norm reproduces)")
    own = module.__dict__.get("forward")
    if own is not None and not isinstance(own, _PatchedForward):  # (ours, inactive: replaced)
        return None, f"its instance has its own forward ({own!r}), which is what it computes, not {cls}.forward"
    why = _probe_norm(module, convention)
    if why is not None:
        return None, why
    params = inspect.signature(type(module).forward).parameters
    arg = list(params)[1] if len(params) > 1 else "hidden_states"
    return ({"kind": "rmsnorm", "convention": convention, "arg": arg, "transformers": _tf_version()},
            f"RMSNorm ({convention} convention, evaluated) -> baracuda::rms_norm")


def _plan(name: str, module: nn.Module, notes: list[str],
          left_alone: dict[tuple[str, str], list[str]] | None = None) -> tuple[dict, str] | None:
    """What to replace in ``module``: a spec (plain data, kept in pickles) and its
    description; None (with a note where useful) to leave it alone. RMSNorm modules left
    alone are gathered in ``left_alone`` ((class, why) -> module names) for one note each."""
    cls = type(module).__name__

    def norm_plan(convention: str | None) -> tuple[dict, str] | None:
        spec, what = _plan_norm(module, convention)
        if spec is None:
            if left_alone is not None:
                left_alone.setdefault((cls, what), []).append(name)
            return None
        return spec, what

    convention = _rms_norm_kind(module)
    if convention is not None:
        return norm_plan(convention)
    if _rope_attention(module):
        return ({"kind": "rope", "transformers": _tf_version()},
                "apply_rotary_pos_emb -> baracuda::rope_qk_cos_sin")
    if _gated_mlp(module):
        kind = _activation_kind(module.act_fn)
        if kind is None:
            notes.append(f"{name} ({cls}): activation {module.act_fn!r} computes none of the gated "
                         "kinds (silu, gelu, gelu tanh, relu, sigmoid); MLP left unpatched")
            return None
        op = ("baracuda::gated_activation_pair" if hasattr(torch.ops.baracuda, "gated_activation_pair")
              else "baracuda::gated_activation(cat)")
        return ({"kind": "mlp", "gated": kind, "transformers": _tf_version()},
                f"act_fn(gate_proj) * up_proj [{type(module.act_fn).__name__}] -> {op} {kind}")
    if not _is_mamba2_mixer(module):
        return norm_plan(None) if _looks_like_rms_norm(module) else None  # (for its note)
    fwd = type(module).forward
    ver = _tf_version()
    scan = _scan_site(fwd)
    if scan is None:
        notes.append(f"{name} ({cls}): transformers {ver}'s Mamba-2 mixer has no mamba2_chunk_scan "
                     "call to replace (its scan is inline, or the call hidden behind a wrapper); mixer "
                     "left unpatched (Mamba-2 mixers are patched where their forward, or the "
                     "mamba2_scan_forward it calls, calls it: transformers 5.16 through 5.25 of the "
                     "tested releases)")
        return None
    if cls not in _VERIFIED_MIXERS:
        notes.append(f"{name} ({cls}): this Mamba-2 mixer is not verified against baracuda_torch "
                     f"(verified: {', '.join(_VERIFIED_MIXERS)}); left unpatched")
        return None
    if _mamba_module() is None:
        notes.append(f"{name} ({cls}): baracuda_torch.mamba is not in this build; Mamba-2 mixer "
                     "left unpatched")
        return None
    spec: dict[str, Any] = {"kind": "mamba", "fused": False, "norm_before_gate": None, "eps": None,
                            "gate_without_norm": False, "mask_pos": _mask_position(fwd),
                            "transformers": ver}
    decode = _decode_replaceable(fwd, scan)
    spec["decode"] = decode
    if not decode:
        notes.append(f"{name} ({cls}): its decoding step stays transformers' own (no "
                     "causal_conv1d_update / mamba2_selective_state_update of causal-conv1d's and "
                     "mamba_ssm's contracts to replace)")
    why = None
    if _uses(fwd, "mamba2_split_conv1d_scan_combined") and _runs_fused_kernel(
            _unwrap(fwd).__globals__["mamba2_split_conv1d_scan_combined"]):
        # transformers trains on a fused kernel here (mamba_ssm): the same function, as called
        spec.update(fused=True, as_called=True)
    elif _uses(fwd, "mamba2_split_conv1d_scan_combined"):
        rms = getattr(module, "mamba_rms_norm", True)  # FalconH1 makes the norm optional
        probed = None
        if rms:
            ngroups = getattr(module, "n_groups", None)
            width = getattr(module, "intermediate_size", None)
            if isinstance(ngroups, int) and isinstance(width, int):
                probed = _probe_gated_norm(getattr(module, "norm", None), width, ngroups)
            if probed is None:
                why = ("its gated norm is not RMSNorm over groups of intermediate_size / n_groups "
                       "(as the fused path computes)")
        if not str(getattr(module, "activation", "silu")) in ("silu", "swish"):
            why, probed = f"activation {getattr(module, 'activation', None)!r} is not silu", None
        if why is None:
            spec.update(fused=True, gate_without_norm=not rms)
            if probed is not None:
                spec.update(norm_before_gate=probed[0], eps=probed[1])
    what = "mamba2_chunk_scan -> baracuda_torch.mamba.mamba_chunk_scan_combined"
    if decode:
        what += ("; decoding (one token with a cache): causal_conv1d_update -> "
                 "baracuda::causal_conv1d_update, mamba2_selective_state_update -> "
                 "baracuda::selective_state_update")
    if spec.get("as_called"):
        what += ("; mamba2_split_conv1d_scan_combined (training, no cache; transformers runs "
                 "mamba_ssm's fused kernel there) -> baracuda_torch.mamba."
                 "mamba_split_conv1d_scan_combined with the call's arguments")
    elif spec["fused"]:
        what += ("; mamba2_split_conv1d_scan_combined (training, no cache, no attention_mask) -> "
                 "baracuda_torch.mamba.mamba_split_conv1d_scan_combined")
        if spec["norm_before_gate"] is not None:
            what += f" (norm_before_gate={spec['norm_before_gate']}, as its norm computes)"
    elif why:
        what += f"; training path stays transformers' PyTorch path: {why}"
    return spec, what


def _build(cls: type, spec: dict) -> Callable[..., Any] | None:
    """The patched forward function (unbound) for a module of class ``cls``; None when the
    spec was made under another transformers version (then the class forward runs, until
    apply_baracuda decides again)."""
    kind = spec.get("kind")
    fwd = cls.forward
    if spec.get("transformers") != _tf_version():
        return None
    if kind == "rope":
        return _rebind(fwd, {"apply_rotary_pos_emb": _apply_rotary_pos_emb})
    if kind == "mlp":
        return _make_mlp_forward(spec["gated"])
    if kind == "rmsnorm":
        return _make_norm_forward(spec["convention"], spec["arg"])
    mamba = _mamba_module() if kind == "mamba" else None
    if mamba is None:
        return None
    # The replacements, in the function that makes each call (see _scan_site and
    # _decode_sites): the forward's own globals, or those of the mamba2_scan_forward and
    # causal_conv1d_forward it calls (5.25), rebuilt and given to the forward in their place.
    top, scan = _unwrap(fwd), _scan_site(fwd)
    if scan is None:
        return None
    inner: dict[str, Any] = {"mamba2_chunk_scan": _make_chunk_scan(mamba)}
    common: dict[str, Any] = {}
    if spec.get("decode"):
        conv = _decode_sites(fwd, scan)["causal_conv1d_update"]  # (the state update's site is the scan's)
        inner["mamba2_selective_state_update"] = _make_state_update(scan.__globals__["mamba2_selective_state_update"])
        conv_update = {"causal_conv1d_update": _make_conv_update(conv.__globals__["causal_conv1d_update"])}
        if conv is top:
            common.update(conv_update)
        else:
            common["causal_conv1d_forward"] = _rebind(conv, conv_update)
    if scan is top:
        common.update(inner)
    else:
        common["mamba2_scan_forward"] = _rebind(scan, inner)
    unfused = _rebind(fwd, {**common, "mamba2_split_conv1d_scan_combined": _no_fused_path})
    if not spec["fused"]:
        return unfused
    if spec.get("as_called"):
        return _rebind(fwd, {**common,
                             "mamba2_split_conv1d_scan_combined": _make_split_conv1d_scan_as_called(mamba)})
    fused = _rebind(fwd, {**common,
                          "mamba2_split_conv1d_scan_combined": _make_split_conv1d_scan(
                              mamba, spec["norm_before_gate"], spec["eps"], spec["gate_without_norm"])})
    pos = spec["mask_pos"]

    def forward(self, *args, **kwargs):
        # The fused path never sees attention_mask: with one, the PyTorch path masks padding.
        mask = kwargs.get("attention_mask", args[pos] if pos is not None and len(args) > pos else None)
        return (fused if mask is None else unfused)(self, *args, **kwargs)
    return forward


class _PatchedForward:
    """The forward installed on a patched module instance: calls the rebuilt function
    bound to the module. Pickles (``torch.save``, ``copy.deepcopy``) as the module and the
    spec, and is rebuilt from them on load."""

    def __init__(self, module: nn.Module, spec: dict, fn: Callable[..., Any] | None = None) -> None:
        self.module = module
        self.spec = spec
        self.fn = fn if fn is not None else _build(type(module), spec)
        try:  # every patched forward takes the class forward's arguments
            self.__signature__ = inspect.signature(types.MethodType(type(module).forward, module))
        except (TypeError, ValueError):
            pass

    @property
    def active(self) -> bool:
        return self.fn is not None

    def __call__(self, *args, **kwargs):
        if self.fn is None:
            return type(self.module).forward(self.module, *args, **kwargs)
        return self.fn(self.module, *args, **kwargs)

    def __reduce__(self):
        return (_PatchedForward, (self.module, self.spec))


def _patched(module: nn.Module) -> _PatchedForward | None:
    fwd = module.__dict__.get("forward")
    return fwd if isinstance(fwd, _PatchedForward) and fwd.active else None


# ---- public API ------------------------------------------------------------------

def apply_baracuda(model: nn.Module) -> str:
    """Patch a Hugging Face transformers model in place to use baracuda_torch's ops; see
    the module docstring for what is replaced and how.

    Args:
        model: an instantiated model (``LlamaForCausalLM``, ``MistralModel``,
            ``Qwen3ForCausalLM``, ``GemmaForCausalLM``, ``Mamba2ForCausalLM``, ...).

    Returns:
        A non-empty, human-readable description of every replacement (and of what was
        left alone and why). Calling it again on a patched model changes nothing.

    Raises:
        ValueError: nothing in ``model`` can be patched (the message names its class,
            the transformers version and what was found).
    """
    counts: dict[str, int] = {}
    notes: list[str] = []
    norms_left: dict[tuple[str, str], list[str]] = {}
    for name, module in model.named_modules():
        if _patched(module) is not None:
            key = f"{type(module).__name__}: already patched ({getattr(module, _PATCH_ATTR, '?')})"
            counts[key] = counts.get(key, 0) + 1
            continue
        planned = _plan(name, module, notes, norms_left)
        if planned is None:
            continue
        spec, what = planned
        fwd = _PatchedForward(module, spec)
        if not fwd.active:  # pragma: no cover - _plan and _build agree
            continue
        module.forward = fwd
        setattr(module, _PATCH_ATTR, what)
        key = f"{type(module).__name__}: {what}"
        counts[key] = counts.get(key, 0) + 1
    for (cls, why), names in norms_left.items():
        where = names[0] + (f", ... ({len(names)} modules)" if len(names) > 1 else "")
        notes.append(f"{where} ({cls}): {why}; left unpatched")
    if not counts:
        detail = ("; " + "; ".join(notes)) if notes else ""
        raise ValueError(
            f"baracuda_torch.apply_baracuda: cannot patch model class {type(model).__name__} "
            f"(transformers {_tf_version()}): no LLaMA-family attention (apply_rotary_pos_emb + "
            "rotate_half), gated MLP (gate_proj/up_proj/down_proj with a silu, gelu, relu or "
            "sigmoid act_fn), RMSNorm with LlamaRMSNorm's or GemmaRMSNorm's code or Mamba-2 "
            "mixer calling mamba2_chunk_scan found to patch (supported: Llama, Mistral, Qwen2, "
            "Qwen3, Gemma, Gemma2, Gemma3 and models sharing their attention/MLP/RMSNorm code; "
            "the Mamba-2 mixers of Mamba2, Bamba and FalconH1 where their forward calls "
            "mamba2_chunk_scan, itself or through mamba2_scan_forward: transformers 5.16 through "
            "5.25 of the tested releases)"
            f"{detail}")
    lines = [f"baracuda_torch patched {type(model).__name__}:"]
    lines += [f"  {n} x {k}" for k, n in counts.items()]
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)


def remove_baracuda(model: nn.Module) -> int:
    """Undo :func:`apply_baracuda` on ``model``; returns how many modules were restored."""
    n = 0
    for module in model.modules():
        fwd = module.__dict__.get("forward")
        if isinstance(fwd, _PatchedForward) or getattr(module, _PATCH_ATTR, None) is not None:
            module.__dict__.pop("forward", None)
            module.__dict__.pop(_PATCH_ATTR, None)
            n += 1
    return n
