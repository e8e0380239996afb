"""The tiny model's networks in plain torch, with diffusers' (and, for the text encoder, CLIP's)
parameter names, so every state_dict() is a checkpoint cubevec loads as is.

  * FluxTransformer2DModel, the AutoencoderKL decoder, latent (un)packing, calculate_shift and the
    FlowMatch scheduler come from tests/reference/make_flux_reference.py (written from docs/models.md
    and checked against cubevec's port to 1e-4), imported here.
  * AutoencoderKL adds the encoder half (diffusers' Encoder: conv_in, DownEncoderBlock2D blocks with
    a stride-2 Downsample2D after all but the last, mid block, GroupNorm + SiLU + conv_out to
    2 x latent_channels, the DiagonalGaussian split into mean and log-variance) for training.
  * TinyTextEncoder: the model's own text encoder (see its docstring); pipelines/tiny_text_encoder.cpp
    is its C++ twin.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import make_flux_reference as ref  # noqa: E402  (sets torch's thread count and determinism; callers reset)
from make_flux_reference import (AutoencoderKLDecoder, FluxTransformer2DModel, ResnetBlock2D,  # noqa: E402,F401
                                 UNetMidBlock2D, pack_latents, unpack_latents, latent_image_ids,
                                 calculate_shift, FlowMatchEulerDiscreteScheduler)


# ---------------------------------------------------------------------------------------------
# AutoencoderKL: the encoder half, and the whole model
# ---------------------------------------------------------------------------------------------
class Downsample2D(nn.Module):
    """use_conv, padding 0: zero-pad right and bottom by one, then a 3x3 stride-2 conv `conv`."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class DownEncoderBlock2D(nn.Module):
    def __init__(self, cin, cout, num_layers, groups, add_downsample):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin if i == 0 else cout, cout, groups) for i in range(num_layers)])
        if add_downsample:
            self.downsamplers = nn.ModuleList([Downsample2D(cout)])
        self.add_downsample = add_downsample

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.add_downsample:
            x = self.downsamplers[0](x)
        return x


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch = list(cfg["block_out_channels"])
        groups = cfg["norm_num_groups"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], ch[0], 3, padding=1)
        blocks, prev = [], ch[0]
        for i, cout in enumerate(ch):
            blocks.append(DownEncoderBlock2D(prev, cout, cfg["layers_per_block"], groups, add_downsample=i != len(ch) - 1))
            prev = cout
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = UNetMidBlock2D(ch[-1], groups, cfg.get("mid_block_add_attention", True))
        self.conv_norm_out = nn.GroupNorm(groups, ch[-1], eps=1e-6, affine=True)
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(AutoencoderKLDecoder):
    """encoder + (quant_conv) + the reference decoder path; encode() returns (mean, logvar)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.encoder = Encoder(cfg)
        if cfg.get("use_quant_conv", True):
            self.quant_conv = nn.Conv2d(2 * cfg["latent_channels"], 2 * cfg["latent_channels"], 1)
        self.has_quant = cfg.get("use_quant_conv", True)

    def encode(self, x):
        h = self.encoder(x)
        if self.has_quant:
            h = self.quant_conv(h)
        mean, logvar = h.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)


# ---------------------------------------------------------------------------------------------
# The text encoder
# ---------------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """CLIP-style pre-LN layer without a causal mask: x += out_proj(attn(layer_norm1(x))),
    x += fc2(gelu_tanh(fc1(layer_norm2(x))))."""

    def __init__(self, dim, heads, intermediate, eps):
        super().__init__()
        self.heads = heads
        self.layer_norm1 = nn.LayerNorm(dim, eps=eps)
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.self_attn, name, nn.Linear(dim, dim))
        self.layer_norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, intermediate)
        self.mlp.fc2 = nn.Linear(intermediate, dim)

    def forward(self, x):
        b, n, d = x.shape
        h = self.layer_norm1(x)
        a = self.self_attn
        q, k, v = (p(h).reshape(b, n, self.heads, d // self.heads).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        x = x + a.out_proj((w @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.layer_norm2(x)), approximate="tanh"))


TEXT_ENCODER_CONFIG = {
    "_class_name": "CubevecTinyTextEncoder",
    "vocab_size": 31,
    "max_position_embeddings": 16,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "hidden_act": "gelu_tanh",
    "layer_norm_eps": 1e-5,
    "pad_token_id": 0,
    "pooled_projection_dim": 64,
}


class TinyTextEncoder(nn.Module):
    """ids [B, L] (L = max_position_embeddings, padded with pad_token_id) ->
        sequence [B, L, hidden_size]: final_layer_norm(layers(token_embedding[ids] + position_embedding[0..L)))
        pooled   [B, pooled_projection_dim]: pooled_projection(mean of the sequence rows whose id is not
                 pad; a zero vector when every id is pad)
    No attention mask: padding is attended to, as Flux's T5 does."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg["hidden_size"]
        self.embeddings = nn.Module()
        self.embeddings.token_embedding = nn.Embedding(cfg["vocab_size"], d)
        self.embeddings.position_embedding = nn.Embedding(cfg["max_position_embeddings"], d)
        self.layers = nn.ModuleList([EncoderLayer(d, cfg["num_attention_heads"], cfg["intermediate_size"], cfg["layer_norm_eps"])
                                     for _ in range(cfg["num_hidden_layers"])])
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg["layer_norm_eps"])
        self.pooled_projection = nn.Linear(d, cfg["pooled_projection_dim"])
        with torch.no_grad():
            self.embeddings.token_embedding.weight.normal_(0, 0.5)
            self.embeddings.position_embedding.weight.normal_(0, 0.5)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.embeddings.token_embedding(ids) + self.embeddings.position_embedding(pos)[None]
        for layer in self.layers:
            x = layer(x)
        seq = self.final_layer_norm(x)
        keep = (ids != self.cfg["pad_token_id"]).to(seq.dtype)[..., None]
        mean = (seq * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return seq, self.pooled_projection(mean)
