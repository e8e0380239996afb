#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench pipeline`: the shipped tiny models end to end, as the
PyTorch samplers of tools/tinyflux/sample.py and tools/tinywan/sample.py run them (step for step
cubevec's pipelines).

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_pipeline.py --threads 2 --repeats 3 [--dtypes f32,bf16]

Per model (tinyflux: the README's prompt, 64x64, 28 steps, CFG off; tinywan: the README's video
prompt at its generation defaults, 64x64 x 17 frames, 30 steps, CFG 5 as two forwards per step) and
dtype (bf16: every module's weights in bf16, as a diffusers torch_dtype=torch.bfloat16 run; the
latents and the Euler step stay f32), the stages as cubevec's --json names them:
    load           read the folder's configs and safetensors into the modules
    text_encoding  the prompt (and for tinywan the empty unconditional prompt)
    denoising      the scheduler loop (and the mean per step)
    vae_decode     the latents to pixels
    encode         the picture (or each frame) to a quality-90 JPEG in memory (PIL)
With --flux-width DIR, instead: the FLUX-width model bench/flux_dev_shaped.cpp writes there (FLUX.1-dev's
transformer with 2 + 2 blocks, random weights, embedded guidance 3.5), 512x512, 8 steps, CFG off
(model "flux-width"): the model of `cubevec-bench pipeline-flux`.
One warm-up run, then --repeats runs; each stage's median. Output: one JSON object on stdout,
{"environment": ..., "results": [{"model", "dtype", "stages_s": {...}, "step_mean_s"}]}.
"""
import argparse
import io
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from torch_bench_common import DTYPES, add_common_arguments, environment, log, parse_dtypes  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "tinywan"))
import dataset as wan_world  # noqa: E402  (tools/tinywan/dataset.py; loads tinyflux's files under their own names)
import sample as wan_sample  # noqa: E402  (tools/tinywan/sample.py)

flux_sample = wan_world.load_tinyflux("sample")

FLUX_PROMPT = "a large red circle in the center on a blue background"
WAN_PROMPT = "a red circle moving right on a blue background"
FLUX_WIDTH_STEPS = 8


def jpeg_bytes(pixels):
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return len(buffer.getvalue())


def run_flux(model_dir, dtype, steps, **size):
    """tools/tinyflux's sampler on a Flux folder: tinyflux at its defaults, or the FLUX-width model
    (size: width, height and its embedded guidance)."""
    s, t0 = {}, time.perf_counter()
    model = flux_sample.TinyFlux(model_dir).to(dtype)
    s["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    text = model.encode_prompt(FLUX_PROMPT)
    s["text_encoding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    latents = model.denoise(text, seed=0, steps=steps, **size)
    s["denoising"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    image = model.decode(latents)
    s["vae_decode"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    jpeg_bytes(flux_sample.to_pixels(image))
    s["encode"] = time.perf_counter() - t0
    return s, steps


def run_tinyflux(dtype):
    return run_flux(os.path.join(ROOT, "assets", "tinyflux"), dtype, 28)


def run_flux_width(model_dir, dtype):
    return run_flux(model_dir, dtype, FLUX_WIDTH_STEPS, width=512, height=512, guidance=3.5)


def run_tinywan(dtype):
    s, t0 = {}, time.perf_counter()
    model = wan_sample.TinyWan(os.path.join(ROOT, "assets", "tinywan")).to(dtype)
    s["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    text, empty = model.encode_prompt(WAN_PROMPT), model.encode_prompt("")
    s["text_encoding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    latents = model.denoise(text, empty, seed=0)
    s["denoising"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    video = model.decode(latents)
    s["vae_decode"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for frame in wan_sample.to_frames(video):
        jpeg_bytes(frame)
    s["encode"] = time.perf_counter() - t0
    return s, model.defaults["steps"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--flux-width", metavar="DIR", help="time the FLUX-width model in DIR instead of the tiny models")
    args = p.parse_args()
    dtypes = parse_dtypes(p, args)
    torch.set_num_threads(args.threads)
    env = environment(args.threads)
    results = []
    models = (("tinyflux", run_tinyflux), ("tinywan", run_tinywan))
    if args.flux_width:
        models = (("flux-width", lambda dtype: run_flux_width(args.flux_width, dtype)),)
    for name, run in models:
        for dname in dtypes:
            run(DTYPES[dname])  # warm-up
            runs = [run(DTYPES[dname]) for _ in range(args.repeats)]
            steps = runs[0][1]
            stages = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
            log(f"  {name} {dname}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stages.items()))
            results.append(dict(model=name, dtype=dname, stages_s=stages, step_mean_s=stages["denoising"] / steps,
                                runs=[r[0] for r in runs]))
    print(json.dumps(dict(environment=env, torch=torch.__version__, numpy=np.__version__, results=results)))


if __name__ == "__main__":
    main()
