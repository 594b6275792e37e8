"""Dev tool: fits the polynomial Q of GeGLU's Φ = erfc(−b/√2)/2 in the form the kernels use,
    erfc(x)/2 = t·Q(t)·exp(−x²),  x = |b|/√2,  t = 1/(1 + x/2),
towards minimax relative error over x in [0, XMAX] (weighted least squares in t on
Chebyshev points, reweighted by each point's error; mpmath's erfc as the truth), then
reports the largest relative error of t·Q(t) in exact arithmetic and evaluated in float32
the kernels' way (Horner with fma, t rounded), and in exact arithmetic beyond the fit, up
to x = --beyond (which the kernels still evaluate, times an exp(−x²) below 1e-43). Degree
8 gives the CPU's AVX2 float32 rows (csrc/kernels/cpu/gated_activation_avx2.cpp,
vgelu_parts):

    python scripts/fit_erfc.py --degree 8

(mpmath comes with torch, through sympy.)
"""
from __future__ import annotations

import argparse

import mpmath as mp
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--xmax", type=float, default=10.0)
    ap.add_argument("--points", type=int, default=4000)
    ap.add_argument("--beyond", type=float, default=14.15)  # |b| = 20: the AVX2 rows' clamp
    args = ap.parse_args()
    mp.mp.dps = 40
    deg, tmin, m = args.degree, 1.0 / (1.0 + args.xmax / 2), args.points

    def target(t) -> float:  # erfc(x)·exp(x²) / (2t) at x = 2(1/t − 1)
        t = mp.mpf(t)
        x = 2 * (1 / t - 1)
        return float(mp.erfc(x) * mp.exp(x * x) / (2 * t))

    ts = np.sort(0.5 * (1 + tmin) + 0.5 * (1 - tmin) * np.cos(np.pi * (np.arange(m) + 0.5) / m))
    fv = np.array([target(t) for t in ts])
    vander = np.vander(ts, deg + 1, increasing=True)
    w = np.ones(m)
    for _ in range(60):
        c, *_ = np.linalg.lstsq(vander * (w / fv)[:, None], w, rcond=None)
        rel = (vander @ c - fv) / fv
        w *= (np.abs(rel) / np.abs(rel).max()) ** 0.3 + 0.05
        w /= w.mean()
    c32 = [np.float32(v) for v in c]
    worst = 0.0
    for x in np.linspace(0.0, args.xmax, 20001):
        x32 = np.float32(x)
        t32 = np.float32(np.float32(1.0) / np.float32(np.float32(1.0) + np.float32(0.5) * x32))
        q = c32[-1]
        for k in range(deg - 1, -1, -1):  # fma: the float64 product of two float32 values is exact
            q = np.float32(np.float64(q) * np.float64(t32) + np.float64(c32[k]))
        want = float(mp.erfc(mp.mpf(float(x32))) * mp.exp(mp.mpf(float(x32)) ** 2) / 2)
        worst = max(worst, abs(float(np.float32(t32 * q)) - want) / want)
    tb = 1.0 / (1.0 + np.linspace(args.xmax, args.beyond, 401) / 2)
    beyond = max(abs(np.polyval(c[::-1], t) / target(t) - 1) for t in tb)
    print(f"degree {deg}, x in [0, {args.xmax}]: max relative error {np.abs(rel).max():.3g} exact, "
          f"{worst:.3g} in float32; x in [{args.xmax}, {args.beyond}]: {beyond:.3g} exact")
    print("Q(t) coefficients, highest power first:")
    for v in c[::-1]:
        print(f"  {v:.17g}")


if __name__ == "__main__":
    main()
