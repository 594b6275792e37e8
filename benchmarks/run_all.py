"""Run every family's benchmark on the current GPU; write a CSV and a markdown table.

    python benchmarks/run_all.py --out OUTDIR [--families gated_activation,rope]

With ``--device cpu``, the CPU comparison of the families that have one (a ``run_cpu``
in their bench_<family>.py: causal_conv1d, gated_activation, lerp, gather, mamba2_decode
(a smoke run at tiny shapes), rope, ssd_chunk_scan): baracuda against eager
PyTorch on the same tensors, timed alternately (``--repeats`` rounds; medians), at
PyTorch's current thread count (``--threads`` sets it)::

    python benchmarks/run_all.py --device cpu --out OUTDIR [--threads 2] [--repeats 15]
"""
from __future__ import annotations

import argparse
import glob
import importlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import format_cpu_table, format_table, write_csv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: bench_<name>.py scripts left out of the families: they spawn their own ranks over several
#: GPUs and are run directly (bench_context_parallel.py: docs/distributed.md)
STANDALONE = {"context_parallel"}
FAMILIES = sorted(name for name in (os.path.basename(p)[len("bench_"):-3]
                                    for p in glob.glob(os.path.join(HERE, "bench_*.py")))
                  if name not in STANDALONE)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_out")
    p.add_argument("--families", default=None)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--threads", type=int, default=None, help="CPU: torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=15, help="CPU: alternating rounds per case")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "bench.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)
    if args.device == "cpu":
        run_cpu(args, csv_path)
        return
    args.families = args.families or ",".join(FAMILIES)
    props = torch.cuda.get_device_properties(0)
    header = (f"GPU: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}, date {time.strftime('%Y-%m-%d')}")
    all_rows = run_families(args.families.split(","), lambda mod: mod.run(), format_table,
                            header, csv_path, args.out)
    plot(all_rows, os.path.join(args.out, "bench.png"), header)


def run_families(families, run, fmt, header: str, csv_path: str, out: str) -> list:
    """Runs `run(module)` for each family's bench module, appending its rows to the CSV
    and printing them as `fmt` tables as they come; writes bench.md; returns every row."""
    print(header, flush=True)
    all_rows = []
    for fam in families:
        t0 = time.time()
        rows = run(importlib.import_module(f"bench_{fam}"))
        write_csv(rows, csv_path)
        all_rows += rows
        print(f"[{fam}: {len(rows)} rows in {time.time() - t0:.0f} s]", flush=True)
        print(fmt(rows), flush=True)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(header + "\n\n" + fmt(all_rows) + "\n")
    return all_rows


def run_cpu(args, csv_path: str) -> None:
    import platform

    if args.threads:
        torch.set_num_threads(args.threads)
    cpu_families = [f for f in FAMILIES if hasattr(importlib.import_module(f"bench_{f}"), "run_cpu")]
    families = args.families.split(",") if args.families else cpu_families
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    header = (f"CPU: {model}, {os.cpu_count()} logical cores, torch {torch.__version__} with "
              f"{torch.get_num_threads()} threads (CPU capability "
              f"{torch.backends.cpu.get_cpu_capability()}), date {time.strftime('%Y-%m-%d %H:%M %Z')}, "
              f"{args.repeats} alternating rounds per case")
    run_families(families, lambda mod: mod.run_cpu(repeats=args.repeats), format_cpu_table,
                 header, csv_path, args.out)


def plot(rows, path, title) -> None:
    """Bar chart of each memory-bound row's fraction of the same-run copy bandwidth,
    grouped by case and mode, one bar per provider (SSD's TFLOP/s rows are table-only)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # matplotlib is optional
        return
    rows = [r for r in rows if r.mode != "full" and r.ratio_to_copy]
    groups = sorted({(r.family, r.case, r.dtype, r.mode) for r in rows},
                    key=lambda g: [x for x in g])
    providers = sorted({r.provider for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(groups)), 5))
    width = 0.8 / max(len(providers), 1)
    for i, prov in enumerate(providers):
        vals = []
        for g in groups:
            match = [r for r in rows if (r.family, r.case, r.dtype, r.mode) == g and r.provider == prov]
            vals.append(match[0].ratio_to_copy or 0.0 if match else 0.0)
        ax.bar([j + i * width for j in range(len(groups))], vals, width, label=prov)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("fraction of same-run copy bandwidth")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{c} {d} {m}" for _, c, d, m in groups], rotation=75, ha="right", fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
