"""The driver shared by the whole-layer benchmarks (``bench_llama_layer.py``,
``bench_mamba2_layer.py``): several providers of the same layer, with the same weights,
on the same input and output gradient.

For each provider, in order: build its model (its ``context`` open around everything it
runs, for patches that live in module globals), one training step (forward, the loss
``(output * dy).sum()``, then the gradients of the input and every parameter through
``torch.autograd.grad``) whose wall time is reported as the first step (compilation,
autotuning), its output and gradients compared with the first provider that ran (the
reference), then the timings (:func:`harness.time_steps`: the forward alone, with
autograd recording as in training, and the whole step), one step's peak memory, and with
``profile`` the kernel breakdown of one step. A provider that fails is reported and
the others still run; one that cannot run here is listed with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import traceback
from typing import Callable, ContextManager, List, Optional

import torch

from harness import (Row, format_breakdown, kernel_breakdown, max_rel_diff, rel_l2_diff,
                     step_peak_memory, time_steps)


@dataclasses.dataclass
class Provider:
    name: str
    #: builds the model (a fresh copy of the shared weights, patched or compiled)
    make: Callable[[], torch.nn.Module]
    #: opened around everything the provider runs (patches of module globals)
    context: Callable[[], ContextManager] = contextlib.nullcontext
    #: why it is not run here (the model is still built, to show that the patch applies)
    skip: str = ""
    note: str = ""


@dataclasses.dataclass
class Result:
    provider: str
    forward: Optional[tuple] = None
    step: Optional[tuple] = None
    first_step_s: Optional[float] = None
    peak_mib: Optional[float] = None
    peak_abs_mib: Optional[float] = None
    diffs: Optional[dict] = None
    buckets: Optional[dict] = None
    note: str = ""


def _param_name(name: str) -> str:
    return name.replace("_orig_mod.", "")  # torch.compile's wrapper


def _grads(model, call, x, dy):
    """One training step: (output, {"x": dx, parameter name: gradient}). It ends in a loss,
    ``(output * dy).sum()``, as a model's step does: the output's gradient (equal to dy) is
    the autograd engine's own, which no one else holds (a backward may write over it: Liger's
    RMSNorm does, and so does ours where nothing else can read it), and dy stays as it is."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = call(model, x)
    g = torch.autograd.grad((out * dy).sum(), [x] + [p for _, p in named])
    return out.detach(), dict(zip(["x"] + [_param_name(n) for n, _ in named], g))


def _compare(out, grads, ref) -> dict:
    ref_out, ref_grads = ref
    common = [k for k in grads if k != "x" and k in ref_grads]
    worst = max(common, key=lambda k: max_rel_diff(grads[k], ref_grads[k]), default=None)
    return {"out": max_rel_diff(out, ref_out), "out_l2": rel_l2_diff(out, ref_out),
            "dx": max_rel_diff(grads["x"], ref_grads["x"]),
            "dw": max_rel_diff(grads[worst], ref_grads[worst]) if worst else float("nan"),
            "dw_name": worst or "", "dw_l2": rel_l2_diff(grads[worst], ref_grads[worst]) if worst else float("nan")}


def run_providers(providers: List[Provider], call: Callable, x: torch.Tensor, dy: torch.Tensor,
                  device: str, warmup: int, iters: int, profile: bool, buckets: list,
                  rtol: float, profile_iters: int = 3) -> List[Result]:
    """Runs every provider (module docstring); prints progress, skips, failures and, with
    ``profile``, each breakdown as it goes; returns one Result per provider that ran."""
    results: List[Result] = []
    ref = None
    ref_name = ""
    for p in providers:
        res = Result(p.name, note=p.note)
        try:
            with p.context():
                model = p.make()
                if p.skip:
                    print(f"[{p.name}] built, not run: {p.skip}", flush=True)
                    del model
                    continue

                def step(model=model):
                    _grads(model, call, x, dy)

                def forward(model=model):
                    call(model, x)

                t0 = time.perf_counter()
                out, grads = _grads(model, call, x, dy)
                if device != "cpu":
                    torch.cuda.synchronize()
                res.first_step_s = time.perf_counter() - t0
                if ref is None:
                    ref, ref_name = (out, grads), p.name
                else:
                    res.diffs = _compare(out, grads, ref)
                    res.diffs["ref"] = ref_name
                    if not res.diffs["out_l2"] <= rtol:
                        res.note = (res.note + "; " if res.note else "") + (
                            f"OUTPUT DIFFERS from {ref_name}: rel L2 {res.diffs['out_l2']:.3g} > {rtol}")
                        print(f"[{p.name}] WARNING: {res.note}", flush=True)
                del out, grads
                res.forward = time_steps(forward, device, warmup, iters)
                res.step = time_steps(step, device, warmup, iters)
                res.peak_mib, res.peak_abs_mib = step_peak_memory(step, device)
                if profile:
                    kernels = kernel_breakdown(step, device, profile_iters)
                    res.buckets = {"kernels": kernels}
                    print(format_breakdown(f"[{p.name}] breakdown", kernels, buckets), flush=True)
                del model, step, forward
            results.append(res)
            print(f"[{p.name}] forward {res.forward[0] / 1e3:.3f} ms, step {res.step[0] / 1e3:.3f} ms, "
                  f"first step {res.first_step_s:.1f} s", flush=True)
        except Exception as e:  # report it; the other providers still run
            print(f"[{p.name}] FAILED: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        finally:
            if device != "cpu":
                torch.cuda.empty_cache()
    return results


def to_rows(family: str, case: str, dtype: torch.dtype, results: List[Result],
            step_flops: Optional[float] = None) -> List[Row]:
    """Two harness Rows per result: mode ``forward`` and mode ``fwd+bwd`` (with the peak
    memory and, given the step's FLOPs, TFLOP/s); the notes carry the differences."""
    rows = []
    dt = str(dtype).replace("torch.", "")
    for r in results:
        note = r.note
        if r.diffs:
            d = r.diffs
            note = (note + "; " if note else "") + (
                f"vs {d['ref']}: out max rel {d['out']:.2e} (L2 {d['out_l2']:.2e}), dx {d['dx']:.2e}, "
                f"worst dW {d['dw']:.2e} ({d['dw_name']})")
        rows.append(Row(family, case, dt, r.provider, "forward", *r.forward, note=note))
        row = Row(family, case, dt, r.provider, "fwd+bwd", *r.step, peak_mem_mb=r.peak_mib, note=note)
        if step_flops:
            row.tflops = step_flops / (r.step[0] * 1e-6) / 1e12
        rows.append(row)
    return rows


def _fmt(v, spec, none=""):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def format_results(title: str, results: List[Result], step_flops: Optional[float] = None) -> str:
    """A markdown table of the results (times in ms, median and p20–p80), the first
    provider's step time over each one's ("speedup"), one step's peak memory above what
    was allocated before it (and the absolute ``max_memory_allocated``, which includes
    the weights, the inputs and the reference's outputs and gradients), the differences."""
    if not results:
        return f"{title}: no provider ran"
    base = results[0]
    lines = [f"**{title}**", "",
             f"| provider | forward ms | fwd+bwd ms | speedup vs {base.provider} | "
             + ("TFLOP/s | " if step_flops else "")
             + "peak MiB above before (absolute) | max rel diff out / dx / worst dW | first step s | note |",
             "|---|---:|---:|---:|" + ("---:|" if step_flops else "") + "---:|---|---:|---|"]
    for r in results:
        f, s = r.forward, r.step
        diffs = "reference" if r.diffs is None else (
            f"{r.diffs['out']:.1e} / {r.diffs['dx']:.1e} / {r.diffs['dw']:.1e}")
        cells = [r.provider, f"{f[0] / 1e3:.3f} ({f[1] / 1e3:.3f}–{f[2] / 1e3:.3f})",
                 f"{s[0] / 1e3:.3f} ({s[1] / 1e3:.3f}–{s[2] / 1e3:.3f})",
                 f"{base.step[0] / s[0]:.2f}x"]
        if step_flops:
            cells.append(f"{step_flops / (s[0] * 1e-6) / 1e12:.0f}")
        peak = _fmt(r.peak_mib, ".0f", "n/a") + (f" ({r.peak_abs_mib:.0f})" if r.peak_abs_mib else "")
        cells += [peak, diffs, _fmt(r.first_step_s, ".1f"), r.note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_bucket_table(title: str, results: List[Result], buckets: list) -> str:
    """A markdown table: per provider, the milliseconds of one step's kernels in each bucket."""
    from harness import bucket_kernels

    profiled = [r for r in results if r.buckets]
    if not profiled:
        return ""
    names = [n for n, _ in buckets] + ["rest"]
    lines = [f"**{title}: kernel time per step by bucket, ms (torch.profiler)**", "",
             "| provider | " + " | ".join(names) + " | total |",
             "|---|" + "---:|" * (len(names) + 1)]
    for r in profiled:
        sums = bucket_kernels(r.buckets["kernels"], buckets)
        lines.append(f"| {r.provider} | " + " | ".join(f"{sums[n] / 1e3:.2f}" for n in names)
                     + f" | {sum(sums.values()) / 1e3:.2f} |")
    return "\n".join(lines)
