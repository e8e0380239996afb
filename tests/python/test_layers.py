"""MindIE SD's layer API on NumPy arrays (issue 38, Deliver 2): every operator against a float64 NumPy
reference written here (tolerances stated per dtype), every layout and head_first form, masks,
varlen with causal, rf_v2 and ada_bsa against `cubevec sparse-attention` (the C++ op through the
CLI) on the same inputs, RoPE in both modes, __dlpack__ inputs, strided views, threads, Ctrl-C, and
a named exception for every kind of bad argument."""

import math
import os
import signal
import subprocess
import threading

import numpy as np
import pytest

import cubevec
from safetensors_files import read_safetensors, write_safetensors

SOURCE = os.environ.get("CUBEVEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("CUBEVEC_BINARY", os.path.join(SOURCE, "build", "cubevec"))

# Largest absolute error allowed, by input dtype (f32 sums in a different order; f16 and bf16 carry
# their 11 and 8 significant bits through one rounding of the inputs and one of the result).
TOL = {"f32": 2e-5, "f16": 4e-3, "bf16": 4e-2}


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, seed=0, dtype=np.float32):
    return rng(seed).standard_normal(shape).astype(dtype)


# --- references in float64 ------------------------------------------------------------------------


def attention_ref(q, k, v, mask=None, scale=None, head_first=False):
    """softmax(scale q k^T + bias) v per batch and head, float64; q, k, v in BSND (or BNSD)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    if not head_first:
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(0, 1, 3, 2)
    if mask is not None:
        m = np.asarray(mask)
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        out = (p / p.sum(-1, keepdims=True)) @ v
    return out if head_first else out.transpose(0, 2, 1, 3)


def rope_ref(x, cos, sin, mode, layout):
    """x cos + rot(x) sin in float64, cos/sin [S, D] broadcast along the layout's S dim."""
    x = np.asarray(x, np.float64)
    c, s = np.asarray(cos, np.float64).reshape(-1, x.shape[-1]), np.asarray(sin, np.float64).reshape(-1, x.shape[-1])
    shape = {"BSND": (1, -1, 1, x.shape[-1]), "BNSD": (1, 1, -1, x.shape[-1]), "SBND": (-1, 1, 1, x.shape[-1])}[layout]
    c, s = c.reshape(shape), s.reshape(shape)
    if mode == "rotated_half":
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    else:
        rot = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * c + rot * s


def layer_norm_ref(x, weight, bias, eps, axes=1):
    x = np.asarray(x, np.float64)
    flat = x.reshape(x.shape[:x.ndim - axes] + (-1,))
    mean = flat.mean(-1, keepdims=True)
    out = (flat - mean) / np.sqrt(((flat - mean) ** 2).mean(-1, keepdims=True) + eps)
    if weight is not None:
        out = out * np.asarray(weight, np.float64).reshape(-1)
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(-1)
    return out.reshape(x.shape)


ERF = np.vectorize(math.erf)
ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "gelu": lambda x: 0.5 * x * (1 + ERF(x / math.sqrt(2))),
    "gelu-tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "gelu-fast": lambda x: x / (1 + np.exp(-1.702 * np.abs(x))) * np.exp(0.851 * (x - np.abs(x))),
}


def close(out, ref, tol):
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape
    err = np.nanmax(np.abs(out - ref))
    assert err <= tol, f"max error {err} > {tol}"
    assert np.array_equal(np.isnan(out), np.isnan(ref))


# --- attention ------------------------------------------------------------------------------------


def qkv(b=2, sq=40, sk=33, n=3, d=16, head_first=False, dtype=np.float32, seed=0):
    shape = (lambda s: (b, n, s, d)) if head_first else (lambda s: (b, s, n, d))
    return randn(shape(sq), seed, dtype), randn(shape(sk), seed + 1, dtype), randn(shape(sk), seed + 2, dtype)


@pytest.mark.parametrize("head_first", [False, True])
@pytest.mark.parametrize("mode", [dict(), dict(opt_mode="static"), dict(fused=False)]
                         + [dict(opt_mode="manual", op_type=t, layout=l)
                            for t in ("fused_attn_score", "prompt_flash_attn", "ascend_laser_attention", "math", "flash", "cv_pipelined")
                            for l in ("BNSD", "BSND", "BSH")])
def test_attention_every_mode_and_layout(head_first, mode):
    q, k, v = qkv(head_first=head_first)
    out = cubevec.attention_forward(q, k, v, head_first=head_first, **mode)
    assert out.dtype == np.float32 and out.shape == q.shape
    close(out, attention_ref(q, k, v, head_first=head_first), TOL["f32"])


def test_attention_masks_and_scale():
    q, k, v = qkv()
    r = rng(3)
    bool_mask = r.random((40, 33)) < 0.7
    bool_mask[:, 0] = True
    close(cubevec.attention_forward(q, k, v, attn_mask=bool_mask, scale=0.3), attention_ref(q, k, v, bool_mask, 0.3), TOL["f32"])
    per_head = r.random((2, 3, 40, 33)) < 0.5
    per_head[..., 1] = True
    close(cubevec.attention_forward(q, k, v, attn_mask=per_head), attention_ref(q, k, v, per_head), TOL["f32"])
    broadcast = r.random((1, 3, 1, 33)) < 0.5
    broadcast[..., 2] = True
    close(cubevec.attention_forward(q, k, v, attn_mask=broadcast, fused=False), attention_ref(q, k, v, broadcast), TOL["f32"])
    bias = r.standard_normal((40, 33)).astype(np.float32)
    close(cubevec.attention_forward(q, k, v, attn_mask=bias), attention_ref(q, k, v, bias), TOL["f32"])
    # A row that may attend to nothing has no softmax: NaN, as MindIE's math path.
    none_row = np.ones((40, 33), bool)
    none_row[5] = False
    out = cubevec.attention_forward(q, k, v, attn_mask=none_row, fused=False)
    assert np.isnan(out[:, 5]).all() and not np.isnan(np.delete(out, 5, axis=1)).any()


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_attention_half_inputs_and_bf16_compute(kind):
    q, k, v = qkv()
    ref = attention_ref(q, k, v)
    if kind == "f16":
        out = cubevec.attention_forward(*(a.astype(np.float16) for a in (q, k, v)))
        assert out.dtype == np.float16
        close(out, attention_ref(*(a.astype(np.float16) for a in (q, k, v))), TOL["f16"])
    else:
        out = cubevec.attention_forward(q, k, v, dtype="bf16")
        assert out.dtype == np.float32
        close(out, ref, TOL["bf16"])
        assert np.abs(out - ref).max() > 1e-5  # really computed in bf16


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = qkv()
    out = cubevec.attention_forward(*(a.astype(ml_dtypes.bfloat16) for a in (q, k, v)))
    assert out.dtype == ml_dtypes.bfloat16
    close(out.astype(np.float32), attention_ref(q, k, v), TOL["bf16"])


class DlpackOnly:
    """An array known only through the DLPack protocol (as a torch tensor or a JAX array is)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_inputs_strided_views_and_negative_strides():
    q, k, v = qkv()
    ref = attention_ref(q, k, v)
    close(cubevec.attention_forward(DlpackOnly(q), DlpackOnly(k), DlpackOnly(v)), ref, TOL["f32"])
    # A BNSD array seen through a transpose is a non-contiguous BSND one; reversed along S it has
    # negative strides. Both are copied to a contiguous array and give the same answer.
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not qt.flags.c_contiguous
    close(cubevec.attention_forward(qt, k, v), ref, TOL["f32"])
    reversed_q = np.ascontiguousarray(q[:, ::-1])[:, ::-1]
    assert reversed_q.strides[1] < 0
    close(cubevec.attention_forward(reversed_q, k, v), ref, TOL["f32"])
    readonly = q.copy()
    readonly.flags.writeable = False
    close(cubevec.attention_forward(readonly, k, v), ref, TOL["f32"])


def varlen_ref(q, k, v, cu_q, cu_k, causal, scale=None):
    out = np.zeros(q.shape)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        sq, sk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        mask = None
        if causal:
            mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        out[qs] = attention_ref(q[None, qs], k[None, ks], v[None, ks], mask, scale)[0]
    return out


def test_attention_int8_errors_keep_one_prefix():
    # Past the int32 sums' head dims (or on a CPU without AMX-INT8): the op's own message, once prefixed.
    q = np.zeros((1, 1, 1, 65537), np.float32)
    with pytest.raises(ValueError) as e:
        cubevec.attention_forward(q, q, q, opt_mode="manual", op_type="flash_int8")
    message = str(e.value)
    assert message.startswith("attention: op_type flash_int8"), message
    assert "head dims up to 65536" in message or "needs AMX-INT8" in message, message


@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen(causal):
    # Sq < Sk; Sq > Sk (causal: its first two rows see no key and come out NaN); Sq < Sk.
    cu_q, cu_k = [0, 7, 20, 29], [0, 9, 20, 41]
    q, k, v = randn((29, 2, 8), 1), randn((41, 2, 8), 2), randn((41, 2, 8), 3)
    out = cubevec.attention_forward_varlen(q, k, v, np.array(cu_q, np.int32), np.array(cu_k, np.int32), causal=causal,
                                           softmax_scale=0.4, max_seqlen_q=13, max_seqlen_k=21)
    close(out, varlen_ref(q, k, v, cu_q, cu_k, causal, 0.4), TOL["f32"])
    if causal:  # causal changes the answer, so the flag reaches the kernel
        assert np.isnan(out[7:9]).all() and np.nanmax(np.abs(out - varlen_ref(q, k, v, cu_q, cu_k, False, 0.4))) > 1e-3


# --- sparse attention against the C++ op through the CLI ------------------------------------------


@pytest.mark.parametrize("case", [
    dict(sparse_type="rf_v2", sparsity=0.5, txt_len=0, latent_shape_q=(2, 16, 16), layout="BNSD"),
    dict(sparse_type="rf_v2", sparsity=0.6, txt_len=40, latent_shape_q=(2, 16, 16), layout="BSND"),
    dict(sparse_type="ada_bsa", sparsity=0.5, cdf_threshold=0.9, layout="BNSD", length=1280),  # L = 10: the sparsity cap applies
    dict(sparse_type="ada_bsa", sparsity=0.7, cdf_threshold=1.0, keep_sink=False, layout="BSND", length=1280),
])
def test_sparse_attention_equals_the_cpp_op(case, tmp_path):
    case = dict(case)
    layout = case.pop("layout")
    s = case.pop("length", 512) + case.get("txt_len", 0)
    shape = (1, 2, s, 32) if layout == "BNSD" else (1, s, 2, 32)
    q, k, v = randn(shape, 5), randn(shape, 6), randn(shape, 7)
    out = cubevec.sparse_attention(q, k, v, head_num=2, input_layout=layout, **case)
    inputs, result = tmp_path / "qkv.safetensors", tmp_path / "out.safetensors"
    write_safetensors(inputs, {"q": q, "k": k, "v": v})
    command = [BINARY, "sparse-attention", "--inputs", str(inputs), "--out", str(result), "--sparse-type", case["sparse_type"],
               "--sparsity", str(case["sparsity"]), "--layout", layout, "--head-num", "2"]
    if case["sparse_type"] == "rf_v2":
        command += ["--txt-len", str(case["txt_len"]), "--latent-shape", ",".join(map(str, case["latent_shape_q"]))]
    else:
        command += ["--cdf-threshold", str(case["cdf_threshold"]), "--keep-sink", str(int(case.get("keep_sink", True)))]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    expected = read_safetensors(result)
    assert out.shape == q.shape and out.dtype == np.float32
    assert np.abs(out - expected["out"]).max() <= 1e-5
    assert expected["kept_blocks"].mean() < 1  # some blocks were really skipped...
    dense = attention_ref(q, k, v, head_first=layout == "BNSD")
    assert np.abs(out - dense).max() > 1e-3  # ...and the answer shows it
    close(cubevec.sparse_attention(q, k, v, head_num=2, input_layout=layout), dense, TOL["f32"])  # sparse_type None: dense


# --- RoPE, norms, activations ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rotated_half", "rotated_interleaved"])
@pytest.mark.parametrize("form", ["BSND-2d", "BNSD-2d", "BSND-4d", "BNSD-4d", "SBND-4d"])
def test_rope_both_modes_every_layout(mode, form):
    layout, cos_rank = form.split("-")
    x_shape = {"BSND": (2, 12, 3, 16), "BNSD": (2, 3, 12, 16), "SBND": (12, 2, 3, 16)}[layout]
    x = randn(x_shape, 1)
    angles = rng(2).random((12, 8)) * 6
    cos, sin = np.repeat(np.cos(angles), 2, axis=1), np.repeat(np.sin(angles), 2, axis=1)
    if mode == "rotated_half":
        cos, sin = np.concatenate([np.cos(angles)] * 2, axis=1), np.concatenate([np.sin(angles)] * 2, axis=1)
    cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    if cos_rank == "4d":
        shape = {"BSND": (1, 12, 1, 16), "BNSD": (1, 1, 12, 16), "SBND": (12, 1, 1, 16)}[layout]
        cos, sin = cos.reshape(shape), sin.reshape(shape)
    out = cubevec.rotary_position_embedding(x, cos, sin, rotated_mode=mode, head_first=layout == "BNSD")
    close(out, rope_ref(x, cos, sin, mode, layout), TOL["f32"])
    half = cubevec.rotary_position_embedding(x.astype(np.float16), cos, sin, rotated_mode=mode, head_first=layout == "BNSD")
    assert half.dtype == np.float16
    close(half, rope_ref(x.astype(np.float16), cos, sin, mode, layout), TOL["f16"])


def test_rms_norm():
    x = randn((2, 5, 64), 1)
    norm = cubevec.RMSNorm(64, eps=1e-5)
    norm.weight = randn((64,), 2)
    ref = norm.weight.astype(np.float64) * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    close(norm(x), ref, TOL["f32"])
    close(norm.forward(x, if_fused=False), ref, TOL["f32"])
    close(norm(x, dtype="bf16"), ref, 8 * TOL["bf16"])
    close(cubevec.RMSNorm(64)(x.reshape(10, 64)), (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)).reshape(10, 64), TOL["f32"])


@pytest.mark.parametrize("impl_mode", [0, 1])
def test_fast_layernorm_and_layer_norm(impl_mode):
    x = randn((2, 6, 48), 1) * 3 + 1
    norm = cubevec.LayerNorm(48, eps=1e-5)
    norm.weight, norm.bias = randn((48,), 2), randn((48,), 3)
    close(cubevec.fast_layernorm(norm, x, impl_mode=impl_mode), layer_norm_ref(x, norm.weight, norm.bias, 1e-5), 1e-4)
    close(norm(x), layer_norm_ref(x, norm.weight, norm.bias, 1e-5), 1e-4)
    plain = cubevec.LayerNorm(48, elementwise_affine=False)
    close(cubevec.fast_layernorm(plain, x), layer_norm_ref(x, None, None, 1e-5), 1e-4)
    two_dims = cubevec.LayerNorm((6, 48))  # normalized over the last two dims together
    two_dims.weight = randn((6, 48), 4)
    close(cubevec.fast_layernorm(two_dims, x), layer_norm_ref(x, two_dims.weight, two_dims.bias, 1e-5, axes=2), 1e-4)


def test_fast_layernorm_fp16_mode():
    x = (randn((2, 6, 48), 1) * 3).astype(np.float16)
    norm = cubevec.LayerNorm(48)
    norm.weight, norm.bias = randn((48,), 2).astype(np.float16), randn((48,), 3).astype(np.float16)
    out = cubevec.fast_layernorm(norm, x, impl_mode=2)
    assert out.dtype == np.float16
    close(out, layer_norm_ref(x, norm.weight, norm.bias, 1e-5), 2e-2)


@pytest.mark.parametrize("form", ["BH", "B1H", "BSH"])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm_scale_shift(form, affine):
    b, s, h = 2, 7, 32
    x = randn((b, s, h), 1)
    shape = {"BH": (b, h), "B1H": (b, 1, h), "BSH": (b, s, h)}[form]
    scale, shift = randn(shape, 2) * 0.1, randn(shape, 3)
    norm = cubevec.LayerNorm(h, eps=1e-6, elementwise_affine=affine)
    if affine:
        norm.weight, norm.bias = randn((h,), 4), randn((h,), 5)
    ref = layer_norm_ref(x, norm.weight, norm.bias, 1e-6)
    ref = ref * (1 + scale.reshape(b, -1, h).astype(np.float64)) + shift.reshape(b, -1, h)
    close(cubevec.layernorm_scale_shift(norm, x, scale, shift), ref, 1e-4)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations(name):
    x = np.linspace(-6, 6, 301, dtype=np.float32).reshape(7, 43)
    layer = cubevec.get_activation_layer(name.upper())
    assert layer is cubevec.get_activation_layer(name)  # one shared instance per name, as MindIE
    close(layer(x), ACTIVATIONS[name](x.astype(np.float64)), 1e-4)
    close(layer(x.astype(np.float16)), ACTIVATIONS[name](x.astype(np.float16).astype(np.float64)), 1e-2)


# --- threads and Ctrl-C ---------------------------------------------------------------------------


def test_threads_calling_layers_at_once():
    q, k, v = qkv(sq=64, sk=64)
    expected = cubevec.attention_forward(q, k, v)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                results.append(cubevec.attention_forward(q, k, v))
                cubevec.RMSNorm(16)(q)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 20
    assert all(np.array_equal(r, expected) for r in results)


def test_ctrl_c_interrupts_a_loop_of_layer_calls():
    q, k, v = qkv(sq=256, sk=256, d=64)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    calls = 0
    with pytest.raises(KeyboardInterrupt):
        for calls in range(100000):
            cubevec.attention_forward(q, k, v)
    timer.cancel()
    assert calls < 100000
    close(cubevec.attention_forward(q, k, v), attention_ref(q, k, v), TOL["f32"])  # still usable


# --- bad arguments --------------------------------------------------------------------------------

Q, K, V = qkv(b=1, sq=8, sk=8, n=2, d=8)
X4 = randn((1, 4, 2, 8))
COS = np.ones((4, 8), np.float32)
X3 = randn((1, 4, 16))
LN = cubevec.LayerNorm(16)
SQ = randn((1, 256, 2, 16))
CU = np.array([0, 8], np.int32)
Q3 = randn((8, 2, 8))

BAD_CALLS = [
    # attention_forward
    (lambda: cubevec.attention_forward(Q.tolist(), K, V), TypeError, "query must be a NumPy array"),
    (lambda: cubevec.attention_forward(Q.astype(np.float64), K, V), ValueError, "query must be float32"),
    (lambda: cubevec.attention_forward(Q.astype(np.int32), K, V), ValueError, "query must be float32"),
    (lambda: cubevec.attention_forward(Q[0], K, V), ValueError, "query must be 4-D"),
    (lambda: cubevec.attention_forward(Q, K[:, :5], V), ValueError, "value must have key's shape"),
    (lambda: cubevec.attention_forward(Q, K[..., :4], V[..., :4]), ValueError, "head dim D"),
    (lambda: cubevec.attention_forward(Q, K[:, :, :1], V[:, :, :1]), ValueError, "heads N"),
    (lambda: cubevec.attention_forward(Q, K.astype(np.float16), V), ValueError, "key must have query's dtype"),
    (lambda: cubevec.attention_forward(Q[:, :0], K, V), ValueError, "query must not be empty"),
    (lambda: cubevec.attention_forward(Q, K, V, attn_mask=np.ones((8, 7), bool)), ValueError, "attn_mask must have shape"),
    (lambda: cubevec.attention_forward(Q, K, V, attn_mask=np.ones((8, 8), np.int64)), ValueError, "attn_mask must be bool"),
    (lambda: cubevec.attention_forward(Q, K, V, attn_mask=np.ones(8, bool)), ValueError, "attn_mask must be [Sq, Sk]"),
    (lambda: cubevec.attention_forward(Q, K, V, scale="0.5"), TypeError, "scale must be a float"),
    (lambda: cubevec.attention_forward(Q, K, V, scale=float("nan")), ValueError, "scale must be finite"),
    (lambda: cubevec.attention_forward(Q, K, V, scale=float("inf")), ValueError, "scale must be finite"),
    (lambda: cubevec.attention_forward(Q, K, V, head_first=1), TypeError, "head_first must be a bool"),
    (lambda: cubevec.attention_forward(Q, K, V, fused="yes"), TypeError, "fused must be a bool"),
    (lambda: cubevec.attention_forward(Q, K, V, opt_mode="fast"), ValueError, "opt_mode must be one of"),
    (lambda: cubevec.attention_forward(Q, K, V, opt_mode="manual", op_type="npu_fa"), ValueError, "op_type must be one of"),
    (lambda: cubevec.attention_forward(Q, K, V, opt_mode="manual", layout="TND"), ValueError, "layout must be one of"),
    (lambda: cubevec.attention_forward(Q, K, V, op_type="flash"), ValueError, "op_type applies only with opt_mode='manual'"),
    (lambda: cubevec.attention_forward(Q, K, V, dtype="f16"), ValueError, "dtype must be one of"),
    (lambda: cubevec.attention_forward(Q, K, V, is_causal=True), TypeError, "unexpected keyword argument 'is_causal'"),
    (lambda: cubevec.attention_forward(np.ma.masked_array(Q), K, V), TypeError, "masked array"),
    # attention_forward_varlen
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, CU, np.array([0, 9], np.int32)), ValueError, "cu_seqlens_k must start at 0"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, np.array([0, 9, 8]), CU), ValueError, "cu_seqlens_q must start at 0"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, np.array([0.0, 8.0]), CU), ValueError, "cu_seqlens_q must be an integer array"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, np.array([0, 4, 8]), CU), ValueError, "cu_seqlens_k must have cu_seqlens_q's length"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, CU, CU, dropout_p=0.1), ValueError, "dropout_p must be 0"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, CU, CU, window_size=(-1, -1)), ValueError, "window_size is reserved"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, CU, CU, max_seqlen_q=4), ValueError, "max_seqlen_q must be None or the longest"),
    (lambda: cubevec.attention_forward_varlen(Q3[None], Q3, Q3, CU, CU), ValueError, "q must be 3-D"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, CU, CU, causal=None), TypeError, "causal must be a bool"),
    # sparse_attention
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="rf_v3"), ValueError, "sparse_type must be one of"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=3, input_layout="BSND"), ValueError, "head_num must be q's head count 2"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSH"), ValueError, "input_layout must be one of"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", is_causal=True), ValueError, "is_causal=True"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", attn_mask=np.ones((256, 256), bool)), ValueError, "attn_mask is reserved"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="ada_bsa", sparsity=1.5), ValueError, "sparsity must be <= 1.0"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="ada_bsa", sparsity=float("nan")), ValueError, "sparsity must be finite"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="ada_bsa", cdf_threshold=0), ValueError, "cdf_threshold must be > 0.0"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="rf_v2", sparsity=0.5), ValueError, "latent_shape"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="rf_v2", sparsity=0.5, latent_shape_q=(1, 16, 15)), ValueError, "sparse_attention"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", sparse_type="rf_v2", latent_shape_q="1,16,16"), TypeError, "latent_shape_q must be a (t, h, w)"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", block_size=64), ValueError, "block_size must be 128"),
    (lambda: cubevec.sparse_attention(SQ, SQ[:, :128], SQ, head_num=2, input_layout="BSND"), ValueError, "k must have q's shape"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", stride=8), TypeError, "unexpected keyword argument 'stride'"),
    # rotary_position_embedding
    (lambda: cubevec.rotary_position_embedding(X4, COS, COS, rotated_mode="half"), ValueError, "rotated_mode must be one of"),
    (lambda: cubevec.rotary_position_embedding(X4[0], COS, COS), ValueError, "x must be 4-D"),
    (lambda: cubevec.rotary_position_embedding(X4, COS[:3], COS[:3]), ValueError, "cos must be [S, D] = [4, 8]"),
    (lambda: cubevec.rotary_position_embedding(X4, COS, COS[:, :4]), ValueError, "sin must have cos's shape"),
    (lambda: cubevec.rotary_position_embedding(X4, COS.reshape(1, 4, 8), COS.reshape(1, 4, 8)), ValueError, "cos must be 2-D [S, D] or 4-D"),
    (lambda: cubevec.rotary_position_embedding(X4, COS.reshape(4, 1, 1, 8)[:, :, :, :8], COS.reshape(1, 1, 4, 8)), ValueError, "sin must have cos's shape"),
    (lambda: cubevec.rotary_position_embedding(X4[..., :7], COS[:, :7], COS[:, :7]), ValueError, "must be even"),
    (lambda: cubevec.rotary_position_embedding(X4, COS, COS, head_first="no"), TypeError, "head_first must be a bool"),
    (lambda: cubevec.rotary_position_embedding(X4, COS.astype(np.float64), COS), ValueError, "cos must be float32"),
    # norms and activations
    (lambda: cubevec.RMSNorm(0), ValueError, "hidden_size must be in [1"),
    (lambda: cubevec.RMSNorm(2 ** 40), ValueError, "hidden_size must be in [1"),
    (lambda: cubevec.RMSNorm(16, eps=1e-50), ValueError, "eps must be a positive float32"),
    (lambda: cubevec.RMSNorm(16, eps=10 ** 400), ValueError, "eps must be finite"),
    (lambda: cubevec.attention_forward(Q, K, V, scale=1e300), ValueError, "scale must fit in float32"),
    (lambda: cubevec.attention_forward(np.broadcast_to(np.float32(1), (1 << 20, 1 << 20, 2, 8)), K, V), ValueError, "does not fit in memory"),
    (lambda: cubevec.attention_forward(Q, K, V, opt_mode="manual", op_type=1), TypeError, "op_type must be a str"),
    (lambda: cubevec.ActivationLayer("tanh"), ValueError, "name must be one of"),
    (lambda: cubevec.LayerNorm((2 ** 20,) * 3), ValueError, "holds more than 2**31 elements"),
    (lambda: cubevec.sparse_attention(SQ, SQ, SQ, head_num=2, input_layout="BSND", txt_len=2 ** 63), ValueError, "txt_len must be in [0, 256]"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, [0, [4], 8], CU), TypeError, "cu_seqlens_q must hold ints"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, [], CU), ValueError, "cu_seqlens_q must hold B+1 >= 2 offsets"),
    (lambda: cubevec.attention_forward_varlen(Q3, Q3, Q3, np.array([0, 4, 2 ** 64 - 1], np.uint64), CU), ValueError, "18446744073709551615"),
    (lambda: cubevec.RMSNorm(16, eps=-1.0), ValueError, "eps must be > 0.0"),
    (lambda: cubevec.RMSNorm(16, eps=float("nan")), ValueError, "eps must be finite"),
    (lambda: cubevec.RMSNorm(16)(X3[..., :8]), ValueError, "hidden_states must end in hidden_size = 16"),
    (lambda: cubevec.RMSNorm(16)(X3[0, 0]), ValueError, "hidden_states must be 2- to 8-D"),
    (lambda: cubevec.RMSNorm("16"), TypeError, "hidden_size must be an int"),
    (lambda: cubevec.fast_layernorm(LN, X3, impl_mode=3), ValueError, "impl_mode must be in [0, 2]"),
    (lambda: cubevec.fast_layernorm(LN, X3, impl_mode=2), ValueError, "impl_mode=2 needs float16"),
    (lambda: cubevec.fast_layernorm(object(), X3), TypeError, "must be a cubevec.LayerNorm"),
    (lambda: cubevec.fast_layernorm(LN, X3[..., :8]), ValueError, "x must end in normalized_shape [16]"),
    (lambda: cubevec.LayerNorm(16, eps=0), ValueError, "eps must be > 0.0"),
    (lambda: cubevec.LayerNorm("16"), TypeError, "normalized_shape must be an int"),
    (lambda: cubevec.layernorm_scale_shift(LN, X3, X3[:, 0], X3[:, 0, :8]), ValueError, "shift must be [B, H]"),
    (lambda: cubevec.layernorm_scale_shift(LN, X3, X3[:, :2], X3[:, :2]), ValueError, "scale must be [B, H]"),
    (lambda: cubevec.layernorm_scale_shift(LN, X3[0], X3[:, 0], X3[:, 0]), ValueError, "x must be 3-D [B, S, H]"),
    (lambda: cubevec.layernorm_scale_shift(LN, X3, X3[:, 0], X3[:, :1]), ValueError, "shift must have scale's shape"),
    (lambda: cubevec.get_activation_layer("tanh"), ValueError, "act_type must be one of"),
    (lambda: cubevec.get_activation_layer(None), TypeError, "act_type must be a str"),
    (lambda: cubevec.get_activation_layer("gelu")(X3.astype(np.complex64)), ValueError, "x must be float32"),
    (lambda: cubevec.get_activation_layer("gelu")(DlpackOnly(np.ones(4, np.complex64))), ValueError, "x must be float32"),
]


@pytest.mark.parametrize("index", range(len(BAD_CALLS)))
def test_bad_arguments_raise_named_errors(index):
    call, exception, message = BAD_CALLS[index]
    with pytest.raises(exception) as info:
        call()
    assert message in str(info.value)


def test_attributes_changed_after_construction_are_checked():
    norm = cubevec.RMSNorm(16)
    norm.hidden_size = "16"
    with pytest.raises(TypeError, match="RMSNorm.hidden_size must be an int"):
        norm(X3)
    ln = cubevec.LayerNorm(16)
    ln.normalized_shape = [16]  # a list is read as the tuple
    close(cubevec.fast_layernorm(ln, X3), layer_norm_ref(X3, ln.weight, ln.bias, 1e-5), 1e-4)
    ln.normalized_shape = ()
    with pytest.raises(TypeError, match="LayerNorm.normalized_shape must be an int or a non-empty tuple"):
        cubevec.fast_layernorm(ln, X3)
    layer = cubevec.get_activation_layer("relu")
    assert np.isnan(layer(np.array([np.nan, 1], np.float32))[0])  # NaN stays NaN, as torch.relu
    k = K.copy()
    k[0, 3, 1, 2] = np.nan  # a NaN key reaches every row of its head, in the default kernel too
    out = cubevec.attention_forward(Q, k, V)
    assert np.isnan(out[:, :, 1]).all() and np.isfinite(out[:, :, 0]).all()


def test_a_bad_layer_weight_is_named():
    norm = cubevec.RMSNorm(16)
    norm.weight = np.ones(8, np.float32)
    with pytest.raises(ValueError, match=r"RMSNorm.weight must be \[16\]"):
        norm(X3)
    ln = cubevec.LayerNorm(16)
    ln.bias = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"LayerNorm.bias must have normalized_shape \[16\]"):
        ln(X3)


# --- stubs and docstrings -------------------------------------------------------------------------


def stub_definitions(module_name):
    """name -> argument names (None for a class) of a stub file next to the module."""
    import ast
    import importlib

    module = importlib.import_module(f"cubevec.{module_name}")
    tree = ast.parse(open(os.path.splitext(module.__file__)[0] + ".pyi").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
        elif isinstance(node, ast.ClassDef):
            out[node.name] = None
    return module, out


@pytest.mark.parametrize("module_name", ["layers", "pipelines"])
def test_every_public_name_has_a_stub_with_its_arguments_and_a_docstring(module_name):
    import inspect

    module, stubs = stub_definitions(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        assert name in stubs, f"{name} has no stub in {module_name}.pyi"
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if stubs[name] is not None:
            assert stubs[name] == list(inspect.signature(obj).parameters), f"{name}: the stub's arguments differ"
        else:
            for method in ("__call__", "forward", "from_pretrained"):
                if hasattr(obj, method) and method in vars(obj):
                    assert inspect.getdoc(getattr(obj, method)), f"{name}.{method} has no docstring"


def test_the_stub_of_attention_forward_lists_every_op_type_it_takes():
    import ast

    from cubevec import layers

    tree = ast.parse(open(os.path.splitext(layers.__file__)[0] + ".pyi").read())
    stub = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "attention_forward")
    annotation = next(a.annotation for a in stub.args.kwonlyargs if a.arg == "op_type")
    listed = {node.value for node in ast.walk(annotation) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert listed == set(layers._OP_TYPES)


def test_the_native_stub_names_every_native_function():
    import ast

    tree = ast.parse(open(os.path.join(os.path.dirname(cubevec._cubevec.__file__), "_cubevec.pyi")).read())
    stubbed = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    native = {name for name in dir(cubevec._cubevec) if not name.startswith("__")}
    assert native <= stubbed, native - stubbed
