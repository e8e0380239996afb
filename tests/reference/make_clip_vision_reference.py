#!/usr/bin/python3
"""Reference implementation and committed test data for cubevec's CLIP vision encoder (Wan2.1 I2V's
image_encoder) and its image processor (Wan2.1 I2V's image_processor).

Run with Debian's torch (1.13) and Pillow (9.4), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_clip_vision_reference.py [OUTPUT_DIR]   # default tests/data

Written from transformers' source (read for facts only; transformers is not installed or used): the
model from models/clip/modeling_clip.py (CLIPVisionEmbeddings, CLIPAttention, CLIPMLP, CLIPEncoderLayer,
CLIPEncoder, CLIPVisionTransformer, CLIPVisionModel; activations.py for ACT2FN; the hidden-state capture of
utils/output_capturing.py), the processor from models/clip/image_processing_clip.py
(CLIPImageProcessor.resize / preprocess), image_transforms.py (get_resize_output_image_size, resize,
to_pil_image, center_crop, rescale, normalize, convert_to_rgb), image_processing_utils.py
(BaseImageProcessor.rescale / normalize / center_crop) and image_utils.py (infer_channel_dimension_format,
to_numpy_array); the resampler is Pillow's own (libImaging/Resample.c), called through PIL here exactly as
transformers calls it. It writes, under OUTPUT_DIR:

  clip_vision_tiny/         config.json (a CLIPVisionModel config in the format of Wan2.1-I2V's
                            image_encoder/config.json: hidden 32, 4 heads of 8, intermediate 64, 3 layers,
                            image 42, patch 14 -> 3x3 patches + class token = 10 tokens, hidden_act "gelu"),
                            model.safetensors (F32, transformers' names) and preprocessor_config.json (Wan2.1's
                            image_processor config with size / crop 42 instead of 224)
  clip_vision_tiny_quick/   config.json + model.safetensors: hidden_act "quick_gelu", hidden 24, 3 heads of 8,
                            intermediate 48, 2 layers, image 28 (2x2 patches + class = 5 tokens)
  images/portrait.png       a 61 x 97 RGB picture (gradients, a disc, noise, a black / white checker block so
                            the bicubic overshoot is clipped): downscaled to 42 and upscaled to 224, portrait
  goldens_clip_vision.safetensors   (all F32; layout as make_flux_reference.py: "<case>.<name>", each case's
                            JSON in __metadata__, keys starting with "_" describe the file)
      processor_<name>      for images/<name>.{png,jpg} (rgb.png 37x23, portrait.png 61x97, photo.jpg 37x23,
                            rotated.jpg 20x12 stored, 12x20 after its EXIF orientation):
                              pixel_values [1, 3, 42, 42]  through clip_vision_tiny/preprocessor_config.json
                              pixel_values_224_sampled [1, 3, 33, 33]  through the real Wan2.1 config
                                (shortest_edge 224, crop 224): the full [1, 3, 224, 224] result sampled at rows
                                and columns sample_index_224 = 0, 7, ..., 217, 223 (the whole tensor would be
                                600 KB per picture); sample_index_224 [33] is stored too
                              pixel_values_pad [1, 3, 23, 25] (rgb.png, portrait.png only): shortest_edge 20,
                                crop 23 x 25, larger than the resized picture on one side, so center_crop pads
                            The metadata names the picture, the configs, the sizes after the resize and the crop
                            offsets of each.
      vision_tiny           clip_vision_tiny: pixel_values [2, 3, 42, 42] (batch 0 = processor_portrait's
                            pixel_values, batch 1 = N(0, 1)) -> expected_penultimate_hidden_state [2, 10, 32]
                            (hidden_states[-2], what diffusers' WanImageToVideoPipeline.encode_image returns),
                            expected_last_hidden_state [2, 10, 32] (the last layer's output; no layer norm),
                            expected_pooler_output [2, 32] (post_layernorm of the class token);
                            intermediate.embeddings (before pre_layrnorm) and intermediate.hidden_state_<i> for
                            i = 0 .. 3 (hidden_states[i]: 0 = after pre_layrnorm, i = output of layer i - 1)
      vision_tiny_quick     clip_vision_tiny_quick: pixel_values [1, 3, 28, 28] (portrait.png through the tiny
                            processor config with size / crop 28, in the metadata) -> the same names, [1, 5, 24]

Facts used (transformers, read at the commits named in "_transformers_commits"; Pillow at
"_pillow_commit"). A C++ port must follow them bit for bit for the processor:

  Processor (CLIPImageProcessor.preprocess, the slow numpy / PIL processor that Wan2.1's
  preprocessor_config.json selects):
  * Input: diffusers gives the PIL picture the user loaded (diffusers.utils.load_image: Image.open,
    ImageOps.exif_transpose, .convert("RGB")); this script loads pictures that way. do_convert_rgb: a PIL
    image whose mode is not "RGB" gets .convert("RGB") (alpha dropped, not composited); then np.array(image):
    uint8 [H, W, 3]. The channel layout is guessed (infer_channel_dimension_format): a dimension of size 1 or 3
    first means channels first, so an RGB picture 1 or 3 pixels high would be misread (not exercised).
  * Resize size (get_resize_output_image_size, default_to_square=False, no max_size): short = min(H, W)
    (W if W <= H), long = the other; new_short = S, new_long = int(S * long / short), the Python float division
    truncated toward zero, i.e. floor(S * long / short) (for real sizes equal to the integer S * long // short:
    asserted); (out_h, out_w) = (new_long, S) if W <= H else (S, new_long). No special case when the short
    side already is S (PIL then returns a copy of the picture). Ties (W == H): both sides S.
  * Resize pixels (image_transforms.resize): the uint8 array is NOT converted to float: to_pil_image sees
    uint8 and makes PIL.Image.fromarray(array) (mode RGB) without rescaling, then
    image.resize((out_w, out_h), resample=3, reducing_gap=None), i.e. Pillow's BICUBIC on 8-bit RGB, and
    np.array of the result: uint8 [out_h, out_w, 3]. Pillow's BICUBIC (libImaging/Resample.c): the same
    two-pass, 22-bit fixed-point scheme as the LANCZOS one cubevec already ports (media/image_input.h:
    weights at (x + xmin - center + 0.5) / filterscale, center = (xx + 0.5) * scale, support 2 *
    filterscale, filterscale = max(in / out, 1), normalized per output pixel, rounded to int with
    (int)(w * 2^22 +- 0.5), accumulator starting at 2^21, result >> 22 clipped to [0, 255]; horizontal pass
    first into an 8-bit image, then vertical; a pass whose size does not change is skipped), with the kernel
    k(x) = ((a + 2)|x| - (a + 3))|x|^2 + 1 for |x| < 1, a(|x|^3 - 5|x|^2 + 8|x| - 4) for 1 <= |x| < 2, else 0,
    a = -0.5 (Keys' cubic).
  * Center crop (image_transforms.center_crop, on the uint8 image, before any rescale): top = (out_h - C_h) // 2,
    left = (out_w - C_w) // 2 with Python floor division (negative when the crop is larger). If the crop fits,
    rows top .. top + C_h - 1, columns left .. left + C_w - 1. Otherwise the picture is first placed in a zero
    (uint8 0) canvas of max(C_h, out_h) x max(C_w, out_w) at top_pad = ceil((new_h - out_h) / 2), left_pad =
    ceil((new_w - out_w) / 2), and the window starts at max(0, top + top_pad), max(0, left + left_pad). So a
    side that needs padding is padded ceil(d / 2) before and floor(d / 2) after (d = C - size); pad pixels are
    0 before rescale, so they become -mean / std after normalize.
  * Rescale (image_transforms.rescale, dtype float32 default): float32(float64(u8) * rescale_factor), the
    product in float64 (rescale_factor 0.00392156862745098 is the double nearest 1/255), then one rounding to
    f32. (Older transformers wrote `image * scale` on the uint8 array: NumPy 1.x also promotes that to float64,
    same values.)
  * Normalize (image_transforms.normalize on the f32 image): mean and std become np.float32 arrays (each value
    rounded to f32), and (x - mean) / std is computed in float32: out = f32(f32(x - mean_f32) / std_f32), two
    roundings, a true division (not a multiplication by 1 / std).
  * Then channels first ([3, C_h, C_w]), batched to [B, 3, C_h, C_w] f32 (return_tensors "pt").

  Model (CLIPVisionModel = vision_model: CLIPVisionTransformer):
  * embeddings: patch_embedding = Conv2d(num_channels, hidden, kernel = stride = patch_size, no bias) on the
    pixels (cast to the weight's dtype), flattened to [B, (H/p)(W/p), hidden] in row-major patch order;
    class_embedding [hidden] prepended as token 0; plus position_embedding.weight [num_patches + 1, hidden]
    (positions 0 .. num_patches, num_patches = (image_size // patch_size)^2; the input must be image_size square
    unless interpolate_pos_encoding, which Wan does not use).
  * pre_layrnorm (LayerNorm, eps layer_norm_eps) on all tokens; its output is the encoder's input and
    hidden_states[0].
  * each encoder layer (pre-LN): x = x + out_proj(attn(layer_norm1(x))); x = x + fc2(act(fc1(layer_norm2(x)))).
    attn: q_proj, k_proj, v_proj, out_proj are Linear(hidden, hidden) with bias; heads of head_dim = hidden /
    num_attention_heads; softmax(q k^T * head_dim^-0.5) v, no mask (eager and sdpa alike); act from ACT2FN:
    "gelu" = torch's exact erf GELU, "quick_gelu" = x * sigmoid(1.702 x).
  * hidden_states with output_hidden_states=True: (pre_layrnorm output, output of layer 0, ..., output of layer
    L - 1), L + 1 entries. Current transformers records them with forward hooks on CLIPEncoderLayer (the first
    layer's input, then every layer's output; CLIPVisionModel uses tie_last_hidden_states=False, so the last
    entry is the raw last-layer output); older versions appended the layer input before each layer and the
    final output after the loop: the same tuple. hidden_states[-2] is the output of layer L - 2 (for
    Wan2.1's 32-layer encoder: layer 30), so layer L - 1 and post_layernorm do not matter to Wan.
  * last_hidden_state = the last layer's output (NO final layer norm for the vision model);
    pooler_output = post_layernorm(last_hidden_state[:, 0]).
  * checkpoint names (model.safetensors of a CLIPVisionModel): vision_model.embeddings.class_embedding [hidden],
    vision_model.embeddings.patch_embedding.weight [hidden, 3, p, p], vision_model.embeddings.
    position_embedding.weight [num_patches + 1, hidden], vision_model.pre_layrnorm.{weight,bias},
    vision_model.encoder.layers.<n>.{self_attn.{q_proj,k_proj,v_proj,out_proj},layer_norm1,layer_norm2,
    mlp.fc1,mlp.fc2}.{weight,bias}, vision_model.post_layernorm.{weight,bias}. position_ids is a
    non-persistent buffer (checkpoints written by transformers before 4.31 may still hold
    vision_model.embeddings.position_ids: ignore it).

Numerics (as make_flux_reference.py): the models' weights are random, drawn in float64, rounded to
bf16-representable values and stored as F32; the models run in float64 on the f32 inputs and the results are
rounded to f32 once. The processor's pixels are computed exactly in transformers' dtypes (uint8 resize and crop,
float64 product rounded to f32, f32 normalize), so they are bit-exact (for this Pillow and libjpeg); every
resize is also recomputed with the two-pass fixed-point account of Pillow's BICUBIC above
(pillow_resample_axis) and asserted to give the same bytes.
Seeds are fixed, so the output is deterministic (same torch, numpy and Pillow versions, same bytes).
"""
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageOps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The golden / weight / file helpers of the Flux reference and the test picture of the image-input one.
from make_flux_reference import Goldens, bf16_representable, max_abs, write_json  # noqa: E402
from make_image_input_reference import picture  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

F64 = torch.float64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
GENERATOR = "tests/reference/make_clip_vision_reference.py"

# The stored versions of the transformers / Pillow files the facts above were read from.
TRANSFORMERS_COMMITS = {
    "src/transformers/models/clip/modeling_clip.py": "000f1ffdbf1ce6190cc8863af9a2fff817590937",
    "src/transformers/models/clip/image_processing_clip.py": "06053b84c14d72e9789fbf27844a75aa89b3ded7",
    "src/transformers/image_transforms.py": "000593ad84f26043f62917c541c57c4b71b9bc94",
    "src/transformers/image_processing_utils.py": "091630d58781404f2b35a7f5dff1c29bda71b549",
    "src/transformers/activations.py": "00e12e7c54598e50e7bef1540db3408f81916de1",
    "src/transformers/utils/output_capturing.py": "04569d0cbcbb14960dd78a3dcae80830856d44d8",
}
PILLOW_COMMIT = "src/libImaging/Resample.c@01f132fb086af790cbd67cfb0ad9aaac607ef567"


# =============================================================================================
# CLIPImageProcessor.preprocess (one picture)
# =============================================================================================
def load_image(path):
    """diffusers.utils.load_image: PIL's open, exif_transpose, convert("RGB")."""
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def resize_output_size(height, width, shortest_edge):
    """get_resize_output_image_size(default_to_square=False): (out_h, out_w); the long side is
    int(S * long / short), a Python float division truncated."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest_edge * long / short)
    assert new_long == shortest_edge * long // short, (height, width)  # the integer form a port may use
    return (new_long, shortest_edge) if width <= height else (shortest_edge, new_long)


def center_crop_u8(image, crop_h, crop_w):
    """image_transforms.center_crop on a uint8 [H, W, 3] image: floor-division offsets, zero padding placed
    ceil(d / 2) before when the crop is larger than the picture. Returns (crop, (top, left)) with top / left
    the window's offsets in the unpadded picture (negative where it was padded)."""
    h, w = image.shape[:2]
    top, left = (h - crop_h) // 2, (w - crop_w) // 2
    if top >= 0 and left >= 0 and top + crop_h <= h and left + crop_w <= w:
        return image[top:top + crop_h, left:left + crop_w], (top, left)
    new_h, new_w = max(crop_h, h), max(crop_w, w)
    canvas = np.zeros((new_h, new_w, image.shape[2]), dtype=image.dtype)
    top_pad, left_pad = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
    canvas[top_pad:top_pad + h, left_pad:left_pad + w] = image
    t, l = top + top_pad, left + left_pad
    out = canvas[max(0, t):min(new_h, t + crop_h), max(0, l):min(new_w, l + crop_w)]
    assert out.shape[:2] == (crop_h, crop_w), out.shape
    return out, (max(0, t) - top_pad, max(0, l) - left_pad)


def bicubic_kernel(x):
    """Pillow's bicubic_filter: Keys' cubic with a = -0.5, support 2."""
    a, x = -0.5, abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def pillow_resample_axis(image, out_size, axis):
    """One pass of Pillow's 8-bit resampler (precompute_coeffs + normalize_coeffs_8bpc + the 8bpc pass) along
    `axis` of a uint8 [H, W, 3] array, as the docstring describes it; skipped when the size is unchanged."""
    in_size = image.shape[axis]
    if in_size == out_size:
        return image
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    src = np.moveaxis(image, axis, 0).astype(np.int64)
    out = np.empty((out_size,) + src.shape[1:], dtype=np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = [bicubic_kernel((x + xmin - center + 0.5) / filterscale) for x in range(xmax)]
        ww = 0.0
        for w in k:
            ww += w
        k = [w / ww if ww != 0.0 else w for w in k]
        acc = np.full(src.shape[1:], 1 << 21, dtype=np.int64)
        for j, w in enumerate(k):
            acc += src[xmin + j] * (int(-0.5 + w * (1 << 22)) if w < 0 else int(0.5 + w * (1 << 22)))
        out[xx] = np.clip(acc >> 22, 0, 255)
    return np.moveaxis(out, 0, axis).astype(np.uint8)


def clip_preprocess(image, cfg):
    """CLIPImageProcessor.preprocess of one PIL picture with `cfg` (a preprocessor_config.json dict) ->
    ([1, 3, C_h, C_w] f32 torch tensor, info dict). Every do_* flag must be true (Wan's config)."""
    assert all(cfg[k] for k in ("do_convert_rgb", "do_resize", "do_center_crop", "do_rescale", "do_normalize"))
    if image.mode != "RGB":
        image = image.convert("RGB")
    array = np.array(image)  # uint8 [H, W, 3]
    assert array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3
    assert array.shape[0] not in (1, 3), "transformers would read this picture as channels-first"
    h, w = array.shape[:2]
    out_h, out_w = resize_output_size(h, w, cfg["size"]["shortest_edge"])
    # resize: PIL.Image.fromarray(uint8) -> Image.resize((w, h), resample, reducing_gap=None) -> np.array
    resized = np.array(Image.fromarray(array).resize((out_w, out_h), resample=cfg["resample"], reducing_gap=None))
    assert resized.dtype == np.uint8 and resized.shape == (out_h, out_w, 3)
    # The docstring's account of Pillow's BICUBIC (horizontal pass, then vertical) gives the same bytes.
    assert cfg["resample"] == 3
    assert np.array_equal(resized, pillow_resample_axis(pillow_resample_axis(array, out_w, 1), out_h, 0))
    cropped, (top, left) = center_crop_u8(resized, cfg["crop_size"]["height"], cfg["crop_size"]["width"])
    scaled = (cropped.astype(np.float64) * cfg["rescale_factor"]).astype(np.float32)  # rescale
    mean = np.array(cfg["image_mean"], dtype=np.float32)
    std = np.array(cfg["image_std"], dtype=np.float32)
    normalized = (scaled - mean) / std  # float32 arithmetic (numpy float32 arrays)
    assert normalized.dtype == np.float32
    pixels = torch.from_numpy(np.ascontiguousarray(normalized.transpose(2, 0, 1)))[None]
    info = dict(input_hw=[h, w], resized_hw=[out_h, out_w], crop_top_left=[top, left])
    return pixels, info


def preprocessor_config(shortest_edge, crop_h, crop_w=None):
    """Wan2.1-I2V's image_processor/preprocessor_config.json with other sizes."""
    return {
        "crop_size": {"height": crop_h, "width": crop_w if crop_w is not None else crop_h},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": shortest_edge},
    }


# =============================================================================================
# CLIPVisionModel
# =============================================================================================
class CLIPVisionEmbeddings(nn.Module):
    """class_embedding, patch_embedding (Conv2d, stride = kernel = patch_size, no bias), position_embedding."""

    def __init__(self, cfg):
        super().__init__()
        d, p = cfg["hidden_size"], cfg["patch_size"]
        self.num_patches = (cfg["image_size"] // p) ** 2
        self.class_embedding = nn.Parameter(torch.zeros(d))
        self.patch_embedding = nn.Conv2d(cfg["num_channels"], d, kernel_size=p, stride=p, bias=False)
        self.position_embedding = nn.Embedding(self.num_patches + 1, d)

    def forward(self, pixel_values):
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))  # [B, D, h, w]
        patches = patches.flatten(2).transpose(1, 2)  # [B, h * w, D], row-major over the patch grid
        assert patches.shape[1] == self.num_patches, "the picture must be image_size square"
        cls = self.class_embedding[None, None, :].expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight[None]


class CLIPAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.head_dim = d // self.heads
        assert self.head_dim * self.heads == d
        self.scale = self.head_dim ** -0.5
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape

        def split(t):
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, hd]

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(b, s, -1)
        return self.out_proj(out)


def activation(name):
    if name == "gelu":
        return lambda x: F.gelu(x)  # exact (erf) GELU
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    raise ValueError(name)


class CLIPMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.act = activation(cfg["hidden_act"])
        self.fc1 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])
        self.fc2 = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"])

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.self_attn = CLIPAttention(cfg)
        self.layer_norm1 = nn.LayerNorm(d, eps=eps)
        self.mlp = CLIPMLP(cfg)
        self.layer_norm2 = nn.LayerNorm(d, eps=eps)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])


class CLIPVisionTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(d, eps=eps)  # sic: transformers' name
        self.encoder = CLIPEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(d, eps=eps)


class CLIPVisionModel(nn.Module):
    """state_dict() keys as a transformers CLIPVisionModel checkpoint (vision_model.*)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.vision_model = CLIPVisionTransformer(cfg)

    def forward(self, pixel_values):
        """-> dict: embeddings (before pre_layrnorm), hidden_states (L + 1 entries, as output_hidden_states=True
        gives them), last_hidden_state, pooler_output."""
        vm = self.vision_model
        embeddings = vm.embeddings(pixel_values)
        x = vm.pre_layrnorm(embeddings)
        hidden_states = [x]
        for layer in vm.encoder.layers:
            x = layer(x)
            hidden_states.append(x)
        return dict(embeddings=embeddings, hidden_states=hidden_states, last_hidden_state=x,
                    pooler_output=vm.post_layernorm(x[:, 0, :]))


def expected_shapes(cfg):
    """The checkpoint's names and shapes (transformers' CLIPVisionModel), to check the module tree against."""
    d, m, p = cfg["hidden_size"], cfg["intermediate_size"], cfg["patch_size"]
    n = (cfg["image_size"] // p) ** 2 + 1
    v = "vision_model."
    shapes = {v + "embeddings.class_embedding": [d],
              v + "embeddings.patch_embedding.weight": [d, cfg["num_channels"], p, p],
              v + "embeddings.position_embedding.weight": [n, d]}
    for norm in ("pre_layrnorm", "post_layernorm"):
        shapes[f"{v}{norm}.weight"] = shapes[f"{v}{norm}.bias"] = [d]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"{v}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{pre}self_attn.{proj}.weight"], shapes[f"{pre}self_attn.{proj}.bias"] = [d, d], [d]
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"{pre}{norm}.weight"] = shapes[f"{pre}{norm}.bias"] = [d]
        shapes[f"{pre}mlp.fc1.weight"], shapes[f"{pre}mlp.fc1.bias"] = [m, d], [m]
        shapes[f"{pre}mlp.fc2.weight"], shapes[f"{pre}mlp.fc2.bias"] = [d, m], [d]
    return shapes


def vision_config(hidden_act, hidden_size, heads, intermediate, layers, image_size, projection_dim):
    """A config.json in the format of Wan2.1-I2V's image_encoder/config.json (transformers_version is a
    label: a loader must not depend on it)."""
    return {
        "architectures": ["CLIPVisionModel"],
        "attention_dropout": 0.0,
        "dropout": 0.0,
        "hidden_act": hidden_act,
        "hidden_size": hidden_size,
        "image_size": image_size,
        "initializer_factor": 1.0,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "layer_norm_eps": 1e-05,
        "model_type": "clip_vision_model",
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": 14,
        "projection_dim": projection_dim,
        "torch_dtype": "float32",
        "transformers_version": "4.48.0",
    }


TINY_CONFIG = vision_config("gelu", 32, 4, 64, 3, 42, 16)
QUICK_CONFIG = vision_config("quick_gelu", 24, 3, 48, 2, 28, 12)
TINY_PROCESSOR = preprocessor_config(42, 42)
REAL_PROCESSOR = preprocessor_config(224, 224)  # Wan2.1-I2V's own
PAD_PROCESSOR = preprocessor_config(20, 23, 25)  # crop larger than the resized picture on one side
QUICK_PROCESSOR = preprocessor_config(28, 28)


def init_weights(model, seed):
    """Random weights, bf16-representable: Linear / conv weights N(0, 1/fan_in); biases N(0, 0.1^2); LayerNorm
    weights U(0.8, 1.2) (near 1, none exactly 1); class and position embeddings N(0, 0.5^2) (the patch
    embeddings of normalized pixels are O(1) too), so activations stay O(1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("class_embedding", "position_embedding.weight")):
                v = torch.randn(p.shape, generator=gen, dtype=F64) * 0.5
            elif name.endswith(".weight") and p.ndim >= 2:
                v = torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(p[0].numel())
            elif name.endswith(".weight"):  # LayerNorm
                v = torch.rand(p.shape, generator=gen, dtype=F64) * 0.4 + 0.8
            else:
                v = torch.randn(p.shape, generator=gen, dtype=F64) * 0.1
            p.copy_(bf16_representable(v))
    return model


def save_model(directory, model):
    """config.json and model.safetensors (F32, transformers' file name), read back and checked."""
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    assert {k: list(v.shape) for k, v in state.items()} == expected_shapes(model.cfg), "module tree differs"
    write_json(os.path.join(directory, "config.json"), model.cfg)
    path = os.path.join(directory, "model.safetensors")
    write_safetensors(path, state, {"format": "pt"})
    back, _ = read_safetensors(path)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in back), path


# =============================================================================================
# The test picture
# =============================================================================================
PORTRAIT_W, PORTRAIT_H = 61, 97


def portrait_pixels():
    """make_image_input_reference.picture (gradients, a disc, noise) at 61 x 97, with an 8 x 8 black / white
    checker block (2-pixel squares) at rows 70..77, columns 6..13: the bicubic filter overshoots there and
    Pillow clips."""
    rgb = picture(PORTRAIT_W, PORTRAIT_H, 7)
    y, x = np.mgrid[0:8, 0:8]
    rgb[70:78, 6:14] = np.where(((y // 2 + x // 2) % 2 == 0)[:, :, None], 255, 0).astype(np.uint8)
    return rgb


def write_portrait(path):
    """Writes images/portrait.png unless a file there already holds exactly these pixels (PNG bytes depend on
    zlib; the pixels are what the goldens use)."""
    rgb = portrait_pixels()
    if os.path.exists(path):
        old = Image.open(path)
        if old.mode == "RGB" and np.array_equal(np.array(old), rgb):
            return "kept"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(rgb, "RGB").save(path)
    assert np.array_equal(np.array(Image.open(path)), rgb)
    return "written"


# =============================================================================================
# The cases
# =============================================================================================
SAMPLE_INDEX_224 = list(range(0, 224, 7)) + [223]  # 33 rows / columns, both edges included
PICTURES = [("rgb", "rgb.png", True), ("portrait", "portrait.png", True), ("photo", "photo.jpg", False),
            ("rotated", "rotated.jpg", False)]  # (case, file, with the padded-crop case)


def picture_path(fname):
    """portrait.png as this run wrote it (under OUTPUT_DIR), the other pictures from the repository's
    tests/data/images (written by make_image_input_reference.py)."""
    folder = OUT_DIR if fname == "portrait.png" else os.path.join(ROOT, "tests", "data")
    return os.path.join(folder, "images", fname)


def processor_cases(g, report):
    """processor_<name>; returns {name: pixel_values (tiny config)}."""
    out = {}
    for name, fname, pad in PICTURES:
        image = load_image(picture_path(fname))
        pixels, info = clip_preprocess(image, TINY_PROCESSOR)
        full_224, info_224 = clip_preprocess(image, REAL_PROCESSOR)
        assert list(full_224.shape) == [1, 3, 224, 224]
        idx = torch.tensor(SAMPLE_INDEX_224)
        sampled = full_224[:, :, idx][:, :, :, idx].contiguous()
        tensors = {"pixel_values": pixels, "pixel_values_224_sampled": sampled,
                   "sample_index_224": idx.float()}
        params = dict(op="clip_image_processor", image=f"images/{fname}",
                      load="diffusers.utils.load_image: Image.open, ImageOps.exif_transpose, convert('RGB')",
                      input_hw=info["input_hw"],
                      pixel_values=dict(config="clip_vision_tiny/preprocessor_config.json", **info),
                      pixel_values_224_sampled=dict(config=REAL_PROCESSOR, sample_index=SAMPLE_INDEX_224,
                                                    full_shape=[1, 3, 224, 224],
                                                    full_sum_f64=float(full_224.double().sum()),
                                                    full_max_abs=max_abs(full_224),
                                                    resized_hw=info_224["resized_hw"],
                                                    crop_top_left=info_224["crop_top_left"]),
                      note="pixel_values_224_sampled = the [1, 3, 224, 224] result at rows and columns "
                           "sample_index_224 (t[:, :, idx][:, :, :, idx]); full_sum_f64 is the float64 sum "
                           "of all 150528 f32 values")
        if pad:
            padded, info_pad = clip_preprocess(image, PAD_PROCESSOR)
            tensors["pixel_values_pad"] = padded
            params["pixel_values_pad"] = dict(config=PAD_PROCESSOR, **info_pad)
        g.add(f"processor_{name}", params, tensors)
        out[name] = pixels
        report[f"processor_{name}"] = dict(input=f"{info['input_hw'][1]}x{info['input_hw'][0]}",
                                           resized_42=f"{info['resized_hw'][1]}x{info['resized_hw'][0]}",
                                           top_left_42=info["crop_top_left"],
                                           resized_224=f"{info_224['resized_hw'][1]}x{info_224['resized_hw'][0]}",
                                           top_left_224=info_224["crop_top_left"])
    return out


def vision_case(g, case, model, weights, pixel_values, params, report):
    with torch.no_grad():
        out = model(pixel_values.double())
        hs = out["hidden_states"]
        n = len(model.vision_model.encoder.layers)
        assert len(hs) == n + 1
        tensors = {"pixel_values": pixel_values,
                   "expected_penultimate_hidden_state": hs[-2],
                   "expected_last_hidden_state": out["last_hidden_state"],
                   "expected_pooler_output": out["pooler_output"],
                   "intermediate.embeddings": out["embeddings"]}
        tensors.update({f"intermediate.hidden_state_{i}": h for i, h in enumerate(hs)})
        # An f32 run of the same weights, as a tolerance hint.
        m32 = copy.deepcopy(model).float()
        out32 = m32(pixel_values.float())
        f32_err = max(max_abs(out32["hidden_states"][-2].double() - hs[-2]),
                      max_abs(out32["pooler_output"].double() - out["pooler_output"]))
    params = dict(params, op="clip_vision_model", weights=weights, num_hidden_layers=n,
                  hidden_states="intermediate.hidden_state_<i> = hidden_states[i]: 0 = pre_layrnorm output, "
                                "i > 0 = output of encoder layer i - 1; penultimate = hidden_states[-2] = "
                                f"hidden_state_{n - 1}; last_hidden_state = hidden_state_{n} (no final norm); "
                                "pooler_output = post_layernorm(last_hidden_state[:, 0])",
                  f32_run_max_diff=f32_err)
    g.add(case, params, tensors)
    report[case] = dict(max_abs_penultimate=max_abs(hs[-2]), max_abs_last=max_abs(out["last_hidden_state"]),
                        max_abs_pooler=max_abs(out["pooler_output"]), f32_run_max_diff=f32_err)


def main():
    report = {}
    portrait_status = write_portrait(os.path.join(OUT_DIR, "images", "portrait.png"))

    tiny = init_weights(CLIPVisionModel(TINY_CONFIG), 9101).double().eval()
    quick = init_weights(CLIPVisionModel(QUICK_CONFIG), 9102).double().eval()
    tiny_dir, quick_dir = os.path.join(OUT_DIR, "clip_vision_tiny"), os.path.join(OUT_DIR, "clip_vision_tiny_quick")
    save_model(tiny_dir, tiny)
    write_json(os.path.join(tiny_dir, "preprocessor_config.json"), TINY_PROCESSOR)
    save_model(quick_dir, quick)

    g = Goldens(9100, meta={
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_numpy_version": np.__version__,
        "_pillow_version": Image.__version__,
        "_seed": "9100",
        "_transformers_commits": json.dumps(TRANSFORMERS_COMMITS, sort_keys=True),
        "_pillow_commit": PILLOW_COMMIT,
        "_numerics": "processor pixels exactly in transformers' dtypes (uint8 PIL bicubic resize and crop, "
                     "f32(f64(u8) * rescale_factor), f32 (x - mean) / std); models in float64 on f32 inputs and "
                     "bf16-representable weights, results rounded to f32 (see the generator's docstring)",
    })
    processed = processor_cases(g, report)

    pixel_values = torch.cat([processed["portrait"], g.randn((1, 3, 42, 42))], dim=0)
    vision_case(g, "vision_tiny", tiny, "clip_vision_tiny", pixel_values,
                dict(pixel_values="batch 0: processor_portrait.pixel_values; batch 1: N(0, 1)"), report)
    quick_pixels, quick_info = clip_preprocess(load_image(picture_path("portrait.png")),
                                               QUICK_PROCESSOR)
    vision_case(g, "vision_tiny_quick", quick, "clip_vision_tiny_quick", quick_pixels,
                dict(pixel_values="images/portrait.png through the processor config below",
                     processor=dict(config=QUICK_PROCESSOR, **quick_info)), report)

    path = os.path.join(OUT_DIR, "goldens_clip_vision.safetensors")
    g.write(path)

    # ---- summary ---------------------------------------------------------------------------------
    for p in [os.path.join(tiny_dir, f) for f in ("config.json", "model.safetensors", "preprocessor_config.json")] + \
             [os.path.join(quick_dir, f) for f in ("config.json", "model.safetensors")] + \
             [os.path.join(OUT_DIR, "images", "portrait.png"), path]:
        print(f"{os.path.relpath(p, ROOT)}: {os.path.getsize(p)} bytes")
    print(f"images/portrait.png: {portrait_status}")
    print(f"{len(g.tensors)} tensors; max |value| of each golden:")
    for k in sorted(g.tensors):
        t = g.tensors[k]
        print(f"  {k:<52} {str(list(t.shape)):<18} {max_abs(t):.6g}")
    for k, v in report.items():
        print(f"  {k}: " + ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items()))


if __name__ == "__main__":
    main()
