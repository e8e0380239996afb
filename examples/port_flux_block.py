#!/usr/bin/python3
"""A diffusers-style Flux single-stream block written in NumPy, and its port onto cubevec's MindIE SD
layers, compared the way a porter compares them (docs/porting-python.md walks through this file).

    PYTHONPATH=build/python /usr/bin/python3 examples/port_flux_block.py

The reference follows diffusers' FluxSingleTransformerBlock and FluxAttnProcessor2_0 line by line
(with NumPy for torch): heads moved first for F.scaled_dot_product_attention, RoPE by
apply_rotary_emb(use_real=True, use_real_unbind_dim=-1). The port replaces one call at a time with
MindIE SD's layer, in cubevec: attention_forward on [B, S, N, D] (no transposes),
rotary_position_embedding(rotated_mode="rotated_interleaved"), RMSNorm, layernorm_scale_shift,
get_activation_layer("gelu-tanh"). The Linear layers stay NumPy matmuls (MindIE SD has no Linear
since v3.0.0; cubevec's is models::Linear in C++). Exits 1 when a comparison misses its tolerance.
"""

import sys

import numpy as np

import cubevec

# A small block of Flux's shape: 4 heads of 32 (Flux: 24 of 128), MLP 4x wide.
B, S, HEADS, HEAD_DIM = 1, 64, 4, 32
H = HEADS * HEAD_DIM
MLP = 4 * H


def make_weights(seed=0):
    rng = np.random.default_rng(seed)

    def linear(out_features, in_features):
        w = rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)
        return w.astype(np.float32), (0.02 * rng.standard_normal(out_features)).astype(np.float32)

    return {
        "norm.linear": linear(3 * H, H),  # AdaLayerNormZeroSingle: shift, scale, gate
        "proj_mlp": linear(MLP, H),
        "attn.to_q": linear(H, H),
        "attn.to_k": linear(H, H),
        "attn.to_v": linear(H, H),
        "attn.norm_q.weight": (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32),
        "attn.norm_k.weight": (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32),
        "proj_out": linear(H, H + MLP),
    }


def rope_tables(seq, dim, theta=10000.0):
    """Flux's RoPE as diffusers returns it for use_real=True: cos and sin [S, D], each frequency
    repeated for the pair it rotates (repeat_interleave_real)."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(seq), freqs)
    return np.repeat(np.cos(angles), 2, axis=1).astype(np.float32), np.repeat(np.sin(angles), 2, axis=1).astype(np.float32)


def linear(x, w):
    weight, bias = w
    return x @ weight.T + bias


def silu(x):
    return x / (1 + np.exp(-x))


# --- the reference: diffusers' block in NumPy ------------------------------------------------------


def reference_block(x, temb, cos, sin, w):
    x, temb = x.astype(np.float64), temb.astype(np.float64)
    residual = x
    shift, scale, gate = np.split(linear(silu(temb), w["norm.linear"]), 3, axis=-1)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm_x = (x - mean) / np.sqrt(var + 1e-6) * (1 + scale[:, None]) + shift[:, None]

    h = linear(norm_x, w["proj_mlp"])
    mlp = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))

    def heads_first(t):  # [B, S, H] -> [B, N, S, D], as diffusers does for SDPA
        return t.reshape(B, S, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)

    def rms_norm(t, weight):
        return t / np.sqrt((t ** 2).mean(-1, keepdims=True) + 1e-6) * weight

    def apply_rotary_emb(t):  # use_real_unbind_dim=-1: pairs (2i, 2i+1)
        real, imag = t[..., 0::2], t[..., 1::2]
        rotated = np.stack([-imag, real], axis=-1).reshape(t.shape)
        return t * cos + rotated * sin

    q = apply_rotary_emb(rms_norm(heads_first(linear(norm_x, w["attn.to_q"])), w["attn.norm_q.weight"]))
    k = apply_rotary_emb(rms_norm(heads_first(linear(norm_x, w["attn.to_k"])), w["attn.norm_k.weight"]))
    v = heads_first(linear(norm_x, w["attn.to_v"]))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM)  # F.scaled_dot_product_attention
    p = np.exp(scores - scores.max(-1, keepdims=True))
    attn = (p / p.sum(-1, keepdims=True)) @ v
    attn = attn.transpose(0, 2, 1, 3).reshape(B, S, H)

    out = linear(np.concatenate([attn, mlp], axis=2), w["proj_out"])
    return residual + gate[:, None] * out


# --- the port: the same block on cubevec's layers ---------------------------------------------------


def ported_block(x, temb, cos, sin, w, dtype=None, rotated_mode="rotated_interleaved"):
    residual = x
    shift, scale, gate = np.split(linear(silu(temb), w["norm.linear"]), 3, axis=-1)
    # LayerNorm(H, elementwise_affine=False, eps=1e-6)(x) * (1 + scale[:, None]) + shift[:, None]
    norm = cubevec.LayerNorm(H, eps=1e-6, elementwise_affine=False)
    norm_x = cubevec.layernorm_scale_shift(norm, x, np.ascontiguousarray(scale), np.ascontiguousarray(shift), dtype=dtype)

    mlp = cubevec.get_activation_layer("gelu-tanh")(linear(norm_x, w["proj_mlp"]), dtype=dtype)

    # [B, S, H] -> [B, S, N, D]: MindIE's layout (head_first=False), a view, no transpose.
    def heads(t):
        return t.reshape(B, S, HEADS, HEAD_DIM)

    norm_q, norm_k = cubevec.RMSNorm(HEAD_DIM, eps=1e-6), cubevec.RMSNorm(HEAD_DIM, eps=1e-6)
    norm_q.weight, norm_k.weight = w["attn.norm_q.weight"], w["attn.norm_k.weight"]
    rope = dict(rotated_mode=rotated_mode, head_first=False, dtype=dtype)
    q = cubevec.rotary_position_embedding(norm_q(heads(linear(norm_x, w["attn.to_q"])), dtype=dtype), cos, sin, **rope)
    k = cubevec.rotary_position_embedding(norm_k(heads(linear(norm_x, w["attn.to_k"])), dtype=dtype), cos, sin, **rope)
    v = heads(linear(norm_x, w["attn.to_v"]))
    attn = cubevec.attention_forward(q, k, v, head_first=False, dtype=dtype).reshape(B, S, H)

    out = linear(np.concatenate([attn, mlp], axis=2), w["proj_out"])
    return residual + gate[:, None] * out


# --- the comparison ----------------------------------------------------------------------------------


def compare(name, ours, reference, tolerance):
    """Max |error| over max |reference| (the porter's relative error) and the cosine similarity."""
    ours, reference = np.asarray(ours, np.float64).ravel(), np.asarray(reference, np.float64).ravel()
    relative = np.abs(ours - reference).max() / np.abs(reference).max()
    cosine = ours @ reference / (np.linalg.norm(ours) * np.linalg.norm(reference))
    ok = relative <= tolerance and np.isfinite(ours).all()
    print(f"{name:36} relative error {relative:.2e} (tolerance {tolerance:.0e})  cosine {cosine:.8f}  {'within' if ok else 'OUTSIDE'}")
    return ok


def main():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, S, H)).astype(np.float32)
    temb = rng.standard_normal((B, H)).astype(np.float32)
    cos, sin = rope_tables(S, HEAD_DIM)
    w = make_weights()
    reference = reference_block(x, temb, cos, sin, w)
    results = [
        compare("f32 port against the reference", ported_block(x, temb, cos, sin, w), reference, 1e-5),
        compare("bf16 compute against the reference", ported_block(x, temb, cos, sin, w, dtype="bf16"), reference, 3e-2),
    ]
    # The comparison must be able to fail: the same port with rotate-half RoPE (the classic slip:
    # Flux rotates the pairs (2i, 2i+1), not the two halves) is caught, though its cosine looks fine.
    slip = ported_block(x, temb, cos, sin, w, rotated_mode="rotated_half")
    caught = not compare("rotate-half slip (must be outside)", slip, reference, 1e-5)
    return 0 if all(results) and caught else 1


if __name__ == "__main__":
    sys.exit(main())
