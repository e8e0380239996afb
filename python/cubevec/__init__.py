"""cubevec from Python: diffusion pipelines called like diffusers', without PyTorch.

    import cubevec
    pipe = cubevec.FluxPipeline.from_pretrained("assets/tinyflux")
    out = pipe(prompt="a red circle", num_inference_steps=8, generator=1, output_type="np")
    out.images[0]   # uint8 array, height x width x 3
    out.report      # the library's timings and stage figures

MindIE SD's layers work on NumPy arrays with MindIE's names and arguments (cubevec.layers):

    out = cubevec.attention_forward(q, k, v, head_first=False)   # q, k, v [B, S, N, D]

A loaded pipeline is immutable: several Python threads may call it at once (the GIL is released
while it computes). Ctrl-C stops a call at its next denoising step with KeyboardInterrupt.
"""

import json as _json

from ._cubevec import Error, Pipeline as _Pipeline
from . import layers
from .layers import (ActivationLayer, LayerNorm, RMSNorm, attention_forward, attention_forward_varlen, fast_layernorm,
                     get_activation_layer, layernorm_scale_shift, rotary_position_embedding, sparse_attention)

__all__ = ["Error", "FluxPipeline", "WanPipeline", "PipelineOutput"] + layers.__all__


class PipelineOutput:
    """What a pipeline call returns: .images (a picture) or .frames (a video), and .report."""

    def __init__(self, images, report, video):
        self.report = report
        if video:
            self.frames = [images]  # diffusers: one list of frames per prompt
            self.images = None
        else:
            self.images = images
            self.frames = None


def _pil_or_arrays(arrays, output_type):
    if output_type == "np":
        return arrays
    if output_type != "pil":
        raise ValueError(f"output_type must be 'pil' or 'np', got {output_type!r}")
    try:
        from PIL import Image
    except ImportError:  # no Pillow: arrays, as documented
        return arrays
    return [Image.fromarray(a) for a in arrays]


class _DiffusionPipeline:
    _family = None

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_pretrained(cls, path, dtype="f32", variant=None, quant=None, timestep_policy=None, offload=None,
                        memory_limit=None, packed_cache=None, check_weights=False):
        """Loads a diffusers model folder once. dtype: "f32" or "bf16"; quant: a MindIE SD quantization
        description; offload: resident blocks under weight streaming; packed_cache: a folder for the
        packed GEMM panels other processes map."""
        if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
            raise TypeError(f"path must be a folder path, got {type(path).__name__}")
        options = {"dtype": dtype, "check_weights": bool(check_weights)}
        for key, value in (("variant", variant), ("quant", quant), ("timestep_policy", timestep_policy),
                           ("memory_limit", memory_limit), ("packed_cache", packed_cache)):
            if value is not None:
                options[key] = str(value)
        if offload is not None:
            options["offload"] = offload
        import os
        native = _Pipeline.load(os.fsdecode(os.fspath(path)), _json.dumps(options))
        if cls._family is not None and native.family != cls._family:
            raise ValueError(f"{path}: a {native.family} model, not {cls._family} (use the matching pipeline class)")
        return cls(native)

    def _call(self, request, output_type, callback_on_step_end):
        def on_step(step, steps):
            if callback_on_step_end is not None:
                callback_on_step_end(self, step - 1, None, {})

        result = self._native.generate(_json.dumps({k: v for k, v in request.items() if v is not None}),
                                       on_step if callback_on_step_end is not None else None)
        video = self._native.task == "t2v"
        return PipelineOutput(_pil_or_arrays(result["images"], output_type), _json.loads(result["report"]), video)


def _seed(generator):
    if generator is None or isinstance(generator, int):
        return generator
    raise TypeError(f"generator must be an int seed (cubevec has no torch.Generator), got {type(generator).__name__}")


class FluxPipeline(_DiffusionPipeline):
    """Flux text-to-image (diffusers' FluxPipeline arguments)."""

    _family = "flux"

    def __call__(self, prompt=None, negative_prompt=None, height=None, width=None, num_inference_steps=None,
                 guidance_scale=None, true_cfg_scale=None, generator=None, max_sequence_length=None,
                 output_type="pil", callback_on_step_end=None, cache=None, sparse=None, cfg=None):
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_inference_steps": num_inference_steps, "guidance_scale": guidance_scale,
                   "true_cfg_scale": true_cfg_scale, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse, "cfg": cfg}
        return self._call(request, output_type, callback_on_step_end)


class WanPipeline(_DiffusionPipeline):
    """Wan text-to-video (diffusers' WanPipeline arguments); .frames[0] is the list of frames."""

    _family = "wan"

    def __call__(self, prompt=None, negative_prompt=None, height=None, width=None, num_frames=None,
                 num_inference_steps=None, guidance_scale=None, generator=None, max_sequence_length=None,
                 output_type="np", callback_on_step_end=None, cache=None, sparse=None, cfg=None):
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_frames": num_frames, "num_inference_steps": num_inference_steps,
                   "guidance_scale": guidance_scale, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse, "cfg": cfg}
        return self._call(request, output_type, callback_on_step_end)
