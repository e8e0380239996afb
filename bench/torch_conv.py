#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench vae`'s convolution rows: nn.Conv2d (3x3, padding 1) on the
shapes the suite times, f32 and bf16 (weights and input in bf16, as a diffusers
torch_dtype=torch.bfloat16 VAE runs them: oneDNN, on AMX where the CPU has it).

    /usr/bin/python3 bench/torch_conv.py --threads 2 --repeats 3 [--dtypes f32,bf16]

One warm-up call, then --repeats; the median. Output: one JSON object on stdout,
{"environment": ..., "results": [{"c", "o", "h", "w", "dtype", "median_s"}]}.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench_common import DTYPES, add_common_arguments, environment, parse_dtypes  # noqa: E402

# (in channels, out channels, height, width): keep in step with bench/suite_vae.cpp's kConvShapes.
SHAPES = [(32, 32, 128, 128), (16, 16, 512, 512), (32, 16, 512, 512), (16, 3, 512, 512), (64, 64, 128, 128), (128, 128, 64, 64)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p)
    args = p.parse_args()
    dtypes = parse_dtypes(p, args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []
    for c, o, h, w in SHAPES:
        for name in dtypes:
            dtype = DTYPES[name]
            x = torch.randn(1, c, h, w).to(dtype)
            conv = torch.nn.Conv2d(c, o, 3, padding=1).to(dtype)
            with torch.no_grad():
                conv(x)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    conv(x)
                    times.append(time.perf_counter() - t0)
            results.append(dict(c=c, o=o, h=h, w=w, dtype=name, median_s=statistics.median(times)))
    print(json.dumps(dict(environment=environment(args.threads), torch=torch.__version__, results=results)))


if __name__ == "__main__":
    main()
