#!/usr/bin/python3
"""Tiny text encoders in transformers' format and their float64 outputs, the goldens of
tests/models/text_encoder_models_test.cpp.

Run with Debian's torch (1.13), which only /usr/bin/python3 sees:

    /usr/bin/python3 tests/reference/make_text_encoder_goldens.py

transformers is not installed (Debian has no package), so the three forwards below are written from
transformers' sources (modeling_clip.py, modeling_t5.py, modeling_umt5.py; facts only), with explicit
matmuls and softmax in float64:

  CLIPTextModel     token + position embedding; pre-LN layers (causal additive mask, q,k,v,out with
                    biases, scale head_dim^-0.5, quick_gelu MLP); final LayerNorm; pooler_output = the
                    row at argmax(ids) when eos_token_id == 2, else at the first id == eos_token_id.
  T5EncoderModel    embedding (not scaled); per layer RMS norm (no mean, no bias), attention with no
                    scaling whose bias = layer 0's relative position bias (+ the padding mask as
                    finfo(f32).min), shared by every layer; gated-GELU (tanh) FFN; final RMS norm.
  UMT5EncoderModel  the same, but every layer has its own relative position bias table.

Written to tests/data/text_encoders/:
  clip/   config.json + model.safetensors, every matrix stored bf16 (FLUX.1's text_encoder dtype)
  t5/     config.json + two shards + model.safetensors.index.json, f32 (a sharded checkpoint)
  umt5/   config.json + model.safetensors, f32, with `shared.weight` only (no encoder.embed_tokens)
  goldens.safetensors  per case `<case>.input_ids` (I32 [L]), `<case>.attention_mask` (I32 [L], when the
                       model gets one), `<case>.last_hidden_state` (F32 [L, D]) and, for CLIP,
                       `<case>.pooler_output` (F32 [D]).
Every weight is bf16-representable, so the bf16 and f32 copies of a checkpoint hold the same values.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "text_encoders")
F64 = torch.float64
F32_MIN = torch.finfo(torch.float32).min

CLIP_CONFIG = {
    "_name_or_path": "tiny-clip-text (cubevec test)", "architectures": ["CLIPTextModel"], "model_type": "clip_text_model",
    "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0, "eos_token_id": 2, "hidden_act": "quick_gelu",
    "hidden_size": 24, "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 37,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 77, "num_attention_heads": 2, "num_hidden_layers": 2,
    "pad_token_id": 1, "projection_dim": 24, "torch_dtype": "bfloat16", "transformers_version": "4.44.0",
    "vocab_size": 49408,
}
T5_CONFIG = {
    "_name_or_path": "tiny-t5-v1_1 (cubevec test)", "architectures": ["T5EncoderModel"], "model_type": "t5",
    "classifier_dropout": 0.0, "d_ff": 56, "d_kv": 8, "d_model": 40, "dense_act_fn": "gelu_new", "dropout_rate": 0.1,
    "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "is_gated_act": True, "layer_norm_epsilon": 1e-06, "num_decoder_layers": 2, "num_heads": 4, "num_layers": 2,
    "output_past": True, "pad_token_id": 0, "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "torch_dtype": "float32",
    "transformers_version": "4.44.0", "use_cache": True, "vocab_size": 704,
}
UMT5_CONFIG = dict(T5_CONFIG, **{
    "_name_or_path": "tiny-umt5 (cubevec test)", "architectures": ["UMT5EncoderModel"], "model_type": "umt5",
    "d_ff": 40, "d_kv": 6, "d_model": 24, "num_heads": 4, "scalable_attention": True,
})


def bf16_values(t):
    return t.to(torch.bfloat16).to(F64)


def random_weights(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, scale, offset) in shapes.items():
        out[name] = bf16_values(torch.randn(shape, generator=g, dtype=F64) * scale + offset)
    return out


# --- CLIP -----------------------------------------------------------------------------------------

def clip_shapes(c):
    e, i = c["hidden_size"], c["intermediate_size"]
    s = {"text_model.embeddings.token_embedding.weight": ([c["vocab_size"], e], 1.0, 0.0),
         "text_model.embeddings.position_embedding.weight": ([c["max_position_embeddings"], e], 0.5, 0.0),
         "text_model.final_layer_norm.weight": ([e], 0.2, 1.0), "text_model.final_layer_norm.bias": ([e], 0.2, 0.0)}
    for l in range(c["num_hidden_layers"]):
        p = f"text_model.encoder.layers.{l}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[p + f"self_attn.{proj}.weight"] = ([e, e], e ** -0.5, 0.0)
            s[p + f"self_attn.{proj}.bias"] = ([e], 0.1, 0.0)
        for ln in ("layer_norm1", "layer_norm2"):
            s[p + f"{ln}.weight"] = ([e], 0.2, 1.0)
            s[p + f"{ln}.bias"] = ([e], 0.2, 0.0)
        s[p + "mlp.fc1.weight"] = ([i, e], e ** -0.5, 0.0)
        s[p + "mlp.fc1.bias"] = ([i], 0.1, 0.0)
        s[p + "mlp.fc2.weight"] = ([e, i], i ** -0.5, 0.0)
        s[p + "mlp.fc2.bias"] = ([e], 0.1, 0.0)
    return s


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def clip_forward(c, w, ids):
    L, e, h = len(ids), c["hidden_size"], c["num_attention_heads"]
    hd = e // h
    ids_t = torch.tensor(ids)
    x = w["text_model.embeddings.token_embedding.weight"][ids_t] + w["text_model.embeddings.position_embedding.weight"][:L]
    causal = torch.triu(torch.full((L, L), -math.inf, dtype=F64), diagonal=1)
    act = {"quick_gelu": lambda t: t * torch.sigmoid(1.702 * t), "gelu": lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))}[c["hidden_act"]]
    eps = c["layer_norm_eps"]
    for l in range(c["num_hidden_layers"]):
        p = f"text_model.encoder.layers.{l}."
        lin = lambda t, n: t @ w[p + n + ".weight"].T + w[p + n + ".bias"]  # noqa: E731
        y = layer_norm(x, w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], eps)
        q, k, v = (lin(y, f"self_attn.{n}").view(L, h, hd).transpose(0, 1) for n in ("q_proj", "k_proj", "v_proj"))
        scores = (q * hd ** -0.5) @ k.transpose(1, 2) + causal
        a = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(L, e)
        x = x + lin(a, "self_attn.out_proj")
        y = layer_norm(x, w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], eps)
        x = x + lin(act(lin(y, "mlp.fc1")), "mlp.fc2")
    last = layer_norm(x, w["text_model.final_layer_norm.weight"], w["text_model.final_layer_norm.bias"], eps)
    if c["eos_token_id"] == 2:
        eos = int(torch.argmax(ids_t))
    else:
        eos = int(torch.argmax((ids_t == c["eos_token_id"]).int()))
    return last, last[eos]


# --- T5 / umT5 --------------------------------------------------------------------------------------

def t5_shapes(c, per_layer_bias, embed_name):
    d, inner, ff, h = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"], c["num_heads"]
    s = {embed_name: ([c["vocab_size"], d], 1.0, 0.0), "encoder.final_layer_norm.weight": ([d], 0.2, 1.0)}
    for l in range(c["num_layers"]):
        p = f"encoder.block.{l}.layer."
        s[p + "0.SelfAttention.q.weight"] = ([inner, d], (d * c["d_kv"]) ** -0.5, 0.0)  # Mesh-TF folds 1/sqrt(d) in
        s[p + "0.SelfAttention.k.weight"] = ([inner, d], d ** -0.5, 0.0)
        s[p + "0.SelfAttention.v.weight"] = ([inner, d], d ** -0.5, 0.0)
        s[p + "0.SelfAttention.o.weight"] = ([d, inner], inner ** -0.5, 0.0)
        if per_layer_bias or l == 0:
            s[p + "0.SelfAttention.relative_attention_bias.weight"] = ([c["relative_attention_num_buckets"], h], 1.0, 0.0)
        s[p + "0.layer_norm.weight"] = ([d], 0.2, 1.0)
        s[p + "1.layer_norm.weight"] = ([d], 0.2, 1.0)
        s[p + "1.DenseReluDense.wi_0.weight"] = ([ff, d], d ** -0.5, 0.0)
        s[p + "1.DenseReluDense.wi_1.weight"] = ([ff, d], d ** -0.5, 0.0)
        s[p + "1.DenseReluDense.wo.weight"] = ([d, ff], ff ** -0.5, 0.0)
    return s


def relative_bucket(rel, num_buckets, max_distance):
    # Bidirectional (the encoder): half the buckets for keys after the query.
    nb = num_buckets // 2
    out = (rel > 0).to(torch.long) * nb
    n = rel.abs()
    max_exact = nb // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)).to(torch.long)
    large = torch.minimum(large, torch.full_like(large, nb - 1))
    return out + torch.where(n < max_exact, n, large)


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def position_bias(c, table, L):
    pos = torch.arange(L)
    buckets = relative_bucket(pos[None, :] - pos[:, None], c["relative_attention_num_buckets"], c["relative_attention_max_distance"])
    return table[buckets].permute(2, 0, 1)  # [heads, Lq, Lk]


def t5_forward(c, w, ids, mask, per_layer_bias, embed_name):
    L, d, h, dk = len(ids), c["d_model"], c["num_heads"], c["d_kv"]
    x = w[embed_name][torch.tensor(ids)]
    mask_add = (1.0 - torch.tensor(mask, dtype=F64)) * F32_MIN  # [Lk]
    gelu_new = lambda t: 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))  # noqa: E731
    eps = c["layer_norm_epsilon"]
    shared_bias = None
    for l in range(c["num_layers"]):
        p = f"encoder.block.{l}.layer."
        if per_layer_bias or l == 0:
            bias = position_bias(c, w[p + "0.SelfAttention.relative_attention_bias.weight"], L) + mask_add
            if l == 0:
                shared_bias = bias
        if not per_layer_bias:
            bias = shared_bias
        y = rms(x, w[p + "0.layer_norm.weight"], eps)
        q, k, v = (y @ w[p + f"0.SelfAttention.{n}.weight"].T for n in "qkv")
        q, k, v = (t.view(L, h, dk).transpose(0, 1) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(1, 2) + bias, -1) @ v  # no scaling
        x = x + a.transpose(0, 1).reshape(L, h * dk) @ w[p + "0.SelfAttention.o.weight"].T
        y = rms(x, w[p + "1.layer_norm.weight"], eps)
        g = gelu_new(y @ w[p + "1.DenseReluDense.wi_0.weight"].T) * (y @ w[p + "1.DenseReluDense.wi_1.weight"].T)
        x = x + g @ w[p + "1.DenseReluDense.wo.weight"].T
    return rms(x, w["encoder.final_layer_norm.weight"], eps)


# --- files ------------------------------------------------------------------------------------------

def write_config(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def as_f32(w):
    return {n: t.to(torch.float32) for n, t in w.items()}


def main():
    goldens = {}
    # CLIP: bf16 matrices, f32 vectors (as load_parameters keeps them either way).
    clip_w = random_weights(clip_shapes(CLIP_CONFIG), 1)
    folder = os.path.join(OUT, "clip")
    write_config(folder, CLIP_CONFIG)
    safetensors_io.write_safetensors(os.path.join(folder, "model.safetensors"),
                                     {n: (t.to(torch.bfloat16) if t.dim() >= 2 else t.to(torch.float32)) for n, t in clip_w.items()},
                                     {"format": "pt"})
    g = torch.Generator().manual_seed(7)
    cases = {
        # "a photo of a cat" as FluxPipeline pads it (pad = <|endoftext|>).
        "clip_cat": [49406, 320, 1125, 539, 320, 2368, 49407] + [49407] * 70,
        # 30 random ids, then <|endoftext|>, then pad "!" (id 0): the pooled row is the first EOS.
        "clip_pad0": [49406] + torch.randint(1, 49406, (30,), generator=g).tolist() + [49407] + [0] * 45,
        # Shorter than 77 (encode-prompt --max-length).
        "clip_short": [49406, 3306, 1002, 49407, 49407, 49407, 49407, 49407, 49407, 49407],
    }
    for name, ids in cases.items():
        last, pooled = clip_forward(CLIP_CONFIG, clip_w, ids)
        goldens[f"{name}.input_ids"] = torch.tensor(ids, dtype=torch.int32)
        goldens[f"{name}.last_hidden_state"] = last.to(torch.float32)
        goldens[f"{name}.pooler_output"] = pooled.to(torch.float32)

    # T5: sharded f32, both embedding names present (tied), as T5EncoderModel.save_pretrained writes.
    t5_w = random_weights(t5_shapes(T5_CONFIG, False, "shared.weight"), 2)
    t5_w["encoder.embed_tokens.weight"] = t5_w["shared.weight"]
    folder = os.path.join(OUT, "t5")
    write_config(folder, T5_CONFIG)
    names = sorted(t5_w)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        safetensors_io.write_safetensors(os.path.join(folder, shard), {n: t5_w[n].to(torch.float32) for n in shard_names},
                                         {"format": "pt"})
        weight_map.update({n: shard for n in shard_names})
    total = sum(t.numel() * 4 for t in t5_w.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")
    L = 150  # past relative_attention_max_distance 128: the last bucket is reached
    ids = torch.randint(3, 704, (L,), generator=g).tolist()
    ids[139] = 1  # </s>, then padding
    ids[140:] = [0] * (L - 140)
    nomask = [1] * L
    mask = [1] * 140 + [0] * (L - 140)
    goldens["t5_nomask.input_ids"] = torch.tensor(ids, dtype=torch.int32)
    goldens["t5_nomask.attention_mask"] = torch.tensor(nomask, dtype=torch.int32)
    goldens["t5_nomask.last_hidden_state"] = t5_forward(T5_CONFIG, t5_w, ids, nomask, False, "shared.weight").to(torch.float32)
    goldens["t5_mask.input_ids"] = torch.tensor(ids, dtype=torch.int32)
    goldens["t5_mask.attention_mask"] = torch.tensor(mask, dtype=torch.int32)
    goldens["t5_mask.last_hidden_state"] = t5_forward(T5_CONFIG, t5_w, ids, mask, False, "shared.weight").to(torch.float32)

    # umT5: one f32 file, `shared.weight` only.
    umt5_w = random_weights(t5_shapes(UMT5_CONFIG, True, "shared.weight"), 3)
    folder = os.path.join(OUT, "umt5")
    write_config(folder, UMT5_CONFIG)
    safetensors_io.write_safetensors(os.path.join(folder, "model.safetensors"), as_f32(umt5_w), {"format": "pt"})
    L = 40
    ids = torch.randint(3, 704, (L,), generator=g).tolist()
    ids[25] = 1
    ids[26:] = [0] * (L - 26)
    mask = [1] * 26 + [0] * (L - 26)
    goldens["umt5_mask.input_ids"] = torch.tensor(ids, dtype=torch.int32)
    goldens["umt5_mask.attention_mask"] = torch.tensor(mask, dtype=torch.int32)
    goldens["umt5_mask.last_hidden_state"] = t5_forward(UMT5_CONFIG, umt5_w, ids, mask, True, "shared.weight").to(torch.float32)

    safetensors_io.write_safetensors(os.path.join(OUT, "goldens.safetensors"), goldens,
                                     {"generator": "tests/reference/make_text_encoder_goldens.py", "torch": torch.__version__})
    for name in sorted(goldens):
        if name.endswith("last_hidden_state") or name.endswith("pooler_output"):
            print(f"{name}: max |x| = {goldens[name].abs().max().item():.4f}")


if __name__ == "__main__":
    main()
