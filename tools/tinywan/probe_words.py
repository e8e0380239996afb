#!/usr/bin/python3
"""Do tinywan's words change what the transformer predicts? Three probes (a minute each).

    /usr/bin/python3 tools/tinywan/probe_words.py effect --model assets/tinywan
    /usr/bin/python3 tools/tinywan/probe_words.py anchor --model DIR --work WORK [--encoder snapshot]
    /usr/bin/python3 tools/tinywan/probe_words.py reversal --model DIR

effect  From fixed pure noise (and t = 0.9, 0.7), the mean squared change of the velocity when one
        word of "a red circle moving right on a blue background" is swapped (direction, motion,
        color, shape, background), and the text encoder's own output change for each swap.
anchor  For clips of the four directions, one latent frame clean (frame 0 or 2) and the others at
        t = 0.95 and 0.7, as anchored training shows them (train.py --anchor-fraction): is the x0
        the model predicts for the other frames nearer the true clip when the prompt says the true
        direction, and nearer the clip moving the opposite way through the anchor frame when it
        says the opposite? 0.5 is what a model that ignores the direction word gets. Needs the
        training encoder, so the VAE cached by train.py in --work (vae_phase2.pt) and its --encoder.
reversal Can the transformer tell the order of its frames? From fixed noise, the velocity of the
        latent played backwards, played back again, against the velocity of the latent itself, and
        the same for a left-right mirror, relative to the velocity's size. Near 0 for reversal:
        the model is symmetric in time, so no word can say which way a shape moves or whether it
        grows or shrinks (train.py's time_patch_note).
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402

BASE = "a red circle moving right on a blue background"
SWAPS = {"left": ("right", "left"), "up": ("right", "up"), "growing": ("moving right", "growing"),
         "green shape": ("red", "green"), "square": ("circle", "square"), "yellow background": ("blue", "yellow")}
OPPOSITE = {"right": "left", "left": "right", "up": "down", "down": "up"}


def fixed_noise():
    """The probes' pure-noise latent: one 17-frame 64x64 clip, seed 0."""
    return torch.randn((1, train.Z_DIM, train.LATENT_FRAMES, 8, 8), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def word_effect(model):
    noise = fixed_noise()
    base = model.encode_prompt(BASE)
    swapped = {k: model.encode_prompt(BASE.replace(a, b)) for k, (a, b) in SWAPS.items()}
    for t in (1.0, 0.9, 0.7):
        step = torch.tensor([t * 1000.0])
        v0 = model.transformer(noise, step, base)
        effects = {k: float((model.transformer(noise, step, e) - v0).pow(2).mean()) for k, e in swapped.items()}
        print(f"t {t}: velocity change " + ", ".join(f"{k} {v:.4f}" for k, v in effects.items()))
    print("text encoder output change: " + ", ".join(f"{k} {float((e - base).pow(2).mean()):.4f}" for k, e in swapped.items()))


@torch.no_grad()
def anchor_follow(model, work, encoder, clips_per_direction=2):
    vae = train.VideoVae(encoder)
    path = os.path.join(work, "vae_phase2.pt")
    if not os.path.isfile(path):
        sys.exit(f"probe_words.py: {path}: no cached VAE (train.py writes it to its --work folder)")
    try:
        train.load_vae_phase(vae, path, encoder)
    except ValueError as e:  # trained with another --encoder
        sys.exit(f"probe_words.py: {e}")
    except Exception as e:  # another network's weights, not a torch file
        sys.exit(f"probe_words.py: {path}: cannot load it as the VAE of --encoder {encoder}: {e}")
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(model.vae_config["latents_mean"]).view(shape)
    std = torch.tensor(model.vae_config["latents_std"]).view(shape)

    def latents(clip):
        return (vae.encoder(torch.from_numpy(dataset.render(clip))[None])[0] - mean) / std

    rng = np.random.default_rng(5)
    follows = {}
    for direction in list(OPPOSITE) * clips_per_direction:
        clip = dataset.random_clip(rng)
        while clip["motion"] != direction:
            clip = dataset.random_clip(rng)
        x0 = latents(clip)
        for anchor in (0, 2):
            f = 4 * anchor  # the video frame a snapshot latent frame shows
            mirrored = latents(dict(clip, xs=2 * clip["xs"][f] - clip["xs"], ys=2 * clip["ys"][f] - clip["ys"]))
            others = [k for k in range(x0.shape[2]) if k != anchor]
            for t in (0.95, 0.7):
                noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
                tt = torch.full((1, 1, x0.shape[2], 1, 1), t)
                tt[0, 0, anchor] = 0.0
                xt = (1 - tt) * x0 + tt * noise
                for word, truthful in ((direction, True), (OPPOSITE[direction], False)):
                    prompt = dataset.caption(dict(clip, motion=word), full=True)
                    x0_hat = xt - tt * model.transformer(xt, torch.tensor([t * 1000.0]), model.encode_prompt(prompt))
                    to_true = float((x0_hat - x0)[:, :, others].pow(2).mean())
                    to_mirrored = float((x0_hat - mirrored)[:, :, others].pow(2).mean())
                    follows.setdefault((anchor, t), []).append((to_true < to_mirrored) == truthful)
                    print(f"{direction:5s} anchor {anchor} t {t}: says {word:5s}: x0 error {to_true:.3f} to the true clip, "
                          f"{to_mirrored:.3f} to the mirrored one", flush=True)
    for (anchor, t), hits in follows.items():
        print(f"anchor frame {anchor}, t {t}: follows the direction word in {np.mean(hits):.2f} of {len(hits)} cases "
              f"(0.5: ignores it)")


@torch.no_grad()
def reversal(model):
    noise = fixed_noise()
    for prompt in (BASE, BASE.replace("moving right", "growing")):
        e = model.encode_prompt(prompt)
        for t in (1.0, 0.7, 0.3):
            step = torch.tensor([t * 1000.0])
            v = model.transformer(noise, step, e)
            size = float(v.pow(2).mean())
            errors = [float((model.transformer(noise.flip(axis), step, e).flip(axis) - v).pow(2).mean()) / size
                      for axis in (2, 4)]
            print(f'"{prompt}", t {t}: relative change of the velocity when the input is played backwards '
                  f"{errors[0]:.5f}, mirrored left-right {errors[1]:.5f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=["effect", "anchor", "reversal"])
    p.add_argument("--model", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "assets", "tinywan"))
    p.add_argument("--work", help="train.py's --work folder (anchor)")
    p.add_argument("--encoder", choices=sorted(train.ENCODERS), default="snapshot",
                   help="the VAE's training encoder (anchor; the shipped model's: snapshot)")
    args = p.parse_args()
    if args.probe == "anchor" and not args.work:
        p.error("anchor needs --work (the folder with train.py's cached VAE)")
    torch.set_num_threads(2)
    try:
        model = sample.TinyWan(args.model)
    except (OSError, ValueError, KeyError) as e:  # a missing folder or file, a config that does not parse
        p.error(f"--model {args.model}: not a tinywan folder ({e})")
    if args.probe == "effect":
        word_effect(model)
    elif args.probe == "reversal":
        reversal(model)
    else:
        anchor_follow(model, args.work, args.encoder)


if __name__ == "__main__":
    main()
