# Type stubs of cubevec.layers (MindIE SD's layer API on NumPy arrays; docstrings in layers.py).
from typing import Any, Literal, Optional, Sequence, Union

import numpy as np

ArrayLike = Any  # a NumPy array (float32, float16, ml_dtypes.bfloat16) or an object with __dlpack__
Compute = Optional[Literal["f32", "bf16"]]

def attention_forward(query: ArrayLike, key: ArrayLike, value: ArrayLike, attn_mask: Optional[ArrayLike] = None,
                      scale: Optional[float] = None, fused: bool = True, head_first: bool = False, *,
                      opt_mode: Literal["runtime", "static", "manual"] = "runtime",
                      op_type: Optional[Literal["fused_attn_score", "prompt_flash_attn", "ascend_laser_attention", "math", "flash",
                                                "cv_pipelined", "flash_bf16", "flash_int8"]] = None,
                      layout: Optional[Literal["BNSD", "BSND", "BSH"]] = None, dtype: Compute = None) -> np.ndarray:
    """softmax(scale q k^T + mask) v with MindIE SD's semantics; query's shape, layout and dtype."""
def attention_forward_varlen(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: Union[ArrayLike, Sequence[int]],
                             cu_seqlens_k: Union[ArrayLike, Sequence[int]], max_seqlen_q: Optional[int] = None,
                             max_seqlen_k: Optional[int] = None, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: None = None, softcap: None = None, alibi_slopes: None = None,
                             deterministic: None = None, return_attn_probs: None = None, block_table: None = None, *,
                             dtype: Compute = None) -> np.ndarray:
    """Attention over packed sequences [T, N, D] (flash-attn's varlen, MindIE's TND)."""
def sparse_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, attn_mask: None = None, scale: Optional[float] = None,
                     is_causal: bool = False, head_num: int = 1, input_layout: Literal["BNSD", "BSND"] = "BNSD",
                     inner_precise: int = 0, sparse_type: Optional[Literal["rf_v2", "ada_bsa", "none"]] = None, txt_len: int = 0,
                     block_size: int = 128, latent_shape_q: Optional[Sequence[int]] = None,
                     latent_shape_k: Optional[Sequence[int]] = None, keep_sink: bool = True, keep_recent: bool = True,
                     cdf_threshold: float = 1.0, sparsity: float = 0.0, *, dtype: Compute = None) -> np.ndarray:
    """MindIE SD's block-sparse attention (rf_v2, ada_bsa); q's shape and dtype."""
def rotary_position_embedding(x: ArrayLike, cos: ArrayLike, sin: ArrayLike,
                              rotated_mode: Literal["rotated_half", "rotated_interleaved"] = "rotated_half",
                              head_first: bool = False, fused: bool = True, *, dtype: Compute = None) -> np.ndarray:
    """x * cos + rot(x) * sin; x's shape and dtype."""

class RMSNorm:
    """weight * x / sqrt(mean(x^2) + eps) over the last dim (T5's norm)."""
    hidden_size: int
    variance_epsilon: float
    weight: np.ndarray
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None: ...
    @property
    def eps(self) -> float: ...
    def forward(self, hidden_states: ArrayLike, if_fused: bool = True, *, dtype: Compute = None) -> np.ndarray: ...
    def __call__(self, hidden_states: ArrayLike, if_fused: bool = True, *, dtype: Compute = None) -> np.ndarray: ...

class LayerNorm:
    """torch.nn.LayerNorm's parameters as NumPy arrays."""
    normalized_shape: tuple[int, ...]
    eps: float
    elementwise_affine: bool
    weight: Optional[np.ndarray]
    bias: Optional[np.ndarray]
    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None: ...
    def __call__(self, x: ArrayLike, *, dtype: Compute = None) -> np.ndarray: ...

def fast_layernorm(norm: LayerNorm, x: ArrayLike, impl_mode: Literal[0, 1, 2] = 0, fused: bool = True, *,
                   dtype: Compute = None) -> np.ndarray:
    """LayerNorm over norm.normalized_shape with its weight, bias and eps; x's shape and dtype."""
def layernorm_scale_shift(layernorm: LayerNorm, x: ArrayLike, scale: ArrayLike, shift: ArrayLike, fused: bool = True, *,
                          dtype: Compute = None) -> np.ndarray:
    """AdaLN: LayerNorm(x) * (1 + scale) + shift."""

class ActivationLayer:
    """An activation function: call it on an array."""
    name: str
    def __init__(self, name: str) -> None: ...
    def __call__(self, x: ArrayLike, *, dtype: Compute = None) -> np.ndarray: ...

def get_activation_layer(act_type: str) -> ActivationLayer:
    """swish / silu, mish, gelu, relu, gelu-tanh, gelu-fast (any case); one shared instance per name."""
