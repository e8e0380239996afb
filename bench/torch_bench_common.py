"""The harness shared by the PyTorch CPU baselines bench/torch_flux_blocks.py and bench/torch_wan_blocks.py,
so the two are measured the same way: logging, the per-op timer, the math attention with reusable score
buffers, the small tensor helpers both blocks use, random parameters, the thread and environment setup, the
timed forwards, the command-line options both take and the JSON report. The scripts' docstrings describe
what is measured; this module only holds the shared code.
"""
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

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
SCORE_BUDGET_BYTES = 512 << 20
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Per-op instrumentation: tick(group) charges the time since the previous tick to `group`.
# ------------------------------------------------------------------------------------------------
class OpTimer:
    def __init__(self, groups):
        self.groups = groups
        self.on = False
        self.seconds = {}
        self.last = 0.0

    def start(self, on):
        self.on = on
        self.seconds = {g: 0.0 for g in self.groups}
        self.last = time.perf_counter()

    def tick(self, group):
        if self.on:
            now = time.perf_counter()
            self.seconds[group] += now - self.last
            self.last = now


# ------------------------------------------------------------------------------------------------
# Attention and the small tensor helpers (docs/models.md "Shared building blocks")
# ------------------------------------------------------------------------------------------------
def _softmax_inplace(x):
    try:
        torch._softmax(x, -1, False, out=x)
    except (AttributeError, RuntimeError, TypeError):
        x.copy_(torch.softmax(x, dim=-1))
    return x


class Attention:
    """softmax(q k^T / sqrt(hd)) v for q [B, H, Lq, hd], k and v [B, H, Lk, hd] (contiguous) -> [B, H, Lq, hd].

    F.scaled_dot_product_attention when torch has it, otherwise torch.baddbmm (beta 0, the scale folded
    into alpha) + softmax + torch.bmm, split over heads so a score buffer stays under SCORE_BUDGET_BYTES.
    The score buffers are reused across calls (a fresh 150 MB score tensor per call costs ~25% of the
    attention in page faults) and the softmax is done in place, unless `plain` is set (--plain-attention:
    fresh buffers and an out-of-place softmax). With `one_buffer` only the last shape's buffer is kept;
    otherwise one per shape (self and cross attention each keep theirs)."""

    def __init__(self, one_buffer):
        self.one_buffer = one_buffer
        self.plain = False
        self.scores = {}

    def describe(self):
        if HAS_SDPA:
            return "sdpa"
        reused = "reused score buffer" if self.one_buffer else "reused score buffers"
        return "math: baddbmm + softmax + bmm, " + ("fresh buffers" if self.plain else reused + ", in-place softmax")

    def _buffer(self, chunk, nq, nk, dtype):
        if self.plain:
            return torch.empty(chunk, nq, nk, dtype=dtype)
        key = (chunk, nq, nk, dtype)
        if key not in self.scores:
            if self.one_buffer:
                self.scores.clear()
            self.scores[key] = torch.empty(chunk, nq, nk, dtype=dtype)
        return self.scores[key]

    def __call__(self, q, k, v):
        b, h, nq, hd = q.shape
        nk = k.shape[2]
        if HAS_SDPA:
            return F.scaled_dot_product_attention(q, k, v)
        q3, k3, v3 = q.reshape(b * h, nq, hd), k.reshape(b * h, nk, hd), v.reshape(b * h, nk, hd)
        chunk = max(1, min(b * h, SCORE_BUDGET_BYTES // (nq * nk * q.element_size())))
        out = torch.empty_like(q3)
        scores = self._buffer(chunk, nq, nk, q.dtype)
        for s in range(0, b * h, chunk):
            e = min(b * h, s + chunk)
            sc = scores[: e - s]
            torch.baddbmm(sc, q3[s:e], k3[s:e].transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(hd), out=sc)
            probs = torch.softmax(sc, dim=-1) if self.plain else _softmax_inplace(sc)
            torch.bmm(probs, v3[s:e], out=out[s:e])
        return out.view(b, h, nq, hd)


def apply_rope(x, cos_h, sin_h):
    """Rotate the pairs (x[2j], x[2j+1]) of x [B, H, L, hd] by the angles of cos_h/sin_h [L, hd/2]
    (docs/models.md "Shared building blocks"), in f32, cast back to x's dtype."""
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.empty_like(xf)
    out[..., 0::2] = even * cos_h - odd * sin_h
    out[..., 1::2] = odd * cos_h + even * sin_h
    return out.to(x.dtype)


def rms_norm(x, weight, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim; statistics in f32, normalized value cast
    back to x's dtype before the weight multiply."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def head_view(x, num_heads):
    """[B, N, D] -> [B, H, N, hd] (a transposed view)."""
    b, n, d = x.shape
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(x):
    """[B, H, L, hd] -> [B, L, H * hd] (contiguous)."""
    b, h, n, hd = x.shape
    return x.transpose(1, 2).reshape(b, n, h * hd)


def lin(p, name, x):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


def random_linears(linears, gen):
    """{name.weight [n_out, n_in], name.bias [n_out]} for (name, n_in, n_out) in order, all N(0, 0.02)."""
    shapes = {}
    for name, n_in, n_out in linears:
        shapes[name + ".weight"] = (n_out, n_in)
        shapes[name + ".bias"] = (n_out,)
    return {name: torch.empty(shape).normal_(0.0, 0.02, generator=gen) for name, shape in shapes.items()}


def add_norm_weights(params, names, size, gen):
    """params[name.weight] = 1 + N(0, 0.02) of [size] for each name, in order."""
    for name in names:
        params[name + ".weight"] = 1.0 + torch.empty(size).normal_(0.0, 0.02, generator=gen)


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


def cpu_has_bf16_hardware():
    """Whether the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return True  # unknown: measure both
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_dtypes():
    """f32 and bf16 where the CPU has bf16 hardware; else f32 only: PyTorch's best path there is f32,
    and its bf16 kernels fall back to emulation (minutes for one DiT-sized GEMM on an AVX2 Zen 3)."""
    if cpu_has_bf16_hardware():
        return "f32,bf16"
    log("this CPU has no bf16 hardware: PyTorch runs f32 only (pass --dtypes f32,bf16 to time bf16 too)")
    return "f32"


def add_common_arguments(parser):
    """The options every baseline takes first: --threads, --repeats, --dtypes."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated: f32, bf16 (default: both where the CPU has bf16 hardware, else f32)")


def add_trailing_arguments(parser, quick_help, plain_attention_help):
    """The options every baseline takes last: --seed, --quick, --plain-attention."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--plain-attention", action="store_true", help=plain_attention_help)


def parse_dtypes(parser, args):
    """The --dtypes list; an unknown name is a usage error."""
    if args.dtypes is None:
        args.dtypes = default_dtypes()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r} (expected f32 or bf16)")
    if not dtypes:
        parser.error(f"--dtypes {args.dtypes!r} names no dtype (expected f32, bf16 or both, comma-separated)")
    return dtypes


def start(args):
    """Sets torch's pool (and OpenBLAS's) to --threads; returns (wall-clock start, environment report)."""
    wall0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    return wall0, environment(args.threads)


def time_forwards(forward_fn, ops, repeats, what):
    """One warm-up call of forward_fn() (its output, a tensor or a tuple, must be finite), `repeats` timed
    calls and one instrumented call, all under torch.no_grad(). Returns (warm-up s, [run s], ops s, total s)."""

    def forward(instrumented=False):
        ops.start(instrumented)
        t0 = time.perf_counter()
        out = forward_fn()
        return time.perf_counter() - t0, out

    with torch.no_grad():
        warm, out = forward()
        for x in (out if isinstance(out, tuple) else (out,)):
            if not torch.isfinite(x.float()).all():
                raise RuntimeError(f"{what} produced non-finite values")
        runs = [forward()[0] for _ in range(repeats)]
        total, _ = forward(instrumented=True)
    seconds = dict(ops.seconds)
    ops.start(False)
    return warm, runs, seconds, total


def case_result(block, dname, timing, groups, gflop):
    """Logs one (block, dtype) measurement and returns its entry of "results"."""
    warm, runs, ops, total = timing
    median = statistics.median(runs)
    log(f"  {block} {dname}: warm-up {warm:.3f} s, runs {', '.join(f'{r:.3f}' for r in runs)} s, "
        f"median {median:.3f} s; instrumented {total:.3f} s")
    for g in groups:
        if ops[g] > 0:
            log(f"      {g:<20} {ops[g] * 1e3:9.1f} ms  {100 * ops[g] / total:5.1f}%")
    return {"block": block, "dtype": dname, "median_s": median, "runs_s": runs, "ops_s": ops,
            "ops_total_s": total, "gflop": gflop}


def emit(args, attention_impl, env, shape, results, wall0):
    """Prints the one JSON object on stdout (the load average at the end added to env)."""
    env["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"total {time.perf_counter() - wall0:.1f} s")
    print(json.dumps({"torch_version": torch.__version__, "threads": args.threads,
                      "attention": "sdpa" if HAS_SDPA else "math", "attention_impl": attention_impl, "env": env,
                      "shape": shape, "results": results}))
