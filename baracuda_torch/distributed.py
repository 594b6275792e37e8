"""Context parallelism for the Mamba-2 SSD scan and the Mamba-2 layer, over
``torch.distributed``.

A batch's sequences are split along L into contiguous shards, one per rank of a process
group (``cp_group``), in rank order; shard lengths may differ (and may be 0). A shard's
final state is affine in its initial state, ``S_end = a · S_in + S_local`` per (batch,
head), with ``a`` the shard's total decay ``exp(Σ dt·A)`` (0 when a ``seq_idx`` reset falls
inside the shard) and ``S_local`` its final state from a zero state. Each rank but the last
computes ``S_local`` first (one product a (batch, group) over its tokens, far cheaper than
the scan), the ranks exchange ``(S_local, a)`` (``B·H·P·N + B·H`` values each, independent
of L) and recover their true initial states ``S_in`` with an exclusive prefix combine over
the ranks before them, and each rank scans its shard from ``S_in`` with the fused op: its
output and final state are the single process's own computation. The backward is the
reverse combine of the state gradients: one more exchange of ``B·H·P·N`` values per rank.

* :func:`mamba_chunk_scan_combined`: mamba_ssm's signature and return convention (as
  :func:`baracuda_torch.mamba.mamba_chunk_scan_combined`) plus ``cp_group``.
* :class:`baracuda_torch.mamba.Mamba2` with ``cp_group=...`` (and
  ``mamba_split_conv1d_scan_combined(..., cp_group=...)``): the causal conv's halo (the
  ``d_conv - 1`` tokens before each shard) is exchanged too, then the scan above.

Every exchange is a ``torch.distributed.all_gather`` inside a custom
``torch.autograd.Function`` whose backward is the adjoint exchange (another
``all_gather``; no ``reduce_scatter`` or ``all_to_all``, so every backend with
``all_gather`` works: gloo on CPU, NCCL on GPUs). Every rank of the group must call the
same functions with the same shapes, dtypes and options (and, when training, run the
backward: the backward exchanges are collectives too). See docs/distributed.md.
"""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from . import mamba as _mamba
from .reference import process_dt as _process_dt

__all__ = ["mamba_chunk_scan_combined", "shard_bounds"]

_INF = float("inf")


def shard_bounds(seqlen: int, world_size: int, rank: int) -> Tuple[int, int]:
    """``(start, end)`` of ``rank``'s contiguous shard when ``seqlen`` positions are split
    as evenly as possible over ``world_size`` ranks (the first ``seqlen % world_size``
    ranks get one more). Any other contiguous split in rank order works too."""
    if world_size < 1 or not 0 <= rank < world_size or seqlen < 0:
        raise ValueError(f"shard_bounds: need 0 <= rank < world_size and seqlen >= 0, got "
                         f"seqlen={seqlen}, world_size={world_size}, rank={rank}")
    base, extra = divmod(seqlen, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def _group_info(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("baracuda_torch.distributed: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


# ---- the layout exchange: shard lengths and seq_idx at the shard edges ----------------


class _Layout:
    """Every rank's shard length, first ``seq_idx`` and last ``k`` ``seq_idx`` values (one
    int64 ``all_gather`` of ``1 + B + B·k`` values per rank, issued asynchronously at
    construction so that it overlaps the local work; :meth:`wait` finishes it). Without
    ``seq_idx`` only the lengths are exchanged."""

    def __init__(self, seqlen: int, batch: int, seq_idx: Optional[Tensor], k: int, device,
                 group, world: int):
        self.k, self.batch, self.world, self.has_seq = k, batch, world, seq_idx is not None
        parts = [torch.full((1,), seqlen, dtype=torch.int64, device=device)]
        if seq_idx is not None:
            s = seq_idx.to(torch.int64)
            n = min(seqlen, k)
            first = s[:, 0] if seqlen > 0 else s.new_zeros(batch)
            tail = F.pad(s[:, seqlen - n:], (k - n, 0))   # right-aligned; the pad is never read
            parts += [first, tail.reshape(-1)]
        buf = torch.cat(parts)
        self._bufs = [torch.empty_like(buf) for _ in range(world)]
        self._work = dist.all_gather(self._bufs, buf, group=group, async_op=True)
        self._done = False

    def wait(self) -> "_Layout":
        if not self._done:
            self._work.wait()
            g = torch.stack(self._bufs)                               # [W, 1 + B + B·k]
            self.lengths = g[:, 0]                                    # [W]
            if self.has_seq:
                b, k = self.batch, self.k
                self.first = g[:, 1:1 + b]                            # [W, B]
                self.tails = g[:, 1 + b:].view(self.world, b, k)      # [W, B, k]
            self._done = True
            del self._bufs, self._work
        return self

    def halo_index(self) -> Tensor:
        """[W, k] (:func:`_halo_index` of the lengths), computed once."""
        self.wait()
        if getattr(self, "_index", None) is None:
            self._index = _halo_index(self.lengths, self.k)
        return self._index

    def carry(self) -> Optional[Tensor]:
        """[W, B] bool: whether the state carries into rank j's first token (False where
        its first ``seq_idx`` differs from the last one of the nearest non-empty rank
        before it; True for empty ranks and when no non-empty rank precedes). None
        without ``seq_idx`` (always carried)."""
        self.wait()
        if not self.has_seq:
            return None
        keep = []
        seen = torch.zeros(self.batch, dtype=torch.bool, device=self.lengths.device)
        last = torch.zeros(self.batch, dtype=torch.int64, device=self.lengths.device)
        for j in range(self.world):
            nonempty = self.lengths[j] > 0
            keep.append(~(nonempty & seen) | (self.first[j] == last))
            last = torch.where(nonempty, self.tails[j, :, -1], last)
            seen = seen | nonempty
        return torch.stack(keep)


# ---- the state exchange ---------------------------------------------------------------


class _StateExchange(torch.autograd.Function):
    """``(S_local, a, S_first) -> S_in`` on every rank of ``group``: ``S_in`` is this rank's
    true initial state. Rank 0's is ``S_first`` (the caller's initial state, zeros without
    one; a copy); rank r's is the exclusive prefix combine of the ranks before it,
    ``S ← carry_{j+1} · (a_j S + S_end'_j)`` from ``S = 0``, where each rank sends
    ``S_end'_j = S_local_j`` and rank 0 ``a_0 S_first + S_local_0`` (its whole final state).
    Every rank's scan consumes ``S_in``; ``anchors`` (the scan's differentiable inputs,
    the same kinds on every rank) make ``S_in`` require a gradient on every rank or on none,
    whatever this rank's own inputs to the combine (none on an empty shard, a constant
    ``S_local`` on the last rank), so every rank joins the backward's ``all_gather``.

    Backward: one ``all_gather`` of each rank's ``dS_in``, then the reverse combine over the
    ranks after this one gives ``dS_local = carry_{r+1} λ_{r+1}`` with
    ``λ_j = dS_in_j + a_j carry_{j+1} λ_{j+1}``, ``da = ⟨dS_local, S_in⟩`` and, on rank 0,
    ``dS_first = dS_in + a_0 dS_local``."""

    @staticmethod
    def forward(ctx, S_local: Tensor, a: Tensor, S_first: Tensor, group, layout, *anchors):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        n = S_local.numel()
        a4 = a[..., None, None]
        sent = S_local + a4 * S_first if rank == 0 else S_local
        buf = torch.cat([sent.reshape(-1), a.reshape(-1).to(S_local.dtype)])
        bufs = [torch.empty_like(buf) for _ in range(world)]
        work = dist.all_gather(bufs, buf, group=group, async_op=True)
        carry = layout.carry() if layout is not None else None   # overlaps the gather
        work.wait()
        a_all = torch.stack([b[n:] for b in bufs]).view(world, *a.shape)
        if rank == 0:
            S = S_first.clone()
        else:
            S = torch.zeros_like(S_local)
            for j in range(rank):
                S = a_all[j][..., None, None] * S + bufs[j][:n].view_as(S_local)
                if carry is not None:
                    S = torch.where(carry[j + 1][:, None, None, None], S, 0)
        ctx.group, ctx.world, ctx.rank = group, world, rank
        ctx.save_for_backward(S, a_all, carry if carry is not None else torch.empty(0))
        ctx.has_carry = carry is not None
        ctx.anchors = len(anchors)
        return S

    @staticmethod
    def backward(ctx, dS_in: Tensor):
        S_in, a_all, carry = ctx.saved_tensors
        world, rank = ctx.world, ctx.rank
        g = dS_in.contiguous()
        gs = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(gs, g, group=ctx.group)
        mu = torch.zeros_like(g)            # μ_j = carry_j λ_j, the gradient of S_end_{j-1}
        for j in range(world - 1, rank, -1):
            lam = gs[j] + a_all[j][..., None, None] * mu
            mu = torch.where(carry[j][:, None, None, None], lam, 0) if ctx.has_carry else lam
        da = (mu * S_in).sum((-2, -1)) if ctx.needs_input_grad[1] else None
        dS_first = None
        if rank == 0 and ctx.needs_input_grad[2]:
            dS_first = g + a_all[0][..., None, None] * mu
        return (mu, da, dS_first, None, None) + (None,) * ctx.anchors


# ---- the shard's own final state ------------------------------------------------------


def _bmm_dtype_ok() -> bool:
    """Whether this torch has ``bmm(…, out_dtype)`` (16-bit products, float32 results)."""
    return hasattr(torch.ops.aten.bmm, "dtype")


class _ShardState(torch.autograd.Function):
    """``(x, w, B) -> S_local`` [B, H, P, N] in ``w``'s dtype (the compute type): the state
    after the shard's last token from a zero initial state,
    ``S_local[h] = Σ_t w[t, h] · x_t[h] ⊗ B_t[g(h)]`` with ``w[t, h] = exp(Acs_end − Acs_t) · dt_t``
    (0 before the shard's last reset). One product a (batch, group) over the shard's
    tokens; for 16-bit inputs on CUDA ``x·w`` is rounded to bfloat16 (as the chunk-state
    products round their operands) and the product accumulates and returns float32, else
    everything is in the compute type. x [B, L, H, P], w [B, L, H] (contiguous, so that the
    elementwise products over [B, L, H, P] index two dimensions at one group), B [B, L, G, N]."""

    @staticmethod
    def _xw(x: Tensor, w: Tensor, G: int, mm: torch.dtype) -> Tensor:
        """[B·G, L, K·P] (K = H / G heads a group): x · w in ``mm``, one pass."""
        b, L, H, P = x.shape
        K = H // G
        out = torch.empty(b, G, L, K, P, dtype=mm, device=x.device)
        torch.mul(x.unflatten(2, (G, K)).permute(0, 2, 1, 3, 4),
                  w.view(b, L, G, K).permute(0, 2, 1, 3)[..., None], out=out)
        return out.view(b * G, L, K * P)

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, B: Tensor):
        b, L, H, P = x.shape
        G, N = B.size(2), B.size(3)
        cd = w.dtype
        half = x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and _bmm_dtype_ok()
        mm = torch.bfloat16 if half else cd        # bfloat16 keeps float16's large states finite
        xw = _ShardState._xw(x, w, G, mm)                                   # [B·G, L, K·P]
        Bm = B.to(mm).permute(0, 2, 1, 3).reshape(b * G, L, N)              # [B·G, L, N]
        xt = xw.transpose(1, 2)
        S = torch.ops.aten.bmm.dtype(xt, Bm, cd) if half else torch.bmm(xt, Bm)
        # dB's product takes x·w again: kept (x's size in ``mm``) rather than recomputed (one
        # of the three x·w passes over [B, L, H, P] that took 5.1 ms at 64k tokens a rank, e5977cd)
        ctx.save_for_backward(x, w, B, xw if ctx.needs_input_grad[2] else None)
        ctx.mm = mm
        return S.view(b, H, P, N)

    @staticmethod
    def backward(ctx, dS: Tensor):
        x, w, B, xw = ctx.saved_tensors
        b, L, H, P = x.shape
        G, N = B.size(2), B.size(3)
        K, mm = H // G, ctx.mm
        dSm = dS.to(mm).reshape(b * G, K * P, N)
        Bm = B.to(mm).permute(0, 2, 1, 3).reshape(b * G, L, N)
        dx = dw = dB = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            # d(x·w) as [B, L, G, K, P] (a view of the product's [B, G, L, K, P])
            dxw = torch.bmm(Bm, dSm.transpose(1, 2)).view(b, G, L, K, P).permute(0, 2, 1, 3, 4)
            if ctx.needs_input_grad[0]:
                dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                torch.mul(dxw, w.view(b, L, G, K)[..., None], out=dx.view(b, L, G, K, P))
            if ctx.needs_input_grad[1]:
                dw = torch.sum(dxw * x.unflatten(2, (G, K)).to(mm), -1, dtype=w.dtype).view(b, L, H)
        if ctx.needs_input_grad[2]:
            dB = torch.bmm(xw, dSm).view(b, G, L, N).permute(0, 2, 1, 3).to(B.dtype)
        return dx, dw, dB


# ---- the conv halo exchange -------------------------------------------------------------


def _halo_index(lengths: Tensor, k: int) -> Tensor:
    """[W, k] int64: for each rank j and halo slot i (global position start_j - k + i),
    1 + (owner's rank)·k + (slot in the owner's right-aligned k-token tail), or 0 where
    the position is before the sequence (a zero). Computed on the device (no host read)."""
    ends = torch.cumsum(lengths, 0)
    starts = ends - lengths
    pos = starts[:, None] - k + torch.arange(k, device=lengths.device)   # [W, k]
    owner = torch.searchsorted(ends, pos.clamp(min=0).reshape(-1), right=True).view_as(pos)
    owner = owner.clamp(max=lengths.numel() - 1)
    slot = k - (ends[owner] - pos)
    return torch.where(pos >= 0, 1 + owner * k + slot, 0)


class _HaloConv(torch.autograd.Function):
    """The causal depthwise conv (+ SiLU) of this rank's shard ``xBC`` [B, L, C] (``weight``
    [C, W], k = W − 1) as if over the whole sequence, returned as the output's channel
    ranges of ``sizes`` ([B, L, c] each, views of one buffer).

    Forward: every rank's last k tokens (right-aligned, zero-padded) are all-gathered (issued
    before the layout exchange is waited for: the two are in flight together); each rank
    picks the k tokens before its shard (:meth:`_Layout.halo_index`; zeros before the
    sequence start) and their ``seq_idx``, and runs the conv op over ``[halo, xBC]``.
    Backward: the parts' gradients written into one buffer (zeros for the halo's outputs),
    the conv's backward over the extended sequence, an ``all_gather`` of every rank's halo
    gradient, and each rank adds the entries that came from its own tail into its last k
    rows (a one-hot product: deterministic). One Function, so that autograd makes no
    full-size gradient of a slice (the tail, the halo's dropped outputs, each part) and
    adds none up."""

    @staticmethod
    def forward(ctx, xBC: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
                silu: bool, sizes: Tuple[int, ...], layout: "_Layout", group):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        batch, L, _ = xBC.shape
        k = weight.size(1) - 1
        n = min(L, k)
        t = F.pad(xBC[:, L - n:], (0, 0, k - n, 0)).contiguous()               # [B, k, C]
        ts = [torch.empty_like(t) for _ in range(world)]
        work = dist.all_gather(ts, t, group=group, async_op=True)
        index = layout.halo_index()                                             # [W, k]
        ext_seq = None
        if seq_idx is not None:
            table = torch.cat([layout.first.new_zeros(batch, 1),
                               layout.tails.permute(1, 0, 2).reshape(batch, -1)], dim=1)
            picked = table.index_select(1, index[rank])
            ext_seq = _mamba._seq_idx_int32(torch.cat([picked.to(seq_idx.dtype), seq_idx], dim=1))
        work.wait()
        table = torch.cat([t.new_zeros(batch, 1, t.size(2))] + ts, dim=1)      # [B, 1+W·k, C]
        ext = torch.cat([table.index_select(1, index[rank]), xBC], dim=1)      # [B, k+L, C]
        act = "silu" if silu else None
        out, _ = torch.ops.baracuda.causal_conv1d(ext.transpose(1, 2), weight, bias, ext_seq, None, act)
        y = out.transpose(1, 2)[:, k:]
        ctx.save_for_backward(ext, weight, bias, ext_seq, index)
        ctx.group, ctx.world, ctx.rank, ctx.k, ctx.act, ctx.sizes = group, world, rank, k, act, sizes
        ctx.set_materialize_grads(False)
        return y.split(sizes, dim=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *dparts):
        ext, weight, bias, ext_seq, index = ctx.saved_tensors
        k, world, rank = ctx.k, ctx.world, ctx.rank
        kL = ext.size(1)
        dy = torch.empty_like(ext)
        dy[:, :k].zero_()
        _mamba._write_grads(dy[:, k:].split(ctx.sizes, dim=-1), dparts)
        dext, dweight, dbias, _ = torch.ops.baracuda.causal_conv1d_backward(
            dy.transpose(1, 2), None, ext.transpose(1, 2), weight, bias, ext_seq, None, ctx.act)
        dext = dext.transpose(1, 2)                                             # [B, k+L, C]
        g = dext[:, :k].contiguous()
        gs = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(gs, g, group=ctx.group)
        mine = 1 + rank * k + torch.arange(k, device=index.device)               # [k]
        onehot = (index.reshape(-1)[None, :] == mine[:, None]).to(g.dtype)      # [k, W·k]
        dtail = torch.matmul(onehot, torch.cat(gs, dim=1))                       # [B, k, C]
        dxBC = dext[:, k:]
        n = min(kL - k, k)
        if n:
            dxBC[:, kL - k - n:] += dtail[:, k - n:]
        return (dxBC, dweight, dbias if bias is not None else None) + (None,) * 5


# ---- the context-parallel scan ---------------------------------------------------------


def _cp_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
             D: Optional[Tensor], z: Optional[Tensor], dt_bias: Optional[Tensor],
             initial_states: Optional[Tensor], seq_idx: Optional[Tensor], dt_softplus: bool,
             dt_limit: Tuple[float, float], state_dtype: Optional[torch.dtype], group,
             layout: Optional[_Layout] = None,
             fn: str = "mamba_chunk_scan_combined") -> Tuple[Tensor, Tensor]:
    """``(out, S_end)`` of this rank's shard: the output and the state after the shard's
    last token, both as one process over the whole sequence would compute them."""
    world, rank = _group_info(group)
    if world == 1:
        return _mamba._scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                            seq_idx, dt_softplus, dt_limit, state_dtype, fn)
    low, high = _mamba._check_dt_limit(fn, dt_limit)
    if x.dim() != 4 or B.dim() != 4 or dt.dim() != 3:
        # The op's own check, before any collective, names the argument.
        return _mamba._scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                            seq_idx, dt_softplus, dt_limit, state_dtype, fn)
    batch, L, H, P = x.shape
    N = B.size(3)
    if layout is None and seq_idx is not None:
        # Started before the shard's own state is computed, finished in the exchange.
        layout = _Layout(L, batch, seq_idx, 1, x.device, group, world)
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    # The shard-local decays from the same processed dt as the kernel's, the cumsum in
    # float64 as the kernels keep theirs and along the last dimension ([B, H, L]: a scan
    # along L of [B, L, H] runs one thread a column on CUDA, 17 ms at 32k tokens).
    dtp = _process_dt(dt.to(cd), None if dt_bias is None else dt_bias.to(cd), dt_softplus,
                      (low, high)).transpose(1, 2).double()                      # [B, H, L]
    Acs = torch.cumsum((dtp * A.double()[:, None]).contiguous(), dim=-1)
    last_seq = None                          # [B, L]: the token is in the shard's last sequence
    if seq_idx is not None and L > 1:
        resets = F.pad((seq_idx[:, 1:] != seq_idx[:, :-1]).cumsum(1), (1, 0))
        last_seq = resets == resets[:, -1:]
    if L > 0:
        a = torch.exp(Acs[..., -1]).to(cd)                                       # [B, H]
        if last_seq is not None:
            a = torch.where(last_seq[:, :1], a, 0)     # a reset inside the shard: no carry
    else:
        a = x.new_ones(batch, H, dtype=cd)
    if rank < world - 1 and L > 0:
        w = torch.exp(Acs[..., -1:] - Acs) * dtp
        if last_seq is not None:
            w = torch.where(last_seq[:, None, :], w, 0)
        S_local = _ShardState.apply(x, w.to(cd).transpose(1, 2).contiguous(), B)
    else:
        S_local = x.new_zeros(batch, H, P, N, dtype=cd)   # (the last rank's is never read)
    if rank == 0 and initial_states is not None:
        S_first = initial_states.to(cd)
    else:
        S_first = x.new_zeros(batch, H, P, N, dtype=cd)
    anchors = [t for t in (x, dt, A, B, C, D, z, dt_bias) if t is not None]
    S_in = _StateExchange.apply(S_local, a, S_first, group, layout, *anchors)
    # The shard's scan from its true initial state: its output and final state are what
    # one process over the whole sequence computes.
    return _mamba._scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, S_in, seq_idx, dt_softplus,
                        dt_limit, state_dtype, fn)


def mamba_chunk_scan_combined(
        x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
        D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
        initial_states: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
        cu_seqlens: Optional[Tensor] = None, dt_softplus: bool = False,
        dt_limit: Tuple[float, float] = (0.0, _INF), return_final_states: bool = False,
        return_varlen_states: bool = False, state_dtype: Optional[torch.dtype] = None,
        *, cp_group=None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Context-parallel :func:`baracuda_torch.mamba.mamba_chunk_scan_combined`: the same
    arguments, each rank passing its contiguous shard of the sequence dimension
    (x [B, L_r, H, P], dt [B, L_r, H], B and C [B, L_r, G, N], z [B, L_r, H, P],
    seq_idx [B, L_r], the shards in rank order of ``cp_group``, any lengths, 0
    included); A, D, dt_bias and every option the same on every rank.

    Each rank's ``out`` [B, L_r, H, P] is its shard of what one process would compute
    over the whole sequence, and the gradients of every input are too (A, D, dt_bias:
    this rank's share; their sum over the group is the whole gradient).
    ``initial_states`` is the state before the whole sequence: rank 0's is used (other
    ranks may pass it too; it is ignored there). ``seq_idx`` holds global sequence
    numbers: a change between the last token of one shard and the first of the next
    resets the state as it would inside a shard. With ``return_final_states``, every
    rank returns ``(out, S_end)``: the true state after its own shard's last token (on
    the last rank, the final state of the whole sequence), differentiable.

    ``cp_group=None`` runs :func:`baracuda_torch.mamba.mamba_chunk_scan_combined` (no
    context parallelism). ``return_varlen_states`` (a sequence's final state may sit on
    another rank) is not implemented with a ``cp_group``.
    """
    if cp_group is None:
        return _mamba.mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
            initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
            dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states,
            return_varlen_states=return_varlen_states, state_dtype=state_dtype)
    if return_varlen_states:
        raise NotImplementedError("mamba_chunk_scan_combined: return_varlen_states is not "
                                  "implemented with a cp_group")
    chunk_size = _mamba._check_chunk_size("mamba_chunk_scan_combined", chunk_size)
    out, S_end = _cp_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                          dt_softplus, dt_limit, state_dtype, cp_group)
    return (out, S_end) if return_final_states else out


def _split_conv1d_scan_cp(xBC: Tensor, dt: Tensor, conv1d_weight: Tensor,
                          conv1d_bias: Optional[Tensor], seq_idx: Optional[Tensor], silu: bool,
                          cfg, scan_args: dict, group) -> Tuple[Tensor, Tensor]:
    """The conv and the scan of :func:`baracuda_torch.mamba.mamba_split_conv1d_scan_combined`
    under context parallelism (``cfg`` its split): one layout exchange (lengths and the last
    ``d_conv - 1`` ``seq_idx`` of every shard), the conv with its halo, then the scan.
    Returns ``(y, S_end)``."""
    world, _ = _group_info(group)
    k = conv1d_weight.size(1) - 1
    if world == 1 or k == 0:
        layout = None
        if world > 1 and seq_idx is not None:
            layout = _Layout(xBC.size(1), xBC.size(0), seq_idx, 1, xBC.device, group, world)
        x, B, C = _mamba._split_xBC(cfg, _mamba._causal_conv1d(xBC, conv1d_weight, conv1d_bias,
                                                               seq_idx, silu))
        return _cp_scan(x, dt, B=B, C=C, seq_idx=seq_idx, group=group, layout=layout, **scan_args)
    batch, L, _ = xBC.shape
    layout = _Layout(L, batch, seq_idx, k, xBC.device, group, world)
    sizes = tuple(b - a for a, b in _mamba._conv_parts(cfg))
    x, B, C = _HaloConv.apply(xBC, conv1d_weight, conv1d_bias, seq_idx, silu, sizes, layout, group)
    x = x.unflatten(-1, (cfg.nheads, cfg.headdim))
    B, C = (t.unflatten(-1, (cfg.ngroups, cfg.dstate)) for t in (B, C))
    return _cp_scan(x, dt, B=B, C=C, seq_idx=seq_idx, group=group, layout=layout, **scan_args)
