#!/usr/bin/python3
"""Reference implementation and committed test data for cubevec's Wan2.1 port (issue 8).

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_wan_reference.py [OUTPUT_DIR]   # default tests/data

Everything here is written from docs/models.md, "The math the ports follow" (its Wan,
AutoencoderKLWan and FlowMatch sections, with the shared building blocks; the quoted section names
below are that page's) in plain torch; diffusers is not used (nor installed). Modules and parameters
carry diffusers' names, so a state_dict() is a diffusers checkpoint. It writes, under OUTPUT_DIR:

  wan_tiny/transformer/          config.json + diffusion_pytorch_model.safetensors (F32): a
                                 WanTransformer3DModel with 2 heads of 16 (D = 32, RoPE axes t/h/w = 8/4/4),
                                 in/out channels 4, text_dim 24, freq_dim 32, ffn_dim 48, 2 layers
  wan_tiny/vae/                  config.json + diffusion_pytorch_model.safetensors (F32): AutoencoderKLWan
                                 with base_dim 4, z_dim 4 (decoder dims [16, 16, 16, 8, 4]); decoder.*,
                                 post_quant_conv.* and, so a loader's "ignore the encoder" path is
                                 exercised, encoder.conv_in.* and quant_conv.*
  wan_tiny/scheduler/            scheduler_config.json: FlowMatchEulerDiscreteScheduler, shift 3, static
  goldens_wan.safetensors        the goldens (all F32), cases described in __metadata__:
      transformer.{hidden_states [2,4,3,4,6], timestep [2] = (999, 250.5), encoder_hidden_states [2,7,24]
                   (batch 1's last 2 rows zero), sample [2,4,3,4,6], temb [2,32] (time_embedder output),
                   timestep_proj [2,6,32] (time_proj output, before the tables are added), context [2,7,32]}
      rope.{cos, sin} [18, 16]    per-token tables, each angle twice (interleaved), order [t | h | w]
      block0.{hidden_states, out}, block1.out [2,18,32]   (block 0's input is the patch embedding)
      vae.{latents, z [1,4,3,4,4], video_unclamped, video [1,3,9,32,32]} and vae.intermediate.*
      scheduler.{sigmas [11], timesteps [10]}   set_timesteps(10), no sigmas, no mu (Wan's Euler path)
      pipeline.{noise [1,4,3,4,6], prompt_embeds [1,7,24] (last 2 rows zero), negative_prompt_embeds [1,7,24],
               latents and latents_cfg_off [1,4,3,4,6], video [1,3,9,32,48]} and pipeline.intermediate.*:
               WanPipeline ("WanPipeline") with the Euler scheduler ("FlowMatch Euler scheduler"), 3 steps,
               CFG 4.0 (and CFG off), un-normalize per channel, decode, clamp

Golden file layout (as make_flux_reference.py): tensors "<case>.<name>"; __metadata__ maps each case to a
JSON object (op, weights directory, shapes, note); keys starting with "_" describe the file.

Numerics (as make_flux_reference.py):
  * Weights are random, drawn in f32, rounded to bf16-representable values and stored as F32 (so the same
    checkpoint loaded as bf16 holds exactly the same values). Inputs are f32.
  * The models run in float64 on those values and the results are rounded to f32 once.
  * Two places follow an f32 diffusers run instead, because diffusers fixes their precision:
      - the timestep sinusoid ("Shared building blocks"; freq_dim channels, half = freq_dim / 2): the
        frequencies f_j = f32(exp(f32(f32(-ln 10000) * j) / half)) with a correctly rounded exp, the arguments
        a_j = f32(t * f_j) for the raw f32 timestep t (Wan does not divide by 1000); cos and sin of those
        f32 arguments are then taken in float64.
      - the RoPE tables ("Shared building blocks", "Wan 3-D RoPE"): float64, rounded to f32; the rotation
        uses the f32 table.
  * The scheduler values are numpy float32 exactly as diffusers computes them (the class is shared with
    make_flux_reference.py, which checks it against other cases).
  * The pipeline case follows an f32 WanPipeline run: the float64 velocities are combined by CFG in
    float64 and rounded to f32 once, the Euler update is f32 (make_flux_reference.euler_step: f32(x +
    f32(f32(dt) * v))), so the latents are f32 between steps; the model gets the raw f32 timestep.

Where this script goes beyond those sections, and the source fact used (diffusers, read for facts only):
  * Decoder up-block channels ("AutoencoderKLWan decoder" gives only the base-96 widths): WanDecoder3d builds
    dims = [base * m for m in [dim_mult[-1]] + dim_mult[::-1]] and, for up block i > 0 (Wan2.1, not
    is_residual), in_dim = dims[i] // 2 (the previous block's resample conv halves the channels), out_dim =
    dims[i + 1]; block i upsamples unless it is the last, with "upsample3d" where
    temperal_downsample[::-1][i] is true. Every resample conv maps C -> C // 2; time_conv maps C -> 2C.
    Base 4: dims [16, 16, 16, 8, 4]; up_blocks.0 16->16 (3d), .1 8->16 with conv_shortcut (3d),
    .2 8->8 (2d), .3 4->4 (none).
  * Where the decoder's feature cache lives ("AutoencoderKLWan decoder" says only that each causal conv keeps
    the last two frames of its input): diffusers
    caches the input of every causal conv with temporal kernel 3 (conv_in, each resnet's conv1 / conv2,
    conv_out, time_conv), the 2 last frames of (previous cache ++ this chunk), and prepends it, shrinking the
    front zero padding by its length. The 1x1x1 convs (conv_shortcut, post_quant_conv) are not cached; the
    mid-block attention works per frame. post_quant_conv runs on the whole z before the frame loop.
  * upsample3d's first-chunk case: on its first call (the first latent frame) the time_conv is skipped
    entirely (diffusers marks the cache "Rep"); on the second call time_conv sees 2 zero frames in front.
  * WanRMS_norm is F.normalize over the channel dim (eps 1e-12) * sqrt(C) * gamma, no bias parameter (bias=False);
    gamma is [C, 1, 1, 1] in resnets / norm_out and [C, 1, 1] in the attention block.
  * VAE config keys: every argument of AutoencoderKLWan.__init__ in current diffusers (base_dim,
    decoder_base_dim, z_dim, dim_mult, num_res_blocks, attn_scales, temperal_downsample, dropout,
    latents_mean, latents_std, is_residual, in_channels, out_channels, patch_size, scale_factor_temporal,
    scale_factor_spatial). decoder_base_dim (null: the decoder uses base_dim) and in/out_channels are newer
    than the diffusers these facts were first read from; a loader should accept both older and newer files.
  * The encoder-only tensors' shapes: encoder.conv_in is WanCausalConv3d(3, base_dim, 3) and quant_conv is
    WanCausalConv3d(2 z_dim, 2 z_dim, 1).
  * RoPE axis split for attention_head_dim 16: the rule of "Wan 3-D RoPE" (h = w = 2 floor(hd / 6), t = the rest)
    gives 8/4/4, which is what this script (and the brief) use. diffusers builds its table with that rule
    but its forward() then splits the concatenated table with [hd - 2 floor(hd/3), floor(hd/3),
    floor(hd/3)], which is [6, 5, 5] for hd = 16 (the two rules agree for the real hd = 128: 44/42/42).
    So a diffusers run of this tiny config would mix axes in two pairs; the script reports by how much
    the sample would move (see "diffusers_rope_split" in its output). The goldens follow "Wan 3-D RoPE".
  * The output head: shift, scale = rows of (scale_shift_table + temb), no SiLU on temb ("Wan transformer", output,
    and the original Wan head). One newer diffusers version moves this into norm_out = AdaLayerNorm with a
    load-time conversion of scale_shift_table; that is not what the checkpoints store, and not followed here.
Seeds are fixed, so the output is deterministic (same torch and numpy versions, same bytes).
"""
import copy
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_io import read_safetensors
# Shared with the Flux reference: the "Shared building blocks" (the timestep sinusoid, the 1-D RoPE
# table, attention, the norms, the feed-forward and embedding modules), the scheduler's numpy float32
# arithmetic ("FlowMatch Euler scheduler"), and the weight, file and golden helpers.
from make_flux_reference import (FeedForward, FlowMatchEulerDiscreteScheduler, Goldens, PixArtAlphaTextProjection,
                                 RMSNorm, TimestepEmbedding, bf16_representable, euler_step, layer_norm, max_abs,
                                 print_model_files, print_report, rope_1d, save_tensors, sdpa, timestep_sinusoid,
                                 write_json)

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

F64 = torch.float64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
GENERATOR = "tests/reference/make_wan_reference.py"
ROPE_THETA = 10000.0


# =============================================================================================
# Shared building blocks (the rest are make_flux_reference.py's)
# =============================================================================================
def rope_axis_table(dim, num_positions):
    """get_1d_rotary_pos_embed(dim, positions 0..n-1, theta 10000, use_real, repeat_interleave_real):
    float64 angles p * theta^(-2j/dim), cos and sin each repeated twice ([c0, c0, c1, c1, ...]), as f32."""
    return rope_1d(dim, torch.arange(num_positions, dtype=F64), ROPE_THETA)


def apply_rope(x, cos, sin):
    """Rotate the pairs (x[2j], x[2j+1]) of x [B, L, H, hd] by the per-token tables cos/sin [L, hd]
    ("Shared building blocks"). Like Wan, cos is read at the even and sin at the odd positions (the same
    values in a well-formed table; see the docstring on diffusers' split for hd = 16)."""
    c = cos.to(x.dtype)[None, :, None, 0::2]
    s = sin.to(x.dtype)[None, :, None, 1::2]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)


# =============================================================================================
# WanTransformer3DModel ("Wan transformer")
# =============================================================================================
def wan_rope_axes(head_dim):
    """(t, h, w) sizes of the head dim ("Wan 3-D RoPE"): h = w = 2 floor(hd / 6), t = the rest."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def wan_rope(head_dim, frames, height, width, max_seq_len):
    """Per-token cos, sin [frames * height * width, head_dim] (f32) for the post-patch grid, tokens in
    (t, h, w) row-major order; each row is [t table at f | h table at i | w table at j]."""
    axes = wan_rope_axes(head_dim)
    assert max(frames, height, width) <= max_seq_len, "grid exceeds rope_max_seq_len"
    tables = [rope_axis_table(d, max_seq_len) for d in axes]
    return _grid_rows(tables, frames, height, width)


def _grid_rows(tables, frames, height, width):
    """Expands per-axis tables [(cos, sin) of [max_seq_len, d_axis]] to the token grid."""
    f, i, j = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    pos = [f.reshape(-1), i.reshape(-1), j.reshape(-1)]
    cos = torch.cat([tables[a][0][pos[a]] for a in range(3)], dim=1)
    sin = torch.cat([tables[a][1][pos[a]] for a in range(3)], dim=1)
    return cos, sin


def diffusers_split_rope(head_dim, frames, height, width, max_seq_len):
    """The table diffusers' WanRotaryPosEmbed.forward would build: the [t | h | w] tables concatenated
    over positions, then re-split as [hd - 2 floor(hd/3), floor(hd/3), floor(hd/3)]. Equal to wan_rope for
    hd = 128; used only to report how far a diffusers run of the tiny config (hd = 16) would be."""
    full = [rope_axis_table(d, max_seq_len) for d in wan_rope_axes(head_dim)]
    cos_all = torch.cat([t[0] for t in full], dim=1)
    sin_all = torch.cat([t[1] for t in full], dim=1)
    sizes = [head_dim - 2 * (head_dim // 3), head_dim // 3, head_dim // 3]
    tables = list(zip(cos_all.split(sizes, dim=1), sin_all.split(sizes, dim=1)))
    return _grid_rows(tables, frames, height, width)


class WanAttention(nn.Module):
    """attn1 (self, with RoPE) or attn2 (cross, keys/values from the projected text). q and k are
    RMS-normalized over all D channels *before* the head split ("rms_norm_across_heads")."""

    def __init__(self, dim, heads, eps):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)

    def forward(self, x, context=None, rope=None):
        source = x if context is None else context
        q = self.norm_q(self.to_q(x)).unflatten(2, (self.heads, -1))
        k = self.norm_k(self.to_k(source)).unflatten(2, (self.heads, -1))
        v = self.to_v(source).unflatten(2, (self.heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.to_out[0](sdpa(q, k, v))  # no mask: Wan attends to every text position, padding included


class WanTransformerBlock(nn.Module):
    """blocks.N: gated self-attention, (ungated) cross-attention, gated FFN; modulation = table + tp."""

    def __init__(self, dim, ffn_dim, heads, eps, cross_attn_norm):
        super().__init__()
        self.eps = eps
        self.attn1 = WanAttention(dim, heads, eps)
        self.attn2 = WanAttention(dim, heads, eps)
        # diffusers' norm2 is the *cross-attention* pre-norm (the original checkpoint's norm3), affine.
        self.norm2 = nn.LayerNorm(dim, eps=eps, elementwise_affine=True) if cross_attn_norm else None
        self.ffn = FeedForward(dim, inner_dim=ffn_dim)
        self.scale_shift_table = nn.Parameter(torch.zeros(1, 6, dim))

    def forward(self, h, context, timestep_proj, rope):
        """h [B, L, D], context [B, L_txt, D], timestep_proj [B, 6, D] (time_proj output)."""
        mod = self.scale_shift_table + timestep_proj  # rows: shift, scale, gate (self-attn), then (FFN)
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = (mod[:, r, None, :] for r in range(6))
        xn = layer_norm(h, self.eps) * (1 + scale_sa) + shift_sa
        h = h + self.attn1(xn, rope=rope) * gate_sa
        xn = self.norm2(h) if self.norm2 is not None else h
        h = h + self.attn2(xn, context=context)
        xn = layer_norm(h, self.eps) * (1 + scale_ff) + shift_ff
        return h + self.ffn(xn) * gate_ff


class WanConditionEmbedder(nn.Module):
    """condition_embedder: time_embedder, time_proj (D -> 6D after SiLU), text_embedder (GELUt)."""

    def __init__(self, dim, freq_dim, text_dim):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim)
        self.time_proj = nn.Linear(dim, 6 * dim)
        self.text_embedder = PixArtAlphaTextProjection(text_dim, dim, act_fn="gelu_tanh")

    def forward(self, timestep, encoder_hidden_states):
        dtype = encoder_hidden_states.dtype
        temb = self.time_embedder(timestep_sinusoid(timestep, dtype, self.freq_dim))
        timestep_proj = self.time_proj(F.silu(temb))
        return temb, timestep_proj, self.text_embedder(encoder_hidden_states)


WAN_DEFAULTS = dict(patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16,
                    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                    rope_max_seq_len=1024, pos_embed_seq_len=None)


class WanTransformer3DModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        cfg = dict(WAN_DEFAULTS)
        cfg.update({k: v for k, v in config.items() if not k.startswith("_")})
        assert set(cfg) == set(WAN_DEFAULTS), sorted(set(cfg) - set(WAN_DEFAULTS))
        # T2V only: the I2V image embedder / added k,v projections are not part of this reference.
        assert cfg["image_dim"] is None and cfg["added_kv_proj_dim"] is None and cfg["pos_embed_seq_len"] is None
        assert cfg["qk_norm"] == "rms_norm_across_heads"
        self.cfg = cfg
        self.dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        out_channels = cfg["out_channels"] or cfg["in_channels"]
        patch = tuple(cfg["patch_size"])
        # Conv3d with kernel = stride = patch: each token is one non-overlapping (pt, ph, pw) patch.
        self.patch_embedding = nn.Conv3d(cfg["in_channels"], self.dim, kernel_size=patch, stride=patch)
        self.condition_embedder = WanConditionEmbedder(self.dim, cfg["freq_dim"], cfg["text_dim"])
        self.blocks = nn.ModuleList([
            WanTransformerBlock(self.dim, cfg["ffn_dim"], cfg["num_attention_heads"], cfg["eps"], cfg["cross_attn_norm"])
            for _ in range(cfg["num_layers"])])
        self.scale_shift_table = nn.Parameter(torch.zeros(1, 2, self.dim))
        self.proj_out = nn.Linear(self.dim, out_channels * math.prod(patch))

    def forward(self, hidden_states, timestep, encoder_hidden_states, record=None, rope=None):
        """hidden_states [B, C, T, H, W], timestep [B] raw (0..1000), encoder_hidden_states [B, L_txt, text_dim]
        -> the velocity [B, C_out, T, H, W]. `record` (a dict) receives the intermediates; `rope` overrides
        the RoPE table (used only for the diffusers-split report)."""
        rec = record if record is not None else {}
        b, _, t, hh, ww = hidden_states.shape
        pt, ph, pw = self.cfg["patch_size"]
        grid = (t // pt, hh // ph, ww // pw)
        if rope is None:
            rope = wan_rope(self.cfg["attention_head_dim"], *grid, self.cfg["rope_max_seq_len"])
        h = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2)  # tokens (t, h, w) row-major
        temb, timestep_proj, context = self.condition_embedder(timestep, encoder_hidden_states)
        timestep_proj = timestep_proj.unflatten(1, (6, self.dim))
        rec.update({"temb": temb, "timestep_proj": timestep_proj, "context": context, "rope_cos": rope[0],
                    "rope_sin": rope[1], "block0.hidden_states": h})
        for i, block in enumerate(self.blocks):
            h = block(h, context, timestep_proj, rope)
            rec[f"block{i}.out"] = h
        # Output head: rows of (table + temb) are (shift, scale): shift first, and temb, not timestep_proj.
        mod = self.scale_shift_table + temb[:, None, :]
        shift, scale = mod[:, 0, None, :], mod[:, 1, None, :]
        y = self.proj_out(layer_norm(h, self.cfg["eps"]) * (1 + scale) + shift)
        return unpatchify(y, grid, (pt, ph, pw))


def unpatchify(y, grid, patch):
    """[B, L, pt*ph*pw*C] -> [B, C, T, H, W]; within a token the index is ((dt*ph + dy)*pw + dx)*C + c
    (patch position major, channel minor: the opposite of Flux's packing)."""
    b = y.shape[0]
    (f, hh, ww), (pt, ph, pw) = grid, patch
    x = y.reshape(b, f, hh, ww, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, x.shape[1], f * pt, hh * ph, ww * pw)


# =============================================================================================
# AutoencoderKLWan decoder, two ways: the whole sequence at once, and one latent frame
# at a time with diffusers' per-conv feature cache. Every module takes `cache`: None for the whole
# sequence, a ChunkCache for the chunked decode.
# =============================================================================================
CACHE_FRAMES = 2  # a temporal kernel of 3 needs the 2 frames before each chunk


class ChunkCache:
    """State carried across the latent frames of one chunked decode: per causal conv, the last input
    frames seen; per upsample3d, whether it has seen its first chunk."""

    def __init__(self):
        self.frames = {}
        self.upsamplers_seen = set()


class CausalConv3d(nn.Conv3d):
    """WanCausalConv3d: no built-in padding; spatial zeros +-p on each side, time 2 p_t zeros in front
    only. With a cache, the previous frames replace as many of the front zeros."""

    def __init__(self, cin, cout, kernel, padding=0):
        super().__init__(cin, cout, kernel, padding=0)
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else padding
        self.front = 2 * pt
        self.spatial = (pw, pw, ph, ph)

    def forward(self, x, cache=None):
        front = self.front
        if cache is not None and front > 0:
            prev = cache.frames.get(self)
            joined = x if prev is None else torch.cat([prev, x], dim=2)
            cache.frames[self] = joined[:, :, -CACHE_FRAMES:]  # what the next chunk needs
            front -= joined.shape[2] - x.shape[2]
            x = joined
        return super().forward(F.pad(x, self.spatial + (front, 0)))


class WanRMSNorm(nn.Module):
    """WanRMS_norm: F.normalize over the channels (eps 1e-12) * sqrt(C) * gamma (no bias parameter)."""

    def __init__(self, dim, images):
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones((dim, 1, 1) if images else (dim, 1, 1, 1)))

    def forward(self, x):
        return F.normalize(x, dim=1, eps=1e-12) * self.scale * self.gamma


class WanResidualBlock(nn.Module):
    """norm1 -> SiLU -> conv1 (3^3) -> norm2 -> SiLU -> conv2 (3^3), plus a 1^3 conv_shortcut when in != out."""

    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = WanRMSNorm(cin, images=False)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1)
        self.norm2 = WanRMSNorm(cout, images=False)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1)
        self.conv_shortcut = CausalConv3d(cin, cout, 1) if cin != cout else None

    def forward(self, x, cache=None):
        shortcut = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        y = self.conv1(F.silu(self.norm1(x)), cache)
        y = self.conv2(self.dropout(F.silu(self.norm2(y))), cache)
        return y + shortcut


class WanAttentionBlock(nn.Module):
    """Single-head attention within each frame: norm, to_qkv (1x1, C -> 3C: q | k | v), proj (1x1), residual."""

    def __init__(self, dim):
        super().__init__()
        self.norm = WanRMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, 3 * dim, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x, cache=None):
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(frames)).reshape(b * t, 3 * c, h * w).transpose(1, 2)  # [BT, HW, 3C]
        q, k, v = qkv.split(c, dim=-1)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c), dim=-1) @ v  # [BT, HW, C]
        out = self.proj(a.transpose(1, 2).reshape(b * t, c, h, w))
        return out.reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4) + x


class NearestUpsample2x(nn.Module):
    """nearest-exact 2x (equal to nearest for an integer factor): out[y, x] = in[y // 2, x // 2]."""

    def forward(self, x):
        return x.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)


class WanResample(nn.Module):
    """upsample2d: per frame, nearest 2x then Conv2d(C -> C/2, 3x3) stored as `resample.1`.
    upsample3d: the same, preceded by a temporal 2x through time_conv (C -> 2C, kernel (3, 1, 1))."""

    def __init__(self, dim, mode):
        super().__init__()
        assert mode in ("upsample2d", "upsample3d")
        self.mode = mode
        self.resample = nn.Sequential(NearestUpsample2x(), nn.Conv2d(dim, dim // 2, 3, padding=1))
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, 2 * dim, (3, 1, 1), padding=(1, 0, 0))

    def forward(self, x, cache=None):
        if self.mode == "upsample3d":
            x = self.temporal_upsample(x) if cache is None else self.temporal_upsample_chunk(x, cache)
        b, c, t, h, w = x.shape
        y = self.resample(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        return y.reshape(b, t, y.shape[1], 2 * h, 2 * w).permute(0, 2, 1, 3, 4)

    def temporal_upsample(self, x):
        """Whole sequence ("AutoencoderKLWan decoder"): frame 0 passes unchanged; frames 1.. go through
        time_conv as a causal sequence of their own (2 zero frames in front, frame 0 never used as
        context) and each becomes two."""
        first, rest = x[:, :, :1], x[:, :, 1:]
        if rest.shape[2] == 0:
            return first
        return torch.cat([first, self.split_frames(self.time_conv(rest))], dim=2)

    def temporal_upsample_chunk(self, x, cache):
        """Chunked, as diffusers: the first chunk skips time_conv; later ones run it with the conv's cache
        (empty on the second chunk, hence the 2 zero frames)."""
        if self not in cache.upsamplers_seen:
            cache.upsamplers_seen.add(self)
            return x
        return self.split_frames(self.time_conv(x, cache))

    @staticmethod
    def split_frames(y):
        """[B, 2C, T, H, W] -> [B, C, 2T, H, W]: channels [0, C) are the earlier frame, [C, 2C) the later."""
        b, c2, t, h, w = y.shape
        return y.reshape(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)


class WanMidBlock(nn.Module):
    """resnets.0 -> attentions.0 -> resnets.1 (the decoder's mid block always has its attention)."""

    def __init__(self, dim):
        super().__init__()
        self.resnets = nn.ModuleList([WanResidualBlock(dim, dim), WanResidualBlock(dim, dim)])
        self.attentions = nn.ModuleList([WanAttentionBlock(dim)])

    def forward(self, x, cache=None):
        x = self.resnets[0](x, cache)
        x = self.attentions[0](x)
        return self.resnets[1](x, cache)


class WanUpBlock(nn.Module):
    """num_res_blocks + 1 resnets (the first in -> out), then an optional upsamplers.0."""

    def __init__(self, cin, cout, num_res_blocks, upsample_mode):
        super().__init__()
        self.resnets = nn.ModuleList(
            [WanResidualBlock(cin if i == 0 else cout, cout) for i in range(num_res_blocks + 1)])
        self.upsamplers = nn.ModuleList([WanResample(cout, upsample_mode)]) if upsample_mode else None

    def forward(self, x, cache=None):
        for resnet in self.resnets:
            x = resnet(x, cache)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, cache)
        return x


def wan_decoder_plan(cfg):
    """[(in, out, upsample mode or None)] per up block, and the head width (see the module docstring)."""
    base = cfg["decoder_base_dim"] or cfg["base_dim"]
    mult = cfg["dim_mult"]
    dims = [base * m for m in [mult[-1]] + mult[::-1]]
    temporal_up = list(cfg["temperal_downsample"])[::-1]
    plan = []
    for i in range(len(mult)):
        cin = dims[i] if i == 0 else dims[i] // 2  # the previous block's resample conv halved it
        mode = None
        if i != len(mult) - 1:
            mode = "upsample3d" if temporal_up[i] else "upsample2d"
        plan.append((cin, dims[i + 1], mode))
    return dims, plan


class WanDecoder3d(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dims, plan = wan_decoder_plan(cfg)
        self.conv_in = CausalConv3d(cfg["z_dim"], dims[0], 3, padding=1)
        self.mid_block = WanMidBlock(dims[0])
        self.up_blocks = nn.ModuleList([WanUpBlock(cin, cout, cfg["num_res_blocks"], mode) for cin, cout, mode in plan])
        self.norm_out = WanRMSNorm(dims[-1], images=False)
        self.conv_out = CausalConv3d(dims[-1], cfg["out_channels"], 3, padding=1)

    def forward(self, x, cache=None, record=None):
        rec = record if record is not None else {}
        x = self.conv_in(x, cache)
        rec["decoder.conv_in"] = x
        x = self.mid_block(x, cache)
        rec["decoder.mid_block"] = x
        for i, block in enumerate(self.up_blocks):
            x = block(x, cache)
            rec[f"decoder.up_blocks.{i}"] = x
        return self.conv_out(F.silu(self.norm_out(x)), cache)


class AutoencoderKLWanDecoder(nn.Module):
    """The decode path of AutoencoderKLWan: post_quant_conv (1^3) on the whole z, then the decoder.
    decode_*() take the un-normalized z (latents * std + mean, done outside) and return the video
    before the clamp to [-1, 1]."""

    def __init__(self, cfg):
        super().__init__()
        assert not cfg["is_residual"] and cfg["patch_size"] is None and not cfg["attn_scales"], "Wan2.1 VAE only"
        self.post_quant_conv = CausalConv3d(cfg["z_dim"], cfg["z_dim"], 1)
        self.decoder = WanDecoder3d(cfg)

    def decode_whole(self, z, record=None):
        """The whole-sequence equivalent of "AutoencoderKLWan decoder"."""
        rec = record if record is not None else {}
        x = self.post_quant_conv(z)
        rec["post_quant_conv"] = x
        return self.decoder(x, record=rec)

    def decode_chunked(self, z):
        """As diffusers' _decode: one latent frame at a time, the caches carried across frames."""
        x = self.post_quant_conv(z)
        cache = ChunkCache()
        frames = [self.decoder(x[:, :, i:i + 1], cache) for i in range(x.shape[2])]
        return torch.cat(frames, dim=2)


def unnormalize_latents(latents, mean, std):
    """WanPipeline's z = latents / (1 / std) + mean, per channel, in f32 as the pipeline does."""
    shape = (1, len(mean), 1, 1, 1)
    inv_std = 1.0 / torch.tensor(std, dtype=torch.float32).view(shape)
    return latents.float() / inv_std + torch.tensor(mean, dtype=torch.float32).view(shape)


# =============================================================================================
# Tiny configs, weights and files
# =============================================================================================
DIFFUSERS_VERSION = "0.35.0"

TRANSFORMER_CONFIG = {
    "_class_name": "WanTransformer3DModel",
    "_diffusers_version": DIFFUSERS_VERSION,
    "added_kv_proj_dim": None,
    "attention_head_dim": 16,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 48,
    "freq_dim": 32,
    "image_dim": None,
    "in_channels": 4,
    "num_attention_heads": 2,
    "num_layers": 2,
    "out_channels": 4,
    "patch_size": [1, 2, 2],
    "pos_embed_seq_len": None,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 24,
}

VAE_CONFIG = {
    "_class_name": "AutoencoderKLWan",
    "_diffusers_version": DIFFUSERS_VERSION,
    "attn_scales": [],
    "base_dim": 4,
    "decoder_base_dim": None,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "in_channels": 3,
    "is_residual": False,
    # Non-trivial per-channel statistics (the first four of Wan2.1's), so the un-normalization is tested.
    "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075],
    "latents_std": [2.8184, 1.4541, 2.3275, 2.6558],
    "num_res_blocks": 2,
    "out_channels": 3,
    "patch_size": None,
    "scale_factor_spatial": 8,
    "scale_factor_temporal": 4,
    "temperal_downsample": [False, True, True],
    "z_dim": 4,
}

SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": DIFFUSERS_VERSION,
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}


def expected_transformer_shapes(cfg):
    """Parameter names and shapes of the T2V transformer with cross_attn_norm ("Wan transformer"), to check
    the module tree against."""
    d, ffn = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"]
    out = cfg["out_channels"] * math.prod(cfg["patch_size"])
    shapes = {"patch_embedding.weight": [d, cfg["in_channels"], *cfg["patch_size"]], "patch_embedding.bias": [d],
              "scale_shift_table": [1, 2, d], "proj_out.weight": [out, d], "proj_out.bias": [out]}

    def linear(name, n_in, n_out):
        shapes[name + ".weight"], shapes[name + ".bias"] = [n_out, n_in], [n_out]

    linear("condition_embedder.time_embedder.linear_1", cfg["freq_dim"], d)
    linear("condition_embedder.time_embedder.linear_2", d, d)
    linear("condition_embedder.time_proj", d, 6 * d)
    linear("condition_embedder.text_embedder.linear_1", cfg["text_dim"], d)
    linear("condition_embedder.text_embedder.linear_2", d, d)
    for n in range(cfg["num_layers"]):
        p = f"blocks.{n}."
        shapes[p + "scale_shift_table"] = [1, 6, d]
        for attn in ("attn1", "attn2"):
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                linear(p + attn + "." + proj, d, d)
            shapes[p + attn + ".norm_q.weight"] = shapes[p + attn + ".norm_k.weight"] = [d]
        shapes[p + "norm2.weight"] = shapes[p + "norm2.bias"] = [d]
        linear(p + "ffn.net.0.proj", d, ffn)
        linear(p + "ffn.net.2", ffn, d)
    return shapes


def init_transformer(model, seed):
    """Random weights, bf16-representable. Linear / conv weights N(0, 1/fan_in); biases N(0, 0.1^2); RMS
    and LayerNorm weights U(0.5, 1.5) (so no norm weight is 1), norm2's bias N(0, 0.1^2). The modulation
    terms are made clearly non-zero: the scale_shift_tables N(0, 0.3^2) and time_proj's bias N(0, 0.3^2),
    so every shift, scale and gate is O(0.5) and differs per row and per batch element."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                v = torch.randn(p.shape, generator=gen, dtype=F64) * 0.3
            elif name.endswith(".weight") and p.ndim >= 2:
                v = torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(p[0].numel())
            elif name.endswith(".weight"):  # norm_q / norm_k / norm2
                v = torch.rand(p.shape, generator=gen, dtype=F64) + 0.5
            else:
                std = 0.3 if name == "condition_embedder.time_proj.bias" else 0.1
                v = torch.randn(p.shape, generator=gen, dtype=F64) * std
            p.copy_(bf16_representable(v))
    return model


VAE_CONV_OUT_GAIN = 0.5  # keeps the video mostly inside [-1, 1], so the clamp hides little


def init_vae(model, seed):
    """Random weights, bf16-representable. Conv weights N(0, 1/fan_in) (conv_out: 0.5^2/fan_in); biases
    N(0, 0.05^2); the RMS norms' gamma U(0.5, 1.5)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                v = torch.rand(p.shape, generator=gen, dtype=F64) + 0.5
            elif name.endswith(".weight"):
                gain = VAE_CONV_OUT_GAIN if name == "decoder.conv_out.weight" else 1.0
                v = torch.randn(p.shape, generator=gen, dtype=F64) * gain / math.sqrt(p[0].numel())
            else:
                v = torch.randn(p.shape, generator=gen, dtype=F64) * 0.05
            p.copy_(bf16_representable(v))
    return model


def vae_encoder_only_tensors(cfg, seed):
    """A few tensors of the encode path (absent from AutoencoderKLWanDecoder): a loader must ignore them."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"encoder.conv_in.weight": [cfg["base_dim"], cfg["in_channels"], 3, 3, 3],
              "encoder.conv_in.bias": [cfg["base_dim"]],
              "quant_conv.weight": [2 * cfg["z_dim"], 2 * cfg["z_dim"], 1, 1, 1],
              "quant_conv.bias": [2 * cfg["z_dim"]]}
    return {k: bf16_representable(torch.randn(s, generator=gen, dtype=F64) * 0.2) for k, s in shapes.items()}


def save_model(directory, config, tensors):
    """config.json and the F32 safetensors (make_flux_reference.save_tensors), checked by reading them back."""
    tensors = save_tensors(directory, config, tensors)
    path = os.path.join(directory, "diffusion_pytorch_model.safetensors")
    back, _ = read_safetensors(path)
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in back), path


def golden_meta(seed):
    """The file-level __metadata__ of goldens_wan.safetensors."""
    return {
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_numpy_version": np.__version__,
        "_seed": str(seed),
        "_numerics": "models in float64 on f32 inputs and bf16-representable weights, results rounded "
                     "to f32; timestep sinusoid arguments and RoPE tables as an f32 diffusers run; "
                     "scheduler values numpy float32 as diffusers (see the generator's docstring)",
    }


def max_diff(a, b):
    return float((a.double() - b.double()).abs().max())


# =============================================================================================
# The cases
# =============================================================================================
def transformer_cases(g, model, report):
    cfg = model.cfg
    hidden = g.randn((2, cfg["in_channels"], 3, 4, 6))
    timestep = torch.tensor([999.0, 250.5], dtype=torch.float32)
    ehs = g.randn((2, 7, cfg["text_dim"]))
    ehs[1, 5:] = 0.0  # batch 1: a 5-token prompt zero-filled to 7, as WanPipeline does
    rec = {}
    with torch.no_grad():
        sample = model(hidden.double(), timestep, ehs.double(), rec)
        f32_err = max_diff(copy.deepcopy(model).float()(hidden, timestep, ehs), sample)
        # How far a diffusers run of this config would be (its forward re-splits the table; docstring).
        grid = (3, 2, 3)
        quirk = diffusers_split_rope(cfg["attention_head_dim"], *grid, cfg["rope_max_seq_len"])
        quirk_diff = max_diff(model(hidden.double(), timestep, ehs.double(), rope=quirk), sample)
    weights = "wan_tiny/transformer"
    g.add("transformer", dict(op="wan_transformer", weights=weights, batch=2, latent_shape=list(hidden.shape[1:]),
                              token_grid=list(grid), num_tokens=18, num_txt_tokens=7, text_lengths=[7, 5],
                              note="timestep is the raw scheduler value (0..1000); temb is the time_embedder "
                                   "output (before SiLU); timestep_proj the time_proj output [B, 6, D] before "
                                   "the blocks' tables are added; context the text_embedder output; sample the "
                                   "unpatchified velocity [B, C, T, H, W]"),
          {"hidden_states": hidden, "timestep": timestep, "encoder_hidden_states": ehs, "sample": sample,
           "temb": rec["temb"], "timestep_proj": rec["timestep_proj"], "context": rec["context"]})
    axes = wan_rope_axes(cfg["attention_head_dim"])
    g.add("rope", dict(op="wan_rope", head_dim=cfg["attention_head_dim"], axes_t_h_w=list(axes), theta=ROPE_THETA,
                       token_grid=list(grid), note="row n = (f * H' + i) * W' + j holds [t table at f | h at i | w at "
                       "j], each angle twice (interleaved layout)"),
          {"cos": rec["rope_cos"], "sin": rec["rope_sin"]})
    g.add("block0", dict(op="wan_block", weights=weights, prefix="blocks.0.",
                         note="inputs: hidden_states (the patch embedding), transformer.context, "
                              "transformer.timestep_proj, rope.cos / rope.sin"),
          {"hidden_states": rec["block0.hidden_states"], "out": rec["block0.out"]})
    g.add("block1", dict(op="wan_block", weights=weights, prefix="blocks.1.",
                         note="input: block0.out; otherwise as block0"),
          {"out": rec["block1.out"]})
    report["transformer"] = dict(max_abs_sample=max_abs(sample), max_abs_temb=max_abs(rec["temb"]),
                                 max_abs_timestep_proj=max_abs(rec["timestep_proj"]),
                                 max_abs_context=max_abs(rec["context"]),
                                 max_abs_block0_in=max_abs(rec["block0.hidden_states"]),
                                 max_abs_block0_out=max_abs(rec["block0.out"]),
                                 max_abs_block1_out=max_abs(rec["block1.out"]),
                                 f32_run_err=f32_err, diffusers_rope_split_diff=quirk_diff)
    report["rope"] = dict(max_abs_cos=max_abs(rec["rope_cos"]), max_abs_sin=max_abs(rec["rope_sin"]))


def vae_case(g, vae, cfg, report):
    latents = g.randn((1, cfg["z_dim"], 3, 4, 4))
    z = unnormalize_latents(latents, cfg["latents_mean"], cfg["latents_std"])
    rec = {}
    with torch.no_grad():
        whole = vae.decode_whole(z.double(), rec)
        chunked = vae.decode_chunked(z.double())
        vae32 = copy.deepcopy(vae).float()
        whole32, chunked32 = vae32.decode_whole(z), vae32.decode_chunked(z)
    assert whole.shape == (1, 3, 1 + 4 * (z.shape[2] - 1), 8 * z.shape[3], 8 * z.shape[4]), whole.shape
    agree64, agree32 = max_diff(whole, chunked), max_diff(whole32, chunked32)
    # The two formulations must agree (the brief's bar: 1e-5; float64 is ~1e-15, f32 ~1e-6).
    assert agree64 <= 1e-5 and agree32 <= 1e-5, (agree64, agree32)
    video = whole.clamp(-1.0, 1.0)
    inside = float((whole.abs() <= 1.0).double().mean())
    keep = ["post_quant_conv", "decoder.conv_in", "decoder.mid_block", "decoder.up_blocks.0",
            "decoder.up_blocks.1"]
    tensors = {"latents": latents, "z": z, "video_unclamped": whole, "video": video}
    tensors.update({f"intermediate.{k}": rec[k] for k in keep})
    g.add("vae", dict(op="wan_vae_decode", weights="wan_tiny/vae", z_shape=list(z.shape), video_shape=list(video.shape),
                      intermediates=keep,
                      note="z = latents / (1 / latents_std) + latents_mean (f32, as WanPipeline) is the decoder's "
                           "input; video_unclamped is the decoder output, video = clamp(video_unclamped, -1, 1) "
                           "(AutoencoderKLWan._decode); the pipeline's (x / 2 + 0.5) is not applied. Computed "
                           "over the whole sequence and checked against diffusers' frame-by-frame cached decode"),
          tensors)
    report["vae"] = dict(max_abs_z=max_abs(z), max_abs_video_unclamped=max_abs(whole),
                         fraction_within_1=inside, whole_vs_chunked_f64=agree64, whole_vs_chunked_f32=agree32,
                         f32_run_err=max_diff(whole32, whole))


def scheduler_case(g, report):
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    sigmas, timesteps = sched.set_timesteps(10)  # no sigmas, no mu: the default (double-shift) path
    assert sigmas.dtype == np.float32 and sigmas.shape == (11,) and sigmas[-1] == 0 and timesteps.shape == (10,)
    g.add("scheduler", dict(op="flow_match_euler", scheduler="wan_tiny/scheduler", num_inference_steps=10,
                            shift=3.0, note="set_timesteps(10) without sigmas or mu: linspace(sigma_max * 1000, "
                            "sigma_min * 1000, N) / 1000 in float64 with the already shifted training sigmas, "
                            "shifted again, cast to f32; timesteps = sigmas * 1000 (f32, not rounded); a final 0 "
                            "appended to sigmas"),
          {"sigmas": torch.from_numpy(sigmas.copy()), "timesteps": torch.from_numpy(timesteps.copy())})
    report["scheduler"] = dict(max_abs_sigmas=float(np.abs(sigmas).max()), max_abs_timesteps=float(np.abs(timesteps).max()))


PIPELINE_SEED = 8200  # its own generator, so the earlier cases' draws (and bytes) do not depend on this one
PIPELINE_STEPS = 3
PIPELINE_GUIDANCE = 4.0


def pipeline_case(model, vae, vae_cfg, g, report):
    """WanPipeline ("WanPipeline") with the tiny model's FlowMatch Euler scheduler (shift 3): the given
    noise as the f32 latents, set_timesteps(N) without sigmas or mu, per step the raw f32 timestep t_i to
    the model, real CFG v = v_u + g (v_c - v_u), Euler x' = f32(x) + f32(sigma_{i+1} - sigma_i) * v in f32
    (the latents are f32 between steps, as an f32 run); then z = latents / (1 / std) + mean per channel
    (f32) and the VAE decode, clamped to [-1, 1]."""
    gen = torch.Generator().manual_seed(PIPELINE_SEED)
    cfg = model.cfg

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=F64).float()

    noise = randn((1, cfg["in_channels"], 3, 4, 6))
    prompt = randn((1, 7, cfg["text_dim"]))
    prompt[:, 5:] = 0.0  # a 5-token prompt zero-filled to 7 ("WanPipeline")
    negative = randn((1, 7, cfg["text_dim"]))
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    sigmas, timesteps = sched.set_timesteps(PIPELINE_STEPS)  # Wan: no sigmas, no mu

    def velocity(x, t, text):
        """The model's velocity (float64) for the f32 latents x at the raw f32 timestep t."""
        return model(torch.from_numpy(x).double(), torch.tensor([t], dtype=torch.float32), text.double()).numpy()

    def run(guidance):
        x = noise.numpy().copy()
        steps = []
        for i in range(PIPELINE_STEPS):
            v = velocity(x, timesteps[i], prompt)
            if guidance is not None:
                v_u = velocity(x, timesteps[i], negative)
                v = v_u + guidance * (v - v_u)
            x, _ = euler_step(x, v.astype(np.float32), sigmas[i], sigmas[i + 1])  # v as an f32 run has it
            steps.append(torch.from_numpy(x.copy()))
        return torch.from_numpy(x), steps

    with torch.no_grad():
        latents, steps = run(PIPELINE_GUIDANCE)
        latents_off, _ = run(None)
        z = unnormalize_latents(latents, vae_cfg["latents_mean"], vae_cfg["latents_std"])
        whole = vae.decode_whole(z.double())
        agree = max_diff(whole, vae.decode_chunked(z.double()))
    assert agree <= 1e-5, agree
    video = whole.clamp(-1.0, 1.0)
    tensors = {"noise": noise, "prompt_embeds": prompt, "negative_prompt_embeds": negative,
               "latents": latents, "video": video, "latents_cfg_off": latents_off,
               "intermediate.sigmas": torch.from_numpy(sigmas.copy()),
               "intermediate.timesteps": torch.from_numpy(timesteps.copy()), "intermediate.z": z}
    tensors.update({f"intermediate.latents_step{i}": s for i, s in enumerate(steps)})
    g.add("pipeline", dict(op="wan_t2v_pipeline", transformer="wan_tiny/transformer", vae="wan_tiny/vae",
                           scheduler="wan_tiny/scheduler", num_inference_steps=PIPELINE_STEPS,
                           guidance_scale=PIPELINE_GUIDANCE, frames=int(video.shape[2]), height=int(video.shape[3]),
                           width=int(video.shape[4]), seed=PIPELINE_SEED, prompt_length=5,
                           note="noise is the initial f32 latents; per step t_i = the scheduler's raw f32 timestep "
                                "(set_timesteps(N), no sigmas or mu), v_c / v_u the model on prompt_embeds / "
                                "negative_prompt_embeds, v = v_u + g (v_c - v_u) rounded to f32, latents = "
                                "f32(latents + f32(sigma_{i+1} - sigma_i) * v); latents after the loop; "
                                "latents_cfg_off the same loop with one forward per step (v = v_c, guidance "
                                "ignored); z = latents / (1 / latents_std) + latents_mean (f32); video = "
                                "clamp(vae.decode(z), -1, 1), before the (x / 2 + 0.5) postprocess"),
          tensors)
    report["pipeline"] = dict(max_abs_latents=max_abs(latents), max_abs_latents_cfg_off=max_abs(latents_off),
                              cfg_vs_off=max_diff(latents, latents_off), max_abs_video=max_abs(video),
                              max_abs_video_unclamped=max_abs(whole),
                              fraction_within_1=float((whole.abs() <= 1.0).double().mean()),
                              whole_vs_chunked_f64=agree)


def main():
    data = os.path.join(OUT_DIR, "wan_tiny")
    report = {}

    # ---- models and checkpoints ------------------------------------------------------------------
    model = init_transformer(WanTransformer3DModel(TRANSFORMER_CONFIG), 8001).double().eval()
    state = model.state_dict()
    expected = expected_transformer_shapes(model.cfg)
    assert {k: list(v.shape) for k, v in state.items()} == expected, "module tree differs from spec 2.2"
    save_model(os.path.join(data, "transformer"), TRANSFORMER_CONFIG, state)

    vae = init_vae(AutoencoderKLWanDecoder(VAE_CONFIG), 8002).double().eval()
    vae_tensors = dict(vae.state_dict())
    vae_tensors.update(vae_encoder_only_tensors(VAE_CONFIG, 8003))
    save_model(os.path.join(data, "vae"), VAE_CONFIG, vae_tensors)

    write_json(os.path.join(data, "scheduler", "scheduler_config.json"), SCHEDULER_CONFIG)

    # ---- goldens ---------------------------------------------------------------------------------
    g = Goldens(8100, golden_meta(8100))
    transformer_cases(g, model, report)
    vae_case(g, vae, VAE_CONFIG, report)
    scheduler_case(g, report)
    pipeline_case(model, vae, VAE_CONFIG, g, report)

    path = os.path.join(OUT_DIR, "goldens_wan.safetensors")
    g.write(path)

    # ---- summary ---------------------------------------------------------------------------------
    print_model_files(data)
    print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path)} bytes, {len(g.tensors)} tensors")
    print("max |value| of each golden:")
    for k in sorted(g.tensors):
        t = g.tensors[k]
        print(f"  {k:<40} {str(list(t.shape)):<20} {max_abs(t):.6g}")
    print_report(report)
    vr = report["vae"]
    print(f"VAE: whole-sequence and chunked (frame-by-frame, cached) decodes agree: max |diff| "
          f"{vr['whole_vs_chunked_f64']:.3g} in float64, {vr['whole_vs_chunked_f32']:.3g} in f32 (asserted <= 1e-5)")


if __name__ == "__main__":
    main()
