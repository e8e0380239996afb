#!/usr/bin/python3
"""Pictures of the shipped tinyflux in float and with each quantization algorithm.

    /usr/bin/python3 tools/quant_grid.py [CUBEVEC] [OUT.png]   # defaults build/cubevec, docs/images/quant_grid.png

For each algorithm, `cubevec quantize` calibrates on the grid's prompts (28 steps, as t2i runs) and
`cubevec t2i --quant` renders every prompt; W8A8_TIMESTEP runs with every step static (its own
scales per step). Under each picture: its PSNR against the float picture of the same prompt, on
the JPEG pixels. Needs matplotlib and Pillow (Debian's python3-matplotlib); CI does not run it.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(ROOT, "assets", "tinyflux")
PROMPTS = [
    "a large red circle in the center on a blue background",
    "two small green squares on a white background",
    "a yellow triangle in the top left on a black background",
]
ALGORITHMS = ["W8A16", "W8A8_DYNAMIC", "W8A8", "W8A8_TIMESTEP"]


def run(args):
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{result.stderr}")


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def main():
    cubevec = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "cubevec")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "docs", "images", "quant_grid.png")
    with tempfile.TemporaryDirectory() as tmp:
        policy = os.path.join(tmp, "all_static.json")
        with open(policy, "w") as f:
            json.dump({"default": "static"}, f)
        pictures = {}
        for i, prompt in enumerate(PROMPTS):
            path = os.path.join(tmp, f"float_{i}.jpg")
            run([cubevec, "t2i", "--model", MODEL, "--prompt", prompt, "--out", path])
            pictures[("float", i)] = mpimg.imread(path)
        for algo in ALGORITHMS:
            qdir = os.path.join(tmp, algo)
            args = [cubevec, "quantize", "--model", MODEL, "--algo", algo, "--steps", "28", "--out", qdir]
            for prompt in PROMPTS:
                args += ["--prompt", prompt]
            run(args)
            description = os.path.join(qdir, f"quant_model_description_{algo.lower()}.json")
            for i, prompt in enumerate(PROMPTS):
                path = os.path.join(tmp, f"{algo}_{i}.jpg")
                extra = ["--timestep-policy", policy] if algo == "W8A8_TIMESTEP" else []
                run([cubevec, "t2i", "--model", MODEL, "--prompt", prompt, "--quant", description, "--out", path] + extra)
                pictures[(algo, i)] = mpimg.imread(path)

    columns = ["float"] + ALGORITHMS
    fig, axes = plt.subplots(len(PROMPTS), len(columns), figsize=(2.0 * len(columns), 2.25 * len(PROMPTS)), squeeze=False)
    for i, prompt in enumerate(PROMPTS):
        for j, name in enumerate(columns):
            ax = axes[i][j]
            ax.imshow(pictures[(name, i)], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(name + (" (static)" if name == "W8A8_TIMESTEP" else ""), fontsize=8)
            if name != "float":
                ax.set_xlabel(f"{psnr(pictures[(name, i)], pictures[('float', i)]):.1f} dB", fontsize=8)
            else:
                ax.set_xlabel(prompt.replace(" on a", "\non a"), fontsize=6)
    fig.suptitle("tinyflux 64x64, 28 steps: float and quantized (PSNR against float)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
