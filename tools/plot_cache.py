#!/usr/bin/python3
"""Speed / quality curve of the step caches from `cubevec-bench cache --json FILE`.

    /usr/bin/python3 tools/plot_cache.py BENCH.json [OUT.png]     # default docs/images/cache_tradeoff.png

One panel per model (tinyflux, tiny wan): each cache setting at (speedup over no cache, PSNR of the
decoded picture against the uncached one), colored by method, with the issue's two targets for
tinyflux (>= 1.6x at >= 30 dB, >= 2.0x at >= 25 dB) drawn as corners. Needs matplotlib (Debian's
python3-matplotlib); the benchmark itself does not.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"attention": "tab:blue", "dit-block": "tab:orange", "db": "tab:green"}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "docs", "images", "cache_tradeoff.png")
    with open(sys.argv[1]) as f:
        rows = [r for r in json.load(f)["results"] if r["suite"] == "cache"]
    models = sorted({r["case"].split(" no cache")[0] for r in rows if r["case"].endswith("no cache")}, reverse=True)
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for r in rows:
            if not r["case"].startswith(model + " ") or r["case"].endswith("no cache"):
                continue
            setting = r["case"][len(model) + 1:]
            method = setting.split(":")[0]
            psnr = min(r["psnr_db"], 60.0)
            ax.scatter(r["speedup"], psnr, color=COLORS.get(method, "gray"), s=36, zorder=3)
            ax.annotate(setting.split(": ", 1)[1], (r["speedup"], psnr), fontsize=6, xytext=(3, 3), textcoords="offset points")
        for method, color in COLORS.items():
            ax.scatter([], [], color=color, label=method)
        if model == "tinyflux":
            for speed, db in ((1.6, 30.0), (2.0, 25.0)):
                ax.plot([speed, speed, 4.0], [60.0, db, db], color="gray", linestyle="--", linewidth=0.8)
                ax.annotate(f"target {speed}x, {db:g} dB", (speed, db), fontsize=7, color="gray", xytext=(3, -10),
                            textcoords="offset points")
        ax.set_title(f"{model}: denoising speedup vs picture PSNR (same run)")
        ax.set_xlabel("speedup over no cache (median)")
        ax.set_ylabel("PSNR against the uncached picture, dB (capped at 60)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
