"""Side by side with the peer libraries on the interfaces real models call (GPU only).

Cases (bf16):
  gated pair   act(gate) * up for gate, up [16384, 11008] (a LLaMA-7B MLP at 16k tokens):
               baracuda ``gated_activation_pair``, Liger-Kernel's SwiGLU/GeGLU (tanh)
               functions, and eager PyTorch.
  rope HF      ``apply_rotary_pos_emb(q, k, cos, sin)`` with q [8, 32, 4096, 128], k [8, 8,
               4096, 128] (grouped-query) and HF cos/sin [1, 4096, 128]: baracuda, Liger's
               RoPE, and Hugging Face's eager formula.
  rope flash   x [8, 4096, 32, 128] ([B, S, H, D]) with flash-attention's [S, R/2] table:
               baracuda ``rope_cos_sin`` (on the ``transpose(1, 2)`` view, no copy) and
               flash-attention's Triton ``apply_rotary``. flash-attention's op has no
               autograd of its own (its module calls the same kernel with
               ``conjugate=True`` for the gradient), so its backward row times that call.

Each peer runs on its own copies of the inputs (Liger's backward writes into saved
tensors), and its output is checked against ours before anything is timed
(``peers.agree``). A peer that is not installed (``scripts/peers.sh``) is left out.
Bytes: the gated forward reads gate and up and writes the result (3·T·F·elt), its
backward reads dy, gate, up and writes two gradients (5·T·F·elt); RoPE reads and writes
each tensor once in either direction (the tables are not counted).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import baracuda_torch as bt
import peers
from baracuda_torch import reference as ref
from harness import Row, backward_fn, format_table, measure

RTOL = 2e-2  # bf16 outputs of the same inputs from different kernels


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _rows(family: str, case: str, fns: dict, inputs: dict, dy, fwd_bytes: int,
          bwd_bytes: int, check: str) -> list[Row]:
    """Times forward and backward of every provider in ``fns`` (provider -> f(*inputs)),
    after checking each peer's forward against baracuda's."""
    rows = []
    ours = fns["baracuda"](*inputs["baracuda"])
    for provider, f in fns.items():
        args = inputs[provider]
        out = f(*args)
        note = ""
        if provider != "baracuda":
            outs = out if isinstance(out, tuple) else (out,)
            refs = ours if isinstance(ours, tuple) else (ours,)
            note = "; ".join(peers.agree(a, b, f"{check} {provider}", RTOL) for a, b in zip(refs, outs))
        with torch.no_grad():
            r = measure(family, case, args[0].dtype, provider, "forward", lambda: f(*args),
                        nbytes=fwd_bytes)
        r.note = note
        rows.append(r)
        if dy is not None:
            rows.append(measure(family, case, args[0].dtype, provider, "backward",
                                backward_fn(lambda: f(*args), [a for a in args if a.requires_grad], dy),
                                nbytes=bwd_bytes))
    return rows


def gated_pair(T: int = 16384, F_: int = 11008, dtype=torch.bfloat16) -> list[Row]:
    liger = peers.liger_gated()
    rows = []
    gate = torch.randn(T, F_, device="cuda", dtype=dtype)
    up = torch.randn(T, F_, device="cuda", dtype=dtype)
    dy = torch.randn(T, F_, device="cuda", dtype=dtype)
    elt = gate.element_size()
    eager = {"swiglu": lambda g, u: F.silu(g) * u,
             "geglu_tanh": lambda g, u: F.gelu(g, approximate="tanh") * u}
    for kind in ("swiglu", "geglu_tanh"):
        fns = {"baracuda": lambda g, u, k=kind: bt.gated_activation_pair(g, u, k)}
        if liger is not None:
            fns["liger"] = liger[kind]
        fns["torch"] = eager[kind]
        inputs = {p: (_leaf(gate), _leaf(up)) for p in fns}
        rows += _rows("gated_activation", f"{kind} pair [{T}, {F_}]", fns, inputs, dy,
                      3 * T * F_ * elt, 5 * T * F_ * elt, kind)
        del inputs
        torch.cuda.empty_cache()
    return rows


def rope_hf(B: int = 8, Hq: int = 32, Hk: int = 8, S: int = 4096, D: int = 128,
            dtype=torch.bfloat16) -> list[Row]:
    liger = peers.liger_rope()
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype)
    k = torch.randn(B, Hk, S, D, device="cuda", dtype=dtype)
    theta = ref.rope_angles(S, None, D, 10000.0, "cuda")
    emb = torch.cat((theta, theta), dim=-1)[None]  # HF: [1, S, D], cat(freqs, freqs)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    dy = (torch.randn_like(q), torch.randn_like(k))
    fns = {"baracuda": lambda a, b: bt.apply_rotary_pos_emb(a, b, cos, sin)}
    if liger is not None:
        fns["liger"] = lambda a, b: liger(a, b, cos, sin)
    fns["torch"] = lambda a, b: (ref.rope_hf(a, cos[:, None], sin[:, None]),
                                 ref.rope_hf(b, cos[:, None], sin[:, None]))
    inputs = {p: (_leaf(q), _leaf(k)) for p in fns}
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    return _rows("rope", f"apply_rotary_pos_emb q [{B}, {Hq}, {S}, {D}] k [{B}, {Hk}, {S}, {D}]",
                 fns, inputs, dy, nbytes, nbytes, "rope_hf")


def rope_flash(B: int = 8, S: int = 4096, H: int = 32, D: int = 128,
               dtype=torch.bfloat16) -> list[Row]:
    flash = peers.flash_attn_rotary()
    if flash is None:
        return []
    x = torch.randn(B, S, H, D, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    theta = ref.rope_angles(S, None, D, 10000.0, "cuda")  # [S, D/2]
    cos, sin = theta.cos().to(dtype), theta.sin().to(dtype)
    case = f"rope_cos_sin [{B}, {S}, {H}, {D}] [S, R/2] table"
    nbytes = 2 * x.numel() * x.element_size()
    xo = _leaf(x)
    ours = lambda: bt.rope_cos_sin(xo.transpose(1, 2), cos, sin).transpose(1, 2)  # noqa: E731
    theirs = lambda: flash(x, cos, sin, False)  # noqa: E731
    note = peers.agree(ours(), theirs(), "rope_flash flash_attn", RTOL)
    rows = []
    with torch.no_grad():
        rows.append(measure("rope", case, dtype, "baracuda", "forward", ours, nbytes=nbytes))
        r = measure("rope", case, dtype, "flash_attn", "forward", theirs, nbytes=nbytes)
    r.note = note
    rows.append(r)
    rows.append(measure("rope", case, dtype, "baracuda", "backward", backward_fn(ours, [xo], dy),
                        nbytes=nbytes))
    from flash_attn_triton_rotary import apply_rotary
    rows.append(measure("rope", case, dtype, "flash_attn", "backward",
                        lambda: apply_rotary(dy, cos, sin, interleaved=False, conjugate=True),
                        nbytes=nbytes))
    return rows


def run() -> list[Row]:
    rows = gated_pair()
    torch.cuda.empty_cache()
    rows += rope_hf()
    torch.cuda.empty_cache()
    return rows + rope_flash()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(format_table(run()))
