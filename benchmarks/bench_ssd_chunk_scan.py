"""Mamba-2 SSD chunk scan at the benchmark shapes, bf16, chunk 256:
  B4 L4096 H80 D64 N128 G1   (a Mamba-2 2.7B layer)
  B2 L8192 H32 D64 N64 G32   (per-head B/C, the seed's layout)
Providers: baracuda; torch = reference.ssd_chunk_scan_chunked in eager PyTorch (the
chunked SSD recipe: what users have without mamba_ssm); compile = torch.compile of the
same, tried once (Inductor has failed on it) and recorded as a note if it fails;
mamba_ssm = its Triton mamba_chunk_scan_combined when peers/ has it (benchmarks/peers.py),
after a check that its output agrees with ours on the same inputs. Each shape also gets a
"+options" case (D, z, dt_bias with softplus, float32 initial states, A, D and dt_bias in
float32, as Mamba2 calls it) for baracuda.mamba and mamba_ssm.
Modes: forward, backward (the backward pass alone). Peak memory per row.

CPU (``--device cpu``, or ``run_all.py --device cpu``): ``run_cpu``, float32, chunk 64,
B2 L4096 H16 D64 N128 and B1 L2048 H8 D64 N64 (G1): our default (chunked), our
"precise" (float64 recurrence; the small shape only) and the chunked PyTorch reference,
timed alternately, forward and backward.

FLOPs, the project's count of the chunked algorithm's matmuls (Q = chunk, nc = ⌈L/Q⌉),
with the causal (lower-triangular) products counted at half:
  forward  = B·H·nc·Q²·(N + D)       C·Bᵀ per head (Q²·N) and its product with x (Q²·D)
           + 4·B·H·nc·Q·D·N          each chunk's state xᵀB and the state read-out C·h
  backward = 2 × forward             each product's gradient w.r.t. both operands
                                     (recomputation not counted)
For G < H the C·Bᵀ product is shared by a group's heads, so for G = 1 this overstates
the work by B·(H − G)·nc·Q²·N; it gives ≈107 GFLOP for the 2.7B shape's forward and is
kept so that TFLOP/s stay comparable across runs.
"""
from __future__ import annotations

import dataclasses
import time

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import reference as ref
from baracuda_torch.mamba import mamba_chunk_scan_combined
from harness import Row, backward_fn, format_cpu_table, format_table, measure, measure_interleaved
import peers

FAMILY = "ssd_chunk_scan"
SHAPES = [(4, 4096, 80, 64, 128, 1), (2, 8192, 32, 64, 64, 32)]  # B, L, H, D, N, G
CHUNK = 256
COMPILE_BUDGET_S = 45  # stop trying torch.compile after this much time


def forward_flops(b, L, H, D, N, Q):
    nc = -(-L // Q)
    return b * H * nc * Q * Q * (N + D) + 4 * b * H * nc * Q * D * N


def make_inputs(b, L, H, D, N, G, dtype):
    x = torch.randn(b, L, H, D, device="cuda", dtype=dtype)
    dt = F.softplus(torch.randn(b, L, H, device="cuda") - 2).to(dtype)
    A = -torch.exp(0.5 * torch.randn(H, device="cuda")).to(dtype)
    B = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    C = torch.randn(b, L, G, N, device="cuda", dtype=dtype)
    return [t.requires_grad_() for t in (x, dt, A, B, C)]


def check_output(inputs) -> str:
    """Normwise error of our bf16 output against the chunked reference in float32, on the
    first batch element; a note for the row, and a loud one when it is off."""
    one = [t.detach()[:1] if t.dim() > 1 else t.detach() for t in inputs]
    with torch.no_grad():
        y = bt.ssd_chunk_scan(*one, chunk_size=CHUNK).float()
        y32 = ref.ssd_chunk_scan_chunked(*[t.float() for t in one], chunk_size=CHUNK)
    err = ((y - y32).norm() / y32.norm()).item()
    del y, y32
    torch.cuda.empty_cache()
    return f"rel err vs float32 reference {err:.1e}" + ("" if err < 2e-2 else " CHECK FAILED")


def option_rows(b, L, H, D, N, G, dtype) -> list[Row]:
    """The "+options" case: ours and mamba_ssm's with the options a Mamba2 layer passes."""
    case = f"B{b} L{L} H{H} D{D} N{N} G{G} Q{CHUNK} +options"
    x, dt, _, B, C = [t.detach() for t in make_inputs(b, L, H, D, N, G, dtype)]
    f32 = dict(device="cuda", dtype=torch.float32)
    inputs = [x, (dt.float() - 1).to(dtype), -torch.exp(0.5 * torch.randn(H, **f32)), B, C,
              torch.randn(H, **f32), torch.randn_like(x), torch.randn(H, **f32) * 0.1,
              torch.randn(b, H, D, N, **f32)]
    inputs = [t.requires_grad_() for t in inputs]
    dy = torch.randn_like(x)
    flops = forward_flops(b, L, H, D, N, CHUNK)

    def call(fn):
        def f():
            x, dt, A, B, C, Dp, z, dt_bias, init = inputs
            return fn(x, dt, A, B, C, CHUNK, D=Dp, z=z, dt_bias=dt_bias, initial_states=init,
                      dt_softplus=True)
        return f
    impls = {"baracuda": call(mamba_chunk_scan_combined)}
    theirs = peers.mamba_chunk_scan_combined()
    note = ""
    if theirs is not None:
        impls["mamba_ssm"] = call(theirs)
        with torch.no_grad():
            note = peers.agree(impls["baracuda"](), impls["mamba_ssm"](), case, rtol=2e-2)
    rows = []
    for provider, f in impls.items():
        with torch.no_grad():
            rows.append(measure(FAMILY, case, dtype, provider, "forward", f, flops=flops,
                                with_memory=True, note=note))
        rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(f, inputs, dy),
                            flops=2 * flops, with_memory=True, note=note))
        torch.cuda.empty_cache()
    return rows


def run(shapes=SHAPES, dtype=torch.bfloat16,
        providers=("baracuda", "mamba_ssm", "torch", "compile")) -> list[Row]:
    rows: list[Row] = []
    mamba = peers.mamba_chunk_scan_combined() if "mamba_ssm" in providers else None
    if mamba is None:
        providers = tuple(p for p in providers if p != "mamba_ssm")
    compile_failed = None
    t_start = time.time()
    for b, L, H, D, N, G in shapes:
        case = f"B{b} L{L} H{H} D{D} N{N} G{G} Q{CHUNK}"
        inputs = make_inputs(b, L, H, D, N, G, dtype)
        dy = torch.randn(b, L, H, D, device="cuda", dtype=dtype)
        flops = forward_flops(b, L, H, D, N, CHUNK)
        note = check_output(inputs)
        fwd = {
            "baracuda": lambda: bt.ssd_chunk_scan(*inputs, chunk_size=CHUNK),
            "torch": lambda: ref.ssd_chunk_scan_chunked(*inputs, chunk_size=CHUNK),
        }
        if mamba is not None:
            fwd["mamba_ssm"] = lambda: mamba(*inputs, chunk_size=CHUNK)
            with torch.no_grad():
                note += "; mamba_ssm " + peers.agree(fwd["baracuda"](), fwd["mamba_ssm"](),
                                                     case, rtol=2e-2)

        def measure_both(provider, f):
            row_note = note if provider == "baracuda" else ""
            with torch.no_grad():
                rows.append(measure(FAMILY, case, dtype, provider, "forward", f, flops=flops,
                                    with_memory=True, note=row_note))
            rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(f, inputs, dy),
                                flops=2 * flops, with_memory=True, note=row_note))
            torch.cuda.empty_cache()

        for provider in providers:
            if provider != "compile":
                measure_both(provider, fwd[provider])
                continue
            if compile_failed:
                continue
            if time.time() - t_start > COMPILE_BUDGET_S:
                nan = float("nan")
                rows.append(Row(FAMILY, case, str(dtype).replace("torch.", ""), "compile", "forward",
                                nan, nan, nan, note="compile not tried: over the time budget"))
                continue
            # No donated buffers: the backward mode replays the backward with
            # retain_graph=True. The setting is part of the compiled graphs' cache key, so
            # it holds for the compilation and the measurements alike.
            with functorch_config.patch(donated_buffer=False):
                try:
                    torch._dynamo.reset()
                    compiled = torch.compile(ref.ssd_chunk_scan_chunked)
                    with torch.no_grad():
                        compiled(*inputs, chunk_size=CHUNK)
                    torch.autograd.grad(compiled(*inputs, chunk_size=CHUNK), inputs, dy)
                except Exception as e:  # noqa: BLE001 - recorded, not fatal
                    compile_failed = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    nan = float("nan")
                    rows.append(Row(FAMILY, case, str(dtype).replace("torch.", ""), "compile", "forward",
                                    nan, nan, nan, note=compile_failed))
                    continue
                measure_both("compile", lambda c=compiled: c(*inputs, chunk_size=CHUNK))
        del inputs, dy, fwd
        torch.cuda.empty_cache()
        rows += option_rows(b, L, H, D, N, G, dtype)
    return rows


# CPU: float32, chunk 64 (the chunk of mamba's ssd_minimal recipe), B, L, H, D, N, G.
CPU_SHAPES = [(2, 4096, 16, 64, 128, 1), (1, 2048, 8, 64, 64, 1)]
CPU_CHUNK = 64


def cpu_inputs(b, L, H, D, N, G):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, L, H, D, generator=g)
    dt = F.softplus(torch.randn(b, L, H, generator=g) - 2)
    A = -torch.exp(0.5 * torch.randn(H, generator=g))
    B = torch.randn(b, L, G, N, generator=g)
    C = torch.randn(b, L, G, N, generator=g)
    return [t.requires_grad_() for t in (x, dt, A, B, C)]


def run_cpu(shapes=CPU_SHAPES, repeats=15, precise_max_numel=2**21) -> list[Row]:
    """CPU, float32: baracuda's default (the chunked variant), baracuda under
    preference "precise" (the float64 recurrence; only where B·L·H·D <=
    precise_max_numel, it is slow) and the chunked PyTorch reference
    (reference.ssd_chunk_scan_chunked, chunk 64, its backward by autograd), all timed
    alternately on the same tensors, forward and backward. The "precise" rows appear as
    a case of their own ("... precise") next to the same run's torch timing."""
    rows: list[Row] = []
    dtype = torch.float32
    for b, L, H, D, N, G in shapes:
        case = f"B{b} L{L} H{H} D{D} N{N} G{G} Q{CPU_CHUNK}"
        inputs = cpu_inputs(b, L, H, D, N, G)
        dy = torch.randn(b, L, H, D)
        fwd = {"baracuda": lambda: bt.ssd_chunk_scan(*inputs, chunk_size=CPU_CHUNK),
               "torch": lambda: ref.ssd_chunk_scan_chunked(*inputs, chunk_size=CPU_CHUNK)}
        if b * L * H * D <= precise_max_numel:
            def precise():
                with bt.preference("precise"):
                    return bt.ssd_chunk_scan(*inputs, chunk_size=CPU_CHUNK)
            fwd["precise"] = precise
        with torch.no_grad():
            y, y_ref = fwd["baracuda"](), fwd["torch"]()
            err = ((y - y_ref).norm() / y_ref.norm()).item()
        note = f"rel err vs reference {err:.1e}" + ("" if err < 1e-4 else " CHECK FAILED")
        with torch.no_grad():
            fw = measure_interleaved(FAMILY, case, dtype, "forward", fwd, repeats=repeats)
        bwd = {p: backward_fn(f, inputs, dy) for p, f in fwd.items()}
        if "precise" in bwd:  # the backward's plan is chosen when it runs: keep "precise"
            def precise_backward(run=bwd["precise"]):
                with bt.preference("precise"):
                    return run()
            bwd["precise"] = precise_backward
        bw = measure_interleaved(FAMILY, case, dtype, "backward", bwd, repeats=repeats)
        for r in fw + bw:
            if r.provider == "baracuda":
                r.note = note
            if r.provider == "precise":  # a case of its own, against the same torch run
                torch_row = next(t for t in fw + bw if t.mode == r.mode and t.provider == "torch")
                r.case, r.provider = case + " precise", "baracuda"
                rows.append(dataclasses.replace(torch_row, case=r.case, note=""))
        rows += fw + bw
        del inputs, dy, fwd
    return rows


if __name__ == "__main__":
    import sys

    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
        print(format_cpu_table(run_cpu()))
    else:
        print(format_table(run()))
