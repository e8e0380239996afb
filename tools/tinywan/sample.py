#!/usr/bin/python3
"""The PyTorch sampler of tinywan, step for step cubevec's WanT2VPipeline.

    /usr/bin/python3 tools/tinywan/sample.py video --prompt "a red circle moving right on a blue background" [--seed 0] --out x.png
    /usr/bin/python3 tools/tinywan/sample.py reference   # tests/data/tinywan_reference.safetensors

Sampling as the C++ pipeline does it (pipelines/wan_t2v.cpp, docs/models.md "WanPipeline"):
  * noise [1, z_dim, 1 + (F - 1) / 4, H / 8, W / 8] from cubevec_noise() (pipelines/noise.h in numpy,
    tools/tinyflux/sample.py);
  * sigmas and timesteps: FlowMatchEulerDiscreteScheduler.set_timesteps(N) without sigmas or mu
    (Wan's path, the static shift of scheduler_config.json);
  * each step: the raw f32 timestep to the model, CFG v = v_u + g (v_c - v_u) with the empty prompt
    as the unconditional input, x = x + f32(sigma_{i+1} - sigma_i) v in f32;
  * z = latents / (1 / latents_std) + latents_mean per channel, the VAE decode (the whole sequence:
    equal to diffusers' chunked decode, make_wan_reference.py checks it), clamp to [-1, 1].
The video command writes a strip of frames 0, 4, 8, 12, 16 as a PNG; reference writes the parity
video tests/pipelines/tinywan_test.cpp compares cubevec's pipeline with (REFERENCE_PROMPT, seed 0,
the model's generation defaults: CFG on, the empty prompt as the unconditional input).
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import modules as M  # noqa: E402

_flux_sample = dataset.load_tinyflux("sample")
cubevec_noise = _flux_sample.cubevec_noise  # pipelines/noise.h in numpy
DEFAULT_MODEL = os.path.join(M.ROOT, "assets", "tinywan")
REFERENCE_PROMPT = "a red circle moving right on a blue background"  # the README's
REFERENCE_SEED = 0


def _config(path):
    return _flux_sample._config(path)


def _load_weights(module, path):
    return _flux_sample._load_weights(module, path).eval()


class TinyWan:
    """The components of a tinywan directory, f32, eval mode."""

    def __init__(self, model_dir=DEFAULT_MODEL):
        cfg = lambda *p: _config(os.path.join(model_dir, *p))  # noqa: E731
        self.transformer_config = cfg("transformer", "config.json")
        self.vae_config = cfg("vae", "config.json")
        self.scheduler_config = cfg("scheduler", "scheduler_config.json")
        self.text_config = cfg("text_encoder", "config.json")
        self.defaults = cfg("generation_defaults.json")
        assert cfg("tokenizer", "vocab.json") == dataset.WORD_ID, "tokenizer/vocab.json differs from dataset.VOCAB"
        self.transformer = _load_weights(M.WanTransformer3DModel(self.transformer_config),
                                         os.path.join(model_dir, "transformer", "diffusion_pytorch_model.safetensors"))
        self.vae = _load_weights(M.AutoencoderKLWanDecoder(self.vae_config),
                                 os.path.join(model_dir, "vae", "diffusion_pytorch_model.safetensors"))
        self.text_encoder = _load_weights(M.TinyTextEncoder(self.text_config),
                                          os.path.join(model_dir, "text_encoder", "model.safetensors"))

    to = _flux_sample.TinyFlux.to  # every module's weights in a dtype; the sampler casts at their inputs

    @torch.no_grad()
    def encode_prompt(self, prompt):
        return self.text_encoder(torch.from_numpy(dataset.tokenize(prompt))[None])[0].float()

    @torch.no_grad()
    def sample(self, prompt, seed=0, steps=None, guidance=None, cfg=True):
        """The video [1, 3, F, H, W] in [-1, 1] at the model's generation defaults."""
        empty = self.encode_prompt("") if cfg else None
        return self.decode(self.denoise(self.encode_prompt(prompt), empty, seed, steps, guidance))

    @torch.no_grad()
    def denoise(self, text, empty=None, seed=0, steps=None, guidance=None, on_step=None):
        """The final latents (f32) from encode_prompt()'s outputs (empty: the unconditional input, None
        for CFG off); on_step(i) after each step."""
        d = self.defaults
        steps = steps or d["steps"]
        guidance = d["guidance"] if guidance is None else guidance
        latent_frames = (d["frames"] - 1) // 4 + 1
        shape = (1, self.transformer_config["in_channels"], latent_frames, d["height"] // 8, d["width"] // 8)
        x = torch.from_numpy(cubevec_noise(shape, seed))
        sc = {k: v for k, v in self.scheduler_config.items() if not k.startswith("_")}
        sigmas, timesteps = M.FlowMatchEulerDiscreteScheduler(**sc).set_timesteps(steps)
        dt = getattr(self, "dtype", torch.float32)
        for i in range(steps):
            t = torch.tensor([timesteps[i]], dtype=torch.float32)
            v = self.transformer(x.to(dt), t, text.to(dt)).float()
            if empty is not None:
                v_u = self.transformer(x.to(dt), t, empty.to(dt)).float()
                v = v_u + np.float32(guidance) * (v - v_u)
            x = x + torch.tensor(np.float32(sigmas[i + 1]) - np.float32(sigmas[i])) * v
            if on_step is not None:
                on_step(i)
        return x

    @torch.no_grad()
    def decode(self, latents):
        """The video [1, 3, F, H, W] in [-1, 1] of denoise()'s latents."""
        z = M.unnormalize_latents(latents, self.vae_config["latents_mean"], self.vae_config["latents_std"])
        return self.vae.decode_whole(z.to(getattr(self, "dtype", torch.float32))).float().clamp(-1.0, 1.0)


def to_frames(video):
    """[1, 3, F, H, W] in [-1, 1] -> uint8 [F, H, W, 3], as pipelines::to_rgb."""
    x = (video[0] / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).numpy()
    return np.round(x * 255).astype(np.uint8)


def strip(frames, every=4):
    return np.concatenate(list(frames[::every]), axis=1)


def write_reference(model, out_path):
    from safetensors_io import write_safetensors  # tests/reference, on the path via modules
    d = model.defaults
    text, empty = model.encode_prompt(REFERENCE_PROMPT), model.encode_prompt("")
    latents = model.denoise(text, empty, REFERENCE_SEED)
    tensors = {"video": model.decode(latents).contiguous(), "latents": latents.contiguous()}
    meta = {
        "_generator": "tools/tinywan/sample.py reference",
        "_torch_version": torch.__version__,
        "_note": "video: the decoded [1,3,F,H,W] clip (clamped to [-1, 1]) of the PyTorch sampler (f32) on "
                 "assets/tinywan for prompt/seed at generation_defaults.json (CFG with the empty prompt); "
                 "latents: the final latents",
        "prompt": REFERENCE_PROMPT,
        "seed": str(REFERENCE_SEED),
        **{k: str(d[k]) for k in ("width", "height", "frames", "steps", "guidance")},
    }
    write_safetensors(out_path, tensors, meta)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["video", "reference"])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--prompt", default=REFERENCE_PROMPT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int)
    p.add_argument("--guidance", type=float)
    p.add_argument("--out", help="video: the PNG strip (default /tmp/tinywan.png); reference: the safetensors "
                                 "(default tests/data/tinywan_reference.safetensors)")
    args = p.parse_args()
    torch.set_num_threads(2)
    from PIL import Image
    try:
        model = TinyWan(args.model)
    except (OSError, ValueError, KeyError) as e:  # a missing folder or file, a config that does not parse
        p.error(f"--model {args.model}: not a tinywan folder ({e})")
    if args.command == "reference":
        out = args.out or os.path.join(M.ROOT, "tests", "data", "tinywan_reference.safetensors")
        try:
            write_reference(model, out)
        except OSError as e:
            p.error(f"--out {out}: cannot write it ({e})")
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")
        return
    out = args.out or "/tmp/tinywan.png"
    Image.fromarray(strip(to_frames(model.sample(args.prompt, args.seed, args.steps, args.guidance)))).save(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
