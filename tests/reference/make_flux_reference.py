#!/usr/bin/python3
"""Reference implementation and committed test data for cubevec's Flux port.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_flux_reference.py [OUTPUT_DIR]   # default tests/data

Everything here is written from docs/models.md, "The math the ports follow" (its Flux,
AutoencoderKL and FlowMatch sections, with the shared building blocks; the quoted section names below
are that page's) in plain torch; diffusers is not used. Modules and parameters carry diffusers'
names, so a state_dict() is a diffusers checkpoint. It writes, under OUTPUT_DIR:

  flux_tiny/transformer/            config.json + diffusion_pytorch_model.safetensors (F32), guidance_embeds
  flux_tiny/transformer_bf16/       the same checkpoint stored as BF16 (every weight of the tiny models is
                                    bf16-representable, so both files hold exactly the same values and
                                    the same goldens apply to both)
  flux_tiny/transformer_noguidance/ a second, differently shaped config without guidance (schnell-like)
  flux_tiny/vae/                    AutoencoderKL decoder, Flux-like (latent 16, no post_quant_conv)
  flux_tiny/vae_postquant/          AutoencoderKL decoder, SD-like (latent 4, with post_quant_conv)
  flux_tiny/scheduler/              scheduler_config.json, FLUX.1-dev style
  goldens_flux.safetensors          goldens (all F32), cases described in __metadata__
  flowmatch_reference.json          FlowMatchEulerDiscreteScheduler sigmas / timesteps, one Euler step

Golden file layout (as make_goldens.py): each case <case> has tensors "<case>.<name>"; inputs are
named as diffusers' forward arguments, results start with "expected" and optional debugging values
with "intermediate.". __metadata__ maps each case name to a JSON object (op, weights directory,
prefix, shapes, ...); keys starting with "_" describe the file.

Numerics of the goldens:
  * Weights are random, drawn in f32, rounded to bf16-representable values and stored as F32 (and
    BF16 for transformer_bf16). Inputs are f32.
  * The models run in float64 on those values and the results are rounded to f32 once.
  * Two places follow an f32 diffusers run instead, because diffusers fixes their precision:
      - the timestep / guidance sinusoid ("Shared building blocks", "Flux transformer"):
        t' = f32(t * 1000); the frequency table f_j = f32(exp(f32(f32(-ln 10000) * j) / 128)) with a
        correctly rounded exp (torch's own f32 exp differs by 1 ulp in 15 of the 128 entries); the
        argument a_j = f32(t' * f_j). cos and sin of those f32 arguments are then taken in float64.
      - the RoPE table ("Shared building blocks", "Flux transformer"): computed in float64 from f32 ids,
        rounded to f32; the rotation then uses the f32 table (in float64).
  * The pipeline case follows FluxPipeline with an f32 model: the scheduler's f32 timesteps t are
    passed as f32(t / 1000) (so the model sees f32(f32(t / 1000) * 1000)); the Euler update uses the
    f32 difference sigma_{i+1} - sigma_i, but the latents stay float64 between steps.
  * flowmatch_reference.json is computed with numpy exactly as the scheduler does (f32 arrays with
    Python-float scalars, or float64 then cast to f32 on the default-sigma path); every value is the
    exact decimal of an f32 (parse as double, then cast to float: no double rounding).
Seeds are fixed, so the output is deterministic (same torch and numpy versions, same bytes).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# The safetensors writer (torch 1.13 has no safetensors package), shared with make_goldens.py.
from safetensors_io import read_safetensors, write_safetensors

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

BF16 = torch.bfloat16
F64 = torch.float64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
GENERATOR = "tests/reference/make_flux_reference.py"


# =============================================================================================
# Shared building blocks
# =============================================================================================
def sinusoid_arguments(values, half=128):
    """Timesteps(2 half (256 for Flux), flip_sin_to_cos=True, downscale_freq_shift=0) up to the cos/sin:
    the f32 arguments a[b, j] = f32(values[b] * f_j), j < half (see the module docstring)."""
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32)  # f32(c) * j, rounded to f32
    exponent = exponent / half  # an f32 division, as diffusers (exact for power-of-two halves)
    freqs = torch.exp(exponent.double()).float()  # correctly rounded f32 exp
    return values.float()[:, None] * freqs[None, :]


def timestep_sinusoid(values, dtype, num_channels=256):
    """[cos(a), sin(a)] (cosines first), [B, num_channels], cos/sin taken in float64 of the f32 arguments."""
    a = sinusoid_arguments(values, num_channels // 2).double()
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1).to(dtype)


def rope_1d(dim, pos, theta=10000.0):
    """get_1d_rotary_pos_embed(use_real=True, repeat_interleave_real=True) in float64 -> f32 cos, sin."""
    omega = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=F64)[: dim // 2] / dim))
    angles = torch.outer(pos.double(), omega)
    return (torch.cos(angles).repeat_interleave(2, dim=1).float(),
            torch.sin(angles).repeat_interleave(2, dim=1).float())


def flux_rope(ids, axes_dims):
    """FluxPosEmbed (theta 10000): ids [L, n_axes] (float positions, cast to f32) -> cos, sin
    [L, sum(axes_dims)] f32, the axes' tables concatenated along the feature dim."""
    pos = ids.float()
    tables = [rope_1d(d, pos[:, i]) for i, d in enumerate(axes_dims)]
    return torch.cat([c for c, _ in tables], dim=-1), torch.cat([s for _, s in tables], dim=-1)


def apply_rope(x, cos, sin):
    """Interleaved-pair rotation of x [B, L, H, hd] by cos/sin [L, hd] ("Shared building blocks")."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([-imag, real], dim=-1).flatten(-2)
    cos = cos.to(x.dtype)[None, :, None, :]
    sin = sin.to(x.dtype)[None, :, None, :]
    return x * cos + rotated * sin


def sdpa(q, k, v):
    """softmax(q k^T / sqrt(hd)) v for q, k, v [B, L, H, hd], no mask; returns [B, L, H * hd]."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, hd]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).flatten(2)


def layer_norm(x, eps=1e-6):
    """nn.LayerNorm(elementwise_affine=False) over the last dim."""
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm(dim, eps, elementwise_affine=True): x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GELU(nn.Module):
    """diffusers' activations.GELU with approximate="tanh": a `proj` Linear, then GELUt."""

    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """FeedForward(dim, dim_out, mult=4, activation_fn="gelu-approximate", inner_dim): net.0.proj, net.2
    (the hidden width is inner_dim when given, else dim * mult)."""

    def __init__(self, dim, dim_out=None, mult=4, inner_dim=None):
        super().__init__()
        inner = inner_dim or dim * mult
        self.net = nn.ModuleList([GELU(dim, inner), nn.Dropout(0.0), nn.Linear(inner, dim_out or dim)])

    def forward(self, x):
        for layer in self.net:
            x = layer(x)
        return x


class TimestepEmbedding(nn.Module):
    """linear_1 (256 -> D), SiLU, linear_2 (D -> D)."""

    def __init__(self, in_channels, dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class PixArtAlphaTextProjection(nn.Module):
    """linear_1 (in -> D), act_fn: "silu" (Flux) or "gelu_tanh" (Wan), linear_2 (D -> D)."""

    def __init__(self, in_features, dim, act_fn="silu"):
        super().__init__()
        assert act_fn in ("silu", "gelu_tanh"), act_fn
        self.act_fn = act_fn
        self.linear_1 = nn.Linear(in_features, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        x = self.linear_1(x)
        return self.linear_2(F.silu(x) if self.act_fn == "silu" else F.gelu(x, approximate="tanh"))


# =============================================================================================
# FluxTransformer2DModel ("Flux transformer")
# =============================================================================================
class CombinedTimestepTextProjEmbeddings(nn.Module):
    """time_text_embed: timestep_embedder [+ guidance_embedder] + text_embedder ("Flux transformer")."""

    def __init__(self, dim, pooled_projection_dim, guidance):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(256, dim)
        if guidance:
            self.guidance_embedder = TimestepEmbedding(256, dim)
        self.text_embedder = PixArtAlphaTextProjection(pooled_projection_dim, dim)
        self.has_guidance = guidance

    def forward(self, timestep, guidance, pooled_projection):
        """timestep, guidance: the model's scaled values (t * 1000, f32)."""
        emb = self.timestep_embedder(timestep_sinusoid(timestep, pooled_projection.dtype))
        if self.has_guidance:
            emb = emb + self.guidance_embedder(timestep_sinusoid(guidance, pooled_projection.dtype))
        return emb + self.text_embedder(pooled_projection)


class AdaLayerNormZero(nn.Module):
    """norm1 / norm1_context: linear(SiLU(temb)) -> (shift, scale, gate, shift_mlp, scale_mlp, gate_mlp)."""

    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 6 * dim)

    def forward(self, x, temb):
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = self.linear(F.silu(temb)).chunk(6, dim=-1)
        xn = layer_norm(x) * (1 + scale[:, None]) + shift[:, None]
        return xn, gate, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroSingle(nn.Module):
    """norm (single block): linear(SiLU(temb)) -> (shift, scale, gate)."""

    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 3 * dim)

    def forward(self, x, temb):
        shift, scale, gate = self.linear(F.silu(temb)).chunk(3, dim=-1)
        return layer_norm(x) * (1 + scale[:, None]) + shift[:, None], gate


class AdaLayerNormContinuous(nn.Module):
    """norm_out: linear(SiLU(temb)) -> (scale, shift): scale first."""

    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, temb):
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=-1)
        return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


class FluxAttention(nn.Module):
    """attn of both block kinds: to_q/k/v, per-head RMS q/k norms (eps 1e-6); the double block
    adds add_{q,k,v}_proj, norm_added_{q,k}, to_out.0 and to_add_out; the single one is pre_only."""

    def __init__(self, dim, heads, head_dim, joint):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim, self.joint = heads, head_dim, joint
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.norm_q, self.norm_k = RMSNorm(head_dim), RMSNorm(head_dim)
        if joint:
            self.add_q_proj, self.add_k_proj = nn.Linear(dim, inner), nn.Linear(dim, inner)
            self.add_v_proj = nn.Linear(dim, inner)
            self.norm_added_q, self.norm_added_k = RMSNorm(head_dim), RMSNorm(head_dim)
            self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
            self.to_add_out = nn.Linear(inner, dim)

    def heads_of(self, x):
        return x.reshape(*x.shape[:-1], self.heads, self.head_dim)

    def forward(self, x, rope, context=None):
        q = self.norm_q(self.heads_of(self.to_q(x)))
        k = self.norm_k(self.heads_of(self.to_k(x)))
        v = self.heads_of(self.to_v(x))
        if self.joint:  # text first, then image
            cq = self.norm_added_q(self.heads_of(self.add_q_proj(context)))
            ck = self.norm_added_k(self.heads_of(self.add_k_proj(context)))
            cv = self.heads_of(self.add_v_proj(context))
            q, k, v = torch.cat([cq, q], dim=1), torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
        cos, sin = rope
        out = sdpa(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        if not self.joint:
            return out
        n_txt = context.shape[1]
        return self.to_out[0](out[:, n_txt:]), self.to_add_out(out[:, :n_txt])


class FluxTransformerBlock(nn.Module):
    """transformer_blocks.N (double stream)."""

    def __init__(self, dim, heads, head_dim):
        super().__init__()
        self.norm1 = AdaLayerNormZero(dim)
        self.norm1_context = AdaLayerNormZero(dim)
        self.attn = FluxAttention(dim, heads, head_dim, joint=True)
        self.ff = FeedForward(dim)
        self.ff_context = FeedForward(dim)

    def forward(self, h, c, temb, rope):
        hn, g1, sh2, sc2, g2 = self.norm1(h, temb)
        cn, cg1, ch2, cs2, cg2 = self.norm1_context(c, temb)
        attn_h, attn_c = self.attn(hn, rope, context=cn)
        h = h + g1[:, None] * attn_h
        h = h + g2[:, None] * self.ff(layer_norm(h) * (1 + sc2[:, None]) + sh2[:, None])
        c = c + cg1[:, None] * attn_c
        c = c + cg2[:, None] * self.ff_context(layer_norm(c) * (1 + cs2[:, None]) + ch2[:, None])
        return h, c


class FluxSingleTransformerBlock(nn.Module):
    """single_transformer_blocks.N: s = [c; h], s += gate * proj_out([attn(sn) | GELUt(proj_mlp(sn))])."""

    def __init__(self, dim, heads, head_dim, mlp_ratio=4):
        super().__init__()
        self.norm = AdaLayerNormZeroSingle(dim)
        self.proj_mlp = nn.Linear(dim, mlp_ratio * dim)
        self.attn = FluxAttention(dim, heads, head_dim, joint=False)
        self.proj_out = nn.Linear(heads * head_dim + mlp_ratio * dim, dim)

    def forward(self, h, c, temb, rope):
        n_txt = c.shape[1]
        s = torch.cat([c, h], dim=1)
        sn, gate = self.norm(s, temb)
        mlp = F.gelu(self.proj_mlp(sn), approximate="tanh")
        a = self.attn(sn, rope)
        s = s + gate[:, None] * self.proj_out(torch.cat([a, mlp], dim=-1))
        return s[:, n_txt:], s[:, :n_txt]


FLUX_DEFAULTS = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                     attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                     pooled_projection_dim=768, guidance_embeds=False, axes_dims_rope=[16, 56, 56])


class FluxTransformer2DModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        cfg = dict(FLUX_DEFAULTS)
        cfg.update({k: v for k, v in config.items() if not k.startswith("_")})
        self.cfg = cfg
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        out_channels = cfg["out_channels"] or cfg["in_channels"]
        assert sum(cfg["axes_dims_rope"]) == cfg["attention_head_dim"]
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(dim, cfg["pooled_projection_dim"],
                                                                   cfg["guidance_embeds"])
        self.context_embedder = nn.Linear(cfg["joint_attention_dim"], dim)
        self.x_embedder = nn.Linear(cfg["in_channels"], dim)
        heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
        self.transformer_blocks = nn.ModuleList(
            [FluxTransformerBlock(dim, heads, hd) for _ in range(cfg["num_layers"])])
        self.single_transformer_blocks = nn.ModuleList(
            [FluxSingleTransformerBlock(dim, heads, hd) for _ in range(cfg["num_single_layers"])])
        self.norm_out = AdaLayerNormContinuous(dim)
        self.proj_out = nn.Linear(dim, cfg["patch_size"] ** 2 * out_channels)

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids,
                guidance=None, record=None):
        """Returns the predicted velocity [B, N_img, out]; `record` (a dict) gets intermediates."""
        rec = record if record is not None else {}
        dtype = hidden_states.dtype
        h = self.x_embedder(hidden_states)
        # t' = timestep * 1000 (and guidance) in the model dtype of an f32 run: f32.
        t = timestep.float() * 1000
        g = guidance.float() * 1000 if guidance is not None else None
        assert (g is not None) == self.cfg["guidance_embeds"]
        temb = self.time_text_embed(t, g, pooled_projections)
        c = self.context_embedder(encoder_hidden_states)
        if txt_ids.ndim == 3:
            txt_ids = txt_ids[0]
        if img_ids.ndim == 3:
            img_ids = img_ids[0]
        rope = flux_rope(torch.cat([txt_ids, img_ids], dim=0), self.cfg["axes_dims_rope"])
        rec.update({"temb": temb, "x_embedder": h, "context_embedder": c, "rope_cos": rope[0], "rope_sin": rope[1]})
        for i, block in enumerate(self.transformer_blocks):
            h, c = block(h, c, temb, rope)
            rec[f"transformer_blocks.{i}.hidden_states"] = h
            rec[f"transformer_blocks.{i}.encoder_hidden_states"] = c
        for i, block in enumerate(self.single_transformer_blocks):
            h, c = block(h, c, temb, rope)
            rec[f"single_transformer_blocks.{i}.hidden_states"] = h
            rec[f"single_transformer_blocks.{i}.encoder_hidden_states"] = c
        h = self.norm_out(h, temb)
        rec["norm_out"] = h
        return self.proj_out(h).to(dtype)


# =============================================================================================
# Latent packing ("Flux latent packing") and Flux's calculate_shift ("FluxPipeline")
# =============================================================================================
def pack_latents(latents):
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C], channel = c*4 + dy*2 + dx, token = (y/2)(W/2) + x/2."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(packed, height, width):
    """The inverse of pack_latents for a latent of height x width."""
    b, _, ch = packed.shape
    x = packed.reshape(b, height // 2, width // 2, ch // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, ch // 4, height, width)


def latent_image_ids(height, width):
    """img_ids [(H/2)(W/2), 3]: (0, row, col), row-major."""
    ids = torch.zeros(height // 2, width // 2, 3)
    ids[..., 1] += torch.arange(height // 2)[:, None]
    ids[..., 2] += torch.arange(width // 2)[None, :]
    return ids.reshape(-1, 3)


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    """mu = image_seq_len * m + b, Python floats (float64)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


# =============================================================================================
# AutoencoderKL decoder
# =============================================================================================
class ResnetBlock2D(nn.Module):
    """Pre-norm resnet, GroupNorm eps 1e-6, temb None, 1x1 conv_shortcut when in != out."""

    def __init__(self, cin, cout, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-6, affine=True)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-6, affine=True)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.conv_shortcut = nn.Conv2d(cin, cout, 1)
        self.has_shortcut = cin != cout

    def forward(self, x):
        y = self.conv1(F.silu(self.norm1(x)))
        y = self.conv2(self.dropout(F.silu(self.norm2(y))))
        return (self.conv_shortcut(x) if self.has_shortcut else x) + y


class VAEAttention(nn.Module):
    """mid_block.attentions.0: one head of dim C, GroupNorm, Linear q/k/v/to_out.0, residual."""

    def __init__(self, channels, groups):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=1e-6, affine=True)
        self.to_q, self.to_k, self.to_v = (nn.Linear(channels, channels) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(channels, channels), nn.Dropout(0.0)])

    def forward(self, x):
        b, c, h, w = x.shape
        tokens = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)  # [B, HW, C], row-major (h, w)
        q, k, v = self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)
        a = torch.softmax(torch.matmul(q, k.transpose(1, 2)) / math.sqrt(c), dim=-1) @ v
        o = self.to_out[0](a)
        return o.transpose(1, 2).reshape(b, c, h, w) + x


class UNetMidBlock2D(nn.Module):
    def __init__(self, channels, groups, add_attention=True):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, groups) for _ in range(2)])
        self.attentions = nn.ModuleList([VAEAttention(channels, groups)] if add_attention else [])

    def forward(self, x):
        x = self.resnets[0](x)
        for attn in self.attentions:
            x = attn(x)
        return self.resnets[1](x)


class Upsample2D(nn.Module):
    """Nearest 2x, then a 3x3 pad-1 conv named `conv`."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UpDecoderBlock2D(nn.Module):
    def __init__(self, cin, cout, num_layers, groups, add_upsample):
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResnetBlock2D(cin if i == 0 else cout, cout, groups) for i in range(num_layers)])
        if add_upsample:
            self.upsamplers = nn.ModuleList([Upsample2D(cout)])
        self.add_upsample = add_upsample

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.add_upsample:
            x = self.upsamplers[0](x)
        return x


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch = list(cfg["block_out_channels"])
        groups = cfg["norm_num_groups"]
        self.conv_in = nn.Conv2d(cfg["latent_channels"], ch[-1], 3, padding=1)
        self.mid_block = UNetMidBlock2D(ch[-1], groups, cfg.get("mid_block_add_attention", True))
        rev = ch[::-1]
        prev = rev[0]
        blocks = []
        for i, cout in enumerate(rev):
            blocks.append(UpDecoderBlock2D(prev, cout, cfg["layers_per_block"] + 1, groups,
                                           add_upsample=i != len(rev) - 1))
            prev = cout
        self.up_blocks = nn.ModuleList(blocks)
        self.conv_norm_out = nn.GroupNorm(groups, ch[0], eps=1e-6, affine=True)
        self.conv_out = nn.Conv2d(ch[0], cfg["out_channels"], 3, padding=1)

    def forward(self, z, record):
        x = self.conv_in(z)
        record["decoder.conv_in"] = x
        x = self.mid_block(x)
        record["decoder.mid_block"] = x
        for i, block in enumerate(self.up_blocks):
            x = block(x)
            record[f"decoder.up_blocks.{i}"] = x
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKLDecoder(nn.Module):
    """The decode path of AutoencoderKL: optional post_quant_conv (1x1), then the decoder.
    decode() takes the unscaled z (= latents / scaling_factor + shift_factor, done outside)."""

    def __init__(self, cfg):
        super().__init__()
        self.decoder = Decoder(cfg)
        if cfg.get("use_post_quant_conv", True):
            self.post_quant_conv = nn.Conv2d(cfg["latent_channels"], cfg["latent_channels"], 1)
        self.has_post_quant = cfg.get("use_post_quant_conv", True)

    def decode(self, z, record=None):
        rec = record if record is not None else {}
        if self.has_post_quant:
            z = self.post_quant_conv(z)
            rec["post_quant_conv"] = z
        return self.decoder(z, rec)


# =============================================================================================
# FlowMatchEulerDiscreteScheduler ("FlowMatch Euler scheduler"), numpy as the scheduler does it
# =============================================================================================
class FlowMatchEulerDiscreteScheduler:
    def __init__(self, num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5,
                 max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096, invert_sigmas=False,
                 shift_terminal=None, time_shift_type="exponential", **unused):
        assert not invert_sigmas and shift_terminal is None and time_shift_type in ("exponential", "linear")
        for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"):
            assert not unused.get(k, False), k
        self.num_train_timesteps = num_train_timesteps
        self.shift = float(shift)
        self.dynamic = use_dynamic_shifting
        self.time_shift_type = time_shift_type
        # s_k = k / 1000, k = 1000 .. 1, f32 (a torch f32 tensor there; the same IEEE operations here).
        timesteps = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1].copy()
        sigmas = timesteps / num_train_timesteps
        if not use_dynamic_shifting:
            sigmas = self.shift * sigmas / (1 + (self.shift - 1) * sigmas)
        self.sigma_max = float(sigmas[0])
        self.sigma_min = float(sigmas[-1])

    def time_shift(self, mu, sigma, t):
        if self.time_shift_type == "exponential":
            return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)
        return mu / (mu + (1 / t - 1) ** sigma)

    def set_timesteps(self, num_inference_steps=None, sigmas=None, mu=None):
        """Returns (sigmas [N+1] f32 ending in 0, timesteps [N] f32)."""
        if self.dynamic and mu is None:
            raise ValueError("mu is required with use_dynamic_shifting")
        if sigmas is None:
            # float64: linspace of Python floats; sigma_min is already shifted (and is shifted again).
            timesteps = np.linspace(self.sigma_max * self.num_train_timesteps,
                                    self.sigma_min * self.num_train_timesteps, num_inference_steps)
            sigmas = timesteps / self.num_train_timesteps
        else:
            sigmas = np.array(sigmas).astype(np.float32)  # f32 arithmetic from here on
        if self.dynamic:
            sigmas = self.time_shift(mu, 1.0, sigmas)
        else:
            sigmas = self.shift * sigmas / (1 + (self.shift - 1) * sigmas)
        sigmas = sigmas.astype(np.float32)
        timesteps = sigmas * np.float32(self.num_train_timesteps)
        return np.append(sigmas, np.float32(0.0)).astype(np.float32), timesteps.astype(np.float32)


def euler_step(x, v, sigma, sigma_next):
    """x' = f32(x) + (sigma_next - sigma) * v, all f32 (v f32)."""
    dt = np.float32(sigma_next) - np.float32(sigma)
    return (x.astype(np.float32) + dt * v.astype(np.float32)).astype(np.float32), dt


# =============================================================================================
# Tiny configs, weights and files
# =============================================================================================
TRANSFORMER_CONFIG = {
    "_class_name": "FluxTransformer2DModel",
    "_diffusers_version": "0.30.0",
    "attention_head_dim": 16,
    "axes_dims_rope": [4, 6, 6],
    "guidance_embeds": True,
    "in_channels": 64,
    "joint_attention_dim": 40,
    "num_attention_heads": 2,
    "num_layers": 2,
    "num_single_layers": 2,
    "out_channels": None,
    "patch_size": 1,
    "pooled_projection_dim": 24,
}

# schnell-like (no guidance), shaped differently on purpose: 3 heads of 8 (D = 24), one double block,
# out_channels left to its default (absent).
TRANSFORMER_NOGUIDANCE_CONFIG = {
    "_class_name": "FluxTransformer2DModel",
    "_diffusers_version": "0.30.0",
    "attention_head_dim": 8,
    "axes_dims_rope": [2, 2, 4],
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": 40,
    "num_attention_heads": 3,
    "num_layers": 1,
    "num_single_layers": 2,
    "patch_size": 1,
    "pooled_projection_dim": 20,
}

# Flux-like: 16 latent channels, no quant convs, scaling/shift of the Flux VAE; three blocks, so two
# upsamplers (4x): an 8x8 latent decodes to 32x32.
VAE_CONFIG = {
    "_class_name": "AutoencoderKL",
    "_diffusers_version": "0.30.0",
    "act_fn": "silu",
    "block_out_channels": [8, 16, 24],
    "down_block_types": ["DownEncoderBlock2D"] * 3,
    "force_upcast": True,
    "in_channels": 3,
    "latent_channels": 16,
    "latents_mean": None,
    "latents_std": None,
    "layers_per_block": 1,
    "mid_block_add_attention": True,
    "norm_num_groups": 4,
    "out_channels": 3,
    "sample_size": 32,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "up_block_types": ["UpDecoderBlock2D"] * 3,
    "use_post_quant_conv": False,
    "use_quant_conv": False,
}

# SD-like: 4 latent channels, quant convs (the decoder uses post_quant_conv), 3 resnets per up block,
# two blocks (one upsampler, 2x), no shift_factor.
VAE_POSTQUANT_CONFIG = {
    "_class_name": "AutoencoderKL",
    "_diffusers_version": "0.30.0",
    "act_fn": "silu",
    "block_out_channels": [8, 16],
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "force_upcast": True,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 2,
    "out_channels": 3,
    "sample_size": 16,
    "scaling_factor": 0.18215,
    "shift_factor": None,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "use_post_quant_conv": True,
    "use_quant_conv": True,
}

SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.30.0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}

MODULATION = ("norm1.linear", "norm1_context.linear", "norm.linear", "norm_out.linear")


def init_weights(model, seed):
    """Random weights, bf16-representable, in f32. Linear/conv weights N(0, 1/fan_in); biases N(0, 0.1^2);
    RMS/group-norm weights U(0.5, 1.5). The modulation linears get biases N(0, 0.3^2) (on top of the
    projected SiLU(temb)), so shift, scale and gate are all clearly non-zero and differ per chunk."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.rsplit(".", 1)[0]
            if name.endswith(".weight") and p.ndim >= 2:
                fan_in = p[0].numel()
                v = torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(fan_in)
            elif name.endswith(".weight"):  # RMSNorm / GroupNorm
                v = torch.rand(p.shape, generator=gen, dtype=F64) + 0.5
            else:
                std = 0.3 if module.endswith(MODULATION) else 0.1
                v = torch.randn(p.shape, generator=gen, dtype=F64) * std
            p.copy_(bf16_representable(v))
    return model


def bf16_representable(t):
    """t rounded to the nearest bf16 value, as f32."""
    return t.float().to(BF16).float()


def write_json(path, obj):
    """obj as indented JSON with sorted keys and a final newline; creates the directory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_tensors(directory, config, tensors, dtype=torch.float32):
    """directory/config.json and directory/diffusion_pytorch_model.safetensors (tensors as dtype); returns
    the tensors written."""
    write_json(os.path.join(directory, "config.json"), config)
    tensors = {k: v.detach().float().contiguous().to(dtype) for k, v in tensors.items()}
    write_safetensors(os.path.join(directory, "diffusion_pytorch_model.safetensors"), tensors, {"format": "pt"})
    return tensors


def save_model(model, directory, config, dtype=torch.float32):
    return save_tensors(directory, config, model.state_dict(), dtype)


class Goldens:
    """The cases of one golden file: tensors "<case>.<name>" (f32) and __metadata__ (`meta`: the keys
    starting with "_" describe the file, Flux's description unless given; each case maps to its JSON)."""

    def __init__(self, seed, meta=None):
        self.gen = torch.Generator().manual_seed(seed)
        self.tensors = {}
        self.meta = meta if meta is not None else {
            "_generator": GENERATOR,
            "_torch_version": torch.__version__,
            "_seed": str(seed),
            "_numerics": "models in float64 on f32 inputs and bf16-representable weights, results rounded "
                         "to f32; timestep sinusoid arguments and RoPE tables as an f32 diffusers run "
                         "(see the generator's docstring)",
        }

    def randn(self, shape, scale=1.0, offset=0.0):
        return (torch.randn(shape, generator=self.gen, dtype=F64) * scale + offset).float()

    def uniform(self, shape, lo, hi):
        return (torch.rand(shape, generator=self.gen, dtype=F64) * (hi - lo) + lo).float()

    def add(self, case, params, tensors):
        assert case not in self.meta, case
        for name, t in tensors.items():
            key = f"{case}.{name}"
            assert key not in self.tensors, key
            t = t.detach()
            assert t.dtype in (torch.float32, F64), key
            self.tensors[key] = t.float().contiguous()
        self.meta[case] = json.dumps(params, separators=(",", ":"), sort_keys=True)

    def write(self, path):
        """Writes the safetensors file and checks it reads back the same."""
        write_safetensors(path, self.tensors, self.meta)
        back, meta = read_safetensors(path)
        assert set(back) == set(self.tensors) and all(torch.equal(back[k], self.tensors[k]) for k in back)
        assert meta == self.meta


def max_abs(t):
    return float(t.detach().abs().max())


def print_model_files(data):
    """One line per file of each model directory under `data`: its path (from the repository root), size."""
    for name in sorted(os.listdir(data)):
        for fname in sorted(os.listdir(os.path.join(data, name))):
            p = os.path.join(data, name, fname)
            print(f"{os.path.relpath(p, ROOT)}: {os.path.getsize(p)} bytes")


def print_report(report):
    for k, v in report.items():
        print(f"  {k}: " + ", ".join(f"{a}={b:.4g}" for a, b in v.items()))


def f32_run_error(model, fn, expected):
    """Max |f32 run - golden|: runs `fn` on an f32 copy of the model (a tolerance hint)."""
    import copy
    m32 = copy.deepcopy(model).float()
    return max_abs(fn(m32).float() - expected)


# =============================================================================================
# Main
# =============================================================================================
def main():
    data = os.path.join(OUT_DIR, "flux_tiny")
    report = {}

    # ---- models -------------------------------------------------------------------------------
    flux = init_weights(FluxTransformer2DModel(TRANSFORMER_CONFIG), 3001).double().eval()
    flux_ng = init_weights(FluxTransformer2DModel(TRANSFORMER_NOGUIDANCE_CONFIG), 3002).double().eval()
    vae = init_weights(AutoencoderKLDecoder(VAE_CONFIG), 3003).double().eval()
    vae_pq = init_weights(AutoencoderKLDecoder(VAE_POSTQUANT_CONFIG), 3004).double().eval()

    f32_weights = save_model(flux, os.path.join(data, "transformer"), TRANSFORMER_CONFIG)
    bf16_weights = save_model(flux, os.path.join(data, "transformer_bf16"), TRANSFORMER_CONFIG, dtype=BF16)
    for k in f32_weights:
        assert torch.equal(bf16_weights[k].float(), f32_weights[k]), k  # exactly the same values
    save_model(flux_ng, os.path.join(data, "transformer_noguidance"), TRANSFORMER_NOGUIDANCE_CONFIG)
    save_model(vae, os.path.join(data, "vae"), VAE_CONFIG)
    save_model(vae_pq, os.path.join(data, "vae_postquant"), VAE_POSTQUANT_CONFIG)
    write_json(os.path.join(data, "scheduler", "scheduler_config.json"), SCHEDULER_CONFIG)

    g = Goldens(3100)
    cfg = flux.cfg
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    tiny = "flux_tiny/transformer"

    # ---- RoPE table -----------------------------------------------------------------------------
    rope_ids = torch.cat([
        torch.zeros(5, 3),  # text tokens
        latent_image_ids(6, 8),  # a 3 x 4 image grid
        torch.tensor([[2.0, 63.0, 127.0], [0.5, 1.25, 7.0], [1.0, 0.0, 0.0]]),  # axis 0, large, fractional
    ])
    cos, sin = flux_rope(rope_ids, cfg["axes_dims_rope"])
    g.add("rope", dict(op="flux_rope", axes_dims_rope=cfg["axes_dims_rope"], theta=10000.0,
                       num_tokens=rope_ids.shape[0]),
          {"ids": rope_ids, "cos": cos, "sin": sin})
    cos_ng, sin_ng = flux_rope(rope_ids, flux_ng.cfg["axes_dims_rope"])
    g.add("rope_axes_2_2_4", dict(op="flux_rope", axes_dims_rope=flux_ng.cfg["axes_dims_rope"], theta=10000.0,
                                  num_tokens=rope_ids.shape[0]),
          {"ids": rope_ids, "cos": cos_ng, "sin": sin_ng})

    # ---- timestep sinusoid ------------------------------------------------------------------------
    tvals = torch.tensor([0.0, 1.0, 28.5, 437.5, 999.0, 1000.0, 3500.0], dtype=torch.float32)
    g.add("timestep_sinusoid", dict(op="timestep_sinusoid", num_channels=256, flip_sin_to_cos=True,
                                    downscale_freq_shift=0, max_period=10000,
                                    note="input is the already scaled value (t * 1000); output [cos | sin]"),
          {"timestep": tvals, "expected": timestep_sinusoid(tvals, F64)})

    # ---- one double block and one single block ----------------------------------------------------
    bsz, n_img, n_txt = 2, 8, 5
    block_ids = torch.randint(0, 8, (n_txt + n_img, 3), generator=g.gen).float()
    bcos, bsin = flux_rope(block_ids, cfg["axes_dims_rope"])
    for kind, idx in (("double_block", 1), ("single_block", 0)):
        h = g.randn((bsz, n_img, dim))
        c = g.randn((bsz, n_txt, dim))
        temb = g.randn((bsz, dim))
        if kind == "double_block":
            block, prefix = flux.transformer_blocks[idx], f"transformer_blocks.{idx}."
        else:
            block, prefix = flux.single_transformer_blocks[idx], f"single_transformer_blocks.{idx}."
        with torch.no_grad():
            oh, oc = block(h.double(), c.double(), temb.double(), (bcos, bsin))
            err = f32_run_error(block, lambda b: b(h, c, temb, (bcos, bsin))[0], oh.float())
        g.add(kind, dict(op=f"flux_{kind}", weights=tiny, prefix=prefix, num_attention_heads=cfg["num_attention_heads"],
                         attention_head_dim=cfg["attention_head_dim"], batch=bsz, num_img_tokens=n_img,
                         num_txt_tokens=n_txt, rope_order="text tokens first, then image tokens",
                         temb="before SiLU", ids="rope ids of the rows of cos/sin (random, for coverage)"),
              {"hidden_states": h, "encoder_hidden_states": c, "temb": temb, "ids": block_ids, "cos": bcos,
               "sin": bsin, "expected_hidden_states": oh, "expected_encoder_hidden_states": oc})
        report[kind] = dict(max_abs_hidden=max_abs(oh), max_abs_context=max_abs(oc), f32_run_err_hidden=err)

    # ---- whole transformer forwards -------------------------------------------------------------------
    def transformer_case(case, model, weights, lat_h, lat_w, n_txt, guidance):
        mcfg = model.cfg
        latents = g.randn((bsz, 16, lat_h, lat_w))
        hidden = pack_latents(latents)
        ehs = g.randn((bsz, n_txt, mcfg["joint_attention_dim"]))
        pooled = g.randn((bsz, mcfg["pooled_projection_dim"]))
        timestep = g.uniform((bsz,), 0.0, 1.0)
        img_ids, txt_ids = latent_image_ids(lat_h, lat_w), torch.zeros(n_txt, 3)
        gd = torch.tensor(guidance, dtype=torch.float32) if guidance is not None else None
        rec = {}
        with torch.no_grad():
            out = model(hidden.double(), ehs.double(), pooled.double(), timestep, img_ids, txt_ids, gd, rec)
            err = f32_run_error(model, lambda m: m(hidden, ehs, pooled, timestep, img_ids, txt_ids, gd), out.float())
        tensors = {"hidden_states": hidden, "encoder_hidden_states": ehs, "pooled_projections": pooled,
                   "timestep": timestep, "img_ids": img_ids, "txt_ids": txt_ids, "expected": out}
        if gd is not None:
            tensors["guidance"] = gd
        tensors.update({f"intermediate.{k}": v for k, v in rec.items()})
        params = dict(op="flux_transformer", weights=weights, batch=bsz, latent_height=lat_h, latent_width=lat_w,
                      num_img_tokens=hidden.shape[1], num_txt_tokens=n_txt, guidance=gd is not None,
                      intermediates=sorted(rec), note="timestep is sigma in [0, 1]; expected is the packed "
                      "velocity [B, N_img, out_channels]; intermediate.temb is before SiLU")
        g.add(case, params, tensors)
        report[case] = dict(max_abs_expected=max_abs(out), max_abs_temb=max_abs(rec["temb"]),
                            max_abs_any_intermediate=max(max_abs(v) for v in rec.values()), f32_run_err=err)

    transformer_case("transformer", flux, tiny, 8, 8, 5, [3.5, 5.0])
    transformer_case("transformer_noguidance", flux_ng, "flux_tiny/transformer_noguidance", 6, 10, 7, None)

    # ---- pack / unpack ------------------------------------------------------------------------------
    lat = g.randn((2, 16, 4, 6))
    packed = pack_latents(lat)
    assert torch.equal(unpack_latents(packed, 4, 6), lat)
    g.add("pack", dict(op="flux_pack_latents", latent_height=4, latent_width=6,
                       note="expected = pack(latents); unpack(expected, 4, 6) == latents; img_ids = "
                            "(0, row, col) of the packed grid"),
          {"latents": lat, "expected": packed, "img_ids": latent_image_ids(4, 6)})

    # ---- VAE decoder ----------------------------------------------------------------------------------
    def vae_case(case, model, weights, vcfg, shape):
        shift = vcfg["shift_factor"] or 0.0
        latents = g.randn(shape)
        z = (latents.double() / vcfg["scaling_factor"] + shift).float()  # unscaled outside the decoder
        rec = {}
        with torch.no_grad():
            img = model.decode(z.double(), rec)
            err = f32_run_error(model, lambda m: m.decode(z), img.float())
        tensors = {"z": z, "expected": img}
        tensors.update({f"intermediate.{k}": v for k, v in rec.items() if "up_blocks" not in k})
        g.add(case, dict(op="vae_decode", weights=weights, z_shape=list(z.shape), image_shape=list(img.shape),
                         post_quant_conv=vcfg["use_post_quant_conv"],
                         intermediates=sorted(k[len("intermediate."):] for k in tensors if k.startswith("interm")),
                         note="z is already unscaled (latents / scaling_factor + shift_factor); expected is "
                              "the raw decoder output (before clamp(x / 2 + 0.5, 0, 1))"),
              tensors)
        report[case] = dict(max_abs_z=max_abs(z), max_abs_expected=max_abs(img), f32_run_err=err)

    vae_case("vae_decode", vae, "flux_tiny/vae", VAE_CONFIG, (1, 16, 8, 8))
    vae_case("vae_postquant_decode", vae_pq, "flux_tiny/vae_postquant", VAE_POSTQUANT_CONFIG, (2, 4, 6, 10))

    # ---- tiny text-to-image pipeline: 4 Euler steps, unpack, unscale, decode -----------------------------
    steps, lat_h, lat_w, n_txt_p = 4, 8, 8, 5
    noise = g.randn((1, 16, lat_h, lat_w))
    ehs = g.randn((1, n_txt_p, cfg["joint_attention_dim"]))
    pooled = g.randn((1, cfg["pooled_projection_dim"]))
    guidance = torch.full((1,), 3.5, dtype=torch.float32)
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    seq_len = (lat_h // 2) * (lat_w // 2)
    mu = calculate_shift(seq_len, SCHEDULER_CONFIG["base_image_seq_len"], SCHEDULER_CONFIG["max_image_seq_len"],
                         SCHEDULER_CONFIG["base_shift"], SCHEDULER_CONFIG["max_shift"])
    sigmas, timesteps = sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    img_ids, txt_ids = latent_image_ids(lat_h, lat_w), torch.zeros(n_txt_p, 3)
    x = pack_latents(noise).double()
    tensors = {"noise": noise, "encoder_hidden_states": ehs, "pooled_projections": pooled, "guidance": guidance,
               "img_ids": img_ids, "txt_ids": txt_ids}
    with torch.no_grad():
        for i in range(steps):
            t_model = torch.tensor([timesteps[i]], dtype=torch.float32) / 1000  # f32, as the pipeline
            v = flux(x, ehs.double(), pooled.double(), t_model, img_ids, txt_ids, guidance)
            dt = float(np.float32(sigmas[i + 1]) - np.float32(sigmas[i]))
            x = x + dt * v
            tensors[f"intermediate.latents_step{i}"] = x
        lat = unpack_latents(x, lat_h, lat_w)
        z = lat / VAE_CONFIG["scaling_factor"] + VAE_CONFIG["shift_factor"]
        image = vae.decode(z)
    tensors.update({"intermediate.timesteps": torch.from_numpy(timesteps.copy()),
                    "intermediate.sigmas": torch.from_numpy(sigmas.copy()),
                    "intermediate.z": z, "expected_latents": lat, "expected": image})
    g.add("pipeline", dict(op="flux_pipeline", transformer="flux_tiny/transformer", vae="flux_tiny/vae",
                           scheduler="flux_tiny/scheduler", num_inference_steps=steps, guidance_scale=3.5,
                           height=lat_h * 4, width=lat_w * 4, latent_height=lat_h, latent_width=lat_w,
                           image_seq_len=seq_len, mu=mu,
                           note="noise [1,16,H,W] is packed, then per step the transformer gets timestep "
                                "f32(t / 1000) and latents += f32(sigma_{i+1} - sigma_i) * v (latents kept in "
                                "float64); expected_latents = unpack(final), z = expected_latents / 0.3611 + "
                                "0.1159, expected = vae.decode(z) (before clamp(x / 2 + 0.5, 0, 1))"),
          tensors)
    report["pipeline"] = dict(max_abs_expected=max_abs(image), max_abs_latents=max_abs(lat))

    path = os.path.join(OUT_DIR, "goldens_flux.safetensors")
    g.write(path)

    # ---- scheduler reference values ----------------------------------------------------------------------
    write_scheduler_reference(os.path.join(OUT_DIR, "flowmatch_reference.json"))

    print_model_files(data)
    for p in (path, os.path.join(OUT_DIR, "flowmatch_reference.json")):
        print(f"{os.path.relpath(p, ROOT)}: {os.path.getsize(p)} bytes")
    print("cases:", ", ".join(k for k in g.meta if not k.startswith("_")))
    print_report(report)


def f32_list(a):
    """Exact decimals of f32 values (shortest double repr of each)."""
    return [float(np.float32(v)) for v in np.asarray(a, dtype=np.float32).ravel()]


def write_scheduler_reference(path):
    dev = dict(SCHEDULER_CONFIG)
    dev.pop("_class_name")
    dev.pop("_diffusers_version")
    schnell = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)
    static3 = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    wan = dict(num_train_timesteps=1000, shift=5.0, use_dynamic_shifting=False)
    # (name, config, N, image_seq_len for mu or None, pipeline sigmas linspace(1, 1/N, N) or default)
    cases = [
        ("flux_dev_seq4096_n28", dev, 28, 4096, True),
        ("flux_dev_seq1024_n28", dev, 28, 1024, True),
        ("flux_dev_seq4096_n50", dev, 50, 4096, True),
        ("flux_dev_seq16_n4", dev, 4, 16, True),  # the tiny pipeline golden
        ("flux_schnell_shift1_n4", schnell, 4, 4096, True),
        ("static_shift3_pipeline_sigmas_n20", static3, 20, None, True),
        ("static_shift3_default_sigmas_n8", static3, 8, None, False),
        ("wan_shift5_default_sigmas_n10", wan, 10, None, False),
    ]
    out_cases = []
    for name, config, n, seq_len, pipeline_sigmas in cases:
        sched = FlowMatchEulerDiscreteScheduler(**config)
        mu = None
        if seq_len is not None:
            mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15))
        given = np.linspace(1.0, 1 / n, n) if pipeline_sigmas else None
        sigmas, timesteps = sched.set_timesteps(n, sigmas=given, mu=mu)
        assert sigmas.shape == (n + 1,) and timesteps.shape == (n,) and sigmas[-1] == 0
        case = {
            "name": name,
            "config": config,
            "num_inference_steps": n,
            "sigmas_argument": "linspace(1, 1/N, N) (FluxPipeline), cast to f32 by the scheduler"
            if pipeline_sigmas else None,
            "input_sigmas_f32": f32_list(given) if pipeline_sigmas else None,
            "image_seq_len": seq_len,
            "mu": mu if sched.dynamic else None,
            "mu_passed_but_unused": mu if (mu is not None and not sched.dynamic) else None,
            "init_sigma_max": sched.sigma_max,
            "init_sigma_min": sched.sigma_min,
            "sigmas": f32_list(sigmas),
            "timesteps": f32_list(timesteps),
        }
        out_cases.append(case)

    gen = np.random.RandomState(3200)
    x = gen.standard_normal(8).astype(np.float32)
    v = gen.standard_normal(8).astype(np.float32)
    dev_case = out_cases[0]
    s0, s1 = dev_case["sigmas"][0], dev_case["sigmas"][1]
    x_next, dt = euler_step(x, v, s0, s1)
    step = {"from_case": dev_case["name"], "step_index": 0, "sigma": s0, "sigma_next": s1,
            "dt": float(dt), "x": f32_list(x), "v": f32_list(v), "expected": f32_list(x_next),
            "formula": "dt = f32(sigma_next - sigma); expected = f32(x + f32(dt * v)), all f32"}
    doc = {
        "_generator": GENERATOR,
        "_numpy_version": np.__version__,
        "_note": "FlowMatchEulerDiscreteScheduler.set_timesteps: sigmas has N+1 f32 entries ending in 0, "
                 "timesteps N f32 entries (sigma * 1000, not rounded). Every number is the exact decimal of an "
                 "f32 (mu and init_sigma_* are Python floats). Pipeline-sigma cases do all arithmetic in f32 "
                 "(numpy f32 arrays with Python-float scalars); default-sigma cases (no sigmas argument) do "
                 "linspace(sigma_max*1000, sigma_min*1000, N)/1000 and the shift in float64, then cast to f32, "
                 "where sigma_min is the already shifted training sigma (shifted twice).",
        "cases": out_cases,
        "euler_step": step,
    }
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
