"""Turn a run_all.py CSV into the per-family markdown tables of BENCHMARKS.md.

    python benchmarks/report.py OUT/bench.csv > tables.md

One row per (case, dtype, mode): our median time, its fraction of the same-run copy of
the same bytes (memory-bound families) or TFLOP/s (SSD), peak memory where measured, and
every other provider's median with our speedup over it.
"""
from __future__ import annotations

import csv
import sys
from collections import OrderedDict


def fnum(v: str, spec: str) -> str:
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return ""


def main(path: str) -> None:
    rows = list(csv.DictReader(open(path)))
    families = OrderedDict()
    for r in rows:
        families.setdefault(r["family"], []).append(r)
    for fam, frows in families.items():
        ours = [r for r in frows if r["provider"] == "baracuda"]
        others = sorted({r["provider"] for r in frows} - {"baracuda"})
        flops = any(r["tflops"] for r in ours)
        head = ["case", "dtype", "mode", "baracuda µs", "TFLOP/s" if flops else "× copy"]
        if any(r["peak_mem_mb"] for r in ours):
            head.append("peak MiB")
        for o in others:
            head += [f"{o} µs", f"speedup vs {o}"]
        print(f"### {fam}\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in ours:
            if r["mode"] == "full":
                continue
            t = float(r["median_us"])
            cells = [r["case"], r["dtype"], r["mode"], f"{t:.1f}",
                     fnum(r["tflops"], ".1f") if flops else fnum(r["ratio_to_copy"], ".3f")]
            if "peak MiB" in head:
                cells.append(fnum(r["peak_mem_mb"], ".0f"))
            for o in others:
                match = [x for x in frows if x["provider"] == o and x["case"] == r["case"]
                         and x["dtype"] == r["dtype"] and x["mode"] == r["mode"]]
                if match and match[0]["median_us"] not in ("", "nan"):
                    ot = float(match[0]["median_us"])
                    cells += [f"{ot:.1f}", f"{ot / t:.2f}x"]
                elif match and match[0]["note"]:
                    cells += ["failed", ""]
                else:
                    cells += ["", ""]
            print("| " + " | ".join(cells) + " |")
        notes = sorted({r["note"] for r in frows if r["note"]})
        for n in notes:
            print(f"\nNote: {n}")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
