#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench gemm`: the five GEMM shapes as a Linear layer runs them,
y = x W^T with x [M, K] and W [N, K] (F.linear, no bias), in f32 and in bf16 (x and W bfloat16, as
a model loaded with torch_dtype=torch.bfloat16).

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_gemm.py --threads 2 --repeats 3 [--dtypes f32,bf16]

Inputs are N(0, 1) (the values do not change the speed). For each shape and dtype: one warm-up
call and --repeats timed calls (median). Output: one JSON object on stdout (torch_bench_common.py's
format), "results" entries with "block" = "MxNxK".
"""
import argparse

import torch
import torch.nn.functional as F

from torch_bench_common import DTYPES, OpTimer, add_common_arguments, add_trailing_arguments, case_result, emit, parse_dtypes, start, time_forwards

SHAPES = [(4096, 3072, 3072), (4096, 12288, 3072), (4608, 9216, 3072), (1024, 1024, 1024), (256, 3072, 3072)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    add_trailing_arguments(parser, "the two smallest shapes only", "unused (no attention here)")
    args = parser.parse_args()
    dtypes = parse_dtypes(parser, args)
    wall0, env = start(args)
    gen = torch.Generator().manual_seed(args.seed)
    ops = OpTimer([])
    results = []
    for m, n, k in SHAPES[3:] if args.quick else SHAPES:
        x32 = torch.randn(m, k, generator=gen)
        w32 = torch.randn(n, k, generator=gen)
        for dname in dtypes:
            x, w = x32.to(DTYPES[dname]), w32.to(DTYPES[dname])
            timing = time_forwards(lambda: F.linear(x, w), ops, args.repeats, f"{m}x{n}x{k} {dname}")
            results.append(case_result(f"{m}x{n}x{k}", dname, timing, [], 2.0 * m * n * k / 1e9))
    emit(args, "none", env, {"shapes": SHAPES}, results, wall0)


if __name__ == "__main__":
    main()
