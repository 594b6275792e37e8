"""apply_baracuda over every causal LM the installed transformers registers.

For each model type in transformers' causal-LM registry, a child process builds a tiny
float32 model (2 layers, width 64, 4 heads; a few config variants are tried where the
defaults do not build or run: more layers, hybrid layer types, latent-attention sizes),
runs it unpatched, patches a deep copy, and compares logits (evaluation with and without
left padding, and the training step) and the training step's gradients. One line per
model type, then a summary:

    ok            patched, same logits and gradients (the errors are relative to the
                  largest value: logits of the batch, gradients of each parameter)
    DIFFERS       patched, and a logit over 1e-4 or a gradient over 1e-3 of its scale
    PATCHED-FAIL  the unpatched model runs, the patched one raises
    nothing       apply_baracuda raised its "cannot patch model class" ValueError
    skipped       the tiny model does not build, or does not run unpatched, or is over
                  --max-params (vision towers, audio codecs, ...), or the child ran out
                  of --mem-gb or --timeout

    PYTHONPATH=. python scripts/hf_sweep.py                      # every type
    PYTHONPATH=. python scripts/hf_sweep.py --types llama,phi3   # some

Exit status 1 when any type DIFFERS or is PATCHED-FAIL. CPU only; a child process a type
(about 5 s each with transformers 5.25, most of it importing).
"""
from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import warnings

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0)
# tried in order until the unpatched model builds and runs
VARIANTS = [
    {},
    dict(num_hidden_layers=4),
    dict(layer_types=["linear_attention", "full_attention"]),
    dict(head_dim=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
         num_key_value_heads=4),
]
LOGIT_TOL, GRAD_TOL = 1e-4, 1e-3


def tiny_config(model_type, variant=None):
    """transformers' config of ``model_type`` at SMALL's sizes with ``variant``'s overrides
    (a None value drops the key), its mixture of experts shrunk (at most 4 experts of width
    32, 2 a token) and eager attention. Raises what the config class raises."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    kw = {k: v for k, v in {**SMALL, **(variant or {})}.items() if v is not None}
    cfg = CONFIG_MAPPING[model_type](**kw)
    for k in ("num_experts", "num_local_experts", "n_routed_experts"):  # few small experts
        if isinstance(getattr(cfg, k, None), int):
            setattr(cfg, k, min(getattr(cfg, k), 4))
    for k, top in (("num_experts_per_tok", 2), ("moe_topk", 2), ("n_group", 1), ("topk_group", 1)):
        if isinstance(getattr(cfg, k, None), int):
            setattr(cfg, k, min(getattr(cfg, k), top))
    for k in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if isinstance(getattr(cfg, k, None), int):
            setattr(cfg, k, 32)
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001 - a config without the attribute keeps its default
        pass
    return cfg


def tiny_model(model_type, cfg):
    """The causal LM of ``model_type`` on ``cfg`` in float32 (seed 0), its 1-d parameters
    (norm weights, biases) moved off their initial values so their gradients count."""
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model


def _run(model, ids, mask):
    """Logits (eval without and with the mask, and training) and the training gradients."""
    import torch
    out = []
    model.eval()
    with torch.no_grad():
        out.append(model(input_ids=ids, use_cache=False).logits)
        out.append(model(input_ids=ids, attention_mask=mask, use_cache=False).logits)
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same dropout draws, if any
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logits.float().square().mean().backward()
    out.append(logits.detach())
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def one(model_type, max_params):
    import torch
    from baracuda_torch.integrations.huggingface import apply_baracuda
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 96, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0
    keep = mask.bool()
    why = "no variant builds"
    for variant in VARIANTS:
        try:
            base = tiny_model(model_type, tiny_config(model_type, variant))
        except Exception as e:  # noqa: BLE001 - transformers' own config checks
            why = f"build: {type(e).__name__}: {str(e)[:120]}"
            continue
        n = sum(p.numel() for p in base.parameters())
        if n > max_params:
            return dict(status="skipped", why=f"{n / 1e6:.1f}M parameters")
        patched = copy.deepcopy(base)
        try:
            want, gwant = _run(base, ids, mask)
        except Exception as e:  # noqa: BLE001 - the unpatched model does not run this config
            why = f"unpatched: {type(e).__name__}: {str(e)[:120]}"
            continue
        try:
            apply_baracuda(patched)
        except ValueError as e:
            if "cannot patch model class" in str(e):
                return dict(status="nothing", variant=variant)
            raise
        try:
            got, ggot = _run(patched, ids, mask)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            return dict(status="PATCHED-FAIL", why=f"{type(e).__name__}: {str(e)[:200]}")
        lerr = 0.0
        for i, (a, b) in enumerate(zip(got, want)):
            sel = slice(None) if i == 0 else keep
            lerr = max(lerr, ((a - b)[sel].abs().max() / b[sel].abs().max().clamp_min(1e-6)).item())
        gerr = 0.0 if set(ggot) == set(gwant) else float("inf")
        for k in gwant:
            if k in ggot:
                gerr = max(gerr, ((ggot[k] - gwant[k]).abs().max() / gwant[k].abs().max().clamp_min(1e-12)).item())
        status = "ok" if lerr <= LOGIT_TOL and gerr <= GRAD_TOL else "DIFFERS"
        patched_modules = sum(1 for _, m in patched.named_modules() if "forward" in vars(m))
        return dict(status=status, logits=lerr, grads=gerr, modules=patched_modules, variant=variant)
    return dict(status="skipped", why=why)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", help="comma-separated model types (default: every causal LM)")
    ap.add_argument("--max-params", type=float, default=20e6)
    ap.add_argument("--mem-gb", type=float, default=8.0, help="address-space limit of each child")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for each child")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    if args.one:
        import transformers.utils.logging
        transformers.utils.logging.set_verbosity_error()
        print(json.dumps(one(args.one, args.max_params)))
        return 0
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    types = args.types.split(",") if args.types else sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    limit = int(args.mem_gb * 2**30)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    counts: dict[str, int] = {}
    bad = []
    print(f"transformers {transformers.__version__}, {len(types)} causal LM types", flush=True)
    for t in types:
        cmd = [sys.executable, __file__, "--one", t, "--max-params", str(args.max_params)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, preexec_fn=cap)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if lines else dict(
                status="skipped", why=f"child exited {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:120]}")
        except subprocess.TimeoutExpired:
            res = dict(status="skipped", why=f"over {args.timeout:.0f} s")
        s = res["status"]
        counts[s] = counts.get(s, 0) + 1
        if s in ("DIFFERS", "PATCHED-FAIL"):
            bad.append(t)
        detail = (f"logits {res['logits']:.1e} grads {res['grads']:.1e} ({res['modules']} modules patched)"
                  if "logits" in res else res.get("why", ""))
        variant = f" variant {res['variant']}" if res.get("variant") else ""
        print(f"{t}: {s} {detail}{variant}".rstrip(), flush=True)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if bad:
        print("patched differently: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
