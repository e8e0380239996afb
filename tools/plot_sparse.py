#!/usr/bin/python3
"""Speedup and quality of sparse attention against sparsity, from `cubevec-bench sparse --json FILE`.

    /usr/bin/python3 tools/plot_sparse.py BENCH.json [OUT.png]     # default docs/images/sparse_tradeoff.png

Left: the sparse path's speedup over dense flash attention (the mask given; dashed: with the mask
estimated on every call) per sequence length and algorithm, with the issue's targets (1.8x at 50%,
3.5x at 80%). Right: the tiny Wan video's PSNR against the dense run, per algorithm. Needs
matplotlib (Debian's python3-matplotlib); the benchmark itself does not.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"rf_v2": "tab:blue", "ada_bsa": "tab:orange"}


def sparsity_of(case):
    return float(case.rsplit("sparsity ", 1)[1])


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "docs", "images", "sparse_tradeoff.png")
    with open(sys.argv[1]) as f:
        rows = [r for r in json.load(f)["results"] if r["suite"] == "sparse"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    shapes = sorted({r["case"].split(" sparsity")[0] for r in rows if r["case"].startswith("kernel ") and "sparsity" in r["case"]})
    styles = ["o-", "s-"]
    for shape, style in zip(shapes, styles):
        for algo, color in COLORS.items():
            pts = sorted((sparsity_of(r["case"]), r["speedup"], r["speedup_with_estimate"]) for r in rows
                         if r["case"].startswith(shape + " sparsity") and r["impl"] == algo)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            left.plot(xs, [p[1] for p in pts], style, color=color, label=f"{algo}, {shape[len('kernel '):]}")
            left.plot(xs, [p[2] for p in pts], style.replace("-", ":"), color=color, alpha=0.5)
    left.scatter([0.5, 0.8], [1.8, 3.5], marker="*", s=140, color="black", zorder=5, label="targets")
    left.axhline(1.0, color="gray", lw=0.8)
    left.set_xlabel("sparsity")
    left.set_ylabel("speedup over dense flash (dotted: estimate included)")
    left.set_title("one attention layer, head dim 128, f32")
    left.legend(fontsize=7)
    for algo, color in COLORS.items():
        pts = sorted((sparsity_of(r["case"]), min(r["psnr_db"], 80.0)) for r in rows
                     if r["case"].startswith("tiny wan") and "sparsity" in r["case"] and r["impl"] == algo)
        if pts:
            right.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=algo)
    right.set_xlabel("sparsity")
    right.set_ylabel("video PSNR against dense (dB, capped at 80)")
    right.set_title("tiny Wan (random weights), 2,560 tokens, 20 steps")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
