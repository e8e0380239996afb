# Type stubs of cubevec.pipelines (diffusers-style pipelines; docstrings in pipelines.py).
import os
from typing import Any, Callable, Literal, Optional, Union

import numpy as np

PathLike = Union[str, bytes, os.PathLike]
StageSettings = Union[str, dict[str, Any], None]
StepCallback = Callable[[Any, int, None, dict], Any]
Picture = Union[PathLike, np.ndarray, Any, None]  # a path, an H x W x 3 uint8 array or a PIL image
Lora = Union[PathLike, tuple[PathLike, float], list[Union[PathLike, tuple[PathLike, float]]], None]

class PipelineOutput:
    """What a pipeline call returns: .images (a picture) or .frames (a video), and .report."""
    images: Optional[list[Any]]
    frames: Optional[list[list[Any]]]
    report: dict[str, Any]

class _DiffusionPipeline:
    @classmethod
    def from_pretrained(cls, path: PathLike, dtype: Literal["f32", "bf16"] = "f32", variant: Optional[str] = None,
                        quant: Optional[PathLike] = None, timestep_policy: Optional[PathLike] = None, offload: Optional[int] = None,
                        memory_limit: Union[int, str, None] = None, packed_cache: Optional[PathLike] = None,
                        check_weights: bool = False,
                        lora: Lora = None, lora_ignore_unmatched: bool = False,
                        lora_mode: Optional[Literal["fused", "runtime"]] = None) -> Any:
        """Loads a diffusers model folder once."""

class FluxPipeline(_DiffusionPipeline):
    """Flux text-to-image (diffusers' FluxPipeline arguments)."""
    def __call__(self, prompt: Optional[str] = None, negative_prompt: Optional[str] = None, height: Optional[int] = None,
                 width: Optional[int] = None, num_inference_steps: Optional[int] = None, guidance_scale: Optional[float] = None,
                 true_cfg_scale: Optional[float] = None, generator: Optional[int] = None, max_sequence_length: Optional[int] = None,
                 output_type: Literal["pil", "np"] = "pil", callback_on_step_end: Optional[StepCallback] = None,
                 cache: StageSettings = None, sparse: StageSettings = None,
                 cfg: Optional[Literal["off", "fused", "streams"]] = None, image: Picture = None, mask_image: Picture = None,
                 strength: Optional[float] = None, lora: Lora = None, max_area: Optional[int] = None,
                 _auto_resize: Optional[bool] = None) -> PipelineOutput: ...

class WanPipeline(_DiffusionPipeline):
    """Wan text-to-video (diffusers' WanPipeline arguments)."""
    def __call__(self, prompt: Optional[str] = None, negative_prompt: Optional[str] = None, height: Optional[int] = None,
                 width: Optional[int] = None, num_frames: Optional[int] = None, num_inference_steps: Optional[int] = None,
                 guidance_scale: Optional[float] = None, guidance_scale_2: Optional[float] = None, generator: Optional[int] = None,
                 max_sequence_length: Optional[int] = None, output_type: Literal["pil", "np"] = "np",
                 callback_on_step_end: Optional[StepCallback] = None, cache: StageSettings = None, sparse: StageSettings = None,
                 cfg: Optional[Literal["off", "fused", "streams"]] = None, lora: Lora = None) -> PipelineOutput: ...

class WanImageToVideoPipeline(_DiffusionPipeline):
    """Wan image-to-video and first-last-frame (diffusers' WanImageToVideoPipeline arguments)."""
    def __call__(self, image: Picture = None, prompt: Optional[str] = None, negative_prompt: Optional[str] = None,
                 height: Optional[int] = None, width: Optional[int] = None, num_frames: Optional[int] = None,
                 num_inference_steps: Optional[int] = None, guidance_scale: Optional[float] = None,
                 guidance_scale_2: Optional[float] = None, generator: Optional[int] = None,
                 max_sequence_length: Optional[int] = None, output_type: Literal["pil", "np"] = "np",
                 callback_on_step_end: Optional[StepCallback] = None, last_image: Picture = None, cache: StageSettings = None,
                 sparse: StageSettings = None, cfg: Optional[Literal["off", "fused", "streams"]] = None,
                 lora: Lora = None) -> PipelineOutput: ...
