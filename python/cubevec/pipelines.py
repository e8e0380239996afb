"""Diffusion pipelines called like diffusers' (FluxPipeline, WanPipeline): a model folder is loaded
once, then called any number of times, from any number of threads.

Every argument is checked here, before any work, with diffusers' name in the message: TypeError for
a value of the wrong Python type, ValueError for a value out of range (the library's own checks of
the request, which name the same keys, raise ValueError too).
"""

import json
import math
import numbers
import os
import secrets

from ._cubevec import Pipeline as _Pipeline

__all__ = ["FluxPipeline", "WanPipeline", "PipelineOutput"]


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

    def __repr__(self):
        what = f"frames=[{len(self.frames[0])} frames]" if self.frames is not None else f"images=[{len(self.images)} image(s)]"
        return f"PipelineOutput({what}, report keys {sorted(self.report)})"


# --- argument checks ------------------------------------------------------------------------------


def _text(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (one prompt per call), got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode text (it holds a lone surrogate)") from None
    return value


def _integer(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _json_value(value, name):
    """A stage's settings (a method name or a dict of settings) as plain JSON values."""
    if isinstance(value, str):
        return _text(value, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _number(value, name)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{name}: keys must be str, got {key!r}")
            out[key] = _json_value(item, f"{name}[{key!r}]")
        return out
    raise TypeError(f"{name} must be a str, a number, a bool or a dict of them, got {type(value).__name__}")


def _seed(generator):
    """diffusers' generator as a seed: an int; None draws a fresh one (the report says which)."""
    if generator is None:
        return secrets.randbits(63)
    if isinstance(generator, bool) or not isinstance(generator, numbers.Integral):
        raise TypeError(f"generator must be an int seed (cubevec has no torch.Generator), got {type(generator).__name__}")
    if not 0 <= int(generator) < 2 ** 63:
        raise ValueError(f"generator must be a seed in [0, 2**63), got {generator}")
    return int(generator)


def _path(value, name):
    if not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise TypeError(f"{name} must be a path (str, bytes or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    if (b"\0" if isinstance(path, bytes) else "\0") in path:
        raise ValueError(f"{name} holds a NUL character")
    return os.fsencode(path)  # the bytes as the file system has them (any encoding)


def _output_type(output_type):
    if not isinstance(output_type, str) or output_type not in ("pil", "np"):
        raise ValueError(f"output_type must be 'pil' or 'np', got {output_type!r}")
    return output_type


def _pil_or_arrays(arrays, output_type):
    if output_type == "np":
        return arrays
    try:
        from PIL import Image
    except ImportError:  # no Pillow: arrays, as documented
        return arrays
    return [Image.fromarray(a) for a in arrays]


# --- the pipelines --------------------------------------------------------------------------------


class _DiffusionPipeline:
    _family = None

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_pretrained(cls, path, dtype="f32", variant=None, quant=None, timestep_policy=None, offload=None,
                        memory_limit=None, packed_cache=None, check_weights=False):
        """Loads a diffusers model folder once.

        dtype "f32" or "bf16"; variant: the weight files' variant ("fp16" for
        diffusion_pytorch_model.fp16.safetensors); quant: a MindIE SD quantization description
        (JSON file); timestep_policy: its timestep policy file (W8A8_TIMESTEP); offload: transformer
        blocks kept resident under weight streaming; memory_limit: bytes (int) or a size such as
        "24G"; packed_cache: a folder for the packed GEMM panels other processes map;
        check_weights: scan every weight for NaN/inf.
        """
        folder = _path(path, "path")
        options = {"dtype": _text(dtype, "dtype"), "check_weights": check_weights}
        if not isinstance(check_weights, bool):
            raise TypeError(f"check_weights must be a bool, got {type(check_weights).__name__}")
        if variant is not None:
            options["variant"] = _text(variant, "variant")
        for key, value in (("quant", quant), ("timestep_policy", timestep_policy), ("packed_cache", packed_cache)):
            if value is not None:
                options[key] = os.fsdecode(_path(value, key))
        if offload is not None:
            options["offload"] = _integer(offload, "offload")
        if memory_limit is not None:
            if isinstance(memory_limit, numbers.Integral) and not isinstance(memory_limit, bool):
                memory_limit = str(int(memory_limit))
            options["memory_limit"] = _text(memory_limit, "memory_limit")
        native = _Pipeline.load(folder, json.dumps(options))
        if cls._family is not None and native.family != cls._family:
            raise ValueError(f"{os.fsdecode(folder)}: a {native.family} model, not {cls._family} (use the matching pipeline class)")
        return cls(native)

    def _call(self, request, output_type, callback_on_step_end):
        output_type = _output_type(output_type)
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise TypeError(f"callback_on_step_end must be callable, got {type(callback_on_step_end).__name__}")
        checked = {}
        for key, value in request.items():
            if value is None:
                continue
            if key in ("prompt", "negative_prompt", "cfg"):
                checked[key] = _text(value, key)
            elif key in ("height", "width", "num_frames", "num_inference_steps", "max_sequence_length", "seed"):
                checked[key] = value if key == "seed" else _integer(value, key)
            elif key in ("guidance_scale", "true_cfg_scale"):
                checked[key] = _number(value, key)
            else:
                checked[key] = _json_value(value, key)

        def on_step(step, steps):
            callback_on_step_end(self, step - 1, None, {})

        result = self._native.generate(json.dumps(checked, allow_nan=False), on_step if callback_on_step_end is not None else None)
        video = self._native.task == "t2v"
        return PipelineOutput(_pil_or_arrays(result["images"], output_type), json.loads(result["report"]), video)


class FluxPipeline(_DiffusionPipeline):
    """Flux text-to-image (diffusers' FluxPipeline arguments).

    As in diffusers, true classifier-free guidance runs when true_cfg_scale > 1 and a
    negative_prompt is given (cubevec's CFG fusion, cfg="fused", unless cfg names another mode).
    """

    _family = "flux"

    def __call__(self, prompt=None, negative_prompt=None, height=None, width=None, num_inference_steps=None,
                 guidance_scale=None, true_cfg_scale=None, generator=None, max_sequence_length=None,
                 output_type="pil", callback_on_step_end=None, cache=None, sparse=None, cfg=None):
        """Generates one image: .images[0] (a PIL image, or an HxWx3 uint8 array with output_type="np")."""
        if cfg is None and negative_prompt is not None and true_cfg_scale is not None and _number(true_cfg_scale, "true_cfg_scale") > 1:
            cfg = "fused"
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
        """Generates one video: .frames[0] (PIL images, or HxWx3 uint8 arrays with output_type="np")."""
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_frames": num_frames, "num_inference_steps": num_inference_steps,
                   "guidance_scale": guidance_scale, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse, "cfg": cfg}
        return self._call(request, output_type, callback_on_step_end)
