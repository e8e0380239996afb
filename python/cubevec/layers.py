"""MindIE SD's layer API on NumPy arrays: the same names, keyword arguments and semantics as
``mindiesd`` (``attention_forward``, ``attention_forward_varlen``, ``sparse_attention``,
``rotary_position_embedding``, ``RMSNorm``, ``fast_layernorm``, ``layernorm_scale_shift``,
``get_activation_layer``), computed by cubevec's kernels.

Arrays are NumPy's (float32, float16, or ``ml_dtypes.bfloat16`` where that package exists); any
object with ``__dlpack__`` (a CPU torch tensor, a JAX array) is taken through
``numpy.from_dlpack``. Non-contiguous and negative-stride arrays are copied into a contiguous one
first. Results are new NumPy arrays of the input's dtype. float16 is computed in float32 (rounded
once at the end); ``dtype="bf16"`` computes in bfloat16 as MindIE does on the NPU (the result is
returned in the input's dtype). Where MindIE SD takes a ``torch.nn`` module this takes cubevec's
own small class (``RMSNorm``, ``LayerNorm``) holding NumPy weights.

Errors: ``TypeError`` for an argument of the wrong Python type (a list where an array belongs, a
string for ``scale``, an unknown keyword); ``ValueError`` for a wrong dtype, rank, shape or value
(each message names the argument and what was expected).
"""

import math
import numbers

import numpy as np

from . import _cubevec
from ._checks import finite_float

try:  # bfloat16 arrays, where the package exists
    import ml_dtypes as _ml_dtypes

    _BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the machine
    _BFLOAT16 = None

__all__ = [
    "attention_forward",
    "attention_forward_varlen",
    "sparse_attention",
    "rotary_position_embedding",
    "RMSNorm",
    "LayerNorm",
    "fast_layernorm",
    "layernorm_scale_shift",
    "get_activation_layer",
    "ActivationLayer",
]

_FLOAT_NAMES = "float32, float16 or bfloat16" if _BFLOAT16 is not None else "float32 or float16"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MAX_ELEMENTS = 2 ** 31  # a norm's width, a shape's dims: beyond this a typo, not a model


# --- argument checks ------------------------------------------------------------------------------


def _array(value, name):
    """`value` as a C-contiguous, aligned NumPy array (a copy only when it is not one already)."""
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain NumPy array: a masked array's mask would be ignored")
    if isinstance(value, np.ndarray):
        array = np.asarray(value)
    elif hasattr(value, "__dlpack__"):
        try:
            array = np.from_dlpack(value)
        except Exception as e:  # numpy names the reason (a device other than the CPU, a dtype it lacks)
            raise TypeError(
                f"{name}: numpy.from_dlpack could not take this {type(value).__name__} ({e}); "
                "pass a CPU tensor of float32 or float16 (for bfloat16, .float() first)") from None
    else:
        raise TypeError(f"{name} must be a NumPy array or an object with __dlpack__, got {type(value).__name__}")
    try:
        return np.require(array, requirements=["C", "A"])
    except MemoryError:  # a broadcast or strided view of a huge shape
        raise ValueError(f"{name}: a contiguous copy of this view, shape {array.shape}, does not fit in memory") from None


def _float_array(value, name):
    array = _array(value, name)
    # (not `dtype != _BFLOAT16`: numpy reads a None there as float64)
    if array.dtype not in (np.float32, np.float16) and (_BFLOAT16 is None or array.dtype != _BFLOAT16):
        raise ValueError(f"{name} must be {_FLOAT_NAMES}, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {array.shape}")
    return array


def _rank(array, name, ranks, form):
    if array.ndim not in ranks:
        raise ValueError(f"{name} must be {form}, got {array.ndim}-D shape {array.shape}")


def _bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _int(value, name, low=None, high=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


def _real(value, name, low=None, high=None, low_open=False):
    """A finite float that float32 holds (the kernels compute in f32): a larger one would be inf there."""
    value = finite_float(value, name)
    if abs(value) > _FLOAT32_MAX:
        raise ValueError(f"{name} must fit in float32 (|{name}| <= {_FLOAT32_MAX:.4g}), got {value}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def _eps(value, name):
    eps = _real(value, name, 0.0, low_open=True)
    if np.float32(eps) == 0:
        raise ValueError(f"{name} must be a positive float32, got {eps} (0 in float32)")
    return eps


def _choice(value, name, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def _compute_bf16(dtype):
    """The compute option: None or "f32" (the arrays' own precision, float16 in float32), "bf16"."""
    if dtype is None:
        return False
    return _choice(dtype, "dtype", ("f32", "bf16")) == "bf16"


def _same_dtype(arrays, names):
    first = arrays[0]
    for array, name in zip(arrays[1:], names[1:]):
        if array.dtype != first.dtype:
            raise ValueError(f"{name} must have {names[0]}'s dtype {first.dtype}, got {array.dtype}")


# --- attention ------------------------------------------------------------------------------------

# MindIE SD's manual-mode op types and cubevec's own kernel names: MindIE's NPU kernels map to the
# kernel of the same kind here (the two flash-attention ops to the tiled flash kernel, the custom
# Cube/Vector-pipelined laser attention to the CV-pipelined one).
_OP_TYPES = {
    "prompt_flash_attn": "flash",
    "fused_attn_score": "flash",
    "ascend_laser_attention": "cv_pipelined",
    "math": "math",
    "flash": "flash",
    "cv_pipelined": "cv_pipelined",
    "flash_bf16": "flash_bf16",
    "flash_int8": "flash_int8",
}


def _check_mask(attn_mask, batch, heads, sq, sk):
    mask = _array(attn_mask, "attn_mask")
    if mask.dtype != np.bool_ and mask.dtype not in (np.float32, np.float16):
        raise ValueError(f"attn_mask must be bool (True = attend) or a float32/float16 additive bias, got dtype {mask.dtype}")
    if mask.ndim == 2:
        expected = (sq, sk)
    elif mask.ndim == 4:
        expected = (batch, heads, sq, sk)
    else:
        raise ValueError(f"attn_mask must be [Sq, Sk] = [{sq}, {sk}] or [B, N, Sq, Sk] = [{batch}, {heads}, {sq}, {sk}], got shape {mask.shape}")
    if any(m != e and not (m == 1 and mask.ndim == 4) for m, e in zip(mask.shape, expected)):
        raise ValueError(f"attn_mask must have shape {list(expected)} (size-1 dims broadcast in the 4-D form), got {list(mask.shape)}")
    if mask.ndim == 4 and (mask.shape[2] != sq or mask.shape[3] != sk):  # the kernels broadcast B and N only
        mask = np.ascontiguousarray(np.broadcast_to(mask, mask.shape[:2] + (sq, sk)))
    return mask


def attention_forward(query, key, value, attn_mask=None, scale=None, fused=True, head_first=False, *, opt_mode="runtime",
                      op_type=None, layout=None, dtype=None):
    """Attention with MindIE SD's semantics: ``softmax(scale * q k^T + mask) v``.

    query [B, Sq, N, D], key and value [B, Sk, N, D] (head_first=False, MindIE's BSND), or
    [B, N, S, D] (head_first=True). attn_mask: None, bool (True = attend) or an additive float bias,
    [Sq, Sk] or [B, N, Sq, Sk] (size-1 dims broadcast). scale: default D**-0.5. fused=False is
    MindIE's attention_math (the reference: scores materialized, bf16 rounded where MindIE rounds).
    opt_mode "runtime" times the kernels on the first call of a shape and keeps the fastest;
    "static" takes the fixed pick; "manual" uses op_type ("fused_attn_score" by default, or
    "prompt_flash_attn", "ascend_laser_attention", or cubevec's "flash", "cv_pipelined", "math",
    "flash_bf16": bf16 products on AMX tiles or AVX512-BF16, an error on CPUs without either; "flash_int8": Q K^T in
    int8 on AMX-INT8 or AVX512-VNNI as SageAttention quantizes, lossy, an error on CPUs without either)
    and layout (the kernel's layout, "BNSD" by default, "BSND", "BSH"). dtype="bf16" computes in
    bfloat16. Returns an array of query's shape, layout and dtype.
    """
    fused = _bool(fused, "fused")
    head_first = _bool(head_first, "head_first")
    bf16 = _compute_bf16(dtype)
    q, k, v = (_float_array(a, n) for a, n in ((query, "query"), (key, "key"), (value, "value")))
    form = "[B, N, S, D] (head_first=True)" if head_first else "[B, S, N, D] (head_first=False)"
    for array, name in ((q, "query"), (k, "key"), (v, "value")):
        _rank(array, name, (4,), "4-D " + form)
    _same_dtype((q, k, v), ("query", "key", "value"))
    if k.shape != v.shape:
        raise ValueError(f"value must have key's shape {list(k.shape)}, got {list(v.shape)}")
    s_dim, n_dim = (2, 1) if head_first else (1, 2)
    for dim, what in ((0, "batch B"), (n_dim, "heads N"), (3, "head dim D")):
        if k.shape[dim] != q.shape[dim]:
            raise ValueError(f"key must have query's {what} = {q.shape[dim]} (dim {dim} of {form}), got {k.shape[dim]}")
    mask = None if attn_mask is None else _check_mask(attn_mask, q.shape[0], q.shape[n_dim], q.shape[s_dim], k.shape[s_dim])
    scale = None if scale is None else _real(scale, "scale")
    opt_mode = _choice(opt_mode, "opt_mode", ("runtime", "static", "manual"))
    for given, name in ((op_type, "op_type"), (layout, "layout")):
        if given is not None and not isinstance(given, str):
            raise TypeError(f"{name} must be a str, got {type(given).__name__}")
    if opt_mode != "manual" and fused:
        for given, name in ((op_type, "op_type"), (layout, "layout")):
            if given is not None:
                raise ValueError(f"{name} applies only with opt_mode='manual' (opt_mode={opt_mode!r} picks the kernel itself)")
    kernel = _OP_TYPES[_choice("fused_attn_score" if op_type is None else op_type, "op_type", tuple(_OP_TYPES))]
    kernel_layout = _choice("BNSD" if layout is None else layout, "layout", ("BNSD", "BSND", "BSH"))
    if not fused:  # MindIE's attention_math: BNSD, scores materialized
        opt_mode, kernel, kernel_layout = "manual", "math", "BNSD"
    return _cubevec._attention(q, k, v, mask, scale, "BNSD" if head_first else "BSND", opt_mode, kernel,
                               "BSND" if kernel_layout == "BSH" else kernel_layout, 0, bf16)


def _cu_seqlens(value, name, total):
    if isinstance(value, (list, tuple)):
        if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in value):
            raise TypeError(f"{name} must hold ints (int32 [B+1]), got {value!r}")
        value = np.array([int(x) for x in value], dtype=object if value else np.int64)
        if value.dtype == object:
            if any(not -2 ** 63 <= x < 2 ** 63 for x in value):
                raise ValueError(f"{name} must start at 0, never decrease and end at {total}, got {value.tolist()}")
            value = value.astype(np.int64)
    array = _array(value, name)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array (int32 [B+1]), got dtype {array.dtype}")
    _rank(array, name, (1,), "1-D [B+1]")
    if array.shape[0] < 2:
        raise ValueError(f"{name} must hold B+1 >= 2 offsets, got {array.shape[0]}")
    if array.dtype == np.uint64 and int(array.max()) > total:
        raise ValueError(f"{name} must start at 0, never decrease and end at {total}, got {array.tolist()}")
    values = array.astype(np.int64)
    if values[0] != 0 or values[-1] != total or np.any(np.diff(values) < 0):
        raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the rows of the packed tensor), got {values.tolist()}")
    return np.ascontiguousarray(values.astype(np.int32))


def attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                             softmax_scale=None, causal=False, window_size=None, softcap=None, alibi_slopes=None,
                             deterministic=None, return_attn_probs=None, block_table=None, *, dtype=None):
    """Attention over packed variable-length sequences (flash-attn's varlen call, MindIE's TND form).

    q [Tq, N, D], k and v [Tk, N, D]; sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (integer arrays [B+1] from 0 to T). causal: query
    i of a sequence sees key j when j <= i + (Sk_b - Sq_b) (aligned bottom-right, flash-attn's and
    MindIE's sparse_mode 3). max_seqlen_q / max_seqlen_k may be given only as the true longest
    sequence; dropout_p must be 0; the other flash-attn arguments are reserved (None), as in
    MindIE SD. Returns [Tq, N, D] in q's dtype.
    """
    for given, name in ((window_size, "window_size"), (softcap, "softcap"), (alibi_slopes, "alibi_slopes"),
                        (deterministic, "deterministic"), (return_attn_probs, "return_attn_probs"), (block_table, "block_table")):
        if given is not None:
            raise ValueError(f"{name} is reserved and must be None (MindIE SD's attention_forward_varlen refuses it too)")
    if abs(_real(dropout_p, "dropout_p")) > 1e-6:
        raise ValueError(f"dropout_p must be 0 (inference only), got {dropout_p}")
    causal = _bool(causal, "causal")
    bf16 = _compute_bf16(dtype)
    tq, tk, tv = (_float_array(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    for array, name in ((tq, "q"), (tk, "k"), (tv, "v")):
        _rank(array, name, (3,), "3-D [T, N, D]")
    _same_dtype((tq, tk, tv), ("q", "k", "v"))
    if tk.shape != tv.shape:
        raise ValueError(f"v must have k's shape {list(tk.shape)}, got {list(tv.shape)}")
    if tk.shape[1:] != tq.shape[1:]:
        raise ValueError(f"k must have q's heads and head dim [N, D] = {list(tq.shape[1:])}, got {list(tk.shape[1:])}")
    cu_q = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", tq.shape[0])
    cu_k = _cu_seqlens(cu_seqlens_k, "cu_seqlens_k", tk.shape[0])
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_k must have cu_seqlens_q's length B+1 = {cu_q.shape[0]}, got {cu_k.shape[0]}")
    for given, cu, name in ((max_seqlen_q, cu_q, "max_seqlen_q"), (max_seqlen_k, cu_k, "max_seqlen_k")):
        if given is not None and _int(given, name) != int(np.diff(cu).max()):
            raise ValueError(f"{name} must be None or the longest sequence, {int(np.diff(cu).max())}, got {given}")
    scale = None if softmax_scale is None else _real(softmax_scale, "softmax_scale")
    return _cubevec._attention_varlen(tq, tk, tv, cu_q, cu_k, scale, causal, bf16)


def _latent_shape(value, name):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise TypeError(f"{name} must be a (t, h, w) tuple of three ints, got {value!r}")
    return [_int(x, f"{name}[{i}]", 1, _MAX_ELEMENTS) for i, x in enumerate(value)]


def _block_size(value):
    if _int(value, "block_size") != 128:
        raise ValueError(f"block_size must be 128 (the only block size MindIE SD's kernels take), got {value}")
    return 128


def sparse_attention(q, k, v, attn_mask=None, scale=None, is_causal=False, head_num=1, input_layout="BNSD", inner_precise=0,
                     sparse_type=None, txt_len=0, block_size=128, latent_shape_q=None, latent_shape_k=None, keep_sink=True,
                     keep_recent=True, cdf_threshold=1.0, sparsity=0.0, *, dtype=None):
    """MindIE SD's sparse attention: a block mask estimated from q and k picks the 128 x 128 blocks
    the block-sparse flash kernel computes.

    sparse_type None (dense), "rf_v2" (RainFusion 2.0: 8x8 spatial tiles per frame of
    latent_shape_q = (t, h, w), text first (txt_len tokens), each query block keeps its
    ceil(L * (1 - sparsity)) best key blocks, text and first frame whole) or "ada_bsa" (antidiagonal
    estimate, cdf_threshold, capped by sparsity, keep_sink / keep_recent). q, k, v are
    [B, N, S, D] (input_layout "BNSD", the default) or [B, S, N, D] ("BSND"); head_num must be q's
    head count. attn_mask is reserved (None) and is_causal must be False, as MindIE's kernels
    compute no causal sparse attention here; inner_precise (0..4) is accepted and changes nothing
    (sums are f32). Returns an array of q's shape and dtype.
    """
    if attn_mask is not None:
        raise ValueError("attn_mask is reserved in sparse_attention and must be None (a mask would be ignored)")
    if _bool(is_causal, "is_causal"):
        raise ValueError("is_causal=True is not supported by sparse_attention (rf_v2 and ada_bsa here are non-causal)")
    sparse_type = _choice("none" if sparse_type is None else sparse_type, "sparse_type", ("none", "rf_v2", "ada_bsa"))
    input_layout = _choice(input_layout, "input_layout", ("BNSD", "BSND"))
    bf16 = _compute_bf16(dtype)
    tq, tk, tv = (_float_array(a, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    form = f"4-D [B, N, S, D] (input_layout={input_layout!r})" if input_layout == "BNSD" else f"4-D [B, S, N, D] (input_layout={input_layout!r})"
    for array, name in ((tq, "q"), (tk, "k"), (tv, "v")):
        _rank(array, name, (4,), form)
    _same_dtype((tq, tk, tv), ("q", "k", "v"))
    for array, name in ((tk, "k"), (tv, "v")):
        if array.shape != tq.shape:
            raise ValueError(f"{name} must have q's shape {list(tq.shape)} (self-attention), got {list(array.shape)}")
    heads = tq.shape[1 if input_layout == "BNSD" else 2]
    seq = tq.shape[2 if input_layout == "BNSD" else 1]
    head_num = _int(head_num, "head_num", 1, _MAX_ELEMENTS)
    if head_num != heads:
        raise ValueError(f"head_num must be q's head count {heads} ({form}), got {head_num}")
    scale = None if scale is None else _real(scale, "scale")
    return _cubevec._sparse_attention(
        tq, tk, tv, sparse_type, _real(sparsity, "sparsity", 0.0, 1.0), _int(txt_len, "txt_len", 0, seq),
        _latent_shape(latent_shape_q, "latent_shape_q"), _latent_shape(latent_shape_k, "latent_shape_k"),
        _bool(keep_sink, "keep_sink"), _bool(keep_recent, "keep_recent"), _real(cdf_threshold, "cdf_threshold", 0.0, 1.0, low_open=True),
        input_layout, scale, head_num, _int(inner_precise, "inner_precise", 0, 4), _block_size(block_size), bf16)


# --- RoPE -----------------------------------------------------------------------------------------


def rotary_position_embedding(x, cos, sin, rotated_mode="rotated_half", head_first=False, fused=True, *, dtype=None):
    """``x * cos + rot(x) * sin`` (MindIE SD's RoPE).

    x is 4-D: [B, S, N, D] (head_first=False), [B, N, S, D] (head_first=True) or [S, B, N, D]
    (with 4-D cos [S, 1, 1, D]). cos and sin are full width (each frequency repeated for the pair it
    rotates): 2-D [S, D], or 4-D [1, S, 1, D], [1, 1, S, D], [S, 1, 1, D] (the 4-D shape says where
    S is). rotated_mode "rotated_half" rotates halves ([x1 | x2] -> [-x2 | x1]),
    "rotated_interleaved" pairs ((x_2i, x_2i+1) -> (-x_2i+1, x_2i), Flux and Wan). Arithmetic in
    f32 (dtype="bf16": x in bfloat16); result in x's dtype. fused is accepted (both paths are one
    formula).
    """
    head_first = _bool(head_first, "head_first")
    _bool(fused, "fused")
    mode = _choice(rotated_mode, "rotated_mode", ("rotated_half", "rotated_interleaved"))
    bf16 = _compute_bf16(dtype)
    tx = _float_array(x, "x")
    _rank(tx, "x", (4,), "4-D [B, S, N, D], [B, N, S, D] or [S, B, N, D]")
    tc, ts = _float_array(cos, "cos"), _float_array(sin, "sin")
    if tc.shape != ts.shape:
        raise ValueError(f"sin must have cos's shape {list(tc.shape)}, got {list(ts.shape)}")
    d = tx.shape[3]
    if d % 2:
        raise ValueError(f"x's head dim D = {d} must be even (RoPE rotates pairs)")
    if tc.ndim == 2:
        layout = "BNSD" if head_first else "BSND"
        s = tx.shape[2 if head_first else 1]
        if tc.shape != (s, d):
            raise ValueError(f"cos must be [S, D] = [{s}, {d}] for x {list(tx.shape)} (head_first={head_first}), got {list(tc.shape)}")
    elif tc.ndim == 4:
        # The dim that holds S: the one cos does not broadcast over.
        forms = (("SBND", 0), ("BSND", 1), ("BNSD", 2))
        matches = [name for name, dim in forms if tc.shape == tuple(tx.shape[dim] if i == dim else (d if i == 3 else 1) for i in range(4))]
        if not matches:
            raise ValueError(f"cos must be [1, S, 1, D], [1, 1, S, D] or [S, 1, 1, D] with S and D of x {list(tx.shape)}, got {list(tc.shape)}")
        preferred = "BNSD" if head_first else "BSND"
        layout = preferred if preferred in matches else matches[0]
    else:
        raise ValueError(f"cos must be 2-D [S, D] or 4-D, got {tc.ndim}-D shape {tc.shape}")
    return _cubevec._rope(tx, tc, ts, mode, layout, bf16)


# --- norms ----------------------------------------------------------------------------------------


def _weight(value, name, size):
    if value is None:
        return None
    array = _float_array(value, name)
    if array.shape != (size,):
        raise ValueError(f"{name} must be [{size}], got shape {list(array.shape)}")
    return array


class RMSNorm:
    """MindIE SD's RMSNorm (T5's norm): ``weight * x / sqrt(mean(x^2 over the last dim) + eps)``.

    ``weight`` is a float32 array of ones [hidden_size] to start with (assign your checkpoint's);
    ``variance_epsilon`` is eps (MindIE's attribute name; ``eps`` reads the same). Statistics in f32,
    one rounding at the end.
    """

    def __init__(self, hidden_size, eps=1e-6):
        self.hidden_size = _int(hidden_size, "hidden_size", 1, _MAX_ELEMENTS)
        self.variance_epsilon = _eps(eps, "eps")
        self.weight = np.ones(self.hidden_size, dtype=np.float32)

    @property
    def eps(self):
        return self.variance_epsilon

    def forward(self, hidden_states, if_fused=True, *, dtype=None):
        """hidden_states [..., hidden_size] (2 to 8 dims, as MindIE) -> the same shape and dtype."""
        _bool(if_fused, "if_fused")
        bf16 = _compute_bf16(dtype)
        size = _int(self.hidden_size, "RMSNorm.hidden_size", 1, _MAX_ELEMENTS)
        eps = _eps(self.variance_epsilon, "RMSNorm.variance_epsilon")
        x = _float_array(hidden_states, "hidden_states")
        _rank(x, "hidden_states", range(2, 9), f"2- to 8-D [..., {size}]")
        if x.shape[-1] != size:
            raise ValueError(f"hidden_states must end in hidden_size = {size}, got shape {list(x.shape)}")
        return _cubevec._rms_norm(x, _weight(self.weight, "RMSNorm.weight", size), eps, bf16)

    __call__ = forward

    def __repr__(self):
        return f"RMSNorm({self.hidden_size}, eps={self.variance_epsilon})"


def _normalized_shape(value, name):
    shape = (value,) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value
    if not isinstance(shape, (tuple, list)) or not shape:
        raise TypeError(f"{name} must be an int or a non-empty tuple of ints, got {value!r}")
    shape = tuple(_int(s, name, 1, _MAX_ELEMENTS) for s in shape)
    if math.prod(shape) > _MAX_ELEMENTS:
        raise ValueError(f"{name} {list(shape)} holds more than 2**31 elements")
    return shape


class LayerNorm:
    """torch.nn.LayerNorm's parameters as NumPy arrays, for fast_layernorm and layernorm_scale_shift.

    ``normalized_shape`` (an int or a tuple: the trailing dims normalized together), ``eps``,
    ``elementwise_affine`` and ``bias`` as torch's; ``weight`` (ones) and ``bias`` (zeros) are float32
    arrays of normalized_shape, or None without the affine. Calling it is fast_layernorm(self, x).
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        self.normalized_shape = _normalized_shape(normalized_shape, "normalized_shape")
        self.eps = _eps(eps, "eps")
        self.elementwise_affine = _bool(elementwise_affine, "elementwise_affine")
        with_bias = _bool(bias, "bias")
        self.weight = np.ones(self.normalized_shape, dtype=np.float32) if self.elementwise_affine else None
        self.bias = np.zeros(self.normalized_shape, dtype=np.float32) if self.elementwise_affine and with_bias else None

    def __call__(self, x, *, dtype=None):
        return fast_layernorm(self, x, dtype=dtype)

    def __repr__(self):
        return f"LayerNorm({self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine})"


def _layer_norm_params(norm, function):
    if not isinstance(norm, LayerNorm):
        raise TypeError(f"{function}: the norm must be a cubevec.LayerNorm, got {type(norm).__name__}")
    shape = _normalized_shape(norm.normalized_shape, "LayerNorm.normalized_shape")
    size = math.prod(shape)
    eps = _eps(norm.eps, "LayerNorm.eps")
    params = []
    for value, name in ((norm.weight, "LayerNorm.weight"), (norm.bias, "LayerNorm.bias")):
        if value is None:
            params.append(None)
            continue
        array = _float_array(value, name)
        if array.shape != shape:
            raise ValueError(f"{name} must have normalized_shape {list(shape)}, got {list(array.shape)}")
        params.append(array.reshape(size))
    return shape, eps, params[0], params[1]


def fast_layernorm(norm, x, impl_mode=0, fused=True, *, dtype=None):
    """LayerNorm over norm.normalized_shape's trailing dims of x with norm's weight, bias and eps.

    impl_mode 0 is high precision, 1 high performance, 2 float16 (x, weight and bias all float16).
    fused is accepted (both paths are one formula). Returns x's shape and dtype.
    """
    impl_mode = _int(impl_mode, "impl_mode", 0, 2)
    _bool(fused, "fused")
    bf16 = _compute_bf16(dtype)
    shape, eps, weight, bias = _layer_norm_params(norm, "fast_layernorm")
    size = math.prod(shape)
    tx = _float_array(x, "x")
    trailing = len(shape)
    if tx.ndim < trailing or tx.shape[tx.ndim - trailing:] != shape:
        raise ValueError(f"x must end in normalized_shape {list(shape)}, got shape {list(tx.shape)}")
    if impl_mode == 2:
        if bf16:
            raise ValueError("impl_mode=2 (float16) cannot compute in dtype='bf16'")
        for array, name in ((tx, "x"), (weight, "LayerNorm.weight"), (bias, "LayerNorm.bias")):
            if array is not None and array.dtype != np.float16:
                raise ValueError(f"impl_mode=2 needs float16 x, weight and bias; {name} is {array.dtype}")
    flat = tx.reshape(tx.shape[:tx.ndim - trailing] + (size,))
    return _cubevec._layer_norm(flat, weight, bias, eps, impl_mode, bf16).reshape(tx.shape)


def layernorm_scale_shift(layernorm, x, scale, shift, fused=True, *, dtype=None):
    """AdaLN: ``LayerNorm(x) * (1 + scale) + shift`` (MindIE SD's order: scale before shift).

    x [B, S, H]; scale and shift [B, H], [B, 1, H] or per token [B, S, H]; the LayerNorm's eps, and
    its weight and bias when it has the affine (normalized_shape must be (H,)). Returns x's shape
    and dtype.
    """
    _bool(fused, "fused")
    bf16 = _compute_bf16(dtype)
    shape, eps, weight, bias = _layer_norm_params(layernorm, "layernorm_scale_shift")
    tx = _float_array(x, "x")
    _rank(tx, "x", (3,), "3-D [B, S, H]")
    b, s, h = tx.shape
    if shape != (h,):
        raise ValueError(f"the LayerNorm's normalized_shape must be ({h},) for x {list(tx.shape)}, got {shape}")
    ts, tt = _float_array(scale, "scale"), _float_array(shift, "shift")
    allowed = ((b, h), (b, 1, h), (b, s, h))
    for array, name in ((ts, "scale"), (tt, "shift")):
        if array.shape not in allowed:
            raise ValueError(f"{name} must be [B, H] = [{b}, {h}], [B, 1, H] or [B, S, H] = [{b}, {s}, {h}], got {list(array.shape)}")
    if ts.shape != tt.shape:
        raise ValueError(f"shift must have scale's shape {list(ts.shape)}, got {list(tt.shape)}")
    return _cubevec._layernorm_scale_shift(tx, ts, tt, weight, bias, eps, bf16)


# --- activations ----------------------------------------------------------------------------------

_ACTIVATIONS = ("swish", "silu", "mish", "gelu", "relu", "gelu-tanh", "gelu-fast")
_activation_layers = {}


def _activation_name(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if value.lower() not in _ACTIVATIONS:
        raise ValueError(f"{name} must be one of {', '.join(_ACTIVATIONS)} (any case), got {value!r}")
    return value.lower()


class ActivationLayer:
    """An activation function (what get_activation_layer returns): call it on an array."""

    def __init__(self, name):
        self.name = _activation_name(name, "name")

    def __call__(self, x, *, dtype=None):
        bf16 = _compute_bf16(dtype)
        return _cubevec._activation(_float_array(x, "x"), _activation_name(self.name, "ActivationLayer.name"), bf16)

    def __repr__(self):
        return f"ActivationLayer({self.name!r})"


def get_activation_layer(act_type):
    """MindIE SD's activations by name, case-insensitive: "swish" / "silu", "mish", "gelu" (exact,
    erf), "relu", "gelu-tanh", "gelu-fast" (Ascend's fast approximation
    x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|))). One shared instance per name."""
    name = _activation_name(act_type, "act_type")
    return _activation_layers.setdefault(name, ActivationLayer(name))
