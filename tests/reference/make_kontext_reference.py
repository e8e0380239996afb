#!/usr/bin/python3
"""Reference values for cubevec's FLUX.1 Kontext editing (FluxKontextPipeline).

Run with Debian's torch (1.13) and PIL, which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_kontext_reference.py [OUTPUT_DIR]   # default tests/data

Written from diffusers' pipelines/flux/pipeline_flux_kontext.py in plain torch (diffusers is not
used); the transformer, packing, ids, scheduler and VAE decoder are make_flux_reference.py's, the VAE
encoder make_vae_encoder_reference.py's. It writes OUTPUT_DIR/goldens_kontext.safetensors:

  sizes.table      one row per case: image width, image height, requested width, requested height,
                   max_area, auto_resize (0/1), then the output width and height and the reference
                   width and height by diffusers' rules (Python's round, PREFERRED_KONTEXT_RESOLUTIONS,
                   get_default_height_width's floor to the VAE's scale, the floor to 2 x that)
  edit.*           a 4-step edit with the tiny models: tests/data/flux_tiny/transformer, the whole VAE
                   tests/data/vae_encoder/flux (4x, 16 latent channels) and flux_tiny's scheduler.
                   `picture` is the reference picture (RGB bytes as f32 [H, W, 3], 36 x 28), resized
                   by PIL's Lanczos to its reference size (auto_resize off: 32 x 24) and encoded
                   (the latent distribution's mean, then (mean - shift) * scale); `noise` the initial
                   latents [1, 16, 8, 8] (32 x 32 output, max_area 32 x 32); each step the transformer
                   gets [latents | reference tokens] with img_ids [noise ids | reference ids with the
                   first coordinate 1] and its prediction is cut to the latents' 16 tokens.
                   Outputs: expected_reference (packed [1, 12, 64]), expected_latents ([1, 16, 8, 8])
                   and expected (the decoded picture [1, 3, 32, 32], before clamp(x / 2 + 0.5)).

Numerics as make_flux_reference.py: models in float64, f32 inputs, results rounded to f32.
"""

import os
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_flux_reference as ref  # noqa: E402
import make_vae_encoder_reference as venc  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ref.ROOT, "tests", "data")

PREFERRED_KONTEXT_RESOLUTIONS = [(672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248), (880, 1184),
                                 (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832), (1328, 800), (1392, 752),
                                 (1456, 720), (1504, 688), (1568, 672)]


def output_size(width, height, max_area, multiple):
    """__call__'s: rescaled to max_area at the aspect ratio, Python's round, floored to multiple."""
    aspect_ratio = width / height
    width = round((max_area * aspect_ratio) ** 0.5)
    height = round((max_area / aspect_ratio) ** 0.5)
    return width // multiple * multiple, height // multiple * multiple


def reference_size(image_width, image_height, auto_resize, vae_scale_factor, multiple):
    """get_default_height_width (floor to the VAE's scale), the preferred resolution, floor to multiple."""
    image_width, image_height = (x - x % vae_scale_factor for x in (image_width, image_height))
    aspect_ratio = image_width / image_height
    if auto_resize:
        _, image_width, image_height = min((abs(aspect_ratio - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    return image_width // multiple * multiple, image_height // multiple * multiple


SIZE_CASES = [  # image w, h, requested w, h, max_area, auto_resize (FLUX.1: VAE scale 8, multiple 16)
    (1024, 1024, 1024, 1024, 1024 ** 2, 1),
    (1000, 600, 1000, 600, 1024 ** 2, 1),
    (600, 1000, 1024, 1024, 1024 ** 2, 1),
    (1920, 1080, 1920, 1080, 1024 ** 2, 1),
    (1080, 1920, 512, 768, 1024 ** 2, 1),
    (777, 333, 777, 333, 1024 ** 2, 1),
    (333, 777, 640, 480, 512 ** 2, 1),
    (500, 500, 1024, 768, 1024 ** 2, 0),
    (1023, 517, 1023, 517, 768 * 768, 0),
    (2000, 1000, 300, 900, 1024 ** 2, 1),
    (64, 48, 32, 32, 32 * 32, 0),
]


def main():
    g = ref.Goldens(7401, meta={"_generator": "tests/reference/make_kontext_reference.py", "_torch_version": torch.__version__,
                                "_numerics": "models in float64 on f32 inputs, results rounded to f32"})
    rows = []
    for iw, ih, w, h, area, auto in SIZE_CASES:
        ow, oh = output_size(w, h, area, 16)
        rw, rh = reference_size(iw, ih, bool(auto), 8, 16)
        rows.append([iw, ih, w, h, area, auto, ow, oh, rw, rh])
    g.add("sizes", dict(op="kontext_sizes", vae_scale_factor=8, multiple=16,
                        columns=["image_w", "image_h", "width", "height", "max_area", "auto_resize", "out_w", "out_h", "ref_w",
                                 "ref_h"]),
          {"table": torch.tensor(rows, dtype=torch.float64)})

    # ---- the tiny edit ------------------------------------------------------------------------------
    weights, _ = read_safetensors(os.path.join(OUT_DIR, "flux_tiny", "transformer", "diffusion_pytorch_model.safetensors"))
    flux = ref.FluxTransformer2DModel(ref.TRANSFORMER_CONFIG).double().eval()
    flux.load_state_dict({k: v.double() for k, v in weights.items()})
    vae_cfg = venc.FLUX_CONFIG
    vae = venc.AutoencoderKL(vae_cfg).double().eval()
    vae_weights, _ = read_safetensors(os.path.join(OUT_DIR, "vae_encoder", "flux", "diffusion_pytorch_model.safetensors"))
    vae.load_state_dict({k: v.double() for k, v in vae_weights.items()})
    upscale = 2 ** (len(vae_cfg["block_out_channels"]) - 1)  # 4
    multiple = 2 * upscale

    yy, xx = np.mgrid[0:28, 0:36]
    pixels = np.stack([(xx * 7 + yy * 3) % 256, (yy * 9) % 256, ((xx - 18) ** 2 + (yy - 14) ** 2 < 64) * 200 + 30], axis=-1)
    picture = Image.fromarray(pixels.astype(np.uint8), "RGB")
    ref_w, ref_h = reference_size(36, 28, False, upscale, multiple)
    resized = np.asarray(picture.resize((ref_w, ref_h), resample=Image.LANCZOS)).astype(np.float32) / 255.0
    image = torch.from_numpy(2.0 * resized - 1.0).permute(2, 0, 1)[None]  # VaeImageProcessor: [-1, 1], NCHW, f32

    out_w, out_h = output_size(32, 32, 32 * 32, multiple)
    lat_h, lat_w = out_h // upscale, out_w // upscale
    steps, n_txt = 4, 5
    noise = g.randn((1, 16, lat_h, lat_w))
    ehs = g.randn((1, n_txt, ref.TRANSFORMER_CONFIG["joint_attention_dim"]))
    pooled = g.randn((1, ref.TRANSFORMER_CONFIG["pooled_projection_dim"]))
    guidance = torch.full((1,), 3.5, dtype=torch.float32)
    with torch.no_grad():
        mean = vae.moments(image.double())[:, :16]
        reference = ref.pack_latents((mean - vae_cfg["shift_factor"]) * vae_cfg["scaling_factor"])
        ref_ids = ref.latent_image_ids(mean.shape[2], mean.shape[3])
        ref_ids[:, 0] = 1
        ids = torch.cat([ref.latent_image_ids(lat_h, lat_w), ref_ids], dim=0)
        sched = ref.FlowMatchEulerDiscreteScheduler(**ref.SCHEDULER_CONFIG)
        seq_len = (lat_h // 2) * (lat_w // 2)  # the noise's tokens only
        mu = ref.calculate_shift(seq_len, ref.SCHEDULER_CONFIG["base_image_seq_len"], ref.SCHEDULER_CONFIG["max_image_seq_len"],
                                 ref.SCHEDULER_CONFIG["base_shift"], ref.SCHEDULER_CONFIG["max_shift"])
        sigmas, timesteps = sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        x = ref.pack_latents(noise).double()
        for i in range(steps):
            t_model = torch.tensor([timesteps[i]], dtype=torch.float32) / 1000
            v = flux(torch.cat([x, reference], dim=1), ehs.double(), pooled.double(), t_model, ids, torch.zeros(n_txt, 3), guidance)
            v = v[:, :x.shape[1]]
            x = x + float(np.float32(sigmas[i + 1]) - np.float32(sigmas[i])) * v
        lat = ref.unpack_latents(x, lat_h, lat_w)
        decoded = vae.decoder(lat / vae_cfg["scaling_factor"] + vae_cfg["shift_factor"], {})
    g.add("edit", dict(op="kontext_edit", transformer="flux_tiny/transformer", vae="vae_encoder/flux", scheduler="flux_tiny/scheduler",
                       steps=steps, guidance_scale=3.5, width=out_w, height=out_h, max_area=32 * 32, auto_resize=False,
                       reference_width=ref_w, reference_height=ref_h, image_seq_len=seq_len, mu=mu),
          {"picture": torch.from_numpy(pixels.astype(np.float32)), "noise": noise, "encoder_hidden_states": ehs,
           "pooled_projections": pooled, "expected_reference": reference, "expected_latents": lat, "expected": decoded})
    print(f"edit: output {out_w}x{out_h}, reference {ref_w}x{ref_h} ({reference.shape[1]} tokens), "
          f"max |latents| {ref.max_abs(lat):.4g}, max |picture| {ref.max_abs(decoded):.4g}")
    g.write(os.path.join(OUT_DIR, "goldens_kontext.safetensors"))
    for row in rows:
        print("sizes", row)


if __name__ == "__main__":
    main()
