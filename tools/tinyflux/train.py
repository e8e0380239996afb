#!/usr/bin/python3
"""Trains cubevec's tiny text-to-image model from scratch and writes it in diffusers layout.

    nice -n 19 /usr/bin/python3 tools/tinyflux/train.py [--out assets/tinyflux] [--work /tmp/tinyflux-work]

Debian's torch 1.13 on the CPU, two threads, fixed seeds (the same torch and numpy give the same
weights; threading may change the last bits). Stages:

  1. data:        a pool of POOL_SIZE captioned scenes rendered by dataset.py (seed 1).
  2. vae:         AutoencoderKL (encoder + decoder, VAE_CONFIG) on random 32x32 crops of the pool's
                  pictures; loss L1 + MSE + KL_WEIGHT * KL. shift_factor / scaling_factor are
                  then the mean and 1 / std of the pool's latents (Flux's convention:
                  latents = (z - shift) * scale).
  3. transformer: FluxTransformer2DModel (TRANSFORMER_CONFIG) and TinyTextEncoder (modules.py)
                  together, rectified flow: x_t = (1 - t) x0 + t noise, target v = noise - x0 (the
                  pipeline's Euler step x + (sigma_next - sigma) v walks from noise at sigma = 1 to x0
                  at 0), t = sigmoid(N(0, 1)) (logit-normal), captions with attributes left out at
                  random and 10% empty captions (for true CFG); AdamW, warm-up then cosine decay,
                  gradient clipping, an EMA of the weights (decay EMA_DECAY); of the EMA and the
                  last weights the one with the better semantic accuracy on seeds 100..103 is saved.
  4. save:        every tensor rounded to bf16 and stored as BF16 (the C++ loader widens it to f32;
                  the PyTorch sampler uses the same rounded values), configs, tokenizer, scheduler,
                  training_log.json; then a semantic evaluation with the saved weights.
"""
import argparse
import copy
import json
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
import sample as S  # noqa: E402
import evaluate as E  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

POOL_SIZE = 20000
VAE_CONFIG = {
    "_class_name": "AutoencoderKL",
    "_diffusers_version": "0.30.0",
    "act_fn": "silu",
    "block_out_channels": [16, 32, 32],
    "down_block_types": ["DownEncoderBlock2D"] * 3,
    "force_upcast": True,
    "in_channels": 3,
    "latent_channels": 4,
    "latents_mean": None,
    "latents_std": None,
    "layers_per_block": 1,
    "mid_block_add_attention": False,
    "norm_num_groups": 8,
    "out_channels": 3,
    "sample_size": 64,
    "scaling_factor": None,  # filled in after training
    "shift_factor": None,
    "up_block_types": ["UpDecoderBlock2D"] * 3,
    "use_post_quant_conv": False,
    "use_quant_conv": False,
}
KL_WEIGHT = 1e-4
TRANSFORMER_CONFIG = {
    "_class_name": "FluxTransformer2DModel",
    "_diffusers_version": "0.30.0",
    "attention_head_dim": 32,
    "axes_dims_rope": [8, 12, 12],
    "guidance_embeds": False,
    "in_channels": 16,
    "joint_attention_dim": 64,
    "num_attention_heads": 6,
    "num_layers": 2,
    "num_single_layers": 2,
    "out_channels": None,
    "patch_size": 1,
    "pooled_projection_dim": 64,
}
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.30.0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": False,
}
TOKENIZER_CONFIG = {
    "_class_name": "CubevecWordTokenizer",
    "model_max_length": dataset.MAX_LENGTH,
    "pad_token": dataset.PAD,
    "do_lower_case": True,
    "separators": ",.;:!?",
    "note": "word-level: lower-case, the separators become spaces, split on whitespace, one id per word from "
            "vocab.json, pad with pad_token to model_max_length; an unknown word is an error",
}
CAPTION_DROPOUT = 0.1
EMA_DECAY = 0.998
SELECTION_SEED = 777
MODULATION = ("norm1.linear", "norm1_context.linear", "norm.linear", "norm_out.linear")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def bf16_round_(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def save(module, directory, filename, config=None, config_name="config.json"):
    os.makedirs(directory, exist_ok=True)
    if config is not None:
        with open(os.path.join(directory, config_name), "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().contiguous().to(torch.bfloat16) for k, v in module.state_dict().items()}
    write_safetensors(os.path.join(directory, filename), tensors, {"format": "pt"})


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------------
# Stage 2: the VAE
# ---------------------------------------------------------------------------------------------
def psnr(a, b):
    """PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = float(((a.clamp(-1, 1) - b) ** 2).mean())
    return 10 * math.log10(4.0 / max(mse, 1e-12))


def train_vae(images, val, steps, history):
    torch.manual_seed(2)
    rng = np.random.default_rng(2)
    vae = M.AutoencoderKL(VAE_CONFIG)
    opt = torch.optim.Adam(vae.parameters(), lr=2e-3)
    t0, acc = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 2e-3, 100)
        # 32 random 32x32 crops: the network is fully convolutional (no mid-block attention), and a
        # quarter of the pixels costs a quarter of the time; validation is on whole pictures.
        idx = rng.integers(len(images), size=32)
        ox, oy = rng.integers(0, 33, size=32), rng.integers(0, 33, size=32)
        x = torch.from_numpy(np.stack([images[i, :, y:y + 32, xx:xx + 32] for i, xx, y in zip(idx, ox, oy)]))
        x = x.float() / 127.5 - 1.0
        mean, logvar = vae.encode(x)
        z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        rec = vae.decode(z)
        kl = 0.5 * (mean ** 2 + logvar.exp() - 1 - logvar).mean()
        loss = (rec - x).abs().mean() + ((rec - x) ** 2).mean() + KL_WEIGHT * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        acc.append(float(loss))
        if (step + 1) % 100 == 0 or step + 1 == steps:
            with torch.no_grad():
                xv = torch.from_numpy(val[:64]).float() / 127.5 - 1.0
                p = psnr(vae.decode(vae.encode(xv)[0]), xv)
            entry = dict(step=step + 1, loss=float(np.mean(acc)), kl=float(kl), val_psnr_db=p, seconds=time.time() - t0)
            history.append(entry)
            log(f"vae step {step + 1}/{steps}: loss {entry['loss']:.4f}, kl {float(kl):.3f}, val PSNR {p:.2f} dB")
            acc = []
    return vae.eval()


@torch.no_grad()
def encode_pool(vae, images):
    means, stds = [], []
    for i in range(0, len(images), 256):
        x = torch.from_numpy(images[i:i + 256]).float() / 127.5 - 1.0
        mean, logvar = vae.encode(x)
        means.append(mean)
        stds.append(torch.exp(0.5 * logvar))
    return torch.cat(means), torch.cat(stds)


# ---------------------------------------------------------------------------------------------
# Stage 3: transformer + text encoder
# ---------------------------------------------------------------------------------------------
def init_transformer(model):
    """PyTorch's default init, then adaLN-zero: the modulation linears and proj_out start at 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.rsplit(".", 1)[0]
            if module.endswith(MODULATION) or module == "proj_out":
                p.zero_()
    return model


def optimizer_step(loss, opt, params, ema_params, step, steps, acc, history, t0, ema_decay):
    """The transformer stage's step: backward, gradients clipped at norm 1, the optimizer, the EMA
    (its decay warms up to ema_decay); every 100 steps the mean loss goes to `history` and the log.
    Returns the losses not yet logged."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    decay = min(ema_decay, (1 + step) / (10 + step))
    with torch.no_grad():
        for e, p in zip(ema_params, params):
            e.mul_(decay).add_(p, alpha=1 - decay)
    acc = acc + [float(loss)]
    if (step + 1) % 100 == 0 or step + 1 == steps:
        entry = dict(step=step + 1, loss=float(np.mean(acc)), seconds=time.time() - t0)
        history.append(entry)
        rate = (step + 1) / entry["seconds"]
        log(f"transformer step {step + 1}/{steps}: loss {entry['loss']:.4f}, {rate:.2f} steps/s, "
            f"ETA {(steps - step - 1) / rate / 60:.1f} min")
        acc = []
    return acc


def train_transformer(scenes, lat_mean, lat_std, shift, scale, steps, batch, history, lr=1e-3):
    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    model = init_transformer(M.FluxTransformer2DModel(TRANSFORMER_CONFIG))
    text = M.TinyTextEncoder(M.TEXT_ENCODER_CONFIG)
    params = list(model.parameters()) + list(text.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    ema_model, ema_text = copy.deepcopy(model), copy.deepcopy(text)
    ema_params = list(ema_model.parameters()) + list(ema_text.parameters())
    lh, lw = lat_mean.shape[2], lat_mean.shape[3]
    img_ids, txt_ids = M.latent_image_ids(lh, lw), torch.zeros(dataset.MAX_LENGTH, 3)
    t0, acc = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, 200)
        idx = rng.integers(len(scenes), size=batch)
        captions = ["" if rng.random() < CAPTION_DROPOUT else dataset.caption(scenes[i], rng) for i in idx]
        ids = torch.from_numpy(np.stack([dataset.tokenize(c) for c in captions]))
        z = lat_mean[idx] + lat_std[idx] * torch.randn(batch, *lat_mean.shape[1:])
        x0 = (z - shift) * scale
        noise = torch.randn_like(x0)
        t = torch.sigmoid(torch.randn(batch))
        xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
        seq, pooled = text(ids)
        v = model(M.pack_latents(xt), seq, pooled, t, img_ids, txt_ids)
        loss = F.mse_loss(v, M.pack_latents(noise - x0))
        acc = optimizer_step(loss, opt, params, ema_params, step, steps, acc, history, t0, EMA_DECAY)
    return ema_model.eval(), ema_text.eval(), model.eval(), text.eval()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(M.ROOT, "assets", "tinyflux"))
    p.add_argument("--work", default="/tmp/tinyflux-work", help="caches the pool and the trained VAE")
    p.add_argument("--vae-steps", type=int, default=1800)
    p.add_argument("--steps", type=int, default=4000, help="transformer steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--reuse-vae", action="store_true", help="reuse the VAE in --work from an earlier run")
    args = p.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.work, exist_ok=True)
    start, cpu_start = time.time(), time.process_time()
    log_doc = dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__, numpy=np.__version__,
                   threads=torch.get_num_threads(), pool_size=POOL_SIZE, vae_steps=args.vae_steps,
                   transformer_steps=args.steps, batch=args.batch, lr=args.lr, vae=[], transformer=[])

    # 1. data
    scenes, images = dataset.make_pool(POOL_SIZE, seed=1)
    images = np.round((images + 1) * 127.5).astype(np.uint8)  # 240 MB as float; keep bytes
    _, val = dataset.make_pool(256, seed=99)
    val = np.round((val + 1) * 127.5).astype(np.uint8)
    log(f"pool of {len(scenes)} pictures rendered ({time.time() - start:.0f} s)")

    # 2. VAE
    vae_path = os.path.join(args.work, "vae.pt")
    t_vae = time.time()
    if args.reuse_vae and os.path.exists(vae_path):
        saved = torch.load(vae_path)
        vae = M.AutoencoderKL(VAE_CONFIG)
        vae.load_state_dict(saved["state"])
        vae.eval()
        log_doc["vae"] = saved["history"]
        log("reusing " + vae_path)
    else:
        vae = train_vae(images, val, args.vae_steps, log_doc["vae"])
        torch.save({"state": vae.state_dict(), "history": log_doc["vae"]}, vae_path)
    bf16_round_(vae)
    lat_mean, lat_std = encode_pool(vae, images)
    shift = float(lat_mean.mean())
    scale = float(1.0 / lat_mean.std())
    vae_config = dict(VAE_CONFIG, shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
    with torch.no_grad():
        xv = torch.from_numpy(val).float() / 127.5 - 1.0
        vae_psnr = psnr(vae.decode(vae.encode(xv)[0]), xv)
    log_doc["vae_seconds"] = time.time() - t_vae
    log_doc["vae_val_psnr_db_bf16"] = vae_psnr
    log(f"VAE: {log_doc['vae_seconds']:.0f} s, val PSNR {vae_psnr:.2f} dB (bf16 weights), latent mean {shift:.4f}, "
        f"std {1 / scale:.4f}, posterior std mean {float(lat_std.mean()):.4f}")

    # 3. transformer + text encoder
    t_tr = time.time()
    transformer, text, raw_transformer, raw_text = train_transformer(
        scenes, lat_mean, lat_std, vae_config["shift_factor"], vae_config["scaling_factor"], args.steps, args.batch,
        log_doc["transformer"], lr=args.lr)
    log_doc["transformer_seconds"] = time.time() - t_tr
    torch.save({"transformer": raw_transformer.state_dict(), "text": raw_text.state_dict()}, os.path.join(args.work, "raw.pt"))
    for m in (transformer, text, raw_transformer, raw_text):
        bf16_round_(m)
    # The EMA or the last weights, whichever gets more of the selection prompts entirely right
    # (evaluate.py's grading: color, background, shape, count, position) on 20 scenes drawn with
    # another seed than the evaluation's 100.
    scores = {}
    selection = E.fixed_scenes(20, seed=SELECTION_SEED)
    for kind, (tr, te) in (("ema", (transformer, text)), ("last", (raw_transformer, raw_text))):
        candidate = S.TinyFlux.from_modules(tr, vae, te, TRANSFORMER_CONFIG, dict(vae_config), SCHEDULER_CONFIG,
                                            M.TEXT_ENCODER_CONFIG)
        scores[kind] = E.evaluate_model(candidate, selection, steps=28, progress=False)[0]["all"]
    log_doc["selection_accuracy"] = scores
    if scores["last"] > scores["ema"]:
        transformer, text = raw_transformer, raw_text
    log_doc["shipped_weights"] = "ema" if scores["last"] <= scores["ema"] else "last"
    log(f"semantic accuracy on the selection seeds: EMA {scores['ema']:.3f}, last {scores['last']:.3f}: "
        f"shipping {log_doc['shipped_weights']}")

    # 4. save
    out = args.out
    save(transformer, os.path.join(out, "transformer"), "diffusion_pytorch_model.safetensors", TRANSFORMER_CONFIG)
    save(vae, os.path.join(out, "vae"), "diffusion_pytorch_model.safetensors", vae_config)
    save(text, os.path.join(out, "text_encoder"), "model.safetensors", M.TEXT_ENCODER_CONFIG)
    write_json(os.path.join(out, "scheduler", "scheduler_config.json"), SCHEDULER_CONFIG)
    write_json(os.path.join(out, "tokenizer", "vocab.json"), dataset.WORD_ID)
    write_json(os.path.join(out, "tokenizer", "tokenizer_config.json"), TOKENIZER_CONFIG)
    log_doc["total_training_seconds"] = time.time() - start
    log_doc["total_cpu_seconds"] = time.process_time() - cpu_start
    log(f"training done in {log_doc['total_training_seconds'] / 60:.1f} min wall (VAE {log_doc['vae_seconds'] / 60:.1f}, "
        f"transformer {log_doc['transformer_seconds'] / 60:.1f}), {log_doc['total_cpu_seconds'] / 60:.1f} min CPU")

    model = S.TinyFlux(out)
    acc, rows = S.evaluate(model, steps=28, seeds=range(4))
    log_doc["semantic_accuracy"] = acc
    log(f"semantic accuracy (28 steps, CFG off, 4 seeds x {len(S.SEMANTIC_PROMPTS)} prompts): {acc:.3f}")
    log_doc["evaluation_100_prompts"] = E.evaluate_model(model, E.fixed_scenes(), steps=28, progress=False)[0]
    log(f"evaluate.py's 100 prompts (28 steps, CFG off): {log_doc['evaluation_100_prompts']}")
    write_json(os.path.join(out, "training_log.json"), log_doc)


if __name__ == "__main__":
    main()
