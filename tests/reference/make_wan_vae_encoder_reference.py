#!/usr/bin/python3
"""Reference implementation and committed test data for cubevec's AutoencoderKLWan encoder.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_wan_vae_encoder_reference.py [OUTPUT_DIR]   # default tests/data

Written from diffusers' source (models/autoencoders/autoencoder_kl_wan.py: WanEncoder3d, WanResample
in its downsample2d / downsample3d modes, AutoencoderKLWan._encode's chunking (the first frame alone,
then 4 frames at a time, each causal conv keeping its last input frames), tiled_encode, blend_v /
blend_h; DiagonalGaussianDistribution in vae.py) in plain torch; diffusers is not used. The blocks
shared with the decoder (the causal conv and its chunk cache, the RMS norm, the residual block, the
mid block) and the decoder come from make_wan_reference.py. It writes, under OUTPUT_DIR:

  vae_encoder/wan/    a whole AutoencoderKLWan (encoder and decoder) of Wan2.1's shape at width 4:
                      dim_mult [1, 2, 4, 4], temperal_downsample [false, true, true], 2 res blocks
  vae_encoder/wan_b/  another layout: dim_mult [1, 2, 2, 2], temperal_downsample [true, true, false]
                      (time is downsampled in the first two blocks), 1 res block, z_dim 3
  goldens_wan_vae_encoder.safetensors
                      per case: `sample` (the video [B, 3, 1 + 4k, H, W]), `expected_moments`
                      (quant_conv(encoder(sample)) in diffusers' chunks: [B, 2 z_dim, T', H/8, W/8]) and
                      `expected_mean` (its first z_dim channels: latent_dist.mean); the *_tiled case holds
                      tiled_encode's moments with the tile sizes in its metadata

Numerics as make_flux_reference.py: bf16-representable random weights stored as F32, the models run
in float64 on f32 inputs, results rounded to f32.
"""

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_wan_reference as wan  # noqa: E402  (the decoder's blocks, the chunk cache, weights, files)

F64 = torch.float64
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(wan.ROOT, "tests", "data")
FRAMES_PER_CHUNK = 4  # diffusers' _encode: frame 0 alone, then 4 frames per chunk


class WanDownsample(nn.Module):
    """WanResample, downsample2d: per frame, one zero column right and one zero row below
    (ZeroPad2d((0, 1, 0, 1)), `resample.0`), then Conv2d(C, C, 3, stride 2) as `resample.1`.
    downsample3d: then time_conv (Conv3d(C, C, (3, 1, 1), stride (2, 1, 1)), no padding) over
    [the previous chunk's last frame, this chunk's frames]; the first chunk skips it (its last frame is
    kept for the next)."""

    def __init__(self, dim, mode):
        super().__init__()
        assert mode in ("downsample2d", "downsample3d")
        self.mode = mode
        self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        if mode == "downsample3d":
            self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x, cache):
        b, c, t, h, w = x.shape
        y = self.resample(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        y = y.reshape(b, t, c, y.shape[2], y.shape[3]).permute(0, 2, 1, 3, 4)
        if self.mode == "downsample3d":
            prev = cache.frames.get(self)
            cache.frames[self] = y[:, :, -1:]
            if prev is not None:
                y = self.time_conv(torch.cat([prev, y], dim=2))
        return y


class WanEncoder3d(nn.Module):
    """conv_in (3^3 causal), down_blocks (a flat list: per level num_res_blocks residual blocks, then a
    downsampler except after the last level), the mid block, RMS norm + SiLU, conv_out to 2 z_dim."""

    def __init__(self, cfg):
        super().__init__()
        assert not cfg["attn_scales"], "diffusers' encoder cannot call its down-block attention with a cache"
        dims = [cfg["base_dim"] * u for u in [1] + cfg["dim_mult"]]
        self.conv_in = wan.CausalConv3d(cfg["in_channels"], dims[0], 3, padding=1)
        layers = []
        n = len(cfg["dim_mult"])
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg["num_res_blocks"]):
                layers.append(wan.WanResidualBlock(cin, cout))
                cin = cout
            if i != n - 1:
                layers.append(WanDownsample(cout, "downsample3d" if cfg["temperal_downsample"][i] else "downsample2d"))
        self.down_blocks = nn.ModuleList(layers)
        self.mid_block = wan.WanMidBlock(dims[-1])
        self.norm_out = wan.WanRMSNorm(dims[-1], images=False)
        self.conv_out = wan.CausalConv3d(dims[-1], 2 * cfg["z_dim"], 3, padding=1)

    def forward(self, x, cache):
        x = self.conv_in(x, cache)
        for layer in self.down_blocks:
            x = layer(x, cache)
        x = self.mid_block(x, cache)
        return self.conv_out(torch.nn.functional.silu(self.norm_out(x)), cache)


class AutoencoderKLWan(nn.Module):
    """The whole model, state_dict keys as diffusers' (encoder.*, quant_conv.*, post_quant_conv.*, decoder.*)."""

    def __init__(self, cfg):
        super().__init__()
        self.encoder = WanEncoder3d(cfg)
        self.quant_conv = wan.CausalConv3d(2 * cfg["z_dim"], 2 * cfg["z_dim"], 1)
        decoder = wan.AutoencoderKLWanDecoder(cfg)
        self.post_quant_conv = decoder.post_quant_conv
        self.decoder = decoder.decoder

    def moments(self, x):
        """_encode: the chunks through the encoder with one cache, concatenated, then quant_conv."""
        t = x.shape[2]
        assert (t - 1) % FRAMES_PER_CHUNK == 0, t
        cache = wan.ChunkCache()
        chunks = [x[:, :, :1]] + [x[:, :, 1 + FRAMES_PER_CHUNK * i:1 + FRAMES_PER_CHUNK * (i + 1)]
                                  for i in range((t - 1) // FRAMES_PER_CHUNK)]
        out = torch.cat([self.encoder(c, cache) for c in chunks], dim=2)
        return self.quant_conv(out)

    def tiled_moments(self, x, tile, stride, down):
        """tiled_encode: tiles of `tile` pixels every `stride`, each encoded with its own caches, blended
        over tile/down - stride/down latent rows and columns with the upper and left tiles, cropped to
        stride/down, concatenated, cropped to the latent size."""
        tile_latent, stride_latent = tile // down, stride // down
        blend = tile_latent - stride_latent
        h, w = x.shape[3], x.shape[4]
        rows = [[self.moments(x[:, :, :, i:i + tile, j:j + tile]) for j in range(0, w, stride)] for i in range(0, h, stride)]
        result_rows = []
        for i, row in enumerate(rows):
            result_row = []
            for j, t in enumerate(row):
                if i > 0:
                    t = blend_v(rows[i - 1][j], t, blend)
                if j > 0:
                    t = blend_h(row[j - 1], t, blend)
                result_row.append(t[:, :, :, :stride_latent, :stride_latent])
            result_rows.append(torch.cat(result_row, dim=-1))
        return torch.cat(result_rows, dim=3)[:, :, :, :h // down, :w // down]


def blend_v(a, b, extent):
    """In place, as diffusers: the tile below and the one to the right then blend with the blended tile."""
    extent = min(a.shape[-2], b.shape[-2], extent)
    for y in range(extent):
        b[:, :, :, y, :] = a[:, :, :, -extent + y, :] * (1 - y / extent) + b[:, :, :, y, :] * (y / extent)
    return b


def blend_h(a, b, extent):
    extent = min(a.shape[-1], b.shape[-1], extent)
    for x in range(extent):
        b[:, :, :, :, x] = a[:, :, :, :, -extent + x] * (1 - x / extent) + b[:, :, :, :, x] * (x / extent)
    return b


WAN_CONFIG = dict(wan.VAE_CONFIG)
WAN_B_CONFIG = dict(wan.VAE_CONFIG, dim_mult=[1, 2, 2, 2], temperal_downsample=[True, True, False], num_res_blocks=1, z_dim=3,
                    latents_mean=[0.1, -0.2, 0.3], latents_std=[1.5, 2.0, 0.8])
TILE, TILE_STRIDE = 32, 24  # tiled_encode's tile_sample_min and tile_sample_stride for the tiled case


def init_whole_vae(model, seed):
    """make_wan_reference.init_vae's distributions, with the encoder's conv_out scaled like the decoder's."""
    wan.init_vae(model, seed)
    with torch.no_grad():
        model.encoder.conv_out.weight.mul_(0.5)
    return model


def main():
    goldens = wan.Goldens(6301, meta={
        "_generator": "tests/reference/make_wan_vae_encoder_reference.py",
        "_torch_version": torch.__version__,
        "_numerics": "models in float64 on f32 videos and bf16-representable weights, results rounded to f32",
    })
    with torch.no_grad():
        for name, cfg, seed, cases in (
                ("wan", WAN_CONFIG, 6311, [("one_frame", (1, 3, 1, 16, 24), False), ("nine_frames", (2, 3, 9, 16, 16), False),
                                           ("tiled", (1, 3, 5, 48, 40), True)]),
                ("wan_b", WAN_B_CONFIG, 6312, [("nine_frames", (1, 3, 9, 24, 16), False)]),
        ):
            model = init_whole_vae(AutoencoderKLWan(cfg), seed).double().eval()
            wan.save_tensors(os.path.join(OUT_DIR, "vae_encoder", name), cfg, model.state_dict())
            for case, shape, tiled in cases:
                sample = goldens.uniform(shape, -1.0, 1.0)
                x = sample.double()
                moments = model.tiled_moments(x, TILE, TILE_STRIDE, 8) if tiled else model.moments(x)
                params = dict(op="wan_vae_encode", weights=f"vae_encoder/{name}", tiled=tiled, shape=list(shape))
                if tiled:
                    params.update(tile_sample_min=TILE, tile_sample_stride=TILE_STRIDE)
                    # The tiles see less context: the tiled moments differ from the whole encode's.
                    print(f"  tiled vs whole: max diff {float((moments - model.moments(x)).abs().max()):.3g}")
                z = cfg["z_dim"]
                goldens.add(f"{name}_{case}", params, {"sample": sample, "expected_moments": moments, "expected_mean": moments[:, :z]})
                print(f"{name}_{case}: sample {list(shape)} -> moments {list(moments.shape)}, max |moments| {wan.max_abs(moments):.4g}")
    goldens.write(os.path.join(OUT_DIR, "goldens_wan_vae_encoder.safetensors"))


if __name__ == "__main__":
    main()
