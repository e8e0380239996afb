#!/usr/bin/python3
"""The Python binding's cost: the same operator calls through `import cubevec` and in C++
(`cubevec-bench python-ops`, bench/suite_python_ops.cpp), on the same device and shapes.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--bench build/bench/cubevec-bench] [--rounds 3]

Small operators: microseconds per call in each, the difference (the binding's overhead per call)
and the ratio. attention_forward at S=4608, 24 heads x 128 (f32, BSND, opt_mode runtime): median
seconds, GFLOP/s and the fraction of the FMA peak the C++ side measured, and Python's time over
C++'s (the issue's target: within 2%). The machine is shared and noisy, so the two sides run in
alternating rounds and the medians of all rounds are compared. --json writes the figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import cubevec

CALLS_PER_RUN = 200
SMALL = ["rms_norm [1,16,64]", "gelu-tanh [1,16,64]", "rope [1,16,2,64]", "layernorm_scale_shift [1,16,64]", "attention [1,16,2,32]"]
BIG = "attention S4608 24x128"


def randn(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def python_calls():
    """The Python side of each case: a function making one call, as the C++ suite's."""
    x, weight = randn((1, 16, 64), 1), randn((64,), 2)
    scale, shift = randn((1, 64), 3), randn((1, 64), 4)
    rope_x, cos, sin = randn((1, 16, 2, 64), 5), randn((16, 64), 6), randn((16, 64), 7)
    q, k, v = randn((1, 16, 2, 32), 8), randn((1, 16, 2, 32), 9), randn((1, 16, 2, 32), 10)
    norm = cubevec.RMSNorm(64)
    norm.weight = weight
    ln = cubevec.LayerNorm(64, eps=1e-6, elementwise_affine=False)
    gelu = cubevec.get_activation_layer("gelu-tanh")
    return {
        "rms_norm [1,16,64]": lambda: norm(x),
        "gelu-tanh [1,16,64]": lambda: gelu(x),
        "rope [1,16,2,64]": lambda: cubevec.rotary_position_embedding(rope_x, cos, sin),
        "layernorm_scale_shift [1,16,64]": lambda: cubevec.layernorm_scale_shift(ln, x, scale, shift),
        "attention [1,16,2,32]": lambda: cubevec.attention_forward(q, k, v),
    }


def time_python(calls, big, runs_small, runs_big):
    out = {}
    for name, call in calls.items():
        call()  # the tuner's first call for the shape
        per_call = []
        for _ in range(runs_small):
            t0 = time.perf_counter()
            for _ in range(CALLS_PER_RUN):
                call()
            per_call.append((time.perf_counter() - t0) / CALLS_PER_RUN)
        out[name] = per_call
    big()  # tunes the shape once
    seconds = []
    for _ in range(runs_big):
        t0 = time.perf_counter()
        big()
        seconds.append(time.perf_counter() - t0)
    out[BIG] = seconds
    return out


def time_cpp(bench, repeats):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "python-ops.json")
        subprocess.run([bench, "python-ops", "--repeats", str(repeats), "--json", path], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = json.load(open(path))
    rows = {r["case"]: r for r in data["results"] if r["suite"] == "python-ops"}
    return data["machine"], rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--bench", default=os.path.join(here, "..", "build", "bench", "cubevec-bench"), help="cubevec-bench")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of C++ and Python")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"error: {args.bench}: no cubevec-bench there (build it, or pass --bench)")

    s, n, d = 4608, 24, 128
    big_q, big_k, big_v = randn((1, s, n, d), 11), randn((1, s, n, d), 12), randn((1, s, n, d), 13)
    calls = python_calls()
    cpp = {name: [] for name in SMALL + [BIG]}
    py = {name: [] for name in SMALL + [BIG]}
    machine = None
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}: C++ ...", file=sys.stderr, flush=True)
        machine, rows = time_cpp(args.bench, 5)
        for name in SMALL:
            cpp[name].append(rows[name]["median_s"])
        cpp[BIG].append(rows[BIG]["median_s"])
        print(f"round {round_index + 1}/{args.rounds}: Python ...", file=sys.stderr, flush=True)
        times = time_python(calls, lambda: cubevec.attention_forward(big_q, big_k, big_v), 7, 3)
        for name in SMALL:
            py[name].append(statistics.median(times[name]))
        py[BIG].append(statistics.median(times[BIG]))

    flops = 4.0 * n * s * s * d
    print(f"machine: {machine['cpu']}, {machine['threads']} threads, FMA peak {machine['fma_peak_gflops']:.1f} GFLOP/s")
    print(f"{'case':34} {'C++ us':>10} {'Python us':>10} {'overhead us':>12} {'ratio':>7}")
    figures = {"machine": machine, "small": {}, "attention": {}}
    for name in SMALL:
        c, p = statistics.median(cpp[name]) * 1e6, statistics.median(py[name]) * 1e6
        figures["small"][name] = {"cpp_us": c, "python_us": p, "overhead_us": p - c, "ratio": p / c}
        print(f"{name:34} {c:10.1f} {p:10.1f} {p - c:12.1f} {p / c:7.2f}")
    c, p = statistics.median(cpp[BIG]), statistics.median(py[BIG])
    ratio = p / c
    figures["attention"] = {"cpp_s": c, "python_s": p, "ratio": ratio, "cpp_gflops": flops / c / 1e9, "python_gflops": flops / p / 1e9,
                            "cpp_peak_fraction": flops / c / 1e9 / machine["fma_peak_gflops"],
                            "python_peak_fraction": flops / p / 1e9 / machine["fma_peak_gflops"],
                            "rounds": {"cpp_s": cpp[BIG], "python_s": py[BIG]}}
    print(f"\n{BIG} (f32, BSND, opt_mode runtime), median of {args.rounds} rounds:")
    print(f"  C++    {c:.3f} s  {flops / c / 1e9:7.1f} GFLOP/s  {flops / c / 1e9 / machine['fma_peak_gflops']:.1%} of the FMA peak")
    print(f"  Python {p:.3f} s  {flops / p / 1e9:7.1f} GFLOP/s  {flops / p / 1e9 / machine['fma_peak_gflops']:.1%} of the FMA peak")
    print(f"  Python / C++ = {ratio:.4f} ({'within' if ratio <= 1.02 else 'NOT within'} the 2% target)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
