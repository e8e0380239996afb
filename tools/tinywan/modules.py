"""tinywan's networks in plain torch, with diffusers' parameter names where they are shipped.

  * WanTransformer3DModel, the AutoencoderKLWan decoder (post_quant_conv + decoder) and the
    FlowMatch scheduler come from tests/reference/make_wan_reference.py and make_flux_reference.py
    (written from the porting spec and checked against cubevec's port), imported here.
  * VideoEncoder: the encoder used to train the VAE. It is not Wan's encoder (a smaller, plain
    network that maps the same [B, 3, 1 + 4k, H, W] clip to the same [B, 2 z_dim, 1 + k, H/8, W/8]
    mean and log-variance) and it is not shipped: cubevec's text-to-video only decodes.
  * SnapshotEncoder: the same, each latent frame the code of one video frame (an experiment,
    train.py --encoder snapshot).
  * TinyTextEncoder: tinyflux's text encoder (tools/tinyflux/modules.py); Wan takes its sequence
    output as encoder_hidden_states and ignores the pooled one.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
# Both set torch's thread count to 1 and turn on determinism when imported; the callers reset the threads.
import make_wan_reference as wan  # noqa: E402
from make_flux_reference import FlowMatchEulerDiscreteScheduler  # noqa: E402,F401
from dataset import load_tinyflux  # noqa: E402

TinyTextEncoder = load_tinyflux("modules").TinyTextEncoder
TinyTextEncoder_CONFIG = load_tinyflux("modules").TEXT_ENCODER_CONFIG  # tinyflux's; train.py adapts it

WanTransformer3DModel = wan.WanTransformer3DModel
AutoencoderKLWanDecoder = wan.AutoencoderKLWanDecoder
unnormalize_latents = wan.unnormalize_latents


LOGVAR_OFFSET = 6.0
MEAN_BOUND = 4.0


def frame_convs(width):
    """The encoders' per-frame layers: three stride-2 3x3 convolutions (8x smaller), `width` wide."""
    w = width
    return [nn.Conv2d(3, w // 2, 3, padding=1), nn.SiLU(),
            nn.Conv2d(w // 2, w, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(w, w, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(w, w, 3, padding=1)]


def per_frame(net, x):
    """A 2-D network applied to every frame of x [B, C, T, H, W]: [B, C', T, H', W']."""
    b, c, t, h, w = x.shape
    y = net(x.transpose(1, 2).reshape(b * t, c, h, w))
    return y.reshape(b, t, *y.shape[1:]).transpose(1, 2)


class VideoEncoder(nn.Module):
    """[B, 3, 1 + 4k, H, W] -> (mean, logvar) [B, z_dim, 1 + k, H / 8, W / 8].

    (The first version's encoder; the shipped second version was trained with SnapshotEncoder.
    Commit e08a221 tried a time-stationary one with bounded means: its latents were far better
    behaved, consecutive latent frames correlating 0.90 against 0.57, but the model trained on them
    scored worse; see assets/tinywan/MODEL_CARD.md.)

    Each frame goes through three stride-2 3x3 convolutions (8x smaller); then, as the Wan VAE
    groups time, the first frame makes the first latent frame on its own and each later group of
    four frames makes one latent frame (a (4, 3, 3) convolution of stride 4 in time); a causal
    3x3x3 convolution mixes the latent frames and gives the mean and log-variance."""

    def __init__(self, z_dim, width=64):
        super().__init__()
        w = width
        self.frame = nn.Sequential(*frame_convs(w))
        self.first = nn.Conv3d(w, w, (1, 3, 3), padding=(0, 1, 1))
        self.group = nn.Conv3d(w, w, (4, 3, 3), stride=(4, 1, 1), padding=(0, 1, 1))
        self.out = nn.Conv3d(w, 2 * z_dim, 3, padding=(0, 1, 1))

    def forward(self, x):
        t = x.shape[2]
        assert (t - 1) % 4 == 0, f"{t} frames: expected 1 + 4k"
        f = per_frame(self.frame, x)  # [B, W, T, h, w]
        y = F.silu(torch.cat([self.first(f[:, :, :1]), self.group(f[:, :, 1:])], dim=2))
        y = self.out(F.pad(y, (0, 0, 0, 0, 2, 0)))  # causal in time: two zero frames in front
        mean, logvar = y.chunk(2, dim=1)
        # Posterior std starts near e^-3: the decoder's RMS norms make it blind to the latents'
        # scale, so a posterior that starts wide is never narrowed by the reconstruction loss.
        return mean, (logvar - LOGVAR_OFFSET).clamp(-30.0, 0.0)


class SnapshotEncoder(nn.Module):
    """[B, 3, 1 + 4k, H, W] -> (mean, logvar) [B, z_dim, 1 + k, H / 8, W / 8], each latent frame
    the code of one video frame: latent frame j encodes frame 4j alone (frame 0, then the last
    frame of each group of four Wan's VAE puts into one latent frame).

    Why: a latent frame made from four frames carries its own direction of motion, and trained on
    those latents the transformer read the direction from its input, never from the words (three
    recipes; MODEL_CARD.md). A snapshot only says where the shape is; which way it goes is in the
    words and in the neighbouring latent frames alone. Wan's decoder is causal in time, so it
    draws the three frames between two snapshots from both (the VAE is trained on all frames;
    24.7 dB on whole clips, the in-between frames within 1 dB of the snapshots). Measured
    (tw8, MODEL_CARD.md): the latents are as intended, but the transformer still ignores the
    direction words, even from a clean anchor frame.
    The means are soft-bounded to +-MEAN_BOUND (unbounded, the decoder's RMS norms let them grow
    heavy tails: max |z| 45 against a mean |z| of 2.4)."""

    def __init__(self, z_dim, width=64):
        super().__init__()
        w = width
        self.frame = nn.Sequential(*frame_convs(w), nn.SiLU(), nn.Conv2d(w, 2 * z_dim, 3, padding=1))

    def forward(self, x):
        t = x.shape[2]
        assert (t - 1) % 4 == 0, f"{t} frames: expected 1 + 4k"
        y = per_frame(self.frame, x[:, :, ::4])  # [B, 2 z_dim, 1 + k, h, w]
        mean, logvar = y.chunk(2, dim=1)
        mean = MEAN_BOUND * torch.tanh(mean / MEAN_BOUND)
        return mean, (logvar - LOGVAR_OFFSET).clamp(-30.0, 0.0)
