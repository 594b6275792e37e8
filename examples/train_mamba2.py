"""Train a small randomly initialised Hugging Face Mamba-2 on synthetic tokens, with and
without baracuda_torch's patch, printing the loss and ms/step (same options as
train_llama.py). The patched run needs ``baracuda_torch.mamba`` (the Mamba-2 scan ops);
without it the script says so and runs the stock model only.

    python examples/train_mamba2.py [--patch | --no-patch] [--steps N] [--device cuda]
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_llama import train  # noqa: E402  (the shared training loop)

try:
    import transformers
except ImportError as e:  # pragma: no cover
    raise SystemExit("this example needs transformers: pip install 'baracuda_torch[hf]'") from e

import baracuda_torch  # noqa: F401,E402
from baracuda_torch.integrations.huggingface import apply_baracuda  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--patch", dest="patch", action="store_true", default=None)
    p.add_argument("--no-patch", dest="patch", action="store_false")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    args = p.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))

    runs = [False, True] if args.patch is None else [args.patch]
    if True in runs and importlib.util.find_spec("baracuda_torch.mamba") is None:
        print("baracuda_torch.mamba is not in this build: running the stock model only")
        runs = [False]

    cfg = transformers.Mamba2Config(vocab_size=args.vocab, hidden_size=args.hidden,
                                    num_hidden_layers=args.layers, state_size=32, expand=2, num_heads=2 * args.hidden // 32,
                                    head_dim=32, n_groups=1, chunk_size=32)
    torch.manual_seed(0)
    base = transformers.Mamba2ForCausalLM(cfg).to(args.device, dtype)
    print(f"Mamba-2 {sum(p.numel() for p in base.parameters()) / 1e6:.2f} M parameters, {args.device} {dtype}")
    results = {}
    for patched in runs:
        model = copy.deepcopy(base)
        if patched:
            print(apply_baracuda(model))
        results[patched] = train(model, args, "patched" if patched else "stock")
    if len(results) == 2:
        (ls, ms), (lp, mp) = results[False], results[True]
        print(f"final loss stock {ls:.4f} vs patched {lp:.4f}; ms/step stock {ms:.1f} vs patched {mp:.1f}")


if __name__ == "__main__":
    main()
