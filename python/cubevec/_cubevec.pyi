# Type stubs of cubevec's native module (python/module.cpp, python/layers.cpp). The public API is
# the package's (cubevec.FluxPipeline, cubevec.attention_forward, ...): these take arguments that
# python/cubevec/pipelines.py and layers.py have already checked.
from typing import Callable, Optional, Sequence, TypedDict

import numpy as np
import numpy.typing as npt

class Error(RuntimeError):
    """A cubevec failure that is not a bad argument (a damaged model file, a failed run)."""

class _Result(TypedDict):
    images: list[npt.NDArray[np.uint8]]
    report: str

class Pipeline:
    """A model folder loaded once (the generation library's Pipeline)."""

    @staticmethod
    def load(path: str | bytes, options_json: str = "{}") -> "Pipeline":
        """Loads a diffusers model folder (options: the library's LoadOptions JSON keys)."""
    def generate(self, request_json: str, on_step: Optional[Callable[[int, int], None]] = None) -> _Result:
        """Runs one request (the library's request JSON); on_step(step, steps) after each step."""
    @property
    def family(self) -> str:
        """"flux" or "wan"."""
    @property
    def task(self) -> str:
        """"t2i" or "t2v"."""

def _attention(query: np.ndarray, key: np.ndarray, value: np.ndarray, attn_mask: Optional[np.ndarray], scale: Optional[float],
               layout: str, opt_mode: str, op_type: str, kernel_layout: str, num_heads: int, bf16: bool) -> np.ndarray: ...
def _attention_varlen(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens_q: np.ndarray, cu_seqlens_k: np.ndarray,
                      scale: Optional[float], causal: bool, bf16: bool) -> np.ndarray: ...
def _sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sparse_type: str, sparsity: float, txt_len: int,
                      latent_shape_q: Optional[Sequence[int]], latent_shape_k: Optional[Sequence[int]], keep_sink: bool,
                      keep_recent: bool, cdf_threshold: float, input_layout: str, scale: Optional[float], head_num: int,
                      inner_precise: int, block_size: int, bf16: bool) -> np.ndarray: ...
def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rotated_mode: str, layout: str, bf16: bool) -> np.ndarray: ...
def _rms_norm(x: np.ndarray, weight: Optional[np.ndarray], eps: float, bf16: bool) -> np.ndarray: ...
def _layer_norm(x: np.ndarray, weight: Optional[np.ndarray], bias: Optional[np.ndarray], eps: float, impl_mode: int,
                bf16: bool) -> np.ndarray: ...
def _layernorm_scale_shift(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, weight: Optional[np.ndarray],
                           bias: Optional[np.ndarray], eps: float, bf16: bool) -> np.ndarray: ...
def _activation(x: np.ndarray, name: str, bf16: bool) -> np.ndarray: ...
