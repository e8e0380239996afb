#!/usr/bin/python3
"""The PyTorch sampler of the tiny model, step for step cubevec's FluxT2IPipeline, and what is
built from it: the parity reference and text-encoder goldens for cubevec's tests, and the
semantic evaluation.

    /usr/bin/python3 tools/tinyflux/sample.py reference [--model assets/tinyflux] [--out tests/data/tinyflux_reference.safetensors]
    /usr/bin/python3 tools/tinyflux/sample.py eval      [--model assets/tinyflux] [--steps 28] [--seeds 4]
    /usr/bin/python3 tools/tinyflux/sample.py image     --prompt "a red circle on a blue background" [--seed 0] --out x.png

Sampling as the C++ pipeline does it (pipelines/flux_t2i.cpp, docs/models.md "FluxPipeline"):
  * noise [1, C, H/4, W/4] from cubevec_noise(): pipelines/noise.h's generator (SplitMix64 +
    Box-Muller, the pair p = i / 2 of element i) reimplemented in numpy, then packed 2x2;
  * sigmas: FlowMatchEulerDiscreteScheduler (tests/reference) with FluxPipeline's
    linspace(1, 1/N, N) and mu from the packed token count (ignored without dynamic shifting);
  * each step: timestep f32(t / 1000), v = transformer(...), x = x + f32(sigma_{i+1} - sigma_i) v,
    all f32; with true CFG v = v_neg + scale (v - v_neg);
  * unpack, z = latents / scaling_factor + shift_factor, image = vae.decode(z) (unclamped) and
    round(clamp(x / 2 + 0.5, 0, 1) * 255) for pixels.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import modules as M  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402  (tests/reference, on the path via modules)

ROOT = M.ROOT
DEFAULT_MODEL = os.path.join(ROOT, "assets", "tinyflux")

# The reference image of tests/pipelines/tinyflux_test.cpp, and the prompts of its text-encoder goldens.
REFERENCE_PROMPT = "a red circle on a blue background"
REFERENCE_SEED = 42
TEXT_GOLDEN_PROMPTS = ["a red circle on a blue background", "two small yellow squares on the left",
                       "An orange triangle, at the top on a BLACK background.", ""]
# The semantic test's prompts: (prompt, shape color, background color).
SEMANTIC_PROMPTS = [
    ("a red circle on a blue background", "red", "blue"),
    ("a yellow square on a purple background", "yellow", "purple"),
    ("a large white triangle on a black background", "white", "black"),
    ("a blue circle in the center on an orange background", "blue", "orange"),
    ("two green squares on a white background", "green", "white"),
    ("a black circle on a yellow background", "black", "yellow"),
]


# ---------------------------------------------------------------------------------------------
# pipelines/noise.h in numpy
# ---------------------------------------------------------------------------------------------
def _splitmix64(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)).astype(np.uint64)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)).astype(np.uint64)
    return x ^ (x >> np.uint64(31))


def cubevec_noise(shape, seed):
    """cubevec's gaussian_noise(shape, seed) as float32: element i from the pair p = i / 2, words
    w1 = mix(key + 2p + 1), w2 = mix(key + 2p + 2) with key = mix(seed); u1 = ((w1 >> 11) + 1) 2^-53,
    u2 = (w2 >> 11) 2^-53; r = sqrt(-2 ln u1); z_2p = r cos(2 pi u2), z_2p+1 = r sin(2 pi u2) in
    double, rounded to f32."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed], dtype=np.uint64))[0]
        p = np.arange((n + 1) // 2, dtype=np.uint64)
        w1 = _splitmix64(key + np.uint64(2) * p + np.uint64(1))
        w2 = _splitmix64(key + np.uint64(2) * p + np.uint64(2))
    u1 = ((w1 >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0 ** -53
    u2 = (w2 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    r = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * np.pi * u2
    z = np.empty(2 * len(p), dtype=np.float64)
    z[0::2] = r * np.cos(angle)
    z[1::2] = r * np.sin(angle)
    return z[:n].astype(np.float32).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Loading the shipped model
# ---------------------------------------------------------------------------------------------
def _config(path):
    with open(path) as f:
        return json.load(f)


def _load_weights(module, path):
    tensors, _ = read_safetensors(path)
    module.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return module


class TinyFlux:
    """The four components of a model directory, f32, eval mode."""

    def __init__(self, model_dir=DEFAULT_MODEL):
        self.dir = model_dir
        self.transformer_config = _config(os.path.join(model_dir, "transformer", "config.json"))
        self.vae_config = _config(os.path.join(model_dir, "vae", "config.json"))
        self.scheduler_config = _config(os.path.join(model_dir, "scheduler", "scheduler_config.json"))
        self.text_config = _config(os.path.join(model_dir, "text_encoder", "config.json"))
        vocab = _config(os.path.join(model_dir, "tokenizer", "vocab.json"))
        assert vocab == dataset.WORD_ID, "tokenizer/vocab.json differs from dataset.VOCAB"
        self.transformer = _load_weights(M.FluxTransformer2DModel(self.transformer_config),
                                         os.path.join(model_dir, "transformer", "diffusion_pytorch_model.safetensors")).eval()
        vae_file = os.path.join(model_dir, "vae", "diffusion_pytorch_model.safetensors")
        # A folder whose VAE has only the decoder (bench/flux_dev_shaped.cpp's FLUX-width model) decodes only.
        has_encoder = any(k.startswith("encoder.") for k in read_safetensors(vae_file)[0])
        self.vae = _load_weights((M.AutoencoderKL if has_encoder else M.AutoencoderKLDecoder)(self.vae_config), vae_file).eval()
        self.text_encoder = _load_weights(M.TinyTextEncoder(self.text_config),
                                          os.path.join(model_dir, "text_encoder", "model.safetensors")).eval()

    @classmethod
    def from_modules(cls, transformer, vae, text_encoder, transformer_config, vae_config, scheduler_config, text_config):
        self = cls.__new__(cls)
        self.dir = None
        self.transformer, self.vae, self.text_encoder = transformer, vae, text_encoder
        self.transformer_config, self.vae_config = transformer_config, vae_config
        self.scheduler_config, self.text_config = scheduler_config, text_config
        return self

    @torch.no_grad()
    def encode_prompt(self, prompt):
        ids = torch.from_numpy(dataset.tokenize(prompt))[None]
        return tuple(x.float() for x in self.text_encoder(ids))

    def upscale(self):
        return 2 ** (len(self.vae_config["block_out_channels"]) - 1)

    def to(self, dtype):
        """The modules' weights in `dtype` (bf16: as a diffusers torch_dtype=torch.bfloat16 run); the
        sampler keeps its latents and Euler steps in f32 and casts at each module's input."""
        for m in (self.transformer, self.vae, self.text_encoder):
            m.to(dtype)
        self.dtype = dtype
        return self

    @torch.no_grad()
    def sample(self, prompt, seed=0, steps=28, width=None, height=None, negative_prompt=None, cfg_scale=4.0,
               scheduler_config=None, record=None):
        """The decoded image [1, 3, H, W] (unclamped). negative_prompt not None: true CFG."""
        text = self.encode_prompt(prompt)
        negative = self.encode_prompt(negative_prompt) if negative_prompt is not None else None
        latents = self.denoise(text, negative, seed, steps, width, height, cfg_scale, scheduler_config, record)
        return self.decode(latents)

    @torch.no_grad()
    def denoise(self, text, negative=None, seed=0, steps=28, width=None, height=None, cfg_scale=4.0, scheduler_config=None,
                record=None, on_step=None, guidance=3.5):
        """The final latents [1, C, H / up, W / up] (f32) from encode_prompt()'s outputs; on_step(i) after each step.
        guidance: the embedded guidance of a transformer with guidance_embeds (FLUX.1-dev's; cubevec's default 3.5)."""
        width = width or self.vae_config["sample_size"]
        height = height or self.vae_config["sample_size"]
        up = self.upscale()
        lh, lw = height // up, width // up
        channels = self.transformer_config["in_channels"] // 4
        noise = torch.from_numpy(cubevec_noise((1, channels, lh, lw), seed))
        x = M.pack_latents(noise)
        sc = dict(scheduler_config or self.scheduler_config)
        sched = M.FlowMatchEulerDiscreteScheduler(**{k: v for k, v in sc.items() if not k.startswith("_")})
        tokens = (lh // 2) * (lw // 2)
        mu = M.calculate_shift(tokens, sc.get("base_image_seq_len", 256), sc.get("max_image_seq_len", 4096),
                               sc.get("base_shift", 0.5), sc.get("max_shift", 1.15))
        sigmas, timesteps = sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        img_ids = M.latent_image_ids(lh, lw)
        d = getattr(self, "dtype", torch.float32)
        seq, pooled = text
        txt_ids = torch.zeros(seq.shape[1], 3)
        g = torch.full([1], guidance, dtype=torch.float32).to(d) if self.transformer_config.get("guidance_embeds") else None
        for i in range(steps):
            t = torch.tensor([timesteps[i]], dtype=torch.float32) / 1000
            v = self.transformer(x.to(d), seq.to(d), pooled.to(d), t.to(d), img_ids, txt_ids, g).float()
            if negative is not None:
                vn = self.transformer(x.to(d), negative[0].to(d), negative[1].to(d), t.to(d), img_ids,
                                      torch.zeros(negative[0].shape[1], 3), g).float()
                v = vn + np.float32(cfg_scale) * (v - vn)
            dt = np.float32(sigmas[i + 1]) - np.float32(sigmas[i])
            x = x + torch.tensor(dt, dtype=torch.float32) * v
            if on_step is not None:
                on_step(i)
        latents = M.unpack_latents(x, lh, lw)
        if record is not None:
            record.update(noise=noise, latents=latents, sigmas=sigmas, timesteps=timesteps)
        return latents

    @torch.no_grad()
    def decode(self, latents):
        """The image [1, 3, H, W] (f32, unclamped) of denoise()'s latents."""
        z = latents / self.vae_config["scaling_factor"] + (self.vae_config.get("shift_factor") or 0.0)
        return self.vae.decode(z.to(getattr(self, "dtype", torch.float32))).float()


def to_pixels(image):
    """[1, 3, H, W] in about [-1, 1] -> uint8 [H, W, 3], as pipelines::to_rgb."""
    x = torch.clamp(image[0] / 2 + 0.5, 0, 1).permute(1, 2, 0).numpy()
    return np.round(x * 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Evaluation: do the colors come out as asked?
# ---------------------------------------------------------------------------------------------
def evaluate(model, steps=28, seeds=(0, 1, 2, 3), prompts=None, scheduler_config=None, verbose=False, **kw):
    """Fraction of samples whose dominant background and shape colors match the prompt."""
    prompts = prompts or SEMANTIC_PROMPTS
    good, total, rows = 0, 0, []
    for prompt, shape, background in prompts:
        for seed in seeds:
            px = to_pixels(model.sample(prompt, seed=seed, steps=steps, scheduler_config=scheduler_config, **kw))
            got_bg, got_shape = dataset.dominant_colors(px)
            ok = got_bg == background and got_shape == shape
            good += ok
            total += 1
            rows.append((prompt, seed, got_shape, got_bg, ok))
            if verbose:
                print(f"  {'ok ' if ok else 'BAD'} seed {seed}: {prompt!r} -> shape {got_shape}, background {got_bg}")
    return good / total, rows


# ---------------------------------------------------------------------------------------------
# The committed reference for cubevec's tests
# ---------------------------------------------------------------------------------------------
def write_reference(model, out_path, steps=28):
    tensors = {}
    record = {}
    image = model.sample(REFERENCE_PROMPT, seed=REFERENCE_SEED, steps=steps, record=record)
    tensors["image"] = image.float().contiguous()
    tensors["latents"] = record["latents"].float().contiguous()
    tensors["noise"] = record["noise"].float().contiguous()
    # A longer stretch of the generator (odd length, a large seed) for the noise check.
    tensors["noise_check"] = torch.from_numpy(cubevec_noise((3, 5, 7), 0xFFFFFFFFFFFFFFFF))
    prompts = {}
    for i, prompt in enumerate(TEXT_GOLDEN_PROMPTS):
        seq, pooled = model.encode_prompt(prompt)
        tensors[f"text.{i}.input_ids"] = torch.from_numpy(dataset.tokenize(prompt).astype(np.int32))
        tensors[f"text.{i}.sequence"] = seq.float().contiguous()
        tensors[f"text.{i}.pooled"] = pooled.float().contiguous()
        prompts[str(i)] = prompt
    meta = {
        "_generator": "tools/tinyflux/sample.py reference",
        "_torch_version": torch.__version__,
        "prompt": REFERENCE_PROMPT,
        "seed": str(REFERENCE_SEED),
        "steps": str(steps),
        "width": str(model.vae_config["sample_size"]),
        "height": str(model.vae_config["sample_size"]),
        "noise_check_seed": str(0xFFFFFFFFFFFFFFFF),
        "text_prompts": json.dumps(prompts),
        "_note": "image: the decoded [1,3,H,W] image (unclamped) of the PyTorch sampler (f32) on assets/tinyflux for "
                 "prompt/seed/steps, CFG off; latents: the final unpacked latents; noise: cubevec_noise([1,C,h,w], seed); "
                 "noise_check: cubevec_noise([3,5,7], noise_check_seed); text.i.*: the text encoder's input ids "
                 "(int32), sequence [1,L,D] and pooled [1,P] for text_prompts[i]",
    }
    write_safetensors(out_path, tensors, meta)
    return image


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["reference", "eval", "image"])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--out")
    p.add_argument("--prompt", default=REFERENCE_PROMPT)
    p.add_argument("--negative-prompt")
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--shift", type=float, help="override the scheduler's static shift (eval)")
    args = p.parse_args()
    torch.set_num_threads(2)
    model = TinyFlux(args.model)
    if args.command == "reference":
        out = args.out or os.path.join(ROOT, "tests", "data", "tinyflux_reference.safetensors")
        write_reference(model, out, steps=args.steps)
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    elif args.command == "eval":
        sc = dict(model.scheduler_config)
        if args.shift is not None:
            sc["shift"] = args.shift
        kw = {}
        if args.negative_prompt is not None:
            kw = dict(negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale)
        acc, _ = evaluate(model, steps=args.steps, seeds=range(args.seeds), scheduler_config=sc, verbose=True, **kw)
        print(f"semantic accuracy {acc:.3f}")
    else:
        from PIL import Image
        kw = {}
        if args.negative_prompt is not None:
            kw = dict(negative_prompt=args.negative_prompt, cfg_scale=args.cfg_scale)
        px = to_pixels(model.sample(args.prompt, seed=args.seed, steps=args.steps, **kw))
        Image.fromarray(px).save(args.out or "/tmp/tinyflux.png")


if __name__ == "__main__":
    main()
