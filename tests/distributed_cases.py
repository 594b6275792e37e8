"""The per-rank bodies of tests/test_distributed.py and tests/test_distributed_nccl.py
(run by distributed_harness.run in spawned processes; not a test module). Each rank
builds the whole problem from the same seed, runs the single-process float64
computation over the whole sequence on the CPU as the reference, runs the
context-parallel one on its own shard on its device (:func:`rank_device`: the CPU under
gloo, its GPU under NCCL), and asserts: its outputs and its shard of every per-token
gradient against the reference's slice, and the sum over the group of every shared
gradient (A, D, dt_bias, initial_states, the layer's parameters) against the
reference's, within ``rtol_for`` of the dtype (the same rule on either device)."""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from baracuda_torch import distributed as bdist
from baracuda_torch import mamba
from test_ssd_chunk_scan import check, rtol_for

SCAN_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
PER_TOKEN = ("x", "dt", "B", "C", "z")


def rank_device() -> torch.device:
    """This rank's device: its GPU (``torch.cuda.current_device()``, which
    distributed_harness sets to cuda:rank) when the default group is NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bounds_of(lengths, rank):
    start = sum(lengths[:rank])
    return start, start + lengths[rank]


def seq_idx_from_starts(b, L, starts, dtype=torch.int64):
    """[b, L] sequence numbers: row i starts a new sequence at each position of
    starts[i % len(starts)] (global positions)."""
    s = torch.zeros(b, L, dtype=torch.int64)
    for i in range(b):
        for p in starts[i % len(starts)]:
            s[i, p] = 1
    return s.cumsum(1).to(dtype)


def scan_inputs(spec):
    """The whole problem of `spec` (float64 values rounded to spec["dtype"]) and the
    scan's keyword options."""
    g = torch.Generator().manual_seed(spec["seed"])
    b, H, P, N, G = spec["b"], spec["H"], spec["P"], spec["N"], spec["G"]
    L = sum(spec["lengths"])
    dtype = spec["dtype"]

    def rn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    softplus = spec.get("softplus", False)
    dt = rn(b, L, H) - 1.5 if softplus else F.softplus(rn(b, L, H) - 1)
    t = {"x": rn(b, L, H, P), "dt": dt, "A": -torch.exp(0.5 * rn(H)), "B": rn(b, L, G, N),
         "C": rn(b, L, G, N)}
    if spec.get("D"):
        t["D"] = rn(H, P) if spec["D"] == "hdim" else rn(H)
    if spec.get("z"):
        t["z"] = rn(b, L, H, P)
    if spec.get("dt_bias"):
        t["dt_bias"] = 0.3 * rn(H)
    if spec.get("init"):
        t["initial_states"] = rn(b, H, P, N)
    t = {k: v.to(dtype) for k, v in t.items()}
    if spec.get("starts") is not None:
        t["seq_idx"] = seq_idx_from_starts(b, L, spec["starts"], spec.get("idx_dtype", torch.int64))
    kw = {"dt_softplus": softplus,
          "dt_limit": (0.02, 0.8) if spec.get("limit") else (0.0, float("inf"))}
    return t, kw


def _leaves(t, sl=None, keys=PER_TOKEN):
    out = {}
    for k, v in t.items():
        if sl is not None and k in keys + ("seq_idx",):
            v = v[:, sl]
        out[k] = v.detach().clone().requires_grad_() if v.is_floating_point() else v
    return out


def _call(fn, leaves, chunk, kw, **extra):
    return fn(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], chunk,
              D=leaves.get("D"), z=leaves.get("z"), dt_bias=leaves.get("dt_bias"),
              initial_states=leaves.get("initial_states"), seq_idx=leaves.get("seq_idx"),
              return_final_states=True, **kw, **extra)


def scan_case(rank, world, spec):
    """mamba_chunk_scan_combined with cp_group against one float64 process."""
    lengths, chunk = spec["lengths"], spec["chunk"]
    assert len(lengths) == world
    t, kw = scan_inputs(spec)
    b, L, H, P = t["x"].shape
    N = t["B"].size(-1)
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    dout = torch.randn(b, L, H, P, generator=g, dtype=torch.float64)
    dstate = torch.randn(world, b, H, P, N, generator=g, dtype=torch.float64)
    start, end = bounds_of(lengths, rank)

    # The reference: one process, float64, over the whole sequence; the state after
    # each rank's shard is the final state of the prefix up to its end.
    ref = _leaves({k: (v.double() if v.is_floating_point() else v) for k, v in t.items()})
    out64, _ = _call(mamba.mamba_chunk_scan_combined, ref, chunk, kw)
    loss = (out64 * dout).sum()
    ends64, ends64_graph = [], []
    for j in range(world):
        e = sum(lengths[:j + 1])
        pre = {k: (v[:, :e] if k in PER_TOKEN + ("seq_idx",) else v) for k, v in ref.items()}
        _, s_end = _call(mamba.mamba_chunk_scan_combined, pre, chunk, kw)
        ends64.append(s_end.detach())
        ends64_graph.append(s_end)
        loss = loss + (s_end * dstate[j]).sum()
    names = [k for k in SCAN_NAMES if k in ref]
    g64 = dict(zip(names, torch.autograd.grad(loss, [ref[k] for k in names], retain_graph=True)))
    # A shared gradient sums every token's (and every rank's) terms and can cancel to far
    # below their magnitude, which is what float32 rounding follows: its tolerance takes
    # the larger of its own scale and that of the same gradient for a second loss.
    loss2 = (out64 * torch.randn(out64.shape, generator=g, dtype=torch.float64)).sum()
    loss2 = loss2 + sum((e * torch.randn(e.shape, generator=g, dtype=torch.float64)).sum() for e in ends64_graph)
    term_scale = {k: gr.abs().max().item()
                  for k, gr in zip(names, torch.autograd.grad(loss2, [ref[k] for k in names]))}

    # Context parallel: this rank's shard, on this rank's device.
    device = rank_device()
    mine = _leaves({k: v.to(device) for k, v in t.items()}, slice(start, end))
    out, s_end = _call(bdist.mamba_chunk_scan_combined, mine, chunk, kw,
                       cp_group=dist.group.WORLD)
    dtype = t["x"].dtype
    rtol = rtol_for(dtype, device.type)
    what = f"rank {rank}/{world} of {spec['name']}"
    assert out.shape == (b, end - start, H, P) and out.dtype == dtype and out.device == device
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert s_end.shape == (b, H, P, N) and s_end.dtype == state_dtype
    check(out, out64[:, start:end], rtol, f"out of {what}")
    check(s_end, ends64[rank], rtol, f"final_states of {what}")
    grads = torch.autograd.grad([out, s_end], [mine[k] for k in names],
                                [dout[:, start:end].to(device, dtype),
                                 dstate[rank].to(device, state_dtype)],
                                allow_unused=True)
    for k, gr in zip(names, grads):
        if gr is None:
            gr = torch.zeros_like(mine[k])
        if k in PER_TOKEN:
            check(gr, g64[k][:, start:end], rtol, f"d{k} of {what}")
        else:  # shared: this rank's share; the group's sum is the whole gradient
            gr = gr.contiguous()
            dist.all_reduce(gr)
            own = max(g64[k].abs().max().item(), 1e-300)
            check(gr, g64[k], rtol * max(1.0, term_scale[k] / own), f"d{k} (summed over the group) of {what}")


def scan_cases(rank, world, specs):
    for spec in specs:
        scan_case(rank, world, spec)


# ---- the Mamba-2 layer ---------------------------------------------------------------


def make_layer(spec):
    torch.manual_seed(spec["seed"])
    return mamba.Mamba2(d_model=spec.get("d_model", 16), d_state=spec.get("d_state", 8),
                        d_conv=spec.get("d_conv", 4), expand=2, headdim=spec.get("headdim", 8),
                        ngroups=spec.get("ngroups", 2), chunk_size=spec.get("chunk", 16),
                        D_has_hdim=spec.get("D_has_hdim", False),
                        rmsnorm=spec.get("rmsnorm", True),
                        norm_before_gate=spec.get("norm_before_gate", False),
                        dt_limit=spec.get("dt_limit", (0.0, float("inf"))))


def layer_inputs(spec):
    g = torch.Generator().manual_seed(spec["seed"] + 2)
    b, L, d = spec["b"], sum(spec["lengths"]), spec.get("d_model", 16)
    u = torch.randn(b, L, d, generator=g, dtype=torch.float64)
    w = torch.randn(b, L, d, generator=g, dtype=torch.float64)
    seq_idx = None
    if spec.get("starts") is not None:
        seq_idx = seq_idx_from_starts(b, L, spec["starts"], torch.int32)
    return u, w, seq_idx


def layer_reference(spec):
    """out, d(u) and every parameter's gradient of one float64 process over the whole
    sequence, for the loss Σ out·w."""
    model = make_layer(spec).double()
    u, w, seq_idx = layer_inputs(spec)
    u = u.clone().requires_grad_()
    out = model(u, seq_idx=seq_idx)
    (out * w).sum().backward()
    return out.detach(), u.grad, {n: p.grad for n, p in model.named_parameters()}


def layer_case(rank, world, spec):
    """Mamba2(cp_group=...) in float32 on this rank's shard and device against one float64
    process on the CPU. With spec["wrap"] = "ddp" (DistributedDataParallel; under NCCL
    with ``device_ids=[this GPU]``) or "fsdp" (FSDP2's fully_shard on a 1-d mesh of the
    rank's device type, the parameters sharded over the ranks), the wrapper's collectives
    on WORLD and the CP exchanges on a separate group; the loss scaled by the world size,
    so that the wrapper's average of the gradients is the whole gradient (FSDP2 of torch
    2.8 on gloo sums them instead: _fsdp_reduction tells)."""
    lengths = spec["lengths"]
    assert len(lengths) == world
    out64, du64, dp64 = layer_reference(spec)
    start, end = bounds_of(lengths, rank)
    u, w, seq_idx = layer_inputs(spec)
    device = rank_device()
    wrap = spec.get("wrap")
    model = make_layer(spec).to(device)
    model.cp_group = dist.new_group(list(range(world))) if wrap else dist.group.WORLD
    runner = model
    if wrap == "ddp":
        runner = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    elif wrap == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        runner = fully_shard(model, mesh=init_device_mesh(device.type, (world,)))
    u_r = u[:, start:end].float().to(device).requires_grad_()
    seq_r = None if seq_idx is None else seq_idx[:, start:end].to(device)
    out = runner(u_r, seq_idx=seq_r)
    loss = (out * w[:, start:end].float().to(device)).sum()
    (loss * world if wrap else loss).backward()
    rtol = rtol_for(torch.float32, device.type)
    what = f"rank {rank}/{world} of {spec['name']}"
    check(out, out64[:, start:end], rtol, f"out of {what}")
    du = u_r.grad / world if wrap else u_r.grad   # the scaled loss; wrappers average parameters only
    check(du, du64[:, start:end], rtol, f"du of {what}")
    reduced = _fsdp_reduction(world, device) if wrap == "fsdp" else 1.0
    for n, p in model.named_parameters():
        if wrap == "fsdp":
            gr = p.grad.full_tensor() / reduced    # this rank holds a shard of the averaged one
        else:
            gr = p.grad.clone()
        if not wrap:
            dist.all_reduce(gr)
        check(gr, dp64[n], rtol, f"d{n} (summed over the group) of {what}")


@functools.cache
def _fsdp_reduction(world, device):
    """What FSDP2 makes of gradients across ranks: 1 where it averages them, `world` where
    it sums them (torch 2.8 on gloo sums, newer torch averages), from a one-parameter
    module whose gradient is 1 on every rank; probed once a process (every rank's first
    FSDP2 case, so all ranks take part in its collectives)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    probe = torch.nn.Linear(world, 1, bias=False, device=device)
    fully_shard(probe, mesh=init_device_mesh(device.type, (world,)))
    probe(torch.ones(1, world, device=device)).sum().backward()
    g = probe.weight.grad.full_tensor()
    assert torch.allclose(g, g[0, 0].expand_as(g)) and g[0, 0].item() in (1.0, float(world)), g
    return g[0, 0].item()


def layer_cases(rank, world, specs):
    for spec in specs:
        layer_case(rank, world, spec)


# ---- communication volume ------------------------------------------------------------


_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all",
                "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
                "send", "recv", "isend", "irecv", "gather", "scatter", "reduce")


def _counting(counts, group):
    """Wrappers of torch.distributed's collectives that add, for the calls on `group`,
    the bytes this rank sends (the input tensor of all_gather; any tensor argument of
    the others) to counts[name]."""
    real = {n: getattr(dist, n) for n in _COLLECTIVES}

    def wrap(name):
        fn = real[name]

        def counted(*args, **kwargs):
            g = kwargs.get("group")
            if g is group:
                if name == "all_gather":
                    t = args[1] if len(args) > 1 else kwargs["tensor"]
                    nbytes = t.numel() * t.element_size()
                else:
                    nbytes = sum(a.numel() * a.element_size() for a in args
                                 if isinstance(a, torch.Tensor))
                counts[name] = counts.get(name, 0) + nbytes
            return fn(*args, **kwargs)
        return counted
    return real, {n: wrap(n) for n in _COLLECTIVES}


def volume_case(rank, world, spec):
    """The bytes each rank sends through the collectives for one Mamba2 layer, forward
    and backward, at several sequence lengths: the same for every L, equal to the
    formula of docs/distributed.md, and only all_gather."""
    group = dist.group.WORLD
    device = rank_device()
    model = make_layer(spec).to(device)
    model.cp_group = group
    b, d = spec["b"], spec.get("d_model", 16)
    H, P, N, G = model.nheads, model.headdim, model.d_state, model.ngroups
    k = model.d_conv - 1
    conv_dim = model.d_ssm + 2 * G * N
    with_seq = spec.get("with_seq_idx", False)
    expected = (8 * (1 + (b + b * k if with_seq else 0))   # layout: lengths (+ seq_idx edges)
                + 2 * b * k * conv_dim * 4                 # conv halo, forward and backward
                + (b * H * P * N + b * H) * 4              # (S_local, a)
                + b * H * P * N * 4)                       # dS_in
    seen = []
    for L_rank in spec["shard_lengths"]:
        counts = {}
        real, wrapped = _counting(counts, group)
        for n, f in wrapped.items():
            setattr(dist, n, f)
        try:
            u = torch.randn(b, L_rank, d, device=device, requires_grad=True)
            seq_idx = None
            if with_seq:
                seq_idx = (torch.arange(L_rank, device=device) // 7
                           + rank * 1000).expand(b, L_rank).to(torch.int32)
            model(u, seq_idx=seq_idx).square().sum().backward()
        finally:
            for n, f in real.items():
                setattr(dist, n, f)
        assert set(counts) == {"all_gather"}, f"rank {rank}: collectives used: {counts}"
        seen.append(counts["all_gather"])
    assert seen == [expected] * len(seen), (
        f"rank {rank}: bytes sent per layer at shard lengths {spec['shard_lengths']}: {seen}, "
        f"expected {expected} for every L")


def volume_cases(rank, world, specs):
    for spec in specs:
        volume_case(rank, world, spec)


# ---- the harness itself ----------------------------------------------------------------


def fail_on_rank(rank, world, bad_rank):
    """Rank `bad_rank` raises while the others wait in a collective."""
    if rank == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    dist.barrier()


def hang(rank, world):
    """Never returns (the harness's timeout must kill it)."""
    import time
    while True:
        time.sleep(1)
