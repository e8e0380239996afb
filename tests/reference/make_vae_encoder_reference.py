#!/usr/bin/python3
"""Reference implementation and committed test data for cubevec's AutoencoderKL encoder.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_vae_encoder_reference.py [OUTPUT_DIR]   # default tests/data

Written from diffusers' source (models/autoencoders/vae.py: Encoder, DownEncoderBlock2D via
unets/unet_2d_blocks.py, Downsample2D in downsampling.py, DiagonalGaussianDistribution;
autoencoder_kl.py: _encode, _tiled_encode, blend_v, blend_h) in plain torch; diffusers is not
used. The building blocks the decoder shares (ResnetBlock2D, the mid block) and the decoder come
from make_flux_reference.py. It writes, under OUTPUT_DIR:

  vae_encoder/flux/   a whole AutoencoderKL (encoder and decoder), Flux-like: latent 16, no quant convs,
                      three blocks (4x), sample_size 32 (so a 64x48 image is encoded in tiles)
  vae_encoder/sd/     SD-like: latent 4, quant_conv and post_quant_conv, two blocks (2x), two resnets
                      per block, sample_size 16
  goldens_vae_encoder.safetensors
                      per case: `sample` (the image), `expected_moments` (quant_conv(encoder(sample)),
                      [B, 2 latent, h, w]) and `expected_mean` (its first half: latent_dist.mean);
                      cases *_tiled hold the tiled encode's moments

Numerics as make_flux_reference.py: bf16-representable random weights stored as F32, the models run
in float64 on f32 inputs, results rounded to f32.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_flux_reference as ref  # noqa: E402  (the shared blocks, weights and file helpers)

F64 = torch.float64
ROOT = ref.ROOT
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")


class Downsample2D(nn.Module):
    """use_conv, padding=0: F.pad(x, (0, 1, 0, 1)) (one zero column right, one zero row below), then a
    3x3 stride-2 conv named `conv`."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))


class DownEncoderBlock2D(nn.Module):
    def __init__(self, cin, cout, num_layers, groups, add_downsample):
        super().__init__()
        self.resnets = nn.ModuleList([ref.ResnetBlock2D(cin if i == 0 else cout, cout, groups) for i in range(num_layers)])
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
    """conv_in, the down blocks (layers_per_block resnets each; all but the last downsample), the mid
    block, GroupNorm + SiLU, conv_out to 2 latent_channels (double_z)."""

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
        self.mid_block = ref.UNetMidBlock2D(ch[-1], groups, cfg.get("mid_block_add_attention", True))
        self.conv_norm_out = nn.GroupNorm(groups, ch[-1], eps=1e-6, affine=True)
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    """The whole model (state_dict keys as diffusers': encoder.*, quant_conv.*, decoder.*, post_quant_conv.*)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        latent = cfg["latent_channels"]
        if cfg.get("use_quant_conv", True):
            self.quant_conv = nn.Conv2d(2 * latent, 2 * latent, 1)
        self.decoder = ref.Decoder(cfg)
        if cfg.get("use_post_quant_conv", True):
            self.post_quant_conv = nn.Conv2d(latent, latent, 1)
        self.upscale = 2 ** (len(cfg["block_out_channels"]) - 1)

    def moments(self, x):
        h = self.encoder(x)
        return self.quant_conv(h) if self.cfg.get("use_quant_conv", True) else h

    def tiled_moments(self, x):
        """diffusers' _tiled_encode: tiles of tile_sample_min_size = sample_size every
        int(tile * (1 - 0.25)) pixels, blend_v / blend_h over int(tile_latent * 0.25) latent rows,
        each tile cropped to tile_latent - blend_extent, the crops concatenated."""
        tile = self.cfg["sample_size"]
        tile_latent = int(tile / self.upscale)
        overlap_size = int(tile * (1 - 0.25))
        blend_extent = int(tile_latent * 0.25)
        row_limit = tile_latent - blend_extent
        rows = []
        for i in range(0, x.shape[2], overlap_size):
            row = []
            for j in range(0, x.shape[3], overlap_size):
                row.append(self.moments(x[:, :, i:i + tile, j:j + tile]))
            rows.append(row)
        result_rows = []
        for i, row in enumerate(rows):
            result_row = []
            for j, t in enumerate(row):
                if i > 0:
                    t = blend_v(rows[i - 1][j], t, blend_extent)
                if j > 0:
                    t = blend_h(row[j - 1], t, blend_extent)
                result_row.append(t[:, :, :row_limit, :row_limit])
            result_rows.append(torch.cat(result_row, dim=3))
        return torch.cat(result_rows, dim=2)


def blend_v(a, b, blend_extent):
    blend_extent = min(a.shape[2], b.shape[2], blend_extent)
    for y in range(blend_extent):
        b[:, :, y, :] = a[:, :, -blend_extent + y, :] * (1 - y / blend_extent) + b[:, :, y, :] * (y / blend_extent)
    return b


def blend_h(a, b, blend_extent):
    blend_extent = min(a.shape[3], b.shape[3], blend_extent)
    for x in range(blend_extent):
        b[:, :, :, x] = a[:, :, :, -blend_extent + x] * (1 - x / blend_extent) + b[:, :, :, x] * (x / blend_extent)
    return b


FLUX_CONFIG = dict(ref.VAE_CONFIG)
SD_CONFIG = dict(ref.VAE_POSTQUANT_CONFIG)


def main():
    goldens = ref.Goldens(4242, meta={
        "_generator": "tests/reference/make_vae_encoder_reference.py",
        "_torch_version": torch.__version__,
        "_numerics": "models in float64 on f32 images and bf16-representable weights, results rounded to f32",
    })
    with torch.no_grad():
        for name, cfg, seed, cases in (
                ("flux", FLUX_CONFIG, 5101, [("whole", (1, 3, 32, 32), False), ("tiled", (1, 3, 64, 48), True)]),
                ("sd", SD_CONFIG, 5102, [("whole", (2, 3, 16, 16), False), ("tiled", (1, 3, 40, 24), True)]),
        ):
            model = ref.init_weights(AutoencoderKL(cfg), seed).double().eval()
            ref.save_model(model, os.path.join(OUT_DIR, "vae_encoder", name), cfg)
            for case, shape, tiled in cases:
                sample = goldens.uniform(shape, -1.0, 1.0)
                moments = (model.tiled_moments if tiled else model.moments)(sample.double())
                latent = cfg["latent_channels"]
                goldens.add(f"{name}_{case}", dict(op="vae_encode", weights=f"vae_encoder/{name}", tiled=tiled, shape=list(shape)),
                            {"sample": sample, "expected_moments": moments, "expected_mean": moments[:, :latent]})
                print(f"{name}_{case}: sample {list(shape)} -> moments {list(moments.shape)}, max |moments| {ref.max_abs(moments):.4g}")
    goldens.write(os.path.join(OUT_DIR, "goldens_vae_encoder.safetensors"))


if __name__ == "__main__":
    main()
