#!/usr/bin/python3
"""Writes PyTorch goldens for cubevec's operators into tests/data/goldens_*.safetensors.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_goldens.py [OUTPUT_DIR]

Every file holds, per case, the inputs `<case>.<input>` and the result(s) `<case>.expected`
(plus `<case>.mean` / `<case>.rstd` for layer norm; attention also has a bool `<case>.mask` and,
packed, int32 `<case>.cu_seqlens_q` / `.cu_seqlens_k`). The file's `__metadata__` maps each case name
to a JSON object with the op and its parameters; keys starting with "_" describe the file.

Numerics:
  * f32 cases: the inputs are f32; torch computes in float64 and the result is rounded to f32,
    so the expected values are (nearly) exact.
  * bf16 cases: the inputs are bf16; torch computes in f32 on the bf16 values and rounds the
    result to bf16 once, which is what ops/vector_ops.h says cubevec does.
  * bf16 attention: MindIE's attention_math path, which also rounds q*scale, the scores and the
    probabilities to bf16 (see attention_bf16_math).
Seeds are fixed, so the output is deterministic (same torch version, same bytes).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# The safetensors writer (torch 1.13 has no safetensors package), shared with make_flux_reference.py.
from safetensors_io import write_safetensors

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

BF16 = torch.bfloat16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")


class Golden:
    """One output file: cases with their tensors and JSON parameters."""

    def __init__(self, family, seed):
        self.family = family
        self.gen = torch.Generator().manual_seed(seed)
        self.tensors = {}
        self.meta = {
            "_generator": "tests/reference/make_goldens.py",
            "_torch_version": torch.__version__,
            "_seed": str(seed),
        }
        self.counts = {}

    # Random inputs, f32 (rounded to bf16 by the case when its dtype is bf16).
    def randn(self, shape, scale=1.0):
        return torch.randn(shape, generator=self.gen, dtype=torch.float64).float() * scale

    def uniform(self, shape, lo, hi):
        return (torch.rand(shape, generator=self.gen, dtype=torch.float64) * (hi - lo) + lo).float()

    def add(self, case, params, inputs, outputs):
        assert case not in self.meta, case
        for name, t in list(inputs.items()) + list(outputs.items()):
            key = f"{case}.{name}"
            assert key not in self.tensors, key
            self.tensors[key] = t
        self.meta[case] = json.dumps(params, separators=(",", ":"), sort_keys=True)
        self.counts[params["op"]] = self.counts.get(params["op"], 0) + 1

    def write(self):
        path = os.path.join(OUT_DIR, f"goldens_{self.family}.safetensors")
        write_safetensors(path, self.tensors, self.meta)
        size = os.path.getsize(path)
        counts = ", ".join(f"{op} {n}" for op, n in sorted(self.counts.items()))
        print(f"{os.path.relpath(path, ROOT)}: {size} bytes, {sum(self.counts.values())} cases ({counts})")
        return size


def stored(t, dtype):
    """The input as stored in the file: f32 as is, bf16 rounded by torch."""
    return t if dtype == "f32" else t.to(BF16)


def compute(fn, dtype, *inputs):
    """f32 case: compute in float64, round to f32. bf16 case: compute in f32 on the bf16 inputs,
    round to bf16 once. Non-tensor inputs (None) pass through. fn may return a tuple."""
    def prep(t):
        if t is None:
            return None
        return t.double() if dtype == "f32" else t.to(BF16).float()

    out = fn(*[prep(t) for t in inputs])
    outs = out if isinstance(out, tuple) else (out,)
    res = tuple(o.float() if dtype == "f32" else o.to(BF16) for o in outs)
    return res if isinstance(out, tuple) else res[0]


def f32_compute(fn, dtype, *inputs):
    """Like compute, but the result stays f32 (layer norm's mean and rstd)."""
    def prep(t):
        if t is None:
            return None
        return t.double() if dtype == "f32" else t.to(BF16).float()

    return fn(*[prep(t) for t in inputs]).float()


def transposed_view(x):
    """x given as its logical tensor; returns the physical (stored) tensor whose
    transpose(-2, -1) is x."""
    return x.transpose(-2, -1).contiguous()


# ---------------------------------------------------------------------------------------------
# GEMM: C = act(A B + bias); C = residual + gate * C. f32 only (ops/gemm.h takes f32).
# ---------------------------------------------------------------------------------------------
def gemm_epilogue(y, v, bias, residual, gate):
    """float64: act(y + bias), then residual + gate * y."""
    if bias is not None:
        y = y + bias.double()
    if v["activation"] == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif v["activation"] == "silu":
        y = F.silu(y)
    if residual is not None:
        y = residual.double() + (gate.double() if gate is not None else 1.0) * y
    return y


def make_gemm():
    g = Golden("gemm", 1001)
    variants = {
        "plain": dict(b_is_weight=False, bias=False, activation="none", residual=False, gate=False),
        "weight": dict(b_is_weight=True, bias=False, activation="none", residual=False, gate=False),
        "bias": dict(b_is_weight=True, bias=True, activation="none", residual=False, gate=False),
        "gelu": dict(b_is_weight=True, bias=True, activation="gelu_tanh", residual=False, gate=False),
        "silu": dict(b_is_weight=False, bias=True, activation="silu", residual=False, gate=False),
        "residual": dict(b_is_weight=True, bias=True, activation="none", residual=True, gate=False),
        "gated": dict(b_is_weight=True, bias=True, activation="gelu_tanh", residual=True, gate=True),
        "gated_silu_nobias": dict(b_is_weight=False, bias=False, activation="silu", residual=True, gate=True),
    }
    shapes = [
        ((1, 1, 1), list(variants)),
        ((7, 17, 5), list(variants)),
        ((17, 7, 129), list(variants)),
        ((1, 129, 17), list(variants)),
        ((3, 100, 1), ["plain", "weight", "gelu", "gated"]),
        ((33, 65, 129), ["plain", "weight", "gated"]),
        ((40, 24, 256), ["weight", "gated"]),
        ((2, 9, 1000), ["bias", "silu"]),
    ]
    for (m, n, k), names in shapes:
        for name in names:
            v = variants[name]
            a = g.randn((m, k))
            w = g.randn((n, k)) / math.sqrt(k) * 2  # keeps |C| around a few units
            bias = g.randn((n,)) if v["bias"] else None
            residual = g.randn((m, n)) if v["residual"] else None
            gate = g.randn((n,)) if v["gate"] else None

            def fn(a, w, bias, residual, gate, v=v):
                y = F.linear(a, w, bias) if v["b_is_weight"] else torch.matmul(a, w.t())
                if not v["b_is_weight"] and bias is not None:
                    y = y + bias
                if v["activation"] == "gelu_tanh":
                    y = F.gelu(y, approximate="tanh")
                elif v["activation"] == "silu":
                    y = F.silu(y)
                if residual is not None:
                    y = residual + (gate if gate is not None else 1.0) * y
                return y

            expected = compute(fn, "f32", a, w, bias, residual, gate)
            inputs = {"a": a, "b": w if v["b_is_weight"] else w.t().contiguous()}
            if bias is not None:
                inputs["bias"] = bias
            if residual is not None:
                inputs["residual"] = residual
            if gate is not None:
                inputs["gate"] = gate
            case = f"matmul_{name}_m{m}_n{n}_k{k}"
            params = dict(op="matmul", dtype="f32", m=m, n=n, k=k, **v)
            g.add(case, params, inputs, {"expected": expected})
    # bf16 GEMM: A and B stored as bf16, the products of the bf16 values summed (here in float64),
    # the epilogue (f32 bias, residual, gate) in f32 and an f32 result.
    for (m, n, k), names in [((1, 1, 1), ["plain", "gated"]), ((7, 17, 5), ["plain", "weight", "gelu"]),
                             ((17, 7, 129), ["weight", "silu", "gated"]), ((1, 129, 17), ["bias", "residual"]),
                             ((33, 65, 129), ["plain", "gated"]), ((5, 9, 1000), ["weight"])]:
        for name in names:
            v = variants[name]
            a = g.randn((m, k)).to(BF16)
            w = (g.randn((n, k)) / math.sqrt(k) * 2).to(BF16)
            bias = g.randn((n,)) if v["bias"] else None
            residual = g.randn((m, n)) if v["residual"] else None
            gate = g.randn((n,)) if v["gate"] else None
            y = gemm_epilogue(a.double() @ w.double().t(), v, bias, residual, gate)
            inputs = {"a": a, "b": w if v["b_is_weight"] else w.t().contiguous()}
            inputs.update({k_: t for k_, t in [("bias", bias), ("residual", residual), ("gate", gate)] if t is not None})
            g.add(f"matmul_bf16_{name}_m{m}_n{n}_k{k}", dict(op="matmul", dtype="bf16", m=m, n=n, k=k, **v), inputs,
                  {"expected": y.float()})
    # bmm: a [Bt, M, K], b [Bt, K, N] (or [Bt, N, K] as weights) or one shared b, epilogue per batch.
    for bt, m, n, k, shared, name, dt in [(3, 7, 17, 33, False, "plain", "f32"), (2, 5, 9, 129, True, "weight", "f32"),
                                          (3, 7, 17, 33, False, "gated", "f32"), (2, 1, 1, 1, True, "gated", "f32"),
                                          (4, 9, 13, 65, True, "bias", "f32"), (3, 7, 17, 33, False, "gated", "bf16"),
                                          (2, 5, 9, 129, True, "silu", "bf16")]:
        v = variants[name]
        a = g.randn((bt, m, k))
        w = g.randn(((n, k) if shared else (bt, n, k))) / math.sqrt(k) * 2
        if dt == "bf16":
            a, w = a.to(BF16), w.to(BF16)
        bias = g.randn((n,)) if v["bias"] else None
        residual = g.randn((bt, m, n)) if v["residual"] else None
        gate = g.randn((n,)) if v["gate"] else None
        y = gemm_epilogue(torch.matmul(a.double(), w.double().transpose(-1, -2)), v, bias, residual, gate)
        inputs = {"a": a, "b": w if v["b_is_weight"] else w.transpose(-1, -2).contiguous()}
        inputs.update({k_: t for k_, t in [("bias", bias), ("residual", residual), ("gate", gate)] if t is not None})
        g.add(f"bmm_{dt}_{name}_bt{bt}_m{m}_n{n}_k{k}" + ("_shared" if shared else ""),
              dict(op="bmm", dtype=dt, bt=bt, m=m, n=n, k=k, shared_b=shared, **v), inputs, {"expected": y.float()})
    # ops::linear: x [..., K] (3-D), weight [N, K], bias [N] or none.
    for shape, n, with_bias in [((2, 5, 33), 17, True), ((1, 7, 129), 65, False), ((3, 1, 1), 4, True)]:
        k = shape[-1]
        x = g.randn(shape)
        w = g.randn((n, k)) / math.sqrt(k) * 2
        bias = g.randn((n,)) if with_bias else None
        expected = compute(lambda x, w, b: F.linear(x, w, b), "f32", x, w, bias)
        inputs = {"x": x, "weight": w}
        if bias is not None:
            inputs["bias"] = bias
        case = "linear_" + "x".join(map(str, shape)) + f"_n{n}" + ("_bias" if with_bias else "")
        g.add(case, dict(op="linear", dtype="f32", k=k, bias=with_bias), inputs, {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# Norms: rms_norm, fast_layernorm (out, mean, rstd), layernorm_scale_shift (AdaLN).
# ---------------------------------------------------------------------------------------------
def rms_ref(x, w, eps):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def make_norms():
    g = Golden("norms", 2002)
    # rms_norm: (shape, weight, eps, dtype, x scale, view)
    rms_cases = [
        ((1,), True, 1e-6, "f32", 1.0, None),
        ((3, 5, 1), True, 1e-6, "f32", 1.0, None),
        ((3, 5, 7), True, 1e-6, "f32", 1.0, None),
        ((2, 17), False, 1e-5, "f32", 1.0, None),
        ((4, 129), True, 1e-6, "f32", 1.0, None),
        ((2, 3, 256), True, 1e-6, "f32", 100.0, None),
        ((5, 64), False, 1e-6, "f32", 1e-3, None),
        ((6, 129), True, 1e-6, "f32", 1.0, "transpose_last2"),
        ((3, 5, 17), True, 1e-6, "bf16", 1.0, None),
        ((4, 129), True, 1e-6, "bf16", 1.0, None),
        ((2, 64), False, 1e-5, "bf16", 1.0, None),
        ((7, 33), True, 1e-6, "bf16", 1.0, "transpose_last2"),
    ]
    for shape, has_w, eps, dt, scale, view in rms_cases:
        x = g.randn(shape, scale)
        w = g.uniform((shape[-1],), 0.5, 1.5) if has_w else None
        expected = compute(lambda x, w: rms_ref(x, w, eps), dt, x, w)
        xs = stored(x, dt)
        inputs = {"x": transposed_view(xs) if view else xs}
        if has_w:
            inputs["weight"] = stored(w, dt)
        case = f"rms_norm_{dt}_" + "x".join(map(str, shape)) + ("_w" if has_w else "") + (f"_eps{eps:g}") + (
            f"_s{scale:g}" if scale != 1.0 else "") + ("_T" if view else "")
        params = dict(op="rms_norm", dtype=dt, eps=eps, weight=has_w)
        if view:
            params["view"] = view
        g.add(case, params, inputs, {"expected": expected})

    # fast_layernorm: (shape, affine, eps, dtype)
    ln_cases = [
        ((1, 1, 1), True, 1e-5, "f32"),
        ((2, 3, 7), True, 1e-5, "f32"),
        ((2, 5, 129), False, 1e-5, "f32"),
        ((1, 17, 64), True, 1e-6, "f32"),
        ((4, 17), True, 1e-5, "f32"),
        ((2, 3, 17), True, 1e-5, "bf16"),
        ((1, 7, 129), False, 1e-6, "bf16"),
        ((2, 4, 64), True, 1e-5, "bf16"),
    ]
    for shape, affine, eps, dt in ln_cases:
        x = g.randn(shape) * 2 + 0.5
        h = shape[-1]
        w = g.uniform((h,), 0.5, 1.5) if affine else None
        b = g.randn((h,)) * 0.5 if affine else None
        out = compute(lambda x, w, b: F.layer_norm(x, (h,), w, b, eps), dt, x, w, b)
        mean = f32_compute(lambda x: x.mean(-1), dt, x)
        rstd = f32_compute(lambda x: torch.rsqrt(x.var(-1, unbiased=False) + eps), dt, x)
        inputs = {"x": stored(x, dt)}
        if affine:
            inputs["weight"] = stored(w, dt)
            inputs["bias"] = stored(b, dt)
        case = f"layer_norm_{dt}_" + "x".join(map(str, shape)) + ("_affine" if affine else "") + f"_eps{eps:g}"
        g.add(case, dict(op="layer_norm", dtype=dt, eps=eps, affine=affine), inputs,
              {"expected": out, "mean": mean, "rstd": rstd})

    # layernorm_scale_shift: out = LN(x) * (1 + scale) + shift; (B, S, H, scale shape kind, affine, dtype)
    ada_cases = [
        (2, 7, 17, "BH", False, "f32"),
        (2, 7, 17, "B1H", True, "f32"),
        (2, 7, 17, "BSH", False, "f32"),
        (1, 5, 129, "BH", True, "f32"),
        (1, 5, 129, "BSH", True, "f32"),
        (3, 1, 64, "B1H", False, "f32"),
        (1, 1, 1, "BH", True, "f32"),
        (2, 7, 17, "BH", False, "bf16"),
        (1, 5, 129, "B1H", True, "bf16"),
        (2, 3, 64, "BSH", True, "bf16"),
    ]
    eps = 1e-6
    for bsz, s, h, kind, affine, dt in ada_cases:
        x = g.randn((bsz, s, h)) * 2 - 0.3
        sshape = {"BH": (bsz, h), "B1H": (bsz, 1, h), "BSH": (bsz, s, h)}[kind]
        scale = g.randn(sshape) * 0.5
        shift = g.randn(sshape) * 0.5
        w = g.uniform((h,), 0.5, 1.5) if affine else None
        b = g.randn((h,)) * 0.5 if affine else None

        def fn(x, scale, shift, w, b, kind=kind, h=h):
            if kind == "BH":
                scale, shift = scale[:, None, :], shift[:, None, :]
            return F.layer_norm(x, (h,), w, b, eps) * (1 + scale) + shift

        expected = compute(fn, dt, x, scale, shift, w, b)
        inputs = {"x": stored(x, dt), "scale": stored(scale, dt), "shift": stored(shift, dt)}
        if affine:
            inputs["weight"] = stored(w, dt)
            inputs["bias"] = stored(b, dt)
        case = f"adaln_{dt}_{bsz}x{s}x{h}_{kind}" + ("_affine" if affine else "")
        g.add(case, dict(op="layernorm_scale_shift", dtype=dt, eps=eps, affine=affine, scale_shape=kind), inputs,
              {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# RoPE: out = x * cos + rot(x) * sin, in the layouts BSND, BNSD, SBND.
# ---------------------------------------------------------------------------------------------
def rotate(x, mode):
    d = x.shape[-1]
    if mode == "rotated_half":
        return torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def make_rope():
    g = Golden("rope", 3003)
    # (B, S, N, D, mode, layout, cos dims, dtype, cos kind)
    cases = []
    shapes = [(2, 7, 3, 16), (1, 17, 2, 64), (3, 5, 1, 130), (2, 1, 4, 2), (1, 9, 5, 34), (2, 4, 3, 8)]
    i = 0
    for mode in ["rotated_half", "rotated_interleaved"]:
        for layout in ["BSND", "BNSD", "SBND"]:
            for cdims in [2, 4]:
                cases.append((*shapes[i % len(shapes)], mode, layout, cdims, "f32", "freq"))
                i += 1
    for mode in ["rotated_half", "rotated_interleaved"]:
        for layout, cdims in [("BSND", 2), ("BNSD", 4), ("SBND", 4)]:
            cases.append((*shapes[i % len(shapes)], mode, layout, cdims, "bf16", "freq"))
            i += 1
    # cos/sin are full-width: arbitrary values (not duplicated per pair) must work too.
    cases.append((2, 7, 3, 16, "rotated_half", "BSND", 2, "f32", "random"))
    cases.append((1, 5, 2, 12, "rotated_interleaved", "BNSD", 4, "f32", "random"))
    cases.append((2, 3, 2, 10, "rotated_interleaved", "SBND", 2, "bf16", "random"))

    for bsz, s, n, d, mode, layout, cdims, dt, ckind in cases:
        if ckind == "freq":
            inv = 1.0 / (10000.0 ** (torch.arange(0, d // 2, dtype=torch.float64) * 2 / d))
            freqs = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]  # [S, D/2]
            if mode == "rotated_half":
                freqs = torch.cat([freqs, freqs], dim=-1)
            else:
                freqs = freqs.repeat_interleave(2, dim=-1)
            cos, sin = freqs.cos().float(), freqs.sin().float()
        else:
            cos, sin = g.uniform((s, d), -1, 1), g.uniform((s, d), -1, 1)
        xshape = {"BSND": (bsz, s, n, d), "BNSD": (bsz, n, s, d), "SBND": (s, bsz, n, d)}[layout]
        cshape4 = {"BSND": (1, s, 1, d), "BNSD": (1, 1, s, d), "SBND": (s, 1, 1, d)}[layout]
        x = g.randn(xshape)

        def fn(x, cos, sin, mode=mode, cshape4=cshape4):
            c, sn = cos.reshape(cshape4), sin.reshape(cshape4)
            return x * c + rotate(x, mode) * sn

        expected = compute(fn, dt, x, cos, sin)
        if cdims == 4:
            cos, sin = cos.reshape(cshape4), sin.reshape(cshape4)
        case = f"rope_{dt}_{mode.split('_')[1]}_{layout}_cs{cdims}d_" + "x".join(map(str, xshape)) + (
            "_randomcs" if ckind == "random" else "")
        g.add(case, dict(op="rope", dtype=dt, mode=mode, layout=layout, cos_dims=cdims, cos_kind=ckind),
              {"x": stored(x, dt), "cos": stored(cos, dt), "sin": stored(sin, dt)}, {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------
def gelu_fast(x):
    return x / (1 + torch.exp(-1.702 * x.abs())) * torch.exp(0.851 * (x - x.abs()))


ACTIVATIONS = {
    # kind: (name passed to get_activation_layer, torch function)
    "relu": ("relu", F.relu),
    "silu": ("silu", F.silu),
    "swish": ("Swish", F.silu),
    "mish": ("mish", F.mish),
    "gelu": ("gelu", F.gelu),
    "gelu_tanh": ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh")),
    "gelu_fast": ("GELU-fast", gelu_fast),
}


def make_activations():
    g = Golden("activations", 4004)
    specials = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 88.0, -88.0, 100.0, -100.0, 0.5, -0.5, 3.0, -3.0])
    layouts = [((1,), "f32", None), ((7,), "f32", None), ((17, 129), "f32", None), ((3, 7, 17), "f32", None),
               ((5, 33), "f32", "transpose_last2"), ((2, 14), "f32", "specials"),
               ((17, 129), "bf16", None), ((7,), "bf16", None), ((2, 14), "bf16", "specials"),
               ((9, 13), "bf16", "transpose_last2")]
    for kind, (name, fn) in ACTIVATIONS.items():
        if kind == "swish":  # only the name differs: two cases
            layouts_k = [layouts[2], layouts[6]]
        else:
            layouts_k = layouts
        for shape, dt, extra in layouts_k:
            if extra == "specials":
                x = torch.cat([specials, g.randn((shape[0] * shape[1] - specials.numel(),), 4.0)]).reshape(shape)
            else:
                x = g.randn(shape, 4.0)
            expected = compute(fn, dt, x)
            xs = stored(x, dt)
            params = dict(op="activation", dtype=dt, kind=kind, name=name)
            if extra == "transpose_last2":
                xs = transposed_view(xs)
                params["view"] = extra
            case = f"act_{kind}_{dt}_" + "x".join(map(str, shape)) + (
                "_T" if extra == "transpose_last2" else "_specials" if extra == "specials" else "")
            g.add(case, params, {"x": xs}, {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# Softmax over the last dim
# ---------------------------------------------------------------------------------------------
def make_softmax():
    g = Golden("softmax", 5005)
    cases = [((1, 1), "f32", 1.0, None), ((1,), "f32", 1.0, None), ((5, 33), "f32", 3.0, None),
             ((3, 7, 129), "f32", 3.0, None), ((2, 1000), "f32", 5.0, None), ((4, 17), "f32", 50.0, None),
             ((3, 16), "f32", 3.0, "masked"), ((6, 40), "f32", 3.0, "transpose_last2"),
             ((5, 33), "bf16", 3.0, None), ((3, 7, 129), "bf16", 3.0, None), ((4, 17), "bf16", 50.0, None),
             ((3, 16), "bf16", 3.0, "masked"), ((6, 40), "bf16", 3.0, "transpose_last2")]
    for shape, dt, scale, extra in cases:
        x = g.randn(shape, scale) + 1000.0 * (scale == 50.0)  # a large offset: needs the max shift
        if extra == "masked":
            mask = torch.rand(shape, generator=g.gen) < 0.4
            mask[..., 0] = False  # every row keeps at least one finite entry
            x = x.masked_fill(mask, float("-inf"))
        expected = compute(lambda x: torch.softmax(x, dim=-1), dt, x)
        xs = stored(x, dt)
        params = dict(op="softmax", dtype=dt)
        if extra == "transpose_last2":
            xs = transposed_view(xs)
            params["view"] = extra
        case = f"softmax_{dt}_" + "x".join(map(str, shape)) + (f"_s{scale:g}" if scale != 3.0 else "") + (
            f"_{extra}" if extra == "masked" else "_T" if extra else "")
        g.add(case, params, {"x": xs}, {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# GroupNorm
# ---------------------------------------------------------------------------------------------
def make_group_norm():
    g = Golden("group_norm", 6006)
    cases = [((2, 6, 5), 3, True, 1e-5, "f32"), ((1, 4, 7, 9), 2, True, 1e-5, "f32"),
             ((3, 32, 4, 4), 8, False, 1e-5, "f32"), ((2, 5, 17), 5, True, 1e-6, "f32"),
             ((2, 6, 3, 5), 1, True, 1e-5, "f32"), ((1, 8), 4, True, 1e-5, "f32"),
             ((1, 16, 2, 3, 5), 4, True, 1e-5, "f32"),
             ((2, 6, 5), 3, True, 1e-5, "bf16"), ((1, 32, 4, 4), 8, False, 1e-5, "bf16"),
             ((2, 4, 33), 2, True, 1e-6, "bf16")]
    for shape, groups, affine, eps, dt in cases:
        c = shape[1]
        x = g.randn(shape) * 2 + 0.7
        w = g.uniform((c,), 0.5, 1.5) if affine else None
        b = g.randn((c,)) * 0.5 if affine else None
        expected = compute(lambda x, w, b: F.group_norm(x, groups, w, b, eps), dt, x, w, b)
        inputs = {"x": stored(x, dt)}
        if affine:
            inputs["weight"] = stored(w, dt)
            inputs["bias"] = stored(b, dt)
        case = f"group_norm_{dt}_" + "x".join(map(str, shape)) + f"_g{groups}" + ("_affine" if affine else "") + \
            f"_eps{eps:g}"
        g.add(case, dict(op="group_norm", dtype=dt, groups=groups, eps=eps, affine=affine), inputs,
              {"expected": expected})
    return g.write()


# ---------------------------------------------------------------------------------------------
# Elementwise: add/sub/mul/div with broadcasting, muls_add, casts
# ---------------------------------------------------------------------------------------------
def make_elementwise():
    g = Golden("elementwise", 7007)
    pairs = [((7, 17), (7, 17)), ((7, 17), (17,)), ((3, 1, 5), (1, 4, 1)), ((1,), (129,)), ((5, 1), (1, 7)),
             ((2, 3, 4, 5), (3, 1, 5)), ((17,), (1,)), ((1, 1), (1, 1))]
    fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}

    def operand_b(op, shape):
        if op == "div":  # keep the divisor away from zero
            mag = g.uniform(shape, 0.5, 2.0)
            sign = torch.where(torch.rand(shape, generator=g.gen) < 0.5, -1.0, 1.0).float()
            return mag * sign
        return g.randn(shape, 2.0)

    for op, fn in fns.items():
        for sa, sb in pairs:
            for dt in (["f32", "bf16"] if sa in [(7, 17), (3, 1, 5)] and sb != (7, 17) else ["f32"]):
                a, b = g.randn(sa, 2.0), operand_b(op, sb)
                expected = compute(fn, dt, a, b)
                case = f"{op}_{dt}_" + "x".join(map(str, sa)) + "_" + "x".join(map(str, sb))
                g.add(case, dict(op=op, dtype=dt), {"a": stored(a, dt), "b": stored(b, dt)}, {"expected": expected})
        # a strided a: physical [17, 7] viewed as [7, 17], b [17]
        for dt in ["f32", "bf16"]:
            a, b = g.randn((7, 17), 2.0), operand_b(op, (17,))
            expected = compute(fn, dt, a, b)
            g.add(f"{op}_{dt}_7x17_17_T", dict(op=op, dtype=dt, view="transpose_last2"),
                  {"a": transposed_view(stored(a, dt)), "b": stored(b, dt)}, {"expected": expected})

    for shape, scale, dt in [((7, 17), 0.5, "f32"), ((2, 3, 129), -1.25, "f32"), ((1,), 3.0, "f32"),
                             ((4, 33), 0.0, "f32"), ((7, 17), 0.5, "bf16"), ((2, 3, 129), -1.25, "bf16")]:
        x, y = g.randn(shape, 2.0), g.randn(shape, 2.0)
        expected = compute(lambda x, y: x * scale + y, dt, x, y)
        case = f"muls_add_{dt}_" + "x".join(map(str, shape)) + f"_s{scale:g}"
        g.add(case, dict(op="muls_add", dtype=dt, scale=scale), {"x": stored(x, dt), "y": stored(y, dt)},
              {"expected": expected})

    # Casts (round to nearest even), exact: corner values, then random ones.
    one = 1.0
    corners = torch.tensor([
        0.0, -0.0, one, -one, one + 2 ** -8, one + 3 * 2 ** -8, one + 2 ** -8 + 2 ** -20, -(one + 2 ** -8),
        one + 2 ** -11, one + 3 * 2 ** -11, 65504.0, 65519.0, 65520.0, -65520.0, 6e-5, 6e-8, 3e-8, 1e-7,
        3.3895e38, 3.4e38, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1.17549435e-38, 9.2e-41,
        2.5, 3.5, 1e-3, 123.456, -7.875,
    ], dtype=torch.float32)
    rnd = torch.cat([corners, g.randn((129 * 7 - corners.numel(),), 10.0)]).reshape(7, 129)
    for src, dst in [("f32", "bf16"), ("f32", "f16"), ("bf16", "f32"), ("f16", "f32"), ("bf16", "f16"),
                     ("f16", "bf16")]:
        tdt = {"f32": torch.float32, "bf16": BF16, "f16": torch.float16}
        x = rnd.to(tdt[src])
        expected = x.to(tdt[dst])
        g.add(f"cast_{src}_to_{dst}_7x129", dict(op="cast", dtype=src, to=dst), {"x": x}, {"expected": expected})
    # strided input
    x = g.randn((5, 33), 10.0)
    g.add("cast_f32_to_bf16_5x33_T", dict(op="cast", dtype="f32", to="bf16", view="transpose_last2"),
          {"x": transposed_view(x)}, {"expected": x.to(BF16)})
    return g.write()


# ---------------------------------------------------------------------------------------------
# Attention (ops/attention.h, MindIE SD's attention_forward / attention_forward_varlen):
#   out = softmax(scale * q k^T + bias) v, bias 0 where the bool mask is true, -inf where false.
# ---------------------------------------------------------------------------------------------
def to_bnsd(x, layout, n):
    """The stored q/k/v/out in `layout` -> [B, N, S, D]."""
    if layout == "BNSD":
        return x
    if layout == "BSH":
        b, s, h = x.shape
        x = x.reshape(b, s, n, h // n)
    return x.transpose(1, 2)


def from_bnsd(x, layout):
    """[B, N, S, D] -> the layout's stored form (BSH: [B, S, N*D], channel = head * D + d)."""
    if layout == "BNSD":
        return x.contiguous()
    x = x.transpose(1, 2).contiguous()
    return x.reshape(x.shape[0], x.shape[1], -1) if layout == "BSH" else x


def attention_bias(mask, dtype):
    """0 where the mask is true, -inf where false (None: no bias)."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


def attention_f32(q, k, v, mask, scale):
    """f32 case, [B, N, S, D]: everything in float64 on the f32 inputs, rounded to f32 once."""
    s = scale * torch.matmul(q.double(), k.double().transpose(-2, -1))
    if mask is not None:
        s = s + attention_bias(mask, torch.float64)
    return torch.matmul(torch.softmax(s, dim=-1), v.double()).float()


def attention_bf16_math(q, k, v, mask, scale):
    """bf16 case, [B, N, S, D]: MindIE's attention_math in bf16 -- q * scale (an f32 product rounded
    to bf16), scores = (q*scale) k^T rounded to bf16, cast to f32, + bias, softmax in f32 (computed
    in float64 and rounded to f32, so the result does not depend on torch's vectorized exp), rounded
    to bf16, then P v rounded to bf16. The two matmuls sum exactly (float64) and round once, as an
    f32-accumulating bf16 matmul does up to its summation order."""
    qs = (q.float() * torch.tensor(scale, dtype=torch.float32)).to(BF16)
    scores = torch.matmul(qs.double(), k.double().transpose(-2, -1)).float().to(BF16).float()
    if mask is not None:
        scores = scores + attention_bias(mask, torch.float32)
    p = torch.softmax(scores.double(), dim=-1).float().to(BF16)
    return torch.matmul(p.double(), v.double()).float().to(BF16)


def attention_mask(g, shape, keep=0.7):
    """A random bool mask (True = attend) with at least one true entry in every row."""
    mask = torch.rand(shape, generator=g.gen, dtype=torch.float64) < keep
    sk = shape[-1]
    rows = mask.reshape(-1, sk)
    pick = torch.randint(0, sk, (rows.shape[0],), generator=g.gen)
    rows[torch.arange(rows.shape[0]), pick] = True
    return rows.reshape(shape)


def make_attention():
    g = Golden("attention", 8008)
    # (dtype, layout, B, N, Sq, Sk, D, mask shape kind, scale or None, extra)
    #   mask kinds: "none", "2d" [Sq, Sk], "4d" [B, N, Sq, Sk], "4d_b1" [B, 1, Sq, Sk],
    #   "4d_1n" [1, N, Sq, Sk], "4d_11" [1, 1, Sq, Sk]; extra "masked_row": a row masked everywhere
    #   (its output is NaN).
    cases = [
        ("f32", "BSND", 2, 3, 1, 1, 8, "none", None, None),
        ("f32", "BNSD", 2, 3, 7, 7, 40, "2d", None, None),
        ("f32", "BSH", 2, 3, 7, 7, 24, "4d", None, None),
        ("f32", "BNSD", 2, 3, 33, 33, 8, "4d_b1", None, None),
        ("f32", "BSND", 1, 1, 130, 130, 8, "2d", None, None),
        ("f32", "BSH", 2, 3, 37, 11, 8, "4d", None, None),
        ("f32", "BSND", 2, 2, 5, 70, 8, "2d", None, None),
        ("f32", "BSND", 1, 2, 7, 9, 64, "none", 0.3, None),
        ("f32", "BNSD", 1, 2, 9, 13, 72, "4d_1n", None, None),
        ("f32", "BSH", 2, 1, 3, 9, 80, "2d", None, None),
        ("f32", "BSND", 1, 1, 4, 9, 128, "none", None, None),
        ("f32", "BNSD", 2, 3, 7, 9, 8, "2d", None, "masked_row"),
        ("f32", "BSH", 2, 3, 6, 6, 8, "4d", None, "masked_row"),
        ("f32", "BSND", 2, 3, 7, 13, 24, "none", 1.5, None),
        ("f32", "BNSD", 2, 3, 5, 5, 8, "4d_11", None, None),
        ("f32", "BNSD", 2, 2, 1, 33, 17, "none", None, None),
        ("f32", "BSH", 1, 2, 17, 17, 17, "4d_b1", 0.25, None),
        ("bf16", "BSND", 2, 3, 7, 7, 40, "2d", None, None),
        ("bf16", "BNSD", 2, 3, 37, 11, 8, "4d_b1", None, None),
        ("bf16", "BSH", 1, 2, 17, 17, 64, "none", None, None),
        ("bf16", "BSND", 2, 2, 5, 70, 17, "4d", 0.5, None),
        ("bf16", "BNSD", 1, 2, 4, 6, 8, "2d", None, "masked_row"),
        ("bf16", "BSND", 1, 1, 3, 33, 128, "none", None, None),
    ]
    for dt, layout, bsz, n, sq, sk, d, mkind, scale, extra in cases:
        q = g.randn((bsz, n, sq, d))
        k = g.randn((bsz, n, sk, d))
        v = g.randn((bsz, n, sk, d))
        mshape = {"none": None, "2d": (sq, sk), "4d": (bsz, n, sq, sk), "4d_b1": (bsz, 1, sq, sk),
                  "4d_1n": (1, n, sq, sk), "4d_11": (1, 1, sq, sk)}[mkind]
        mask = attention_mask(g, mshape) if mshape else None
        if extra == "masked_row":
            if mkind == "2d":
                mask[sq // 2, :] = False  # every batch and head
            else:
                mask[-1, -1, 0, :] = False  # one (batch, head) only
        eff_scale = scale if scale is not None else d ** -0.5
        if dt == "f32":
            expected = attention_f32(q, k, v, mask, eff_scale)
        else:
            q, k, v = q.to(BF16), k.to(BF16), v.to(BF16)
            expected = attention_bf16_math(q, k, v, mask, eff_scale)
        if extra == "masked_row":
            assert torch.isnan(expected.float()).any() and not torch.isnan(expected.float()).all()
        else:
            assert not torch.isnan(expected.float()).any()
        inputs = {"q": from_bnsd(q, layout), "k": from_bnsd(k, layout), "v": from_bnsd(v, layout)}
        if mask is not None:
            inputs["mask"] = mask.contiguous()
        params = dict(op="attention", dtype=dt, layout=layout, num_heads=n, batch=bsz, seq_q=sq, seq_k=sk,
                      head_dim=d, mask="none" if mkind == "none" else mkind[:2])
        if mask is not None:
            params["mask_shape"] = list(mask.shape)
        if scale is not None:
            params["scale"] = scale
        if extra:
            params["masked_row"] = True
        case = f"attention_{dt}_{layout}_b{bsz}n{n}_sq{sq}_sk{sk}_d{d}_mask{mkind}" + (
            f"_s{scale:g}" if scale is not None else "") + (f"_{extra}" if extra else "")
        g.add(case, params, inputs, {"expected": from_bnsd(expected, layout)})

    # attention_forward_varlen: packed q [Tq, N, D], k, v [Tk, N, D], cu_seqlens int32 [B + 1].
    # causal is bottom-right aligned: query i of a sequence attends key j iff j <= i + (Sk - Sq).
    # (N, D, q lengths, k lengths, causal, scale or None)
    varlen = [
        (2, 24, [1, 7, 0, 13], [1, 11, 0, 5], False, None),  # lengths 1, unequal, an empty sequence
        (3, 17, [3, 0, 2], [4, 5, 1], False, 0.5),           # a sequence with keys but no queries
        (1, 80, [9], [14], False, None),                     # one sequence
        (3, 17, [1, 6, 0, 5, 1], [1, 6, 3, 12, 9], True, None),
        (2, 8, [70, 3], [70, 20], True, 0.5),                # crosses 64-row tiles
        (2, 24, [12, 1, 4], [12, 1, 4], True, None),         # Sq == Sk: the usual causal mask
    ]
    for n, d, lq, lk, causal, scale in varlen:
        assert len(lq) == len(lk)
        assert all(b > 0 or a == 0 for a, b in zip(lq, lk)), "a query row with no key would be NaN"
        tq, tk = sum(lq), sum(lk)
        q, k, v = g.randn((tq, n, d)), g.randn((tk, n, d)), g.randn((tk, n, d))
        cu_q = torch.tensor([0] + np.cumsum(lq).tolist(), dtype=torch.int32)
        cu_k = torch.tensor([0] + np.cumsum(lk).tolist(), dtype=torch.int32)
        eff_scale = scale if scale is not None else d ** -0.5
        out = torch.zeros((tq, n, d), dtype=torch.float64)
        for b in range(len(lq)):
            q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
            if q1 == q0:
                continue
            qb = q[q0:q1].double().transpose(0, 1)  # [N, Sq, D]
            kb, vb = k[k0:k1].double().transpose(0, 1), v[k0:k1].double().transpose(0, 1)
            s = eff_scale * torch.matmul(qb, kb.transpose(-2, -1))  # [N, Sq, Sk]
            if causal:
                i = torch.arange(q1 - q0)[:, None]
                j = torch.arange(k1 - k0)[None, :]
                s = s.masked_fill(j > i + ((k1 - k0) - (q1 - q0)), float("-inf"))
            out[q0:q1] = torch.matmul(torch.softmax(s, dim=-1), vb).transpose(0, 1)
        expected = out.float()
        assert not torch.isnan(expected).any()
        params = dict(op="attention_varlen", dtype="f32", causal=causal, num_heads=n, head_dim=d,
                      seqlens_q=lq, seqlens_k=lk)
        if scale is not None:
            params["scale"] = scale
        case = f"attention_varlen_f32_n{n}_d{d}_q{'-'.join(map(str, lq))}_k{'-'.join(map(str, lk))}" + (
            "_causal" if causal else "") + (f"_s{scale:g}" if scale is not None else "")
        g.add(case, params, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
              {"expected": expected})
    return g.write()


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for make in [make_gemm, make_norms, make_rope, make_activations, make_softmax, make_group_norm,
                 make_elementwise, make_attention]:
        total += make()
    print(f"total: {total} bytes (torch {torch.__version__})")


if __name__ == "__main__":
    main()
