#!/usr/bin/python3
"""PyTorch CPU baseline for a Wan2.1 block: one WanTransformerBlock of Wan2.1-T2V-1.3B, timed in plain torch.

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_wan_blocks.py --threads 2 --repeats 3 [--dtypes f32,bf16]
        [--hidden 1536 --heads 12 --ffn 8960 --frames 13 --height 18 --width 20 --txt 512] [--quick]

Default shape: D 1536 (12 heads x 128), ffn 8960, batch 1 (one CFG branch), a post-patch token grid of
13 x 18 x 20 = 4,680 video tokens (13 latent frames = 49 video frames; 36 x 40 latents = 288 x 320
pixels) and 512 text tokens (umT5's padded length). --quick shrinks it to D 256 (2 heads x 128),
ffn 512, grid 2 x 4 x 8 = 64 tokens, 16 text tokens (about a second).

The block is written from docs/models.md, "Wan transformer" (with "Shared building blocks" and "Wan
3-D RoPE"); diffusers is not used. Weights are random (normal, std 0.02; the q/k RMSNorm and norm2
weights 1 + N(0, 0.02); scale_shift_table N(0, 1/D) as diffusers initializes it), inputs N(0, 1):
hidden [1, L, D], context [1, txt, D] (the text_embedder output: the block's cross-attention input),
timestep_proj [1, 6, D] (time_proj's output, computed once per step outside the blocks, so it is not
timed here). RoPE is Wan's 3-D table (t/h/w = 44/42/42 for head dim 128; h = w = 2 floor(hd / 6)) on
the grid, as f32 per-pair angle tables.

Precision follows diffusers' bf16 run: the modulation (scale_shift_table + timestep_proj), the three
LayerNorms with their modulation, the gated residual adds and the RoPE rotation are computed in f32 and
cast back to bf16 (norm1/norm2/norm3 and scale_shift_table are kept in fp32 by diffusers, and so is
norm2's affine weight here); the Linears, the RMSNorm weight multiply, attention and GELU run in bf16; the
cross-attention residual is a bf16 add. In f32 every cast is a no-op.

Attention (self and cross): F.scaled_dot_product_attention when torch has it (torch >= 2.0), otherwise
the math form softmax(Q K^T / sqrt(hd)) V with torch.baddbmm (beta 0, scale in alpha) and torch.bmm,
one score buffer per shape reused across calls and the softmax done in place, as torch_flux_blocks.py
does (--plain-attention: fresh buffers and an out-of-place softmax). Score buffers are kept under 512 MB
by splitting over heads (4,680^2 f32 scores are 88 MB a head).

One warm-up forward, then --repeats timed forwards under torch.no_grad() (median reported), then one
instrumented forward whose time is split into op groups with time.perf_counter():

    modulation          scale_shift_table + timestep_proj (f32), split into the six rows
    layernorm_modulate  norm1 / norm3: LayerNorm (eps 1e-6, no affine) * (1 + scale) + shift
    qkv_linear          self-attention to_q / to_k / to_v
    qk_rmsnorm          RMSNorm of q and k across all heads (D channels), self and cross attention
    rope                interleaved-pair 3-D RoPE of Q and K
    attention           self-attention softmax(Q K^T / sqrt(hd)) V
    out_proj            self-attention to_out.0
    gated_residual      h + gate * branch (self-attention and FFN) and the ungated cross-attention add
    cross_norm          norm2: affine LayerNorm before the cross-attention
    cross_q_linear      cross-attention to_q (video tokens)
    cross_kv_linear     cross-attention to_k / to_v (text tokens)
    cross_attention     softmax(Q K_txt^T / sqrt(hd)) V_txt
    cross_out_proj      cross-attention to_out.0
    mlp_in              ffn.net.0.proj, D -> ffn
    gelu                GELU (tanh approximation)
    mlp_out             ffn.net.2, ffn -> D
    concat_split        head splits and merges (transposes, contiguous copies)

The groups add up to the instrumented forward's time (ops_total_s) except for freeing the temporaries.

Output: exactly one JSON object on stdout, as torch_flux_blocks.py:
    {"torch_version", "threads", "attention": "sdpa"|"math", "attention_impl", "env": {...}, "shape": {...},
     "results": [{"block": "wan", "dtype", "median_s", "runs_s", "ops_s", "ops_total_s", "gflop"}]}
where gflop counts the matmul FLOPs (the Linears and the four attention products). Progress goes to
stderr. Threads: as torch_flux_blocks.py (torch.set_num_threads plus OpenBLAS's own pool).
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

# The harness shared with the Flux baseline (torch_bench_common.py: timer, attention, helpers, threads,
# environment report, timed forwards and JSON output), so the two baselines are measured the same way.
from torch_bench_common import (DTYPES, Attention, OpTimer, add_common_arguments, add_norm_weights,
                                add_trailing_arguments, apply_rope, case_result, emit, head_view, lin, log,
                                merge_heads, parse_dtypes, random_linears, rms_norm, start, time_forwards)

GROUPS = ["modulation", "layernorm_modulate", "qkv_linear", "qk_rmsnorm", "rope", "attention", "out_proj",
          "gated_residual", "cross_norm", "cross_q_linear", "cross_kv_linear", "cross_attention", "cross_out_proj",
          "mlp_in", "gelu", "mlp_out", "concat_split"]
EPS = 1e-6

OPS = OpTimer(GROUPS)
# Self and cross attention each keep their score buffer; --plain-attention sets .plain.
attention = Attention(one_buffer=False)


# ------------------------------------------------------------------------------------------------
# Building blocks (docs/models.md "Shared building blocks", "Wan 3-D RoPE")
# ------------------------------------------------------------------------------------------------
def wan_rope_halves(frames, height, width, head_dim):
    """Per-pair angle tables cos, sin [L, hd/2] (f32, computed in float64) for the token grid, tokens
    (t, h, w) row-major, pairs [t | h | w] with t/h/w = hd - 2 hw, hw, hw and hw = 2 floor(hd / 6)."""
    hw = 2 * (head_dim // 6)
    angles = []
    for axis, (dim, n) in enumerate(zip([head_dim - 2 * hw, hw, hw], [frames, height, width])):
        freqs = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        pos = torch.arange(n, dtype=torch.float64)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = n
        grid = (pos[:, None] * freqs[None, :]).view(shape).expand(frames, height, width, dim // 2)
        angles.append(grid.reshape(-1, dim // 2))
    a = torch.cat(angles, dim=1)
    return torch.cos(a).float(), torch.sin(a).float()


def layernorm_modulate(x, shift, scale):
    """(LN_1e-6(x in f32) * (1 + scale) + shift) cast to x's dtype; shift/scale [B, 1, D] f32."""
    normed = F.layer_norm(x.float(), (x.shape[-1],), eps=EPS)
    return torch.addcmul(shift, normed, 1 + scale).to(x.dtype)


def heads(x, num_heads):
    """[B, N, D] -> [B, H, N, hd] contiguous (the layout of the batched products)."""
    return head_view(x, num_heads).contiguous()


# ------------------------------------------------------------------------------------------------
# The block (docs/models.md "Wan transformer"); parameters are plain tensors in a dict with
# diffusers' names.
# ------------------------------------------------------------------------------------------------
def block_params(dim, ffn, gen):
    linears = [(f"{attn}.{proj}", dim, dim) for attn in ["attn1", "attn2"]
               for proj in ["to_q", "to_k", "to_v", "to_out.0"]]
    linears += [("ffn.net.0.proj", dim, ffn), ("ffn.net.2", ffn, dim)]
    params = random_linears(linears, gen)
    add_norm_weights(params, ["attn1.norm_q", "attn1.norm_k", "attn2.norm_q", "attn2.norm_k", "norm2"], dim, gen)
    params["norm2.bias"] = torch.empty(dim).normal_(0.0, 0.02, generator=gen)
    params["scale_shift_table"] = torch.randn(1, 6, dim, generator=gen) / math.sqrt(dim)
    return params


FP32_KEPT = ("scale_shift_table", "norm2.weight", "norm2.bias")  # diffusers' _keep_in_fp32_modules


def wan_block(p, h, context, timestep_proj, cos_h, sin_h, num_heads):
    """WanTransformerBlock: h [B, L, D], context [B, L_txt, D], timestep_proj [B, 6, D] -> h."""
    t = OPS.tick
    mod = p["scale_shift_table"] + timestep_proj.float()  # f32, rows: shift, scale, gate (self), then (FFN)
    shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = mod.chunk(6, dim=1)
    t("modulation")
    # 1. self-attention
    xn = layernorm_modulate(h, shift_sa, scale_sa)
    t("layernorm_modulate")
    q, k, v = (lin(p, "attn1." + n, xn) for n in ["to_q", "to_k", "to_v"])
    t("qkv_linear")
    q, k = rms_norm(q, p["attn1.norm_q.weight"]), rms_norm(k, p["attn1.norm_k.weight"])  # across heads
    t("qk_rmsnorm")
    q, k, v = heads(q, num_heads), heads(k, num_heads), heads(v, num_heads)
    t("concat_split")
    q, k = apply_rope(q, cos_h, sin_h), apply_rope(k, cos_h, sin_h)
    t("rope")
    a = attention(q, k, v)
    t("attention")
    a = merge_heads(a)
    t("concat_split")
    a = lin(p, "attn1.to_out.0", a)
    t("out_proj")
    h = torch.addcmul(h.float(), a.float(), gate_sa).to(h.dtype)  # f32 (the gate is f32), cast back
    t("gated_residual")
    # 2. cross-attention (no RoPE, no gate)
    xn = F.layer_norm(h.float(), (h.shape[-1],), p["norm2.weight"], p["norm2.bias"], EPS).to(h.dtype)
    t("cross_norm")
    q = lin(p, "attn2.to_q", xn)
    t("cross_q_linear")
    k, v = lin(p, "attn2.to_k", context), lin(p, "attn2.to_v", context)
    t("cross_kv_linear")
    q, k = rms_norm(q, p["attn2.norm_q.weight"]), rms_norm(k, p["attn2.norm_k.weight"])
    t("qk_rmsnorm")
    q, k, v = heads(q, num_heads), heads(k, num_heads), heads(v, num_heads)
    t("concat_split")
    a = attention(q, k, v)
    t("cross_attention")
    a = merge_heads(a)
    t("concat_split")
    a = lin(p, "attn2.to_out.0", a)
    t("cross_out_proj")
    h = h + a
    t("gated_residual")
    # 3. feed-forward
    xn = layernorm_modulate(h, shift_ff, scale_ff)
    t("layernorm_modulate")
    f = lin(p, "ffn.net.0.proj", xn)
    t("mlp_in")
    f = F.gelu(f, approximate="tanh")
    t("gelu")
    f = lin(p, "ffn.net.2", f)
    t("mlp_out")
    h = torch.addcmul(h.float(), f.float(), gate_ff).to(h.dtype)
    t("gated_residual")
    return h


def block_gflop(dim, ffn, tokens, txt):
    """Matmul FLOPs of one forward: Linears (self q/k/v/out, cross q/out on video tokens, cross k/v on
    text tokens, the FFN) and the four attention products."""
    linear = 2 * tokens * dim * (4 * dim + 2 * dim + 2 * ffn) + 2 * txt * dim * 2 * dim
    attn = 4 * tokens * tokens * dim + 4 * tokens * txt * dim
    return (linear + attn) / 1e9


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------
def run_case(params, inputs, num_heads, repeats):
    h, context, timestep_proj, cos_h, sin_h = inputs
    return time_forwards(lambda: wan_block(params, h, context, timestep_proj, cos_h, sin_h, num_heads), OPS,
                         repeats, "the block")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--blocks", default="wan", help="only 'wan' (for symmetry with torch_flux_blocks.py)")
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--ffn", type=int, default=8960)
    parser.add_argument("--frames", type=int, default=13, help="post-patch token grid: latent frames")
    parser.add_argument("--height", type=int, default=18, help="post-patch token grid: latent height / 2")
    parser.add_argument("--width", type=int, default=20, help="post-patch token grid: latent width / 2")
    parser.add_argument("--txt", type=int, default=512)
    add_trailing_arguments(parser, "hidden 256, heads 2, ffn 512, grid 2x4x8, txt 16",
                           "math attention with fresh score tensors and an out-of-place softmax")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.heads, args.ffn, args.frames, args.height, args.width, args.txt = 256, 2, 512, 2, 4, 8, 16
    dtypes = parse_dtypes(parser, args)
    if [b.strip() for b in args.blocks.split(",") if b.strip()] != ["wan"]:
        parser.error("--blocks: only 'wan'")
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2 or args.hidden // args.heads < 6:
        parser.error("--hidden must be --heads times an even head dim >= 6")

    attention.plain = args.plain_attention
    wall0, env = start(args)
    dim, num_heads, head_dim = args.hidden, args.heads, args.hidden // args.heads
    tokens = args.frames * args.height * args.width
    attention_impl = attention.describe()
    log(f"torch {torch.__version__}, {args.threads} threads, attention {attention_impl}; D {dim}, {num_heads} heads x "
        f"{head_dim}, ffn {args.ffn}; grid {args.frames} x {args.height} x {args.width} = {tokens} video + {args.txt} "
        f"text tokens; load average {env['loadavg_at_start']}")

    gen = torch.Generator().manual_seed(args.seed)
    h = torch.randn(1, tokens, dim, generator=gen)
    context = torch.randn(1, args.txt, dim, generator=gen)
    timestep_proj = torch.randn(1, 6, dim, generator=gen)
    cos_h, sin_h = wan_rope_halves(args.frames, args.height, args.width, head_dim)

    t0 = time.perf_counter()
    master = block_params(dim, args.ffn, gen)
    log(f"wan block: {sum(t.numel() for t in master.values()) / 1e6:.1f} M parameters, built in "
        f"{time.perf_counter() - t0:.1f} s")
    results = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        params = {k: (v if k in FP32_KEPT else v.to(dtype)) for k, v in master.items()}
        inputs = (h.to(dtype), context.to(dtype), timestep_proj.to(dtype), cos_h, sin_h)
        timing = run_case(params, inputs, num_heads, args.repeats)
        del params
        results.append(case_result("wan", dname, timing, GROUPS, block_gflop(dim, args.ffn, tokens, args.txt)))
        attention.scores.clear()
    emit(args, attention_impl, env, {"hidden": dim, "heads": num_heads, "head_dim": head_dim, "ffn": args.ffn,
                                     "grid": [args.frames, args.height, args.width], "video_tokens": tokens,
                                     "txt": args.txt, "batch": 1}, results, wall0)

if __name__ == "__main__":
    sys.exit(main())
