"""Run every family's benchmark on the current GPU; write a CSV and a markdown table.

    python benchmarks/run_all.py --out OUTDIR [--families gated_activation,rope]
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
from harness import format_table, write_csv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = sorted(os.path.basename(p)[len("bench_"):-3] for p in glob.glob(os.path.join(HERE, "bench_*.py")))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_out")
    p.add_argument("--families", default=",".join(FAMILIES))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "bench.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)
    props = torch.cuda.get_device_properties(0)
    header = (f"GPU: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}, date {time.strftime('%Y-%m-%d')}")
    print(header, flush=True)
    all_rows = []
    for fam in args.families.split(","):
        t0 = time.time()
        mod = importlib.import_module(f"bench_{fam}")
        rows = mod.run()
        write_csv(rows, csv_path)
        all_rows += rows
        print(f"[{fam}: {len(rows)} rows in {time.time() - t0:.0f} s]", flush=True)
        print(format_table(rows), flush=True)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(header + "\n\n" + format_table(all_rows) + "\n")


if __name__ == "__main__":
    main()
