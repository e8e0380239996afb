#!/usr/bin/python3
"""Reference and committed test data for cubevec's Wan image-to-video (Wan2.1 I2V, FLF2V) and Wan2.2 A14B
two-expert ports.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_wan_i2v_reference.py [OUTPUT_DIR]   # default tests/data

Plain torch; diffusers is not used (nor installed). It extends the existing references instead of
rewriting them: the T2V transformer, the VAE decoder, the weight / file helpers and the numerics come from
make_wan_reference.py, the VAE encoder from make_wan_vae_encoder_reference.py, the FlowMatch Euler scheduler
and Goldens from make_flux_reference.py, the UniPC sigma / timestep grid from make_unipc_reference.py.
Committed inputs are read from tests/data (whatever OUTPUT_DIR is): tests/data/images/{rgb.png, photo.jpg},
tests/data/vae_encoder/wan (copied), tests/data/wan_tiny/{vae, scheduler} (copied), and two golden files used
only to check that the loaded VAEs reproduce their own goldens. It writes, under OUTPUT_DIR:

  wan_i2v_tiny/       WanImageToVideoPipeline folder: transformer/ (the wan_tiny sizes with in_channels 12 =
                      4 noise + 4 mask + 4 condition, out_channels 4, image_dim 32, added_kv_proj_dim 32,
                      pos_embed_seq_len null; its checkpoint also holds blocks.N.attn2.norm_added_q.weight, which
                      diffusers ignores on load), vae/ (a byte copy of vae_encoder/wan: the whole VAE, z_dim 4),
                      scheduler/ (a copy of wan_tiny/scheduler: FlowMatch Euler, shift 3), model_index.json.
                      No image_encoder/ (tests/data/clip_vision_tiny is written elsewhere: hidden 32, 10 tokens).
  wan_flf2v_tiny/     the same with pos_embed_seq_len 20 (two pictures of 10 tokens), no norm_added_q tensors
  wan22_tiny_a14b/    WanPipeline folder with two experts: transformer/ (high noise) and transformer_2/ (low
                      noise), both T2V with the wan_tiny/transformer config and their own seeds, vae/ and
                      scheduler/ copied from wan_tiny, model_index.json with boundary_ratio 0.75 (4 Euler shift-3
                      steps: timesteps 1000, 857.69, 602.15, 8.93 -> experts high, high, low, low)
  goldens_wan_i2v.safetensors   the goldens (F32), cases described in __metadata__ and in the README

Numerics: as make_wan_reference.py (the models in float64 on f32 inputs and bf16-representable weights,
results rounded to f32 once; the timestep sinusoid and the RoPE table as an f32 diffusers run, by reusing
its forward). The pipelines follow an f32 run: latents f32 between steps, CFG combined in float64 and
rounded to f32, the f32 Euler step; the condition latents are the float64 encoder's mean rounded to f32,
normalized in f32 as the pipeline does. Images: diffusers' load_image (EXIF transpose, RGB), then
VaeImageProcessor.preprocess: PIL resize to (width, height) with LANCZOS (reducing_gap None), then
np.float32(pixel) / 255 (an f32 division), then 2 * x - 1 in f32.

diffusers facts used (read from its source for facts only: models/transformers/transformer_wan.py,
pipelines/wan/pipeline_wan_i2v.py and pipeline_wan.py, image_processor.py, video_processor.py,
utils/loading_utils.py, models/autoencoders/autoencoder_kl_wan.py):
  * WanAttnProcessor with add_k_proj: the context is [image tokens ; text], the text is the last 512 rows
    (hard-coded); q = norm_q(to_q(x)) is shared; out = to_out(attn(q, k_txt, v_txt) + attn(q, k_img, v_img))
    with k_img = norm_added_k(add_k_proj(img)) (RMSNorm over all heads' channels, eps = the model eps, with
    a weight), v_img = add_v_proj(img); no RoPE in the cross-attention.
  * WanImageEmbedding: with pos_embed [1, P, image_dim], the states are viewed as [-1, 2 * seq, image_dim]
    and pos_embed is added; then norm1 (LayerNorm(image_dim), eps 1e-5, affine), ff = Linear(image_dim,
    image_dim) + exact GELU + Linear(image_dim, dim) (ff.net.0.proj, ff.net.2), norm2 (LayerNorm(dim), eps
    1e-5, affine). The model concatenates [image_embedder(img) ; text_embedder(text)].
  * WanImageToVideoPipeline: video_condition = [image, zeros] or [image, zeros, last_image] (num_frames in
    all), vae.encode(...).latent_dist.mode() (the mean), (z - mean) * (1 / std) in f32; the mask: ones
    [B, 1, num_frames, h, w], frames 1 .. (num_frames - 1 or num_frames - 2) zero, frame 0 repeated 4 times
    (vae scale_factor_temporal), viewed [B, -1, 4, h, w] and transposed: [B, 4, T', h, w];
    condition = cat([mask, latent_condition], 1); each step cat([latents, condition], 1) goes to the model
    with encoder_hidden_states_image = image_embeds (cond and uncond alike).
  * Experts (both pipelines, same rule): boundary = boundary_ratio * scheduler.config.num_train_timesteps;
    `t >= boundary` (t the scheduler's timestep tensor element: f32 for FlowMatch Euler, int64 for UniPC,
    so the comparison is in f32) -> transformer with guidance_scale, else transformer_2 with
    guidance_scale_2 (default: guidance_scale).
Seeds are fixed: with the same torch, numpy and PIL the output is byte-identical.
"""
import copy
import json
import math
import os
import shutil
import sys

import numpy as np
from safetensors_io import write_safetensors
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageOps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_unipc_reference as unipc  # noqa: E402  (flow_grid: UniPC's sigmas and int64 timesteps)
import make_wan_reference as wan  # noqa: E402  (T2V transformer, VAE decoder, configs, weights, files)
import make_wan_vae_encoder_reference as wan_enc  # noqa: E402  (the whole AutoencoderKLWan, encode path)
from make_flux_reference import (FeedForward, FlowMatchEulerDiscreteScheduler, Goldens, RMSNorm,  # noqa: E402
                                 bf16_representable, euler_step, max_abs, sdpa, write_json)
from safetensors_io import read_safetensors  # noqa: E402

F32, F64 = torch.float32, torch.float64
ROOT = wan.ROOT
SRC_DIR = os.path.join(ROOT, "tests", "data")  # committed inputs, read whatever OUT_DIR is
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else SRC_DIR
GENERATOR = "tests/reference/make_wan_i2v_reference.py"
TEXT_LEN = 512  # WanAttnProcessor: the text is the last 512 rows of the cross-attention context
IMAGE_TOKENS = 10  # tokens per picture of the tiny CLIP vision model (tests/data/clip_vision_tiny)
IMAGE_DIM = 32  # its hidden size
NUM_FRAMES = 9
HEIGHT, WIDTH = 32, 48
IMAGE_FILES = ("images/rgb.png", "images/photo.jpg")  # first and last picture, relative to tests/data
A14B_BOUNDARY = 0.75  # 4 Euler shift-3 steps (t = 1000, 857.69, 602.15, 8.93): high, high, low, low


# =============================================================================================
# WanTransformer3DModel with the I2V parts (image_dim, added_kv_proj_dim, pos_embed_seq_len)
# =============================================================================================
class GELUExact(nn.Module):
    """diffusers' activations.GELU with approximate "none": a `proj` Linear, then the erf GELU."""

    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return F.gelu(self.proj(x))


class WanImageEmbedding(nn.Module):
    """condition_embedder.image_embedder: [+ pos_embed], norm1, ff (mult 1, exact GELU), norm2."""

    def __init__(self, in_features, out_features, pos_embed_seq_len=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(in_features, eps=1e-5)  # FP32LayerNorm: nn.LayerNorm's defaults
        self.ff = FeedForward(in_features, out_features, inner_dim=in_features)
        self.ff.net[0] = GELUExact(in_features, in_features)  # activation_fn "gelu", not "gelu-approximate"
        self.norm2 = nn.LayerNorm(out_features, eps=1e-5)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_embed_seq_len, in_features)) if pos_embed_seq_len else None

    def forward(self, image_states):
        if self.pos_embed is not None:
            _, seq, dim = image_states.shape
            image_states = image_states.reshape(-1, 2 * seq, dim) + self.pos_embed  # FLF2V: 2 pictures per sample
        return self.norm2(self.ff(self.norm1(image_states)))


class WanTimeTextImageEmbedding(wan.WanConditionEmbedder):
    """The T2V condition embedder plus image_embedder; returns the context [image_embedder(img) ; text].
    The model sets `image_states` (and `record`) for the length of one forward (the parent forward takes
    no image argument)."""

    def __init__(self, dim, freq_dim, text_dim, image_dim, pos_embed_seq_len):
        super().__init__(dim, freq_dim, text_dim)
        self.image_embedder = WanImageEmbedding(image_dim, dim, pos_embed_seq_len)
        self.image_states = None
        self.record = None

    def forward(self, timestep, encoder_hidden_states):
        temb, timestep_proj, text = super().forward(timestep, encoder_hidden_states)
        assert self.image_states is not None, "an I2V transformer needs encoder_hidden_states_image"
        image = self.image_embedder(self.image_states)
        if self.record is not None:
            self.record.update({"image_context": image, "text_context": text})
        return temb, timestep_proj, torch.cat([image, text], dim=1)


class WanI2VCrossAttention(wan.WanAttention):
    """attn2 with add_k_proj / add_v_proj / norm_added_k: two attentions sharing q, summed before to_out."""

    def __init__(self, dim, heads, eps, added_kv_proj_dim):
        super().__init__(dim, heads, eps)
        self.add_k_proj = nn.Linear(added_kv_proj_dim, dim)
        self.add_v_proj = nn.Linear(added_kv_proj_dim, dim)
        self.norm_added_k = RMSNorm(dim, eps)

    def forward(self, x, context=None, rope=None):
        assert context is not None and rope is None and context.shape[1] > TEXT_LEN, context.shape
        n_image = context.shape[1] - TEXT_LEN
        image, text = context[:, :n_image], context[:, n_image:]

        def heads(t):
            return t.unflatten(2, (self.heads, -1))

        q = heads(self.norm_q(self.to_q(x)))
        k, v = heads(self.norm_k(self.to_k(text))), heads(self.to_v(text))
        k_img, v_img = heads(self.norm_added_k(self.add_k_proj(image))), heads(self.add_v_proj(image))
        return self.to_out[0](sdpa(q, k, v) + sdpa(q, k_img, v_img))


class WanI2VTransformer3DModel(wan.WanTransformer3DModel):
    """WanTransformer3DModel with image_dim and added_kv_proj_dim set (Wan2.1 I2V / FLF2V)."""

    def __init__(self, config):
        super().__init__(dict(config, image_dim=None, added_kv_proj_dim=None, pos_embed_seq_len=None))
        extra = {k: config[k] for k in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len")}
        assert extra["image_dim"] is not None and extra["added_kv_proj_dim"] is not None, extra
        self.cfg.update(extra)
        c = self.cfg
        self.condition_embedder = WanTimeTextImageEmbedding(self.dim, c["freq_dim"], c["text_dim"], c["image_dim"],
                                                            c["pos_embed_seq_len"])
        for block in self.blocks:
            block.attn2 = WanI2VCrossAttention(self.dim, c["num_attention_heads"], c["eps"], c["added_kv_proj_dim"])

    def forward(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_image, record=None):
        """As the T2V forward, with encoder_hidden_states_image [B or 2B, tokens, image_dim]; `record` also
        receives image_context (the image_embedder output) and text_context (the text_embedder output)."""
        emb = self.condition_embedder
        emb.image_states, emb.record = encoder_hidden_states_image, record
        try:
            return super().forward(hidden_states, timestep, encoder_hidden_states, record)
        finally:
            emb.image_states = emb.record = None


def expected_i2v_shapes(cfg):
    """make_wan_reference's T2V names and shapes plus the I2V parameters (diffusers' names)."""
    shapes = wan.expected_transformer_shapes(cfg)
    d, img, kv = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["image_dim"], cfg["added_kv_proj_dim"]
    p = "condition_embedder.image_embedder."
    shapes.update({p + "norm1.weight": [img], p + "norm1.bias": [img], p + "ff.net.0.proj.weight": [img, img],
                   p + "ff.net.0.proj.bias": [img], p + "ff.net.2.weight": [d, img], p + "ff.net.2.bias": [d],
                   p + "norm2.weight": [d], p + "norm2.bias": [d]})
    if cfg["pos_embed_seq_len"]:
        shapes[p + "pos_embed"] = [1, cfg["pos_embed_seq_len"], img]
    for n in range(cfg["num_layers"]):
        a = f"blocks.{n}.attn2."
        shapes.update({a + "add_k_proj.weight": [d, kv], a + "add_k_proj.bias": [d], a + "add_v_proj.weight": [d, kv],
                       a + "add_v_proj.bias": [d], a + "norm_added_k.weight": [d]})
    return shapes


I2V_CONFIG = dict(wan.TRANSFORMER_CONFIG, in_channels=12, out_channels=4, image_dim=IMAGE_DIM, added_kv_proj_dim=32,
                  pos_embed_seq_len=None)
FLF2V_CONFIG = dict(I2V_CONFIG, pos_embed_seq_len=2 * IMAGE_TOKENS)
POS_EMBED_STD = 0.5  # so adding the position table moves the image context clearly


def make_i2v_transformer(config, seed):
    """make_wan_reference.init_transformer's distributions; pos_embed redrawn N(0, 0.5^2) (init_transformer
    would give it a bias's 0.1). Returns the float64 model."""
    model = wan.init_transformer(WanI2VTransformer3DModel(config), seed)
    pos = model.condition_embedder.image_embedder.pos_embed
    if pos is not None:
        gen = torch.Generator().manual_seed(seed + 50)
        with torch.no_grad():
            pos.copy_(bf16_representable(torch.randn(pos.shape, generator=gen, dtype=F64) * POS_EMBED_STD))
    model = model.double().eval()
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == expected_i2v_shapes(model.cfg), sorted(set(got) ^ set(expected_i2v_shapes(model.cfg)))
    return model


def norm_added_q_tensors(cfg, seed):
    """blocks.N.attn2.norm_added_q.weight [D]: older diffusers conversions stored it (Attention built it for
    rms_norm_across_heads before diffusers 1357931d); WanTransformer3DModel lists "norm_added_q" in
    _keys_to_ignore_on_load_unexpected. Random U(0.5, 1.5), so a loader that used it would be caught."""
    gen = torch.Generator().manual_seed(seed)
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return {f"blocks.{n}.attn2.norm_added_q.weight": bf16_representable(torch.rand(d, generator=gen, dtype=F64) + 0.5)
            for n in range(cfg["num_layers"])}


# =============================================================================================
# Files
# =============================================================================================
DIFFUSERS_VERSION = wan.DIFFUSERS_VERSION


def model_index(class_name, image_components, transformer_2, boundary_ratio):
    """model_index.json as diffusers saves these pipelines (components ["library", "Class"], absent optional
    ones [null, null]; boundary_ratio and expand_timesteps are pipeline config). The scheduler is the Euler
    one the folder holds (the Wan-AI repos ship UniPC)."""
    index = {
        "_class_name": class_name,
        "_diffusers_version": DIFFUSERS_VERSION,
        "boundary_ratio": boundary_ratio,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"] if transformer_2 else [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    if image_components:
        index["image_encoder"] = ["transformers", "CLIPVisionModel"]
        index["image_processor"] = ["transformers", "CLIPImageProcessor"]
    return index


def copy_folder(src, dst):
    """Byte copies of the files of src (a model component folder) into dst."""
    os.makedirs(dst, exist_ok=True)
    for name in sorted(os.listdir(src)):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load_whole_vae(directory):
    """make_wan_vae_encoder_reference.AutoencoderKLWan (encoder and decoder) from a checkpoint folder."""
    cfg = read_json(os.path.join(directory, "config.json"))
    state, _ = read_safetensors(os.path.join(directory, "diffusion_pytorch_model.safetensors"))
    model = wan_enc.AutoencoderKLWan(cfg).double().eval()
    model.load_state_dict(state, strict=True)
    return model, cfg


def load_vae_decoder(directory):
    """make_wan_reference.AutoencoderKLWanDecoder from a folder (encoder tensors, if any, ignored)."""
    cfg = read_json(os.path.join(directory, "config.json"))
    state, _ = read_safetensors(os.path.join(directory, "diffusion_pytorch_model.safetensors"))
    model = wan.AutoencoderKLWanDecoder(cfg).double().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and all(k.startswith(("encoder.", "quant_conv.")) for k in unexpected), (missing, unexpected)
    return model, cfg


# =============================================================================================
# Pipeline pieces
# =============================================================================================
def load_image_pixels(relpath, height, width):
    """load_image (EXIF transpose, RGB) + VaeImageProcessor.preprocess for a PIL image: resize (LANCZOS,
    reducing_gap None), np.float32 / 255, NHWC -> NCHW, 2 x - 1 (f32). -> [1, 3, height, width] f32."""
    image = ImageOps.exif_transpose(Image.open(os.path.join(SRC_DIR, relpath))).convert("RGB")
    image = image.resize((width, height), resample=Image.Resampling.LANCZOS, reducing_gap=None)
    array = np.array(image).astype(np.float32) / 255.0
    pixels = torch.from_numpy(np.ascontiguousarray(array[None].transpose(0, 3, 1, 2)))
    return 2.0 * pixels - 1.0


def frame_mask(batch, num_frames, lat_h, lat_w, temporal, last_image):
    """prepare_latents' mask: [B, temporal, T', lat_h, lat_w] (1 = a given pixel frame)."""
    m = torch.ones(batch, 1, num_frames, lat_h, lat_w)
    m[:, :, 1:num_frames - 1 if last_image else num_frames] = 0
    m = torch.cat([m[:, :, :1].repeat_interleave(temporal, dim=2), m[:, :, 1:]], dim=2)
    return m.view(batch, -1, temporal, lat_h, lat_w).transpose(1, 2)


def i2v_condition(vae, cfg, image, last_image, num_frames):
    """WanImageToVideoPipeline.prepare_latents (batch 1, not expand_timesteps) -> dict with the condition
    [1, temporal + z, T', h, w], the mask, the encoder mean (latent_raw) and the normalized latents."""
    b, c, h, w = image.shape
    parts = [image[:, :, None]]
    if last_image is None:
        parts.append(image.new_zeros(b, c, num_frames - 1, h, w))
    else:
        parts += [image.new_zeros(b, c, num_frames - 2, h, w), last_image[:, :, None]]
    video = torch.cat(parts, dim=2)
    z = cfg["z_dim"]
    with torch.no_grad():
        latent_raw = vae.moments(video.double())[:, :z].float()  # latent_dist.mode() = the mean, an f32 run's value
    shape = (1, z, 1, 1, 1)
    mean = torch.tensor(cfg["latents_mean"], dtype=F32).view(shape)
    inv_std = 1.0 / torch.tensor(cfg["latents_std"], dtype=F32).view(shape)
    latent_condition = (latent_raw - mean) * inv_std  # f32, as the pipeline
    down, temporal = cfg["scale_factor_spatial"], cfg["scale_factor_temporal"]
    mask = frame_mask(b, num_frames, h // down, w // down, temporal, last_image is not None)
    assert mask.shape[2] == latent_condition.shape[2], (mask.shape, latent_condition.shape)
    return {"condition": torch.cat([mask, latent_condition], dim=1), "mask": mask, "latent_raw": latent_raw,
            "latent_condition": latent_condition}


def low_noise_expert(timesteps, boundary_ratio, num_train_timesteps):
    """Per step True where the pipelines pick transformer_2: not (t >= boundary_ratio * num_train_timesteps),
    compared as torch does (timesteps: the scheduler's tensor, f32 or int64; the bound a Python float)."""
    boundary = boundary_ratio * num_train_timesteps
    return [not bool(t >= boundary) for t in torch.from_numpy(np.asarray(timesteps))]


def run_pipeline(models, noise, prompt, negative, steps, guidance, guidance_2=None, boundary_ratio=None,
                 condition=None, image_embeds=None):
    """The denoising loop of WanPipeline / WanImageToVideoPipeline with wan_tiny's Euler scheduler, CFG on:
    per step the expert (models[0] high noise, models[1] low noise when boundary_ratio is set), the model on
    cat([latents, condition]) (I2V) at the raw f32 timestep, v = v_u + g (v_c - v_u) in float64 rounded to
    f32, the f32 Euler step."""
    sched = FlowMatchEulerDiscreteScheduler(**wan.SCHEDULER_CONFIG)
    sigmas, timesteps = sched.set_timesteps(steps)
    if boundary_ratio is None:
        low = [False] * steps
    else:
        low = low_noise_expert(timesteps, boundary_ratio, sched.num_train_timesteps)
        guidance_2 = guidance if guidance_2 is None else guidance_2
    x = noise.numpy().copy()
    out = {"steps": [], "expert": [], "guidance": []}
    for i in range(steps):
        model, g = (models[1], guidance_2) if low[i] else (models[0], guidance)
        inp = torch.from_numpy(x)
        if condition is not None:
            inp = torch.cat([inp, condition], dim=1)
        t = torch.tensor([timesteps[i]], dtype=F32)

        def velocity(text):
            args = (inp.double(), t, text.double()) + (() if image_embeds is None else (image_embeds.double(),))
            return model(*args).numpy()

        v_c, v_u = velocity(prompt), velocity(negative)
        v = v_u + g * (v_c - v_u)
        x, _ = euler_step(x, v.astype(np.float32), sigmas[i], sigmas[i + 1])
        out["steps"].append(torch.from_numpy(x.copy()))
        out["expert"].append(float(low[i]))
        out["guidance"].append(float(g))
    out.update(latents=torch.from_numpy(x), sigmas=torch.from_numpy(sigmas.copy()),
               timesteps=torch.from_numpy(timesteps.copy()))
    return out


def decode(decoder, cfg, latents):
    """z = latents / (1 / std) + mean (f32), the float64 decode (checked against the cached chunked one),
    clamped to [-1, 1]."""
    z = wan.unnormalize_latents(latents, cfg["latents_mean"], cfg["latents_std"])
    with torch.no_grad():
        whole = decoder.decode_whole(z.double())
        agree = wan.max_diff(whole, decoder.decode_chunked(z.double()))
    assert agree <= 1e-5, agree
    return z, whole.clamp(-1.0, 1.0), whole, agree


# =============================================================================================
# Checks
# =============================================================================================
def check_cross_attention(attn, x, context):
    """WanI2VCrossAttention against a direct per-head einsum version of the same formula."""
    n_image = context.shape[1] - TEXT_LEN
    heads = attn.heads

    def rms(t, w, eps):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    def attend(q, k, v):
        b, lq, d = q.shape
        hd = d // heads
        qh, kh, vh = (t.reshape(b, t.shape[1], heads, hd) for t in (q, k, v))
        p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", qh, kh) / math.sqrt(hd), dim=-1)
        return torch.einsum("bhqk,bkhd->bqhd", p, vh).reshape(b, lq, d)

    eps = attn.norm_q.eps
    lin = F.linear
    q = rms(lin(x, attn.to_q.weight, attn.to_q.bias), attn.norm_q.weight, eps)
    img, txt = context[:, :n_image], context[:, n_image:]
    k = rms(lin(txt, attn.to_k.weight, attn.to_k.bias), attn.norm_k.weight, eps)
    v = lin(txt, attn.to_v.weight, attn.to_v.bias)
    ki = rms(lin(img, attn.add_k_proj.weight, attn.add_k_proj.bias), attn.norm_added_k.weight, eps)
    vi = lin(img, attn.add_v_proj.weight, attn.add_v_proj.bias)
    direct = lin(attend(q, k, v) + attend(q, ki, vi), attn.to_out[0].weight, attn.to_out[0].bias)
    return wan.max_diff(attn(x, context=context), direct)


def check_vaes(whole_vae, t2v_decoder, report):
    """The loaded VAEs reproduce the committed goldens they were made with."""
    enc, _ = read_safetensors(os.path.join(SRC_DIR, "goldens_wan_vae_encoder.safetensors"))
    dec, _ = read_safetensors(os.path.join(SRC_DIR, "goldens_wan.safetensors"))
    with torch.no_grad():
        moments = whole_vae.moments(enc["wan_nine_frames.sample"].double()).float()
        video = t2v_decoder.decode_whole(dec["vae.z"].double()).float()
    e1 = wan.max_diff(moments, enc["wan_nine_frames.expected_moments"])
    e2 = wan.max_diff(video, dec["vae.video_unclamped"])
    assert e1 <= 1e-6 and e2 <= 1e-6, (e1, e2)
    report["vae_checks"] = dict(encoder_vs_goldens=e1, wan_tiny_decoder_vs_goldens=e2)


# =============================================================================================
# The cases
# =============================================================================================
def transformer_i2v_case(g, model, report):
    cfg = model.cfg
    hidden = g.randn((2, cfg["in_channels"], 3, 4, 6))
    timestep = torch.tensor([999.0, 250.5], dtype=F32)
    ehs = g.randn((2, TEXT_LEN, cfg["text_dim"]))
    ehs[1, 9:] = 0.0  # batch 1: a 9-token prompt zero-filled to 512
    image = g.randn((2, IMAGE_TOKENS, cfg["image_dim"]))
    rec = {}
    with torch.no_grad():
        sample = model(hidden.double(), timestep, ehs.double(), image.double(), rec)
        f32_err = wan.max_diff(copy.deepcopy(model).float()(hidden, timestep, ehs, image), sample)
        attn_err = check_cross_attention(model.blocks[1].attn2, rec["block0.out"],
                                         torch.cat([rec["image_context"], rec["text_context"]], dim=1))
    assert attn_err < 1e-12, attn_err
    assert sample.shape == (2, cfg["out_channels"], 3, 4, 6)
    g.add("transformer_i2v", dict(
        op="wan_i2v_transformer", weights="wan_i2v_tiny/transformer", batch=2, latent_shape=list(hidden.shape[1:]),
        num_tokens=18, num_txt_tokens=TEXT_LEN, num_image_tokens=IMAGE_TOKENS, text_lengths=[TEXT_LEN, 9],
        note="hidden_states = [noise 4 | mask 4 | condition 4] channels (random here); timestep raw (0..1000); "
             "encoder_hidden_states_image stands for the CLIP penultimate hidden states; intermediate.image_context "
             "is condition_embedder.image_embedder's output, intermediate.context the text_embedder's; the blocks' "
             "cross-attention context is [image_context ; context], text = its last 512 rows. The checkpoint's "
             "norm_added_q tensors must be ignored"),
        {"hidden_states": hidden, "timestep": timestep, "encoder_hidden_states": ehs,
         "encoder_hidden_states_image": image, "sample": sample, "intermediate.image_context": rec["image_context"],
         "intermediate.context": rec["text_context"], "intermediate.temb": rec["temb"]})
    report["transformer_i2v"] = dict(max_abs_sample=max_abs(sample), max_abs_image_context=max_abs(rec["image_context"]),
                                     f32_run_err=f32_err, cross_attention_vs_direct=attn_err)


def transformer_flf2v_case(g, model, report):
    cfg = model.cfg
    hidden = g.randn((1, cfg["in_channels"], 3, 4, 6))
    timestep = torch.tensor([612.75], dtype=F32)
    ehs = g.randn((1, TEXT_LEN, cfg["text_dim"]))
    ehs[:, 7:] = 0.0
    image = g.randn((2, IMAGE_TOKENS, cfg["image_dim"]))  # diffusers' layout: one row per picture
    rec = {}
    with torch.no_grad():
        sample = model(hidden.double(), timestep, ehs.double(), image.double(), rec)
        f32_err = wan.max_diff(copy.deepcopy(model).float()(hidden, timestep, ehs, image), sample)
        no_pos = copy.deepcopy(model)
        no_pos.condition_embedder.image_embedder.pos_embed.zero_()
        pos_effect = wan.max_diff(no_pos(hidden.double(), timestep, ehs.double(), image.double()), sample)
    assert rec["image_context"].shape == (1, 2 * IMAGE_TOKENS, cfg["num_attention_heads"] * cfg["attention_head_dim"])
    g.add("transformer_flf2v", dict(
        op="wan_i2v_transformer", weights="wan_flf2v_tiny/transformer", batch=1, latent_shape=list(hidden.shape[1:]),
        num_txt_tokens=TEXT_LEN, num_image_tokens=2 * IMAGE_TOKENS, text_lengths=[7], pos_embed_seq_len=2 * IMAGE_TOKENS,
        note="encoder_hidden_states_image [2, 10, 32]: the first and the last picture's CLIP states (diffusers "
             "passes encode_image([image, last_image])); the image embedder views them as [1, 20, 32] and adds "
             "pos_embed [1, 20, 32] before norm1; intermediate.image_context [1, 20, 32]"),
        {"hidden_states": hidden, "timestep": timestep, "encoder_hidden_states": ehs,
         "encoder_hidden_states_image": image, "sample": sample, "intermediate.image_context": rec["image_context"]})
    report["transformer_flf2v"] = dict(max_abs_sample=max_abs(sample), f32_run_err=f32_err,
                                       pos_embed_moves_sample_by=pos_effect)


def condition_cases(g, vae, cfg, images, report):
    for case, last in (("condition_i2v", None), ("condition_flf2v", images[1])):
        c = i2v_condition(vae, cfg, images[0], last, NUM_FRAMES)
        tensors = {"image": images[0]}
        if last is not None:
            tensors["last_image"] = last
        tensors.update({"condition": c["condition"], "intermediate.mask": c["mask"],
                        "intermediate.latent_raw": c["latent_raw"],
                        "intermediate.latent_condition": c["latent_condition"]})
        g.add(case, dict(
            op="wan_i2v_condition", vae="wan_i2v_tiny/vae", num_frames=NUM_FRAMES, height=HEIGHT, width=WIDTH,
            image_file=IMAGE_FILES[0], last_image_file=IMAGE_FILES[1] if last is not None else None,
            note="image / last_image: the files after load_image (EXIF transpose, RGB) and VideoProcessor.preprocess "
                 "(PIL LANCZOS resize to 48x32, np.float32(p) / 255, 2 x - 1 in f32); video_condition = [image, "
                 "zeros, (last_image)] over num_frames frames, VAE-encoded (mean, no sampling, no tiling): "
                 "intermediate.latent_raw; latent_condition = (latent_raw - latents_mean) * (1 / latents_std) in f32; "
                 "intermediate.mask [1, 4, 3, 4, 6] (latent frame 0 all ones; FLF2V also channel 3 of the last "
                 "latent frame); condition = cat([mask, latent_condition], dim=1)"),
            tensors)
        report[case] = dict(max_abs_condition=max_abs(c["condition"]), max_abs_image=max_abs(images[0]))


SCHEDULERS = {  # name -> (kind, config)
    "euler3": ("flow_match_euler", dict(wan.SCHEDULER_CONFIG)),
    "unipc12": ("unipc", dict(unipc.SHIPPED, flow_shift=12.0)),
    "unipc5": ("unipc", dict(unipc.SHIPPED, flow_shift=5.0)),
    "unipc3": ("unipc", dict(unipc.SHIPPED, flow_shift=3.0)),
}
EXPERT_STEPS = (1, 2, 3, 4, 10, 40, 50)
EXPERT_RATIOS = (0.875, 0.9, 0.5)


def scheduler_timesteps(kind, config, steps):
    if kind == "unipc":
        _, ts = unipc.flow_grid(steps, config["flow_shift"], config["num_train_timesteps"])
        return ts  # int64
    _, ts = FlowMatchEulerDiscreteScheduler(**config).set_timesteps(steps)
    return ts  # f32


def experts_case(g, report):
    tensors, ties = {}, []
    for name, (kind, config) in SCHEDULERS.items():
        for steps in EXPERT_STEPS:
            ts = scheduler_timesteps(kind, config, steps)
            for ratio in EXPERT_RATIOS:
                key = f"{name}_r{str(ratio).replace('.', '')}_n{steps}"
                low = low_noise_expert(ts, ratio, config["num_train_timesteps"])
                tensors[key] = torch.tensor(low, dtype=F32)
                tensors[key + "_timesteps"] = torch.from_numpy(ts.astype(np.float32))
                ties += [f"{key}[{i}]" for i, t in enumerate(ts) if float(t) == ratio * config["num_train_timesteps"]]
    g.add("experts", dict(
        op="wan_expert_choice", schedulers={k: dict(kind=v[0], config=v[1]) for k, v in SCHEDULERS.items()},
        steps=list(EXPERT_STEPS), boundary_ratios=list(EXPERT_RATIOS), ties=ties,
        note="<scheduler>_r<ratio digits>_n<steps>: per step 1 = transformer_2 (low-noise expert, guidance_scale_2), "
             "0 = transformer; rule t >= boundary_ratio * num_train_timesteps -> transformer (a tie goes to the "
             "high-noise expert; `ties` lists them). _timesteps: the scheduler's timesteps (FlowMatch Euler f32 "
             "set_timesteps(N) without sigmas; UniPC flow sigmas: int64 values stored as f32). unipc12 is Wan2.2 "
             "T2V A14B's sample_shift 12, unipc5 I2V A14B's 5, unipc3 what diffusers' converter and tests use"),
        tensors)
    report["experts"] = dict(cases=len(tensors) // 2, ties=len(ties))
    return ties


PIPELINE_GUIDANCE = 4.0


def pipeline_a14b_case(g, models, decoder, vae_cfg, report):
    gen = torch.Generator().manual_seed(9300)

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=F64).float()

    noise = randn((1, 4, 3, 4, 6))
    prompt = randn((1, TEXT_LEN, 24))
    prompt[:, 5:] = 0.0
    negative = randn((1, TEXT_LEN, 24))
    negative[:, 8:] = 0.0
    steps, g2 = 4, 3.0
    with torch.no_grad():
        r = run_pipeline(models, noise, prompt, negative, steps, PIPELINE_GUIDANCE, g2, A14B_BOUNDARY)
        only_high = run_pipeline(models[:1], noise, prompt, negative, steps, PIPELINE_GUIDANCE)["latents"]
    assert r["expert"] == [0.0, 0.0, 1.0, 1.0], r["expert"]
    z, video, whole, agree = decode(decoder, vae_cfg, r["latents"])
    tensors = {"noise": noise, "prompt_embeds": prompt, "negative_prompt_embeds": negative, "latents": r["latents"],
               "video": video, "intermediate.expert": torch.tensor(r["expert"]),
               "intermediate.guidance": torch.tensor(r["guidance"]), "intermediate.sigmas": r["sigmas"],
               "intermediate.timesteps": r["timesteps"], "intermediate.z": z}
    tensors.update({f"intermediate.latents_step{i}": s for i, s in enumerate(r["steps"])})
    g.add("pipeline_a14b", dict(
        op="wan_t2v_pipeline", model="wan22_tiny_a14b", transformer="wan22_tiny_a14b/transformer",
        transformer_2="wan22_tiny_a14b/transformer_2", vae="wan22_tiny_a14b/vae", scheduler="wan22_tiny_a14b/scheduler",
        boundary_ratio=A14B_BOUNDARY, num_inference_steps=steps, guidance_scale=PIPELINE_GUIDANCE, guidance_scale_2=g2,
        frames=int(video.shape[2]), height=int(video.shape[3]), width=int(video.shape[4]), prompt_length=5,
        negative_prompt_length=8, seed=9300,
        note="WanPipeline with two experts: step i uses transformer and guidance_scale when t_i >= boundary_ratio * "
             "1000 (= 750), else transformer_2 and guidance_scale_2 (intermediate.expert: 1 = transformer_2; "
             "intermediate.guidance the scale used); otherwise as goldens_wan's pipeline case: f32 latents, "
             "v = v_u + g (v_c - v_u) rounded to f32, f32 Euler; z = latents / (1 / std) + mean; video = "
             "clamp(decode(z), -1, 1)"),
        tensors)
    report["pipeline_a14b"] = dict(max_abs_latents=max_abs(r["latents"]), max_abs_video=max_abs(video),
                                   vs_high_expert_only=wan.max_diff(r["latents"], only_high),
                                   fraction_within_1=float((whole.abs() <= 1.0).double().mean()), whole_vs_chunked=agree)
    return r


def pipeline_i2v_case(g, case, model, model_dir, vae, vae_cfg, decoder, images, seed, report):
    """WanImageToVideoPipeline (FLF2V when images has two pictures) on a tiny folder, 3 Euler steps."""
    gen = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=F64).float()

    flf2v = len(images) == 2
    noise = randn((1, 4, 3, 4, 6))
    prompt = randn((1, TEXT_LEN, 24))
    prompt[:, 5:] = 0.0
    negative = randn((1, TEXT_LEN, 24))
    negative[:, 8:] = 0.0
    image_embeds = randn((len(images), IMAGE_TOKENS, IMAGE_DIM))
    steps = 3
    c = i2v_condition(vae, vae_cfg, images[0], images[1] if flf2v else None, NUM_FRAMES)
    with torch.no_grad():
        r = run_pipeline([model], noise, prompt, negative, steps, PIPELINE_GUIDANCE, condition=c["condition"],
                         image_embeds=image_embeds)
    z, video, whole, agree = decode(decoder, vae_cfg, r["latents"])
    tensors = {"noise": noise, "prompt_embeds": prompt, "negative_prompt_embeds": negative, "image_embeds": image_embeds,
               "image": images[0]}
    if flf2v:
        tensors["last_image"] = images[1]
    tensors.update({"condition": c["condition"], "latents": r["latents"], "video": video,
                    "intermediate.sigmas": r["sigmas"], "intermediate.timesteps": r["timesteps"], "intermediate.z": z})
    tensors.update({f"intermediate.latents_step{i}": s for i, s in enumerate(r["steps"])})
    g.add(case, dict(
        op="wan_i2v_pipeline", model=model_dir, transformer=f"{model_dir}/transformer", vae=f"{model_dir}/vae",
        scheduler=f"{model_dir}/scheduler", num_inference_steps=steps, guidance_scale=PIPELINE_GUIDANCE,
        num_frames=NUM_FRAMES, height=HEIGHT, width=WIDTH, prompt_length=5, negative_prompt_length=8, seed=seed,
        image_file=IMAGE_FILES[0], last_image_file=IMAGE_FILES[1] if flf2v else None,
        note="image_embeds stands for the image encoder's penultimate hidden states (" +
             ("[2, 10, 32]: first and last picture" if flf2v else "[1, 10, 32]") +
             "); image (and last_image) as in condition_" + ("flf2v" if flf2v else "i2v") + "; condition = "
             "[mask ; normalized VAE latents] of the video condition; per step the model gets cat([latents, "
             "condition], 1) [1, 12, 3, 4, 6] at the raw f32 timestep, with encoder_hidden_states_image = "
             "image_embeds for the conditional and the unconditional pass; v = v_u + 4 (v_c - v_u) rounded to f32, "
             "f32 Euler (shift 3); z = latents / (1 / std) + mean; video = clamp(decode(z), -1, 1)"),
        tensors)
    report[case] = dict(max_abs_latents=max_abs(r["latents"]), max_abs_video=max_abs(video),
                        fraction_within_1=float((whole.abs() <= 1.0).double().mean()), whole_vs_chunked=agree)


# =============================================================================================
# Main
# =============================================================================================
def write_i2v_folder(name, config, model, extra_tensors, vae_src):
    data = os.path.join(OUT_DIR, name)
    state = dict(model.state_dict())
    state.update(extra_tensors)
    wan.save_model(os.path.join(data, "transformer"), config, state)
    copy_folder(vae_src, os.path.join(data, "vae"))
    copy_folder(os.path.join(SRC_DIR, "wan_tiny", "scheduler"), os.path.join(data, "scheduler"))
    write_json(os.path.join(data, "model_index.json"),
               model_index("WanImageToVideoPipeline", image_components=True, transformer_2=False, boundary_ratio=None))


TEXT_ENCODER_CONFIG = {"_class_name": "CubevecTinyTextEncoder", "hidden_act": "gelu_tanh", "hidden_size": 24,
                       "intermediate_size": 48, "layer_norm_eps": 1e-05, "max_position_embeddings": 10,
                       "num_attention_heads": 2, "num_hidden_layers": 1, "pad_token_id": 0, "pooled_projection_dim": 1,
                       "vocab_size": 23}


def add_front_end_parts(folder, image_encoder):
    """What a whole pipeline folder has beside the models the goldens use, so the command line, the server
    and Python can run it from a prompt and a picture: a random tiny text encoder (cubevec's
    CubevecTinyTextEncoder format, 24 wide = the transformers' text_dim) with the shipped tinywan's
    word tokenizer, and (image_encoder) tests/data/clip_vision_tiny as image_encoder/ + image_processor/.
    Its own generator: the goldens do not change."""
    gen = torch.Generator().manual_seed(9900)
    c = TEXT_ENCODER_CONFIG
    e, i, v, p = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"]
    shapes = {"embeddings.token_embedding.weight": [v, e], "embeddings.position_embedding.weight": [p, e],
              "final_layer_norm.weight": [e], "final_layer_norm.bias": [e],
              "pooled_projection.weight": [c["pooled_projection_dim"], e], "pooled_projection.bias": [c["pooled_projection_dim"]]}
    for layer in range(c["num_hidden_layers"]):
        q = f"layers.{layer}."
        for n in ("layer_norm1", "layer_norm2"):
            shapes[q + n + ".weight"] = [e]
            shapes[q + n + ".bias"] = [e]
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[q + "self_attn." + n + ".weight"] = [e, e]
            shapes[q + "self_attn." + n + ".bias"] = [e]
        shapes[q + "mlp.fc1.weight"], shapes[q + "mlp.fc1.bias"] = [i, e], [i]
        shapes[q + "mlp.fc2.weight"], shapes[q + "mlp.fc2.bias"] = [e, i], [e]
    tensors = {}
    for name, shape in sorted(shapes.items()):
        t = torch.randn(shape, generator=gen, dtype=torch.float64) * (0.2 if len(shape) > 1 else 0.05)
        if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "final_layer_norm.weight":
            t = t + 1.0
        tensors[name] = bf16_representable(t.float()).contiguous()
    write_json(os.path.join(folder, "text_encoder", "config.json"), c)
    write_safetensors(os.path.join(folder, "text_encoder", "model.safetensors"), tensors, {"format": "pt"})
    copy_folder(os.path.join(ROOT, "assets", "tinywan", "tokenizer"), os.path.join(folder, "tokenizer"))
    if image_encoder:
        clip = os.path.join(SRC_DIR, "clip_vision_tiny")
        os.makedirs(os.path.join(folder, "image_encoder"), exist_ok=True)
        os.makedirs(os.path.join(folder, "image_processor"), exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(clip, name), os.path.join(folder, "image_encoder", name))
        shutil.copyfile(os.path.join(clip, "preprocessor_config.json"),
                        os.path.join(folder, "image_processor", "preprocessor_config.json"))


def main():
    report = {}
    whole_vae_dir = os.path.join(SRC_DIR, "vae_encoder", "wan")
    t2v_vae_dir = os.path.join(SRC_DIR, "wan_tiny", "vae")
    whole_vae, whole_cfg = load_whole_vae(whole_vae_dir)
    whole_decoder, _ = load_vae_decoder(whole_vae_dir)
    t2v_decoder, t2v_vae_cfg = load_vae_decoder(t2v_vae_dir)
    check_vaes(whole_vae, t2v_decoder, report)

    # ---- models and folders ------------------------------------------------------------------------
    i2v = make_i2v_transformer(I2V_CONFIG, 9001)
    flf2v = make_i2v_transformer(FLF2V_CONFIG, 9002)
    write_i2v_folder("wan_i2v_tiny", I2V_CONFIG, i2v, norm_added_q_tensors(I2V_CONFIG, 9003), whole_vae_dir)
    write_i2v_folder("wan_flf2v_tiny", FLF2V_CONFIG, flf2v, {}, whole_vae_dir)

    a14b_dir = os.path.join(OUT_DIR, "wan22_tiny_a14b")
    experts = []
    for sub, seed in (("transformer", 9011), ("transformer_2", 9012)):
        m = wan.init_transformer(wan.WanTransformer3DModel(wan.TRANSFORMER_CONFIG), seed).double().eval()
        wan.save_model(os.path.join(a14b_dir, sub), wan.TRANSFORMER_CONFIG, m.state_dict())
        experts.append(m)
    copy_folder(t2v_vae_dir, os.path.join(a14b_dir, "vae"))
    copy_folder(os.path.join(SRC_DIR, "wan_tiny", "scheduler"), os.path.join(a14b_dir, "scheduler"))
    write_json(os.path.join(a14b_dir, "model_index.json"),
               model_index("WanPipeline", image_components=False, transformer_2=True, boundary_ratio=A14B_BOUNDARY))

    add_front_end_parts(os.path.join(OUT_DIR, "wan_i2v_tiny"), image_encoder=True)
    add_front_end_parts(os.path.join(OUT_DIR, "wan_flf2v_tiny"), image_encoder=True)
    add_front_end_parts(a14b_dir, image_encoder=False)

    # ---- goldens -----------------------------------------------------------------------------------
    g = Goldens(9100, {
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_numpy_version": np.__version__,
        "_pil_version": Image.__version__,
        "_seed": "9100",
        "_numerics": "models in float64 on f32 inputs and bf16-representable weights, results rounded to f32; "
                     "timestep sinusoid arguments and RoPE tables as an f32 diffusers run (make_wan_reference.py); "
                     "pipelines as an f32 run (see the generator's docstring)",
    })
    images = [load_image_pixels(f, HEIGHT, WIDTH) for f in IMAGE_FILES]
    transformer_i2v_case(g, i2v, report)
    transformer_flf2v_case(g, flf2v, report)
    condition_cases(g, whole_vae, whole_cfg, images, report)
    ties = experts_case(g, report)
    a14b = pipeline_a14b_case(g, experts, t2v_decoder, t2v_vae_cfg, report)
    pipeline_i2v_case(g, "pipeline_i2v", i2v, "wan_i2v_tiny", whole_vae, whole_cfg, whole_decoder, images[:1], 9400,
                      report)
    pipeline_i2v_case(g, "pipeline_flf2v", flf2v, "wan_flf2v_tiny", whole_vae, whole_cfg, whole_decoder, images, 9500,
                      report)
    path = os.path.join(OUT_DIR, "goldens_wan_i2v.safetensors")
    g.write(path)

    # ---- summary -----------------------------------------------------------------------------------
    total = 0
    for name in ("wan_i2v_tiny", "wan_flf2v_tiny", "wan22_tiny_a14b"):
        for dirpath, _, files in sorted(os.walk(os.path.join(OUT_DIR, name))):
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                total += os.path.getsize(p)
                print(f"{os.path.relpath(p, OUT_DIR)}: {os.path.getsize(p)} bytes")
    total += os.path.getsize(path)
    print(f"{os.path.relpath(path, OUT_DIR)}: {os.path.getsize(path)} bytes, {len(g.tensors)} tensors; all: {total} bytes")
    for k in sorted(g.tensors):
        if not k.startswith("experts."):
            t = g.tensors[k]
            print(f"  {k:<48} {str(list(t.shape)):<22} max|x| {max_abs(t):.6g}")
    print(f"  experts.*: {report['experts']['cases']} expert tensors + their timesteps; ties (t == boundary): {ties}")
    sched = FlowMatchEulerDiscreteScheduler(**wan.SCHEDULER_CONFIG)
    print(f"wan22_tiny_a14b: boundary_ratio {A14B_BOUNDARY}; 4-step timesteps {sched.set_timesteps(4)[1].tolist()}, "
          f"experts (1 = transformer_2) {a14b['expert']}")
    for k, v in report.items():
        print(f"  {k}: " + ", ".join(f"{a}={b:.4g}" for a, b in v.items()))


if __name__ == "__main__":
    main()
