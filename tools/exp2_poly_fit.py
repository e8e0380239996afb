#!/usr/bin/env python3
"""Fits the degree-3 polynomial for 2^f, |f| <= 1/2, that the bf16 softmax uses
(exp_shifted_for_bf16 in ops/attention/tile_kernels_avx512.cpp) and prints its coefficients
rounded to f32 with the largest relative error they give on a fine grid of f32 inputs.

The fit is least squares on the relative error, reweighted toward the points where the error is
largest (close to minimax). Needs numpy: /usr/bin/python3 tools/exp2_poly_fit.py
"""
import numpy as np


def fit(degree: int):
    x = np.cos(np.linspace(0, np.pi, 4001)) * 0.5  # Chebyshev-spaced points on [-1/2, 1/2]
    y = 2.0**x
    w = 1 / y
    for _ in range(200):
        a = np.vander(x, degree + 1, increasing=True) * w[:, None]
        c, *_ = np.linalg.lstsq(a, y * w, rcond=None)
        err = (np.polyval(c[::-1], x) - y) / y
        w = w * (1 + 50 * np.abs(err) / np.abs(err).max())
        w /= w.mean()
    c32 = c.astype(np.float32)
    xs = np.linspace(-0.5, 0.5, 200001).astype(np.float32)
    p = np.zeros_like(xs)
    for ci in c32[::-1]:  # Horner in f32, as the kernel evaluates it
        p = (p * xs + ci).astype(np.float32)
    worst = np.abs(p.astype(np.float64) / 2.0 ** xs.astype(np.float64) - 1).max()
    return c32, worst


if __name__ == "__main__":
    for degree in (3, 4):
        c, worst = fit(degree)
        print(f"degree {degree}: c0..c{degree} = {[float(v) for v in c]}, max relative error {worst:.3g}")
