"""Train a small randomly initialised Hugging Face LLaMA on synthetic tokens, with and
without baracuda_torch's patch (apply_baracuda), printing the loss and ms/step.

    python examples/train_llama.py                 # both, one after the other (same init, same data)
    python examples/train_llama.py --patch         # patched only
    python examples/train_llama.py --no-patch      # stock transformers only
    python examples/train_llama.py --steps 300 --device cuda --dtype bfloat16

The data is a fixed synthetic language (each token determined by the two before it,
plus noise), so the loss falls well below log(vocab) within a few hundred steps.
About a minute on a laptop CPU with the defaults; on CUDA when present.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch

try:
    import transformers
except ImportError as e:  # pragma: no cover
    raise SystemExit("this example needs transformers: pip install 'baracuda_torch[hf]'") from e

import baracuda_torch  # noqa: F401  (registers the ops)
from baracuda_torch.integrations.huggingface import apply_baracuda


def synthetic_batches(vocab: int, batch: int, seq: int, steps: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab, (vocab, vocab), generator=g)  # next = table[t-2, t-1]
    for _ in range(steps):
        x = torch.empty(batch, seq, dtype=torch.long)
        x[:, :2] = torch.randint(0, vocab, (batch, 2), generator=g)
        for t in range(2, seq):
            x[:, t] = table[x[:, t - 2], x[:, t - 1]]
        noise = torch.rand(batch, seq, generator=g) < 0.05
        x[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
        yield x.to(device)


def train(model: torch.nn.Module, args, label: str) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    times, loss = [], float("nan")
    for step, ids in enumerate(synthetic_batches(args.vocab, args.batch, args.seq, args.steps, args.device)):
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        loss = out.loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"[{label}] step {step:4d}  loss {loss:.4f}  {1000 * times[-1]:.1f} ms/step")
    warm = times[min(10, len(times) - 1):]
    ms = 1000 * sorted(warm)[len(warm) // 2]
    print(f"[{label}] final loss {loss:.4f}, median {ms:.1f} ms/step over {len(warm)} steps")
    return loss, ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--patch", dest="patch", action="store_true", default=None, help="patched run only")
    p.add_argument("--no-patch", dest="patch", action="store_false", help="stock run only")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))

    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                   intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=max(256, args.seq))
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(cfg).to(args.device, dtype)
    print(f"LLaMA {sum(p.numel() for p in base.parameters()) / 1e6:.2f} M parameters, {args.device} {dtype}, "
          f"batch {args.batch} x {args.seq} tokens, {args.steps} steps")
    results = {}
    for patched in ([False, True] if args.patch is None else [args.patch]):
        model = copy.deepcopy(base)
        if patched:
            print(apply_baracuda(model))
        results["patched" if patched else "stock"] = train(model, args, "patched" if patched else "stock")
    if len(results) == 2:
        (ls, ms), (lp, mp) = results["stock"], results["patched"]
        print(f"final loss stock {ls:.4f} vs patched {lp:.4f}; ms/step stock {ms:.1f} vs patched {mp:.1f} "
              f"({ms / mp:.2f}x)")


if __name__ == "__main__":
    main()
