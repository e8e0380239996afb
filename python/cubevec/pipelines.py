"""Diffusion pipelines called like diffusers' (FluxPipeline, WanPipeline, WanImageToVideoPipeline): a model folder is loaded
once, then called any number of times, from any number of threads.

Every argument is checked here, before any work, with diffusers' name in the message: TypeError for
a value of the wrong Python type, ValueError for a value out of range (the library's own checks of
the request, which name the same keys, raise ValueError too).
"""

import errno
import json
import numbers
import os
import secrets
import stat
import struct
import tempfile
import warnings
import zlib

import numpy as np

from ._checks import finite_float
from ._cubevec import Error, Pipeline as _Pipeline

__all__ = ["FluxPipeline", "WanPipeline", "WanImageToVideoPipeline", "PipelineOutput"]


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


def _text(value, name, prompt=False):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str{' (one prompt per call)' if prompt else ''}, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode text (it holds a lone surrogate)") from None
    if not prompt and "\0" in value:
        raise ValueError(f"{name} holds a NUL character: {value!r}")
    return value


def _integer(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


_number = finite_float


def _stage_settings(value, name):
    """A stage's settings: a method name, or a dict of settings (str, number and bool values)."""
    if isinstance(value, str):
        return _text(value, name)
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a method name (str) or a dict of settings, got {type(value).__name__}")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{name}: setting names must be str, got {key!r}")
        where = f"{name}[{_text(key, f'{name} setting name')!r}]"
        if isinstance(item, (bool, np.bool_)):
            out[key] = bool(item)
        elif isinstance(item, numbers.Integral):
            out[key] = int(item)
        elif isinstance(item, numbers.Real):
            out[key] = _number(item, where)
        elif isinstance(item, str):
            out[key] = _text(item, where)
        else:
            raise TypeError(f"{where} must be a str, a number or a bool, got {type(item).__name__}")
    return out


def _seed(generator):
    """diffusers' generator as a seed: an int; None draws a fresh one (the report says which)."""
    if generator is None:
        return secrets.randbits(63)
    if isinstance(generator, bool) or not isinstance(generator, numbers.Integral):
        raise TypeError(f"generator must be an int seed (cubevec has no torch.Generator), got {type(generator).__name__}")
    if not 0 <= int(generator) < 2 ** 64:
        raise ValueError(f"generator must be a seed in [0, 2**64), got {generator}")
    return int(generator)


def _path(value, name):
    """A path as str: UTF-8, since cubevec's reports and files carry it as text."""
    if not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise TypeError(f"{name} must be a path (str, bytes or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    try:
        raw = os.fsencode(path)
        text = raw.decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ValueError(f"{name} must be UTF-8 (cubevec's reports carry it as text), got {repr(path)[:200]}") from None
    if "\0" in text:
        raise ValueError(f"{name} holds a NUL character: {repr(path)[:200]}")
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text


def _existing(path, name, folder):
    """OSError by errno for a path that is not there or not the kind asked for, naming it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no such {'model folder' if folder else 'file'} ({name})", path) from None
    except OSError as e:
        raise type(e)(e.errno, f"{e.strerror} ({name})", path) from None
    if folder and not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"not a folder ({name} is a model folder)", path)
    if not folder and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"a folder, not a file ({name})", path)
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        raise PermissionError(errno.EACCES, f"not readable ({name})", path)


def _png_bytes(pixels):
    """An 8-bit RGB PNG of an H x W x 3 uint8 array (filter 0 rows): lossless, so the library reads
    back exactly these pixels."""
    height, width = pixels.shape[:2]

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _picture(value, name, folder):
    """A picture argument as a file the library reads: a path as it is (PNG or JPEG); a PIL image or
    an H x W x 3 (or H x W grey) uint8 array written losslessly into `folder` first."""
    if isinstance(value, bytes) and (value[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xe1") or b"\0" in value):
        raise TypeError(f"{name}: got a picture's bytes; pass a path, a PIL image or a uint8 array (bytes are read as a path)")
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        path = _path(value, name)
        _existing(path, name, folder=False)
        return path
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image, made RGB as diffusers' load_image makes it
        path = os.path.join(folder, f"{name}.png")
        try:
            value.convert("RGB").save(path, format="PNG")
        except Exception as e:  # PIL's own errors (a closed or truncated image, an empty one)
            raise ValueError(f"{name}: this PIL image cannot be read ({type(e).__name__}: {e})") from None
        return path
    if isinstance(value, np.matrix):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] != 3) or 0 in value.shape:
            raise ValueError(f"{name} must be an H x W x 3 (or H x W) uint8 array, got {value.dtype} {list(value.shape)}")
        rgb = np.repeat(value[:, :, None], 3, axis=2) if value.ndim == 2 else value
        path = os.path.join(folder, f"{name}.png")
        with open(path, "wb") as f:
            f.write(_png_bytes(np.ascontiguousarray(rgb)))
        return path
    raise TypeError(f"{name} must be a path, a PIL image or a uint8 array, got {type(value).__name__}")


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


def _lora_flags(lora):
    """A LoRA file, a (file, scale) pair, or a list of them -> ["FILE:SCALE", ...], each file checked."""
    items = lora if isinstance(lora, list) else [lora]
    if not items:
        raise ValueError("lora must name at least one file (None: no LoRA)")
    if len(items) > 16:
        raise ValueError(f"lora may list at most 16 files, got {len(items)}")
    flags = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (str, bytes, os.PathLike)):
            raise TypeError("lora=(file, scale): the scale must be a number; give several files as a list, [file1, file2]")
        file, scale = item if isinstance(item, tuple) and len(item) == 2 else (item, 1.0)
        file = _path(file, "lora")
        _existing(file, "lora", folder=False)
        flags.append(f"{file}:{repr(_number(scale, 'lora scale'))}")
    return flags


class _DiffusionPipeline:
    _family = None

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_pretrained(cls, path, dtype="f32", variant=None, quant=None, timestep_policy=None, offload=None,
                        memory_limit=None, packed_cache=None, check_weights=False, lora=None, lora_ignore_unmatched=False,
                        lora_mode=None, quant_2=None):
        """Loads a diffusers model folder once.

        dtype "f32" or "bf16"; variant: the weight files' variant ("fp16" for
        diffusion_pytorch_model.fp16.safetensors); quant: a MindIE SD quantization description
        (JSON file; on a two-expert folder, Wan2.2 A14B, transformer/'s, and quant_2 transformer_2/'s);
        timestep_policy: its timestep policy file (W8A8_TIMESTEP); offload: transformer
        blocks kept resident under weight streaming; memory_limit: bytes (int) or a size such as
        "24G"; packed_cache: a folder for the packed GEMM panels other processes map;
        check_weights: scan every weight for NaN/inf; lora: a LoRA file (diffusers / PEFT, kohya
        Flux or Wan safetensors), a (file, scale) pair, or a list of them, fused into the transformer
        as diffusers' fuse_lora (lora_ignore_unmatched: skip a LoRA's layers the model lacks);
        lora_mode "fused" or "runtime" (beside each layer, the weights untouched; the default with
        quant). A call's own lora= applies at run time to that call only.
        """
        folder = _path(path, "path")
        if not isinstance(check_weights, (bool, np.bool_)):
            raise TypeError(f"check_weights must be a bool, got {type(check_weights).__name__}")
        options = {"dtype": _text(dtype, "dtype"), "check_weights": bool(check_weights)}
        if variant is not None:
            options["variant"] = _text(variant, "variant")
            if not variant:
                raise ValueError("variant must not be empty (None: the files without a variant)")
        for key, value in (("quant", quant), ("quant_2", quant_2), ("timestep_policy", timestep_policy),
                           ("packed_cache", packed_cache)):
            if value is not None:
                options[key] = _path(value, key)
        if quant_2 is not None and quant is None:
            raise ValueError("quant_2 (transformer_2/'s quantization) needs quant for transformer/ too")
        if timestep_policy is not None and quant is None:
            raise ValueError("timestep_policy applies with quant (a W8A8_TIMESTEP description)")
        if packed_cache is not None and offload is not None:
            raise ValueError("packed_cache does not combine with offload (the cache maps every layer's panels; offload streams the weights)")
        if offload is not None:
            options["offload"] = _integer(offload, "offload")
        if memory_limit is not None:
            if isinstance(memory_limit, numbers.Integral) and not isinstance(memory_limit, bool):
                if memory_limit <= 0:
                    raise ValueError(f"memory_limit must be a positive number of bytes, got {memory_limit}")
                memory_limit = str(int(memory_limit))
            elif not isinstance(memory_limit, str):
                raise TypeError(f"memory_limit must be an int (bytes) or a str such as '24G', got {type(memory_limit).__name__}")
            options["memory_limit"] = _text(memory_limit, "memory_limit")
        if lora is not None:
            options["lora"] = _lora_flags(lora)
        if lora_mode is not None:
            if _text(lora_mode, "lora_mode") not in ("fused", "runtime"):
                raise ValueError(f"lora_mode must be 'fused' or 'runtime', got {lora_mode!r}")
            if lora_mode == "fused" and quant is not None and lora is not None:
                raise ValueError("lora_mode='fused' with quant: the quantized layers load their int8 weights from the quantization's "
                                 "own files, so a fused LoRA would not reach them; use lora_mode='runtime' (the default with quant)")
            options["lora_mode"] = lora_mode
        if not isinstance(lora_ignore_unmatched, (bool, np.bool_)):
            raise TypeError(f"lora_ignore_unmatched must be a bool, got {type(lora_ignore_unmatched).__name__}")
        if lora_ignore_unmatched:
            options["lora_ignore_unmatched"] = True
        _existing(folder, "path", folder=True)
        for key in ("quant", "quant_2", "timestep_policy"):
            if key in options:
                _existing(options[key], key, folder=False)
        native = _Pipeline.load(folder, json.dumps(options))
        if cls._family is not None and native.family != cls._family:
            raise ValueError(f"{folder}: a {native.family} model, not {cls._family} (use the matching pipeline class)")
        return cls(native)

    def _call(self, request, output_type, callback_on_step_end, pictures=None):
        output_type = _output_type(output_type)
        with tempfile.TemporaryDirectory(prefix="cubevec-") as folder:
            for key, value in (pictures or {}).items():
                if value is not None:
                    request[key] = _picture(value, key, folder)
            try:
                return self._generate(request, output_type, callback_on_step_end)
            except (ValueError, Error) as e:  # a picture written here is named as the caller gave it, not by its temporary file
                if folder not in str(e):
                    raise
                message = str(e)
                for key in pictures or {}:
                    message = message.replace(os.path.join(folder, f"{key}.png"), f"(the {key} given)")
                raise type(e)(message) from None

    def _generate(self, request, output_type, callback_on_step_end):
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise TypeError(f"callback_on_step_end must be callable, got {type(callback_on_step_end).__name__}")
        checked = {}
        for key, value in request.items():
            if value is None:
                continue
            if key in ("prompt", "negative_prompt"):
                checked[key] = _text(value, key, prompt=True)
            elif key in ("cfg", "image", "mask_image", "last_image", "quant_attention"):
                checked[key] = _text(value, key)
            elif key == "strength":
                checked[key] = _number(value, key)
            elif key == "lora":
                checked[key] = _lora_flags(value)
            elif key == "auto_resize":
                if not isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"_auto_resize must be a bool, got {type(value).__name__}")
                checked[key] = bool(value)
            elif key in ("height", "width", "num_frames", "num_inference_steps", "max_sequence_length", "seed", "max_area"):
                checked[key] = value if key == "seed" else _integer(value, key)
            elif key in ("guidance_scale", "guidance_scale_2", "true_cfg_scale"):
                checked[key] = _number(value, key)
            else:
                checked[key] = _stage_settings(value, key)
        if "prompt" not in checked:
            raise ValueError("prompt is required (a str)")
        if not checked["prompt"].strip():
            raise ValueError("prompt must not be blank")

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
                 output_type="pil", callback_on_step_end=None, cache=None, sparse=None, quant_attention=None, cfg=None, image=None,
                 mask_image=None, strength=None, lora=None, max_area=None, _auto_resize=None):
        """Generates one image: .images[0] (a PIL image, or an HxWx3 uint8 array with output_type="np").

        image (a path, a PIL image or an H x W x 3 uint8 array) makes it image-to-image
        (FluxImg2ImgPipeline; strength, default 0.6, says how much is repainted), and mask_image
        (white: repaint) inpainting (FluxInpaintPipeline). On a FLUX.1 Kontext folder (model_index.json
        names FluxKontextPipeline) image is the reference the prompt edits (FluxKontextPipeline), with
        max_area (the output's pixels, default 1024 * 1024) and _auto_resize (the reference resized to
        Kontext's preferred resolutions, default True). lora (as from_pretrained's) applies at run time
        to this call only, over the loaded model. quant_attention="int8" runs every attention with
        Q K^T in int8 (SageAttention's scheme; lossy; CPUs with AMX-INT8, or AVX512-VNNI with AVX512-BF16)."""
        if cfg is None and true_cfg_scale is not None and _number(true_cfg_scale, "true_cfg_scale") > 1:
            if negative_prompt is not None:
                cfg = "fused"
            else:  # diffusers warns the same way
                warnings.warn("true_cfg_scale > 1 without a negative_prompt: true CFG stays off (diffusers' rule)", stacklevel=2)
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_inference_steps": num_inference_steps, "guidance_scale": guidance_scale,
                   "true_cfg_scale": true_cfg_scale, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse,
                   "quant_attention": quant_attention, "cfg": cfg,
                   "strength": strength, "lora": lora, "max_area": max_area, "auto_resize": _auto_resize}
        return self._call(request, output_type, callback_on_step_end, {"image": image, "mask_image": mask_image})


class WanPipeline(_DiffusionPipeline):
    """Wan text-to-video (diffusers' WanPipeline arguments); .frames[0] is the list of frames."""

    _family = "wan"

    def __call__(self, prompt=None, negative_prompt=None, height=None, width=None, num_frames=None,
                 num_inference_steps=None, guidance_scale=None, guidance_scale_2=None, generator=None,
                 max_sequence_length=None, output_type="np", callback_on_step_end=None, cache=None, sparse=None, quant_attention=None,
                 cfg=None, lora=None):
        """Generates one video: .frames[0] (PIL images, or HxWx3 uint8 arrays with output_type="np").

        guidance_scale_2 is the low-noise expert's CFG scale on a two-expert folder (Wan2.2 A14B:
        model_index.json's boundary_ratio; default guidance_scale). lora (as from_pretrained's)
        applies at run time to this call only, over the loaded model. quant_attention="int8" as in
        FluxPipeline."""
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_frames": num_frames, "num_inference_steps": num_inference_steps,
                   "guidance_scale": guidance_scale, "guidance_scale_2": guidance_scale_2, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse,
                   "quant_attention": quant_attention, "cfg": cfg,
                   "lora": lora}
        return self._call(request, output_type, callback_on_step_end)


class WanImageToVideoPipeline(_DiffusionPipeline):
    """Wan image-to-video (diffusers' WanImageToVideoPipeline arguments): image is the first frame and,
    on a first-last-frame checkpoint (Wan2.1 FLF2V; any Wan2.2 I2V), last_image the last; .frames[0]
    is the list of frames."""

    _family = "wan"

    def __call__(self, image=None, prompt=None, negative_prompt=None, height=None, width=None, num_frames=None,
                 num_inference_steps=None, guidance_scale=None, guidance_scale_2=None, generator=None,
                 max_sequence_length=None, output_type="np", callback_on_step_end=None, last_image=None, cache=None,
                 sparse=None, quant_attention=None, cfg=None, lora=None):
        """Generates one video from a picture (a path, a PIL image or an H x W x 3 uint8 array), resized
        to width x height: .frames[0] (PIL images, or HxWx3 uint8 arrays with output_type="np")."""
        if image is None:
            raise ValueError("image is required: the first frame (a path, a PIL image or an H x W x 3 uint8 array)")
        request = {"prompt": prompt, "negative_prompt": negative_prompt, "height": height, "width": width,
                   "num_frames": num_frames, "num_inference_steps": num_inference_steps,
                   "guidance_scale": guidance_scale, "guidance_scale_2": guidance_scale_2, "seed": _seed(generator),
                   "max_sequence_length": max_sequence_length, "cache": cache, "sparse": sparse,
                   "quant_attention": quant_attention, "cfg": cfg,
                   "lora": lora}
        return self._call(request, output_type, callback_on_step_end, {"image": image, "last_image": last_image})
