#!/usr/bin/python3
"""Trains cubevec's tiny text-to-video model from scratch and writes it in diffusers layout.

    nice -n 19 /usr/bin/python3 tools/tinywan/train.py [--out assets/tinywan] [--work /tmp/tinywan-work]

Debian's torch 1.13 on the CPU, two threads, fixed seeds (the same torch and numpy give the same
weights; threading may change the last bits). Stages:

  1. data:        a pool of POOL_SIZE captioned 17-frame clips rendered by dataset.py (seed 1).
  2. vae:         VideoEncoder (modules.py, training only) + the AutoencoderKLWan decoder (VAE_CONFIG)
                  on random 32x32 crops of the pool's clips, 9 frames long then 17; loss L1 + MSE +
                  KL_WEIGHT * KL.
                  latents_mean / latents_std are then the per-channel mean and std of the pool's
                  latents (Wan's convention: latents = (z - mean) / std).
  3. transformer: WanTransformer3DModel (TRANSFORMER_CONFIG) and TinyTextEncoder together, rectified
                  flow: x_t = (1 - t) x0 + t noise, target v = noise - x0, t = sigmoid(N(0, 1)) (with
                  --t-shift s: shifted as a scheduler of shift s shifts its sigmas), the model gets
                  the raw timestep 1000 t (as WanPipeline gives it), 10% empty captions (for CFG);
                  AdamW, warm-up then cosine decay, gradient clipping, an EMA of the weights.
  4. save:        the EMA weights rounded to bf16 and stored as BF16 (the C++ loader widens them to
                  f32), configs, tokenizer, scheduler, training_log.json (losses, wall and CPU time).
The defaults reproduce the shipped model (the second version, 2026-11-28: snapshot latents, patch
(5, 2, 2), width 384, shift 3, anchors, the shape weighted 3x; the first version was trained with
`--encoder grouped --vae-long-steps 800 --heads 4 --ffn 384 --time-patch 1 --steps 4000 --batch 32
--t-shift 1 --anchor-fraction 0 --foreground-weight 1`). --encoder, --heads, --layers, --ffn,
--patch, --time-patch, --t-shift, --anchor-fraction (frame_noise_levels), --foreground-weight
(foreground_weights) and --freeze-text-encoder are for experiments (the model card lists those tried).
"""
import argparse
import copy
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import modules as M  # noqa: E402

POOL_SIZE = 8000
DIFFUSERS_VERSION = "0.35.0"
Z_DIM = 16
VAE_CONFIG = {
    "_class_name": "AutoencoderKLWan",
    "_diffusers_version": DIFFUSERS_VERSION,
    "attn_scales": [],
    "base_dim": 8,
    "decoder_base_dim": None,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "in_channels": 3,
    "is_residual": False,
    "latents_mean": None,  # filled in after training
    "latents_std": None,
    "num_res_blocks": 1,
    "out_channels": 3,
    "patch_size": None,
    "scale_factor_spatial": 8,
    "scale_factor_temporal": 4,
    "temperal_downsample": [False, True, True],
    "z_dim": Z_DIM,
}
KL_WEIGHT = 1e-4
VAE_LR = 1e-3
TRANSFORMER_CONFIG = {
    "_class_name": "WanTransformer3DModel",
    "_diffusers_version": DIFFUSERS_VERSION,
    "added_kv_proj_dim": None,
    "attention_head_dim": 32,
    "cross_attn_norm": True,
    "eps": 1e-06,
    "ffn_dim": 1536,
    "freq_dim": 64,
    "image_dim": None,
    "in_channels": Z_DIM,
    "num_attention_heads": 12,
    "num_layers": 4,
    "out_channels": Z_DIM,
    "patch_size": [5, 2, 2],  # one token holds the 5 latent frames of its place (time_patch_note)
    "pos_embed_seq_len": None,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 64,
}
# tinyflux's text encoder with this vocabulary and length; Wan does not use the pooled head.
TEXT_ENCODER_CONFIG = dict(M.TinyTextEncoder_CONFIG, vocab_size=len(dataset.VOCAB),
                           max_position_embeddings=dataset.MAX_LENGTH, pooled_projection_dim=1)
SCHEDULER_CONFIG = M.wan.SCHEDULER_CONFIG  # FlowMatch Euler with Wan's static shift 3, as the Wan reference's
TOKENIZER_CONFIG = {
    "tokenizer_class": "CubevecWordTokenizer",
    "model_max_length": dataset.MAX_LENGTH,
    "pad_token": dataset.PAD,
    "do_lower_case": True,
    "separators": ",.;:!?",
    "note": "word-level: lower-case, the separators become spaces, split on whitespace, one id per word from "
            "vocab.json, pad with pad_token to model_max_length; an unknown word is an error",
}
# What `cubevec t2v --model assets/tinywan` renders when --width, --height, --frames, --steps or
# --guidance are not given (the Wan2.1 defaults would be 832x480, 81 frames).
GENERATION_DEFAULTS = {"width": dataset.SIZE, "height": dataset.SIZE, "frames": dataset.FRAMES, "steps": 30,
                       "guidance": 5.0}
CAPTION_DROPOUT = 0.1
EMA_DECAY = 0.998
MODULATION = ("scale_shift_table", "proj_out")
ANCHOR_MAX = 0.5  # an anchor frame's noise level is at most this fraction of the others' (frame_noise_levels)
LATENT_FRAMES = 1 + (dataset.FRAMES - 1) // 4
# time_patch_note: with a temporal patch of 1 (as Wan), a token knows its frame only through RoPE,
# which is relative. On snapshot latents (every latent frame alike) the model came out symmetric
# under time reversal (the velocity of a clip played backwards is the reversed velocity to 2e-4 of
# its size, against 0.05 for a left-right mirror; probe_words.py reversal, MODEL_CARD.md), and a
# model blind to the order of its frames cannot tell "left" from "right" or "growing" from
# "shrinking". --time-patch LATENT_FRAMES puts all latent frames of one place in one token: each
# frame then has its own patch-embedding and output weights.


# The helpers tinyflux's trainer already has: a timestamped log, rounding to bf16, saving a module as
# BF16 safetensors with its config, JSON files, the warm-up + cosine learning rate, PSNR in dB.
_flux_train = dataset.load_tinyflux("train")
log, bf16_round_, save, write_json, lr_at, psnr = (_flux_train.log, _flux_train.bf16_round_, _flux_train.save,
                                                    _flux_train.write_json, _flux_train.lr_at, _flux_train.psnr)


def as_float(videos):
    return torch.from_numpy(videos).float() / 127.5 - 1.0


# ---------------------------------------------------------------------------------------------
# Stage 2: the VAE
# ---------------------------------------------------------------------------------------------
ENCODERS = {"grouped": M.VideoEncoder, "snapshot": M.SnapshotEncoder}


class VideoVae(torch.nn.Module):
    def __init__(self, encoder="grouped"):
        super().__init__()
        self.encoder = ENCODERS[encoder](Z_DIM)
        self.decoder = M.AutoencoderKLWanDecoder(VAE_CONFIG)

    def reconstruct(self, x, sample=True):
        mean, logvar = self.encoder(x)
        z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean) if sample else mean
        return self.decoder.decode_whole(z), mean, logvar


def load_vae_phase(vae, path, encoder):
    """Loads a VAE phase cached by an earlier run into vae and returns what was saved. Raises
    ValueError when the cache was trained with another --encoder (caches without the key came
    before the option and hold the grouped encoder)."""
    saved = torch.load(path)
    trained_with = saved.get("encoder", "grouped")
    if trained_with != encoder:
        raise ValueError(f"{path}: a VAE trained with --encoder {trained_with}, not {encoder}")
    vae.load_state_dict(saved["state"])
    return saved


def train_vae(vae, videos, val, steps, batch, frames, seed, history):
    """One phase: `steps` of Adam (warm-up, cosine) on random 32x32 crops of `frames` frames. The
    networks are convolutional (the decoder's mid-block attention works per frame on any size), so
    a quarter of the pixels costs a quarter; but the causal convolutions stack up a long reach in
    time, so the last phase sees whole clips' length (trained on 9 frames only, the decoder's
    latent frames 3 and 4 come out at 10 dB: it learns where the zero padding is)."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(vae.parameters(), lr=VAE_LR)
    t0, acc = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, VAE_LR, 100)
        idx = rng.integers(len(videos), size=batch)
        last = dataset.FRAMES - frames + 1
        ox, oy, ot = rng.integers(0, 33, size=batch), rng.integers(0, 33, size=batch), rng.integers(0, last, size=batch)
        x = as_float(np.stack([videos[i, :, t:t + frames, y:y + 32, xx:xx + 32] for i, xx, y, t in zip(idx, ox, oy, ot)]))
        rec, mean, logvar = vae.reconstruct(x)
        kl = 0.5 * (mean ** 2 + logvar.exp() - 1 - logvar).mean()
        loss = (rec - x).abs().mean() + ((rec - x) ** 2).mean() + KL_WEIGHT * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        acc.append(float(loss))
        if (step + 1) % 50 == 0 or step + 1 == steps:
            with torch.no_grad():
                xv = as_float(val[:8])
                p = psnr(vae.reconstruct(xv, sample=False)[0], xv)
            entry = dict(frames=frames, step=step + 1, loss=float(np.mean(acc)), kl=float(kl), val_psnr_db=p,
                         seconds=time.time() - t0)
            history.append(entry)
            rate = (step + 1) / entry["seconds"]
            log(f"vae ({frames} frames) step {step + 1}/{steps}: loss {entry['loss']:.4f}, kl {float(kl):.3f}, val PSNR {p:.2f} dB, "
                f"{rate:.2f} steps/s, ETA {(steps - step - 1) / rate / 60:.1f} min")
            acc = []
    return vae.eval()


def latent_stats(lat_mean, ch_mean, ch_std):
    """What decides whether the transformer can learn motion, measured before it is trained: how
    far the normalized latents reach (the shipped VAE's: max |z| about 45 against a mean of 2.4)
    and how alike consecutive latent frames are (the background stands still; the shipped VAE's
    correlate about 0.57). Better figures alone did not make motion learnable (MODEL_CARD.md)."""
    shape = (1, Z_DIM, 1, 1, 1)
    x = (lat_mean - torch.tensor(ch_mean).view(shape)) / torch.tensor(ch_std).view(shape)
    a, b = x[:, :, :-1].flatten(), x[:, :, 1:].flatten()
    a, b = a - a.mean(), b - b.mean()
    corr = float((a * b).mean() / (a.std() * b.std()))
    return dict(max_abs=float(x.abs().max()), mean_abs=float(x.abs().mean()), consecutive_frame_correlation=corr)


@torch.no_grad()
def encode_pool(vae, videos):
    means, stds = [], []
    for i in range(0, len(videos), 64):
        mean, logvar = vae.encoder(as_float(videos[i:i + 64]))
        means.append(mean)
        stds.append(torch.exp(0.5 * logvar))
    return torch.cat(means), torch.cat(stds)


# ---------------------------------------------------------------------------------------------
# Stage 3: transformer + text encoder
# ---------------------------------------------------------------------------------------------
def init_transformer(model):
    """PyTorch's default init, then adaLN-zero-like: the output head starts at 0."""
    with torch.no_grad():
        model.proj_out.weight.zero_()
        model.proj_out.bias.zero_()
    return model


def training_timesteps(batch, shift):
    """t = sigmoid(N(0, 1)) (logit-normal), then shifted as a scheduler shifts its sigmas
    (shift t / (1 + (shift - 1) t); shift 1 leaves t as it is). Shift 3 makes training see the
    noise levels in the proportions Wan's shift-3 sampling visits them: half the sampling steps are
    above sigma 0.75, where unshifted logit-normal training puts only 16% of its samples."""
    t = torch.sigmoid(torch.randn(batch))
    return shift * t / (1 + (shift - 1) * t)


def frame_noise_levels(t, frames, anchor_fraction, rng):
    """Per latent frame noise levels [B, 1, F, 1, 1] and loss weights for the timesteps t [B].

    Without anchors every frame is at t. With probability anchor_fraction an example gets an
    anchor: one latent frame, drawn at random, noised only to t * U(0, ANCHOR_MAX) and left out of
    the loss. Why: the transformer's positions are rotary (relative) only, so from frames all at
    one noise level it cannot tell the first latent frame from the last, and a noised clip shows
    its own direction whenever the text could tell it; trained that way, three recipes left the
    direction to the noise (same seed, same displacement for all four direction words). From an
    anchor the direction towards the other frames is in the words alone. The target noise - x0
    does not depend on t, and the model still gets the timestep of the noisy frames, so the
    architecture and the sampler are Wan's, unchanged."""
    batch = t.shape[0]
    tt = t.view(batch, 1, 1, 1, 1).repeat(1, 1, frames, 1, 1)
    weight = torch.ones_like(tt)
    if anchor_fraction > 0:  # no draws at 0: the first version's random stream stays as it was
        anchored = rng.random(batch) < anchor_fraction
        anchor, scale = rng.integers(frames, size=batch), rng.uniform(0.0, ANCHOR_MAX, size=batch)
        for b in np.nonzero(anchored)[0]:
            tt[b, 0, anchor[b]] = t[b] * float(scale[b])
            weight[b, 0, anchor[b]] = 0.0
    return tt, weight


def foreground_weights(videos, weight):
    """Loss weights [B, 1, F, h, w] of latent tokens: `weight` where the shape is in any frame of the
    token's group (frame 0 alone, then groups of four, as the VAE groups time), 1 elsewhere. The
    background fills most of the latent, so an unweighted loss barely notices a shape drawn at
    the wrong place or moving the wrong way (the words for direction and shape came out with no
    effect on the prediction; MODEL_CARD.md)."""
    v = videos.astype(np.int16)
    shape = (np.abs(v - v[:, :, :1, :1, :1]).max(axis=1) > 30)  # [B, T, H, W]; the corner is background
    groups = [shape[:, :1]] + [shape[:, t:t + 4] for t in range(1, shape.shape[1], 4)]
    g = np.stack([x.any(axis=1) for x in groups], axis=1)  # [B, F, H, W]
    b, f, h, w = g.shape
    g = g.reshape(b, f, h // 8, 8, w // 8, 8).any(axis=(3, 5))
    return torch.from_numpy(1.0 + (weight - 1.0) * g.astype(np.float32))[:, None]


def train_transformer(clips, lat_mean, lat_std, ch_mean, ch_std, config, steps, batch, history, lr, shift,
                      anchor_fraction, videos=None, foreground_weight=1.0, freeze_text=False, save_every=0,
                      on_checkpoint=None):
    """Returns the EMA and the last weights of the transformer and the text encoder. With save_every
    N, on_checkpoint(step, ema_transformer, ema_text) after every N steps but the last (it gets the
    live EMA modules: copy before changing them)."""
    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    model = init_transformer(M.WanTransformer3DModel(config))
    text = M.TinyTextEncoder(TEXT_ENCODER_CONFIG)
    # Frozen at its random start, the text encoder's words stay as far apart as they began (trained
    # with the transformer, the direction and shape words collapsed together; MODEL_CARD.md).
    text.requires_grad_(not freeze_text)
    params = list(model.parameters()) + ([] if freeze_text else list(text.parameters()))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    ema_model, ema_text = copy.deepcopy(model), copy.deepcopy(text)
    ema_params = list(ema_model.parameters()) + ([] if freeze_text else list(ema_text.parameters()))
    shape = (1, Z_DIM, 1, 1, 1)
    mean_c, std_c = torch.tensor(ch_mean).view(shape), torch.tensor(ch_std).view(shape)
    t0, acc = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, 200)
        idx = rng.integers(len(clips), size=batch)
        captions = ["" if rng.random() < CAPTION_DROPOUT else dataset.caption(clips[i], rng) for i in idx]
        ids = torch.from_numpy(np.stack([dataset.tokenize(c) for c in captions]))
        z = lat_mean[idx] + lat_std[idx] * torch.randn(batch, *lat_mean.shape[1:])
        x0 = (z - mean_c) / std_c
        noise = torch.randn_like(x0)
        t = training_timesteps(batch, shift)
        tt, weight = frame_noise_levels(t, x0.shape[2], anchor_fraction, rng)
        if foreground_weight != 1.0:
            weight = weight * foreground_weights(videos[idx], foreground_weight)
        xt = (1 - tt) * x0 + tt * noise
        seq, _ = text(ids)
        v = model(xt, t * 1000, seq)
        if anchor_fraction == 0 and foreground_weight == 1.0:
            loss = F.mse_loss(v, noise - x0)  # the first version's recipe, bit for bit as it was trained
        else:
            loss = (weight * (v - (noise - x0)) ** 2).sum() / (weight.expand_as(x0[:, :1]).sum() * x0.shape[1])
        acc = _flux_train.optimizer_step(loss, opt, params, ema_params, step, steps, acc, history, t0, EMA_DECAY)
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            on_checkpoint(step + 1, ema_model, ema_text)
    return ema_model.eval(), ema_text.eval(), model.eval(), text.eval()


def write_model(out, transformer, text, vae, transformer_config, vae_config):
    """A tinywan folder in diffusers layout; the decode path of the VAE (post_quant_conv + decoder) is
    what cubevec runs. The modules are written as they are (bf16_round_ them first)."""
    save(transformer, os.path.join(out, "transformer"), "diffusion_pytorch_model.safetensors", transformer_config)
    save(vae.decoder, os.path.join(out, "vae"), "diffusion_pytorch_model.safetensors", vae_config)
    save(text, os.path.join(out, "text_encoder"), "model.safetensors", TEXT_ENCODER_CONFIG)
    write_json(os.path.join(out, "scheduler", "scheduler_config.json"), SCHEDULER_CONFIG)
    write_json(os.path.join(out, "tokenizer", "vocab.json"), dataset.WORD_ID)
    write_json(os.path.join(out, "tokenizer", "tokenizer_config.json"), TOKENIZER_CONFIG)
    write_json(os.path.join(out, "generation_defaults.json"), GENERATION_DEFAULTS)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(M.ROOT, "assets", "tinywan"))
    p.add_argument("--work", default="/tmp/tinywan-work", help="caches the trained VAE and the last weights")
    p.add_argument("--pool", type=int, default=POOL_SIZE)
    p.add_argument("--vae-steps", type=int, default=1200, help="VAE steps on 9-frame crops")
    p.add_argument("--vae-long-steps", type=int, default=1200, help="VAE steps on whole-length (17-frame) crops")
    p.add_argument("--vae-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1500, help="transformer steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--heads", type=int, default=TRANSFORMER_CONFIG["num_attention_heads"],
                   help="transformer heads of 32 channels (the width is 32 heads)")
    p.add_argument("--layers", type=int, default=TRANSFORMER_CONFIG["num_layers"])
    p.add_argument("--ffn", type=int, default=TRANSFORMER_CONFIG["ffn_dim"])
    p.add_argument("--patch", type=int, default=TRANSFORMER_CONFIG["patch_size"][1], help="spatial patch size (1, 2 or 4)")
    p.add_argument("--time-patch", type=int, default=TRANSFORMER_CONFIG["patch_size"][0],
                   help=f"temporal patch size: 1 (as Wan) or {LATENT_FRAMES} (one token holds every latent frame of its "
                        "place, so each frame has its own input and output weights; see time_patch_note)")
    p.add_argument("--t-shift", type=float, default=3.0,
                   help="shift of the training timesteps (1: plain logit-normal, as the first version)")
    p.add_argument("--anchor-fraction", type=float, default=0.5,
                   help="fraction of training examples with one nearly clean latent frame (frame_noise_levels)")
    p.add_argument("--foreground-weight", type=float, default=3.0,
                   help="loss weight of the latent tokens the shape covers (foreground_weights; 1: unweighted)")
    p.add_argument("--freeze-text-encoder", action="store_true",
                   help="keep the text encoder at its random initialization (experiment)")
    p.add_argument("--encoder", choices=sorted(ENCODERS), default="snapshot",
                   help="the VAE's training encoder: snapshot (one frame per latent frame; modules.SnapshotEncoder, "
                        "the shipped model) or grouped (four frames per latent frame, as the first version)")
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="also write the EMA weights every N transformer steps to OUT/step_N (a tinywan folder each, "
                        "for probing when the words take hold; 0: only the final model)")
    p.add_argument("--reuse-vae", action="store_true", help="reuse the VAE in --work from an earlier run")
    p.add_argument("--vae-only", action="store_true",
                   help="stop after the VAE and its latent statistics (with --reuse-vae, a later run goes on from there)")
    args = p.parse_args()
    # Checked before the data and the VAE take their minutes.
    if not (math.isfinite(args.t_shift) and args.t_shift > 0):
        p.error(f"--t-shift {args.t_shift}: expected a finite positive number")
    for flag, value in (("--heads", args.heads), ("--layers", args.layers), ("--ffn", args.ffn)):
        if value < 1:
            p.error(f"{flag} {value}: expected a positive integer")
    if args.save_every < 0:
        p.error(f"--save-every {args.save_every}: expected 0 (off) or a positive number of steps")
    if not 0.0 <= args.anchor_fraction <= 1.0:
        p.error(f"--anchor-fraction {args.anchor_fraction}: expected a number from 0 to 1")
    if not (math.isfinite(args.foreground_weight) and args.foreground_weight > 0):
        p.error(f"--foreground-weight {args.foreground_weight}: expected a finite positive number")
    if args.patch not in (1, 2, 4):
        p.error(f"--patch {args.patch}: expected 1, 2 or 4")
    if args.time_patch not in (1, LATENT_FRAMES):
        p.error(f"--time-patch {args.time_patch}: expected 1 or {LATENT_FRAMES} (it must divide the {LATENT_FRAMES} latent frames)")
    transformer_config = dict(TRANSFORMER_CONFIG, num_attention_heads=args.heads, num_layers=args.layers, ffn_dim=args.ffn,
                              patch_size=[args.time_patch, args.patch, args.patch])
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.work, exist_ok=True)
    start, cpu_start = time.time(), time.process_time()
    log_doc = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__, numpy=np.__version__,
                   threads=torch.get_num_threads(), pool_size=args.pool, vae_steps=args.vae_steps,
                   vae_long_steps=args.vae_long_steps, vae_batch=args.vae_batch, transformer_steps=args.steps, batch=args.batch, lr=args.lr,
                   transformer_config=transformer_config, t_shift=args.t_shift,
                   anchor_fraction=args.anchor_fraction, anchor_max=ANCHOR_MAX, foreground_weight=args.foreground_weight,
                   freeze_text_encoder=args.freeze_text_encoder, encoder=args.encoder, vae=[],
                   transformer=[])

    # 1. data
    clips, videos = dataset.make_pool(args.pool, seed=1)
    _, val = dataset.make_pool(32, seed=99)
    log(f"pool of {len(clips)} clips rendered ({time.time() - start:.0f} s)")

    # 2. VAE
    # Two phases, 9 then 17 frames; each phase's result is cached in --work (--reuse-vae resumes).
    t_vae, reused_seconds = time.time(), 0.0
    torch.manual_seed(2)
    vae = VideoVae(args.encoder)
    for phase, (steps, frames) in enumerate([(args.vae_steps, 9), (args.vae_long_steps, dataset.FRAMES)]):
        path = os.path.join(args.work, f"vae_phase{phase + 1}.pt")
        if args.reuse_vae and os.path.exists(path):
            try:
                saved = load_vae_phase(vae, path, args.encoder)
            except ValueError as e:
                p.error(f"--reuse-vae: {e}")
            log_doc["vae"] = saved["history"]
            reused_seconds += saved["history"][-1]["seconds"]
            log(f"reusing {path} (its phase took {saved['history'][-1]['seconds']:.0f} s)")
            continue
        if phase > 0:
            torch.manual_seed(2 + phase)
        train_vae(vae, videos, val, steps, args.vae_batch, frames, 2 + phase, log_doc["vae"])
        torch.save({"state": vae.state_dict(), "history": log_doc["vae"], "encoder": args.encoder}, path)
    vae.eval()
    bf16_round_(vae)
    lat_mean, lat_std = encode_pool(vae, videos)
    ch_mean = [round(float(v), 4) for v in lat_mean.mean(dim=(0, 2, 3, 4))]
    # A channel the encoder left unused has no spread: 0.01 keeps its normalization finite.
    ch_std = [round(max(float(v), 0.01), 4) for v in lat_mean.std(dim=(0, 2, 3, 4))]
    vae_config = dict(VAE_CONFIG, latents_mean=ch_mean, latents_std=ch_std)
    with torch.no_grad():
        xv = as_float(val)
        vae_psnr = psnr(vae.reconstruct(xv, sample=False)[0], xv)
    # Wall time of the VAE phases as they ran (a reused phase counts the time it took when trained).
    log_doc["vae_seconds"] = time.time() - t_vae + reused_seconds
    log_doc["vae_val_psnr_db_bf16"] = vae_psnr
    log_doc["latents"] = latent_stats(lat_mean, ch_mean, ch_std)
    log(f"VAE: {log_doc['vae_seconds']:.0f} s, val PSNR {vae_psnr:.2f} dB (bf16 weights, 32 whole clips), "
        f"posterior std mean {float(lat_std.mean()):.4f}, normalized latents {log_doc['latents']}")
    if args.vae_only:
        return

    # 3. transformer + text encoder
    t_tr = time.time()

    def checkpoint(step, ema_transformer, ema_text):
        copies = [copy.deepcopy(m).eval() for m in (ema_transformer, ema_text)]
        for m in copies:
            bf16_round_(m)
        write_model(os.path.join(args.out, f"step_{step}"), *copies, vae, transformer_config, vae_config)
        log(f"wrote {os.path.join(args.out, f'step_{step}')}")

    transformer, text, raw_transformer, raw_text = train_transformer(
        clips, lat_mean, lat_std, ch_mean, ch_std, transformer_config, args.steps, args.batch, log_doc["transformer"], args.lr,
        args.t_shift, args.anchor_fraction, videos, args.foreground_weight, args.freeze_text_encoder, args.save_every,
        checkpoint)
    log_doc["transformer_seconds"] = time.time() - t_tr
    torch.save({"transformer": raw_transformer.state_dict(), "text": raw_text.state_dict()}, os.path.join(args.work, "raw.pt"))
    for m in (transformer, text):
        bf16_round_(m)

    # 4. save
    out = args.out
    write_model(out, transformer, text, vae, transformer_config, vae_config)
    log_doc["reused_vae_seconds"] = reused_seconds
    log_doc["total_training_seconds"] = time.time() - start + reused_seconds
    log_doc["total_cpu_seconds"] = time.process_time() - cpu_start
    log(f"training done in {log_doc['total_training_seconds'] / 60:.1f} min wall (VAE {log_doc['vae_seconds'] / 60:.1f}, "
        f"transformer {log_doc['transformer_seconds'] / 60:.1f}), {log_doc['total_cpu_seconds'] / 60:.1f} min CPU")
    write_json(os.path.join(out, "training_log.json"), log_doc)


if __name__ == "__main__":
    main()
