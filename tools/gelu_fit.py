#!/usr/bin/env python3
"""Fits and checks the polynomial of `gelu_erf_fast` (device/src/math.rs).

    python3 tools/gelu_fit.py            # needs numpy and mpmath

GELU(x) = x * Phi(x) with h = Phi(-|x|) = erfc(|x| / sqrt 2) / 2 written as
h = u * 2^(Q(u) - x^2 log2(e) / 2),  u = 1 / (1 + p |x|),  p = 0.4 / sqrt 2.
Q is fitted (Chebyshev, degree 6) to log2(h / u) + x^2 log2(e) / 2 for
|x| / sqrt 2 in [0, 4.2]: past that GELU is below half the smallest f16
subnormal. The script prints the f32 coefficients (highest degree first,
the order of the Horner chain in math.rs) and then checks an f32 model of
the GPU sequence (FMAs rounded once, exact reciprocal and exp2: the
hardware's approximations add under 2^-21 relative) against mpmath:
relative error where |gelu| >= 2^-24, and the f16 results over every
finite f16 input against the correctly rounded ones.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 30
P_T, DEG, T_MAX = 0.4, 6, 4.2  # p in the variable t = |x| / sqrt 2
f32 = np.float32


def target(t, u):
    return float(mp.log(0.5 * mp.erfc(mp.mpf(t)) / mp.mpf(u), 2) + mp.mpf(t) ** 2 / mp.log(2))


def fit(n=200):
    umin = 1 / (1 + P_T * T_MAX)
    xs = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    us = umin + (1 - umin) * (xs + 1) / 2
    ys = np.array([target((1 / u - 1) / P_T, u) for u in us])
    cheb = np.polynomial.chebyshev.chebfit(xs, ys, DEG)
    poly = np.polynomial.Chebyshev(cheb, domain=[umin, 1]).convert(kind=np.polynomial.Polynomial)
    tt = np.linspace(0, T_MAX, 4001)
    uu = 1 / (1 + P_T * tt)
    err = max(abs(np.polyval(poly.coef[::-1], u) - target(t, u)) for t, u in zip(tt, uu))
    return poly.coef, err


def fma(a, b, c):
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


def gelu32(x, c32):
    half_log2e, p = f32(np.log2(np.e) / 2), f32(P_T / np.sqrt(2))
    x = f32(x)
    a = abs(x)
    u = f32(1 / np.float64(fma(a, p, f32(1))))
    q = c32[DEG]
    for k in range(DEG - 1, -1, -1):
        q = fma(q, u, c32[k])
    h = f32(u * f32(2.0 ** np.float64(fma(-f32(a * a), half_log2e, q))))
    return f32(x * (h if x < 0 else f32(f32(1) - h)))


def gelu_ref(x):
    x = mp.mpf(float(x))
    return x * mp.erfc(-x / mp.sqrt(2)) / 2


def main():
    coef, err = fit()
    c32 = [f32(v) for v in coef]
    print(f"fit error {err:.2e} (log2 units)")
    print("coefficients, highest degree first:", ", ".join(repr(float(v)) for v in c32[::-1]))
    worst, mism, ulp = 0.0, 0, 0
    for x in np.arange(0x10000, dtype=np.uint16).view(np.float16):
        if not np.isfinite(x):
            continue
        g, r = gelu32(x, c32), gelu_ref(x)
        if abs(r) >= 2**-24:
            worst = max(worst, abs(float(g) - float(r)) / abs(float(r)))
        gh, rh = np.float16(g), np.float16(float(r))
        if gh != rh:
            mism += 1
            ulp = max(ulp, abs(int(np.array(gh).view(np.int16)) - int(np.array(rh).view(np.int16))))
    print(f"f16 inputs: max relative error {worst:.2e}; {mism} results differ from the correctly rounded f16, by at most {ulp} ulp")


if __name__ == "__main__":
    main()
