"""Dev tool: where a kernel's instructions go, from Nsight Compute's source page (SASS).
Runs anywhere (no GPU, no torch): it reads the CSV that
  ncu --section SourceCounters --section WarpStateStats -k regex:NAME --launch-count 1 -o REPORT ...
  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SASS.csv
writes, and prints:
  - the warp instructions executed in all and by opcode (with its share of the stall samples);
  - the stall reasons' shares of all samples;
  - the execution-count classes: SASS lines executed the same number of times belong to
    the same loop level (with W warps a block and N blocks, a line executed N·W times runs
    once a block; N·W·heads times, once a head; and so on), so each class's lines count
    the instructions a warp runs at that level;
  - the runs: consecutive lines of one class, with their main opcodes (``--runs`` of them,
    those above ``--min-share`` of the instructions).
  python benchmarks/tune/ncu_source_summary.py SASS.csv [--runs 40] [--min-share 0.4]
"""
from __future__ import annotations

import argparse
import collections
import csv
import re


def read_rows(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu's first line names the kernel; the header follows
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[start]
    return header, [r for r in rows[start + 1:] if len(r) >= len(header)]


def opcode(source: str) -> str:
    """The opcode without its predicate and modifiers: '@!P0 LDG.E.64 R2, ...' -> 'LDG'."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--runs", type=int, default=40, help="at most this many runs")
    ap.add_argument("--min-share", type=float, default=0.4, help="runs above this %% of the instructions")
    args = ap.parse_args()
    header, rows = read_rows(args.csv)
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(r: list[str], name: str) -> int:
        return int(r[col[name]] or 0)

    executed = [num(r, "Instructions Executed") for r in rows]
    samples = [num(r, "# Samples") for r in rows]
    ops = [opcode(r[col["Source"]]) for r in rows]
    total, total_samples = sum(executed), max(sum(samples), 1)
    print(f"{len(rows)} SASS lines, {total:,} warp instructions executed, {total_samples:,} stall samples")

    by_op, samples_by_op = collections.Counter(), collections.Counter()
    for op, e, s in zip(ops, executed, samples):
        by_op[op] += e
        samples_by_op[op] += s
    print("\nby opcode: % of instructions (% of samples)")
    for op, e in by_op.most_common(20):
        print(f"  {op:10s} {100 * e / total:5.1f} ({100 * samples_by_op[op] / total_samples:4.1f})")

    by_stall = collections.Counter({s: sum(num(r, s) for r in rows) for s in stalls})
    print("\nstall reasons: % of samples")
    for s, n in by_stall.most_common(12):
        print(f"  {s[len('stall_'):]:18s} {100 * n / total_samples:5.1f}")

    classes, class_samples = collections.Counter(), collections.Counter()
    for e, s in zip(executed, samples):
        classes[e] += 1
        class_samples[e] += s
    print("\nexecution-count classes: times a line ran, lines, % of instructions (% of samples)")
    for e, lines in sorted(classes.items(), key=lambda kv: -kv[0] * kv[1])[:15]:
        if e:
            print(f"  {e:>11,} {lines:5d} {100 * e * lines / total:5.1f} ({100 * class_samples[e] / total_samples:4.1f})")

    runs: list[dict] = []
    for i, (e, s, op) in enumerate(zip(executed, samples, ops)):
        if runs and runs[-1]["executed"] == e:
            run = runs[-1]
        else:
            run = {"first": i, "executed": e, "lines": 0, "samples": 0, "ops": collections.Counter()}
            runs.append(run)
        run["last"], run["lines"], run["samples"] = i, run["lines"] + 1, run["samples"] + s
        run["ops"][op] += 1
    print("\nruns (SASS line numbers from 0): times run, lines, % of instructions (% of samples), main opcodes")
    shown = 0
    for run in runs:
        share = 100 * run["executed"] * run["lines"] / total
        if share < args.min_share or shown >= args.runs:
            continue
        shown += 1
        main_ops = ", ".join(f"{o} {n}" for o, n in run["ops"].most_common(6))
        print(f"  {run['first']:5d}-{run['last']:<5d} {run['executed']:>11,} {run['lines']:4d} {share:5.1f} "
              f"({100 * run['samples'] / total_samples:4.1f})  {main_ops}")


if __name__ == "__main__":
    main()
