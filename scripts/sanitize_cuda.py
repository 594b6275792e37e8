"""Every CUDA kernel variant of every family at small shapes, forward and backward: the
workload that ``scripts/gpu.sh``'s ``sanitize`` stage runs under compute-sanitizer
(memcheck, racecheck, synccheck, initcheck). The layouts are the ones the plans map to
each variant (16-byte rows, scalar rows, strided; the SSD's tensor-core and SIMT paths
through the dtype; gather's slabs through a src larger than half of L2). Correctness is
the test suite's job; this script only makes every kernel run on inputs that reach it.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize_cuda.py
    python scripts/sanitize_cuda.py --list        # the cases, without running them
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterator, List, Tuple

import torch

import baracuda_torch as bt

Case = Tuple[str, Callable[[], Tuple[torch.Tensor, ...]], Callable[..., object], tuple]  # name, make, run, ops
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def rand(*shape, dtype, device="cuda", grad=True):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


def layouts(shape, dtype) -> Iterator[Tuple[str, Callable[[], torch.Tensor]]]:
    """Contiguous (16-byte vectors), odd inner size (scalar rows), transposed (strided)."""
    yield "contiguous", lambda: rand(*shape, dtype=dtype)
    odd = shape[:-1] + (shape[-1] - 2,)
    yield "odd", lambda: rand(*odd, dtype=dtype)
    yield "transposed", lambda: rand(*reversed(shape), dtype=dtype).detach().t().requires_grad_(True)


def gated_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for name, make in layouts((48, 2 * 72), dtype):
            for kind in ("glu", "reglu", "swiglu", "geglu", "geglu_tanh"):
                yield (f"gated {kind} {name}", lambda make=make: (make(),),
                       lambda x, kind=kind: bt.gated_activation(x, kind),
                       ("gated_activation",))


def rope_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for interleaved in (True, False):
            for rotary_dim in (None, 32):
                yield (f"rope interleaved={interleaved} rotary_dim={rotary_dim}",
                       lambda dtype=dtype: (rand(2, 4, 24, 64, dtype=dtype),),
                       lambda x, i=interleaved, r=rotary_dim: bt.rope(x, interleaved=i, rotary_dim=r),
                       ("rope",))
            yield (f"rope [B,S,H,D] view positions interleaved={interleaved}",
                   lambda dtype=dtype: (rand(2, 24, 4, 64, dtype=dtype).transpose(1, 2),),
                   lambda x, i=interleaved: bt.rope(
                       x, torch.arange(24, device="cuda").expand(2, 24) * 7, interleaved=i),
                   ("rope",))
            yield (f"rope odd head dim interleaved={interleaved}",
                   lambda dtype=dtype: (rand(1, 3, 5, 18, dtype=dtype),),
                   lambda x, i=interleaved: bt.rope(x, interleaved=i), ("rope",))


def gated_pair_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for name, make in layouts((48, 72), dtype):
            for kind in ("glu", "reglu", "swiglu", "geglu", "geglu_tanh"):
                yield (f"gated pair {kind} {name}", lambda make=make: (make(), make()),
                       lambda g, u, kind=kind: bt.gated_activation_pair(g, u, kind),
                       ("gated_activation_pair",))


def rope_cos_sin_cases() -> Iterator[Case]:
    """HF [1|B, S, R] and flash-attention [S, R/2] tables (the table's gradient too), one
    tensor and q/k with fewer k heads, 16-byte rows, odd head dims and [B, S, H, D] views."""
    def table(B, S, R, dtype, hf, interleaved):
        theta = torch.rand(S, R // 2, device="cuda", dtype=torch.float64) * 6
        if hf:
            theta = (theta.repeat_interleave(2, -1) if interleaved else torch.cat((theta, theta), -1))
            theta = theta.expand(B, S, R)
        c, s = theta.cos().to(dtype), theta.sin().to(dtype)
        return c.requires_grad_(), s.requires_grad_()

    for dtype in DTYPES:
        for interleaved in (False, True):
            for hf in (True, False):
                for D, R in ((64, 64), (64, 32), (18, 18)):
                    desc = f"hf={hf} interleaved={interleaved} D={D} R={R}"
                    yield (f"rope_cos_sin {desc}",
                           lambda dtype=dtype, hf=hf, i=interleaved, D=D, R=R:
                               (rand(2, 4, 24, D, dtype=dtype), *table(2, 24, R, dtype, hf, i)),
                           lambda x, c, s, i=interleaved: bt.rope_cos_sin(x, c, s, i),
                           ("rope_cos_sin",))
                    yield (f"rope_qk_cos_sin [B,S,H,D] views {desc}",
                           lambda dtype=dtype, hf=hf, i=interleaved, D=D, R=R:
                               (rand(2, 24, 4, D, dtype=dtype).transpose(1, 2),
                                rand(2, 24, 1, D, dtype=dtype).transpose(1, 2),
                                *table(1, 24, R, dtype, hf, i)),
                           lambda q, k, c, s, i=interleaved: bt.rope_qk_cos_sin(q, k, c, s, i),
                           ("rope_qk_cos_sin",))


def lerp_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for name, make in layouts((40, 96), dtype):
            yield (f"lerp scalar {name}", lambda make=make: (make(), make()),
                   lambda a, b: bt.lerp(a, b, 0.3), ("lerp",))
            yield (f"lerp tensor {name}", lambda make=make: (make(), make(), make()),
                   lambda a, b, w: bt.lerp(a, b, w), ("lerp",))


def gather_cases() -> Iterator[Case]:
    for dtype in (torch.float32, torch.bfloat16):
        for index_dtype in (torch.int32, torch.int64):
            for dim in (0, 1):
                for pref in ("fastest", "deterministic"):
                    def make(dtype=dtype, index_dtype=index_dtype, dim=dim):
                        src = rand(64, 80, dtype=dtype)
                        index = torch.randint(0, src.size(dim), (64, 80), device="cuda",
                                              dtype=index_dtype)
                        return src, index

                    def run(src, index, dim=dim, pref=pref):
                        with bt.preference(pref):
                            return bt.gather(src, dim, index)
                    yield (f"gather dim={dim} {index_dtype} {pref}", make, run, ("gather",))
    # column slabs: a src larger than about half of L2, gathered along a non-innermost dim
    def make_slab():
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        rows = max(64, (l2 // 2) // 512 + 64)  # float32 rows of 128 columns: > L2/2 bytes
        src = rand(rows, 128, dtype=torch.float32)
        return src, torch.randint(0, rows, (rows // 2, 128), device="cuda")
    for pref in ("fastest", "deterministic"):
        def run_slab(src, index, pref=pref):
            with bt.preference(pref):
                return bt.gather(src, 0, index)
        yield f"gather slab {pref}", make_slab, run_slab, ("gather",)


def ssd_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for L, chunk in ((70, 32), (64, 64)):
            def make(dtype=dtype, L=L):
                B, H, D, G, N = 2, 4, 32, 2, 16
                x = rand(B, L, H, D, dtype=dtype)
                dt = (torch.rand(B, L, H, device="cuda", dtype=dtype) * 0.5).requires_grad_()
                A = (-torch.rand(H, device="cuda", dtype=dtype)).requires_grad_()
                return x, dt, A, rand(B, L, G, N, dtype=dtype), rand(B, L, G, N, dtype=dtype)
            yield (f"ssd L={L} chunk={chunk}", make,
                   lambda *t, chunk=chunk: bt.ssd_chunk_scan(*t, chunk_size=chunk),
                   ("ssd_chunk_scan",))


def _ssd_option_inputs(dtype, D_per_dim, starts):
    """x, dt, A, B, C, D, z, dt_bias, initial states and seq_idx of the options' cases (B 2,
    L 70, H 4, P 32, G 2, N 16; parameters in float32, float64 for float64; sequences
    starting at `starts`)."""
    B, L, H, P, G, N = 2, 70, 4, 32, 2, 16
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    seq_idx = torch.zeros(B, L, dtype=torch.int32, device="cuda")
    for t0 in starts:
        seq_idx[:, t0:] += 1
    return (rand(B, L, H, P, dtype=dtype), rand(B, L, H, dtype=dtype),
            (-torch.rand(H, device="cuda", dtype=pdt)).requires_grad_(),
            rand(B, L, G, N, dtype=dtype), rand(B, L, G, N, dtype=dtype),
            rand(*((H, P) if D_per_dim else (H,)), dtype=pdt),
            rand(B, L, H, P, dtype=dtype), rand(H, dtype=pdt),
            rand(B, H, P, N, dtype=pdt), seq_idx)


def _ssd_option_run(x, dt, A, B, C, D, z, dt_bias, init, seq_idx):
    from baracuda_torch.mamba import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined(
        x, dt, A, B, C, 32, D=D, z=z, dt_bias=dt_bias, initial_states=init,
        seq_idx=seq_idx, dt_softplus=True, dt_limit=(0.01, 2.0),
        return_final_states=True)


def ssd_option_cases() -> Iterator[Case]:
    """mamba_chunk_scan_combined with every option: D (both shapes), z, dt_bias + softplus +
    limit, initial and final states, seq_idx boundaries inside chunks, float32 parameters."""
    for dtype in DTYPES:
        for D_per_dim in (False, True):
            yield (f"ssd options D_per_dim={D_per_dim}",
                   lambda dtype=dtype, D_per_dim=D_per_dim: _ssd_option_inputs(dtype, D_per_dim, (21, 50)),
                   _ssd_option_run, ("ssd_chunk_scan_combined",))


def rmsnorm_cases() -> Iterator[Case]:
    """Widths that take each variant (a row per 8 lanes, a warp, a block; 16-byte rows,
    odd widths and transposed x: strided; a row wider than the registers hold), row
    counts that leave row groups empty, each convention, with and without a residual
    and a weight (the backward's shared-memory and workspace dw partials)."""
    for dtype in DTYPES:
        for hidden in (64, 256, 4096, 40000):
            for name, make in layouts((37, hidden), dtype):
                for conv, residual, weight in (("torch", False, True), ("llama", True, True),
                                               ("gemma", True, False)):
                    def build(make=make, residual=residual, weight=weight, dtype=dtype):
                        x = make()
                        w = rand(x.shape[-1], dtype=dtype) if weight else None
                        return (x, rand(*x.shape, dtype=dtype) if residual else None, w)

                    def run(x, r, w, conv=conv):
                        return bt.rms_norm(x, x.shape[-1], w, 1e-6, convention=conv, residual=r)
                    yield (f"rmsnorm {conv} residual={residual} weight={weight} [37, {hidden}] {name}",
                           build, run, ("rms_norm", "add_rms_norm"))


def conv_cases() -> Iterator[Case]:
    """The causal conv1d, forward and backward, in each layout the plan maps to a kernel
    (channel-last vectors, 16-byte rows: 48 steps, a 16-bit thread's last iteration ending
    halfway; strided), each width, with seq_idx (padding steps too) or with initial states
    and final states (dfinal)."""
    for dtype in DTYPES:
        for width in (2, 3, 4):
            shapes = (("channel-last", lambda: rand(2, 45, 24, dtype=dtype).detach().transpose(1, 2)),
                      ("rows", lambda: rand(2, 24, 48, dtype=dtype).detach()),
                      ("strided", lambda: rand(2, 24, 90, dtype=dtype).detach()[..., ::2]))
            for name, make_x in shapes:
                for seq in (True, False):
                    def build(make_x=make_x, width=width, seq=seq, dtype=dtype):
                        x = make_x().requires_grad_(True)
                        w, b = rand(24, width, dtype=dtype), rand(24, dtype=dtype)
                        if seq:
                            L = x.size(2)
                            ids = torch.arange(L, device="cuda", dtype=torch.int32) // 10 - 1
                            return (x, w, b, ids.expand(2, L).contiguous(), None)
                        return (x, w, b, None, rand(2, 24, width - 1, dtype=dtype))

                    def run(x, w, b, seq_idx, init):
                        return bt.causal_depthwise_conv1d(x, w, b, seq_idx=seq_idx, initial_states=init,
                                                          activation="silu",
                                                          return_final_states=init is not None)
                    yield (f"conv W={width} {name} seq_idx={seq}", build, run,
                           ("causal_conv1d", "causal_conv1d_backward"))


def gated_rmsnorm_cases() -> Iterator[Case]:
    """The gated RMSNorm over group widths that take each variant (8 lanes, a block, 4
    vectors a thread, strided: odd, transposed, wider than the registers hold), several
    groups a row, both gates, with and without a bias (its own backward kernels)."""
    for dtype in DTYPES:
        for hidden, group_size in ((64, 8), (5120, None), (5120, 640), (10240, None), (40000, 20000)):
            for name, make in layouts((37, hidden), dtype):
                for before, bias in ((True, False), (False, True)):
                    def build(make=make, bias=bias, dtype=dtype):
                        x = make()
                        n = x.shape[-1]
                        return (x, rand(*x.shape, dtype=dtype), rand(n, dtype=dtype),
                                rand(n, dtype=dtype) if bias else None)

                    def run(x, z, w, b, gs=group_size, hidden=hidden, before=before):
                        return bt.gated_rms_norm(x, w, z, 1e-5, gs if x.shape[-1] == hidden else None,
                                                 before, bias=b)
                    yield (f"gated_rmsnorm norm_before_gate={before} bias={bias} [37, {hidden}] "
                           f"group_size={group_size} {name}", build, run, ("gated_rms_norm",))
    # The into op: dz a column slice of a wider buffer (rows at a 16-byte multiple: the rows
    # kernel; at an odd offset: strided), y recomputed.
    for dtype in DTYPES:
        for hidden, group_size, start in ((5120, None, 5120), (5120, 640, 8), (5120, None, 1), (100, 25, 4)):
            def build(hidden=hidden, dtype=dtype):
                return tuple(rand(*shape, dtype=dtype, grad=False) for shape in ((37, hidden), (37, hidden), (hidden,),
                                                                                  (37, hidden)))

            def run(x, z, w, dy, gs=group_size, start=start):
                rstd = torch.ops.baracuda.gated_rms_norm(x, w, None, z, 1e-5, gs)[1]
                dz = torch.empty(37, start + x.shape[-1] + 16, dtype=x.dtype, device="cuda")[:, start:start + x.shape[-1]]
                return torch.ops.baracuda.gated_rms_norm_backward_into(dy, x, w, None, z, rstd, dz, gs, True, True)
            yield (f"gated_rmsnorm into [37, {hidden}] group_size={group_size} dz at column {start}", build, run,
                   ("gated_rms_norm_backward_into",))


def mamba_split_cases() -> Iterator[Case]:
    """mamba_split_conv1d_scan_combined's fused Function: the causal conv1d on zxbcdt's
    channel-last slice (and its backward over x's channels, then B's and C's, writing dx
    into those slices of dzxbcdt: causal_conv1d_backward_into), the scan, the
    gated RMSNorm (its backward writing dz into dzxbcdt: gated_rms_norm_backward_into) or
    the scan's own gate, SwiGLU for a d_mlp part, seq_idx with padding."""
    from baracuda_torch.mamba import mamba_split_conv1d_scan_combined
    for dtype in (torch.bfloat16, torch.float32):
        for rms, d_mlp, seq in ((True, 0, False), (True, 8, True), (False, 0, True)):
            def make(dtype=dtype, d_mlp=d_mlp, seq=seq):
                b, L, H, P, G, N, W = 2, 70, 4, 16, 2, 16, 4
                dim, f32 = H * P, torch.float32
                seq_idx = None
                if seq:
                    seq_idx = torch.zeros(b, L, dtype=torch.int32, device="cuda")
                    seq_idx[:, :3] = -1
                    seq_idx[:, 40:] = 1
                return (rand(b, L, 2 * d_mlp + 2 * dim + 2 * G * N + H, dtype=dtype),
                        rand(dim + 2 * G * N, W, dtype=dtype), rand(dim + 2 * G * N, dtype=dtype),
                        rand(H, dtype=f32), (-torch.rand(H, device="cuda")).requires_grad_(), rand(H, dtype=f32),
                        rand(dim, dtype=dtype), rand(24, d_mlp + dim, dtype=dtype), seq_idx)

            def run(zxbcdt, cw, cb, dt_bias, A, D, rms_w, out_w, seq_idx, rms=rms):
                return mamba_split_conv1d_scan_combined(
                    zxbcdt, cw, cb, dt_bias, A, D, 32, seq_idx=seq_idx, return_final_states=True,
                    rmsnorm_weight=rms_w if rms else None, rmsnorm_eps=1e-5, outproj_weight=out_w,
                    headdim=16, ngroups=2, norm_before_gate=False)
            yield (f"mamba_split rms={rms} d_mlp={d_mlp} seq_idx={seq}", make, run,
                   ("causal_conv1d", "causal_conv1d_backward_into", "ssd_chunk_scan_combined", "gated_rms_norm",
                    "gated_rms_norm_backward_into", "gated_activation"))


def ssd_group_cases() -> Iterator[Case]:
    """The backward's group products (dCB, dx from the B·Cᵀ tiles, dC/dB): one group of
    4 heads (the plan's choice at these sizes: dCB in 2 head splits), or 4 groups of one
    head (one split: the dCB kernel stores the 16-bit dCB itself), a short last chunk,
    head_dim past one 64-column tile, state_dim padded to the MMA step (40) or not a
    multiple of 4 (38, the scalar copies), with and without D and z; chunk 64, and 128 at
    L = 300 (whole off-diagonal 64-row tile pairs, where dCB's weights factor)."""
    from baracuda_torch.mamba import mamba_chunk_scan_combined
    for dtype in (torch.bfloat16, torch.float16):
        for N, options, G, L, Q in ((40, False, 1, 100, 64), (38, True, 1, 100, 64), (40, True, 4, 100, 64),
                                    (40, False, 1, 300, 128)):
            def make(dtype=dtype, N=N, options=options, G=G, L=L):
                B, H, P = 2, 4, 96
                t = (rand(B, L, H, P, dtype=dtype), (torch.rand(B, L, H, device="cuda", dtype=dtype) * 0.5),
                     (-torch.rand(H, device="cuda", dtype=dtype)), rand(B, L, G, N, dtype=dtype),
                     rand(B, L, G, N, dtype=dtype))
                extra = (rand(H, P, dtype=torch.float32), rand(B, L, H, P, dtype=dtype)) if options else (None, None)
                return tuple(x.requires_grad_() if x is not None and not x.requires_grad else x for x in t) + extra

            def run(x, dt, A, B, C, D, z, Q=Q):
                return mamba_chunk_scan_combined(x, dt, A, B, C, Q, D=D, z=z)
            yield f"ssd group products N={N} options={options} G={G} L={L} chunk={Q}", make, run, \
                ("ssd_chunk_scan_combined",)


def _switched_cases(cases, switch, value: str, tag: str) -> Iterator[Case]:
    """`cases`' cases with the test switch `switch` set to `value`, each name tagged. The
    switch holds while the cases run (each case's plans are made inside run_case)."""
    previous = switch(value)
    try:
        for case, make, fn, ops in cases():
            yield f"{case} ({tag})", make, fn, ops
    finally:
        switch(previous)


def _wgmma_cases(cases, switch, name: str) -> Iterator[Case]:
    """`cases`' cases with the SSD test switch `switch` (bt._C._ssd_cuda_forward or
    _ssd_cuda_backward) set to the wgmma kernel `name`: an sm_90 device with the build's
    sm_90a code (no cases elsewhere)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0) \
            or not bt._C._arch_specific_kernels(90):
        return iter(())
    return _switched_cases(cases, switch, name, "wgmma")


def rope_cos_sin_i64_cases() -> Iterator[Case]:
    """rope_cos_sin's cases on the 64-bit kernel (the plan walks 32-bit offsets wherever
    they fit)."""
    return _switched_cases(rope_cos_sin_cases, bt._C._rope_cos_sin_walk32, "off", "64-bit kernel")


def ssd_group_wgmma_cases() -> Iterator[Case]:
    """ssd_group's cases with the dC/dB kernel's products on wgmma (group_wgmma)."""
    return _wgmma_cases(ssd_group_cases, bt._C._ssd_cuda_backward, "group_wgmma")


def ssd_fused_cases() -> Iterator[Case]:
    """The one-launch forwards (16-bit, head_dim 64, no seq_idx): the plan's fused_mma_cb (4
    heads a group: the C·Bᵀ table, H_c where B was) and fused_mma (a head a group); a short
    last chunk, N = 128 (whole 16-byte rows) and N = 38 (scalar loads, padded state
    columns), with D, z and initial states; forward and backward."""
    for G in (1, 4):
        for N, options in ((128, False), (38, True)):
            yield (f"ssd fused G={G} N={N} options={options}",
                   lambda G=G, N=N, options=options: _ssd_fused_inputs(4, 64, G, N, options), _ssd_fused_run,
                   ("ssd_chunk_scan_combined",))


def ssd_state_wgmma_cases() -> Iterator[Case]:
    """The chunk-state kernel where a block computes 128 state columns (on sm_90a its
    products on wgmma, the plan's state_wgmma): head_dim 96 (a 32-column tile: warps past it
    multiply zeros) with N = 192 (a 64-column last block) through the staged forward, and
    the fused forward's N = 128 with D, z and initial states, then with seq_idx too (the
    packed-sequence instantiation); forward and backward (the recomputed states and the
    local dstates)."""
    for P, N, options, seq in ((96, 192, False, False), (64, 128, True, False), (64, 128, True, True)):
        yield (f"ssd chunk states P={P} N={N} options={options} seq_idx={seq}",
               lambda P=P, N=N, options=options, seq=seq: _ssd_fused_inputs(2, P, 1, N, options, seq),
               _ssd_fused_run, ("ssd_chunk_scan_combined",))


def ssd_fused_seq_cases() -> Iterator[Case]:
    """fused_mma and fused_mma_cb with seq_idx (sequences starting inside a chunk, at a
    chunk's first position and one after it), each forced through the test switch (the
    plan picks one of them by the heads a group), with D, z and initial states; N = 128
    and 38."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return
    for kernel in ("fused_mma", "fused_mma_cb"):
        previous = bt._C._ssd_cuda_forward(kernel)
        try:
            for N in (128, 38):
                yield (f"ssd {kernel} N={N} seq_idx",
                       lambda N=N: _ssd_fused_inputs(4, 64, 1, N, True, True), _ssd_fused_run,
                       ("ssd_chunk_scan_combined",))
        finally:
            bt._C._ssd_cuda_forward(previous)


def ssd_staged_seq_cases() -> Iterator[Case]:
    """The staged tensor-core kernels with seq_idx (float16, bfloat16; the forward, and the
    per-head and the group products' backward, forced through the test switches): the
    options' cases with two starts in one chunk, one at a chunk's first position, one
    inside a 16-position step."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return
    previous = bt._C._ssd_cuda_forward("staged"), bt._C._ssd_cuda_backward("auto")
    try:
        for dtype, backward in ((torch.bfloat16, "staged"), (torch.float16, "staged"),
                                (torch.bfloat16, "group_mma"), (torch.bfloat16, "group_wgmma")):
            bt._C._ssd_cuda_backward(backward)
            yield (f"ssd staged seq_idx backward={backward}",
                   lambda dtype=dtype: _ssd_option_inputs(dtype, False, (5, 21, 32, 50)),
                   _ssd_option_run, ("ssd_chunk_scan_combined",))
    finally:
        bt._C._ssd_cuda_forward(previous[0])
        bt._C._ssd_cuda_backward(previous[1])


def _ssd_fused_inputs(H, P, G, N, options, seq=False):
    """The fused forwards' cases' inputs (bfloat16, B 1, L 300): x, dt, A, B, C with
    gradients, then D [H], z and float32 initial states (or None each without options), and
    seq_idx (int32, sequences starting at 100, 256 and 257; or None)."""
    B, L, dtype = 1, 300, torch.bfloat16
    t = (rand(B, L, H, P, dtype=dtype), (torch.rand(B, L, H, device="cuda", dtype=dtype) * 0.5),
         (-torch.rand(H, device="cuda")), rand(B, L, G, N, dtype=dtype), rand(B, L, G, N, dtype=dtype))
    extra = ((rand(H, dtype=torch.float32), rand(B, L, H, P, dtype=dtype),
              rand(B, H, P, N, dtype=torch.float32)) if options else (None, None, None))
    seq_idx = None
    if seq:
        seq_idx = torch.zeros(B, L, dtype=torch.int32, device="cuda")
        for t0 in (100, 256, 257):
            seq_idx[:, t0:] += 1
    return tuple(x.requires_grad_() if x is not None and not x.requires_grad else x for x in t) + extra + (seq_idx,)


def _ssd_fused_run(x, dt, A, B, C, D, z, init, seq_idx):
    from baracuda_torch.mamba import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, z=z, initial_states=init, seq_idx=seq_idx)


def ssd_fused_wgmma_cases() -> Iterator[Case]:
    """ssd_fused's cases with the forward forced to fused_wgmma."""
    return _wgmma_cases(ssd_fused_cases, bt._C._ssd_cuda_forward, "fused_wgmma")


def ssd_fused_n256_cases() -> Iterator[Case]:
    """fused_mma_cb at state dims above 128 (its tile of 256 columns in two halves of
    128; the plan's forward there): N = 256 (whole 16-byte rows, one head a group and
    head_dim 128; the second half's H_c handed to the first, which writes every row),
    N = 200 (padded tile, scalar loads) with D, z and initial states, and N = 256 with
    those and seq_idx (the two option cases, with z: both halves hand over H_c and write
    half the rows each, the plan's fused_split_share); forward and backward. Sm_90 only."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return
    for N, P, G, options, seq in ((256, 128, 2, False, False), (200, 64, 1, True, False), (256, 64, 1, True, True)):
        yield (f"ssd fused_mma_cb N={N} P={P} G={G} options={options} seq_idx={seq}",
               lambda N=N, P=P, G=G, options=options, seq=seq: _ssd_fused_inputs(2, P, G, N, options, seq),
               _ssd_fused_run, ("ssd_chunk_scan_combined",))


def ssd_99kb_cases() -> Iterator[Case]:
    """The SSD's 16-bit SIMT route (a device whose blocks may opt into 99 KB, simulated by
    capping what the plans see: the staged tensor-core scan does not fit at N or D above
    192): N = 256 and D = 256, with every option and seq_idx boundaries inside chunks;
    forward and backward. The cap holds while the cases run."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        return
    from baracuda_torch.mamba import mamba_chunk_scan_combined
    previous = bt._C._cuda_smem_optin_cap(99 * 1024)
    try:
        for dtype in (torch.bfloat16, torch.float16):
            for P, N in ((32, 256), (256, 16)):
                def make(dtype=dtype, P=P, N=N):
                    B, L, H, G = 1, 70, 2, 1
                    seq_idx = torch.zeros(B, L, dtype=torch.int32, device="cuda")
                    seq_idx[:, 40:] = 1
                    return (rand(B, L, H, P, dtype=dtype), rand(B, L, H, dtype=dtype),
                            (-torch.rand(H, device="cuda")).requires_grad_(),
                            rand(B, L, G, N, dtype=dtype), rand(B, L, G, N, dtype=dtype),
                            rand(H, dtype=torch.float32), rand(B, L, H, P, dtype=dtype),
                            rand(B, H, P, N, dtype=torch.float32), seq_idx)

                def run(x, dt, A, B, C, D, z, init, seq_idx):
                    return mamba_chunk_scan_combined(x, dt, A, B, C, 32, D=D, z=z, initial_states=init,
                                                     seq_idx=seq_idx, dt_softplus=True, return_final_states=True)
                yield f"ssd 99 KB {dtype} P={P} N={N}", make, run, ("ssd_chunk_scan_combined",)
    finally:
        bt._C._cuda_smem_optin_cap(previous)


def state_update_cases() -> Iterator[Case]:
    """The state update and its tokens op over d_state classes (lanes and chunks a row), a
    batch large enough for several passes a block (both ways of computing a row's values:
    a lane per (row, token) pair, and every lane), a transposed state (tile_strided), a
    pool with a padding row and an index past it (the kernel's NaN row), and A per element
    and per head (Mamba-2's expanded A: tile_staged, the rows through shared memory); the
    decode step's whole-tiles kernel."""
    def build(batch, heads, dim, N, tokens, dtype, strided=False, pool=None, head_A=False):
        def make():
            t = () if tokens is None else (tokens,)
            st = torch.randn(pool or batch, heads, N, dim, device="cuda").transpose(-1, -2) if strided else \
                torch.randn(pool or batch, heads, dim, N, device="cuda")
            return (st, rand(batch, *t, heads, dim, dtype=dtype, grad=False),
                    rand(batch, *t, heads, dim, dtype=dtype, grad=False),
                    (-torch.rand(heads, 1 if head_A else dim, 1 if head_A else N, device="cuda")).expand(heads, dim, N),
                    rand(batch, *t, 1, N, dtype=dtype, grad=False),
                    rand(batch, *t, 1, N, dtype=dtype, grad=False))
        return make

    def run(state, x, dt, A, B, C, tokens=None, pool=None):
        fn = bt.selective_state_update_tokens if tokens else bt.selective_state_update
        idx = None if pool is None else torch.tensor([pool - 1, -1, pool] + [0] * (x.shape[0] - 3), device="cuda")
        return fn(state, x, dt, A, B, C, D=torch.randn(A.shape[:2], device="cuda"), dt_softplus=True,
                  state_batch_indices=idx)

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for N in (5, 16, 128, 256):
            for tokens in (None, 3):
                # (64 × 70 heads of 4 block passes' rows: several passes on 132 multiprocessors)
                lanes = min(32, max(4, 1 << max(0, (N + 3) // 4 - 1).bit_length()))  # the plan's lanes
                for batch, heads, dim in ((3, 4, 9), (64, 70, 4 * 128 // lanes)):
                    if dtype == torch.float64 and batch == 64:
                        continue
                    for head_A in (False, True):
                        yield (f"state update B{batch} H{heads} P{dim} N{N} tokens={tokens} head_A={head_A}",
                               build(batch, heads, dim, N, tokens, dtype, head_A=head_A),
                               lambda *a, t=tokens: run(*a, tokens=t),
                               ("selective_state_update", "selective_state_update_tokens"))
        for head_A in (False, True):
            yield (f"state update {'' if head_A else 'strided state, '}pool with padding, head_A={head_A}",
                   build(4, 4, 9, 16, None, dtype, strided=not head_A, pool=5, head_A=head_A),
                   lambda *a: run(*a, pool=5), ("selective_state_update",))

    for batch, N in ((4, 128), (64, 128), (4, 64)):  # 1, 8 and 1 passes a block on 132 multiprocessors
        yield (f"state update whole tiles B{batch} H8 P64 N{N}", build(batch, 8, 64, N, None, torch.bfloat16, head_A=True),
               run, ("selective_state_update",))


FAMILIES = {"gated": gated_cases, "gated_pair": gated_pair_cases, "rope": rope_cases,
            "rope_cos_sin": rope_cos_sin_cases,
            "rope_cos_sin_i64": rope_cos_sin_i64_cases, "lerp": lerp_cases,
            "gather": gather_cases, "conv": conv_cases, "rmsnorm": rmsnorm_cases, "gated_rmsnorm": gated_rmsnorm_cases,
            "ssd": ssd_cases,
            "ssd_options": ssd_option_cases, "ssd_group": ssd_group_cases, "ssd_group_wgmma": ssd_group_wgmma_cases,
            "ssd_fused": ssd_fused_cases, "ssd_fused_wgmma": ssd_fused_wgmma_cases,
            "ssd_fused_n256": ssd_fused_n256_cases, "ssd_fused_seq": ssd_fused_seq_cases,
            "ssd_99kb": ssd_99kb_cases,
            "ssd_staged_seq": ssd_staged_seq_cases, "ssd_state_wgmma": ssd_state_wgmma_cases,
            "mamba_split": mamba_split_cases, "state_update": state_update_cases}


def run_case(name: str, make, fn) -> str:
    inputs = make()
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) for o in outs if o.is_floating_point() and o.requires_grad]
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    if grads and leaves:
        torch.autograd.grad([o for o in outs if o.requires_grad], leaves, grads, allow_unused=True)
    torch.cuda.synchronize()
    return f"{name} [{inputs[0].dtype}]"


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    args = p.parse_args(argv)
    count = 0
    for family in args.families.split(","):
        for name, make, fn, _ in FAMILIES[family]():
            if args.list:
                print(name)
                continue
            print(run_case(name, make, fn), flush=True)
            count += 1
    if not args.list:
        print(f"sanitize_cuda: {count} cases ran")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available() and "--list" not in sys.argv:
        sys.exit("sanitize_cuda: needs a CUDA device")
    sys.exit(main(sys.argv[1:]))
