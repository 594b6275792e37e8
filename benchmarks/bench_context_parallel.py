"""Context-parallel Mamba-2 scaling: one Mamba-2 2.7B-shaped layer (d_model 2560, d_state
128, headdim 64, expand 2: 80 heads, ngroups 1, chunk 256, d_conv 4; bf16 parameters and
activations, built as ``bench_mamba2_layer.py`` builds it), a training step (forward,
then ``torch.autograd.grad`` of the input and every parameter) on ONE sequence (batch 1)
of L tokens, on 1 GPU and on W GPUs.

Modes, each timed the same way at every L:
  single  ``Mamba2`` without ``cp_group`` on rank 0's GPU, the whole sequence (the other
          ranks idle)
  cp      ``Mamba2(cp_group=WORLD)`` on W GPUs, rank r holding the contiguous shard
          ``shard_bounds(L, W, r)`` (docs/distributed.md: only the conv halo and the SSM
          state cross the ranks; all_gather)
  a2a     head parallelism in the style of Megatron / DeepSpeed-Ulysses, around the same
          single-GPU ops (:func:`head_parallel_forward`): each rank projects its sequence
          shard, one ``all_to_all_single`` moves x and dt from sequence-sharded to
          head-sharded (H/W heads over the whole sequence; B and C, shared by all heads at
          ngroups 1, go to every rank), the conv and the SSD scan run on the whole
          sequence for the rank's heads, a second all-to-all brings y back to
          sequence-sharded for the gated RMSNorm and out_proj. Its backward is the same
          two exchanges in reverse (an equal-split all-to-all is its own adjoint).

The parameter gradients of cp and a2a are each rank's share; their sum over the group
(an all-reduce that data-parallel training issues anyway, and that DDP overlaps with the
backward) is not part of the timed step.

Per L and mode: the median (p20-p80) step time over ``n`` steps after two warm-up steps
(CUDA events, ``harness.time_steps``; ``n`` from the second step's time, the same on every
rank; for cp and a2a the slowest rank's median), tokens/s (L / step time), the peak memory
of each GPU during one step (``torch.cuda.max_memory_allocated``, absolute: weights and
inputs included), and, for cp and a2a, the communication on rank 0 from torch.profiler
over two steps: the summed device time of the NCCL kernels per step (it includes the
time a kernel waits for the slower rank, so it bounds the transfer time from above;
NCCL calls return to the host at once, so their host-side wall time says nothing) and
their share of all kernel time (on the CPU: the c10d ops' self CPU time, a smoke-test
number). Scaling efficiency = T_single / (W · T_mode).

Before the timings, a check that the distributed runs compute the single-GPU function:
at ``--check-len`` (default 8192), in bfloat16 and in float32 (no TF32), the ranks'
outputs and input gradients concatenated, and the parameter gradients summed over the
ranks, against ``single`` on the whole sequence (relative L2 and max |Δ| / max |ref|).

An out-of-memory error is caught and reported for its phase. Where the peak of the
previous L, scaled linearly to this L, exceeds 92 % of a GPU, a cp or a2a phase is not
started ("predicted OOM": one rank running out of memory alone would leave its peer
waiting in a collective); after an out-of-memory error in a cp or a2a phase, no further
distributed phase runs (the communicator may hold an unfinished collective). A rank
that fails or a run past ``--timeout`` stops everything; the phases recorded so far are
still reported.

Default L: 65536, 131072, 262144, 524288 and 1048576 tokens. The script spawns the W
workers itself (one GPU each, NCCL through a file store, with NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1; the CUDA allocator with
expandable segments unless PYTORCH_CUDA_ALLOC_CONF says otherwise), prints a markdown
table and writes ``bench_context_parallel.json`` to ``--out``. ``--quick``: L = 8192
only; on a machine without W GPUs it runs on the CPU with gloo and the tiny layer shape
(a smoke test of the script, no meaningful times).

  PYTHONPATH=$PWD python benchmarks/bench_context_parallel.py --out $OUT/cp_bench
  PYTHONPATH=$PWD python benchmarks/bench_context_parallel.py --quick --out /tmp/cp_quick
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import pickle
import sys
import tempfile
import time
import traceback
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mamba2_layer import RTOL as BF16_RTOL  # noqa: E402
from bench_mamba2_layer import SHAPES as LAYER_SHAPES  # noqa: E402
from harness import kernel_breakdown, max_rel_diff, rel_l2_diff, step_peak_memory, time_steps  # noqa: E402

#: Every worker's environment: NVLink SHARP (NVLS) and symmetric-memory multicast off.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
MODES = ("single", "cp", "a2a")
DEFAULT_LENGTHS = (65536, 131072, 262144, 524288, 1048576)
QUICK_LENGTHS = (8192,)
#: a phase is not started where the previous L's peak, scaled to this L, is above this
#: share of the GPU's memory
PREDICTED_OOM_SHARE = 0.92
#: the largest relative L2 difference from the single-GPU run the check accepts
CHECK_RTOL = {torch.bfloat16: BF16_RTOL, torch.float32: 1e-4}
JSON_NAME = "bench_context_parallel.json"

# ---- head parallelism (the all-to-all comparison) ----------------------------------------


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of ``t`` [W, ...] over ``group``: block j goes to rank j, and
    block i of the result came from rank i. With equal blocks the exchange is its own
    adjoint, so the backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        t = t.contiguous()
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t, group=group)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        g = g.contiguous()
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g, group=ctx.group)
        return out, None


def head_parallel_forward(model, u: Tensor, group) -> Tensor:
    """``model(u)`` of a :class:`baracuda_torch.mamba.Mamba2` (``rmsnorm=True``,
    ``ngroups=1``, no d_mlp) with the sequence split over ``group`` as for context
    parallelism (``u`` [B, L/W, d_model] this rank's shard, equal shards) and the scan split
    by heads: rank r scans heads ``[r·H/W, (r+1)·H/W)`` over the whole sequence.

    One all-to-all before the conv sends each rank, from every sequence shard, the x and
    dt channels of its heads and the B and C channels (all of them: every head reads
    them); the conv (its weight rows of those channels) and
    :func:`baracuda_torch.mamba.mamba_chunk_scan_combined` (D, dt_bias, softplus,
    dt_limit) run on the whole sequence; one all-to-all brings y back to the sequence
    shards, where the gated RMSNorm (over all d_ssm channels) and out_proj run. The
    parameter gradients are this rank's share."""
    from baracuda_torch.causal_conv1d import causal_conv1d_fn
    from baracuda_torch.mamba import mamba_chunk_scan_combined

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    H, P, G, N, d_ssm = model.nheads, model.headdim, model.ngroups, model.d_state, model.d_ssm
    if G != 1 or H % world or not model.rmsnorm or model.d_inner != d_ssm:
        raise ValueError("head_parallel_forward: needs ngroups 1, rmsnorm, d_ssm = d_inner and "
                         f"the heads ({H}) a multiple of the world size ({world})")
    hw = H // world
    zxbcdt = model.in_proj(u)                                  # [B, Lr, 2·d_ssm + 2GN + H]
    batch, lr, _ = zxbcdt.shape
    z = zxbcdt[..., :d_ssm]
    x = zxbcdt[..., d_ssm:2 * d_ssm]
    bc = zxbcdt[..., 2 * d_ssm:2 * d_ssm + 2 * G * N]
    dt = zxbcdt[..., 2 * d_ssm + 2 * G * N:]
    # [x of rank j's heads | B, C | dt of rank j's heads] for every destination rank j
    send = torch.cat([x.unflatten(-1, (world, hw * P)),
                      bc.unsqueeze(2).expand(batch, lr, world, 2 * G * N),
                      dt.unflatten(-1, (world, hw))], dim=-1)   # [B, Lr, W, F]
    recv = _AllToAll.apply(send.permute(2, 0, 1, 3), group)    # [W (shard), B, Lr, F]
    recv = recv.permute(1, 0, 2, 3).flatten(1, 2)             # [B, L, F]
    c = hw * P + 2 * G * N
    weight = model.conv1d.weight.squeeze(1)
    heads = slice(rank * hw * P, (rank + 1) * hw * P)
    w_r = torch.cat([weight[heads], weight[d_ssm:]])
    b_r = (None if model.conv1d.bias is None
           else torch.cat([model.conv1d.bias[heads], model.conv1d.bias[d_ssm:]]))
    xbc = causal_conv1d_fn(recv[..., :c].transpose(1, 2), w_r, b_r,
                           activation="silu").transpose(1, 2)   # [B, L, c]
    hs = slice(rank * hw, (rank + 1) * hw)
    y = mamba_chunk_scan_combined(
        xbc[..., :hw * P].unflatten(-1, (hw, P)), recv[..., c:], -torch.exp(model.A_log.float())[hs],
        xbc[..., hw * P:hw * P + G * N].unflatten(-1, (G, N)),
        xbc[..., hw * P + G * N:].unflatten(-1, (G, N)), model.chunk_size, D=model._D()[hs],
        dt_bias=model.dt_bias[hs], dt_softplus=True, dt_limit=model.dt_limit)   # [B, L, hw, P]
    back = _AllToAll.apply(y.reshape(batch, world, lr, hw * P).transpose(0, 1), group)
    y = back.permute(1, 2, 0, 3).reshape(batch, lr, d_ssm)   # [B, Lr, d_ssm], heads in order
    return model.out_proj(model.norm(y, z))


# ---- the layer and one training step -----------------------------------------------------


def build_layer(kwargs: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """``bench_mamba2_layer.build``'s layer (seeded, D and the norm weight moved off 1),
    built on the CPU so that every rank has the same weights, then moved to ``device``."""
    from baracuda_torch.mamba import Mamba2

    torch.manual_seed(seed)
    model = Mamba2(**kwargs, dtype=dtype)
    with torch.no_grad():
        model.D.add_(0.2 * torch.randn_like(model.D))
        model.norm.weight.add_(0.2 * torch.randn_like(model.norm.weight))
    return model.to(device)


def forward_of(mode: str, model, group) -> Callable[[Tensor], Tensor]:
    """The forward of ``mode`` (``model.cp_group`` is set for it)."""
    model.cp_group = group if mode == "cp" else None
    if mode == "a2a":
        return lambda u: head_parallel_forward(model, u, group)
    return model


def training_step(fwd: Callable[[Tensor], Tensor], model, u: Tensor,
                  dy: Tensor) -> Tuple[Tensor, List[Tensor]]:
    """(output, [du] + parameter gradients) of one step: forward, then
    ``torch.autograd.grad`` of the input and every parameter (bench_mamba2_layer's step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = fwd(u)
    return out, list(torch.autograd.grad(out, [u] + params, dy))


# ---- the workers --------------------------------------------------------------------------


class _Worker:
    """One rank: the check, then every (L, mode) phase; rank 0 appends each record to the
    results file (one JSON object a line) as soon as the ranks agree on it."""

    def __init__(self, rank: int, world: int, cfg: dict):
        self.rank, self.world, self.cfg = rank, world, cfg
        self.cuda = cfg["backend"] == "nccl"
        self.device = torch.device("cuda", rank) if self.cuda else torch.device("cpu")
        self.group = dist.group.WORLD
        # host-side agreement (barriers, records) on gloo, apart from the NCCL communicator
        self.ctrl = (dist.new_group(backend="gloo",
                                    timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
                     if self.cuda else dist.group.WORLD)
        # the barrier after a distributed phase, with a short timeout on every rank
        self.fence = dist.new_group(backend="gloo",
                                    timeout=datetime.timedelta(seconds=cfg["barrier_s"]))
        self.dtype = getattr(torch, cfg["dtype"])
        self.kwargs = cfg["layer"]
        self.t0 = time.monotonic()
        self.comm_broken = ""
        self.peaks: dict = {}   # mode -> (L, [peak GiB of each rank])
        self.total_gib = (torch.cuda.get_device_properties(self.device).total_memory / 2**30
                          if self.cuda else None)

    # -- helpers ---------------------------------------------------------------------------

    def emit(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.cfg["results"], "a") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def gather(self, obj) -> list:
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def agree(self, obj):
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.ctrl)
        return box[0]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def inputs(self, length: int, seed: int, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        g = torch.Generator(device=self.device).manual_seed(seed)
        shape = (1, length, self.kwargs["d_model"])
        u = torch.randn(shape, generator=g, device=self.device, dtype=dtype).requires_grad_()
        return u, torch.randn(shape, generator=g, device=self.device, dtype=dtype)

    # -- the check ---------------------------------------------------------------------------

    def check(self) -> None:
        """cp and a2a against single at ``check_len``, in the benchmark's dtype and float32."""
        from baracuda_torch.distributed import shard_bounds

        L = self.cfg["check_len"]
        start, end = shard_bounds(L, self.world, self.rank)
        for dtype in dict.fromkeys([self.dtype, torch.float32]):
            model = build_layer(self.kwargs, self.device, dtype)
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            g = torch.Generator().manual_seed(1234)
            u = torch.randn(1, L, self.kwargs["d_model"], generator=g).to(self.device, dtype)
            dy = torch.randn(1, L, self.kwargs["d_model"], generator=g).to(self.device, dtype)
            ref = None
            if self.rank == 0:
                ref = training_step(forward_of("single", model, None), model,
                                    u.clone().requires_grad_(), dy)
            for mode in ("cp", "a2a"):
                record = {"kind": "check", "mode": mode, "dtype": str(dtype).replace("torch.", ""),
                          "L": L, "world": self.world}
                try:
                    out, grads = training_step(forward_of(mode, model, self.group), model,
                                               u[:, start:end].clone().requires_grad_(),
                                               dy[:, start:end])
                    outs = [torch.empty_like(out) for _ in range(self.world)]
                    dist.all_gather(outs, out.detach().contiguous(), group=self.group)
                    dus = [torch.empty_like(grads[0]) for _ in range(self.world)]
                    dist.all_gather(dus, grads[0].contiguous(), group=self.group)
                    flat = torch.cat([gr.reshape(-1).float() for gr in grads[1:]])
                    dist.all_reduce(flat, group=self.group)
                    if self.rank == 0:
                        got_out, got_du = torch.cat(outs, 1), torch.cat(dus, 1)
                        worst, worst_name, off = -1.0, "", 0
                        for name, gr in zip(names, ref[1][1:]):
                            mine = flat[off:off + gr.numel()].view_as(gr)
                            off += gr.numel()
                            d = rel_l2_diff(mine, gr.float())
                            if d > worst:
                                worst, worst_name = d, name
                        record.update(out_rel_l2=rel_l2_diff(got_out, ref[0]),
                                      out_max_rel=max_rel_diff(got_out, ref[0]),
                                      du_rel_l2=rel_l2_diff(got_du, ref[1][0]),
                                      dparam_rel_l2=worst, dparam_worst=worst_name)
                        rtol = CHECK_RTOL.get(dtype, BF16_RTOL)
                        record["ok"] = max(record["out_rel_l2"], record["du_rel_l2"], worst) <= rtol
                        record["rtol"] = rtol
                    del out, grads, outs, dus, flat
                except Exception as e:  # reported; a failed exchange would show as a hang
                    record.update(ok=False, error=f"{type(e).__name__}: {e}")
                    traceback.print_exc()
                self.emit(record)
                if self.rank == 0:
                    print(f"[check] {_check_line(record)}", flush=True)
            del model, ref, u, dy
            self.free()

    # -- one phase ---------------------------------------------------------------------------

    def measure(self, L: int, mode: str) -> dict:
        """This rank's timings, peak and (rank 0, cp and a2a) communication of ``mode``."""
        from baracuda_torch.distributed import shard_bounds

        world = 1 if mode == "single" else self.world
        start, end = shard_bounds(L, world, 0 if mode == "single" else self.rank)
        fwd = forward_of(mode, self.model, self.group)
        u, dy = self.inputs(end - start, 1000 + self.rank, self.dtype)

        def step():
            training_step(fwd, self.model, u, dy)

        step()                                    # warm-up (plans, NCCL buffers)
        self.sync()
        t = time.perf_counter()
        step()
        self.sync()
        est = time.perf_counter() - t
        if mode != "single":                      # the same step count on every rank
            est = max(self.gather(est))
        cfg = self.cfg
        iters = max(cfg["min_iters"], min(cfg["max_iters"], math.ceil(cfg["target_s"] / max(est, 1e-6))))
        med, p20, p80 = time_steps(step, self.device.type, warmup=0, iters=iters)
        above, peak = step_peak_memory(step, self.device.type)
        stats = {"median_ms": med / 1e3, "p20_ms": p20 / 1e3, "p80_ms": p80 / 1e3, "iters": iters,
                 "peak_gib": None if peak is None else peak / 1024,
                 "peak_above_gib": None if above is None else above / 1024}
        if cfg["profile"]:
            # every rank profiles the same steps (the collectives keep them together): its
            # kernel time, its communication and its largest other kernels, so that an
            # imbalance between ranks (time one rank spends waiting inside a collective) is
            # seen with the work that causes it; the single GPU's list is the baseline
            fence = None if mode == "single" else (lambda: dist.barrier(group=self.fence))
            kernels = kernel_breakdown(step, self.device.type, iters=2, start=fence)
            comm = [k for k in kernels if _is_comm(k[0], self.device.type)]
            stats.update(kernel_ms=sum(k[1] for k in kernels) / 1e3,
                         work_top=[(k[0][:100], k[1] / 1e3, k[2]) for k in kernels
                                   if not _is_comm(k[0], self.device.type)][:12])
            if mode != "single":
                stats.update(comm_ms=sum(k[1] for k in comm) / 1e3,
                             comm_calls=sum(k[2] for k in comm),
                             comm_top=[(k[0][:100], k[1] / 1e3, k[2]) for k in comm[:4]])
        del u, dy, fwd, step
        return stats

    def phase(self, L: int, mode: str) -> None:
        record = {"kind": "phase", "L": L, "mode": mode, "world": 1 if mode == "single" else self.world}
        skip = self.agree(self.why_not(L, mode) if self.rank == 0 else None)
        if skip:
            record.update(status="skipped", reason=skip)
            self.emit(record)
            if self.rank == 0:
                print(f"[{mode} L={L}] skipped: {skip}", flush=True)
            return
        active = mode != "single" or self.rank == 0
        status, reason, stats = "ok", "", {}
        if active:
            try:
                stats = self.measure(L, mode)
            except torch.OutOfMemoryError as e:
                status, reason = "oom", str(e).splitlines()[0][:300]
            except Exception as e:
                status, reason = "error", f"{type(e).__name__}: {e}"[:500]
                traceback.print_exc()
            self.free()
        if status != "ok":
            print(f"[rank {self.rank}] {mode} at L={L}: {status}: {reason}", flush=True)
        if mode != "single":
            # A rank that failed alone leaves its peer waiting inside a collective: then the
            # barrier times out here, the worker raises and the launcher stops the run.
            try:
                dist.barrier(group=self.fence)
            except RuntimeError as e:
                raise RuntimeError(f"{mode} at L={L}: rank {self.rank} finished with {status} "
                                   f"({reason}); a peer did not reach the barrier after the "
                                   f"phase: {e}") from None
        per_rank = self.gather((status, reason, stats))
        if mode == "single":
            status, reason, stats = per_rank[0]
            record.update(status=status, reason=reason, **stats)
        else:
            bad = [(r, s, why) for r, (s, why, _) in enumerate(per_rank) if s != "ok"]
            if bad:
                record.update(status=bad[0][1], reason="; ".join(f"rank {r}: {why}" for r, _, why in bad))
                self.comm_broken = f"{bad[0][1]} in {mode} at L={L}"
            else:
                meds = [s["median_ms"] for _, _, s in per_rank]
                slowest = max(range(self.world), key=lambda r: meds[r])
                record.update(status="ok", **{k: v for k, v in per_rank[slowest][2].items()
                                              if k in ("median_ms", "p20_ms", "p80_ms")},
                              iters=per_rank[0][2]["iters"], rank_median_ms=meds, slowest_rank=slowest,
                              peak_gib=[s["peak_gib"] for _, _, s in per_rank],
                              **{k: v for k, v in per_rank[0][2].items() if k.startswith(("comm", "kernel"))})
                if "kernel_ms" in per_rank[0][2]:
                    record.update(ranks=[{k: s[k] for k in ("kernel_ms", "comm_ms", "work_top")}
                                         for _, _, s in per_rank])
        if record["status"] == "ok":
            peaks = record["peak_gib"] if isinstance(record["peak_gib"], list) else [record["peak_gib"]]
            if all(p is not None for p in peaks):
                self.peaks[mode] = (L, peaks)
        self.emit(record)
        if self.rank == 0:
            print(f"[{mode} L={L}] {_phase_line(record)} at {time.monotonic() - self.t0:.0f} s", flush=True)

    def why_not(self, L: int, mode: str) -> str:
        """Why rank 0 will not start this phase ("" to run it)."""
        elapsed = time.monotonic() - self.t0
        if elapsed > self.cfg["budget_s"]:
            return f"time budget ({self.cfg['budget_s']:.0f} s) spent ({elapsed:.0f} s)"
        if mode == "single":
            return ""
        if self.comm_broken:
            return f"no distributed phase after the {self.comm_broken} (the communicator may be stuck)"
        if mode == "a2a" and (L % self.world or self.kwargs_heads() % self.world):
            return f"a2a needs L and the heads divisible by {self.world}"
        if mode in self.peaks and self.total_gib:
            L0, peaks = self.peaks[mode]
            predicted = max(peaks) * L / L0
            if predicted > PREDICTED_OOM_SHARE * self.total_gib:
                return (f"predicted OOM: peak {max(peaks):.1f} GiB at L={L0} scaled to "
                        f"{predicted:.1f} GiB > {PREDICTED_OOM_SHARE:.0%} of {self.total_gib:.1f} GiB")
        return ""

    def kwargs_heads(self) -> int:
        k = self.kwargs
        return k["expand"] * k["d_model"] // k["headdim"]

    def run(self) -> None:
        if self.rank == 0:
            meta = {"kind": "meta", "world": self.world, "backend": self.cfg["backend"],
                    "device": (torch.cuda.get_device_name(self.device) if self.cuda else "cpu"),
                    "gpu_memory_gib": self.total_gib, "torch": torch.__version__,
                    "nccl": (".".join(map(str, torch.cuda.nccl.version())) if self.cuda else None),
                    "layer": self.kwargs, "dtype": self.cfg["dtype"], "batch": 1,
                    "lengths": self.cfg["lengths"],
                    "env": {k: os.environ.get(k) for k in (*NCCL_ENV, "PYTORCH_CUDA_ALLOC_CONF")}}
            self.emit(meta)
        if self.cfg["check_len"]:
            self.check()
        self.model = build_layer(self.kwargs, self.device, self.dtype)
        for L in self.cfg["lengths"]:
            for mode in self.cfg["modes"]:
                self.phase(L, mode)


def _is_comm(name: str, device_type: str) -> bool:
    """A communication entry of ``harness.kernel_breakdown``: an NCCL kernel on a GPU; on
    the CPU a c10d op (its self CPU time: a smoke-test number, not the transfer time)."""
    low = name.lower()
    return "nccl" in low if device_type == "cuda" else low.startswith("c10d::")


def _worker(rank: int, world: int, cfg: dict) -> None:
    os.environ.update(NCCL_ENV)
    # the same allocator for every mode; less fragmentation at the longest sequences
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    cuda = cfg["backend"] == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
        torch.backends.cuda.matmul.allow_tf32 = False   # float32 check at full precision
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(cfg["backend"], init_method=f"file://{cfg['store']}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout_s"]),
                            device_id=torch.device("cuda", rank) if cuda else None)
    worker = _Worker(rank, world, cfg)
    worker.run()
    if worker.comm_broken:
        # the communicator may hold an unfinished collective: tearing it down could wait on it
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def launch(world: int, cfg: dict, timeout_s: float) -> str:
    """Runs the workers; returns "" or why they did not all finish (every rank's traceback
    of a failure; no worker outlives the call)."""
    ctx = mp.start_processes(_worker, args=(world, cfg), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic())), grace_period=5.0):
            if time.monotonic() >= deadline:
                return f"the workers did not finish in {timeout_s:.0f} s (--timeout): stopped"
        return ""
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        traces = {}
        for rank, path in enumerate(ctx.error_files):
            if os.access(path, os.R_OK):
                with open(path, "rb") as fh:
                    traces[rank] = pickle.load(fh)
        if not traces:
            return f"a worker failed: {e}"
        last = "; ".join(f"rank {r}: {t.strip().splitlines()[-1]}" for r, t in traces.items())
        return f"a worker failed ({last})\n" + "\n".join(f"-- rank {r}:\n{t}" for r, t in traces.items())
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        for p in ctx.processes:
            p.join(10)


# ---- the report ---------------------------------------------------------------------------


def _fmt(v, spec: str, none: str = "n/a") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _check_line(r: dict) -> str:
    if "error" in r:
        return f"{r['mode']} {r['dtype']} L={r['L']}: FAILED: {r['error']}"
    if "out_rel_l2" not in r:
        return f"{r['mode']} {r['dtype']} L={r['L']}: no result"
    return (f"{r['mode']} vs single, {r['dtype']}, L={r['L']}: out rel L2 {r['out_rel_l2']:.2e} "
            f"(max rel {r['out_max_rel']:.2e}), du {r['du_rel_l2']:.2e}, worst dW {r['dparam_rel_l2']:.2e} "
            f"({r['dparam_worst']}): {'OK' if r['ok'] else 'MISMATCH'} (rtol {r['rtol']:.0e})")


def _phase_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('reason', '')}"
    peak = r["peak_gib"] if isinstance(r["peak_gib"], list) else [r["peak_gib"]]
    s = (f"{r['median_ms']:.2f} ms/step ({r['p20_ms']:.2f}-{r['p80_ms']:.2f}, {r['iters']} steps), "
         f"peak {'/'.join(_fmt(p, '.1f') for p in peak)} GiB")
    if "comm_ms" in r:
        s += f", comm {r['comm_ms']:.2f} ms/step on rank 0"
    if r["mode"] == "single" and "work_top" in r:
        s += (f"\n    kernels {r['kernel_ms']:.2f} ms/step; largest: "
              + ", ".join(f"{name} {ms:.2f} ms x{n:g}" for name, ms, n in r["work_top"][:8]))
    for rank, k in enumerate(r.get("ranks", [])):
        s += (f"\n    rank {rank}: kernels {k['kernel_ms']:.2f} ms/step, communication {k['comm_ms']:.2f}; "
              "largest others: " + ", ".join(f"{name} {ms:.2f} ms x{n:g}" for name, ms, n in k["work_top"][:8]))
    return s


def summarize(records: List[dict]) -> dict:
    """The JSON report: meta, checks and phases, with tokens/s and the efficiency."""
    meta = next((r for r in records if r["kind"] == "meta"), {})
    checks = [r for r in records if r["kind"] == "check"]
    phases = [r for r in records if r["kind"] == "phase"]
    single = {r["L"]: r["median_ms"] for r in phases if r["mode"] == "single" and r["status"] == "ok"}
    for r in phases:
        if r["status"] != "ok":
            continue
        r["tokens_per_s"] = r["L"] / (r["median_ms"] / 1e3)
        if r["mode"] != "single" and r["L"] in single:
            r["speedup"] = single[r["L"]] / r["median_ms"]
            r["efficiency"] = single[r["L"]] / (r["world"] * r["median_ms"])
    return {"meta": meta, "check": checks, "results": phases}


def markdown(report: dict, error: str) -> str:
    meta, phases = report["meta"], report["results"]
    comm_name = ("NCCL kernels ms/step" if meta.get("backend") == "nccl"
                 else "c10d ops CPU self ms/step")
    lines = [f"**Context-parallel Mamba-2 layer** ({meta.get('device', '?')} x{meta.get('world', '?')}, "
             f"{meta.get('backend', '?')}"
             + (f" {meta['nccl']}" if meta.get("nccl") else "") + f", torch {meta.get('torch', '?')}; "
             f"layer {meta.get('layer')}, {meta.get('dtype')}, batch 1; forward + backward)", ""]
    if report["check"]:
        lines += ["| check vs single GPU | dtype | L | out rel L2 (max rel) | du rel L2 | worst dW rel L2 "
                  "| verdict |", "|---|---|---:|---:|---:|---:|---|"]
        for r in report["check"]:
            if "out_rel_l2" in r:
                lines.append(f"| {r['mode']} | {r['dtype']} | {r['L']} | {r['out_rel_l2']:.2e} "
                             f"({r['out_max_rel']:.2e}) | {r['du_rel_l2']:.2e} | {r['dparam_rel_l2']:.2e} "
                             f"({r['dparam_worst']}) | {'OK' if r['ok'] else 'MISMATCH'} |")
            else:
                lines.append(f"| {r['mode']} | {r['dtype']} | {r['L']} | | | | "
                             f"FAILED: {r.get('error', '')} |")
        lines.append("")
    lines += [f"| L | mode | GPUs | tokens/GPU | ms/step median (p20-p80) | tokens/s | peak GiB per GPU | "
              f"{comm_name}, rank 0 (share of kernel time) | T1/(W·TW) | status |",
              "|---:|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in phases:
        w = r["world"]
        row = [str(r["L"]), r["mode"], str(w), str(r["L"] // w)]
        if r["status"] == "ok":
            peak = r["peak_gib"] if isinstance(r["peak_gib"], list) else [r["peak_gib"]]
            comm = ""
            if "comm_ms" in r:
                comm = f"{r['comm_ms']:.2f} ({100 * r['comm_ms'] / max(r['kernel_ms'], 1e-9):.1f} %)"
            row += [f"{r['median_ms']:.2f} ({r['p20_ms']:.2f}-{r['p80_ms']:.2f})",
                    f"{r['tokens_per_s']:.3g}", " / ".join(_fmt(p, ".1f") for p in peak), comm,
                    _fmt(r.get("efficiency"), ".2f", ""), "ok"]
        else:
            row += ["", "", "", "", "", f"{r['status']}: {r.get('reason', '')}"]
        lines.append("| " + " | ".join(row) + " |")
    if error:
        lines += ["", "**The run stopped early**: " + error.strip().splitlines()[0]]
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench_out/context_parallel", help="directory of the JSON report")
    p.add_argument("--world", type=int, default=2, help="GPUs (ranks) of the distributed modes")
    p.add_argument("--quick", action="store_true",
                   help=f"L = {QUICK_LENGTHS[0]} only; without --world GPUs: CPU, gloo, the tiny shape")
    p.add_argument("--cpu", action="store_true", help="run on the CPU with gloo even with GPUs")
    p.add_argument("--lengths", help="comma-separated sequence lengths (default: "
                   + ",".join(map(str, DEFAULT_LENGTHS)) + ")")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    p.add_argument("--shape", choices=tuple(LAYER_SHAPES), help="bench_mamba2_layer's layer shape "
                   "(default: 2.7b; tiny for --quick on the CPU)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--check-len", type=int, help="L of the check against one GPU (0: no check; "
                   "default 8192, 2048 on the CPU)")
    p.add_argument("--target-s", type=float,
                   help="timed seconds a phase aims at (default 1.5; 0.3 on the CPU)")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=15)
    p.add_argument("--no-profile", action="store_true", help="no torch.profiler communication time")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="no new phase starts after this many seconds in the workers")
    p.add_argument("--timeout", type=float, default=330.0, help="the workers are stopped after this")
    a = p.parse_args(argv)

    cuda = (not a.cpu and torch.cuda.is_available() and dist.is_nccl_available()
            and torch.cuda.device_count() >= a.world)
    if not cuda and not (a.quick or a.cpu):
        print(f"bench_context_parallel: needs {a.world} GPUs with NCCL (found "
              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}); --quick or --cpu "
              "runs a CPU smoke test with gloo", file=sys.stderr)
        return 2
    modes = [m for m in a.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        p.error(f"--modes: choose from {', '.join(MODES)}")
    lengths = ([int(x) for x in a.lengths.split(",")] if a.lengths
               else list(QUICK_LENGTHS if a.quick else DEFAULT_LENGTHS))
    shape = a.shape or ("2.7b" if cuda else "tiny")
    layer = dict(LAYER_SHAPES[shape][0])
    layer.setdefault("d_conv", 4)
    os.makedirs(a.out, exist_ok=True)
    os.environ.update(NCCL_ENV)
    with tempfile.TemporaryDirectory(prefix="baracuda_cp_bench_") as tmp:
        cfg = dict(backend="nccl" if cuda else "gloo", store=os.path.join(tmp, "store"),
                   results=os.path.join(tmp, "records.jsonl"), layer=layer, dtype=a.dtype,
                   lengths=lengths, modes=modes,
                   check_len=a.check_len if a.check_len is not None else (8192 if cuda else 2048),
                   target_s=a.target_s if a.target_s is not None else (1.5 if cuda else 0.3),
                   min_iters=a.min_iters, max_iters=a.max_iters, profile=not a.no_profile,
                   budget_s=a.budget_s, timeout_s=max(60.0, a.timeout), barrier_s=60.0)
        print(f"bench_context_parallel: {cfg['backend']}, {a.world} ranks, layer {shape} {layer}, "
              f"{a.dtype}, L = {lengths}, modes {modes}", flush=True)
        t0 = time.monotonic()
        error = launch(a.world, cfg, a.timeout)
        records = []
        if os.path.exists(cfg["results"]):
            with open(cfg["results"]) as fh:
                records = [json.loads(line) for line in fh if line.strip()]
    report = summarize(records)
    report["error"] = error or None
    report["wall_s"] = time.monotonic() - t0
    path = os.path.join(a.out, JSON_NAME)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1)
    if error:
        print(error, file=sys.stderr, flush=True)
    print(markdown(report, error), flush=True)
    print(f"\n(JSON: {path}; {report['wall_s']:.0f} s)", flush=True)
    bad_check = any(not r.get("ok", False) for r in report["check"])
    return 1 if error or bad_check or not report["results"] else 0


if __name__ == "__main__":
    sys.exit(main())
