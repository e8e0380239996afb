#!/usr/bin/python3
"""PyTorch CPU baseline for a Wan2.1 block: one WanTransformerBlock of Wan2.1-T2V-1.3B, timed in plain torch.

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_wan_blocks.py --threads 2 --repeats 3 [--dtypes f32,bf16]
        [--hidden 1536 --heads 12 --ffn 8960 --frames 13 --height 18 --width 20 --txt 512] [--quick]

Default shape: D 1536 (12 heads x 128), ffn 8960, batch 1 (one CFG branch), a post-patch token grid of
13 x 18 x 20 = 4,680 video tokens (13 latent frames = 49 video frames; 36 x 40 latents = 288 x 320
pixels) and 512 text tokens (umT5's padded length). --quick shrinks it to D 256 (2 heads x 128),
ffn 512, grid 2 x 4 x 8 = 64 tokens, 16 text tokens (about a second).

The block is written from ../shared/reference/porting-spec.md section 2.3 (with 0.4-0.7 and 2.4);
diffusers is not used. Weights are random (normal, std 0.02; the q/k RMSNorm and norm2 weights
1 + N(0, 0.02); scale_shift_table N(0, 1/D) as diffusers initializes it), inputs N(0, 1): hidden
[1, L, D], context [1, txt, D] (the text_embedder output: the block's cross-attention input),
timestep_proj [1, 6, D] (time_proj's output, computed once per step outside the blocks, so it is not
timed here). RoPE is Wan's 3-D table (t/h/w = 44/42/42 for head dim 128; h = w = 2 floor(hd / 6)) on the
grid, as f32 per-pair angle tables.

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
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# Shared with the Flux baseline: the environment report (sets OpenBLAS's pool), the in-place softmax
# and logging, so the two baselines are measured the same way.
from torch_flux_blocks import SCORE_BUDGET_BYTES, _softmax_inplace, environment, log

GROUPS = ["modulation", "layernorm_modulate", "qkv_linear", "qk_rmsnorm", "rope", "attention", "out_proj",
          "gated_residual", "cross_norm", "cross_q_linear", "cross_kv_linear", "cross_attention", "cross_out_proj",
          "mlp_in", "gelu", "mlp_out", "concat_split"]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
EPS = 1e-6
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class OpTimer:
    """tick(group) charges the time since the previous tick to `group` (when switched on)."""

    def __init__(self):
        self.on = False
        self.seconds = {}
        self.last = 0.0

    def start(self, on):
        self.on = on
        self.seconds = {g: 0.0 for g in GROUPS}
        self.last = time.perf_counter()

    def tick(self, group):
        if self.on:
            now = time.perf_counter()
            self.seconds[group] += now - self.last
            self.last = now


OPS = OpTimer()


# ------------------------------------------------------------------------------------------------
# Building blocks (porting-spec 0.4-0.7, 2.4)
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


def apply_rope(x, cos_h, sin_h):
    """Rotate the pairs (x[2j], x[2j+1]) of x [B, H, L, hd] by the angles [L, hd/2], in f32, cast back."""
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.empty_like(xf)
    out[..., 0::2] = even * cos_h - odd * sin_h
    out[..., 1::2] = odd * cos_h + even * sin_h
    return out.to(x.dtype)


def rms_norm(x, weight):
    """RMSNorm over the last dim (all D channels): statistics in f32, normalized value cast back to x's
    dtype, then times the weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight


def layernorm_modulate(x, shift, scale):
    """(LN_1e-6(x in f32) * (1 + scale) + shift) cast to x's dtype; shift/scale [B, 1, D] f32."""
    normed = F.layer_norm(x.float(), (x.shape[-1],), eps=EPS)
    return torch.addcmul(shift, normed, 1 + scale).to(x.dtype)


_SCORES = {}
PLAIN_ATTENTION = False


def attention(q, k, v):
    """softmax(q k^T / sqrt(hd)) v for q [B, H, Lq, hd], k and v [B, H, Lk, hd] (contiguous) -> [B, H, Lq, hd]."""
    b, h, nq, hd = q.shape
    nk = k.shape[2]
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v)
    q3, k3, v3 = q.reshape(b * h, nq, hd), k.reshape(b * h, nk, hd), v.reshape(b * h, nk, hd)
    chunk = max(1, min(b * h, SCORE_BUDGET_BYTES // (nq * nk * q.element_size())))
    key = (chunk, nq, nk, q.dtype)
    if PLAIN_ATTENTION:
        scores = torch.empty(chunk, nq, nk, dtype=q.dtype)
    else:
        if key not in _SCORES:  # self and cross attention each keep their buffer
            _SCORES[key] = torch.empty(chunk, nq, nk, dtype=q.dtype)
        scores = _SCORES[key]
    out = torch.empty_like(q3)
    for s in range(0, b * h, chunk):
        e = min(b * h, s + chunk)
        sc = scores[: e - s]
        torch.baddbmm(sc, q3[s:e], k3[s:e].transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(hd), out=sc)
        probs = torch.softmax(sc, dim=-1) if PLAIN_ATTENTION else _softmax_inplace(sc)
        torch.bmm(probs, v3[s:e], out=out[s:e])
    return out.view(b, h, nq, hd)


def heads(x, num_heads):
    """[B, N, D] -> [B, H, N, hd] contiguous (the layout of the batched products)."""
    b, n, d = x.shape
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2).contiguous()


def merge_heads(x):
    """[B, H, L, hd] -> [B, L, H * hd] (contiguous)."""
    b, h, n, hd = x.shape
    return x.transpose(1, 2).reshape(b, n, h * hd)


# ------------------------------------------------------------------------------------------------
# The block (porting-spec 2.3); parameters are plain tensors in a dict with diffusers' names.
# ------------------------------------------------------------------------------------------------
def block_params(dim, ffn, gen):
    shapes = {}

    def linear(name, n_in, n_out):
        shapes[name + ".weight"] = (n_out, n_in)
        shapes[name + ".bias"] = (n_out,)

    for attn in ["attn1", "attn2"]:
        for proj in ["to_q", "to_k", "to_v", "to_out.0"]:
            linear(f"{attn}.{proj}", dim, dim)
    linear("ffn.net.0.proj", dim, ffn)
    linear("ffn.net.2", ffn, dim)
    params = {name: torch.empty(shape).normal_(0.0, 0.02, generator=gen) for name, shape in shapes.items()}
    for name in ["attn1.norm_q", "attn1.norm_k", "attn2.norm_q", "attn2.norm_k", "norm2"]:
        params[name + ".weight"] = 1.0 + torch.empty(dim).normal_(0.0, 0.02, generator=gen)
    params["norm2.bias"] = torch.empty(dim).normal_(0.0, 0.02, generator=gen)
    params["scale_shift_table"] = torch.randn(1, 6, dim, generator=gen) / math.sqrt(dim)
    return params


FP32_KEPT = ("scale_shift_table", "norm2.weight", "norm2.bias")  # diffusers' _keep_in_fp32_modules


def lin(p, name, x):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


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

    def forward(instrumented=False):
        OPS.start(instrumented)
        t0 = time.perf_counter()
        out = wan_block(params, h, context, timestep_proj, cos_h, sin_h, num_heads)
        return time.perf_counter() - t0, out

    with torch.no_grad():
        warm, out = forward()
        if not torch.isfinite(out.float()).all():
            raise RuntimeError("the block produced non-finite values")
        runs = [forward()[0] for _ in range(repeats)]
        total, _ = forward(instrumented=True)
    ops = dict(OPS.seconds)
    OPS.start(False)
    return warm, runs, ops, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="f32,bf16", help="comma-separated: f32, bf16")
    parser.add_argument("--blocks", default="wan", help="only 'wan' (for symmetry with torch_flux_blocks.py)")
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--ffn", type=int, default=8960)
    parser.add_argument("--frames", type=int, default=13, help="post-patch token grid: latent frames")
    parser.add_argument("--height", type=int, default=18, help="post-patch token grid: latent height / 2")
    parser.add_argument("--width", type=int, default=20, help="post-patch token grid: latent width / 2")
    parser.add_argument("--txt", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="hidden 256, heads 2, ffn 512, grid 2x4x8, txt 16")
    parser.add_argument("--plain-attention", action="store_true",
                        help="math attention with fresh score tensors and an out-of-place softmax")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.heads, args.ffn, args.frames, args.height, args.width, args.txt = 256, 2, 512, 2, 4, 8, 16
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r} (expected f32 or bf16)")
    if [b.strip() for b in args.blocks.split(",") if b.strip()] != ["wan"]:
        parser.error("--blocks: only 'wan'")
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2 or args.hidden // args.heads < 6:
        parser.error("--hidden must be --heads times an even head dim >= 6")

    global PLAIN_ATTENTION
    PLAIN_ATTENTION = args.plain_attention
    wall0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    env = environment(args.threads)
    dim, num_heads, head_dim = args.hidden, args.heads, args.hidden // args.heads
    tokens = args.frames * args.height * args.width
    attention_impl = ("sdpa" if HAS_SDPA else "math: baddbmm + softmax + bmm, " +
                      ("fresh buffers" if PLAIN_ATTENTION else "reused score buffers, in-place softmax"))
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
        warm, runs, ops, total = run_case(params, inputs, num_heads, args.repeats)
        del params
        median = statistics.median(runs)
        log(f"  wan {dname}: warm-up {warm:.3f} s, runs {', '.join(f'{r:.3f}' for r in runs)} s, "
            f"median {median:.3f} s; instrumented {total:.3f} s")
        for g in GROUPS:
            if ops[g] > 0:
                log(f"      {g:<20} {ops[g] * 1e3:9.1f} ms  {100 * ops[g] / total:5.1f}%")
        results.append({"block": "wan", "dtype": dname, "median_s": median, "runs_s": runs, "ops_s": ops,
                        "ops_total_s": total, "gflop": block_gflop(dim, args.ffn, tokens, args.txt)})
        _SCORES.clear()
    env["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"total {time.perf_counter() - wall0:.1f} s")
    print(json.dumps({"torch_version": torch.__version__, "threads": args.threads,
                      "attention": "sdpa" if HAS_SDPA else "math", "attention_impl": attention_impl, "env": env,
                      "shape": {"hidden": dim, "heads": num_heads, "head_dim": head_dim, "ffn": args.ffn,
                                "grid": [args.frames, args.height, args.width], "video_tokens": tokens,
                                "txt": args.txt, "batch": 1}, "results": results}))


if __name__ == "__main__":
    sys.exit(main())
