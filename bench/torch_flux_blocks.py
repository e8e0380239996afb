#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench blocks`: one Flux double-stream block and one
single-stream block, timed in plain torch.

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_flux_blocks.py --threads 2 --repeats 3 [--dtypes f32,bf16]
        [--blocks double,single] [--hidden 3072 --heads 24 --img 1024 --txt 256] [--quick]

--quick shrinks the shapes to hidden 256, heads 2 (head dim 128), img 64, txt 16 (about a second).

The blocks are written from docs/models.md, "Flux transformer" (with "Shared building blocks");
diffusers is not used. Weights are random (normal, std 0.02; the q/k RMSNorm weights are
1 + N(0, 0.02)), inputs are N(0, 1): hidden [1, img, D], context [1, txt, D], temb [1, D], and the
Flux RoPE table (axes 16/56/56, text ids zero, image ids (0, row, col) on a near-square grid) as
f32 cos/sin [txt + img, 128]. For bf16 the weights and inputs are cast to bfloat16; the RoPE
rotation runs in f32 and is cast back, and the RMSNorm statistics are taken in f32, as diffusers
does. LayerNorm, softmax and GELU run in the tensor's dtype (torch accumulates in f32 inside).

Attention: F.scaled_dot_product_attention when torch has it (torch >= 2.0), otherwise the math
form softmax(Q K^T / sqrt(hd)) V with torch.baddbmm (beta 0, the scale folded into alpha) and
torch.bmm, the fastest math form in torch 1.13 (torch.matmul with a pre-scaled Q is ~1.4x slower),
with one score buffer reused across calls and the softmax done in place (torch._softmax with out=):
a fresh 150 MB score tensor per call and an out-of-place softmax cost another ~1.6x in page faults
(--plain-attention measures that variant). Very long sequences are split over heads so the score
buffer stays under 512 MB.

For each block and dtype: one warm-up forward, then --repeats timed forwards under torch.no_grad()
(median reported), then one extra instrumented forward whose time is split into op groups with
time.perf_counter(). The groups are the same for both blocks (a group a block does not have is
reported as 0.0):

    modulation_linear   SiLU(temb) and the AdaLN Linear(s) D -> 6D (double: two) / 3D (single)
    layernorm_modulate  LayerNorm (eps 1e-6, no affine) * (1 + scale) + shift
    qkv_linear          q/k/v Linears (double: image and text streams, six Linears)
    qk_rmsnorm          per-head RMSNorm of q and k (eps 1e-6, weight [hd])
    rope                interleaved-pair RoPE of Q and K on the joint [text; image] sequence
    attention           softmax(Q K^T / sqrt(hd)) V
    out_proj            double: to_out.0 and to_add_out; single: proj_out (5D -> D, which also
                        does the MLP's down projection: single has no separate mlp_out)
    mlp_in              Linear D -> 4D (double: ff and ff_context; single: proj_mlp)
    gelu                GELU (tanh approximation)
    mlp_out             Linear 4D -> D (double only)
    gated_residual      x + gate * branch
    concat_split        joint-sequence concatenations, head transposes and splits

Everything between two group boundaries is charged to a group, so the groups add up to the
instrumented forward's time (reported as ops_total_s) except for the freeing of the block's
temporaries when it returns (about 1% for the single block).

Output: exactly one JSON object on stdout,
    {"torch_version", "threads", "attention": "sdpa"|"math", "env": {...},
     "results": [{"block", "dtype", "median_s", "runs_s", "ops_s", "ops_total_s", "gflop"}]}
where gflop counts the matmul FLOPs (Linears and the two attention products). Progress goes to
stderr.

Threads: torch.set_num_threads(--threads) sets the OpenMP pool. torch 1.13's f32 Linears call the
system BLAS (on Debian: OpenBLAS, pthread build) which keeps its own pool; it is set to the same
count through openblas_set_num_threads when the library is loaded. bf16 Linears and bmm go through
oneDNN.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

# The harness shared with torch_wan_blocks.py (timer, attention, helpers, threads, environment, report).
from torch_bench_common import (DTYPES, Attention, OpTimer, add_common_arguments, add_norm_weights,
                                add_trailing_arguments, apply_rope, case_result, emit, head_view, lin, log,
                                merge_heads, parse_dtypes, random_linears, rms_norm, start, time_forwards)

GROUPS = ["modulation_linear", "layernorm_modulate", "qkv_linear", "qk_rmsnorm", "rope", "attention", "out_proj",
          "mlp_in", "gelu", "mlp_out", "gated_residual", "concat_split"]
LN_EPS = 1e-6

OPS = OpTimer(GROUPS)
# One score buffer at a time (the two blocks' sequences have the same length); --plain-attention sets .plain.
attention = Attention(one_buffer=True)


# ------------------------------------------------------------------------------------------------
# Building blocks (docs/models.md "Shared building blocks", "Flux transformer"); apply_rope,
# rms_norm, lin and merge_heads are shared.
# ------------------------------------------------------------------------------------------------
heads = head_view  # [B, N, D] -> [B, H, N, hd], a transposed view


def flux_rope_table(txt, img, head_dim):
    """cos, sin [txt + img, head_dim] (f32, computed in float64): text ids (0, 0, 0), image ids
    (0, row, col) row-major on a grid `cols` wide; axes 16/56/56 for head dim 128, otherwise the
    head dim split 1/8, 7/16, 7/16 (rounded to even sizes)."""
    if head_dim == 128:
        axes = [16, 56, 56]
    else:
        a0 = max(2, (head_dim // 8) // 2 * 2)
        a1 = (head_dim - a0) // 2 // 2 * 2
        axes = [a0, a1, head_dim - a0 - a1]
    cols = max(1, math.ceil(math.sqrt(img)))
    n = torch.arange(img, dtype=torch.float64)
    ids = torch.zeros(txt + img, 3, dtype=torch.float64)
    ids[txt:, 1] = torch.div(n, cols, rounding_mode="floor")
    ids[txt:, 2] = n - ids[txt:, 1] * cols
    cos_parts, sin_parts = [], []
    for axis, d in enumerate(axes):
        freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # d/2 frequencies
        angles = ids[:, axis:axis + 1] * freqs[None, :]  # [L, d/2]
        cos_parts.append(torch.cos(angles).repeat_interleave(2, dim=1))
        sin_parts.append(torch.sin(angles).repeat_interleave(2, dim=1))
    return torch.cat(cos_parts, 1).float(), torch.cat(sin_parts, 1).float()


def rope_halves(cos, sin):
    """The per-pair angle tables [L, hd/2] (entries 2j and 2j+1 of the full tables are equal)."""
    return cos[:, 0::2].contiguous(), sin[:, 0::2].contiguous()


def layernorm_modulate(x, shift, scale):
    """LN_1e-6(x) * (1 + scale) + shift, scale/shift [B, D] broadcast over tokens."""
    normed = F.layer_norm(x, (x.shape[-1],), eps=LN_EPS)
    return torch.addcmul(shift[:, None], normed, 1 + scale[:, None])


# ------------------------------------------------------------------------------------------------
# The two blocks (docs/models.md "Flux transformer"); parameters are plain tensors in a dict with
# diffusers' names.
# ------------------------------------------------------------------------------------------------
def double_block_params(dim, head_dim, gen):
    linears = [("norm1.linear", dim, 6 * dim), ("norm1_context.linear", dim, 6 * dim)]
    for name in ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                 "attn.to_out.0", "attn.to_add_out"]:
        linears.append((name, dim, dim))
    for ff in ["ff", "ff_context"]:
        linears += [(ff + ".net.0.proj", dim, 4 * dim), (ff + ".net.2", 4 * dim, dim)]
    params = random_linears(linears, gen)
    add_norm_weights(params, ["attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"], head_dim, gen)
    return params


def single_block_params(dim, head_dim, gen):
    linears = [("norm.linear", dim, 3 * dim), ("proj_mlp", dim, 4 * dim)]
    linears += [(name, dim, dim) for name in ["attn.to_q", "attn.to_k", "attn.to_v"]]
    linears.append(("proj_out", 5 * dim, dim))
    params = random_linears(linears, gen)
    add_norm_weights(params, ["attn.norm_q", "attn.norm_k"], head_dim, gen)
    return params


def double_block(p, h, c, temb, cos_h, sin_h, num_heads):
    """FluxTransformerBlock: h [B, N_img, D], c [B, L_txt, D], temb [B, D] -> (h, c)."""
    t = OPS.tick
    m = F.silu(temb)
    sh1, sc1, g1, sh2, sc2, g2 = lin(p, "norm1.linear", m).chunk(6, dim=1)
    ch1, cs1, cg1, ch2, cs2, cg2 = lin(p, "norm1_context.linear", m).chunk(6, dim=1)
    t("modulation_linear")
    xn = layernorm_modulate(h, sh1, sc1)
    cn = layernorm_modulate(c, ch1, cs1)
    t("layernorm_modulate")
    q, k, v = (heads(lin(p, "attn." + n, xn), num_heads) for n in ["to_q", "to_k", "to_v"])
    cq, ck, cv = (heads(lin(p, "attn." + n, cn), num_heads) for n in ["add_q_proj", "add_k_proj", "add_v_proj"])
    t("qkv_linear")
    q = rms_norm(q, p["attn.norm_q.weight"])
    k = rms_norm(k, p["attn.norm_k.weight"])
    cq = rms_norm(cq, p["attn.norm_added_q.weight"])
    ck = rms_norm(ck, p["attn.norm_added_k.weight"])
    t("qk_rmsnorm")
    n_txt = c.shape[1]
    jq = torch.cat([cq, q], dim=2)  # [B, H, L, hd], text first
    jk = torch.cat([ck, k], dim=2)
    jv = torch.cat([cv, v], dim=2)
    t("concat_split")
    jq = apply_rope(jq, cos_h, sin_h)
    jk = apply_rope(jk, cos_h, sin_h)
    t("rope")
    o = attention(jq, jk, jv)
    t("attention")
    o = merge_heads(o)
    co, io = o[:, :n_txt], o[:, n_txt:]
    t("concat_split")
    io = lin(p, "attn.to_out.0", io)
    co = lin(p, "attn.to_add_out", co)
    t("out_proj")
    h = torch.addcmul(h, g1[:, None], io)
    c = torch.addcmul(c, cg1[:, None], co)
    t("gated_residual")
    hn = layernorm_modulate(h, sh2, sc2)
    cn2 = layernorm_modulate(c, ch2, cs2)
    t("layernorm_modulate")
    hf = lin(p, "ff.net.0.proj", hn)
    cf = lin(p, "ff_context.net.0.proj", cn2)
    t("mlp_in")
    hf = F.gelu(hf, approximate="tanh")
    cf = F.gelu(cf, approximate="tanh")
    t("gelu")
    hf = lin(p, "ff.net.2", hf)
    cf = lin(p, "ff_context.net.2", cf)
    t("mlp_out")
    h = torch.addcmul(h, g2[:, None], hf)
    c = torch.addcmul(c, cg2[:, None], cf)
    t("gated_residual")
    return h, c


def single_block(p, h, c, temb, cos_h, sin_h, num_heads):
    """FluxSingleTransformerBlock on s = [c; h]: returns (h, c)."""
    t = OPS.tick
    n_txt = c.shape[1]
    s = torch.cat([c, h], dim=1)
    t("concat_split")
    shift, scale, gate = lin(p, "norm.linear", F.silu(temb)).chunk(3, dim=1)
    t("modulation_linear")
    sn = layernorm_modulate(s, shift, scale)
    t("layernorm_modulate")
    mlp = lin(p, "proj_mlp", sn)
    t("mlp_in")
    mlp = F.gelu(mlp, approximate="tanh")
    t("gelu")
    q, k, v = (heads(lin(p, "attn." + n, sn), num_heads) for n in ["to_q", "to_k", "to_v"])
    t("qkv_linear")
    q = rms_norm(q, p["attn.norm_q.weight"])
    k = rms_norm(k, p["attn.norm_k.weight"])
    t("qk_rmsnorm")
    q = apply_rope(q, cos_h, sin_h)
    k = apply_rope(k, cos_h, sin_h)
    t("rope")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # [B, H, L, hd] layout for the batched products
    t("concat_split")
    a = attention(q, k, v)
    t("attention")
    joint = torch.cat([merge_heads(a), mlp], dim=-1)  # [attention D | MLP 4D]
    t("concat_split")
    out = lin(p, "proj_out", joint)
    t("out_proj")
    s = torch.addcmul(s, gate[:, None], out)
    t("gated_residual")
    c, h = s[:, :n_txt], s[:, n_txt:]
    t("concat_split")
    return h, c


def block_gflop(kind, dim, img, txt):
    """Matmul FLOPs of one forward (Linears over tokens, the two attention products, modulation)."""
    n = img + txt
    if kind == "double":
        linear = 2 * n * dim * (3 * dim + dim + 8 * dim) + 2 * 2 * dim * 6 * dim
    else:
        linear = 2 * n * dim * (3 * dim + 4 * dim + 5 * dim) + 2 * dim * 3 * dim
    return (linear + 4 * n * n * dim) / 1e9


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------
def run_case(kind, params, inputs, num_heads, repeats):
    fn = double_block if kind == "double" else single_block
    h, c, temb, cos_h, sin_h = inputs
    return time_forwards(lambda: fn(params, h, c, temb, cos_h, sin_h, num_heads), OPS, repeats, f"{kind} block")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--blocks", default="double,single", help="comma-separated: double, single")
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--img", type=int, default=1024)
    parser.add_argument("--txt", type=int, default=256)
    add_trailing_arguments(parser, "hidden 256, heads 2, img 64, txt 16",
                           "math attention with a fresh score tensor per call and an out-of-place softmax "
                           "(what a straightforward torch 1.13 port does); default: reused buffer, in-place")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.heads, args.img, args.txt = 256, 2, 64, 16
    dtypes = parse_dtypes(parser, args)
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    for b in blocks:
        if b not in ("double", "single"):
            parser.error(f"unknown block {b!r} (expected double or single)")
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        parser.error("--hidden must be --heads times an even head dim")

    attention.plain = args.plain_attention
    wall0, env = start(args)
    dim, num_heads, head_dim = args.hidden, args.heads, args.hidden // args.heads
    attention_impl = attention.describe()
    log(f"torch {torch.__version__}, {args.threads} threads, attention {attention_impl}; D {dim}, {num_heads} heads x {head_dim}, "
        f"img {args.img} + txt {args.txt} tokens; load average {env['loadavg_at_start']}")

    gen = torch.Generator().manual_seed(args.seed)
    h = torch.randn(1, args.img, dim, generator=gen)
    c = torch.randn(1, args.txt, dim, generator=gen)
    temb = torch.randn(1, dim, generator=gen)
    cos, sin = flux_rope_table(args.txt, args.img, head_dim)
    cos_h, sin_h = rope_halves(cos, sin)

    results = []
    for kind in blocks:
        t0 = time.perf_counter()
        make = double_block_params if kind == "double" else single_block_params
        master = make(dim, head_dim, gen)
        n_params = sum(t.numel() for t in master.values())
        log(f"{kind} block: {n_params / 1e6:.1f} M parameters, built in {time.perf_counter() - t0:.1f} s")
        for dname in dtypes:
            dtype = DTYPES[dname]
            params = master if dtype == torch.float32 else {k: v.to(dtype) for k, v in master.items()}
            inputs = (h.to(dtype), c.to(dtype), temb.to(dtype), cos_h, sin_h)
            timing = run_case(kind, params, inputs, num_heads, args.repeats)
            del params
            results.append(case_result(kind, dname, timing, GROUPS, block_gflop(kind, dim, args.img, args.txt)))
        del master
        attention.scores.clear()
    emit(args, attention_impl, env, {"hidden": dim, "heads": num_heads, "head_dim": head_dim, "img": args.img,
                                     "txt": args.txt}, results, wall0)

if __name__ == "__main__":
    main()
