"""One LLaMA-7B decoder layer, a training step end to end: transformers' ``LlamaModel``
with one layer (hidden 4096, intermediate 11008, 32 heads, 8 KV heads, SDPA attention,
bf16; the final norm included, the embedding not: the input is ``inputs_embeds``) at
batch 2 × 4096 tokens.

Providers, all from the same weights (one model, copied) on the same input and output
gradient:
  torch             the stock model (transformers' eager PyTorch modules)
  baracuda          ``apply_baracuda`` (RoPE, the SwiGLU of the MLP, every RMSNorm)
  liger             Liger-Kernel patched as ``apply_liger_kernel_to_llama``'s defaults
                    patch a ``LlamaModel``: rope, swiglu, rms_norm (its
                    fused-linear-cross-entropy default replaces ``LlamaForCausalLM``'s
                    loss, which a ``LlamaModel`` has not, so it is off); from peers/site
                    (``scripts/peers.sh install``), left out with a note when missing;
                    its RoPE patch is a global of ``modeling_llama``, set only while its
                    rows run
  compile           ``torch.compile`` of the stock model
  baracuda+compile  ``torch.compile`` of the patched model

Each provider's output, input gradient and parameter gradients are compared with the
stock model's (max |Δ| / max |stock|; a relative L2 difference of the output above
``--rtol`` is flagged in the note). Times: median (p20–p80) of ``--iters`` steps after
``--warmup`` (CUDA events, ``harness.time_steps``) of the forward alone (autograd
recording, as in training) and of the step (forward, the loss ``(output * dy).sum()``
for a random dy, then ``torch.autograd.grad`` of the input and every parameter:
``layers.py``); peak memory is one step's
``torch.cuda.max_memory_allocated`` above what was allocated before it (weights and
inputs), i.e. activations, gradients and workspaces. ``--profile`` adds the kernels of
one step (torch.profiler), bucketed into GEMMs, attention and the rest.

TFLOP/s counts the model FLOPs of a step, 3 × the forward's: the projections'
2·T·(h·(h + 2·kv·d) + h·h + 3·h·i) and causal attention's 2·B·H·S²·d (half of QKᵀ and
PV), for T = B·S tokens.

  PYTHONPATH=$PWD python benchmarks/bench_llama_layer.py [--profile] [--csv out.csv]
  PYTHONPATH=$PWD python benchmarks/bench_llama_layer.py --device cpu --tiny   # smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402,F401  (puts peers/site on sys.path)
from harness import format_table, write_csv  # noqa: E402
from layers import Provider, format_bucket_table, format_results, run_providers, to_rows  # noqa: E402

FAMILY = "llama_layer"
PROVIDERS = ("torch", "baracuda", "liger", "compile", "baracuda+compile")
RTOL = 2e-2  # relative L2 of bf16 outputs from different kernels

#: kernel buckets of the breakdown: (name, predicate on the lower-cased kernel name)
BUCKETS = [
    ("attention", lambda n: any(s in n for s in ("flash", "fmha", "attention", "sdpa", "attn"))),
    ("GEMM", lambda n: any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul",
                                             "aten::mm", "aten::addmm", "aten::bmm", "triton_tem"))),
]


def config(hidden: int, intermediate: int, heads: int, kv_heads: int, seq: int):
    from transformers import LlamaConfig

    # vocab_size: the embedding is not used (the input is inputs_embeds)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max(seq, 4096), rms_norm_eps=1e-5, use_cache=False,
                      attention_dropout=0.0, attn_implementation="sdpa")
    cfg._attn_implementation = "sdpa"
    return cfg


def build(cfg, device: str, dtype: torch.dtype, seed: int = 0):
    """The stock LlamaModel with seeded weights (norm weights perturbed off 1)."""
    from transformers import LlamaModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaModel(cfg)
    model = model.to(dtype).train()
    model.embed_tokens.requires_grad_(False)  # unused: the input is inputs_embeds
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model


def call(model, x):
    return model(inputs_embeds=x, use_cache=False).last_hidden_state


@contextlib.contextmanager
def llama_globals():
    """Restores what ``apply_liger_kernel_to_llama`` replaces in ``modeling_llama`` (RoPE,
    the RMSNorm and MLP classes) when the block ends, so that it patches only the model
    run inside."""
    from transformers.models.llama import modeling_llama as ml

    names = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")
    saved = {n: getattr(ml, n) for n in names}
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(ml, n, v)


def providers(base, device: str, wanted) -> list:
    from baracuda_torch.integrations.huggingface import apply_baracuda

    def ours():
        m = copy.deepcopy(base)
        desc = apply_baracuda(m)
        if not ours.printed:
            print(desc, flush=True)
            ours.printed = True
        return m
    ours.printed = False

    def compiled(make):
        def f():
            torch._dynamo.reset()  # a fresh cache per provider: no recompile limit
            return torch.compile(make())
        return f

    out = []
    for name in wanted:
        if name == "torch":
            out.append(Provider("torch", lambda: copy.deepcopy(base)))
        elif name == "baracuda":
            out.append(Provider("baracuda", ours))
        elif name == "compile":
            out.append(Provider("compile", compiled(lambda: copy.deepcopy(base))))
        elif name == "baracuda+compile":
            out.append(Provider("baracuda+compile", compiled(ours)))
        elif name == "liger":
            def load_liger():
                from liger_kernel.transformers.monkey_patch import apply_liger_kernel_to_llama
                return apply_liger_kernel_to_llama
            patch = peers._try(load_liger)
            if patch is None:
                print("[liger] skipped: Liger-Kernel is not importable (peers/site: "
                      "bash scripts/peers.sh install)", flush=True)
                continue

            def liger(patch=patch):
                m = copy.deepcopy(base)
                patch(rope=True, cross_entropy=False, fused_linear_cross_entropy=False,
                      rms_norm=True, swiglu=True, model=m)
                return m
            out.append(Provider("liger", liger, context=llama_globals,
                                skip="" if device != "cpu" else "Liger's kernels are Triton (CUDA only)"))
        else:
            raise ValueError(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")
    return out


def step_flops(B: int, S: int, h: int, i: int, heads: int, kv_heads: int) -> float:
    d = h // heads
    T = B * S
    proj = 2 * T * (h * (h + 2 * kv_heads * d) + h * h + 3 * h * i)
    attn = 2 * B * heads * S * S * d
    return 3.0 * (proj + attn)


def bench(device: str = "cuda", batch: int = 2, seq: int = 4096, hidden: int = 4096,
          intermediate: int = 11008, heads: int = 32, kv_heads: int = 8,
          dtype: torch.dtype = torch.bfloat16, wanted=PROVIDERS, warmup: int = 3, iters: int = 20,
          profile: bool = False, rtol: float = RTOL) -> list:
    cfg = config(hidden, intermediate, heads, kv_heads, seq)
    base = build(cfg, device, dtype)
    torch.manual_seed(1)
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn_like(x)
    case = f"B{batch} S{seq} h{hidden} i{intermediate} heads {heads}/{kv_heads}"
    flops = step_flops(batch, seq, hidden, intermediate, heads, kv_heads)
    print(f"== {FAMILY} {case} {str(dtype).replace('torch.', '')} on {device}", flush=True)
    results = run_providers(providers(base, device, wanted), call, x, dy, device, warmup, iters,
                            profile, BUCKETS, rtol)
    print(format_results(f"{FAMILY} {case}", results, flops if device != "cpu" else None), flush=True)
    if profile:
        print(format_bucket_table(f"{FAMILY} {case}", results, BUCKETS), flush=True)
    return to_rows(FAMILY, case, dtype, results, flops if device != "cpu" else None)


def run() -> list:
    """run_all.py's entry: the LLaMA-7B layer on the GPU, every provider."""
    return bench()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny layer (hidden 256, intermediate 688, 4/2 heads, 2 x 128 tokens): smoke test")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated, from: " + ", ".join(PROVIDERS))
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile providers")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rtol", type=float, default=RTOL)
    p.add_argument("--profile", action="store_true", help="per-kernel breakdown of one step (torch.profiler)")
    p.add_argument("--csv", help="append the rows to this CSV (harness.write_csv)")
    a = p.parse_args(argv)
    shape = dict(batch=2, seq=4096, hidden=4096, intermediate=11008, heads=32, kv_heads=8)
    if a.tiny:
        shape = dict(batch=2, seq=128, hidden=256, intermediate=688, heads=4, kv_heads=2)
    for k in shape:
        if getattr(a, k) is not None:
            shape[k] = getattr(a, k)
    wanted = [w for w in a.providers.split(",") if w and not (a.no_compile and "compile" in w)]
    rows = bench(a.device, dtype=getattr(torch, a.dtype), wanted=wanted, warmup=a.warmup,
                 iters=a.iters, profile=a.profile, rtol=a.rtol, **shape)
    print(format_table(rows))
    if a.csv:
        write_csv(rows, a.csv)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
