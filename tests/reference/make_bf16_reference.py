#!/usr/bin/python3
"""bf16 end-to-end goldens: what diffusers computes with torch_dtype=torch.bfloat16 on the tiny checkpoints.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_bf16_reference.py [OUTPUT_DIR]   # default tests/data

It reads the tiny checkpoints (tests/data/flux_tiny/, tests/data/wan_tiny/) and the inputs of three cases
of the float64 goldens (goldens_flux.safetensors, goldens_wan.safetensors), and writes
OUTPUT_DIR/goldens_bf16.safetensors (all F32; layout and __metadata__ as the other golden files):

  flux_transformer   FluxTransformer2DModel (flux_tiny/transformer) on goldens_flux's `transformer` inputs
  wan_transformer    WanTransformer3DModel (wan_tiny/transformer) on goldens_wan's `transformer` inputs (batch 2)
  flux_pipeline      goldens_flux's `pipeline` case (4 Euler steps from the given noise) as FluxPipeline runs
                     in bf16, then the VAE decode in f32 of the final latents

How the bf16 run is emulated. Every tensor is held in float64, and rounded where diffusers' bf16 run rounds
(b(): to bf16, through f32, round to nearest even, as torch's f32 -> bf16 cast; f(): to f32). Each op is
computed in float64 on the already rounded operands and rounded once, which is what a CUDA kernel does
with an f32 accumulator / f32 opmath up to f32 rounding of its internals. This makes the file independent
of torch's CPU bf16 kernels and deterministic. The per-op choices (read from diffusers at DIFFUSERS_COMMIT
for facts, and from PyTorch's kernels) are PRECISION_FLUX / PRECISION_WAN / PRECISION_PIPELINE below; they
go into __metadata__. With both roundings switched off the same code reproduces the float64 goldens
(asserted), so the two runs differ only by the rounding points.

Weights: every weight of the tiny checkpoints is bf16-representable, so a bf16 and an f32 copy of a weight
hold the same values; diffusers' _keep_in_fp32_modules only decides the precision of the arithmetic.

The script prints, per case, max |bf16 - f64| / max |f64| against the float64 goldens; for Flux also against
a float64 run given the same bf16 timestep / guidance values (diffusers rounds t * 1000 and g * 1000 to bf16,
which moves the tiny random model's output far more than all the other roundings together); and how far
two alternative rounding points move the bf16 result (RMSNorm with an extra rounding, as older torch and
diffusers' own RMSNorm; attention keeping scores and probabilities in f32, as flash kernels).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from safetensors_io import read_safetensors
from make_flux_reference import (VAE_CONFIG, AutoencoderKLDecoder, Goldens, flux_rope, pack_latents,
                                 timestep_sinusoid, unpack_latents)
from make_wan_reference import unpatchify, wan_rope

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

BF16 = torch.bfloat16
F64 = torch.float64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else DATA
GENERATOR = "tests/reference/make_bf16_reference.py"
DIFFUSERS_COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"  # huggingface/diffusers main, read for facts

COMMON = {
    "linear": "bf16 x and W; sum + bias exact (float64), rounded once to bf16 (cuBLAS: f32 accumulate, "
              "bias epilogue, one rounding); Conv3d patch embedding the same",
    "elementwise": "each bf16 op (add, mul, 1 + scale, SiLU, GELU-tanh) computed exactly / in float64 on its "
                   "bf16 operands, rounded to f32 then to bf16 (torch's f32 opmath then cast)",
    "layer_norm_bf16": "nn.LayerNorm on bf16: statistics and normalization in float64, one rounding to bf16",
    "rms_norm": "torch.nn.RMSNorm (Flux norm_q/k, norm_added_q/k; Wan norm_q/k across heads), bf16 weight: "
                "x * rsqrt(mean(x^2) + eps) * w in float64, one rounding to bf16 (current torch: "
                "rms_norm_composite / _fused_rms_norm keep x*rsqrt*w in f32 and cast once)",
    "attention": "SDPA math in bf16 (the composite math backend of torch 2.x): S = bf16(q k^T / sqrt(D)) "
                 "(D = 16: the sqrt(scale) = 0.5 pre-scaling of q and k is exact), P = bf16(f32(softmax(S))) "
                 "with the softmax of the bf16 scores taken in float64, O = bf16(P v) summed exactly; "
                 "head dim 16, no mask",
}

PRECISION_FLUX = dict(COMMON, **{
    "inputs": "hidden_states, encoder_hidden_states, pooled_projections cast to bf16 (stored here already "
              "rounded, as f32)",
    "timestep": "timestep.to(bf16) * 1000 in bf16: t' = bf16(bf16(t) * 1000) (FluxTransformer2DModel.forward "
                "casts to hidden_states.dtype, the x_embedder output's bf16); stored as intermediate.timestep_scaled",
    "guidance": "the same: g' = bf16(bf16(g) * 1000): 3.5 -> 3504, 5.0 -> 4992 (intermediate.guidance_scaled)",
    "sinusoid": "Timesteps in f32: arguments f32(t' * f_j) with f_j = f32(exp(f32(-ln 10000 * j) / 128)) "
                "(correctly rounded exp), cos/sin rounded to f32, then .to(pooled_projections.dtype) = bf16",
    "embedders": "timestep_embedder, guidance_embedder, text_embedder, context_embedder, x_embedder: bf16 "
                 "Linear / SiLU; temb = bf16(bf16(t_emb + g_emb) + pooled_emb)",
    "ids_rope": "img_ids / txt_ids in bf16 (exact small integers), FluxPosEmbed: ids.float(), table in "
                "float64, cos/sin as f32",
    "rope": "apply_rotary_emb: f32(f32(x * cos) + f32(x_rot * sin)) with x widened to f32, then cast to bf16",
    "adaln": "AdaLayerNormZero / Single / Continuous (norm_out, scale first): emb = Linear(SiLU(temb)) in bf16; "
             "bf16(bf16(bf16(LN(x)) * bf16(1 + scale)) + shift), LN in bf16",
    "blocks": "gated residuals in bf16: h = bf16(h + bf16(gate * y)); single block cat([attn, GELU(proj_mlp)]) "
              "-> proj_out in bf16; ff: Linear, GELU-tanh, Linear in bf16",
    "output": "proj_out bf16, widened to f32 as `expected`",
})

PRECISION_WAN = dict(COMMON, **{
    "keep_in_fp32_modules": "WanTransformer3DModel._keep_in_fp32_modules = [rope, time_embedder, "
                            "scale_shift_table, norm1, norm2, norm3]: condition_embedder.time_embedder.*, every "
                            "scale_shift_table and blocks.N.norm2.{weight,bias} stay f32 (norm1 / norm3 have no "
                            "parameters, rope has f32 buffers); all other weights bf16",
    "inputs": "hidden_states and encoder_hidden_states cast to bf16 (stored already rounded); timestep stays "
              "f32 (WanPipeline passes t.expand(B), not cast)",
    "patch_embedding": "Conv3d in bf16 (kernel = stride = patch), one rounding",
    "sinusoid": "Timesteps in f32 (freq_dim 32): arguments f32(t * f_j), cos/sin rounded to f32; stays f32 "
                "(time_embedder is f32)",
    "time_embedder": "f32: Linear, SiLU, Linear each rounded to f32 (float64 arithmetic); then "
                     "temb.type_as(encoder_hidden_states) -> bf16 (intermediate.temb is the f32 value)",
    "time_proj": "bf16 Linear(SiLU(bf16 temb)) (intermediate.timestep_proj [B, 6, D])",
    "text_embedder": "bf16 Linear, GELU-tanh, Linear",
    "modulation": "scale_shift_table (f32) + timestep_proj.float(): f32",
    "norm1_norm3": "FP32LayerNorm of hidden_states.float() (f32), * (1 + scale) + shift in f32 (each op rounded "
                   "to f32), then .type_as(hidden_states) -> bf16",
    "norm2": "FP32LayerNorm with f32 weight / bias (cross-attention pre-norm), then bf16",
    "rope": "WanAttnProcessor.apply_rotary_emb: x1 * cos - x2 * sin and x1 * sin + x2 * cos with bf16 x and "
            "f32 tables: products and sum in f32, stored into a bf16 tensor (rounded); table split t/h/w 8/4/4 "
            "(diffusers at this commit splits by t_dim/h_dim/w_dim)",
    "residuals": "self-attention and FFN: bf16(f32(h.float() + f32(y * gate_f32))); cross-attention: "
                 "bf16(h + y) in bf16",
    "output_head": "shift, scale = scale_shift_table (f32) + temb (the bf16 temb, widened): f32; "
                   "bf16(f32(f32(f32(LN(h)) * f32(1 + scale)) + shift)); proj_out bf16; unpatchified",
})

PRECISION_PIPELINE = {
    "transformer": "as flux_transformer's precision (timestep and guidance included)",
    "latents": "noise cast to bf16 and packed (prepare_latents: latents.to(prompt_embeds.dtype)); bf16 between "
               "steps",
    "model_timestep": "timestep = t.expand(B).to(bf16), then timestep / 1000 in bf16, which CUDA computes as a "
                      "product with the f32 reciprocal of the CPU scalar: bf16(f32(bf16(t) * f32(1 / 1000))) (the "
                      "true quotient gives the same 4 values); the model multiplies it back by 1000 in bf16 "
                      "(intermediate.model_timestep)",
    "guidance": "torch.full([1], 3.5, f32) -> in the model bf16(bf16(3.5) * 1000) = 3504",
    "euler_step": "FlowMatchEulerDiscreteScheduler.step: sample.to(f32); dt = sigma_{i+1} - sigma_i (0-dim f32 "
                  "tensors, f32); dt * model_output is a bf16 tensor (a 0-dim f32 tensor does not promote a "
                  "bf16 one): bf16(f32(dt * v)); prev = f32(sample + that); prev.to(model_output.dtype) = bf16",
    "decode": "not bf16: z = latents.float() / 0.3611 + 0.1159 (torch f32 ops) from the unpacked bf16 latents, "
              "then the AutoencoderKL decoder (flux_tiny/vae) in float64, rounded to f32 (expected_image, before "
              "clamp(x / 2 + 0.5)); a real bf16 FluxPipeline decodes with a bf16 VAE",
    "expected": "the packed bf16 latents after the last step, widened to f32",
}


class Numerics:
    """Rounding points of one run: bf16=False is the float64 reference (no rounding at all); bf16=True the
    diffusers bf16 run. The two flags select the alternative rounding points reported by the script."""

    def __init__(self, bf16, rms_extra_rounding=False, attention_f32=False, bf16_timesteps=False):
        self.bf16 = bf16
        self.bf16_timesteps = bf16 or bf16_timesteps  # a diagnostic: float64 run with diffusers' bf16 timesteps
        self.rms_extra_rounding = rms_extra_rounding
        self.attention_f32 = attention_f32

    def b(self, t):
        """A tensor diffusers holds in bf16 (through f32: torch's double -> bf16 cast does the same)."""
        return to_bf16(t) if self.bf16 else t

    def f(self, t):
        """A tensor diffusers holds in f32."""
        return t.float().double() if self.bf16 else t

    def linear(self, x, p, name, keep_f32=False):
        y = F.linear(x, p[name + ".weight"], p[name + ".bias"])
        return self.f(y) if keep_f32 else self.b(y)

    def act(self, fn, x, keep_f32=False):
        return self.f(fn(x)) if keep_f32 else self.b(fn(x))

    def layer_norm(self, x, eps=1e-6):
        return self.b(F.layer_norm(x, (x.shape[-1],), eps=eps))

    def rms_norm(self, x, w, eps=1e-6):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if self.rms_extra_rounding:  # older torch composite / diffusers.RMSNorm: bf16(x * r) before * w
            return self.b(self.b(x * r) * w)
        return self.b(x * r * w)

    def attention(self, q, k, v):
        """q, k, v [B, L, H, D] -> [B, L, H * D], no mask."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if self.attention_f32:
            out = self.b(torch.matmul(torch.softmax(s, dim=-1), v))
        else:
            s = self.b(s)
            out = self.b(torch.matmul(self.b(torch.softmax(s, dim=-1)), v))
        return out.transpose(1, 2).flatten(2)


def to_bf16(t):
    return t.float().to(BF16).double()


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def feed_forward(num, p, prefix, x):
    """FeedForward(activation_fn="gelu-approximate"): net.0.proj, GELU-tanh, net.2."""
    return num.linear(num.act(gelu_tanh, num.linear(x, p, prefix + "net.0.proj")), p, prefix + "net.2")


# =============================================================================================
# FluxTransformer2DModel
# =============================================================================================
def flux_modulate(num, x, scale, shift):
    """LN(x) * (1 + scale) + shift, all bf16 (scale, shift [B, D])."""
    b = num.b
    return b(b(num.layer_norm(x) * b(1 + scale[:, None])) + shift[:, None])


def flux_ada(num, p, name, temb, n):
    return num.linear(num.act(F.silu, temb), p, name).chunk(n, dim=-1)


def flux_rope_apply(num, x, cos, sin):
    """apply_rotary_emb(use_real_unbind_dim=-1) on x [B, L, H, hd]; cos, sin [L, hd] f32."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return num.b(num.f(num.f(x * c) + num.f(rotated * s)))


def flux_qkv(num, p, attn, x, hd, q_name="to_q", k_name="to_k", v_name="to_v", nq="norm_q", nk="norm_k"):
    def heads(t):
        return t.unflatten(-1, (-1, hd))
    q = num.rms_norm(heads(num.linear(x, p, attn + q_name)), p[attn + nq + ".weight"])
    k = num.rms_norm(heads(num.linear(x, p, attn + k_name)), p[attn + nk + ".weight"])
    v = heads(num.linear(x, p, attn + v_name))
    return q, k, v


def flux_double_block(num, p, pre, h, c, temb, rope, hd):
    b = num.b
    sh1, sc1, g1, sh2, sc2, g2 = flux_ada(num, p, pre + "norm1.linear", temb, 6)
    csh1, csc1, cg1, csh2, csc2, cg2 = flux_ada(num, p, pre + "norm1_context.linear", temb, 6)
    hn, cn = flux_modulate(num, h, sc1, sh1), flux_modulate(num, c, csc1, csh1)
    a = pre + "attn."
    q, k, v = flux_qkv(num, p, a, hn, hd)
    cq, ck, cv = flux_qkv(num, p, a, cn, hd, "add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k")
    q, k, v = torch.cat([cq, q], dim=1), torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)
    o = num.attention(flux_rope_apply(num, q, *rope), flux_rope_apply(num, k, *rope), v)
    n_txt = c.shape[1]
    attn_h, attn_c = num.linear(o[:, n_txt:], p, a + "to_out.0"), num.linear(o[:, :n_txt], p, a + "to_add_out")
    h = b(h + b(g1[:, None] * attn_h))
    h = b(h + b(g2[:, None] * feed_forward(num, p, pre + "ff.", flux_modulate(num, h, sc2, sh2))))
    c = b(c + b(cg1[:, None] * attn_c))
    c = b(c + b(cg2[:, None] * feed_forward(num, p, pre + "ff_context.", flux_modulate(num, c, csc2, csh2))))
    return h, c


def flux_single_block(num, p, pre, h, c, temb, rope, hd):
    b = num.b
    n_txt = c.shape[1]
    s = torch.cat([c, h], dim=1)
    shift, scale, gate = flux_ada(num, p, pre + "norm.linear", temb, 3)
    sn = flux_modulate(num, s, scale, shift)
    mlp = num.act(gelu_tanh, num.linear(sn, p, pre + "proj_mlp"))
    q, k, v = flux_qkv(num, p, pre + "attn.", sn, hd)
    o = num.attention(flux_rope_apply(num, q, *rope), flux_rope_apply(num, k, *rope), v)
    s = b(s + b(gate[:, None] * num.linear(torch.cat([o, mlp], dim=-1), p, pre + "proj_out")))
    return s[:, n_txt:], s[:, :n_txt]


def flux_forward(num, p, cfg, hidden, ehs, pooled, timestep, img_ids, txt_ids, guidance, rec=None):
    """FluxTransformer2DModel.forward (guidance_embeds) -> the packed velocity [B, N_img, 64]."""
    rec = rec if rec is not None else {}
    b = num.b
    h = num.linear(b(hidden), p, "x_embedder")
    if num.bf16_timesteps:  # timestep.to(hidden_states.dtype) * 1000, a bf16 product
        t, g = to_bf16(to_bf16(timestep) * 1000), to_bf16(to_bf16(guidance) * 1000)
    else:  # the float64 goldens follow an f32 run here
        t, g = (timestep.float() * 1000).double(), (guidance.float() * 1000).double()

    def embed(values, name):  # Timesteps (f32) -> .to(bf16) -> TimestepEmbedding
        x = b(num.f(timestep_sinusoid(values, F64)))
        pre = "time_text_embed." + name
        return num.linear(num.act(F.silu, num.linear(x, p, pre + ".linear_1")), p, pre + ".linear_2")

    pe = "time_text_embed.text_embedder"
    pooled_emb = num.linear(num.act(F.silu, num.linear(b(pooled), p, pe + ".linear_1")), p, pe + ".linear_2")
    temb = b(b(embed(t, "timestep_embedder") + embed(g, "guidance_embedder")) + pooled_emb)
    c = num.linear(b(ehs), p, "context_embedder")
    ids = torch.cat([b(txt_ids), b(img_ids)], dim=0)
    rope = tuple(t_.double() for t_ in flux_rope(ids, cfg["axes_dims_rope"]))
    rec.update({"timestep_scaled": t, "guidance_scaled": g, "temb": temb})
    hd = cfg["attention_head_dim"]
    for i in range(cfg["num_layers"]):
        h, c = flux_double_block(num, p, f"transformer_blocks.{i}.", h, c, temb, rope, hd)
    for i in range(cfg["num_single_layers"]):
        h, c = flux_single_block(num, p, f"single_transformer_blocks.{i}.", h, c, temb, rope, hd)
    scale, shift = num.linear(num.act(F.silu, temb), p, "norm_out.linear").chunk(2, dim=-1)
    return num.linear(flux_modulate(num, h, scale, shift), p, "proj_out")


# =============================================================================================
# WanTransformer3DModel
# =============================================================================================
def wan_rope_apply(num, x, cos, sin):
    """WanAttnProcessor's apply_rotary_emb on x [B, L, H, hd]; cos, sin [L, hd] f32."""
    c, s = cos[None, :, None, 0::2], sin[None, :, None, 1::2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    f = num.f
    even = num.b(f(f(x1 * c) - f(x2 * s)))
    odd = num.b(f(f(x1 * s) + f(x2 * c)))
    return torch.stack([even, odd], dim=-1).flatten(-2)


def wan_attention(num, p, pre, x, context, heads, rope=None):
    source = x if context is None else context
    q = num.rms_norm(num.linear(x, p, pre + "to_q"), p[pre + "norm_q.weight"]).unflatten(2, (heads, -1))
    k = num.rms_norm(num.linear(source, p, pre + "to_k"), p[pre + "norm_k.weight"]).unflatten(2, (heads, -1))
    v = num.linear(source, p, pre + "to_v").unflatten(2, (heads, -1))
    if rope is not None:
        q, k = wan_rope_apply(num, q, *rope), wan_rope_apply(num, k, *rope)
    return num.linear(num.attention(q, k, v), p, pre + "to_out.0")


def wan_modulate(num, h, scale, shift, eps):
    """(FP32LayerNorm(h.float()) * (1 + scale) + shift).type_as(h), scale / shift f32."""
    f = num.f
    return num.b(f(f(f(F.layer_norm(h, (h.shape[-1],), eps=eps)) * f(1 + scale)) + shift))


def wan_block(num, p, pre, h, context, timestep_proj, rope, heads, eps):
    b, f = num.b, num.f
    mod = f(p[pre + "scale_shift_table"] + timestep_proj)  # f32 table + timestep_proj.float()
    shift, scale, gate, c_shift, c_scale, c_gate = (mod[:, r, None, :] for r in range(6))
    attn = wan_attention(num, p, pre + "attn1.", wan_modulate(num, h, scale, shift, eps), None, heads, rope)
    h = b(f(h + f(attn * gate)))
    xn = b(f(F.layer_norm(h, (h.shape[-1],), p[pre + "norm2.weight"], p[pre + "norm2.bias"], eps)))
    h = b(h + wan_attention(num, p, pre + "attn2.", xn, context, heads))
    ff = feed_forward(num, p, pre + "ffn.", wan_modulate(num, h, c_scale, c_shift, eps))
    return b(f(h + f(ff * c_gate)))


def wan_forward(num, p, cfg, hidden, timestep, ehs, rec=None):
    """WanTransformer3DModel.forward (T2V) -> the velocity [B, C, T, H, W]."""
    rec = rec if rec is not None else {}
    b, f = num.b, num.f
    patch = tuple(cfg["patch_size"])
    grid = tuple(n // s for n, s in zip(hidden.shape[2:], patch))
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    rope = tuple(t.double() for t in wan_rope(cfg["attention_head_dim"], *grid, cfg["rope_max_seq_len"]))
    h = b(F.conv3d(b(hidden), p["patch_embedding.weight"], p["patch_embedding.bias"], stride=patch))
    h = h.flatten(2).transpose(1, 2)
    te = "condition_embedder.time_embedder"
    x = f(timestep_sinusoid(timestep.float(), F64, cfg["freq_dim"]))
    temb = num.linear(num.act(F.silu, num.linear(x, p, te + ".linear_1", True), True), p, te + ".linear_2", True)
    temb_b = b(temb)  # .type_as(encoder_hidden_states)
    timestep_proj = num.linear(num.act(F.silu, temb_b), p, "condition_embedder.time_proj").unflatten(1, (6, dim))
    tx = "condition_embedder.text_embedder"
    context = num.linear(num.act(gelu_tanh, num.linear(b(ehs), p, tx + ".linear_1")), p, tx + ".linear_2")
    rec.update({"temb": temb, "timestep_proj": timestep_proj})
    for i in range(cfg["num_layers"]):
        h = wan_block(num, p, f"blocks.{i}.", h, context, timestep_proj, rope, cfg["num_attention_heads"],
                      cfg["eps"])
    mod = f(p["scale_shift_table"] + temb_b[:, None, :])
    shift, scale = mod[:, 0, None, :], mod[:, 1, None, :]
    y = num.linear(wan_modulate(num, h, scale, shift, cfg["eps"]), p, "proj_out")
    return unpatchify(y, grid, patch)


# =============================================================================================
# FluxPipeline: the Euler loop
# =============================================================================================
INV_1000 = float(torch.tensor(1.0) / 1000)  # f32(1 / 1000)


def flux_pipeline(num, p, cfg, noise, ehs, pooled, guidance, img_ids, txt_ids, sigmas, timesteps, rec):
    b, f = num.b, num.f
    x = b(pack_latents(noise.double()))
    for i in range(len(timesteps)):
        t = timesteps[i:i + 1].double()  # the scheduler's f32 timestep
        # bf16 tensor / 1000: CUDA multiplies by the f32 reciprocal of a CPU scalar (div_true_kernel_cuda)
        if num.bf16_timesteps:
            t_model = to_bf16(to_bf16(t) * INV_1000)
        else:
            t_model = (timesteps[i:i + 1] / 1000).double()
        v = flux_forward(num, p, cfg, x, ehs, pooled, t_model, img_ids, txt_ids, guidance)
        dt = (sigmas[i + 1] - sigmas[i]).double()  # f32 difference (0-dim f32 tensors)
        x = b(f(x + b(f(dt * v)))) if num.bf16 else x + dt * v
        rec[f"model_timestep{i}"] = t_model
        rec[f"latents_step{i}"] = x
    return x


# =============================================================================================
# Main
# =============================================================================================
def load_weights(subdir):
    tensors, _ = read_safetensors(os.path.join(DATA, subdir, "diffusion_pytorch_model.safetensors"))
    return {k: v.double() for k, v in tensors.items()}


def load_config(subdir):
    with open(os.path.join(DATA, subdir, "config.json")) as fh:
        return json.load(fh)


def rel(a, ref):
    return float((a.double() - ref.double()).abs().max() / ref.double().abs().max())


def main():
    flux_goldens, _ = read_safetensors(os.path.join(DATA, "goldens_flux.safetensors"))
    wan_goldens, _ = read_safetensors(os.path.join(DATA, "goldens_wan.safetensors"))
    flux_p, flux_cfg = load_weights("flux_tiny/transformer"), load_config("flux_tiny/transformer")
    wan_p, wan_cfg = load_weights("wan_tiny/transformer"), load_config("wan_tiny/transformer")
    assert flux_cfg["guidance_embeds"] and flux_cfg["attention_head_dim"] == 16 == wan_cfg["attention_head_dim"]
    f64, bf16 = Numerics(False), Numerics(True)
    f64_bf16_timesteps = Numerics(False, bf16_timesteps=True)  # diagnostic: how much is the bf16 timestep alone
    variants = {"rms_extra_rounding": Numerics(True, rms_extra_rounding=True),
                "attention_f32": Numerics(True, attention_f32=True)}
    meta = {
        "_generator": GENERATOR,
        "_torch_version": torch.__version__,
        "_diffusers_commit": DIFFUSERS_COMMIT,
        "_numerics": "diffusers' torch_dtype=torch.bfloat16 run emulated in float64 with bf16 / f32 rounding where "
                     "diffusers rounds (see each case's precision and the generator's docstring); every stored "
                     "tensor is F32 (bf16 values widened exactly)",
    }
    g = Goldens(0, meta)
    report = []

    def check_f64(case, got, golden, tol=2e-6):
        """The f64 run of the same code must reproduce the float64 golden (validates the emulation)."""
        err = rel(got, golden)
        assert err < tol, (case, err)
        return err

    def variant_moves(fn, expected, ref):
        return {k: float((fn(n) - expected).abs().max() / ref.abs().max()) for k, n in variants.items()}

    # ---- flux_transformer ------------------------------------------------------------------------
    gt = {k[len("transformer."):]: v for k, v in flux_goldens.items() if k.startswith("transformer.")}
    inputs = {k: gt[k] for k in ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep",
                                 "img_ids", "txt_ids", "guidance")}
    ref = gt["expected"].double()

    def run_flux(num, rec=None):
        args = [inputs[k].double() for k in ("hidden_states", "encoder_hidden_states", "pooled_projections",
                                             "timestep", "img_ids", "txt_ids", "guidance")]
        return flux_forward(num, flux_p, flux_cfg, *args, rec=rec)

    with torch.no_grad():
        f64_err = check_f64("flux_transformer", run_flux(f64), ref)
        rec = {}
        out = run_flux(bf16, rec)
        moves = variant_moves(run_flux, out, ref)
        same_t = rel(out, run_flux(f64_bf16_timesteps))
    diff = rel(out, ref)
    tensors = {k: bf16.b(v.double()) for k, v in inputs.items()}  # the values the bf16 model sees
    tensors.update({"expected": out, "intermediate.temb": rec["temb"],
                    "intermediate.timestep_scaled": rec["timestep_scaled"],
                    "intermediate.guidance_scaled": rec["guidance_scaled"]})
    g.add("flux_transformer", dict(
        op="flux_transformer", weights="flux_tiny/transformer", dtype="bf16", source="goldens_flux.safetensors "
        "case transformer (its inputs rounded to bf16; its expected is the float64 result)", batch=2,
        num_img_tokens=16, num_txt_tokens=5, precision=PRECISION_FLUX, bf16_vs_f64_rel=diff,
        bf16_vs_f64_same_timesteps_rel=same_t,
        note="inputs are stored as the bf16 values the model sees (x.to(bf16) of goldens_flux's f32 inputs; "
             "img_ids / txt_ids exact); timestep is sigma in [0, 1]; expected the packed bf16 velocity [B, 16, 64]; "
             "intermediate.temb (bf16, before SiLU), timestep_scaled / guidance_scaled the bf16 t * 1000, g * 1000"),
        tensors)
    report.append(("flux_transformer", "transformer.expected", diff, ref, f64_err, moves, same_t))

    # ---- wan_transformer -------------------------------------------------------------------------
    wt = {k[len("transformer."):]: v for k, v in wan_goldens.items() if k.startswith("transformer.")}
    ref = wt["sample"].double()

    def run_wan(num, rec=None):
        return wan_forward(num, wan_p, wan_cfg, wt["hidden_states"].double(), wt["timestep"],
                           wt["encoder_hidden_states"].double(), rec)

    with torch.no_grad():
        f64_err = check_f64("wan_transformer", run_wan(f64), ref)
        rec = {}
        out = run_wan(bf16, rec)
        moves = variant_moves(run_wan, out, ref)
    diff = rel(out, ref)
    g.add("wan_transformer", dict(
        op="wan_transformer", weights="wan_tiny/transformer", dtype="bf16", source="goldens_wan.safetensors case "
        "transformer (batch 2, timesteps 999 / 250.5, batch 1's prompt zero-padded from 5 to 7 tokens)", batch=2,
        token_grid=[3, 2, 3], num_txt_tokens=7, precision=PRECISION_WAN, bf16_vs_f64_rel=diff,
        note="hidden_states and encoder_hidden_states are stored as the bf16 values the model sees; timestep is "
             "the raw f32 scheduler value (not cast); expected the unpatchified bf16 velocity [B, C, T, H, W]; "
             "intermediate.temb the f32 time_embedder output, intermediate.timestep_proj the bf16 time_proj "
             "output [B, 6, D]"),
        {"hidden_states": bf16.b(wt["hidden_states"].double()), "timestep": wt["timestep"],
         "encoder_hidden_states": bf16.b(wt["encoder_hidden_states"].double()), "expected": out,
         "intermediate.temb": rec["temb"], "intermediate.timestep_proj": rec["timestep_proj"]})
    report.append(("wan_transformer", "transformer.sample", diff, ref, f64_err, moves, None))

    # ---- flux_pipeline -----------------------------------------------------------------------------
    gp = {k[len("pipeline."):]: v for k, v in flux_goldens.items() if k.startswith("pipeline.")}
    sigmas, timesteps = gp["intermediate.sigmas"], gp["intermediate.timesteps"]
    steps = timesteps.shape[0]
    ref = gp[f"intermediate.latents_step{steps - 1}"].double()
    lat_h, lat_w = gp["noise"].shape[2:]

    def run_pipeline(num, rec=None):
        rec = rec if rec is not None else {}
        return flux_pipeline(num, flux_p, flux_cfg, gp["noise"], gp["encoder_hidden_states"].double(),
                             gp["pooled_projections"].double(), gp["guidance"].double(), gp["img_ids"].double(),
                             gp["txt_ids"].double(), sigmas, timesteps, rec)

    vae = AutoencoderKLDecoder(VAE_CONFIG).double().eval()
    vae.load_state_dict(load_weights("flux_tiny/vae"))
    with torch.no_grad():
        f64_err = check_f64("flux_pipeline", run_pipeline(f64), ref)
        rec = {}
        out = run_pipeline(bf16, rec)
        moves = variant_moves(run_pipeline, out, ref)
        same_t = rel(out, run_pipeline(f64_bf16_timesteps))
        z = unpack_latents(out, lat_h, lat_w).float() / VAE_CONFIG["scaling_factor"] + VAE_CONFIG["shift_factor"]
        image = vae.decode(z.double())
        assert rel(vae.decode(gp["intermediate.z"].double()), gp["expected"]) < 1e-6  # the weights are the golden's
    diff = rel(out, ref)
    image_diff = rel(image, gp["expected"])
    tensors = {"noise": bf16.b(gp["noise"].double()), "encoder_hidden_states": bf16.b(gp["encoder_hidden_states"]),
               "pooled_projections": bf16.b(gp["pooled_projections"]), "guidance": gp["guidance"],
               "img_ids": gp["img_ids"], "txt_ids": gp["txt_ids"], "intermediate.sigmas": sigmas,
               "intermediate.timesteps": timesteps,
               "intermediate.model_timestep": torch.cat([rec[f"model_timestep{i}"] for i in range(steps)]),
               "intermediate.z": z, "expected": out, "expected_image": image}
    tensors.update({f"intermediate.latents_step{i}": rec[f"latents_step{i}"] for i in range(steps - 1)})
    g.add("flux_pipeline", dict(
        op="flux_pipeline", transformer="flux_tiny/transformer", vae="flux_tiny/vae", scheduler="flux_tiny/scheduler",
        dtype="bf16", source="goldens_flux.safetensors case pipeline (same noise, prompt embeddings, scheduler "
        "sigmas / timesteps)", num_inference_steps=steps, guidance_scale=3.5, latent_height=lat_h,
        latent_width=lat_w, precision=PRECISION_PIPELINE, bf16_vs_f64_rel=diff, image_bf16_vs_f64_rel=image_diff,
        bf16_vs_f64_same_timesteps_rel=same_t,
        note="noise [1,16,H,W] (bf16 values) is packed; per step i the transformer (bf16) gets "
             "intermediate.model_timestep[i] = bf16(bf16(t_i) / 1000) and the latents are updated as "
             "bf16(f32(x + bf16(f32(dt * v)))), dt = f32(sigma_{i+1} - sigma_i); intermediate.latents_step{i} "
             "(packed, bf16 values; the last step is expected); expected = the packed latents after the last "
             "step [1, 16, 64]; "
             "intermediate.z = f32(unpack(expected) / 0.3611 + 0.1159); expected_image = f32 decode of z "
             "(float64 arithmetic, rounded to f32), before clamp(x / 2 + 0.5, 0, 1)"),
        tensors)
    report.append(("flux_pipeline", "pipeline.intermediate.latents_step3", diff, ref, f64_err, moves, same_t))

    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, "goldens_bf16.safetensors")
    g.write(path)

    print(f"{os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}: {os.path.getsize(path)} bytes, "
          f"{len(g.tensors)} tensors")
    for k in sorted(g.tensors):
        print(f"  {k:<46} {str(list(g.tensors[k].shape)):<16} max|.| {float(g.tensors[k].abs().max()):.6g}")
    print("max |bf16 - f64| / max |f64| (f64 = the float64 golden):")
    for case, golden, d, r, err, mv, same_t in report:
        print(f"  {case:<17} {d:.4g}  (vs {golden}, max |f64| {float(r.abs().max()):.4g}; f64 rerun of this code "
              f"vs golden {err:.2g})")
        if same_t is not None:
            print("  " + " " * 17 + f" vs a float64 run given the same bf16 timestep / guidance values: {same_t:.4g}")
        print("  " + " " * 17 + " alternative rounding points move the bf16 result by: " +
              ", ".join(f"{k} {v:.3g}" for k, v in mv.items()))
    print(f"  flux_pipeline image (f32 decode of the bf16 latents vs pipeline.expected): {image_diff:.4g}")


if __name__ == "__main__":
    main()
