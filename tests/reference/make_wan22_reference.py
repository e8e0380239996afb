#!/usr/bin/python3
"""Reference and committed test data for cubevec's Wan2.2 TI2V-5B port: the Wan2.2 VAE (AutoencoderKLWan with
z_dim 48, is_residual, patch_size 2) and the TI2V pipeline rules (expand_timesteps, per-token timesteps).

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_wan22_reference.py [OUTPUT_DIR]   # default tests/data

Plain torch; diffusers is not used (nor installable with this torch). It extends the existing references
rather than rewriting them: the causal conv and its chunk cache, the RMS norm, the residual / attention / mid
blocks, upsample2d / upsample3d, the T2V transformer, the weight / file helpers and the numerics come from
make_wan_reference.py, downsample2d / downsample3d and the encoder's chunking from
make_wan_vae_encoder_reference.py, Goldens from make_flux_reference.py. It writes, under OUTPUT_DIR:

  wan22_vae_tiny/               config.json (every AutoencoderKLWan.__init__ key) + diffusion_pytorch_model.safetensors
                                (F32, bf16-representable): a whole AutoencoderKLWan in the Wan2.2 layout at tiny widths:
                                is_residual true, patch_size 2, in/out_channels 12, base_dim 2 (encoder dims
                                [2, 2, 4, 8, 8]), decoder_base_dim 3 (decoder dims [12, 12, 12, 6, 3]), z_dim 8,
                                dim_mult [1, 2, 4, 4], num_res_blocks 2, temperal_downsample [false, true, true],
                                scale_factor_spatial 16, scale_factor_temporal 4, the first 8 of Wan2.2's
                                latents_mean / latents_std
  wan22_ti2v_tiny/transformer/  config.json + diffusion_pytorch_model.safetensors (F32): a WanTransformer3DModel of
                                make_wan_reference's tiny sizes (2 heads of 16, text_dim 24, freq_dim 32, ffn 48,
                                2 layers) with in_channels = out_channels = 8 (the tiny VAE's z_dim), as TI2V-5B
                                (in = out = 48, no image embedder)
  goldens_wan22.safetensors     the goldens (all F32; cases below, each described in __metadata__):
      vae22_decode            latents, z [1, 8, 3, 2, 3] -> video_unclamped, video [1, 3, 9, 32, 48]; intermediate.*
                              (post_quant_conv, decoder.conv_in, decoder.mid_block, decoder.up_blocks.0 and its
                              avg_shortcut (DupUp3D, first frame trimmed), decoder.up_blocks.1)
      vae22_encode            video [1, 3, 9, 32, 48] -> moments [1, 16, 3, 2, 3], mean [1, 8, 3, 2, 3];
                              intermediate.* (encoder.conv_in, down_blocks.i and down_blocks.i.avg_shortcut,
                              mid_block, encoder output)
      vae22_encode_one_frame  video [1, 3, 1, 32, 48] -> moments [1, 16, 1, 2, 3], mean; intermediate.patchify
                              [1, 12, 1, 16, 24] and the same intermediates
      ti2v_mask               first_frame_mask [1, 1, 3, 4, 6]; a worked example: latents [2, 8, 3, 4, 6],
                              condition [2, 8, 1, 4, 6] -> latent_model_input; latents_after_loop -> final_latents
      ti2v_timesteps          t [1] (999) -> timestep [2, 18] (the I2V rule), timestep_t2v [2, 18] (WanPipeline's
                              all-ones mask), token_mask [18]
      transformer_ti2v        hidden_states [2, 8, 3, 4, 6] (= ti2v_mask.latent_model_input), timestep [2, 18]
                              (per token: row 0 mask * 999, row 1 mask * 250.5), encoder_hidden_states [2, 7, 24]
                              -> sample [2, 8, 3, 4, 6]; temb [2, 18, 32], timestep_proj [2, 18, 6, 32], context,
                              intermediate.block0.out

Numerics as make_wan_reference.py: bf16-representable random weights stored as F32, the models run in float64
on f32 inputs, results rounded to f32 once; the timestep sinusoid arguments and the RoPE tables as an f32
diffusers run. The pipeline rules are f32 arithmetic as the pipelines do it (mask f32, t f32).

diffusers facts used (read from its source for facts only, at commit 58eb52c0803e (HEAD of the mirror):
models/autoencoders/autoencoder_kl_wan.py, pipelines/wan/pipeline_wan.py, pipelines/wan/pipeline_wan_i2v.py,
models/transformers/transformer_wan.py, scripts/convert_wan_to_diffusers.py; history: commit 58d2b10a2e
"[wan2.2] fix vae patches (#12041)"):
  * patchify(x, p) (AutoencoderKLWan._encode, before the encoder): [B, C, T, H, W] -> [B, C p^2, T, H/p, W/p] with
    out[c p^2 + dx p + dy, t, i, j] = x[c, t, i p + dy, j p + dx]: the channel is major, then the WIDTH offset dx,
    then the height offset dy (#12041 changed the order to this). unpatchify (AutoencoderKLWan._decode, after the
    frame loop, before the clamp) is its exact inverse. The encoder sees 12 channels, the decoder ends with 12.
  * The clamp to [-1, 1] always runs after unpatchify (#12041 removed the clip_output config key; a Wan2.2
    config written before it may still carry "clip_output": false, which current diffusers ignores).
  * AvgDown3D(in, out, ft, fs) (the encoder's residual shortcut): zero frames in FRONT to make T a multiple of ft
    ((ft - T % ft) % ft of them), then, with factor = ft fs^2 and group = in factor / out,
    out[o, t, i, j] = mean over k < group of x'[c, t ft + a, i fs + b, j fs + d] where o group + k =
    c factor + (a fs + b) fs + d (a the time offset, b the height offset, d the width offset).
  * DupUp3D(in, out, ft, fs) (the decoder's residual shortcut), repeats = out factor / in:
    out[o, t ft + a, i fs + b, j fs + d] = x[(o factor + (a fs + b) fs + d) // repeats, t, i, j]; with
    first_chunk it then drops its first ft - 1 output frames.
  * WanResidualDownBlock(in, out, num_res_blocks, temporal, down): y = resnets (in -> out, then out -> out),
    then `downsampler` (downsample3d if temporal else downsample2d; only when down); returns
    y + avg_shortcut(x) with AvgDown3D(in, out, 2 if temporal else 1, 2 if down else 1), applied to each chunk's
    block input without a cache. The encoder (base dims [b, b, 2b, 4b, 4b]) has one such block per level:
    temporal = temperal_downsample[i] except the last level, down = not the last level; so the last level's
    shortcut is AvgDown3D(4b, 4b, 1, 1), the identity: that block adds its input.
  * WanResidualUpBlock(in, out, num_res_blocks, temporal, up): num_res_blocks + 1 resnets (in -> out first),
    then `upsampler` = WanResample(out, upsample3d / upsample2d, upsample_out_dim = out) (its 2-D conv keeps the
    channels, Wan2.1's halves them), then + avg_shortcut(x, first_chunk) with DupUp3D(in, out, 2 if temporal else 1,
    2); the last level (up false) has neither upsampler nor shortcut. temporal = temperal_downsample[::-1][i].
  * Decoder dims with is_residual: dims = [d m for m in [dim_mult[-1]] + dim_mult[::-1]] with d = decoder_base_dim
    (base_dim when null), up block i maps dims[i] -> dims[i + 1] (no halving of the input, unlike Wan2.1); the
    encoder uses base_dim. Wan2.2 (convert_wan_to_diffusers.py vae22_diffusers_config): base_dim 160,
    decoder_base_dim 256, z_dim 48, in/out_channels 12, patch_size 2, scale_factor_spatial 16, temporal 4.
  * first_chunk: AutoencoderKLWan._decode passes first_chunk=True for latent frame 0 only; the decoder hands it to
    every up block; only DupUp3D uses it. upsample3d's first call is skipped as in Wan2.1 ("Rep"), so in chunk 0
    both paths give 1 frame and later chunks 2 per input frame. Over the whole sequence the same result is
    DupUp3D with the first ft - 1 frames dropped, which this script checks.
  * The encoder chunks the PATCHIFIED video as Wan2.1 (frame 0, then 4 frames at a time, one cache), then
    quant_conv; latent_dist.mean = the first z_dim channels (DiagonalGaussianDistribution).
  * Pipelines with expand_timesteps (WanPipeline: mask = ones(latents.shape); WanImageToVideoPipeline.prepare_latents:
    first_frame_mask = ones [1, 1, T', h, w] f32 with frame 0 zero, latent_condition the VAE mean (argmax) of the
    single image frame, normalized (z - mean) * (1 / std), repeated over the batch): per step
    latent_model_input = (1 - first_frame_mask) * condition + first_frame_mask * latents (condition's one frame
    broadcast over T'), timestep = (mask[0][0][:, ::2, ::2] * t).flatten() expanded to [B, L] (L = T' (h/2) (w/2)
    tokens, hard-coded stride 2), the scheduler steps the whole latents; after the loop
    latents = (1 - first_frame_mask) * condition + first_frame_mask * latents, then un-normalize and decode.
  * WanTransformer3DModel with timestep.ndim == 2: the timesteps are flattened to [B L], the sinusoid taken per
    element, unflattened to [B, L, freq_dim]; temb = time_embedder(...) [B, L, D], timestep_proj = time_proj(SiLU(temb))
    [B, L, 6D] unflattened to [B, L, 6, D]; each block's modulation is scale_shift_table[None] + timestep_proj
    (rows 0..5 = shift, scale, gate of self-attention, then of the FFN, each [B, L, D], per token); the output head
    is shift, scale = rows 0, 1 of scale_shift_table[None] + temb[:, :, None] (per token, no SiLU).
  * WanRotaryPosEmbed at this commit splits its table with [t, h, w] = [hd - 2 h, h, h], h = 2 floor(hd / 6),
    the same rule as make_wan_reference.py (8/4/4 for hd 16), so a diffusers run of the tiny transformer agrees.
Checks the script makes (asserted): the regroupings against the per-element formulas above
(check_regroup_formulas), the module trees against diffusers' parameter names and shapes, the chunked decode
against the whole-sequence one (float64 4e-15, f32 8e-6), and the per-token transformer path with one t
everywhere against the 1-D path (1e-15). Once, outside this script, the files were also run through diffusers'
own autoencoder_kl_wan.py and transformer_wan.py at the commit above (loaded strictly from these checkpoints, under
stubs for the rest of diffusers and torch >= 2 functions): video 4.3e-7, moments 2.7e-8, every intermediate at f32
rounding, transformer sample 1.1e-6 (diffusers casts parts of the blocks to f32).
Seeds are fixed: with the same torch and numpy the output is byte-identical.
"""
import copy
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_wan_reference as wan  # noqa: E402  (VAE blocks, chunk cache, T2V transformer, weights, files)
import make_wan_vae_encoder_reference as wan_enc  # noqa: E402  (downsample2d/3d, the encoder's chunking)
from make_flux_reference import Goldens, layer_norm, max_abs, timestep_sinusoid  # noqa: E402

F32, F64 = torch.float32, torch.float64
ROOT = wan.ROOT
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
GENERATOR = "tests/reference/make_wan22_reference.py"
DIFFUSERS_COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"


# =============================================================================================
# patchify / unpatchify, AvgDown3D, DupUp3D
# =============================================================================================
def patchify(x, p):
    """[B, C, T, H, W] -> [B, C p^2, T, H/p, W/p]; channel c p^2 + dx p + dy holds x[c, t, i p + dy, j p + dx]."""
    b, c, t, h, w = x.shape
    assert h % p == 0 and w % p == 0, x.shape
    y = x.reshape(b, c, t, h // p, p, w // p, p)  # dims: b, c, t, i, dy, j, dx
    return y.permute(0, 1, 6, 4, 2, 3, 5).reshape(b, c * p * p, t, h // p, w // p)


def unpatchify(x, p):
    """The inverse of patchify."""
    b, cp, t, h, w = x.shape
    y = x.reshape(b, cp // (p * p), p, p, t, h, w)  # dims: b, c, dx, dy, t, i, j
    return y.permute(0, 1, 4, 5, 3, 6, 2).reshape(b, cp // (p * p), t, h * p, w * p)


class AvgDown3D(nn.Module):
    """The encoder's residual shortcut (no parameters): front zero frames up to a multiple of ft, each
    (ft, fs, fs) cell's sub-positions moved into channels (channel major, then time, height, width offset), then
    the mean over consecutive groups of in * factor / out of those channels."""

    def __init__(self, cin, cout, ft, fs):
        super().__init__()
        self.cout, self.ft, self.fs = cout, ft, fs
        factor = ft * fs * fs
        assert cin * factor % cout == 0, (cin, cout, factor)
        self.group = cin * factor // cout

    def forward(self, x):
        ft, fs = self.ft, self.fs
        x = F.pad(x, (0, 0, 0, 0, (ft - x.shape[2] % ft) % ft, 0))
        b, c, t, h, w = x.shape
        y = x.reshape(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6)
        return y.reshape(b, self.cout, self.group, t // ft, h // fs, w // fs).mean(dim=2)


class DupUp3D(nn.Module):
    """The decoder's residual shortcut (no parameters): each channel repeated out * factor / in times (adjacent
    copies), the result read as (out channel, time, height, width offset) and spread over the cells; with
    first_chunk the first ft - 1 frames are dropped."""

    def __init__(self, cin, cout, ft, fs):
        super().__init__()
        self.cout, self.ft, self.fs = cout, ft, fs
        factor = ft * fs * fs
        assert cout * factor % cin == 0, (cin, cout, factor)
        self.repeats = cout * factor // cin

    def forward(self, x, first_chunk=False):
        ft, fs = self.ft, self.fs
        b, _, t, h, w = x.shape
        y = x.repeat_interleave(self.repeats, dim=1).reshape(b, self.cout, ft, fs, fs, t, h, w)
        y = y.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, self.cout, t * ft, h * fs, w * fs)
        return y[:, :, ft - 1:] if first_chunk else y


def check_regroup_formulas():
    """Checks patchify, unpatchify, AvgDown3D and DupUp3D against the per-element formulas of the docstring."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 2, 4, 6, generator=gen, dtype=F64)
    p = 2
    y = patchify(x, p)
    for c in range(3):
        for dx in range(p):
            for dy in range(p):
                assert torch.equal(y[:, c * p * p + dx * p + dy], x[:, c, :, dy::p, dx::p])
    assert torch.equal(unpatchify(y, p), x)
    for cin, cout, ft, fs, t in ((2, 2, 1, 2, 3), (2, 4, 2, 2, 3), (4, 8, 2, 2, 4), (3, 3, 1, 1, 2), (4, 2, 2, 2, 1)):
        x = torch.randn(1, cin, t, 4, 6, generator=gen, dtype=F64)
        got = AvgDown3D(cin, cout, ft, fs)(x)
        pad = (ft - t % ft) % ft
        xp = torch.cat([torch.zeros(1, cin, pad, 4, 6, dtype=F64), x], dim=2)
        factor, group = ft * fs * fs, cin * ft * fs * fs // cout
        want = torch.zeros(got.shape, dtype=F64)
        for o in range(cout):
            for k in range(group):
                c, r = divmod(o * group + k, factor)
                a, rest = divmod(r, fs * fs)
                bb, d = divmod(rest, fs)
                want[:, o] += xp[:, c, a::ft, bb::fs, d::fs] / group
        assert (got - want).abs().max() < 1e-14, (cin, cout, ft, fs)
    for cin, cout, ft, fs in ((4, 4, 2, 2), (4, 2, 1, 2), (12, 6, 1, 2), (2, 4, 2, 2)):
        x = torch.randn(1, cin, 2, 2, 3, generator=gen, dtype=F64)
        m = DupUp3D(cin, cout, ft, fs)
        got = m(x)
        factor = ft * fs * fs
        for o in range(cout):
            for a in range(ft):
                for bb in range(fs):
                    for d in range(fs):
                        src = (o * factor + (a * fs + bb) * fs + d) // m.repeats
                        assert torch.equal(got[:, o, a::ft, bb::fs, d::fs], x[:, src])
        assert torch.equal(m(x, first_chunk=True), got[:, :, ft - 1:])


# =============================================================================================
# AutoencoderKLWan, Wan2.2 layout (is_residual, patch_size)
# =============================================================================================
class WanResidualDownBlock(nn.Module):
    """down_blocks.i: resnets.j (in -> out first), downsampler (resample.1, time_conv), + avg_shortcut(input)."""

    def __init__(self, cin, cout, num_res_blocks, temporal, down):
        super().__init__()
        self.avg_shortcut = AvgDown3D(cin, cout, 2 if temporal else 1, 2 if down else 1)
        self.resnets = nn.ModuleList([wan.WanResidualBlock(cin if i == 0 else cout, cout)
                                      for i in range(num_res_blocks)])
        self.downsampler = wan_enc.WanDownsample(cout, "downsample3d" if temporal else "downsample2d") if down else None

    def forward(self, x, cache):
        y = x
        for resnet in self.resnets:
            y = resnet(y, cache)
        if self.downsampler is not None:
            y = self.downsampler(y, cache)
        return y + self.avg_shortcut(x)


class WanEncoder3d22(wan_enc.WanEncoder3d):
    """Wan2.1's encoder (conv_in, down_blocks, mid block, head to 2 z_dim; its forward runs one chunk with the
    cache) with one WanResidualDownBlock per level instead of the flat list."""

    def __init__(self, cfg):
        super().__init__(cfg)
        dims = [cfg["base_dim"] * u for u in [1] + cfg["dim_mult"]]
        last = len(cfg["dim_mult"]) - 1
        self.down_blocks = nn.ModuleList([
            WanResidualDownBlock(dims[i], dims[i + 1], cfg["num_res_blocks"],
                                 temporal=cfg["temperal_downsample"][i] if i != last else False, down=i != last)
            for i in range(last + 1)])


class WanResample22(wan.WanResample):
    """upsample2d / upsample3d with upsample_out_dim = dim: resample.1 is Conv2d(dim, dim, 3, padding 1)."""

    def __init__(self, dim, mode):
        super().__init__(dim, mode)
        self.resample[1] = nn.Conv2d(dim, dim, 3, padding=1)


class WanResidualUpBlock(nn.Module):
    """up_blocks.i: resnets.j (num_res_blocks + 1, in -> out first), upsampler (resample.1, time_conv), then
    + avg_shortcut(input, first_chunk) (DupUp3D); the last level has neither."""

    def __init__(self, cin, cout, num_res_blocks, temporal, up):
        super().__init__()
        self.avg_shortcut = DupUp3D(cin, cout, 2 if temporal else 1, 2) if up else None
        self.resnets = nn.ModuleList([wan.WanResidualBlock(cin if i == 0 else cout, cout)
                                      for i in range(num_res_blocks + 1)])
        self.upsampler = WanResample22(cout, "upsample3d" if temporal else "upsample2d") if up else None

    def forward(self, x, cache=None, first_chunk=False, record=None, name=""):
        y = x
        for resnet in self.resnets:
            y = resnet(y, cache)
        if self.upsampler is not None:
            y = self.upsampler(y, cache)
        if self.avg_shortcut is not None:
            s = self.avg_shortcut(x, first_chunk)
            if record is not None:
                record[name + ".avg_shortcut"] = s
            y = y + s
        return y


def wan22_decoder_dims(cfg):
    base = cfg["decoder_base_dim"] or cfg["base_dim"]
    mult = cfg["dim_mult"]
    return [base * m for m in [mult[-1]] + mult[::-1]]


class WanDecoder3d22(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dims = wan22_decoder_dims(cfg)
        temporal_up = list(cfg["temperal_downsample"])[::-1]
        n = len(cfg["dim_mult"])
        self.conv_in = wan.CausalConv3d(cfg["z_dim"], dims[0], 3, padding=1)
        self.mid_block = wan.WanMidBlock(dims[0])
        self.up_blocks = nn.ModuleList([
            WanResidualUpBlock(dims[i], dims[i + 1], cfg["num_res_blocks"],
                               temporal=temporal_up[i] if i != n - 1 else False, up=i != n - 1)
            for i in range(n)])
        self.norm_out = wan.WanRMSNorm(dims[-1], images=False)
        self.conv_out = wan.CausalConv3d(dims[-1], cfg["out_channels"], 3, padding=1)

    def forward(self, x, cache=None, first_chunk=False, record=None):
        rec = record if record is not None else {}
        x = self.conv_in(x, cache)
        rec["decoder.conv_in"] = x
        x = self.mid_block(x, cache)
        rec["decoder.mid_block"] = x
        for i, block in enumerate(self.up_blocks):
            x = block(x, cache, first_chunk, rec, f"decoder.up_blocks.{i}")
            rec[f"decoder.up_blocks.{i}"] = x
        return self.conv_out(F.silu(self.norm_out(x)), cache)


class AutoencoderKLWan22(nn.Module):
    """The whole Wan2.2 VAE; state_dict keys as diffusers' (encoder.*, quant_conv.*, post_quant_conv.*, decoder.*)."""

    def __init__(self, cfg):
        super().__init__()
        assert cfg["is_residual"] and cfg["patch_size"] and not cfg["attn_scales"], cfg
        assert cfg["in_channels"] == cfg["out_channels"] == 3 * cfg["patch_size"] ** 2, cfg
        self.cfg = cfg
        self.encoder = WanEncoder3d22(cfg)
        self.quant_conv = wan.CausalConv3d(2 * cfg["z_dim"], 2 * cfg["z_dim"], 1)
        self.post_quant_conv = wan.CausalConv3d(cfg["z_dim"], cfg["z_dim"], 1)
        self.decoder = WanDecoder3d22(cfg)

    def moments(self, video, record=None):
        """_encode: patchify, then Wan2.1's chunking (make_wan_vae_encoder_reference.AutoencoderKLWan.moments:
        frame 0, then 4 frames per chunk with one cache, concatenated, quant_conv). `record` gets the encoder's
        per-chunk module outputs, concatenated over time, and the patchified input."""
        x = patchify(video, self.cfg["patch_size"])
        rec = record if record is not None else {}
        rec["patchify"] = x
        named = {"encoder.conv_in": self.encoder.conv_in, "encoder.mid_block": self.encoder.mid_block,
                 "encoder": self.encoder}
        for i, block in enumerate(self.encoder.down_blocks):
            named[f"encoder.down_blocks.{i}"] = block
            named[f"encoder.down_blocks.{i}.avg_shortcut"] = block.avg_shortcut
        outs = {k: [] for k in named}
        hooks = [m.register_forward_hook(lambda _m, _i, o, k=k: outs[k].append(o)) for k, m in named.items()]
        try:
            moments = wan_enc.AutoencoderKLWan.moments(self, x)  # uses self.encoder and self.quant_conv only
        finally:
            for h in hooks:
                h.remove()
        rec.update({k: torch.cat(v, dim=2) for k, v in outs.items()})
        return moments

    def decode_chunked(self, z, record=None):
        """_decode without the clamp: post_quant_conv on the whole z, one latent frame at a time with the caches
        (first_chunk for frame 0), concatenated, unpatchified."""
        rec = record if record is not None else {}
        x = self.post_quant_conv(z)
        rec["post_quant_conv"] = x
        cache = wan.ChunkCache()
        frames, per_chunk = [], []
        for i in range(x.shape[2]):
            r = {}
            frames.append(self.decoder(x[:, :, i:i + 1], cache, first_chunk=(i == 0), record=r))
            per_chunk.append(r)
        for k in per_chunk[0]:
            rec[k] = torch.cat([r[k] for r in per_chunk], dim=2)
        return unpatchify(torch.cat(frames, dim=2), self.cfg["patch_size"])

    def decode_whole(self, z):
        """The same over the whole sequence at once (upsample3d's whole-sequence form, DupUp3D trimmed once)."""
        x = self.decoder(self.post_quant_conv(z), None, first_chunk=True)
        return unpatchify(x, self.cfg["patch_size"])


VAE22_CONV_OUT_SCALE = 4.0  # a power of two keeps the weights bf16-representable


def init_vae22(model, seed):
    """make_wan_vae_encoder_reference.init_whole_vae's distributions, then the decoder's conv_out weight times 4,
    so part of the decoded video lies outside [-1, 1] and the clamp is exercised."""
    wan_enc.init_whole_vae(model, seed)
    with torch.no_grad():
        model.decoder.conv_out.weight.mul_(VAE22_CONV_OUT_SCALE)
    return model


# The first 8 of Wan2.2's 48 latents_mean / latents_std (convert_wan_to_diffusers.py, vae22_diffusers_config).
WAN22_LATENTS_MEAN8 = [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557]
WAN22_LATENTS_STD8 = [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013]

VAE22_CONFIG = {
    "_class_name": "AutoencoderKLWan",
    "_diffusers_version": wan.DIFFUSERS_VERSION,
    "attn_scales": [],
    "base_dim": 2,
    "decoder_base_dim": 3,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "in_channels": 12,
    "is_residual": True,
    "latents_mean": WAN22_LATENTS_MEAN8,
    "latents_std": WAN22_LATENTS_STD8,
    "num_res_blocks": 2,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "temperal_downsample": [False, True, True],
    "z_dim": 8,
}


def expected_vae22_shapes(cfg):
    """diffusers' parameter names and shapes of AutoencoderKLWan with is_residual (read from its module tree),
    to check this module tree against."""
    shapes = {}

    def conv3(name, cin, cout, k=(3, 3, 3)):
        shapes[name + ".weight"], shapes[name + ".bias"] = [cout, cin, *k], [cout]

    def resnet(p, cin, cout):
        shapes[p + "norm1.gamma"], shapes[p + "norm2.gamma"] = [cin, 1, 1, 1], [cout, 1, 1, 1]
        conv3(p + "conv1", cin, cout)
        conv3(p + "conv2", cout, cout)
        if cin != cout:
            conv3(p + "conv_shortcut", cin, cout, (1, 1, 1))

    def mid(p, c):
        resnet(p + "resnets.0.", c, c)
        resnet(p + "resnets.1.", c, c)
        a = p + "attentions.0."
        shapes[a + "norm.gamma"] = [c, 1, 1]
        shapes[a + "to_qkv.weight"], shapes[a + "to_qkv.bias"] = [3 * c, c, 1, 1], [3 * c]
        shapes[a + "proj.weight"], shapes[a + "proj.bias"] = [c, c, 1, 1], [c]

    z, nrb, n = cfg["z_dim"], cfg["num_res_blocks"], len(cfg["dim_mult"])
    enc = [cfg["base_dim"] * u for u in [1] + cfg["dim_mult"]]
    conv3("encoder.conv_in", cfg["in_channels"], enc[0])
    for i in range(n):
        p = f"encoder.down_blocks.{i}."
        for j in range(nrb):
            resnet(p + f"resnets.{j}.", enc[i] if j == 0 else enc[i + 1], enc[i + 1])
        if i != n - 1:
            c = enc[i + 1]
            shapes[p + "downsampler.resample.1.weight"], shapes[p + "downsampler.resample.1.bias"] = [c, c, 3, 3], [c]
            if cfg["temperal_downsample"][i]:
                conv3(p + "downsampler.time_conv", c, c, (3, 1, 1))
    mid("encoder.mid_block.", enc[-1])
    shapes["encoder.norm_out.gamma"] = [enc[-1], 1, 1, 1]
    conv3("encoder.conv_out", enc[-1], 2 * z)
    conv3("quant_conv", 2 * z, 2 * z, (1, 1, 1))
    conv3("post_quant_conv", z, z, (1, 1, 1))
    dec = wan22_decoder_dims(cfg)
    conv3("decoder.conv_in", z, dec[0])
    mid("decoder.mid_block.", dec[0])
    temporal_up = cfg["temperal_downsample"][::-1]
    for i in range(n):
        p = f"decoder.up_blocks.{i}."
        for j in range(nrb + 1):
            resnet(p + f"resnets.{j}.", dec[i] if j == 0 else dec[i + 1], dec[i + 1])
        if i != n - 1:
            c = dec[i + 1]
            shapes[p + "upsampler.resample.1.weight"], shapes[p + "upsampler.resample.1.bias"] = [c, c, 3, 3], [c]
            if temporal_up[i]:
                conv3(p + "upsampler.time_conv", c, 2 * c, (3, 1, 1))
    shapes["decoder.norm_out.gamma"] = [dec[-1], 1, 1, 1]
    conv3("decoder.conv_out", dec[-1], cfg["out_channels"])
    return shapes


# =============================================================================================
# WanTransformer3DModel with a per-token (2-D) timestep
# =============================================================================================
class WanTransformerBlockPerToken(wan.WanTransformerBlock):
    """blocks.N, taking timestep_proj [B, 6, D] (as make_wan_reference) or [B, L, 6, D] (TI2V: one modulation
    per token); the same parameters."""

    def forward(self, h, context, timestep_proj, rope):
        if timestep_proj.ndim == 3:
            return super().forward(h, context, timestep_proj, rope)
        mod = self.scale_shift_table[None] + timestep_proj  # [B, L, 6, D]
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = (mod[:, :, r] for r in range(6))  # [B, L, D]
        xn = layer_norm(h, self.eps) * (1 + scale_sa) + shift_sa
        h = h + self.attn1(xn, rope=rope) * gate_sa
        xn = self.norm2(h) if self.norm2 is not None else h
        h = h + self.attn2(xn, context=context)
        xn = layer_norm(h, self.eps) * (1 + scale_ff) + shift_ff
        return h + self.ffn(xn) * gate_ff


class WanTI2VTransformer3DModel(wan.WanTransformer3DModel):
    """make_wan_reference's T2V transformer (the TI2V-5B module tree) accepting timestep [B] or [B, L]."""

    def __init__(self, config):
        super().__init__(config)
        c = self.cfg
        self.blocks = nn.ModuleList([
            WanTransformerBlockPerToken(self.dim, c["ffn_dim"], c["num_attention_heads"], c["eps"],
                                        c["cross_attn_norm"])
            for _ in range(c["num_layers"])])

    def forward(self, hidden_states, timestep, encoder_hidden_states, record=None):
        if timestep.ndim == 1:
            return super().forward(hidden_states, timestep, encoder_hidden_states, record)
        rec = record if record is not None else {}
        b, _, t, hh, ww = hidden_states.shape
        pt, ph, pw = self.cfg["patch_size"]
        grid = (t // pt, hh // ph, ww // pw)
        n_tok = grid[0] * grid[1] * grid[2]
        assert timestep.shape == (b, n_tok), (timestep.shape, n_tok)
        rope = wan.wan_rope(self.cfg["attention_head_dim"], *grid, self.cfg["rope_max_seq_len"])
        h = self.patch_embedding(hidden_states).flatten(2).transpose(1, 2)
        emb = self.condition_embedder
        sin = timestep_sinusoid(timestep.reshape(-1), encoder_hidden_states.dtype, emb.freq_dim)  # [B L, freq_dim]
        temb = emb.time_embedder(sin.reshape(b, n_tok, -1))  # [B, L, D]
        timestep_proj = emb.time_proj(F.silu(temb)).unflatten(2, (6, self.dim))  # [B, L, 6, D]
        context = emb.text_embedder(encoder_hidden_states)
        rec.update({"temb": temb, "timestep_proj": timestep_proj, "context": context, "block0.hidden_states": h})
        for i, block in enumerate(self.blocks):
            h = block(h, context, timestep_proj, rope)
            rec[f"block{i}.out"] = h
        mod = self.scale_shift_table[None] + temb[:, :, None, :]  # [B, L, 2, D]: shift, scale per token
        y = self.proj_out(layer_norm(h, self.cfg["eps"]) * (1 + mod[:, :, 1]) + mod[:, :, 0])
        return wan.unpatchify(y, grid, (pt, ph, pw))


TI2V_TRANSFORMER_CONFIG = dict(wan.TRANSFORMER_CONFIG, in_channels=VAE22_CONFIG["z_dim"],
                               out_channels=VAE22_CONFIG["z_dim"])


# =============================================================================================
# The TI2V pipeline rules (WanPipeline / WanImageToVideoPipeline with expand_timesteps)
# =============================================================================================
def first_frame_mask(num_latent_frames, latent_h, latent_w):
    """prepare_latents with expand_timesteps: ones [1, 1, T', h, w] (f32), frame 0 zero."""
    mask = torch.ones(1, 1, num_latent_frames, latent_h, latent_w, dtype=F32)
    mask[:, :, 0] = 0
    return mask


def per_token_timestep(mask, t, batch):
    """(mask[0][0][:, ::2, ::2] * t).flatten() expanded to [batch, L] (f32 product)."""
    return (mask[0][0][:, ::2, ::2] * t).flatten()[None].expand(batch, -1)


def blend(mask, condition, latents):
    """(1 - mask) * condition + mask * latents in f32 (condition [B, z, 1, h, w] broadcast over frames)."""
    return (1 - mask) * condition + mask * latents


# =============================================================================================
# Cases
# =============================================================================================
def max_diff(a, b):
    return float((a.double() - b.double()).abs().max())


def vae_cases(g, vae, report):
    cfg = vae.cfg
    vae32 = copy.deepcopy(vae).float()
    # ---- decode ----
    latents = g.randn((1, cfg["z_dim"], 3, 2, 3))
    z = wan.unnormalize_latents(latents, cfg["latents_mean"], cfg["latents_std"])
    rec = {}
    with torch.no_grad():
        chunked = vae.decode_chunked(z.double(), rec)
        whole = vae.decode_whole(z.double())
        chunked32, whole32 = vae32.decode_chunked(z), vae32.decode_whole(z)
    assert chunked.shape == (1, 3, 9, 32, 48), chunked.shape
    agree64, agree32 = max_diff(whole, chunked), max_diff(whole32, chunked32)
    assert agree64 <= 1e-12 and agree32 <= 1e-5 * max(1.0, max_abs(whole)), (agree64, agree32)
    keep = ["post_quant_conv", "decoder.conv_in", "decoder.mid_block", "decoder.up_blocks.0",
            "decoder.up_blocks.0.avg_shortcut", "decoder.up_blocks.1"]
    tensors = {"latents": latents, "z": z, "video_unclamped": chunked, "video": chunked.clamp(-1.0, 1.0)}
    tensors.update({f"intermediate.{k}": rec[k] for k in keep})
    g.add("vae22_decode", dict(
        op="wan22_vae_decode", weights="wan22_vae_tiny", z_shape=list(z.shape), video_shape=list(chunked.shape),
        intermediates=keep,
        note="z = latents / (1 / latents_std) + latents_mean (f32, as the pipelines) is the decoder's input; "
             "post_quant_conv on the whole z, then AutoencoderKLWan._decode's frame-by-frame decode with the "
             "caches, first_chunk=True for latent frame 0, frames concatenated, unpatchify(2) (12 -> 3 channels), "
             "= video_unclamped; video = clamp(video_unclamped, -1, 1); no (x / 2 + 0.5). Intermediates are "
             "concatenated over the chunks: decoder.up_blocks.0.avg_shortcut is the DupUp3D output with its first "
             "frame dropped (5 frames). The decoder output before unpatchify is patchify(video_unclamped, 2)."),
        tensors)
    report["vae22_decode"] = dict(max_abs_z=max_abs(z), max_abs_video_unclamped=max_abs(chunked),
                                  fraction_within_1=float((chunked.abs() <= 1).double().mean()),
                                  whole_vs_chunked_f64=agree64, whole_vs_chunked_f32=agree32,
                                  f32_run_err=max_diff(chunked32, chunked))
    # ---- encode ----
    enc_keep = (["encoder.conv_in"]
                + [f"encoder.down_blocks.{i}{s}" for i in range(4) for s in ("", ".avg_shortcut")]
                + ["encoder.mid_block", "encoder"])
    for case, frames in (("vae22_encode", 9), ("vae22_encode_one_frame", 1)):
        video = g.uniform((1, 3, frames, 32, 48), -1.0, 1.0)
        rec = {}
        with torch.no_grad():
            moments = vae.moments(video.double(), rec)
            moments32 = vae32.moments(video)
        latent_frames = 1 + (frames - 1) // 4
        assert moments.shape == (1, 2 * cfg["z_dim"], latent_frames, 2, 3), moments.shape
        keep = enc_keep + (["patchify"] if frames == 1 else [])
        tensors = {"video": video, "moments": moments, "mean": moments[:, :cfg["z_dim"]]}
        tensors.update({f"intermediate.{k}": rec[k] for k in keep})
        g.add(case, dict(
            op="wan22_vae_encode", weights="wan22_vae_tiny", video_shape=list(video.shape),
            moments_shape=list(moments.shape), intermediates=keep,
            note="AutoencoderKLWan._encode: patchify(video, 2) (3 -> 12 channels, channel c*4 + dx*2 + dy), then "
                 "the encoder on frame 0, then 4 frames at a time with one cache, concatenated over time, then "
                 "quant_conv = moments; mean = moments[:, :z_dim] (latent_dist.mean / mode()). Intermediates are "
                 "the per-chunk outputs concatenated over time (encoder = the encoder output before quant_conv); "
                 "down_blocks.i.avg_shortcut is AvgDown3D of the block's input"),
            tensors)
        report[case] = dict(max_abs_moments=max_abs(moments), f32_run_err=max_diff(moments32, moments))


TI2V_LATENT_SHAPE = (2, 8, 3, 4, 6)  # B, z, T', h, w: 9 frames of 64 x 96 with spatial factor 16
TI2V_T = 999.0  # UniPC's first timestep (an int64 in the pipeline; the mask product is f32 either way)
TI2V_T_ROW1 = 250.5  # the transformer case's second batch row


def ti2v_cases(g, model, report):
    b, zc, t_lat, h_lat, w_lat = TI2V_LATENT_SHAPE
    mask = first_frame_mask(t_lat, h_lat, w_lat)
    latents = g.randn(TI2V_LATENT_SHAPE)
    condition = g.randn((1, zc, 1, h_lat, w_lat)).repeat(b, 1, 1, 1, 1)  # latent_condition.repeat(batch_size, ...)
    after_loop = g.randn(TI2V_LATENT_SHAPE)
    model_input = blend(mask, condition, latents)
    final = blend(mask, condition, after_loop)
    assert torch.equal(model_input[:, :, 0], condition[:, :, 0])
    assert torch.equal(model_input[:, :, 1:], latents[:, :, 1:])
    g.add("ti2v_mask", dict(
        op="wan22_ti2v_mask", latent_shape=list(TI2V_LATENT_SHAPE), num_frames=9, height=64, width=96,
        vae_scale_factor_spatial=16, vae_scale_factor_temporal=4,
        note="WanImageToVideoPipeline.prepare_latents with expand_timesteps: first_frame_mask = ones [1, 1, T', h, w] "
             "f32 with frame 0 = 0 (T' = (num_frames - 1) // 4 + 1, h = height // 16, w = width // 16); condition = "
             "((vae mean of the 1-frame image) - latents_mean) * (1 / latents_std), repeated over the batch; each "
             "step latent_model_input = (1 - first_frame_mask) * condition + first_frame_mask * latents (f32, "
             "condition broadcast over frames): frame 0 is the condition, the others the latents; after the loop "
             "final_latents = the same blend of the scheduler's last latents (latents_after_loop), then "
             "un-normalize and decode. WanPipeline (text only) with expand_timesteps uses mask = ones(latents.shape) "
             "and no blend."),
        {"first_frame_mask": mask, "latents": latents, "condition": condition, "latent_model_input": model_input,
         "latents_after_loop": after_loop, "final_latents": final})
    t = torch.tensor([TI2V_T], dtype=F32)
    timestep = per_token_timestep(mask, t[0], b)
    timestep_t2v = per_token_timestep(torch.ones(TI2V_LATENT_SHAPE, dtype=F32), t[0], b)
    n_tok = t_lat * (h_lat // 2) * (w_lat // 2)
    assert timestep.shape == (b, n_tok) and float(timestep[:, :n_tok // t_lat].abs().max()) == 0
    g.add("ti2v_timesteps", dict(
        op="wan22_ti2v_timesteps", latent_shape=list(TI2V_LATENT_SHAPE), patch_size=[1, 2, 2], num_tokens=n_tok,
        note="timestep = (first_frame_mask[0][0][:, ::2, ::2] * t).flatten() expanded to [B, L]: token n = "
             "(f * h/2 + i) * w/2 + j gets 0 if f == 0 else t (the transformer's token order); token_mask is "
             "mask[0][0][:, ::2, ::2].flatten(); timestep_t2v is WanPipeline's (all-ones mask: t everywhere). The "
             "stride 2 is hard-coded in the pipelines (patch (1, 2, 2))."),
        {"t": t, "timestep": timestep, "timestep_t2v": timestep_t2v,
         "token_mask": mask[0][0][:, ::2, ::2].flatten()})

    # ---- the transformer with a per-token timestep ----
    ts = torch.stack([per_token_timestep(mask, TI2V_T, 1)[0], per_token_timestep(mask, TI2V_T_ROW1, 1)[0]])
    ehs = g.randn((b, 7, model.cfg["text_dim"]))
    ehs[1, 5:] = 0.0
    rec = {}
    with torch.no_grad():
        sample = model(model_input.double(), ts, ehs.double(), rec)
        f32_err = max_diff(copy.deepcopy(model).float()(model_input, ts, ehs), sample)
        # A per-token timestep equal everywhere must give the 1-D path's result (WanPipeline's case).
        uniform = model(model_input.double(), torch.full((b, n_tok), TI2V_T), ehs.double())
        one_d = model(model_input.double(), torch.full((b,), TI2V_T), ehs.double())
    uniform_diff = max_diff(uniform, one_d)
    assert uniform_diff <= 1e-12, uniform_diff
    g.add("transformer_ti2v", dict(
        op="wan22_ti2v_transformer", weights="wan22_ti2v_tiny/transformer", batch=b,
        latent_shape=list(TI2V_LATENT_SHAPE[1:]), token_grid=[t_lat, h_lat // 2, w_lat // 2], num_tokens=n_tok,
        num_txt_tokens=7, text_lengths=[7, 5], t=[TI2V_T, TI2V_T_ROW1],
        note="timestep [B, L] per token (row 0 = ti2v_timesteps.timestep[0], row 1 the same mask times 250.5); "
             "hidden_states = ti2v_mask.latent_model_input. diffusers' ndim-2 path: sinusoid of the flattened "
             "timesteps, temb = time_embedder [B, L, D] (before SiLU), timestep_proj = time_proj(SiLU(temb)) "
             "unflattened to [B, L, 6, D] (before the tables are added); block modulation table[None] + "
             "timestep_proj per token; output head shift, scale = rows 0, 1 of table[None] + temb[:, :, None]; "
             "context the text_embedder output; sample the unpatchified velocity [B, 8, 3, 4, 6]"),
        {"hidden_states": model_input, "timestep": ts, "encoder_hidden_states": ehs, "sample": sample,
         "temb": rec["temb"], "timestep_proj": rec["timestep_proj"], "context": rec["context"],
         "intermediate.block0.out": rec["block0.out"]})
    report["transformer_ti2v"] = dict(max_abs_sample=max_abs(sample), max_abs_temb=max_abs(rec["temb"]),
                                      f32_run_err=f32_err, uniform_vs_1d=uniform_diff)


def main():
    check_regroup_formulas()
    report = {}

    vae = init_vae22(AutoencoderKLWan22(VAE22_CONFIG), 2201).double().eval()
    got = {k: list(v.shape) for k, v in vae.state_dict().items()}
    want = expected_vae22_shapes(VAE22_CONFIG)
    assert got == want, sorted(set(got) ^ set(want))
    vae_dir = os.path.join(OUT_DIR, "wan22_vae_tiny")
    wan.save_model(vae_dir, VAE22_CONFIG, vae.state_dict())

    model = wan.init_transformer(WanTI2VTransformer3DModel(TI2V_TRANSFORMER_CONFIG), 2202).double().eval()
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert got == wan.expected_transformer_shapes(model.cfg), "module tree differs from diffusers'"
    tr_dir = os.path.join(OUT_DIR, "wan22_ti2v_tiny", "transformer")
    wan.save_model(tr_dir, TI2V_TRANSFORMER_CONFIG, model.state_dict())

    g = Goldens(2210, {
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_numpy_version": np.__version__,
        "_seed": "2210",
        "_diffusers_commit": DIFFUSERS_COMMIT,
        "_numerics": "models in float64 on f32 inputs and bf16-representable weights, results rounded to f32; "
                     "timestep sinusoid arguments and RoPE tables as an f32 diffusers run (make_wan_reference.py); "
                     "pipeline rules in f32 as the pipelines",
    })
    vae_cases(g, vae, report)
    ti2v_cases(g, model, report)
    path = os.path.join(OUT_DIR, "goldens_wan22.safetensors")
    g.write(path)

    total = 0
    for d in (vae_dir, tr_dir):
        for f in sorted(os.listdir(d)):
            p = os.path.join(d, f)
            total += os.path.getsize(p)
            print(f"{os.path.relpath(p, OUT_DIR)}: {os.path.getsize(p)} bytes")
    total += os.path.getsize(path)
    print(f"{os.path.relpath(path, OUT_DIR)}: {os.path.getsize(path)} bytes, {len(g.tensors)} tensors; "
          f"total {total} bytes")
    for k in sorted(g.tensors):
        t = g.tensors[k]
        print(f"  {k:<52} {str(list(t.shape)):<22} {max_abs(t):.6g}")
    wan.print_report(report)


if __name__ == "__main__":
    main()
