#!/usr/bin/python3
"""Reference and committed test data for cubevec's Wan2.2 TI2V-5B pipeline: whole runs of the tiny TI2V model
(text-to-video and text-image-to-video) through WanPipeline / WanImageToVideoPipeline with expand_timesteps.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees, AFTER make_wan22_reference.py (whose tiny
Wan2.2 VAE and TI2V transformer it uses as they are committed):

    /usr/bin/python3 tests/reference/make_wan22_ti2v_reference.py [OUTPUT_DIR]   # default tests/data

Plain torch; diffusers is not used. It writes, under OUTPUT_DIR:

  wan22_ti2v_tiny/              completes the folder make_wan22_reference.py started (transformer/): vae/ (a byte
                                copy of wan22_vae_tiny), scheduler/ (wan_tiny's FlowMatch Euler, shift 3),
                                model_index.json (WanPipeline, expand_timesteps true, boundary_ratio null, no
                                image encoder: the TI2V-5B layout), and a random tiny text encoder + tokenizer
                                (make_wan_i2v_reference.add_front_end_parts) so a prompt and a picture run it
  goldens_wan22_ti2v.safetensors
      pipeline_ti2v          3 Euler steps, CFG 4, 9 frames of 96 x 64, tests/data/images/rgb.png as the first
                             frame: noise, prompt / negative embeddings, image (the VideoProcessor's pixels),
                             condition (the normalized VAE mean of the one-frame video), latents, video;
                             intermediate.* (sigmas, timesteps, per-step model inputs and latents, z)
      pipeline_ti2v_text     the same model, noise and prompts (pipeline_ti2v's, not stored again) without a
                             picture (WanPipeline)

The pipeline rules, from diffusers' pipelines/wan/pipeline_wan_i2v.py and pipeline_wan.py at the commit in
make_wan22_reference.py (read for facts only):
  * expand_timesteps, image given: the condition is the VAE mean (argmax) of the picture as a ONE-frame video
    [1, 3, 1, H, W] (not the zero-padded video of Wan2.1 I2V), normalized (z - latents_mean) * (1 / latents_std);
    first_frame_mask = ones [1, 1, T', h, w] with frame 0 = 0; every step the model gets
    (1 - mask) * condition + mask * latents (frame 0 = the condition) and the per-token timestep
    (mask[0][0][:, ::2, ::2] * t).flatten() (frame 0's tokens at 0) for both CFG passes; the scheduler steps the
    latents themselves; after the loop latents = the same blend, then un-normalize and decode. The transformer
    has no image branch (image_dim null): no image encoder runs.
  * expand_timesteps, no picture (WanPipeline): mask = ones(latents.shape), so the per-token timestep is t for
    every token: the same as the 1-D timestep (make_wan22_reference checks the transformer agrees to 1e-15).
Numerics: the models in float64 on f32 inputs (bf16-representable weights), results rounded to f32; latents f32
between steps; v = v_u + g (v_c - v_u) in float64 rounded to f32; the f32 Euler step; the decode float64 with the
chunk caches (checked against the whole-sequence decode), clamped to [-1, 1].
Seeds are fixed: with the same torch and numpy the output is byte-identical.
"""
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_wan22_reference as w22  # noqa: E402  (the Wan2.2 VAE, the TI2V transformer, the mask rules)
import make_wan_i2v_reference as i2v  # noqa: E402  (picture loading, folder helpers, the tiny text encoder)
import make_wan_reference as wan  # noqa: E402  (scheduler config, un-normalization)
from make_flux_reference import FlowMatchEulerDiscreteScheduler, Goldens, euler_step, max_abs, write_json  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

F32, F64 = torch.float32, torch.float64
ROOT = wan.ROOT
SRC_DIR = os.path.join(ROOT, "tests", "data")
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else SRC_DIR
GENERATOR = "tests/reference/make_wan22_ti2v_reference.py"
FOLDER = "wan22_ti2v_tiny"
NUM_FRAMES, HEIGHT, WIDTH = 9, 64, 96  # latent [8, 3, 4, 6] with the VAE's 16x: 18 tokens of patch (1, 2, 2)
TEXT_LEN = 512  # the pipeline's zero-padded umT5 rows
STEPS, GUIDANCE = 3, 4.0
IMAGE_FILE = "images/rgb.png"


def load_vae(directory):
    cfg = i2v.read_json(os.path.join(directory, "config.json"))
    state, _ = read_safetensors(os.path.join(directory, "diffusion_pytorch_model.safetensors"))
    vae = w22.AutoencoderKLWan22(cfg).double().eval()
    vae.load_state_dict(state, strict=True)
    return vae, cfg


def load_transformer(directory):
    cfg = i2v.read_json(os.path.join(directory, "config.json"))
    state, _ = read_safetensors(os.path.join(directory, "diffusion_pytorch_model.safetensors"))
    model = w22.WanTI2VTransformer3DModel(w22.TI2V_TRANSFORMER_CONFIG).double().eval()
    model.load_state_dict(state, strict=True)
    assert {k: v for k, v in cfg.items() if not k.startswith("_")} == \
        {k: v for k, v in w22.TI2V_TRANSFORMER_CONFIG.items() if not k.startswith("_")}, cfg
    return model


def normalize(latent_raw, cfg):
    shape = (1, cfg["z_dim"], 1, 1, 1)
    mean = torch.tensor(cfg["latents_mean"], dtype=F32).view(shape)
    inv_std = 1.0 / torch.tensor(cfg["latents_std"], dtype=F32).view(shape)
    return (latent_raw - mean) * inv_std


def run(model, noise, prompt, negative, condition):
    """The denoising loop (CFG on); condition None: WanPipeline's all-ones mask."""
    sched = FlowMatchEulerDiscreteScheduler(**wan.SCHEDULER_CONFIG)
    sigmas, timesteps = sched.set_timesteps(STEPS)
    _, _, t_lat, h, w = noise.shape
    mask = w22.first_frame_mask(t_lat, h, w) if condition is not None else torch.ones(noise.shape, dtype=F32)
    x = noise.clone()
    out = {"inputs": [], "steps": [], "timestep_tokens": []}
    for i in range(STEPS):
        t = torch.tensor(timesteps[i], dtype=F32)
        inp = w22.blend(mask, condition, x) if condition is not None else x
        ts = w22.per_token_timestep(mask, t, 1)
        v_c = model(inp.double(), ts, prompt.double()).numpy()
        v_u = model(inp.double(), ts, negative.double()).numpy()
        v = (v_u + GUIDANCE * (v_c - v_u)).astype(np.float32)
        x_np, _ = euler_step(x.numpy(), v, sigmas[i], sigmas[i + 1])
        x = torch.from_numpy(np.ascontiguousarray(x_np, dtype=np.float32))
        out["inputs"].append(inp.clone())
        out["steps"].append(x.clone())
        out["timestep_tokens"].append(ts.clone().float())
    if condition is not None:
        x = w22.blend(mask, condition, x)
    out.update(latents=x, sigmas=torch.from_numpy(np.asarray(sigmas, dtype=np.float32)),
               timesteps=torch.from_numpy(np.asarray(timesteps, dtype=np.float32)))
    return out


def decode(vae, cfg, latents):
    z = wan.unnormalize_latents(latents, cfg["latents_mean"], cfg["latents_std"])
    with torch.no_grad():
        chunked = vae.decode_chunked(z.double())
        agree = w22.max_diff(chunked, vae.decode_whole(z.double()))
    assert agree <= 1e-9, agree
    return z, chunked.clamp(-1.0, 1.0), agree


def main():
    folder = os.path.join(OUT_DIR, FOLDER)
    vae_dir = os.path.join(SRC_DIR, "wan22_vae_tiny")
    vae, vae_cfg = load_vae(vae_dir)
    model = load_transformer(os.path.join(SRC_DIR, FOLDER, "transformer"))

    # ---- the folder ----
    i2v.copy_folder(vae_dir, os.path.join(folder, "vae"))
    i2v.copy_folder(os.path.join(SRC_DIR, "wan_tiny", "scheduler"), os.path.join(folder, "scheduler"))
    if os.path.abspath(OUT_DIR) != os.path.abspath(SRC_DIR):
        shutil.copytree(os.path.join(SRC_DIR, FOLDER, "transformer"), os.path.join(folder, "transformer"),
                        dirs_exist_ok=True)
    index = i2v.model_index("WanPipeline", image_components=False, transformer_2=False, boundary_ratio=None)
    index["expand_timesteps"] = True
    write_json(os.path.join(folder, "model_index.json"), index)
    i2v.add_front_end_parts(folder, image_encoder=False)

    # ---- goldens ----
    g = Goldens(2300, {
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_numpy_version": np.__version__,
        "_seed": "2300",
        "_diffusers_commit": w22.DIFFUSERS_COMMIT,
        "_numerics": "models in float64 on f32 inputs and bf16-representable weights, results rounded to f32; "
                     "pipelines as an f32 run (see the generator's docstring)",
    })
    z_dim = vae_cfg["z_dim"]
    noise = g.randn((1, z_dim, 1 + (NUM_FRAMES - 1) // 4, HEIGHT // 16, WIDTH // 16))
    prompt = g.randn((1, TEXT_LEN, 24))
    prompt[:, 5:] = 0.0
    negative = g.randn((1, TEXT_LEN, 24))
    negative[:, 8:] = 0.0
    image = i2v.load_image_pixels(IMAGE_FILE, HEIGHT, WIDTH)
    with torch.no_grad():
        latent_raw = vae.moments(image[:, :, None].double())[:, :z_dim].float()
    condition = normalize(latent_raw, vae_cfg)
    report = {}
    for case, cond in (("pipeline_ti2v", condition), ("pipeline_ti2v_text", None)):
        with torch.no_grad():
            r = run(model, noise, prompt, negative, cond)
        z, video, agree = decode(vae, vae_cfg, r["latents"])
        # The text case runs on pipeline_ti2v's noise and prompts (stored once).
        tensors = {}
        if cond is not None:
            tensors = {"noise": noise, "prompt_embeds": prompt, "negative_prompt_embeds": negative}
        tensors.update({"latents": r["latents"], "video": video, "intermediate.sigmas": r["sigmas"],
                   "intermediate.timesteps": r["timesteps"], "intermediate.z": z})
        if cond is not None:
            tensors.update({"image": image, "condition": cond, "intermediate.latent_raw": latent_raw})
        for i in range(STEPS):
            tensors[f"intermediate.model_input_step{i}"] = r["inputs"][i]
            tensors[f"intermediate.timestep_step{i}"] = r["timestep_tokens"][i]
            tensors[f"intermediate.latents_step{i}"] = r["steps"][i]
        g.add(case, dict(
            op="wan22_ti2v_pipeline", model=FOLDER, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
            num_frames=NUM_FRAMES, height=HEIGHT, width=WIDTH, prompt_length=5, negative_prompt_length=8,
            image_file=IMAGE_FILE if cond is not None else None,
            note=("WanImageToVideoPipeline with expand_timesteps: condition = normalized VAE mean of image as a "
                  "one-frame video; per step model input = blend(first_frame_mask, condition, latents), per-token "
                  "timestep 0 on frame 0's tokens, t elsewhere ([1, 18]); latents after the loop blended again"
                  if cond is not None else
                  "WanPipeline with expand_timesteps: the all-ones mask, so every token's timestep is t; model "
                  "input = latents") +
                 "; v = v_u + 4 (v_c - v_u) rounded to f32, f32 Euler (shift 3); z = latents / (1 / std) + mean; "
                 "video = clamp(decode(z), -1, 1) [1, 3, 9, 64, 96]"),
            tensors)
        report[case] = dict(max_abs_latents=max_abs(r["latents"]), max_abs_video=max_abs(video),
                            whole_vs_chunked=agree)
    path = os.path.join(OUT_DIR, "goldens_wan22_ti2v.safetensors")
    g.write(path)

    total = 0
    for dirpath, _, files in sorted(os.walk(folder)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            total += os.path.getsize(p)
            print(f"{os.path.relpath(p, OUT_DIR)}: {os.path.getsize(p)} bytes")
    total += os.path.getsize(path)
    print(f"{os.path.relpath(path, OUT_DIR)}: {os.path.getsize(path)} bytes, {len(g.tensors)} tensors; all: {total}")
    for k in sorted(g.tensors):
        t = g.tensors[k]
        print(f"  {k:<52} {str(list(t.shape)):<22} max|x| {max_abs(t):.6g}")
    for k, v in report.items():
        print(f"  {k}: " + ", ".join(f"{a}={b:.4g}" for a, b in v.items()))


if __name__ == "__main__":
    main()
