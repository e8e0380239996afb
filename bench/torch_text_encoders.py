#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench text`: one T5-XXL encoder layer and one CLIP-L text
layer at their real sizes, timed in plain torch.

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_text_encoders.py --threads 2 --repeats 3 [--dtypes f32,bf16] [--quick]

The layers are written from transformers' modeling_t5.py and modeling_clip.py (facts only; see
tests/reference/make_text_encoder_goldens.py for the same forwards in float64), as their eager
code runs them in torch 1.13, which has no SDPA:

  t5    T5Block of T5-v1.1-XXL: d_model 4096, 64 heads x d_kv 64, gated-GELU FFN d_ff 10240, 512
        tokens. Includes what layer 0 does every forward: the relative position buckets and the
        bias lookup [1, 64, 512, 512]. RMS norm in f32 (T5LayerNorm), scores q k^T + bias (no
        scaling), softmax in f32 cast back, as transformers.
  clip  CLIPEncoderLayer of CLIP-L: 768 wide, 12 heads x 64, quick_gelu MLP 3072, 77 tokens with
        the causal mask.

Weights are random (normal, std 0.02; norm weights 1 + N(0, 0.02)); inputs N(0, 1). For bf16 the
weights and inputs are bfloat16 (transformers' torch_dtype=torch.bfloat16).

For each layer and dtype: one warm-up forward, --repeats timed forwards under torch.no_grad()
(median), one instrumented forward split into op groups:
    norm, qkv_linear, position_bias, attention, out_proj, mlp_in, activation, mlp_out, residual

Output: one JSON object on stdout (bench/torch_bench_common.py's format), "results" entries with
"block" = "t5" or "clip".
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

from torch_bench_common import (DTYPES, OpTimer, add_common_arguments, add_trailing_arguments, case_result, emit, log,
                                parse_dtypes, start, time_forwards)

GROUPS = ["norm", "qkv_linear", "position_bias", "attention", "out_proj", "mlp_in", "activation", "mlp_out", "residual"]
OPS = OpTimer(GROUPS)


def t5_rms(x, w, eps=1e-6):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    if w.dtype in (torch.float16, torch.bfloat16):
        y = y.to(w.dtype)
    return w * y


def t5_buckets(length, num_buckets=32, max_distance=128):
    ctx = torch.arange(length)[:, None]
    mem = torch.arange(length)[None, :]
    rel = mem - ctx
    nb = num_buckets // 2
    buckets = (rel > 0).to(torch.long) * nb
    n = rel.abs()
    max_exact = nb // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, nb - 1))
    return buckets + torch.where(n < max_exact, n, large)


def t5_layer(p, x, heads):
    t = OPS.tick
    b, length, d = x.shape
    dk = p["q"].shape[0] // heads
    bias = p["rel"][t5_buckets(length)].permute(2, 0, 1).unsqueeze(0)  # [1, H, L, L]
    t("position_bias")
    h = t5_rms(x, p["ln0"])
    t("norm")
    q, k, v = (F.linear(h, p[n]).view(b, length, heads, dk).transpose(1, 2) for n in ("q", "k", "v"))
    t("qkv_linear")
    scores = torch.matmul(q, k.transpose(3, 2)) + bias
    w = F.softmax(scores.float(), dim=-1).type_as(scores)
    a = torch.matmul(w, v).transpose(1, 2).reshape(b, length, heads * dk)
    t("attention")
    o = F.linear(a, p["o"])
    t("out_proj")
    x = x + o
    t("residual")
    h = t5_rms(x, p["ln1"])
    t("norm")
    g = F.linear(h, p["wi_0"])
    lin = F.linear(h, p["wi_1"])
    t("mlp_in")
    g = F.gelu(g, approximate="tanh") * lin
    t("activation")
    y = F.linear(g, p["wo"])
    t("mlp_out")
    x = x + y
    t("residual")
    return x


def clip_layer(p, x, heads, causal):
    t = OPS.tick
    b, length, d = x.shape
    hd = d // heads
    h = F.layer_norm(x, (d,), p["ln1.w"], p["ln1.b"], 1e-5)
    t("norm")
    q, k, v = (F.linear(h, p[n + ".w"], p[n + ".b"]).view(b, length, heads, hd).transpose(1, 2) for n in ("q", "k", "v"))
    t("qkv_linear")
    scores = torch.matmul(q * hd ** -0.5, k.transpose(2, 3)) + causal
    a = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, length, d)
    t("attention")
    x = x + F.linear(a, p["out.w"], p["out.b"])
    t("out_proj")
    h = F.layer_norm(x, (d,), p["ln2.w"], p["ln2.b"], 1e-5)
    t("norm")
    m = F.linear(h, p["fc1.w"], p["fc1.b"])
    t("mlp_in")
    m = m * torch.sigmoid(1.702 * m)
    t("activation")
    x = x + F.linear(m, p["fc2.w"], p["fc2.b"])
    t("mlp_out")
    return x


def normal(shape, gen, mean=0.0):
    return torch.empty(shape).normal_(mean, 0.02, generator=gen)


def t5_params(d, heads, dk, ff, gen):
    inner = heads * dk
    return {"q": normal((inner, d), gen), "k": normal((inner, d), gen), "v": normal((inner, d), gen), "o": normal((d, inner), gen),
            "rel": normal((32, heads), gen), "ln0": normal((d,), gen, 1.0), "ln1": normal((d,), gen, 1.0),
            "wi_0": normal((ff, d), gen), "wi_1": normal((ff, d), gen), "wo": normal((d, ff), gen)}


def clip_params(d, ff, gen):
    p = {}
    for n, (o, i) in {"q": (d, d), "k": (d, d), "v": (d, d), "out": (d, d), "fc1": (ff, d), "fc2": (d, ff)}.items():
        p[n + ".w"], p[n + ".b"] = normal((o, i), gen), normal((o,), gen)
    for n in ("ln1", "ln2"):
        p[n + ".w"], p[n + ".b"] = normal((d,), gen, 1.0), normal((d,), gen)
    return p


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    add_trailing_arguments(parser, "T5 512 wide / 8 heads / d_ff 1024 on 64 tokens, CLIP 128 wide", "(no effect here)")
    args = parser.parse_args()
    dtypes = parse_dtypes(parser, args)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    t5 = dict(d=4096, heads=64, dk=64, ff=10240, tokens=512)
    clip = dict(d=768, heads=12, ff=3072, tokens=77)
    if args.quick:
        t5 = dict(d=512, heads=8, dk=64, ff=1024, tokens=64)
        clip = dict(d=128, heads=2, ff=512, tokens=77)
    wall0, env = start(args)
    log(f"torch {torch.__version__}, {args.threads} threads; T5 layer {t5}, CLIP layer {clip}; load average {env['loadavg_at_start']}")
    gen = torch.Generator().manual_seed(args.seed)
    results = []
    t5_p32 = t5_params(t5["d"], t5["heads"], t5["dk"], t5["ff"], gen)
    clip_p32 = clip_params(clip["d"], clip["ff"], gen)
    x_t5 = torch.randn(1, t5["tokens"], t5["d"], generator=gen)
    x_clip = torch.randn(1, clip["tokens"], clip["d"], generator=gen)
    n, d, ff, inner = t5["tokens"], t5["d"], t5["ff"], t5["heads"] * t5["dk"]
    t5_gflop = (2 * n * (4 * d * inner + 3 * d * ff) + 4 * n * n * inner) / 1e9
    n, d, ff = clip["tokens"], clip["d"], clip["ff"]
    clip_gflop = (2 * n * (4 * d * d + 2 * d * ff) + 4 * n * n * d) / 1e9
    for dname in dtypes:
        dt = DTYPES[dname]
        t0 = time.perf_counter()
        p = {k: v.to(dt) for k, v in t5_p32.items()}
        x = x_t5.to(dt)
        timing = time_forwards(lambda: t5_layer(p, x, t5["heads"]), OPS, args.repeats, "t5 layer")
        results.append(case_result("t5", dname, timing, GROUPS, t5_gflop))
        p = {k: v.to(dt) for k, v in clip_p32.items()}
        x = x_clip.to(dt)
        causal = torch.triu(torch.full((clip["tokens"], clip["tokens"]), torch.finfo(dt).min, dtype=dt), diagonal=1)
        timing = time_forwards(lambda: clip_layer(p, x, clip["heads"], causal), OPS, args.repeats, "clip layer")
        results.append(case_result("clip", dname, timing, GROUPS, clip_gflop))
        log(f"  {dname} done in {time.perf_counter() - t0:.1f} s")
    emit(args, "math (matmul + softmax), as transformers' eager attention", env, {"t5": t5, "clip": clip}, results, wall0)


if __name__ == "__main__":
    main()
