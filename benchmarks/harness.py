"""Benchmark harness shared by every family's script.

Providers: ``baracuda`` | ``torch`` (eager reference.py) | ``compile`` (torch.compile of
the same reference).

CPU mode (``run_all.py --device cpu``, each family's ``run_cpu``): ``baracuda`` against
``torch`` eager on the same tensors, timed alternately call by call
(:func:`measure_interleaved`), so that load from other processes on a shared machine
falls on both providers alike; each row is the median (p20/p80) over the repeats. Modes: ``forward`` | ``backward`` (the backward pass alone, through
autograd with a retained graph) | ``full`` (both). Each row carries the median and
p20/p80 time (``triton.testing.do_bench``, which flushes L2 between runs; CUDA events
otherwise), GB/s from the fewest bytes the op must move or TFLOP/s from its FLOPs, the
ratio to a same-run device-to-device copy of the same bytes, and peak memory.

Whole layers (``bench_llama_layer``, ``bench_mamba2_layer``): a step is tens of
milliseconds, so :func:`time_steps` times a fixed number of steps one by one (CUDA
events; ``time.perf_counter`` on the CPU) after a warm-up instead of ``do_bench``'s
time budget; :func:`step_peak_memory` is one step's peak above what was allocated
before it; :func:`kernel_breakdown` sums each kernel's time over a few profiled steps
(``torch.profiler``) and :func:`bucket_kernels` groups it by name.
"""
from __future__ import annotations

import csv
import dataclasses
import os
from typing import Callable, Iterable, List, Optional

import torch

try:
    import triton.testing as _tt
except Exception:  # pragma: no cover - triton is optional
    _tt = None

WARMUP_MS = 25
REP_MS = 200


@dataclasses.dataclass
class Row:
    family: str
    case: str
    dtype: str
    provider: str
    mode: str
    median_us: float
    p20_us: float
    p80_us: float
    gbps: Optional[float] = None
    tflops: Optional[float] = None
    copy_us: Optional[float] = None
    ratio_to_copy: Optional[float] = None
    peak_mem_mb: Optional[float] = None
    note: str = ""


def time_us(fn: Callable[[], object]) -> tuple[float, float, float]:
    """(median, p20, p80) in microseconds."""
    if _tt is not None:
        med, p20, p80 = _tt.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, quantiles=[0.5, 0.2, 0.8])
        return med * 1e3, p20 * 1e3, p80 * 1e3
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return _event_times(fn, 50)


def _event_times(run: Callable[[], object], repeats: int, calls: int = 1) -> tuple[float, float, float]:
    """(median, p20, p80) microseconds a call: ``run`` timed ``repeats`` times between CUDA
    events, each time divided by the ``calls`` it makes."""
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / calls)
    t = torch.tensor(times)
    return t.quantile(0.5).item(), t.quantile(0.2).item(), t.quantile(0.8).item()


def time_us_graph(fn: Callable[[], object], calls: int = 20, repeats: int = 25) -> tuple[float, float, float]:
    """(median, p20, p80) microseconds a call of ``fn`` replayed from a CUDA graph of
    ``calls`` back-to-back calls: no host launch cost, as a decode loop under CUDA graphs
    runs (a small op timed eagerly can measure its launch more than its kernel). L2 is not
    flushed between the calls of a replay. ``fn`` runs 3 times on a side stream first
    (compilation, autotuning), then is captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return _event_times(graph.replay, repeats, calls)


_copy_cache: dict = {}


def copy_us(nbytes: int) -> float:
    """Median time of a device-to-device copy moving ``nbytes`` in total (half read, half written)."""
    if nbytes not in _copy_cache:
        n = nbytes // 2
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        _copy_cache[nbytes] = time_us(lambda: dst.copy_(src))[0]
        del src, dst
    return _copy_cache[nbytes]


def peak_memory_mb(fn: Callable[[], object]) -> float:
    """Peak CUDA memory allocated while fn runs, above what was allocated before."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def measure(family: str, case: str, dtype: torch.dtype, provider: str, mode: str,
            fn: Callable[[], object], nbytes: Optional[int] = None, flops: Optional[float] = None,
            with_memory: bool = False, note: str = "", graph: bool = False) -> Row:
    """One row; ``graph``: timed by :func:`time_us_graph` instead of :func:`time_us`."""
    med, p20, p80 = time_us_graph(fn) if graph else time_us(fn)
    row = Row(family, case, str(dtype).replace("torch.", ""), provider, mode, med, p20, p80, note=note)
    if nbytes:
        row.gbps = nbytes / (med * 1e-6) / 1e9
        row.copy_us = copy_us(nbytes)
        row.ratio_to_copy = row.copy_us / med
    if flops:
        row.tflops = flops / (med * 1e-6) / 1e12
    if with_memory:
        row.peak_mem_mb = peak_memory_mb(fn)
    return row


def time_interleaved_cpu(fns: dict, repeats: int = 15, warmup: int = 2) -> dict:
    """CPU timing of several callables on the same inputs, alternating call by call
    (provider order rotating every round): {name: (median, p20, p80)} in microseconds."""
    import time

    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times: dict = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append((time.perf_counter() - t0) * 1e6)
    out = {}
    for n in names:
        t = torch.tensor(times[n], dtype=torch.float64)
        out[n] = (t.quantile(0.5).item(), t.quantile(0.2).item(), t.quantile(0.8).item())
    return out


def measure_interleaved(family: str, case: str, dtype: torch.dtype, mode: str, fns: dict,
                        nbytes: Optional[int] = None, repeats: int = 15) -> List[Row]:
    """One Row per provider of ``fns`` ({provider: callable}), timed alternately on the CPU
    (:func:`time_interleaved_cpu`); each row's note is its median over the first
    provider's ("× baracuda")."""
    res = time_interleaved_cpu(fns, repeats)
    first = next(iter(fns))
    rows = []
    for provider, (med, p20, p80) in res.items():
        row = Row(family, case, str(dtype).replace("torch.", ""), provider, mode, med, p20, p80)
        if nbytes:
            row.gbps = nbytes / (med * 1e-6) / 1e9
        if provider != first:
            row.note = f"{med / res[first][0]:.2f}x {first}"
        rows.append(row)
    return rows


def backward_fn(make_output: Callable[[], torch.Tensor], inputs: List[torch.Tensor],
                grad: torch.Tensor) -> Callable[[], object]:
    """The backward pass alone: one forward with the graph kept, then repeated backward."""
    out = make_output()

    def run():
        return torch.autograd.grad(out, inputs, grad, retain_graph=True)

    return run


def full_fn(make_output: Callable[[], torch.Tensor], inputs: List[torch.Tensor],
            grad: torch.Tensor) -> Callable[[], object]:
    def run():
        return torch.autograd.grad(make_output(), inputs, grad)

    return run


def write_csv(rows: Iterable[Row], path: str) -> None:
    rows = list(rows)
    if not rows:
        return
    exists = os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(Row)])
        if not exists:
            w.writeheader()
        for r in rows:
            w.writerow(dataclasses.asdict(r))


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def format_table(rows: Iterable[Row]) -> str:
    lines = ["| family | case | dtype | provider | mode | median µs | p20–p80 µs | GB/s | TFLOP/s | × copy | peak MiB |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r.family} | {r.case} | {r.dtype} | {r.provider} | {r.mode} | {r.median_us:.1f} | "
            f"{r.p20_us:.1f}–{r.p80_us:.1f} | {_fmt(r.gbps, '.0f')} | {_fmt(r.tflops, '.1f')} | "
            f"{_fmt(r.ratio_to_copy, '.3f')} | {_fmt(r.peak_mem_mb, '.0f')} |")
    return "\n".join(lines)


def format_cpu_table(rows: Iterable[Row]) -> str:
    """CPU comparison table: one line per (family, case, dtype, mode) with the baracuda and
    torch medians (p20–p80) and their ratio (below 1: baracuda is faster)."""
    rows = list(rows)
    keys = []
    for r in rows:
        k = (r.family, r.case, r.dtype, r.mode)
        if k not in keys:
            keys.append(k)
    lines = ["| family | case | dtype | mode | baracuda ms (p20–p80) | torch eager ms (p20–p80) | baracuda / torch |",
             "|---|---|---|---|---:|---:|---:|"]
    for k in keys:
        by = {r.provider: r for r in rows if (r.family, r.case, r.dtype, r.mode) == k}
        if "baracuda" not in by or "torch" not in by:
            continue
        b, t = by["baracuda"], by["torch"]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {b.median_us / 1e3:.2f} "
                     f"({b.p20_us / 1e3:.2f}–{b.p80_us / 1e3:.2f}) | {t.median_us / 1e3:.2f} "
                     f"({t.p20_us / 1e3:.2f}–{t.p80_us / 1e3:.2f}) | {b.median_us / t.median_us:.2f} |")
    return "\n".join(lines)


# ---- whole layers ----------------------------------------------------------------------

def time_steps(fn: Callable[[], object], device: str, warmup: int = 3,
               iters: int = 20) -> tuple[float, float, float]:
    """(median, p20, p80) in microseconds of ``iters`` calls of ``fn`` after ``warmup``
    calls: each call between two CUDA events on a GPU (no synchronization between calls,
    so the host stays ahead where it can), between two ``perf_counter`` reads on the CPU."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    if device == "cpu":
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    else:
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)]
        for s, e in events:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e3 for s, e in events]
    t = torch.tensor(times, dtype=torch.float64)
    return t.quantile(0.5).item(), t.quantile(0.2).item(), t.quantile(0.8).item()


def step_peak_memory(fn: Callable[[], object], device: str) -> tuple[Optional[float], Optional[float]]:
    """(peak above what was allocated before, absolute peak) in MiB of one call of ``fn``
    (``torch.cuda.max_memory_allocated``); (None, None) on the CPU."""
    if device == "cpu":
        fn()
        return None, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return (peak - before) / 2**20, peak / 2**20


def kernel_breakdown(fn: Callable[[], object], device: str, iters: int = 3,
                     start: Optional[Callable[[], object]] = None) -> list:
    """[(name, µs per call of fn, launches per call)] over ``iters`` profiled calls, largest
    first: the CUDA kernels (and copies) on a GPU, each operator's self time on the CPU.
    ``start`` runs once inside the profiler before the calls: a barrier there keeps one
    rank's collective from waiting, profiled, for a peer whose profiler is still starting."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    if device != "cpu":
        torch.cuda.synchronize()
    activity = ProfilerActivity.CPU if device == "cpu" else ProfilerActivity.CUDA
    with profile(activities=[activity]) as prof:
        if start is not None:
            start()
        for _ in range(iters):
            fn()
        if device != "cpu":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_cpu_time_total if device == "cpu" else e.device_time_total
        if us > 0:
            rows.append((e.key, us / iters, e.count / iters))
    rows.sort(key=lambda r: -r[1])
    return rows


def bucket_kernels(kernels: list, buckets: list) -> dict:
    """{bucket: µs per call} for ``kernels`` from :func:`kernel_breakdown`; ``buckets`` is
    [(name, predicate on the lower-cased kernel name)], the first match wins, and what
    matches none goes to "rest"."""
    out = {name: 0.0 for name, _ in buckets}
    out["rest"] = 0.0
    for kname, us, _ in kernels:
        low = kname.lower()
        out[next((name for name, pred in buckets if pred(low)), "rest")] += us
    return out


def format_breakdown(title: str, kernels: list, buckets: list, top: int = 12) -> str:
    """The bucket totals of ``kernels`` (µs and share per call) and its ``top`` largest
    kernels, as text."""
    sums = bucket_kernels(kernels, buckets)
    total = sum(sums.values()) or 1.0
    lines = [f"{title}: {total / 1e3:.2f} ms of kernels per step; " + ", ".join(
        f"{name} {us / 1e3:.2f} ms ({100 * us / total:.0f}%)" for name, us in sums.items())]
    for name, us, n in kernels[:top]:
        short = name if len(name) < 110 else name[:107] + "..."
        lines.append(f"    {us / 1e3:8.3f} ms  x{n:<5g} {short}")
    return "\n".join(lines)


def max_rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|: the largest error on the scale of the values."""
    g, w = got.detach().double(), want.detach().double()
    return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item() if w.numel() else 0.0


def rel_l2_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want|_2 / |want|_2."""
    g, w = got.detach().double(), want.detach().double()
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item() if w.numel() else 0.0
