#!/usr/bin/python3
"""PyTorch CPU baseline for `cubevec-bench blocks`: one Flux double-stream block and one
single-stream block, timed in plain torch.

Run with Debian's torch 1.13 (only /usr/bin/python3 sees it):

    /usr/bin/python3 bench/torch_flux_blocks.py --threads 2 --repeats 3 [--dtypes f32,bf16]
        [--blocks double,single] [--hidden 3072 --heads 24 --img 1024 --txt 256] [--quick]

--quick shrinks the shapes to hidden 256, heads 2 (head dim 128), img 64, txt 16 (about a second).

The blocks are written from ../shared/reference/porting-spec.md section 1.4 (with 0.4-0.7 and 1.6);
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
import ctypes
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

GROUPS = ["modulation_linear", "layernorm_modulate", "qkv_linear", "qk_rmsnorm", "rope", "attention", "out_proj",
          "mlp_in", "gelu", "mlp_out", "gated_residual", "concat_split"]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
SCORE_BUDGET_BYTES = 512 << 20
LN_EPS = 1e-6
RMS_EPS = 1e-6


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Per-op instrumentation: tick(group) charges the time since the previous tick to `group`.
# ------------------------------------------------------------------------------------------------
class OpTimer:
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
# Building blocks (porting-spec 0.4-0.7, 1.6)
# ------------------------------------------------------------------------------------------------
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


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


def apply_rope(x, cos_h, sin_h):
    """Rotate the pairs (x[2j], x[2j+1]) of x [B, H, L, hd] by the angles of cos_h/sin_h [L, hd/2]
    (porting-spec 0.5), in f32, cast back to x's dtype."""
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.empty_like(xf)
    out[..., 0::2] = even * cos_h - odd * sin_h
    out[..., 1::2] = odd * cos_h + even * sin_h
    return out.to(x.dtype)


def rms_norm(x, weight):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim; statistics in f32, normalized value cast
    back to x's dtype before the weight multiply."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return y.to(x.dtype) * weight


def layernorm_modulate(x, shift, scale):
    """LN_1e-6(x) * (1 + scale) + shift, scale/shift [B, D] broadcast over tokens."""
    normed = F.layer_norm(x, (x.shape[-1],), eps=LN_EPS)
    return torch.addcmul(shift[:, None], normed, 1 + scale[:, None])


_SCORES = {}  # reusable score buffers: a fresh 150 MB tensor per call costs ~25% of the attention in page faults
PLAIN_ATTENTION = False  # --plain-attention: fresh buffers and an out-of-place softmax


def _softmax_inplace(x):
    try:
        torch._softmax(x, -1, False, out=x)
    except (AttributeError, RuntimeError, TypeError):
        x.copy_(torch.softmax(x, dim=-1))
    return x


def attention(q, k, v):
    """softmax(q k^T / sqrt(hd)) v for q, k, v [B, H, L, hd] (contiguous) -> [B, H, L, hd]."""
    b, h, n, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v)
    q3, k3, v3 = (t.reshape(b * h, n, hd) for t in (q, k, v))
    per_head = n * n * q.element_size()
    chunk = max(1, min(b * h, SCORE_BUDGET_BYTES // per_head))
    out = torch.empty_like(q3)
    key = (chunk, n, q.dtype)
    if PLAIN_ATTENTION:
        scores = torch.empty(chunk, n, n, dtype=q.dtype)
    else:
        if key not in _SCORES:
            _SCORES.clear()
            _SCORES[key] = torch.empty(chunk, n, n, dtype=q.dtype)
        scores = _SCORES[key]
    for s in range(0, b * h, chunk):
        e = min(b * h, s + chunk)
        sc = scores[: e - s]
        torch.baddbmm(sc, q3[s:e], k3[s:e].transpose(1, 2), beta=0.0, alpha=scale, out=sc)
        probs = torch.softmax(sc, dim=-1) if PLAIN_ATTENTION else _softmax_inplace(sc)
        torch.bmm(probs, v3[s:e], out=out[s:e])
    return out.view(b, h, n, hd)


def heads(x, num_heads):
    """[B, N, D] -> [B, H, N, hd] (a transposed view)."""
    b, n, d = x.shape
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(x):
    """[B, H, L, hd] -> [B, L, H * hd] (contiguous)."""
    b, h, n, hd = x.shape
    return x.transpose(1, 2).reshape(b, n, h * hd)


# ------------------------------------------------------------------------------------------------
# The two blocks (porting-spec 1.4); parameters are plain tensors in a dict with diffusers' names.
# ------------------------------------------------------------------------------------------------
def double_block_params(dim, head_dim, gen):
    shapes = {}

    def linear(name, n_in, n_out):
        shapes[name + ".weight"] = (n_out, n_in)
        shapes[name + ".bias"] = (n_out,)

    linear("norm1.linear", dim, 6 * dim)
    linear("norm1_context.linear", dim, 6 * dim)
    for name in ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                 "attn.to_out.0", "attn.to_add_out"]:
        linear(name, dim, dim)
    for ff in ["ff", "ff_context"]:
        linear(ff + ".net.0.proj", dim, 4 * dim)
        linear(ff + ".net.2", 4 * dim, dim)
    params = {name: torch.empty(shape).normal_(0.0, 0.02, generator=gen) for name, shape in shapes.items()}
    for name in ["attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"]:
        params[name + ".weight"] = 1.0 + torch.empty(head_dim).normal_(0.0, 0.02, generator=gen)
    return params


def single_block_params(dim, head_dim, gen):
    shapes = {}

    def linear(name, n_in, n_out):
        shapes[name + ".weight"] = (n_out, n_in)
        shapes[name + ".bias"] = (n_out,)

    linear("norm.linear", dim, 3 * dim)
    linear("proj_mlp", dim, 4 * dim)
    for name in ["attn.to_q", "attn.to_k", "attn.to_v"]:
        linear(name, dim, dim)
    linear("proj_out", 5 * dim, dim)
    params = {name: torch.empty(shape).normal_(0.0, 0.02, generator=gen) for name, shape in shapes.items()}
    for name in ["attn.norm_q", "attn.norm_k"]:
        params[name + ".weight"] = 1.0 + torch.empty(head_dim).normal_(0.0, 0.02, generator=gen)
    return params


def lin(p, name, x):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


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
def set_openblas_threads(n):
    """Sets OpenBLAS's own pool (torch's f32 GEMM backend on Debian) to n threads, if it is loaded."""
    for lib in ["libopenblas.so.0", "libopenblas.so"]:
        try:
            ob = ctypes.CDLL(lib, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        info = {"openblas_threads_before": ob.openblas_get_num_threads()}
        ob.openblas_set_num_threads(n)
        info["openblas_threads"] = ob.openblas_get_num_threads()
        try:
            ob.openblas_get_config.restype = ctypes.c_char_p
            ob.openblas_get_corename.restype = ctypes.c_char_p
            info["openblas_config"] = ob.openblas_get_config().decode()
            info["openblas_core"] = ob.openblas_get_corename().decode()
        except AttributeError:
            pass
        return info
    return {"openblas_threads": None}


def environment(threads):
    env = {k: os.environ.get(k) for k in ["OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OPENBLAS_L2_SIZE",
                                          "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS",
                                          "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA"]}
    env.update(set_openblas_threads(threads))
    env["torch_num_threads"] = torch.get_num_threads()
    env["mkldnn"] = torch.backends.mkldnn.is_available()
    config = torch.__config__.show()
    env["cpu_capability"] = next((line.split(":", 1)[1].strip() for line in config.splitlines()
                                  if "CPU capability usage" in line), None)
    env["blas_info"] = next((part.split("=", 1)[1] for part in config.replace(",", "\n").split()
                             if part.startswith("BLAS_INFO=")), None)
    env["python"] = platform.python_version()
    env["cpus"] = os.cpu_count()
    env["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return env


def run_case(kind, params, inputs, num_heads, repeats):
    fn = double_block if kind == "double" else single_block
    h, c, temb, cos_h, sin_h = inputs

    def forward(instrumented=False):
        OPS.start(instrumented)
        t0 = time.perf_counter()
        out = fn(params, h, c, temb, cos_h, sin_h, num_heads)
        return time.perf_counter() - t0, out

    with torch.no_grad():
        warm, out = forward()
        for x in out:
            if not torch.isfinite(x.float()).all():
                raise RuntimeError(f"{kind} block produced non-finite values")
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
    parser.add_argument("--blocks", default="double,single", help="comma-separated: double, single")
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--img", type=int, default=1024)
    parser.add_argument("--txt", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="hidden 256, heads 2, img 64, txt 16")
    parser.add_argument("--plain-attention", action="store_true",
                        help="math attention with a fresh score tensor per call and an out-of-place softmax "
                             "(what a straightforward torch 1.13 port does); default: reused buffer, in-place")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.heads, args.img, args.txt = 256, 2, 64, 16
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    for d in dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r} (expected f32 or bf16)")
    for b in blocks:
        if b not in ("double", "single"):
            parser.error(f"unknown block {b!r} (expected double or single)")
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        parser.error("--hidden must be --heads times an even head dim")

    global PLAIN_ATTENTION
    PLAIN_ATTENTION = args.plain_attention
    wall0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    env = environment(args.threads)
    dim, num_heads, head_dim = args.hidden, args.heads, args.hidden // args.heads
    attention_impl = ("sdpa" if HAS_SDPA else "math: baddbmm + softmax + bmm, " +
                      ("fresh buffers" if PLAIN_ATTENTION else "reused score buffer, in-place softmax"))
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
            warm, runs, ops, total = run_case(kind, params, inputs, num_heads, args.repeats)
            del params
            median = statistics.median(runs)
            log(f"  {kind} {dname}: warm-up {warm:.3f} s, runs {', '.join(f'{r:.3f}' for r in runs)} s, "
                f"median {median:.3f} s; instrumented {total:.3f} s")
            for g in GROUPS:
                if ops[g] > 0:
                    log(f"      {g:<20} {ops[g] * 1e3:9.1f} ms  {100 * ops[g] / total:5.1f}%")
            results.append({"block": kind, "dtype": dname, "median_s": median, "runs_s": runs, "ops_s": ops,
                            "ops_total_s": total, "gflop": block_gflop(kind, dim, args.img, args.txt)})
        del master
        _SCORES.clear()
    env["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"total {time.perf_counter() - wall0:.1f} s")
    print(json.dumps({"torch_version": torch.__version__, "threads": args.threads,
                      "attention": "sdpa" if HAS_SDPA else "math", "attention_impl": attention_impl, "env": env,
                      "shape": {"hidden": dim, "heads": num_heads, "head_dim": head_dim, "img": args.img,
                                "txt": args.txt}, "results": results}))


if __name__ == "__main__":
    main()
