"""Context-parallel training of a small Mamba-2 language model: each sequence is split
along its length into contiguous shards, one per rank of a context-parallel (CP) group,
and every Mamba2 layer (``Mamba2(..., cp_group=...)``) exchanges only its conv halo and
its SSM state over the group (docs/distributed.md).

    torchrun --nproc-per-node 2 examples/context_parallel_mamba2.py [--seq 1024] [--steps 30]
    torchrun --nproc-per-node 4 examples/context_parallel_mamba2.py --cp-size 2   # 2 DP x 2 CP

gloo on the CPU, NCCL on GPUs (one GPU per rank). Ranks form data-parallel replicas of
``--cp-size`` consecutive ranks (default: all ranks, pure context parallelism); each
replica trains on its own batch of packed sequences (two synthetic documents per row,
``seq_idx`` marking them, the boundary at a random position: documents span shards). DistributedDataParallel
averages the gradients over all ranks; each rank's loss is scaled by the CP size so that
the average is the data-parallel mean of whole-sequence gradients.

Step 0 is checked first (``--no-check`` skips it): on every rank, the loss and every
parameter's gradient (summed over the CP group) against one process running the whole
sequence of the same batch; the script exits with status 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from baracuda_torch.distributed import shard_bounds
from baracuda_torch.mamba import Mamba2


class MambaLM(nn.Module):
    """Embedding, pre-norm residual Mamba2 layers, final norm, LM head."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, cp_group=None, **mamba_kw):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(n_layers))
        self.layers = nn.ModuleList(Mamba2(d_model, layer_idx=i, cp_group=cp_group, **mamba_kw)
                                    for i in range(n_layers))
        self.norm_f = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, seq_idx=None):
        h = self.embed(tokens)
        for norm, layer in zip(self.norms, self.layers):
            h = h + layer(norm(h), seq_idx=seq_idx)
        return self.head(self.norm_f(h))


def make_batch(gen, batch: int, seq: int, vocab: int, device):
    """Rows of two packed documents (the boundary anywhere): each starts at a random token
    and follows a fixed random successor table, one token in ten replaced by a random
    one. Returns (inputs, labels, seq_idx) over the whole sequence; labels are -100
    where the next token belongs to the other document."""
    succ = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    tokens = torch.empty(batch, seq + 1, dtype=torch.long)
    seq_idx = torch.zeros(batch, seq + 1, dtype=torch.int32)
    noise = torch.rand(batch, seq + 1, generator=gen) < 0.1
    rand = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    for b in range(batch):
        cut = int(torch.randint(1, seq, (1,), generator=gen))
        seq_idx[b, cut:] = 1
        for t in range(seq + 1):
            if t in (0, cut) or noise[b, t]:
                tokens[b, t] = rand[b, t]
            else:
                tokens[b, t] = succ[tokens[b, t - 1]]
    labels = tokens[:, 1:].clone()
    labels[seq_idx[:, 1:] != seq_idx[:, :-1]] = -100
    return tokens[:, :-1].to(device), labels.to(device), seq_idx[:, :-1].to(device)


def max_rel_err(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cp-size", type=int, default=None, help="ranks per CP group (default: all)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=2, help="sequences per data-parallel replica")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence (whole, not per rank)")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--no-check", dest="check", action="store_false")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    cp = args.cp_size or world
    if world % cp:
        raise SystemExit(f"--cp-size {cp} must divide the world size {world}")
    dp = world // cp
    # Every rank creates every group, in the same order. The CP exchanges get their own
    # communicators, apart from DDP's (WORLD): DDP's bucket all-reduces, issued from
    # autograd hooks, must not interleave with the CP collectives on one communicator.
    cp_groups = [dist.new_group(list(range(i * cp, (i + 1) * cp))) for i in range(dp)]
    replica, cp_rank = divmod(rank, cp)
    cp_group = cp_groups[replica]
    start, end = shard_bounds(args.seq, cp, cp_rank)

    if cuda:  # float32 products for the step-0 check (TF32 would differ by ~1e-3)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    mamba_kw = dict(d_state=16, d_conv=4, expand=2, headdim=16, chunk_size=64)
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = MambaLM(args.vocab, args.d_model, args.layers, cp_group=cp_group, **mamba_kw).to(device)
    torch.manual_seed(0)  # the same parameters, one process over the whole sequence
    reference = (MambaLM(args.vocab, args.d_model, args.layers, **mamba_kw).to(device)
                 if args.check else None)
    gen = torch.Generator().manual_seed(1000 + replica)  # one batch stream per replica
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"Mamba-2 LM {n / 1e6:.2f} M parameters on {world} ranks ({dp} DP x {cp} CP, "
              f"{dist.get_backend()}, {device.type}); batch {args.batch} x {args.seq} tokens per "
              f"replica, {end - start} tokens per rank", flush=True)

    def local_loss(net, inputs, labels, seq_idx):
        """This rank's share of the replica's mean token loss (the shares sum to it)."""
        logits = net(inputs[:, start:end], seq_idx=seq_idx[:, start:end])
        n_valid = (labels != -100).sum()   # whole sequence: every rank has the count
        return F.cross_entropy(logits.flatten(0, 1).float(), labels[:, start:end].flatten(),
                               ignore_index=-100, reduction="sum") / n_valid

    if args.check:
        inputs, labels, seq_idx = make_batch(gen, args.batch, args.seq, args.vocab, device)
        loss = local_loss(model, inputs, labels, seq_idx)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=cp_group)
        logits = reference(inputs, seq_idx=seq_idx)
        ref_loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        ref_loss.backward()
        errs = {"loss": max_rel_err(total, ref_loss.detach())}
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            g = p.grad.clone()
            dist.all_reduce(g, group=cp_group)
            errs[name] = max_rel_err(g, q.grad)
        worst = max(errs, key=errs.get)
        ok = errs[worst] <= 1e-4      # the float32 chunked scan's tolerance
        flag = torch.tensor([0 if ok else 1], device=device)
        dist.all_reduce(flag)
        print(f"[rank {rank}] step-0 check against one process over the whole sequence: loss "
              f"rel. error {errs['loss']:.1e}; largest gradient rel. error {errs[worst]:.1e} "
              f"({worst}) over {len(errs) - 1} parameters: {'OK' if ok else 'MISMATCH'}", flush=True)
        if flag.item():
            dist.destroy_process_group()
            raise SystemExit(1)
        model.zero_grad(set_to_none=True)
        del reference

    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    times = []
    for step in range(args.steps):
        inputs, labels, seq_idx = make_batch(gen, args.batch, args.seq, args.vocab, device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = local_loss(ddp, inputs, labels, seq_idx)
        (loss * cp).backward()           # DDP averages over dp·cp ranks; the CP shares sum
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        total = loss.detach().clone()
        dist.all_reduce(total)           # Σ over the replica's shards, Σ over replicas
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {total.item() / dp:.4f}  {1000 * times[-1]:.0f} ms", flush=True)
    if rank == 0 and times:
        warm = sorted(times[min(3, len(times) - 1):])
        ms = 1000 * warm[len(warm) // 2]
        print(f"median {ms:.0f} ms/step; {args.batch * (end - start) / ms * 1000:.0f} tokens/s "
              f"per rank", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
